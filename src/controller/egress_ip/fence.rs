//! Fencing: a node cut off from both the EgressIP assigner and the API server drops the
//! egress IPs it hosts, so that there is never a second owner for long once the assigner
//! has moved them elsewhere.
//!
//! **Signals.** The leading assigner sends an ICMP echo to every candidate each probe
//! interval ([`super::probe`]); the same raw ICMP sockets on the hosting node see those
//! requests arrive (payload `nodeplan`). When none has arrived for the assigner's own
//! verdict time, `interval × (misses + 1)`, the assigner is about to declare this node dead,
//! or is dead itself. The two are told apart by the API server: the node asks it
//! (`/version`, bounded by the same time). Only when that fails too is the node *fenced*:
//! the reconciler withholds every egress address it would host (deleted from the interfaces,
//! SNAT to them replaced by the fail-closed drop, an `EgressIPNotApplied` reason), so the
//! node drops them at most about `2 × interval × (misses + 1)` after it was cut off (0.8 s
//! with the defaults), while the assigner moves them after `interval × (misses + 1)`.
//!
//! **Leaving the fence.** Only on the API server's word: the node lists the EgressIPs and
//! lifts the fence once every IP its own (possibly stale) snapshot places on it is also
//! placed on it by that fresh list. An IP moved away while the node was cut off therefore
//! never comes back, even for the moment before the watch catches up; the snapshot then
//! catches up and the fence lifts with nothing left to host.
//!
//! **Failure modes.**
//! - Fencing is armed only after the first probe was seen: without a nodeplane assigner
//!   (OVN-Kubernetes' cluster manager assigning, or probes off) there are no probes, and an
//!   API outage alone never removes an egress IP.
//! - The assigner's node dying stops the probes while the API server answers: no fence, the
//!   node keeps its IPs and a new leader takes over.
//! - An API outage while the probes keep coming: no fence (the assigner sees the node alive
//!   and cannot move anything either).
//! - A host firewall dropping ICMP echo requests to the node keeps fencing from ever being
//!   armed there (and makes the node dead to the assigner, see `probe`).
//! - The probe payload is not authenticated: a peer spoofing probes could keep a cut-off node
//!   from fencing itself, not make it drop its IPs.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::probe::{self, Settings};
use crate::snapshot::Snapshot;

/// The clock-explicit state of the fence (unit-tested without sockets or sleeping).
#[derive(Debug, Clone)]
pub struct Watchdog {
    quiet_limit: Duration,
    armed: bool,
    last_probe: Instant,
    fenced: bool,
}

impl Watchdog {
    pub fn new(settings: &Settings, now: Instant) -> Watchdog {
        Watchdog {
            quiet_limit: settings.interval * (settings.misses + 1),
            armed: false,
            last_probe: now,
            fenced: false,
        }
    }

    /// An assigner's probe reached this node.
    pub fn probe_seen(&mut self, now: Instant) {
        self.armed = true;
        self.last_probe = now;
    }

    /// Whether the API server must be asked now: armed, hosting, not fenced yet, and no
    /// probe for as long as the assigner takes to declare a node dead.
    pub fn suspect(&self, now: Instant, hosting: bool) -> bool {
        self.armed && hosting && !self.fenced && now - self.last_probe >= self.quiet_limit
    }

    /// The API server answered while the probes were quiet (the assigner is gone, not
    /// this node): ask again only after another quiet period.
    pub fn api_answered(&mut self, now: Instant) {
        self.last_probe = now;
    }

    pub fn fence(&mut self) {
        self.fenced = true;
    }

    /// The API server confirmed what this node hosts: back to normal, with a fresh quiet
    /// period.
    pub fn lift(&mut self, now: Instant) {
        self.fenced = false;
        self.last_probe = now;
    }

    pub fn fenced(&self) -> bool {
        self.fenced
    }

    /// The time within which the API server must answer.
    pub fn api_timeout(&self) -> Duration {
        self.quiet_limit
    }
}

/// The egress IPs `status.items` places on `node`.
pub fn hosted_by(
    egress_ips: impl IntoIterator<Item = crate::api::EgressIP>,
    node: &str,
) -> BTreeSet<String> {
    egress_ips
        .into_iter()
        .filter_map(|e| e.status)
        .flat_map(|s| s.items)
        .filter(|i| i.node == node)
        .map(|i| i.egress_ip)
        .collect()
}

fn hosted_in(snapshot: &Snapshot, node: &str) -> BTreeSet<String> {
    hosted_by(snapshot.egress_ips().values().map(|e| (**e).clone()), node)
}

