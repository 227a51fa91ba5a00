//! Leader election ([`nodeplane::controller::lease`]) over HTTP against the fake API server's
//! Leases (resourceVersion preconditions, `409` on a stale replace or a taken name): two
//! electors give exactly one leader; a leader that dies without releasing (its node gone) is
//! replaced within the lease duration plus a retry period; a graceful shutdown releases and
//! the next candidate takes over within about a retry period; a replace based on a stale read
//! gets `409` and its sender does not lead. The electors run in this process on the host's
//! loopback: no lab, no agent binary.

use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use nodeplane::controller::lease::{
    Candidate, ElectionConfig, Elector, KubeLeases, Leadership, LeaseApi, LeaseError, Timings,
};
use nodeplane::source::kube::{Liveness, client};
use tokio::sync::watch;
use tokio::time::Instant;

use nodeplane::testing::fakeapi::FakeApi;

const NAMESPACE: &str = "nodeplane";
const NAME: &str = "nodeplane-egress-assigner";

/// Short timings so that the tests take seconds, with margins a loaded machine keeps.
const FAST: Timings = Timings {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_secs(1),
    retry_period: Duration::from_millis(200),
};

struct Setup {
    api: FakeApi,
    kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

fn setup() -> Setup {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let api = FakeApi::start(listener);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let rt = nodeplane::testing::runtime::multi_thread(2);
    Setup {
        api,
        kubeconfig,
        _dir: dir,
        rt,
    }
}

impl Setup {
    async fn leases(&self) -> KubeLeases {
        let c = client(
            Some(&self.kubeconfig),
            None,
            Liveness::new(Duration::from_secs(25)),
        )
        .await
        .expect("client");
        KubeLeases::new(c, NAMESPACE, NAME)
    }

    async fn elector(&self, node: &str, timings: Timings) -> Elector {
        let config = ElectionConfig {
            namespace: NAMESPACE.into(),
            name: NAME.into(),
            identity: node.into(),
            timings,
        };
        Elector::spawn(self.leases().await, config)
    }

    /// `spec` of the stored Lease.
    /// node-a leading and node-b following it, each with its leadership receiver.
    async fn leader_and_follower(
        &self,
        timings: Timings,
    ) -> (
        Elector,
        watch::Receiver<Leadership>,
        Elector,
        watch::Receiver<Leadership>,
    ) {
        let a = self.elector("node-a", timings).await;
        let mut ra = a.subscribe();
        let wait = Duration::from_secs(5);
        until(&mut ra, wait, "node-a leads", leads("node-a")).await;
        let b = self.elector("node-b", timings).await;
        let mut rb = b.subscribe();
        until(&mut rb, wait, "node-b follows", follows("node-a")).await;
        (a, ra, b, rb)
    }

    fn spec(&self) -> serde_json::Value {
        self.api.object("Lease", NAMESPACE, NAME).expect("lease")["spec"].clone()
    }
}

/// Waits (at most `within`) until `pred` holds; returns how long it took.
async fn until(
    rx: &mut watch::Receiver<Leadership>,
    within: Duration,
    what: &str,
    pred: impl FnMut(&Leadership) -> bool,
) -> Duration {
    let start = Instant::now();
    let waited = tokio::time::timeout(within, rx.wait_for(pred))
        .await
        .map(|r| r.is_ok());
    match waited {
        Ok(true) => start.elapsed(),
        Ok(false) => panic!("{what}: elector gone"),
        Err(_) => panic!("{what}: not within {within:?}; last {:?}", *rx.borrow()),
    }
}

fn leads(node: &str) -> impl Fn(&Leadership) -> bool + '_ {
    move |l| l.leading && l.holder.as_deref() == Some(node)
}

fn follows(node: &str) -> impl Fn(&Leadership) -> bool + '_ {
    move |l| !l.leading && l.holder.as_deref() == Some(node)
}

#[test]
fn two_electors_exactly_one_leads() {
    let s = setup();
    s.rt.block_on(async {
        let a = s.elector("node-a", FAST).await;
        let b = s.elector("node-b", FAST).await;
        let (mut ra, mut rb) = (a.subscribe(), b.subscribe());
        let both = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let (la, lb) = (ra.borrow().clone(), rb.borrow().clone());
                if la.leading || lb.leading {
                    return (la, lb);
                }
                tokio::select! {
                    _ = ra.changed() => {}
                    _ = rb.changed() => {}
                }
            }
        })
        .await
        .expect("a leader within 5 s");
        let leader = if both.0.leading { "node-a" } else { "node-b" };
        // For five lease durations: never two leaders, never a change of leader, and the
        // follower names the leader.
        let watch_until = Instant::now() + FAST.lease_duration * 5;
        loop {
            let (la, lb) = (
                ra.borrow_and_update().clone(),
                rb.borrow_and_update().clone(),
            );
            assert!(!(la.leading && lb.leading), "two leaders: {la:?} {lb:?}");
            let (l, f) = if leader == "node-a" {
                (&la, &lb)
            } else {
                (&lb, &la)
            };
            assert!(l.leading, "{leader} lost the lease: {l:?}");
            assert!(
                !f.leading && f.holder.as_deref().is_none_or(|h| h == leader),
                "{f:?}"
            );
            tokio::select! {
                _ = ra.changed() => {}
                _ = rb.changed() => {}
                _ = tokio::time::sleep_until(watch_until) => break,
            }
        }
        assert_eq!(s.spec()["holderIdentity"], leader);
        assert_eq!(s.spec()["leaseTransitions"], 0);
        assert_eq!(s.spec()["leaseDurationSeconds"], 2);
        a.shutdown().await;
        b.shutdown().await;
    });
}

