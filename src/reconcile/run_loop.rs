//! The control loop of run mode: sync, then sync again on every [`Event::Changed`], retry a
//! failed sync with exponential backoff (1 s .. 60 s), resync fully every `config.resync`,
//! repair a drift ([`Event::Drift`]) at once by a sync from the kernel's state, and stop on
//! [`Event::Shutdown`] leaving the rules in place. Each attempt is reported to the
//! [`SyncObserver`]s as a [`SyncOutcome`]; the loop knows nothing of who they are (see
//! [`crate::app`] for the wiring).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::{ReconcileError, Reconciler, SyncObserver, SyncOutcome, SyncReport, real_reconciler};
use crate::config::Config;
use crate::net::NetBackend;
use crate::nft::monitor::{Drift, Quiet};
use crate::nft::{NftBackend, TABLE_NAME};
use crate::plan::Answerer;
use crate::snapshot::Snapshot;
use crate::timing::Backoff;

/// Inputs of the run loop.
pub enum Event {
    /// An input changed: the next sync reads the source again.
    Changed,
    /// Someone else changed the kernel's table. `seq` numbers detections in increasing
    /// order; the loop hands the highest it took in back in [`SyncOutcome::drift_seq`].
    Drift {
        seq: u64,
        drift: Box<Drift>,
    },
    Shutdown,
}

/// Where the run loop reads its snapshots from: the latest one its source published (the
/// Kubernetes source, or the manifests loader thread of [`crate::source::loader`]). The loop
/// never loads or parses anything itself, so a slow source cannot hold it.
pub enum Snapshots {
    Published(tokio::sync::watch::Receiver<Option<Snapshot>>),
}

