//! EgressFirewall DNS against the kernel: pod DNS steered to the agent's transparent proxy,
//! answers held until their addresses are in the learned sets.
//!
//! Node `node-1` forwards for pods `a1` (namespace `alpha`, whose EgressFirewall has
//! `dnsName` rules) and `b1` (namespace `beta`, CIDR rules only). The external host
//! 192.168.1.100 runs the DNS server (UDP and TCP port 53) and owns all of 198.18.0.0/15
//! (a local route), with a TCP server on port 80 of every address, so every answer the server
//! invents is a reachable destination.

use nodeplane::nft::ir::IpFamily;
use nodeplane::plan::firewall::Names;
use nodeplane::testing::lab::dns::{
    DnsServer, Zone, a_query, lookup, lookup_and_connect, lookup_tcp, send_spoofed_udp,
};
use nodeplane::testing::lab::{
    AgentProcess, Lab, ManifestAgent, Ns, Pod, Server, eventually, set_br_netfilter,
};
use nodeplane::testing::objects;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const DNS: &str = "192.168.1.100:53";
/// A connection to a learned address must open at once; a dropped SYN waits this long.
const CONNECT: Duration = Duration::from_millis(500);
const LOOKUP: Duration = Duration::from_secs(2);
/// DNS to the server is allowed, everything else only by the rules under test.
const DNS_ALLOWED: &str = "{type: Allow, to: {cidrSelector: 192.168.1.100/32}, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}";

struct Topo {
    node: Ns,
    ext: Ns,
    zone: Zone,
    a1: Pod,
    b1: Pod,
    /// Namespace `gamma`: no EgressFirewall.
    g1: Pod,
    dns: DnsServer,
    agent: ManifestAgent,
    _server: Server,
    // Last: servers and agents stop before the namespaces go.
    _lab: Lab,
}

fn topo(zone: Zone, alpha_rules: &str) -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let a1 = lab.add_pod(&node, "a1", &["10.128.0.5", "fd01::5"]);
    let b1 = lab.add_pod(&node, "b1", &["10.128.0.7", "fd01::7"]);
    let g1 = lab.add_pod(&node, "g1", &["10.128.0.9", "fd01::9"]);
    let ext = lab.add_uplink_host(&node, "ext");
    lab.add_uplink_prefix(&node, &ext, "198.18.0.0/15");
    let server = ext.tcp_server("0.0.0.0:80", "ext");
    let dns = DnsServer::start(&ext, DNS.parse().unwrap(), zone.clone());
    let mut agent = ManifestAgent::new(&node, NODE, &["--cluster-cidr", "10.128.0.0/14,fd01::/48"]);
    agent.set_resolv_conf(
        "nameserver 192.168.1.100\nnameserver fd00:1::100\noptions timeout:1 attempts:1\n",
    );
    let pods = [
        a1.manifest("alpha", "a1", NODE),
        b1.manifest("beta", "b1", NODE),
        g1.manifest("gamma", "g1", NODE),
    ];
    agent.write("pods.yaml", &pods.join("---\n"));
    agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall("alpha", alpha_rules).to_string(),
    );
    let beta = format!("[{DNS_ALLOWED}, {{type: Deny, to: {{cidrSelector: 198.18.0.0/16}}}}]");
    agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall("beta", &beta).to_string(),
    );
    Topo {
        node,
        ext,
        zone,
        a1,
        b1,
        g1,
        dns,
        agent,
        _server: server,
        _lab: lab,
    }
}

