//! The EgressIP control plane against the fake API server: the assigner task (the library's,
//! with a hand-made leadership channel and the real Kubernetes source) writes `status.items`
//! by server-side apply under its role's field manager, reports IPs it cannot place as
//! Events, moves an IP off a node that stops being a candidate and nothing when a node
//! joins, writes status with the object when the CRD has no status subresource, and writes
//! nothing while it does not lead; the agent binary publishes its node's `host-cidrs`.

use std::net::TcpListener;
use std::time::Duration;

use nodeplane::controller::egress_ip::{self, FIELD_MANAGER};
use nodeplane::source::kube::{self as kube_source, Liveness, SourceHealth};
use nodeplane::testing::lab::{Lab, eventually};
use serde_json::{Value, json};
use tokio::sync::watch;

use nodeplane::testing::fakeapi::{FakeApi, Recorded};

pub(crate) const WAIT: Duration = Duration::from_secs(10);
const LABEL: &str = "k8s.ovn.org/egress-assignable";

fn node(name: &str, ip: &str, assignable: bool, ready: bool) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if assignable {
        labels[LABEL] = json!("");
    }
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
            "annotations": {"k8s.ovn.org/host-cidrs": format!("[\"{ip}/24\"]")}},
        "status": node_status(ip, ready)})
}

/// A Node's `status`: its InternalIP and its Ready condition.
pub(crate) fn node_status(ip: &str, ready: bool) -> Value {
    json!({"addresses": [{"type": "InternalIP", "address": ip}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
            "lastHeartbeatTime": "2024-01-01T00:00:00Z"}]})
}

/// EgressIP `name` for the namespaces labelled `team: <name>`.
pub(crate) fn egress_ip(name: &str, created: &str, ips: &[&str]) -> Value {
    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"egressIPs": ips, "namespaceSelector": {"matchLabels": {"team": name}}}})
}

