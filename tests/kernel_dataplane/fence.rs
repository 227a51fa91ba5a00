//! The EgressIP fence against the kernel: the library's fence (`controller::egress_ip::fence::
//! run`) on a node that hosts an egress IP and never reaches the API server, the library's
//! prober signing probes on a leader node across a segment. The fence holds while the
//! leader's probes come, and fences once they stop, whatever the node's pods send meanwhile:
//! valid probes the node never saw, replayed from a routed pod and from bridged pods (with
//! and without `br_netfilter`) with the leader's address as source, do not count; a flood of
//! ICMP from a pod (junk, and echo requests shaped like probes) does not make it miss the
//! leader's probes. Probes over IPv6 and the node's probes of itself (the loopback) count.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nodeplane::controller::egress_ip::fence::{self, ApiCheck, Proof};
use nodeplane::controller::egress_ip::probe::{self, Settings, Targets, Verdicts};
use nodeplane::controller::egress_ip::probe_auth::{MAGIC, PAYLOAD_LEN, ProbeKey};
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::forged_probes::{Forger, Reach, echo_request, unseen_probe};
use nodeplane::testing::lab::{Lab, Ns, Pod, set_br_netfilter};
use nodeplane::testing::{objects, runtime};
use tokio::sync::watch;

const LEADER: &str = "192.168.62.10";
const NODE: &str = "192.168.62.11";
const LEADER6: &str = "fd00:62::10";
const NODE6: &str = "fd00:62::11";
/// Probes every 100 ms; the fence asks the API server after interval × (misses + 1).
const fn settings(misses: u32) -> Settings {
    Settings {
        interval: Duration::from_millis(100),
        misses,
        rises: 3,
    }
}
/// The deployed default: quiet after 400 ms. The flood test uses it (the tighter the limit,
/// the fewer probes a flood must drown to fence a node whose leader is alive).
const TIGHT: Settings = settings(3);
/// Quiet after 1 s: the other tests wait for the fence to stay off while probes come, which
/// a stalled thread on a loaded machine must not upset; their attacks do not depend on it.
const LOOSE: Settings = settings(9);
/// How long the fence waits for a probe before it asks the API server.
fn quiet(s: Settings) -> Duration {
    s.interval * (s.misses + 1)
}

/// Generous: a loaded 2-core machine runs the fence, the prober and the attackers at once.
const BOUND: Duration = Duration::from_secs(5);

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// An API server that never answers: only the probes keep the node from fencing.
struct Unreachable;

impl ApiCheck for Unreachable {
    async fn reachable(&self) -> bool {
        false
    }

    async fn hosted(&self, _node: &str) -> Option<BTreeSet<String>> {
        None
    }
}

fn key() -> ProbeKey {
    ProbeKey::new(&[0x5a; 32]).unwrap()
}

/// The cluster as the node sees it: the leader and the node, and an egress IP on the node.
fn snapshot() -> Snapshot {
    let eip = objects::egress_ip("e", &["192.168.62.200"], &[])
        .hosted(&[("192.168.62.200", "node")])
        .object();
    Snapshot::builder()
        .with(objects::node("leader", &[LEADER, LEADER6]).object())
        .with(objects::node("node", &[NODE, NODE6]).object())
        .with(eip)
        .build()
}

