//! Fencing: a node cut off from both the EgressIP assigner and the API server drops the
//! egress IPs it hosts, so that there is never a second owner for long once the assigner
//! has moved them elsewhere.
//!
//! **Signals.** The leading assigner sends an ICMP echo to every candidate each probe
//! interval ([`super::probe`]); the same raw ICMP sockets on the hosting node see those
//! requests arrive. One counts only when it is the assigner's: from a Node's address, arrived
//! on one of this node's uplinks ([`super::uplinks`]: an interface holding one of its Node
//! addresses, or the loopback from its own), signed with the cluster's probe key for this
//! node's address, fresh, and newer than the last one accepted ([`super::probe_auth`]). A
//! pod or a host on the segment cannot make one, a replay is refused, and nothing a pod
//! sends counts, not even a valid probe the node never saw: it arrives on the pod's
//! interface. The listener's socket filter ([`super::probe_filter`]) keeps everything else
//! out of its queue in the kernel, so no ICMP flood drowns the probes. When none has arrived
//! for the assigner's own verdict time, `interval × (misses + 1)`, the assigner is about to
//! declare this node dead, or is dead itself. The two are told apart by the API server: the node asks it
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
//! - With a key, fencing is armed only after the first probe was accepted: without a
//!   nodeplane assigner (OVN-Kubernetes' cluster manager assigning, or probes off) there are
//!   no probes, and an API outage alone never removes an egress IP.
//! - Without a key (no `--egress-ip-probe-key-file`, or an unreadable one) probes prove
//!   nothing (fail closed): where nodeplane assigns, fencing is armed from the start and
//!   rests on the API check alone, so a hosting node asks the API server once per quiet
//!   period and any API outage that long withholds its egress IPs. A warning says so in the
//!   log and `/readyz`.
//! - Clocks more than `probe_auth::MAX_SKEW` apart refuse the probes (logged): the node acts
//!   as if the assigner were silent, and asks the API server.
//! - The assigner's node dying stops the probes while the API server answers: no fence, the
//!   node keeps its IPs and a new leader takes over.
//! - An API outage while the probes keep coming: no fence (the assigner sees the node alive
//!   and cannot move anything either).
//! - A host firewall dropping ICMP echo requests to the node keeps fencing from ever being
//!   armed there (and makes the node dead to the assigner, see `probe`).
//! - Nothing a peer sends can make a node drop its IPs while the API server answers; forged
//!   probes are refused. A probe captured within `probe_auth::MAX_SKEW` that the node never
//!   saw counts only when it arrives on an uplink: replayed from the segment, it buys at
//!   most that much time; from a pod, nothing (see [`super::uplinks`] for the bridge that
//!   holds the node address and has pod ports, where pods are on the segment).
//! - The uplinks are read from the kernel when the Node's addresses change and every
//!   `host_cidrs::POLL`: a node address moved to another interface (to a bridge, say) is
//!   taken for an uplink that much later; meanwhile probes are refused and the API server
//!   decides. Probes that only ever arrive on interfaces without a node address (the node
//!   address on the loopback, unnumbered uplinks) are refused: fencing is never armed, and
//!   a warning says so.

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::host_cidrs;
use super::probe::Settings;
use super::probe_auth::{self, ProbeKey, Refused, Verifier};
use super::probe_listener::{Listener, Request};
use super::uplinks::Uplinks;
use crate::snapshot::{self, Snapshot};

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

    /// Armed without a probe: the API check alone decides (no probe key).
    pub fn arm(&mut self, now: Instant) {
        self.armed = true;
        self.last_probe = now;
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

const NODE_ADDRESS_TYPES: &[&str] = &["InternalIP", "ExternalIP"];

/// Where probes may come from (every Node's addresses) and what they must be signed for
/// (this node's own), from a snapshot.
#[derive(Debug, Default)]
struct Peers {
    nodes: HashSet<IpAddr>,
    own: Vec<IpAddr>,
}

impl Peers {
    fn of(snapshot: &Snapshot, node: &str) -> Peers {
        let nodes = snapshot
            .nodes()
            .values()
            .flat_map(|n| snapshot::node_addresses(n, NODE_ADDRESS_TYPES))
            .collect();
        let own = snapshot
            .node(node)
            .map(|n| snapshot::node_addresses(n, NODE_ADDRESS_TYPES))
            .unwrap_or_default();
        Peers { nodes, own }
    }
}

/// The probes' checks on this node: the source a Node's, the interface an uplink, the payload
/// the assigner's.
struct Gate {
    verifier: Verifier,
    peers: Peers,
    uplinks: Uplinks,
    /// Refusals of signed probes for skew are logged once: the clocks need fixing.
    skew_logged: bool,
}

impl Gate {
    /// Takes the Node addresses of `snapshot`; whether this node's own changed (its uplinks
    /// must be read again).
    fn follow_peers(&mut self, snapshot: &Snapshot, node: &str) -> bool {
        let peers = Peers::of(snapshot, node);
        let moved = peers.own != self.peers.own;
        self.peers = peers;
        moved
    }

    fn accept(&mut self, from: IpAddr, ifindex: u32, payload: &[u8]) -> bool {
        if !self.peers.nodes.contains(&from) {
            return false;
        }
        // Before the MAC: a refused probe must not advance its session's counter.
        if !self.uplinks.admit(ifindex, from, &self.peers.own) {
            debug!(
                "EgressIP fencing: echo request from {from} refused: it arrived on interface \
                 {ifindex}, which holds none of this node's addresses"
            );
            return false;
        }
        match self
            .verifier
            .accept(payload, &self.peers.own, probe_auth::unix_ms_now())
        {
            Ok(_) => true,
            Err(Refused::Skew(ms)) if !self.skew_logged => {
                self.skew_logged = true;
                warn!(
                    "EgressIP fencing: a signed probe from {from} is {ms} ms off this node's \
                     clock (more than {:?}): refused; synchronise the nodes' clocks",
                    probe_auth::MAX_SKEW
                );
                false
            }
            Err(e) => {
                debug!("EgressIP fencing: echo request from {from} refused: {e:?}");
                false
            }
        }
    }
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

/// What may keep a node's egress IPs besides the API server.
#[derive(Debug, Clone)]
pub enum Proof {
    /// The assigner's probes, checked with this key.
    Probes(ProbeKey),
    /// Nothing: no key, and nodeplane assigns, so the fence is armed from the start and the
    /// API check alone decides.
    ApiOnly,
    /// Nothing, and no nodeplane assigner to fence against: the fence stays off.
    Off,
}

/// Runs the fence of `node` until the snapshot channel closes: `set(true)` when it fences,
/// `set(false)` when it lifts. Off (returns at once) when the probes are off, `proof` is
/// [`Proof::Off`], or no raw ICMP socket can be opened for the probes (none can be seen).
pub async fn run(
    api: impl ApiCheck,
    node: String,
    mut snapshots: watch::Receiver<Option<Snapshot>>,
    settings: Settings,
    proof: Proof,
    set: impl Fn(bool) + Send,
) {
    if !settings.enabled() {
        return;
    }
    let mut dog = Watchdog::new(&settings, Instant::now());
    let Some((listener, mut gate)) = probe_sight(proof, &mut dog) else {
        return;
    };
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut b4, mut b6) = (vec![0u8; 1500], vec![0u8; 1500]);
    let mut ours = BTreeSet::new();
    let mut fresh = true;
    let mut uplinks_due = Instant::now();
    loop {
        if fresh {
            // O(nodes) once per snapshot; a probe costs a set lookup and a MAC or two.
            if let Some(s) = snapshots.borrow_and_update().as_ref() {
                ours = hosted_in(s, &node);
                if let Some(g) = gate.as_mut()
                    && g.follow_peers(s, &node)
                {
                    uplinks_due = Instant::now();
                }
            }
            fresh = false;
        }
        if let (Some(l), Some(g)) = (listener.as_ref(), gate.as_mut())
            && Instant::now() >= uplinks_due
        {
            refresh_uplinks(l, g).await;
            uplinks_due = Instant::now() + host_cidrs::POLL;
        }
        if let Some(fenced) = fence_or_lift(&api, &mut dog, &ours, &node).await {
            set(fenced);
        }
        tokio::select! {
            r = request(listener.as_ref(), &mut b4, &mut b6) => {
                let buf = if r.v4 { &b4 } else { &b6 };
                if gate.as_mut().is_some_and(|g| g.accept(r.from, r.ifindex, &buf[r.payload])) {
                    dog.probe_seen(Instant::now());
                }
            }
            _ = tick.tick() => {}
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                fresh = true;
            }
        }
    }
}

