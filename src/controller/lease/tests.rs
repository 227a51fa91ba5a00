//! The election's state machine against an in-memory Lease API with the API server's
//! optimistic concurrency, on an explicit clock: nothing sleeps.

use std::sync::Mutex;

use super::*;

/// One Lease with a resourceVersion, `409` on a stale replace or a second create, and knobs
/// for what a real API server does to a client: fail, answer from a stale cache.
#[derive(Default)]
struct FakeLeases {
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    lease: Option<Lease>,
    rv: u64,
    /// Every call fails (API server unreachable).
    down: bool,
    /// Reads return this instead of the stored lease (a lagging cache).
    stale: Option<Option<Lease>>,
    replaces: usize,
    conflicts: usize,
}

impl FakeLeases {
    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    fn spec(&self) -> LeaseSpec {
        self.state().lease.clone().unwrap().spec.unwrap()
    }

    fn holder(&self) -> Option<String> {
        self.spec().holder_identity
    }

    fn transitions(&self) -> i32 {
        self.spec().lease_transitions.unwrap()
    }

    fn stamp(state: &mut FakeState, mut lease: Lease) -> Lease {
        state.rv += 1;
        lease.metadata.resource_version = Some(state.rv.to_string());
        state.lease = Some(lease.clone());
        lease
    }
}

impl LeaseApi for FakeLeases {
    async fn get(&self, _fresh: bool) -> Result<Option<Lease>, LeaseError> {
        let s = self.state();
        if s.down {
            return Err(LeaseError::Other("connection refused".into()));
        }
        Ok(s.stale.clone().unwrap_or_else(|| s.lease.clone()))
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let mut s = self.state();
        if s.down {
            return Err(LeaseError::Other("connection refused".into()));
        }
        if s.lease.is_some() {
            s.conflicts += 1;
            return Err(LeaseError::Conflict("already exists".into()));
        }
        Ok(Self::stamp(&mut s, lease.clone()))
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let mut s = self.state();
        if s.down {
            return Err(LeaseError::Other("connection refused".into()));
        }
        let current = s
            .lease
            .as_ref()
            .ok_or(LeaseError::Other("not found".into()))?;
        if current.metadata.resource_version != lease.metadata.resource_version {
            s.conflicts += 1;
            return Err(LeaseError::Conflict("the object has been modified".into()));
        }
        s.replaces += 1;
        Ok(Self::stamp(&mut s, lease.clone()))
    }
}

fn config(identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: "nodeplane".into(),
        name: "nodeplane-egress-assigner".into(),
        identity: identity.into(),
        timings: Timings::DEFAULT,
    }
}

const RETRY: Duration = Duration::from_secs(1);
const DURATION: Duration = Duration::from_secs(4);
const DEADLINE: Duration = Duration::from_secs(3);
const MS: Duration = Duration::from_millis(1);

/// Wall time written as renewTime: deliberately absurd, to show nobody reads it.
fn wall() -> Timestamp {
    Timestamp::UNIX_EPOCH
}

/// Candidates `node-a` and `node-b` with the test configuration.
fn two_candidates() -> (Candidate, Candidate) {
    (
        Candidate::new(config("node-a")),
        Candidate::new(config("node-b")),
    )
}

/// node-a has created the lease at `t0` and leads; node-b has not read it yet.
async fn a_leading() -> (FakeLeases, Instant, Candidate, Candidate) {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    let (mut a, b) = two_candidates();
    assert!(a.attempt(&api, t0, wall()).await);
    (api, t0, a, b)
}

/// What a follower of `holder` knows.
fn following(holder: &str) -> Leadership {
    Leadership {
        leading: false,
        holder: Some(holder.into()),
    }
}

