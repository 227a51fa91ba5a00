//! EgressFirewall against the kernel with real packets.
//!
//! Node `node-1` forwards for pods `a1`, `a2` (namespace `alpha`) and `b1` (namespace
//! `beta`). The external host owns 203.0.113.10, 203.0.113.20, 2001:db8:1::10 and
//! 2001:db8:2::10 (on lo) behind 192.168.1.100 / fd00:1::100, with TCP servers on ports 80
//! and 443 and UDP servers on 443 of each, and (in the DNS test) a DNS server on
//! 192.168.1.100:53 that the agent in the node netns queries.

use nodeplane::nft::names::object_name;
use nodeplane::testing::lab::{NODE, NodeLab, Ns, Pod, SECOND, wait_for};
use nodeplane::testing::listing;
use nodeplane::testing::objects;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const H10: &str = "203.0.113.10";
const H20: &str = "203.0.113.20";
const H10_6: &str = "2001:db8:1::10";
const H20_6: &str = "2001:db8:2::10";
/// How long a probe that should be dropped waits.
const SHORT: Duration = Duration::from_millis(400);

struct Topo {
    a1: Pod,
    a2: Pod,
    b1: Pod,
    site: NodeLab,
}

fn topo() -> Topo {
    let flags = ["--cluster-cidr", "10.128.0.0/14,fd01::/48"];
    let hosts = [H10, H20, H10_6, H20_6];
    let mut site = NodeLab::new(&flags).with_hosts(&hosts, &["203.0.113.0/24", "2001:db8::/32"]);
    let a1 = site.pod("a1", &["10.128.0.5", "fd01::5"]);
    let a2 = site.pod("a2", &["10.128.0.6", "fd01::6"]);
    let b1 = site.pod("b1", &["10.128.0.7", "fd01::7"]);
    for host in [H10, H20, &format!("[{H10_6}]"), &format!("[{H20_6}]")] {
        for port in [80, 443] {
            site.servers
                .push(site.ext.tcp_server(format!("{host}:{port}"), "ext"));
        }
        site.servers
            .push(site.ext.udp_server(format!("{host}:443"), "ext"));
    }
    // Pod-to-pod: a server in a2.
    site.servers.push(a2.ns.tcp_server("10.128.0.6:8080", "a2"));
    site.servers.push(a2.ns.tcp_server("[fd01::6]:8080", "a2"));
    Topo { a1, a2, b1, site }
}

fn pod_doc(ns: &str, name: &str, pod: &Pod) -> String {
    pod.manifest(ns, name, NODE)
}

impl Topo {
    fn write_pods(&self) {
        let pods = [
            pod_doc("alpha", "a1", &self.a1),
            pod_doc("alpha", "a2", &self.a2),
            pod_doc("beta", "b1", &self.b1),
        ];
        self.site.agent.write("pods.yaml", &pods.join("---\n"));
    }

    /// Writes the pods and the `alpha` firewall.
    fn write(&self, alpha_rules: &str) {
        self.write_pods();
        self.site.agent.write(
            "fw-alpha.yaml",
            &objects::egress_firewall("alpha", alpha_rules).to_string(),
        );
    }
}

/// True if a TCP connection from `pod` to `dst` gets the server's reply.
fn tcp_ok(pod: &Pod, dst: &str) -> bool {
    let timeout = SHORT.max(Duration::from_millis(1));
    pod.ns.tcp_connect(dst, timeout).is_reply()
}

fn v6(addr: &str, port: u16) -> String {
    format!("[{addr}]:{port}")
}

fn v4(addr: &str, port: u16) -> String {
    format!("{addr}:{port}")
}

fn chain(ns: &str) -> String {
    object_name("fw", ns)
}

/// One element of a namespace's rule maps as `nft -j list` shows it.
#[derive(Debug)]
struct Counted {
    comment: String,
    verdict: String,
    packets: u64,
}

