//! A multi-node EgressIP cluster in network namespaces, run in Kubernetes mode: the kernel
//! tests and the failover benchmark of the EgressIP control plane share it.
//!
//! `N` node netns (`node-1` ..) on one L2 segment (192.168.50.0/24) with an external host
//! (`.100`) and an API host (`.250`, where [`FakeApi`] listens); one selected pod per node
//! (`10.128.<i+1>.5`, namespace `backend`, `app: api`), pod subnets routed between the nodes,
//! and on every node a CNI-like masquerade (`ip saddr <cluster> ip daddr != <cluster>
//! masquerade` at srcnat). One agent per node, with the assigner's election and probes on as
//! in a real cluster, and one probe key shared by every agent (as the Secret of deploy/ is),
//! so which agent leads and where the egress IP lands are the agents'
//! decisions, read back from the Lease and `status.items`.
//!
//! A node's *uplink* can be cut at the segment's bridge port (the node sees its carrier go,
//! like a pulled cable or a dead switch port; addresses and routes stay), and its agent
//! killed, restarted or stopped.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::testing::fakeapi::FakeApi;
use crate::testing::lab::{AgentProcess, Exclusive, Lab, Ns, Pod, Segment, exclusive};
use crate::testing::objects;

/// The egress IP every test places.
pub const EIP: &str = "192.168.50.200";
/// The external host, which runs the servers and sinks.
pub const EXT: &str = "192.168.50.100";
const API: &str = "192.168.50.250:6443";
const CLUSTER: &str = "10.128.0.0/14";
const LABEL: &str = "k8s.ovn.org/egress-assignable";
/// The election Lease of the assigner (the agents run without POD_NAMESPACE).
const LEASE: (&str, &str) = ("nodeplane", "nodeplane-egress-assigner");

pub struct EipCluster {
    pub api: FakeApi,
    pub nodes: Vec<Ns>,
    /// The selected pod on each node (`pods[i]` runs on `nodes[i]`).
    pub pods: Vec<Pod>,
    pub ext: Ns,
    /// Each node's segment interface MAC.
    pub macs: Vec<String>,
    seg: Segment,
    /// Each node's port on the segment's bridge.
    ports: Vec<String>,
    /// Behind a lock so that a test can restart agents while another thread samples.
    agents: std::sync::Mutex<Vec<Option<AgentProcess>>>,
    /// Nodes are AWS instances ([`EipCluster::make_cloud`]).
    cloud: std::sync::atomic::AtomicBool,
    kubeconfig: PathBuf,
    /// The probe key every agent reads (`--egress-ip-probe-key-file`).
    probe_key: PathBuf,
    _dir: tempfile::TempDir,
    // The agents and the API server must stop before the namespaces go.
    _lab: Lab,
    // Last of all: three agents and their probes are timing-sensitive; no other lab of the
    // test binary runs meanwhile.
    _alone: Exclusive,
}

pub fn node_name(i: usize) -> String {
    format!("node-{}", i + 1)
}

pub fn node_ip(i: usize) -> String {
    format!("192.168.50.{}", 11 + i)
}

