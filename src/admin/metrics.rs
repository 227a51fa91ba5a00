//! The agent's Prometheus metrics (prometheus-client), updated by the run loop after every
//! sync (see [`AdminObserver`](super::AdminObserver)), by the DNS lookup wrapper and by drift
//! detection and repair (see [`AdminState::drift_detected`](super::AdminState::drift_detected)).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::dns::{Lookup, LookupFuture};
use crate::nft::ir::Table;
use crate::snapshot::{Kind, Snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabel {
    /// The chain or set name's first `-`-separated word: `fw` (EgressFirewall), `qos`
    /// (EgressQoS), `nat`/`filter`/`mangle` base chains, `cluster`/`service`/`node` base sets,
    /// and whatever prefix later features use.
    pub feature: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabel {
    /// The largest kind of object a drift touched: `table`, `chain`, `set`, `other`, or
    /// `unknown` when notifications were lost.
    pub object: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabel {
    /// A background task's name (`crate::task::Task::name`).
    pub task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    /// A cluster-wide role elected by Lease, e.g. `egress-ip-assigner`.
    pub role: String,
}

pub struct Metrics {
    registry: Registry,
    /// kube-proxy's series (`kubeproxy_*`).
    pub kubeproxy: super::kubeproxy::KubeProxyMetrics,
    sync_duration: Histogram,
    transaction_ops: Histogram,
    rules: Family<FeatureLabel, Gauge>,
    set_elements: Family<FeatureLabel, Gauge>,
    apply_errors: Family<ReasonLabel, Counter>,
    dns_resolutions: Family<ResultLabel, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    objects: Family<KindLabel, Gauge>,
    drift_detected: Family<ObjectLabel, Counter>,
    drift_repairs: Counter,
    drift_last_repair: Gauge<f64, AtomicU64>,
    leader: Family<RoleLabel, Gauge>,
    task_down_count: Family<TaskLabel, Counter>,
    /// The EgressFirewall DNS proxy's own metrics (it updates them).
    pub dns_proxy: crate::dnsproxy::metrics::ProxyMetrics,
    egress_ip_cloud_attach: Histogram,
    egress_ip_dataplane: Histogram,
    egress_ip_address_conflicts: Counter,
    /// Packets and bytes per EgressFirewall / EgressQoS rule and NetworkPolicy, published by
    /// the reader of `super::rule_counters` (nothing while it is off).
    pub rule_counters: Arc<super::rule_counters::RuleCounters>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        // Two prefixes in one exposition: nodeplane's own series and kube-proxy's.
        let mut root = Registry::default();
        let kubeproxy = super::kubeproxy::KubeProxyMetrics::register(
            root.sub_registry_with_prefix("kubeproxy"),
            SystemTime::now(),
        );
        let registry = root.sub_registry_with_prefix("nodeplane");
        let sync_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let transaction_ops = Histogram::new(exponential_buckets(1.0, 4.0, 10));
        let m = Metrics {
            sync_duration,
            transaction_ops,
            rules: Family::default(),
            set_elements: Family::default(),
            apply_errors: Family::default(),
            dns_resolutions: Family::default(),
            last_success: Gauge::default(),
            objects: Family::default(),
            drift_detected: Family::default(),
            drift_repairs: Counter::default(),
            drift_last_repair: Gauge::default(),
            leader: Family::default(),
            task_down_count: Family::default(),
            dns_proxy: Default::default(),
            egress_ip_cloud_attach: crate::controller::egress_ip::cloud_sync::attach_histogram(),
            egress_ip_dataplane: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            egress_ip_address_conflicts: Counter::default(),
            rule_counters: Arc::default(),
            registry: Registry::default(),
            kubeproxy,
        };
        m.register(registry);
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Registers nodeplane's own series (kube-proxy's register themselves).
    fn register(&self, registry: &mut Registry) {
        self.dns_proxy.register(registry);
        registry.register_collector(Box::new(self.rule_counters.clone()));
        self.register_sync(registry);
        self.register_drift(registry);
        self.register_tasks(registry);
        self.register_egress_ip(registry);
    }

    /// What each sync took, applied and failed on, and what the snapshot held.
    fn register_sync(&self, registry: &mut Registry) {
        registry.register(
            "sync_duration_seconds",
            "Time to plan and apply one sync (nftables and network)",
            self.sync_duration.clone(),
        );
        registry.register(
            "transaction_operations",
            "Operations per nftables transaction (0 when nothing changed)",
            self.transaction_ops.clone(),
        );
        registry.register(
            "ruleset_rules",
            "Rules in table inet nodeplane per feature",
            self.rules.clone(),
        );
        registry.register(
            "ruleset_set_elements",
            "Set and map elements in table inet nodeplane per feature",
            self.set_elements.clone(),
        );
        registry.register(
            "apply_errors",
            "Failed syncs by reason (nftables, network, source, kube, runtime)",
            self.apply_errors.clone(),
        );
        registry.register(
            "dns_resolutions",
            "EgressFirewall dnsName lookups by result (success, failure)",
            self.dns_resolutions.clone(),
        );
        registry.register(
            "last_successful_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            self.last_success.clone(),
        );
        registry.register(
            "objects",
            "Objects in the current snapshot per kind",
            self.objects.clone(),
        );
    }

    /// Changes to the table by others and their repairs.
    fn register_drift(&self, registry: &mut Registry) {
        registry.register(
            "drift_detected",
            "Changes to table inet nodeplane by another process (or lost notifications), by the \
             largest object touched (table, chain, set, other, unknown)",
            self.drift_detected.clone(),
        );
        registry.register(
            "drift_repairs",
            "Syncs that repaired a detected drift of table inet nodeplane",
            self.drift_repairs.clone(),
        );
        registry.register(
            "drift_last_repair_duration_seconds",
            "Time from detecting the last repaired drift to the end of the sync that repaired it",
            self.drift_last_repair.clone(),
        );
    }

    /// The roles this agent leads and the background tasks that went down.
    fn register_tasks(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "1 while this agent holds the cluster-wide role's Lease, else 0 (one series per \
             role this agent is a candidate for)",
            self.leader.clone(),
        );
        registry.register(
            "task_down",
            "Times a background task went down (ended while the agent was not stopping, failed, \
             panicked, or reported that it cannot work), by task",
            self.task_down_count.clone(),
        );
    }

    /// The EgressIP control plane's and hosting node's timings and address conflicts.
    fn register_egress_ip(&self, registry: &mut Registry) {
        registry.register(
            "egress_ip_cloud_attach_seconds",
            "EgressIP assigner on a cloud: from writing a CloudPrivateIPConfig (create or move) \
             to seeing it Assigned=True on the requested node",
            self.egress_ip_cloud_attach.clone(),
        );
        registry.register(
            "egress_ip_dataplane_seconds",
            "Hosting node: from a snapshot whose EgressIP status.items newly places an egress IP \
             on this node to the end of the committed sync that programs it",
            self.egress_ip_dataplane.clone(),
        );
        registry.register(
            "egress_ip_address_conflicts",
            "Hosting node: egress IPs it added while another host on the segment still answered \
             ARP or neighbour solicitations for them (each also an EgressIPConflict Event)",
            self.egress_ip_address_conflicts.clone(),
        );
    }

    /// `n` egress IPs newly found held by another host too.
    pub fn count_egress_ip_conflicts(&self, n: usize) {
        self.egress_ip_address_conflicts.inc_by(n as u64);
    }

    /// The histogram the EgressIP assigner records the cloud's latency in.
    pub fn egress_ip_cloud_attach(&self) -> Histogram {
        self.egress_ip_cloud_attach.clone()
    }

    /// One egress IP newly placed on this node, programmed `took` after its snapshot.
    pub fn observe_egress_ip_dataplane(&self, took: Duration) {
        self.egress_ip_dataplane.observe(took.as_secs_f64());
    }

    /// Whether this agent leads `role` now.
    pub fn set_leader(&self, role: &str, leading: bool) {
        let label = RoleLabel {
            role: role.to_string(),
        };
        self.leader.get_or_create(&label).set(i64::from(leading));
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn observe_success(&self, duration: Duration, ops: usize, table: &Table) {
        self.sync_duration.observe(duration.as_secs_f64());
        self.transaction_ops.observe(ops as f64);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.last_success.set(now.as_secs_f64());
        let (rules, elements) = per_feature(table);
        self.rules.clear();
        self.set_elements.clear();
        for (feature, n) in rules {
            self.rules.get_or_create(&FeatureLabel { feature }).set(n);
        }
        for (feature, n) in elements {
            self.set_elements
                .get_or_create(&FeatureLabel { feature })
                .set(n);
        }
    }

    pub fn observe_failure(&self, duration: Duration, reason: &str) {
        self.sync_duration.observe(duration.as_secs_f64());
        let label = ReasonLabel {
            reason: reason.to_string(),
        };
        self.apply_errors.get_or_create(&label).inc();
    }

    pub fn observe_snapshot(&self, snapshot: &Snapshot) {
        for kind in Kind::ALL {
            let label = KindLabel {
                kind: kind.as_str().to_string(),
            };
            self.objects
                .get_or_create(&label)
                .set(snapshot.count(*kind) as i64);
        }
    }

    pub fn observe_drift(&self, object: &str) {
        let label = ObjectLabel {
            object: object.to_string(),
        };
        self.drift_detected.get_or_create(&label).inc();
    }

    pub fn task_down(&self, task: &str) {
        let label = TaskLabel { task: task.into() };
        self.task_down_count.get_or_create(&label).inc();
    }

    pub fn observe_drift_repair(&self, took: Duration) {
        self.drift_repairs.inc();
        self.drift_last_repair.set(took.as_secs_f64());
    }

    fn count_dns(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        let label = ResultLabel {
            result: result.into(),
        };
        self.dns_resolutions.get_or_create(&label).inc();
    }
}

fn feature_of(name: &str) -> String {
    name.split('-').next().unwrap_or(name).to_string()
}

/// Rules and elements per feature, from the names of the chains and sets holding them: what
/// the kernel holds, the features' parts included.
fn per_feature(table: &Table) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let mut rules = BTreeMap::new();
    let mut elements = BTreeMap::new();
    for chain in table.all_chains() {
        *rules.entry(feature_of(&chain.name)).or_default() += chain.rules.len() as i64;
    }
    for (set, n) in table.element_counts() {
        *elements.entry(feature_of(set)).or_default() += n as i64;
    }
    (rules, elements)
}

/// A [`Lookup`] that counts resolutions.
pub struct CountingLookup {
    pub inner: Arc<dyn Lookup>,
    pub metrics: Arc<Metrics>,
}

impl Lookup for CountingLookup {
    fn lookup<'a>(&'a self, name: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            let result = self.inner.lookup(name).await;
            self.metrics.count_dns(result.is_ok());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::{Chain, DataType, ElemData, Part, Rule, Set, SetKind, Value, Verdict};

    fn gauge(text: &str, name: &str, feature: &str) -> i64 {
        let prefix = format!("{name}{{feature=\"{feature}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&prefix));
        let value = line.unwrap_or_else(|| panic!("{prefix} missing:\n{text}"));
        value[prefix.len()..].parse().unwrap()
    }

    #[test]
    fn ruleset_gauges_count_what_parts_hold() {
        let mut table = Table::new("nodeplane");
        let mut base = Chain::regular("filter-forward");
        base.push(Rule::new(vec![]));
        table.add_chain(base);
        table.add_set(Set::new(
            "fw-pods-v4",
            vec![DataType::Ipv4Addr],
            SetKind::VerdictMap,
        ));
        for ns in ["a", "b"] {
            let mut part = Part::default();
            let mut chain = Chain::regular(format!("fw-{ns}"));
            chain.push(Rule::new(vec![])).push(Rule::new(vec![]));
            part.add_chain(chain);
            let mut own = Set::new(
                format!("fw-{ns}-v4"),
                vec![DataType::Ipv4Addr],
                SetKind::Set,
            );
            own.insert(vec![Value::Ipv4([10, 0, 0, 1].into()).into()]);
            part.add_set(own);
            let ip = if ns == "a" {
                [10, 1, 0, 1]
            } else {
                [10, 1, 0, 2]
            };
            part.add_mapping(
                "fw-pods-v4",
                vec![Value::Ipv4(ip.into()).into()],
                ElemData::Verdict(Verdict::Goto(format!("fw-{ns}"))),
            );
            table.insert_part(format!("fw/{ns}"), std::sync::Arc::new(part));
        }
        let m = Metrics::new();
        m.observe_success(Duration::from_millis(1), 1, &table);
        let text = m.encode();
        // 2 parts x 2 rules; 2 x (1 own element + 1 dispatch element).
        assert_eq!(gauge(&text, "nodeplane_ruleset_rules", "fw"), 4);
        assert_eq!(gauge(&text, "nodeplane_ruleset_set_elements", "fw"), 4);
        assert_eq!(gauge(&text, "nodeplane_ruleset_rules", "filter"), 1);
        // The same numbers as the flattened table (what the kernel holds).
        let flat = table.flatten();
        let rules: usize = flat
            .chains
            .values()
            .filter(|c| c.name.starts_with("fw-"))
            .map(|c| c.rules.len())
            .sum();
        let elements: usize = flat
            .sets
            .values()
            .filter(|s| s.name.starts_with("fw-"))
            .map(|s| s.elements.len())
            .sum();
        assert_eq!((rules, elements), (4, 4));
    }

    #[test]
    fn exposition_names_every_metric() {
        let m = Metrics::new();
        let mut table = Table::new("nodeplane");
        table.add_chain(crate::nft::ir::Chain::regular("fw-x"));
        m.observe_success(Duration::from_millis(3), 12, &table);
        m.observe_failure(Duration::from_millis(1), "nftables");
        m.count_dns(true);
        m.observe_snapshot(&Snapshot::default());
        m.observe_drift("chain");
        m.observe_drift("chain");
        m.observe_drift("table");
        m.observe_drift_repair(Duration::from_millis(30));
        m.observe_drift_repair(Duration::from_millis(12));
        m.set_leader("egress-ip-assigner", true);
        m.set_leader("egress-ip-assigner", false);
        let text = m.encode();
        for name in [
            "nodeplane_sync_duration_seconds_bucket",
            "nodeplane_transaction_operations_sum 12",
            "nodeplane_ruleset_rules{feature=\"fw\"} 0",
            "nodeplane_apply_errors_total{reason=\"nftables\"} 1",
            "nodeplane_dns_resolutions_total{result=\"success\"} 1",
            "nodeplane_last_successful_sync_timestamp_seconds ",
            "nodeplane_objects{kind=\"EgressQoS\"} 0",
            "nodeplane_drift_detected_total{object=\"chain\"} 2\n",
            "nodeplane_drift_detected_total{object=\"table\"} 1\n",
            "nodeplane_drift_repairs_total 2\n",
            "nodeplane_drift_last_repair_duration_seconds 0.012\n",
            "nodeplane_leader{role=\"egress-ip-assigner\"} 0\n",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
    }
}