/// What sees the assigner's probes for `proof`: the listener and its checks, neither when
/// the API check alone decides (and `dog` is armed from the start); `None` when the fence
/// is off (no nodeplane assigner, or no raw ICMP socket).
fn probe_sight(proof: Proof, dog: &mut Watchdog) -> Option<(Option<Listener>, Option<Gate>)> {
    match proof {
        Proof::Off => None,
        Proof::ApiOnly => {
            dog.arm(Instant::now());
            Some((None, None))
        }
        Proof::Probes(key) => match Listener::open() {
            Ok(l) => {
                let gate = Gate {
                    verifier: Verifier::new(key),
                    peers: Peers::default(),
                    uplinks: Uplinks::default(),
                    skew_logged: false,
                };
                Some((Some(l), Some(gate)))
            }
            Err(e) => {
                warn!("EgressIP fencing off: cannot open a raw ICMP socket to see probes: {e}");
                None
            }
        },
    }
}

/// One step of the watchdog: while the probes are quiet, fence (`Some(true)`) unless the
/// API server answers; while fenced, lift (`Some(false)`) once the API server places on
/// this node every egress IP it hosts (`ours`). `None`: no change.
async fn fence_or_lift(
    api: &impl ApiCheck,
    dog: &mut Watchdog,
    ours: &BTreeSet<String>,
    node: &str,
) -> Option<bool> {
    if dog.suspect(Instant::now(), !ours.is_empty()) {
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
            return Some(true);
        }
    } else if dog.fenced() {
        // At most one request per tick while fenced (a handful of nodes, for seconds).
        if let Some(listed) = api.hosted(node).await
            && ours.is_subset(&listed)
        {
            dog.lift(Instant::now());
            info!("EgressIP fencing lifted: the API server confirms what this node hosts");
            return Some(false);
        }
    }
    None
}

