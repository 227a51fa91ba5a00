//! The NetworkPolicy guards' drops in `/metrics` (`nodeplane_network_policy_guard_drop_*`,
//! by `reason`) with real packets from a hostile bridged pod (the node of `netpol_bridged`:
//! pods a, b, c on `br0`; a isolated for ingress, only b allowed). `flow_set_full` is
//! checked by `netpol_bridged_attacks`, whose flood fills a port's flow set.

use super::netpol_bridged::{Bridged, br_netfilter, bridged, only};
use super::netpol_bridged_attacks::{link_local, on_link};
use nodeplane::testing::lab::dns::{send_spoofed_udp, send_spoofed_udp6};
use nodeplane::testing::lab::{AgentProcess, DatagramSink, Ns, eventually};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const ADMIN: &str = "127.0.0.1:9942";
/// Generous: a debug build on a busy 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Longer than the counters' read interval (1 s): a count that was going to move has.
const QUIET: Duration = Duration::from_millis(1500);
/// The payload of a forged datagram: what the sink reads as its sequence number.
const FORGED_SEQ: u64 = 0x5f00f;

/// The bridged node with policy `only` (b -> a) and [`counting_agent`].
fn start() -> (Bridged, AgentProcess) {
    let b = bridged();
    b.agent.write("policies.yaml", &only("b", "a"));
    let agent = counting_agent(&b);
    (b, agent)
}

/// The agent of `b` in run mode with the policies written, reading the counters every
/// second; returns once the guards' series are there.
pub fn counting_agent(b: &Bridged) -> AgentProcess {
    let flags = ["--admin-address", ADMIN, "--rule-counters-seconds", "1"];
    let mut agent = b.agent.spawn(&flags);
    agent.wait_ready(admin(), TIMEOUT);
    eventually(TIMEOUT, || {
        guard(&agent, "packets", "source_not_bound")
            .map(|_| ())
            .ok_or("no guard series".to_string())
    });
    agent
}

fn admin() -> SocketAddr {
    ADMIN.parse().unwrap()
}

/// `nodeplane_network_policy_guard_drop_<metric>_total{reason}`.
fn guard(agent: &AgentProcess, metric: &str, reason: &str) -> Option<u64> {
    let name = format!("nodeplane_network_policy_guard_drop_{metric}_total{{reason=\"{reason}\"}}");
    agent.metric(admin(), &name).map(|v| v as u64)
}

/// Packets and bytes of `reason` (0 while not exported).
pub fn guard_counts(agent: &AgentProcess, reason: &str) -> (u64, u64) {
    let p = guard(agent, "packets", reason);
    (p.unwrap_or(0), guard(agent, "bytes", reason).unwrap_or(0))
}

/// The counts of `reason` once they stay the same for a while: other pods' multicast
/// listener reports (IPv6 MLD, sent when an interface comes up) to or from isolated a are
/// dropped and counted as `unlisted_address` too.
fn settled(agent: &AgentProcess, reason: &str) -> (u64, u64) {
    steady(reason, || guard_counts(agent, reason))
}

/// What `read` gives once it stays the same for [`QUIET`]; `what` names it in a failure.
fn steady<T: PartialEq + Copy + std::fmt::Debug>(what: &str, read: impl Fn() -> T) -> T {
    let mut last = read();
    eventually(TIMEOUT, || {
        std::thread::sleep(QUIET);
        let now = read();
        let same = std::mem::replace(&mut last, now) == now;
        same.then_some(now)
            .ok_or(format!("{what} still moving: {now:?}"))
    })
}

/// Waits until the packets and bytes of `reason` are `want`.
#[track_caller]
pub fn wait_for_guard(agent: &AgentProcess, reason: &str, want: (u64, u64)) {
    eventually(TIMEOUT, || {
        let got = guard_counts(agent, reason);
        (got == want)
            .then_some(())
            .ok_or(format!("{reason}: (packets, bytes) {got:?}, want {want:?}"))
    });
}

