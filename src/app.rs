//! Run mode's wiring, in one place: the admin server and what feeds it ([`AdminObserver`],
//! [`DriftRepairs`]), the source (manifests directory or Kubernetes API) and, with the API,
//! the status writer and the election of the cluster's EgressIP assigner, the DNS service, the
//! nftables drift monitor, the health-check server, the proxy health and the signal handler. Everything is handed to the control loop
//! ([`crate::reconcile::run_loop`]) as an [`Event`] channel and a list of [`SyncObserver`]s.

use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::admin::{self, AdminObserver, AdminState, CountingLookup, DriftRepairs};
use crate::config::Config;
use crate::controller::egress_ip;
use crate::controller::lease::{ElectionConfig, Elector, KubeLeases, Leadership};
use crate::dns::{self, DnsService};
use crate::features::Switch;
use crate::healthcheck::proxy::{HEALTH_TIMEOUT, ProxyHealth, Stamp};
use crate::healthcheck::{self, HealthServer};
use crate::host;
use crate::nft::monitor::{DEFAULT_RCVBUF, Monitor};
use crate::nft::{Family, TABLE_NAME};
use crate::observe::{ReconcileError, SyncObserver, SyncOutcome};
use crate::reconcile::run_loop::{self, Event, Snapshots};
use crate::reconcile::{Fence, LogReport};
use crate::source::kube::{self as kube_source, SourceHealth};
use crate::source::loader::{self, ManifestHealth};
use crate::source::watch::watch_dir;
use crate::status;

/// Run mode: sync, then re-sync on every change of the source (manifests directory or, without
/// it, the Kubernetes API once every kind has synced), retry failures with exponential backoff
/// (1 s .. 60 s), resync fully every `config.resync`, and stop on SIGTERM/SIGINT leaving the
/// rules in place. A change to the table by anyone else (nftables notifications, see
/// [`crate::nft::monitor`]) is repaired at once by a sync from the kernel's state.
/// The cluster-wide role elected in Kubernetes mode (metrics label, `/readyz` line, logs).
pub const EGRESS_IP_ASSIGNER: &str = "egress-ip-assigner";
/// Its Lease, in `--leader-elect-namespace`.
pub const EGRESS_IP_ASSIGNER_LEASE: &str = "nodeplane-egress-assigner";

