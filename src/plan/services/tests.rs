use crate::config::Config;
use crate::nft::render::render_full;
use crate::plan::{Desired, Memory, plan, plan_with};
use crate::snapshot::{Kind, Snapshot, SnapshotBuilder};
use crate::testing::objects;

/// Service `name` in namespace `ns`, port `http` 80/TCP; `extra` more spec fields.
fn svc(name: &str, ip: &str, extra: &str) -> crate::api::Service {
    let ports = "{name: http, port: 80, protocol: TCP}";
    let svc = objects::service(name, ip, ports).in_namespace("ns");
    svc.spec(extra).object()
}

/// The endpoints of `service` on node n1, port `http` 8080/TCP, without conditions.
pub(super) fn slice(service: &str, ips: &[&str]) -> crate::api::EndpointSlice {
    slice_in("ns", service, ips)
}

fn base() -> SnapshotBuilder {
    Snapshot::builder()
        .with(svc("a", "172.30.0.1", ""))
        .with(slice("a", &["10.128.0.1", "10.128.0.2"]))
        .with(svc("b", "172.30.0.2", "sessionAffinity: ClientIP"))
        .with(slice("b", &["10.128.0.3"]))
}

/// The plan of [`base`], and [`base`] with one endpoint of `a` replaced.
fn base_plan_and_an_endpoint_replaced(cfg: &Config) -> (Desired, SnapshotBuilder) {
    let first = plan(&base().build(), cfg);
    let mut b = base().build().to_builder();
    b.insert(slice("a", &["10.128.0.1", "10.128.0.9"]));
    (first, b)
}

#[test]
fn incremental_plan_equals_a_fresh_plan() {
    let cfg = Config::for_node("n1");
    // One endpoint replaced, one service added, one removed.
    let (first, mut b) = base_plan_and_an_endpoint_replaced(&cfg);
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
    assert!(first.outputs.services.stale_udp.is_empty());
    let mut b = one.to_builder();
    b.insert(udp(&["10.128.0.2"]));
    let second = plan_with(&b.build(), &cfg, &first.memory);
    assert_eq!(
        second.outputs.services.stale_udp,
        vec![("10.128.0.1".parse().unwrap(), 8080)]
    );
}

#[test]
fn udp_frontends_are_reported_new_only_on_their_first_endpoint() {
    use super::UdpFrontend;
    let udp = |ips: &[&str]| -> crate::api::EndpointSlice {
        let mut s = slice("u", ips);
        s.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        s
    };
    let mut s = svc(
        "u",
        "172.30.0.5",
        "type: NodePort, externalIPs: ['198.51.100.5']",
    );
    let port = &mut s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0];
    port.protocol = Some("UDP".into());
    port.node_port = Some(30053);
    let none = Snapshot::builder().with(s.clone()).with(udp(&[])).build();
    let first = plan(&none, &honour_all_external_ips());
    assert!(first.outputs.services.new_udp_frontends.is_empty());
    // 0 -> 1 endpoint: every frontend of the port.
    let mut b = none.to_builder();
    b.insert(udp(&["10.128.0.1"]));
    let one = b.build();
    let second = plan_with(&one, &honour_all_external_ips(), &first.memory);
    let ip = |s: &str| s.parse().unwrap();
    assert_eq!(
        second.outputs.services.new_udp_frontends,
        vec![
            UdpFrontend::Addr(ip("172.30.0.5"), 80),
            UdpFrontend::Addr(ip("198.51.100.5"), 80),
            UdpFrontend::NodePort(30053),
        ]
    );
    // 1 -> 2 endpoints: nothing.
    let mut b = one.to_builder();
    b.insert(udp(&["10.128.0.1", "10.128.0.2"]));
    let third = plan_with(&b.build(), &honour_all_external_ips(), &second.memory);
    assert!(third.outputs.services.new_udp_frontends.is_empty());
}