#[tokio::test]
async fn the_first_candidate_creates_the_lease_and_leads() {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    let mut a = Candidate::new(config("node-a"));
    assert_eq!(a.leadership(t0), Leadership::default());
    assert!(a.attempt(&api, t0, wall()).await);
    assert_eq!(
        a.leadership(t0),
        Leadership {
            leading: true,
            holder: Some("node-a".into())
        }
    );
    let spec = api.spec();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(4));
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
    let meta = api.state().lease.clone().unwrap().metadata;
    assert_eq!(meta.name.as_deref(), Some("nodeplane-egress-assigner"));
    assert_eq!(meta.namespace.as_deref(), Some("nodeplane"));
}

#[tokio::test]
async fn the_leader_renews_without_reading_and_followers_wait() {
    let (api, t0, mut a, mut b) = a_leading().await;
    // Ten seconds of renewals: the follower never takes over, whatever its phase.
    for i in 1..=10u32 {
        let t = t0 + RETRY * i;
        assert!(a.attempt(&api, t, wall()).await);
        assert!(!b.attempt(&api, t + MS * 300, wall()).await);
        assert_eq!(b.leadership(t), following("node-a"));
    }
    assert_eq!(
        api.state().replaces,
        10,
        "one replace per renewal, no takeover"
    );
    assert_eq!(api.transitions(), 0);
}

#[tokio::test]
async fn a_dead_leader_is_replaced_after_the_lease_duration_on_the_followers_clock() {
    let (api, t0, mut a, mut b) = a_leading().await;
    assert!(a.attempt(&api, t0 + RETRY, wall()).await);
    // The follower sees the last renewal at t0 + 1.5 s; then node-a dies.
    let seen = t0 + RETRY + MS * 500;
    assert!(!b.attempt(&api, seen, wall()).await);
    // Unchanged record: the countdown runs from when it was first seen, not re-armed.
    assert!(!b.attempt(&api, seen + DURATION / 2, wall()).await);
    assert!(!b.attempt(&api, seen + DURATION - MS, wall()).await);
    // The follower's next wake-up is the expiry itself, not a retry period later.
    assert_eq!(b.next_attempt(seen + DURATION - MS, 0.0), seen + DURATION);
    assert!(b.attempt(&api, seen + DURATION, wall()).await);
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    assert_eq!(api.transitions(), 1);

    // node-a comes back (a partition, not a death): its fast renewal conflicts, it reads
    // the lease, sees node-b's fresh record and does not lead.
    let later = seen + DURATION + MS;
    assert!(!a.attempt(&api, later, wall()).await);
    assert_eq!(a.leadership(later), following("node-b"));
    assert_eq!(api.holder().as_deref(), Some("node-b"));
}

#[tokio::test]
async fn a_holder_the_probes_prove_dead_is_replaced_at_once_and_steps_down_at_its_next_renewal() {
    let (api, t0, mut a, mut b) = a_leading().await;
    assert!(!b.attempt(&api, t0 + MS, wall()).await);
    // Another node dead changes nothing.
    b.set_dead(["node-c".to_string()].into());
    assert!(!b.attempt(&api, t0 + MS * 2, wall()).await);
    assert_eq!(b.next_attempt(t0 + MS * 2, 0.0), t0 + MS * 2 + RETRY);
    // The holder's node dead: taken over long before the lease expires.
    b.set_dead(["node-a".to_string()].into());
    assert_eq!(b.next_attempt(t0 + MS * 3, 0.0), t0 + MS * 3 + RETRY / 10);
    let early = t0 + MS * 400;
    assert!(b.attempt(&api, early, wall()).await);
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    assert_eq!(api.transitions(), 1);
    // node-a was only cut off from node-b: its next renewal conflicts, it reads node-b's
    // record and stops leading at once, not at its renew deadline.
    assert!(a.leading(early + RETRY));
    assert!(!a.attempt(&api, t0 + RETRY, wall()).await);
    assert!(!a.leading(t0 + RETRY));
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    // A candidate never takes over from itself because its own node is in the set.
    let mut own = Candidate::new(config("node-b"));
    own.set_dead(["node-b".to_string()].into());
    assert!(!own.holder_dead());
}

