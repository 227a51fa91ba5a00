//! NetworkPolicy for bridged pods: pods on one L2 bridge (`br0`, 10.128.5.0/24) in the node
//! netns, as bridge CNIs attach them. With `br_netfilter` (`net.bridge.bridge-nf-call-iptables`
//! and `-ip6tables`, per netns on this kernel) bridged IP traffic passes the inet forward hook
//! and policies apply; without it an inet table never sees that traffic, so policies do not
//! apply: the documented limit (README "NetworkPolicy"), checked here so the text stays true.

use nodeplane::testing::lab::{Endpoint, Lab, ManifestAgent, Ns, Probe, Server, assert_truth};
use nodeplane::testing::objects;

const NODE: &str = "node-1";
/// (name, IPv4, IPv6); pod `a` is isolated by the policy.
const PODS: [(&str, &str, &str); 3] = [
    ("a", "10.128.5.2", "fd01:5::2"),
    ("b", "10.128.5.3", "fd01:5::3"),
    ("c", "10.128.5.4", "fd01:5::4"),
];

struct Bridged {
    node: Ns,
    pods: Vec<Endpoint>,
    pods6: Vec<Endpoint>,
    _agent: ManifestAgent,
    _servers: Vec<Server>,
    _lab: Lab,
}

fn bridged() -> Bridged {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    node.run(&["ip", "link", "add", "br0", "type", "bridge"]);
    node.run(&["ip", "link", "set", "br0", "up"]);
    node.run(&["ip", "addr", "add", "10.128.5.1/24", "dev", "br0"]);
    node.run(&["ip", "addr", "add", "fd01:5::1/64", "dev", "br0", "nodad"]);
    let (mut pods, mut pods6, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (name, v4, v6)) in PODS.into_iter().enumerate() {
        let pod = lab.add_host(&format!("pod-{name}"));
        let veth = format!("veth{i}");
        node.run(&[
            "ip",
            "link",
            "add",
            &veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        node.run(&["ip", "link", "set", &veth, "master", "br0", "up"]);
        pod.run(&["ip", "addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
        pod.run(&[
            "ip",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        pod.run(&["ip", "link", "set", "eth0", "up"]);
        servers.push(pod.tcp_server("[::]:80", name));
        for (list, addr) in [(&mut pods, v4), (&mut pods6, v6)] {
            list.push(Endpoint {
                name: name.to_string(),
                ns: pod.clone(),
                addr: addr.parse().unwrap(),
            });
        }
    }
    let agent = ManifestAgent::new(&node, NODE, &[]);
    let mut docs: Vec<String> = PODS
        .iter()
        .map(|(name, v4, v6)| {
            let pod = objects::pod("x", name)
                .on(NODE)
                .labels(&[("pod", name)])
                .ips(&[v4, v6]);
            pod.to_string()
        })
        .collect();
    docs.push(
        objects::network_policy(
            "x",
            "only-b-to-a",
            "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]\n",
        )
        .to_string(),
    );
    agent.write("cluster.yaml", &docs.join("---\n"));
    agent.once(&[]);
    Bridged {
        node,
        pods,
        pods6,
        _agent: agent,
        _servers: servers,
        _lab: lab,
    }
}

fn br_netfilter(node: &Ns, on: bool) {
    let v = if on { "1" } else { "0" };
    node.sysctl("net.bridge.bridge-nf-call-iptables", v);
    node.sysctl("net.bridge.bridge-nf-call-ip6tables", v);
}

#[test]
fn bridged_pods_are_enforced_with_br_netfilter() {
    let b = bridged();
    br_netfilter(&b.node, true);
    let allowed = |from: &str, to: &str| from == to || to != "a" || from == "b";
    assert_truth(
        "bridged, br_netfilter",
        &b.pods,
        &b.pods,
        Probe::Tcp(80),
        allowed,
    );
    assert_truth(
        "bridged, br_netfilter, IPv6",
        &b.pods6,
        &b.pods6,
        Probe::Tcp(80),
        allowed,
    );
    // Without br_netfilter the inet hooks never see bridged frames: the documented limit.
    br_netfilter(&b.node, false);
    assert_truth(
        "bridged, no br_netfilter",
        &b.pods,
        &b.pods,
        Probe::Tcp(80),
        |_, _| true,
    );
}