#[test]
fn bad_service_and_conflicting_frontend_are_reported_without_harming_others() {
    let cfg = honour_all_external_ips();
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
        errors[0].contains("ns/bad: spec.clusterIP: invalid IP"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains(
            "ns/x2: spec.externalIPs[0]: 198.51.100.7 port 80/TCP is already used by Service ns/x1"
        ),
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
    // One endpoint of `a` replaced: the backend count stays, so only elements change.
    let (first, b) = base_plan_and_an_endpoint_replaced(&cfg);
    let snap = b.build();
    let second = plan_with(&snap, &cfg, &first.memory);
    let tx = diff(&first.ruleset, &second.ruleset);
    crate::plan::assert_element_updates_only(&tx);
    // A third endpoint: the dispatch element moves to the 3-backend pool chain, which is
    // created; the 2-backend one, now unused, goes. No other chain is touched. `c` is in
    // the same backends-map shard as `a` (6, see `names::shard`).
    let mut b = snap.to_builder();
    b.insert(slice("a", &["10.128.0.1", "10.128.0.9", "10.128.0.7"]));
    b.insert(svc("c", "172.30.0.17", ""));
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
            .all(|c| *c == "svc-v4-c3-s6" || *c == "svc-v4-c2-s6"),
        "{chains:?}"
    );
    // Both services share the one pool chain.
    let text = render_full(&third.ruleset);
    assert_eq!(text.matches("chain svc-v4-c3-s6 {").count(), 1);
    assert!(
        text.contains("172.30.0.17 . tcp . 80 : goto svc-v4-c3-s6"),
        "{text}"
    );
    assert!(
        text.contains("172.30.0.1 . tcp . 80 : goto svc-v4-c3-s6"),
        "{text}"
    );
    assert!(
        text.contains("172.30.0.17 . tcp . 80 . 2 : 10.128.0.6 . 8080"),
        "{text}"
    );
    assert!(text.contains("map svc-backends-v4-6 {"), "{text}");
}

/// The error statuses of a plan, as `ns/name: message`.
fn errors(d: &crate::plan::Desired) -> Vec<String> {
    d.statuses
        .iter()
        .filter_map(|s| s.result.clone().err().map(|e| format!("{}: {e}", s.key)))
        .collect()
}

/// The dispatch and no-endpoint elements of the plan, rendered (`ip . proto . port : ...`).
fn frontends(d: &crate::plan::Desired) -> String {
    render_full(&d.ruleset)
}

/// A Service in namespace `ns` with port `http` 80/TCP, created at `created` (RFC 3339).
fn aged(ns: &str, name: &str, ip: &str, created: &str, extra: &str) -> crate::api::Service {
    let ports = "{name: http, port: 80, protocol: TCP}";
    let s = objects::service(name, ip, ports).in_namespace(ns);
    s.spec(extra).created(created).object()
}

/// The endpoints of Service `ns/service` on node n1, port `http` 8080/TCP.
fn slice_in(ns: &str, service: &str, ips: &[&str]) -> crate::api::EndpointSlice {
    let ports = "{name: http, port: 8080, protocol: TCP}";
    let eps: Vec<_> = ips
        .iter()
        .map(|ip| objects::ep(ip, "n1").unknown())
        .collect();
    let slice = objects::endpoint_slice(&format!("{service}-x"), service, "IPv4", ports, &eps);
    slice.in_namespace(ns).object()
}

/// A config that honours every externalIP (kube-proxy's behaviour).
fn honour_all_external_ips() -> Config {
    let mut cfg = Config::for_node("n1");
    cfg.external_ip_allowed_cidrs = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
    cfg
}

