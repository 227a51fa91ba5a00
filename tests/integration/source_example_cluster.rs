//! examples/cluster loads cleanly and holds what its README promises.

use std::net::IpAddr;
use std::path::Path;

use nodeplane::snapshot::{Kind, node_internal_ips, pod_ips, pod_is_host_network};
use nodeplane::source::manifests::load_dir;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn example_cluster_loads_without_problems() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster");
    let report = load_dir(&dir).unwrap();
    let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(report.files, 8);
    assert_eq!(report.ignored, 1, "the Deployment");

    let s = &report.snapshot;
    let counts: Vec<(Kind, usize)> = s.counts().into_iter().collect();
    assert_eq!(
        counts,
        [
            (Kind::Namespace, 3),
            (Kind::Pod, 7),
            (Kind::Node, 2),
            (Kind::Service, 2),
            (Kind::Endpoints, 2),
            (Kind::EndpointSlice, 2),
            (Kind::EgressFirewall, 1),
            (Kind::EgressQoS, 1),
            (Kind::EgressIP, 1),
            (Kind::CloudPrivateIPConfig, 1),
            (Kind::NetworkPolicy, 1),
        ]
    );

    // Nodes and pods line up.
    assert_eq!(
        node_internal_ips(s.node("worker-1").unwrap()),
        [ip("192.168.50.11")]
    );
    assert_eq!(
        node_internal_ips(s.node("worker-2").unwrap()),
        [ip("192.168.50.12")]
    );
    assert_eq!(s.pods_on_node("worker-1").count(), 4);
    assert_eq!(s.pods_on_node("worker-2").count(), 3);
    let cluster: ipnet::IpNet = "10.128.0.0/14".parse().unwrap();
    for pod in s.pods().values().filter(|p| !pod_is_host_network(p)) {
        let ips = pod_ips(pod);
        assert_eq!(ips.len(), 1);
        assert!(cluster.contains(&ips[0]), "{ips:?}");
        assert!(pod.metadata.managed_fields.is_none());
    }
    assert_eq!(s.pods_in_namespace("backend").count(), 3);
    assert_eq!(s.endpoint_slices_for_service("frontend", "web").count(), 1);
    assert_eq!(s.namespace_labels("backend").unwrap()["team"], "payments");

    // Every custom resource is valid.
    let fw = s.egress_firewall("backend").unwrap().validate().unwrap();
    assert_eq!(fw.rules.len(), 5);
    let qos = s.egress_qos("frontend").unwrap().validate().unwrap();
    assert_eq!(qos.rules.len(), 3);
    let eip = s.egress_ips()["egress-payments"].validate().unwrap();
    assert_eq!(
        eip.ips_on_node("worker-1").collect::<Vec<_>>(),
        [ip("192.168.50.100")]
    );
    let cloud = s.cloud_private_ip_configs()["192.168.50.100"]
        .validate()
        .unwrap();
    assert!(cloud.is_assigned_to("worker-1"));
}
