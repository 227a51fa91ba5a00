//! The reconciler: load the snapshot, plan, apply the nftables transaction and the
//! rtnetlink changes, report per-object status. `--dry-run`, `--once` and `cleanup` are here;
//! run mode repeats the sync in [`run_loop`] (on every input change, with retries and periodic
//! resyncs), wired up by [`crate::app`].

pub mod run_loop;
mod tables;

use crate::config::Config;
use crate::net::{NetBackend, NetChanges, NetConfig, RtnlBackend};
use crate::nft::monitor::Quiet;
use crate::nft::nftnl::NftnlBackend;
use crate::nft::render::render_full;
use crate::nft::{Engine, Family, NftBackend, TABLE_NAME, Table};
use crate::observe::{
    ReconcileError, SyncObserver, SyncOutcome, SyncReport, SyncTimes, status_line,
};
use crate::plan::{self, Answerer, AppliedReport, BackendReport, Desired, Memory, plan_with};
use crate::snapshot::Snapshot;
use crate::source::kube::SourceHealth;
use crate::source::{kube as kube_source, manifests};
use crate::state::{self, StateStore};
use crate::text::one_line;
use std::collections::BTreeSet;
use std::time::Duration;
use tables::ExtraEngines;
use tracing::{info, warn};

/// Owns the backends and what they were last told.
pub struct Reconciler<N: NftBackend, B: NetBackend> {
    config: Config,
    engine: Engine<N>,
    /// The tables the features plan beside the main one: an engine per table.
    extra: ExtraEngines<N>,
    net: B,
    /// Last valid objects, as of the last successful apply.
    memory: Memory,
    /// Answers what the features ask before each plan ([`plan::Asks`]).
    answerer: Box<dyn Answerer>,
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
            extra: ExtraEngines::new(&plan::extra_tables()),
            net,
            memory: Memory::default(),
            answerer: Box::new(plan::NoAnswers),
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

    /// Has what the features ask answered by `answerer` before each plan.
    pub fn with_answerer(mut self, answerer: impl Answerer + 'static) -> Self {
        self.answerer = Box::new(answerer);
        self
    }

    /// Plans `snapshot` and brings the kernel to it. nftables first, so that rules exist
    /// before an address starts attracting traffic; removal order is handled per backend.
    pub fn sync(&mut self, snapshot: &Snapshot) -> Result<SyncReport, ReconcileError> {
        // Asked and answered before the clock starts: a new answer may be waited for.
        let asks = plan::asks(snapshot, &self.config, &self.memory);
        let answers = self.answerer.answer(&asks);
        let started = std::time::Instant::now();
        let mut desired = plan::plan_answered(snapshot, &self.config, &self.memory, &answers);
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
        // Read-only too: what a feature asked to know of the node.
        let facts = self.net.read_facts(&desired.net);
        let report = BackendReport::new(&refused, &facts);
        plan::settle(snapshot, &self.config, &answers, &mut desired, &report);
        let Desired {
            ruleset,
            extra_tables,
            mut statuses,
            memory,
            mut outputs,
            ..
        } = desired;
        let planned_at = std::time::Instant::now();
        // The other tables first: the main table may rely on what they decide (and mark), so
        // it never holds rules without them.
        let extra = (self.extra).sync(extra_tables, &mut self.cleanup_failures)?;
        let mut nft = self.engine.sync(ruleset)?;
        nft += extra;
        let committed_at = std::time::Instant::now();
        if self.kernel_effects {
            for (feature, e) in outputs.after_commit() {
                warn!("{feature}: {e}");
            }
        }
        let changes = planned?;
        self.net.apply(&changes)?;
        // Found while adding addresses: reported by the feature, as long as it lasts.
        let conflicts = self.net.conflicts();
        let applied = AppliedReport {
            conflicts: &conflicts,
        };
        plan::report_applied(snapshot, &self.config, &applied, &mut statuses);
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

    /// The other tables the kernel holds as far as their engines know.
    pub fn applied_extra(&self) -> Vec<&crate::nft::ir::Table> {
        self.extra.applied()
    }

    /// Forces the next sync to read every table back and repair it (drift, resync).
    pub fn invalidate(&mut self) {
        self.engine.invalidate();
        self.extra.invalidate();
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
    if let Some(line) = plan::asks(&snapshot, config, &memory).unanswered_in_dry_run() {
        comment(&line);
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
    for table in desired.extra_tables.iter() {
        out.push_str(&render_full(table));
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

/// `--once`: one sync against the real kernel, with what the features ask answered by
/// `answerer`.
pub fn once(config: &Config, answerer: impl Answerer + 'static) -> Result<(), ReconcileError> {
    let snapshot = load_snapshot(config)?;
    let net = RtnlBackend::new(NetConfig::default())?;
    let mut rec = real_reconciler(config, net, None)?.with_answerer(answerer);
    let report = rec.sync(&snapshot)?;
    log_report(&report);
    Ok(())
}

/// `agent cleanup`: delete the tables (inet, and the features' other tables if present) and
/// every marked address, route and rule.
pub fn cleanup(_config: &Config) -> Result<(), ReconcileError> {
    let mut engine = Engine::new(NftnlBackend::new());
    engine.delete_table(Family::Inet, TABLE_NAME)?;
    let mut extra = Vec::new();
    for (family, name) in plan::extra_tables() {
        // Only if present: a kernel without a family refuses even `add table` in it.
        let table = Table::with_family(family, name);
        if engine.backend_mut().read_back(&table)?.table.is_some() {
            engine.delete_table(family, name)?;
        }
        extra.push(format!("{} {name}", family.keyword()));
    }
    let removed: NetChanges = RtnlBackend::new(NetConfig::default())?.cleanup()?;
    info!(
        "removed table inet {TABLE_NAME} (and {} if present) and {} network objects",
        extra.join(", "),
        removed.len()
    );
    for line in removed.describe() {
        info!("{line}");
    }
    Ok(())
}

/// A reconciler of the kernel's tables and `net` (the real backend, or one the run mode
/// wraps), with the features' kernel side effects and the state directory.
fn real_reconciler<B: NetBackend>(
    config: &Config,
    net: B,
    quiet: Option<Quiet>,
) -> Result<Reconciler<NftnlBackend, B>, ReconcileError> {
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
mod tests;
