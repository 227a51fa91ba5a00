//! What a sync reports and who is told about it: [`SyncReport`] (what a successful sync
//! did), [`ReconcileError`] (why one failed), [`SyncOutcome`] (one attempt of the run loop as
//! its [`SyncObserver`]s see it) and [`status_line`] (an object's verdict as one line of text).
//! The control loop ([`crate::reconcile::run_loop`]) reports; the admin server, the status
//! writer and the health-check server react (wired in [`crate::app`]). This module depends on
//! neither side.

use std::time::Duration;

use crate::net::NetError;
use crate::nft::ir::Table;
use crate::nft::{ApplyStats, NftError};
use crate::plan::{ObjectStatus, Outputs};
use crate::snapshot::Snapshot;
use crate::text::one_line;

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

/// Told about every sync attempt of the run loop: the log, metrics, the admin server, status
/// write-back, drift repairs, the features' outputs (`SyncReport::outputs`). Runs on the
/// reconcile thread, so it must not block for long.
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
    pub applied: Option<&'a Table>,
    /// The features' other tables as the kernel holds them (NetworkPolicy's bridge table
    /// while a pod is bridged).
    pub applied_extra: Vec<&'a Table>,
    /// The highest drift detection (the `seq` of the run loop's drift events) taken in before
    /// this sync started; a successful sync repaired every detection up to it. 0: none yet.
    pub drift_seq: u64,
    /// The sync read the kernel's table back and repaired it (start-up, periodic resync,
    /// drift, a rejected batch) rather than sending a diff against what it believed:
    /// kube-proxy's "full" sync; the others are "partial".
    pub full: bool,
    /// Removing a table no longer wanted (`table bridge nodeplane` once NetworkPolicy needs
    /// it no more) failed in this sync.
    pub cleanup_failed: bool,
}

impl<'a> SyncOutcome<'a> {
    /// An attempt that took no time, after no drift, as a partial sync without cleanup
    /// failures: what most observers' tests need (set the other fields where one matters).
    pub fn plain(
        snapshot: Option<&'a Snapshot>,
        result: &'a Result<SyncReport, ReconcileError>,
        applied: Option<&'a Table>,
    ) -> Self {
        SyncOutcome {
            snapshot,
            result,
            duration: Duration::ZERO,
            applied,
            applied_extra: Vec::new(),
            drift_seq: 0,
            full: false,
            cleanup_failed: false,
        }
    }
}

/// What one successful sync did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub nft: ApplyStats,
    pub net_ops: usize,
    pub statuses: Vec<ObjectStatus>,
    /// What the features hand to the world besides the tables (health-check ports, DNS
    /// learning), for the observers.
    pub outputs: Outputs,
    /// Where the sync's time went (logged with "sync done").
    pub took: SyncTimes,
    /// Egress addresses another host answered for that this sync found newly
    /// (`nodeplane_egress_ip_address_conflicts_total`).
    pub new_address_conflicts: usize,
}

/// The steps of one sync, timed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncTimes {
    /// Planning and settling (user space only).
    pub plan: std::time::Duration,
    /// The nftables diff and transaction (both tables), kernel commit included.
    pub nft: std::time::Duration,
    /// Addresses, routes and rules, and the conntrack cleanup.
    pub net: std::time::Duration,
}

/// An object's verdict as the log, `--dry-run` and the admin ruleset print it: one line
/// whatever its name and message hold ([`crate::text::one_line`]), so that a namespace named
/// `x\nadd table ip PWNED4` stays inside its `#` comment.
pub fn status_line(s: &ObjectStatus, apply_error: Option<&str>) -> String {
    let kind = s.kind.as_str();
    let verdict = match (&s.result, apply_error) {
        (Ok(()), None) => format!("{kind} Rules applied"),
        (Ok(()), Some(e)) => format!("{kind} Rules not correctly applied: {e}"),
        (Err(e), _) => format!("{kind} Rules not correctly applied: {e}"),
    };
    one_line(&format!("{kind} {}: {verdict}", s.key)).into_owned()
}
