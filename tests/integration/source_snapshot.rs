//! Snapshot building, queries, and the object helpers.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, PodIP, PodSpec, PodStatus};
use nodeplane::api::service::ServiceSpec;
use nodeplane::api::{EndpointSlice, Namespace, Node, ObjectMeta, Pod, Service};
use nodeplane::snapshot::*;

fn meta(ns: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: ns.map(str::to_string),
        name: Some(name.to_string()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn pod(ns: &str, name: &str, node: &str, ips: &[&str]) -> Pod {
    Pod {
        metadata: meta(Some(ns), name, &[]),
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            pod_ip: ips.first().map(|s| s.to_string()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..Default::default()
        }),
    }
}

fn slice(ns: &str, name: &str, service: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(Some(ns), name, &[(SERVICE_NAME_LABEL, service)]),
        address_type: "IPv4".into(),
        ..Default::default()
    }
}

/// A Service with `spec.clusterIP` 172.30.0.<first> and `spec.clusterIPs` of both.
fn service(ns: &str, name: &str, ips: &[u8]) -> Service {
    let ips: Vec<String> = ips.iter().map(|n| format!("172.30.0.{n}")).collect();
    Service {
        metadata: meta(Some(ns), name, &[]),
        spec: Some(ServiceSpec {
            cluster_ip: ips.first().cloned(),
            cluster_ips: Some(ips),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sample() -> Snapshot {
    Snapshot::builder()
        .with(Namespace {
            metadata: meta(None, "a", &[("team", "x")]),
            ..Default::default()
        })
        .with(pod("a", "p1", "n1", &["10.128.0.5", "fd00::5"]))
        .with(pod("a", "p2", "n2", &["10.128.2.5"]))
        .with(pod("ab", "p3", "n1", &["10.128.0.6"]))
        .with(pod("b", "p4", "n1", &[]))
        .with(slice("a", "web-abc", "web"))
        .with(slice("a", "web-def", "web"))
        .with(slice("b", "web-xyz", "web"))
        .build()
}

fn names<'a, T: 'a + k8s_openapi::Metadata<Ty = ObjectMeta>>(
    it: impl Iterator<Item = &'a Arc<T>>,
) -> Vec<String> {
    it.map(|o| o.metadata().name.clone().unwrap()).collect()
}

#[test]
fn queries() {
    let s = sample();
    assert_eq!(names(s.pods_in_namespace("a")), ["p1", "p2"]);
    assert_eq!(names(s.pods_in_namespace("ab")), ["p3"]);
    assert_eq!(names(s.pods_in_namespace("zzz")), Vec::<String>::new());
    assert_eq!(names(s.pods_on_node("n1")), ["p1", "p3", "p4"]);
    assert_eq!(
        names(s.endpoint_slices_for_service("a", "web")),
        ["web-abc", "web-def"]
    );
    assert_eq!(s.namespace_labels("a").unwrap().get("team").unwrap(), "x");
    assert!(s.namespace_labels("b").is_none());
    assert_eq!(s.count(Kind::Pod), 4);
    assert_eq!(s.len(), 8);
    assert_eq!(
        format!("{s:?}"),
        "Snapshot { counts: {Namespace: 1, Pod: 4, EndpointSlice: 3} }"
    );
    let p1 = s.pod("a", "p1").unwrap();
    assert_eq!(
        pod_ips(p1),
        [
            "10.128.0.5".parse::<IpAddr>().unwrap(),
            "fd00::5".parse().unwrap()
        ]
    );
    assert_eq!(pod_node_name(p1), Some("n1"));
    assert!(pod_ips(s.pod("b", "p4").unwrap()).is_empty());
}

#[test]
fn builder_replace_remove_and_clone() {
    let s = sample();
    let mut b = s.to_builder();
    let old = b.insert(pod("a", "p1", "n2", &["10.128.2.9"]));
    assert!(matches!(old, Some(AnyObject::Pod(_))));
    assert!(b.remove(Kind::Pod, &ObjectKey::new("ab", "p3")).is_some());
    assert!(
        b.remove(Kind::Namespace, &ObjectKey::new("ignored", "a"))
            .is_some()
    );
    let s2 = b.build();
    assert_eq!(names(s2.pods_on_node("n2")), ["p1", "p2"]);
    assert_eq!(names(s2.pods_on_node("n1")), ["p4"]);
    // The original is untouched and clones share storage.
    assert_eq!(names(s.pods_on_node("n1")), ["p1", "p3", "p4"]);
    assert!(s.clone().ptr_eq(&s));
    assert_eq!(s.to_builder().build(), s);
    assert_ne!(s2, s);
    assert_eq!(s2.objects().count(), s2.len());
}

#[test]
fn node_address_helpers() {
    let addr = |t: &str, a: &str| NodeAddress {
        type_: t.into(),
        address: a.into(),
    };
    let node = Node {
        metadata: meta(None, "n1", &[]),
        status: Some(NodeStatus {
            addresses: Some(vec![
                addr("Hostname", "n1"),
                addr("InternalIP", "192.168.50.11"),
                addr("ExternalIP", "203.0.113.11"),
                addr("InternalIP", "192.168.50.11"),
                addr("InternalIP", "fd00::11"),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        node_internal_ips(&node),
        [ip("192.168.50.11"), ip("fd00::11")]
    );
    assert_eq!(
        node_ips(&node),
        [ip("192.168.50.11"), ip("203.0.113.11"), ip("fd00::11")]
    );
}

#[test]
fn kinds_and_normalize() {
    assert_eq!(
        Kind::from_type("discovery.k8s.io/v1", "EndpointSlice"),
        Some(Kind::EndpointSlice)
    );
    assert_eq!(
        Kind::from_type("discovery.k8s.io/v1beta1", "EndpointSlice"),
        None
    );
    assert_eq!(
        Kind::from_type("k8s.ovn.org/v1", "EgressQoS"),
        Some(Kind::EgressQoS)
    );
    assert_eq!(Kind::from_type("v1", "ConfigMap"), None);
    assert_eq!(Kind::from_name("EgressIP"), Some(Kind::EgressIP));
    assert_eq!(
        Kind::from_type("networking.k8s.io/v1", "NetworkPolicy"),
        Some(Kind::NetworkPolicy)
    );
    assert_eq!(Kind::ALL.len(), 11);

    let mut p = AnyObject::from(Pod {
        metadata: meta(None, "x", &[]),
        ..Default::default()
    });
    p.meta_mut().managed_fields = Some(vec![Default::default()]);
    p.normalize();
    assert_eq!(p.meta().namespace.as_deref(), Some("default"));
    assert!(p.meta().managed_fields.is_none());
    let mut n = AnyObject::from(Node {
        metadata: meta(Some("oops"), "n", &[]),
        ..Default::default()
    });
    n.normalize();
    assert_eq!(n.key(), ObjectKey::cluster("n"));
    assert_eq!(n.key().to_string(), "n");
    assert_eq!(p.key().to_string(), "default/x");
}

#[test]
fn a_relabelled_slice_moves_between_services_and_changes_lists_only_the_difference() {
    let s = sample();
    let mut b = s.to_builder();
    b.insert(slice("a", "web-def", "api"));
    let s2 = b.build();
    assert_eq!(
        names(s2.endpoint_slices_for_service("a", "web")),
        ["web-abc"]
    );
    assert_eq!(
        names(s2.endpoint_slices_for_service("a", "api")),
        ["web-def"]
    );
    let changed: Vec<String> = changes(s.endpoint_slices(), s2.endpoint_slices())
        .map(|(k, old, new)| format!("{k} {} {}", old.is_some(), new.is_some()))
        .collect();
    assert_eq!(changed, ["a/web-def true true"]);
    // An identical object re-sent (a relist) is no change.
    let mut b = s2.to_builder();
    b.insert(slice("a", "web-def", "api"));
    assert_eq!(
        changes(s2.endpoint_slices(), b.build().endpoint_slices()).count(),
        0
    );
    let mut b = s2.to_builder();
    b.clear_kind(Kind::EndpointSlice);
    let s3 = b.build();
    assert_eq!(s3.endpoint_slices_for_service("a", "api").count(), 0);
    assert_eq!(
        changes(s2.endpoint_slices(), s3.endpoint_slices()).count(),
        3
    );
}

mod incremental {
    use super::*;
    use proptest::prelude::*;

    /// One step: insert pod `i` on node `n`, insert slice `i` of service `svc`, or remove.
    #[derive(Debug, Clone)]
    enum Step {
        Pod(u8, u8),
        Slice(u8, u8),
        /// Service `i` with ClusterIPs `a` and `b` of a small pool (so services share them).
        Service(u8, u8, u8),
        RemovePod(u8),
        RemoveSlice(u8),
        RemoveService(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..8u8, 0..3u8).prop_map(|(i, n)| Step::Pod(i, n)),
            (0..8u8, 0..3u8).prop_map(|(i, n)| Step::Slice(i, n)),
            (0..8u8, 0..4u8, 0..4u8).prop_map(|(i, a, b)| Step::Service(i, a, b)),
            (0..8u8).prop_map(Step::RemovePod),
            (0..8u8).prop_map(Step::RemoveSlice),
            (0..8u8).prop_map(Step::RemoveService),
        ]
    }

    proptest! {
        /// The indexes kept up to date by every insert and remove equal those of a snapshot
        /// built from scratch from the same objects.
        #[test]
        fn indexes_kept_by_deltas_equal_indexes_built_from_scratch(
            steps in proptest::collection::vec(step(), 0..40)
        ) {
            let mut snap = Snapshot::default();
            for s in steps {
                let mut b = snap.to_builder();
                match s {
                    Step::Pod(i, n) => { b.insert(pod("a", &format!("p{i}"), &format!("n{n}"), &[])); }
                    Step::Slice(i, n) => { b.insert(slice("a", &format!("s{i}"), &format!("svc{n}"))); }
                    Step::RemovePod(i) => { b.remove(Kind::Pod, &ObjectKey::new("a", format!("p{i}"))); }
                    Step::RemoveSlice(i) => { b.remove(Kind::EndpointSlice, &ObjectKey::new("a", format!("s{i}"))); }
                    Step::Service(i, x, y) => { b.insert(service("a", &format!("svc{i}"), &[x, y])); }
                    Step::RemoveService(i) => { b.remove(Kind::Service, &ObjectKey::new("a", format!("svc{i}"))); }
                }
                snap = b.build();
            }
            let mut scratch = Snapshot::builder();
            for o in snap.objects() {
                scratch.insert(o);
            }
            let scratch = scratch.build();
            for n in 0..4u8 {
                let ip: IpAddr = format!("172.30.0.{n}").parse().unwrap();
                let by_index = names(snap.services_with_cluster_ip(ip));
                let by_scan: Vec<String> = snap
                    .services()
                    .values()
                    .filter(|s| service_cluster_ips(s).contains(&ip))
                    .map(|s| s.metadata.name.clone().unwrap())
                    .collect();
                prop_assert_eq!(by_index, by_scan);
            }
            prop_assert_eq!(scratch, snap);
        }
    }
}
