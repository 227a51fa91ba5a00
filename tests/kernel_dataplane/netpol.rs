//! NetworkPolicy against the kernel with real packets, in the style of the upstream e2e
//! suite: every client probes every server on the port a case names and the result is
//! compared with the expected truth table (`testing::lab::assert_truth` prints both and the
//! differing cells).
//!
//! Two routed nodes (pods behind /32 and /128 routes, as the lab builds them) on a
//! point-to-point link, one agent per node fed the same manifests. Namespaces `x` (ns=x) and
//! `y` (ns=y); pods labelled pod=<name>:
//!
//! | pod | node | IPv4 | IPv6 | named port `web` |
//! |---|---|---|---|---|
//! | x/a | node-1 | 10.128.0.10 | fd01::10 | TCP 80 |
//! | x/b | node-1 | 10.128.0.11 | fd01::11 | TCP 81 |
//! | x/c | node-2 | 10.128.1.12 | fd01:1::12 | TCP 81 |
//! | y/a | node-1 | 10.128.0.20 | fd01::20 | TCP 81 |
//! | y/b | node-2 | 10.128.1.21 | fd01:1::21 | TCP 81 |
//!
//! Every pod serves TCP 80 and 81 and UDP 53. The nodes themselves are clients too
//! (`node-1`, `node-2`): traffic between a pod and its own node is always allowed
//! (upstream semantics), traffic from the other node is subject to policy. SCTP is planned and
//! checked by `nft -c` in the unit tests only: this kernel has no SCTP sockets.

use super::netpol_scenarios::upstream;
use nodeplane::testing::lab::{
    self, EchoConn, Endpoint, Lab, ManifestAgent, Ns, Pod, PodNetwork, Probe, SECOND, Server,
    Topology, assert_truth, eventually,
};
use nodeplane::testing::nft_check::nft_check;
use nodeplane::testing::objects;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub const NODES: [&str; 2] = ["node-1", "node-2"];
/// (namespace, name, node index, IPv4, IPv6, port number of `web`).
pub const PODS: [(&str, &str, usize, &str, &str, u16); 5] = [
    ("x", "a", 0, "10.128.0.10", "fd01::10", 80),
    ("x", "b", 0, "10.128.0.11", "fd01::11", 81),
    ("x", "c", 1, "10.128.1.12", "fd01:1::12", 81),
    ("y", "a", 0, "10.128.0.20", "fd01::20", 81),
    ("y", "b", 1, "10.128.1.21", "fd01:1::21", 81),
];

pub struct Cluster {
    pub nodes: Vec<Ns>,
    pub pods: Vec<(String, Pod)>,
    pub agents: Vec<ManifestAgent>,
    _servers: Vec<Server>,
    // Last: servers and agents must stop before the namespaces go.
    _lab: Lab,
}

pub fn cluster() -> Cluster {
    cluster_on(Topology::Routed)
}

pub fn cluster_on(topology: Topology) -> Cluster {
    let mut lab = Lab::new();
    let nodes: Vec<Ns> = NODES.iter().map(|n| lab.add_node(n)).collect();
    lab.link(
        &nodes[0],
        &["192.168.2.1/24", "fd00:2::1/64"],
        &nodes[1],
        &["192.168.2.2/24", "fd00:2::2/64"],
    );
    lab.add_route(&nodes[0], "10.128.1.0/24", "192.168.2.2");
    lab.add_route(&nodes[0], "fd01:1::/64", "fd00:2::2");
    lab.add_route(&nodes[1], "10.128.0.0/24", "192.168.2.1");
    lab.add_route(&nodes[1], "fd01::/64", "fd00:2::1");
    // How the nodes attach their pods (both alike): each node's pod subnet on its bridge.
    let subnets = [
        ["10.128.0.1/24", "fd01::1/64"],
        ["10.128.1.1/24", "fd01:1::1/64"],
    ];
    let networks: Vec<PodNetwork> = (nodes.iter().zip(subnets))
        .map(|(node, gateways)| lab.pod_network(node, topology, &gateways))
        .collect();
    let mut pods = Vec::new();
    let mut servers = Vec::new();
    for (ns, name, node, v4, v6, _) in PODS {
        let role = format!("{ns}-{name}");
        let pod = lab.add_pod_in(&networks[node], &role, &[v4, v6]);
        let tag = format!("{ns}-{name}");
        servers.push(pod.ns.tcp_server("[::]:80", &tag));
        servers.push(pod.ns.tcp_server("[::]:81", &tag));
        servers.push(pod.ns.udp_server("[::]:53", &tag));
        pods.push((format!("{ns}/{name}"), pod));
    }
    let agents = nodes
        .iter()
        .zip(NODES)
        .map(|(ns, name)| ManifestAgent::new(ns, name, &[]))
        .collect();
    Cluster {
        nodes,
        pods,
        agents,
        _servers: servers,
        _lab: lab,
    }
}

