//! The TCP path (the pod's retry after a truncated answer, or TCP by choice): each steered
//! connection gets its own connection to the server, and every length-prefixed answer on it
//! is held until learned before it is written back.

use super::answer;
use super::hold::Holder;
use crate::listener::fair::Gate;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Limits {
    /// Connections proxied at once; more are closed at once.
    pub connections: usize,
    /// Of those, one namespace's at most (all its pods together).
    pub per_namespace: usize,
    /// How long to wait for the server (connect, and each answer).
    pub upstream_timeout: Duration,
    /// How long a connection may sit without a query.
    pub idle_timeout: Duration,
}

/// The TCP side of the proxy: the slots and shares every TCP listener draws from.
#[derive(Clone)]
pub struct TcpProxy {
    holder: Holder,
    gate: Gate,
    limits: Arc<Limits>,
}

impl TcpProxy {
    pub fn new(holder: Holder, limits: Limits) -> TcpProxy {
        TcpProxy {
            holder,
            gate: Gate::new(limits.connections, limits.per_namespace),
            limits: Arc::new(limits),
        }
    }

    /// Serves the listener forever (running out of descriptors backs off: see
    /// `listener::accept_loop`).
    pub async fn serve(&self, listener: TcpListener) -> std::io::Result<()> {
        let holder = &self.holder;
        crate::listener::accept_loop("dns proxy (tcp)", &listener, |pod_conn, pod| {
            // With tproxy (or a listener at the resolver's address) the accepted socket's
            // local address is the server the pod connected to.
            let Ok(server) = pod_conn.local_addr() else {
                holder.metrics().error("tcp");
                return;
            };
            let Some(ticket) = holder.admit(&self.gate, pod.ip(), server.ip()) else {
                return;
            };
            let (holder, limits) = (holder.clone(), self.limits.clone());
            tokio::spawn(async move {
                let _ticket = ticket;
                if let Err(reason) = connection(&holder, pod_conn, pod.ip(), server, &limits).await
                {
                    holder.metrics().error(reason);
                }
            });
        })
        .await
    }
}

async fn connection(
    holder: &Holder,
    mut pod_conn: TcpStream,
    pod: std::net::IpAddr,
    server: std::net::SocketAddr,
    limits: &Limits,
) -> Result<(), &'static str> {
    let mut upstream = tokio::time::timeout(limits.upstream_timeout, TcpStream::connect(server))
        .await
        .map_err(|_| "upstream_timeout")?
        .map_err(|_| "upstream")?;
    loop {
        let query =
            match tokio::time::timeout(limits.idle_timeout, read_message(&mut pod_conn)).await {
                Ok(Ok(Some(q))) => q,
                // The pod closed, went idle, or sent a broken frame: done.
                _ => return Ok(()),
            };
        if !answer::is_query(&query) {
            return Err("malformed");
        }
        // A fresh ID upstream, the pod's own back (as on the UDP path).
        let id = answer::fresh_id().ok_or("random")?;
        let mut upstream_query = query.clone();
        answer::set_id(&mut upstream_query, id);
        write_message(&mut upstream, &upstream_query)
            .await
            .map_err(|_| "upstream")?;
        let mut answer = tokio::time::timeout(limits.upstream_timeout, read_message(&mut upstream))
            .await
            .map_err(|_| "upstream_timeout")?
            .map_err(|_| "upstream")?
            .ok_or("upstream")?;
        if answer::id(&answer) != id || !answer::answers_question(&query, &answer) {
            return Err("mismatch");
        }
        answer::set_id(&mut answer, answer::id(&query));
        holder.hold(pod, server.ip(), &answer).await;
        write_message(&mut pod_conn, &answer)
            .await
            .map_err(|_| "reply")?;
    }
}

/// One length-prefixed DNS message (RFC 1035 4.2.2); `None` at a clean end of stream. The
/// length is 16 bits, so a message never needs more than 64 KiB.
async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

async fn write_message<W: AsyncWrite + Unpin>(w: &mut W, msg: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| std::io::Error::other("message too long"))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    w.write_all(&framed).await
}
