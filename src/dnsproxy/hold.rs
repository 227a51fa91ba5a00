//! Holding an answer: parse it, have the learner write its addresses (on the learner's own
//! thread: netlink calls block), wait for the kernel's acknowledgement, then let it go.
//!
//! The keep-alive pass (which addresses still have live flows) dumps conntrack on its own
//! thread: the dump grows with the node's conntrack table, and an answer must never wait for
//! it. The learner only gets the flows from steered pods, which cost it O(those flows).

use super::answer;
use super::learn::Learner;
use super::metrics::ProxyMetrics;
use crate::listener::fair::{Gate, Share, Shares, Ticket};
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// A namespace, an input interface (its index) and, when that interface is a bridge (whose
/// ports' pods all come in on it when `br_netfilter` is off), the source address: the key
/// of a per-interface sub-share.
pub type InterfaceKey = (Arc<str>, u32, Option<IpAddr>);

/// How often learned addresses with live conntrack flows are extended (half the default
/// floor, so an element in use is extended before it expires).
const KEEP_ALIVE_PERIOD: Duration = Duration::from_millis(2500);
/// Every this many keep-alive passes, the learner forgets what expired.
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
        let remembers = Arc::new(AtomicBool::new(false));
        let (l, m, r) = (learning.clone(), metrics.clone(), remembers.clone());
        std::thread::Builder::new()
            .name("dns-learner".into())
            .spawn(move || learn_loop(learner, rx, l, m, r))
            .expect("spawn the learner thread");
        let (l, m, j) = (learning.clone(), metrics.clone(), jobs.clone());
        std::thread::Builder::new()
            .name("dns-keepalive".into())
            .spawn(move || keep_alive_loop(j, l, m, remembers))
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
    remembers: Arc<AtomicBool>,
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
                match learner.keep_alive(&current, &flows, 2 * KEEP_ALIVE_PERIOD, now) {
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
        remembers.store(learner.remembers_any(), Ordering::Relaxed);
    }
}

/// The keep-alive thread: every period, while anything is learned, one conntrack dump,
/// reduced to the flows of steered pods, handed to the learner.
fn keep_alive_loop(
    jobs: SyncSender<Job>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
    remembers: Arc<AtomicBool>,
) {
    let mut pass = 0u32;
    loop {
        std::thread::sleep(KEEP_ALIVE_PERIOD);
        if !remembers.load(Ordering::Relaxed) {
            continue;
        }
        pass = pass.wrapping_add(1);
        let all = match crate::conntrack::flow_endpoints() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("dns proxy: conntrack dump failed: {e}");
                metrics.error("conntrack");
                continue;
            }
        };
        let flows: BTreeSet<(IpAddr, IpAddr)> = {
            let current = learning.borrow();
            all.into_iter()
                .filter(|(src, _)| !current.targets(*src).is_empty())
                .collect()
        };
        let forget = pass.is_multiple_of(FORGET_EVERY);
        match jobs.try_send(Job::KeepAlive { flows, forget }) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}