/// Every element of the interval maps of namespace `ns` with its comment (the rule it was
/// compiled from), verdict and packet counter.
fn counted_elements(node: &Ns, ns: &str) -> Vec<Counted> {
    let out = node
        .nft(&["-j", "list", "table", "inet", "nodeplane"])
        .expect("list table");
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft -j output is JSON");
    let prefix = format!("{}-", chain(ns));
    let mut found = Vec::new();
    let maps = v["nftables"].as_array().expect("nftables array").iter();
    for map in maps.filter_map(|i| i.get("map")) {
        if !map["name"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&prefix)
        {
            continue;
        }
        for pair in map["elem"].as_array().into_iter().flatten() {
            let (elem, verdict) = (&pair[0]["elem"], &pair[1]);
            let verdict = verdict.as_object().and_then(|o| o.keys().next().cloned());
            found.push(Counted {
                comment: elem["comment"].as_str().unwrap_or_default().to_string(),
                verdict: verdict.unwrap_or_else(|| panic!("verdict in {pair}")),
                packets: elem["counter"]["packets"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no counter in {pair}")),
            });
        }
    }
    found
}

/// Packets counted by the elements compiled from rule `index` of namespace `ns`.
fn rule_packets(node: &Ns, ns: &str, index: usize) -> u64 {
    let tag = format!("rule {index}: ");
    let elements = counted_elements(node, ns);
    let mine: Vec<&Counted> = elements
        .iter()
        .filter(|e| e.comment.starts_with(&tag))
        .collect();
    assert!(
        !mine.is_empty(),
        "no element of rule {index} in {elements:?}"
    );
    mine.iter().map(|e| e.packets).sum()
}

/// Handles of every rule of the table: equal before and after = no chain was rewritten.
fn rule_handles(node: &Ns) -> Vec<String> {
    let out = node
        .nft(&["-a", "list", "table", "inet", "nodeplane"])
        .expect("list table");
    out.lines()
        .filter(|l| l.contains("# handle") && !l.trim_start().starts_with("chain"))
        .map(|l| {
            l.rsplit("# handle")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn deny_all_after_allowing_one_host_leaves_only_that_host_reachable() {
    let t = topo();
    t.write(&format!(
        "[{{type: Allow, to: {{cidrSelector: {H10}/32}}}}, {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}]"
    ));
    t.site.agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall(
            "beta",
            "[{type: Deny, to: {cidrSelector: 198.51.100.0/24}}]",
        )
        .to_string(),
    );
    let out = t.site.agent.once(&[]);
    assert!(!out.contains("not correctly applied"), "{out}");
    for pod in [&t.a1, &t.a2] {
        assert!(tcp_ok(pod, &v4(H10, 80)), "allowed host");
        assert!(tcp_ok(pod, &v4(H10, 443)));
        assert!(!tcp_ok(pod, &v4(H20, 80)), "denied host");
        assert!(!pod.ns.udp_exchange(v4(H20, 443), SHORT).is_reply());
        // The rules are IPv4: IPv6 traffic is not matched.
        assert!(tcp_ok(pod, &v6(H20_6, 80)));
    }
    // Namespace beta has its own (unrelated) rules.
    assert!(tcp_ok(&t.b1, &v4(H20, 80)));
    assert!(tcp_ok(&t.b1, &v4(H10, 80)));
    // Pod-to-pod inside the cluster CIDR is never filtered.
    assert!(tcp_ok(&t.a1, "10.128.0.6:8080"));
    assert!(tcp_ok(&t.a1, "[fd01::6]:8080"));
    // Each rule's elements count its hits, and their comments and verdicts name the rule.
    assert!(rule_packets(&t.site.node, "alpha", 0) >= 4);
    assert!(rule_packets(&t.site.node, "alpha", 1) >= 2);
    let elements = counted_elements(&t.site.node, "alpha");
    for e in &elements {
        let want = if e.comment == format!("rule 0: Allow {H10}/32") {
            "accept"
        } else {
            assert_eq!(e.comment, "rule 1: Deny 0.0.0.0/0", "{elements:?}");
            "drop"
        };
        assert_eq!(e.verdict, want, "{e:?}");
    }
    // One denied connection counts on the deny rule's element only, one allowed connection
    // on the allow rule's only (the first packet decides; the rest of the connection
    // returns at `ct state established`).
    let counts = |t: &Topo| {
        (
            rule_packets(&t.site.node, "alpha", 0),
            rule_packets(&t.site.node, "alpha", 1),
        )
    };
    let (allowed, denied) = counts(&t);
    // Under 200 ms the probe sends exactly one datagram (it resends every 200 ms).
    let one_datagram = Duration::from_millis(150);
    assert!(!t.a1.ns.udp_exchange(v4(H20, 443), one_datagram).is_reply());
    assert_eq!(counts(&t), (allowed, denied + 1), "one denied UDP datagram");
    assert!(tcp_ok(&t.a1, &v4(H10, 80)));
    assert_eq!(counts(&t), (allowed + 1, denied + 1), "one allowed SYN");
}

#[test]
fn ipv6_deny_all_after_allowing_one_host() {
    let t = topo();
    t.write(&format!(
        "[{{type: Allow, to: {{cidrSelector: '{H10_6}/128'}}}}, {{type: Deny, to: {{cidrSelector: '::/0'}}}}]"
    ));
    t.site.agent.once(&[]);
    for pod in [&t.a1, &t.a2] {
        assert!(tcp_ok(pod, &v6(H10_6, 80)));
        assert!(!tcp_ok(pod, &v6(H20_6, 80)));
        assert!(!pod.ns.udp_exchange(v6(H20_6, 443), SHORT).is_reply());
        assert!(tcp_ok(pod, &v4(H20, 80)), "IPv4 unaffected");
    }
    assert!(tcp_ok(&t.b1, &v6(H20_6, 80)));
    assert!(tcp_ok(&t.a1, "[fd01::6]:8080"));
}

#[test]
fn allow_tcp_443_to_a_cidr_then_deny_the_rest() {
    let t = topo();
    t.write(
        "[{type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: tcp, port: 443}]}, \
          {type: Allow, to: {cidrSelector: '2001:db8::/32'}, ports: [{protocol: TCP, port: 443}]}, \
          {type: Deny, to: {cidrSelector: 0.0.0.0/0}}, {type: Deny, to: {cidrSelector: '::/0'}}]",
    );
    t.site.agent.once(&[]);
    for (h10, h20) in [
        (v4(H10, 443), v4(H20, 443)),
        (v6(H10_6, 443), v6(H20_6, 443)),
    ] {
        assert!(tcp_ok(&t.a1, &h10), "{h10}");
        assert!(tcp_ok(&t.a1, &h20), "{h20}");
        assert!(!t.a1.ns.udp_exchange(&h10, SHORT).is_reply(), "UDP {h10}");
    }
    assert!(!tcp_ok(&t.a1, &v4(H10, 80)));
    assert!(!tcp_ok(&t.a1, &v6(H10_6, 80)));
    assert!(t.b1.ns.udp_exchange(v4(H10, 443), SECOND).is_reply());
    assert!(rule_packets(&t.site.node, "alpha", 0) >= 2);
    assert!(rule_packets(&t.site.node, "alpha", 2) >= 2);
}

#[test]
fn node_selector_follows_node_labels() {
    let t = topo();
    t.write(
        "[{type: Allow, to: {nodeSelector: {matchLabels: {role: x}}}}, \
          {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
    );
    let nodes = |r20: &str, r10: &str| {
        [
            objects::node("ext-20", &[H20])
                .labels(&[("role", r20)])
                .to_string(),
            objects::node("ext-10", &[H10])
                .labels(&[("role", r10)])
                .to_string(),
        ]
        .join("---\n")
    };
    t.site.agent.write("nodes.yaml", &nodes("x", "y"));
    let agent = t.site.agent.spawn(&[]);
    let reach = || (tcp_ok(&t.a1, &v4(H20, 80)), tcp_ok(&t.a1, &v4(H10, 80)));
    wait_for(10, (true, false), reach);
    let before = rule_handles(&t.site.node);
    t.site.agent.write("nodes.yaml", &nodes("y", "x"));
    wait_for(10, (false, true), reach);
    assert_eq!(
        rule_handles(&t.site.node),
        before,
        "relabel rewrote a chain"
    );
    agent.stop_ok();
}

/// OVN-Kubernetes takes a selected node's addresses from its `k8s.ovn.org/host-cidrs`
/// (secondary interfaces included), not only from InternalIP/ExternalIP: a rule allowing a
/// node whose storage address (H10) is only in host-cidrs lets the pod reach that address.
#[test]
fn node_selector_allows_a_host_cidrs_address() {
    let t = topo();
    t.write(
        "[{type: Allow, to: {nodeSelector: {matchLabels: {role: storage}}}}, \
          {type: Deny, to: {cidrSelector: 0.0.0.0/0}}, \
          {type: Deny, to: {cidrSelector: '::/0'}}]",
    );
    let node = objects::node("ext-storage", &[H20])
        .labels(&[("role", "storage")])
        .host_cidrs(&["203.0.113.20/24", "203.0.113.10/32", "2001:db8:1::10/64"]);
    t.site.agent.write("nodes.yaml", &node.to_string());
    let agent = t.site.agent.spawn(&[]);
    let reach = || {
        (
            tcp_ok(&t.a1, &v4(H20, 80)),
            tcp_ok(&t.a1, &v4(H10, 80)),
            tcp_ok(&t.a1, &v6(H10_6, 80)),
            tcp_ok(&t.a1, &v6(H20_6, 80)),
        )
    };
    wait_for(10, (true, true, true, false), reach);
    agent.stop_ok();
}

#[test]
fn an_invalid_object_reports_the_rule_and_keeps_the_previous_rules() {
    let t = topo();
    t.write(&format!("[{{type: Deny, to: {{cidrSelector: {H20}/32}}}}]"));
    t.site.agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall("beta", "[]").to_string(),
    );
    let agent = t.site.agent.spawn(&[]);
    let reach = || (tcp_ok(&t.a1, &v4(H20, 80)), tcp_ok(&t.b1, &v4(H10, 80)));
    wait_for(10, (false, true), reach);

    // Rule 3 has a bad CIDR; beta changes at the same time and is applied.
    t.write(
        "[{type: Allow, to: {cidrSelector: 203.0.113.20/32}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}, \
          {type: Allow, to: {dnsName: example.com}}, {type: Deny, to: {cidrSelector: 203.0.113.300/32}}]",
    );
    t.site.agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall(
            "beta",
            &format!("[{{type: Deny, to: {{cidrSelector: {H10}/32}}}}]"),
        )
        .to_string(),
    );
    let reason = "EgressFirewall alpha/default: EgressFirewall Rules not correctly applied: \
                  spec.egress[3].to.cidrSelector: invalid CIDR \"203.0.113.300/32\"";
    wait_for(10, true, || agent.logs().contains(reason));
    wait_for(5, (false, false), reach);
    assert!(!tcp_ok(&t.a1, &v4(H20, 80)), "previous rules still block");
    assert!(tcp_ok(&t.a1, &v4(H10, 80)), "and still allow");

    // Fixing the object applies it, by map elements only (no rule is added or removed:
    // each rule is elements that map to accept/drop, not a chain).
    let before = rule_handles(&t.site.node);
    t.write(&format!(
        "[{{type: Allow, to: {{cidrSelector: {H20}/32}}}}, {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}]"
    ));
    wait_for(10, (true, false), reach);
    assert!(!tcp_ok(&t.a1, &v4(H10, 80)));
    assert_eq!(
        rule_handles(&t.site.node),
        before,
        "a rule change rewrote a chain"
    );
    let logs = agent.stop_ok();
    assert!(
        logs.contains("EgressFirewall alpha/default: EgressFirewall Rules applied"),
        "{logs}"
    );
}

/// A DNS server answering every A query with the current address and TTL (no AAAA records).
struct DnsServer {
    answer: Arc<Mutex<(Ipv4Addr, u32)>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DnsServer {
    fn start(ns: &Ns, bind: &str, addr: Ipv4Addr, ttl: u32) -> DnsServer {
        let bind = bind.to_string();
        let sock = ns.enter(move || UdpSocket::bind(bind).expect("bind DNS server"));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let answer = Arc::new(Mutex::new((addr, ttl)));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (answer.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let current = *a.lock().unwrap();
                if let Some(reply) = dns_reply(&buf[..n], current) {
                    let _ = sock.send_to(&reply, peer);
                }
            }
        });
        DnsServer {
            answer,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, addr: Ipv4Addr, ttl: u32) {
        *self.answer.lock().unwrap() = (addr, ttl);
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A response to a one-question query: the A record `addr` for A queries, no records
/// otherwise (NOERROR).
fn dns_reply(query: &[u8], (addr, ttl): (Ipv4Addr, u32)) -> Option<Vec<u8>> {
    if query.len() < 12 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The question: labels up to the root, then QTYPE and QCLASS.
    let mut i = 12;
    while *query.get(i)? != 0 {
        i += 1 + usize::from(query[i]);
    }
    let end = i + 5;
    let qtype = u16::from_be_bytes([*query.get(i + 1)?, *query.get(i + 2)?]);
    let question = query.get(12..end)?;
    let is_a = qtype == 1;
    let mut r = Vec::new();
    r.extend_from_slice(&query[0..2]); // id
    r.extend_from_slice(&[0x81, 0x80]); // response, recursion desired + available, NOERROR
    r.extend_from_slice(&[0, 1, 0, u8::from(is_a), 0, 0, 0, 0]);
    r.extend_from_slice(question);
    if is_a {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]); // name pointer, type A, class IN
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 4]);
        r.extend_from_slice(&addr.octets());
    }
    Some(r)
}

