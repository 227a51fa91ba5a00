//! The Kubernetes source's tasks: the watches, the status writer, and with EgressIP the
//! host-cidrs publisher, the fence and the assigner with its election.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tracing::{info, warn};

use super::{EGRESS_IP_ASSIGNER, EGRESS_IP_ASSIGNER_LEASE, Events, Published, wait_for_signal};
use crate::admin::AdminState;
use crate::config::Config;
use crate::controller::egress_ip;
use crate::controller::lease::{ElectionConfig, Elector, KubeLeases, Leadership};
use crate::features::Switch;
use crate::net::fence::Fence;
use crate::observe::{ReconcileError, SyncObserver};
use crate::reconcile::run_loop::Event;
use crate::source::kube::SourceHealth;
use crate::task::{OnExit, Runtime, once, task};

/// Starts the watches and the tasks that write to the API; returns the snapshots once every
/// kind is listed (`None`: stopped by a signal first).
pub async fn start(
    config: &Config,
    health: SourceHealth,
    admin: &Arc<AdminState>,
    fence: &Fence,
    events: &Events,
    observers: &mut Vec<Box<dyn SyncObserver>>,
    tasks: &mut Runtime,
) -> Result<Option<Published>, ReconcileError> {
    let (client, source) =
        crate::reconcile::connect_kube(config, health, &config.features.kinds(), tasks).await?;
    let egress_ip_on = config.features.on(Switch::EgressIp);
    // Every agent publishes its own node's egress-capable subnets for nodeplane's assigner;
    // where another controller assigns (`--egress-ip-assigner=false`, e.g. OVN-Kubernetes,
    // whose ovnkube-node writes the annotation) the agent leaves it.
    if egress_ip_on && config.egress_ip_assigner {
        add_host_cidrs_publisher(config, &client, &source.snapshots, tasks);
    }
    let probe_key = (egress_ip_on && config.egress_ip_probe.enabled())
        .then(|| probe_key(config, admin))
        .flatten();
    // Every agent fences itself when cut off from the assigner and the API server.
    if egress_ip_on {
        let proof = match (&probe_key, config.egress_ip_assigner) {
            (Some(key), _) => egress_ip::fence::Proof::Probes(key.clone()),
            (None, true) => egress_ip::fence::Proof::ApiOnly,
            (None, false) => egress_ip::fence::Proof::Off,
        };
        add_fence(
            config,
            &client,
            &source.snapshots,
            fence,
            proof,
            events,
            tasks,
        );
    }
    let (writer, status, rejections) =
        crate::status::writer_task(client.clone(), &config.node_name);
    tasks.add(writer);
    observers.push(Box::new(status));
    let mut rejected = source.rejections;
    tasks.add(once("rejection-events", OnExit::Finish, async move {
        while let Some(r) = rejected.recv().await {
            rejections.report(&r);
        }
        Ok(())
    }));
    // Never program a partial view: the first sync waits for every initial list.
    if !listed(&source.snapshots).await? {
        return Ok(None);
    }
    // Candidates only once every kind is listed: an assigner must not act on a partial view
    // of the cluster.
    if egress_ip_on && config.egress_ip_assigner && config.egress_ip_assigner_candidate {
        add_assigner(config, client, &source.snapshots, probe_key, admin, tasks);
    }
    Ok(Some(source.snapshots))
}

/// The probes' key from `--egress-ip-probe-key-file`; without one (none given, unreadable,
/// too short) a warning in the log and `/readyz`: probes then prove nothing to the fence.
pub(super) fn probe_key(
    config: &Config,
    admin: &AdminState,
) -> Option<egress_ip::probe_auth::ProbeKey> {
    let why = match &config.egress_ip_probe_key_file {
        None => "no --egress-ip-probe-key-file".to_string(),
        Some(path) => match egress_ip::probe_auth::ProbeKey::load(path) {
            Ok(key) => return Some(key),
            Err(e) => e,
        },
    };
    let message = format!(
        "probes are not authenticated ({why}): they never keep a node's egress IPs, so a node \
         hosting some drops them whenever the API server is unreachable for the probes' \
         verdict time (see README \"EgressIP\")"
    );
    warn!("EgressIP {message}");
    admin.environment_warning("egress-ip probe key", &message);
    None
}

/// Waits for the first complete snapshot (every kind listed); false when a signal came
/// first.
pub(super) async fn listed(snapshots: &Published) -> Result<bool, ReconcileError> {
    info!("waiting for the initial list of every kind");
    let mut listed = snapshots.clone();
    tokio::select! {
        synced = listed.wait_for(Option::is_some) => {
            synced.map_err(|e| ReconcileError::Runtime(e.to_string()))?;
            Ok(true)
        }
        _ = wait_for_signal() => Ok(false),
    }
}

