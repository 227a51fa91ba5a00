//! NetworkPolicy with the other features, on the two-node cluster of `netpol`: service
//! traffic is judged by its endpoint (the forward hook runs after service DNAT), and on a
//! pod's egress EgressFirewall and NetworkPolicy must both accept.

use super::netpol::{Cluster, NODES, cluster, in_ns, policy};
use nodeplane::testing::lab::{Endpoint, Probe, SECOND, assert_truth};
use nodeplane::testing::objects;

const CLUSTER_IP: &str = "172.30.0.10";

/// `extra` (a Service, an EgressFirewall) written next to the policies.
fn apply_with(c: &Cluster, policies: &[String], extra: &[String]) {
    let mut docs = policies.to_vec();
    docs.extend_from_slice(extra);
    c.apply(&docs);
}

#[test]
fn service_traffic_is_judged_by_its_endpoint() {
    let c = cluster();
    // Service x/web -> x/a:80 (on node-1).
    let service = objects::service(
        "web",
        CLUSTER_IP,
        "{port: 80, protocol: TCP, targetPort: 80}",
    )
    .in_namespace("x")
    .to_string();
    let slice = objects::endpoint_slice(
        "web",
        "web",
        "IPv4",
        "{port: 80, protocol: TCP}",
        &[objects::ep("10.128.0.10", NODES[0])],
    )
    .in_namespace("x")
    .to_string();
    let only_b = policy(
        "x",
        "only-b",
        "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]\n",
    );
    // Locally generated traffic needs a route before nat-output can DNAT it (clusters have a
    // default route; the lab nodes have none).
    for (node, peer) in c.nodes.iter().zip(["192.168.2.2", "192.168.2.1"]) {
        node.run(&["ip", "route", "add", "172.30.0.0/16", "via", peer]);
    }
    apply_with(&c, &[only_b], &[service, slice]);
    let x_a = &c.pods[0].1;
    let svc = [Endpoint {
        name: "x/web".into(),
        ns: x_a.ns.clone(),
        addr: CLUSTER_IP.parse().unwrap(),
    }];
    // x/a itself is left out: its own service hairpins through forward, a case of its own.
    let clients: Vec<Endpoint> = c
        .clients(4)
        .into_iter()
        .filter(|e| e.name != "x/a")
        .collect();
    assert_truth(
        "ClusterIP of x/a",
        &clients,
        &svc,
        Probe::Tcp(80),
        |from, _| from == "x/b" || from == NODES[0],
    );
}

#[test]
fn egress_firewall_and_network_policy_must_both_accept() {
    let c = cluster();
    let _srv = c.nodes[1].tcp_server("[::]:80", "node-2");
    let y_a = &c.pods[3].1;
    assert!(in_ns(&c.pods[3].0, "y"));
    let reaches_node2 = || y_a.ns.tcp_connect("192.168.2.2:80", SECOND).is_reply();
    let egress_to = |cidr: &str| {
        policy(
            "y",
            "egress",
            &format!(
                "  podSelector: {{}}\n  policyTypes: [Egress]\n  egress: [{{to: [{{ipBlock: {{cidr: {cidr}}}}}]}}]\n"
            ),
        )
    };
    let firewall = |action: &str| {
        objects::egress_firewall(
            "y",
            &format!("[{{type: {action}, to: {{cidrSelector: 192.168.2.2/32}}}}]"),
        )
        .to_string()
    };
    apply_with(&c, &[egress_to("192.168.2.0/24")], &[firewall("Allow")]);
    assert!(reaches_node2(), "both allow");
    apply_with(&c, &[egress_to("10.0.0.0/8")], &[firewall("Allow")]);
    assert!(!reaches_node2(), "the firewall allows, the policy does not");
    apply_with(&c, &[egress_to("192.168.2.0/24")], &[firewall("Deny")]);
    assert!(!reaches_node2(), "the policy allows, the firewall does not");
}
