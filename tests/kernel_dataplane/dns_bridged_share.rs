//! EgressFirewall DNS fairness for bridged pods without `br_netfilter`: every pod's query
//! enters the node's IP stack on the bridge (`br0`), so the input interface does not tell
//! the pods apart there. One pod flooding a trusted resolver that never answers (each query
//! holds a proxy slot for the upstream timeout) must not take its bridge neighbours' lookups.
//! (A pod that forges its neighbour's address there is stopped by `--pod-source-check` at its
//! bridge port while a NetworkPolicy is in force, not by the proxy: README, limits.)
//!
//! Node `node-1` with `br0` (10.128.5.0/24); the external host 192.168.1.100 runs the
//! resolver, and 192.168.1.222 is a second trusted resolver that never answers (routed to
//! the external host, which does not forward).

use nodeplane::testing::lab::dns::{DnsServer, Zone, a_query, lookup};
use nodeplane::testing::lab::{Lab, ManifestAgent, Ns, Pod, eventually, set_br_netfilter};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const NODE: &str = "node-1";
const LOOKUP: Duration = Duration::from_secs(2);
const RESOLVER: &str = "192.168.1.100:53";
const SILENT: &str = "192.168.1.222:53";

struct Topo {
    /// `alpha` (a `dnsName` rule): its DNS is steered.
    victim: Pod,
    /// Also `alpha`, on the same bridge.
    neighbour: Pod,
    resolver: DnsServer,
    agent: ManifestAgent,
    _node: Ns,
    _lab: Lab,
}

fn topo() -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let bridge = lab.add_bridge(&node, "br0", &["10.128.5.1/24"]);
    let victim = lab.add_bridged_pod(&bridge, "v", &["10.128.5.2/24"]);
    let neighbour = lab.add_bridged_pod(&bridge, "n", &["10.128.5.3/24"]);
    let ext = lab.add_uplink_host(&node, "ext");
    lab.add_route(&node, "192.168.1.222/32", "192.168.1.100");
    let mut zone = Zone::default();
    zone.fixed.insert(
        "v.example.com".into(),
        (vec!["198.18.13.1".parse().unwrap()], 30),
    );
    let resolver = DnsServer::start(&ext, RESOLVER.parse().unwrap(), zone);
    set_br_netfilter(&node, false);
    // No reverse-path filter (pods on one bridge pass it anyway).
    node.sysctl("net.ipv4.conf.all.rp_filter", "0");
    node.sysctl("net.ipv4.conf.br0.rp_filter", "0");
    let agent = crate::dns_attacks::steered_alpha_agent(
        &node,
        &[
            victim.manifest("alpha", "v", NODE),
            neighbour.manifest("alpha", "n", NODE),
        ],
    );
    Topo {
        victim,
        neighbour,
        resolver,
        agent,
        _node: node,
        _lab: lab,
    }
}

impl Topo {
    /// Starts the agent and waits until the victim's lookups go through the proxy.
    fn spawn(&self) -> nodeplane::testing::lab::AgentProcess {
        let resolv = self.agent.dir().join("resolv.conf.txt");
        let running = self
            .agent
            .spawn(&["--resolv-conf", resolv.to_str().unwrap()]);
        eventually(Duration::from_secs(15), || {
            let _ = self.resolver.take_sources();
            lookup(&self.victim.ns, resolver(), "v.example.com", LOOKUP)?;
            let sources = self.resolver.take_sources();
            sources
                .contains(&"192.168.1.1".parse::<IpAddr>().unwrap())
                .then_some(())
                .ok_or(format!("not proxied: {sources:?}"))
        });
        running
    }

    /// Ten lookups of the victim while `flood` runs (started 6 s before: past the upstream
    /// timeout, the flood holds all it ever can); the failures and how many were sent.
    fn lookups_under(&self, flood: Flood) -> (Vec<String>, u32) {
        std::thread::sleep(Duration::from_secs(6));
        let failures: Vec<String> = (0..10)
            .filter_map(|_| lookup(&self.victim.ns, resolver(), "v.example.com", LOOKUP).err())
            .collect();
        flood.0.store(true, Ordering::Relaxed);
        (failures, flood.1.join().unwrap())
    }
}

/// A running flood: its stop flag and its thread (which returns how many it sent).
struct Flood(Arc<AtomicBool>, std::thread::JoinHandle<u32>);

fn resolver() -> SocketAddr {
    RESOLVER.parse().unwrap()
}

/// `alpha`'s pod `n` asks the silent resolver with its own address, from a fresh port per
/// query (as a resolver's retries look), ~1,000 queries a second.
#[test]
fn a_bridged_pods_flood_leaves_its_bridge_neighbour_its_lookups() {
    let t = topo();
    let running = t.spawn();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = t.neighbour.ns.spawn(move || {
        let silent: SocketAddr = SILENT.parse().unwrap();
        let mut sent = 0u32;
        while !flag.load(Ordering::Relaxed) {
            let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let q = a_query(&format!("q{sent}.example.com"), sent as u16);
            if sock.send_to(&q, silent).is_ok() {
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    });
    let (failures, sent) = t.lookups_under(Flood(stop, thread));
    let (status, logs) = running.stop();
    assert!(
        sent > 3000,
        "the flood was too small to prove anything: {sent}"
    );
    assert!(
        failures.is_empty(),
        "{} of 10 lookups failed under its bridge neighbour's flood of {sent} queries: {failures:?}",
        failures.len()
    );
    assert!(status.success(), "{status}:\n{logs}");
}
