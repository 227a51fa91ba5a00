//! What run mode hangs on the control loop besides the admin state and the status writer:
//! each a [`SyncObserver`] that hands a sync's outcome to a task or a health record.

use std::sync::Arc;

use tokio::sync::watch;

use crate::healthcheck::HealthServer;
use crate::healthcheck::proxy::{ProxyHealth, Stamp};
use crate::observe::{SyncObserver, SyncOutcome};

/// Tells the DNS proxy whose answers to learn from once a sync put the learned sets in place.
pub struct DnsLearning(pub watch::Sender<Arc<crate::plan::firewall::learning::Learning>>);

impl SyncObserver for DnsLearning {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Ok(report) = sync.result {
            self.0.send_if_modified(|current| {
                let changed = **current != *report.outputs.firewall.learning;
                if changed {
                    *current = report.outputs.firewall.learning.clone();
                }
                changed
            });
        }
    }
}

/// Hands the ACL log reader the logged verdicts of each applied plan, and logs what is
/// wrong with the namespaces' `k8s.ovn.org/acl-logging` annotations when that changes.
pub struct AclBook(pub watch::Sender<Arc<crate::plan::acl_log::Book>>);

impl SyncObserver for AclBook {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        let Ok(report) = sync.result else { return };
        let mut merged = (*report.outputs.firewall.acl).clone();
        merged.merge(&report.outputs.netpol.acl);
        let book = &Arc::new(merged);
        self.0.send_if_modified(|current| {
            if **current == **book {
                return false;
            }
            for problem in book.problems.difference(&current.problems) {
                tracing::warn!("ACL logging: {}", crate::text::one_line(problem));
            }
            *current = book.clone();
            true
        });
    }
}

/// Serves the services' health-check ports of the last successful sync.
pub struct HealthCheckServer(pub HealthServer);

impl SyncObserver for HealthCheckServer {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if let Ok(report) = sync.result {
            self.0.update(
                report
                    .outputs
                    .services
                    .health_checks
                    .clone()
                    .into_iter()
                    .collect(),
            );
        }
    }
}

/// Feeds the proxy health from every sync attempt: a success is the new `lastUpdated` and
/// clears what was pending, a failure leaves an update pending since the sync started, and
/// the snapshot's own Node decides the node's eligibility.
pub struct SyncHealth {
    pub health: Arc<ProxyHealth>,
    pub node_name: String,
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
