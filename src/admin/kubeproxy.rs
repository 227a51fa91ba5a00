//! kube-proxy's own metrics, with its names, help texts, labels and bucket layouts, so that
//! dashboards and clusterloader2 read nodeplane unchanged: sync duration and last sync time,
//! nftables sync failures, network programming latency, and the proxy health probes by code.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::snapshot::{self, ObjectKey, ObjectMap, Snapshot};

/// Set by the EndpointSlice and Endpoints controllers: when the change that led to this
/// version of the object happened (a pod became ready, a service changed).
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

/// The `kubeproxy_*` series.
#[derive(Clone)]
pub struct KubeProxyMetrics {
    sync_duration: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    sync_failures: Counter,
    programming: Histogram,
    healthz: Family<CodeLabel, Counter>,
    livez: Family<CodeLabel, Counter>,
    latency: Arc<Mutex<ProgrammingLatency>>,
}

/// kube-proxy's `NetworkProgrammingLatency` buckets: 0.25 s, 0.5 s, 1..59 s by 1 s, 60..115 s
/// by 5 s, 120..300 s by 30 s.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

impl KubeProxyMetrics {
    /// Registers the series under `registry` (prefixed `kubeproxy`). `start`: changes
    /// triggered before it are not observed (kube-proxy's rule: at start-up every object is
    /// new, and its trigger time may be days old).
    pub fn register(registry: &mut Registry, start: SystemTime) -> KubeProxyMetrics {
        let m = KubeProxyMetrics {
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            last_sync: Gauge::default(),
            sync_failures: Counter::default(),
            programming: Histogram::new(programming_buckets()),
            healthz: Family::default(),
            livez: Family::default(),
            latency: Arc::new(Mutex::new(ProgrammingLatency::new(start))),
        };
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync.clone(),
        );
        registry.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            m.sync_failures.clone(),
        );
        registry.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.programming.clone(),
        );
        registry.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz.clone(),
        );
        registry.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez.clone(),
        );
        m
    }

    /// A sync that committed `snapshot` at `now` and took `took`.
    pub fn synced(&self, took: Duration, snapshot: Option<&Snapshot>, now: SystemTime) {
        self.sync_duration.observe(took.as_secs_f64());
        let unix = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.last_sync.set(unix.as_secs_f64());
        if let Some(s) = snapshot {
            let mut latency = self.latency.lock().unwrap_or_else(|p| p.into_inner());
            for seconds in latency.committed(s, now) {
                self.programming.observe(seconds);
            }
        }
    }

    /// A failed sync (kube-proxy counts the failed nftables transactions; every failed sync
    /// leaves the rules not synced, so all count).
    pub fn failed(&self, took: Duration) {
        self.sync_duration.observe(took.as_secs_f64());
        self.sync_failures.inc();
    }

    /// One answer of the proxy health server: `livez` or `/healthz`, by HTTP status code.
    pub fn probe(&self, livez: bool, code: u16) {
        let family = if livez { &self.livez } else { &self.healthz };
        let label = CodeLabel {
            code: code.to_string(),
        };
        family.get_or_create(&label).inc();
    }
}

/// What network programming latency is measured from: the trigger times of the endpoint
/// objects that changed since the last committed snapshot, each observed once, by the sync
/// that commits it.
pub struct ProgrammingLatency {
    start: SystemTime,
    committed: Option<Snapshot>,
}

impl ProgrammingLatency {
    pub fn new(start: SystemTime) -> ProgrammingLatency {
        ProgrammingLatency {
            start,
            committed: None,
        }
    }

    /// The latencies (seconds) of the changes `snapshot` carries over the last committed one.
    /// A changed object's trigger time counts when it is after the start and differs from
    /// its previous version's (an object re-sent unchanged is no new change).
    pub fn committed(&mut self, snapshot: &Snapshot, now: SystemTime) -> Vec<f64> {
        let mut out = Vec::new();
        let prev = self.committed.as_ref();
        let mut observe = |old: Option<Option<SystemTime>>, new: Option<SystemTime>| {
            if let Some(t) = new
                && t > self.start
                && old != Some(Some(t))
            {
                out.push(now.duration_since(t).unwrap_or_default().as_secs_f64());
            }
        };
        changed(
            prev.map(Snapshot::endpoint_slices),
            snapshot.endpoint_slices(),
            |old, new| observe(old.map(|o| trigger(&o.metadata)), trigger(&new.metadata)),
        );
        changed(
            prev.map(Snapshot::endpoints),
            snapshot.endpoints(),
            |old, new| observe(old.map(|o| trigger(&o.metadata)), trigger(&new.metadata)),
        );
        self.committed = Some(snapshot.clone());
        out
    }
}

