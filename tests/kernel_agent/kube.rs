//! The real agent binary in Kubernetes mode against the in-process fake API server, inside a
//! lab netns (the fake listens on the netns' loopback): nothing is applied before every
//! initial list completes, the kernel follows create/update/delete, a malformed object is
//! reported and skipped, a dead API server leaves the rules alone and a restarted one (also
//! after `410 Gone`) resumes updates, and a silently stalled API connection (open, no data) is
//! noticed: `/readyz` says so and changes arrive again over new connections.

use nodeplane::testing::lab;
use nodeplane::testing::listing;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use nodeplane::testing::fakeapi::{self, FakeApi};
use nodeplane::testing::lab::{AgentProcess, Lab, Ns, eventually};
use serde_json::{Value, json};

const NODE: &str = "worker-1";
const WAIT: Duration = Duration::from_secs(10);
const ADMIN: &str = "127.0.0.1:9942";

/// GET on the agent's admin server from inside the node netns: (status code, body).
fn admin_get(ns: &Ns, path: &str) -> Result<(u16, String), String> {
    ns.http_get(ADMIN.parse().unwrap(), path, Duration::from_secs(5))
}

/// A table listing in a canonical order (after incremental updates the kernel lists objects
/// in creation order, a fresh load in file order).
fn sorted(listing: Value) -> Vec<String> {
    let mut items: Vec<String> = listing["nftables"]
        .as_array()
        .expect("nftables array")
        .iter()
        .map(|v| v.to_string())
        .collect();
    items.sort();
    items
}

/// Waits until GET `path` answers `code` with a body containing `needle`.
#[track_caller]
fn wait_admin(ns: &Ns, path: &str, code: u16, needle: &str) -> String {
    ns.wait_http(ADMIN.parse().unwrap(), path, code, needle, WAIT)
}

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

fn network_policy(ns: &str, from: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "from-block", "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": from}}], "ports": [{"port": "http"}]}]}})
}

