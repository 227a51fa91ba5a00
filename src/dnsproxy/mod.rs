//! The transparent DNS proxy of EgressFirewall `dnsName` rules (see README "EgressFirewall
//! DNS"): pod DNS of namespaces with `dnsName` rules is steered here by nftables `tproxy`
//! (`plan::firewall::steer`); each answer's addresses of watched names are written to the
//! learned sets, acknowledged by the kernel, before the answer goes on to the pod.
//!
//! `socket` (transparent sockets), `udp` and `tcp` (the two paths), `resolvers` (listeners
//! at the resolvers' own addresses, for bridged pods with br_netfilter; a namespace's share
//! of the slots is `listener::fair`), `hold` (parse, learn on the learner thread, wait),
//! `answer` (parsing, CNAME chains, IDs), `learn` (the bounded learned-set writer), `metrics`.

pub mod answer;
pub mod hold;
pub mod learn;
pub mod metrics;
pub mod resolvers;
pub mod socket;
pub mod tcp;
pub mod udp;

use crate::config::DnsProxySettings;
use crate::nft::TABLE_NAME;
use crate::nft::nftnl::NftnlBackend;
use crate::plan::firewall::learning::Learning;
use crate::task::{OnExit, Task, once, task};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the proxy waits for a server: a pod's resolver gives up after ~5 s anyway.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the transparent listeners; returns the tasks that serve them (one per listener,
/// rebound on restart) and the one that keeps the resolvers' own listeners. An error (no
/// CAP_NET_ADMIN or CAP_NET_BIND_SERVICE, port taken) leaves pod DNS going direct: the
/// steering rules find no socket and do not match.
pub fn tasks(
    settings: &DnsProxySettings,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: metrics::ProxyMetrics,
) -> std::io::Result<Vec<Box<dyn Task>>> {
    let Some(port) = settings.port else {
        return Ok(Vec::new());
    };
    probe_answer_socket()?;
    let backend = NftnlBackend::new();
    let learner = learn::Learner::new(backend, TABLE_NAME, learn::Bounds::new(settings));
    let holder = hold::Holder::start(learner, learning.clone(), metrics);
    // Each query in flight holds an upstream socket, each connection two: stay well under
    // the default 1,024 open files (every listener of both families together). A namespace
    // (all its pods, whatever addresses they send from) gets a sixth, and the UDP queries of
    // one input interface (a pod, or a pod forging that namespace's addresses) a quarter of
    // that.
    let udp = udp::UdpProxy::new(
        holder.clone(),
        udp::Limits {
            in_flight: 384,
            per_namespace: 64,
            per_interface: 16,
            upstream_timeout: UPSTREAM_TIMEOUT,
        },
    );
    let tcp = tcp::TcpProxy::new(
        holder,
        tcp::Limits {
            connections: 192,
            per_namespace: 32,
            upstream_timeout: UPSTREAM_TIMEOUT,
            idle_timeout: Duration::from_secs(10),
        },
    );
    // IPv4 must work; IPv6 is served when the node can (a node without IPv6 skips it).
    let mut tasks = listeners(false, port, &udp, &tcp)?;
    match listeners(true, port, &udp, &tcp) {
        Ok(v6) => tasks.extend(v6),
        Err(e) => {
            tracing::warn!("dns proxy: no IPv6 listeners (pod DNS over IPv6 goes direct): {e}")
        }
    }
    let maintain = resolvers::maintain(udp, tcp, learning);
    tasks.push(Box::new(once(
        "dns-proxy-resolvers",
        OnExit::Finish,
        async move {
            maintain.await;
            Ok(())
        },
    )));
    tracing::info!("dns proxy listening on port {port} (udp, tcp)");
    Ok(tasks)
}

/// Where the start-up probe binds an answer socket: a documentation address (RFC 5737) that
/// no node holds, on the DNS port, as every UDP answer's socket binds the server's.
const PROBE_ANSWER_FROM: &str = "192.0.2.1:53";

/// UDP answers go to pods from the server's address and port 53 (`socket::answer_socket`),
/// and binding a port below 1024 needs CAP_NET_BIND_SERVICE: IP_TRANSPARENT does not exempt
/// it (EACCES, measured on 6.18; unless `net.ipv4.ip_unprivileged_port_start` is lowered).
/// Tried once at start, so that a missing capability stops the proxy with an error (pods'
/// DNS then goes direct) instead of failing every answer, counted only as a metric.
fn probe_answer_socket() -> std::io::Result<()> {
    let from = PROBE_ANSWER_FROM.parse().expect("valid address");
    match socket::answer_socket(from) {
        Ok(_) => Ok(()),
        Err(e) => {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (CAP_NET_BIND_SERVICE missing)"
            } else {
                ""
            };
            Err(std::io::Error::new(
                e.kind(),
                format!("answers cannot be sent from port 53: binding {from}: {e}{hint}"),
            ))
        }
    }
}

/// Binds one family's `tproxy` listeners; a task serves each (bound again on restart).
fn listeners(
    v6: bool,
    port: u16,
    udp: &udp::UdpProxy,
    tcp: &tcp::TcpProxy,
) -> std::io::Result<Vec<Box<dyn Task>>> {
    let family = if v6 { "v6" } else { "v4" };
    let udp_listener = socket::udp_listener(v6, port)?;
    let tcp_listener = socket::tcp_listener(v6, port, 1024)?;
    let udp = udp.clone();
    let udp_task = listener_task(
        format!("dns-proxy-udp-{family}"),
        udp_listener,
        move || socket::udp_listener(v6, port),
        move |l| {
            let udp = udp.clone();
            async move { udp.serve(l).await }
        },
    );
    let tcp = tcp.clone();
    let tcp_task = listener_task(
        format!("dns-proxy-tcp-{family}"),
        tcp_listener,
        move || socket::tcp_listener(v6, port, 1024),
        move |l| {
            let tcp = tcp.clone();
            async move { tcp.serve(l).await }
        },
    );
    Ok(vec![Box::new(udp_task), Box::new(tcp_task)])
}

/// A listener's task: serves `first`, and on a restart a socket from `bind`.
fn listener_task<S, B, F, Fut>(name: String, first: S, bind: B, serve: F) -> impl Task
where
    S: Send + 'static,
    B: Fn() -> std::io::Result<S> + Send + 'static,
    F: Fn(S) -> Fut + Send + 'static,
    Fut: Future<Output = std::io::Result<()>> + Send + 'static,
{
    let mut first = Some(first);
    task(name, OnExit::Restart, move |mut ctx| {
        let serving = first.take().map_or_else(&bind, Ok).map(&serve);
        async move {
            let serving = serving.map_err(|e| format!("bind: {e}"))?;
            ctx.until_stopped(async move {
                serving.await.map_err(|e| e.to_string())?;
                Err("ended".to_string())
            })
            .await
        }
    })
}