impl Topo {
    fn spawn(&self, extra: &[&str]) -> AgentProcess {
        let agent = self.agent.spawn(extra);
        // Up once the steering is in and the proxy listens: a1's queries come from the node.
        // (The steering set first: the agent's own resolution of exact names also asks
        // from the node, before its first sync.)
        eventually(Duration::from_secs(15), || {
            let steered = self
                .node
                .nft(&["list", "set", "inet", "nodeplane", "fw-dns-pods-v4"])
                .unwrap_or_default();
            if !steered.contains(&self.a1.ip().to_string()) {
                return Err(format!("a1 not steered yet: {steered}"));
            }
            let (ns, name) = (&self.a1.ns, "probe.example.com");
            self.dns.lookup_via(ns, dns(), name, node_ip(), LOOKUP)
        });
        agent
    }
}

/// `alpha`'s rules: DNS to the server, the names `dns_name` matches, nothing else.
fn dns_name_only(dns_name: &str) -> String {
    format!(
        "[{DNS_ALLOWED}, {{type: Allow, to: {{dnsName: {dns_name}}}}}, {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}]"
    )
}

fn dns() -> SocketAddr {
    DNS.parse().unwrap()
}

fn node_ip() -> IpAddr {
    "192.168.1.1".parse().unwrap()
}

fn connects(pod: &Pod, addr: Ipv4Addr) -> bool {
    pod.ns.tcp_connect(format!("{addr}:80"), CONNECT).is_reply()
}

/// Resolves `name` in `pod` and connects at once to the (first) answer.
fn resolve_and_connect(pod: &Pod, name: &str) -> (Ipv4Addr, bool) {
    let got = lookup(&pod.ns, dns(), name, LOOKUP).unwrap_or_else(|e| panic!("lookup {name}: {e}"));
    let addr = *got
        .addrs
        .first()
        .unwrap_or_else(|| panic!("{name}: no address"));
    (addr, connects(pod, addr))
}

fn zone_with(fixed: &[(&str, &str, u32)]) -> Zone {
    let mut z = Zone::default();
    for (name, addr, ttl) in fixed {
        z.fixed
            .insert(name.to_string(), (vec![addr.parse().unwrap()], *ttl));
    }
    z
}

fn learned_elements(node: &Ns, pattern: &str) -> String {
    let set = Names::new("alpha").learned_set(pattern, IpFamily::V4);
    node.nft(&["list", "set", "inet", "nodeplane", &set])
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
pub(crate) fn rotating_answers_are_allowed_before_the_pod_connects() {
    let mut zone = Zone::default();
    zone.rotating.insert(
        "rot.example.com".into(),
        ("198.18.0.1".parse().unwrap(), 30),
    );
    let t = topo(zone, &dns_name_only("rot.example.com"));
    let agent = t.spawn(&[]);
    let started = Instant::now();
    let mut dropped = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..1000 {
        let (addr, ok) = resolve_and_connect(&t.a1, "rot.example.com");
        seen.insert(addr);
        if !ok {
            dropped.push(addr);
        }
    }
    eprintln!(
        "1000 lookups + first connections in {:?}",
        started.elapsed()
    );
    assert!(
        seen.len() >= 1000,
        "the answers did not rotate: {} distinct",
        seen.len()
    );
    assert_eq!(dropped, Vec::<Ipv4Addr>::new(), "first connections dropped");
    // The rule order holds: an address nobody answered is denied.
    assert!(!connects(&t.a1, "198.19.255.254".parse().unwrap()));
    agent.stop_ok();
}

#[test]
fn a_wildcard_matches_exactly_one_more_label() {
    let zone = zone_with(&[
        ("a.example.com", "198.18.1.1", 30),
        ("a.b.example.com", "198.18.1.2", 30),
        ("example.com", "198.18.1.3", 30),
    ]);
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&[]);
    assert_eq!(
        resolve_and_connect(&t.a1, "a.example.com"),
        ("198.18.1.1".parse().unwrap(), true)
    );
    assert_eq!(
        resolve_and_connect(&t.a1, "a.b.example.com"),
        ("198.18.1.2".parse().unwrap(), false)
    );
    assert_eq!(
        resolve_and_connect(&t.a1, "example.com"),
        ("198.18.1.3".parse().unwrap(), false)
    );
    agent.stop_ok();
}

