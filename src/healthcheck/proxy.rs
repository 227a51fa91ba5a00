//! Node-level proxy health, as kube-proxy serves it on `--healthz-bind-address` (default
//! `0.0.0.0:10256`): cloud load balancers probe `/healthz` to decide whether a node takes
//! `externalTrafficPolicy: Cluster` traffic, and `serviceProxyHealthy` on every
//! health-check port is the same verdict.
//!
//! *Healthy* is kube-proxy's rule: no update of the dataplane has been waiting longer than the
//! health timeout (60 s, kube-proxy's default of twice its 30 s sync period). An update is
//! *queued* when a new snapshot is published, a drift of the table is detected or a sync
//! fails (from when that sync started); a successful sync clears it and becomes
//! `lastUpdated`. A failing or stuck agent is therefore reported only once the oldest pending
//! update is late, so one transient failure does not make every load balancer drain the node.
//! `/healthz` also requires the node to be *eligible*: its Node object neither has a
//! `deletionTimestamp` nor the Cluster Autoscaler's `ToBeDeletedByClusterAutoscaler` taint
//! (eligible while the Node is unknown, as kube-proxy is at start-up). `/livez` ignores
//! eligibility. Both answer 200 or 503 with kube-proxy's JSON body.

use hyper::StatusCode;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::api::Node;

/// How late a queued update may be before the proxy is unhealthy (kube-proxy: twice its
/// sync period, 30 s by default).
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// The taint the Cluster Autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// A moment on both clocks: the monotonic one decides, the wall clock is what the body shows.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    pub at: Instant,
    pub wall: SystemTime,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp {
            at: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// The shared proxy health: written by the run loop's observer and the change notifications,
/// read by the `/healthz` server and every health-check port. Clock-explicit.
#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    last_updated: SystemTime,
    oldest_pending: Option<Instant>,
    node_eligible: bool,
}

/// What one probe sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The dataplane is up to date or not late (node eligibility aside).
    pub healthy: bool,
    pub node_eligible: bool,
    /// The last successful sync (the agent's start before the first).
    pub last_updated: SystemTime,
}