#[test]
fn unusable_cluster_and_lb_ips_are_refused_by_field_and_the_rest_applies() {
    let cfg = Config::for_node("n1");
    let ports = "{name: http, port: 80, protocol: TCP}";
    let lo = objects::service("lo", "127.0.0.1", ports).in_namespace("ns");
    let lo = lo
        .spec("type: LoadBalancer")
        .lb_ingress(&["169.254.169.254", "198.51.100.3", "ff02::1", "0.0.0.0"])
        .object();
    let dual = objects::service_ips("dual", &["172.30.0.9", "::ffff:172.30.0.9"], ports);
    let snap = Snapshot::builder()
        .with(objects::node("n1", &["192.168.1.1"]).object())
        .with(objects::node("n2", &["192.168.1.2"]).object())
        .with(lo)
        .with(slice("lo", &["10.128.0.1"]))
        .with(svc("nodeip", "192.168.1.2", ""))
        .with(slice("nodeip", &["10.128.0.2"]))
        .with(dual.in_namespace("ns").object())
        .with(slice("dual", &["10.128.0.3"]))
        .build();
    let d = plan(&snap, &cfg);
    let errs = errors(&d).join("\n");
    for want in [
        "ns/lo: spec.clusterIP: 127.0.0.1 is a loopback address",
        "status.loadBalancer.ingress[0].ip: 169.254.169.254 is a link-local address",
        "status.loadBalancer.ingress[2].ip: ff02::1 is a multicast address",
        "status.loadBalancer.ingress[3].ip: 0.0.0.0 is the unspecified address",
        "ns/nodeip: spec.clusterIP: 192.168.1.2 is an address of node n2",
        "ns/dual: spec.clusterIPs[1]: ::ffff:172.30.0.9 is an IPv4-mapped IPv6 address",
    ] {
        assert!(errs.contains(want), "missing {want:?} in\n{errs}");
    }
    let text = frontends(&d);
    // The refused addresses are nowhere; the service's other IPs are planned.
    for gone in [
        "127.0.0.1 . tcp",
        "169.254.169.254",
        "ff02::1",
        "192.168.1.2 . tcp",
        "::ffff:",
    ] {
        assert!(!text.contains(gone), "{gone} planned:\n{text}");
    }
    assert!(!text.contains("elements = { 127.0.0.1"), "{text}");
    assert!(text.contains("198.51.100.3 . tcp . 80 : goto"), "{text}");
    assert!(text.contains("172.30.0.9 . tcp . 80 : goto"), "{text}");
}

#[test]
fn node_address_changes_replan_the_services_that_use_them() {
    let cfg = Config::for_node("n1");
    let one = Snapshot::builder()
        .with(objects::node("n1", &["192.168.1.1"]).object())
        .with(svc("a", "172.30.0.1", ""))
        .with(slice("a", &["10.128.0.1"]))
        .with(svc("b", "172.30.0.50", ""))
        .with(slice("b", &["10.128.0.2"]))
        .build();
    let first = plan(&one, &cfg);
    assert!(errors(&first).is_empty(), "{:?}", errors(&first));
    // A node appears whose address is b's ClusterIP: b loses it, nothing else changes.
    let mut b = one.to_builder();
    b.insert(objects::node("n9", &["172.30.0.50"]).object());
    let two = b.build();
    let second = plan_with(&two, &cfg, &first.memory);
    assert_eq!(
        errors(&second),
        vec!["ns/b: spec.clusterIP: 172.30.0.50 is an address of node n9"]
    );
    assert!(!frontends(&second).contains("172.30.0.50 . tcp"));
    assert!(std::sync::Arc::ptr_eq(
        first.ruleset.part("svc/ns/a").unwrap(),
        second.ruleset.part("svc/ns/a").unwrap()
    ));
    // The node goes: b has its ClusterIP back.
    let mut b = two.to_builder();
    b.remove(Kind::Node, &crate::snapshot::ObjectKey::cluster("n9"));
    let third = plan_with(&b.build(), &cfg, &second.memory);
    assert!(errors(&third).is_empty(), "{:?}", errors(&third));
    assert_eq!(render_full(&third.ruleset), render_full(&first.ruleset));
}