#[test]
fn learned_addresses_expire_with_their_ttl_and_a_new_answer_extends_them() {
    let zone = zone_with(&[("t.example.com", "198.18.2.1", 2)]);
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&["--dns-min-ttl-seconds", "2"]);
    let addr: Ipv4Addr = "198.18.2.1".parse().unwrap();
    assert_eq!(resolve_and_connect(&t.a1, "t.example.com"), (addr, true));
    assert!(learned_elements(&t.node, "*.example.com").contains("198.18.2.1 timeout 2s"));
    // Nobody asks again: the address expires with its TTL.
    std::thread::sleep(Duration::from_millis(3000));
    assert!(!connects(&t.a1, addr), "still allowed after its TTL");
    // Asked again with a longer TTL: allowed again, and refreshed in place.
    t.dns.update(|z| {
        z.fixed
            .insert("t.example.com".into(), (vec![addr], 6))
            .map(drop)
            .unwrap_or(())
    });
    assert_eq!(resolve_and_connect(&t.a1, "t.example.com"), (addr, true));
    std::thread::sleep(Duration::from_millis(1000));
    t.dns.update(|z| {
        z.fixed
            .insert("t.example.com".into(), (vec![addr], 8))
            .map(drop)
            .unwrap_or(())
    });
    lookup(&t.a1.ns, dns(), "t.example.com", LOOKUP).unwrap();
    assert!(learned_elements(&t.node, "*.example.com").contains("198.18.2.1 timeout 8s"));
    // 6.5 s after the first of the two answers: only the refresh keeps it.
    std::thread::sleep(Duration::from_millis(5500));
    assert!(
        connects(&t.a1, addr),
        "the refresh did not extend the element"
    );
    agent.stop_ok();
}

#[test]
fn an_address_in_use_stays_allowed_past_its_ttl() {
    let zone = zone_with(&[
        ("used.example.com", "198.18.7.1", 1),
        ("idle.example.com", "198.18.7.2", 1),
    ]);
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&["--dns-min-ttl-seconds", "5"]);
    let used: Ipv4Addr = "198.18.7.1".parse().unwrap();
    let idle: Ipv4Addr = "198.18.7.2".parse().unwrap();
    assert_eq!(resolve_and_connect(&t.a1, "used.example.com"), (used, true));
    assert_eq!(resolve_and_connect(&t.a1, "idle.example.com"), (idle, true));
    // A connection stays open to `used` (an established conntrack entry: the lab's port 80
    // server closes after its reply, this one holds on); `idle` has none.
    let holder = t
        .ext
        .enter(|| std::net::TcpListener::bind("0.0.0.0:81").unwrap());
    let accepted = std::thread::spawn(move || holder.accept().map(|(conn, _)| conn));
    let target = SocketAddr::from((used, 81));
    let open =
        t.a1.ns
            .enter(move || std::net::TcpStream::connect_timeout(&target, CONNECT))
            .expect("connect to the used address");
    std::thread::sleep(Duration::from_secs(8));
    let (used_ok, idle_ok) = (connects(&t.a1, used), connects(&t.a1, idle));
    let set = learned_elements(&t.node, "*.example.com");
    drop((open, accepted.join()));
    let (status, logs) = agent.stop();
    assert!(
        used_ok,
        "an address with a live flow expired:\n{set}\n{logs}"
    );
    assert!(
        !idle_ok,
        "an address without flows outlived its TTL:\n{set}\n{logs}"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

#[test]
fn a_truncated_answer_is_retried_over_tcp_and_learned_there() {
    let mut zone = zone_with(&[("big.example.com", "198.18.3.1", 30)]);
    zone.truncate_udp = true;
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&[]);
    let _ = t.dns.take_sources();
    let got = lookup(&t.a1.ns, dns(), "big.example.com", LOOKUP).unwrap();
    assert!(got.over_tcp, "the answer was not truncated");
    assert_eq!(got.addrs, ["198.18.3.1".parse::<Ipv4Addr>().unwrap()]);
    assert_eq!(
        t.dns.take_sources(),
        [node_ip()].into(),
        "TCP went through the proxy too"
    );
    assert!(connects(&t.a1, "198.18.3.1".parse().unwrap()));
    agent.stop_ok();
}

