//! Who writes the learned sets, and when: the thread of the answer itself, at once.
//!
//! A held answer is queued, and its task takes the learner if no one holds it: it writes
//! what is queued (its own answer and any that queued up meanwhile, in one netlink batch of
//! up to [`MAX_BATCH`]). An answer that finds the learner taken waits: the holder, after
//! its batch, looks at the queue again and calls on one waiting task to write the next
//! batch, so no answer is left behind and no task writes others' answers for longer than
//! one batch. No thread hop, no timer: an answer alone on the node is written by its own
//! task, and answers that arrive together share one batch (flat combining).
//!
//! The keep-alive pass (which addresses still have live flows) dumps conntrack on its own
//! thread: the dump grows with the node's conntrack table and nothing is locked meanwhile;
//! only the flows of steered pods reach the learner, which costs it O(those flows).

use super::answer::Answer;
use super::learn::{Learned, Learner};
use super::metrics::ProxyMetrics;
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, oneshot, watch};

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

/// An answer waiting to be written; `done` fires once the kernel acknowledged (or refused).
struct Queued {
    pod: IpAddr,
    answer: Answer,
    done: oneshot::Sender<()>,
}

/// The learner's operations the writer needs, without its backend's type.
trait Book: Send {
    fn learn_all(
        &mut self,
        learning: &Learning,
        answers: &[(IpAddr, &Answer)],
        now: Instant,
    ) -> anyhow::Result<Learned>;
    fn keep_alive(
        &mut self,
        learning: &Learning,
        flows: &BTreeSet<(IpAddr, IpAddr)>,
        horizon: Duration,
        now: Instant,
    ) -> anyhow::Result<Learned>;
    fn forget_expired(&mut self, now: Instant);
    fn remembers_any(&self) -> bool;
}

impl<B: NftBackend + Send> Book for Learner<B> {
    fn learn_all(
        &mut self,
        learning: &Learning,
        answers: &[(IpAddr, &Answer)],
        now: Instant,
    ) -> anyhow::Result<Learned> {
        Learner::learn_all(self, learning, answers, now)
    }
    fn keep_alive(
        &mut self,
        learning: &Learning,
        flows: &BTreeSet<(IpAddr, IpAddr)>,
        horizon: Duration,
        now: Instant,
    ) -> anyhow::Result<Learned> {
        Learner::keep_alive(self, learning, flows, horizon, now)
    }
    fn forget_expired(&mut self, now: Instant) {
        Learner::forget_expired(self, now)
    }
    fn remembers_any(&self) -> bool {
        Learner::remembers_any(self)
    }
}

/// The learner and the answers waiting for it; shared by every answer's task and the
/// keep-alive thread.
pub struct Writer {
    book: Mutex<Box<dyn Book>>,
    queue: Mutex<Vec<Queued>>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
    /// Whether anything is learned (a keep-alive pass has something to do).
    remembers: AtomicBool,
    /// Called on when answers are queued and the learner is free.
    turn: Notify,
}

