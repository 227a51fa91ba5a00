//! The admin HTTP server and what it reports: liveness, readiness (degraded while the
//! Kubernetes source is not synced or the API server is unreachable, while a drift of the
//! kernel's table is not repaired, or when the last sync failed), Prometheus metrics and the
//! ruleset the agent last applied, rendered as `--dry-run` prints it.

mod drift;
pub mod egress_ip_dataplane;
pub mod kubeproxy;
pub mod metrics;
pub mod rule_counters;
mod server;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::info;

pub use metrics::{CountingLookup, Metrics};
pub use server::{Surface, listen};

use crate::nft::TABLE_NAME;
use crate::nft::ir::Table;
use crate::nft::monitor::Drift;
use crate::nft::render::render_full;
use crate::observe::{SyncObserver, SyncOutcome, status_line};
use crate::source::kube::SourceHealth;
use crate::source::loader::ManifestHealth;
use crate::text::one_line;

/// Shared between the run loop (writer) and the admin server (reader).
#[derive(Default)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Set in Kubernetes mode.
    pub source: Option<SourceHealth>,
    /// Set in manifests mode: degraded while a file is rejected or the directory unreadable.
    pub manifests: Option<ManifestHealth>,
    last: Mutex<Last>,
    drift: Mutex<drift::DriftStatus>,
    /// Per cluster-wide role this agent is a candidate for: a line for `/readyz`.
    roles: Mutex<BTreeMap<String, String>>,
    /// What the host lacks, found at start (`host`, the DNS proxy's start).
    environment: Mutex<Environment>,
    /// Tasks that are down: name → (why, vital). See [`crate::task::Health`].
    tasks: Mutex<BTreeMap<String, (String, bool)>>,
    /// `agent assigner`: no control loop, so no sync to wait for.
    no_syncs: bool,
    /// Set while `/explain?trace=..` runs: one trace at a time.
    tracing: std::sync::atomic::AtomicBool,
}

/// Why `/explain` gives no report.
#[derive(Debug)]
pub enum ExplainRefused {
    /// A bad question (400), naming the parameter.
    Bad(String),
    /// A trace is already running (409).
    Busy,
    /// The trace could not run (500).
    Failed(String),
}

/// Problems of the agent's environment, by what they concern (`capabilities`, `dns proxy`,
/// `sysctl`). Errors (a missing capability, a listener that cannot work) keep `/readyz`
/// degraded; warnings are lines of its body.
#[derive(Default)]
struct Environment {
    errors: BTreeMap<String, String>,
    warnings: BTreeMap<String, String>,
}

#[derive(Default)]
struct Last {
    /// Applied table, header and status lines of the last successful sync.
    applied: Option<(Arc<Table>, String)>,
    /// `table bridge nodeplane` as that sync left it (None while no pod is bridged).
    applied_bridge: Option<Arc<Table>>,
    /// Why the last sync failed, if it did.
    error: Option<String>,
    /// The node's facts and EgressIP names when the applied table was planned, for
    /// `/explain`.
    explain: Option<Arc<ExplainFacts>>,
}

/// What `/explain` needs besides the applied table.
#[derive(Default)]
struct ExplainFacts {
    node: String,
    facts: crate::explain::packet::NodeFacts,
    egress_ips: Vec<(String, Vec<String>)>,
}

impl AdminState {
    pub fn new(source: Option<SourceHealth>) -> AdminState {
        AdminState {
            source,
            ..Default::default()
        }
    }

    /// For a process without a control loop (`agent assigner`): ready without a sync.
    pub fn without_syncs(mut self) -> AdminState {
        self.no_syncs = true;
        self
    }

    /// Reports the manifests loader's health in `/readyz` too.
    pub fn with_manifests(mut self, manifests: Option<ManifestHealth>) -> AdminState {
        self.manifests = manifests;
        self
    }

