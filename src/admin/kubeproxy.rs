//! kube-proxy's own metrics (its nftables mode's set), with its names, help texts, labels and
//! bucket layouts, so that dashboards and clusterloader2 read nodeplane unchanged: full and
//! partial sync durations, last sync and last queued times, nftables sync and cleanup
//! failures, network programming latency, pending and total Service and endpoint changes,
//! services with a Local policy and no local endpoint, the conntrack reconciler, and the proxy
//! health probes by code. tests/fixtures/kube-proxy-metrics.txt holds kube-proxy's list;
//! `served_series_match_kube_proxys_list` compares.
//!
//! One sync programs both address families (one `inet` table), where kube-proxy runs a proxier
//! per family: a sync is observed under `ip_family="IPv4"` and `"IPv6"` alike.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::nft::ir::IpFamily;
use crate::plan::services::{ConntrackReconciled, NoLocalEndpoints};
use crate::snapshot::{self, ObjectKey, ObjectMap, Snapshot};

/// Set by the EndpointSlice and Endpoints controllers: when the change that led to this
/// version of the object happened (a pod became ready, a service changed).
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// kube-proxy's `ip_family` values (`v1.IPFamily`), in the order of [`family_index`].
pub const FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub ip_family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoLocalLabel {
    /// `internal` or `external`.
    pub traffic_policy: String,
    pub ip_family: String,
}

type Histograms = Family<FamilyLabel, Histogram, fn() -> Histogram>;
type TimeGauges = Family<FamilyLabel, Gauge<f64, AtomicU64>>;

/// The `kubeproxy_*` series.
#[derive(Clone)]
pub struct KubeProxyMetrics {
    sync_duration: Histograms,
    full_sync_duration: Histograms,
    partial_sync_duration: Histograms,
    last_sync: TimeGauges,
    last_queued: TimeGauges,
    sync_failures: Family<FamilyLabel, Counter>,
    cleanup_failures: Family<FamilyLabel, Counter>,
    programming: Histograms,
    endpoint_changes_pending: Gauge,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    service_changes: Counter,
    no_local: Family<NoLocalLabel, Gauge>,
    conntrack_duration: Histograms,
    conntrack_deleted: Family<FamilyLabel, Counter>,
    healthz: Family<CodeLabel, Counter>,
    livez: Family<CodeLabel, Counter>,
    latency: Arc<Mutex<ProgrammingLatency>>,
    changes: Arc<Mutex<ChangeTracker>>,
}

