//! The control loop: load the snapshot, plan, apply the nftables transaction and the
//! rtnetlink changes, report per-object status; in run mode repeat on every input change,
//! retry failures with backoff and resynchronise periodically.

use crate::admin::{self, AdminObserver, AdminState, CountingLookup};
use crate::config::Config;
use crate::dns::{self, DnsAnswers, DnsService};
use crate::net::{NetBackend, NetChanges, NetConfig, NetError, RtnlBackend};
use crate::nft::nftnl::NftnlBackend;
use crate::nft::render::render_full;
use crate::nft::{ApplyStats, Engine, NftBackend, NftError, TABLE_NAME};
use crate::plan::{Desired, Memory, ObjectStatus, egress_ip, firewall, plan_with, plan_with_dns};
use crate::snapshot::Snapshot;
use crate::source::kube::SourceHealth;
use crate::source::{kube as kube_source, manifests};
use crate::state::{self, StateStore};
use crate::timing::Backoff;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("manifests: {0}")]
    Source(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] crate::source::kube::KubeError),
    #[error("nftables: {0}")]
    Nft(#[from] NftError),
    #[error("network: {0}")]
    Net(#[from] NetError),
    #[error("{0}")]
    Runtime(String),
}

impl ReconcileError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Source(_) => "source",
            ReconcileError::Kube(_) => "kube",
            ReconcileError::Nft(_) => "nftables",
            ReconcileError::Net(_) => "network",
            ReconcileError::Runtime(_) => "runtime",
        }
    }
}

/// Told about every sync attempt of the run loop: metrics, the admin server, status
/// write-back. Runs on the reconcile thread, so it must not block for long.
pub trait SyncObserver: Send {
    fn observe(&mut self, sync: &SyncOutcome<'_>);
}

/// One sync attempt as observers see it.
pub struct SyncOutcome<'a> {
    /// The snapshot planned (None when the source failed).
    pub snapshot: Option<&'a Snapshot>,
    pub result: &'a Result<SyncReport, ReconcileError>,
    pub duration: Duration,
    /// The table the kernel holds (None until a first successful apply).
    pub applied: Option<&'a crate::nft::ir::Table>,
}

/// What one successful sync did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub nft: ApplyStats,
    pub net_ops: usize,
    pub statuses: Vec<ObjectStatus>,
}

/// Owns the backends and what they were last told.
pub struct Reconciler<N: NftBackend, B: NetBackend> {
    config: Config,
    engine: Engine<N>,
    net: B,
    /// Last valid objects, as of the last successful apply.
    memory: Memory,
    /// Current answers for EgressFirewall dnsName rules (a planner input).
    dns: DnsAnswers,
    /// Delete conntrack entries of removed UDP service backends (off for fake backends).
    conntrack_cleanup: bool,
    /// Where the last valid objects are saved after a sync (None: kept in memory only).
    state: Option<StateStore>,
}