struct Setup {
    lab: Lab,
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
        lab,
        node,
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Setup {
    /// This node, namespace `shop` with pod `web-1` and a firewall denying 203.0.113.0/24:
    /// the objects most tests start from.
    fn put_shop(&self) {
        self.api.put(node(NODE, "192.168.50.11"));
        self.api.put(namespace("shop"));
        self.api.put(pod("shop", "web-1", "10.128.1.5"));
        self.api.put(firewall("shop", "203.0.113.0/24"));
    }

    fn spawn(&self) -> AgentProcess {
        self.spawn_with(&[])
    }

    fn spawn_with(&self, extra: &[&str]) -> AgentProcess {
        let mut args = vec![
            "--kubeconfig",
            &self.kubeconfig,
            "--node-name",
            NODE,
            "--log-level",
            "info,nodeplane=debug",
            "--admin-address",
            ADMIN,
        ];
        args.extend_from_slice(extra);
        self.node.spawn_agent(&args)
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
    let mut s = setup();
    let agent = first_apply_after_every_list(&s);
    follows_nodes_and_pods(&s, &agent);
    follows_policies(&s, &agent);
    follows_services(&s, &agent);
    follows_egress_ips(&mut s, &agent);
    objects_gauge_follows_every_kind(&s);
    ready_with_metrics_and_the_ruleset_the_kernel_holds(&mut s);
    let logs = agent.stop_ok();
    assert!(logs.contains("every initial list synced"), "{logs}");
}

/// Starts the agent while one kind's list hangs: nothing is programmed, `/readyz` says why,
/// and the first apply follows the last list.
fn first_apply_after_every_list(s: &Setup) -> AgentProcess {
    s.put_shop();
    // One kind's list hangs: the agent must not program the others' partial view.
    s.api.hold_lists("EgressQoS");
    // The test writes EgressIP `status.items` itself, as an outside assigner (OVN-Kubernetes'
    // cluster manager) would: this agent must not be the assigner too.
    let agent = s.spawn_with(&["--egress-ip-assigner=false"]);
    eventually(WAIT, || {
        (s.api.lists("Node") > 0 && s.api.lists("EgressFirewall") > 0)
            .then_some(())
            .ok_or_else(|| "agent has not listed yet".to_string())
    });
    // Alive but not ready, and saying why.
    wait_admin(
        &s.node,
        "/readyz",
        503,
        "waiting for the first list of EgressQoS",
    );
    wait_admin(&s.node, "/healthz", 200, "ok");
    std::thread::sleep(Duration::from_millis(500));
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

    agent
}

fn follows_nodes_and_pods(s: &Setup, agent: &AgentProcess) {
    // Node: create, update, delete.
    let node_at = |ip: &str| node("worker-2", ip);
    let worker_2 = ("Node", "", "worker-2");
    follows_an_address_change(
        s,
        agent,
        "node",
        node_at,
        worker_2,
        ["192.168.50.12", "192.168.50.22"],
    );

    // Pod: create, update (new IP), delete.
    let pod_at = |ip: &str| pod("shop", "web-2", ip);
    let web_2 = ("Pod", "shop", "web-2");
    follows_an_address_change(s, agent, "pod", pod_at, web_2, ["10.128.1.6", "10.128.1.7"]);
}

/// Creates the object `at(first)`, updates it to `at(then)` and deletes it (`kind`,
/// namespace, name), each time waiting for the table to hold its address and not the old one.
fn follows_an_address_change(
    s: &Setup,
    agent: &AgentProcess,
    what: &str,
    at: impl Fn(&str) -> Value,
    object: (&str, &str, &str),
    [first, then]: [&str; 2],
) {
    s.api.put(at(first));
    s.wait_table(agent, &format!("{what} created"), |t| t.contains(first));
    updated_then_deleted(s, agent, what, at(then), [first, then], object, then);
}

/// Puts `updated` (the table then holds `now` and not `before`), then deletes that object
/// (`kind`, namespace, name: the table then lacks `gone`). `what` names it in the waits.
fn updated_then_deleted(
    s: &Setup,
    agent: &AgentProcess,
    what: &str,
    updated: Value,
    [before, now]: [&str; 2],
    (kind, ns, name): (&str, &str, &str),
    gone: &str,
) {
    s.api.put(updated);
    s.wait_table(agent, &format!("{what} updated"), |t| {
        t.contains(now) && !t.contains(before)
    });
    s.api.delete(kind, ns, name);
    s.wait_table(agent, &format!("{what} deleted"), |t| !t.contains(gone));
}

/// EgressFirewall, EgressQoS and NetworkPolicy, and a Namespace that comes and goes.
fn follows_policies(s: &Setup, agent: &AgentProcess) {
    // EgressFirewall: update, delete, create.
    let (before, now) = ("203.0.113.0/24", "198.51.100.0/24");
    let shop_firewall = ("EgressFirewall", "shop", "default");
    updated_then_deleted(
        s,
        agent,
        "firewall",
        firewall("shop", now),
        [before, now],
        shop_firewall,
        now,
    );
    s.api.put(firewall("shop", "203.0.113.0/24"));
    s.wait_table(agent, "firewall created", |t| t.contains("203.0.113.0/24"));

    // EgressQoS: create, update, delete.
    s.api.put(qos("shop", 46, "192.0.2.0/24"));
    s.wait_table(agent, "qos created", |t| {
        t.contains("192.0.2.0/24") && t.contains("dscp set ef")
    });
    let af11 = qos("shop", 10, "192.0.2.0/24");
    let marks = ["dscp set ef", "dscp set af11"];
    let shop_qos = ("EgressQoS", "shop", "default");
    updated_then_deleted(s, agent, "qos", af11, marks, shop_qos, "192.0.2.0/24");

    // NetworkPolicy: create, update, delete; the pod's named port survives pruning.
    let mut named = pod("shop", "web-1", "10.128.1.5");
    named["spec"]["containers"][0]["ports"] = json!([{"name": "http", "containerPort": 8080}]);
    s.api.put(named);
    s.api.put(network_policy("shop", "198.18.0.0/15"));
    s.wait_table(agent, "network policy created", |t| {
        t.contains("198.18.0.0/15") && t.contains("10.128.1.5 . tcp . 8080")
    });
    let (before, now) = ("198.18.0.0/15", "198.51.100.0/24");
    let from_block = ("NetworkPolicy", "shop", "from-block");
    let updated = network_policy("shop", now);
    updated_then_deleted(
        s,
        agent,
        "network policy",
        updated,
        [before, now],
        from_block,
        "np-ingress",
    );

    // Namespace deletion takes its pods' rules with it only when the pods go; here the
    // namespace object itself is watched and removed without disturbing the rest.
    s.api.put(namespace("other"));
    s.api.delete("Namespace", "", "other");
}

/// `shop/web`: ClusterIP 172.30.0.10, port 80 to 8080.
fn web_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "172.30.0.10", "clusterIPs": ["172.30.0.10"],
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

fn follows_services(s: &Setup, agent: &AgentProcess) {
    // Service with EndpointSlice: create, update, delete reach the kernel.
    let service = web_service();
    let slice = |ip: &str| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-a", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            "ports": [{"port": 8080, "protocol": "TCP"}]})
    };
    s.api.put(service);
    s.api.put(slice("10.128.1.5"));
    s.wait_table(agent, "service created", |t| {
        t.contains("172.30.0.10") && t.contains("10.128.1.5 . 8080")
    });
    s.api.put(slice("10.128.1.9"));
    s.wait_table(agent, "endpoint slice updated", |t| {
        t.contains("10.128.1.9 . 8080") && !t.contains("10.128.1.5 . 8080")
    });
    // Endpoints are used for a service without slices.
    s.api.delete("EndpointSlice", "shop", "web-a");
    s.api.put(json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "shop"},
        "subsets": [{"addresses": [{"ip": "10.128.1.8"}],
            "ports": [{"port": 8080, "protocol": "TCP"}]}]}));
    s.wait_table(agent, "endpoints used without slices", |t| {
        t.contains("10.128.1.8 . 8080") && !t.contains("10.128.1.9 . 8080")
    });
    s.api.delete("Endpoints", "shop", "web");
    s.api.delete("Service", "shop", "web");
    s.wait_table(agent, "service deleted", |t| !t.contains("172.30.0.10"));
}

