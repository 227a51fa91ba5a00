//! The reconciler: load the snapshot, plan, apply the nftables transaction and the
//! rtnetlink changes, report per-object status. `--dry-run`, `--once` and `cleanup` are here;
//! run mode repeats the sync in [`run_loop`] (on every input change, with retries and periodic
//! resyncs), wired up by [`crate::app`].

pub mod run_loop;

use crate::config::Config;
use crate::dns::{self, DnsAnswers};
use crate::net::fence::{Fence, Fenced};
use crate::net::{NetBackend, NetChanges, NetConfig, RtnlBackend};
use crate::nft::monitor::Quiet;
use crate::nft::nftnl::NftnlBackend;
use crate::nft::render::render_full;
use crate::nft::{ApplyStats, Engine, Family, NftBackend, NftError, TABLE_NAME, Table};
use crate::observe::{
    ReconcileError, SyncObserver, SyncOutcome, SyncReport, SyncTimes, status_line,
};
use crate::plan::{self, BackendReport, Desired, Memory, plan_with, plan_with_dns};
use crate::snapshot::Snapshot;
use crate::source::kube::SourceHealth;
use crate::source::{kube as kube_source, manifests};
use crate::state::{self, StateStore};
use crate::text::one_line;
use std::collections::BTreeSet;
use std::time::Duration;
use tracing::{info, warn};

/// Owns the backends and what they were last told.
pub struct Reconciler<N: NftBackend, B: NetBackend> {
    config: Config,
    engine: Engine<N>,
    /// `table bridge nodeplane` (NetworkPolicy for bridged pods): an engine per table.
    bridge: Engine<N>,
    /// The kernel is known to hold no bridge table of ours (since the last invalidation).
    bridge_absent: bool,
    net: B,
    /// Last valid objects, as of the last successful apply.
    memory: Memory,
    /// Current answers for EgressFirewall dnsName rules (a planner input).
    dns: DnsAnswers,
    /// Run the features' kernel side effects after each commit ([`plan::Output`]; off for
    /// fake backends).
    kernel_effects: bool,
    /// Where the last valid objects are saved after a sync (None: kept in memory only).
    state: Option<StateStore>,
    /// The egress addresses in conflict after the last apply (a new one is counted once).
    conflicts: BTreeSet<std::net::IpAddr>,
    /// Failed removals of a table no longer wanted (see [`Reconciler::cleanup_failures`]).
    cleanup_failures: u64,
}

impl<N: NftBackend + Default, B: NetBackend> Reconciler<N, B> {
    pub fn new(config: Config, nft: N, net: B) -> Self {
        Reconciler {
            config,
            engine: Engine::new(nft).with_chunks(CREATE_CHUNK_OPS, crate::plan::is_bulk_map),
            bridge: Engine::new(N::default()),
            bridge_absent: false,
            net,
            memory: Memory::default(),
            dns: DnsAnswers::default(),
            kernel_effects: false,
            state: None,
            conflicts: BTreeSet::new(),
            cleanup_failures: 0,
        }
    }

    /// Starts from the last valid objects saved in `store` (each validated again; problems
    /// are logged and the file ignored in part or whole) and saves them there after each
    /// successful sync that changed them.
    pub fn with_state(mut self, mut store: StateStore) -> Self {
        let loaded = store.load();
        loaded.log(&store.path());
        self.memory = loaded.last_valid.into_memory();
        self.state = Some(store);
        self
    }

    /// Runs the features' kernel side effects after each commit ([`plan::Output::after_commit`]).
    pub fn with_kernel_effects(mut self) -> Self {
        self.kernel_effects = true;
        self
    }

    /// The planner's memory as of the last successful sync.
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// The DNS names the next plan of `snapshot` needs (remembered objects included).
    pub fn dns_names(&self, snapshot: &Snapshot) -> BTreeSet<String> {
        plan::dns_names(snapshot, &self.config, &self.memory)
    }

    /// Sets the DNS answers the next syncs plan with.
    pub fn set_dns(&mut self, answers: DnsAnswers) {
        self.dns = answers;
    }

