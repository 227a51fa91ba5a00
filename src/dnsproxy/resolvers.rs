//! Listeners at each trusted resolver's own address, port 53, and at each endpoint of a
//! ClusterIP resolver (its address and target port), beside the `tproxy` listeners.
//!
//! With `br_netfilter`, a bridged pod's packet passes the inet prerouting hook in the
//! bridge's context, before the IP layer's receive path, which drops the socket `tproxy`
//! assigned (`ip_rcv_core` orphans the packet). Delivered locally by its mark all the same,
//! the query then finds its socket by destination address and port (after service DNAT, an
//! endpoint's): one of these. Without them every steered lookup of a bridged pod fails
//! (`Udp: NoPorts`). An address that is the node's own (a node-local cache) gets none: its
//! server owns the port.

use super::socket;
use super::tcp::TcpProxy;
use super::udp::UdpProxy;
use crate::plan::firewall::learning::Learning;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Keeps one UDP and one TCP listener per trusted resolver and endpoint of one, following
/// `learning`.
pub async fn maintain(udp: UdpProxy, tcp: TcpProxy, mut learning: watch::Receiver<Arc<Learning>>) {
    // Address -> its serving tasks (none when it is local or could not be bound).
    let mut bound = Serving::default();
    let bound = &mut bound.0;
    loop {
        let wanted = learning.borrow_and_update().listen_at();
        bound.retain(|addr, tasks| {
            let keep = wanted.contains(addr);
            if !keep {
                tasks.iter().for_each(AbortHandle::abort);
            }
            keep
        });
        for addr in wanted {
            if bound.contains_key(&addr) {
                continue;
            }
            let tasks = if socket::is_local(addr.ip()) {
                Vec::new()
            } else {
                listen(&udp, &tcp, addr)
            };
            bound.insert(addr, tasks);
        }
        if learning.changed().await.is_err() {
            return;
        }
    }
}

/// The resolvers' serving tasks, aborted with the task that keeps them.
#[derive(Default)]
struct Serving(BTreeMap<SocketAddr, Vec<AbortHandle>>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.values().flatten().for_each(AbortHandle::abort);
    }
}

fn listen(udp: &UdpProxy, tcp: &TcpProxy, server: SocketAddr) -> Vec<AbortHandle> {
    let (u, t) = match (
        socket::udp_listener_at(server),
        socket::tcp_listener_at(server, 256),
    ) {
        (Ok(u), Ok(t)) => (u, t),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(
                "dns proxy: no listener at {server} (bridged pods with br_netfilter cannot be proxied to it): {e}"
            );
            return Vec::new();
        }
    };
    let (udp, tcp) = (udp.clone(), tcp.clone());
    vec![
        tokio::spawn(async move {
            if let Err(e) = udp.serve_at(server, u).await {
                tracing::error!("dns proxy (udp at {server}) stopped: {e}");
            }
        })
        .abort_handle(),
        tokio::spawn(async move {
            if let Err(e) = tcp.serve(t).await {
                tracing::error!("dns proxy (tcp at {server}) stopped: {e}");
            }
        })
        .abort_handle(),
    ]
}
