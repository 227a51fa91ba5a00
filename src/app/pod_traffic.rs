//! Does pod traffic cross this node's netfilter hooks? Everything the agent programs
//! (EgressFirewall, EgressQoS, EgressIP, Services, NetworkPolicy) judges pod packets in the
//! host's hooks; a CNI that keeps pod traffic elsewhere (OVN-Kubernetes' OVS datapath, an
//! eBPF dataplane that redirects past the stack) leaves all of it without effect, silently.
//!
//! The skeleton's `filter-forward` chain starts with `counter` rules for packets from the
//! cluster CIDRs ([`POD_TRAFFIC_PROBE`]). Once the node runs a pod on the pod network, the
//! check reads those counters every [`POLL`] (one rule dump of one chain); if none has
//! counted a packet within `--pod-traffic-check-seconds`, the log and `/readyz` warn. The
//! first packet counted clears the warning and ends the check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::admin::AdminState;
use crate::nft::ir::{Family, TABLE_NAME};
use crate::nft::nftnl::rule_counts;
use crate::observe::{SyncObserver, SyncOutcome};
use crate::plan::base::POD_TRAFFIC_PROBE;
use crate::plan::base::chains::FILTER_FORWARD;
use crate::snapshot::{self, Snapshot};
use crate::task::{OnExit, Task, once};

/// How often the counters are read while no pod packet has been seen.
const POLL: Duration = Duration::from_secs(2);
/// The `/readyz` topic of the warning.
const TOPIC: &str = "pod traffic";

/// Whether `node` runs a pod on the pod network (not host network, not finished, with an
/// address): only such a pod's packets can be expected in the forward hook.
pub fn runs_pod_network_pods(snapshot: &Snapshot, node: &str) -> bool {
    snapshot.pods_on_node(node).any(|pod| {
        !snapshot::pod_is_host_network(pod)
            && !snapshot::pod_is_terminal(pod)
            && !snapshot::pod_ips(pod).is_empty()
    })
}

/// Tells the check when the node's first pod-network pod is seen.
pub struct PodsSeen {
    pub node_name: String,
    pub seen: watch::Sender<bool>,
}

impl SyncObserver for PodsSeen {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if *self.seen.borrow() {
            return;
        }
        if let (Some(snapshot), Ok(_)) = (sync.snapshot, sync.result)
            && runs_pod_network_pods(snapshot, &self.node_name)
        {
            self.seen.send_replace(true);
        }
    }
}

/// The check as a task: waits for pods, then for a counted packet or the deadline.
pub fn check(
    admin: Arc<AdminState>,
    mut pods_seen: watch::Receiver<bool>,
    within: Duration,
) -> impl Task {
    once("pod-traffic-check", OnExit::Finish, async move {
        if pods_seen.wait_for(|seen| *seen).await.is_err() {
            return Ok(()); // the control loop is gone: the agent is stopping
        }
        let since = Instant::now();
        let mut warned = false;
        loop {
            let counted = tokio::task::spawn_blocking(|| {
                rule_counts(Family::Inet, TABLE_NAME, FILTER_FORWARD, POD_TRAFFIC_PROBE)
            })
            .await
            .map_err(|e| e.to_string())?;
            match counted {
                Ok(Some(c)) if c.packets > 0 => {
                    if warned {
                        admin.clear_environment_warning(TOPIC);
                    }
                    info!(
                        "pod traffic crosses this node's netfilter forward hook ({} packets from the cluster CIDRs counted)",
                        c.packets
                    );
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => debug!("pod traffic check: cannot read the counters: {e}"),
            }
            if !warned && since.elapsed() >= within {
                let message = format!(
                    "no packet from the cluster CIDRs reached the forward hook in the {} s since this node's first pod ran: the CNI keeps pod traffic out of the host's netfilter hooks (e.g. OVN-Kubernetes), so EgressFirewall, EgressQoS, EgressIP, Services and NetworkPolicy do not apply to its pods (README \"Feature switches\")",
                    within.as_secs()
                );
                warn!("{TOPIC}: {message}");
                admin.environment_warning(TOPIC, &message);
                warned = true;
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

/// The check's two halves for run mode: the observer that sees pods and the task, or
/// nothing when the check is off.
pub fn parts(
    admin: &Arc<AdminState>,
    node_name: &str,
    within: Option<Duration>,
) -> Option<(PodsSeen, impl Task)> {
    let within = within?;
    let (seen, pods_seen) = watch::channel(false);
    Some((
        PodsSeen {
            node_name: node_name.to_string(),
            seen,
        },
        check(admin.clone(), pods_seen, within),
    ))
}