pub async fn run(config: Config) -> Result<(), ReconcileError> {
    let (tx, rx) = mpsc::channel();
    let change_tx = tx.clone();
    // Up before the first list, so that probes see "alive, not ready" while it runs.
    let source_health = config.manifests.is_none().then(SourceHealth::default);
    let manifest_health = config.manifests.is_some().then(ManifestHealth::default);
    let admin =
        Arc::new(AdminState::new(source_health.clone()).with_manifests(manifest_health.clone()));
    admin::serve(config.admin_address, admin.clone(), admin::Surface::Admin)
        .await
        .map_err(|e| {
            ReconcileError::Runtime(format!("admin server on {}: {e}", config.admin_address))
        })?;
    // A taken metrics port (kube-proxy still running beside the agent) costs the scrape
    // target, not the dataplane.
    if let Some(addr) = config.metrics_bind_address
        && let Err(e) = admin::serve(addr, admin.clone(), admin::Surface::Metrics).await
    {
        error!("metrics server on {addr}: {e} (metrics stay on the admin server)");
    }
    check_host(&config, &admin);
    // kube-proxy's proxy health: healthy and eligible while starting up; up before the first
    // list, like kube-proxy's, so that load balancers see the node as soon as it can serve.
    let proxy_health = Arc::new(ProxyHealth::new(HEALTH_TIMEOUT, Stamp::now()));
    let features = config.features.clone();
    info!("features: {features}");
    if let Some(addr) = config
        .healthz_bind_address
        .filter(|_| features.on(Switch::Services))
    {
        let admin = admin.clone();
        let count = Arc::new(move |livez, code| admin.metrics.kubeproxy.probe(livez, code));
        healthcheck::spawn_proxy_health(addr, proxy_health.clone(), count);
    }
    let mut observers: Vec<Box<dyn SyncObserver>> = vec![Box::new(AdminObserver {
        state: admin.clone(),
        node_name: config.node_name.clone(),
    })];
    // Kubernetes mode with --egress-ip-assigner: released after the loop stops.
    let mut elector = None;
    // Set while this node withholds its egress IPs (Kubernetes mode: `egress_ip::fence`).
    let fence = Fence::default();
    let published = match &config.manifests {
        Some(dir) => {
            // Watch first, so that no change falls between the first load and the watch.
            let mut changes = watch_dir(dir).map_err(|e| ReconcileError::Source(e.to_string()))?;
            let (load_tx, load_rx) = mpsc::channel();
            tokio::spawn(async move {
                while changes.recv().await.is_some() {
                    if load_tx.send(()).is_err() {
                        break;
                    }
                }
            });
            // Parsing runs on the loader thread; the control loop gets finished snapshots.
            let health = manifest_health.unwrap_or_default();
            let mut snapshots = loader::spawn(dir.clone(), config.manifest_limits, load_rx, health)
                .map_err(|e| ReconcileError::Runtime(format!("manifest loader thread: {e}")))?;
            tokio::select! {
                loaded = snapshots.wait_for(Option::is_some) => {
                    loaded.map_err(|e| ReconcileError::Runtime(e.to_string()))?;
                }
                _ = wait_for_signal() => return Ok(()),
            }
            snapshots
        }
        None => {
            let liveness = kube_source::Liveness::new(config.api_watch_timeout);
            let client = kube_source::client(
                config.kubeconfig.as_deref(),
                config.api_server.as_ref(),
                liveness,
            )
            .await?;
            let source = kube_source::start(
                client.clone(),
                source_health.unwrap_or_default(),
                liveness,
                &features.kinds(),
            );
            let egress_ip_on = features.on(Switch::EgressIp);
            // Every agent publishes its own node's egress-capable subnets for nodeplane's
            // assigner; where another controller assigns (`--egress-ip-assigner=false`, e.g.
            // OVN-Kubernetes, whose ovnkube-node writes the annotation) the agent leaves it.
            if egress_ip_on && config.egress_ip_assigner {
                let excluded =
                    [config.cluster_cidrs.clone(), config.service_cidrs.clone()].concat();
                tokio::spawn(egress_ip::host_cidrs::publish(
                    client.clone(),
                    config.node_name.clone(),
                    excluded,
                    source.snapshots.clone(),
                ));
            }
            // Every agent fences itself when cut off from the assigner and the API server.
            let (fence_flag, fence_tx) = (fence.clone(), Mutex::new(tx.clone()));
            let fence_task = egress_ip::fence::run(
                egress_ip::fence::KubeCheck {
                    client: client.clone(),
                    timeout: config.egress_ip_probe.interval * (config.egress_ip_probe.misses + 1),
                },
                config.node_name.clone(),
                source.snapshots.clone(),
                config.egress_ip_probe,
                move |on| {
                    if fence_flag.set(on) {
                        let _ = fence_tx.lock().map(|t| t.send(Event::Changed));
                    }
                },
            );
            if egress_ip_on {
                tokio::spawn(fence_task);
            }
            let (status, rejections) = status::spawn_writer(client.clone(), &config.node_name);
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
            // Candidates only once every kind is listed: an assigner must not act on a
            // partial view of the cluster.
            if egress_ip_on && config.egress_ip_assigner {
                let e = elect_egress_ip_assigner(client.clone(), &config);
                tokio::spawn(report_leadership(
                    EGRESS_IP_ASSIGNER,
                    e.subscribe(),
                    admin.clone(),
                ));
                tokio::spawn(egress_ip::run(
                    client,
                    leading(e.subscribe()),
                    source.snapshots.clone(),
                    config.node_name.clone(),
                    config.egress_ip_probe,
                    egress_ip::cloud_sync::Settings {
                        platform: config.platform,
                        attach_seconds: admin.metrics.egress_ip_cloud_attach(),
                    },
                ));
                elector = Some(e);
            }
            source.snapshots
        }
    };
    // Every newly published snapshot wakes the loop, and is an update the proxy health waits
    // for (the first one included: the first sync is pending from now).
    let mut changes = published.clone();
    changes.mark_unchanged();
    proxy_health.queued(std::time::Instant::now());
    let queued = proxy_health.clone();
    let dataplane_timer =
        admin::egress_ip_dataplane::DataplaneTimer::new(&config.node_name, admin.metrics.clone());
    let arrivals = dataplane_timer.clone();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let now = std::time::Instant::now();
            queued.queued(now);
            if let Some(snap) = changes.borrow().as_ref() {
                arrivals.arrived(snap, now);
            }
            if change_tx.send(Event::Changed).is_err() {
                break;
            }
        }
    });
    let snapshots = Snapshots::Published(published);
    let dns_tx = Mutex::new(tx.clone());
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
    let drift_health = proxy_health.clone();
    // Both tables: `table bridge nodeplane` holds NetworkPolicy for bridged pods.
    let families = [Family::Inet, Family::Bridge];
    let monitor = Monitor::start_families(&families, TABLE_NAME, DEFAULT_RCVBUF, move |drift| {
        let seq = drift_admin.drift_detected(&drift);
        drift_health.queued(std::time::Instant::now());
        let drift = Box::new(drift);
        drift_tx.send(Event::Drift { seq, drift }).is_ok()
    })
    .map_err(|e| ReconcileError::Runtime(format!("nftables monitor: {e}")))?;
    // The agent's large commits go out unheard by the monitor (the kernel then builds no
    // notification per element), checked by generation; without it they are just heard.
    let quiet = monitor
        .quiet()
        .inspect_err(|e| error!("nftables monitor: no quiet window for large commits: {e}"))
        .ok();
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = tx.send(Event::Shutdown);
    });
    // After every successful sync, in this order (as the loop did before it had observers):
    // the log, the drift repair (readiness back), the health-check ports.
    let (learning_tx, learning_rx) = watch::channel(Arc::default());
    if !features.on(Switch::EgressFirewall) {
        // No dnsName rules to learn for: no listeners.
    } else if let Err(e) = crate::dnsproxy::spawn(
        &config.dns_proxy,
        learning_rx,
        admin.metrics.dns_proxy.clone(),
    ) {
        let message =
            format!("not started (pod DNS goes direct, only resolution feeds dnsName rules): {e}");
        error!("dns proxy {message}");
        admin.environment_error("dns proxy", &message);
    }
    observers.push(Box::new(LogReport));
    observers.push(Box::new(crate::memory_limit::MemoryWatch::start()));
    observers.push(Box::new(DnsLearning(learning_tx)));
    observers.push(Box::new(dataplane_timer));
    observers.push(Box::new(DriftRepairs { state: admin }));
    observers.push(Box::new(SyncHealth {
        health: proxy_health.clone(),
        node_name: config.node_name.clone(),
    }));
    let health = HealthServer::new(tokio::runtime::Handle::current(), proxy_health);
    observers.push(Box::new(HealthCheckServer(health)));
    // The backends block on netlink: run the loop on its own thread, off the async workers.
    let worker = std::thread::spawn(move || {
        run_loop::run(config, rx, resolver, snapshots, fence, quiet, observers)
    });
    let result = tokio::task::spawn_blocking(move || worker.join())
        .await
        .map_err(|e| ReconcileError::Runtime(e.to_string()))
        .and_then(|r| r.map_err(|_| ReconcileError::Runtime("reconcile thread panicked".into())));
    // Stopping: hand the role over at once instead of letting the lease expire.
    if let Some(e) = elector {
        e.shutdown().await;
    }
    result?
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