impl Writer {
    /// The writer, and its keep-alive thread started.
    pub fn start<B: NftBackend + Send + 'static>(
        learner: Learner<B>,
        learning: watch::Receiver<Arc<Learning>>,
        metrics: ProxyMetrics,
    ) -> Arc<Writer> {
        let writer = Arc::new(Writer::new(learner, learning, metrics));
        let w = writer.clone();
        std::thread::Builder::new()
            .name("dns-keepalive".into())
            .spawn(move || keep_alive_loop(&w))
            .expect("spawn the keep-alive thread");
        writer
    }

    fn new<B: NftBackend + Send + 'static>(
        learner: Learner<B>,
        learning: watch::Receiver<Arc<Learning>>,
        metrics: ProxyMetrics,
    ) -> Writer {
        Writer {
            book: Mutex::new(Box::new(learner)),
            queue: Mutex::new(Vec::new()),
            learning,
            metrics,
            remembers: AtomicBool::new(false),
            turn: Notify::new(),
        }
    }

    /// Returns once `answer`'s addresses are written (acknowledged or refused): written on
    /// this task when the learner is free, else by its holder or when this task is called
    /// on. False, at once, when [`QUEUE`] answers wait already (nothing is written).
    pub async fn write(&self, pod: IpAddr, answer: Answer) -> bool {
        let Some(mut written) = self.queue(pod, answer) else {
            return false;
        };
        blocking(|| self.write_queued());
        loop {
            tokio::select! {
                biased;
                _ = &mut written => return true,
                _ = self.turn() => blocking(|| self.write_queued()),
            }
        }
    }

    /// Queues `answer`; `None` (nothing queued) when [`QUEUE`] answers wait already.
    fn queue(&self, pod: IpAddr, answer: Answer) -> Option<oneshot::Receiver<()>> {
        let mut queue = lock(&self.queue);
        if queue.len() >= QUEUE {
            return None;
        }
        let (done, wait) = oneshot::channel();
        queue.push(Queued { pod, answer, done });
        Some(wait)
    }

    /// Writes one batch of what is queued on this thread, unless another thread holds the
    /// learner (that one writes it). Blocks for the netlink round trip: an async caller
    /// runs it through [`blocking`].
    fn write_queued(&self) {
        if let Some(book) = try_lock(&self.book) {
            self.write_and_hand_over(book);
        }
    }

    /// Resolves when what is queued needs a writer: a task whose answer waits runs
    /// `write_queued` then.
    fn turn(&self) -> Notified<'_> {
        self.turn.notified()
    }

    /// Runs `f` on the learner (waiting for it), then writes one batch of what queued up.
    fn with<R>(&self, f: impl FnOnce(&mut dyn Book) -> R) -> R {
        let mut book = lock(&self.book);
        let r = f(&mut **book);
        self.write_and_hand_over(book);
        r
    }

    /// Writes one batch with `book` held, lets it go, then hands the turn to a waiting
    /// answer's task when more queued up meanwhile: whoever finds the learner taken is
    /// written by the holder or called on by it, and no task writes others' answers for
    /// longer than one batch before sending its own.
    fn write_and_hand_over(&self, mut book: MutexGuard<'_, Box<dyn Book>>) {
        self.write_batch(&mut **book);
        self.remembers
            .store(book.remembers_any(), Ordering::Relaxed);
        drop(book);
        if !lock(&self.queue).is_empty() {
            self.turn.notify_one();
        }
    }

    /// Writes up to [`MAX_BATCH`] queued answers in one batch and releases them.
    fn write_batch(&self, book: &mut dyn Book) {
        let answers: Vec<Queued> = {
            let mut queue = lock(&self.queue);
            let n = queue.len().min(MAX_BATCH);
            queue.drain(..n).collect()
        };
        if answers.is_empty() {
            return;
        }
        let current = self.learning.borrow().clone();
        let batch: Vec<(IpAddr, &Answer)> = answers.iter().map(|q| (q.pod, &q.answer)).collect();
        match book.learn_all(&current, &batch, Instant::now()) {
            Ok(l) => {
                self.metrics.learned(l.written);
                self.metrics.evicted(l.evicted);
            }
            Err(e) => {
                tracing::warn!("dns proxy: learning failed: {e:#}");
                self.metrics.error("learn");
            }
        }
        for q in answers {
            let _ = q.done.send(());
        }
    }
}