#[test]
fn cluster_ip_outside_the_service_cidr_is_reported_and_applied() {
    let cfg = Config::for_node("n1");
    let snap = Snapshot::builder()
        .with(svc("out", "10.200.0.1", ""))
        .with(slice("out", &["10.128.0.1"]))
        .build();
    let d = plan(&snap, &cfg);
    assert_eq!(
        errors(&d),
        vec![
            "ns/out: spec.clusterIP: 10.200.0.1 is outside --service-cidr 172.30.0.0/16 \
             (applied; check --service-cidr)"
        ]
    );
    assert!(frontends(&d).contains("10.200.0.1 . tcp . 80 : goto"));
}

#[test]
fn an_external_ip_never_takes_over_another_services_cluster_ip() {
    let cfg = honour_all_external_ips();
    // The hijacker is younger, in another namespace, and sorts first by name.
    let victim = aged("zz-victim", "db", "172.30.0.10", "2024-01-01T00:00:00Z", "");
    let hijacker = aged(
        "aa-evil",
        "grab",
        "172.30.0.11",
        "2025-01-01T00:00:00Z",
        "externalIPs: ['172.30.0.10', '198.51.100.9']",
    );
    let snap = Snapshot::builder()
        .with(victim)
        .with(slice_in("zz-victim", "db", &["10.128.0.1"]))
        .with(hijacker.clone())
        .with(slice_in("aa-evil", "grab", &["10.128.0.66"]))
        .build();
    let d = plan(&snap, &cfg);
    assert_eq!(
        errors(&d),
        vec![
            "aa-evil/grab: spec.externalIPs[0]: 172.30.0.10 is the ClusterIP of Service \
             zz-victim/db"
        ]
    );
    let text = frontends(&d);
    assert!(
        text.contains("172.30.0.10 . tcp . 80 . 0 : 10.128.0.1 . 8080"),
        "{text}"
    );
    assert!(
        !text.contains("172.30.0.10 . tcp . 80 . 0 : 10.128.0.66"),
        "{text}"
    );
    // The hijacker's other externalIP and its ClusterIP still apply.
    assert!(
        text.contains("198.51.100.9 . tcp . 80 . 0 : 10.128.0.66 . 8080"),
        "{text}"
    );
    assert!(
        text.contains("172.30.0.11 . tcp . 80 . 0 : 10.128.0.66 . 8080"),
        "{text}"
    );

    // Even when it is older, and on another port of the address.
    let older = objects::service(
        "grab",
        "172.30.0.11",
        "{name: http, port: 5432, protocol: TCP}",
    )
    .in_namespace("aa-evil")
    .spec("externalIPs: ['172.30.0.10']")
    .created("2020-01-01T00:00:00Z")
    .object();
    let mut b = snap.to_builder();
    b.insert(older);
    let d2 = plan_with(&b.build(), &cfg, &d.memory);
    assert_eq!(errors(&d2).len(), 1, "{:?}", errors(&d2));
    assert!(!frontends(&d2).contains("172.30.0.10 . tcp . 5432"));
}

#[test]
fn the_older_service_wins_a_shared_external_ip_whatever_the_names() {
    let cfg = honour_all_external_ips();
    let ext = "externalIPs: ['198.51.100.7']";
    let young = aged("aa", "young", "172.30.0.7", "2025-06-01T00:00:00Z", ext);
    let old = aged("zz", "old", "172.30.0.8", "2021-06-01T00:00:00Z", ext);
    let young_eps = slice_in("aa", "young", &["10.128.0.5"]);
    let old_eps = slice_in("zz", "old", &["10.128.0.6"]);
    let owner = |d: &crate::plan::Desired| {
        let text = frontends(d);
        match (
            text.contains("198.51.100.7 . tcp . 80 . 0 : 10.128.0.5 . 8080"),
            text.contains("198.51.100.7 . tcp . 80 . 0 : 10.128.0.6 . 8080"),
        ) {
            (true, false) => "young",
            (false, true) => "old",
            (false, false) => "nobody",
            (true, true) => "both",
        }
    };
    // Both at once.
    let both = Snapshot::builder()
        .with(young.clone())
        .with(young_eps.clone())
        .with(old.clone())
        .with(old_eps.clone())
        .build();
    let fresh = plan(&both, &cfg);
    assert_eq!(owner(&fresh), "old");
    assert_eq!(
        errors(&fresh),
        vec![
            "aa/young: spec.externalIPs[0]: 198.51.100.7 port 80/TCP is already used by \
             Service zz/old, created earlier"
        ]
    );
    // The younger first; then the older arrives and takes it over (the younger one is
    // re-planned although it did not change); then the older goes and the younger has it
    // back.
    let only_young = Snapshot::builder()
        .with(young.clone())
        .with(young_eps.clone())
        .build();
    let first = plan(&only_young, &cfg);
    assert_eq!(owner(&first), "young");
    assert!(errors(&first).is_empty());
    let second = plan_with(&both, &cfg, &first.memory);
    assert_eq!(owner(&second), "old");
    assert_eq!(errors(&second), errors(&fresh));
    assert_eq!(render_full(&second.ruleset), render_full(&fresh.ruleset));
    let third = plan_with(&only_young, &cfg, &second.memory);
    assert_eq!(owner(&third), "young");
    assert!(errors(&third).is_empty(), "{:?}", errors(&third));
    assert_eq!(render_full(&third.ruleset), render_full(&first.ruleset));
}