/// Reads this node's uplinks again; the listener's socket filter follows them.
async fn refresh_uplinks(listener: &Listener, gate: &mut Gate) {
    let (links, addresses) = match host_cidrs::read_kernel().await {
        Ok(read) => read,
        Err(e) => {
            warn!("EgressIP fencing: cannot read the interfaces, the last uplinks stay: {e}");
            return;
        }
    };
    let uplinks = Uplinks::of(&links, &addresses, &gate.peers.own);
    if uplinks == gate.uplinks {
        return;
    }
    if let Err(e) = listener.admit_only(&uplinks.interfaces()) {
        warn!(
            "EgressIP fencing: cannot set the probe listener's socket filter ({e}): it passes \
             no probe, so fencing is never armed"
        );
    }
    if uplinks.none() && !gate.peers.own.is_empty() {
        warn!(
            "EgressIP fencing: no interface but the loopback holds this node's addresses ({}): \
             probes from other nodes are refused, so fencing is armed only by an assigner on \
             this node",
            gate.peers
                .own
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        debug!(
            "EgressIP fencing: probes count on interfaces {:?} (uplinks, then the loopback)",
            uplinks.interfaces()
        );
    }
    gate.uplinks = uplinks;
}

/// The next echo request shaped like a probe; never, without a listener.
async fn request(listener: Option<&Listener>, b4: &mut [u8], b6: &mut [u8]) -> Request {
    let Some(l) = listener else {
        return std::future::pending().await;
    };
    loop {
        if let Some(r) = l.request(b4, b6).await {
            return r;
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
    fn without_a_key_the_fence_is_armed_from_the_start_and_the_api_check_alone_decides() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut dog = Watchdog::new(&settings(), t0);
        dog.arm(t0);
        assert!(!dog.suspect(ms(399), true));
        assert!(dog.suspect(ms(400), true), "no probe needed to suspect");
        dog.api_answered(ms(400));
        assert!(dog.suspect(ms(800), true), "asked once per quiet period");
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