impl<N: NftBackend, B: NetBackend> Reconciler<N, B> {
    pub fn new(config: Config, nft: N, net: B) -> Self {
        Reconciler {
            config,
            engine: Engine::new(nft),
            net,
            memory: Memory::default(),
            dns: DnsAnswers::default(),
            conntrack_cleanup: false,
            state: None,
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

    /// Deletes conntrack entries of removed UDP service backends after each apply.
    pub fn with_conntrack_cleanup(mut self) -> Self {
        self.conntrack_cleanup = true;
        self
    }

    /// The planner's memory as of the last successful sync.
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// The DNS names the next plan of `snapshot` needs (remembered objects included).
    pub fn dns_names(&self, snapshot: &Snapshot) -> BTreeSet<String> {
        firewall::dns_names(snapshot, &self.memory.firewall)
    }

    /// Sets the DNS answers the next syncs plan with.
    pub fn set_dns(&mut self, answers: DnsAnswers) {
        self.dns = answers;
    }

    /// Plans `snapshot` and brings the kernel to it. nftables first, so that rules exist
    /// before an address starts attracting traffic; removal order is handled per backend.
    pub fn sync(&mut self, snapshot: &Snapshot) -> Result<SyncReport, ReconcileError> {
        let Desired {
            mut ruleset,
            net,
            mut statuses,
            memory,
            stale_udp,
        } = plan_with_dns(snapshot, &self.config, &self.memory, &self.dns);
        // Read-only: learn which addresses cannot be placed before programming SNAT to them.
        // A network planning error still lets the nftables side (other features) apply.
        let planned = self.net.plan(&net);
        for r in planned.iter().flat_map(|c| &c.refused) {
            warn!("address {}: {}", r.addr, r.reason);
            egress_ip::address_refused(snapshot, &mut ruleset, &mut statuses, r.addr, &r.reason);
        }
        let nft = self.engine.sync(ruleset)?;
        // After the new rules are in: a deleted flow's next packet picks a live backend.
        if self.conntrack_cleanup
            && let Err(e) = crate::conntrack::delete_udp_flows_to(&stale_udp)
        {
            warn!("conntrack: stale UDP service flows not deleted: {e}");
        }
        let changes = planned?;
        self.net.apply(&changes)?;
        self.memory = memory;
        self.save_state();
        Ok(SyncReport {
            nft,
            net_ops: changes.len(),
            statuses,
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

    /// The table the kernel holds as far as the engine knows.
    pub fn applied(&self) -> Option<&crate::nft::ir::Table> {
        self.engine.current()
    }

    /// Forces the next sync to replace the table wholesale (repairs drift).
    pub fn invalidate(&mut self) {
        self.engine.invalidate();
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
    let report = manifests::load_dir(dir).map_err(|e| ReconcileError::Source(e.to_string()))?;
    for p in &report.problems {
        warn!("skipped: {p}");
    }
    Ok(report.snapshot)
}

/// How long `--once` and `--dry-run` wait for every kind's list.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

async fn list_kube_once(config: &Config) -> Result<Snapshot, ReconcileError> {
    let client = kube_source::client(config.kubeconfig.as_deref()).await?;
    let health = SourceHealth::default();
    let mut source = kube_source::start(client, health.clone());
    let synced = tokio::time::timeout(LIST_TIMEOUT, source.snapshots.wait_for(Option::is_some));
    match synced.await {
        Ok(Ok(snapshot)) => Ok(snapshot.clone().unwrap_or_default()),
        Ok(Err(e)) => Err(ReconcileError::Runtime(e.to_string())),
        Err(_) => Err(ReconcileError::Runtime(format!(
            "no complete view of the cluster after {}s: {}",
            LIST_TIMEOUT.as_secs(),
            health.check().err().unwrap_or_default()
        ))),
    }
}

/// Where the run loop reads its snapshots from.
enum Snapshots {
    /// Reloaded from the directory on every wake-up.
    Manifests,
    /// The latest snapshot the Kubernetes source published.
    Kube(tokio::sync::watch::Receiver<Option<Snapshot>>),
}

impl Snapshots {
    fn current(&self, config: &Config) -> Result<Snapshot, ReconcileError> {
        match self {
            Snapshots::Manifests => load_snapshot(config),
            Snapshots::Kube(rx) => Ok(rx.borrow().clone().unwrap_or_default()),
        }
    }
}

/// `--dry-run`: the full ruleset plus the address/route/rule changes as `#` lines. Reads the
/// kernel's interfaces to say which device an address would go on, and the state directory
/// (read-only) for the last valid version of an invalid object; needs no privileges.
pub fn dry_run(config: &Config) -> Result<String, ReconcileError> {
    let snapshot = load_snapshot(config)?;
    let path = config.state_dir.join(state::FILE_NAME);
    let loaded = state::read(&path, &config.node_name);
    loaded.log(&path);
    let memory = loaded.last_valid.into_memory();
    let desired = plan_with(&snapshot, config, &memory);
    let mut out = format!(
        "# nodeplane ruleset for node {} ({} objects read)\n",
        config.node_name,
        snapshot.len()
    );
    let names = firewall::dns_names(&snapshot, &memory.firewall);
    if !names.is_empty() {
        let names: Vec<String> = names.into_iter().collect();
        out.push_str(&format!(
            "# dnsName rules are resolved when applied, not in --dry-run: {}\n",
            names.join(", ")
        ));
    }
    match RtnlBackend::new(NetConfig::default()).and_then(|mut b| b.plan(&desired.net)) {
        Ok(changes) => {
            out.extend(changes.describe().iter().map(|l| format!("# {l}\n")));
            // Shown, not applied to the ruleset: the printed table stays the same on any host.
            for r in &changes.refused {
                out.push_str(&format!(
                    "# address {} cannot be placed on this host: {}\n",
                    r.addr, r.reason
                ));
            }
        }
        Err(e) => out.push_str(&format!("# network changes unknown: {e}\n")),
    }
    for status in &desired.statuses {
        out.push_str(&format!("# {}\n", status_line(status, None)));
    }
    out.push_str(&render_full(&desired.ruleset));
    Ok(out)
}

/// `--once`: one sync against the real kernel.
pub fn once(config: &Config) -> Result<(), ReconcileError> {
    let snapshot = load_snapshot(config)?;
    let mut rec = real_reconciler(config)?;
    let names = rec.dns_names(&snapshot);
    match dns::resolve_once(&config.resolv_conf, &names) {
        Ok(answers) => rec.set_dns(answers),
        Err(e) => warn!("dnsName rules get no addresses: {e}"),
    }
    let report = rec.sync(&snapshot)?;
    log_report(&report);
    Ok(())
}

/// `agent cleanup`: delete the table and every marked address, route and rule.
pub fn cleanup(_config: &Config) -> Result<(), ReconcileError> {
    let mut engine = Engine::new(NftnlBackend::new());
    engine.delete_table(TABLE_NAME)?;
    let removed: NetChanges = RtnlBackend::new(NetConfig::default())?.cleanup()?;
    info!(
        "removed table inet {TABLE_NAME} and {} network objects",
        removed.len()
    );
    for line in removed.describe() {
        info!("{line}");
    }
    Ok(())
}

fn real_reconciler(
    config: &Config,
) -> Result<Reconciler<NftnlBackend, RtnlBackend>, ReconcileError> {
    Ok(Reconciler::new(
        config.clone(),
        NftnlBackend::new(),
        RtnlBackend::new(NetConfig::default())?,
    )
    .with_conntrack_cleanup()
    .with_state(StateStore::new(&config.state_dir, &config.node_name)))
}

pub fn status_line(s: &ObjectStatus, apply_error: Option<&str>) -> String {
    let kind = s.kind.as_str();
    let verdict = match (&s.result, apply_error) {
        (Ok(()), None) => format!("{kind} Rules applied"),
        (Ok(()), Some(e)) => format!("{kind} Rules not correctly applied: {e}"),
        (Err(e), _) => format!("{kind} Rules not correctly applied: {e}"),
    };
    format!("{kind} {}: {verdict}", s.key)
}

fn log_report(report: &SyncReport) {
    info!(
        nft_ops = report.nft.ops,
        nft_messages = report.nft.messages,
        net_ops = report.net_ops,
        "sync done"
    );
    for s in &report.statuses {
        match s.result {
            Ok(()) => info!("{}", status_line(s, None)),
            Err(_) => warn!("{}", status_line(s, None)),
        }
    }
}

/// Inputs of the run loop.
enum Event {
    Changed,
    /// Someone else changed the kernel's table (detection `seq` of the admin state).
    Drift {
        seq: u64,
        drift: Box<crate::nft::monitor::Drift>,
    },
    Shutdown,
}

/// Run mode: sync, then re-sync on every change of the source (manifests directory or, without
/// it, the Kubernetes API once every kind has synced), retry failures
/// with exponential backoff (1 s .. 60 s), resync fully every `config.resync`, and stop on
/// SIGTERM/SIGINT leaving the rules in place. A change to the table by anyone else (nftables
/// notifications, see [`crate::nft::monitor`]) is repaired at once by a sync from the kernel's
/// state.
pub async fn run(config: Config) -> Result<(), ReconcileError> {
    let (tx, rx) = mpsc::channel();
    let change_tx = tx.clone();
    // Up before the first list, so that probes see "alive, not ready" while it runs.
    let source_health = config.manifests.is_none().then(SourceHealth::default);
    let admin = Arc::new(AdminState::new(source_health.clone()));
    admin::serve(config.admin_address, admin.clone())
        .await
        .map_err(|e| {
            ReconcileError::Runtime(format!("admin server on {}: {e}", config.admin_address))
        })?;
    let mut observers: Vec<Box<dyn SyncObserver>> = vec![Box::new(AdminObserver {
        state: admin.clone(),
        node_name: config.node_name.clone(),
    })];
    let snapshots = match &config.manifests {
        Some(dir) => {
            let mut changes = crate::source::watch::watch_dir(dir)
                .map_err(|e| ReconcileError::Source(e.to_string()))?;
            tokio::spawn(async move {
                while changes.recv().await.is_some() {
                    if change_tx.send(Event::Changed).is_err() {
                        break;
                    }
                }
            });
            Snapshots::Manifests
        }
        None => {
            let client = kube_source::client(config.kubeconfig.as_deref()).await?;
            let source = kube_source::start(client.clone(), source_health.unwrap_or_default());
            let (status, rejections) = crate::status::spawn_writer(client, &config.node_name);
            observers.push(Box::new(status));
            let mut rejected = source.rejections;
            tokio::spawn(async move {
                while let Some(r) = rejected.recv().await {
                    rejections.report(&r);
                }
            });
            let mut changes = source.snapshots.clone();
            // Never program a partial view: the first sync waits for every initial list.
            info!("waiting for the initial list of every kind");
            tokio::select! {
                synced = changes.wait_for(Option::is_some) => {
                    synced.map_err(|e| ReconcileError::Runtime(e.to_string()))?;
                }
                _ = wait_for_signal() => return Ok(()),
            }
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    if change_tx.send(Event::Changed).is_err() {
                        break;
                    }
                }
            });
            Snapshots::Kube(source.snapshots)
        }
    };
    let dns_tx = std::sync::Mutex::new(tx.clone());
    let lookup: Arc<dyn dns::Lookup> =
        match dns::HickoryLookup::from_resolv_conf(&config.resolv_conf) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                error!("dnsName rules get no addresses: {e}");
                Arc::new(dns::Unavailable(e.to_string()))
            }
        };
    let lookup = Arc::new(CountingLookup {
        inner: lookup,
        metrics: admin.metrics.clone(),
    });
    // A changed answer wakes the loop like a changed manifest.
    let resolver = DnsService::spawn(lookup, move || {
        let _ = dns_tx.lock().map(|t| t.send(Event::Changed));
    });
    // Up before the first sync; readiness drops as soon as a drift is seen, not when the
    // loop gets to it. Lives until the loop ends.
    let (drift_tx, drift_admin) = (tx.clone(), admin.clone());
    let _monitor = crate::nft::monitor::Monitor::start(TABLE_NAME, move |drift| {
        let seq = drift_admin.drift_detected(&drift);
        let drift = Box::new(drift);
        drift_tx.send(Event::Drift { seq, drift }).is_ok()
    })
    .map_err(|e| ReconcileError::Runtime(format!("nftables monitor: {e}")))?;
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = tx.send(Event::Shutdown);
    });
    let health = crate::healthcheck::HealthServer::new(tokio::runtime::Handle::current());
    // The backends block on netlink: run the loop on its own thread, off the async workers.
    let worker = std::thread::spawn(move || {
        run_loop(config, rx, resolver, snapshots, observers, health, admin)
    });
    tokio::task::spawn_blocking(move || worker.join())
        .await
        .map_err(|e| ReconcileError::Runtime(e.to_string()))?
        .map_err(|_| ReconcileError::Runtime("reconcile thread panicked".into()))?
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM: stopping, rules stay in place"),
                _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping, rules stay in place"),
            }
        }
        Err(e) => {
            warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// How long a sync waits for the first answer of a newly used DNS name.
const DNS_FIRST_ANSWER_WAIT: Duration = Duration::from_secs(3);

fn run_loop(
    config: Config,
    events: mpsc::Receiver<Event>,
    resolver: DnsService,
    snapshots: Snapshots,
    mut observers: Vec<Box<dyn SyncObserver>>,
    mut health: crate::healthcheck::HealthServer,
    admin: Arc<AdminState>,
) -> Result<(), ReconcileError> {
    let mut rec = real_reconciler(&config)?;
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
        let started = Instant::now();
        // What this sync repairs if it succeeds: detections seen before it started.
        let repairing = drift_taken;
        let current = match last_snapshot.take() {
            Some(s) if !reload => Ok(s),
            _ => snapshots.current(&config),
        };
        reload = false;
        let (snapshot, synced) = match current {
            Ok(s) => {
                let names = rec.dns_names(&s);
                rec.set_dns(resolver.want_and_wait(&names, DNS_FIRST_ANSWER_WAIT));
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
        };
        for o in &mut observers {
            o.observe(&outcome);
        }
        last_snapshot = snapshot;
        match synced {
            Ok(report) => {
                log_report(&report);
                if let Some(took) = admin.drift_repaired(repairing) {
                    info!(
                        "table inet {TABLE_NAME} repaired {:.1} ms after the drift was seen",
                        took.as_secs_f64() * 1e3
                    );
                }
                health.update(rec.memory().services.health().clone().into_iter().collect());
                backoff.reset();
            }
            Err(e) => {
                reload = true;
                let delay = backoff.next_delay();
                error!("sync failed, retrying in {}s: {e}", delay.as_secs());
                wait = wait.min(delay);
            }
        }
        match events.recv_timeout(wait) {
            Ok(first) => {
                // Coalesce a burst (one `nft flush ruleset` is many objects, a script many
                // commits) into one sync, with no delay: whatever is queued now.
                let mut drift: Option<crate::nft::monitor::Drift> = None;
                let mut next = Some(first);
                while let Some(event) = next {
                    match event {
                        Event::Changed => reload = true,
                        Event::Drift { seq, drift: d } => {
                            drift_taken = drift_taken.max(seq);
                            match &mut drift {
                                Some(all) => all.merge(*d),
                                None => drift = Some(*d),
                            }
                        }
                        Event::Shutdown => return Ok(()),
                    }
                    next = events.try_recv().ok();
                }
                if let Some(d) = drift {
                    warn!("table inet {TABLE_NAME} changed by someone else: {d}; repairing");
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
    fn an_unplaceable_egress_ip_is_reported_and_gets_no_snat() {
        let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), node());
        let report = rec.sync(&snapshot()).unwrap();
        let eip = report.statuses.iter().find(|s| s.key.name == "e").unwrap();
        assert_eq!(
            eip.result,
            Err("spec.egressIPs[0]: 192.168.99.9: no interface subnet contains it".into())
        );
        let table = rec.engine.current().unwrap();
        assert!(table.sets["eip-snat-v4"].elements.is_empty());
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
        let table = rec.engine.current().expect("nftables applied");
        assert_eq!(table.sets["qos-pods-v4"].elements.len(), 1);
    }
}
