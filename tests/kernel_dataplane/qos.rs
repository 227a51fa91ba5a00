//! EgressQoS against the kernel with real packets: pods behind a node netns send UDP to an
//! external host whose server reports the TOS / traffic class byte it received.
//!
//! Pods (node `node-1`): `voip` (app=voip) and `web` (app=web) in namespace `voice`, `plain`
//! in namespace `plain`. The external host owns 203.0.113.10, 198.51.100.10,
//! 2001:db8:1::10 and 2001:db8:2::10 (on lo) behind 192.168.1.100 / fd00:1::100.

use nodeplane::nft::names::object_name;
use nodeplane::testing::lab::{NODE, NodeLab, Ns, Pod, SECOND, wait_for};
use nodeplane::testing::listing;
use nodeplane::testing::objects;

const IN_CIDR: &str = "203.0.113.10:9000";
const OUT_CIDR: &str = "198.51.100.10:9000";
const IN_CIDR6: &str = "[2001:db8:1::10]:9000";
const OUT_CIDR6: &str = "[2001:db8:2::10]:9000";
/// The external host's address on the link to the node.
const LINK: &str = "192.168.1.100:9000";
/// ECN field values (RFC 3168).
const ECT0: u8 = 0b10;
const CE: u8 = 0b11;

struct Topo {
    voip: Pod,
    web: Pod,
    plain: Pod,
    site: NodeLab,
}

fn topo() -> Topo {
    let hosts = [
        "203.0.113.10",
        "198.51.100.10",
        "2001:db8:1::10",
        "2001:db8:2::10",
    ];
    let prefixes = ["203.0.113.0/24", "198.51.100.0/24", "2001:db8::/32"];
    let mut site = NodeLab::new(&[]).with_hosts(&hosts, &prefixes);
    let voip = site.pod("voip", &["10.128.0.5", "fd01::5"]);
    let web = site.pod("web", &["10.128.0.6", "fd01::6"]);
    let plain = site.pod("plain", &["10.128.0.7", "fd01::7"]);
    // One server per address: a wildcard-bound UDP socket would answer from the address of
    // the route back (192.168.1.100), which the pod's connected socket does not accept.
    site.servers = [
        IN_CIDR,
        OUT_CIDR,
        IN_CIDR6,
        OUT_CIDR6,
        LINK,
        "203.0.113.10:5060",
        "[2001:db8:1::10]:5060",
    ]
    .map(|addr| site.ext.udp_server(addr, "ext"))
    .into();
    Topo {
        voip,
        web,
        plain,
        site,
    }
}

fn pod_doc(ns: &str, name: &str, app: &str, pod: &Pod) -> String {
    let pod_doc = objects::pod(ns, name).on(NODE).labels(&[("app", app)]);
    pod_doc.ips(&pod.addrs).to_string()
}

impl Topo {
    /// Writes the pods (with these `app` labels for voip and web) and the `voice` object.
    fn write(&self, voip_app: &str, web_app: &str, voice_rules: &str) {
        let pods = [
            pod_doc("voice", "voip", voip_app, &self.voip),
            pod_doc("voice", "web", web_app, &self.web),
            pod_doc("plain", "plain", "voip", &self.plain),
        ];
        self.site.agent.write("pods.yaml", &pods.join("---\n"));
        self.site.agent.write(
            "qos-voice.yaml",
            &objects::egress_qos("voice", voice_rules).to_string(),
        );
    }
}

/// The topology with the pods at their own `app` labels and `voice_rules` applied by
/// `--once`.
fn applied(voice_rules: &str) -> Topo {
    let t = topo();
    t.write("voip", "web", voice_rules);
    t.site.agent.once(&[]);
    t
}

/// The TOS byte the external server saw for a datagram from `from` sent with `tos`.
#[track_caller]
fn tos_seen(from: &Pod, dst: &str, tos: u8) -> u8 {
    let reply = from.ns.udp_exchange_tos(dst, tos, SECOND).expect_reply();
    reply.tos.expect("server reports the TOS it received")
}

/// The DSCP the external server saw for a datagram sent with TOS 0.
#[track_caller]
fn dscp_seen(from: &Pod, dst: &str) -> u8 {
    tos_seen(from, dst, 0) >> 2
}

fn chain(ns: &str) -> String {
    object_name("qos", ns)
}

/// `(rule handle, packets)` of each rule of a chain, from `nft -a list chain`.
fn rule_handles_and_packets(node: &Ns, chain: &str) -> Vec<(u64, u64)> {
    let out = node
        .nft(&["-a", "list", "chain", "inet", "nodeplane", chain])
        .unwrap_or_else(|e| panic!("list chain {chain}: {e}"));
    let number_after = |line: &str, word: &str| -> Option<u64> {
        let mut it = line.split_whitespace().skip_while(|w| *w != word);
        it.nth(1)?.parse().ok()
    };
    out.lines()
        .filter(|l| l.contains("dscp set"))
        .map(|l| {
            let handle = number_after(l, "handle").expect("rule handle");
            (handle, number_after(l, "packets").expect("counter"))
        })
        .collect()
}