/// Sends `count` UDP datagrams from `ns` with the forged source `src` to `dst` (a raw
/// socket) carrying [`FORGED_SEQ`]; returns the bytes of one as the kernel counts them
/// (the IP packet).
fn forge(ns: &Ns, src: SocketAddr, dst: SocketAddr, count: u64) -> u64 {
    let payload = FORGED_SEQ.to_be_bytes();
    for _ in 0..count {
        let sent = match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => send_spoofed_udp(ns, s, d, &payload),
            (SocketAddr::V6(s), SocketAddr::V6(d)) => send_spoofed_udp6(ns, s, d, &payload),
            _ => panic!("{src} -> {dst}: mixed families"),
        };
        sent.expect("raw socket (CAP_NET_RAW)");
    }
    let header = if dst.is_ipv4() { 20 } else { 40 };
    (header + 8 + payload.len()) as u64
}

/// Pod c forges UDP datagrams to isolated a with b's address (b may reach a) through a raw
/// socket, IPv4 and IPv6: none arrives, and `source_not_bound` counts exactly those
/// datagrams and their bytes, without `br_netfilter` and with it.
#[test]
fn a_spoofing_bridged_pod_raises_source_not_bound_by_exactly_what_it_sent() {
    let (b, agent) = start();
    let mut want = (0, 0);
    // The forged datagrams are sound: with c's own source they reach b, which no policy
    // isolates.
    for pods in [&b.pods, &b.pods6] {
        let (b_pod, c) = (&pods[1], &pods[2]);
        let dst = SocketAddr::new(b_pod.addr, 5300);
        let sink = DatagramSink::start(&b_pod.ns, dst);
        eventually(Duration::from_secs(10), || {
            forge(&c.ns, SocketAddr::new(c.addr, 40000), dst, 1);
            std::thread::sleep(Duration::from_millis(100));
            let arrived = sink.arrivals().iter().any(|a| a.seq == FORGED_SEQ);
            arrived
                .then_some(())
                .ok_or(format!("forged to {dst}: never arrived"))
        });
    }
    wait_for_guard(&agent, "source_not_bound", want);
    for on in [false, true] {
        br_netfilter(&b.node, on);
        for (pods, count) in [(&b.pods, 7u64), (&b.pods6, 5)] {
            let (a, b_pod, c) = (&pods[0], &pods[1], &pods[2]);
            let dst = SocketAddr::new(a.addr, 5300);
            let sink = DatagramSink::start(&a.ns, dst);
            // b's own datagrams arrive: the path is open and a's neighbours are resolved.
            let since = Instant::now();
            eventually(Duration::from_secs(10), || {
                b_pod.ns.enter(|| {
                    let any = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                    let socket = UdpSocket::bind(any).expect("bind");
                    socket.send_to(b"own", dst).expect("send");
                });
                std::thread::sleep(Duration::from_millis(100));
                (sink.first_from(b_pod.addr, since).map(|_| ())).ok_or(format!(
                    "br_netfilter {on}: b's own datagrams to {dst} never arrived"
                ))
            });
            let bytes = forge(&c.ns, SocketAddr::new(b_pod.addr, 40000), dst, count);
            want = (want.0 + count, want.1 + count * bytes);
            wait_for_guard(&agent, "source_not_bound", want);
            let forged = (sink.arrivals().iter())
                .filter(|a| a.seq == FORGED_SEQ)
                .count();
            assert_eq!(
                forged, 0,
                "br_netfilter {on}: forged datagrams reached {dst}"
            );
        }
    }
    // Each step's count was exact when reached; none comes late.
    std::thread::sleep(QUIET);
    assert_eq!(guard_counts(&agent, "source_not_bound"), want);
}

