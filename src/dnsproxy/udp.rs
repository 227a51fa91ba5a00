//! The UDP path: a steered query is forwarded to the server it was addressed to (from the
//! node, so it is not steered again), the answer is held until learned, then sent to the pod
//! from the server's address. Truncated answers (TC) pass as they are: the pod retries over
//! TCP, which the TCP path proxies. EDNS and every other byte are forwarded untouched.

use super::fair::PerPod;
use super::hold::Holder;
use super::{answer, socket};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// The largest DNS message (a datagram cannot be larger).
const MAX_MESSAGE: usize = 65_535;

pub struct Limits {
    /// Queries in flight at most; more are dropped (the pod's resolver retries).
    pub in_flight: usize,
    /// Of those, one pod's at most.
    pub per_pod: usize,
    /// How long to wait for the server.
    pub upstream_timeout: Duration,
}

/// Serves the listener until it fails.
pub async fn serve(listener: UdpSocket, holder: Holder, limits: Limits) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.in_flight));
    let fair = PerPod::new(limits.per_pod);
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (n, pod, server) = match listener
            .async_io(Interest::READABLE, || {
                socket::recv_with_orig_dst(&listener, &mut buf)
            })
            .await
        {
            Ok(got) => got,
            // A datagram without its destination, a pending ICMP error...: skip it.
            Err(_) => {
                holder.metrics().error("receive");
                continue;
            }
        };
        if n > buf.len() {
            holder.metrics().error("malformed");
            continue;
        }
        if !answer::is_query(&buf[..n]) {
            holder.metrics().error("malformed");
            continue;
        }
        let Some(share) = fair.try_acquire(pod.ip()) else {
            holder.metrics().error("overload");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            holder.metrics().error("overload");
            continue;
        };
        let query = buf[..n].to_vec();
        let holder = holder.clone();
        let timeout = limits.upstream_timeout;
        tokio::spawn(async move {
            let _slot = (slot, share);
            if let Err(reason) = exchange(&holder, &query, pod, server, timeout).await {
                holder.metrics().error(reason);
            }
        });
    }
}

/// One query: forward, wait, hold, answer.
async fn exchange(
    holder: &Holder,
    query: &[u8],
    pod: SocketAddr,
    server: SocketAddr,
    timeout: Duration,
) -> Result<(), &'static str> {
    let local: SocketAddr = if server.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let upstream = UdpSocket::bind(local).await.map_err(|_| "upstream")?;
    upstream.connect(server).await.map_err(|_| "upstream")?;
    upstream.send(query).await.map_err(|_| "upstream")?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = loop {
        let n = tokio::time::timeout(timeout, upstream.recv(&mut buf))
            .await
            .map_err(|_| "upstream_timeout")?
            .map_err(|_| "upstream")?;
        // Only the answer to this query (same ID) goes back; anything else is ignored.
        if n >= 2 && query.len() >= 2 && buf[..2] == query[..2] {
            break n;
        }
    };
    let answer = &buf[..n];
    holder.hold(pod.ip(), answer).await;
    let reply = socket::answer_socket(server).map_err(|_| "reply")?;
    reply.send_to(answer, pod).await.map_err(|_| "reply")?;
    Ok(())
}