/// A task on a runtime of its own on a thread in `ns`, stopped when its channel is dropped.
struct Running<T> {
    stop: Option<watch::Sender<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The fence of "node" in `ns`; `fenced` turns true when it fences.
fn start_fence(ns: &Ns, settings: Settings, fenced: Arc<AtomicBool>) -> Running<Option<Snapshot>> {
    let (tx, rx) = watch::channel(Some(snapshot()));
    let thread = ns.spawn(move || {
        runtime::current_thread().block_on(fence::run(
            Unreachable,
            "node".into(),
            rx,
            settings,
            Proof::Probes(key()),
            move |on| fenced.store(on, Ordering::SeqCst),
        ))
    });
    Running {
        stop: Some(tx),
        thread: Some(thread),
    }
}

/// The leader's prober in `ns`, probing the node at `addrs` with signed probes.
fn start_leader(ns: &Ns, addrs: &[&str]) -> Running<Targets> {
    let addrs = addrs.iter().map(|a| a.parse().unwrap()).collect();
    let targets: Targets = [("node".to_string(), addrs)].into();
    let (tx, rx) = watch::channel(targets);
    let thread = ns.spawn(move || {
        let (verdicts, _keep) = watch::channel(Verdicts::new());
        runtime::current_thread().block_on(probe::run(
            TIGHT,
            Some(key()),
            rx,
            verdicts,
            watch::channel(true).1,
        ))
    });
    Running {
        stop: Some(tx),
        thread: Some(thread),
    }
}

/// Waits until `fenced`; the time it took.
fn wait_fenced(fenced: &AtomicBool, what: &str) -> Duration {
    let t0 = Instant::now();
    while !fenced.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < BOUND, "{what}: not fenced within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.elapsed()
}

/// Checks every 5 ms for `d` that the fence stays off.
fn stays_unfenced(fenced: &AtomicBool, d: Duration, what: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        assert!(
            !fenced.load(Ordering::SeqCst),
            "{what}: fenced after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The leader and the node on a segment; on the node a routed pod and a bridged pod.
struct Cluster {
    leader: Ns,
    node: Ns,
    routed: Pod,
    bridged: Pod,
    _lab: Lab,
}

fn cluster() -> Cluster {
    let mut lab = Lab::new();
    let seg = lab.add_segment("seg");
    let leader = lab.add_node("leader");
    let node = lab.add_node("node");
    lab.attach(
        &leader,
        &seg,
        &[&format!("{LEADER}/24"), &format!("{LEADER6}/64")],
    );
    lab.attach(
        &node,
        &seg,
        &[&format!("{NODE}/24"), &format!("{NODE6}/64")],
    );
    let routed = lab.add_pod(&node, "routed", &["10.128.0.5"]);
    let bridge = lab.add_bridge(&node, "cni0", &["10.129.0.1/24"]);
    let bridged = lab.add_bridged_pod(&bridge, "bridged", &["10.129.0.5/24"]);
    Cluster {
        leader,
        node,
        routed,
        bridged,
        _lab: lab,
    }
}

/// Valid probes the node never saw (signed with the cluster's key, stamped now: what a
/// capture on the way to the node within the skew window gives), replayed every 20 ms by a
/// pod with the leader's address as source.
fn replay_unseen_probes(pod: &Pod) -> Forger {
    let (leader, node, key) = (v4(LEADER), v4(NODE), key());
    let mut counter = 0;
    Forger::start_with(&pod.ns, node, Duration::from_millis(20), move || {
        counter += 1;
        vec![(leader, unseen_probe(&key, counter, node))]
    })
}

#[test]
fn probes_replayed_from_routed_and_bridged_pods_do_not_keep_the_fence_quiet() {
    let c = cluster();
    for (pod, br_netfilter) in [
        (&c.routed, None),
        (&c.bridged, Some(false)),
        (&c.bridged, Some(true)),
    ] {
        let case = format!("{} pod, br_netfilter {br_netfilter:?}", pod.ns.name());
        if let Some(on) = br_netfilter {
            set_br_netfilter(&c.node, on);
        }
        let fenced = Arc::new(AtomicBool::new(false));
        let _fence = start_fence(&c.node, LOOSE, fenced.clone());
        let leader = start_leader(&c.leader, &[NODE]);
        let forger = replay_unseen_probes(pod);
        // The leader's probes arm the fence and keep it quiet.
        stays_unfenced(&fenced, 4 * quiet(LOOSE), &case);
        // The leader goes silent; only the pod's replays reach the node now.
        drop(leader);
        let reach = Reach::start(&forger, &c.node);
        let took = wait_fenced(&fenced, &case);
        eprintln!(
            "{case}: fenced {took:?} after the leader went silent (quiet limit {:?})",
            quiet(LOOSE)
        );
        let (sent, received) = reach.counts();
        assert!(sent >= 5, "{case}: only {sent} replays sent");
        assert!(
            received * 10 >= sent * 9,
            "{case}: {received} of {sent} replays reached the node"
        );
    }
}

/// The leader's probes count over IPv6 (the ICMPv6 listener and its filter), and over the
/// loopback when the leader probes its own node: the fence stays quiet while they come and
/// fences once they stop.
#[test]
fn the_leaders_probes_count_over_ipv6_and_from_the_node_itself() {
    let c = cluster();
    for (case, from, to) in [
        ("IPv6 across the segment", &c.leader, NODE6),
        ("the node probing itself", &c.node, NODE),
    ] {
        let fenced = Arc::new(AtomicBool::new(false));
        let _fence = start_fence(&c.node, LOOSE, fenced.clone());
        let leader = start_leader(from, &[to]);
        stays_unfenced(&fenced, 4 * quiet(LOOSE), case);
        drop(leader);
        let took = wait_fenced(&fenced, case);
        eprintln!("{case}: fenced {took:?} after the probes stopped");
    }
}

/// An echo reply (type 0) from nobody's ping: what a flood looks like to a socket that sees
/// every ICMP message (large, so few fill a receive buffer).
fn flood_reply(seq: u16) -> Vec<u8> {
    let mut p = echo_request(0x4242, seq, &[0x5a; 1200]);
    p[0] = 0;
    // Type 8 -> 0 lowers the one's-complement sum by 0x0800: the checksum rises by it.
    let sum = u16::from_be_bytes([p[2], p[3]]).wrapping_add(0x0800);
    p[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

#[test]
fn an_icmp_flood_from_a_pod_does_not_make_the_fence_miss_the_leaders_probes() {
    let c = cluster();
    let fenced = Arc::new(AtomicBool::new(false));
    let _fence = start_fence(&c.node, TIGHT, fenced.clone());
    let leader = start_leader(&c.leader, &[NODE]);
    stays_unfenced(&fenced, 5 * quiet(TIGHT), "before the flood");

    // Four flooding threads (more than the cores of a small machine), each sending bursts
    // with no pause: large junk replies from the pod's address, and echo requests shaped
    // like probes (the magic, a probe's length, a forged MAC) from the leader's address.
    let (pod, leader_ip) = (v4("10.128.0.5"), v4(LEADER));
    let mut forged = [0u8; PAYLOAD_LEN];
    forged[..8].copy_from_slice(MAGIC);
    let shaped = echo_request(0x4e50, 1, &forged);
    let burst: Vec<(Ipv4Addr, Vec<u8>)> = (0..64)
        .map(|i| {
            if i % 2 == 0 {
                (pod, flood_reply(i))
            } else {
                (leader_ip, shaped.clone())
            }
        })
        .collect();
    let floods: Vec<Forger> = (0..4)
        .map(|_| Forger::start(&c.routed.ns, v4(NODE), burst.clone(), Duration::ZERO))
        .collect();
    let watch = Duration::from_secs(3);
    stays_unfenced(&fenced, watch, "under the flood");
    let sent: u64 = floods.iter().map(Forger::sent).sum();
    eprintln!(
        "flood: {sent} packets in {watch:?} ({:.0}/s); the fence saw the leader's probes",
        sent as f64 / watch.as_secs_f64()
    );
    assert!(sent > 10_000, "the flood sent only {sent} packets");

    // Under the flood, the fence still notices the leader going silent.
    drop(leader);
    let took = wait_fenced(&fenced, "leader silent under the flood");
    eprintln!("leader silent under the flood: fenced after {took:?}");
    drop(floods);
}
