//! The admin HTTP server and what it reports: liveness, readiness (degraded while the
//! Kubernetes source is not synced or the API server is unreachable, or the last sync
//! failed), Prometheus metrics and the ruleset the agent last applied, rendered as `--dry-run`
//! prints it.

pub mod metrics;
mod server;

use std::sync::{Arc, Mutex};

pub use metrics::{CountingLookup, Metrics};
pub use server::serve;

use crate::nft::ir::Table;
use crate::nft::render::render_full;
use crate::reconcile::{SyncObserver, SyncOutcome, status_line};
use crate::source::kube::SourceHealth;

/// Shared between the run loop (writer) and the admin server (reader).
#[derive(Default)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Set in Kubernetes mode.
    pub source: Option<SourceHealth>,
    last: Mutex<Last>,
}

#[derive(Default)]
struct Last {
    /// Applied table, header and status lines of the last successful sync.
    applied: Option<(Arc<Table>, String)>,
    /// Why the last sync failed, if it did.
    error: Option<String>,
}

impl AdminState {
    pub fn new(source: Option<SourceHealth>) -> AdminState {
        AdminState {
            source,
            ..Default::default()
        }
    }

    fn last(&self) -> std::sync::MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ok, or why the node's view or rules may be stale.
    pub fn ready(&self) -> Result<(), String> {
        if let Some(source) = &self.source {
            source.check()?;
        }
        let last = self.last();
        if let Some(e) = &last.error {
            return Err(format!("last sync failed: {e}"));
        }
        if last.applied.is_none() {
            return Err("no sync yet".into());
        }
        Ok(())
    }

    /// The last applied ruleset in `--dry-run` form.
    pub fn ruleset(&self) -> Option<String> {
        let (table, header) = self.last().applied.clone()?;
        Some(format!("{header}{}", render_full(&table)))
    }
}

/// Feeds [`AdminState`] from the run loop.
pub struct AdminObserver {
    pub state: Arc<AdminState>,
    pub node_name: String,
}

impl SyncObserver for AdminObserver {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        let metrics = &self.state.metrics;
        if let Some(s) = sync.snapshot {
            metrics.observe_snapshot(s);
        }
        match (sync.result, sync.applied) {
            (Ok(report), Some(table)) => {
                metrics.observe_success(sync.duration, report.nft.ops, table);
                let objects = sync.snapshot.map(|s| s.len()).unwrap_or_default();
                let mut header = format!(
                    "# nodeplane ruleset for node {} ({objects} objects read)\n",
                    self.node_name
                );
                for s in &report.statuses {
                    header.push_str(&format!("# {}\n", status_line(s, None)));
                }
                let mut last = self.state.last();
                last.applied = Some((Arc::new(table.clone()), header));
                last.error = None;
            }
            (Ok(_), None) => {}
            (Err(e), _) => {
                metrics.observe_failure(sync.duration, e.reason());
                self.state.last().error = Some(e.to_string());
            }
        }
    }
}