impl Snapshots {
    fn current(&self) -> Result<Snapshot, ReconcileError> {
        match self {
            Snapshots::Published(rx) => Ok(rx.borrow().clone().unwrap_or_default()),
        }
    }
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Runs until [`Event::Shutdown`] or until every sender of `events` is gone, applying the
/// network side through `net` (the real backend as the caller wrapped it) and having what the
/// features ask answered by `answerer` before each plan. Blocks on netlink: call it on a
/// thread of its own.
pub fn run<B: NetBackend>(
    config: Config,
    events: mpsc::Receiver<Event>,
    answerer: impl Answerer + 'static,
    snapshots: Snapshots,
    net: B,
    quiet: Option<Quiet>,
    mut observers: Vec<Box<dyn SyncObserver>>,
) -> Result<(), ReconcileError> {
    let mut rec = real_reconciler(&config, net, quiet)?.with_answerer(answerer);
    let mut next_resync = Instant::now() + config.resync;
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    // The last drift detection the loop took in (and invalidated the engine for).
    let mut drift_taken = 0;
    // The snapshot of the last sync, and whether the next one must read the source again: a
    // wake-up for drift alone re-plans the same snapshot (with a manifests directory, loading
    // it again would cost more than the repair).
    let mut last_snapshot: Option<Snapshot> = None;
    let mut reload = true;
    loop {
        // Every wake-up (change, retry, resync) re-plans from a fresh snapshot; a drift alone
        // re-plans the last one.
        let mut wait = next_resync.saturating_duration_since(Instant::now());
        let current = match last_snapshot.take() {
            Some(s) if !reload => Ok(s),
            _ => snapshots.current(),
        };
        reload = false;
        // What this sync repairs if it succeeds: detections seen before it started.
        let (snapshot, synced) = sync_once(&mut rec, current, drift_taken, &mut observers);
        last_snapshot = snapshot;
        match synced {
            // Logged, drift repairs and health-check ports: reactions of the observers.
            Ok(_) => backoff.reset(),
            Err(e) => {
                reload = true;
                let delay = backoff.next_delay();
                error!("sync failed, retrying in {}s: {e}", delay.as_secs());
                wait = wait.min(delay);
            }
        }
        match events.recv_timeout(wait) {
            Ok(first) => {
                let burst = coalesce(first, &events);
                if burst.shutdown {
                    return Ok(());
                }
                reload |= burst.changed;
                if let Some((seq, d)) = burst.drift {
                    drift_taken = drift_taken.max(seq);
                    warn!("table {TABLE_NAME} changed by someone else: {d}; repairing");
                    // The next sync starts from the kernel's state, not from our belief.
                    rec.invalidate();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                reload = true;
                if Instant::now() >= next_resync {
                    info!("periodic resync");
                    rec.invalidate();
                    next_resync = Instant::now() + config.resync;
                }
            }
        }
    }
}

/// One sync of `current`, reported to every observer; `repairing`: the drift detections
/// taken in before it.
/// Returns the snapshot planned and the result.
fn sync_once<N: NftBackend + Default, B: NetBackend>(
    rec: &mut Reconciler<N, B>,
    current: Result<Snapshot, ReconcileError>,
    repairing: u64,
    observers: &mut [Box<dyn SyncObserver>],
) -> (Option<Snapshot>, Result<SyncReport, ReconcileError>) {
    let started = Instant::now();
    let (read_backs, cleanup_failures) = (rec.read_backs(), rec.cleanup_failures());
    let (snapshot, synced) = match current {
        Ok(s) => {
            let synced = rec.sync(&s);
            (Some(s), synced)
        }
        Err(e) => (None, Err(e)),
    };
    let outcome = SyncOutcome {
        snapshot: snapshot.as_ref(),
        result: &synced,
        duration: started.elapsed(),
        applied: rec.applied(),
        applied_extra: rec.applied_extra(),
        drift_seq: repairing,
        full: rec.read_backs() > read_backs,
        cleanup_failed: rec.cleanup_failures() > cleanup_failures,
    };
    for o in observers {
        o.observe(&outcome);
    }
    (snapshot, synced)
}

/// What a burst of queued events asks of the next sync.
#[derive(Debug, Default)]
struct Burst {
    /// An input changed: read the source again.
    changed: bool,
    /// The highest drift detection's `seq` and every drift of the burst, merged.
    drift: Option<(u64, Drift)>,
    shutdown: bool,
}

/// Coalesces a burst (one `nft flush ruleset` is many objects, a script many commits) into
/// one sync, with no delay: `first` and whatever is queued now. Stops at a shutdown.
fn coalesce(first: Event, events: &mpsc::Receiver<Event>) -> Burst {
    let mut burst = Burst::default();
    let mut next = Some(first);
    while let Some(event) = next {
        match event {
            Event::Changed => burst.changed = true,
            Event::Drift { seq, drift } => match &mut burst.drift {
                Some((highest, all)) => {
                    *highest = (*highest).max(seq);
                    all.merge(*drift);
                }
                None => burst.drift = Some((seq, *drift)),
            },
            Event::Shutdown => {
                burst.shutdown = true;
                return burst;
            }
        }
        next = events.try_recv().ok();
    }
    burst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drift(seq: u64, by: &str) -> Event {
        Event::Drift {
            seq,
            drift: Box::new(Drift {
                at: Instant::now(),
                changes: Default::default(),
                by: [by.to_string()].into(),
                events_lost: false,
                unseen: false,
            }),
        }
    }

    #[test]
    fn a_burst_is_one_sync_with_every_drift_merged_and_the_highest_seq() {
        let (tx, rx) = mpsc::channel();
        tx.send(Event::Changed).unwrap();
        tx.send(drift(3, "nft (pid 2)")).unwrap();
        let burst = coalesce(drift(5, "nft (pid 1)"), &rx);
        assert!(burst.changed && !burst.shutdown);
        let (seq, d) = burst.drift.expect("drift taken in");
        assert_eq!(seq, 5);
        assert_eq!(d.by.len(), 2, "both senders reported: {:?}", d.by);
        assert!(rx.try_recv().is_err(), "the queue is drained");
    }

    #[test]
    fn a_shutdown_ends_the_burst_and_leaves_the_rest_queued() {
        let (tx, rx) = mpsc::channel();
        tx.send(Event::Shutdown).unwrap();
        tx.send(Event::Changed).unwrap();
        let burst = coalesce(Event::Changed, &rx);
        assert!(burst.shutdown && burst.changed);
        assert!(matches!(rx.try_recv(), Ok(Event::Changed)));
    }
}
