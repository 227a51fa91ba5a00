//! EgressFirewall DNS under attack from a pod that sends forged packets (raw sockets, no
//! reverse-path filter on the node): floods with a neighbour's source address and answers
//! forged "from" the trusted resolver.
//!
//! Node `node-1` forwards for routed pods; the external host 192.168.1.100 runs the
//! resolver, and 192.168.1.222 is a second trusted resolver that never answers (routed to
//! the external host, which does not forward), so every query to it holds a proxy slot
//! until the upstream timeout.

use nodeplane::testing::lab::dns::{
    DnsServer, Zone, a_answer, lookup, raw_ipv4_socket, send_raw, spoofed_udp_packet,
};
use nodeplane::testing::lab::{Lab, ManifestAgent, Ns, Pod, Topology, eventually};
use nodeplane::testing::objects;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const NODE: &str = "node-1";
const LOOKUP: Duration = Duration::from_secs(2);
const RESOLVER: &str = "192.168.1.100:53";
const SILENT: &str = "192.168.1.222:53";
/// A flood that sent fewer in its ~7 s proves nothing: over 100 a second, it offers more
/// than the kernel lets through per pod (`--dns-rate-limit`, 100/s), which is many times
/// what the proxy's shares hold for the upstream timeout (16 per pod, 64 per namespace).
/// (A fixed 1 ms pace, so a loaded machine sends less: not thousands.)
pub(crate) const ENOUGH_FLOOD: u32 = 1000;

pub(crate) struct Topo {
    pub node: Ns,
    /// Namespace `alpha` (an EgressFirewall with a `dnsName` rule): its DNS is steered.
    pub victim: Pod,
    /// Namespace `mallory` (no EgressFirewall: sends what it likes), or a second pod of
    /// `alpha`.
    pub attacker: Pod,
    pub resolver: DnsServer,
    agent: ManifestAgent,
    _lab: Lab,
}

fn topo(zone: Zone) -> Topo {
    topo_on(Topology::Routed, zone, "mallory")
}

/// Victim 10.128.0.5 and attacker 10.128.1.1 (of `attacker_namespace`) attached as
/// `topology` says (bridged: both on `br0`, gateway 10.128.0.1/16).
pub(crate) fn topo_on(topology: Topology, zone: Zone, attacker_namespace: &str) -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pods = lab.pod_network(&node, topology, &["10.128.0.1/16"]);
    let victim = lab.add_pod_in(&pods, "v", &["10.128.0.5"]);
    let attacker = lab.add_pod_in(&pods, "m", &["10.128.1.1"]);
    let ext = lab.add_uplink_host(&node, "ext");
    lab.add_route(&node, "192.168.1.222/32", "192.168.1.100");
    let resolver = DnsServer::start(&ext, RESOLVER.parse().unwrap(), zone);
    // No reverse-path filter: forged sources get through (many CNIs run loose or none).
    node.sysctl("net.ipv4.conf.all.rp_filter", "0");
    node.sysctl(
        &format!("net.ipv4.conf.{}.rp_filter", attacker.host_iface),
        "0",
    );
    let agent = steered_alpha_agent(
        &node,
        &[
            victim.manifest("alpha", "v", NODE),
            attacker.manifest(attacker_namespace, "m", NODE),
        ],
    );
    Topo {
        node,
        victim,
        attacker,
        resolver,
        agent,
        _lab: lab,
    }
}

/// An agent on `node` with `pods`, namespace `alpha`'s EgressFirewall (`*.example.com`
/// allowed, 198.18.0.0/15 denied, so its DNS is steered) and both resolvers trusted.
fn steered_alpha_agent(node: &Ns, pods: &[String]) -> ManifestAgent {
    let mut agent = ManifestAgent::new(node, NODE, &["--cluster-cidr", "10.128.0.0/14"]);
    agent.write("pods.yaml", &pods.join("---\n"));
    agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall(
            "alpha",
            "[{type: Allow, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 198.18.0.0/15}}]",
        )
        .to_string(),
    );
    agent.set_resolv_conf(
        "nameserver 192.168.1.100\nnameserver 192.168.1.222\noptions timeout:1 attempts:1\n",
    );
    agent
}

impl Topo {
    /// Starts the agent and waits until the victim's lookups go through the proxy.
    pub(crate) fn spawn(&self, extra: &[&str]) -> nodeplane::testing::lab::AgentProcess {
        let running = self.agent.spawn(extra);
        eventually(Duration::from_secs(15), || {
            let (ns, name) = (&self.victim.ns, "v.example.com");
            self.resolver
                .lookup_via(ns, resolver(), name, node_ip(), LOOKUP)
        });
        running
    }