fn add_host_cidrs_publisher(
    config: &Config,
    client: &kube::Client,
    snapshots: &Published,
    tasks: &mut Runtime,
) {
    let excluded = [config.cluster_cidrs.clone(), config.service_cidrs.clone()].concat();
    let (client, node, snapshots) = (client.clone(), config.node_name.clone(), snapshots.clone());
    tasks.add(task(
        "egress-ip-host-cidrs",
        OnExit::Restart,
        move |mut ctx| {
            let publish = egress_ip::host_cidrs::publish(
                client.clone(),
                node.clone(),
                excluded.clone(),
                snapshots.clone(),
            );
            async move { ctx.until_stopped(super::ended(publish)).await }
        },
    ));
}

fn add_fence(
    config: &Config,
    client: &kube::Client,
    snapshots: &Published,
    fence: &Fence,
    proof: egress_ip::fence::Proof,
    events: &Events,
    tasks: &mut Runtime,
) {
    let check = egress_ip::fence::KubeCheck {
        client: client.clone(),
        timeout: config.egress_ip_probe.interval * (config.egress_ip_probe.misses + 1),
    };
    let (flag, events) = (fence.clone(), Mutex::new(events.clone()));
    let run = egress_ip::fence::run(
        check,
        config.node_name.clone(),
        snapshots.clone(),
        config.egress_ip_probe,
        proof,
        move |on| {
            if flag.set(on) {
                let _ = events.lock().map(|t| t.send(Event::Changed));
            }
        },
    );
    tasks.add(once("egress-ip-fence", OnExit::Finish, async move {
        run.await;
        Ok(())
    }));
}

/// The candidacy for the EgressIP assigner role (Lease `EGRESS_IP_ASSIGNER_LEASE` in
/// `--leader-elect-namespace`, holder identity the node name), the report of who leads, and
/// the assigner, which acts only while this agent leads.
pub(super) fn add_assigner(
    config: &Config,
    client: kube::Client,
    snapshots: &Published,
    probe_key: Option<egress_ip::probe_auth::ProbeKey>,
    admin: &Arc<AdminState>,
    tasks: &mut Runtime,
) {
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
    let api = KubeLeases::new(client.clone(), &election.namespace, &election.name);
    // The assigner's probes prove the holder's node dead; the election takes over early.
    let (dead_tx, dead) = watch::channel(std::collections::BTreeSet::new());
    let (leadership, elector) = Elector::task("egress-ip-election", api, election, dead);
    let admin = admin.clone();
    let reported = leadership.clone();
    tasks.add(once(
        "egress-ip-leadership",
        OnExit::Finish,
        report_leadership(EGRESS_IP_ASSIGNER, reported, admin.clone()),
    ));
    let (node, probes, snapshots) = (
        config.node_name.clone(),
        config.egress_ip_probe,
        snapshots.clone(),
    );
    let cloud = egress_ip::cloud_sync::Settings {
        platform: config.platform,
        attach_seconds: admin.metrics.egress_ip_cloud_attach(),
    };
    tasks.add(task(
        "egress-ip-assigner",
        OnExit::Restart,
        move |mut ctx| {
            let standby = egress_ip::Standby {
                holder: follow(leadership.clone(), |l| l.holder.clone(), None),
                dead: dead_tx.clone(),
            };
            let assign = egress_ip::run(
                client.clone(),
                follow(leadership.clone(), |l| l.leading, false),
                snapshots.clone(),
                node.clone(),
                probes,
                probe_key.clone(),
                cloud.clone(),
                Some(standby),
            );
            async move { ctx.until_stopped(super::ended(assign)).await }
        },
    ));
    // Added last, stopped first: the role is handed over at once on SIGTERM instead of
    // letting the lease expire, and the assigner sees "not leading" before it is stopped.
    tasks.add(elector);
}

/// Logs every change of who leads `role` and shows it in `/readyz` and `nodeplane_leader`.
async fn report_leadership(
    role: &'static str,
    mut leadership: watch::Receiver<Leadership>,
    admin: Arc<AdminState>,
) -> Result<(), String> {
    loop {
        let now = leadership.borrow_and_update().clone();
        admin.set_leadership(role, now.leading, now.holder.as_deref());
        match (now.leading, now.holder.as_deref()) {
            (true, _) => info!("{role}: this node leads"),
            (false, Some(h)) => info!("{role}: following {}", crate::text::one_line(h)),
            (false, None) => info!("{role}: no leader yet"),
        }
        if leadership.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// One part of the leadership (whether this agent leads, who holds the Lease), as the
/// assigner consumes it: follows `leadership` until the election is gone (then: `gone`).
/// Lives as long as the returned receiver's holder.
fn follow<T: PartialEq + Send + Sync + 'static>(
    mut leadership: watch::Receiver<Leadership>,
    part: fn(&Leadership) -> T,
    gone: T,
) -> watch::Receiver<T> {
    let (tx, rx) = watch::channel(part(&leadership.borrow()));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = leadership.changed() => if changed.is_err() { break },
                _ = tx.closed() => return,
            }
            let now = part(&leadership.borrow());
            tx.send_if_modified(|old| {
                let differ = *old != now;
                if differ {
                    *old = now;
                }
                differ
            });
        }
        let _ = tx.send(gone);
    });
    rx
}
