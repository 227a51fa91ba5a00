//! Run mode, as a list: build the task runtime, add the tasks (admin and metrics servers,
//! proxy health, the source, the DNS resolver and proxy, the nftables drift monitor, the
//! change forwarder), hand the observers and a channel of [`Event`]s to the control loop
//! ([`crate::reconcile::run_loop`]), and on SIGTERM/SIGINT stop the loop, then every task in
//! reverse order within [`SHUTDOWN_DEADLINE`]. The rules stay in place.

pub mod assigner;
mod kube;
mod observers;
mod pod_traffic;

use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::admin::{self, AdminObserver, AdminState, CountingLookup, DriftRepairs};
use crate::config::Config;
use crate::dns::{self, DnsService};
use crate::features::Switch;
use crate::healthcheck::proxy::{HEALTH_TIMEOUT, ProxyHealth, Stamp};
use crate::healthcheck::{self, HealthServer};
use crate::host;
use crate::net::fence::{Fence, Fenced};
use crate::net::{NetConfig, RtnlBackend};
use crate::nft::monitor::{DEFAULT_RCVBUF, Monitor, Quiet};
use crate::nft::{Family, TABLE_NAME};
use crate::observe::{ReconcileError, SyncObserver};
use crate::reconcile::LogReport;
use crate::reconcile::run_loop::{self, Event, Snapshots};
use crate::snapshot::Snapshot;
use crate::source::kube::SourceHealth;
use crate::source::loader::{self, ManifestHealth};
use crate::source::watch::watch_dir;
use crate::task::{OnExit, Runtime, hold, once};
use observers::{AclBook, DnsLearning, HealthCheckServer, SyncHealth};

/// The cluster-wide role elected in Kubernetes mode (metrics label, `/readyz` line, logs).
pub const EGRESS_IP_ASSIGNER: &str = "egress-ip-assigner";
/// Its Lease, in `--leader-elect-namespace`.
pub const EGRESS_IP_ASSIGNER_LEASE: &str = "nodeplane-egress-assigner";
/// How long the tasks get to stop on SIGTERM, together (the elector's lease release is
/// bounded by its renew deadline, well under this).
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

/// The control loop's inbox.
type Events = mpsc::Sender<Event>;
/// The source's published snapshots (`None` until the first complete one).
type Published = watch::Receiver<Option<Snapshot>>;

/// Run mode: sync, then re-sync on every change of the source (manifests directory or, without
/// it, the Kubernetes API once every kind has synced), retry failures with exponential backoff
/// (1 s .. 60 s), resync fully every `config.resync`, and stop on SIGTERM/SIGINT leaving the
/// rules in place. A change to the table by anyone else (nftables notifications, see
/// [`crate::nft::monitor`]) is repaired at once by a sync from the kernel's state.
pub async fn run(config: Config) -> Result<(), ReconcileError> {
    // Up before the first list, so that probes see "alive, not ready" while it runs.
    let source_health = config.manifests.is_none().then(SourceHealth::default);
    let manifest_health = config.manifests.is_some().then(ManifestHealth::default);
    let admin =
        Arc::new(AdminState::new(source_health.clone()).with_manifests(manifest_health.clone()));
    let mut tasks = Runtime::new(admin.clone());
    let result = run_with(config, &admin, &mut tasks, source_health, manifest_health).await;
    let stopped = tasks.shutdown(SHUTDOWN_DEADLINE).await;
    info!("{stopped}");
    result
}