/// Calls `f(old, new)` for every object of `cur` that is new or replaced since `prev`
/// (this runs after every sync: the cost is the size of the change, see `snapshot::changes`).
fn changed<T: PartialEq>(
    prev: Option<&ObjectMap<ObjectKey, T>>,
    cur: &ObjectMap<ObjectKey, T>,
    mut f: impl FnMut(Option<&T>, &T),
) {
    let empty = ObjectMap::new();
    for (_, old, new) in snapshot::changes(prev.unwrap_or(&empty), cur) {
        if let Some(new) = new {
            f(old.map(|o| &**o), new);
        }
    }
}

fn trigger(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<SystemTime> {
    let text = meta.annotations.as_ref()?.get(TRIGGER_TIME)?;
    let t: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::objects;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Service `web`'s slice with this trigger time (RFC 3339).
    fn slice(ip: &str, trigger: Option<&str>) -> crate::api::EndpointSlice {
        let ports = "{name: http, port: 8080, protocol: TCP}";
        let mut s =
            objects::endpoint_slice("web-x", "web", "IPv4", ports, &[objects::ep(ip, "n1")])
                .object();
        if let Some(t) = trigger {
            let a = [(TRIGGER_TIME.to_string(), t.to_string())];
            s.metadata.annotations = Some(a.into_iter().collect());
        }
        s
    }

    #[test]
    fn programming_latency_is_observed_once_per_change_after_the_start() {
        // 2026-01-01T00:00:00Z = 1767225600.
        let t0 = 1_767_225_600;
        let mut p = ProgrammingLatency::new(at(t0));
        // Present at start, triggered before it: not observed.
        let old = Snapshot::builder()
            .with(slice("10.128.0.1", Some("2025-12-31T23:00:00Z")))
            .build();
        assert!(p.committed(&old, at(t0 + 5)).is_empty());
        // A change triggered 1.5 s before the commit.
        let mut b = old.to_builder();
        b.insert(slice("10.128.0.2", Some("2026-01-01T00:00:10.5Z")));
        let changed = b.build();
        assert_eq!(p.committed(&changed, at(t0 + 12)), vec![1.5]);
        // Committed again (another object changed): not observed twice.
        assert!(p.committed(&changed, at(t0 + 20)).is_empty());
        // A new version without a new trigger time, or without one at all: nothing.
        let mut b = changed.to_builder();
        b.insert(slice("10.128.0.3", Some("2026-01-01T00:00:10.5Z")));
        assert!(p.committed(&b.build(), at(t0 + 30)).is_empty());
        let mut b = changed.to_builder();
        b.insert(slice("10.128.0.4", None));
        assert!(p.committed(&b.build(), at(t0 + 31)).is_empty());
    }

    #[test]
    fn exposition_has_kube_proxys_names_and_buckets() {
        let m = crate::admin::Metrics::new();
        let k = &m.kubeproxy;
        k.synced(Duration::from_millis(3), None, at(1_767_225_600));
        k.failed(Duration::from_millis(1));
        k.failed(Duration::from_millis(1));
        let snap = Snapshot::builder()
            .with(slice("10.128.0.1", Some("2999-01-01T00:00:00Z")))
            .build();
        // Triggered "in the future" of the commit clock: observed as 0.
        k.synced(Duration::from_millis(2), Some(&snap), SystemTime::now());
        let text = m.encode();
        for line in [
            "# HELP kubeproxy_sync_proxy_rules_duration_seconds SyncProxyRules latency in seconds.\n",
            "kubeproxy_sync_proxy_rules_duration_seconds_count 4\n",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 2\n",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"16.384\"} 4\n",
            "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total 2\n",
            "kubeproxy_network_programming_duration_seconds_count 1\n",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 1\n",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"59.0\"} 1\n",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"115.0\"} 1\n",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"300.0\"} 1\n",
            // The agent's own series stay.
            "nodeplane_sync_duration_seconds_count",
        ] {
            assert!(text.contains(line), "{line:?} missing:\n{text}");
        }
        // 15 sync buckets and 80 programming buckets, each plus +Inf.
        let buckets = |name: &str| text.matches(&format!("{name}_bucket{{")).count();
        assert_eq!(buckets("kubeproxy_sync_proxy_rules_duration_seconds"), 16);
        assert_eq!(
            buckets("kubeproxy_network_programming_duration_seconds"),
            81
        );
    }
}
