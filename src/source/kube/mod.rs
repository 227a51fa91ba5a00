//! The Kubernetes API source: one watch per [`Kind`] (list, then watch from its
//! resourceVersion; relist on `410 Gone`; retry with backoff), decoded per object into one
//! store, published as a [`Snapshot`] only once every kind's first list has completed, and
//! debounced so that a burst of events becomes one snapshot (one transaction).
//!
//! When the API server goes away the store keeps its last view and nothing is published, so
//! the kernel keeps its rules (fail static); `health` turns `/readyz` degraded meanwhile, also
//! when a connection stalls silently (see `follow` for how that is bounded).

mod client;
mod decode;
mod follow;
mod health;
mod kinds;
mod prune;
mod store;

use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use client::client;
pub use decode::{Rejection, decode};
pub use follow::{Failure, Liveness};
pub use health::SourceHealth;
pub use kinds::{api_resource, watch_config};
pub use store::{Change, Store, Update};

use crate::snapshot::{Kind, Snapshot};
use crate::task::{OnExit, Runtime, once, task};
use crate::timing::{Burst, Debounce};

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {what}: {reason}")]
    Config { what: String, reason: String },
    #[error("API client: {0}")]
    Client(String),
}

/// Quiet time that ends a burst of events, and the longest a burst can delay a snapshot.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_millis(500);
const BURST: Debounce = Debounce {
    quiet: DEBOUNCE,
    max: MAX_DELAY,
};
/// How often the API server is probed for `/readyz`.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// How long the probe waits for `/version`, a trivial answer: longer means a stalled
/// connection or an API server that cannot serve.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running source. Dropping the receivers stops nothing; the tasks end with the runtime.
pub struct KubeSource {
    /// `None` until every kind has synced, then the latest debounced snapshot.
    pub snapshots: watch::Receiver<Option<Snapshot>>,
    /// Objects that could not be decoded (for Events); lossy when nobody reads.
    pub rejections: mpsc::Receiver<Rejection>,
    pub health: SourceHealth,
}

/// Adds one watch task per kind of `kinds` (the enabled features', `Features::kinds`), the
/// store task and the API server probe to `tasks`, reporting into `health`; the other kinds
/// are never requested and count as synced with no objects.
pub fn start(
    client: Client,
    health: SourceHealth,
    liveness: Liveness,
    kinds: &[Kind],
    tasks: &mut Runtime,
) -> KubeSource {
    let (tx, rx) = mpsc::unbounded_channel();
    health.set_stale_after(liveness.stale());
    for kind in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(*kind));
        let (kind, tx, health) = (*kind, tx.clone(), health.clone());
        tasks.add(task(
            format!("watch-{kind}"),
            OnExit::Restart,
            move |mut ctx| {
                let follow =
                    follow::follow(api.clone(), kind, liveness, tx.clone(), health.clone());
                async move { ctx.until_stopped(ended(follow)).await }
            },
        ));
    }
    let (snap_tx, snapshots) = watch::channel(None);
    let (rej_tx, rejections) = mpsc::channel(256);
    health.set_unsynced(kinds.to_vec());
    let mut store = Store::default();
    for kind in Kind::ALL.iter().filter(|k| !kinds.contains(k)) {
        store.mark_absent(*kind);
    }
    let store = store_task(store, rx, snap_tx, rej_tx, health.clone());
    tasks.add(once("kube-store", OnExit::Vital, ended(store)));
    let probe_health = health.clone();
    tasks.add(task("kube-api-probe", OnExit::Restart, move |mut ctx| {
        let probe = probe_api(client.clone(), probe_health.clone());
        async move { ctx.until_stopped(ended(probe)).await }
    }));
    KubeSource {
        snapshots,
        rejections,
        health,
    }
}

/// A loop that is meant to run for as long as the agent: its end is an error.
async fn ended(work: impl std::future::Future<Output = ()>) -> Result<(), String> {
    work.await;
    Err("ended".into())
}

/// What a kind's watch task reports.
enum Msg {
    Update(Update),
    Rejected(Rejection),
    Error(Kind, Failure),
}

async fn store_task(
    mut store: Store,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    snapshots: watch::Sender<Option<Snapshot>>,
    rejections: mpsc::Sender<Rejection>,
    health: SourceHealth,
) {
    let handle = |msg: Msg, store: &mut Store| take_in(msg, store, &rejections);
    // When the last snapshot went out: a change after a quiet spell goes out at once.
    let mut published: Option<Instant> = None;
    loop {
        let Some(msg) = rx.recv().await else { return };
        let was_synced = store.all_synced();
        let change = handle(msg, &mut store);
        if !change.any() {
            continue;
        }
        // Coalesce the burst; a moved egress IP ends it at once (what is queued is still
        // taken in, see `take`), and so do the first change after a quiet spell (leading
        // edge, as kube-proxy's bounded-frequency runner syncs at once when it last synced
        // long enough ago: a lone endpoint change costs no debounce) and the last initial
        // list (a cold start waits for nothing more).
        let now = Instant::now();
        let mut burst = BURST.start(now);
        let idle = published.is_none_or(|at| now >= at + DEBOUNCE);
        let change = escalate(change, was_synced, store.all_synced(), idle);
        take(&mut burst, change, now);
        loop {
            match tokio::time::timeout_at(burst.deadline(), rx.recv()).await {
                Ok(Some(msg)) => {
                    let was_synced = store.all_synced();
                    let change = handle(msg, &mut store);
                    let change = escalate(change, was_synced, store.all_synced(), false);
                    let now = Instant::now();
                    burst.event(now);
                    take(&mut burst, change, now);
                }
                Ok(None) => return,
                Err(_) => break,
            }
        }
        if publish(&store, &snapshots, &health) {
            published = Some(Instant::now());
        }
    }
}