#[test]
fn without_the_agent_dns_answers_directly_and_what_was_learned_stays() {
    let mut zone = zone_with(&[("keep.example.com", "198.18.4.1", 60)]);
    zone.rotating.insert(
        "rot.example.com".into(),
        ("198.18.5.1".parse().unwrap(), 60),
    );
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&[]);
    let kept: Ipv4Addr = "198.18.4.1".parse().unwrap();
    assert_eq!(resolve_and_connect(&t.a1, "keep.example.com"), (kept, true));
    let (_, logs) = agent.kill();
    assert!(logs.contains("dns proxy listening"), "{logs}");
    // DNS keeps answering, now straight from the server (queries come from the pod).
    let _ = t.dns.take_sources();
    let started = Instant::now();
    for _ in 0..20 {
        lookup(&t.a1.ns, dns(), "keep.example.com", LOOKUP).expect("DNS without the agent");
    }
    eprintln!("20 lookups without the agent in {:?}", started.elapsed());
    assert_eq!(t.dns.take_sources(), [t.a1.ip()].into());
    // What was learned stays enforced; nothing new is learned.
    assert!(connects(&t.a1, kept));
    let (fresh, ok) = resolve_and_connect(&t.a1, "rot.example.com");
    assert!(!ok, "{fresh} was allowed though nobody learned it");
}

#[test]
fn garbage_to_the_proxy_neither_crashes_nor_stalls_it() {
    let t = topo(
        zone_with(&[("ok.example.com", "198.18.8.1", 30)]),
        &dns_name_only("'*.example.com'"),
    );
    let mut agent = t.spawn(&[]);
    let server = dns();
    t.a1.ns.enter(move || {
        let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut seed = 0x9e37_79b9_u32;
        for i in 0..2000usize {
            // Empty, short, header-only and random datagrams up to 1,400 bytes.
            let len = [0, 1, 11, 12, 13, 512, 1400][i % 7];
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let _ = udp.send_to(&junk, server);
        }
        // TCP: a length prefix promising more than is sent, a lone byte, a silent connection.
        for junk in [&[0xff, 0xff, 1, 2, 3][..], &[7], &[]] {
            if let Ok(mut c) = std::net::TcpStream::connect_timeout(&server, CONNECT) {
                use std::io::Write;
                let _ = c.write_all(junk);
            }
        }
    });
    // DNS through the proxy still answers and still learns.
    assert_eq!(
        resolve_and_connect(&t.a1, "ok.example.com"),
        ("198.18.8.1".parse().unwrap(), true)
    );
    assert!(
        agent.try_status().is_none(),
        "the agent died:\n{}",
        agent.logs()
    );
    agent.stop_ok();
}

#[test]
fn dns_over_ipv6_is_proxied_and_learned_too() {
    let t = topo(
        zone_with(&[("six.example.com", "198.18.9.1", 30)]),
        &format!(
            "[{DNS_ALLOWED}, {{type: Allow, to: {{cidrSelector: 'fd00:1::100/128'}}, ports: [{{protocol: UDP, port: 53}}]}}, \
                   {{type: Allow, to: {{dnsName: '*.example.com'}}}}, {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}]"
        ),
    );
    let dns6: SocketAddr = "[fd00:1::100]:53".parse().unwrap();
    let server6 = DnsServer::start(&t.ext, dns6, t.zone.clone());
    let agent = t.spawn(&[]);
    let got = lookup(&t.a1.ns, dns6, "six.example.com", LOOKUP).expect("lookup over IPv6");
    assert_eq!(got.addrs, ["198.18.9.1".parse::<Ipv4Addr>().unwrap()]);
    assert_eq!(
        server6.take_sources(),
        ["fd00:1::1".parse::<IpAddr>().unwrap()].into(),
        "the IPv6 query did not go through the proxy"
    );
    assert!(connects(&t.a1, "198.18.9.1".parse().unwrap()));
    agent.stop_ok();
}

