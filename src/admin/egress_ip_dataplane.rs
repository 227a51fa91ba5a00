//! `nodeplane_egress_ip_dataplane_seconds` on the hosting node: from the moment a snapshot
//! whose EgressIP `status.items` newly places an egress IP on this node is published (on a
//! cloud, the assigner writes that item only once the cloud attached the IP) to the end of
//! the first committed sync of a snapshot that has it. The arrival is taken when the
//! snapshot reaches the run loop rather than from the condition's `lastTransitionTime`:
//! that time is the cloud controller's clock with one-second resolution, and it includes
//! the assigner's own reaction, which `nodeplane_egress_ip_cloud_attach_seconds` and the
//! assigner's logs cover.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::metrics::Metrics;
use crate::controller::egress_ip::fence::hosted_by;
use crate::observe::{SyncObserver, SyncOutcome};
use crate::snapshot::Snapshot;

#[derive(Default)]
struct State {
    /// What the last snapshot placed here.
    hosted: BTreeSet<String>,
    /// Newly placed IPs not yet programmed, and when their snapshot arrived.
    waiting: BTreeMap<String, Instant>,
}

/// Shared between the snapshot watcher ([`DataplaneTimer::arrived`]) and the sync
/// observer.
#[derive(Clone)]
pub struct DataplaneTimer {
    node: String,
    state: Arc<Mutex<State>>,
    metrics: Arc<Metrics>,
}

fn hosted_in(snap: &Snapshot, node: &str) -> BTreeSet<String> {
    hosted_by(snap.egress_ips().values().map(|e| (**e).clone()), node)
}

impl DataplaneTimer {
    pub fn new(node: &str, metrics: Arc<Metrics>) -> DataplaneTimer {
        DataplaneTimer {
            node: node.into(),
            state: Arc::default(),
            metrics,
        }
    }

    /// A snapshot was published at `at`.
    pub fn arrived(&self, snap: &Snapshot, at: Instant) {
        let now = hosted_in(snap, &self.node);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let new: Vec<String> = now.difference(&s.hosted).cloned().collect();
        for ip in new {
            s.waiting.entry(ip).or_insert(at);
        }
        s.waiting.retain(|ip, _| now.contains(ip));
        s.hosted = now;
    }

    /// The IPs programmed by a committed sync of `snap`, each with how long it waited.
    fn programmed(&self, snap: &Snapshot, done: Instant) -> Vec<(String, std::time::Duration)> {
        let placed = hosted_in(snap, &self.node);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A sync that ran before the watcher saw its snapshot: not new when it does.
        s.hosted.extend(placed.iter().cloned());
        let ready: Vec<String> = s
            .waiting
            .keys()
            .filter(|ip| placed.contains(*ip))
            .cloned()
            .collect();
        ready
            .into_iter()
            .filter_map(|ip| {
                let at = s.waiting.remove(&ip)?;
                Some((ip, done.saturating_duration_since(at)))
            })
            .collect()
    }
}

impl SyncObserver for DataplaneTimer {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        let (Ok(_), Some(snap)) = (sync.result, sync.snapshot) else {
            return;
        };
        for (ip, took) in self.programmed(snap, Instant::now()) {
            tracing::info!("egress IP {ip}: programmed on this node {took:?} after its status");
            self.metrics.observe_egress_ip_dataplane(took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::objects::egress_ip;
    use std::time::Duration;

    fn snap(items: &[(&str, &str)]) -> Snapshot {
        let e = egress_ip("a", &["10.0.0.1", "10.0.0.2"], &[]).hosted(items);
        Snapshot::builder().with(e.object()).build()
    }

    #[test]
    fn times_each_newly_placed_ip_from_its_snapshot_to_the_sync() {
        let t = DataplaneTimer::new("w1", Arc::new(Metrics::new()));
        let t0 = Instant::now();
        t.arrived(&snap(&[("10.0.0.2", "w2")]), t0);
        assert!(t.programmed(&snap(&[]), t0).is_empty());
        // Placed here; an unrelated snapshot later does not restart its clock.
        t.arrived(&snap(&[("10.0.0.1", "w1")]), t0);
        t.arrived(&snap(&[("10.0.0.1", "w1")]), t0 + Duration::from_millis(5));
        let done = t0 + Duration::from_millis(20);
        assert_eq!(
            t.programmed(&snap(&[("10.0.0.1", "w1")]), done),
            vec![("10.0.0.1".to_string(), Duration::from_millis(20))]
        );
        // Counted once.
        assert!(t.programmed(&snap(&[("10.0.0.1", "w1")]), done).is_empty());
        // Gone before a sync programmed it: nothing to count.
        t.arrived(&snap(&[("10.0.0.2", "w1")]), t0);
        t.arrived(&snap(&[]), t0);
        assert!(t.programmed(&snap(&[("10.0.0.2", "w1")]), done).is_empty());
    }
}