#[test]
fn dst_cidr_rule_marks_only_packets_to_that_cidr_and_counts_them() {
    let t = applied("[{dscp: 46, dstCIDR: 203.0.113.0/24}]");
    assert_eq!(dscp_seen(&t.voip, IN_CIDR), 46);
    assert_eq!(dscp_seen(&t.web, IN_CIDR), 46);
    assert_eq!(dscp_seen(&t.voip, OUT_CIDR), 0);
    assert_eq!(dscp_seen(&t.voip, LINK), 0);
    // An IPv4 rule leaves IPv6 alone.
    assert_eq!(dscp_seen(&t.voip, IN_CIDR6), 0);
    let counted = rule_handles_and_packets(&t.site.node, &chain("voice"));
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert!(
        counted[0].1 >= 2,
        "the rule's counter shows its hits: {counted:?}"
    );
}

#[test]
fn of_two_overlapping_rules_the_first_wins() {
    let t = applied(
        "[{dscp: 20, dstCIDR: 203.0.0.0/16}, {dscp: 10, dstCIDR: 203.0.113.0/24}, {dscp: 30}]",
    );
    // The narrower second rule also matches, but the first one decides.
    assert_eq!(dscp_seen(&t.voip, IN_CIDR), 20);
    assert_eq!(dscp_seen(&t.voip, OUT_CIDR), 30);
    assert_eq!(dscp_seen(&t.voip, OUT_CIDR6), 30);
}

#[test]
fn ipv6_rules_mark_ipv6_traffic() {
    let t = applied(
        "[{dscp: 34, dstCIDR: '2001:db8:1::/64'}, {dscp: 8, podSelector: {matchLabels: {app: voip}}}]",
    );
    assert_eq!(dscp_seen(&t.voip, IN_CIDR6), 34);
    assert_eq!(dscp_seen(&t.web, IN_CIDR6), 34);
    assert_eq!(dscp_seen(&t.voip, OUT_CIDR6), 8);
    assert_eq!(dscp_seen(&t.web, OUT_CIDR6), 0);
    assert_eq!(
        dscp_seen(&t.voip, IN_CIDR),
        8,
        "the v6 CIDR rule does not apply to IPv4"
    );
}

#[test]
fn ecn_bits_set_by_the_sender_survive_the_marking() {
    let t = applied("[{dscp: 46}]");
    for dst in [IN_CIDR, IN_CIDR6] {
        for ecn in [0, ECT0, CE] {
            let sent = 10 << 2 | ecn;
            assert_eq!(
                tos_seen(&t.voip, dst, sent),
                46 << 2 | ecn,
                "to {dst}, sent {sent:#x}"
            );
        }
    }
}

#[test]
fn a_namespace_without_egress_qos_is_untouched() {
    let t = applied("[{dscp: 46}]");
    for dst in [IN_CIDR, IN_CIDR6] {
        // The sender's own DSCP and ECN go through unchanged, zero included.
        assert_eq!(tos_seen(&t.plain, dst, 10 << 2 | ECT0), 10 << 2 | ECT0);
        assert_eq!(tos_seen(&t.plain, dst, 0), 0);
        assert_eq!(dscp_seen(&t.voip, dst), 46);
    }
}

#[test]
fn ports_extension_marks_only_the_listed_ports() {
    let t = applied(
        "[{dscp: 46, ports: [{protocol: UDP, port: 5060}]}, {dscp: 8, ports: [{protocol: TCP, port: 9000}]}]",
    );
    for (sip, other) in [
        ("203.0.113.10:5060", IN_CIDR),
        ("[2001:db8:1::10]:5060", IN_CIDR6),
    ] {
        assert_eq!(dscp_seen(&t.voip, sip), 46);
        // UDP 9000: the TCP 9000 rule does not apply.
        assert_eq!(dscp_seen(&t.voip, other), 0);
    }
}

#[test]
fn pod_selector_marks_only_selected_pods_and_relabelling_moves_them_by_element_updates() {
    let t = topo();
    let rules = "[{dscp: 46, podSelector: {matchLabels: {app: voip}}}, \
                 {dscp: 10, podSelector: {matchExpressions: [{key: app, operator: In, values: [web]}]}}]";
    t.write("voip", "web", rules);
    let agent = t.site.agent.spawn(&[]);
    let marks = |dst| (dscp_seen(&t.voip, dst), dscp_seen(&t.web, dst));
    for dst in [IN_CIDR, IN_CIDR6] {
        wait_for(10, (46, 10), || marks(dst));
    }
    let before = rule_handles_and_packets(&t.site.node, &chain("voice"));

    // Swap the labels: the pods swap marks, and the chain's rules stay the same kernel objects.
    t.write("web", "voip", rules);
    for dst in [IN_CIDR, IN_CIDR6] {
        wait_for(5, (10, 46), || marks(dst));
    }
    let after = rule_handles_and_packets(&t.site.node, &chain("voice"));
    let handles = |v: &[(u64, u64)]| v.iter().map(|h| h.0).collect::<Vec<_>>();
    assert_eq!(handles(&after), handles(&before), "chain was rewritten");
    // A label no rule selects: unmarked.
    t.write("db", "voip", rules);
    wait_for(5, (0, 46), || marks(IN_CIDR));
    agent.stop_ok();
}

