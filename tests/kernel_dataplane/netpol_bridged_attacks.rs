//! NetworkPolicy against a hostile pod on a bridge (the node of `netpol_bridged`: pods a, b, c
//! on `br0`), with and without `br_netfilter`: a pod can put any source address on its frames
//! and reach its neighbours' addresses that the API does not list (IPv6 link-local, SLAAC);
//! neither may get it past a policy that isolates another pod.

use super::netpol_attacks::{send_from, sink_the_peer_reaches};
use super::netpol_bridged::{Bridged, NODE, br_netfilter, bridged, only};
use super::netpol_guard_metrics::{counting_agent, wait_for_guard};
use nodeplane::testing::lab::{Ns, eventually};
use nodeplane::testing::objects;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

/// a isolated for ingress; b may reach it, and so may two blocks that hold no pod's address
/// (what a spoofer would pick when the policy names one).
const B_AND_BLOCKS_TO_A: &str = "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}, {ipBlock: {cidr: 10.128.5.64/26}}, {ipBlock: {cidr: 'fd01:5::40/122'}}]}]\n";

/// Pod c sends UDP to isolated pod a with b's addresses (bound to b's port) and with addresses
/// of an allowed block that no pod holds (not c's own); none may arrive, with or without
/// `br_netfilter`, while b's own datagrams do. The drops are counted.
#[test]
fn a_bridged_pod_cannot_spoof_a_neighbour_or_an_allowed_block() {
    let b = bridged();
    let policy = objects::network_policy("x", "b-and-blocks", B_AND_BLOCKS_TO_A).to_string();
    b.agent.write("policies.yaml", &policy);
    b.agent.once(&[]);
    // Binding reads back as written: applying again changes nothing.
    let again = b.agent.once_logs();
    assert!(again.contains("nft_ops=0"), "{again}");
    let (a, b_pod, c) = (&b.pods[0], &b.pods[1], &b.pods[2]);
    let cases = [
        (a.addr, b_pod.addr, "10.128.5.77".parse::<IpAddr>().unwrap()),
        (
            b.pods6[0].addr,
            b.pods6[1].addr,
            "fd01:5::77".parse().unwrap(),
        ),
    ];
    for on in [false, true] {
        br_netfilter(&b.node, on);
        for (dst, neighbour, block) in cases {
            let dst = SocketAddr::new(dst, 5300);
            let (sink, since) = sink_the_peer_reaches(&a.ns, dst, (&b_pod.ns, neighbour, "b"));
            for spoofed in [neighbour, block] {
                let before = sink.sources_since(since).get(&spoofed).copied();
                send_from(&c.ns, spoofed, dst);
                // Well past the time a delivered datagram takes.
                std::thread::sleep(Duration::from_millis(300));
                let after = sink.sources_since(since).get(&spoofed).copied();
                assert_eq!(
                    after, before,
                    "br_netfilter {on}: c reached isolated a at {dst} with source {spoofed}"
                );
            }
        }
    }
    let chain = b
        .node
        .nft(&["list", "chain", "bridge", "nodeplane", "np-forward-egress"])
        .unwrap();
    let dropped: u64 = chain
        .lines()
        .filter(|l| l.contains("not bound to the bridge port"))
        .filter_map(|l| {
            l.split("counter packets ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(dropped > 0, "the spoofed frames are counted: {chain}");
    // A pod the API places in the bridge's subnet that no port carries cannot be bound: said.
    let ghost = objects::pod("x", "ghost").on(NODE).ips(&["10.128.5.50"]);
    b.agent.write("ghost.yaml", &ghost.to_string());
    let logs = b.agent.once_logs();
    assert!(
        logs.contains("address 10.128.5.50 of pod x/ghost (bridge br0) is behind no bridge port"),
        "{logs}"
    );
}

/// The IPv6 link-local address of `eth0` in `ns` (once it has passed DAD).
pub fn link_local(ns: &Ns) -> Ipv6Addr {
    eventually(Duration::from_secs(10), || {
        let out = ns
            .exec(&[
                "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link",
            ])
            .map_err(|e| e.to_string())?;
        out.split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .filter(|_| !out.contains("tentative"))
            .and_then(|a| a.split('/').next()?.parse().ok())
            .ok_or(format!("no usable link-local address yet: {out}"))
    })
}

/// `addr` on the link of `eth0` in `from` (the scope a link-local address needs).
pub fn on_link(from: &Ns, addr: Ipv6Addr, port: u16) -> SocketAddr {
    let out = from.run(&["cat", "/sys/class/net/eth0/ifindex"]);
    let index = out.trim().parse().expect("eth0's ifindex");
    SocketAddr::V6(SocketAddrV6::new(addr, port, 0, index))
}

fn reaches(b: &Bridged, from: usize, to: SocketAddr) -> bool {
    b.pods[from]
        .ns
        .tcp_connect(to, Duration::from_secs(1))
        .is_reply()
}

/// a is isolated (only b may reach it). Its server listens on `[::]:80`, so it also answers on
/// its link-local address and on an address the API does not list (`fd01:5::99`, as SLAAC or
/// a second address would be). Neither c nor even b (allowed by a's listed addresses only)
/// may reach it there, with or without `br_netfilter`; c reaches b's link-local address (b is
/// not isolated) and b reaches a's listed address, so neighbour discovery still works.
#[test]
fn an_isolated_bridged_pod_is_isolated_on_every_address() {
    let b = bridged();
    let a_ns = &b.pods[0].ns;
    a_ns.run(&["ip", "addr", "add", "fd01:5::99/64", "dev", "eth0", "nodad"]);
    b.agent.write("policies.yaml", &only("b", "a"));
    b.agent.once(&[]);
    let (a_ll, b_ll) = (link_local(a_ns), link_local(&b.pods[1].ns));
    let unlisted: Ipv6Addr = "fd01:5::99".parse().unwrap();
    let listed = SocketAddr::new(b.pods6[0].addr, 80);
    for on in [false, true] {
        br_netfilter(&b.node, on);
        eventually(Duration::from_secs(10), || {
            let got = (
                reaches(&b, 2, on_link(&b.pods[2].ns, b_ll, 80)),
                reaches(&b, 1, listed),
            );
            (got == (true, true))
                .then_some(())
                .ok_or(format!("c -> b link-local, b -> a listed: {got:?}"))
        });
        for (from, to, what) in [
            (2, on_link(&b.pods[2].ns, a_ll, 80), "c -> a link-local"),
            (1, on_link(&b.pods[1].ns, a_ll, 80), "b -> a link-local"),
            (2, SocketAddr::new(unlisted.into(), 80), "c -> a unlisted"),
        ] {
            assert!(!reaches(&b, from, to), "br_netfilter {on}: {what} ({to})");
        }
    }
}

/// Without `br_netfilter` (the flow set stands in for conntrack): a is isolated both ways,
/// b and c may reach it on every port, a may send nothing but replies. c sends 100,000 UDP
/// datagrams to a's ports, each a new flow the flow set records (an allowed flow with an
/// isolated end); then b opens connections to a, whose answers pass only through the flow
/// set. Flows are bounded per source port, so c fills only its own share: every connection
/// of b succeeds, and c's next flow is dropped, counted in the metrics as `flow_set_full`.
#[test]
fn a_pod_allowed_on_many_ports_cannot_push_out_another_pods_flows() {
    let b = bridged();
    br_netfilter(&b.node, false);
    let spec = "  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Ingress, Egress]\n  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}, {podSelector: {matchLabels: {pod: c}}}]}]\n";
    let policy = objects::network_policy("x", "a-both-ways", spec).to_string();
    b.agent.write("policies.yaml", &policy);
    let agent = counting_agent(&b);
    let a = b.pods[0].addr;
    let before = b.pods[1].ns.tcp_connect((a, 80), Duration::from_secs(5));
    assert!(before.is_reply(), "b -> a before the flood: {before:?}");
    b.pods[2].ns.enter(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        // One source port, 60,000 destination ports: that many flows (two entries each).
        for i in 0..100_000u32 {
            let port = 1024 + (i % 60_000) as u16;
            while socket.send_to(b"x", (a, port)).is_err() {
                std::thread::yield_now();
            }
        }
    });
    let mut failures = Vec::new();
    for i in 0..20 {
        let outcome = b.pods[1].ns.tcp_connect((a, 80), Duration::from_secs(2));
        if !outcome.is_reply() {
            failures.push(format!("#{i}: {outcome:?}"));
            if failures.len() == 3 {
                break;
            }
        }
    }
    assert!(failures.is_empty(), "b -> a after c's flood: {failures:?}");
    // c's flows are where they were recorded: in its port's set, which is full.
    let port = host_port(&b.node, &b.pods[2].ns);
    let set = format!("{}-v4", nodeplane::nft::names::object_name("np-fl", &port));
    let listed = b
        .node
        .nft(&["list", "set", "bridge", "nodeplane", &set])
        .unwrap();
    let entries = listed.matches(" . udp . ").count();
    assert!(entries >= 65_000, "{set} holds {entries} flows of c");
    // A new flow of c no longer fits: it is dropped (and counted), not let through
    // unrecorded, where a's answer would be recorded as a new flow of a's, in a's share.
    let late = b.pods[2].ns.tcp_connect((a, 80), Duration::from_secs(1));
    assert!(!late.is_reply(), "c's flow beyond its share: {late:?}");
    let table = b
        .node
        .nft(&["list", "table", "bridge", "nodeplane"])
        .unwrap();
    let full_drops: Vec<(u64, u64)> = table
        .lines()
        .filter(|l| l.contains("flow set is full"))
        .filter_map(|l| {
            let mut words = l.split("counter packets ").nth(1)?.split(' ');
            let packets = words.next()?.parse().ok()?;
            let bytes = words.nth(1)?.parse().ok()?;
            Some((packets, bytes))
        })
        .collect();
    let full_drops = (full_drops.iter()).fold((0, 0), |(p, b), (dp, db)| (p + dp, b + db));
    assert!(full_drops.0 > 0, "counted: {table}");
    wait_for_guard(&agent, "flow_set_full", full_drops);
}

/// The name of the node's end of the veth whose other end is `eth0` in `pod`.
fn host_port(node: &Ns, pod: &Ns) -> String {
    let link = pod.run(&["ip", "-o", "link", "show", "eth0"]);
    let peer = link
        .split_once("@if")
        .and_then(|(_, rest)| rest.split(':').next())
        .expect("eth0@ifN");
    let out = node.run(&["ip", "-o", "link"]);
    out.lines()
        .find(|l| l.starts_with(&format!("{peer}: ")))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|n| n.split('@').next())
        .expect("the host end")
        .to_string()
}
