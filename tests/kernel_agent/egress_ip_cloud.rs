//! The cloud flow of the EgressIP assigner against the fake API server and the test kit's
//! cloud-controller stand-in: nodes with an `aws://` providerID and the
//! `cloud.network.openshift.io/egress-ipconfig` annotation make the platform a cloud; the
//! assigner creates one CloudPrivateIPConfig per assigned IP, writes `status.items` only once
//! the cloud attached it, moves it by changing `spec.node`, deletes it when no longer
//! assigned, reports a `CloudResponseError` and retries (on another node, or on the same one
//! after its backoff), respects the NIC capacity, and names IPv6 objects fully expanded.

use std::net::IpAddr;
use std::time::Duration;

use nodeplane::api::cloud_private_ip_config::name_for_ip;
use nodeplane::controller::egress_ip::cloud_sync::{CLOUD_ERROR, CLOUD_REQUESTED};
use nodeplane::testing::cloud_controller::CloudController;
use nodeplane::testing::fakeapi::FakeApi;
use nodeplane::testing::lab::eventually;
use serde_json::{Value, json};

use super::egress_ip_assign::{
    WAIT, egress_ip, events, fake_api, items, node_status, start, wait_items,
};

const HOLD: Duration = Duration::MAX;

/// An AWS node at `ip`/24 (and `fd00:50::<n>`/64), egress-assignable, Ready, whose NIC takes
/// `capacity` IPv4 and IPv6 egress IPs.
fn cloud_node(name: &str, ip: &str, capacity: u32, ready: bool) -> Value {
    let host = ip.rsplit('.').next().unwrap();
    let config = json!([{"interface": format!("eni-{name}"),
        "ifaddr": {"ipv4": "192.168.50.0/24", "ipv6": "fd00:50::/64"},
        "capacity": {"ipv4": capacity, "ipv6": capacity}}]);
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name,
            "labels": {"kubernetes.io/hostname": name, "k8s.ovn.org/egress-assignable": ""},
            "annotations": {
                "k8s.ovn.org/host-cidrs": format!("[\"{ip}/24\",\"fd00:50::{host}/64\"]"),
                "cloud.network.openshift.io/egress-ipconfig": config.to_string()}},
        "spec": {"providerID": format!("aws:///us-east-1a/i-{name}")},
        "status": node_status(ip, ready)})
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The CloudPrivateIPConfig of `ip`: `(spec.node, status.node, Assigned reason)`.
fn cloud_request(api: &FakeApi, ip: IpAddr) -> Option<(String, String, String)> {
    let obj = api.object("CloudPrivateIPConfig", "", &name_for_ip(ip))?;
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    Some((
        s(&obj["spec"]["node"]),
        s(&obj["status"]["node"]),
        s(&obj["status"]["conditions"][0]["reason"]),
    ))
}

#[track_caller]
fn wait_request(api: &FakeApi, ip: IpAddr, want: Option<(&str, &str, &str)>) {
    let want = want.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    eventually(WAIT, || {
        let got = cloud_request(api, ip);
        (got == want)
            .then_some(())
            .ok_or_else(|| format!("CloudPrivateIPConfig {ip}: {got:?}, want {want:?}"))
    });
}