    /// Plans `snapshot` and brings the kernel to it. nftables first, so that rules exist
    /// before an address starts attracting traffic; removal order is handled per backend.
    pub fn sync(&mut self, snapshot: &Snapshot) -> Result<SyncReport, ReconcileError> {
        let started = std::time::Instant::now();
        let mut desired = plan_with_dns(snapshot, &self.config, &self.memory, &self.dns);
        // Read-only: learn which addresses cannot be placed before programming SNAT to them.
        // A network planning error still lets the nftables side (other features) apply.
        let planned = self.net.plan(&desired.net);
        let refused = match &planned {
            Ok(changes) => changes.refused.clone(),
            Err(_) => self.net.standing_refusals(&desired.net),
        };
        for r in &refused {
            warn!("address {}: {}", r.addr, r.reason);
        }
        // Read-only too: what a feature asked to know of the node's bridge ports.
        let bridge_pods = &desired.net.bridge_pods;
        let ports = (!bridge_pods.is_empty()).then(|| {
            self.net
                .bridge_ports(bridge_pods)
                .map_err(|e| e.to_string())
        });
        let report = BackendReport {
            refused: &refused,
            bridge_ports: ports.as_ref(),
        };
        plan::settle(snapshot, &self.config, &self.dns, &mut desired, &report);
        let Desired {
            ruleset,
            bridge,
            mut statuses,
            memory,
            mut outputs,
            ..
        } = desired;
        let planned_at = std::time::Instant::now();
        // The bridge table first: the inet table's policy chains never exist without it.
        let bridged = self.sync_bridge(bridge)?;
        let mut nft = self.engine.sync(ruleset)?;
        nft += bridged;
        let committed_at = std::time::Instant::now();
        if self.kernel_effects {
            for (feature, e) in outputs.after_commit() {
                warn!("{feature}: {e}");
            }
        }
        let changes = planned?;
        self.net.apply(&changes)?;
        // Found while adding addresses: reported with the EgressIP, as long as it lasts.
        let conflicts = self.net.conflicts();
        plan::egress_ip::report_conflicts(
            snapshot,
            &self.config.node_name,
            &conflicts,
            &mut statuses,
        );
        let now: BTreeSet<std::net::IpAddr> = conflicts.iter().map(|c| c.addr).collect();
        let new_address_conflicts = now.difference(&self.conflicts).count();
        self.conflicts = now;
        self.memory = memory;
        self.save_state();
        if nft.ops >= TRIM_AFTER_OPS {
            crate::heap::release_freed_memory();
        }
        Ok(SyncReport {
            nft,
            net_ops: changes.len(),
            statuses,
            outputs,
            took: SyncTimes {
                plan: planned_at - started,
                nft: committed_at - planned_at,
                net: committed_at.elapsed(),
            },
            new_address_conflicts,
        })
    }

    /// Saves the objects in force if they changed, in the background (the store's writer
    /// logs the outcome; a failed write is a warning, not a failed sync, and is tried again
    /// after the next sync). Dropping the reconciler waits for the write.
    fn save_state(&mut self) {
        if let Some(store) = &mut self.state {
            store.save(&self.memory);
        }
    }

    /// Brings `table bridge nodeplane` to `desired`; `None` deletes a table the kernel holds
    /// (read back once after each invalidation, so a leftover one goes too).
    fn sync_bridge(&mut self, desired: Option<Table>) -> Result<ApplyStats, NftError> {
        let Some(table) = desired else {
            if self.bridge_absent {
                return Ok(ApplyStats::default());
            }
            let stats = self
                .delete_bridge()
                .inspect_err(|_| self.cleanup_failures += 1)?;
            self.bridge_absent = true;
            return Ok(stats);
        };
        self.bridge_absent = false;
        self.bridge.sync(table)
    }

    /// Deletes `table bridge nodeplane` if the kernel holds it.
    fn delete_bridge(&mut self) -> Result<ApplyStats, NftError> {
        let none = Table::with_family(Family::Bridge, TABLE_NAME);
        let held = self.bridge.current().is_some()
            || self.bridge.backend_mut().read_back(&none)?.table.is_some();
        if held {
            self.bridge.delete_table(Family::Bridge, TABLE_NAME)
        } else {
            Ok(ApplyStats::default())
        }
    }

    /// Times the main table was read back (a sync that does is a full one, see
    /// [`SyncOutcome::full`]).
    pub fn read_backs(&self) -> u64 {
        self.engine.read_backs()
    }

    /// Failed removals of a table no longer wanted (kube-proxy's nftables cleanup failures).
    pub fn cleanup_failures(&self) -> u64 {
        self.cleanup_failures
    }

