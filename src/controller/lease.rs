//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//!
//! - **Acquire**: create the Lease, or take over one whose holder is empty (released) or
//!   whose record has not changed for its `leaseDurationSeconds` as measured by *this* agent's
//!   monotonic clock since it last saw the record change (its resourceVersion). No two clocks
//!   are compared: `renewTime`/`acquireTime` are written for people (`kubectl get lease`),
//!   never read. A takeover increments `leaseTransitions`.
//! - **Every write** is a replace with the resourceVersion last read as precondition, so of
//!   two candidates racing for an expired lease exactly one wins; the other gets `409
//!   Conflict` (or `409 AlreadyExists` for two creates) and stays a follower.
//! - **Renew** every retry period. The leader replaces its own record directly (no read);
//!   only when that fails does it read the Lease afresh (a quorum read).
//! - **Lost**: a leader whose renewals all failed for the renew deadline stops leading
//!   (published at once, even while a request hangs: each attempt is bounded by what is left
//!   of the deadline) and goes back to being a candidate. The deadline is counted from the
//!   *start* of the last successful renewal, which is before any other agent can have seen
//!   it, so the old leader has stopped before anyone may take over (renew deadline < lease
//!   duration).
//! - **Release** on shutdown: holder cleared and `leaseDurationSeconds: 1`, so the next
//!   candidate takes over at its next attempt instead of waiting for expiry.
//! - **Early takeover** of a dead holder: the role's own health probes may prove the holder's
//!   node dead ([`Candidate::set_dead`]: node names, which are the holder identities); a
//!   follower then takes over at once instead of waiting for the lease to expire (still a
//!   replace with the resourceVersion read as precondition, so of several followers one
//!   wins). A leader that reads its Lease held by another stops leading at once rather than
//!   at its renew deadline: a holder the probes could not reach but the API server can goes
//!   silent within one retry period.
//!
//! Followers read the Lease with `resourceVersion=0` (served from the API server's watch
//! cache, no etcd read). A stale read is harmless: a decision taken on it is a replace whose
//! precondition fails.
//!
//! [`Candidate`] is the state machine, clock-explicit (the caller passes the monotonic `now`
//! and the wall time to write) and generic over [`LeaseApi`] so that it is tested without a
//! server; [`Elector`] runs it as a tokio task and publishes [`Leadership`] on a `watch`
//! channel.

use std::future::Future;
use std::hash::BuildHasher;
use std::time::Duration;

use crate::task::{OnExit, Task, task};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{GetParams, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use crate::config::election::{JITTER, Timings};

/// One election: which Lease, who we are, how fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionConfig {
    pub namespace: String,
    pub name: String,
    /// `holderIdentity` when leading: the node name (a restarted agent on the leader's node
    /// takes its own lease back at once).
    pub identity: String,
    pub timings: Timings,
}

/// What the elector publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leadership {
    /// This agent holds the lease and may act.
    pub leading: bool,
    /// The holder of the lease as last read (this agent's identity when leading), `None`
    /// when the lease is free or not read yet.
    pub holder: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// 409: a stale resourceVersion on replace, or the Lease already exists on create.
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("{0}")]
    Other(String),
}

/// The three calls an election needs, on one named Lease.
pub trait LeaseApi: Send + Sync + 'static {
    /// The Lease, `None` if it does not exist. `fresh`: a quorum read; otherwise the API
    /// server may answer from its cache.
    fn get(&self, fresh: bool) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
    /// Replace, with `metadata.resourceVersion` as precondition.
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
}