/// Takes one message of the watches into `store`; a rejected object goes to `rejections`.
fn take_in(msg: Msg, store: &mut Store, rejections: &mpsc::Sender<Rejection>) -> Change {
    match msg {
        Msg::Update(u) => store.apply(u),
        Msg::Rejected(r) => {
            // The previous version of the object (if any) stays: a broken update must not
            // make a namespace fall open.
            warn!("skipped {r}");
            let _ = rejections.try_send(r);
            Change::None
        }
        Msg::Error(kind, e) => {
            if e.is_not_served() && !store.is_synced(kind) {
                warn!(
                    "{kind} is not served by this API server (CRD not installed?); treating it as empty"
                );
                store.mark_absent(kind);
                return Change::Changed;
            }
            debug!("watch {kind}: {e}");
            if store.is_synced(kind) {
                info!("watch {kind} interrupted, retrying: {e}");
            } else {
                warn!("cannot list {kind}, retrying: {e}");
            }
            Change::None
        }
    }
}

/// Publishes the store's snapshot once every kind has synced (until then `health` says
/// which have not); whether it did.
fn publish(
    store: &Store,
    snapshots: &watch::Sender<Option<Snapshot>>,
    health: &SourceHealth,
) -> bool {
    let unsynced = store.unsynced();
    health.set_unsynced(unsynced.clone());
    if !unsynced.is_empty() {
        debug!(?unsynced, "waiting for initial lists");
        return false;
    }
    if snapshots.borrow().is_none() {
        info!("every initial list synced");
    }
    snapshots.send_replace(Some(store.snapshot()));
    true
}

/// How urgent a change is, given whether the store was and is synced and whether the
/// source was `idle` (nothing published for a debounce interval): the change that completes
/// the first view, and the first change after a quiet spell, go out at once.
fn escalate(change: Change, was_synced: bool, synced: bool, idle: bool) -> Change {
    let first_view = !was_synced && synced;
    if change.any() && (first_view || (idle && was_synced)) {
        Change::Urgent
    } else {
        change
    }
}

/// Takes a change into the burst at `now`: an urgent one ends it (see [`Change::Urgent`]).
fn take<I>(burst: &mut Burst<I>, change: Change, now: I)
where
    I: Copy + Ord + std::ops::Add<Duration, Output = I>,
{
    if change == Change::Urgent {
        burst.hurry(now);
    }
}

async fn probe_api(client: Client, health: SourceHealth) {
    loop {
        let error = match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("GET /version: {e}")),
            Err(_) => Some(format!(
                "GET /version: no answer within {}s",
                PROBE_TIMEOUT.as_secs()
            )),
        };
        health.set_api_error(error);
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_moved_egress_ip_is_published_without_the_debounce() {
        let t0 = std::time::Instant::now();
        // An ordinary change waits for quiet.
        let mut burst = BURST.start(t0);
        take(&mut burst, Change::Changed, t0);
        assert_eq!(burst.deadline(), t0 + DEBOUNCE);
        // A status.items change arriving first is published at once...
        let mut burst = BURST.start(t0);
        take(&mut burst, Change::Urgent, t0);
        assert!(burst.is_over(t0));
        // ... and one arriving in the middle of a burst ends it when it arrives.
        let mut burst = BURST.start(t0);
        burst.event(t0 + ms(40));
        take(&mut burst, Change::Changed, t0 + ms(40));
        burst.event(t0 + ms(50));
        take(&mut burst, Change::Urgent, t0 + ms(50));
        assert_eq!(burst.deadline(), t0 + ms(50));
    }

    #[test]
    fn the_first_view_and_a_change_after_quiet_go_out_at_once() {
        use Change::*;
        // The last initial list completes the view: no debounce before the cold start.
        assert_eq!(escalate(Changed, false, true, false), Urgent);
        // Lists still missing: nothing to publish early.
        assert_eq!(escalate(Changed, false, false, true), Changed);
        // Synced and idle: the lone change goes at once; in a burst it waits for quiet.
        assert_eq!(escalate(Changed, true, true, true), Urgent);
        assert_eq!(escalate(Changed, true, true, false), Changed);
        // No change stays no change.
        assert_eq!(escalate(None, true, true, true), None);
    }
}