impl Cluster {
    /// Writes namespaces, pods and `policies` (manifests) for both agents and applies them
    /// with `--once` on each node.
    pub fn apply(&self, policies: &[String]) {
        self.write(policies);
        for agent in &self.agents {
            agent.once(&[]);
        }
    }

    /// Writes the manifests only (for agents in run mode).
    pub fn write(&self, policies: &[String]) {
        for agent in &self.agents {
            agent.write("cluster.yaml", &cluster_docs());
            agent.write("policies.yaml", &policies.join("---\n"));
        }
    }

    /// Pods and both nodes as clients, by their address of `family` (4 or 6).
    pub fn clients(&self, family: u8) -> Vec<Endpoint> {
        let mut out = self.servers(family);
        for (i, node) in self.nodes.iter().enumerate() {
            let addr = if family == 4 {
                "192.168.2.1"
            } else {
                "fd00:2::1"
            };
            let mut addr: IpAddr = addr.parse().unwrap();
            if i == 1 {
                addr = if family == 4 {
                    "192.168.2.2"
                } else {
                    "fd00:2::2"
                }
                .parse()
                .unwrap();
            }
            out.push(Endpoint {
                name: NODES[i].to_string(),
                ns: node.clone(),
                addr,
            });
        }
        out
    }

    fn servers(&self, family: u8) -> Vec<Endpoint> {
        self.pods
            .iter()
            .map(|(name, pod)| Endpoint {
                name: name.clone(),
                ns: pod.ns.clone(),
                addr: if family == 4 {
                    pod.ip()
                } else {
                    pod.ip6().unwrap()
                },
            })
            .collect()
    }

    #[track_caller]
    fn check(&self, case: &str, family: u8, probe: Probe, allowed: impl Fn(&str, &str) -> bool) {
        assert_truth(
            case,
            &self.clients(family),
            &self.servers(family),
            probe,
            |from, to| always(from, to) || allowed(from, to),
        );
    }
}

/// The namespaces and pods of the cluster, as one manifest file.
pub fn cluster_docs() -> String {
    let mut docs = vec![
        objects::namespace("x", &[("ns", "x")]).to_string(),
        objects::namespace("y", &[("ns", "y")]).to_string(),
    ];
    for (ns, name, node, v4, v6, web) in PODS {
        let pod = objects::pod(ns, name)
            .on(NODES[node])
            .labels(&[("pod", name)])
            .ips(&[v4, v6])
            .named_ports(&[("web", "TCP", web)]);
        docs.push(pod.to_string());
    }
    docs.join("---\n")
}

/// What no policy can block: a pod to itself, a node to its own pods.
pub fn always(from: &str, to: &str) -> bool {
    from == to || node_of(from).is_some_and(|n| Some(n) == node_of(to) && NODES.contains(&from))
}

/// The node index of a pod (`x/a`) or node name.
pub fn node_of(name: &str) -> Option<usize> {
    if let Some(i) = NODES.iter().position(|n| *n == name) {
        return Some(i);
    }
    PODS.iter()
        .find(|(ns, pod, ..)| format!("{ns}/{pod}") == name)
        .map(|p| p.2)
}

pub fn policy(ns: &str, name: &str, spec: &str) -> String {
    objects::network_policy(ns, name, spec).to_string()
}

pub fn in_ns(name: &str, ns: &str) -> bool {
    name.starts_with(&format!("{ns}/"))
}

const DENY_INGRESS: &str = "  podSelector: {}\n  policyTypes: [Ingress]\n";
const TCP80: Probe = Probe::Tcp(80);

/// The upstream scenarios (`netpol_scenarios`) on `c`, step by step, applied with `--once`.
fn run_scenarios(c: &Cluster, topology: &str) {
    for step in upstream() {
        c.apply(&step.policies);
        for check in step.checks {
            let case = format!("{topology}: {}", check.label);
            c.check(&case, check.family, check.probe, check.allowed);
        }
    }
}

