//! EgressIP against the kernel with real packets: three node netns on one bridge (the node
//! subnet 192.168.50.0/24, fd00:50::/64) with an external host on it, pods behind nodes 1 and
//! 2, one agent per node reading a shared manifests directory, and on every node a CNI-like
//! masquerade rule in a table of its own (`ip saddr <cluster> ip daddr != <cluster>
//! masquerade` at srcnat, no output-interface restriction: the hardest case).
//!
//! Pods: `api1` (node-1) and `api2` (node-2) in `backend` with app=api are selected; `web2`
//! (backend, app=web) and `front2` (frontend, app=api) on node-2 are not.

use nodeplane::testing::lab::{self, AgentProcess, Lab, Ns, Pod, SECOND, Server, eventually};
use nodeplane::testing::objects;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const EIP4: &str = "192.168.50.200";
const EIP6: &str = "fd00:50::200";
const EXT4: &str = "192.168.50.100:8080";
const EXT6: &str = "[fd00:50::100]:8080";
const CLUSTER4: &str = "10.128.0.0/14";
const CLUSTER6: &str = "fd01::/48";
/// What moves and deletes must converge within (the bound).
const CONVERGE: Duration = Duration::from_secs(2);

struct Topo {
    nodes: Vec<Ns>,
    /// eth MAC of each node on the segment.
    macs: Vec<String>,
    /// Each node's interface on the segment (its uplink).
    uplinks: Vec<String>,
    ext: Ns,
    api1: Pod,
    api2: Pod,
    web2: Pod,
    front2: Pod,
    dir: tempfile::TempDir,
    _servers: Vec<Server>,
    // Last: servers must stop before the namespaces go.
    _lab: Lab,
}

fn node_ip(i: usize) -> String {
    format!("192.168.50.1{}", i + 1)
}

fn node_ip6(i: usize) -> String {
    format!("fd00:50::1{}", i + 1)
}

fn topo() -> Topo {
    let mut lab = Lab::new();
    let seg = lab.add_segment("seg");
    let mut nodes = Vec::new();
    let mut macs = Vec::new();
    let mut uplinks = Vec::new();
    for i in 0..3 {
        let n = lab.add_node(&format!("node{}", i + 1));
        let cidrs = [format!("{}/24", node_ip(i)), format!("{}/64", node_ip6(i))];
        let iface = lab.attach(&n, &seg, &[&cidrs[0], &cidrs[1]]);
        let link = n.run(&["cat", &format!("/sys/class/net/{iface}/address")]);
        macs.push(link.trim().to_string());
        uplinks.push(iface);
        // What a CNI's source NAT looks like (Calico natOutgoing, flannel ipMasq).
        let cni = format!(
            "table ip cni {{\n chain post {{\n type nat hook postrouting priority srcnat;\n \
             ip saddr {CLUSTER4} ip daddr != {CLUSTER4} masquerade\n }}\n}}\n\
             table ip6 cni {{\n chain post {{\n type nat hook postrouting priority srcnat;\n \
             ip6 saddr {CLUSTER6} ip6 daddr != {CLUSTER6} masquerade\n }}\n}}\n"
        );
        n.exec_stdin(&["nft", "-f", "-"], &cni).expect("CNI tables");
        nodes.push(n);
    }
    // Each node routes the other nodes' pod subnets over the node subnet.
    for (i, n) in nodes.iter().enumerate() {
        for j in (0..3).filter(|j| *j != i) {
            lab.add_route(n, &format!("10.128.{}.0/24", j + 1), &node_ip(j));
            lab.add_route(n, &format!("fd01:0:0:{}::/64", j + 1), &node_ip6(j));
        }
    }
    let ext = lab.add_host("ext");
    let ext_if = lab.attach(&ext, &seg, &["192.168.50.100/24", "fd00:50::100/64"]);
    // An upstream router that accepts announcements for addresses it has not seen yet (the
    // kernel creates entries from unsolicited NAs only on forwarding interfaces).
    ext.sysctl("net.ipv6.conf.all.forwarding", "1");
    ext.sysctl("net.ipv4.conf.all.arp_accept", "1");
    ext.sysctl(&format!("net.ipv4.conf.{ext_if}.arp_accept"), "1");
    ext.sysctl(&format!("net.ipv6.conf.{ext_if}.accept_untracked_na"), "1");
    let api1 = lab.add_pod(&nodes[0], "api1", &["10.128.1.5", "fd01:0:0:1::5"]);
    let api2 = lab.add_pod(&nodes[1], "api2", &["10.128.2.5", "fd01:0:0:2::5"]);
    let web2 = lab.add_pod(&nodes[1], "web2", &["10.128.2.6", "fd01:0:0:2::6"]);
    let front2 = lab.add_pod(&nodes[1], "front2", &["10.128.2.7", "fd01:0:0:2::7"]);
    let servers = vec![
        ext.tcp_server(EXT4, "ext"),
        ext.tcp_server(EXT6, "ext6"),
        api2.ns.tcp_server("0.0.0.0:9000", "api2"),
    ];
    let t = Topo {
        nodes,
        macs,
        uplinks,
        ext,
        api1,
        api2,
        web2,
        front2,
        dir: tempfile::tempdir().unwrap(),
        _servers: servers,
        _lab: lab,
    };
    t.write_file("cluster.yaml", &t.cluster_doc());
    t
}