/// kube-proxy's sync and conntrack reconciler buckets: 1 ms doubling, 15 buckets.
fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn programming_histogram() -> Histogram {
    Histogram::new(programming_buckets())
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

fn family(name: &str) -> FamilyLabel {
    FamilyLabel {
        ip_family: name.to_string(),
    }
}

/// The index of `f` in [`FAMILIES`].
pub fn family_index(f: IpFamily) -> usize {
    match f {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl KubeProxyMetrics {
    /// Registers the series under `registry` (prefixed `kubeproxy`). `start`: changes
    /// triggered before it are not observed (kube-proxy's rule: at start-up every object is
    /// new, and its trigger time may be days old).
    pub fn register(registry: &mut Registry, start: SystemTime) -> KubeProxyMetrics {
        let m = KubeProxyMetrics::new(start);
        m.start_at_zero();
        m.register_sync(registry);
        m.register_changes(registry);
        m.register_conntrack_and_health(registry);
        m
    }

    fn new(start: SystemTime) -> KubeProxyMetrics {
        let histograms = || Histograms::new_with_constructor(sync_histogram as fn() -> Histogram);
        KubeProxyMetrics {
            sync_duration: histograms(),
            full_sync_duration: histograms(),
            partial_sync_duration: histograms(),
            last_sync: Family::default(),
            last_queued: Family::default(),
            sync_failures: Family::default(),
            cleanup_failures: Family::default(),
            programming: Histograms::new_with_constructor(programming_histogram),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            no_local: Family::default(),
            conntrack_duration: histograms(),
            conntrack_deleted: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            latency: Arc::new(Mutex::new(ProgrammingLatency::new(start))),
            changes: Arc::new(Mutex::new(ChangeTracker::default())),
        }
    }

    /// Counters and the no-local gauges exist from the start, at 0, so that `rate()` and
    /// alerts see the first event.
    fn start_at_zero(&self) {
        for f in FAMILIES {
            let _ = self.sync_failures.get_or_create(&family(f));
            let _ = self.cleanup_failures.get_or_create(&family(f));
            let _ = self.conntrack_deleted.get_or_create(&family(f));
        }
        self.no_local_endpoints(&imbl::OrdMap::new());
    }

    /// How long syncs took, when the last one ran or was queued, and how many failed.
    fn register_sync(&self, r: &mut Registry) {
        r.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        r.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            self.full_sync_duration.clone(),
        );
        r.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            self.partial_sync_duration.clone(),
        );
        r.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            self.last_sync.clone(),
        );
        r.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            self.last_queued.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            self.sync_failures.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            self.cleanup_failures.clone(),
        );
    }

    /// The programming latency and the pending and counted Service and endpoint changes.
    fn register_changes(&self, r: &mut Registry) {
        r.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            self.programming.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            self.endpoint_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            self.endpoint_changes.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            self.service_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            self.service_changes.clone(),
        );
        r.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            self.no_local.clone(),
        );
    }

    /// The conntrack cleanup's time and deletions and the health servers' answers.
    fn register_conntrack_and_health(&self, r: &mut Registry) {
        r.register(
            "conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            self.conntrack_duration.clone(),
        );
        r.register(
            "conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            self.conntrack_deleted.clone(),
        );
        r.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            self.healthz.clone(),
        );
        r.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            self.livez.clone(),
        );
    }

    fn observe_sync(&self, took: Duration, full: bool) {
        let kind = if full {
            &self.full_sync_duration
        } else {
            &self.partial_sync_duration
        };
        for f in FAMILIES {
            self.sync_duration
                .get_or_create(&family(f))
                .observe(took.as_secs_f64());
            kind.get_or_create(&family(f)).observe(took.as_secs_f64());
        }
    }

    /// A sync that committed `snapshot` at `now` and took `took`; `full`: it read the
    /// kernel's table back (see [`crate::observe::SyncOutcome::full`]).
    pub fn synced(&self, took: Duration, full: bool, snapshot: Option<&Snapshot>, now: SystemTime) {
        self.observe_sync(took, full);
        for f in FAMILIES {
            self.last_sync
                .get_or_create(&family(f))
                .set(unix_seconds(now));
        }
        if let Some(s) = snapshot {
            let mut latency = self.latency.lock().unwrap_or_else(|p| p.into_inner());
            for (fam, seconds) in latency.committed(s, now) {
                let label = family(FAMILIES[family_index(fam)]);
                self.programming.get_or_create(&label).observe(seconds);
            }
        }
    }

    /// A failed sync (kube-proxy counts the failed nftables transactions; every failed sync
    /// leaves the rules not synced, so all count).
    pub fn failed(&self, took: Duration, full: bool) {
        self.observe_sync(took, full);
        for f in FAMILIES {
            self.sync_failures.get_or_create(&family(f)).inc();
        }
    }

    /// Removing a table no longer wanted failed (kube-proxy: deleting stale chains, a
    /// transaction of its own after the sync).
    pub fn cleanup_failed(&self) {
        for f in FAMILIES {
            self.cleanup_failures.get_or_create(&family(f)).inc();
        }
    }

    /// A new snapshot was published at `now`: a sync is queued. Counts the Services and the
    /// endpoint objects (EndpointSlices, Endpoints) it changed, and what is pending since the
    /// last planned snapshot.
    pub fn queued(&self, published: &Snapshot, now: SystemTime) {
        for f in FAMILIES {
            self.last_queued
                .get_or_create(&family(f))
                .set(unix_seconds(now));
        }
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let (services, endpoints) = changes.published(published);
        self.service_changes.inc_by(services as u64);
        self.endpoint_changes.inc_by(endpoints as u64);
        self.set_pending(changes.pending());
    }

    /// A sync planned `snapshot` (whatever its outcome): the changes up to it are no longer
    /// pending (kube-proxy's trackers hand their changes over to the sync the same way).
    pub fn taken(&self, snapshot: &Snapshot) {
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        changes.taken(snapshot);
        self.set_pending(changes.pending());
    }

    fn set_pending(&self, (services, endpoints): (usize, usize)) {
        self.service_changes_pending.set(services as i64);
        self.endpoint_changes_pending.set(endpoints as i64);
    }

    /// The services' count of ports with a Local policy and no local endpoint, as of the
    /// last successful sync (every family and policy is set, absent ones to 0).
    pub fn no_local_endpoints(&self, counts: &imbl::OrdMap<NoLocalEndpoints, usize>) {
        for fam in [IpFamily::V4, IpFamily::V6] {
            for (external, policy) in [(false, "internal"), (true, "external")] {
                let n = counts
                    .get(&NoLocalEndpoints {
                        family: fam,
                        external,
                    })
                    .copied()
                    .unwrap_or(0);
                let label = NoLocalLabel {
                    traffic_policy: policy.into(),
                    ip_family: FAMILIES[family_index(fam)].into(),
                };
                self.no_local.get_or_create(&label).set(n as i64);
            }
        }
    }

    /// What the conntrack cleanup after a commit did, IPv4 then IPv6.
    pub fn conntrack_reconciled(&self, done: &[ConntrackReconciled; 2]) {
        for (f, d) in FAMILIES.iter().zip(done) {
            let label = family(f);
            self.conntrack_duration
                .get_or_create(&label)
                .observe(d.took.as_secs_f64());
            self.conntrack_deleted
                .get_or_create(&label)
                .inc_by(d.deleted as u64);
        }
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

/// Service and endpoint changes between published snapshots (kube-proxy's change trackers).
/// An object changed twice within one coalesced burst of the source counts once.
#[derive(Default)]
pub struct ChangeTracker {
    /// The last published snapshot.
    published: Option<Snapshot>,
    /// The last snapshot a sync planned.
    taken: Option<Snapshot>,
}

impl ChangeTracker {
    /// Takes in a newly published snapshot; returns the (Service, endpoint object) changes
    /// since the previous one. O(change).
    pub fn published(&mut self, s: &Snapshot) -> (usize, usize) {
        let empty = Snapshot::default();
        let prev = self.published.as_ref().unwrap_or(&empty);
        let services = snapshot::changes(prev.services(), s.services()).count();
        let endpoints = snapshot::changes(prev.endpoint_slices(), s.endpoint_slices()).count()
            + snapshot::changes(prev.endpoints(), s.endpoints()).count();
        self.published = Some(s.clone());
        (services, endpoints)
    }

    pub fn taken(&mut self, s: &Snapshot) {
        self.taken = Some(s.clone());
    }

    /// The services with a pending (Service, endpoint) change: changed between the last
    /// planned snapshot and the last published one, each service counted once per kind.
    pub fn pending(&self) -> (usize, usize) {
        let Some(published) = &self.published else {
            return (0, 0);
        };
        let empty = Snapshot::default();
        let taken = self.taken.as_ref().unwrap_or(&empty);
        if taken.ptr_eq(published) {
            return (0, 0);
        }
        let services = snapshot::changes(taken.services(), published.services()).count();
        let mut endpoints: BTreeSet<ObjectKey> =
            snapshot::changes(taken.endpoints(), published.endpoints())
                .map(|(k, _, _)| k.clone())
                .collect();
        for (k, old, new) in snapshot::changes(taken.endpoint_slices(), published.endpoint_slices())
        {
            for slice in old.into_iter().chain(new) {
                if let Some(svc) =
                    snapshot::labels(&slice.metadata).get(snapshot::SERVICE_NAME_LABEL)
                {
                    endpoints.insert(ObjectKey::new(k.namespace.clone(), svc.clone()));
                }
            }
        }
        (services, endpoints.len())
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

    /// The latencies (seconds) of the changes `snapshot` carries over the last committed one,
    /// by the family of the endpoint object's addresses (FQDN slices and Endpoints without
    /// an address have none and are not observed, as kube-proxy's per-family proxiers do).
    /// A changed object's trigger time counts when it is after the start and differs from
    /// its previous version's (an object re-sent unchanged is no new change).
    pub fn committed(&mut self, snapshot: &Snapshot, now: SystemTime) -> Vec<(IpFamily, f64)> {
        let mut out = Vec::new();
        let prev = self.committed.as_ref();
        let mut observe = |fam: Option<IpFamily>, old: Option<Option<SystemTime>>, new| {
            if let Some(t) = new
                && let Some(fam) = fam
                && t > self.start
                && old != Some(Some(t))
            {
                out.push((fam, now.duration_since(t).unwrap_or_default().as_secs_f64()));
            }
        };
        changed(
            prev.map(Snapshot::endpoint_slices),
            snapshot.endpoint_slices(),
            |old, new| {
                let fam = match new.address_type.as_str() {
                    "IPv4" => Some(IpFamily::V4),
                    "IPv6" => Some(IpFamily::V6),
                    _ => None,
                };
                observe(
                    fam,
                    old.map(|o| trigger(&o.metadata)),
                    trigger(&new.metadata),
                )
            },
        );
        changed(
            prev.map(Snapshot::endpoints),
            snapshot.endpoints(),
            |old, new| {
                let first = (new.subsets.iter().flatten())
                    .flat_map(|s| s.addresses.iter().flatten())
                    .find_map(|a| a.ip.parse::<std::net::IpAddr>().ok());
                let fam = first.map(IpFamily::of);
                observe(
                    fam,
                    old.map(|o| trigger(&o.metadata)),
                    trigger(&new.metadata),
                )
            },
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
        assert_eq!(
            p.committed(&changed, at(t0 + 12)),
            vec![(IpFamily::V4, 1.5)]
        );
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

    /// Parses an exposition into its families: name -> (type, help, label names, buckets,
    /// samples).
    #[derive(Debug, Default)]
    struct Served {
        kind: String,
        help: String,
        labels: BTreeSet<String>,
        buckets: Vec<String>,
        samples: usize,
    }

    fn parse(text: &str) -> std::collections::BTreeMap<String, Served> {
        let mut out: std::collections::BTreeMap<String, Served> = Default::default();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                out.entry(name.into()).or_default().help = help.into();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                current = name.into();
                out.entry(name.into()).or_default().kind = kind.into();
            } else if !line.starts_with('#') && !line.is_empty() {
                let f = out.get_mut(&current).unwrap();
                let sample = line.split_once(' ').unwrap().0;
                let (metric, labels) = match sample.split_once('{') {
                    Some((m, l)) => (m, l.trim_end_matches('}')),
                    None => (sample, ""),
                };
                f.samples += 1;
                for pair in labels.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap();
                    if k == "le" {
                        let le = v.trim_matches('"').to_string();
                        if metric.ends_with("_bucket") && !f.buckets.contains(&le) {
                            f.buckets.push(le);
                        }
                    } else {
                        f.labels.insert(k.into());
                    }
                }
            }
        }
        out
    }

    /// Go's `ExponentialBuckets`/`LinearBuckets` joined by `+` (`MergeBuckets`), as the
    /// fixture writes them.
    fn buckets_of(spec: &str) -> Vec<f64> {
        let mut out = Vec::new();
        for part in spec.split('+') {
            let (f, args) = part.trim_end_matches(')').split_once('(').unwrap();
            let a: Vec<f64> = args.split(',').map(|x| x.parse().unwrap()).collect();
            let (start, step, count) = (a[0], a[1], a[2] as usize);
            for i in 0..count {
                out.push(match f {
                    "exponential" => start * step.powi(i as i32),
                    "linear" => start + step * i as f64,
                    other => panic!("unknown bucket helper {other}"),
                });
            }
        }
        out
    }

    /// Every event the run mode feeds kube-proxy's series, through the observer the run
    /// loop calls (syncs full and partial, failed, a failed cleanup, the services' no-local
    /// counts and conntrack cleanup) and the change forwarder's `queued`.
    fn drive_every_series() -> Arc<crate::admin::AdminState> {
        use crate::admin::{AdminObserver, AdminState};
        use crate::observe::{ReconcileError, SyncObserver, SyncOutcome, SyncReport};
        let state = Arc::new(AdminState::new(None));
        let mut observer = AdminObserver {
            state: state.clone(),
            node_name: "n1".into(),
        };
        let table = crate::nft::ir::Table::new("nodeplane");
        let future = slice("10.128.0.1", Some("2999-01-01T00:00:00Z"));
        let snap = Snapshot::builder()
            .with(objects::service("web", "172.30.0.1", "{port: 80}").object())
            .with(future)
            .build();
        state.metrics.kubeproxy.queued(&snap, SystemTime::now());
        let mut report = SyncReport::default();
        let svc = &mut report.outputs.services;
        let no_local = NoLocalEndpoints {
            family: IpFamily::V6,
            external: true,
        };
        svc.no_local_endpoints.insert(no_local, 3);
        let reconciled = |ms, deleted| ConntrackReconciled {
            took: Duration::from_millis(ms),
            deleted,
        };
        svc.conntrack = Some([reconciled(2, 4), reconciled(1, 0)]);
        let ok = Ok(report);
        let failed = Err(ReconcileError::Runtime("boom".into()));
        for (result, full, cleanup_failed) in [
            (&ok, true, false),
            (&ok, false, false),
            (&failed, false, true),
        ] {
            observer.observe(&SyncOutcome {
                snapshot: Some(&snap),
                result,
                duration: Duration::from_millis(3),
                applied: Some(&table),
                applied_extra: Vec::new(),
                drift_seq: 0,
                full,
                cleanup_failed,
            });
        }
        state.metrics.kubeproxy.probe(false, 200);
        state.metrics.kubeproxy.probe(true, 503);
        state
    }

    /// The served `kubeproxy_*` series against kube-proxy's list
    /// (tests/fixtures/kube-proxy-metrics.txt, taken from its metrics.go): every series it
    /// lists as served exists with its type, label names, buckets and help text (plus the
    /// period prometheus-client appends), every absent one is absent, and nothing else is
    /// served under the prefix. Lists every difference.
    #[test]
    fn served_series_match_kube_proxys_list() {
        let fixture = include_str!("../../tests/fixtures/kube-proxy-metrics.txt");
        let state = drive_every_series();
        let text = state.metrics.encode();
        let served = parse(&text);
        let mut problems = Vec::new();
        let mut listed = BTreeSet::new();
        for line in fixture
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let f: Vec<&str> = line.split(" | ").collect();
            let [name, kind, labels, buckets, help, status] = f[..] else {
                panic!("fixture line of {} fields: {line}", f.len());
            };
            // OpenMetrics names a counter's family without `_total`.
            let family = match kind {
                "counter" => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            listed.insert(family.to_string());
            let got = served.get(family);
            if let Some(why) = status.strip_prefix("absent: ") {
                assert!(!why.is_empty(), "{name}: absent without a reason");
                if got.is_some() {
                    problems.push(format!("{name}: listed absent ({why}) but served"));
                }
                continue;
            }
            assert_eq!(status, "served", "{line}");
            let Some(got) = got else {
                problems.push(format!("{name}: missing"));
                continue;
            };
            if got.kind != kind {
                problems.push(format!("{name}: type {} (kube-proxy: {kind})", got.kind));
            }
            let want_help = format!("{help}.");
            if got.help != want_help {
                problems.push(format!("{name}: help {:?} (want {want_help:?})", got.help));
            }
            let want: BTreeSet<String> = labels
                .split(',')
                .filter(|l| *l != "-")
                .map(String::from)
                .collect();
            if got.labels != want {
                problems.push(format!("{name}: labels {:?} (want {want:?})", got.labels));
            }
            if got.samples == 0 {
                problems.push(format!("{name}: no sample (no event reached it)"));
            }
            if buckets != "-" {
                let mut want: Vec<String> = buckets_of(buckets)
                    .iter()
                    .map(|b| format!("{b:?}"))
                    .collect();
                want.push("+Inf".into());
                let got: Vec<String> = got
                    .buckets
                    .iter()
                    .map(|b| match b.parse::<f64>() {
                        Ok(v) if b != "+Inf" => format!("{v:?}"),
                        _ => b.clone(),
                    })
                    .collect();
                if got != want {
                    problems.push(format!("{name}: buckets {got:?} (want {want:?})"));
                }
            }
        }
        for name in served.keys().filter(|n| n.starts_with("kubeproxy_")) {
            if !listed.contains(name) {
                problems.push(format!("{name}: served but not in kube-proxy's list"));
            }
        }
        assert!(problems.is_empty(), "{}\n\n{text}", problems.join("\n"));
    }

    /// The values behind the series: what each event sets, per family.
    #[test]
    fn each_event_sets_its_series() {
        let state = drive_every_series();
        let text = state.metrics.encode();
        for line in [
            // Three syncs observed per family: one full, two partial.
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 3\n",
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 3\n",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1\n",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 2\n",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 1\n",
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv6\"} 1\n",
            // The snapshot's one Service and one slice were changes; the syncs took them.
            "kubeproxy_sync_proxy_rules_service_changes_total 1\n",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1\n",
            "kubeproxy_sync_proxy_rules_service_changes_pending 0\n",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0\n",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv6\"} 3\n",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\",ip_family=\"IPv4\"} 0\n",
            // Two successful syncs each reconciled: 4 IPv4 flows deleted each time.
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 8\n",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv6\"} 0\n",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv6\"} 2\n",
            // The IPv4 slice's change, triggered "in the future" of the commit: observed as 0,
            // once, under its family.
            "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 1\n",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\",ip_family=\"IPv4\"} 1\n",
            "kubeproxy_proxy_livez_total{code=\"503\"} 1\n",
        ] {
            assert!(text.contains(line), "{line:?} missing:\n{text}");
        }
        assert!(!text.contains("network_programming_duration_seconds_count{ip_family=\"IPv6\"}"));
    }

    /// Pending changes count the services changed since the last planned snapshot, each
    /// once per kind; totals count every changed object of each published snapshot.
    #[test]
    fn changes_are_pending_until_a_sync_plans_them() {
        let m = crate::admin::Metrics::new();
        let k = &m.kubeproxy;
        let svc = |name: &str, ip: &str| objects::service(name, ip, "{port: 80}").object();
        let first = Snapshot::builder()
            .with(svc("web", "172.30.0.1"))
            .with(slice("10.128.0.1", None))
            .build();
        k.queued(&first, at(1));
        k.taken(&first);
        // Two slices of `web` and another service change before the next sync.
        let mut b = first.to_builder();
        b.insert(slice("10.128.0.2", None));
        let mut other = slice("10.128.0.3", None);
        other.metadata.name = Some("web-y".into());
        b.insert(other);
        b.insert(svc("db", "172.30.0.2"));
        let second = b.build();
        k.queued(&second, at(2));
        let text = m.encode();
        for line in [
            "kubeproxy_sync_proxy_rules_service_changes_total 2\n",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 3\n",
            "kubeproxy_sync_proxy_rules_service_changes_pending 1\n",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 1\n",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"} 2.0\n",
        ] {
            assert!(text.contains(line), "{line:?} missing:\n{text}");
        }
        k.taken(&second);
        let text = m.encode();
        assert!(text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_pending 0\n"));
        assert!(text.contains("kubeproxy_sync_proxy_rules_service_changes_pending 0\n"));
    }
}