    /// Ten lookups of the victim while `flood` runs (started 6 s before: past the upstream
    /// timeout, 5 s, the flood holds all it ever can), then stops it: the failures, and
    /// how many the flood sent.
    pub(crate) fn lookups_under(
        &self,
        stop: &AtomicBool,
        flood: std::thread::JoinHandle<u32>,
    ) -> (Vec<String>, u32) {
        std::thread::sleep(Duration::from_secs(6));
        let failures = (0..10)
            .filter_map(|_| lookup(&self.victim.ns, resolver(), "v.example.com", LOOKUP).err())
            .collect();
        stop.store(true, Ordering::Relaxed);
        (failures, flood.join().unwrap())
    }
}

fn resolver() -> SocketAddr {
    RESOLVER.parse().unwrap()
}

fn node_ip() -> IpAddr {
    "192.168.1.1".parse().unwrap()
}

pub(crate) fn zone_with(name: &str, addr: &str) -> Zone {
    let mut z = Zone::default();
    z.fixed
        .insert(name.into(), (vec![addr.parse().unwrap()], 30));
    z
}

/// A one-question A query for `name`.
fn question(name: &str, id: u16) -> Vec<u8> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut q = Message::query();
    q.metadata.id = id;
    let name = Name::from_ascii(format!("{name}.")).expect("a valid name");
    q.add_query(Query::query(name, RecordType::A));
    q.to_vec().expect("encodes")
}

