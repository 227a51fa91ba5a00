//! NetworkPolicy against a hostile pod, on the cluster of `netpol`: what a pod can send
//! (spoofed sources) must not get it past a policy that isolates another pod.

use super::netpol::{cluster, policy};
use nodeplane::testing::lab::{DatagramSink, Ns, eventually};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// x/a (node-1) isolated for ingress; only x/b (node-1) may reach it.
const ONLY_B_TO_A: &str = "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]\n";

/// Sends a few datagrams from `ns` with source `src` (an address the sender puts on its own
/// loopback, as a hostile pod can: the packet leaves its eth0 carrying that source).
pub fn send_from(ns: &Ns, src: IpAddr, dst: SocketAddr) {
    let prefix = if src.is_ipv4() { "32" } else { "128" };
    let cidr = format!("{src}/{prefix}");
    let mut argv = vec!["ip", "addr", "add", &cidr, "dev", "lo"];
    if src.is_ipv6() {
        argv.push("nodad");
    }
    let _ = ns.exec(&argv); // already there from an earlier call
    ns.enter(|| {
        let socket = UdpSocket::bind(SocketAddr::new(src, 0)).expect("bind the spoofed source");
        for _ in 0..5 {
            socket.send_to(b"spoofed", dst).expect("send");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// A datagram sink at `dst` in `ns`, and when it started, once the allowed peer (`peer`,
/// sending from its own address `src`, called `who`) gets through to it: the sink does listen.
pub fn sink_the_peer_reaches(
    ns: &Ns,
    dst: SocketAddr,
    (peer, src, who): (&Ns, IpAddr, &str),
) -> (DatagramSink, Instant) {
    let sink = DatagramSink::start(ns, dst);
    let since = Instant::now();
    eventually(Duration::from_secs(10), || {
        send_from(peer, src, dst);
        sink.first_from(src, since)
            .map(|_| ())
            .ok_or(format!("{who}'s own datagrams to {dst} never arrived"))
    });
    (sink, since)
}

/// Routed pods, `rp_filter` off on the node (as many nodes have it; IPv6 has no
/// `rp_filter` at all): y/a, on the same node as x/a, and y/b, on the other node, send
/// with x/b's address. Nothing from them may arrive; x/b's own datagrams do.
#[test]
fn a_routed_pod_cannot_spoof_an_allowed_peer() {
    let c = cluster();
    for node in &c.nodes {
        node.sysctl("net.ipv4.conf.all.rp_filter", "0");
        node.sysctl("net.ipv4.conf.default.rp_filter", "0");
        for (_, pod) in &c.pods {
            if pod.node == *node {
                node.sysctl(&format!("net.ipv4.conf.{}.rp_filter", pod.host_iface), "0");
            }
        }
    }
    c.apply(&[policy("x", "only-b", ONLY_B_TO_A)]);
    // The check reads back as written: applying again changes nothing.
    let again = c.agents[0].once_logs();
    assert!(again.contains("nft_ops=0"), "{again}");
    let (x_a, x_b) = (&c.pods[0].1, &c.pods[1].1);
    let attackers = [
        (&c.pods[3].1, "y/a, same node"),
        (&c.pods[4].1, "y/b, other node"),
    ];
    for (src, dst) in [
        (x_b.ip(), x_a.ip()),
        (x_b.ip6().unwrap(), x_a.ip6().unwrap()),
    ] {
        let dst = SocketAddr::new(dst, 5300);
        let (sink, since) = sink_the_peer_reaches(&x_a.ns, dst, (&x_b.ns, src, "x/b"));
        for (attacker, who) in attackers {
            let before = sink.sources_since(since).get(&src).copied().unwrap_or(0);
            send_from(&attacker.ns, src, dst);
            // Wait well past the time a delivered datagram takes.
            std::thread::sleep(Duration::from_millis(500));
            let after = sink.sources_since(since).get(&src).copied().unwrap_or(0);
            assert_eq!(
                after, before,
                "{who} reached isolated x/a at {dst} with x/b's source {src}"
            );
        }
    }
    // The drops are counted.
    let counted = c.nodes[0]
        .nft(&["list", "chain", "inet", "nodeplane", "np-forward-egress"])
        .unwrap();
    assert!(counted.contains("fib saddr . iif oif missing"), "{counted}");
}

/// Routed pods, measured: with x/a isolated (only x/b may reach it), neither y/a (same node)
/// nor x/b reaches x/a's server on its IPv6 link-local address (not on their links: each pod's
/// link is its own veth to the node, which routes and never forwards link-local traffic) nor
/// on an address the API does not list (`fd01::99` on x/a's eth0: the node routes only the
/// listed /128s to a pod's veth). So routed pods need no rule for these; bridged pods do
/// (`netpol_bridged_attacks`).
#[test]
fn a_routed_pods_unlisted_addresses_are_out_of_other_pods_reach() {
    let c = cluster();
    c.apply(&[policy("x", "only-b", ONLY_B_TO_A)]);
    let (x_a, x_b, y_a) = (&c.pods[0].1, &c.pods[1].1, &c.pods[3].1);
    x_a.ns.run(&[
        "ip",
        "addr",
        "add",
        "fd01::99/128",
        "dev",
        &x_a.iface,
        "nodad",
    ]);
    let a_ll = eventually(Duration::from_secs(10), || {
        let out = x_a
            .ns
            .exec(&[
                "ip", "-6", "-o", "addr", "show", "dev", &x_a.iface, "scope", "link",
            ])
            .map_err(|e| e.to_string())?;
        out.split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .filter(|_| !out.contains("tentative"))
            .and_then(|a| a.split('/').next()?.parse::<std::net::Ipv6Addr>().ok())
            .ok_or(format!("no usable link-local address yet: {out}"))
    });
    // x/b reaches x/a on its listed address: the path works.
    let listed = SocketAddr::new(x_a.ip6().unwrap(), 80);
    assert!(
        x_b.ns
            .tcp_connect(listed, Duration::from_secs(5))
            .is_reply()
    );
    for (client, who) in [(y_a, "y/a"), (x_b, "x/b")] {
        let index = client
            .ns
            .run(&["cat", &format!("/sys/class/net/{}/ifindex", client.iface)]);
        let index = index.trim().parse().expect("ifindex");
        let ll = SocketAddr::V6(std::net::SocketAddrV6::new(a_ll, 80, 0, index));
        let unlisted = SocketAddr::new("fd01::99".parse().unwrap(), 80);
        for to in [ll, unlisted] {
            let got = client.ns.tcp_connect(to, Duration::from_secs(1));
            assert!(!got.is_reply(), "{who} reached x/a at {to}: {got:?}");
        }
    }
}

/// Sends `n` datagrams from `ns` to `dst` on a socket that marks its packets with `mark`
/// (`SO_MARK`, which a pod's root can set: it has `CAP_NET_ADMIN` in its own namespace).
fn send_marked(ns: &Ns, mark: u32, dst: SocketAddr, n: usize) {
    use socket2::{Domain, Socket, Type};
    ns.enter(|| {
        let socket = Socket::new(Domain::for_address(dst), Type::DGRAM, None).expect("socket");
        socket.set_mark(mark).expect("SO_MARK");
        for _ in 0..n {
            socket.send_to(b"marked", &dst.into()).expect("send");
        }
    });
}

/// The packets `ns` sent to UDP port `port` carrying `bit`, counted by a table of the test's
/// own on the pod's output hook (created on first use).
fn marked_sent(ns: &Ns, bit: u32, port: u16) -> u64 {
    let rules = format!(
        "table inet attacker {{\n  chain out {{\n    type filter hook output priority 0;\n    \
         udp dport {port} meta mark & {bit:#x} == {bit:#x} counter\n  }}\n}}\n"
    );
    if ns.nft(&["list", "table", "inet", "attacker"]).is_err() {
        ns.exec_stdin(&["nft", "-f", "-"], &rules).expect("nft -f");
    }
    let listed = ns.nft(&["list", "table", "inet", "attacker"]).unwrap();
    let count = listed
        .split("packets ")
        .nth(1)
        .and_then(|r| r.split(' ').next());
    count.and_then(|n| n.parse().ok()).expect("the counter")
}

/// Routed pods: y/a (same node as x/a, not allowed by policy `only-b`) marks its datagrams
/// to isolated x/a with the bit by which the bridge table tells the inet table it judged a
/// packet (`BRIDGE_JUDGED`). The mark does not leave the pod: a packet crossing the veth
/// into the node's namespace has its mark cleared, so the inet table judges it, and drops
/// it, IPv4 and IPv6. Control: the same bit set on y/a's packets in the node (a test table
/// on prerouting) would let them through, so the veth's clearing is what this proves.
#[test]
fn a_routed_pod_cannot_mark_its_packets_past_network_policy() {
    use nodeplane::plan::netpol::BRIDGE_JUDGED;
    let c = cluster();
    c.apply(&[policy("x", "only-b", ONLY_B_TO_A)]);
    let (x_a, x_b, y_a) = (&c.pods[0].1, &c.pods[1].1, &c.pods[3].1);
    let port = 5303;
    for (dst, from_b, from_y) in [
        (x_a.ip(), x_b.ip(), y_a.ip()),
        (x_a.ip6().unwrap(), x_b.ip6().unwrap(), y_a.ip6().unwrap()),
    ] {
        let dst = SocketAddr::new(dst, port);
        let sink = DatagramSink::start(&x_a.ns, dst);
        let since = Instant::now();
        // The allowed peer gets through (so the sink does listen).
        eventually(Duration::from_secs(10), || {
            send_marked(&x_b.ns, 0, dst, 1);
            std::thread::sleep(Duration::from_millis(100));
            (sink.first_from(from_b, since).map(|_| ()))
                .ok_or(format!("x/b's datagrams to {dst} never arrived"))
        });
        let sent = marked_sent(&y_a.ns, BRIDGE_JUDGED, port);
        send_marked(&y_a.ns, BRIDGE_JUDGED, dst, 5);
        let sent = marked_sent(&y_a.ns, BRIDGE_JUDGED, port) - sent;
        assert_eq!(sent, 5, "y/a's datagrams left without the mark");
        // Wait well past the time a delivered datagram takes.
        std::thread::sleep(Duration::from_millis(500));
        let got = sink.sources_since(since).get(&from_y).copied();
        assert_eq!(
            got, None,
            "marked datagrams of y/a reached isolated x/a at {dst}"
        );
    }
    // Control: the bit set in the node (where no pod can set it) is what the inet table's
    // NetworkPolicy chains skip.
    let control = format!(
        "table inet control {{\n  chain pre {{\n    type filter hook prerouting priority -300;\n    \
         iifname \"{}\" meta mark set meta mark | {BRIDGE_JUDGED:#x}\n  }}\n}}\n",
        y_a.host_iface
    );
    c.nodes[0]
        .exec_stdin(&["nft", "-f", "-"], &control)
        .expect("nft -f");
    let dst = SocketAddr::new(x_a.ip(), port);
    let sink = DatagramSink::start(&x_a.ns, dst);
    let since = Instant::now();
    eventually(Duration::from_secs(10), || {
        send_marked(&y_a.ns, 0, dst, 1);
        std::thread::sleep(Duration::from_millis(100));
        (sink.first_from(y_a.ip(), since).map(|_| ())).ok_or(format!(
            "control: y/a marked in the node never reached {dst}"
        ))
    });
    c.nodes[0].run(&["nft", "delete", "table", "inet", "control"]);
}