/// The fake API server, and the assigner task with its Kubernetes source on a runtime of
/// their own.
pub(crate) struct Assigner {
    pub(crate) api: FakeApi,
    pub(crate) leading: watch::Sender<bool>,
    /// What the assigner's source has published.
    pub(crate) snapshots: watch::Receiver<Option<nodeplane::snapshot::Snapshot>>,
    _tasks: nodeplane::task::Runtime,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

pub(crate) fn start(api: FakeApi, leading: bool) -> Assigner {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let rt = nodeplane::testing::runtime::multi_thread(1);
    let (tx, rx) = watch::channel(leading);
    let (tasks, snapshots) = rt.block_on(async {
        let mut tasks =
            nodeplane::task::Runtime::new(std::sync::Arc::new(nodeplane::task::LogsOnly));
        let liveness = Liveness::new(Duration::from_secs(30));
        let client = kube_source::client(Some(&kubeconfig), None, liveness)
            .await
            .expect("client");
        let source = kube_source::start(
            client.clone(),
            SourceHealth::default(),
            liveness,
            nodeplane::snapshot::Kind::ALL,
            &mut tasks,
        );
        tokio::spawn(egress_ip::run(
            client,
            rx,
            source.snapshots.clone(),
            "test-node".into(),
            // The fake nodes' addresses exist nowhere: no probes (tests/kernel_dataplane/probe.rs
            // has them).
            egress_ip::probe::Settings {
                misses: 0,
                ..Default::default()
            },
            None,
            // Bare metal: the fake nodes have no providerID.
            egress_ip::cloud_sync::Settings::default(),
            // No election: the test says whether it leads.
            None,
        ));
        (tasks, source.snapshots)
    });
    Assigner {
        api,
        leading: tx,
        snapshots,
        _tasks: tasks,
        _rt: rt,
        _dir: dir,
    }
}

/// Node `w1` (assignable, Ready) and EgressIP `e` for 192.168.50.100.
fn put_w1_and_e(api: &FakeApi) {
    api.put(node("w1", "192.168.50.11", true, true));
    api.put(egress_ip("e", "2024-01-01T00:00:00Z", &["192.168.50.100"]));
}

pub(crate) fn fake_api() -> FakeApi {
    FakeApi::start(TcpListener::bind("127.0.0.1:0").expect("bind fake API server"))
}

/// `status.items` of an EgressIP as `(ip, node)` pairs.
pub(crate) fn items(api: &FakeApi, name: &str) -> Option<Vec<(String, String)>> {
    let obj = api.object("EgressIP", "", name)?;
    let items = obj["status"]["items"].as_array()?.clone();
    Some(
        items
            .iter()
            .map(|i| {
                (
                    i["egressIP"].as_str().unwrap().to_string(),
                    i["node"].as_str().unwrap().to_string(),
                )
            })
            .collect(),
    )
}

#[track_caller]
pub(crate) fn wait_items(api: &FakeApi, name: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    eventually(WAIT, || {
        let got = items(api, name);
        (got.as_ref() == Some(&want))
            .then_some(())
            .ok_or_else(|| format!("EgressIP {name}: status.items {got:?}, want {want:?}"))
    });
}

fn patches(api: &FakeApi, name: &str) -> Vec<Recorded> {
    api.writes()
        .into_iter()
        .filter(|w| w.method == "PATCH" && w.path.contains(&format!("/egressips/{name}")))
        .collect()
}

pub(crate) fn events(api: &FakeApi, name: &str, reason: &str) -> Vec<Value> {
    api.writes()
        .into_iter()
        .filter(|w| w.method == "POST" && w.path.ends_with("/events"))
        .map(|w| w.body)
        .filter(|b| b["regarding"]["name"] == name && b["reason"] == reason)
        .collect()
}

#[test]
fn assigns_by_server_side_apply_and_reports_a_conflict_as_an_event() {
    let api = fake_api();
    api.put(node("w1", "192.168.50.11", true, true));
    api.put(node("w2", "192.168.50.12", true, true));
    // Not assignable, not Ready: never chosen.
    api.put(node("a0", "192.168.50.10", false, true));
    api.put(node("a1", "192.168.50.9", true, false));
    api.put(egress_ip(
        "older",
        "2024-01-01T00:00:00Z",
        &["192.168.50.100", "192.168.50.101"],
    ));
    let a = start(api, true);
    wait_items(
        &a.api,
        "older",
        &[("192.168.50.100", "w1"), ("192.168.50.101", "w2")],
    );
    let w = patches(&a.api, "older").pop().unwrap();
    assert_eq!(w.path, "/apis/k8s.ovn.org/v1/egressips/older/status");
    assert_eq!(w.param("fieldManager").as_deref(), Some(FIELD_MANAGER));
    assert_eq!(w.param("force").as_deref(), Some("true"));
    assert!(
        w.content_type.starts_with("application/apply-patch"),
        "{}",
        w.content_type
    );

    // Created later, asks for an IP the older one has: no item, an Event saying why.
    a.api.put(egress_ip(
        "younger",
        "2024-02-01T00:00:00Z",
        &["192.168.50.100"],
    ));
    wait_items(&a.api, "younger", &[]);
    let ev = eventually(WAIT, || {
        events(&a.api, "younger", "UnsupportedRequest")
            .pop()
            .ok_or("no Event yet".to_string())
    });
    assert_eq!(ev["type"], "Warning");
    assert_eq!(
        ev["note"],
        "spec.egressIPs[0]: 192.168.50.100 is not assigned: EgressIP older, created earlier, asks for the same IP"
    );
    // Steady state: no further writes, no repeated Event.
    std::thread::sleep(Duration::from_millis(1500));
    let writes = a.api.writes().len();
    a.api
        .put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        a.api.writes().len(),
        writes,
        "{:#?}",
        &a.api.writes()[writes..]
    );
    assert_eq!(events(&a.api, "younger", "UnsupportedRequest").len(), 1);
}

#[test]
fn a_node_leaving_moves_its_ip_and_a_node_joining_moves_nothing() {
    let api = fake_api();
    put_w1_and_e(&api);
    let a = start(api, true);
    wait_items(&a.api, "e", &[("192.168.50.100", "w1")]);
    // w0 joins (sorts first, hosts nothing): e stays; f, created once the source has seen
    // w0 (the two kinds are separate watches), goes to w0.
    a.api.put(node("w0", "192.168.50.10", true, true));
    eventually(Duration::from_secs(10), || {
        let seen = a
            .snapshots
            .borrow()
            .as_ref()
            .and_then(|s| s.node("w0"))
            .is_some();
        seen.then_some(())
            .ok_or("w0 not in the assigner's snapshot".to_string())
    });
    a.api
        .put(egress_ip("f", "2024-01-02T00:00:00Z", &["192.168.50.101"]));
    wait_items(&a.api, "f", &[("192.168.50.101", "w0")]);
    assert_eq!(
        items(&a.api, "e").unwrap(),
        [("192.168.50.100".to_string(), "w1".to_string())]
    );
    // w1 goes NotReady: e moves to w2 (w0 already hosts one IP), with a Normal Event.
    a.api.put(node("w2", "192.168.50.12", true, true));
    a.api.put(node("w1", "192.168.50.11", true, false));
    wait_items(&a.api, "e", &[("192.168.50.100", "w2")]);
    let moved = events(&a.api, "e", egress_ip::MOVED);
    assert_eq!(moved.len(), 1, "{moved:#?}");
    assert_eq!(
        moved[0]["note"],
        "192.168.50.100 moved from node w1 to node w2"
    );
    // w2 loses its label: back to the one candidate with the fewest IPs (w0 and w1 Ready
    // again: w1 has none).
    a.api.put(node("w1", "192.168.50.11", true, true));
    a.api.put(node("w2", "192.168.50.12", false, true));
    wait_items(&a.api, "e", &[("192.168.50.100", "w1")]);
    assert_eq!(
        items(&a.api, "f").unwrap(),
        [("192.168.50.101".to_string(), "w0".to_string())]
    );
}