/// [`LeaseApi`] on the Kubernetes API.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> KubeLeases {
        KubeLeases {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn lease_error(e: kube::Error) -> LeaseError {
    match e {
        kube::Error::Api(s) if s.code == 409 => LeaseError::Conflict(s.message),
        e => LeaseError::Other(e.to_string()),
    }
}

impl LeaseApi for KubeLeases {
    async fn get(&self, fresh: bool) -> Result<Option<Lease>, LeaseError> {
        let params = if fresh {
            GetParams::default()
        } else {
            GetParams::any()
        };
        match self.api.get_with(&self.name, &params).await {
            Ok(l) => Ok(Some(l)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(lease_error(e)),
        }
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .create(&PostParams::default(), lease)
            .await
            .map_err(lease_error)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(lease_error)
    }
}

/// The Lease as last read or written, and when (this agent's clock) it was first seen with
/// this resourceVersion.
#[derive(Debug, Clone)]
struct Observed {
    lease: Lease,
    at: Instant,
}

impl Observed {
    fn spec(&self) -> LeaseSpec {
        self.lease.spec.clone().unwrap_or_default()
    }

    fn holder(&self) -> Option<&str> {
        let h = self.lease.spec.as_ref()?.holder_identity.as_deref()?;
        (!h.is_empty()).then_some(h)
    }

    fn resource_version(&self) -> Option<&str> {
        self.lease.metadata.resource_version.as_deref()
    }

    /// The record's own duration, as client-go: a released lease (1 s) expires quickly.
    fn expires(&self) -> Instant {
        let secs = self.spec().lease_duration_seconds.unwrap_or(0).max(0);
        self.at + Duration::from_secs(secs.unsigned_abs().into())
    }
}

/// The election's state machine: one [`attempt`](Candidate::attempt) per retry period.
#[derive(Debug)]
pub struct Candidate {
    config: ElectionConfig,
    observed: Option<Observed>,
    /// Start of the last successful acquire or renewal, while leading.
    renewed: Option<Instant>,
    /// Identities whose nodes the role's probes have proven dead (early takeover).
    dead: std::collections::BTreeSet<String>,
}

impl Candidate {
    pub fn new(config: ElectionConfig) -> Candidate {
        Candidate {
            config,
            observed: None,
            renewed: None,
            dead: Default::default(),
        }
    }

    /// The holder identities (node names) the probes prove dead now: a follower takes over
    /// from one of them without waiting for its lease to expire.
    pub fn set_dead(&mut self, dead: std::collections::BTreeSet<String>) {
        self.dead = dead;
    }

    /// The observed holder is another agent proven dead.
    fn holder_dead(&self) -> bool {
        self.observed
            .as_ref()
            .and_then(Observed::holder)
            .is_some_and(|h| h != self.config.identity && self.dead.contains(h))
    }

    pub fn config(&self) -> &ElectionConfig {
        &self.config
    }

    /// Leading at `now`: the last successful renewal started less than the renew deadline ago.
    pub fn leading(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|r| now < r + self.config.timings.renew_deadline)
    }

    pub fn leadership(&self, now: Instant) -> Leadership {
        let leading = self.leading(now);
        let holder = if leading {
            Some(self.config.identity.clone())
        } else {
            self.observed
                .as_ref()
                .and_then(|o| o.holder().map(str::to_string))
        };
        Leadership { leading, holder }
    }

    /// How long the attempt starting at `now` may take: what is left of the renew deadline
    /// while leading (so that a hanging request cannot keep a lost leadership), else the
    /// renew deadline.
    pub fn attempt_budget(&self, now: Instant) -> Duration {
        match self.renewed {
            Some(r) => (r + self.config.timings.renew_deadline).saturating_duration_since(now),
            None => self.config.timings.renew_deadline,
        }
    }

    /// When the next attempt is due after one that started at `started`: one retry period
    /// for the leader; for followers up to [`JITTER`] times that, or earlier when the observed
    /// lease expires.
    pub fn next_attempt(&self, started: Instant, jitter: f64) -> Instant {
        let retry = self.config.timings.retry_period;
        if self.renewed.is_some() {
            return started + retry;
        }
        if self.holder_dead() {
            // A takeover lost to another follower, or a stale read: try again soon.
            return started + retry / 10;
        }
        let spread = jitter.clamp(0.0, 1.0) * (JITTER - 1.0);
        let next = started + retry.mul_f64(1.0 + spread);
        match &self.observed {
            Some(o) if o.holder().is_some() && o.expires() > started => next.min(o.expires()),
            _ => next,
        }
    }

    /// The wall clock renewTime/acquireTime get (for people; never read back).
    fn stamp(wall: Timestamp) -> Option<MicroTime> {
        Some(MicroTime(wall))
    }

    /// Our record on top of `base` (the lease as observed, or a new one).
    fn our_record(&self, base: Option<&Observed>, wall: Timestamp) -> Lease {
        let mut lease = base.map(|o| o.lease.clone()).unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: None,
        });
        let old = base.map(Observed::spec).unwrap_or_default();
        let ours = base.and_then(Observed::holder) == Some(self.config.identity.as_str());
        let secs = self.config.timings.lease_duration.as_secs();
        let mut spec = old.clone();
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(i32::try_from(secs).unwrap_or(i32::MAX));
        spec.renew_time = Self::stamp(wall);
        if !ours {
            spec.acquire_time = Self::stamp(wall);
            spec.lease_transitions = Some(match base {
                Some(_) => old.lease_transitions.unwrap_or(0).saturating_add(1),
                None => 0,
            });
        }
        lease.spec = Some(spec);
        lease
    }

    fn won(&mut self, lease: Lease, now: Instant) -> bool {
        if self.renewed.is_none() {
            info!(
                "lease {}/{}: acquired as {}",
                self.config.namespace, self.config.name, self.config.identity
            );
        }
        self.observed = Some(Observed { lease, at: now });
        self.renewed = Some(now);
        true
    }

    /// After an attempt that did not renew: leadership lapses once the deadline passed.
    fn failed(&mut self, now: Instant) -> bool {
        if self.renewed.is_some() && !self.leading(now) {
            warn!(
                "lease {}/{}: not renewed for {:?}, no longer leading",
                self.config.namespace, self.config.name, self.config.timings.renew_deadline
            );
            self.renewed = None;
        }
        false
    }

    /// client-go's `tryAcquireOrRenew`, started at `now` (monotonic) writing `wall` as
    /// renewTime. Returns whether this attempt acquired or renewed the lease; whether the
    /// agent leads is [`leading`](Candidate::leading) (a failed renewal does not end
    /// leadership before the renew deadline).
    pub async fn attempt<A: LeaseApi>(&mut self, api: &A, now: Instant, wall: Timestamp) -> bool {
        let name = format!("{}/{}", self.config.namespace, self.config.name);
        // The leader renews its own record directly.
        if self.renewed.is_some()
            && let Some(o) = self
                .observed
                .as_ref()
                .filter(|o| o.holder() == Some(self.config.identity.as_str()))
        {
            let record = self.our_record(Some(o), wall);
            match api.replace(&record).await {
                Ok(lease) => return self.won(lease, now),
                Err(e) => debug!("lease {name}: renewal failed, reading it again: {e}"),
            }
        }
        let fresh = self.renewed.is_some();
        let current = match api.get(fresh).await {
            Ok(c) => c,
            Err(e) => {
                debug!("lease {name}: read failed: {e}");
                return self.failed(now);
            }
        };
        let Some(current) = current else {
            let record = self.our_record(None, wall);
            return match api.create(&record).await {
                Ok(lease) => self.won(lease, now),
                Err(e) => {
                    debug!("lease {name}: create failed: {e}");
                    self.failed(now)
                }
            };
        };
        // A changed record restarts the expiry countdown; an unchanged one keeps its age.
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.resource_version() != current.metadata.resource_version.as_deref());
        if changed {
            self.observed = Some(Observed {
                lease: current,
                at: now,
            });
        }
        let observed = self.observed.as_ref().expect("set above");
        let other = observed.holder().is_some_and(|h| h != self.config.identity);
        if other && self.renewed.take().is_some() {
            warn!(
                "lease {name}: taken over by {}, no longer leading",
                observed.holder().unwrap_or_default()
            );
        }
        let dead = self.holder_dead();
        let observed = self.observed.as_ref().expect("set above");
        if other && now < observed.expires() && !dead {
            return self.failed(now);
        }
        if other && dead {
            info!(
                "lease {name}: held by {}, whose node the probes prove dead: taking over",
                observed.holder().unwrap_or_default()
            );
        } else if other {
            info!(
                "lease {name}: held by {} but not renewed for {}s, taking over",
                observed.holder().unwrap_or_default(),
                observed.spec().lease_duration_seconds.unwrap_or(0)
            );
        }
        let record = self.our_record(Some(observed), wall);
        match api.replace(&record).await {
            Ok(lease) => self.won(lease, now),
            Err(e) => {
                debug!("lease {name}: acquire failed: {e}");
                self.failed(now)
            }
        }
    }

    /// Hands the lease back if this agent holds it: holder cleared, 1 s duration, so the
    /// next candidate takes over at once. Returns whether a release was written.
    pub async fn release<A: LeaseApi>(&mut self, api: &A, wall: Timestamp) -> bool {
        let held = self.renewed.take().is_some();
        let Some(o) = self
            .observed
            .as_ref()
            .filter(|o| held && o.holder() == Some(self.config.identity.as_str()))
        else {
            return false;
        };
        let mut lease = o.lease.clone();
        let mut spec = o.spec();
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Self::stamp(wall);
        spec.acquire_time = Self::stamp(wall);
        lease.spec = Some(spec);
        let name = format!("{}/{}", self.config.namespace, self.config.name);
        match api.replace(&lease).await {
            Ok(_) => {
                info!("lease {name}: released");
                true
            }
            Err(e) => {
                warn!("lease {name}: release failed (others take over when it expires): {e}");
                false
            }
        }
    }
}