#[test]
fn a_namespace_without_dns_names_never_goes_through_the_proxy() {
    let t = topo(
        zone_with(&[("x.example.com", "198.18.6.1", 30)]),
        &format!("[{DNS_ALLOWED}, {{type: Allow, to: {{dnsName: '*.example.com'}}}}]"),
    );
    let agent = t.spawn(&[]);
    let _ = t.dns.take_sources();
    for _ in 0..5 {
        lookup(&t.b1.ns, dns(), "x.example.com", LOOKUP).unwrap();
    }
    assert_eq!(
        t.dns.take_sources(),
        [t.b1.ip()].into(),
        "beta's DNS was proxied"
    );
    let steered = t
        .node
        .nft(&["list", "set", "inet", "nodeplane", "fw-dns-pods-v4"])
        .unwrap();
    assert!(
        steered.contains("10.128.0.5") && !steered.contains("10.128.0.7"),
        "{steered}"
    );
    agent.stop_ok();
}

/// A DNS server a pod picked (not one of the node's resolvers), on the external host.
const ROGUE: &str = "198.18.200.53:53";

fn rogue(t: &Topo, zone: Zone) -> DnsServer {
    DnsServer::start(&t.ext, ROGUE.parse().unwrap(), zone)
}

#[test]
fn an_answer_from_a_server_the_pod_picked_is_never_learned() {
    // The namespace lets its pods reach the rogue server (a namespace that allows "DNS
    // anywhere"): the pod gets its answer, but the answer must not open anything.
    let t = topo(
        zone_with(&[("payments.example.com", "198.18.10.10", 30)]),
        &format!(
            "[{DNS_ALLOWED}, {{type: Allow, to: {{cidrSelector: 198.18.200.53/32}}, ports: [{{protocol: UDP, port: 53}}]}}, \
              {{type: Allow, to: {{dnsName: payments.example.com}}}}, {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}]"
        ),
    );
    let agent = t.spawn(&[]);
    let server = rogue(
        &t,
        zone_with(&[("payments.example.com", "198.18.66.66", i32::MAX as u32)]),
    );
    let got = lookup(
        &t.a1.ns,
        ROGUE.parse().unwrap(),
        "payments.example.com",
        LOOKUP,
    )
    .expect("the rogue server is allowed, so it answers");
    assert_eq!(got.addrs, ["198.18.66.66".parse::<Ipv4Addr>().unwrap()]);
    let sources = server.take_sources();
    let poisoned = connects(&t.a1, "198.18.66.66".parse().unwrap());
    let set = learned_elements(&t.node, "payments.example.com");
    // The real answer (from the node's resolver) still works.
    let real = resolve_and_connect(&t.a1, "payments.example.com");
    agent.stop_ok();
    assert!(
        !poisoned,
        "the rogue answer was learned ({sources:?} asked it):\n{set}"
    );
    assert_eq!(
        sources,
        [t.a1.ip()].into(),
        "the query to the rogue server was proxied"
    );
    assert_eq!(real, ("198.18.10.10".parse().unwrap(), true));
}

