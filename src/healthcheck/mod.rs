//! kube-proxy's two health servers.
//!
//! Per service: on each `externalTrafficPolicy: Local` service's `healthCheckNodePort`, any
//! request answers 200 when this node has *ready* endpoints of the service and the proxy is
//! healthy, else 503, with kube-proxy's JSON body (`service`, `localEndpoints`,
//! `serviceProxyHealthy`), so external load balancers send traffic only to nodes that can
//! serve it and drain nodes whose endpoints are terminating.
//!
//! Per node ([`proxy`]): `/healthz` and `/livez` on `--healthz-bind-address`.

pub mod proxy;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::listener::{Limits, SourceGate, http};
use crate::task::{OnExit, Task, task};
use proxy::ProxyHealth;

/// healthCheckNodePort -> (service `namespace/name`, ready local endpoints).
pub type Health = BTreeMap<u16, (String, usize)>;

/// Listeners per port; counts are read at request time, so an update is one map write.
pub struct HealthServer {
    runtime: Handle,
    state: Arc<RwLock<Health>>,
    proxy: Arc<ProxyHealth>,
    listeners: BTreeMap<u16, JoinHandle<()>>,
    /// One admission for every port: a client's connections count across them.
    gate: SourceGate,
}

impl HealthServer {
    /// `proxy` is the verdict every port reports as `serviceProxyHealthy`.
    pub fn new(runtime: Handle, proxy: Arc<ProxyHealth>) -> HealthServer {
        HealthServer {
            runtime,
            state: Arc::default(),
            proxy,
            listeners: BTreeMap::new(),
            gate: Limits::HEALTH.gate(),
        }
    }

