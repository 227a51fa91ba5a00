use super::*;
use crate::api::{Namespace, Node, Pod};
use crate::net::{RouteSpec, RuleSpec};
use crate::nft::diff::{Op, diff};
use crate::plan::{Desired, plan as plan_all};
use crate::snapshot::{Kind, SnapshotBuilder};
use crate::testing::objects;

fn node(name: &str, ips: &[&str]) -> Node {
    objects::node(name, ips).object()
}

fn namespace(name: &str, team: &str) -> Namespace {
    objects::namespace(name, &[("team", team)]).object()
}

fn pod(node: &str, ns: &str, name: &str, app: &str, ips: &[&str]) -> Pod {
    let pod = objects::pod(ns, name).on(node).labels(&[("app", app)]);
    pod.ips(ips).object()
}

/// Selects pods `app: api` in namespaces `team: backend`.
fn egress_ip(name: &str, created: Option<&str>, ips: &[&str], hosts: &[(&str, &str)]) -> EgressIP {
    objects::egress_ip(name, ips, &[("team", "backend")])
        .pods(&[("app", "api")])
        .hosted(hosts)
        .created(created)
        .object()
}

/// Three nodes, pods on worker-1 and worker-2, one EgressIP hosted as given.
fn cluster(hosts: &[(&str, &str)]) -> SnapshotBuilder {
    Snapshot::builder()
        .with(node("worker-1", &["192.168.50.11", "fd00:50::11"]))
        .with(node("worker-2", &["192.168.50.12", "fd00:50::12"]))
        .with(node("worker-3", &["192.168.50.13", "fd00:50::13"]))
        .with(namespace("backend", "backend"))
        .with(namespace("frontend", "frontend"))
        .with(pod(
            "worker-1",
            "backend",
            "api1",
            "api",
            &["10.128.1.5", "fd01:0:0:1::5"],
        ))
        .with(pod("worker-2", "backend", "api2", "api", &["10.128.2.5"]))
        .with(pod("worker-2", "backend", "web2", "web", &["10.128.2.6"]))
        .with(pod(
            "worker-2",
            "frontend",
            "front2",
            "api",
            &["10.128.2.7"],
        ))
        .with(egress_ip(
            "backend",
            None,
            &["192.168.50.200", "192.168.50.201", "fd00:50::200"],
            hosts,
        ))
}

/// The plan for `node` after its net backend refused `ip` for `reason` (the second planning
/// step, as the reconciler runs it).
fn refused_on(node: &str, snap: &Snapshot, ip: &str, reason: &str) -> Desired {
    let config = Config::for_node(node);
    let mut d = plan_all(snap, &config);
    let refused = [crate::net::Refusal {
        addr: ip.parse().unwrap(),
        reason: reason.into(),
    }];
    let report = crate::plan::BackendReport {
        refused: &refused,
        bridge_ports: None,
    };
    let answers = crate::plan::Answers::default();
    crate::plan::settle(snap, &config, &answers, &mut d, &report);
    d
}

/// worker-1's plan when no interface of it can take 192.168.50.200, the address it hosts:
/// nothing is SNATed to it.
fn unplaceable_on_worker_1() -> Desired {
    let snap = cluster(&[("192.168.50.200", "worker-1")]).build();
    let reason = "no interface subnet contains it";
    let d = refused_on("worker-1", &snap, "192.168.50.200", reason);
    assert!(elements(&d, SNAT_V4).is_empty());
    d
}

fn on(node: &str, snap: &Snapshot) -> Desired {
    plan_all(snap, &Config::for_node(node))
}

/// The steering routes (every route but the reverse-path table's).
fn steer_routes(d: &Desired) -> impl Iterator<Item = &RouteSpec> {
    d.net.routes.iter().filter(|r| r.table != RETURN_TABLE)
}

/// The steering rules (every rule but the reverse-path one).
fn steer_rules(d: &Desired) -> impl Iterator<Item = &RuleSpec> {
    d.net.rules.iter().filter(|r| r.table != RETURN_TABLE)
}

