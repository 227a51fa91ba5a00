//! kube-proxy parity cases of the services planner (the packet-level checks are in the
//! kernel tests).

use super::tests::slice;
use crate::config::Config;
use crate::nft::render::render_full;
use crate::plan::{plan, plan_with};
use crate::snapshot::Snapshot;
use crate::testing::objects;

/// The rule of the source-filter chain of `ns/name` that lists the allowed sources.
fn allowed_sources(d: &crate::plan::Desired, name: &str) -> String {
    let text = render_full(&d.ruleset);
    let mut in_filter = false;
    for line in text.lines() {
        if line.trim_start().starts_with("chain ") {
            in_filter = line.contains("chain svf-") && line.contains(&format!("-ns_{name}_"));
        } else if in_filter && line.contains("saddr {") {
            return line.trim().to_string();
        }
    }
    panic!("no source filter for {name} in:\n{text}")
}

fn lb(name: &str, ip: &str, range: &str, ingress: &str) -> crate::api::Service {
    let ports = "{name: http, port: 80, protocol: TCP}";
    let spec = format!("type: LoadBalancer, loadBalancerSourceRanges: ['{range}']");
    let s = objects::service(name, ip, ports).in_namespace("ns");
    s.spec(&spec).lb_ingress(&[ingress]).object()
}

#[test]
fn source_ranges_holding_the_node_address_allow_the_lb_ips() {
    let cfg = Config::for_node("n1");
    let snap = Snapshot::builder()
        .with(objects::node("n1", &["192.168.1.1"]).object())
        .with(lb("near", "172.30.0.1", "192.168.1.0/24", "203.0.113.60"))
        .with(slice("near", &["10.128.0.1"]))
        .with(lb("far", "172.30.0.2", "10.0.0.0/8", "203.0.113.61"))
        .with(slice("far", &["10.128.0.1"]))
        .build();
    let first = plan(&snap, &cfg);
    assert!(allowed_sources(&first, "near").contains("{ 192.168.1.0/24, 203.0.113.60/32 }"));
    assert!(!allowed_sources(&first, "far").contains("203.0.113.61"));

    // The node's address moves into the other range: re-planned as a fresh plan would.
    let mut b = snap.to_builder();
    b.insert(objects::node("n1", &["10.1.2.3"]).object());
    let moved = b.build();
    let incremental = plan_with(&moved, &cfg, &first.memory);
    assert_eq!(
        render_full(&incremental.ruleset),
        render_full(&plan(&moved, &cfg).ruleset)
    );
    assert!(!allowed_sources(&incremental, "near").contains("203.0.113.60"));
    assert!(allowed_sources(&incremental, "far").contains("{ 10.0.0.0/8, 203.0.113.61/32 }"));
}

#[test]
fn nodeport_addresses_are_the_primary_ones_or_the_cidrs_per_family() {
    use crate::config::NodePortAddresses;
    use crate::plan::services::nodeports::addresses_part;
    let elements = |p: &crate::nft::ir::Part| -> Vec<String> {
        let mut out: Vec<String> = p
            .elements
            .values()
            .flat_map(|e| e.keys())
            .map(|k| format!("{k:?}"))
            .collect();
        out.sort();
        out
    };
    let ip = |s: &str| s.parse().unwrap();
    let net = |s: &str| s.parse().unwrap();
    let primary = addresses_part(&NodePortAddresses::Primary, &[ip("192.168.1.1")]);
    assert_eq!(elements(&primary), vec!["[Prefix(192.168.1.1/32)]"]);
    // No address known for the node: no NodePort anywhere.
    assert!(elements(&addresses_part(&NodePortAddresses::Primary, &[])).is_empty());
    // CIDRs: overlapping ones merged; a family without any gets all of its addresses.
    let cidrs = NodePortAddresses::Cidrs(vec![net("10.0.0.0/8"), net("10.1.0.0/16")]);
    assert_eq!(
        elements(&addresses_part(&cidrs, &[ip("192.168.1.1")])),
        vec!["[Prefix(10.0.0.0/8)]", "[Prefix(::/0)]"]
    );
}