async fn run_with(
    config: Config,
    admin: &Arc<AdminState>,
    tasks: &mut Runtime,
    source_health: Option<SourceHealth>,
    manifest_health: Option<ManifestHealth>,
) -> Result<(), ReconcileError> {
    let (events, inbox) = mpsc::channel();
    // Before any listener: a pod's idle connections must not reach a soft limit of 1,024.
    crate::listener::raise_nofile_limit();
    add_admin_servers(&config, admin, tasks).await?;
    check_host(&config, admin);
    info!("features: {}", config.features);
    let proxy_health = add_proxy_health(&config, admin, tasks);
    let mut observers: Vec<Box<dyn SyncObserver>> = vec![Box::new(AdminObserver {
        state: admin.clone(),
        node_name: config.node_name.clone(),
    })];
    // Set while this node withholds its egress IPs (Kubernetes mode: `egress_ip::fence`).
    let fence = Fence::default();
    let published = match &config.manifests {
        Some(dir) => {
            let health = manifest_health.unwrap_or_default();
            manifests_source(dir, &config, health, tasks).await?
        }
        None => {
            let health = source_health.unwrap_or_default();
            let observers = &mut observers;
            kube::start(&config, health, admin, &fence, &events, observers, tasks).await?
        }
    };
    let Some(published) = published else {
        return Ok(()); // stopped before the first complete snapshot
    };
    let dataplane_timer =
        admin::egress_ip_dataplane::DataplaneTimer::new(&config.node_name, admin.metrics.clone());
    let forwarder = (&proxy_health, &dataplane_timer, &admin.metrics);
    add_change_forwarder(&published, forwarder, &events, tasks);
    let resolver = add_dns_resolver(&config, admin, &events, tasks);
    let quiet = add_drift_monitor(admin, &proxy_health, &events, tasks)?;
    let (learning_tx, learning_rx) = watch::channel(Arc::default());
    add_dns_proxy(&config, admin, learning_rx, tasks);
    let (acl_tx, acl_rx) = watch::channel(Arc::default());
    tasks.add(crate::acl_log::task(config.acl_log, acl_rx));
    observers.extend(after_sync(
        &config,
        admin,
        (DnsLearning(learning_tx), AclBook(acl_tx)),
        dataplane_timer,
        proxy_health,
    ));
    if let Some((seen, check)) =
        pod_traffic::parts(admin, &config.node_name, config.pod_traffic_check)
    {
        observers.push(Box::new(seen));
        tasks.add(check);
    }
    add_rule_counters(&config, admin, tasks);
    // The backends block on netlink: the loop runs on its own thread, off the async workers.
    let snapshots = Snapshots::Published(published);
    let control = move || {
        // While the fence is set every egress address is refused like one no interface can
        // take: EgressIP's `settle` withholds it like any other refusal.
        let net = Fenced {
            inner: RtnlBackend::new(NetConfig::default())?,
            fence,
        };
        run_loop::run(config, inbox, resolver, snapshots, net, quiet, observers)
    };
    until_signal(control, events).await
}

/// kube-proxy's proxy health (with services): healthy and eligible while starting up; up
/// before the first list, like kube-proxy's, so that load balancers see the node as soon as
/// it can serve.
fn add_proxy_health(config: &Config, admin: &AdminState, tasks: &mut Runtime) -> Arc<ProxyHealth> {
    let proxy_health = Arc::new(ProxyHealth::new(HEALTH_TIMEOUT, Stamp::now()));
    if let Some(addr) =
        (config.healthz_bind_address).filter(|_| config.features.on(Switch::Services))
    {
        let metrics = admin.metrics.clone();
        let count = Arc::new(move |livez, code| metrics.kubeproxy.probe(livez, code));
        tasks.add(healthcheck::proxy_health_task(
            addr,
            proxy_health.clone(),
            count,
        ));
    }
    proxy_health
}

/// The observers after every successful sync, in this order: the log, the memory watch, the
/// features' outputs (DNS learning, ACL log book), the dataplane timer, the drift repair
/// (readiness back), the proxy health and the health-check ports.
fn after_sync(
    config: &Config,
    admin: &Arc<AdminState>,
    (learning, acl_book): (DnsLearning, AclBook),
    dataplane_timer: admin::egress_ip_dataplane::DataplaneTimer,
    proxy_health: Arc<ProxyHealth>,
) -> Vec<Box<dyn SyncObserver>> {
    let health = HealthServer::new(tokio::runtime::Handle::current(), proxy_health.clone());
    vec![
        Box::new(LogReport),
        Box::new(crate::memory_limit::MemoryWatch::start()),
        Box::new(learning),
        Box::new(acl_book),
        Box::new(dataplane_timer),
        Box::new(DriftRepairs {
            state: admin.clone(),
        }),
        Box::new(SyncHealth {
            health: proxy_health,
            node_name: config.node_name.clone(),
        }),
        Box::new(HealthCheckServer(health)),
    ]
}