#[test]
fn cloud_assignment_waits_for_the_cloud_then_moves_and_deletes() {
    let api = fake_api();
    api.put(cloud_node("w1", "192.168.50.11", 4, true));
    api.put(cloud_node("w2", "192.168.50.12", 4, true));
    let cloud = CloudController::start(&api, HOLD);
    api.put(egress_ip("a", "2024-01-01T00:00:00Z", &["192.168.50.100"]));
    let a = start(api, true);
    let eip = ip("192.168.50.100");

    // Requested on w1; while the cloud has not answered, status.items stays empty.
    wait_request(&a.api, eip, Some(("w1", "", "CloudResponsePending")));
    wait_items(&a.api, "a", &[]);
    let created = a
        .api
        .writes()
        .into_iter()
        .find(|w| w.method == "POST" && w.path.ends_with("/cloudprivateipconfigs"))
        .expect("a create");
    assert_eq!(created.body["metadata"]["name"], "192.168.50.100");
    assert_eq!(created.body["spec"], json!({"node": "w1"}));
    assert_eq!(
        events(&a.api, "a", CLOUD_REQUESTED)[0]["note"],
        "192.168.50.100 requested from the cloud on node w1"
    );
    cloud.set_delay(Duration::ZERO);
    wait_request(&a.api, eip, Some(("w1", "w1", "CloudResponseSuccess")));
    wait_items(&a.api, "a", &[("192.168.50.100", "w1")]);

    // w1 no longer Ready: a move is a new spec.node; the IP leaves status.items at once
    // (the cloud releases it from w1 first) and comes back on w2 once attached there.
    cloud.set_delay(HOLD);
    a.api.put(cloud_node("w1", "192.168.50.11", 4, false));
    wait_request(&a.api, eip, Some(("w2", "", "CloudResponsePending")));
    wait_items(&a.api, "a", &[]);
    cloud.set_delay(Duration::ZERO);
    wait_request(&a.api, eip, Some(("w2", "w2", "CloudResponseSuccess")));
    wait_items(&a.api, "a", &[("192.168.50.100", "w2")]);

    // No EgressIP asks for it any more: the request is deleted.
    a.api.delete("EgressIP", "", "a");
    wait_request(&a.api, eip, None);
}

#[test]
fn cloud_error_is_reported_and_retried_on_another_node_then_on_the_same() {
    let api = fake_api();
    api.put(cloud_node("w1", "192.168.50.11", 4, true));
    api.put(cloud_node("w2", "192.168.50.12", 4, true));
    let cloud = CloudController::start(&api, Duration::from_millis(50));
    let eip = ip("192.168.50.100");
    cloud.refuse(eip, "w1");
    api.put(egress_ip("a", "2024-01-01T00:00:00Z", &["192.168.50.100"]));
    let a = start(api, true);

    // Refused on w1: a Warning Event with the cloud's message, then w2 takes it.
    let ev = eventually(WAIT, || {
        events(&a.api, "a", CLOUD_ERROR)
            .pop()
            .ok_or("no Event yet".to_string())
    });
    assert_eq!(ev["type"], "Warning");
    let note = ev["note"].as_str().unwrap();
    assert!(
        note.starts_with(
            "192.168.50.100: the cloud could not attach it to node w1: injected: the cloud \
             refuses 192.168.50.100 on w1; node w1 is avoided for 1s"
        ),
        "{note}"
    );
    wait_request(&a.api, eip, Some(("w2", "w2", "CloudResponseSuccess")));
    wait_items(&a.api, "a", &[("192.168.50.100", "w2")]);

    // w2 leaves; w1 is the only node and refuses: the IP is unassigned (with the reason),
    // then asked of w1 again after the backoff, which the cloud now accepts.
    // (The success on w2 reset the backoff: w1 is avoided below only after a new refusal.
    // That CloudError Event has the first one's text: the Event recorder patches it.)
    a.api.put(cloud_node("w2", "192.168.50.12", 4, false));
    wait_items(&a.api, "a", &[]);
    let why = eventually(WAIT, || {
        events(&a.api, "a", "NoMatchingNodeFound")
            .pop()
            .ok_or("no NoMatchingNodeFound Event yet".to_string())
    });
    assert!(
        why["note"]
            .as_str()
            .unwrap()
            .ends_with("node w1: the cloud failed to attach it there, retrying later"),
        "{why}"
    );
    cloud.accept(eip, "w1");
    wait_request(&a.api, eip, Some(("w1", "w1", "CloudResponseSuccess")));
    wait_items(&a.api, "a", &[("192.168.50.100", "w1")]);
}