fn follows_egress_ips(s: &mut Setup, agent: &AgentProcess) {
    // EgressIP hosted on this node: the address lands on the interface whose subnet holds
    // it, and the selected pod is SNATed to it; moving and deleting follow.
    let upstream = s.lab.add_host("upstream");
    let uplink = s.lab.link(
        &s.node,
        &["192.168.50.11/24"],
        &upstream,
        &["192.168.50.1/24"],
    );
    let egress_ip = |ip: &str| {
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
            "metadata": {"name": "eip-shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"egressIPs": [ip],
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app": "web"}}},
            "status": {"items": [{"node": NODE, "egressIP": ip}]}})
    };
    let addresses = || {
        s.node
            .exec(&["ip", "-4", "addr", "show", "dev", &uplink.a_iface])
            .unwrap()
    };
    s.api.put(egress_ip("192.168.50.100"));
    s.wait_table(agent, "egress IP created", |t| {
        t.contains("10.128.1.5 : 192.168.50.100")
    });
    // The address follows the rules: the node first makes sure nobody else answers for it.
    eventually(WAIT, || {
        let a = addresses();
        a.contains("192.168.50.100/32").then_some(()).ok_or(a)
    });
    s.api.put(egress_ip("192.168.50.101"));
    s.wait_table(agent, "egress IP updated", |t| {
        t.contains("10.128.1.5 : 192.168.50.101") && !t.contains("192.168.50.100")
    });
    eventually(WAIT, || {
        let a = addresses();
        (a.contains("192.168.50.101/32") && !a.contains("192.168.50.100"))
            .then_some(())
            .ok_or(a)
    });
    s.api.delete("EgressIP", "", "eip-shop");
    s.wait_table(agent, "egress IP deleted", |t| {
        !t.contains("192.168.50.101")
    });
    eventually(WAIT, || {
        let a = addresses();
        (!a.contains("192.168.50.101")).then_some(()).ok_or(a)
    });
}

fn objects_gauge_follows_every_kind(s: &Setup) {
    // Every kind flows through the watch: the objects gauge follows them.
    let others = [
        web_service(),
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "shop"}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-a", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": []}),
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP", "metadata": {"name": "eip"},
            "spec": {"egressIPs": ["192.168.50.100"], "namespaceSelector": {}}}),
        json!({"apiVersion": "cloud.network.openshift.io/v1", "kind": "CloudPrivateIPConfig",
            "metadata": {"name": "192.168.50.100"}, "spec": {"node": NODE}}),
    ];
    for obj in &others {
        s.api.put(obj.clone());
    }
    let objects_gauge_reads = |count: usize| {
        for obj in &others {
            let kind = obj["kind"].as_str().unwrap();
            let line = format!("nodeplane_objects{{kind=\"{kind}\"}} {count}");
            wait_admin(&s.node, "/metrics", 200, &line);
        }
    };
    objects_gauge_reads(1);
    // A Service owned by another proxy is not ours (label selector, as kube-proxy).
    s.api.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "other", "namespace": "shop",
            "labels": {"service.kubernetes.io/service-proxy-name": "someone-else"}},
        "spec": {"clusterIP": "172.30.0.11"}}));
    for obj in &others {
        let m = &obj["metadata"];
        s.api.delete(
            obj["kind"].as_str().unwrap(),
            m["namespace"].as_str().unwrap_or(""),
            m["name"].as_str().unwrap(),
        );
    }
    objects_gauge_reads(0);
}

