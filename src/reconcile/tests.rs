//! The reconciler against fake backends.

use super::*;
use crate::net::{FakeNetBackend, NetConfig};
use crate::nft::FakeBackend;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {addresses: [{type: InternalIP, address: 192.168.50.11}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: a}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {nodeName: n1, containers: []}
status: {phase: Running, podIP: 10.128.0.5}
---
apiVersion: k8s.ovn.org/v1
kind: EgressQoS
metadata: {name: default, namespace: a}
spec: {egress: [{dscp: 46}]}
---
apiVersion: k8s.ovn.org/v1
kind: EgressIP
metadata: {name: e}
spec: {egressIPs: [192.168.99.9], namespaceSelector: {matchLabels: {team: a}}}
status: {items: [{egressIP: 192.168.99.9, node: n1}]}
"#;

fn snapshot() -> Snapshot {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.yaml"), CLUSTER).unwrap();
    manifests::load_dir(dir.path()).unwrap().snapshot
}

fn node() -> FakeNetBackend {
    FakeNetBackend::new(NetConfig::default())
        .with_link("eth0")
        .with_address("eth0", "192.168.50.11/24")
}

#[test]
fn the_bridge_table_follows_network_policies_and_a_leftover_goes() {
    use crate::testing::objects;
    let pod = objects::pod("a", "p")
        .on("n1")
        .ips(&["10.128.0.5"])
        .object();
    let deny = objects::network_policy("a", "deny", "  podSelector: {}\n  ingress: []\n");
    let with = Snapshot::builder()
        .with(pod.clone())
        .with(deny.object())
        .build();
    let without = Snapshot::builder().with(pod).build();
    let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), node());
    rec.sync(&with).unwrap();
    let bridge = |rec: &mut Reconciler<FakeBackend, FakeNetBackend>| {
        rec.extra
            .engine_mut(Family::Bridge, TABLE_NAME)
            .backend()
            .table
            .clone()
    };
    let held = bridge(&mut rec).expect("bridge table applied");
    assert_eq!(held.family, Family::Bridge);
    assert!(held.chains.contains_key("np-forward-flows"));
    rec.sync(&without).unwrap();
    assert!(bridge(&mut rec).is_none(), "deleted without policies");
    // A leftover (a restart after the last policy went): deleted after a read-back.
    let engine = rec.extra.engine_mut(Family::Bridge, TABLE_NAME);
    engine.backend_mut().table = Some(Table::with_family(Family::Bridge, TABLE_NAME));
    rec.invalidate();
    rec.sync(&without).unwrap();
    assert!(bridge(&mut rec).is_none(), "leftover deleted");
}

#[test]
fn an_unplaceable_egress_ip_is_reported_and_gets_no_snat() {
    let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), node());
    let report = rec.sync(&snapshot()).unwrap();
    let eip = report.statuses.iter().find(|s| s.key.name == "e").unwrap();
    assert_eq!(
        eip.result,
        Err(
            "spec.egressIPs[0]: 192.168.99.9: no interface subnet contains it; the traffic \
                 of its 1 selected pod address(es) to destinations outside the cluster is \
                 dropped on node n1"
                .into()
        )
    );
    let table = rec.engine.current().unwrap().flatten();
    assert!(table.sets["eip-snat-v4"].elements.is_empty());
    // Fail closed: the pod is not left to leave with the node's address.
    let steer: Vec<_> = table.sets["eip-steer-v4"].elements.values().collect();
    assert_eq!(steer.len(), 1);
    assert_eq!(
        steer[0].data,
        Some(crate::nft::ir::ElemData::Verdict(
            crate::nft::ir::Verdict::Jump("eip-unreachable".into())
        ))
    );
    assert!(table.chains.contains_key("eip-unreachable"));
    assert!(
        table.sets["qos-pods-v4"].elements.len() == 1,
        "QoS still applied"
    );
}

#[test]
fn a_network_planning_error_still_applies_nftables() {
    // Someone else's interface with the tunnel's name: the net side refuses to touch it.
    let net = node().with_link("np-eip");
    let mut rec = Reconciler::new(Config::for_node("n1"), FakeBackend::default(), net);
    let err = rec.sync(&snapshot()).unwrap_err().to_string();
    assert!(
        err.contains("link np-eip: exists and was not created by the agent"),
        "{err}"
    );
    let table = rec.engine.current().expect("nftables applied").flatten();
    assert_eq!(table.sets["qos-pods-v4"].elements.len(), 1);
}