/// What fencing asks of the API server.
pub trait ApiCheck {
    /// Any successful answer.
    fn reachable(&self) -> impl Future<Output = bool> + Send;
    /// The egress IPs the API server's own `status.items` place on the node, or `None`.
    fn hosted(&self, node: &str) -> impl Future<Output = Option<BTreeSet<String>>> + Send;
}

/// [`ApiCheck`] over a kube client, each request bounded by `timeout`.
pub struct KubeCheck {
    pub client: kube::Client,
    pub timeout: Duration,
}

impl ApiCheck for KubeCheck {
    async fn reachable(&self) -> bool {
        matches!(
            tokio::time::timeout(self.timeout, self.client.apiserver_version()).await,
            Ok(Ok(_))
        )
    }

    async fn hosted(&self, node: &str) -> Option<BTreeSet<String>> {
        let api: kube::Api<crate::api::EgressIP> = kube::Api::all(self.client.clone());
        let list = tokio::time::timeout(
            Duration::from_secs(2),
            api.list(&kube::api::ListParams::default()),
        )
        .await;
        match list {
            Ok(Ok(l)) => Some(hosted_by(l.items, node)),
            _ => None,
        }
    }
}

/// Runs the fence of `node` until the snapshot channel closes: `set(true)` when it fences,
/// `set(false)` when it lifts. Off (returns at once) when the probes are off or no raw ICMP
/// socket can be opened (no probes can be seen then).
pub async fn run(
    api: impl ApiCheck,
    node: String,
    mut snapshots: watch::Receiver<Option<Snapshot>>,
    settings: Settings,
    set: impl Fn(bool) + Send,
) {
    if !settings.enabled() {
        return;
    }
    let listener = match probe::Listener::open() {
        Ok(l) => l,
        Err(e) => {
            warn!("EgressIP fencing off: cannot open a raw ICMP socket to see probes: {e}");
            return;
        }
    };
    let mut dog = Watchdog::new(&settings, Instant::now());
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut b4, mut b6) = (vec![0u8; 1500], vec![0u8; 1500]);
    loop {
        tokio::select! {
            seen = listener.probe(&mut b4, &mut b6) => {
                if seen {
                    dog.probe_seen(Instant::now());
                }
            }
            _ = tick.tick() => {}
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let ours = snapshots
            .borrow()
            .as_ref()
            .map(|s| hosted_in(s, &node))
            .unwrap_or_default();
        let now = Instant::now();
        if dog.suspect(now, !ours.is_empty()) {
            if api.reachable().await {
                dog.api_answered(Instant::now());
            } else {
                dog.fence();
                warn!(
                    "EgressIP fencing: no probe from the assigner for {:?} and no answer from \
                     the API server: withholding the egress IPs of this node ({})",
                    dog.api_timeout(),
                    ours.iter().cloned().collect::<Vec<_>>().join(", ")
                );
                set(true);
            }
        } else if dog.fenced() {
            // At most one request per tick while fenced (a handful of nodes, for seconds).
            if let Some(fresh) = api.hosted(&node).await
                && ours.is_subset(&fresh)
            {
                dog.lift(Instant::now());
                info!("EgressIP fencing lifted: the API server confirms what this node hosts");
                set(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            interval: Duration::from_millis(100),
            misses: 3,
            rises: 3,
        }
    }

    #[test]
    fn unarmed_never_suspects_and_quiet_probes_do_after_the_verdict_time() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut dog = Watchdog::new(&settings(), t0);
        // No probe ever seen (no nodeplane assigner): an API outage alone never fences.
        assert!(!dog.suspect(ms(10_000), true));
        dog.probe_seen(ms(100));
        assert!(!dog.suspect(ms(450), true));
        assert!(dog.suspect(ms(500), true));
        // Nothing hosted here: nothing to withhold.
        assert!(!dog.suspect(ms(500), false));
        // The API answered (the assigner is gone, not this node): quiet again for 400 ms.
        dog.api_answered(ms(500));
        assert!(!dog.suspect(ms(899), true));
        assert!(dog.suspect(ms(900), true));
        dog.fence();
        assert!(dog.fenced());
        assert!(!dog.suspect(ms(2000), true), "already fenced");
        dog.lift(ms(2000));
        assert!(!dog.fenced());
        assert!(!dog.suspect(ms(2300), true));
    }

    #[test]
    fn hosted_by_reads_the_items_naming_the_node() {
        let eip = crate::testing::objects::egress_ip("a", &["10.0.0.1", "10.0.0.2"], &[])
            .hosted(&[("10.0.0.1", "node-1"), ("10.0.0.2", "node-2")])
            .object();
        let got = hosted_by([eip], "node-1");
        assert_eq!(got, BTreeSet::from(["10.0.0.1".to_string()]));
    }
}