/// The upstream scenarios with both agents in run mode: each step is a live edit of the
/// policies file the agents watch. The file also holds a Service whose cluster IP names the
/// step: the sync whose table shows it applied the step's policies too (one file is read
/// whole), so the checks start once both nodes show the step's marker.
fn run_scenarios_live(c: &Cluster, topology: &str) {
    const ADMIN: &str = "127.0.0.1:9942";
    let admin: SocketAddr = ADMIN.parse().unwrap();
    let wait = Duration::from_secs(60);
    c.write(&[]);
    let mut agents: Vec<_> = c
        .agents
        .iter()
        .map(|a| a.spawn(&["--admin-address", ADMIN]))
        .collect();
    for agent in &mut agents {
        agent.wait_ready(admin, wait);
    }
    for (i, step) in upstream().into_iter().enumerate() {
        let marker = format!("10.96.200.{}", i + 1);
        let ports = "{port: 80, protocol: TCP}";
        let mut docs = step.policies.clone();
        docs.push(objects::service(&format!("step-{i}"), &marker, ports).to_string());
        c.write(&docs);
        for (node, agent) in c.nodes.iter().zip(&agents) {
            eventually(wait, || match node.http_get(admin, "/ruleset", wait) {
                Ok((200, body)) if body.contains(&format!("{marker} ")) => Ok(()),
                other => Err(format!("step {i} not applied: {other:?}\n{}", agent.logs())),
            });
        }
        for check in step.checks {
            let case = format!("{topology}, run mode: {}", check.label);
            c.check(&case, check.family, check.probe, check.allowed);
        }
    }
    for agent in agents {
        agent.stop();
    }
}

#[test]
fn truth_tables_same_node_and_cross_node() {
    run_scenarios(&cluster(), "routed");
}

// The live matrix runs as one test per topology so that libtest can run them side by side.
#[test]
fn truth_tables_with_live_edits_on_routed_nodes() {
    run_scenarios_live(&cluster(), "routed");
}

#[test]
fn truth_tables_with_live_edits_on_bridged_nodes_without_br_netfilter() {
    let c = cluster_on(Topology::Bridged {
        br_netfilter: false,
    });
    run_scenarios_live(&c, "bridged, br_netfilter false");
}

#[test]
fn truth_tables_with_live_edits_on_bridged_nodes_with_br_netfilter() {
    let c = cluster_on(Topology::Bridged { br_netfilter: true });
    run_scenarios_live(&c, "bridged, br_netfilter true");
}

#[test]
fn truth_tables_on_bridged_nodes_without_br_netfilter() {
    let c = cluster_on(Topology::Bridged {
        br_netfilter: false,
    });
    run_scenarios(&c, "bridged without br_netfilter");
}

#[test]
fn truth_tables_on_bridged_nodes_with_br_netfilter() {
    let c = cluster_on(Topology::Bridged { br_netfilter: true });
    run_scenarios(&c, "bridged with br_netfilter");
}

/// What `--dry-run` prints for every step of the upstream scenarios loads with `nft -f`
/// (both tables: `inet` and `bridge`).
#[test]
fn upstream_scenarios_dry_run_rulesets_load_with_nft() {
    let c = cluster();
    for (i, step) in upstream().into_iter().enumerate() {
        c.write(&step.policies);
        let printed = c.agents[0]
            .dry_run(&[])
            .unwrap_or_else(|e| panic!("dry run of step {i}: {e}"));
        nft_check(&printed);
    }
}

#[test]
fn established_connections_survive_a_policy_change() {
    let c = cluster();
    c.apply(&[]);
    let server = &c.pods[0].1; // x/a
    let client = &c.pods[1].1; // x/b
    let dst = SocketAddr::new(server.ip(), 7000);
    let echo = lab::line_echo_server(&server.ns, dst);
    let mut conn = EchoConn::connect(&client.ns, dst, SECOND);
    assert_eq!(conn.roundtrip("before").unwrap(), "before");
    c.apply(&[policy("x", "deny", DENY_INGRESS)]);
    // Documented choice: a policy change does not cut established connections ...
    assert_eq!(conn.roundtrip("after").unwrap(), "after");
    // ... while new ones are denied.
    c.check("new connections denied", 4, TCP80, |_, to| !in_ns(to, "x"));
    drop(conn);
    echo.join().unwrap();
}