/// Isolated pod a sends UDP from its IPv6 link-local address (bound to its port, but not
/// an address it lists) to b's link-local address: dropped, and each datagram counted as
/// `unlisted_address`; c, not isolated, reaches b the same way.
#[test]
fn an_isolated_bridged_pod_on_its_link_local_address_raises_unlisted_address() {
    let (b, agent) = start();
    let (a, b_pod, c) = (&b.pods[0].ns, &b.pods[1].ns, &b.pods[2].ns);
    let b_ll = link_local(b_pod);
    let sink = DatagramSink::start(b_pod, "[::]:5301".parse().unwrap());
    let send = |from: &Ns, count: u64| {
        let dst = on_link(from, b_ll, 5301);
        from.enter(|| {
            let socket = UdpSocket::bind("[::]:0").expect("bind");
            for _ in 0..count {
                socket.send_to(b"ll", dst).expect("send");
            }
        });
    };
    for on in [false, true] {
        br_netfilter(&b.node, on);
        let c_ll = IpAddr::V6(link_local(c));
        let since = Instant::now();
        eventually(Duration::from_secs(10), || {
            send(c, 1);
            std::thread::sleep(Duration::from_millis(100));
            (sink.first_from(c_ll, since).map(|_| ())).ok_or(format!(
                "br_netfilter {on}: c -> b link-local never arrived"
            ))
        });
        let before = settled(&agent, "unlisted_address");
        let count = 5;
        send(a, count);
        // An IPv6 header, a UDP header and "ll".
        let want = (before.0 + count, before.1 + count * (40 + 8 + 2));
        wait_for_guard(&agent, "unlisted_address", want);
        std::thread::sleep(QUIET);
        assert_eq!(guard_counts(&agent, "unlisted_address"), want);
        let a_ll = IpAddr::V6(link_local(a));
        let from_a = sink.sources_since(since).get(&a_ll).copied();
        assert_eq!(
            from_a, None,
            "br_netfilter {on}: a's link-local datagrams reached b"
        );
    }
}

/// `nodeplane_network_policy_packets_total` of policy `only`'s allows (0 while not exported).
fn allowed_packets(agent: &AgentProcess) -> u64 {
    let name = "nodeplane_network_policy_packets_total{namespace=\"x\",name=\"only\",\
                direction=\"ingress\",verdict=\"allow\"}";
    agent.metric(admin(), name).map_or(0, |v| v as u64)
}

/// b sends datagrams to isolated a (policy `only` allows b), each from a socket of its own
/// (a new flow each, so each is judged), IPv4 and IPv6, without `br_netfilter` and with it:
/// all arrive, and the policy's `allow` count rises by exactly their number. With
/// `br_netfilter` the inet table's forward hook sees them too, after the bridge table: a
/// packet is judged and counted once, not once per table.
#[test]
fn allowed_bridged_datagrams_count_once_each_with_and_without_br_netfilter() {
    let (b, agent) = start();
    for on in [false, true] {
        br_netfilter(&b.node, on);
        for (pods, count) in [(&b.pods, 3usize), (&b.pods6, 4)] {
            let (a, b_pod) = (&pods[0], &pods[1]);
            let dst = SocketAddr::new(a.addr, 5302);
            let sink = DatagramSink::start(&a.ns, dst);
            let any = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let send = |n: usize| {
                b_pod.ns.enter(|| {
                    for _ in 0..n {
                        let socket = UdpSocket::bind(any).expect("bind");
                        socket.send_to(b"allowed", dst).expect("send");
                    }
                })
            };
            // The path is open and a's neighbours are resolved.
            let warm = Instant::now();
            eventually(Duration::from_secs(10), || {
                send(1);
                std::thread::sleep(Duration::from_millis(100));
                (sink.first_from(b_pod.addr, warm).map(|_| ())).ok_or(format!(
                    "br_netfilter {on}: b's datagrams to {dst} never arrived"
                ))
            });
            let before = steady("allowed packets", || allowed_packets(&agent));
            let since = Instant::now();
            send(count);
            let want = before + count as u64;
            eventually(TIMEOUT, || {
                let got = allowed_packets(&agent);
                (got == want).then_some(()).ok_or(format!(
                    "br_netfilter {on}, {dst}: allowed packets {got}, want {want}"
                ))
            });
            std::thread::sleep(QUIET);
            assert_eq!(
                allowed_packets(&agent),
                want,
                "br_netfilter {on}, {dst}: counted more than once"
            );
            let arrived = sink.sources_since(since).get(&b_pod.addr).copied();
            assert_eq!(arrived, Some(count), "br_netfilter {on}, {dst}");
        }
    }
}
