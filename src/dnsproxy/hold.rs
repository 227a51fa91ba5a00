//! Holding an answer: parse it, have the learner write its addresses (on the learner's own
//! thread: netlink calls block), wait for the kernel's acknowledgement, then let it go.

use super::answer;
use super::learn::Learner;
use super::metrics::ProxyMetrics;
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::Instant;
use tokio::sync::{oneshot, watch};

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
                while let Ok(job) = rx.recv() {
                    let current = thread_learning.borrow().clone();
                    match learner.learn(&current, job.pod, &job.answer, Instant::now()) {
                        Ok(l) => thread_metrics.learned(l.written),
                        Err(e) => {
                            tracing::warn!("dns proxy: learning failed: {e:#}");
                            thread_metrics.error("learn");
                        }
                    }
                    let _ = job.done.send(());
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
