//! kube-proxy parity cases of Services against the kernel with real packets (the flows of
//! kube-proxy's own nftables tests that nodeplane did not hold at first). Same lab as
//! [`crate::services`].

use crate::services::{NODE, OTHER, SHORT, TCP_PORTS, Topo, set, tcp_servers, topo};
use nodeplane::testing::lab::{Outcome, SECOND};
use nodeplane::testing::objects::{self, Ep, endpoint_slice, ep, service_ips};
use std::net::IpAddr;

const ZONE: &str = "topology.kubernetes.io/zone";

/// kube-proxy's TestLoadBalancer, "same node to LB1, SNATted to LB1 (implicitly allowed)":
/// a VIP-style LB IP is a local address of the node, so the node's own connection to it
/// leaves with the LB IP as source. It is allowed when a source range holds the node's
/// address, and masqueraded; otherwise the source filter drops it.
#[test]
fn lb_source_ranges_holding_the_node_address_let_the_node_use_its_lb_ip() {
    let t = topo();
    let b1 = t.v4(&t.b1);
    let lb = |name: &str, cluster_ip: &str, range: &str, ingress: &str| {
        service_ips(name, &[cluster_ip], "{name: http, port: 80, protocol: TCP}")
            .spec(&format!(
                "type: LoadBalancer, loadBalancerSourceRanges: ['{range}']"
            ))
            .lb_ingress(&[ingress])
            .to_string()
    };
    let docs = [
        // 192.168.1.1 is the node's InternalIP.
        lb("near", "172.30.0.40", "192.168.1.0/24", "203.0.113.70"),
        endpoint_slice("near", "near", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
        lb("far", "172.30.0.41", "198.51.100.0/24", "203.0.113.71"),
        endpoint_slice("far", "far", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
    ];
    // On the uplink, as kube-vip or MetalLB's layer 2 mode put them; added after the node's
    // own address, so masquerading picks that one.
    let listing = t
        .node
        .run(&["ip", "-o", "-4", "addr", "show", "to", "192.168.1.1"]);
    let uplink = listing
        .split_whitespace()
        .nth(1)
        .expect("the node's uplink");
    for vip in ["203.0.113.70/32", "203.0.113.71/32"] {
        t.node.run(&["ip", "addr", "add", vip, "dev", uplink]);
    }
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);

    let near: IpAddr = "203.0.113.70".parse().unwrap();
    let r = t
        .node
        .tcp_connect_from(near, "203.0.113.70:80", SECOND)
        .expect_reply();
    assert_eq!(r.server, "b1");
    assert_eq!(
        r.src_ip(),
        "192.168.1.1".parse::<IpAddr>().unwrap(),
        "the LB IP source is masqueraded"
    );
    let far: IpAddr = "203.0.113.71".parse().unwrap();
    assert_eq!(
        t.node.tcp_connect_from(far, "203.0.113.71:80", SHORT),
        Outcome::Timeout,
        "no source range holds the node's address: the LB IP source is dropped"
    );
    // The ranges themselves still decide for everyone else.
    assert!(t.ext.tcp_connect("203.0.113.70:80", SECOND).is_reply());
    assert_eq!(
        t.ext.tcp_connect("203.0.113.71:80", SHORT),
        Outcome::Timeout
    );
}

/// kube-proxy's `--nodeport-addresses`: NodePorts are served on the local addresses inside
/// the CIDRs given, not on the node's other addresses; the default (`primary`) is the Node's
/// InternalIP alone.
#[test]
fn nodeports_are_served_only_on_the_nodeport_addresses() {
    let t = topo();
    let b1 = t.v4(&t.b1);
    let docs = [
        service_ips(
            "np",
            &["172.30.0.42"],
            "{name: http, port: 80, protocol: TCP, nodePort: 30100}",
        )
        .spec("type: NodePort")
        .to_string(),
        endpoint_slice("np", "np", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);
    assert!(t.ext.tcp_connect("192.168.1.1:30100", SECOND).is_reply());
    assert_eq!(
        t.ext2.tcp_connect("192.168.2.1:30100", SECOND),
        Outcome::Refused,
        "the node's own stack answers: no NodePort on a non-primary address"
    );

    t.agent.once(&["--nodeport-addresses", "192.168.2.0/24"]);
    assert_eq!(
        t.ext2
            .tcp_connect("192.168.2.1:30100", SECOND)
            .expect_reply()
            .server,
        "b1"
    );
    // Neither the primary address, from outside or from a pod, serves it any more.
    assert_eq!(
        t.ext.tcp_connect("192.168.1.1:30100", SHORT),
        Outcome::Refused
    );
    assert_eq!(
        t.c1.ns.tcp_connect("192.168.1.1:30100", SHORT),
        Outcome::Refused
    );
}

/// kube-proxy's internal-and-external-Local case: with both traffic policies Local, pods
/// (and the node) reaching an external IP or NodePort of the service follow the internal
/// policy, so they reach only this node's endpoints too, and nothing when it has none. In
/// both layouts: the shared pools and a service's own chains (session affinity).
#[test]
fn pods_reaching_an_external_ip_follow_the_internal_policy_when_both_are_local() {
    let t = topo();
    let (b1, b2, b3) = (t.v4(&t.b1), t.v4(&t.b2), t.v4(&t.b3));
    let both_local = "externalTrafficPolicy: Local, internalTrafficPolicy: Local";
    let svc = |name: &str, ip: &str, node_port: u16, external_ip: &str, extra: &str| {
        let ports = format!("{{name: http, port: 80, protocol: TCP, nodePort: {node_port}}}");
        service_ips(name, &[ip], &ports)
            .spec(&format!(
                "type: NodePort, externalIPs: ['{external_ip}'], {both_local}{extra}"
            ))
            .to_string()
    };
    let sticky = ", sessionAffinity: ClientIP";
    let everywhere = [ep(&b1, NODE), ep(&b2, OTHER), ep(&b3, OTHER)];
    let remote = [ep(&b2, OTHER), ep(&b3, OTHER)];
    let docs = [
        svc("local", "172.30.0.50", 30110, "203.0.113.80", ""),
        endpoint_slice("local", "local", "IPv4", TCP_PORTS, &everywhere).to_string(),
        svc("remote", "172.30.0.51", 30111, "203.0.113.81", ""),
        endpoint_slice("remote", "remote", "IPv4", TCP_PORTS, &remote).to_string(),
        svc("sticky-local", "172.30.0.52", 30112, "203.0.113.82", sticky),
        endpoint_slice(
            "sticky-local",
            "sticky-local",
            "IPv4",
            TCP_PORTS,
            &everywhere,
        )
        .to_string(),
        svc(
            "sticky-remote",
            "172.30.0.53",
            30113,
            "203.0.113.83",
            sticky,
        ),
        endpoint_slice("sticky-remote", "sticky-remote", "IPv4", TCP_PORTS, &remote).to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent
        .once(&["--external-ip-allowed-cidrs", "203.0.113.0/24"]);

    let only_b1 = set(&["b1"]);
    for dst in [
        "203.0.113.80:80",
        "192.168.1.1:30110",
        "203.0.113.82:80",
        "192.168.1.1:30112",
    ] {
        assert_eq!(tcp_servers(&t.c1.ns, dst, 20), only_b1, "pod to {dst}");
        assert_eq!(tcp_servers(&t.ext, dst, 5), only_b1, "outside to {dst}");
    }
    for dst in [
        "203.0.113.81:80",
        "192.168.1.1:30111",
        "203.0.113.83:80",
        "192.168.1.1:30113",
    ] {
        assert_eq!(
            t.c1.ns.tcp_connect(dst, SHORT),
            Outcome::Timeout,
            "pod to {dst}: no local endpoint, dropped"
        );
    }
}

/// The services topology with this node in zone `zone-a`, and the backends' IPv4 addresses.
fn node_in_zone_a() -> (Topo, [String; 3]) {
    let t = topo();
    let backends = [&t.b1, &t.b2, &t.b3].map(|b| t.v4(b));
    let node = objects::node(NODE, &["192.168.1.1"]).labels(&[(ZONE, "zone-a")]);
    t.agent.write("nodes.yaml", &node.to_string());
    (t, backends)
}

/// HTTP Service `name` at `ip` with the given `trafficDistribution` (if any), and its
/// EndpointSlice of `endpoints`.
fn distributed(name: &str, ip: &str, distribution: Option<&str>, endpoints: &[Ep]) -> [String; 2] {
    let mut service = service_ips(name, &[ip], "{name: http, port: 80, protocol: TCP}");
    if let Some(d) = distribution {
        service = service.spec(&format!("trafficDistribution: {d}"));
    }
    let slice = endpoint_slice(name, name, "IPv4", TCP_PORTS, endpoints);
    [service.to_string(), slice.to_string()]
}

/// Topology-aware routing: a Service whose endpoints are hinted for zones (as the
/// EndpointSlice controller does for `trafficDistribution: PreferClose` or the
/// `topology-mode: Auto` annotation) reaches only the endpoints hinted for the node's zone,
/// and every endpoint when the hints are incomplete (kube-proxy's fallback).
#[test]
fn zone_hints_keep_cluster_traffic_in_the_nodes_zone() {
    let (t, [b1, b2, b3]) = node_in_zone_a();
    let hinted = [
        ep(&b1, NODE).for_zones(&["zone-a"]),
        ep(&b2, OTHER).for_zones(&["zone-b"]),
        ep(&b3, OTHER).for_zones(&["zone-a"]),
    ];
    let incomplete = [
        ep(&b1, NODE).for_zones(&["zone-a"]),
        ep(&b2, OTHER),
        ep(&b3, OTHER).for_zones(&["zone-a"]),
    ];
    let docs = [
        distributed("close", "172.30.0.60", Some("PreferClose"), &hinted),
        distributed("partial", "172.30.0.61", Some("PreferClose"), &incomplete),
        distributed("plain", "172.30.0.62", None, &hinted),
    ]
    .concat();
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);

    assert_eq!(
        tcp_servers(&t.c1.ns, "172.30.0.60:80", 30),
        set(&["b1", "b3"])
    );
    assert_eq!(
        tcp_servers(&t.c1.ns, "172.30.0.61:80", 40),
        set(&["b1", "b2", "b3"]),
        "incomplete hints: every endpoint"
    );
    // kube-proxy reads the hints whatever the Service says.
    assert_eq!(
        tcp_servers(&t.c1.ns, "172.30.0.62:80", 30),
        set(&["b1", "b3"])
    );
}

/// kube-proxy takes only `addresses[0]` of an endpoint (the API says the others are the same
/// endpoint): an endpoint listing two addresses gets the same share as one listing one, and
/// its second address gets nothing.
#[test]
fn an_endpoint_with_two_addresses_weighs_as_much_as_one_with_one() {
    let t = topo();
    let (b1, b2, b3) = (t.v4(&t.b1), t.v4(&t.b2), t.v4(&t.b3));
    let docs = [
        service_ips(
            "multi",
            &["172.30.0.70"],
            "{name: http, port: 80, protocol: TCP}",
        )
        .to_string(),
        endpoint_slice(
            "multi",
            "multi",
            "IPv4",
            TCP_PORTS,
            &[ep(&b1, OTHER).more_ips(&[&b2]), ep(&b3, OTHER)],
        )
        .to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);

    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..1000 {
        let r = t.c1.ns.tcp_connect("172.30.0.70:80", SECOND).expect_reply();
        *counts.entry(r.server).or_default() += 1;
    }
    eprintln!("1,000 connections: {counts:?}");
    assert_eq!(
        counts.get("b2"),
        None,
        "b2 is the first endpoint's second address"
    );
    // Two equal weights: 500 expected each, one standard deviation 15.8; 400..600 is more
    // than six deviations either way.
    for server in ["b1", "b3"] {
        let n = counts.get(server).copied().unwrap_or(0);
        assert!(
            (400..=600).contains(&n),
            "{server}: {n} of 1,000 ({counts:?})"
        );
    }
}

/// `trafficDistribution: PreferSameNode` (Kubernetes 1.33+): the EndpointSlice controller
/// hints each endpoint for its own node (`hints.forNodes`), and kube-proxy sends cluster
/// traffic to the endpoints hinted for this node when every ready endpoint has a node hint
/// and one is for this node; otherwise the zone hints decide, as kube-proxy's topology.go.
#[test]
fn prefer_same_node_chooses_the_local_endpoint() {
    let (t, [b1, b2, b3]) = node_in_zone_a();
    let same_node = [
        ep(&b1, NODE).for_nodes(&[NODE]).for_zones(&["zone-a"]),
        ep(&b2, OTHER).for_nodes(&[OTHER]).for_zones(&["zone-a"]),
        ep(&b3, OTHER).for_nodes(&[OTHER]).for_zones(&["zone-b"]),
    ];
    // One ready endpoint without a node hint: the zone hints decide.
    let partial = [
        ep(&b1, NODE).for_nodes(&[NODE]).for_zones(&["zone-a"]),
        ep(&b2, OTHER).for_zones(&["zone-a"]),
        ep(&b3, OTHER).for_nodes(&[OTHER]).for_zones(&["zone-b"]),
    ];
    let docs = [
        distributed("same", "172.30.0.71", Some("PreferSameNode"), &same_node),
        distributed("partial", "172.30.0.72", Some("PreferSameNode"), &partial),
    ]
    .concat();
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);

    assert_eq!(tcp_servers(&t.c1.ns, "172.30.0.71:80", 30), set(&["b1"]));
    assert_eq!(
        tcp_servers(&t.c1.ns, "172.30.0.72:80", 40),
        set(&["b1", "b2"])
    );
}
