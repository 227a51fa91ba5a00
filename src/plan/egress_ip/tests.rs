use super::*;
use crate::api::{Namespace, Node, Pod};
use crate::nft::diff::{Op, diff};
use crate::plan::{Desired, plan as plan_all};
use crate::snapshot::SnapshotBuilder;
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

fn on(node: &str, snap: &Snapshot) -> Desired {
    plan_all(snap, &Config::for_node(node))
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
    assert!(d.net.routes.is_empty() && d.net.rules.is_empty());
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
    let route = d.net.routes.iter().next().expect("steering route");
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
    let rule = d.net.rules.iter().next().unwrap();
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
    assert!(d3.net.routes.is_empty());
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
    let snap = cluster(&[("192.168.50.200", "worker-1")]).build();
    let mut d = on("worker-1", &snap);
    let ip: IpAddr = "192.168.50.200".parse().unwrap();
    address_refused(
        &snap,
        &mut d.ruleset,
        &mut d.statuses,
        ip,
        "no interface subnet contains it",
    );
    assert!(elements(&d, SNAT_V4).is_empty());
    assert_eq!(
        eip_status(&d, "backend"),
        Err("spec.egressIPs[0]: 192.168.50.200: no interface subnet contains it".into())
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