#[test]
fn dns_name_follows_the_answer_and_keeps_the_last_one_when_the_server_is_down() {
    let mut t = topo();
    let dns = DnsServer::start(&t.site.ext, "192.168.1.100:53", H10.parse().unwrap(), 2);
    t.site
        .agent
        .set_resolv_conf("nameserver 192.168.1.100\noptions timeout:1 attempts:1\n");
    t.write(
        "[{type: Allow, to: {dnsName: Svc.FW.test}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
    );
    // The same name in another namespace: one resolution serves both.
    t.site.agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall(
            "beta",
            "[{type: Deny, to: {dnsName: svc.fw.test}, ports: [{protocol: TCP, port: 443}]}]",
        )
        .to_string(),
    );
    let agent = t.site.agent.spawn(&[]);
    let reach = || (tcp_ok(&t.a1, &v4(H10, 80)), tcp_ok(&t.a1, &v4(H20, 80)));
    wait_for(10, (true, false), reach);
    assert!(!tcp_ok(&t.b1, &v4(H10, 443)));
    assert!(tcp_ok(&t.b1, &v4(H20, 443)));
    let before = rule_handles(&t.site.node);

    // A new answer: access follows within the TTL (2 s), by element updates only.
    let changed = Instant::now();
    dns.set(H20.parse().unwrap(), 2);
    wait_for(10, (false, true), reach);
    eprintln!(
        "access followed the new answer after {:?}",
        changed.elapsed()
    );
    assert_eq!(
        rule_handles(&t.site.node),
        before,
        "an answer change rewrote a chain"
    );
    assert!(tcp_ok(&t.b1, &v4(H10, 443)));
    assert!(!tcp_ok(&t.b1, &v4(H20, 443)));

    // The server goes away: after several failed refreshes the last answer still holds.
    drop(dns);
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(reach(), (false, true));
    let logs = agent.stop_ok();
    assert!(logs.contains("keeping the last answer"), "{logs}");
}

