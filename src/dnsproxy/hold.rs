//! Holding an answer: parse it, have the learner write its addresses (on the learner's own
//! thread: netlink calls block), wait for the kernel's acknowledgement, then let it go.
//!
//! The keep-alive pass (which addresses still have live flows) dumps conntrack on its own
//! thread: the dump grows with the node's conntrack table, and an answer must never wait for
//! it. The learner only gets the flows from steered pods, which cost it O(those flows). The
//! dump only runs when a learned element expires within the pass's horizon: the kernel's side
//! of a dump of 20,000 entries alone is ~70 ms of CPU, which a 2-vCPU node's answers feel.

use super::answer;
use super::learn::Learner;
use super::metrics::ProxyMetrics;
use crate::listener::fair::{Gate, Share, Shares, Ticket};
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// A namespace, an input interface (its index) and, when that interface is a bridge (whose
/// ports' pods all come in on it when `br_netfilter` is off), the source address: the key
/// of a per-interface sub-share.
pub type InterfaceKey = (Arc<str>, u32, Option<IpAddr>);

/// How often learned addresses with live conntrack flows are extended (half the default
/// floor, so an element in use is extended before it expires).
const KEEP_ALIVE_PERIOD: Duration = Duration::from_millis(2500);
/// A pass extends the elements that expire within this (two periods: one pass may be late).
const HORIZON: Duration = KEEP_ALIVE_PERIOD.saturating_mul(2);
/// Every this many keep-alive periods, the learner forgets what expired.
const FORGET_EVERY: u32 = 12;

/// Answers written in one netlink batch at most.
const MAX_BATCH: usize = 256;

/// Answers waiting for the learner at most; beyond, answers pass without being learned
/// (counted as `learner_busy` errors) rather than pile up.
const QUEUE: usize = 4096;

enum Job {
    Answer {
        pod: IpAddr,
        answer: answer::Answer,
        done: oneshot::Sender<()>,
    },
    /// Live (steered pod, destination) flows from the keep-alive thread.
    KeepAlive {
        flows: BTreeSet<(IpAddr, IpAddr)>,
        forget: bool,
    },
}

/// The handle the UDP and TCP paths share.
#[derive(Clone)]
pub struct Holder {
    jobs: SyncSender<Job>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
}

impl Holder {
    /// Starts the learner and keep-alive threads.
    pub fn start<B: NftBackend + Send + 'static>(
        learner: Learner<B>,
        learning: watch::Receiver<Arc<Learning>>,
        metrics: ProxyMetrics,
    ) -> Holder {
        let (jobs, rx) = sync_channel::<Job>(QUEUE);
        let next_expiry = NextExpiry::default();
        let (l, m, r) = (learning.clone(), metrics.clone(), next_expiry.clone());
        std::thread::Builder::new()
            .name("dns-learner".into())
            .spawn(move || learn_loop(learner, rx, l, m, r))
            .expect("spawn the learner thread");
        let (l, m, j) = (learning.clone(), metrics.clone(), jobs.clone());
        std::thread::Builder::new()
            .name("dns-keepalive".into())
            .spawn(move || keep_alive_loop(j, l, m, next_expiry))
            .expect("spawn the keep-alive thread");
        Holder {
            jobs,
            learning,
            metrics,
        }
    }

    /// Whose share a query of `pod` to `server` takes (its namespace; a pod the proxy does
    /// not know yet counts alone), or `None` when `server` is not a trusted resolver.
    fn tenant(&self, pod: IpAddr, server: IpAddr) -> Option<Arc<str>> {
        let learning = self.learning.borrow();
        if !learning.is_trusted(server) {
            return None;
        }
        Some(
            learning
                .namespace(pod)
                .cloned()
                .unwrap_or_else(|| pod.to_string().into()),
        )
    }

    /// A ticket through `gate` for a query of `pod` to `server`, or `None`, counted as an
    /// error: `untrusted` when `server` is not a trusted resolver (the steering is being
    /// updated: never learned from), `overload` when the namespace's share or every slot is
    /// taken.
    pub fn admit(&self, gate: &Gate, pod: IpAddr, server: IpAddr) -> Option<Ticket> {
        let Some(tenant) = self.tenant(pod, server) else {
            self.metrics.error("untrusted");
            return None;
        };
        let ticket = gate.admit(tenant);
        if ticket.is_none() {
            self.metrics.error("overload");
        }
        ticket
    }

    /// [`Holder::admit`] for a query that came in on interface `ifindex`, which also takes
    /// one of `per_interface` for (namespace, interface): a pod that forges its neighbour's
    /// source address sends on its own interface, so it takes at most that sub-share of the
    /// neighbour's namespace share, never all of it. On a bridge (`bridged`), which every pod
    /// behind it comes in on, the sub-share is per (namespace, bridge, source address):
    /// a pod flooding with its own address leaves its bridge neighbours theirs.
    pub fn admit_on(
        &self,
        gate: &Gate,
        per_interface: &Shares<InterfaceKey>,
        (ifindex, bridged): (u32, bool),
        pod: IpAddr,
        server: IpAddr,
    ) -> Option<(Ticket, Share<InterfaceKey>)> {
        let Some(tenant) = self.tenant(pod, server) else {
            self.metrics.error("untrusted");
            return None;
        };
        let admitted = per_interface
            .try_acquire((tenant.clone(), ifindex, bridged.then_some(pod)))
            .and_then(|share| Some((gate.admit(tenant)?, share)));
        if admitted.is_none() {
            self.metrics.error("overload");
        }
        admitted
    }

    /// Returns once what `bytes` (an answer to `pod` from `server`) teaches is in the
    /// kernel, or at once when it teaches nothing (other names, or not a trusted resolver).
    pub async fn hold(&self, pod: IpAddr, server: IpAddr, bytes: &[u8]) {
        let started = Instant::now();
        let Some(answer) = answer::parse(bytes) else {
            return;
        };
        self.metrics.answer();
        let watched = {
            let learning = self.learning.borrow();
            learning.is_trusted(server) && learning.matching(pod, &answer.name).next().is_some()
        };
        if !watched || answer.addresses.is_empty() {
            return;
        }
        let (done, wait) = oneshot::channel();
        match self.jobs.try_send(Job::Answer { pod, answer, done }) {
            Ok(()) => {
                let _ = wait.await;
                self.metrics.held(started.elapsed());
            }
            Err(TrySendError::Full(_)) => self.metrics.error("learner_busy"),
            Err(TrySendError::Disconnected(_)) => self.metrics.error("learner_gone"),
        }
    }

    pub fn metrics(&self) -> &ProxyMetrics {
        &self.metrics
    }
}

