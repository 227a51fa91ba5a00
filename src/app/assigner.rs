//! `agent assigner`: the cluster's EgressIP assigner alone, under an identity of its own
//! (deploy/assigner.yaml), so that the node agents' credentials cannot move egress IPs. The
//! same tasks as a node agent's candidacy (`kube::add_assigner`) on a Kubernetes source of the
//! kinds it reads; no control loop, nothing programmed on the host.

use std::sync::Arc;

use tracing::info;

use super::{SHUTDOWN_DEADLINE, add_admin_servers, kube, wait_for_signal};
use crate::admin::AdminState;
use crate::config::Config;
use crate::features::{Features, Switch};
use crate::observe::ReconcileError;
use crate::source::kube::SourceHealth;
use crate::task::Runtime;

pub async fn run(config: Config) -> Result<(), ReconcileError> {
    let health = SourceHealth::default();
    let admin = Arc::new(AdminState::new(Some(health.clone())).without_syncs());
    let mut tasks = Runtime::new(admin.clone());
    let result = match start(&config, health, &admin, &mut tasks).await {
        Ok(true) => {
            wait_for_signal().await;
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(e) => Err(e),
    };
    let stopped = tasks.shutdown(SHUTDOWN_DEADLINE).await;
    info!("{stopped}");
    result
}

/// Starts the tasks; false when a signal came before every kind was listed.
async fn start(
    config: &Config,
    health: SourceHealth,
    admin: &Arc<AdminState>,
    tasks: &mut Runtime,
) -> Result<bool, ReconcileError> {
    crate::listener::raise_nofile_limit();
    add_admin_servers(config, admin, tasks).await?;
    let kinds = Features::only(&[Switch::EgressIp]).kinds();
    let (client, source) = crate::reconcile::connect_kube(config, health, &kinds, tasks).await?;
    // An assigner must not act on a partial view of the cluster.
    if !kube::listed(&source.snapshots).await? {
        return Ok(false);
    }
    // The probes carry the key, so that the nodes' fences accept them.
    let probe_key = config
        .egress_ip_probe
        .enabled()
        .then(|| kube::probe_key(config, admin))
        .flatten();
    kube::add_assigner(config, client, &source.snapshots, probe_key, admin, tasks);
    Ok(true)
}