#[test]
fn cloud_capacity_is_respected_and_ipv6_names_are_fully_expanded() {
    let api = fake_api();
    // One IPv4 and one IPv6 egress IP per NIC.
    api.put(cloud_node("w1", "192.168.50.11", 1, true));
    api.put(cloud_node("w2", "192.168.50.12", 1, true));
    let _cloud = CloudController::start(&api, Duration::ZERO);
    api.put(egress_ip("a", "2024-01-01T00:00:00Z", &["192.168.50.100"]));
    api.put(egress_ip("b", "2024-01-02T00:00:00Z", &["192.168.50.101"]));
    api.put(egress_ip("c", "2024-01-03T00:00:00Z", &["192.168.50.102"]));
    api.put(egress_ip("v6", "2024-01-04T00:00:00Z", &["fd00:50::100"]));
    let a = start(api, true);
    wait_items(&a.api, "a", &[("192.168.50.100", "w1")]);
    wait_items(&a.api, "b", &[("192.168.50.101", "w2")]);
    wait_items(&a.api, "v6", &[("fd00:50::100", "w1")]);
    let ev = eventually(WAIT, || {
        events(&a.api, "c", "NoMatchingNodeFound")
            .pop()
            .ok_or("no Event yet".to_string())
    });
    assert_eq!(
        ev["note"],
        "spec.egressIPs[0]: 192.168.50.102 is not assigned: no candidate node can host it in \
         the cloud: node w1: at capacity (ipv4 1, ipv6 1); node w2: at capacity (ipv4 1, ipv6 1)"
    );
    assert_eq!(items(&a.api, "c"), Some(vec![]));
    assert!(cloud_request(&a.api, ip("192.168.50.102")).is_none());
    let v6 = a
        .api
        .object(
            "CloudPrivateIPConfig",
            "",
            "fd00.0050.0000.0000.0000.0000.0000.0100",
        )
        .expect("the IPv6 request, fully expanded with '.'");
    assert_eq!(v6["spec"]["node"], "w1");
}

/// A deleted EgressIP frees a slot another one waits for: the new CloudPrivateIPConfig is
/// created only once the old one is gone (the cloud released the IP; the stand-in holds a
/// finalizer until then), never while both exist, so the node is never asked for more than
/// its capacity.
#[test]
fn cloud_capacity_counts_a_request_being_deleted_until_it_is_gone() {
    let api = fake_api();
    api.put(cloud_node("w1", "192.168.50.11", 1, true));
    let cloud = CloudController::start(&api, Duration::ZERO);
    api.put(egress_ip("a", "2024-01-01T00:00:00Z", &["192.168.50.100"]));
    api.put(egress_ip("b", "2024-01-02T00:00:00Z", &["192.168.50.101"]));
    let a = start(api, true);
    let (old, new) = (ip("192.168.50.100"), ip("192.168.50.101"));
    wait_items(&a.api, "a", &[("192.168.50.100", "w1")]);
    eventually(WAIT, || {
        (!events(&a.api, "b", "NoMatchingNodeFound").is_empty())
            .then_some(())
            .ok_or("b: no NoMatchingNodeFound Event yet".to_string())
    });

    // The cloud takes its time to release the IP of the deleted EgressIP.
    cloud.set_delay(HOLD);
    a.api.delete("EgressIP", "", "a");
    eventually(WAIT, || {
        let obj = a.api.object("CloudPrivateIPConfig", "", &name_for_ip(old));
        obj.filter(|o| !o["metadata"]["deletionTimestamp"].is_null())
            .map(|_| ())
            .ok_or("the old request is not being deleted yet".to_string())
    });
    // The assigner sees the object being deleted (one sync per snapshot, milliseconds); give
    // it ample time to do the wrong thing.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        cloud_request(&a.api, new).is_none(),
        "created while {old} still occupies w1's only slot: {:?}",
        a.api.objects("CloudPrivateIPConfig")
    );

    // Released: the slot is free, b gets it.
    cloud.set_delay(Duration::ZERO);
    wait_request(&a.api, new, Some(("w1", "w1", "CloudResponseSuccess")));
    wait_items(&a.api, "b", &[("192.168.50.101", "w1")]);
    assert!(cloud_request(&a.api, old).is_none());
    let order: Vec<String> = a
        .api
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/cloudprivateipconfigs"))
        .filter(|w| w.method == "POST" || w.method == "DELETE")
        .map(|w| {
            format!(
                "{} {}",
                w.method,
                w.body["metadata"]["name"].as_str().unwrap_or(&w.path)
            )
        })
        .collect();
    let deleted = order.iter().position(|w| w.starts_with("DELETE"));
    let created = order.iter().position(|w| w.contains("192.168.50.101"));
    match (deleted, created) {
        (Some(d), Some(c)) => assert!(d < c, "writes in this order: {order:?}"),
        _ => panic!("want a DELETE, then the create: {order:?}"),
    }
}