fn pod_doc(ns: &str, name: &str, app: &str, node: &str, pod: &Pod) -> String {
    let pod_doc = objects::pod(ns, name).on(node).labels(&[("app", app)]);
    pod_doc.ips(&pod.addrs).to_string()
}

/// Selects pods `app: api` in namespaces `team: backend`.
fn egress_ip_doc(name: &str, ips: &[&str], hosts: &[(&str, &str)]) -> String {
    let eip = objects::egress_ip(name, ips, &[("team", "backend")]).pods(&[("app", "api")]);
    eip.hosted(hosts).to_string()
}

impl Topo {
    fn cluster_doc(&self) -> String {
        let mut docs = Vec::new();
        for i in 0..3 {
            docs.push(format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: node-{}, labels: {{k8s.ovn.org/egress-assignable: ''}}}}\n\
                 status: {{addresses: [{{type: InternalIP, address: '{}'}}, {{type: InternalIP, address: '{}'}}]}}\n",
                i + 1,
                node_ip(i),
                node_ip6(i)
            ));
        }
        docs.push(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: backend, labels: {team: backend}}\n"
                .into(),
        );
        docs.push("apiVersion: v1\nkind: Namespace\nmetadata: {name: frontend, labels: {team: frontend}}\n".into());
        docs.push(pod_doc("backend", "api1", "api", "node-1", &self.api1));
        docs.push(pod_doc("backend", "api2", "api", "node-2", &self.api2));
        docs.push(pod_doc("backend", "web2", "web", "node-2", &self.web2));
        docs.push(pod_doc("frontend", "front2", "api", "node-2", &self.front2));
        docs.join("---\n")
    }

    fn write_file(&self, name: &str, text: &str) {
        lab::write_manifest(self.dir.path(), name, text);
    }

    fn remove_file(&self, name: &str) {
        std::fs::remove_file(self.dir.path().join(name)).unwrap();
    }

    fn host_on(&self, node: &str) {
        let hosts = [(EIP4, node), (EIP6, node)];
        self.write_file("eip.yaml", &egress_ip_doc("backend", &[EIP4, EIP6], &hosts));
    }

    fn spawn_agents(&self) -> Vec<AgentProcess> {
        let dir = self.dir.path().to_str().unwrap();
        (0..3)
            .map(|i| {
                let name = format!("node-{}", i + 1);
                self.nodes[i].spawn_agent(&[
                    "--manifests",
                    dir,
                    "--node-name",
                    &name,
                    "--cluster-cidr",
                    "10.128.0.0/14,fd01::/48",
                    "--service-cidr",
                    "172.30.0.0/16,fd02::/112",
                ])
            })
            .collect()
    }
}

/// An unselected pod (`web2`) leaves with its node's address (the CNI's masquerade), and
/// pod to pod across nodes is neither SNATed nor steered.
#[track_caller]
fn assert_unselected_and_cluster_traffic_untouched(t: &Topo) {
    assert_eq!(source_seen(&t.web2, false).unwrap().to_string(), node_ip(1));
    let reply = t
        .api1
        .ns
        .tcp_connect("10.128.2.5:9000", SECOND)
        .expect_reply();
    assert_eq!(reply.src_ip(), t.api1.ip());
}