#[test]
fn eight_thousand_rules_apply_and_packets_still_find_their_verdict() {
    let t = topo();
    // 7998 rules that do not match the test hosts (distinct /32s in 198.18.0.0/15, half of
    // them with ports), then Allow H10, then Deny all: rule 7998 and 7999 decide.
    let mut rules = Vec::new();
    for i in 0..7998u32 {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
        let action = if i % 2 == 0 { "Allow" } else { "Deny" };
        if i % 4 == 0 {
            rules.push(format!(
                "{{type: {action}, to: {{cidrSelector: {ip}/32}}, ports: [{{protocol: TCP, port: {}}}]}}",
                1 + i % 1000
            ));
        } else {
            rules.push(format!("{{type: {action}, to: {{cidrSelector: {ip}/32}}}}"));
        }
    }
    rules.push(format!("{{type: Allow, to: {{cidrSelector: {H10}/32}}}}"));
    rules.push("{type: Deny, to: {cidrSelector: 0.0.0.0/0}}".into());
    t.write(&format!("[{}]", rules.join(", ")));
    let started = Instant::now();
    let out = t.site.agent.once(&[]);
    eprintln!("8000 rules applied in {:?}", started.elapsed());
    assert!(!out.contains("not correctly applied"), "{out}");
    assert!(tcp_ok(&t.a1, &v4(H10, 80)));
    assert!(!tcp_ok(&t.a1, &v4(H20, 80)));
    assert!(rule_packets(&t.site.node, "alpha", 7998) >= 1);
    assert!(rule_packets(&t.site.node, "alpha", 7999) >= 1);
    // The namespace chain is still four rules.
    let listing = t
        .site
        .node
        .nft(&["list", "chain", "inet", "nodeplane", &chain("alpha")])
        .unwrap();
    assert_eq!(listing.matches("vmap").count(), 4, "{listing}");
}