    /// The table the kernel holds as far as the engine knows.
    pub fn applied(&self) -> Option<&crate::nft::ir::Table> {
        self.engine.current()
    }

    /// The bridge table the kernel holds as far as the engine knows.
    pub fn applied_bridge(&self) -> Option<&crate::nft::ir::Table> {
        self.bridge.current()
    }

    /// Forces the next sync to read both tables back and repair them (drift, resync).
    pub fn invalidate(&mut self) {
        self.engine.invalidate();
        self.bridge.invalidate();
        self.bridge_absent = false;
    }
}

/// Loads the configured source once: the manifests directory, or (without `--manifests`) the
/// Kubernetes API once every kind has been listed.
pub fn load_snapshot(config: &Config) -> Result<Snapshot, ReconcileError> {
    let Some(dir) = config.manifests.as_ref() else {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ReconcileError::Runtime(e.to_string()))?;
        return runtime.block_on(list_kube_once(config));
    };
    let report = manifests::load_dir_with(dir, &config.manifest_limits)
        .map_err(|e| ReconcileError::Source(e.to_string()))?;
    for p in &report.problems {
        warn!("skipped: {p}");
    }
    Ok(report.snapshot)
}

/// The API client of `config` (kubeconfig, `--api-server`, `--api-watch-timeout-seconds`) and
/// the Kubernetes source of `kinds`, its tasks added to `tasks`: run mode, `agent assigner`
/// and the one-shot modes connect alike.
pub async fn connect_kube(
    config: &Config,
    health: SourceHealth,
    kinds: &[crate::snapshot::Kind],
    tasks: &mut crate::task::Runtime,
) -> Result<(kube::Client, kube_source::KubeSource), ReconcileError> {
    let liveness = kube_source::Liveness::new(config.api_watch_timeout);
    let client = kube_source::client(
        config.kubeconfig.as_deref(),
        config.api_server.as_ref(),
        liveness,
    )
    .await?;
    let source = kube_source::start(client.clone(), health, liveness, kinds, tasks);
    Ok((client, source))
}

/// How long `--once` and `--dry-run` wait for every kind's list.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

async fn list_kube_once(config: &Config) -> Result<Snapshot, ReconcileError> {
    let health = SourceHealth::default();
    let mut tasks = crate::task::Runtime::new(std::sync::Arc::new(crate::task::LogsOnly));
    let kinds = config.features.kinds();
    let (_, mut source) = connect_kube(config, health.clone(), &kinds, &mut tasks).await?;
    let synced = tokio::time::timeout(LIST_TIMEOUT, source.snapshots.wait_for(Option::is_some));
    let listed = synced.await;
    tasks.shutdown(Duration::from_secs(1)).await;
    match listed {
        Ok(Ok(snapshot)) => Ok(snapshot.clone().unwrap_or_default()),
        Ok(Err(e)) => Err(ReconcileError::Runtime(e.to_string())),
        Err(_) => Err(ReconcileError::Runtime(format!(
            "no complete view of the cluster after {}s: {}",
            LIST_TIMEOUT.as_secs(),
            health.check().err().unwrap_or_default()
        ))),
    }
}

/// `--dry-run`: the full ruleset plus the address/route/rule changes as `#` lines. Reads the
/// kernel's interfaces to say which device an address would go on, and the state directory
/// (read-only) for the last valid version of an invalid object; needs no privileges.
pub fn dry_run(config: &Config) -> Result<String, ReconcileError> {
    let (snapshot, desired, memory) = planned(config)?;
    // Every line before the table is one `#` comment, whatever the names in it hold.
    let mut out = String::new();
    let mut comment = |line: &str| {
        out.push_str("# ");
        out.push_str(&one_line(line));
        out.push('\n');
    };
    comment(&format!(
        "nodeplane ruleset for node {} ({} objects read)",
        config.node_name,
        snapshot.len()
    ));
    let names = plan::dns_names(&snapshot, config, &memory);
    if !names.is_empty() {
        let names: Vec<String> = names.into_iter().collect();
        comment(&format!(
            "dnsName rules are resolved when applied, not in --dry-run: {}",
            names.join(", ")
        ));
    }
    match RtnlBackend::new(NetConfig::default()).and_then(|mut b| b.plan(&desired.net)) {
        Ok(changes) => {
            changes.describe().iter().for_each(|l| comment(l));
            // Shown, not applied to the ruleset: the printed table stays the same on any host.
            for r in &changes.refused {
                comment(&format!(
                    "address {} cannot be placed on this host: {}",
                    r.addr, r.reason
                ));
            }
        }
        Err(e) => comment(&format!("network changes unknown: {e}")),
    }
    for status in &desired.statuses {
        comment(&status_line(status, None));
    }
    out.push_str(&render_full(&desired.ruleset));
    if let Some(bridge) = &desired.bridge {
        out.push_str(&render_full(bridge));
    }
    Ok(out)
}