/// The source address the external server saw for a new connection from `pod` (v4 or v6).
fn source_seen(pod: &Pod, v6: bool) -> Result<IpAddr, String> {
    let (dst, ok) = if v6 { (EXT6, "ext6") } else { (EXT4, "ext") };
    match pod.ns.tcp_connect(dst, SECOND) {
        lab::Outcome::Reply(r) if r.server == ok => Ok(r.src_ip()),
        other => Err(format!("{} -> {dst}: {other:?}", pod.ns.name())),
    }
}

#[track_caller]
fn eventually_source(pod: &Pod, v6: bool, want: &str, within: Duration) {
    let want: IpAddr = want.parse().unwrap();
    eventually(within, || match source_seen(pod, v6) {
        Ok(ip) if ip == want => Ok(()),
        Ok(ip) => Err(format!(
            "{}: external host saw {ip}, want {want}",
            pod.ns.name()
        )),
        Err(e) => Err(e),
    });
}

fn has_addr(ns: &Ns, ip: &str) -> bool {
    ns.run(&["ip", "-o", "addr", "show"])
        .split_whitespace()
        .any(|w| w.split('/').next() == Some(ip))
}

/// The MAC the host's neighbour table holds for `ip` (any state but FAILED/INCOMPLETE).
fn neighbour_mac(ns: &Ns, ip: &str) -> Option<String> {
    let out = ns.run(&["ip", "neigh", "show", ip]);
    let mut words = out.split_whitespace().skip_while(|w| *w != "lladdr");
    words.nth(1).map(str::to_string)
}

/// Everything of the agent's EgressIP state on a node, as text (empty when nothing is left):
/// marked addresses, the tunnel, marked rules and routes, and the EgressIP map elements.
fn eip_state(ns: &Ns) -> String {
    let mut out = String::new();
    for ip in [EIP4, EIP6] {
        if has_addr(ns, ip) {
            out.push_str(&format!("address {ip}\n"));
        }
    }
    if ns.exec(&["ip", "link", "show", "np-eip"]).is_ok() {
        out.push_str("link np-eip\n");
    }
    for fam in ["-4", "-6"] {
        let rules = ns.run(&["ip", fam, "rule", "show"]);
        out.extend(
            rules
                .lines()
                .filter(|l| l.contains("proto 110"))
                .map(|l| format!("{l}\n")),
        );
        let routes = ns.run(&["ip", fam, "route", "show", "table", "all", "proto", "110"]);
        out.push_str(&routes);
    }
    if let Ok(table) = ns.nft(&["list", "table", "inet", "nodeplane"]) {
        let mut in_eip_map = false;
        for line in table.lines() {
            if line.trim_start().starts_with("map eip-") {
                in_eip_map = true;
            } else if line.trim() == "}" {
                in_eip_map = false;
            } else if in_eip_map && line.contains("elements") {
                out.push_str(&format!("{line}\n"));
            }
        }
    }
    out
}

