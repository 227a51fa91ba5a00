//! Per-rule counters in `/metrics` with real packets: an allowed and a denied EgressFirewall
//! rule, a NetworkPolicy's allow and deny, and EgressQoS rules, each counted exactly.
//!
//! Node `node-1` forwards for pods `a1`, `a2` (namespace `alpha`) and `b1` (namespace
//! `beta`); the external host owns 203.0.113.10 and 203.0.113.20. Traffic is UDP datagrams
//! of 100 bytes (128-byte IPv4 packets) to sinks that never reply: a flow without a reply is
//! not established, so every datagram is judged by the rules and counted.

use nodeplane::config::DEFAULT_ADMIN_ADDRESS as ADMIN;
use nodeplane::testing::lab::{DatagramSink, NODE, NodeLab, Ns, Pod, eventually};
use nodeplane::testing::objects;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

const ALLOWED: &str = "203.0.113.10:7000";
const DENIED: &str = "203.0.113.20:7000";
const A2_PORT: &str = "10.128.0.6:9000";
/// An IPv4 header, a UDP header and the payload.
const PACKET_BYTES: u64 = 20 + 8 + 100;
/// Generous: a debug build on a busy 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(60);

const FIREWALL: &str = "[\
    {type: Allow, to: {cidrSelector: 203.0.113.10/32}}, \
    {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";

/// Every pod of `alpha` takes UDP 9000 from the pods of `alpha` only.
const POLICY: &str = "  podSelector: {}\n  ingress:\n  \
    - from: [{podSelector: {}}]\n    ports: [{protocol: UDP, port: 9000}]\n";

struct Topo {
    a1: Pod,
    b1: Pod,
    sinks: Vec<DatagramSink>,
    site: NodeLab,
}

/// The lab and the pods, no policy objects yet.
fn pods_only() -> Topo {
    let flags = [
        "--cluster-cidr",
        "10.128.0.0/14",
        "--admin-address",
        ADMIN,
        "--rule-counters-seconds",
        "1",
    ];
    let hosts = ["203.0.113.10", "203.0.113.20"];
    let mut site = NodeLab::new(&flags).with_hosts(&hosts, &["203.0.113.0/24"]);
    let a1 = site.pod("a1", &["10.128.0.5"]);
    let a2 = site.pod("a2", &["10.128.0.6"]);
    let b1 = site.pod("b1", &["10.128.0.7"]);
    let sinks = vec![
        DatagramSink::start(&site.ext, addr(ALLOWED)),
        DatagramSink::start(&site.ext, addr(DENIED)),
        DatagramSink::start(&a2.ns, addr(A2_PORT)),
    ];
    let pods = [
        a1.manifest("alpha", "a1", NODE),
        a2.manifest("alpha", "a2", NODE),
        b1.manifest("beta", "b1", NODE),
    ];
    site.agent.write("pods.yaml", &pods.join("---\n"));
    Topo {
        a1,
        b1,
        sinks,
        site,
    }
}

/// The pods, alpha's EgressFirewall and its policy `udp-9000`.
fn topo() -> Topo {
    let t = pods_only();
    let firewall = objects::egress_firewall("alpha", FIREWALL);
    t.site.agent.write("fw.yaml", &firewall.to_string());
    let policy = objects::network_policy("alpha", "udp-9000", POLICY);
    t.site.agent.write("np.yaml", &policy.to_string());
    t
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Sends `n` datagrams of 100 bytes from one socket of `pod` to `dst`.
fn send(pod: &Pod, dst: &str, n: usize) {
    let dst = addr(dst);
    pod.ns.enter(|| {
        let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
        for _ in 0..n {
            // A drop in forward is silent for the sender: every send succeeds.
            socket.send_to(&[0u8; 100], dst).expect("send");
        }
    });
}

/// The metrics of the EgressFirewall and NetworkPolicy series (after `nodeplane_`).
const FIREWALL_AND_POLICY: [&str; 2] = ["egress_firewall_rule_", "network_policy_"];

/// The `/metrics` lines of the per-rule series of `metrics` (prefixes after `nodeplane_`),
/// sorted.
fn rule_series(node: &Ns, metrics: &[&str]) -> Vec<String> {
    let (code, body) = node
        .http_get(addr(ADMIN), "/metrics", Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(code, 200, "{body}");
    let mut lines: Vec<String> = (body.lines())
        .filter(|l| (metrics.iter()).any(|m| l.starts_with(&format!("nodeplane_{m}"))))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

fn firewall(metric: &str, rule: u32, n: u64) -> String {
    format!(
        "nodeplane_egress_firewall_rule_{metric}_total{{namespace=\"alpha\",name=\"default\",rule=\"{rule}\"}} {n}"
    )
}

fn policy(metric: &str, verdict: &str, n: u64) -> String {
    format!(
        "nodeplane_network_policy_{metric}_total{{namespace=\"alpha\",name=\"udp-9000\",direction=\"ingress\",verdict=\"{verdict}\"}} {n}"
    )
}

/// Waits until the per-rule series of `metrics` are exactly `want`.
#[track_caller]
fn wait_for_series(t: &Topo, metrics: &[&str], want: Vec<String>) {
    let mut want = want;
    want.sort();
    eventually(TIMEOUT, || {
        let got = rule_series(&t.site.node, metrics);
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "series:\n{}\nwant:\n{}",
                got.join("\n"),
                want.join("\n")
            ))
        }
    });
}

