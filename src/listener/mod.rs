//! What every listener of the agent shares, so that no client (a pod holding idle
//! connections, a flood) can exhaust the agent's descriptors or stop a listener:
//! - admission through a [`fair::Gate`]: a cap on connections per listener and per source
//!   address (per namespace at the DNS proxy);
//! - an accept loop that survives `EMFILE`/`ENFILE` (backs off, never returns);
//! - for HTTP ([`http`]): a header-read timeout that is also the keep-alive idle timeout,
//!   and a lifetime cap per connection;
//! - [`raise_nofile_limit`]: the soft descriptor limit raised to the hard one at start.

pub mod fair;
pub mod http;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// A listener's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub connections: usize,
    /// Of those, from one source address.
    pub per_source: usize,
    /// To read a request's headers, and the longest a kept-alive connection waits idle.
    pub header_timeout: Duration,
    /// The longest a connection lives, however busy (a client that never reads its answer).
    pub lifetime: Duration,
}

impl Limits {
    /// The admin server (loopback): the node's own tools.
    pub const ADMIN: Limits = Limits {
        connections: 64,
        per_source: 32,
        header_timeout: Duration::from_secs(10),
        lifetime: Duration::from_secs(60),
    };
    /// The metrics server (`:10249`): scrapers.
    pub const METRICS: Limits = Limits {
        connections: 64,
        per_source: 8,
        header_timeout: Duration::from_secs(10),
        lifetime: Duration::from_secs(60),
    };
    /// kube-proxy's `:10256` and the `healthCheckNodePort`s (one gate for all of them):
    /// load balancers' health checkers, a few connections each.
    pub const HEALTH: Limits = Limits {
        connections: 256,
        per_source: 16,
        header_timeout: Duration::from_secs(5),
        lifetime: Duration::from_secs(30),
    };
}

/// Connections admitted per source address.
pub type SourceGate = fair::Gate<IpAddr>;

impl Limits {
    pub fn gate(&self) -> SourceGate {
        fair::Gate::new(self.connections, self.per_source)
    }
}

/// Accepts from `listener` forever, handing each admitted connection to `admit` (which
/// spawns its handling). A connection over the caps is closed at once. Running out of
/// descriptors (or kernel memory) backs off, 10 ms doubling to 1 s, and is logged at most
/// every 10 s; other accept errors (a client that reset before the accept) are skipped.
pub async fn accept_loop<F>(name: &str, listener: &TcpListener, mut admit: F) -> !
where
    F: FnMut(TcpStream, SocketAddr),
{
    let mut backoff = Duration::from_millis(10);
    let mut last_warning: Option<Instant> = None;
    let mut refused_since_warning = 0u64;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                backoff = Duration::from_millis(10);
                admit(stream, peer);
            }
            Err(e) if is_exhaustion(&e) => {
                refused_since_warning += 1;
                if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    warn!(
                        "{name}: accept: {e} ({refused_since_warning} times since the last \
                         warning); backing off"
                    );
                    last_warning = Some(Instant::now());
                    refused_since_warning = 0;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => debug!("{name}: accept: {e}"),
        }
    }
}

/// Out of descriptors or kernel memory: waiting helps, a busy retry does not.
fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd and containerd start services
/// with a soft 1,024) and logs both. Returns the limit in force.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                info!("open files: soft limit raised from {soft} to the hard limit {hard}");
                hard
            }
            Err(e) => {
                warn!("open files: soft limit {soft} (hard {hard}) could not be raised: {e}");
                soft
            }
        },
        Ok((soft, hard)) => {
            info!("open files: soft limit {soft}, hard limit {hard}");
            soft
        }
        Err(e) => {
            warn!("open files: limit unknown: {e}");
            0
        }
    }
}