/// The per-rule counter reader (`--rule-counters-seconds`), on the applied table.
fn add_rule_counters(config: &Config, admin: &Arc<AdminState>, tasks: &mut Runtime) {
    if let Some(every) = config.rule_counters {
        let applied = admin.clone();
        let counters = admin.metrics.rule_counters.clone();
        let applied_table = move || applied.applied_table();
        tasks.add(admin::rule_counters::reader(applied_table, counters, every));
    }
}

/// Runs `control` (the control loop) on a thread of its own until it ends, or until
/// SIGTERM/SIGINT sends it `Event::Shutdown` on `events` and it has stopped.
async fn until_signal(
    control: impl FnOnce() -> Result<(), ReconcileError> + Send + 'static,
    events: Events,
) -> Result<(), ReconcileError> {
    let worker = std::thread::spawn(control);
    let mut finished = tokio::task::spawn_blocking(move || worker.join());
    let joined = tokio::select! {
        joined = &mut finished => joined,
        _ = wait_for_signal() => {
            let _ = events.send(Event::Shutdown);
            finished.await
        }
    };
    joined
        .map_err(|e| ReconcileError::Runtime(e.to_string()))
        .and_then(|r| r.map_err(|_| ReconcileError::Runtime("reconcile thread panicked".into())))?
}

/// The admin server (vital) and the metrics-only server. A taken metrics port (kube-proxy
/// still running beside the agent) costs the scrape target, not the dataplane.
async fn add_admin_servers(
    config: &Config,
    admin: &Arc<AdminState>,
    tasks: &mut Runtime,
) -> Result<(), ReconcileError> {
    let addr = config.admin_address;
    let (_, server) = admin::listen(addr, admin.clone(), admin::Surface::Admin)
        .await
        .map_err(|e| ReconcileError::Runtime(format!("admin server on {addr}: {e}")))?;
    tasks.add(server);
    if let Some(addr) = config.metrics_bind_address {
        match admin::listen(addr, admin.clone(), admin::Surface::Metrics).await {
            Ok((_, server)) => tasks.add(server),
            Err(e) => error!("metrics server on {addr}: {e} (metrics stay on the admin server)"),
        }
    }
    Ok(())
}

/// The manifests directory's watcher and loader; returns the snapshots once the first load
/// is done (`None`: stopped by a signal first).
async fn manifests_source(
    dir: &std::path::Path,
    config: &Config,
    health: ManifestHealth,
    tasks: &mut Runtime,
) -> Result<Option<Published>, ReconcileError> {
    // Watch first, so that no change falls between the first load and the watch.
    let mut changes = watch_dir(dir).map_err(|e| ReconcileError::Source(e.to_string()))?;
    let (load_tx, load_rx) = mpsc::channel();
    tasks.add(once("manifest-watch", OnExit::Finish, async move {
        while changes.recv().await.is_some() {
            if load_tx.send(()).is_err() {
                break;
            }
        }
        Ok(())
    }));
    // Parsing runs on the loader thread; the control loop gets finished snapshots.
    let snapshots = loader::spawn(dir.to_path_buf(), config.manifest_limits, load_rx, health)
        .map_err(|e| ReconcileError::Runtime(format!("manifest loader thread: {e}")))?;
    let mut loaded = snapshots.clone();
    tokio::select! {
        loaded = loaded.wait_for(Option::is_some) => {
            loaded.map_err(|e| ReconcileError::Runtime(e.to_string()))?;
        }
        _ = wait_for_signal() => return Ok(None),
    }
    Ok(Some(snapshots))
}

/// Every newly published snapshot wakes the loop, and is an update the proxy health waits
/// for (the first one included: the first sync is pending from now) and a queued sync with
/// its Service and endpoint changes for kube-proxy's metrics.
fn add_change_forwarder(
    published: &Published,
    (proxy_health, timer, metrics): (
        &Arc<ProxyHealth>,
        &admin::egress_ip_dataplane::DataplaneTimer,
        &Arc<admin::Metrics>,
    ),
    events: &Events,
    tasks: &mut Runtime,
) {
    let mut changes = published.clone();
    changes.mark_unchanged();
    proxy_health.queued(std::time::Instant::now());
    if let Some(first) = changes.borrow().as_ref() {
        metrics
            .kubeproxy
            .queued(first, std::time::SystemTime::now());
    }
    let (queued, arrivals, events) = (proxy_health.clone(), timer.clone(), events.clone());
    let metrics = metrics.clone();
    tasks.add(once("snapshot-changes", OnExit::Finish, async move {
        while changes.changed().await.is_ok() {
            let now = std::time::Instant::now();
            queued.queued(now);
            if let Some(snap) = changes.borrow().as_ref() {
                arrivals.arrived(snap, now);
                metrics.kubeproxy.queued(snap, std::time::SystemTime::now());
            }
            if events.send(Event::Changed).is_err() {
                break;
            }
        }
        Ok(())
    }));
}