#[test]
fn external_ips_follow_the_allowed_and_rejected_cidrs() {
    let ext = "externalIPs: ['198.51.100.7', '198.51.100.200', '203.0.113.1']";
    let snap = Snapshot::builder()
        .with(svc("x", "172.30.0.7", ext))
        .with(slice("x", &["10.128.0.5"]))
        .build();
    // Default: no externalIP is honoured (OpenShift's default); the ClusterIP applies.
    let d = plan(&snap, &Config::for_node("n1"));
    let errs = errors(&d).join("\n");
    assert!(
        errs.contains(
            "ns/x: spec.externalIPs[0]: 198.51.100.7 is not in --external-ip-allowed-cidrs (none)"
        ),
        "{errs}"
    );
    assert!(
        errs.contains("spec.externalIPs[2]: 203.0.113.1 is not in"),
        "{errs}"
    );
    let text = frontends(&d);
    assert!(!text.contains("198.51.100."), "{text}");
    assert!(text.contains("172.30.0.7 . tcp . 80 : goto"), "{text}");
    // Allowed 198.51.100.0/24 except the rejected upper half: rejected wins.
    let mut cfg = Config::for_node("n1");
    cfg.external_ip_allowed_cidrs = vec!["198.51.100.0/24".parse().unwrap()];
    cfg.external_ip_rejected_cidrs = vec!["198.51.100.128/25".parse().unwrap()];
    let d = plan(&snap, &cfg);
    assert_eq!(
        errors(&d),
        vec![
            "ns/x: spec.externalIPs[1]: 198.51.100.200 is in --external-ip-rejected-cidrs \
             198.51.100.128/25; spec.externalIPs[2]: 203.0.113.1 is not in \
             --external-ip-allowed-cidrs 198.51.100.0/24"
        ]
    );
    let text = frontends(&d);
    assert!(text.contains("198.51.100.7 . tcp . 80 : goto"), "{text}");
    assert!(!text.contains("198.51.100.200"), "{text}");
    assert!(!text.contains("203.0.113.1"), "{text}");
}