/// What `--dry-run` plans (and `agent explain` evaluates): the objects read, the desired
/// state planned from them with the last valid objects of the state directory, and that
/// memory.
pub fn planned(config: &Config) -> Result<(Snapshot, Desired, Memory), ReconcileError> {
    let snapshot = load_snapshot(config)?;
    let path = config.state_dir.join(state::FILE_NAME);
    let loaded = state::read(&path, &config.node_name);
    loaded.log(&path);
    let memory = loaded.last_valid.into_memory();
    let desired = plan_with(&snapshot, config, &memory);
    Ok((snapshot, desired, memory))
}

/// `--once`: one sync against the real kernel.
pub fn once(config: &Config) -> Result<(), ReconcileError> {
    let snapshot = load_snapshot(config)?;
    let mut rec = real_reconciler(config, Fence::default(), None)?;
    let names = rec.dns_names(&snapshot);
    match dns::resolve_once(&config.resolv_conf, &names) {
        Ok(answers) => rec.set_dns(answers),
        Err(e) => warn!("dnsName rules get no addresses: {e}"),
    }
    let report = rec.sync(&snapshot)?;
    log_report(&report);
    Ok(())
}

/// `agent cleanup`: delete the tables (inet, and bridge if present) and every marked
/// address, route and rule.
pub fn cleanup(_config: &Config) -> Result<(), ReconcileError> {
    let mut engine = Engine::new(NftnlBackend::new());
    engine.delete_table(Family::Inet, TABLE_NAME)?;
    // Only if present: a kernel without the bridge family refuses even `add table bridge`.
    let bridge = Table::with_family(Family::Bridge, TABLE_NAME);
    if engine.backend_mut().read_back(&bridge)?.table.is_some() {
        engine.delete_table(Family::Bridge, TABLE_NAME)?;
    }
    let removed: NetChanges = RtnlBackend::new(NetConfig::default())?.cleanup()?;
    info!(
        "removed table inet {TABLE_NAME} (and bridge {TABLE_NAME} if present) and {} network objects",
        removed.len()
    );
    for line in removed.describe() {
        info!("{line}");
    }
    Ok(())
}

fn real_reconciler(
    config: &Config,
    fence: Fence,
    quiet: Option<Quiet>,
) -> Result<Reconciler<NftnlBackend, Fenced<RtnlBackend>>, ReconcileError> {
    let net = Fenced {
        inner: RtnlBackend::new(NetConfig::default())?,
        fence,
    };
    Ok(
        Reconciler::new(config.clone(), NftnlBackend::new().with_quiet(quiet), net)
            .with_kernel_effects()
            .with_state(StateStore::new(&config.state_dir, &config.node_name)),
    )
}

/// Elements per transaction after the first when a large table is created (a cold start):
/// the node's other nftables users wait for our commit no longer than ~20 ms.
const CREATE_CHUNK_OPS: usize = 10_000;

/// A transaction this large (a cold start, a full resync) leaves tens of MiB of freed
/// temporaries in malloc's arenas: they are handed back (see `heap`).
const TRIM_AFTER_OPS: usize = 2000;

fn log_report(report: &SyncReport) {
    info!(
        nft_ops = report.nft.ops,
        nft_messages = report.nft.messages,
        net_ops = report.net_ops,
        plan_ms = report.took.plan.as_secs_f64() * 1e3,
        nft_ms = report.took.nft.as_secs_f64() * 1e3,
        net_ms = report.took.net.as_secs_f64() * 1e3,
        "sync done"
    );
    for s in &report.statuses {
        match s.result {
            Ok(()) => info!("{}", status_line(s, None)),
            Err(_) => warn!("{}", status_line(s, None)),
        }
    }
    for (topic, lines) in report.outputs.warnings() {
        for line in lines {
            warn!("{topic}: {}", one_line(line));
        }
    }
}

