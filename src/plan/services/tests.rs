use crate::config::Config;
use crate::nft::render::render_full;
use crate::plan::{Memory, plan, plan_with};
use crate::snapshot::{Kind, Snapshot, SnapshotBuilder};
use crate::testing::objects;

/// Service `name` in namespace `ns`, port `http` 80/TCP; `extra` more spec fields.
fn svc(name: &str, ip: &str, extra: &str) -> crate::api::Service {
    let ports = "{name: http, port: 80, protocol: TCP}";
    let svc = objects::service(name, ip, ports).in_namespace("ns");
    svc.spec(extra).object()
}

/// The endpoints of `service` on node n1, port `http` 8080/TCP, without conditions.
fn slice(service: &str, ips: &[&str]) -> crate::api::EndpointSlice {
    let ports = "{name: http, port: 8080, protocol: TCP}";
    let eps: Vec<_> = ips
        .iter()
        .map(|ip| objects::ep(ip, "n1").unknown())
        .collect();
    let slice = objects::endpoint_slice(&format!("{service}-x"), service, "IPv4", ports, &eps);
    slice.in_namespace("ns").object()
}

fn base() -> SnapshotBuilder {
    Snapshot::builder()
        .with(svc("a", "172.30.0.1", ""))
        .with(slice("a", &["10.128.0.1", "10.128.0.2"]))
        .with(svc("b", "172.30.0.2", "sessionAffinity: ClientIP"))
        .with(slice("b", &["10.128.0.3"]))
}

#[test]
fn incremental_plan_equals_a_fresh_plan() {
    let cfg = Config::for_node("n1");
    let first = plan(&base().build(), &cfg);
    // One endpoint replaced, one service added, one removed.
    let mut b = base().build().to_builder();
    b.insert(slice("a", &["10.128.0.1", "10.128.0.9"]));
    b.insert(svc("c", "172.30.0.3", ""));
    b.insert(slice("c", &["10.128.0.4"]));
    b.remove(Kind::Service, &crate::snapshot::ObjectKey::new("ns", "b"));
    let snap = b.build();
    let incremental = plan_with(&snap, &cfg, &first.memory);
    let fresh = plan(&snap, &cfg);
    assert_eq!(
        render_full(&incremental.ruleset),
        render_full(&fresh.ruleset)
    );
    // Unchanged services keep their part by pointer; the changed one gets a new one.
    let unchanged = plan_with(&snap, &cfg, &incremental.memory);
    for k in incremental.ruleset.part_keys() {
        let (p, q) = (incremental.ruleset.part(k), unchanged.ruleset.part(k));
        assert!(std::sync::Arc::ptr_eq(p.unwrap(), q.unwrap()), "{k}");
    }
    assert!(!std::sync::Arc::ptr_eq(
        first.ruleset.part("svc/ns/a").unwrap(),
        incremental.ruleset.part("svc/ns/a").unwrap()
    ));
}

#[test]
fn removed_udp_backend_is_reported_stale() {
    let cfg = Config::for_node("n1");
    let udp = |ips: &[&str]| -> crate::api::EndpointSlice {
        let mut s = slice("u", ips);
        s.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        s
    };
    let mut s = svc("u", "172.30.0.5", "");
    s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
    let one = Snapshot::builder()
        .with(s.clone())
        .with(udp(&["10.128.0.1", "10.128.0.2"]))
        .build();
    let first = plan(&one, &cfg);
    assert!(first.stale_udp.is_empty());
    let mut b = one.to_builder();
    b.insert(udp(&["10.128.0.2"]));
    let second = plan_with(&b.build(), &cfg, &first.memory);
    assert_eq!(
        second.stale_udp,
        vec![("10.128.0.1".parse().unwrap(), 8080)]
    );
}

#[test]
fn bad_service_and_conflicting_frontend_are_reported_without_harming_others() {
    let cfg = Config::for_node("n1");
    let snap = base()
        .with(svc("bad", "not-an-ip", ""))
        .with(svc("x1", "172.30.0.7", "externalIPs: ['198.51.100.7']"))
        .with(slice("x1", &["10.128.0.5"]))
        .with(svc("x2", "172.30.0.8", "externalIPs: ['198.51.100.7']"))
        .with(slice("x2", &["10.128.0.6"]))
        .build();
    let d = plan_with(&snap, &cfg, &Memory::default());
    let errors: Vec<String> = d
        .statuses
        .iter()
        .filter_map(|s| s.result.clone().err().map(|e| format!("{}: {e}", s.key)))
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("ns/bad: spec.clusterIPs[0]: invalid IP"),
        "{errors:?}"
    );
    assert!(
        errors[1]
            .contains("ns/x2: 198.51.100.7 . tcp . 80 in svc-dispatch-v4 is already used by ns/x1"),
        "{errors:?}"
    );
    let text = render_full(&d.ruleset);
    assert!(
        text.contains("172.30.0.1 . tcp . 80"),
        "others still planned"
    );
    // One dispatch element, and only the owner's backends behind the frontend.
    assert_eq!(text.matches("198.51.100.7 . tcp . 80 :").count(), 1);
    assert!(text.contains("198.51.100.7 . tcp . 80 . 0 : 10.128.0.5 . 8080"));
    assert!(!text.contains("198.51.100.7 . tcp . 80 . 0 : 10.128.0.6"));
}

#[test]
fn endpoint_changes_are_element_updates_and_pool_chains_are_shared() {
    use crate::nft::{Op, diff};
    let cfg = Config::for_node("n1");
    let first = plan(&base().build(), &cfg);
    // One endpoint of `a` replaced: the backend count stays, so only elements change.
    let mut b = base().build().to_builder();
    b.insert(slice("a", &["10.128.0.1", "10.128.0.9"]));
    let snap = b.build();
    let second = plan_with(&snap, &cfg, &first.memory);
    let tx = diff(&first.ruleset, &second.ruleset);
    assert!(!tx.ops.is_empty());
    assert!(
        tx.ops
            .iter()
            .all(|o| matches!(o, Op::AddElements(_) | Op::DeleteElements(_))),
        "{tx:?}"
    );
    // A third endpoint: the dispatch element moves to the 3-backend pool chain, which is
    // created; the 2-backend one, now unused, goes. No other chain is touched.
    let mut b = snap.to_builder();
    b.insert(slice("a", &["10.128.0.1", "10.128.0.9", "10.128.0.7"]));
    b.insert(svc("c", "172.30.0.3", ""));
    b.insert(slice("c", &["10.128.0.4", "10.128.0.5", "10.128.0.6"]));
    let third = plan_with(&b.build(), &cfg, &second.memory);
    let tx = diff(&second.ruleset, &third.ruleset);
    let chains: Vec<&str> = tx
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::AddChain { name, .. } | Op::DeleteChain(name) | Op::FlushChain(name) => {
                Some(name.as_str())
            }
            Op::AddRule { chain, .. } => Some(chain.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        chains
            .iter()
            .all(|c| *c == "svc-v4-c3" || *c == "svc-v4-c2"),
        "{chains:?}"
    );
    // Both services share the one pool chain.
    let text = render_full(&third.ruleset);
    assert_eq!(text.matches("chain svc-v4-c3 {").count(), 1);
    assert!(
        text.contains("172.30.0.3 . tcp . 80 : goto svc-v4-c3"),
        "{text}"
    );
    assert!(
        text.contains("172.30.0.1 . tcp . 80 : goto svc-v4-c3"),
        "{text}"
    );
}