fn ready_with_metrics_and_the_ruleset_the_kernel_holds(s: &mut Setup) {
    // Ready; the metrics cover syncs; /ruleset is what the kernel holds.
    wait_admin(&s.node, "/readyz", 200, "ready");
    let metrics = wait_admin(&s.node, "/metrics", 200, "nodeplane_objects");
    for needle in [
        "nodeplane_sync_duration_seconds_count",
        "nodeplane_transaction_operations_bucket",
        "nodeplane_ruleset_rules{feature=\"fw\"}",
        "nodeplane_ruleset_set_elements{feature=\"node\"} 1",
        "nodeplane_last_successful_sync_timestamp_seconds",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    let (code, ruleset) = admin_get(&s.node, "/ruleset").unwrap();
    assert_eq!(code, 200);
    assert!(
        ruleset.starts_with("# nodeplane ruleset for node worker-1"),
        "{ruleset}"
    );
    let reference = s.lab.add_reference(&ruleset);
    assert_eq!(
        sorted(listing::json(&s.node, "nodeplane")),
        sorted(listing::json(&reference, "nodeplane"))
    );
}

#[test]
fn the_agent_leads_the_egress_ip_assigner_and_releases_it_on_sigterm() {
    let s = setup();
    s.api.put(node(NODE, "192.168.50.11"));
    let agent = s.spawn();
    wait_admin(&s.node, "/readyz", 200, "egress-ip-assigner: leader\n");
    wait_admin(
        &s.node,
        "/metrics",
        200,
        "nodeplane_leader{role=\"egress-ip-assigner\"} 1\n",
    );
    let lease = |field: &str| {
        let l = s
            .api
            .object("Lease", "nodeplane", "nodeplane-egress-assigner");
        l.expect("the Lease")["spec"][field].clone()
    };
    assert_eq!(lease("holderIdentity"), NODE);
    assert_eq!(lease("leaseDurationSeconds"), 4);
    let logs = agent.stop_ok();
    assert!(
        logs.contains("egress-ip-assigner: this node leads"),
        "{logs}"
    );
    // Besides run mode's own: a watch per kind, the store, the API probe, the status writer,
    // the host-cidrs publisher, fence, election, leadership report and assigner.
    lab::assert_every_task_stopped(&logs, 20);
    // Released: the next candidate need not wait for the lease to expire.
    assert_eq!(lease("holderIdentity"), Value::Null, "{logs}");
    assert_eq!(lease("leaseDurationSeconds"), 1);
}

#[test]
fn malformed_object_is_reported_and_the_rest_applies() {
    let mut s = setup();
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
    // --dry-run lists the same API once and prints what the agent applied.
    let printed = s
        .node
        .run_agent(&[
            "--dry-run",
            "--kubeconfig",
            &s.kubeconfig,
            "--node-name",
            NODE,
        ])
        .expect("--dry-run against the API");
    let reference = s.lab.add_reference(&printed);
    assert_eq!(
        sorted(listing::json(&s.node, "nodeplane")),
        sorted(listing::json(&reference, "nodeplane")),
        "--dry-run differs from the running agent's table:\n{printed}"
    );
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

/// Beside kube-proxy and a CNI that enforces NetworkPolicy, on a cluster whose EgressIPs
/// another controller serves: with only the firewall and QoS on, the agent never asks for the
/// other features' kinds, writes nothing to the API (no host-cidrs annotation, no Lease),
/// opens no kube-proxy health port and programs no chain of theirs.
#[test]
fn features_switched_off_have_no_watches_writes_listeners_or_chains() {
    let s = setup();
    s.put_shop();
    s.api.put(network_policy("shop", "10.0.0.0/8"));
    let health = "127.0.0.1:10256";
    let agent = s.spawn_with(&[
        "--features",
        "egress-firewall,egress-qos",
        "--healthz-bind-address",
        health,
    ]);
    s.wait_table(&agent, "the firewall applied", |t| {
        t.contains("203.0.113.0/24")
    });
    for kind in [
        "Service",
        "EndpointSlice",
        "Endpoints",
        "NetworkPolicy",
        "EgressIP",
    ] {
        assert_eq!(s.api.lists(kind), 0, "{kind} was listed:\n{}", agent.logs());
    }
    assert!(s.api.lists("CloudPrivateIPConfig") == 0 && s.api.lists("EgressQoS") > 0);
    let writes: Vec<String> = s
        .api
        .writes()
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .filter(|w| w.contains("/nodes/") || w.contains("/leases"))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "{}", agent.logs());
    let refused = s.node.enter(|| TcpStream::connect(health).err());
    assert!(refused.is_some(), "{health} is served with services off");
    let table = s.table().unwrap();
    for prefix in ["chain svc-", "chain np-", "map eip-", "map svc-"] {
        assert!(
            !table.contains(prefix),
            "{prefix} with its feature off:\n{table}"
        );
    }
    agent.stop();
}

/// A node of a cluster without kube-proxy, after a reboot: the kubeconfig (as the in-cluster
/// environment would) names the `kubernetes` ClusterIP, which nothing translates yet. With
/// `--api-server` at the server's real address the agent lists, applies and follows changes.
#[test]
fn api_server_flag_reaches_the_api_when_the_kubernetes_cluster_ip_is_unroutable() {
    let s = setup();
    s.put_shop();
    let cluster_ip = format!("{}-clusterip", s.kubeconfig);
    let text = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let real = format!("http://{}", s.api.addr());
    std::fs::write(&cluster_ip, text.replace(&real, "https://172.30.0.1:443")).unwrap();
    let mut args = vec!["--kubeconfig", &cluster_ip, "--node-name", NODE];
    args.extend(["--api-server", &real, "--admin-address", ADMIN]);
    let agent = s.node.spawn_agent(&args);
    s.wait_table(&agent, "applied from the real address", |t| {
        t.contains("203.0.113.0/24")
    });
    s.api.put(firewall("shop", "198.51.100.0/24"));
    s.wait_table(&agent, "a change over the real address", |t| {
        t.contains("198.51.100.0/24")
    });
    agent.stop();
}

#[test]
fn dead_api_server_leaves_rules_and_a_restarted_one_resumes_even_after_410() {
    let s = setup();
    s.put_shop();
    let agent = s.spawn();
    s.wait_table(&agent, "first apply", |t| t.contains("203.0.113.0/24"));
    let before = s.table().unwrap();

    wait_admin(&s.node, "/readyz", 200, "ready");

    s.api.stop();
    // Changes made while the server is unreachable from the agent are invisible to it.
    s.api.put(firewall("shop", "198.51.100.0/24"));
    wait_admin(&s.node, "/readyz", 503, "API server unreachable");
    wait_admin(&s.node, "/healthz", 200, "ok");
    assert_eq!(
        s.table().unwrap(),
        before,
        "kernel state changed while the API was gone"
    );

    // Back up: the watch resumes from its resourceVersion and sees what it missed.
    s.api.restart(s.rebind());
    s.wait_table(&agent, "resumed", |t| t.contains("198.51.100.0/24"));
    wait_admin(&s.node, "/readyz", 200, "ready");

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
    agent.stop_ok();
}

fn status_patches(api: &FakeApi, path_end: &str) -> Vec<fakeapi::Recorded> {
    api.writes()
        .into_iter()
        .filter(|w| w.method == "PATCH" && w.path.ends_with(path_end))
        .collect()
}

/// The last status patch at `path_end`, once there is one.
fn last_status_patch(api: &FakeApi, path_end: &str) -> fakeapi::Recorded {
    eventually(WAIT, || {
        status_patches(api, path_end)
            .pop()
            .ok_or_else(|| format!("no patch of {path_end} yet"))
    })
}

fn events_about(api: &FakeApi, kind: &str, ns: &str, reason: &str) -> Vec<Value> {
    api.writes()
        .into_iter()
        .filter(|w| w.method == "POST" && w.path.ends_with("/events"))
        .map(|w| w.body)
        .filter(|b| {
            b["regarding"]["kind"] == kind
                && b["regarding"]["namespace"] == ns
                && b["reason"] == reason
        })
        .collect()
}

#[test]
fn status_is_server_side_applied_per_node_and_rejections_become_events() {
    let s = setup();
    let agent = spawn_with_objects_to_report_on(&s);
    shop_firewall_status_is_applied_by_this_node(&s, &agent);
    status_is_merged_with_another_nodes_entry(&s);
    an_invalid_object_has_its_reason_as_status_condition_and_event(&s);
    steady_state_writes_no_status_or_event_again(&s, &agent);
    agent.stop();
}

/// The status subresource of `shop`'s EgressQoS.
const QOS_STATUS_PATH: &str = "/apis/k8s.ovn.org/v1/namespaces/shop/egressqoses/default/status";

/// A valid firewall in `shop`, one in `team` another node reported a failure for, an invalid
/// EgressQoS in `shop` and an undecodable firewall in `bad`; then the agent.
fn spawn_with_objects_to_report_on(s: &Setup) -> AgentProcess {
    s.api.put(node(NODE, "192.168.50.11"));
    for ns in ["shop", "team", "bad"] {
        s.api.put(namespace(ns));
    }
    s.api.put(pod("shop", "web-1", "10.128.1.5"));
    s.api.put(firewall("shop", "203.0.113.0/24"));
    // Another node's agent already reported a failure for this one.
    let mut team = firewall("team", "198.51.100.0/24");
    team["status"] = json!({"status": "EgressFirewall Rules not correctly applied: boom",
        "messages": ["worker-2: EgressFirewall Rules not correctly applied: boom"]});
    s.api.put(team);
    s.api.put(qos("shop", 99, "192.0.2.0/24"));
    s.api.put(
        json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default", "namespace": "bad"}, "spec": {"egress": 7}}),
    );
    s.spawn()
}

fn shop_firewall_status_is_applied_by_this_node(s: &Setup, agent: &AgentProcess) {
    let shop_path = "/apis/k8s.ovn.org/v1/namespaces/shop/egressfirewalls/default/status";
    let shop = eventually(WAIT, || {
        status_patches(&s.api, shop_path)
            .pop()
            .ok_or_else(|| format!("no status patch yet:\n{}", agent.logs()))
    });
    assert_eq!(shop.content_type, "application/apply-patch+yaml");
    assert_eq!(
        shop.param("fieldManager").as_deref(),
        Some("nodeplane-worker-1")
    );
    assert_eq!(shop.param("force").as_deref(), Some("true"));
    assert_eq!(
        shop.body["status"],
        json!({"status": "EgressFirewall Rules applied",
            "messages": ["worker-1: EgressFirewall Rules applied"]})
    );
}

fn status_is_merged_with_another_nodes_entry(s: &Setup) {
    // Merged with the other node's entry; the aggregate keeps its failure.
    let team_path = "/apis/k8s.ovn.org/v1/namespaces/team/egressfirewalls/default/status";
    let team = last_status_patch(&s.api, team_path);
    // `status.status` is OVN-Kubernetes' own text, without a reason (the entries carry it).
    assert_eq!(
        team.body["status"]["status"],
        "EgressFirewall Rules not correctly applied"
    );
    let stored = s.api.object("EgressFirewall", "team", "default").unwrap();
    assert_eq!(
        stored["status"]["messages"],
        json!([
            "worker-2: EgressFirewall Rules not correctly applied: boom",
            "worker-1: EgressFirewall Rules applied"
        ])
    );
}

/// An invalid EgressQoS: status says why, and an Event says so on the object; an
/// undecodable object gets an Event naming the problem.
fn an_invalid_object_has_its_reason_as_status_condition_and_event(s: &Setup) {
    // An invalid EgressQoS: status says why, and an Event says so on the object.
    let qos_patch = last_status_patch(&s.api, QOS_STATUS_PATH);
    assert_eq!(
        qos_patch.body["status"]["status"],
        "EgressQoS Rules not correctly applied"
    );
    let entry = qos_patch.body["status"]["messages"][0].as_str().unwrap();
    let qos_status = entry
        .strip_prefix("worker-1: ")
        .unwrap_or(entry)
        .to_string();
    assert!(
        qos_status.starts_with("EgressQoS Rules not correctly applied: spec.egress[0].dscp"),
        "{qos_status}"
    );
    // OVN-Kubernetes' zone condition beside it, the same verdict as message.
    let condition = &qos_patch.body["status"]["conditions"][0];
    assert_eq!(
        condition["type"], "Ready-In-Zone-worker-1",
        "{}",
        qos_patch.body
    );
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "SetupFailed");
    assert_eq!(condition["message"], qos_status.as_str());
    assert!(
        condition["lastTransitionTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let event = eventually(WAIT, || {
        events_about(&s.api, "EgressQoS", "shop", "RulesNotApplied")
            .pop()
            .ok_or("no event".to_string())
    });
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["note"], qos_status.as_str());
    // The undecodable object gets an Event naming the problem.
    let malformed = eventually(WAIT, || {
        events_about(&s.api, "EgressFirewall", "bad", "Malformed")
            .pop()
            .ok_or("no Malformed event".to_string())
    });
    assert!(
        malformed["note"].as_str().unwrap().contains("invalid type"),
        "{malformed}"
    );
}

