//! EgressFirewall DNS under a learning flood: the pods of two namespaces look up many names
//! whose answers carry many addresses each. What is learned stays within the caps
//! (`--dns-max-addresses-per-name`, `--dns-max-addresses-per-namespace`), whatever the
//! flood offers; the agent's resident memory before and after is printed (a figure for
//! docs/performance.md, not asserted: memory is judged by the counts it follows from).
//!
//! `NODEPLANE_TEST_FLOOD_NAMES` (default 400) sets the names per namespace.

use nodeplane::nft::ir::IpFamily;
use nodeplane::plan::firewall::Names;
use nodeplane::testing::lab::dns::{DnsServer, Zone, lookup_here};
use nodeplane::testing::lab::{Lab, ManifestAgent, Ns, Pod, eventually};
use nodeplane::testing::objects;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const RESOLVER: &str = "192.168.1.100:53";
/// Addresses per answer (what fits the lab client's 4 KiB UDP buffer).
const PER_ANSWER: u32 = 120;
const PER_NAME: usize = 50;
const PER_NAMESPACE: usize = 2000;
/// Parallel resolvers per pod.
const THREADS: u32 = 4;

/// `kB` of `VmRSS` and `VmHWM` (peak) of process `pid`.
fn memory_kb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The addresses of name `i` of namespace number `ns`: `PER_ANSWER` from one /24 per name,
/// a /12 of 100.64.0.0/10 per namespace (nothing connects to them: only learning counts).
fn addresses(ns: u32, i: u32) -> Vec<Ipv4Addr> {
    let base = u32::from(Ipv4Addr::new(100, 64, 0, 0)) + (ns << 20) + (i << 8);
    (1..=PER_ANSWER).map(|j| Ipv4Addr::from(base + j)).collect()
}

/// The learned elements of the namespace's `*.example.com` set, by /24 (one name each).
fn learned_by_name(node: &Ns, namespace: &str) -> BTreeMap<[u8; 3], usize> {
    let set = Names::new(namespace).learned_set("*.example.com", IpFamily::V4);
    let listing = node
        .nft(&["list", "set", "inet", "nodeplane", &set])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut by = BTreeMap::new();
    for word in listing.split(|c: char| c.is_whitespace() || c == ',') {
        if let Ok(a) = word.parse::<Ipv4Addr>() {
            let o = a.octets();
            *by.entry([o[0], o[1], o[2]]).or_insert(0) += 1;
        }
    }
    by
}

/// Looks up names `range` of each namespace from its pod, `THREADS` resolvers each;
/// returns how many lookups failed.
fn flood(pods: &[(&str, Pod)], server: SocketAddr, range: std::ops::Range<u32>) -> u32 {
    let mut floods = Vec::new();
    for (ns, pod) in pods {
        for t in 0..THREADS {
            let (ns, range) = (ns.to_string(), range.clone());
            floods.push(pod.ns.spawn(move || {
                let mut failed = 0u32;
                for i in range.skip(t as usize).step_by(THREADS as usize) {
                    let name = format!("{ns}-{i}.example.com");
                    if lookup_here(server, &name, Duration::from_secs(2)).is_err() {
                        failed += 1;
                    }
                }
                failed
            }));
        }
    }
    floods.into_iter().map(|f| f.join().unwrap()).sum()
}

/// `NODEPLANE_TEST_FLOOD_NAMES`, or 400.
fn names_per_namespace() -> u32 {
    let names: u32 = std::env::var("NODEPLANE_TEST_FLOOD_NAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    assert!(
        names <= 4096,
        "at most 4096 names per namespace, got {names}"
    );
    names
}

/// `names` names per namespace of `pods` (see [`addresses`]), and `probe.example.com`.
fn flood_zone(pods: &[(&str, Pod)], names: u32) -> Zone {
    let mut zone = Zone::default();
    for (n, (ns, _)) in pods.iter().enumerate() {
        for i in 0..names {
            zone.fixed.insert(
                format!("{ns}-{i}.example.com"),
                (addresses(n as u32, i), 300),
            );
        }
    }
    zone.fixed.insert(
        "probe.example.com".into(),
        (vec![[198, 19, 255, 1].into()], 300),
    );
    zone
}