/// Runs `f`, which blocks, from a task of a multi-threaded runtime without stalling the
/// worker's other tasks (they move to another thread meanwhile); elsewhere, directly.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A panic while a lock was held leaves the learner's book as it was: keep going with it.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn try_lock<T: ?Sized>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The keep-alive thread: every period, while anything is learned, one conntrack dump
/// (nothing locked meanwhile), reduced to the flows of steered pods, then the learner
/// extends what they still use.
fn keep_alive_loop(writer: &Writer) {
    let mut pass = 0u32;
    loop {
        std::thread::sleep(KEEP_ALIVE_PERIOD);
        if !writer.remembers.load(Ordering::Relaxed) {
            continue;
        }
        pass = pass.wrapping_add(1);
        let all = match crate::conntrack::flow_endpoints() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("dns proxy: conntrack dump failed: {e}");
                writer.metrics.error("conntrack");
                continue;
            }
        };
        let current = writer.learning.borrow().clone();
        let flows: BTreeSet<(IpAddr, IpAddr)> = all
            .into_iter()
            .filter(|(src, _)| !current.targets(*src).is_empty())
            .collect();
        let forget = pass.is_multiple_of(FORGET_EVERY);
        let kept = writer.with(|book| {
            let now = Instant::now();
            if forget {
                book.forget_expired(now);
            }
            book.keep_alive(&current, &flows, 2 * KEEP_ALIVE_PERIOD, now)
        });
        match kept {
            Ok(l) => {
                tracing::debug!(
                    flows = flows.len(),
                    extended = l.written,
                    "dns proxy keep-alive"
                );
                writer.metrics.learned(l.written);
            }
            Err(e) => {
                tracing::warn!("dns proxy: keep-alive failed: {e:#}");
                writer.metrics.error("learn");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnsproxy::learn::Bounds;
    use crate::dnsproxy::learn::tests::{POD, answer, planned};
    use crate::nft::FakeBackend;
    use crate::nft::engine::ApplyStats;
    use crate::nft::engine::NftError;
    use crate::nft::readback::Baseline;
    use crate::nft::transaction::Transaction;
    use futures::FutureExt;

    /// A fake kernel the test keeps a handle on.
    #[derive(Clone)]
    struct Shared(Arc<Mutex<FakeBackend>>);

    impl NftBackend for Shared {
        fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError> {
            lock(&self.0).apply(tx)
        }
        fn read_back(&mut self, desired: &crate::nft::ir::Table) -> Result<Baseline, NftError> {
            lock(&self.0).read_back(desired)
        }
    }

    fn writer() -> (Writer, Shared, watch::Sender<Arc<Learning>>) {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let kernel = Shared(Arc::new(Mutex::new(backend)));
        let bounds = Bounds {
            floor_secs: 5,
            max_ttl_secs: 86_400,
            per_name: 50,
            per_namespace: 2000,
        };
        let learner = Learner::new(kernel.clone(), "nodeplane", bounds);
        let (tx, rx) = watch::channel(Arc::new(learning));
        let w = Writer::new(learner, rx, ProxyMetrics::default());
        (w, kernel, tx)
    }

    fn nth(i: usize) -> Answer {
        let addr = format!("198.51.{}.{}", i / 250, i % 250 + 1);
        answer(&format!("n{i}.example.com"), &[(addr.as_str(), 60)])
    }

    fn batches(k: &Shared) -> usize {
        lock(&k.0).applied.len()
    }

    #[test]
    fn a_lone_answer_is_written_by_its_own_thread() {
        let (w, kernel, _keep) = writer();
        let mut done = w.queue(POD.parse().unwrap(), nth(0)).unwrap();
        w.write_queued();
        assert!(done.try_recv().is_ok(), "released on return");
        assert_eq!(batches(&kernel), 1);
        assert!(w.remembers.load(Ordering::Relaxed));
    }

    #[test]
    fn answers_that_find_the_learner_taken_go_in_the_holders_next_batch() {
        let (w, kernel, _keep) = writer();
        let held = lock(&w.book);
        let mut waiting: Vec<_> = (0..3)
            .map(|i| w.queue(POD.parse().unwrap(), nth(i)).unwrap())
            .collect();
        w.write_queued();
        assert!(
            waiting.iter_mut().all(|d| d.try_recv().is_err()),
            "taken: not written"
        );
        // The holder finishes: one batch for all three, and no turn to hand over.
        w.write_and_hand_over(held);
        assert!(waiting.iter_mut().all(|d| d.try_recv().is_ok()));
        assert_eq!(batches(&kernel), 1);
        assert!(w.turn().now_or_never().is_none(), "nothing left to write");
    }

    #[test]
    fn past_one_batch_the_writer_hands_the_turn_over() {
        let (w, kernel, _keep) = writer();
        let mut waiting: Vec<_> = (0..MAX_BATCH + 1)
            .map(|i| w.queue(POD.parse().unwrap(), nth(i)).unwrap())
            .collect();
        w.write_queued();
        let released = waiting
            .iter_mut()
            .map(|d| d.try_recv().is_ok())
            .filter(|ok| *ok)
            .count();
        assert_eq!((released, batches(&kernel)), (MAX_BATCH, 1));
        assert!(
            w.turn().now_or_never().is_some(),
            "a waiting task is called on"
        );
        w.write_queued();
        assert!(waiting.last_mut().unwrap().try_recv().is_ok());
        assert_eq!(batches(&kernel), 2);
    }

    #[test]
    fn a_full_queue_passes_answers_unwritten() {
        let (w, _kernel, _keep) = writer();
        let _held = lock(&w.book);
        let _waiting: Vec<_> = (0..QUEUE)
            .map(|i| w.queue(POD.parse().unwrap(), nth(i)).unwrap())
            .collect();
        assert!(w.queue(POD.parse().unwrap(), nth(QUEUE)).is_none());
    }

    /// Many answers at once on a multi-threaded runtime: every one is released, and every
    /// address is in the kernel before its answer is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_answers_are_all_written_before_release() {
        let (w, kernel, _keep) = writer();
        let w = Arc::new(w);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let (w, kernel) = (w.clone(), kernel.clone());
                tokio::spawn(async move {
                    assert!(w.write(POD.parse().unwrap(), nth(i)).await);
                    let set = crate::plan::firewall::Names::new("web")
                        .learned_set("*.example.com", crate::nft::ir::IpFamily::V4);
                    let k = lock(&kernel.0);
                    let addr = nth(i).addresses[0].0;
                    let key = vec![crate::nft::ir::Value::ip(addr).into()];
                    assert!(
                        k.table.as_ref().unwrap().sets[&set]
                            .elements
                            .contains_key(&key)
                    );
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(batches(&kernel) <= 200);
    }
}