#[test]
fn nodeport_lookups_are_limited_to_the_address_sets() {
    let mut cfg = Config::for_node("n1");
    cfg.nodeport_addresses =
        crate::config::NodePortAddresses::Cidrs(vec!["192.168.2.0/24".parse().unwrap()]);
    let snap = Snapshot::builder()
        .with(objects::node("n1", &["192.168.1.1"]).object())
        .build();
    let text = render_full(&plan(&snap, &cfg).ruleset);
    for map in ["@svc-nodeports", "@svc-noep-nodeports"] {
        let lookups: Vec<&str> = text.lines().filter(|l| l.contains(map)).collect();
        assert_eq!(lookups.len(), 2, "{text}");
        assert!(lookups[0].contains("ip daddr @svc-nodeport-addrs-v4 fib daddr type local"));
        assert!(lookups[1].contains("ip6 daddr @svc-nodeport-addrs-v6 fib daddr type local"));
    }
    assert!(text.contains("192.168.2.0/24"), "{text}");
}

/// The backend addresses rendered for the plan (the `svc-backends-v4` elements).
fn backend_ips(d: &crate::plan::Desired) -> Vec<String> {
    let text = render_full(&d.ruleset);
    let mut ips: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(" : ").nth(1))
        .filter_map(|v| v.split(" . ").next())
        .filter(|ip| ip.starts_with("10.128."))
        .map(|ip| ip.trim_end_matches(',').to_string())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

#[test]
fn zone_hints_narrow_cluster_traffic_with_kube_proxys_fallbacks() {
    let cfg = Config::for_node("n1");
    let zoned = |hints: &[(&str, &[&str])]| {
        let ports = "{name: http, port: 8080, protocol: TCP}";
        let eps: Vec<_> = hints
            .iter()
            .map(|(ip, zones)| objects::ep(ip, "n2").for_zones(zones))
            .collect();
        let s = objects::endpoint_slice("a-x", "a", "IPv4", ports, &eps);
        s.in_namespace("ns").object()
    };
    let asked = |extra: &str| {
        let ports = "{name: http, port: 80, protocol: TCP}";
        let s = objects::service("a", "172.30.0.1", ports).in_namespace("ns");
        s.spec(extra).object()
    };
    let node = |zone: &str| {
        objects::node("n1", &["192.168.1.1"])
            .labels(&[("topology.kubernetes.io/zone", zone)])
            .object()
    };
    let hinted = zoned(&[
        ("10.128.0.1", &["a"]),
        ("10.128.0.2", &["b"]),
        ("10.128.0.3", &["a", "b"]),
    ]);
    let snap = Snapshot::builder()
        .with(node("a"))
        .with(asked("trafficDistribution: PreferClose"))
        .with(hinted.clone())
        .build();
    let first = plan(&snap, &cfg);
    assert_eq!(backend_ips(&first), ["10.128.0.1", "10.128.0.3"]);

    // The node moves to zone b: re-planned as a fresh plan would be.
    let mut b = snap.to_builder();
    b.insert(node("b"));
    let moved = b.build();
    let incremental = plan_with(&moved, &cfg, &first.memory);
    assert_eq!(backend_ips(&incremental), ["10.128.0.2", "10.128.0.3"]);
    assert_eq!(
        render_full(&incremental.ruleset),
        render_full(&plan(&moved, &cfg).ruleset)
    );

    let all = ["10.128.0.1", "10.128.0.2", "10.128.0.3"];
    let with = |node_zone: &str, svc: crate::api::Service, slice| {
        let snap = Snapshot::builder()
            .with(node(node_zone))
            .with(svc)
            .with(slice)
            .build();
        backend_ips(&plan(&snap, &cfg))
    };
    // Not asked for by the Service: the hints still decide, as in kube-proxy.
    assert_eq!(
        with("a", asked(""), hinted.clone()),
        ["10.128.0.1", "10.128.0.3"]
    );
    // No endpoint hinted for this zone.
    assert_eq!(
        with(
            "c",
            asked("trafficDistribution: PreferClose"),
            hinted.clone()
        ),
        all
    );
    // One ready endpoint without a hint.
    let partial = zoned(&[
        ("10.128.0.1", &["a"]),
        ("10.128.0.2", &[]),
        ("10.128.0.3", &["a"]),
    ]);
    assert_eq!(
        with("a", asked("trafficDistribution: PreferClose"), partial),
        all
    );
}