/// A running election: a tokio task publishing [`Leadership`].
pub struct Elector {
    leadership: watch::Receiver<Leadership>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Elector {
    /// Starts electing; the receiver starts at "not leading".
    pub fn spawn<A: LeaseApi>(api: A, config: ElectionConfig) -> Elector {
        let (tx, leadership) = watch::channel(Leadership::default());
        let (stop, stopped) = oneshot::channel();
        let stopped = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(run(api, Candidate::new(config), tx, None, stopped));
        Elector {
            leadership,
            stop: Some(stop),
            task,
        }
    }

    /// The election as a task of the agent's runtime, and its leadership. Stopping the task
    /// publishes "not leading", then releases the lease if held (bounded by the renew
    /// deadline), as [`Elector::shutdown`] does. `dead`: the holder identities the role's
    /// probes prove dead now ([`Candidate::set_dead`]).
    pub fn task<A: LeaseApi>(
        name: &str,
        api: A,
        config: ElectionConfig,
        dead: watch::Receiver<std::collections::BTreeSet<String>>,
    ) -> (watch::Receiver<Leadership>, impl Task) {
        let (tx, leadership) = watch::channel(Leadership::default());
        let mut parts = Some((api, tx, dead));
        let task = task(name, OnExit::Finish, move |mut ctx| {
            let parts = parts.take();
            let candidate = Candidate::new(config.clone());
            async move {
                let (api, tx, dead) = parts.ok_or("runs once: cannot be restarted")?;
                run(api, candidate, tx, Some(dead), async move {
                    ctx.stopping().await
                })
                .await;
                Ok(())
            }
        });
        (leadership, task)
    }

    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Stops: publishes "not leading" first (the role's consumer stops acting), then
    /// releases the lease if held (bounded by the renew deadline) and returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Stops at once without releasing, as if the node died: others take over once the
    /// lease expires.
    pub fn abort(self) {
        self.task.abort();
    }
}

/// A number in `[0, 1)` that differs between agents and attempts.
fn jitter() -> f64 {
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    (r % 10_000) as f64 / 10_000.0
}

async fn run<A: LeaseApi>(
    api: A,
    mut candidate: Candidate,
    tx: watch::Sender<Leadership>,
    mut dead: Option<watch::Receiver<std::collections::BTreeSet<String>>>,
    stop: impl Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let publish = |l: Leadership| {
        tx.send_if_modified(|cur| {
            let changed = *cur != l;
            *cur = l;
            changed
        });
    };
    loop {
        if let Some(d) = dead.as_mut() {
            candidate.set_dead(d.borrow_and_update().clone());
        }
        let started = Instant::now();
        let budget = candidate.attempt_budget(started);
        let attempt = candidate.attempt(&api, started, Timestamp::now());
        tokio::select! {
            r = tokio::time::timeout(budget, attempt) => {
                if r.is_err() {
                    debug!("lease attempt timed out after {budget:?}");
                    candidate.failed(Instant::now());
                }
            }
            _ = &mut stop => break,
        }
        publish(candidate.leadership(Instant::now()));
        let mut next = candidate.next_attempt(started, jitter());
        // Wake up when the leadership lapses, even if the next attempt is later.
        if let Some(r) = candidate.renewed {
            next = next.min(r + candidate.config.timings.renew_deadline);
        }
        // A follower looks again as soon as the probes prove a node dead (it may hold the
        // lease); a leader has nothing to take over.
        let following = candidate.renewed.is_none();
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            changed = async { dead.as_mut().expect("guarded").changed().await },
                if following && dead.is_some() => {
                if changed.is_err() {
                    dead = None;
                }
            }
            _ = &mut stop => break,
        }
    }
    publish(Leadership {
        leading: false,
        holder: None,
    });
    let deadline = candidate.config.timings.renew_deadline;
    let release = candidate.release(&api, Timestamp::now());
    if tokio::time::timeout(deadline, release).await.is_err() {
        warn!("lease release timed out after {deadline:?}");
    }
}

#[cfg(test)]
mod tests;