#[test]
fn an_invalid_policy_is_reported_and_skipped_while_the_others_apply() {
    let c = cluster();
    let invalid = policy(
        "x",
        "open",
        "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.128.0.0/16, except: [10.0.0.0/8]}}]}]\n",
    );
    c.apply(&[policy("x", "deny", DENY_INGRESS), invalid]);
    c.check(
        "the valid deny applies, the invalid allow does not",
        4,
        TCP80,
        |_, to| !in_ns(to, "x"),
    );
    let report = c.agents[0]
        .dry_run(&[])
        .unwrap_or_else(|e| panic!("dry run: {e}"));
    assert!(
        report.contains("NetworkPolicy x/open")
            && report.contains("spec.ingress[0].from[0].ipBlock.except[0]: 10.0.0.0/8 must be strictly inside the cidr 10.128.0.0/16"),
        "{report}"
    );
}

#[test]
fn host_network_pods_are_not_subject() {
    let c = cluster();
    // A hostNetwork pod on node-1 labelled like the others: its address is the node's.
    let mut docs = vec![policy("x", "deny", DENY_INGRESS)];
    let host = objects::pod("x", "host")
        .on(NODES[0])
        .labels(&[("pod", "a")])
        .ips(&["192.168.2.1"])
        .object();
    let mut host = serde_json::to_value(host).unwrap();
    host["spec"]["hostNetwork"] = true.into();
    docs.push(serde_norway::to_string(&host).unwrap());
    c.apply(&docs);
    let ruleset = c.nodes[0]
        .nft(&["list", "map", "inet", "nodeplane", "np-ingress-v4"])
        .unwrap();
    assert!(
        ruleset.contains("10.128.0.10") && !ruleset.contains("192.168.2.1"),
        "{ruleset}"
    );
    c.check(
        "node-2 (host network) to x is denied, node-1 to its pods is not",
        4,
        TCP80,
        |_, to| !in_ns(to, "x"),
    );
}

#[test]
pub(crate) fn run_mode_applies_edits_and_deletes_live_and_keeps_the_last_valid_version() {
    let c = cluster();
    c.write(&[]);
    let agents: Vec<_> = c.agents.iter().map(|a| a.spawn(&[])).collect();
    let (x_b, y_a) = (&c.pods[1].1, &c.pods[3].1);
    let x_a = c.pods[0].1.ip();
    let reaches = |from: &Pod| {
        from.ns
            .tcp_connect((x_a, 80), Duration::from_millis(500))
            .is_reply()
    };
    let wait = |what: &str, want: (bool, bool)| {
        eventually(Duration::from_secs(10), || {
            let got = (reaches(x_b), reaches(y_a));
            (got == want)
                .then_some(())
                .ok_or(format!("{what}: x/b, y/a -> x/a: {got:?}"))
        })
    };
    wait("no policy", (true, true));
    let deny = policy("x", "deny", DENY_INGRESS);
    let allow_b = |from: &str| {
        policy(
            "x",
            "allow",
            &format!(
                "  podSelector: {{}}\n  ingress: [{{from: [{{ipBlock: {{cidr: {from}}}}}]}}]\n"
            ),
        )
    };
    c.write(&[deny.clone(), allow_b("10.128.0.11/32")]);
    wait("deny but from x/b", (true, false));
    // An invalid edit: reported, and the last valid version stays in force.
    c.write(&[deny.clone(), allow_b("10.128.0.0/33")]);
    eventually(Duration::from_secs(10), || {
        let logs = agents[0].logs();
        logs.contains("spec.ingress[0].from[0].ipBlock.cidr")
            .then_some(())
            .ok_or(logs)
    });
    wait("invalid edit keeps the last valid version", (true, false));
    c.write(&[deny.clone(), allow_b("10.128.0.20/32")]);
    wait("edited: from y/a only", (false, true));
    c.write(&[]);
    wait("deleted", (true, true));
    for agent in agents {
        agent.stop_ok();
    }
}

#[test]
fn a_pod_always_reaches_its_own_node_but_not_other_nodes_when_egress_isolated() {
    let c = cluster();
    let servers: Vec<Server> = c
        .nodes
        .iter()
        .map(|n| n.tcp_server("[::]:80", "node"))
        .collect();
    c.apply(&[policy(
        "y",
        "no-egress",
        "  podSelector: {}\n  policyTypes: [Egress]\n",
    )]);
    let nodes: Vec<Endpoint> = c
        .clients(4)
        .into_iter()
        .filter(|e| NODES.contains(&e.name.as_str()))
        .collect();
    let pods: Vec<Endpoint> = c.servers(4);
    // Upstream: traffic between a pod and its own node is always allowed; y/b is on node-2.
    assert_truth(
        "pods to nodes, y egress-isolated",
        &pods,
        &nodes,
        TCP80,
        |from, to| !in_ns(from, "y") || node_of(from) == node_of(to),
    );
    drop(servers);
}