#[test]
fn a_dead_leader_is_replaced_within_the_lease_duration_and_a_retry() {
    let s = setup();
    s.rt.block_on(async {
        let (a, _ra, b, mut rb) = s.leader_and_follower(FAST).await;
        // node-a's node dies: no release, no more renewals.
        a.abort();
        let took = until(
            &mut rb,
            Duration::from_secs(10),
            "node-b takes over",
            leads("node-b"),
        )
        .await;
        // Not before the lease expired on node-b's clock (it may have seen the last renewal
        // up to a jittered retry before the abort), and within duration + jittered retry
        // (plus scheduling slack on a shared machine).
        let retry = FAST.retry_period.mul_f64(1.2);
        assert!(took >= FAST.lease_duration - retry, "too early: {took:?}");
        assert!(
            took <= FAST.lease_duration + retry + Duration::from_millis(500),
            "too late: {took:?}"
        );
        assert_eq!(s.spec()["holderIdentity"], "node-b");
        assert_eq!(s.spec()["leaseTransitions"], 1);
        b.shutdown().await;
    });
}

#[test]
fn graceful_shutdown_releases_and_the_next_takes_over_within_a_retry() {
    let s = setup();
    s.rt.block_on(async {
        // The default timings: a takeover well before the 4 s lease duration shows the release.
        let t = Timings::DEFAULT;
        let (a, ra, b, mut rb) = s.leader_and_follower(t).await;
        let start = Instant::now();
        a.shutdown().await;
        assert!(!ra.borrow().leading, "node-a published that it stopped");
        let took = start.elapsed()
            + until(
                &mut rb,
                Duration::from_secs(10),
                "node-b takes over",
                leads("node-b"),
            )
            .await;
        assert!(
            took < t.retry_period.mul_f64(1.2) + Duration::from_millis(800),
            "{took:?}: not a takeover of a released lease (expiry would be {:?})",
            t.lease_duration
        );
        assert_eq!(s.spec()["holderIdentity"], "node-b");
        assert_eq!(s.spec()["leaseTransitions"], 1);
        // The release itself: node-a wrote an empty holder with a 1 s duration.
        let release = s
            .api
            .writes()
            .into_iter()
            .filter(|w| w.method == "PUT" && w.path.ends_with(NAME))
            .find(|w| w.body["spec"]["holderIdentity"].is_null())
            .expect("a release was written");
        assert_eq!(release.body["spec"]["leaseDurationSeconds"], 1);
        b.shutdown().await;
    });
}

/// Reads answered from a cache that lags behind (as the API server's watch cache may).
struct StaleReads {
    inner: KubeLeases,
    stale: Mutex<Option<Lease>>,
}

impl LeaseApi for StaleReads {
    async fn get(&self, fresh: bool) -> Result<Option<Lease>, LeaseError> {
        let stale = self.stale.lock().unwrap().clone();
        match stale {
            Some(l) => Ok(Some(l)),
            None => self.inner.get(fresh).await,
        }
    }
    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.create(lease).await
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.replace(lease).await
    }
}

#[test]
fn a_replace_on_a_stale_read_gets_409_and_the_loser_does_not_lead() {
    let s = setup();
    s.rt.block_on(async {
        let config = |node: &str| ElectionConfig {
            namespace: NAMESPACE.into(),
            name: NAME.into(),
            identity: node.into(),
            timings: FAST,
        };
        let (api_a, api_b) = (s.leases().await, s.leases().await);
        let (mut a, mut b) = (
            Candidate::new(config("node-a")),
            Candidate::new(config("node-b")),
        );
        let t0 = Instant::now();

        // Two creates race: one gets 409 AlreadyExists.
        let first = api_a.get(true).await.unwrap();
        assert!(first.is_none());
        assert!(a.attempt(&api_a, t0, Timestamp::now()).await);
        let mut taken = Lease::default();
        taken.metadata.name = Some(NAME.into());
        match api_b.create(&taken).await {
            Err(LeaseError::Conflict(m)) => assert!(m.contains("already exists"), "{m}"),
            other => panic!("second create: {other:?}"),
        }
        assert_eq!(s.api.lease_conflicts(), 1);

        // node-b reads the lease, then node-a renews (new resourceVersion).
        let old = api_b.get(true).await.unwrap();
        let b_api = StaleReads {
            inner: api_b,
            stale: Mutex::new(old),
        };
        assert!(!b.attempt(&b_api, t0, Timestamp::now()).await);
        assert!(
            a.attempt(&api_a, t0 + FAST.retry_period, Timestamp::now())
                .await
        );
        // node-b's cache still shows the old record: once it looks expired on node-b's clock
        // it tries to take over with the old resourceVersion, gets 409 and does not lead.
        let expired = t0 + FAST.lease_duration;
        assert!(!b.attempt(&b_api, expired, Timestamp::now()).await);
        assert_eq!(s.api.lease_conflicts(), 2, "the stale replace got 409");
        assert!(!b.leading(expired));
        assert_eq!(s.spec()["holderIdentity"], "node-a");
        assert_eq!(s.spec()["leaseTransitions"], 0);
        // With the cache caught up node-b sees node-a's renewal and keeps following.
        *b_api.stale.lock().unwrap() = None;
        assert!(!b.attempt(&b_api, expired, Timestamp::now()).await);
        assert_eq!(
            b.leadership(expired).holder.as_deref(),
            Some("node-a"),
            "follows node-a"
        );
    });
}
