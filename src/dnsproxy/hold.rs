//! Holding an answer: parse it, have the learner write its addresses (on the learner's own
//! thread: netlink calls block), wait for the kernel's acknowledgement, then let it go.

use super::answer;
use super::learn::Learner;
use super::metrics::ProxyMetrics;
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// How often learned addresses with live conntrack flows are extended (half the default
/// floor, so an element in use is extended before it expires).
const KEEP_ALIVE_PERIOD: Duration = Duration::from_millis(2500);

/// One keep-alive pass: a conntrack dump, then one batch for what is about to expire.
fn keep_alive<B: NftBackend>(
    learner: &mut Learner<B>,
    learning: &watch::Receiver<Arc<Learning>>,
    metrics: &ProxyMetrics,
) {
    if !learner.remembers_any() {
        return;
    }
    let flows = match crate::conntrack::flow_endpoints() {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("dns proxy: conntrack dump failed: {e}");
            metrics.error("conntrack");
            return;
        }
    };
    let current = learning.borrow().clone();
    match learner.keep_alive(&current, &flows, 2 * KEEP_ALIVE_PERIOD, Instant::now()) {
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

/// Answers written in one netlink batch at most.
const MAX_BATCH: usize = 256;

/// Answers waiting for the learner at most; beyond, answers pass without being learned
/// (counted as `learner_busy` errors) rather than pile up.
const QUEUE: usize = 4096;

struct Job {
    pod: IpAddr,
    answer: answer::Answer,
    done: oneshot::Sender<()>,
}

/// The handle the UDP and TCP paths share.
#[derive(Clone)]
pub struct Holder {
    jobs: SyncSender<Job>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
}

impl Holder {
    /// Starts the learner thread.
    pub fn start<B: NftBackend + Send + 'static>(
        mut learner: Learner<B>,
        learning: watch::Receiver<Arc<Learning>>,
        metrics: ProxyMetrics,
    ) -> Holder {
        let (jobs, rx) = sync_channel::<Job>(QUEUE);
        let (thread_learning, thread_metrics) = (learning.clone(), metrics.clone());
        std::thread::Builder::new()
            .name("dns-learner".into())
            .spawn(move || {
                let mut next_pass = Instant::now() + KEEP_ALIVE_PERIOD;
                loop {
                    let job = match rx
                        .recv_timeout(next_pass.saturating_duration_since(Instant::now()))
                    {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            next_pass = Instant::now() + KEEP_ALIVE_PERIOD;
                            keep_alive(&mut learner, &thread_learning, &thread_metrics);
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    };
                    // What queued up while the last batch was in the kernel goes in one batch.
                    let mut jobs = vec![job];
                    while jobs.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(more) => jobs.push(more),
                            Err(_) => break,
                        }
                    }
                    let current = thread_learning.borrow().clone();
                    let answers: Vec<(IpAddr, &answer::Answer)> =
                        jobs.iter().map(|j| (j.pod, &j.answer)).collect();
                    match learner.learn_all(&current, &answers, Instant::now()) {
                        Ok(l) => thread_metrics.learned(l.written),
                        Err(e) => {
                            tracing::warn!("dns proxy: learning failed: {e:#}");
                            thread_metrics.error("learn");
                        }
                    }
                    for job in jobs {
                        let _ = job.done.send(());
                    }
                }
            })
            .expect("spawn the learner thread");
        Holder {
            jobs,
            learning,
            metrics,
        }
    }

    /// Returns once what `bytes` (an answer to `pod`) teaches is in the kernel, or at once
    /// when it teaches nothing.
    pub async fn hold(&self, pod: IpAddr, bytes: &[u8]) {
        let started = Instant::now();
        let Some(answer) = answer::parse(bytes) else {
            return;
        };
        self.metrics.answer();
        let watched = self
            .learning
            .borrow()
            .matching(pod, &answer.name)
            .next()
            .is_some();
        if !watched || answer.addresses.is_empty() {
            return;
        }
        let (done, wait) = oneshot::channel();
        match self.jobs.try_send(Job { pod, answer, done }) {
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