impl ProxyHealth {
    /// Healthy and eligible, "updated" at `start` (kube-proxy marks its start as an update, so
    /// that a proxy whose first sync never succeeds is late `timeout` after its first event).
    pub fn new(timeout: Duration, start: Stamp) -> ProxyHealth {
        ProxyHealth {
            timeout,
            inner: Mutex::new(Inner {
                last_updated: start.wall,
                oldest_pending: None,
                node_eligible: true,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An update is waiting for a sync since `at` (the oldest one counts).
    pub fn queued(&self, at: Instant) {
        let mut s = self.lock();
        if s.oldest_pending.is_none_or(|p| at < p) {
            s.oldest_pending = Some(at);
        }
    }

    /// A sync succeeded at `at`: nothing is pending any more.
    pub fn updated(&self, at: Stamp) {
        let mut s = self.lock();
        s.oldest_pending = None;
        s.last_updated = at.wall;
    }

    /// The node's eligibility from its Node object (`None`: unknown, eligible).
    pub fn set_node(&self, node: Option<&Node>) {
        self.lock().node_eligible = node.is_none_or(node_eligible);
    }

    /// kube-proxy's rule, node aside: no update pending for `timeout` or longer.
    pub fn healthy(&self, now: Instant) -> bool {
        self.verdict(now).healthy
    }

    pub fn verdict(&self, now: Instant) -> Verdict {
        let s = self.lock();
        Verdict {
            healthy: s
                .oldest_pending
                .is_none_or(|p| now.saturating_duration_since(p) < self.timeout),
            node_eligible: s.node_eligible,
            last_updated: s.last_updated,
        }
    }
}

/// Not being deleted and not tainted for deletion by the Cluster Autoscaler.
pub fn node_eligible(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !node
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// The answer to `/healthz` (`livez: false`: healthy *and* eligible) or `/livez` (healthy):
/// status and kube-proxy's body, byte for byte. `lastUpdated` is the current time when
/// healthy, as kube-proxy reports it.
pub fn answer(verdict: &Verdict, now: SystemTime, livez: bool) -> (StatusCode, String) {
    let ok = verdict.healthy && (livez || verdict.node_eligible);
    let last = if ok { now } else { verdict.last_updated };
    let (last, now) = (go_time(last), go_time(now));
    let body = if livez {
        format!(r#"{{"lastUpdated": "{last}","currentTime": "{now}"}}"#)
    } else {
        let eligible = verdict.node_eligible;
        format!(r#"{{"lastUpdated": "{last}","currentTime": "{now}", "nodeEligible": {eligible}}}"#)
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

/// A time as Go's `time.Time.String()` prints it in UTC (what kube-proxy's bodies hold):
/// `2006-01-02 15:04:05.999999999 +0000 UTC`, trailing zeros of the fraction dropped.
pub fn go_time(t: SystemTime) -> String {
    let ts = k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or_default();
    let dt = ts.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).datetime();
    let mut s = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    let nanos = dt.subsec_nanosecond();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push_str(" +0000 UTC");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::objects;

    fn at(t0: Stamp, secs: u64) -> Stamp {
        Stamp {
            at: t0.at + Duration::from_secs(secs),
            wall: t0.wall + Duration::from_secs(secs),
        }
    }

    #[test]
    fn healthy_until_a_queued_update_is_late() {
        let t0 = Stamp::now();
        let h = ProxyHealth::new(HEALTH_TIMEOUT, t0);
        // Starting up, nothing queued: healthy however long.
        assert!(h.healthy(at(t0, 1000).at));
        h.queued(at(t0, 10).at);
        h.queued(at(t0, 50).at); // the oldest pending update counts
        assert!(h.healthy(at(t0, 69).at));
        assert!(!h.healthy(at(t0, 70).at));
        let v = h.verdict(at(t0, 70).at);
        assert_eq!(v.last_updated, t0.wall);
        // A successful sync clears it and is the new lastUpdated.
        h.updated(at(t0, 71));
        assert!(h.healthy(at(t0, 500).at));
        assert_eq!(h.verdict(at(t0, 500).at).last_updated, at(t0, 71).wall);
    }

    #[test]
    fn failing_syncs_make_it_unhealthy_after_the_timeout() {
        let t0 = Stamp::now();
        let h = ProxyHealth::new(HEALTH_TIMEOUT, t0);
        h.updated(at(t0, 1));
        // A sync started at 5 fails, and so does every retry.
        h.queued(at(t0, 5).at);
        h.queued(at(t0, 7).at);
        assert!(h.healthy(at(t0, 64).at));
        assert!(!h.healthy(at(t0, 65).at));
    }

    #[test]
    fn nodes_being_deleted_or_tainted_for_deletion_are_not_eligible() {
        let eligible = |n: objects::Node| node_eligible(&n.object());
        assert!(eligible(objects::node("n1", &["192.0.2.1"])));
        assert!(eligible(objects::node("n1", &["192.0.2.1"]).taint("other")));
        assert!(!eligible(
            objects::node("n1", &["192.0.2.1"]).taint(TO_BE_DELETED_TAINT)
        ));
        assert!(!eligible(objects::node("n1", &["192.0.2.1"]).deleting()));
        let h = ProxyHealth::new(HEALTH_TIMEOUT, Stamp::now());
        let gone = objects::node("n1", &["192.0.2.1"]).deleting().object();
        h.set_node(Some(&gone));
        assert!(!h.verdict(Instant::now()).node_eligible);
        h.set_node(None);
        assert!(h.verdict(Instant::now()).node_eligible);
    }

    #[test]
    fn healthz_and_livez_bodies_are_kube_proxys() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        let last = SystemTime::UNIX_EPOCH + Duration::from_secs(1_699_999_000);
        let v = Verdict {
            healthy: true,
            node_eligible: true,
            last_updated: last,
        };
        let now = "2023-11-14 22:13:20.25 +0000 UTC";
        assert_eq!(
            answer(&v, t, false),
            (
                StatusCode::OK,
                format!(
                    r#"{{"lastUpdated": "{now}","currentTime": "{now}", "nodeEligible": true}}"#
                )
            )
        );
        let tainted = Verdict {
            node_eligible: false,
            ..v
        };
        let (code, body) = answer(&tainted, t, false);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            format!(
                r#"{{"lastUpdated": "2023-11-14 21:56:40 +0000 UTC","currentTime": "{now}", "nodeEligible": false}}"#
            )
        );
        // /livez ignores eligibility.
        assert_eq!(
            answer(&tainted, t, true),
            (
                StatusCode::OK,
                format!(r#"{{"lastUpdated": "{now}","currentTime": "{now}"}}"#)
            )
        );
        let late = Verdict {
            healthy: false,
            ..v
        };
        assert_eq!(answer(&late, t, true).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer(&late, t, false).0, StatusCode::SERVICE_UNAVAILABLE);
    }
}