#[test]
fn an_invalid_update_keeps_the_previous_marks_and_reports_the_reason() {
    let t = topo();
    t.write("voip", "web", "[{dscp: 46}]");
    t.site.agent.write(
        "qos-plain.yaml",
        &objects::egress_qos("plain", "[{dscp: 12}]").to_string(),
    );
    let agent = t.site.agent.spawn(&[]);
    let marks = || (dscp_seen(&t.voip, IN_CIDR), dscp_seen(&t.plain, IN_CIDR));
    wait_for(10, (46, 12), marks);

    t.write("voip", "web", "[{dscp: 99}]");
    // The other namespace changes at the same time and is applied.
    t.site.agent.write(
        "qos-plain.yaml",
        &objects::egress_qos("plain", "[{dscp: 14}]").to_string(),
    );
    let reason = "EgressQoS voice/default: EgressQoS Rules not correctly applied: \
                  spec.egress[0].dscp: dscp 99 out of range 0-63";
    wait_for(5, true, || agent.logs().contains(reason));
    wait_for(5, (46, 14), marks);
    for dst in [IN_CIDR, IN_CIDR6] {
        assert_eq!(dscp_seen(&t.voip, dst), 46, "previous marks stay");
        assert_eq!(dscp_seen(&t.web, dst), 46);
    }

    // Fixing the object applies it.
    t.write("voip", "web", "[{dscp: 20}]");
    wait_for(5, (20, 14), marks);
    let logs = agent.stop_ok();
    assert!(
        logs.contains("EgressQoS voice/default: EgressQoS Rules applied"),
        "{logs}"
    );
}

#[test]
fn marks_survive_later_snat_and_dst_cidr_sees_the_dnat_destination() {
    let t = applied("[{dscp: 46, dstCIDR: 203.0.113.0/24}]");
    // Someone else's NAT on the node: a DNAT of 192.0.2.80:80 to the external server, and
    // masquerade of all pod traffic leaving through eth0 (as EgressIP/services would do).
    let foreign = "table ip foreign {
        chain pre { type nat hook prerouting priority -100; udp dport 80 ip daddr 192.0.2.80 dnat to 203.0.113.10:9000; }
        chain post { type nat hook postrouting priority 100; oifname \"eth0\" ip saddr 10.128.0.0/14 masquerade; }
    }";
    t.site
        .node
        .exec_stdin(&["nft", "-f", "-"], foreign)
        .expect("foreign NAT table");
    let reply = t.voip.ns.udp_exchange(IN_CIDR, SECOND).expect_reply();
    assert_eq!(
        (reply.src_ip().to_string(), reply.dscp()),
        ("192.168.1.1".into(), Some(46))
    );
    let reply = t
        .voip
        .ns
        .udp_exchange("192.0.2.80:80", SECOND)
        .expect_reply();
    assert_eq!(
        (reply.src_ip().to_string(), reply.dscp()),
        ("192.168.1.1".into(), Some(46))
    );
    let reply = t.voip.ns.udp_exchange(OUT_CIDR, SECOND).expect_reply();
    assert_eq!(
        (reply.src_ip().to_string(), reply.dscp()),
        ("192.168.1.1".into(), Some(0))
    );
}

#[test]
fn once_applies_exactly_what_dry_run_printed() {
    let mut t = topo();
    t.write(
        "voip",
        "web",
        "[{dscp: 46, dstCIDR: 203.0.113.10/32, podSelector: {matchLabels: {app: voip}}}, \
          {dscp: 40, dstCIDR: '2001:db8:1::10/128', ports: [{protocol: UDP, port: 5060}]}, \
          {dscp: 26, ports: [{protocol: SCTP, port: 9}, {protocol: TCP, port: 443}, {protocol: UDP, port: 443}]}, \
          {dscp: 18, dstCIDR: 10.0.0.0/9, podSelector: {matchExpressions: [{key: app, operator: NotIn, values: [db]}]}}, \
          {dscp: 1, dstCIDR: '::/0'}, {dscp: 0}]",
    );
    t.site.agent.write(
        "qos-plain.yaml",
        &objects::egress_qos("plain", "[{dscp: 63, podSelector: {}}]").to_string(),
    );
    let reference = t.site.once_applies_the_dry_run();
    assert_eq!(
        listing::bytecode(&t.site.node, "nodeplane"),
        listing::bytecode(&reference, "nodeplane")
    );
    assert_eq!(
        rule_handles_and_packets(&t.site.node, &chain("voice")).len(),
        8
    );
    assert_eq!(dscp_seen(&t.voip, IN_CIDR), 46);
    assert_eq!(dscp_seen(&t.web, IN_CIDR), 0);
    assert_eq!(dscp_seen(&t.web, "[2001:db8:1::10]:5060"), 40);
    assert_eq!(dscp_seen(&t.plain, IN_CIDR6), 63);
}