/// Each pod's namespace learns `*.example.com` and denies the rest.
fn write_learning_firewalls(agent: &ManifestAgent, pods: &[(&str, Pod)]) {
    let mut objs = Vec::new();
    for (ns, pod) in pods {
        objs.push(objects::pod(ns, "p").on(NODE).ips(&pod.addrs).to_string());
        agent.write(
            &format!("fw-{ns}.yaml"),
            &objects::egress_firewall(
                ns,
                // The resolver is outside the cluster: the firewall must let DNS reach it.
                "[{type: Allow, to: {cidrSelector: 192.168.1.100/32}, ports: [{protocol: UDP, port: 53}]}, \
                  {type: Allow, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
            )
            .to_string(),
        );
    }
    agent.write("pods.yaml", &objs.join("---\n"));
}

/// Waits until `pod`'s lookups reach `resolver` through the proxy (from the node's address).
fn wait_until_proxied(pod: &Pod, resolver: &DnsServer, server: SocketAddr) {
    eventually(Duration::from_secs(15), || {
        let _ = resolver.take_sources();
        pod.ns
            .enter(|| lookup_here(server, "probe.example.com", Duration::from_secs(2)))?;
        let from = resolver.take_sources();
        from.contains(&IpAddr::from([192, 168, 1, 1]))
            .then_some(())
            .ok_or(format!("not proxied: {from:?}"))
    });
}

/// Each namespace learned within the caps, and filled them (the caps evict the oldest).
fn assert_within_the_caps(learned: &[(&str, BTreeMap<[u8; 3], usize>)], names: u32) {
    for (ns, by) in learned {
        let total: usize = by.values().sum();
        assert!(
            total <= PER_NAMESPACE,
            "{ns} learned {total} addresses (cap {PER_NAMESPACE})"
        );
        let widest = by.values().max().copied().unwrap_or(0);
        assert!(
            widest <= PER_NAME,
            "{ns}: one name learned {widest} addresses (cap {PER_NAME})"
        );
        // The caps evict the oldest: the namespace is full, not empty.
        assert!(
            total >= PER_NAMESPACE.min(names as usize * PER_NAME) / 2,
            "{ns} learned only {total}"
        );
    }
}

#[test]
fn a_learning_flood_stays_within_the_caps() {
    let names = names_per_namespace();
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pods = [
        ("alpha", lab.add_pod(&node, "a", &["10.128.0.5"])),
        ("beta", lab.add_pod(&node, "b", &["10.128.0.7"])),
    ];
    let ext = lab.add_uplink_host(&node, "ext");
    let zone = flood_zone(&pods, names);
    let resolver = DnsServer::start(&ext, RESOLVER.parse().unwrap(), zone);
    let mut agent = ManifestAgent::new(&node, NODE, &["--cluster-cidr", "10.128.0.0/14"]);
    write_learning_firewalls(&agent, &pods);
    agent.set_resolv_conf("nameserver 192.168.1.100\n");
    // The flood measures learning, not the per-pod rate limit.
    let running = agent.spawn(&["--dns-rate-limit", "0"]);
    let server: SocketAddr = RESOLVER.parse().unwrap();
    wait_until_proxied(&pods[0].1, &resolver, server);
    let before = memory_kb(running.pid());
    let started = Instant::now();
    // Two rounds of fresh names: memory after the second shows whether it keeps growing.
    let half = names / 2;
    let mut failed = flood(&pods, server, 0..half);
    let middle = memory_kb(running.pid());
    failed += flood(&pods, server, half..names);
    let took = started.elapsed();
    let after = memory_kb(running.pid());
    let learned: Vec<_> = pods
        .iter()
        .map(|(ns, _)| (*ns, learned_by_name(&node, ns)))
        .collect();
    running.stop_ok();
    let offered = 2 * names * PER_ANSWER;
    eprintln!(
        "{offered} addresses offered in {} answers in {took:.1?} ({failed} lookups failed); \
         agent VmRSS {} -> {} (half way) -> {} kB, peak {} kB; learned {:?}",
        2 * names,
        before.0,
        middle.0,
        after.0,
        after.1,
        learned
            .iter()
            .map(|(ns, by)| (*ns, by.values().sum::<usize>()))
            .collect::<Vec<_>>(),
    );
    assert_within_the_caps(&learned, names);
    assert!(
        failed <= names / 20,
        "{failed} of {} lookups failed",
        2 * names
    );
}