/// A change elsewhere re-plans but writes no status again; the fixed object turns to
/// applied.
fn steady_state_writes_no_status_or_event_again(s: &Setup, agent: &AgentProcess) {
    // Steady state: a change elsewhere re-plans but writes no status again.
    s.wait_table(agent, "applied", |t| t.contains("203.0.113.0/24"));
    std::thread::sleep(Duration::from_millis(500));
    // (The agent's own Node gets its host-cidrs annotation once, whenever: not counted.)
    let patches = |api: &FakeApi| {
        api.writes()
            .iter()
            .filter(|w| w.method == "PATCH" && !w.path.starts_with("/api/v1/nodes/"))
            .count()
    };
    let events = |api: &FakeApi| {
        let writes = api.writes();
        let events = writes.iter().filter(|w| w.path.ends_with("/events"));
        events.filter(|w| w.method == "POST").count()
    };
    let (p0, e0) = (patches(&s.api), events(&s.api));
    s.api.put(node("worker-2", "192.168.50.12"));
    s.wait_table(agent, "node added", |t| t.contains("192.168.50.12"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(patches(&s.api), p0, "status rewritten without a change");
    assert_eq!(events(&s.api), e0, "event repeated without a new reason");
    // The fixed object turns to applied.
    s.api.put(qos("shop", 46, "192.0.2.0/24"));
    eventually(WAIT, || {
        let last = status_patches(&s.api, QOS_STATUS_PATH).pop().unwrap();
        let condition = &last.body["status"]["conditions"][0];
        (last.body["status"]["status"] == "EgressQoS Rules applied"
            && condition["status"] == "True"
            && condition["reason"] == "SetupSucceeded")
            .then_some(())
            .ok_or(format!("{}", last.body))
    });
}

/// Server-side watch timeout for the stall test: dead watches are dropped after 5 + 5 s
/// instead of the default 25 + 5 s, to keep the test short.
const STALL_WATCH_TIMEOUT: &str = "5";
/// How long the agent may take to notice a stalled connection with that setting and get a
/// change through a new one: the idle deadline (10 s), a re-watch, a debounce and a sync, with
/// slack for a loaded machine.
const STALL_DETECT: Duration = Duration::from_secs(20);

/// Waits up to `within` for the table to satisfy `pred`; returns how long it took.
#[track_caller]
fn time_table(
    s: &Setup,
    agent: &AgentProcess,
    within: Duration,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let t = s.table();
        if t.as_deref().is_ok_and(&pred) {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!(
                "{what}: not reached after {within:?}\ntable: {t:?}\nagent log:\n{}",
                agent.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn silently_stalled_api_connections_are_noticed_and_changes_flow_again() {
    let s = setup();
    s.put_shop();
    let agent = s.spawn_with(&["--api-watch-timeout-seconds", STALL_WATCH_TIMEOUT]);
    s.wait_table(&agent, "first apply", |t| t.contains("203.0.113.0/24"));
    wait_admin(&s.node, "/readyz", 200, "ready");

    // Every connection goes silent, new ones too (no RST, no FIN: the agent only sees that
    // nothing arrives). A change made now cannot reach the agent.
    s.api.stall_open();
    s.api.stall_new(true);
    let before = s.table().unwrap();
    s.api.put(firewall("shop", "198.51.100.0/24"));
    // Not ready, naming the kinds without fresh data and the unanswered probe.
    eventually(STALL_DETECT, || match admin_get(&s.node, "/readyz") {
        Ok((503, body))
            if body.contains("no data from the API server for")
                && body.contains("EgressFirewall") =>
        {
            Ok(body)
        }
        other => Err(format!(
            "want 503 naming the stalled watches, got {other:?}"
        )),
    });
    wait_admin(&s.node, "/readyz", 503, "/version");
    wait_admin(&s.node, "/healthz", 200, "ok");
    assert_eq!(s.table().unwrap(), before, "kernel changed without data");

    // New connections work again (the stalled ones stay dead): the change arrives and
    // readiness comes back.
    s.api.stall_new(false);
    let took = time_table(&s, &agent, STALL_DETECT, "change after the stall", |t| {
        t.contains("198.51.100.0/24")
    });
    eprintln!("change reached the kernel {took:?} after new connections were served again");
    wait_admin(&s.node, "/readyz", 200, "ready");

    // Only the open connections stall (a middlebox lost their state); new ones are fine. The
    // change still arrives within the idle deadline, without any error from the server.
    s.api.stall_open();
    let lists = s.api.lists("EgressFirewall");
    s.api.put(firewall("shop", "192.0.2.0/24"));
    let took = time_table(
        &s,
        &agent,
        STALL_DETECT,
        "change after open connections stalled",
        |t| t.contains("192.0.2.0/24"),
    );
    eprintln!("change reached the kernel {took:?} after the open connections stalled");
    wait_admin(&s.node, "/readyz", 200, "ready");
    // Resumed from the last resourceVersion: no relist.
    assert_eq!(
        s.api.lists("EgressFirewall"),
        lists,
        "relisted after a stall"
    );

    let logs = agent.stop_ok();
    assert!(logs.contains("no data for"), "stall not logged:\n{logs}");
}

/// deploy/'s split: the node agent (`--egress-ip-assigner-candidate=false`) writes no Lease,
/// no EgressIP and no CloudPrivateIPConfig; `agent assigner`, a process of its own (its own
/// identity in deploy/), is elected and places the egress IP.
#[test]
fn agent_assigner_places_egress_ips_and_the_node_agent_writes_none() {
    let mut s = setup();
    // The node agent publishes its egress-capable subnet (k8s.ovn.org/host-cidrs).
    let upstream = s.lab.add_host("upstream");
    s.lab.link(
        &s.node,
        &["192.168.50.11/24"],
        &upstream,
        &["192.168.50.1/24"],
    );
    let mut n = node(NODE, "192.168.50.11");
    n["metadata"]["labels"]["k8s.ovn.org/egress-assignable"] = json!("");
    n["status"]["conditions"] = json!([{"type": "Ready", "status": "True",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]);
    s.api.put(n);
    s.api
        .put(json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
        "metadata": {"name": "eip-shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"egressIPs": ["192.168.50.100"], "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app": "web"}}}}));
    let agent = s.spawn_with(&["--egress-ip-assigner-candidate=false"]);
    wait_admin(&s.node, "/readyz", 200, "ready\n");
    let moves = |w: &fakeapi::Recorded| {
        ["/leases", "/egressips", "/cloudprivateipconfigs"]
            .iter()
            .any(|p| w.path.contains(p))
    };
    let by_node_agent: Vec<_> = s.api.writes().into_iter().filter(moves).collect();
    assert!(by_node_agent.is_empty(), "{by_node_agent:#?}");
    let assigner = s.node.spawn_agent(&[
        "assigner",
        "--kubeconfig",
        &s.kubeconfig,
        "--node-name",
        "assigner-a",
        "--admin-address",
        "127.0.0.1:9943",
        "--metrics-bind-address=",
        "--egress-ip-probe-misses",
        "0",
    ]);
    eventually(WAIT, || {
        let eip = s.api.object("EgressIP", "", "eip-shop");
        let items = eip
            .map(|e| e["status"]["items"].clone())
            .unwrap_or_default();
        (items == json!([{"egressIP": "192.168.50.100", "node": NODE}]))
            .then_some(())
            .ok_or(format!("{items}"))
    });
    let lease = s
        .api
        .object("Lease", "nodeplane", "nodeplane-egress-assigner");
    assert_eq!(
        lease.expect("the Lease")["spec"]["holderIdentity"],
        "assigner-a"
    );
    let (status, logs) = assigner.stop();
    assert!(status.success(), "assigner exit {status:?}:\n{logs}");
    lab::assert_every_task_stopped(&logs, 6);
    let logs = agent.stop_ok();
    assert!(
        !logs.contains("egress-ip-assigner: this node leads"),
        "{logs}"
    );
}