#[tokio::test]
async fn renew_times_from_a_skewed_clock_do_not_matter() {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    let mut a = Candidate::new(config("node-a"));
    let mut b = Candidate::new(config("node-b"));
    // node-a's wall clock is a year behind, then a year ahead.
    let behind = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(24 * 365);
    let ahead = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(24 * 365);
    assert!(a.attempt(&api, t0, behind).await);
    assert!(
        !b.attempt(&api, t0 + MS, wall()).await,
        "an old renewTime is not expiry"
    );
    assert!(a.attempt(&api, t0 + RETRY, ahead).await);
    // A renewTime in the future does not keep a dead leader alive either.
    assert!(!b.attempt(&api, t0 + RETRY + MS, wall()).await);
    assert!(b.attempt(&api, t0 + RETRY + MS + DURATION, wall()).await);
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_leading_at_the_renew_deadline() {
    let (api, t0, mut a, _) = a_leading().await;
    api.state().down = true;
    assert!(!a.attempt(&api, t0 + RETRY, wall()).await, "not renewed");
    assert!(a.leading(t0 + RETRY), "but still leading");
    assert!(!a.attempt(&api, t0 + RETRY * 2, wall()).await);
    assert!(a.leading(t0 + RETRY * 2), "still within the renew deadline");
    // A hanging request gets only what is left of the deadline.
    assert_eq!(a.attempt_budget(t0 + RETRY * 2), DEADLINE - RETRY * 2);
    assert!(!a.leading(t0 + DEADLINE));
    assert!(!a.attempt(&api, t0 + DEADLINE, wall()).await);
    assert!(!a.leadership(t0 + DEADLINE).leading);
    // Stopped before any follower may take over (deadline < duration, counted from the start
    // of the last renewal, which no follower can have seen earlier).
    const { assert!(DEADLINE.as_millis() < DURATION.as_millis()) };

    // The API server comes back and nobody took over: the lease is still ours, take it back.
    api.state().down = false;
    assert!(a.attempt(&api, t0 + DEADLINE + RETRY, wall()).await);
    assert_eq!(api.transitions(), 0);
}

#[tokio::test]
async fn the_leader_reads_again_when_its_direct_renewal_fails() {
    let (api, t0, mut a, _) = a_leading().await;
    // Someone (kubectl label) updated the lease: the direct renewal conflicts, a fresh read
    // shows the record still ours, the renewal goes through on the new resourceVersion.
    {
        let mut s = api.state();
        let mut lease = s.lease.clone().unwrap();
        lease.metadata.labels = Some([("team".to_string(), "net".to_string())].into());
        FakeLeases::stamp(&mut s, lease);
    }
    assert!(a.attempt(&api, t0 + RETRY, wall()).await);
    assert_eq!(api.state().conflicts, 1);
    let lease = api.state().lease.clone().unwrap();
    assert_eq!(lease.metadata.labels.unwrap()["team"], "net", "kept");
    assert_eq!(api.transitions(), 0);
}

#[tokio::test]
async fn release_lets_the_next_candidate_take_over_at_once() {
    let (api, t0, mut a, mut b) = a_leading().await;
    assert!(!b.attempt(&api, t0 + MS, wall()).await);
    assert!(a.release(&api, wall()).await);
    assert!(!a.leading(t0 + MS * 2));
    let spec = api.spec();
    assert_eq!(spec.holder_identity, None);
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(0));
    // The very next attempt of the follower, not a lease duration later.
    assert!(b.attempt(&api, t0 + MS * 3, wall()).await);
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    assert_eq!(api.transitions(), 1);
    // Releasing what one does not hold writes nothing.
    let before = api.state().rv;
    assert!(!a.release(&api, wall()).await);
    assert_eq!(api.state().rv, before);
}