#[test]
fn once_applies_exactly_what_dry_run_printed() {
    let mut t = topo();
    t.write(
        "[{type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: TCP, port: 443}, {protocol: sctp, port: 9}]}, \
          {type: Deny, to: {cidrSelector: 203.0.113.16/28}}, {type: Allow, to: {cidrSelector: 203.0.113.0/25}}, \
          {type: Allow, to: {cidrSelector: '2001:db8:1::/48'}, ports: [{protocol: UDP, port: 53}]}, \
          {type: Deny, to: {cidrSelector: '::/0'}}, {type: Deny, to: {cidrSelector: 10.0.0.0/8}}]",
    );
    t.site.agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall("beta", "[{type: Deny, to: {cidrSelector: 0.0.0.0/1}}]")
            .to_string(),
    );
    let reference = t.site.once_applies_the_dry_run();
    // nft emits a no-op 1-byte `byteorder` after `meta l4proto` in concatenated interval
    // keys that the netlink backend leaves out (reported to the nftnl owners); equal otherwise.
    let strip = |s: String| {
        s.lines()
            .filter(|l| !l.contains("byteorder reg") || !l.ends_with(", 2, 1) ]"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(listing::bytecode(&t.site.node, "nodeplane")),
        strip(listing::bytecode(&reference, "nodeplane"))
    );
    assert!(tcp_ok(&t.a1, &v4(H10, 443)));
    assert!(tcp_ok(&t.a1, &v4(H10, 80)), "203.0.113.0/25 allows");
    assert!(!tcp_ok(&t.a1, &v4(H20, 80)), "203.0.113.16/28 denies");
    assert!(tcp_ok(&t.a1, &v4(H20, 443)), "443 comes first");
    assert!(!tcp_ok(&t.a1, &v6(H10_6, 80)));
    assert!(
        tcp_ok(&t.b1, &v4(H10, 80)),
        "203.0.113.10 is outside 0.0.0.0/1"
    );
}

impl Topo {
    /// `agent --once` run to completion as its own process; its logs (the status lines go
    /// to stderr). Panics with the logs if it fails.
    fn once_logs(&self, extra: &[&str]) -> String {
        let mut args = self.site.agent.args(extra);
        args.push("--once");
        let mut agent = self.site.node.spawn_agent(&args);
        let deadline = Instant::now() + Duration::from_secs(60);
        while agent.try_status().is_none() {
            assert!(Instant::now() < deadline, "--once hangs:\n{}", agent.logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        let (status, logs) = agent.stop();
        assert!(status.success(), "agent --once: {status}:\n{logs}");
        logs
    }
}

/// Alpha's firewall: deny H20, nothing else.
fn deny_h20() -> String {
    format!("[{{type: Deny, to: {{cidrSelector: {H20}/32}}}}]")
}

/// The same object with a bad CIDR: applied as it is, alpha would have no rules at all.
const INVALID: &str = "[{type: Deny, to: {cidrSelector: 203.0.113.300/32}}]";
const INVALID_STATUS: &str = "EgressFirewall alpha/default: EgressFirewall Rules not correctly \
                              applied: spec.egress[0].to.cidrSelector: invalid CIDR \
                              \"203.0.113.300/32\"";

#[test]
fn once_keeps_the_last_valid_rules_of_an_object_that_turned_invalid() {
    let t = topo();
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("nodeplane");
    let flag = ["--state-dir", state_dir.to_str().unwrap()];
    let file = state_dir.join("last-valid.json");
    let reach = || (tcp_ok(&t.a1, &v4(H20, 80)), tcp_ok(&t.a1, &v4(H10, 80)));
    t.write(&deny_h20());
    let logs = t.once_logs(&flag);
    assert!(!logs.contains("not correctly applied"), "{logs}");
    assert_eq!(reach(), (false, true), "the deny is in force");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        (&saved["format"], &saved["node"]),
        (&"nodeplane/last-valid/v1".into(), &NODE.into())
    );
    assert_eq!(
        saved["egressFirewalls"][0]["metadata"]["namespace"],
        "alpha"
    );
    let written = std::fs::metadata(&file).unwrap().modified().unwrap();

    // The object turns invalid; a new --once process still applies its last valid rules.
    t.write(INVALID);
    let logs = t.once_logs(&flag);
    assert!(logs.contains(INVALID_STATUS), "{logs}");
    assert!(logs.contains("last valid objects read: 1"), "{logs}");
    assert_eq!(reach(), (false, true), "still denied after a restart");
    // Nothing new to remember: the file is not rewritten.
    assert!(!logs.contains("last valid objects saved"), "{logs}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        written
    );

    // As after a reboot: the table is gone, the file is all there is. Still denied.
    t.site
        .node
        .nft(&["delete", "table", "inet", "nodeplane"])
        .unwrap();
    assert_eq!(reach(), (true, true), "no table, no deny");
    let logs = t.once_logs(&flag);
    assert!(logs.contains(INVALID_STATUS), "{logs}");
    assert_eq!(
        reach(),
        (false, true),
        "the deny came back from the state file"
    );

    // A corrupt file is reported and ignored: nothing remembered, the invalid object gets
    // no rules (which shows that the file was what kept them).
    std::fs::write(&file, "{\"format\": \"nodeplane/last-").unwrap();
    let logs = t.once_logs(&flag);
    let corrupt = format!("{}: corrupt (not JSON", file.display());
    assert!(logs.contains(&corrupt), "{logs}");
    assert!(logs.contains(INVALID_STATUS), "{logs}");
    assert_eq!(reach(), (true, true));

    // A valid object applies and is remembered again.
    t.write(&format!("[{{type: Deny, to: {{cidrSelector: {H10}/32}}}}]"));
    let logs = t.once_logs(&flag);
    assert!(logs.contains("last valid objects saved"), "{logs}");
    assert_eq!(reach(), (true, false));
    t.write(INVALID);
    t.once_logs(&flag);
    assert_eq!(reach(), (true, false));
}

#[test]
fn a_restarted_agent_keeps_the_last_valid_rules_of_an_object_that_turned_invalid() {
    let t = topo();
    let state = tempfile::tempdir().unwrap();
    let flag = ["--state-dir", state.path().to_str().unwrap()];
    let reach = || (tcp_ok(&t.a1, &v4(H20, 80)), tcp_ok(&t.a1, &v4(H10, 80)));
    t.write(&deny_h20());
    let agent = t.site.agent.spawn(&flag);
    wait_for(10, (false, true), reach);
    t.write(INVALID);
    wait_for(10, true, || agent.logs().contains(INVALID_STATUS));
    assert_eq!(reach(), (false, true));
    // Killed (no shutdown path runs): what it saved after the valid sync is on disk.
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let (status, _) = agent.stop();
    assert!(!status.success(), "killed: {status}");
    // Started while the object is invalid: it says so, and the deny holds.
    let started_with_the_deny = |why: &str| {
        let agent = t.site.agent.spawn(&flag);
        wait_for(10, true, || agent.logs().contains(INVALID_STATUS));
        assert_eq!(reach(), (false, true), "{why}");
        agent
    };

    // Restarted while the object is invalid: the deny stays.
    started_with_the_deny("still denied after SIGKILL and a restart").stop_ok();

    // And again after a clean stop (SIGTERM).
    started_with_the_deny("still denied after a restart").stop_ok();

    // Rebooted (the table is gone) while the object is invalid: the deny comes back.
    t.site
        .node
        .nft(&["delete", "table", "inet", "nodeplane"])
        .unwrap();
    assert_eq!(reach(), (true, true), "no table, no deny");
    let agent = started_with_the_deny("the deny came back from the state file");
    // Fixing the object applies the fix.
    t.write(&format!("[{{type: Deny, to: {{cidrSelector: {H10}/32}}}}]"));
    wait_for(10, (true, false), reach);
    agent.stop_ok();
}