    /// Serves exactly the ports of `health` from now on.
    pub fn update(&mut self, health: Health) {
        self.listeners.retain(|port, task| {
            let keep = health.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for port in health.keys() {
            if !self.listeners.contains_key(port) {
                let (state, proxy) = (self.state.clone(), self.proxy.clone());
                let (port, gate) = (*port, self.gate.clone());
                let task = self.runtime.spawn(async move {
                    // [::] is dual-stack: IPv4 clients arrive as v4-mapped addresses.
                    let addr = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
                    // A port another process holds is tried again; serving never ends.
                    loop {
                        match TcpListener::bind(addr).await {
                            Ok(l) => {
                                let handler = service_handler(port, state.clone(), proxy.clone());
                                serve(l, gate.clone(), handler).await;
                            }
                            Err(e) => warn!("health check port {port}: {e}; retrying in 5 s"),
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                });
                self.listeners.insert(port, task);
            }
        }
        if let Ok(mut s) = self.state.write() {
            *s = health;
        }
    }

    /// The ports currently served.
    pub fn ports(&self) -> Vec<u16> {
        self.listeners.keys().copied().collect()
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        for task in self.listeners.values() {
            task.abort();
        }
    }
}

/// Serves HTTP/1 on `listener` under [`Limits::HEALTH`] (admitted by `gate`), each request
/// answered by `handler` from its path. Never returns (see `listener::accept_loop`).
async fn serve<F>(listener: TcpListener, gate: SourceGate, handler: F)
where
    F: Fn(&str) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
{
    let name = match listener.local_addr() {
        Ok(addr) => format!("health server on {addr}"),
        Err(_) => "health server".into(),
    };
    let answer = move |req: Request<Incoming>| {
        let response = handler(req.uri().path());
        async move { response }
    };
    http::serve(&name, listener, Limits::HEALTH, gate, answer).await
}

fn service_handler(
    port: u16,
    state: Arc<RwLock<Health>>,
    proxy: Arc<ProxyHealth>,
) -> impl Fn(&str) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static {
    move |_path| answer(port, &state, proxy.healthy(Instant::now()))
}

/// 200 when the service has ready local endpoints and the proxy is healthy, else 503 (also
/// for a port not known), with kube-proxy's body byte for byte.
pub fn answer(port: u16, state: &RwLock<Health>, proxy_healthy: bool) -> Response<Full<Bytes>> {
    let entry = state.read().ok().and_then(|s| s.get(&port).cloned());
    let (name, count) = entry.unwrap_or_default();
    let (namespace, name) = name.split_once('/').unwrap_or(("", &name));
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\
         \t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(namespace),
        quote(name)
    );
    let status = if count > 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, body)
}

fn json_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Told of every `/healthz` (`false`) and `/livez` (`true`) answer with its HTTP status code
/// (kube-proxy's `kubeproxy_proxy_healthz_total` / `_livez_total`).
pub type ProbeCounter = Arc<dyn Fn(bool, u16) + Send + Sync>;

/// `/healthz` and `/livez` from `health`; any other path is 404, as Go's mux answers it.
fn proxy_handler(
    health: Arc<ProxyHealth>,
    count: ProbeCounter,
) -> impl Fn(&str) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static {
    move |path| {
        let livez = match path {
            "/healthz" => false,
            "/livez" => true,
            _ => {
                let mut resp = Response::new(Full::new(Bytes::from("404 page not found\n")));
                *resp.status_mut() = StatusCode::NOT_FOUND;
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                return resp;
            }
        };
        let verdict = health.verdict(Instant::now());
        let (status, body) = proxy::answer(&verdict, SystemTime::now(), livez);
        count(livez, status.as_u16());
        json_response(status, body)
    }
}

/// Binds `addr` as Go's `net.Listen("tcp", addr)` does: the IPv4 wildcard is dual-stack
/// (`[::]`, IPv4 clients as v4-mapped addresses) where the host has IPv6.
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    if addr.ip() == Ipv4Addr::UNSPECIFIED
        && let Ok(l) = TcpListener::bind((Ipv6Addr::UNSPECIFIED, addr.port())).await
    {
        return Ok(l);
    }
    TcpListener::bind(addr).await
}

/// The node-level proxy health server on `addr` (`--healthz-bind-address`). As kube-proxy
/// does, a failure to listen (another process holds the port, say a kube-proxy not yet
/// removed) is logged and retried every 5 s; the dataplane keeps running meanwhile.
pub fn proxy_health_task(
    addr: SocketAddr,
    health: Arc<ProxyHealth>,
    count: ProbeCounter,
) -> impl Task {
    task("proxy-health", OnExit::Restart, move |mut ctx| {
        let (health, count) = (health.clone(), count.clone());
        let serve = async move {
            loop {
                match bind(addr).await {
                    Ok(listener) => {
                        info!("proxy health (/healthz, /livez) on {addr}");
                        let handler = proxy_handler(health.clone(), count.clone());
                        serve(listener, Limits::HEALTH.gate(), handler).await;
                    }
                    Err(e) => warn!("proxy health server on {addr}: {e}; retrying in 5 s"),
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        };
        async move { ctx.until_stopped(serve).await }
    })
}

#[cfg(test)]
mod tests {
    use super::proxy::{HEALTH_TIMEOUT, Stamp};
    use super::*;
    use crate::testing::objects;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One `GET path` over a fresh connection: (status, lower-case header lines, body).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (code, head.to_lowercase(), body.to_string())
    }

    async fn listen() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    fn json(body: &str) -> serde_json::Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// An update queued longer ago than the timeout and never synced.
    fn late(h: &ProxyHealth) {
        h.queued(Instant::now() - HEALTH_TIMEOUT - Duration::from_secs(1));
    }

    #[tokio::test]
    async fn service_port_reports_ready_endpoints_and_proxy_health() {
        let (l, addr) = listen().await;
        let state = Arc::new(RwLock::new(Health::from([(
            addr.port(),
            ("default/a".to_string(), 2),
        )])));
        let proxy = Arc::new(ProxyHealth::new(HEALTH_TIMEOUT, Stamp::now()));
        let handler = service_handler(addr.port(), state.clone(), proxy.clone());
        tokio::spawn(serve(l, Limits::HEALTH.gate(), handler));

        let (code, head, body) = get(addr, "/").await;
        assert_eq!(code, 200, "{body}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert_eq!(
            json(&body),
            serde_json::json!({"service": {"namespace": "default", "name": "a"},
                "localEndpoints": 2, "serviceProxyHealthy": true})
        );
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"a\"\n\t},\n\
             \t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        // Only terminating endpoints here: none ready, the node fails the check.
        state
            .write()
            .unwrap()
            .insert(addr.port(), ("default/a".to_string(), 0));
        let (code, _, body) = get(addr, "/any/path").await;
        assert_eq!(code, 503, "{body}");
        assert_eq!(json(&body)["localEndpoints"], 0);
        assert_eq!(json(&body)["serviceProxyHealthy"], true);
        // Endpoints, but the agent has not synced a pending update for too long.
        state
            .write()
            .unwrap()
            .insert(addr.port(), ("default/a".to_string(), 2));
        late(&proxy);
        let (code, _, body) = get(addr, "/").await;
        assert_eq!(code, 503, "{body}");
        assert_eq!(json(&body)["localEndpoints"], 2);
        assert_eq!(json(&body)["serviceProxyHealthy"], false);
        // A successful sync makes it healthy again.
        proxy.updated(Stamp::now());
        assert_eq!(get(addr, "/").await.0, 200);
    }

    #[tokio::test]
    async fn healthz_and_livez_follow_sync_health_and_node_eligibility() {
        let (l, addr) = listen().await;
        let health = Arc::new(ProxyHealth::new(HEALTH_TIMEOUT, Stamp::now()));
        let metrics = Arc::new(crate::admin::metrics::Metrics::new());
        let m = metrics.clone();
        let count: ProbeCounter = Arc::new(move |livez, code| m.kubeproxy.probe(livez, code));
        tokio::spawn(serve(
            l,
            Limits::HEALTH.gate(),
            proxy_handler(health.clone(), count),
        ));

        for path in ["/healthz", "/livez"] {
            let (code, head, body) = get(addr, path).await;
            assert_eq!(code, 200, "{path}: {body}");
            assert!(head.contains("content-type: application/json"), "{head}");
            assert!(head.contains("x-content-type-options: nosniff"), "{head}");
            let v = json(&body);
            assert_eq!(v["lastUpdated"], v["currentTime"], "{body}");
            assert!(v["currentTime"].as_str().unwrap().ends_with(" +0000 UTC"));
        }
        assert_eq!(json(&get(addr, "/healthz").await.2)["nodeEligible"], true);
        assert!(
            json(&get(addr, "/livez").await.2)
                .get("nodeEligible")
                .is_none()
        );
        assert_eq!(get(addr, "/").await.0, 404);

        // Tainted by the Cluster Autoscaler: /healthz fails, /livez does not.
        let node = objects::node("n1", &["192.0.2.1"]).taint(proxy::TO_BE_DELETED_TAINT);
        health.set_node(Some(&node.object()));
        let (code, _, body) = get(addr, "/healthz").await;
        assert_eq!(code, 503, "{body}");
        assert_eq!(json(&body)["nodeEligible"], false);
        assert_eq!(get(addr, "/livez").await.0, 200);
        // Being deleted: the same.
        let node = objects::node("n1", &["192.0.2.1"]).deleting();
        health.set_node(Some(&node.object()));
        assert_eq!(get(addr, "/healthz").await.0, 503);
        assert_eq!(get(addr, "/livez").await.0, 200);
        health.set_node(Some(&objects::node("n1", &["192.0.2.1"]).object()));
        assert_eq!(get(addr, "/healthz").await.0, 200);

        // Syncs failing past the timeout: both fail, lastUpdated is the last success.
        late(&health);
        for path in ["/healthz", "/livez"] {
            let (code, _, body) = get(addr, path).await;
            assert_eq!(code, 503, "{path}: {body}");
            let v = json(&body);
            assert_ne!(v["lastUpdated"], v["currentTime"], "{body}");
        }
        // Every answer counted by path and code, as kube-proxy does (the 404 is not).
        let text = metrics.encode();
        for line in [
            "kubeproxy_proxy_healthz_total{code=\"200\"} 3\n",
            "kubeproxy_proxy_healthz_total{code=\"503\"} 3\n",
            "kubeproxy_proxy_livez_total{code=\"200\"} 4\n",
            "kubeproxy_proxy_livez_total{code=\"503\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