/// How many backend-map buckets point at each backend address.
fn backend_buckets(d: &crate::plan::Desired) -> std::collections::BTreeMap<String, usize> {
    let text = render_full(&d.ruleset);
    let mut counts = std::collections::BTreeMap::new();
    for ip in text
        .lines()
        .filter_map(|l| l.split(" : ").nth(1))
        .filter_map(|v| v.split(" . ").next())
        .filter(|ip| ip.starts_with("10.128."))
    {
        *counts
            .entry(ip.trim_end_matches(',').to_string())
            .or_default() += 1;
    }
    counts
}

#[test]
fn only_the_first_address_of_an_endpoint_is_a_backend() {
    let cfg = Config::for_node("n1");
    let ports = "{name: http, port: 8080, protocol: TCP}";
    let eps = [
        objects::ep("10.128.0.1", "n2").more_ips(&["10.128.0.2"]),
        objects::ep("10.128.0.3", "n2"),
    ];
    let snap = Snapshot::builder()
        .with(
            objects::service("a", "172.30.0.1", "{name: http, port: 80, protocol: TCP}")
                .in_namespace("ns")
                .object(),
        )
        .with(
            objects::endpoint_slice("a-x", "a", "IPv4", ports, &eps)
                .in_namespace("ns")
                .object(),
        )
        .build();
    let buckets = backend_buckets(&plan(&snap, &cfg));
    assert_eq!(
        buckets.keys().collect::<Vec<_>>(),
        ["10.128.0.1", "10.128.0.3"],
        "{buckets:?}"
    );
    assert_eq!(
        buckets["10.128.0.1"], buckets["10.128.0.3"],
        "equal weights"
    );
}

#[test]
fn node_hints_come_first_then_zone_hints_as_in_kube_proxy() {
    let cfg = Config::for_node("n1");
    let node = objects::node("n1", &["192.168.1.1"])
        .labels(&[("topology.kubernetes.io/zone", "a")])
        .object();
    let svc = |extra: &str| {
        let ports = "{name: http, port: 80, protocol: TCP}";
        let s = objects::service("a", "172.30.0.1", ports).in_namespace("ns");
        s.spec(extra).object()
    };
    // (address, node, forNodes, forZones)
    let slice = |eps: &[(&str, &str, &[&str], &[&str])]| {
        let ports = "{name: http, port: 8080, protocol: TCP}";
        let eps: Vec<_> = eps
            .iter()
            .map(|(ip, n, nodes, zones)| objects::ep(ip, n).for_nodes(nodes).for_zones(zones))
            .collect();
        let s = objects::endpoint_slice("a-x", "a", "IPv4", ports, &eps);
        s.in_namespace("ns").object()
    };
    let with = |svc: crate::api::Service, slice| {
        let snap = Snapshot::builder()
            .with(node.clone())
            .with(svc)
            .with(slice)
            .build();
        backend_ips(&plan(&snap, &cfg))
    };
    let same_node = "trafficDistribution: PreferSameNode";
    let complete = slice(&[
        ("10.128.0.1", "n1", &["n1"], &["a"]),
        ("10.128.0.2", "n2", &["n2"], &["a"]),
        ("10.128.0.3", "n3", &["n3"], &["b"]),
    ]);
    assert_eq!(with(svc(same_node), complete.clone()), ["10.128.0.1"]);
    // One ready endpoint without a node hint: the zone hints decide.
    let partial = slice(&[
        ("10.128.0.1", "n1", &["n1"], &["a"]),
        ("10.128.0.2", "n2", &[], &["a"]),
        ("10.128.0.3", "n3", &["n3"], &["b"]),
    ]);
    assert_eq!(with(svc(same_node), partial), ["10.128.0.1", "10.128.0.2"]);
    // No endpoint hinted for this node: the zone hints decide.
    let elsewhere = slice(&[
        ("10.128.0.2", "n2", &["n2"], &["a"]),
        ("10.128.0.3", "n3", &["n3"], &["b"]),
    ]);
    assert_eq!(with(svc(same_node), elsewhere), ["10.128.0.2"]);
    // kube-proxy reads the hints whatever the Service says (the EndpointSlice controller
    // writes them only for a Service that asks).
    assert_eq!(with(svc(""), complete), ["10.128.0.1"]);
}
