//! The EgressIP assigner's node health probes against the kernel: the library's prober
//! (`controller::egress_ip::probe::run`) in node-1 probes node-2 on a bridge. node-2's kernel
//! answers with or without an agent (one is started, then killed: the verdict never
//! changes), an address nothing answers on is dead, node-2 is dead within
//! interval × (misses + 1) of its link going down and alive again soon after it comes back.
//! A pod on the prober's node flooding it with ICMP does not make node-2 look dead, and the
//! probes still see node-2's link go down under the flood.

use nodeplane::controller::egress_ip::probe::{self, Settings, Targets, Verdicts};
use nodeplane::testing::forged_probes::Forger;
use nodeplane::testing::lab::{Lab, ManifestAgent, Ns};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const INTERVAL: Duration = Duration::from_millis(100);
const MISSES: u32 = 3;
/// Scheduling allowance of a loaded test machine on top of the design bound.
const SLACK: Duration = Duration::from_millis(150);
const NODE2_V4: &str = "192.168.60.12";
const NODE2_V6: &str = "fd00:60::12";
/// On the node subnet, nobody's.
const GHOST: &str = "192.168.60.99";
/// node-1's own addresses, probed as two more nodes that always answer: the dead stay a
/// minority, so the self-doubt guard (more than half dead) keeps out of the way.
const SELF: [(&str, &[&str]); 2] = [
    ("self-v4", &["192.168.60.11"]),
    ("self-v6", &["fd00:60::11"]),
];
const ADMIN: &str = "127.0.0.1:9942";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn targets(nodes: &[(&str, &[&str])]) -> Targets {
    nodes
        .iter()
        .map(|(n, a)| (n.to_string(), a.iter().map(|s| ip(s)).collect()))
        .collect()
}