/// Logs every successful sync of the run loop as `--once` does (a [`SyncObserver`]).
pub struct LogReport;

impl SyncObserver for LogReport {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Ok(report) = sync.result {
            log_report(report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{FakeNetBackend, NetConfig};
    use crate::nft::FakeBackend;

    const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {addresses: [{type: InternalIP, address: 192.168.50.11}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: a}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {nodeName: n1, containers: []}
status: {phase: Running, podIP: 10.128.0.5}
---
apiVersion: k8s.ovn.org/v1
kind: EgressQoS
metadata: {name: default, namespace: a}
spec: {egress: [{dscp: 46}]}
---
apiVersion: k8s.ovn.org/v1
kind: EgressIP
metadata: {name: e}
spec: {egressIPs: [192.168.99.9], namespaceSelector: {matchLabels: {team: a}}}
status: {items: [{egressIP: 192.168.99.9, node: n1}]}
"#;

    fn snapshot() -> Snapshot {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.yaml"), CLUSTER).unwrap();
        manifests::load_dir(dir.path()).unwrap().snapshot
    }

    fn node() -> FakeNetBackend {
        FakeNetBackend::new(NetConfig::default())
            .with_link("eth0")
            .with_address("eth0", "192.168.50.11/24")
    }

    #[test]
    fn the_bridge_table_follows_network_policies_and_a_leftover_goes() {
        use crate::testing::objects;
        let pod = objects::pod("a", "p")
            .on("n1")
            .ips(&["10.128.0.5"])
            .object();
        let deny = objects::network_policy("a", "deny", "  podSelector: {}\n  ingress: []\n");
        let with = Snapshot::builder()
            .with(pod.clone())
            .with(deny.object())
            .build();
        let without = Snapshot::builder().with(pod).build();
        let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), node());
        rec.sync(&with).unwrap();
        let held = rec
            .bridge
            .backend()
            .table
            .as_ref()
            .expect("bridge table applied");
        assert_eq!(held.family, Family::Bridge);
        assert!(held.chains.contains_key("np-forward-flows"));
        rec.sync(&without).unwrap();
        assert!(
            rec.bridge.backend().table.is_none(),
            "deleted without policies"
        );
        // A leftover (a restart after the last policy went): deleted after a read-back.
        rec.bridge.backend_mut().table = Some(Table::with_family(Family::Bridge, TABLE_NAME));
        rec.invalidate();
        rec.sync(&without).unwrap();
        assert!(rec.bridge.backend().table.is_none(), "leftover deleted");
    }

    #[test]
    fn an_unplaceable_egress_ip_is_reported_and_gets_no_snat() {
        let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), node());
        let report = rec.sync(&snapshot()).unwrap();
        let eip = report.statuses.iter().find(|s| s.key.name == "e").unwrap();
        assert_eq!(
            eip.result,
            Err(
                "spec.egressIPs[0]: 192.168.99.9: no interface subnet contains it; the traffic \
                 of its 1 selected pod address(es) to destinations outside the cluster is \
                 dropped on node n1"
                    .into()
            )
        );
        let table = rec.engine.current().unwrap().flatten();
        assert!(table.sets["eip-snat-v4"].elements.is_empty());
        // Fail closed: the pod is not left to leave with the node's address.
        let steer: Vec<_> = table.sets["eip-steer-v4"].elements.values().collect();
        assert_eq!(steer.len(), 1);
        assert_eq!(
            steer[0].data,
            Some(crate::nft::ir::ElemData::Verdict(
                crate::nft::ir::Verdict::Jump("eip-unreachable".into())
            ))
        );
        assert!(table.chains.contains_key("eip-unreachable"));
        assert!(
            table.sets["qos-pods-v4"].elements.len() == 1,
            "QoS still applied"
        );
    }

    #[test]
    fn a_network_planning_error_still_applies_nftables() {
        // Someone else's interface with the tunnel's name: the net side refuses to touch it.
        let net = node().with_link("np-eip");
        let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), net);
        let err = rec.sync(&snapshot()).unwrap_err().to_string();
        assert!(
            err.contains("link np-eip: exists and was not created by the agent"),
            "{err}"
        );
        let table = rec.engine.current().expect("nftables applied").flatten();
        assert_eq!(table.sets["qos-pods-v4"].elements.len(), 1);
    }
}