#[tokio::test]
async fn a_replace_on_a_stale_read_conflicts_and_the_loser_does_not_lead() {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    let (mut a, mut b, mut c) = (
        Candidate::new(config("node-a")),
        Candidate::new(config("node-b")),
        Candidate::new(config("node-c")),
    );
    assert!(a.attempt(&api, t0, wall()).await);
    assert!(!b.attempt(&api, t0 + MS, wall()).await);
    assert!(!c.attempt(&api, t0 + MS, wall()).await);
    // node-a dies; both followers see the lease expire and race for it.
    let expired = t0 + MS + DURATION;
    let stale = api.state().lease.clone();
    assert!(b.attempt(&api, expired, wall()).await);
    // node-c reads from a cache that has not seen node-b's takeover yet.
    api.state().stale = Some(stale);
    assert!(!c.attempt(&api, expired, wall()).await);
    assert_eq!(api.state().conflicts, 1, "node-c's replace got 409");
    assert!(!c.leadership(expired).leading);
    assert_eq!(api.holder().as_deref(), Some("node-b"));
    assert_eq!(api.transitions(), 1, "one takeover, not two");
    // Once the cache catches up node-c sees a live leader.
    api.state().stale = None;
    assert!(!c.attempt(&api, expired + RETRY, wall()).await);
    assert_eq!(
        c.leadership(expired + RETRY).holder.as_deref(),
        Some("node-b")
    );
}

#[tokio::test]
async fn two_creates_race_and_one_gets_already_exists() {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    let (mut a, mut b) = two_candidates();
    // Both read "no lease" (node-b from a cache that has not seen node-a's create).
    api.state().stale = Some(None);
    assert!(a.attempt(&api, t0, wall()).await);
    assert!(!b.attempt(&api, t0, wall()).await);
    assert_eq!(api.state().conflicts, 1);
    assert_eq!(api.holder().as_deref(), Some("node-a"));
}

#[tokio::test]
async fn a_restarted_agent_takes_its_own_lease_back_at_once() {
    let api = FakeLeases::default();
    let t0 = Instant::now();
    assert!(
        Candidate::new(config("node-a"))
            .attempt(&api, t0, wall())
            .await
    );
    // Same node, new process: no wait for its own old lease to expire, no transition.
    let mut again = Candidate::new(config("node-a"));
    assert!(again.attempt(&api, t0 + MS, wall()).await);
    assert_eq!(api.transitions(), 0);
}

#[test]
fn followers_spread_their_reads_and_the_leader_keeps_time() {
    let t0 = Instant::now();
    let b = Candidate::new(config("node-b"));
    assert_eq!(b.next_attempt(t0, 0.0), t0 + RETRY);
    assert_eq!(b.next_attempt(t0, 0.5), t0 + RETRY.mul_f64(1.1));
    assert!(b.next_attempt(t0, 0.9999) < t0 + RETRY.mul_f64(1.2));
    assert_eq!(b.attempt_budget(t0), DEADLINE);
}

#[test]
fn timings_follow_client_go_rules() {
    assert_eq!(Timings::DEFAULT.validate(), Ok(()));
    let t = |d: u64, r: u64, p: u64| Timings {
        lease_duration: Duration::from_millis(d),
        renew_deadline: Duration::from_millis(r),
        retry_period: Duration::from_millis(p),
    };
    assert_eq!(t(15_000, 10_000, 2_000).validate(), Ok(()));
    assert!(
        t(4_500, 3_000, 1_000)
            .validate()
            .unwrap_err()
            .contains("whole")
    );
    assert!(
        t(4_000, 4_000, 1_000)
            .validate()
            .unwrap_err()
            .contains("less than")
    );
    assert!(
        t(4_000, 3_000, 2_500)
            .validate()
            .unwrap_err()
            .contains("jitter")
    );
    assert!(t(4_000, 3_000, 0).validate().is_err());
}
