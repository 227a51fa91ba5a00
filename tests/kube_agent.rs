//! The real agent binary in Kubernetes mode against the in-process fake API server, inside a
//! lab netns (the fake listens on the netns' loopback): nothing is applied before every
//! initial list completes, the kernel follows create/update/delete, a malformed object is
//! reported and skipped, a dead API server leaves the rules alone and a restarted one (also
//! after `410 Gone`) resumes updates.

mod fakeapi;
mod lab;

use std::net::TcpListener;
use std::time::Duration;

use fakeapi::FakeApi;
use lab::{AgentProcess, Lab, Ns, eventually};
use serde_json::{Value, json};

const NODE: &str = "worker-1";
const WAIT: Duration = Duration::from_secs(10);

fn node(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}})
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn pod(ns: &str, name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry/app:1"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

fn firewall(ns: &str, deny: &str) -> Value {
    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": deny}}]}})
}

fn qos(ns: &str, dscp: u8, dst: &str) -> Value {
    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressQoS",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"dscp": dscp, "dstCIDR": dst}]}})
}

struct Setup {
    _lab: Lab,
    node: Ns,
    api: FakeApi,
    _dir: tempfile::TempDir,
    kubeconfig: String,
}

fn setup() -> Setup {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let listener = node
        .enter(|| TcpListener::bind("127.0.0.1:0"))
        .expect("bind fake API server in the node netns");
    let api = FakeApi::start(listener);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path()).to_str().unwrap().to_string();
    Setup {
        _lab: lab,
        node,
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Setup {
    fn spawn(&self) -> AgentProcess {
        self.node.spawn_agent(&[
            "--kubeconfig",
            &self.kubeconfig,
            "--node-name",
            NODE,
            "--log-level",
            "info,nodeplane=debug",
        ])
    }

    fn table(&self) -> Result<String, String> {
        self.node
            .nft(&["list", "table", "inet", "nodeplane"])
            .map_err(|e| e.to_string())
    }

    /// Waits until the table satisfies `pred`; the message names what was expected.
    #[track_caller]
    fn wait_table(&self, agent: &AgentProcess, what: &str, pred: impl Fn(&str) -> bool) {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let t = self.table();
            if t.as_deref().is_ok_and(&pred) {
                return;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "{what}: not reached after {WAIT:?}\ntable: {t:?}\nagent log:\n{}",
                    agent.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn rebind(&self) -> TcpListener {
        let addr = self.api.addr();
        eventually(Duration::from_secs(5), || {
            self.node
                .enter(|| TcpListener::bind(addr))
                .map_err(|e| e.to_string())
        })
    }
}

#[test]
fn first_apply_waits_for_every_initial_list_then_follows_each_kind() {
    let s = setup();
    s.api.put(node(NODE, "192.168.50.11"));
    s.api.put(namespace("shop"));
    s.api.put(pod("shop", "web-1", "10.128.1.5"));
    s.api.put(firewall("shop", "203.0.113.0/24"));
    // One kind's list hangs: the agent must not program the others' partial view.
    s.api.hold_lists("EgressQoS");
    let agent = s.spawn();
    eventually(WAIT, || {
        (s.api.lists("Node") > 0 && s.api.lists("EgressFirewall") > 0)
            .then_some(())
            .ok_or_else(|| "agent has not listed yet".to_string())
    });
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        s.table().is_err(),
        "table programmed before every list completed:\n{:?}\n{}",
        s.table(),
        agent.logs()
    );
    s.api.release_lists("EgressQoS");
    s.wait_table(&agent, "first apply", |t| {
        t.contains("192.168.50.11") && t.contains("203.0.113.0/24") && t.contains("10.128.1.5")
    });

    // Node: create, update, delete.
    s.api.put(node("worker-2", "192.168.50.12"));
    s.wait_table(&agent, "node created", |t| t.contains("192.168.50.12"));
    s.api.put(node("worker-2", "192.168.50.22"));
    s.wait_table(&agent, "node updated", |t| {
        t.contains("192.168.50.22") && !t.contains("192.168.50.12")
    });
    s.api.delete("Node", "", "worker-2");
    s.wait_table(&agent, "node deleted", |t| !t.contains("192.168.50.22"));

    // Pod: create, update (new IP), delete.
    s.api.put(pod("shop", "web-2", "10.128.1.6"));
    s.wait_table(&agent, "pod created", |t| t.contains("10.128.1.6"));
    s.api.put(pod("shop", "web-2", "10.128.1.7"));
    s.wait_table(&agent, "pod updated", |t| {
        t.contains("10.128.1.7") && !t.contains("10.128.1.6")
    });
    s.api.delete("Pod", "shop", "web-2");
    s.wait_table(&agent, "pod deleted", |t| !t.contains("10.128.1.7"));

    // EgressFirewall: update, delete, create.
    s.api.put(firewall("shop", "198.51.100.0/24"));
    s.wait_table(&agent, "firewall updated", |t| {
        t.contains("198.51.100.0/24") && !t.contains("203.0.113.0/24")
    });
    s.api.delete("EgressFirewall", "shop", "default");
    s.wait_table(&agent, "firewall deleted", |t| {
        !t.contains("198.51.100.0/24")
    });
    s.api.put(firewall("shop", "203.0.113.0/24"));
    s.wait_table(&agent, "firewall created", |t| t.contains("203.0.113.0/24"));

    // EgressQoS: create, update, delete.
    s.api.put(qos("shop", 46, "192.0.2.0/24"));
    s.wait_table(&agent, "qos created", |t| {
        t.contains("192.0.2.0/24") && t.contains("dscp set ef")
    });
    s.api.put(qos("shop", 10, "192.0.2.0/24"));
    s.wait_table(&agent, "qos updated", |t| {
        t.contains("dscp set af11") && !t.contains("dscp set ef")
    });
    s.api.delete("EgressQoS", "shop", "default");
    s.wait_table(&agent, "qos deleted", |t| !t.contains("192.0.2.0/24"));

    // Namespace deletion takes its pods' rules with it only when the pods go; here the
    // namespace object itself is watched and removed without disturbing the rest.
    s.api.put(namespace("other"));
    s.api.delete("Namespace", "", "other");

    let (status, logs) = agent.stop();
    assert!(status.success(), "agent exit {status:?}:\n{logs}");
    assert!(logs.contains("every initial list synced"), "{logs}");
}

#[test]
fn malformed_object_is_reported_and_the_rest_applies() {
    let s = setup();
    s.api.put(node(NODE, "192.168.50.11"));
    s.api.put(namespace("shop"));
    s.api.put(namespace("bad"));
    s.api.put(pod("shop", "web-1", "10.128.1.5"));
    s.api.put(pod("bad", "web-1", "10.128.2.5"));
    s.api.put(firewall("shop", "203.0.113.0/24"));
    // Not even decodable (a CRD without schema validation lets this through).
    s.api.put(
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default", "namespace": "bad"},
        "spec": {"egress": "deny everything"}}),
    );
    let agent = s.spawn();
    s.wait_table(&agent, "valid objects applied", |t| {
        t.contains("203.0.113.0/24") && t.contains("192.168.50.11")
    });
    // The watch goes on after the bad object: later changes still arrive.
    s.api.put(firewall("shop", "198.51.100.0/24"));
    s.wait_table(&agent, "update after the bad object", |t| {
        t.contains("198.51.100.0/24")
    });
    // A broken update of a good object keeps its last decodable version in force.
    s.api.put(
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default", "namespace": "shop"},
        "spec": {"egress": [{"type": "Deny", "to": 42}]}}),
    );
    s.api.put(node("worker-2", "192.168.50.12"));
    s.wait_table(&agent, "later node", |t| t.contains("192.168.50.12"));
    assert!(
        s.table().unwrap().contains("198.51.100.0/24"),
        "fell open on a broken update"
    );
    let (_, logs) = agent.stop();
    assert!(
        logs.contains("skipped EgressFirewall bad/default: invalid type"),
        "bad object not reported by name:\n{logs}"
    );
    assert!(
        logs.contains("skipped EgressFirewall shop/default:"),
        "broken update not reported:\n{logs}"
    );
}