/// Exact counts: each allowed and denied EgressFirewall rule, and the policy's allow and
/// deny, say how many packets and bytes they decided; the series go with their object.
#[test]
fn metrics_count_each_rules_packets_exactly() {
    let t = topo();
    let mut agent = t.site.agent.spawn(&[]);
    agent.wait_ready(addr(ADMIN), TIMEOUT);
    let expected = |fw: [u64; 2], np: [u64; 2]| {
        let mut lines = Vec::new();
        for (rule, n) in fw.into_iter().enumerate() {
            lines.push(firewall("packets", rule as u32, n));
            lines.push(firewall("bytes", rule as u32, n * PACKET_BYTES));
        }
        for (verdict, n) in ["allow", "deny"].into_iter().zip(np) {
            lines.push(policy("packets", verdict, n));
            lines.push(policy("bytes", verdict, n * PACKET_BYTES));
        }
        // The guards' node-wide series exist while a policy is in force; routed pods meet
        // none of them.
        for reason in ["flow_set_full", "source_not_bound", "unlisted_address"] {
            for metric in ["packets", "bytes"] {
                lines.push(format!(
                    "nodeplane_network_policy_guard_drop_{metric}_total{{reason=\"{reason}\"}} 0"
                ));
            }
        }
        lines
    };
    // Every rule's series is there at 0 before any packet.
    wait_for_series(&t, &FIREWALL_AND_POLICY, expected([0, 0], [0, 0]));
    send(&t.a1, ALLOWED, 3);
    send(&t.a1, DENIED, 5);
    send(&t.a1, A2_PORT, 4);
    send(&t.b1, A2_PORT, 2);
    wait_for_series(&t, &FIREWALL_AND_POLICY, expected([3, 5], [4, 2]));
    // The packets did what the rules say (the counters count decisions, not attempts).
    let sinks = &t.sinks;
    let from = |sink: &DatagramSink, pod: &Pod| {
        (sink.arrivals().iter())
            .filter(|a| a.src == pod.ip())
            .count()
    };
    assert_eq!([from(&sinks[0], &t.a1), from(&sinks[1], &t.a1)], [3, 0]);
    assert_eq!([from(&sinks[2], &t.a1), from(&sinks[2], &t.b1)], [4, 0]);
    // A deleted policy's series disappear; the firewall's stay as they were.
    std::fs::remove_file(t.site.agent.dir().join("np.yaml")).unwrap();
    let fw_only: Vec<String> = expected([3, 5], [0, 0])
        .into_iter()
        .filter(|l| l.contains("egress_firewall"))
        .collect();
    wait_for_series(&t, &FIREWALL_AND_POLICY, fw_only);
    drop(agent);
}

/// alpha's EgressQoS: DSCP 46 to the first host, DSCP 10 for everything else its pods send.
const QOS: &str = "[{dscp: 46, dstCIDR: 203.0.113.10/32}, {dscp: 10}]";

fn qos(metric: &str, rule: u32, n: u64) -> String {
    format!(
        "nodeplane_egress_qos_rule_{metric}_total{{namespace=\"alpha\",name=\"default\",rule=\"{rule}\"}} {n}"
    )
}

/// Exact counts of EgressQoS rules: every packet of a pod of the namespace is marked (not
/// only a connection's first), by the first rule that matches; other namespaces' packets
/// count nowhere.
#[test]
fn metrics_count_each_egress_qos_rules_packets_exactly() {
    let t = pods_only();
    t.site
        .agent
        .write("qos.yaml", &objects::egress_qos("alpha", QOS).to_string());
    let mut agent = t.site.agent.spawn(&[]);
    agent.wait_ready(addr(ADMIN), TIMEOUT);
    let expected = |n: [u64; 2]| {
        let mut lines = Vec::new();
        for (rule, n) in n.into_iter().enumerate() {
            lines.push(qos("packets", rule as u32, n));
            lines.push(qos("bytes", rule as u32, n * PACKET_BYTES));
        }
        lines
    };
    let metrics = ["egress_qos_rule_"];
    wait_for_series(&t, &metrics, expected([0, 0]));
    send(&t.a1, ALLOWED, 3);
    send(&t.a1, DENIED, 5);
    send(&t.a1, A2_PORT, 4);
    send(&t.b1, ALLOWED, 2);
    wait_for_series(&t, &metrics, expected([3, 9]));
    // Delivered: nothing here drops (no firewall, no policy).
    let from = |sink: &DatagramSink, pod: &Pod| {
        (sink.arrivals().iter())
            .filter(|a| a.src == pod.ip())
            .count()
    };
    let sinks = &t.sinks;
    let got = [
        from(&sinks[0], &t.a1),
        from(&sinks[1], &t.a1),
        from(&sinks[2], &t.a1),
        from(&sinks[0], &t.b1),
    ];
    assert_eq!(got, [3, 5, 4, 2]);
    drop(agent);
}