#[test]
fn dns_to_a_server_the_firewall_denies_stays_denied() {
    let t = topo(zone_with(&[]), &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&[]);
    let server = rogue(&t, zone_with(&[("tunnel.example.org", "198.18.77.77", 30)]));
    let rogue_addr: SocketAddr = ROGUE.parse().unwrap();
    let udp = lookup(&t.a1.ns, rogue_addr, "tunnel.example.org", LOOKUP);
    let tcp = lookup_tcp(&t.a1.ns, rogue_addr, "tunnel.example.org", LOOKUP);
    let sources = server.take_sources();
    agent.stop_ok();
    assert!(
        udp.is_err(),
        "UDP DNS to a denied address got through: {udp:?} ({sources:?})"
    );
    assert!(
        tcp.is_err(),
        "TCP DNS to a denied address got through: {tcp:?} ({sources:?})"
    );
    assert!(
        sources.is_empty(),
        "the rogue server was asked by {sources:?}"
    );
}

#[test]
fn a_pods_own_port_53_traffic_to_a_pod_meets_that_pods_network_policy() {
    let t = topo(
        zone_with(&[]),
        &format!("[{DNS_ALLOWED}, {{type: Allow, to: {{dnsName: '*.example.com'}}}}]"),
    );
    // g1 serves DNS and admits nobody (ingress isolated, no rule).
    let policy = objects::network_policy("gamma", "deny", "  podSelector: {}\n  ingress: []\n");
    t.agent.write("np-gamma.yaml", &policy.to_string());
    let g1_dns: SocketAddr = "10.128.0.9:53".parse().unwrap();
    let isolated = DnsServer::start(
        &t.g1.ns,
        g1_dns,
        zone_with(&[("x.example.com", "198.18.11.1", 30)]),
    );
    let agent = t.spawn(&[]);
    let got = lookup(&t.a1.ns, g1_dns, "x.example.com", LOOKUP);
    let sources = isolated.take_sources();
    agent.stop_ok();
    assert!(
        got.is_err(),
        "the isolated pod answered ({sources:?} asked it): {got:?}"
    );
    assert!(
        sources.is_empty(),
        "the isolated pod was reached by {sources:?}"
    );
}

/// Elements of a learned set listing (each has an `expires`).
fn element_count(listing: &str) -> usize {
    listing.matches(" expires ").count()
}

#[test]
fn learning_is_bounded_per_name_and_per_namespace() {
    // 60 names of 120 addresses each (one answer each, under the lab client's 4 KiB): 7,200 offered.
    let mut zone = Zone::default();
    for i in 0..60u32 {
        let addrs = (1..=120u32)
            .map(|j| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 100, 0)) + i * 256 + j))
            .collect();
        zone.fixed.insert(format!("n{i}.example.com"), (addrs, 300));
    }
    let t = topo(zone, &dns_name_only("'*.example.com'"));
    let agent = t.spawn(&[]);
    let got = lookup(&t.a1.ns, dns(), "n0.example.com", LOOKUP).expect("lookup n0");
    assert_eq!(got.addrs.len(), 120, "the pod gets the whole answer");
    let after_one = element_count(&learned_elements(&t.node, "*.example.com"));
    for i in 1..60 {
        lookup(&t.a1.ns, dns(), &format!("n{i}.example.com"), LOOKUP).expect("lookup");
    }
    let after_all = element_count(&learned_elements(&t.node, "*.example.com"));
    // The newest name is allowed; the oldest went first.
    let newest = connects(&t.a1, Ipv4Addr::new(198, 18, 159, 1));
    agent.stop_ok();
    assert!(
        after_one <= 50,
        "one name learned {after_one} addresses (cap 50)"
    );
    assert!(
        after_all <= 2000,
        "one namespace learned {after_all} addresses (cap 2000)"
    );
    assert!(
        after_all >= 1000,
        "only {after_all} learned: the newest names must be kept"
    );
    assert!(newest, "the newest name's first address is not allowed");
}