#[test]
fn dead_api_server_leaves_rules_and_a_restarted_one_resumes_even_after_410() {
    let s = setup();
    s.api.put(node(NODE, "192.168.50.11"));
    s.api.put(namespace("shop"));
    s.api.put(pod("shop", "web-1", "10.128.1.5"));
    s.api.put(firewall("shop", "203.0.113.0/24"));
    let agent = s.spawn();
    s.wait_table(&agent, "first apply", |t| t.contains("203.0.113.0/24"));
    let before = s.table().unwrap();

    s.api.stop();
    // Changes made while the server is unreachable from the agent are invisible to it.
    s.api.put(firewall("shop", "198.51.100.0/24"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s.table().unwrap(),
        before,
        "kernel state changed while the API was gone"
    );

    // Back up: the watch resumes from its resourceVersion and sees what it missed.
    s.api.restart(s.rebind());
    s.wait_table(&agent, "resumed", |t| t.contains("198.51.100.0/24"));

    // History compacted while the watch is down: resuming gets 410 Gone, the agent relists
    // (and notices the deletion it missed).
    s.api.stop();
    s.api.delete("EgressFirewall", "shop", "default");
    s.api.put(node("worker-2", "192.168.50.12"));
    s.api.compact();
    let lists_before = s.api.lists("EgressFirewall");
    s.api.restart(s.rebind());
    s.wait_table(&agent, "relisted after 410", |t| {
        t.contains("192.168.50.12") && !t.contains("198.51.100.0/24")
    });
    assert!(
        s.api.lists("EgressFirewall") > lists_before,
        "no relist after 410 Gone"
    );
    let (status, logs) = agent.stop();
    assert!(status.success(), "agent exit {status:?}:\n{logs}");
}