/// The learner thread: answers (what queued up while the last batch was in the kernel goes
/// in one batch) and keep-alive results, in arrival order.
fn learn_loop<B: NftBackend>(
    mut learner: Learner<B>,
    rx: Receiver<Job>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
    next_expiry: NextExpiry,
) {
    let mut pending = None;
    loop {
        let job = match pending.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let current = learning.borrow().clone();
        match job {
            Job::KeepAlive { flows, forget } => {
                let now = Instant::now();
                if forget {
                    learner.forget_expired(now);
                }
                match learner.keep_alive(&current, &flows, HORIZON, now) {
                    Ok(l) => {
                        tracing::debug!(
                            flows = flows.len(),
                            extended = l.written,
                            "dns proxy keep-alive"
                        );
                        metrics.learned(l.written);
                    }
                    Err(e) => {
                        tracing::warn!("dns proxy: keep-alive failed: {e:#}");
                        metrics.error("learn");
                    }
                }
            }
            Job::Answer { pod, answer, done } => {
                let mut answers = vec![(pod, answer, done)];
                while answers.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(Job::Answer { pod, answer, done }) => answers.push((pod, answer, done)),
                        Ok(other) => {
                            pending = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let batch: Vec<(IpAddr, &answer::Answer)> =
                    answers.iter().map(|(p, a, _)| (*p, a)).collect();
                match learner.learn_all(&current, &batch, Instant::now()) {
                    Ok(l) => {
                        metrics.learned(l.written);
                        metrics.evicted(l.evicted);
                    }
                    Err(e) => {
                        tracing::warn!("dns proxy: learning failed: {e:#}");
                        metrics.error("learn");
                    }
                }
                for (_, _, done) in answers {
                    let _ = done.send(());
                }
            }
        }
        next_expiry.set(learner.next_expiry(Instant::now()));
    }
}

/// When the learner's soonest element expires (`None`: it remembers none), as of its last
/// job: the keep-alive thread dumps conntrack only when a pass could extend something.
#[derive(Clone, Default)]
struct NextExpiry(Arc<Mutex<Option<Instant>>>);

impl NextExpiry {
    fn set(&self, at: Option<Instant>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// Whether an element may expire within the horizon of a pass at `now` (an instant
    /// that passed since the learner's last job counts: what follows it is unknown).
    fn due(&self, now: Instant) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at <= now + HORIZON)
    }
}

/// The keep-alive thread: every period in which a learned element may expire within the
/// horizon, one conntrack dump, reduced to the flows of steered pods, handed to the learner;
/// every [`FORGET_EVERY`] periods, the learner forgets what expired.
fn keep_alive_loop(
    jobs: SyncSender<Job>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
    next_expiry: NextExpiry,
) {
    let mut period = 0u32;
    loop {
        std::thread::sleep(KEEP_ALIVE_PERIOD);
        period = period.wrapping_add(1);
        let forget = period.is_multiple_of(FORGET_EVERY);
        let flows = if next_expiry.due(Instant::now()) {
            match live_flows(&learning) {
                Ok(flows) => flows,
                Err(e) => {
                    tracing::warn!("dns proxy: conntrack dump failed: {e}");
                    metrics.error("conntrack");
                    continue;
                }
            }
        } else if forget {
            BTreeSet::new()
        } else {
            continue;
        };
        match jobs.try_send(Job::KeepAlive { flows, forget }) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// The (source, destination) of every live conntrack flow from a steered pod.
fn live_flows(
    learning: &watch::Receiver<Arc<Learning>>,
) -> std::io::Result<BTreeSet<(IpAddr, IpAddr)>> {
    let all = crate::conntrack::flow_endpoints()?;
    let current = learning.borrow();
    Ok(all
        .into_iter()
        .filter(|(src, _)| !current.targets(*src).is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_dumps_only_when_an_element_may_expire_within_its_horizon() {
        let next = NextExpiry::default();
        let now = Instant::now();
        assert!(!next.due(now), "nothing learned");
        next.set(Some(now + HORIZON + Duration::from_millis(1)));
        assert!(
            !next.due(now),
            "expires after the horizon: the next pass is in time"
        );
        next.set(Some(now + HORIZON));
        assert!(next.due(now));
        next.set(Some(now));
        assert!(
            next.due(now + Duration::from_secs(60)),
            "passed since the learner's last job: due"
        );
    }
}