/// A pod on a Linux bridge (`br0`, 10.128.5.0/24, as bridge CNIs attach them) in namespace
/// `alpha`, with the same external host as [`topo`].
#[test]
fn bridged_pods_are_steered_with_and_without_br_netfilter() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let bridge = lab.add_bridge(&node, "br0", &["10.128.5.1/24"]);
    let pod = lab.add_bridged_pod(&bridge, "pod-p", &["10.128.5.2/24"]).ns;
    let ext = lab.add_uplink_host(&node, "ext");
    lab.add_uplink_prefix(&node, &ext, "198.18.0.0/15");
    let _server = ext.tcp_server("0.0.0.0:80", "ext");
    let mut zone = Zone::default();
    zone.rotating.insert(
        "br.example.com".into(),
        ("198.18.12.1".parse().unwrap(), 30),
    );
    let server = DnsServer::start(&ext, dns(), zone);
    let mut agent = ManifestAgent::new(&node, NODE, &["--cluster-cidr", "10.128.0.0/14"]);
    agent.set_resolv_conf("nameserver 192.168.1.100\noptions timeout:1 attempts:1\n");
    agent.write(
        "pods.yaml",
        &objects::pod("alpha", "p")
            .on(NODE)
            .ips(&["10.128.5.2"])
            .to_string(),
    );
    agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall("alpha", &dns_name_only("'*.example.com'")).to_string(),
    );
    let running = agent.spawn(&[]);
    let mut failures = Vec::new();
    for on in [false, true, false] {
        set_br_netfilter(&node, on);
        // Steered once the queries come from the node (the agent may still be starting).
        let deadline = Instant::now() + Duration::from_secs(15);
        let steered = loop {
            match server.lookup_via(&pod, dns(), "br.example.com", node_ip(), LOOKUP) {
                Ok(_) => break Ok(()),
                Err(e) if Instant::now() > deadline => break Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        if let Err(last) = steered {
            failures.push(format!("br_netfilter {on}: UDP not steered: {last}"));
            continue;
        }
        let [udp, tcp] = lookup_and_connect(&pod, dns(), "br.example.com", (LOOKUP, CONNECT));
        for (proto, got) in [("udp", udp), ("tcp", tcp)] {
            match got {
                Ok((_, true)) => {}
                Ok((addr, false)) => {
                    failures.push(format!("br_netfilter {on}, {proto}: {addr} not allowed"))
                }
                Err(e) => failures.push(format!("br_netfilter {on}, {proto}: lookup: {e}")),
            }
        }
    }
    let (status, logs) = running.stop();
    assert!(failures.is_empty(), "{failures:#?}\n{logs}");
    assert!(status.success(), "{status}:\n{logs}");
}

/// Seven pods of one tenant flood a trusted resolver that never answers (each query holds a
/// slot until the upstream timeout); another tenant's lookups must keep working.
#[test]
fn one_tenants_flood_does_not_take_another_tenants_lookups() {
    const FLOODERS: usize = 7;
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let victim = lab.add_pod(&node, "v", &["10.128.0.5"]);
    let flooders: Vec<Pod> = (0..FLOODERS)
        .map(|i| {
            let addr = format!("10.128.1.{}", i + 1);
            lab.add_pod(&node, &format!("f{i}"), &[addr.as_str()])
        })
        .collect();
    let ext = lab.add_uplink_host(&node, "ext");
    // 192.168.1.222 is routed to the external host, which does not forward: silence.
    lab.add_route(&node, "192.168.1.222/32", "192.168.1.100");
    let server = DnsServer::start(
        &ext,
        dns(),
        zone_with(&[("v.example.com", "198.18.13.1", 30)]),
    );
    let mut agent = ManifestAgent::new(&node, NODE, &["--cluster-cidr", "10.128.0.0/14"]);
    // Both servers are the node's resolvers (so the silent one is trusted too).
    agent.set_resolv_conf(
        "nameserver 192.168.1.100\nnameserver 192.168.1.222\noptions timeout:1 attempts:1\n",
    );
    let mut pods = vec![victim.manifest("alpha", "v", NODE)];
    for (i, f) in flooders.iter().enumerate() {
        pods.push(
            objects::pod("flood", &format!("f{i}"))
                .on(NODE)
                .ips(&f.addrs)
                .to_string(),
        );
    }
    agent.write("pods.yaml", &pods.join("---\n"));
    for ns in ["alpha", "flood"] {
        agent.write(
            &format!("fw-{ns}.yaml"),
            &objects::egress_firewall(ns, "[{type: Allow, to: {dnsName: '*.example.com'}}]")
                .to_string(),
        );
    }
    let running = agent.spawn(&[]);
    eventually(Duration::from_secs(15), || {
        server.lookup_via(&victim.ns, dns(), "v.example.com", node_ip(), LOOKUP)
    });
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let floods: Vec<_> = flooders
        .iter()
        .map(|f| {
            let stop = stop.clone();
            f.ns.spawn(move || {
                let silent: SocketAddr = "192.168.1.222:53".parse().unwrap();
                let mut sent = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A fresh source port per query, as a resolver would (up to ~1,000/s).
                    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                    let _ = lookup_query(sent).map(|q| sock.send_to(&q, silent));
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                sent
            })
        })
        .collect();
    // Let the flood fill what it can (its queries wait 5 s for the silent server).
    std::thread::sleep(Duration::from_secs(3));
    let results: Vec<Result<_, String>> = (0..10)
        .map(|_| lookup(&victim.ns, dns(), "v.example.com", LOOKUP))
        .collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent: u32 = floods.into_iter().map(|t| t.join().unwrap()).sum();
    running.stop_ok();
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        failed, 0,
        "{failed} of 10 lookups failed under a flood of {sent} queries: {results:?}"
    );
    assert!(
        sent > 1000,
        "the flood was too small to prove anything: {sent}"
    );
}