#[test]
fn without_a_status_subresource_status_is_written_with_the_object() {
    let api = fake_api();
    api.without_status_subresource("EgressIP");
    put_w1_and_e(&api);
    let a = start(api, true);
    wait_items(&a.api, "e", &[("192.168.50.100", "w1")]);
    let paths: Vec<String> = patches(&a.api, "e").into_iter().map(|w| w.path).collect();
    assert_eq!(
        paths,
        [
            "/apis/k8s.ovn.org/v1/egressips/e/status",
            "/apis/k8s.ovn.org/v1/egressips/e"
        ]
    );
    // From then on straight to the object.
    a.api
        .put(egress_ip("f", "2024-01-02T00:00:00Z", &["192.168.50.101"]));
    wait_items(&a.api, "f", &[("192.168.50.101", "w1")]);
    let paths: Vec<String> = patches(&a.api, "f").into_iter().map(|w| w.path).collect();
    assert_eq!(paths, ["/apis/k8s.ovn.org/v1/egressips/f"]);
    let w = patches(&a.api, "f").pop().unwrap();
    assert_eq!(w.param("fieldManager").as_deref(), Some(FIELD_MANAGER));
}

#[test]
fn writes_nothing_until_it_leads() {
    let api = fake_api();
    put_w1_and_e(&api);
    let a = start(api, false);
    std::thread::sleep(Duration::from_secs(2));
    assert!(a.api.writes().is_empty(), "{:#?}", a.api.writes());
    a.leading.send_replace(true);
    wait_items(&a.api, "e", &[("192.168.50.100", "w1")]);
    // Leadership lost: a change is not written.
    a.leading.send_replace(false);
    std::thread::sleep(Duration::from_millis(300));
    let writes = a.api.writes().len();
    a.api.put(node("w1", "192.168.50.11", true, false));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(a.api.writes().len(), writes);
}

#[test]
fn the_agent_publishes_its_nodes_host_cidrs() {
    let mut lab = Lab::new();
    let ns = lab.add_node("node");
    ns.run(&[
        "ip", "link", "add", "eth9", "type", "veth", "peer", "name", "eth9p",
    ]);
    ns.run(&["ip", "link", "set", "eth9p", "up"]);
    ns.run(&["ip", "addr", "add", "192.168.77.11/24", "dev", "eth9"]);
    ns.run(&["ip", "addr", "add", "fd77::11/64", "dev", "eth9", "nodad"]);
    ns.run(&["ip", "link", "set", "eth9", "up"]);
    // Down: not published.
    ns.run(&[
        "ip", "link", "add", "eth8", "type", "veth", "peer", "name", "eth8p",
    ]);
    ns.run(&["ip", "addr", "add", "192.168.78.11/24", "dev", "eth8"]);
    let listener = ns
        .enter(|| TcpListener::bind("127.0.0.1:0"))
        .expect("bind fake API server in the node netns");
    let api = FakeApi::start(listener);
    api.put(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.11"}]}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let agent = ns.spawn_agent(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        "worker-1",
        "--admin-address",
        "127.0.0.1:9943",
    ]);
    let want = r#"["192.168.77.11/24","fd77::11/64"]"#;
    eventually(WAIT, || {
        let node = api.object("Node", "", "worker-1").unwrap();
        let got = node["metadata"]["annotations"]["k8s.ovn.org/host-cidrs"].clone();
        (got == want)
            .then_some(())
            .ok_or_else(|| format!("host-cidrs {got}\nagent log:\n{}", agent.logs()))
    });
    let w = api
        .writes()
        .into_iter()
        .find(|w| w.path == "/api/v1/nodes/worker-1")
        .unwrap();
    assert_eq!(w.method, "PATCH");
    assert!(w.content_type.starts_with("application/merge-patch+json"));
    assert_eq!(
        w.body,
        json!({"metadata": {"annotations": {"k8s.ovn.org/host-cidrs": want}}})
    );
    // Removed by someone: published again.
    let mut node = api.object("Node", "", "worker-1").unwrap();
    node["metadata"]["annotations"] = json!({});
    api.put(node);
    eventually(WAIT, || {
        let node = api.object("Node", "", "worker-1").unwrap();
        (node["metadata"]["annotations"]["k8s.ovn.org/host-cidrs"] == want)
            .then_some(())
            .ok_or("not published again".to_string())
    });
    agent.stop_ok();
}