/// Starts this agent's candidacy for the EgressIP assigner role (Lease
/// `EGRESS_IP_ASSIGNER_LEASE` in `--leader-elect-namespace`, holder identity the node name).
/// The role's work subscribes to the returned [`Elector`] and acts only while
/// [`Leadership::leading`].
fn elect_egress_ip_assigner(client: kube::Client, config: &Config) -> Elector {
    let election = ElectionConfig {
        namespace: config.leader_elect_namespace.clone(),
        name: EGRESS_IP_ASSIGNER_LEASE.into(),
        identity: config.node_name.clone(),
        timings: config.leader_elect,
    };
    info!(
        "candidate for {EGRESS_IP_ASSIGNER} (lease {}/{}, duration {:?}, renew deadline {:?}, \
         retry {:?})",
        election.namespace,
        election.name,
        election.timings.lease_duration,
        election.timings.renew_deadline,
        election.timings.retry_period
    );
    let api = KubeLeases::new(client, &election.namespace, &election.name);
    Elector::spawn(api, election)
}

/// Logs every change of who leads `role` and shows it in `/readyz` and `nodeplane_leader`.
async fn report_leadership(
    role: &'static str,
    mut leadership: tokio::sync::watch::Receiver<Leadership>,
    admin: Arc<AdminState>,
) {
    loop {
        let now = leadership.borrow_and_update().clone();
        admin.set_leadership(role, now.leading, now.holder.as_deref());
        match (now.leading, now.holder.as_deref()) {
            (true, _) => info!("{role}: this node leads"),
            (false, Some(h)) => info!("{role}: following {}", crate::text::one_line(h)),
            (false, None) => info!("{role}: no leader yet"),
        }
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Wiring point of the EgressIP assigner's leadership: `true` while this agent leads. The
/// Lease elector connects here; until it does, the sender is dropped at once, so no agent
/// leads and the assigner task ends without writing anything (`status.items` stays whatever
/// another controller or the manifests wrote).
/// Whether this agent leads, as the role's work consumes it: follows `leadership` until the
/// elector is gone (then: not leading).
fn leading(mut leadership: watch::Receiver<Leadership>) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(leadership.borrow().leading);
    tokio::spawn(async move {
        while leadership.changed().await.is_ok() {
            let now = leadership.borrow().leading;
            if tx.send(now).is_err() {
                return;
            }
        }
        let _ = tx.send(false);
    });
    rx
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

/// Tells the DNS proxy whose answers to learn from once a sync put the learned sets in place.
struct DnsLearning(watch::Sender<Arc<crate::plan::firewall::learning::Learning>>);

impl SyncObserver for DnsLearning {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Ok(report) = sync.result {
            self.0.send_if_modified(|current| {
                let changed = **current != *report.dns_learning;
                if changed {
                    *current = report.dns_learning.clone();
                }
                changed
            });
        }
    }
}

/// Serves the services' health-check ports of the last successful sync.
struct HealthCheckServer(HealthServer);

impl SyncObserver for HealthCheckServer {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Ok(report) = sync.result {
            self.0
                .update(report.health_checks.clone().into_iter().collect());
        }
    }
}

/// Feeds the proxy health from every sync attempt: a success is the new `lastUpdated` and
/// clears what was pending, a failure leaves an update pending since the sync started, and
/// the snapshot's own Node decides the node's eligibility.
struct SyncHealth {
    health: Arc<ProxyHealth>,
    node_name: String,
}

impl SyncObserver for SyncHealth {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Some(snapshot) = sync.snapshot {
            self.health
                .set_node(snapshot.node(&self.node_name).map(|n| &**n));
        }
        let now = Stamp::now();
        match sync.result {
            Ok(_) => self.health.updated(now),
            Err(_) => {
                let started = now.at.checked_sub(sync.duration).unwrap_or(now.at);
                self.health.queued(started);
            }
        }
    }
}