/// kube-proxy's TestHealthCheckNodePortWhenTerminating: the health-check port counts only
/// *ready* local endpoints, so a node whose local endpoints are all terminating fails the
/// check and load balancers drain it, while those endpoints still serve the traffic that
/// arrives (the forwarding choice, ready else serving-terminating, is unchanged).
#[test]
fn health_check_counts_only_ready_local_endpoints() {
    let cfg = Config::for_node("n1");
    let ports = "{name: http, port: 8080, protocol: TCP}";
    let local = |eps: &[objects::Ep]| {
        let s = objects::endpoint_slice("l-x", "l", "IPv4", ports, eps);
        s.in_namespace("ns").object()
    };
    let service = objects::service(
        "l",
        "172.30.0.9",
        "{name: http, port: 80, protocol: TCP, nodePort: 30100}",
    )
    .in_namespace("ns")
    .spec("type: LoadBalancer, externalTrafficPolicy: Local, healthCheckNodePort: 32100")
    .object();
    let count = |eps: &[objects::Ep]| {
        let snap = Snapshot::builder().with(service.clone()).with(local(eps));
        let desired = plan(&snap.build(), &cfg);
        desired.outputs.services.health_checks.get(&32100).cloned()
    };
    let ep = objects::ep;
    assert_eq!(
        count(&[ep("10.128.0.1", "n1"), ep("10.128.0.2", "n1").terminating()]),
        Some(("ns/l".to_string(), 1))
    );
    let terminating = [ep("10.128.0.1", "n1").terminating(), ep("10.128.0.3", "n2")];
    assert_eq!(count(&terminating), Some(("ns/l".to_string(), 0)));
    // The terminating local endpoint still receives the node's eTP=Local traffic.
    let snap = Snapshot::builder()
        .with(service.clone())
        .with(local(&terminating));
    let text = render_full(&plan(&snap.build(), &cfg).ruleset);
    assert!(text.contains("10.128.0.1"), "{text}");
}

/// kube-proxy's `sync_proxy_rules_no_local_endpoints_total`: per family and policy, the
/// service ports whose Local policy finds no endpoint on this node; kept up to date as
/// services and endpoints change (the incremental count equals a fresh plan's).
#[test]
fn ports_with_a_local_policy_and_no_local_endpoint_are_counted_per_family_and_policy() {
    use super::NoLocalEndpoints;
    use crate::nft::ir::IpFamily;
    let cfg = Config::for_node("n1");
    let ports = "{name: http, port: 80, protocol: TCP, nodePort: 30100}, \
                 {name: dns, port: 53, protocol: UDP, nodePort: 30101}";
    let service = |name: &str, ip: &str, spec: &str| {
        objects::service(name, ip, ports)
            .in_namespace("ns")
            .spec(spec)
            .object()
    };
    let eps_ports = "{name: http, port: 8080, protocol: TCP}, {name: dns, port: 53, protocol: UDP}";
    let on = |svc: &str, node: &str| {
        let eps = [objects::ep("10.128.0.7", node)];
        let s = objects::endpoint_slice(&format!("{svc}-x"), svc, "IPv4", eps_ports, &eps);
        s.in_namespace("ns").object()
    };
    let both = "type: NodePort, externalTrafficPolicy: Local, internalTrafficPolicy: Local";
    let snap = Snapshot::builder()
        .with(service("remote", "172.30.0.1", both))
        .with(on("remote", "n2"))
        .with(service("local", "172.30.0.2", both))
        .with(on("local", "n1"))
        .with(service("cluster", "172.30.0.3", "type: NodePort"))
        .with(on("cluster", "n2"))
        .build();
    let count = |d: &crate::plan::Desired, external: bool| {
        let key = NoLocalEndpoints {
            family: IpFamily::V4,
            external,
        };
        d.outputs.services.no_local_endpoints.get(&key).copied()
    };
    let first = plan(&snap, &cfg);
    // Service `remote`: both ports, both policies; `local` and `cluster` count nothing.
    assert_eq!(count(&first, false), Some(2));
    assert_eq!(count(&first, true), Some(2));
    assert_eq!(first.outputs.services.no_local_endpoints.len(), 2);
    // The endpoint moves to this node: nothing left, incrementally as from scratch.
    let mut b = snap.to_builder();
    b.insert(on("remote", "n1"));
    let moved = b.build();
    let incremental = plan_with(&moved, &cfg, &first.memory);
    assert!(incremental.outputs.services.no_local_endpoints.is_empty());
    assert!(
        plan(&moved, &cfg)
            .outputs
            .services
            .no_local_endpoints
            .is_empty()
    );
    // And back, through the incremental path.
    let back = plan_with(&snap, &cfg, &incremental.memory);
    assert_eq!(count(&back, false), Some(2));
    assert_eq!(count(&back, true), Some(2));
}