/// The resolver of `dnsName` rules; a changed answer wakes the loop like a changed manifest.
fn add_dns_resolver(
    config: &Config,
    admin: &Arc<AdminState>,
    events: &Events,
    tasks: &mut Runtime,
) -> DnsService {
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
    let events = Mutex::new(events.clone());
    let (service, resolver) = DnsService::new(lookup, move || {
        let _ = events.lock().map(|t| t.send(Event::Changed));
    });
    tasks.add(resolver);
    service
}

/// The nftables monitor of both tables (`table bridge nodeplane` holds NetworkPolicy for
/// bridged pods). Up before the first sync; readiness drops as soon as a drift is seen, not
/// when the loop gets to it. Returns the quiet window the agent's large commits go out in
/// (the kernel then builds no notification per element; checked by generation).
fn add_drift_monitor(
    admin: &Arc<AdminState>,
    proxy_health: &Arc<ProxyHealth>,
    events: &Events,
    tasks: &mut Runtime,
) -> Result<Option<Quiet>, ReconcileError> {
    let (events, admin, health) = (events.clone(), admin.clone(), proxy_health.clone());
    let families = [Family::Inet, Family::Bridge];
    let monitor = Monitor::start_families(&families, TABLE_NAME, DEFAULT_RCVBUF, move |drift| {
        let seq = admin.drift_detected(&drift);
        health.queued(std::time::Instant::now());
        let drift = Box::new(drift);
        events.send(Event::Drift { seq, drift }).is_ok()
    })
    .map_err(|e| ReconcileError::Runtime(format!("nftables monitor: {e}")))?;
    let quiet = monitor
        .quiet()
        .inspect_err(|e| error!("nftables monitor: no quiet window for large commits: {e}"))
        .ok();
    tasks.add(hold("nft-monitor", monitor));
    Ok(quiet)
}

/// The transparent DNS proxy of `dnsName` rules (none without the EgressFirewall feature).
fn add_dns_proxy(
    config: &Config,
    admin: &Arc<AdminState>,
    learning: watch::Receiver<Arc<crate::plan::firewall::learning::Learning>>,
    tasks: &mut Runtime,
) {
    if !config.features.on(Switch::EgressFirewall) {
        return;
    }
    match crate::dnsproxy::tasks(&config.dns_proxy, learning, admin.metrics.dns_proxy.clone()) {
        Ok(listeners) => listeners.into_iter().for_each(|t| tasks.add_boxed(t)),
        Err(e) => {
            let message = format!(
                "not started (pod DNS goes direct, only resolution feeds dnsName rules): {e}"
            );
            error!("dns proxy {message}");
            admin.environment_error("dns proxy", &message);
        }
    }
}

/// The capabilities and sysctls the agent needs (`host`): each gap is logged and shown in
/// `/readyz` (a missing capability keeps it degraded). Nothing is changed.
fn check_host(config: &Config, admin: &AdminState) {
    let mut needed = vec![&host::NET_ADMIN, &host::NET_RAW];
    if config.dns_proxy.port.is_some() && config.features.on(Switch::EgressFirewall) {
        needed.push(&host::NET_BIND_SERVICE);
    }
    match host::effective_capabilities() {
        Ok(effective) => {
            let missing = host::missing(effective, &needed);
            for m in &missing {
                error!("{m}");
            }
            if !missing.is_empty() {
                admin.environment_error("capabilities", &missing.join("; "));
            }
        }
        Err(e) => warn!("cannot read the agent's capabilities: {e}"),
    }
    for (key, problem) in host::sysctl_warnings() {
        warn!("{key} {problem}");
        admin.environment_warning(key, &problem);
    }
}

/// A loop that is meant to run for as long as the agent: its end is an error.
async fn ended(work: impl std::future::Future<Output = ()>) -> Result<(), String> {
    work.await;
    Err("ended".into())
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