#[test]
pub(crate) fn egress_ip_snat_steering_announcement_move_delete_and_cleanup() {
    let t = topo();
    // A second object whose IP no node subnet contains: reported, and harmless to the rest.
    t.write_file(
        "bad.yaml",
        &egress_ip_doc("nowhere", &["192.168.99.1"], &[("192.168.99.1", "node-1")]),
    );
    t.host_on("node-1");
    let agents = t.spawn_agents();
    let node1 = &t.nodes[0];

    // The announcement alone teaches the external host where the egress IP lives: no packet
    // has been sent to it yet.
    eventually(CONVERGE * 2, || {
        has_addr(node1, EIP4)
            .then_some(())
            .ok_or_else(|| "node-1 has no egress IP yet".to_string())
    });
    let mac1 = t.macs[0].clone();
    eventually(SECOND, || {
        match (neighbour_mac(&t.ext, EIP4), neighbour_mac(&t.ext, EIP6)) {
            (Some(a), Some(b)) if a == mac1 && b == mac1 => Ok(()),
            other => Err(format!("ext neighbours {other:?}, want {mac1}")),
        }
    });

    // Hosting node: its own pod leaves with the egress IP, through the CNI masquerade.
    eventually_source(&t.api1, false, EIP4, CONVERGE);
    // Other node: steered through the tunnel with its pod address, SNATed on node-1.
    eventually_source(&t.api2, false, EIP4, CONVERGE);
    assert_unselected_and_cluster_traffic_untouched(&t);
    assert_eq!(
        source_seen(&t.front2, false).unwrap().to_string(),
        node_ip(1)
    );
    // IPv6: same paths.
    eventually_source(&t.api1, true, EIP6, CONVERGE);
    eventually_source(&t.api2, true, EIP6, CONVERGE);
    assert_eq!(source_seen(&t.web2, true).unwrap().to_string(), node_ip6(1));

    // The invalid object is reported by the node asked to host it; nothing else suffers.
    eventually(CONVERGE, || {
        let logs = agents[0].logs();
        logs.contains("EgressIP nowhere")
            .then_some(())
            .filter(|_| {
                logs.contains("spec.egressIPs[0]: 192.168.99.1: no interface subnet contains it")
            })
            .ok_or_else(|| format!("node-1 log does not report the bad object:\n{logs}"))
    });

    // Move both IPs to node-3: node-1 lets go, node-3 takes over, both pods follow.
    let moved = Instant::now();
    t.host_on("node-3");
    eventually(CONVERGE, || {
        let gone = !has_addr(node1, EIP4) && !has_addr(node1, EIP6);
        let there = has_addr(&t.nodes[2], EIP4) && has_addr(&t.nodes[2], EIP6);
        (gone && there)
            .then_some(())
            .ok_or("addresses not moved".to_string())
    });
    let mac3 = t.macs[2].clone();
    eventually(CONVERGE, || match neighbour_mac(&t.ext, EIP4) {
        Some(m) if m == mac3 => Ok(()),
        other => Err(format!(
            "ext still has {other:?} for the egress IP, want {mac3}"
        )),
    });
    eventually_source(&t.api1, false, EIP4, CONVERGE);
    eventually_source(&t.api2, false, EIP4, CONVERGE);
    eventually_source(&t.api1, true, EIP6, CONVERGE);
    // Each step above waited at most CONVERGE; the total is printed, not asserted.
    eprintln!(
        "egress IP move node-1 -> node-3 converged in {:?}",
        moved.elapsed()
    );
    // node-1 kept no SNAT element for the IP; it only steers now.
    let n1 = eip_state(node1);
    assert!(!n1.contains("address"), "{n1}");

    // Delete the EgressIPs: nothing of them remains anywhere.
    t.remove_file("eip.yaml");
    t.remove_file("bad.yaml");
    for n in &t.nodes {
        eventually(CONVERGE, || {
            let left = eip_state(n);
            left.is_empty()
                .then_some(())
                .ok_or_else(|| format!("{} still has:\n{left}", n.name()))
        });
    }
    assert_eq!(source_seen(&t.api2, false).unwrap().to_string(), node_ip(1));

    // Recreate, stop the agents (rules stay), and `agent cleanup` removes it all.
    t.host_on("node-2");
    eventually(CONVERGE, || {
        let s = eip_state(&t.nodes[1]);
        s.contains("address").then_some(()).ok_or(s)
    });
    eventually_source(&t.api1, false, EIP4, CONVERGE);
    for a in agents {
        a.stop_ok();
    }
    assert!(
        !eip_state(node1).is_empty(),
        "SIGTERM leaves the state in place"
    );
    for n in &t.nodes {
        n.run_agent(&["cleanup"]).expect("agent cleanup");
        let left = eip_state(n);
        assert!(left.is_empty(), "{} after cleanup:\n{left}", n.name());
        assert!(n.nft(&["list", "table", "inet", "nodeplane"]).is_err());
    }
}

#[test]
fn several_hosting_nodes_each_flow_leaves_through_one_of_them() {
    let t = topo();
    let eip2 = "192.168.50.201";
    t.write_file(
        "eip.yaml",
        &egress_ip_doc(
            "backend",
            &[EIP4, eip2],
            &[(EIP4, "node-1"), (eip2, "node-3")],
        ),
    );
    // Hash flows by ports too (the default hashes addresses only, so one pod talking to one
    // host would always take the same path): an operator's choice, not the agent's.
    t.nodes[1].sysctl("net.ipv4.fib_multipath_hash_policy", "1");
    let _agents = t.spawn_agents();
    eventually_source(&t.api1, false, EIP4, CONVERGE * 2);
    eventually(CONVERGE, || {
        has_addr(&t.nodes[2], eip2)
            .then_some(())
            .ok_or("node-3 has no egress IP yet".to_string())
    });
    let allowed: [IpAddr; 2] = [EIP4.parse().unwrap(), eip2.parse().unwrap()];
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let src = eventually(CONVERGE, || source_seen(&t.api2, false));
        assert!(allowed.contains(&src), "api2 left as {src}");
        seen.insert(src);
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "40 flows all took one path: {seen:?}");
    // The hosting node's own pod uses the local egress IP.
    for _ in 0..5 {
        assert_eq!(source_seen(&t.api1, false).unwrap().to_string(), EIP4);
    }
}

