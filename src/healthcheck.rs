//! Health-check server for `externalTrafficPolicy: Local` services: on each service's
//! `healthCheckNodePort`, `GET` answers 200 with the number of this node's endpoints, or
//! 503 when there are none, so external load balancers send traffic only to nodes that
//! can serve it (kube-proxy's protocol: a JSON body with `localEndpoints`).

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::warn;

/// healthCheckNodePort -> (service `namespace/name`, local endpoints).
pub type Health = BTreeMap<u16, (String, usize)>;

/// Listeners per port; counts are read at request time, so an update is one map write.
pub struct HealthServer {
    runtime: Handle,
    state: Arc<RwLock<Health>>,
    listeners: BTreeMap<u16, JoinHandle<()>>,
}

impl HealthServer {
    pub fn new(runtime: Handle) -> HealthServer {
        HealthServer {
            runtime,
            state: Arc::default(),
            listeners: BTreeMap::new(),
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
                let state = self.state.clone();
                let port = *port;
                let task = self.runtime.spawn(async move {
                    if let Err(e) = serve(port, state).await {
                        warn!("health check port {port}: {e}");
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

async fn serve(port: u16, state: Arc<RwLock<Health>>) -> std::io::Result<()> {
    // [::] is dual-stack: IPv4 clients arrive as v4-mapped addresses.
    let listener = TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |_req: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(port, &state)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// 200 with the local endpoint count, 503 when it is zero (or the port is not known).
pub fn answer(port: u16, state: &RwLock<Health>) -> Response<Full<Bytes>> {
    let entry = state.read().ok().and_then(|s| s.get(&port).cloned());
    let (name, count) = entry.unwrap_or_default();
    let (namespace, name) = name.split_once('/').unwrap_or(("", &name));
    let body = serde_json::json!({
        "service": {"namespace": namespace, "name": name},
        "localEndpoints": count,
        "serviceProxyHealthy": true,
    });
    let status = if count > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_count_or_unavailable() {
        let state = RwLock::new(Health::from([
            (32000, ("default/a".to_string(), 2)),
            (32001, ("default/b".to_string(), 0)),
        ]));
        let ok = answer(32000, &state);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            answer(32001, &state).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answer(1, &state).status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
