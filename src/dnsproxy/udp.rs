//! The UDP path: a steered query to a trusted resolver is forwarded to it (from the node, so
//! it is not steered again) with a fresh random ID from a fresh connected socket (a random
//! source port; the kernel delivers only what comes from the resolver's address and port),
//! the answer counts only with that ID and the same question, is held until learned, then
//! sent to the pod with the pod's own ID from the server's address. Truncated answers (TC)
//! pass as they are: the pod retries over TCP, which the TCP path proxies. EDNS and every
//! other byte are forwarded untouched.

use super::hold::Holder;
use super::metrics::ProxyMetrics;
use super::{answer, socket};
use crate::listener::fair::{Gate, Shares};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// The largest DNS message (a datagram cannot be larger).
const MAX_MESSAGE: usize = 65_535;

pub struct Limits {
    /// Queries in flight at most; more are dropped (the pod's resolver retries).
    pub in_flight: usize,
    /// Of those, one namespace's at most (all its pods together).
    pub per_namespace: usize,
    /// Of a namespace's, those that came in on one interface at most (one routed pod, or
    /// a pod forging that namespace's addresses from its own interface).
    pub per_interface: usize,
    /// How long to wait for the server.
    pub upstream_timeout: Duration,
}

/// The UDP side of the proxy: the slots and shares every UDP listener (the `tproxy`
/// listener of each family, the resolver-address listeners) draws from.
#[derive(Clone)]
pub struct UdpProxy {
    holder: Holder,
    gate: Gate,
    per_interface: Shares<super::hold::InterfaceKey>,
    bridges: socket::Bridges,
    timeout: Duration,
    /// The listeners bound at a resolver's own address: answers to that resolver's queries
    /// leave through them (a second socket at that address could catch a pod's next query).
    replies: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>,
}

impl UdpProxy {
    pub fn new(holder: Holder, limits: Limits) -> UdpProxy {
        UdpProxy {
            holder,
            gate: Gate::new(limits.in_flight, limits.per_namespace),
            per_interface: Shares::new(limits.per_interface),
            bridges: socket::Bridges::default(),
            timeout: limits.upstream_timeout,
            replies: Arc::default(),
        }
    }

    /// Serves a listener bound at `server` (a resolver's address, port 53) until it is dropped
    /// from the set of replies or fails.
    pub async fn serve_at(&self, server: SocketAddr, listener: UdpSocket) -> std::io::Result<()> {
        let listener = Arc::new(listener);
        self.replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server, listener.clone());
        // Also when the task is aborted (the resolver is no longer trusted).
        let _unregister = Unregister(self.replies.clone(), server);
        self.serve_shared(&listener).await
    }

    /// Serves the listener until it fails.
    pub async fn serve(&self, listener: UdpSocket) -> std::io::Result<()> {
        self.serve_shared(&Arc::new(listener)).await
    }

    async fn serve_shared(&self, listener: &Arc<UdpSocket>) -> std::io::Result<()> {
        let holder = &self.holder;
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let got = match listener
                .async_io(Interest::READABLE, || {
                    socket::recv_with_orig_dst(listener, &mut buf)
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
            let (n, pod, server) = (got.len, got.from, got.orig_dst);
            if n > buf.len() || !answer::is_query(&buf[..n]) {
                holder.metrics().error("malformed");
                continue;
            }
            let gates = (&self.gate, &self.per_interface);
            let input = (got.ifindex, self.bridges.is_bridge(got.ifindex));
            let Some(ticket) = holder.admit_on(gates.0, gates.1, input, pod.ip(), server.ip())
            else {
                continue;
            };
            let query = buf[..n].to_vec();
            let proxy = self.clone();
            tokio::spawn(async move {
                let _ticket = ticket;
                if let Err(reason) = proxy.exchange(&query, pod, server).await {
                    proxy.holder.metrics().error(reason);
                }
            });
        }
    }

    /// One query: forward, wait, hold, answer.
    async fn exchange(
        &self,
        query: &[u8],
        pod: SocketAddr,
        server: SocketAddr,
    ) -> Result<(), &'static str> {
        let mut answer = exchange(query, server, self.timeout, self.holder.metrics()).await?;
        self.holder.hold(pod.ip(), server.ip(), &answer).await;
        answer::set_id(&mut answer, answer::id(query));
        let bound = self
            .replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&server)
            .cloned();
        match bound {
            Some(listener) => listener.send_to(&answer, pod).await,
            None => {
                let reply = socket::answer_socket(server).map_err(|_| "reply")?;
                reply.send_to(&answer, pod).await
            }
        }
        .map_err(|_| "reply")?;
        Ok(())
    }
}

struct Unregister(Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>, SocketAddr);

impl Drop for Unregister {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// Sends `query` to `server` with a fresh ID from a fresh connected socket and returns the
/// answer to it (still with that ID).
async fn exchange(
    query: &[u8],
    server: SocketAddr,
    timeout: Duration,
    metrics: &ProxyMetrics,
) -> Result<Vec<u8>, &'static str> {
    let local: SocketAddr = if server.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let id = answer::fresh_id().ok_or("random")?;
    let mut upstream_query = query.to_vec();
    answer::set_id(&mut upstream_query, id);
    let upstream = UdpSocket::bind(local).await.map_err(|_| "upstream")?;
    upstream.connect(server).await.map_err(|_| "upstream")?;
    upstream
        .send(&upstream_query)
        .await
        .map_err(|_| "upstream")?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let n = tokio::time::timeout_at(deadline, upstream.recv(&mut buf))
            .await
            .map_err(|_| "upstream_timeout")?
            .map_err(|_| "upstream")?;
        // Only the answer to this query (its ID, its question) goes back; anything else is
        // ignored, and does not end the wait (a forger cannot cut the real answer off).
        if answer::id(&buf[..n]) == id && answer::answers_question(query, &buf[..n]) {
            buf.truncate(n);
            return Ok(buf);
        }
        metrics.error("mismatch");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    fn query(name: &str, id: u16) -> Vec<u8> {
        let mut q = Message::query();
        q.metadata.id = id;
        q.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        q.to_vec().unwrap()
    }

    /// A resolver that first sends forgeries (the pod's own ID; the right ID with another
    /// question), then the real answer: only the real one counts.
    #[tokio::test]
    async fn only_the_answer_with_the_fresh_id_and_the_same_question_counts() {
        let resolver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server = resolver.local_addr().unwrap();
        let pod_query = query("a.example.com.", 0x1234);
        let fake = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let (n, from) = resolver.recv_from(&mut buf).await.unwrap();
            let id = answer::id(&buf[..n]);
            let respond = |name: &str, id: u16| {
                let mut m = Message::from_vec(&query(name, id)).unwrap();
                m.metadata.message_type = hickory_proto::op::MessageType::Response;
                m.to_vec().unwrap()
            };
            for forged in [
                respond("a.example.com.", 0x1234),
                respond("b.example.com.", id),
            ] {
                resolver.send_to(&forged, from).await.unwrap();
            }
            resolver
                .send_to(&respond("a.example.com.", id), from)
                .await
                .unwrap();
            id
        });
        let metrics = ProxyMetrics::default();
        let got = exchange(&pod_query, server, Duration::from_secs(5), &metrics)
            .await
            .unwrap();
        let upstream_id = fake.await.unwrap();
        assert_ne!(upstream_id, 0x1234, "the pod's ID went upstream");
        assert_eq!(answer::id(&got), upstream_id);
        assert!(answer::answers_question(&pod_query, &got));
    }
}