/// Two policies naming the same peers (`namespaceSelector ns=y`) hold one peer set in each
/// table; deleting one of them live leaves the set, and the other policy's allow, in force,
/// and isolates the pod only the deleted one allowed to. Routed and bridged nodes (the set
/// is in both tables).
#[test]
fn two_policies_with_the_same_peers_share_one_set_and_deleting_one_keeps_the_other() {
    let from_y = |name: &str, pod: &str| {
        policy(
            "x",
            name,
            &format!(
                "  podSelector: {{matchLabels: {{pod: {pod}}}}}\n  ingress: [{{from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}}}]}}]\n"
            ),
        )
    };
    let deny = policy("x", "deny", DENY_INGRESS);
    for topology in [
        Topology::Routed,
        Topology::Bridged {
            br_netfilter: false,
        },
    ] {
        let c = cluster_on(topology);
        c.write(&[
            deny.clone(),
            from_y("from-y-a", "a"),
            from_y("from-y-b", "b"),
        ]);
        let agents: Vec<_> = c.agents.iter().map(|a| a.spawn(&[])).collect();
        let (x_b, y_a) = (c.pods[1].1.ip(), &c.pods[3].1);
        let y_reaches_x_b = || {
            y_a.ns
                .tcp_connect((x_b, 80), Duration::from_millis(500))
                .is_reply()
        };
        // The shared sets' names (one per family) and how many rules look up the v4 one.
        let peer_sets = |family: &str| -> (Vec<String>, usize) {
            let table = c.nodes[0]
                .nft(&["list", "table", family, "nodeplane"])
                .unwrap_or_else(|e| panic!("list table {family} nodeplane: {e}"));
            let names: Vec<String> = table
                .lines()
                .filter_map(|l| l.trim().strip_prefix("set np-peers-"))
                .map(|s| format!("np-peers-{}", s.trim_end_matches(" {")))
                .collect();
            let uses = names
                .first()
                .map_or(0, |n| table.matches(&format!("ip saddr @{n} ")).count());
            (names, uses)
        };
        let case = format!("{topology:?}");
        let x_a = &c.pods[0].1;
        eventually(Duration::from_secs(20), || {
            let x_a_reaches_x_b = x_a
                .ns
                .tcp_connect((x_b, 80), Duration::from_millis(500))
                .is_reply();
            (!x_a_reaches_x_b && y_reaches_x_b())
                .then_some(())
                .ok_or_else(|| "the policies are not in force yet".to_string())
        });
        c.check(&format!("{case}: both allow y"), 4, TCP80, |from, to| {
            !in_ns(to, "x") || (in_ns(from, "y") && to != "x/c")
        });
        let (shared, uses) = peer_sets("inet");
        let base = shared[0].trim_end_matches("-v4");
        assert_eq!(
            shared,
            [format!("{base}-v4"), format!("{base}-v6")],
            "{case}: one peer set (per family) for both"
        );
        assert_eq!(uses, 2, "{case}: both policies look it up");
        assert_eq!(peer_sets("bridge"), (shared.clone(), 2), "{case}: bridge");
        // One of the two goes: x/b is isolated by `deny` alone, x/a still allows y.
        c.write(&[deny.clone(), from_y("from-y-a", "a")]);
        eventually(Duration::from_secs(20), || {
            (!y_reaches_x_b())
                .then_some(())
                .ok_or_else(|| "y/a -> x/b still open".to_string())
        });
        c.check(&format!("{case}: x/a allows y"), 4, TCP80, |from, to| {
            !in_ns(to, "x") || (in_ns(from, "y") && to == "x/a")
        });
        assert_eq!(
            peer_sets("inet"),
            (shared.clone(), 1),
            "{case}: the set stays for x/a's policy"
        );
        // The last user goes: so does the set.
        c.write(std::slice::from_ref(&deny));
        eventually(Duration::from_secs(20), || {
            let (left, _) = peer_sets("inet");
            left.is_empty().then_some(()).ok_or(format!("{left:?}"))
        });
        c.check(&format!("{case}: x denies all"), 4, TCP80, |_, to| {
            !in_ns(to, "x")
        });
        for agent in agents {
            let (status, logs) = agent.stop();
            assert!(status.success(), "{case}: {status}:\n{logs}");
        }
    }
}