/// The packet count of the first `counter` in `chain` of the agent's table on `ns`.
fn chain_packets(ns: &Ns, chain: &str) -> u64 {
    let text = ns
        .nft(&["list", "chain", "inet", "nodeplane", chain])
        .unwrap_or_default();
    let mut words = text.split_whitespace().skip_while(|w| *w != "packets");
    words.nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn replies_to_connections_opened_from_outside_are_not_steered() {
    let t = topo();
    // The external host reaches api2 directly (a routed pod network, or what a NodePort
    // with externalTrafficPolicy Local leaves after DNAT): api2 answers from its address.
    t.ext
        .run(&["ip", "route", "add", "10.128.2.0/24", "via", &node_ip(1)]);
    t.host_on("node-1");
    let _agents = t.spawn_agents();
    // api2 is steered through node-1 for the connections it opens.
    eventually_source(&t.api2, false, EIP4, CONVERGE * 2);
    let steered = chain_packets(&t.nodes[1], "eip-steer-0");
    assert!(steered > 0, "api2's own connection was steered");
    for _ in 0..3 {
        // The reply (SYN-ACK, data) comes from the pod address, not the egress IP: steering
        // it to node-1 would have it SNATed there or lost.
        match t.ext.tcp_connect("10.128.2.5:9000", SECOND) {
            lab::Outcome::Reply(r) => {
                assert_eq!(r.server, "api2");
                assert_eq!(r.src_ip().to_string(), "192.168.50.100", "no SNAT inbound");
            }
            other => panic!("ext -> api2: {other:?}"),
        }
    }
    assert_eq!(
        chain_packets(&t.nodes[1], "eip-steer-0"),
        steered,
        "no reply packet was steered"
    );
    // And the pod's own connections still are.
    eventually_source(&t.api2, false, EIP4, CONVERGE);
}

#[test]
fn an_egress_ip_on_an_unreachable_node_fails_closed() {
    let t = topo();
    // A leaked packet with the pod's address would get its answer.
    t.ext
        .run(&["ip", "route", "add", "10.128.2.0/24", "via", &node_ip(1)]);
    // node-9 has no Node object: no node can tunnel to it.
    t.write_file(
        "eip.yaml",
        &egress_ip_doc("backend", &[EIP4], &[(EIP4, "node-9")]),
    );
    let agents = t.spawn_agents();
    eventually(CONVERGE * 2, || {
        let s = eip_state(&t.nodes[1]);
        s.contains("eip-unreachable")
            .then_some(())
            .ok_or_else(|| format!("node-2 has not failed closed yet:\n{s}"))
    });
    // Neither leaves: not with the pod address, not with the node's (as if not selected).
    for pod in [&t.api2, &t.api1] {
        let out = pod.ns.tcp_connect(EXT4, SECOND);
        assert_eq!(out, lab::Outcome::Timeout, "{}", pod.ns.name());
    }
    assert!(chain_packets(&t.nodes[1], "eip-unreachable") > 0);
    assert_unselected_and_cluster_traffic_untouched(&t);
    // IPv6 has no egress IP assigned: it leaves as without EgressIP (the documented case).
    assert_eq!(source_seen(&t.api2, true).unwrap().to_string(), node_ip6(1));
    // Reported, naming the node.
    eventually(CONVERGE, || {
        let logs = agents[1].logs();
        logs.contains("is assigned to node node-9, which node node-2 cannot reach")
            .then_some(())
            .ok_or_else(|| format!("node-2 log:\n{logs}"))
    });
}

/// Sets `net.ipv4.conf.{all,default,<uplink>}.rp_filter` to `value` on every node (as a
/// RHEL-family or CIS-hardened host has them: an operator's choice, never the agent's).
fn set_rp_filter(t: &Topo, value: &str) {
    for (node, uplink) in t.nodes.iter().zip(&t.uplinks) {
        for dev in ["all", "default", uplink.as_str()] {
            node.sysctl(&format!("net.ipv4.conf.{dev}.rp_filter"), value);
        }
    }
}

/// `(all, default, uplink)` rp_filter of each node, as text.
fn rp_filters(t: &Topo) -> Vec<String> {
    let read = |node: &Ns, dev: &str| {
        node.run(&["cat", &format!("/proc/sys/net/ipv4/conf/{dev}/rp_filter")])
            .trim()
            .to_string()
    };
    t.nodes
        .iter()
        .zip(&t.uplinks)
        .map(|(n, up)| format!("{} {} {}", read(n, "all"), read(n, "default"), read(n, up)))
        .collect()
}

/// Steering to node-1 works with reverse-path filtering `value` in `all`, `default` and
/// the uplink on every node, and the agent changes none of those host-wide settings.
fn steering_with_rp_filter(value: &str) {
    let t = topo();
    set_rp_filter(&t, value);
    let before = rp_filters(&t);
    t.host_on("node-1");
    let agents = t.spawn_agents();
    eventually_source(&t.api1, false, EIP4, CONVERGE * 2);
    // api2 on node-2 is steered over the tunnel: node-1's reverse-path check sees it.
    eventually_source(&t.api2, false, EIP4, CONVERGE * 2);
    for _ in 0..5 {
        assert_eq!(source_seen(&t.api2, false).unwrap().to_string(), EIP4);
    }
    eventually_source(&t.api2, true, EIP6, CONVERGE);
    assert_unselected_and_cluster_traffic_untouched(&t);
    assert_eq!(
        rp_filters(&t),
        before,
        "host-wide rp_filter settings changed"
    );
    // The tunnel's own settings, which the agent set through netlink.
    let conf = |key: &str| {
        let path = format!("/proc/sys/net/ipv4/conf/np-eip/{key}");
        t.nodes[0].run(&["cat", &path]).trim().to_string()
    };
    assert_eq!(
        (conf("rp_filter"), conf("src_valid_mark")),
        ("0".into(), "1".into())
    );
    for a in agents {
        a.stop_ok();
    }
}

#[test]
fn steering_with_rp_filter_off() {
    steering_with_rp_filter("0");
}

#[test]
pub(crate) fn steering_with_strict_rp_filter() {
    steering_with_rp_filter("1");
}

#[test]
fn steering_with_loose_rp_filter() {
    steering_with_rp_filter("2");
}

/// The VXLAN packets `ns` received on its segment interface (the one holding `underlay`),
/// counted by a netdev ingress table of the test's own: `(outer DSCP 46, any other DSCP)`.
fn outer_dscp_counts(ns: &Ns) -> (u64, u64) {
    let text = ns
        .nft(&["list", "table", "netdev", "probe"])
        .unwrap_or_default();
    let packets = |tag: &str| {
        let line = text.lines().find(|l| l.contains(tag)).unwrap_or_default();
        let mut words = line.split_whitespace().skip_while(|w| *w != "packets");
        words.nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    (packets("\"dscp-46\""), packets("\"dscp-other\""))
}

/// EgressQoS marks a pod's packets before the EgressIP steering tunnels them to the hosting
/// node; the tunnel copies the inner DSCP into the outer header (`tos inherit`, as
/// OVN-Kubernetes' Geneve does), so a network that prioritises by DSCP keeps the class on
/// the hop between the nodes.
#[test]
fn egress_qos_dscp_crosses_the_underlay_in_the_tunnel_header() {
    let t = topo();
    t.host_on("node-1");
    t.write_file(
        "qos.yaml",
        &objects::egress_qos("backend", "[{dscp: 46}]").to_string(),
    );
    let node1 = &t.nodes[0];
    let listing = node1.run(&["ip", "-o", "-4", "addr", "show", "to", &node_ip(0)]);
    let uplink = listing.split_whitespace().nth(1).expect("node-1's uplink");
    let probe = format!(
        "table netdev probe {{\n chain in {{\n type filter hook ingress device \"{uplink}\" \
         priority 0;\n udp dport 4789 ip dscp 46 counter comment \"dscp-46\"\n \
         udp dport 4789 ip dscp != 46 counter comment \"dscp-other\"\n }}\n}}\n"
    );
    node1
        .exec_stdin(&["nft", "-f", "-"], &probe)
        .expect("probe table");
    let _agents = t.spawn_agents();
    // api2 (node-2) is steered through the tunnel to node-1.
    eventually_source(&t.api2, false, EIP4, CONVERGE * 2);
    for _ in 0..5 {
        assert_eq!(source_seen(&t.api2, false).unwrap().to_string(), EIP4);
    }
    let (marked, other) = outer_dscp_counts(node1);
    assert!(
        marked >= 5 && other == 0,
        "tunnel packets on the segment: {marked} with outer DSCP 46, {other} with another"
    );
}

/// A NetworkPolicy in force on the hosting node (here one isolating the api pods for ingress,
/// api1 on node-1) turns on the pods' source check; traffic steered in over the tunnel comes from another node's pod and
/// must still pass it on the hosting node, IPv4 and IPv6.
#[test]
fn steering_passes_the_network_policy_source_check() {
    let t = topo();
    t.host_on("node-1");
    let policy = objects::network_policy(
        "backend",
        "isolate-api",
        "  podSelector: {matchLabels: {app: api}}\n  policyTypes: [Ingress]\n",
    );
    t.write_file("netpol.yaml", &policy.to_string());
    let agents = t.spawn_agents();
    for v6 in [false, true] {
        let want = if v6 { EIP6 } else { EIP4 };
        eventually_source(&t.api2, v6, want, CONVERGE * 2);
    }
    let table = t.nodes[0]
        .nft(&["list", "table", "inet", "nodeplane"])
        .expect("node-1's table");
    assert!(
        table.contains("fib saddr . "),
        "no source check in force on node-1:\n{table}"
    );
    for a in agents {
        a.stop_ok();
    }
}

/// A VXLAN datagram for the EgressIP tunnel of the node at `underlay`, carrying a UDP
/// datagram from `src` to `dst:port` (the inner frame addressed to that node's tunnel MAC).
fn forged_vxlan(underlay: &str, src: [u8; 4], dst: [u8; 4], port: u16) -> Vec<u8> {
    use nodeplane::plan::egress_ip::{TUNNEL_VNI, tunnel_mac};
    let payload = b"forged";
    let udp_len = 8 + payload.len() as u16;
    let ip_len = 20 + udp_len;
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut frame = vec![0x08, 0, 0, 0];
    frame.extend_from_slice(&(TUNNEL_VNI << 8).to_be_bytes());
    frame.extend_from_slice(&tunnel_mac(underlay.parse().unwrap()));
    frame.extend_from_slice(&tunnel_mac("192.168.50.12".parse().unwrap()));
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&5555u16.to_be_bytes());
    frame.extend_from_slice(&port.to_be_bytes());
    frame.extend_from_slice(&udp_len.to_be_bytes());
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(payload);
    frame
}

/// The EgressIP tunnel takes packets from nodes only. Otherwise a pod on another node (or a
/// host on the segment) sends VXLAN to the hosting node's port 4789 with an inner packet
/// whose source is a selected pod of another tenant, and the node SNATs it to that tenant's
/// egress IP: its traffic leaves with someone else's identity (the tunnel is exempt from the
/// source checks: its packets are checked on their own node).
#[test]
fn the_egress_ip_tunnel_takes_packets_from_nodes_only() {
    use std::net::UdpSocket;
    let t = topo();
    t.host_on("node-1");
    let agents = t.spawn_agents();
    eventually_source(&t.api2, false, EIP4, CONVERGE * 2);
    let sink = t.ext.enter(|| {
        let s = UdpSocket::bind("0.0.0.0:7777").expect("bind in ext");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s
    });
    // Inner source api2 (selected, on node-2), to the external host.
    let forged = forged_vxlan(&node_ip(0), [10, 128, 2, 5], [192, 168, 50, 100], 7777);
    let to = format!("{}:4789", node_ip(0));
    for sender in [&t.web2.ns, &t.ext] {
        sender.enter(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..20 {
                s.send_to(&forged, &to).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let mut buf = [0u8; 64];
        let got = sink.recv_from(&mut buf);
        assert!(
            got.is_err(),
            "{}'s forged datagram left node-1 through the tunnel: {got:?}",
            sender.name()
        );
    }
    // The nodes' own tunnel traffic still flows.
    eventually_source(&t.api2, false, EIP4, CONVERGE * 2);
    for a in agents {
        a.stop_ok();
    }
}