/// In the netns cluster with agents: nodes are AWS instances, the cloud holds its answer,
/// then attaches. Before `Assigned=True` no node has the address and the pod's traffic leaves
/// with its node's address (the CNI masquerade); after it, with the egress IP. Prints the
/// time from the stand-in writing `Assigned=True` to the first datagram from the egress IP
/// at the external host (docs/performance.md).
#[test]
fn cloud_snat_starts_only_after_the_cloud_attached_the_ip() {
    use nodeplane::testing::eip_cluster::{EIP, EXT, EipCluster};
    use nodeplane::testing::lab::{DatagramSender, DatagramSink};
    use std::time::Instant;

    let wait = Duration::from_secs(15);
    let c = EipCluster::new(3, &[0, 1]);
    c.make_cloud(&[0, 1]);
    let cloud = CloudController::start(&c.api, HOLD);
    c.start_agent(2);
    assert_eq!(c.wait_leader(wait), 2, "{}", c.all_logs());
    c.start_agent(0);
    c.start_agent(1);
    for i in 0..3 {
        c.wait_ready(i, wait);
    }
    let eip: IpAddr = EIP.parse().unwrap();
    let sink_addr = format!("{EXT}:9999").parse().unwrap();
    let sink = DatagramSink::start(&c.ext, sink_addr);
    // A new flow per datagram: an existing flow keeps the NAT it started with.
    let _sender =
        DatagramSender::start_new_flows(&c.pods[0].ns, sink_addr, Duration::from_millis(10));
    c.put_egress_ip();

    // Requested from the cloud, which holds its answer.
    let node = eventually(wait, || match cloud_request(&c.api, eip) {
        Some((node, _, reason)) if reason == "CloudResponsePending" => Ok(node),
        other => Err(format!("CloudPrivateIPConfig {EIP}: {other:?}")),
    });
    let host = c.index(&node);
    let requested = Instant::now();
    // The pod's traffic keeps flowing, from its node's address.
    eventually(wait, || {
        let o = sink.outage(eip, requested);
        (o.leaked >= 50)
            .then_some(())
            .ok_or(format!("{} datagrams since the request", o.leaked))
    });
    assert_eq!(sink.first_from(eip, requested), None, "{}", c.all_logs());
    for i in 0..3 {
        assert!(
            !c.has_eip(i),
            "node-{} has {EIP} before the cloud attached it",
            i + 1
        );
    }
    assert_eq!(c.status()["items"], json!([]), "{}", c.status());

    // The cloud attaches it (about 1 s after the answer is let go).
    cloud.set_delay(Duration::from_secs(1));
    let attached = eventually(wait, || {
        cloud
            .attached_at(eip, &node)
            .ok_or(format!("not attached to {node} yet"))
    });
    let first = eventually(wait, || {
        sink.first_from(eip, attached)
            .ok_or(format!("no datagram from {EIP} yet\n{}", c.all_logs()))
    });
    let leaked_after = sink.outage(eip, attached).leaked;
    // Nothing left with the egress IP before the cloud said so.
    let early: Vec<_> = sink
        .arrivals()
        .into_iter()
        .filter(|a| a.src == eip && a.at < attached)
        .collect();
    assert!(
        early.is_empty(),
        "{} datagrams from {EIP} before Assigned=True",
        early.len()
    );
    // SNAT is committed before the address is added (rules before an address attracts
    // traffic): the first datagram can leave a moment before the address is there.
    eventually(wait, || {
        (c.has_eip(host)).then_some(()).ok_or(format!(
            "node-{} lacks {EIP}\n{}",
            host + 1,
            c.all_logs()
        ))
    });
    eprintln!(
        "cloud egress IP on {node}: Assigned=True to the first datagram from {EIP} at the \
         external host: {:.1} ms (a new flow every 10 ms; {} from another source after \
         Assigned=True)",
        (first - attached).as_secs_f64() * 1e3,
        leaked_after
    );
}