fn elements(d: &Desired, map: &str) -> Vec<(String, String)> {
    d.ruleset.flatten().sets[map]
        .elements
        .iter()
        .map(|(k, v)| {
            let value = |v: &Value| match v {
                Value::Ipv4(a) => a.to_string(),
                Value::Ipv6(a) => a.to_string(),
                other => format!("{other:?}"),
            };
            let key = match &k[0] {
                KeyPart::Value(v) => value(v),
                other => format!("{other:?}"),
            };
            let data = match &v.data {
                Some(ElemData::Values(vals)) => value(&vals[0]),
                Some(ElemData::Verdict(v)) => format!("{v:?}"),
                None => String::new(),
            };
            (key, data)
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn eip_status(d: &Desired, name: &str) -> Result<(), String> {
    d.statuses
        .iter()
        .find(|s| s.kind == Kind::EgressIP && s.key.name == name)
        .expect("status")
        .result
        .clone()
}

#[test]
fn hosting_node_snats_every_selected_pod_and_holds_the_address() {
    let snap = cluster(&[("192.168.50.200", "worker-1"), ("fd00:50::200", "worker-1")]).build();
    let d = on("worker-1", &snap);
    assert_eq!(
        elements(&d, SNAT_V4),
        pairs(&[
            ("10.128.1.5", "192.168.50.200"),
            ("10.128.2.5", "192.168.50.200")
        ]),
        "local and remote selected pods; not web2 (podSelector) nor front2 (namespace)"
    );
    assert_eq!(
        elements(&d, SNAT_V6),
        pairs(&[("fd01:0:0:1::5", "fd00:50::200")])
    );
    assert!(elements(&d, STEER_V4).is_empty());
    let addrs: Vec<String> = d.net.addresses.iter().map(|a| a.to_string()).collect();
    assert_eq!(addrs, vec!["192.168.50.200/32", "fd00:50::200/128"]);
    assert_eq!((steer_routes(&d).count(), steer_rules(&d).count()), (0, 0));
    let tunnel = d
        .net
        .tunnel
        .as_ref()
        .expect("hosting nodes receive on the tunnel");
    assert_eq!(tunnel.local.to_string(), "192.168.50.11");
    assert!(tunnel.peers.is_empty());
    assert_eq!(eip_status(&d, "backend"), Ok(()));
}

#[test]
fn other_nodes_steer_local_pods_over_multipath_to_all_hosting_nodes() {
    let snap = cluster(&[
        ("192.168.50.200", "worker-1"),
        ("192.168.50.201", "worker-3"),
    ])
    .build();
    let d = on("worker-2", &snap);
    assert_eq!(
        elements(&d, STEER_V4),
        pairs(&[("10.128.2.5", "Jump(\"eip-steer-0\")")])
    );
    assert_eq!(
        elements(&d, SNAT_V4),
        pairs(&[("10.128.2.5", "10.128.2.5")]),
        "identity SNAT keeps the pod source through a CNI masquerade"
    );
    assert!(d.net.addresses.is_empty());
    let route = steer_routes(&d).next().expect("steering route");
    assert_eq!(route.table, STEER_TABLE_BASE);
    let vias: Vec<String> = route
        .nexthops
        .iter()
        .map(|h| format!("{} {:?} {}", h.via.unwrap(), h.dev, h.onlink))
        .collect();
    assert_eq!(
        vias,
        vec![
            "192.168.50.11 Some(\"np-eip\") true",
            "192.168.50.13 Some(\"np-eip\") true"
        ]
    );
    let rule = steer_rules(&d).next().unwrap();
    assert_eq!(
        (rule.fwmark, rule.table, rule.family),
        (Some((0x1_0000, MARK_MASK)), STEER_TABLE_BASE, Family::V4)
    );
    let tunnel = d.net.tunnel.as_ref().unwrap();
    let peers: Vec<String> = tunnel
        .peers
        .iter()
        .map(|p| p.underlay.to_string())
        .collect();
    assert_eq!(peers, vec!["192.168.50.11", "192.168.50.13"]);
    assert_eq!(tunnel.mac, tunnel_mac("192.168.50.12".parse().unwrap()));
    // The IPv6 IP is not hosted: IPv6 traffic leaves as without EgressIP.
    assert!(elements(&d, STEER_V6).is_empty());
    // worker-3 has no selected local pod: it only hosts (SNAT for both pods).
    let d3 = on("worker-3", &snap);
    assert_eq!(elements(&d3, SNAT_V4).len(), 2);
    assert_eq!(steer_routes(&d3).count(), 0);
}

#[test]
fn pod_churn_changes_map_elements_only() {
    let hosts = [("192.168.50.200", "worker-1")];
    let before = on("worker-2", &cluster(&hosts).build());
    let after = on(
        "worker-2",
        &cluster(&hosts)
            .with(pod("worker-2", "backend", "api3", "api", &["10.128.2.9"]))
            .build(),
    );
    let tx = diff(&before.ruleset, &after.ruleset);
    assert!(!tx.is_empty());
    assert!(
        tx.ops.iter().all(|op| matches!(op, Op::AddElements(_))),
        "{tx:?}"
    );
    assert_eq!(elements(&after, STEER_V4).len(), 2);
    assert_eq!(
        before.net, after.net,
        "routes, rules and tunnel do not move"
    );
}

#[test]
fn node_addresses_and_double_assignments_are_reported_with_field_paths() {
    let snap = cluster(&[
        ("192.168.50.200", "worker-1"),
        ("192.168.50.201", "worker-1"),
    ])
    .with(egress_ip(
        "clash",
        None,
        &["192.168.50.12"],
        &[("192.168.50.12", "worker-1")],
    ))
    .build();
    let d = on("worker-1", &snap);
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(err.contains("status.items: 192.168.50.201 is assigned to node worker-1, which already hosts another IP"), "{err}");
    assert!(!err.contains("no node hosts"), "{err}");
    let err = eip_status(&d, "clash").unwrap_err();
    assert!(
        err.contains("spec.egressIPs[0]: 192.168.50.12 is an address of node worker-2"),
        "{err}"
    );
    let addrs: Vec<String> = d.net.addresses.iter().map(|a| a.to_string()).collect();
    assert_eq!(addrs, vec!["192.168.50.200/32"]);
    // The Events carry OVN-Kubernetes' reason where it has one for the case.
    let reason = |name| event_with_reason(&d, name).map(|(r, _)| r);
    assert_eq!(reason("clash"), Some("EgressIPConflict"));
    assert_eq!(
        reason("backend"),
        Some("EgressIPNotApplied"),
        "no counterpart"
    );
}

#[test]
fn an_invalid_egress_ip_is_reported_as_invalid_egress_ip() {
    let mut bad = egress_ip("bad", None, &["192.168.50.250"], &[]);
    bad.spec.egress_ips = vec!["not-an-ip".into()];
    let snap = cluster(&[("192.168.50.200", "worker-1")]).with(bad).build();
    let (reason, note) = event_with_reason(&on("worker-1", &snap), "bad").expect("an Event");
    assert_eq!(reason, "InvalidEgressIP", "{note}");
}

#[test]
fn the_earliest_egress_ip_wins_a_pod_and_the_later_is_reported() {
    // "zzz" sorts last by name but was created first.
    let snap = cluster(&[("192.168.50.200", "worker-1")])
        .with(egress_ip(
            "zzz",
            Some("2024-01-01T00:00:00Z"),
            &["192.168.50.210"],
            &[("192.168.50.210", "worker-1")],
        ))
        .build();
    let d = on("worker-1", &snap);
    assert_eq!(
        elements(&d, SNAT_V4),
        pairs(&[
            ("10.128.1.5", "192.168.50.210"),
            ("10.128.2.5", "192.168.50.210")
        ])
    );
    assert_eq!(eip_status(&d, "zzz"), Ok(()));
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(
        err.starts_with("spec.podSelector: pod backend/api1 (EgressIP zzz) and 1 more"),
        "{err}"
    );
}

#[test]
fn unassigned_egress_ip_says_why_and_changes_nothing() {
    let d = on("worker-2", &cluster(&[]).build());
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(
        err.contains("no node hosts any of its egress IPs yet"),
        "{err}"
    );
    assert!(elements(&d, SNAT_V4).is_empty() && elements(&d, STEER_V4).is_empty());
    assert_eq!(d.net, NetDesired::default());
}

#[test]
fn invalid_object_is_reported_and_others_still_apply() {
    let mut bad = egress_ip("bad", None, &["300.1.1.1"], &[]);
    bad.metadata.name = Some("bad".into());
    let snap = cluster(&[("192.168.50.200", "worker-1")]).with(bad).build();
    let d = on("worker-1", &snap);
    assert_eq!(
        eip_status(&d, "bad"),
        Err("spec.egressIPs[0]: invalid IP address \"300.1.1.1\"".into())
    );
    assert_eq!(elements(&d, SNAT_V4).len(), 2);
}

#[test]
fn no_egress_ip_adds_nothing_to_the_table() {
    let snap = Snapshot::builder()
        .with(node("worker-1", &["192.168.50.11"]))
        .build();
    let t = on("worker-1", &snap).ruleset.flatten();
    assert!(t.chains.keys().all(|c| !c.starts_with("eip-")));
    assert!(t.sets.keys().all(|c| !c.starts_with("eip-")));
}

#[test]
fn refused_address_removes_its_snat_elements_and_is_reported() {
    let d = unplaceable_on_worker_1();
    assert_eq!(
        eip_status(&d, "backend"),
        Err(
            "spec.egressIPs[0]: 192.168.50.200: no interface subnet contains it; the traffic \
             of its 2 selected pod address(es) to destinations outside the cluster is dropped \
             on node worker-1"
                .into()
        )
    );
}

#[test]
fn tunnel_addresses_are_derived_from_the_underlay() {
    let mac = tunnel_mac("192.168.50.11".parse().unwrap());
    assert_eq!(mac, [0x0a, 0x6e, 192, 168, 50, 11]);
    assert_eq!(tunnel_gateway6(mac).to_string(), "fe80::a6e:c0a8:320b");
}

#[test]
fn an_invalid_edit_keeps_the_last_valid_version_in_force() {
    let hosts = [("192.168.50.200", "worker-1")];
    let cfg = Config::for_node("worker-1");
    let good = crate::plan::plan(&cluster(&hosts).build(), &cfg);
    assert!(good.memory.egress_ip.in_force.contains_key("backend"));
    let mut broken = egress_ip("backend", None, &["192.168.50.300"], &hosts);
    broken.metadata.name = Some("backend".into());
    let snap = cluster(&hosts).with(broken).build();
    let d = crate::plan::plan_with(&snap, &cfg, &good.memory);
    assert_eq!(elements(&d, SNAT_V4), elements(&good, SNAT_V4));
    assert_eq!(d.net.addresses, good.net.addresses);
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(
        err.starts_with("spec.egressIPs[0]: invalid IP address \"192.168.50.300\" (the last valid"),
        "{err}"
    );
    // Without memory (a fresh agent) nothing is planned for it.
    let fresh = on("worker-1", &snap);
    assert!(elements(&fresh, SNAT_V4).is_empty());
}

fn event(d: &Desired, name: &str) -> Option<String> {
    event_with_reason(d, name).map(|(_, note)| note)
}

fn event_with_reason(d: &Desired, name: &str) -> Option<(&'static str, String)> {
    d.statuses
        .iter()
        .find(|s| s.kind == Kind::EgressIP && s.key.name == name)
        .expect("status")
        .event
        .clone()
        .map(|e| (e.reason, e.note))
}

/// Chain `name` of the plan, as `nft` prints it.
fn chain_text(d: &Desired, name: &str) -> String {
    let mut t = Table::new("t");
    t.add_chain(d.ruleset.flatten().chains[name].clone());
    crate::nft::render::render_table(&t)
}

fn unreachable_jump() -> String {
    format!("{:?}", Verdict::Jump(UNREACHABLE.into()))
}

#[test]
fn a_hosting_node_without_a_node_object_fails_closed_and_is_reported() {
    // worker-9 has no Node: nothing can route to it, so api2's traffic must not leave with
    // its pod address (identity SNAT) nor as if it were not selected.
    let snap = cluster(&[("192.168.50.200", "worker-9")]).build();
    let d = on("worker-2", &snap);
    assert_eq!(
        elements(&d, STEER_V4),
        vec![("10.128.2.5".to_string(), unreachable_jump())]
    );
    assert!(elements(&d, SNAT_V4).is_empty(), "no identity SNAT");
    assert_eq!((steer_routes(&d).count(), steer_rules(&d).count()), (0, 0));
    let text = chain_text(&d, UNREACHABLE);
    assert!(
        text.contains("ip daddr @"),
        "cluster destinations pass:\n{text}"
    );
    assert!(text.contains("counter drop"), "{text}");
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(
        err.contains(
            "status.items: 192.168.50.200 is assigned to node worker-9, which node worker-2 \
             cannot reach through the tunnel: there is no Node worker-9"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "1 selected pod address(es) on node worker-2 (10.128.2.5) cannot use any IPv4 egress IP"
        ),
        "{err}"
    );
    // worker-2's own problem: it reports it itself, naming the node.
    let ev = event(&d, "backend").expect("event");
    assert!(ev.starts_with("node worker-2: "), "{ev}");
    assert!(ev.contains("dropped"), "{ev}");
    // worker-3 has no selected pod: nothing to drop, and the event is not its to make.
    let d3 = on("worker-3", &snap);
    assert!(elements(&d3, STEER_V4).is_empty());
    assert!(!d3.ruleset.flatten().chains.contains_key(UNREACHABLE));
    assert_eq!(event(&d3, "backend"), None);
}

#[test]
fn an_unroutable_hosting_node_is_skipped_and_the_others_still_carry_the_traffic() {
    // worker-3 has only an IPv6 InternalIP: the IPv4 tunnel from worker-2 cannot reach it.
    let snap = cluster(&[
        ("192.168.50.200", "worker-1"),
        ("192.168.50.201", "worker-3"),
    ])
    .with(node("worker-3", &["fd00:50::13"]))
    .build();
    let d = on("worker-2", &snap);
    assert_eq!(
        elements(&d, STEER_V4),
        pairs(&[("10.128.2.5", "Jump(\"eip-steer-0\")")])
    );
    let route = steer_routes(&d).next().expect("route");
    let vias: Vec<String> = route
        .nexthops
        .iter()
        .map(|h| h.via.unwrap().to_string())
        .collect();
    assert_eq!(vias, vec!["192.168.50.11"]);
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(err.contains("worker-3 has no IPv4 InternalIP"), "{err}");
    assert!(!err.contains("dropped"), "{err}");
    // Only worker-3 hosting: the pod fails closed.
    let snap = cluster(&[("192.168.50.201", "worker-3")])
        .with(node("worker-3", &["fd00:50::13"]))
        .build();
    let d = on("worker-2", &snap);
    assert_eq!(
        elements(&d, STEER_V4),
        vec![("10.128.2.5".to_string(), unreachable_jump())]
    );
}

#[test]
fn a_node_without_an_internal_ip_fails_closed_for_its_steered_pods() {
    let snap = cluster(&[("192.168.50.200", "worker-1")])
        .with(node("worker-2", &[]))
        .build();
    let d = on("worker-2", &snap);
    assert_eq!(
        elements(&d, STEER_V4),
        vec![("10.128.2.5".to_string(), unreachable_jump())]
    );
    assert!(d.net.tunnel.is_none());
    let err = eip_status(&d, "backend").unwrap_err();
    assert!(err.contains("this node has no InternalIP"), "{err}");
}

#[test]
fn only_connections_the_pods_open_are_steered() {
    let snap = cluster(&[("192.168.50.200", "worker-1")]).build();
    let d = on("worker-2", &snap);
    let text = chain_text(&d, PREROUTING);
    assert!(
        text.contains("ct direction original ip saddr vmap @eip-steer-v4"),
        "{text}"
    );
    assert!(
        text.contains("ct direction original ip6 saddr vmap @eip-steer-v6"),
        "{text}"
    );
}

#[test]
fn a_refused_address_fails_closed_for_the_pods_snated_to_it() {
    let d = unplaceable_on_worker_1();
    assert_eq!(
        elements(&d, STEER_V4),
        vec![
            ("10.128.1.5".to_string(), unreachable_jump()),
            ("10.128.2.5".to_string(), unreachable_jump())
        ],
        "the local pod and the one arriving through the tunnel"
    );
    assert!(d.ruleset.flatten().chains.contains_key(UNREACHABLE));
    let ev = event(&d, "backend").expect("event");
    assert!(
        ev.starts_with("node worker-1: spec.egressIPs[0]: 192.168.50.200: no interface"),
        "{ev}"
    );
}

#[test]
fn problems_every_node_sees_are_reported_by_one_node_only() {
    // The double assignment is the same on every node: only the first hosting node
    // (worker-1) makes it an Event; every node still logs it.
    let snap = cluster(&[
        ("192.168.50.200", "worker-1"),
        ("192.168.50.201", "worker-1"),
    ])
    .build();
    let d1 = on("worker-1", &snap);
    let d2 = on("worker-2", &snap);
    assert!(eip_status(&d2, "backend").is_err());
    assert_eq!(event(&d2, "backend"), None);
    let ev = event(&d1, "backend").expect("the reporter's event");
    assert!(
        ev.starts_with("node worker-1: status.items: 192.168.50.201 is assigned"),
        "{ev}"
    );
    // Unassigned: reported by the first node running a selected pod.
    let snap = cluster(&[]).build();
    assert!(event(&on("worker-1", &snap), "backend").is_some());
    assert_eq!(event(&on("worker-2", &snap), "backend"), None);
    // Invalid without a last valid version: by the first node its status names.
    let mut bad = egress_ip("bad", None, &["300.1.1.1"], &[("300.1.1.1", "worker-3")]);
    bad.metadata.name = Some("bad".into());
    let snap = cluster(&[]).with(bad).build();
    assert!(event(&on("worker-3", &snap), "bad").is_some());
    assert_eq!(event(&on("worker-1", &snap), "bad"), None);
    // No problem, no event.
    let snap = cluster(&[("192.168.50.200", "worker-1")]).build();
    assert_eq!(event(&on("worker-1", &snap), "backend"), None);
}

/// Every node with the tunnel routes the IPv4 cluster CIDRs back over it in the reverse-path
/// table, looked up only for packets marked as tunneled, so that the kernel's strict or loose
/// reverse-path check of a decapsulated packet passes (README "Reverse-path filtering").
#[test]
fn tunnel_nodes_route_cluster_sources_back_over_the_tunnel_for_marked_packets() {
    let snap = cluster(&[("192.168.50.200", "worker-1")]).build();
    for node in ["worker-1", "worker-2"] {
        let d = on(node, &snap);
        let back: Vec<String> = d
            .net
            .routes
            .iter()
            .filter(|r| r.table == RETURN_TABLE)
            .map(|r| format!("{} {:?} {:?}", r.dst, r.nexthops[0].via, r.nexthops[0].dev))
            .collect();
        assert_eq!(back, vec!["10.128.0.0/14 None Some(\"np-eip\")"], "{node}");
        let rules: Vec<_> = d
            .net
            .rules
            .iter()
            .filter(|r| r.table == RETURN_TABLE)
            .map(|r| (r.priority, r.fwmark, r.family))
            .collect();
        assert_eq!(
            rules,
            vec![(RETURN_RULE_PRIORITY, Some((TUNNELED, TUNNELED)), Family::V4)],
            "{node}"
        );
    }
    // The mark is outside the steering bits: a tunneled packet never matches a steering rule.
    assert_eq!(TUNNELED & MARK_MASK, 0);
    // No EgressIP hosted anywhere: no tunnel, no reverse-path routing.
    let d = on("worker-1", &cluster(&[]).build());
    assert!(d.net.routes.is_empty() && d.net.rules.is_empty());
}