    fn last(&self) -> std::sync::MutexGuard<'_, Last> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn drift(&self) -> std::sync::MutexGuard<'_, drift::DriftStatus> {
        self.drift.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Someone else changed the kernel's table: not ready until a sync repairs it. Returns
    /// the detection's sequence number, for [`AdminState::drift_repaired`].
    pub fn drift_detected(&self, drift: &Drift) -> u64 {
        self.metrics.observe_drift(drift.object());
        self.drift().detected(drift)
    }

    /// A sync that started after the run loop took in detections up to `upto` succeeded.
    /// Returns the time from the (earliest) detection to now if that repaired a drift.
    pub fn drift_repaired(&self, upto: u64) -> Option<Duration> {
        let took = self.drift().repaired(upto, Instant::now())?;
        self.metrics.observe_drift_repair(took);
        Some(took)
    }

    /// Drifts repaired since the start.
    pub fn drift_repairs(&self) -> u64 {
        self.drift().repairs()
    }

    /// Who leads `role` as this agent sees it: the `nodeplane_leader` gauge and a line of the
    /// `/readyz` body (information, never a reason to be unready: followers are healthy).
    pub fn set_leadership(&self, role: &str, leading: bool, holder: Option<&str>) {
        self.metrics.set_leader(role, leading);
        let line = match (leading, holder) {
            (true, _) => "leader".to_string(),
            (false, Some(h)) => format!("follower (leader: {})", one_line(h)),
            (false, None) => "follower (no leader)".to_string(),
        };
        self.roles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(role.to_string(), line);
    }

    /// Something the agent needs from its host is missing: `/readyz` stays degraded
    /// naming it (the caller logs it).
    pub fn environment_error(&self, what: &str, message: &str) {
        self.environment()
            .errors
            .insert(what.into(), message.into());
    }

    /// A host setting that defeats a feature: a `warning:` line of `/readyz` (the caller
    /// logs it).
    pub fn environment_warning(&self, what: &str, message: &str) {
        self.environment()
            .warnings
            .insert(what.into(), message.into());
    }

    /// Withdraws the warning `what` (the condition is gone).
    pub fn clear_environment_warning(&self, what: &str) {
        self.environment().warnings.remove(what);
    }

    /// One `warning: <what>: <message>` line per environment warning, for `/readyz`.
    pub fn environment_warnings(&self) -> String {
        let env = self.environment();
        env.warnings
            .iter()
            .map(|(w, m)| format!("warning: {w}: {}\n", one_line(m)))
            .collect()
    }

    fn environment(&self) -> std::sync::MutexGuard<'_, Environment> {
        self.environment.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One `<role>: leader|follower (leader: <holder>)` line per role, for `/readyz`.
    pub fn leadership(&self) -> String {
        let roles = self.roles.lock().unwrap_or_else(|p| p.into_inner());
        roles.iter().map(|(r, l)| format!("{r}: {l}\n")).collect()
    }

    /// Ok, or why the node's view or rules may be stale.
    pub fn ready(&self) -> Result<(), String> {
        if let Some(source) = &self.source {
            source.check()?;
        }
        if let Some(manifests) = &self.manifests {
            manifests.check()?;
        }
        self.drift().check(Instant::now())?;
        let errors: Vec<String> = (self.environment().errors.iter())
            .map(|(w, m)| format!("{w}: {m}"))
            .chain((self.tasks().iter()).map(|(name, (why, _))| format!("task {name}: {why}")))
            .collect();
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        if self.no_syncs {
            return Ok(());
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

    /// Liveness: fails while a task the agent cannot work without is down (then the kubelet
    /// or systemd restarts the agent).
    pub fn alive(&self) -> Result<(), String> {
        let dead: Vec<String> = (self.tasks().iter())
            .filter(|(_, (_, vital))| *vital)
            .map(|(name, (why, _))| format!("task {name}: {why}"))
            .collect();
        if dead.is_empty() {
            Ok(())
        } else {
            Err(dead.join("; "))
        }
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, bool)>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The table the last successful sync applied (an `Arc`: the caller holds it, not the
    /// lock).
    pub fn applied_table(&self) -> Option<Arc<Table>> {
        self.last().applied.as_ref().map(|(table, _)| table.clone())
    }

    /// `/explain?src=..&dst=..[&trace=S][&format=json]`: `agent explain` against the table
    /// last applied (the live state), answered as text or JSON; with `trace`, after tracing
    /// real packets for up to S seconds (blocks: call it off the async runtime).
    pub fn explain(&self, query: &str) -> Result<Option<String>, ExplainRefused> {
        use crate::explain::offline::{Live, Request, explain_tables};
        let json = query.split('&').any(|p| p == "format=json");
        let query: Vec<&str> = query
            .split('&')
            .filter(|p| !p.starts_with("format="))
            .collect();
        let bad = |e: &dyn std::fmt::Display| ExplainRefused::Bad(e.to_string());
        let req = Request::from_query_string(&query.join("&")).map_err(|e| bad(&e))?;
        let (table, bridge, facts) = {
            let last = self.last();
            match (&last.applied, &last.explain) {
                (Some((t, _)), Some(f)) => (t.clone(), last.applied_bridge.clone(), f.clone()),
                _ => return Ok(None),
            }
        };
        let live = Live {
            node: &facts.node,
            inet: &table,
            bridge: bridge.as_deref(),
            facts: &facts.facts,
            egress_ips: &facts.egress_ips,
        };
        let mut report = explain_tables(&live, &req).map_err(|e| bad(&e))?;
        if let Some(limits) = req.trace {
            use std::sync::atomic::{AtomicBool, Ordering};
            /// Frees the slot however the trace ends.
            struct Slot<'a>(&'a AtomicBool);
            impl Drop for Slot<'_> {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            if self.tracing.swap(true, Ordering::AcqRel) {
                return Err(ExplainRefused::Busy);
            }
            let _slot = Slot(&self.tracing);
            let traced = crate::explain::trace::trace(&live, &req, limits);
            report.trace = Some(traced.map_err(|e| ExplainRefused::Failed(e.to_string()))?);
        }
        Ok(Some(if json {
            serde_json::to_string_pretty(&report)
                .map_err(|e| ExplainRefused::Failed(e.to_string()))?
                + "\n"
        } else {
            crate::explain::output::text(&report)
        }))
    }

    /// The last applied ruleset in `--dry-run` form.
    pub fn ruleset(&self) -> Option<String> {
        let (table, header) = self.last().applied.clone()?;
        Some(format!("{header}{}", render_full(&table)))
    }
}

impl crate::task::Health for AdminState {
    fn task_down(&self, name: &str, why: &str, vital: bool) {
        self.metrics.task_down(name);
        self.tasks()
            .insert(name.into(), (one_line(why).into_owned(), vital));
    }

    fn task_up(&self, name: &str) {
        self.tasks().remove(name);
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
            metrics.kubeproxy.taken(s);
        }
        if sync.cleanup_failed {
            metrics.kubeproxy.cleanup_failed();
        }
        match (sync.result, sync.applied) {
            (Ok(report), Some(table)) => {
                metrics.observe_success(sync.duration, report.nft.ops, table);
                metrics.count_egress_ip_conflicts(report.new_address_conflicts);
                // Each sync says anew what the features could not do (NetworkPolicy: bridged
                // pods it could not bind), each under its topic.
                for (topic, problems) in report.outputs.warnings() {
                    match problems {
                        [] => self.state.clear_environment_warning(topic),
                        problems => self.state.environment_warning(topic, &problems.join("; ")),
                    }
                }
                let now = std::time::SystemTime::now();
                let kp = &metrics.kubeproxy;
                kp.synced(sync.duration, sync.full, sync.snapshot, now);
                kp.no_local_endpoints(&report.outputs.services.no_local_endpoints);
                if let Some(done) = &report.outputs.services.conntrack {
                    kp.conntrack_reconciled(done);
                }
                let objects = sync.snapshot.map(|s| s.len()).unwrap_or_default();
                let mut header = format!(
                    "# nodeplane ruleset for node {} ({objects} objects read)\n",
                    one_line(&self.node_name)
                );
                for s in &report.statuses {
                    header.push_str(&format!("# {}\n", status_line(s, None)));
                }
                let explain = sync.snapshot.map(|s| {
                    let facts = crate::explain::offline::node_facts(s, &self.node_name, &[]);
                    let egress_ips = crate::explain::offline::egress_ips(s);
                    let node = self.node_name.clone();
                    Arc::new(ExplainFacts {
                        node,
                        facts,
                        egress_ips,
                    })
                });
                let mut last = self.state.last();
                last.applied = Some((Arc::new(table.clone()), header));
                last.applied_bridge = (sync.applied_extra.iter())
                    .find(|t| t.family == crate::nft::Family::Bridge)
                    .map(|t| Arc::new((*t).clone()));
                if explain.is_some() {
                    last.explain = explain;
                }
                last.error = None;
            }
            (Ok(_), None) => {}
            (Err(e), _) => {
                metrics.observe_failure(sync.duration, e.reason());
                metrics.kubeproxy.failed(sync.duration, sync.full);
                self.state.last().error = Some(e.to_string());
            }
        }
    }
}

/// Marks drifts repaired: a successful sync repaired every detection the run loop took in
/// before it started ([`SyncOutcome::drift_seq`]).
pub struct DriftRepairs {
    pub state: Arc<AdminState>,
}

impl SyncObserver for DriftRepairs {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        if sync.result.is_ok()
            && let Some(took) = self.state.drift_repaired(sync.drift_seq)
        {
            info!(
                "table {TABLE_NAME} repaired {:.1} ms after the drift was seen",
                took.as_secs_f64() * 1e3
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::monitor::Changes;
    use crate::observe::SyncReport;

    fn admin_observer(node_name: &str) -> (Arc<AdminState>, AdminObserver) {
        let state = Arc::new(AdminState::new(None));
        let observer = AdminObserver {
            state: state.clone(),
            node_name: node_name.into(),
        };
        (state, observer)
    }

    /// Each sync says anew which bridged pods could not be bound: a `/readyz` warning while
    /// there are some, gone after a sync with none.
    #[test]
    fn unbound_bridged_pods_are_a_readyz_warning_until_a_sync_binds_them() {
        let (state, mut observer) = admin_observer("node-1");
        let table = Table::new("nodeplane");
        let mut sync = |pod_binding: Vec<String>| {
            let mut report = SyncReport::default();
            report.outputs.netpol.pod_binding = pod_binding;
            observer.observe(&SyncOutcome::plain(None, &Ok(report), Some(&table)));
        };
        sync(vec![
            "address 10.0.0.9 of pod a/p (bridge br0) is behind no bridge port".into(),
        ]);
        assert_eq!(
            state.environment_warnings(),
            "warning: networkpolicy pod binding: address 10.0.0.9 of pod a/p (bridge br0) is behind no bridge port\n"
        );
        sync(Vec::new());
        assert_eq!(state.environment_warnings(), "");
    }

    #[test]
    fn the_ruleset_header_keeps_hostile_names_in_their_comment_lines() {
        use crate::plan::ObjectStatus;
        use crate::snapshot::{Kind, ObjectKey};
        let (state, mut observer) = admin_observer("node-1\nadd table ip NODE");
        let pwned = "x\nadd table ip PWNED4\n#";
        let report = SyncReport {
            statuses: vec![
                ObjectStatus {
                    kind: Kind::EgressFirewall,
                    key: ObjectKey::new(pwned, "default"),
                    result: Ok(()),
                    event: None,
                },
                ObjectStatus {
                    kind: Kind::EgressQoS,
                    key: ObjectKey::new("a\r\0b\u{2028}", pwned),
                    result: Err(format!("bad value {pwned}")),
                    event: None,
                },
            ],
            ..SyncReport::default()
        };
        let table = Table::new("nodeplane");
        observer.observe(&SyncOutcome::plain(None, &Ok(report), Some(&table)));
        let ruleset = state.ruleset().unwrap();
        let header: Vec<&str> = ruleset
            .lines()
            .take_while(|l| *l != "table inet nodeplane")
            .collect();
        assert_eq!(
            header,
            [
                "# nodeplane ruleset for node node-1\\nadd table ip NODE (0 objects read)",
                "# EgressFirewall x\\nadd table ip PWNED4\\n#/default: EgressFirewall Rules applied",
                "# EgressQoS a\\r\\0b\\u{2028}/x\\nadd table ip PWNED4\\n#: EgressQoS Rules not correctly applied: bad value x\\nadd table ip PWNED4\\n#",
            ],
            "{ruleset}"
        );
    }

    #[test]
    fn leadership_is_reported_not_judged() {
        let state = AdminState::new(None);
        state.last().applied = Some((Arc::new(Table::new("nodeplane")), String::new()));
        assert_eq!(state.leadership(), "");
        state.set_leadership("egress-ip-assigner", false, Some("node-b\nready"));
        assert_eq!(
            state.leadership(),
            "egress-ip-assigner: follower (leader: node-b\\nready)\n"
        );
        assert_eq!(state.ready(), Ok(()), "a follower is ready");
        state.set_leadership("egress-ip-assigner", true, Some("node-a"));
        assert_eq!(state.leadership(), "egress-ip-assigner: leader\n");
        assert!(
            state
                .metrics
                .encode()
                .contains("nodeplane_leader{role=\"egress-ip-assigner\"} 1\n")
        );
    }

    #[test]
    fn a_detected_drift_is_not_ready_until_a_sync_repairs_it() {
        let state = AdminState::new(None);
        state.last().applied = Some((Arc::new(Table::new("nodeplane")), String::new()));
        assert_eq!(state.ready(), Ok(()));
        let mut changes = Changes::default();
        changes
            .chains
            .entry("fw-dispatch".into())
            .or_default()
            .removed = 7;
        let drift = Drift {
            at: Instant::now(),
            changes,
            by: ["nft (pid 9)".to_string()].into(),
            events_lost: false,
            unseen: false,
        };
        let seq = state.drift_detected(&drift);
        let reason = state.ready().unwrap_err();
        assert!(
            reason.starts_with("table nodeplane changed by someone else ")
                && reason.ends_with("chain fw-dispatch 7 rules deleted (by nft (pid 9))"),
            "{reason}"
        );
        // A sync that started before the loop took the detection in repairs nothing.
        assert_eq!(state.drift_repaired(seq - 1), None);
        assert!(state.ready().is_err());
        assert!(state.drift_repaired(seq).is_some());
        assert_eq!(state.ready(), Ok(()));
        assert_eq!(state.drift_repairs(), 1);
        let text = state.metrics.encode();
        for line in [
            "nodeplane_drift_detected_total{object=\"chain\"} 1\n",
            "nodeplane_drift_repairs_total 1\n",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