/// Sends, from `pod`, one forged datagram per millisecond built by `packet(n)` until `stop`;
/// returns how many were sent.
fn forge(
    pod: &Pod,
    stop: Arc<AtomicBool>,
    packet: impl Fn(u32) -> (Vec<u8>, SocketAddrV4) + Send + 'static,
) -> std::thread::JoinHandle<u32> {
    pod.ns.spawn(move || {
        let fd = raw_ipv4_socket().expect("raw socket (CAP_NET_RAW)");
        let mut sent = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let (p, dst) = packet(sent);
            if send_raw(&fd, &p, dst).is_ok() {
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    })
}

/// The attacker floods the silent trusted resolver with queries forged with the victim's
/// source address: each would hold one of the victim's namespace's in-flight slots for the
/// upstream timeout. The victim's own lookups (to the resolver that answers) must keep
/// working.
#[test]
fn a_flood_forged_with_a_neighbours_address_leaves_the_neighbour_its_lookups() {
    let t = topo(zone_with("v.example.com", "198.18.13.1"));
    let running = t.spawn(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let victim: Ipv4Addr = "10.128.0.5".parse().unwrap();
    let silent: SocketAddrV4 = SILENT.parse().unwrap();
    let flood = forge(&t.attacker, stop.clone(), move |n| {
        // A fresh source port and name per query, as a resolver's retries would look.
        let src = SocketAddrV4::new(victim, 20_000 + (n % 40_000) as u16);
        let q = question(&format!("q{n}.example.com"), n as u16);
        (spoofed_udp_packet(src, silent, &q), silent)
    });
    let (failures, sent) = t.lookups_under(&stop, flood);
    let limited = t
        .node
        .nft(&["list", "set", "inet", "nodeplane", "fw-dns-rate-v4"])
        .unwrap_or_else(|e| format!("no rate set: {e}"));
    running.stop_ok();
    assert!(
        sent > ENOUGH_FLOOD,
        "the flood was too small to prove anything: {sent}"
    );
    assert!(
        failures.is_empty(),
        "{} of 10 lookups failed under a forged flood of {sent} queries: {failures:?}\n{limited}",
        failures.len()
    );
    // The forged packets spent the attacker's bucket (its interface), not the victim's.
    let bucket = format!("\"{}\" . 10.128.0.5", t.attacker.host_iface);
    assert!(limited.contains(&bucket), "no {bucket} in\n{limited}");
}

/// A steered pod that sends queries as fast as it can gets `--dns-rate-limit` a second
/// (plus the burst) through to the proxy and the resolver; the rest is dropped in the
/// kernel, and its lookups work again once it slows down.
#[test]
fn a_pods_dns_is_limited_to_its_rate_in_the_kernel() {
    const RATE: u32 = 20;
    let t = topo(zone_with("v.example.com", "198.18.13.1"));
    let running = t.spawn(&["--dns-rate-limit", &RATE.to_string()]);
    // Let the bucket fill again after the start-up probes.
    std::thread::sleep(Duration::from_secs(2));
    let before = t.resolver.served();
    let started = std::time::Instant::now();
    let sent = t.victim.ns.enter(|| {
        let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let q = question("v.example.com", 1);
        let mut sent = 0u32;
        while started.elapsed() < Duration::from_secs(1) {
            if sock.send_to(&q, RESOLVER).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    let elapsed = started.elapsed().as_secs_f64();
    // Answers still on their way are counted by the server already (it answered them).
    std::thread::sleep(Duration::from_millis(500));
    let served = t.resolver.served() - before;
    std::thread::sleep(Duration::from_secs(1));
    let after = lookup(&t.victim.ns, resolver(), "v.example.com", LOOKUP);
    running.stop_ok();
    let most = f64::from(RATE) * (1.0 + elapsed + 0.5);
    eprintln!("{served} of {sent} queries reached the resolver in {elapsed:.2} s");
    assert!(
        sent > 2000,
        "the burst was too small to prove anything: {sent}"
    );
    assert!(
        (served as f64) <= most && served >= u64::from(RATE),
        "{served} of {sent} queries reached the resolver in {elapsed:.2} s (rate {RATE}/s, burst {RATE})"
    );
    assert!(after.is_ok(), "a lookup after the burst: {after:?}");
}

/// The `NoPorts` counter of `/proc/net/snmp` in `ns`: UDP datagrams for a port nobody bound.
fn udp_no_ports(ns: &Ns) -> u64 {
    let snmp = ns.enter(|| std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp"));
    let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    let (names, values) = (udp[0].split_whitespace(), udp[1].split_whitespace());
    names
        .zip(values)
        .find(|(n, _)| *n == "NoPorts")
        .and_then(|(_, v)| v.parse().ok())
        .expect("Udp: NoPorts")
}

/// While the victim's lookups wait 200 ms for a slow resolver, the attacker sprays answers
/// forged "from" that resolver (address and port 53) at the node, over its whole ephemeral
/// port range with random IDs, carrying the right question and its own address. The proxy
/// asks with a fresh random ID from a fresh port and accepts only that ID and question: the
/// forged address is never learned and never reaches the victim.
#[test]
fn answers_forged_from_the_trusted_resolver_are_never_learned_nor_forwarded() {
    let mut zone = zone_with("v.example.com", "198.18.13.1");
    zone.udp_delay = Duration::from_millis(200);
    let t = topo(zone);
    let running = t.spawn(&[]);
    let no_ports_before = udp_no_ports(&t.node);
    let stop = Arc::new(AtomicBool::new(false));
    let (resolver4, node4): (SocketAddrV4, Ipv4Addr) =
        (RESOLVER.parse().unwrap(), "192.168.1.1".parse().unwrap());
    let forged: Ipv4Addr = "198.18.66.66".parse().unwrap();
    let spray = t.attacker.ns.spawn({
        let stop = stop.clone();
        move || {
            let fd = raw_ipv4_socket().expect("raw socket (CAP_NET_RAW)");
            let mut sent = 0u64;
            // The node's default ephemeral range, again and again, with IDs that differ each time.
            'spray: loop {
                for port in 32_768u16..61_000 {
                    if stop.load(Ordering::Relaxed) {
                        break 'spray;
                    }
                    let id = (port as u64 ^ (sent >> 3).wrapping_mul(40_503)) as u16;
                    let answer = a_answer(id, "v.example.com", &[forged], 3600);
                    let to = SocketAddrV4::new(node4, port);
                    if send_raw(&fd, &spoofed_udp_packet(resolver4, to, &answer), to).is_ok() {
                        sent += 1;
                    }
                }
            }
            sent
        }
    });
    let started = std::time::Instant::now();
    let mut results = Vec::new();
    while started.elapsed() < Duration::from_secs(3) {
        results.push(lookup(&t.victim.ns, resolver(), "v.example.com", LOOKUP));
    }
    stop.store(true, Ordering::Relaxed);
    let sent = spray.join().unwrap();
    let no_ports = udp_no_ports(&t.node) - no_ports_before;
    let learned = t
        .node
        .nft(&[
            "list",
            "set",
            "inet",
            "nodeplane",
            &nodeplane::plan::firewall::Names::new("alpha")
                .learned_set("*.example.com", nodeplane::nft::ir::IpFamily::V4),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    running.stop_ok();
    eprintln!(
        "{sent} forged answers ({no_ports} to closed ports), {} lookups",
        results.len()
    );
    assert!(
        no_ports > 10_000,
        "the forged answers did not reach the node ({no_ports} to closed ports of {sent})"
    );
    let got: Vec<_> = results
        .iter()
        .map(|r| r.as_ref().map(|l| l.addrs.clone()))
        .collect();
    assert!(
        got.iter().all(|r| r
            .as_ref()
            .is_ok_and(|a| a == &["198.18.13.1".parse::<Ipv4Addr>().unwrap()])),
        "the victim must get the resolver's answer every time: {got:?}"
    );
    assert!(
        results.len() >= 5,
        "too few lookups in 3 s: {}",
        results.len()
    );
    assert!(
        !learned.contains("198.18.66.66"),
        "forged address learned:\n{learned}"
    );
    assert!(learned.contains("198.18.13.1"), "{learned}");
}