impl EipCluster {
    /// `n` nodes; those in `assignable` carry the egress-assignable label. No agent runs yet
    /// and no EgressIP exists.
    pub fn new(n: usize, assignable: &[usize]) -> EipCluster {
        let alone = exclusive();
        let mut lab = Lab::new();
        let seg = lab.add_segment("seg");
        let apihost = lab.add_host("api");
        lab.attach(&apihost, &seg, &["192.168.50.250/24"]);
        let ext = lab.add_host("ext");
        let ext_if = lab.attach(&ext, &seg, &["192.168.50.100/24"]);
        // An upstream router that takes gratuitous ARP for addresses it has not seen yet.
        ext.sysctl("net.ipv4.conf.all.arp_accept", "1");
        ext.sysctl(&format!("net.ipv4.conf.{ext_if}.arp_accept"), "1");
        let listener = apihost
            .enter(|| TcpListener::bind(API))
            .expect("bind the fake API server");
        let api = FakeApi::start(listener);
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.kubeconfig(dir.path());
        let probe_key = dir.path().join("probe-key");
        std::fs::write(
            &probe_key,
            format!("{:032x}{:032x}\n", rand_u128(), rand_u128()),
        )
        .expect("write the probe key");
        let (mut nodes, mut pods, mut macs, mut ports) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            let node = lab.add_node(&node_name(i));
            let iface = lab.attach(&node, &seg, &[&format!("{}/24", node_ip(i))]);
            macs.push(
                node.run(&["cat", &format!("/sys/class/net/{iface}/address")])
                    .trim()
                    .to_string(),
            );
            ports.push(peer_port(&node, &iface, &seg));
            let cni = format!(
                "table ip cni {{\n chain post {{\n type nat hook postrouting priority srcnat;\n \
                 ip saddr {CLUSTER} ip daddr != {CLUSTER} masquerade\n }}\n}}\n"
            );
            node.exec_stdin(&["nft", "-f", "-"], &cni)
                .expect("CNI table");
            let pod_ip = format!("10.128.{}.5", i + 1);
            pods.push(lab.add_pod(&node, &format!("pod{}", i + 1), &[&pod_ip]));
            nodes.push(node);
        }
        for (i, node) in nodes.iter().enumerate() {
            for j in (0..n).filter(|j| *j != i) {
                lab.add_route(node, &format!("10.128.{}.0/24", j + 1), &node_ip(j));
            }
        }
        let c = EipCluster {
            api,
            nodes,
            pods,
            ext,
            macs,
            seg,
            ports,
            agents: std::sync::Mutex::new((0..n).map(|_| None).collect()),
            cloud: std::sync::atomic::AtomicBool::new(false),
            kubeconfig,
            probe_key,
            _dir: dir,
            _lab: lab,
            _alone: alone,
        };
        c.put_objects(assignable);
        c
    }

    fn put_objects(&self, assignable: &[usize]) {
        for i in 0..self.nodes.len() {
            self.put_node(i, assignable.contains(&i));
        }
        let ns = objects::namespace("backend", &[("team", "backend")]);
        self.api.put(objects::parse(&ns.to_string()));
        for (i, pod) in self.pods.iter().enumerate() {
            let p = objects::pod("backend", &format!("api-{}", i + 1))
                .on(&node_name(i))
                .labels(&[("app", "api")])
                .ips(&pod.addrs);
            self.api.put(objects::parse(&p.to_string()));
        }
    }

    /// (Re)writes node `i`'s Node object, Ready, with or without the egress-assignable label.
    pub fn put_node(&self, i: usize, assignable: bool) {
        let mut labels = vec![("kubernetes.io/hostname", node_name(i))];
        if assignable {
            labels.push((LABEL, String::new()));
        }
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let node = objects::node(&node_name(i), &[node_ip(i)])
            .labels(&labels)
            .ready(true);
        let mut obj: Value = objects::parse(&node.to_string());
        // Keep what the agent published (the annotation) across a relabel.
        if let Some(old) = self.api.object("Node", "", &node_name(i)) {
            obj["metadata"]["annotations"] = old["metadata"]["annotations"].clone();
        }
        if self.cloud.load(std::sync::atomic::Ordering::Relaxed) {
            // What AWS and its cloud controller put on a Node: the instance, and the NIC's
            // subnet and room for egress IPs.
            obj["spec"]["providerID"] = json!(format!("aws:///us-east-1a/i-{}", node_name(i)));
            let config = json!([{"interface": format!("eni-{}", node_name(i)),
                "ifaddr": {"ipv4": "192.168.50.0/24"}, "capacity": {"ipv4": 4}}]);
            if !obj["metadata"]["annotations"].is_object() {
                obj["metadata"]["annotations"] = json!({});
            }
            obj["metadata"]["annotations"]["cloud.network.openshift.io/egress-ipconfig"] =
                json!(config.to_string());
        }
        self.api.put(obj);
    }

    /// Makes every node an AWS instance (`spec.providerID` and the
    /// `cloud.network.openshift.io/egress-ipconfig` annotation): the assigner then goes
    /// through CloudPrivateIPConfigs (answer them with `testing::cloud_controller`).
    pub fn make_cloud(&self, assignable: &[usize]) {
        self.cloud.store(true, std::sync::atomic::Ordering::Relaxed);
        for i in 0..self.nodes.len() {
            self.put_node(i, assignable.contains(&i));
        }
    }

    /// The EgressIP `backend` (EIP, namespace `team: backend`, pods `app: api`), without
    /// status: the assigner places it.
    pub fn put_egress_ip(&self) {
        let eip = objects::egress_ip("backend", &[EIP], &[("team", "backend")])
            .pods(&[("app", "api")])
            .created(Some("2026-01-01T00:00:00Z"));
        self.api.put(objects::parse(&eip.to_string()));
    }

    pub fn start_agent(&self, i: usize) {
        let mut agents = self.agents.lock().unwrap();
        assert!(agents[i].is_none(), "{} already runs", node_name(i));
        let name = node_name(i);
        let kubeconfig = self.kubeconfig.to_str().expect("utf-8 path").to_string();
        let key = self.probe_key.to_str().expect("utf-8 path").to_string();
        let args = [
            "--egress-ip-probe-key-file",
            &key,
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            &name,
            "--cluster-cidr",
            CLUSTER,
            "--service-cidr",
            "172.30.0.0/16",
            "--log-level",
            "info,nodeplane=debug",
        ];
        agents[i] = Some(self.nodes[i].spawn_agent(&args));
    }

    /// The probe key every agent holds (what the cluster's Secret would hold).
    pub fn probe_key(&self) -> crate::controller::egress_ip::probe_auth::ProbeKey {
        crate::controller::egress_ip::probe_auth::ProbeKey::load(&self.probe_key)
            .expect("the cluster's probe key")
    }

    /// Waits until node `i`'s agent answers `/readyz` with 200 (its first sync is done).
    pub fn wait_ready(&self, i: usize, within: Duration) {
        let admin: SocketAddr = "127.0.0.1:9942".parse().expect("admin address");
        let mut agents = self.agents.lock().unwrap();
        let agent = agents[i].as_mut().expect("agent runs");
        agent.wait_ready(admin, within);
    }

    /// SIGKILL: the kernel state stays as the agent left it. Returns the agent's log.
    pub fn kill_agent(&self, i: usize) -> String {
        let agent = self.agents.lock().unwrap()[i].take().expect("agent runs");
        agent.kill().1
    }

    /// SIGTERM, waiting for the agent to exit (it releases the Lease if it leads).
    pub fn stop_agent(&self, i: usize) -> String {
        let agent = self.agents.lock().unwrap()[i].take().expect("agent runs");
        agent.stop().1
    }

    pub fn logs(&self, i: usize) -> String {
        self.agents.lock().unwrap()[i]
            .as_ref()
            .map_or_else(|| "(not running)".into(), AgentProcess::logs)
    }

    /// Every running agent's log, for failure messages.
    pub fn all_logs(&self) -> String {
        (0..self.nodes.len())
            .map(|i| format!("===== {} =====\n{}", node_name(i), self.logs(i)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Cuts (or restores) node `i`'s uplink at its bridge port.
    pub fn uplink(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        self.seg
            .ns
            .run(&["ip", "link", "set", &self.ports[i], state]);
    }

    /// What a reboot loses of the agent's kernel state: its table, addresses, routes and
    /// rules (the agent's own `cleanup` mode).
    pub fn forget_kernel_state(&self, i: usize) {
        self.nodes[i]
            .run_agent(&["cleanup"])
            .expect("agent cleanup");
    }

    /// The node `status.items` places EIP on, if any.
    pub fn host(&self) -> Option<String> {
        let obj = self.api.object("EgressIP", "", "backend")?;
        let items = obj["status"]["items"].as_array()?.clone();
        items
            .iter()
            .find(|i| i["egressIP"] == EIP)
            .and_then(|i| i["node"].as_str().map(str::to_string))
    }

    /// Waits until `status.items` places EIP on some node and that node holds the address;
    /// returns the node's index.
    #[track_caller]
    pub fn wait_hosted(&self, within: Duration) -> usize {
        self.wait(within, || {
            let host = self.host().ok_or("EIP not in status.items")?;
            let i = self.index(&host);
            self.has_eip(i)
                .then_some(i)
                .ok_or_else(|| format!("status.items: {host}, which lacks the address"))
        })
    }

    /// Waits until `status.items` places EIP on a node other than `i` and that node holds
    /// the address; returns its index.
    #[track_caller]
    pub fn wait_moved_off(&self, i: usize, within: Duration) -> usize {
        self.wait(within, || {
            let host = self.host().ok_or("EIP not in status.items")?;
            let j = self.index(&host);
            (j != i && self.has_eip(j))
                .then_some(j)
                .ok_or_else(|| format!("EIP still on {host} (or not yet on its new node)"))
        })
    }

    /// The holder of the assigner's Lease.
    pub fn leader(&self) -> Option<String> {
        let lease = self.api.object("Lease", LEASE.0, LEASE.1)?;
        let holder = lease["spec"]["holderIdentity"].as_str()?;
        (!holder.is_empty()).then(|| holder.to_string())
    }

    /// Hands the assigner's Lease to node `i` as `kubectl edit lease` would (holder
    /// rewritten): the old leader's next renewal conflicts and it steps down, and node `i`'s
    /// agent, reading its own name as holder, renews it. Returns once node `i` leads and has
    /// for a second (the old leader has stepped down by then).
    #[track_caller]
    pub fn hand_lease_to(&self, i: usize, within: Duration) {
        let lease = || {
            self.api
                .object("Lease", LEASE.0, LEASE.1)
                .expect("the assigner's Lease")
        };
        let mut edited = lease();
        edited["spec"]["holderIdentity"] = json!(node_name(i));
        self.api.put(edited);
        let written = lease()["metadata"]["resourceVersion"].clone();
        // Only node i's agent writes a record naming node i: a newer one is its renewal.
        let led = self.wait(within, || {
            let now = lease();
            (now["spec"]["holderIdentity"] == json!(node_name(i))
                && now["metadata"]["resourceVersion"] != written)
                .then(std::time::Instant::now)
                .ok_or_else(|| format!("Lease {}", now["spec"]))
        });
        std::thread::sleep(Duration::from_secs(1).saturating_sub(led.elapsed()));
        assert_eq!(self.leader(), Some(node_name(i)), "{}", self.all_logs());
    }

    #[track_caller]
    pub fn wait_leader(&self, within: Duration) -> usize {
        self.wait(within, || {
            self.leader()
                .map(|l| self.index(&l))
                .ok_or_else(|| "nobody holds the Lease".to_string())
        })
    }

    /// Waits until the Lease names a holder other than node `i`.
    #[track_caller]
    pub fn wait_leader_other_than(&self, i: usize, within: Duration) -> usize {
        self.wait(within, || match self.leader() {
            Some(l) if l != node_name(i) => Ok(self.index(&l)),
            other => Err(format!("Lease holder {other:?}")),
        })
    }

    /// Retries `f` every 50 ms until it is Ok; panics with the last error and every agent's
    /// log after `within`.
    #[track_caller]
    pub fn wait<T>(&self, within: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
        let deadline = std::time::Instant::now() + within;
        loop {
            match f() {
                Ok(v) => return v,
                Err(e) if std::time::Instant::now() >= deadline => {
                    panic!("not true after {within:?}: {e}\n{}", self.all_logs())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    pub fn index(&self, node: &str) -> usize {
        (0..self.nodes.len())
            .find(|i| node_name(*i) == node)
            .unwrap_or_else(|| panic!("no node {node}"))
    }

    pub fn has_eip(&self, i: usize) -> bool {
        self.nodes[i]
            .run(&["ip", "-o", "addr", "show"])
            .split_whitespace()
            .any(|w| w.split('/').next() == Some(EIP))
    }

    /// The MAC the external host's neighbour table holds for EIP.
    pub fn ext_neighbour(&self) -> Option<String> {
        let out = self.ext.run(&["ip", "neigh", "show", EIP]);
        let mut words = out.split_whitespace().skip_while(|w| *w != "lladdr");
        words.nth(1).map(str::to_string)
    }

    /// The source address the external host saw for a TCP connection from `pod`.
    pub fn source_seen(&self, pod: usize, server: SocketAddr) -> Result<IpAddr, String> {
        match self.pods[pod]
            .ns
            .tcp_connect(server, Duration::from_secs(1))
        {
            crate::testing::lab::Outcome::Reply(r) => Ok(r.src_ip()),
            other => Err(format!("pod{} -> {server}: {other:?}", pod + 1)),
        }
    }

    /// Whether the EgressIP's object still has a status (for tests that read none).
    pub fn status(&self) -> Value {
        self.api
            .object("EgressIP", "", "backend")
            .map_or(json!(null), |o| o["status"].clone())
    }
}

/// A random number (a test's key need not be strong, only differ between runs).
fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the kernel's random source");
    u128::from_ne_bytes(b)
}

/// The bridge port in `seg` that is the peer of `iface` in `node`.
fn peer_port(node: &Ns, iface: &str, seg: &Segment) -> String {
    let peer = node.run(&["cat", &format!("/sys/class/net/{iface}/iflink")]);
    let peer = peer.trim();
    let links = seg.ns.run(&["ip", "-o", "link", "show"]);
    links
        .lines()
        .find_map(|l| {
            let (index, rest) = l.split_once(": ")?;
            (index == peer).then(|| rest.split(['@', ':']).next().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| panic!("no bridge port with index {peer} for {iface}"))
}