/// The prober on a thread of its own in `ns`; stops when dropped.
struct Prober {
    targets: Option<watch::Sender<Targets>>,
    verdicts: watch::Receiver<Verdicts>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prober {
    fn start(ns: &Ns, initial: Targets) -> Prober {
        let (targets, targets_rx) = watch::channel(initial);
        let (verdicts_tx, verdicts) = watch::channel(Verdicts::new());
        let settings = Settings {
            interval: INTERVAL,
            misses: MISSES,
            ..Settings::default()
        };
        let thread = ns.spawn(move || {
            let rt = nodeplane::testing::runtime::current_thread();
            rt.block_on(probe::run(
                settings,
                None,
                targets_rx,
                verdicts_tx,
                watch::channel(true).1,
            ));
        });
        Prober {
            targets: Some(targets),
            verdicts,
            thread: Some(thread),
        }
    }

    fn verdict(&self, node: &str) -> Option<bool> {
        self.verdicts.borrow().get(node).copied()
    }

    /// Polls every 5 ms until `node`'s verdict is `alive`; the time it took.
    fn wait(&self, node: &str, alive: bool, timeout: Duration) -> Duration {
        let start = Instant::now();
        while self.verdict(node) != Some(alive) {
            assert!(
                start.elapsed() < timeout,
                "{node} not {} within {timeout:?}: {:?}",
                if alive { "alive" } else { "dead" },
                self.verdicts.borrow()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        start.elapsed()
    }

    /// Checks every 5 ms for `d` that `node` stays alive.
    fn stays_alive(&self, node: &str, d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            assert_eq!(
                self.verdict(node),
                Some(true),
                "{node} after {:?}",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // Closing the targets ends the prober.
        self.targets.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// node-1 and node-2 on one segment.
struct TwoNodes {
    lab: Lab,
    node1: Ns,
    node2: Ns,
    /// node-2's interface on the segment.
    node2_if: String,
}

/// The nodes with these addresses (CIDRs) on the segment.
fn two_nodes(node1_cidrs: &[&str], node2_cidrs: &[&str]) -> TwoNodes {
    let mut lab = Lab::new();
    let seg = lab.add_segment("seg");
    let node1 = lab.add_node("node1");
    let node2 = lab.add_node("node2");
    lab.attach(&node1, &seg, node1_cidrs);
    let node2_if = lab.attach(&node2, &seg, node2_cidrs);
    TwoNodes {
        lab,
        node1,
        node2,
        node2_if,
    }
}

#[test]
fn kernel_answers_without_an_agent_and_a_dead_link_is_seen_within_the_bound() {
    let TwoNodes {
        lab: _lab,
        node1,
        node2,
        node2_if,
    } = two_nodes(
        &["192.168.60.11/24", "fd00:60::11/64"],
        &[&format!("{NODE2_V4}/24"), &format!("{NODE2_V6}/64")],
    );

    // node-2 runs an agent (its ruleset in place) when the probes start.
    let agent = ManifestAgent::new(&node2, "node-2", &["--admin-address", ADMIN]);
    let mut process = agent.spawn(&[]);
    process.wait_ready(
        ADMIN.parse::<SocketAddr>().unwrap(),
        Duration::from_secs(20),
    );

    let prober = Prober::start(
        &node1,
        targets(&[
            ("node-2", &[NODE2_V4]),
            ("node-2-v6", &[NODE2_V6]),
            ("ghost", &[GHOST]),
            SELF[0],
            SELF[1],
        ]),
    );
    // The address nobody answers on is dead: the probes tell, not only the optimistic start.
    let bound = INTERVAL * (MISSES + 1) + SLACK;
    let took = prober.wait("ghost", false, bound);
    eprintln!("unanswered address dead after {took:?}");
    prober.stays_alive("node-2", 5 * INTERVAL);
    prober.stays_alive("node-2-v6", INTERVAL);

    // The agent is killed: node-2's kernel keeps answering, the verdict never changes.
    drop(process.kill());
    prober.stays_alive("node-2", Duration::from_secs(1));
    assert_eq!(prober.verdict("node-2-v6"), Some(true));

    // One node, both families: dead when its link goes down, within the bound.
    prober.targets.as_ref().unwrap().send_replace(targets(&[
        ("node-2", &[NODE2_V4, NODE2_V6]),
        ("ghost", &[GHOST]),
        SELF[0],
        SELF[1],
    ]));
    prober.stays_alive("node-2", 3 * INTERVAL);
    let down = Instant::now();
    node2.run(&["ip", "link", "set", "dev", &node2_if, "down"]);
    prober.wait("node-2", false, bound + Duration::from_secs(1));
    let took = down.elapsed();
    eprintln!(
        "link down: node-2 dead after {took:?} (design bound {:?})",
        INTERVAL * (MISSES + 1)
    );
    assert!(took <= bound, "dead after {took:?}, bound {bound:?}");

    // Back up: alive after `RISES` answered rounds.
    node2.run(&["ip", "link", "set", "dev", &node2_if, "up"]);
    let took = prober.wait("node-2", true, Duration::from_secs(2));
    eprintln!("link up: node-2 alive after {took:?}");
    assert_eq!(prober.verdict("ghost"), Some(false));
}

/// An echo reply (type 0) from nobody's ping: what a flood at the prober's node looks like
/// to a socket that sees every ICMP message (large, so few fill a receive buffer).
fn flood_reply(seq: u16) -> Vec<u8> {
    let mut p = nodeplane::testing::forged_probes::echo_request(0x4242, seq, &[0x5a; 1200]);
    p[0] = 0;
    // Type 8 -> 0 lowers the one's-complement sum by 0x0800: the checksum rises by it.
    let sum = u16::from_be_bytes([p[2], p[3]]).wrapping_add(0x0800);
    p[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

#[test]
fn an_icmp_flood_at_the_probers_node_does_not_make_a_healthy_node_dead() {
    let TwoNodes {
        mut lab,
        node1,
        node2,
        node2_if,
    } = two_nodes(&["192.168.60.11/24"], &[&format!("{NODE2_V4}/24")]);
    let pod = lab.add_pod(&node1, "flooder", &["10.128.0.5"]);

    // node-2 alone: the self-doubt guard (more than half of two or more dead) cannot hide
    // a verdict the flood forced.
    let prober = Prober::start(&node1, targets(&[("node-2", &[NODE2_V4])]));
    prober.wait("node-2", true, Duration::from_secs(5));
    prober.stays_alive("node-2", (MISSES + 2) * INTERVAL);

    // Four flooding threads (more than the cores of a small machine), each sending bursts of
    // 64 echo replies with no pause.
    let burst: Vec<(Ipv4Addr, Vec<u8>)> = (0..64)
        .map(|i| ("10.128.0.5".parse().unwrap(), flood_reply(i)))
        .collect();
    let node1_v4: Ipv4Addr = "192.168.60.11".parse().unwrap();
    let floods: Vec<Forger> = (0..4)
        .map(|_| Forger::start(&pod.ns, node1_v4, burst.clone(), Duration::ZERO))
        .collect();
    let watch = Duration::from_secs(3);
    prober.stays_alive("node-2", watch);
    let sent: u64 = floods.iter().map(Forger::sent).sum();
    eprintln!(
        "flood: {sent} echo replies in {watch:?} ({:.0}/s); node-2 stayed alive",
        sent as f64 / watch.as_secs_f64()
    );
    assert!(sent > 10_000, "the flood sent only {sent} packets");

    // Under the flood, the probes still see node-2's link go down.
    let down = Instant::now();
    node2.run(&["ip", "link", "set", "dev", &node2_if, "down"]);
    let bound = INTERVAL * (MISSES + 1) + SLACK;
    prober.wait("node-2", false, bound + Duration::from_secs(2));
    eprintln!(
        "link down under the flood: node-2 dead after {:?}",
        down.elapsed()
    );
    drop(floods);
}