/// A one-question A query for `q<n>.example.com` (what the flooders send).
fn lookup_query(n: u32) -> Option<Vec<u8>> {
    Some(a_query(&format!("q{n}.example.com"), n as u16))
}

#[test]
fn a_query_forged_with_a_neighbours_address_teaches_the_neighbour_nothing() {
    let t = topo(
        zone_with(&[("payments.example.com", "198.18.10.10", 30)]),
        &dns_name_only("payments.example.com"),
    );
    // No reverse-path filter on the node (many CNIs run loose or none; pods on one bridge
    // pass it anyway), so the forged source gets through.
    t.node.sysctl("net.ipv4.conf.all.rp_filter", "0");
    let veth = format!("net.ipv4.conf.{}.rp_filter", t.g1.host_iface);
    t.node.sysctl(&veth, "0");
    let agent = t.spawn(&[]);
    let server = rogue(
        &t,
        zone_with(&[("payments.example.com", "198.18.66.66", 3600)]),
    );
    // g1 (no EgressFirewall) asks the rogue server with a1's source address, again and
    // again for a second (a forged datagram may meet a cold neighbour cache).
    let query = a_query("payments.example.com", 7);
    let (a1, rogue_addr) = ("10.128.0.5:40000".parse().unwrap(), ROGUE.parse().unwrap());
    for _ in 0..10 {
        send_spoofed_udp(&t.g1.ns, a1, rogue_addr, &query).expect("raw send");
        std::thread::sleep(Duration::from_millis(100));
    }
    let served = server.served();
    let sources = server.take_sources();
    let set = learned_elements(&t.node, "payments.example.com");
    let poisoned = connects(&t.a1, "198.18.66.66".parse().unwrap());
    agent.stop_ok();
    // Unproxied, the forged packet meets alpha's own EgressFirewall (it has a1's source),
    // which denies the rogue server: it may well never get there.
    eprintln!("the rogue server answered {served} forged queries");
    assert!(
        !poisoned,
        "alpha learned the rogue answer ({sources:?} asked it):\n{set}"
    );
    assert!(!set.contains("198.18.66.66"), "{set}");
}
