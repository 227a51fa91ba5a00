//! Topologies of named netns: nodes, pods behind them, external hosts, shared L2 segments.
//!
//! Every interface is created directly inside its netns (`ip -n A link add .. peer .. netns B`),
//! so it never exists in the root netns and its name cannot collide with a parallel test; the
//! netns names carry the lab's unique prefix.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::netns::{self, CmdError, Ns};

/// Gateway addresses every pod uses, so pods need no per-node subnet and the node routes each
/// pod by a /32 or /128. The node owns the v4 one on `lo` with scope link: it answers the pod's
/// ARP (arp_ignore=0) but is never picked as the source of node-to-pod traffic (the node's real
/// address is). The v6 one is a link-local address on each node-side veth.
pub const POD_GW4: &str = "169.254.1.1";
pub const POD_GW6: &str = "fe80::1";

/// A pod netns behind a node, on a veth pair.
#[derive(Clone, Debug)]
pub struct Pod {
    pub ns: Ns,
    pub node: Ns,
    pub addrs: Vec<IpAddr>,
    /// Interface in the pod netns (`eth0`).
    pub iface: String,
    /// The peer veth in the node netns.
    pub host_iface: String,
}

impl Pod {
    /// The Pod object of this lab pod for a manifests directory: `namespace/name` on `node`
    /// with the pod's addresses.
    pub fn manifest(&self, namespace: &str, name: &str, node: &str) -> String {
        crate::testing::objects::pod(namespace, name)
            .on(node)
            .ips(&self.addrs)
            .to_string()
    }

    /// The pod's first IPv4 (or else first) address.
    pub fn ip(&self) -> IpAddr {
        let v4 = self.addrs.iter().find(|a| a.is_ipv4());
        *v4.or(self.addrs.first()).expect("pod has an address")
    }

    pub fn ip6(&self) -> Option<IpAddr> {
        self.addrs.iter().copied().find(IpAddr::is_ipv6)
    }
}

/// A Linux bridge in a node netns with pods on its ports (as bridge CNIs attach them): the
/// node's addresses on it are the pods' gateways.
#[derive(Clone, Debug)]
pub struct Bridge {
    pub node: Ns,
    pub name: String,
    /// The gateway addresses (the node's, without prefix length).
    pub gateways: Vec<IpAddr>,
}

/// How a node attaches its pods, for tests that must hold on each (`Topology::ALL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// /32 and /128 routes to each pod's veth, as routed CNIs attach them.
    Routed,
    /// Pods on a Linux bridge `br0` (the node its pods' gateway), with `br_netfilter` on or
    /// off in the node.
    Bridged { br_netfilter: bool },
}

impl Topology {
    pub const ALL: [Topology; 3] = [
        Topology::Routed,
        Topology::Bridged {
            br_netfilter: false,
        },
        Topology::Bridged { br_netfilter: true },
    ];
}

/// Where a node's pods attach under a [`Topology`] ([`Lab::pod_network`]; pods join with
/// [`Lab::add_pod_in`]).
#[derive(Clone, Debug)]
pub struct PodNetwork {
    pub node: Ns,
    pub topology: Topology,
    /// The bridge of bridged pods and the prefix lengths of its subnets.
    bridge: Option<(Bridge, Vec<String>)>,
}

/// A shared L2 segment: a bridge device in its own netns.
#[derive(Clone, Debug)]
pub struct Segment {
    pub ns: Ns,
    pub bridge: String,
}

/// The two ends of a point-to-point veth between two netns.
#[derive(Clone, Debug)]
pub struct Link {
    pub a_iface: String,
    pub b_iface: String,
}

/// Owns every netns it created and deletes them on drop (also during a panic unwind).
pub struct Lab {
    prefix: String,
    created: Vec<Ns>,
    iface_counters: HashMap<(String, &'static str), u32>,
    nodes_with_gw4: HashSet<Ns>,
    _pass: netns::Shared,
}

impl Lab {
    /// Panics if kernel tests cannot run here (not root, no `ip netns`): never skips.
    pub fn new() -> Lab {
        netns::require_environment();
        Lab {
            prefix: netns::unique_prefix(),
            created: Vec::new(),
            iface_counters: HashMap::new(),
            nodes_with_gw4: HashSet::new(),
            _pass: netns::shared(),
        }
    }

    /// Unique per lab, e.g. `np1k3x0`; every netns name is `<prefix>-<role>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Names of all netns created so far.
    pub fn namespaces(&self) -> Vec<String> {
        self.created.iter().map(|n| n.name().to_string()).collect()
    }

    /// Runs a command inside `ns` (see `Ns::exec`).
    pub fn exec(&self, ns: &Ns, argv: &[&str]) -> Result<String, CmdError> {
        ns.exec(argv)
    }

    /// A plain host netns (external server/client): loopback up, nothing else.
    pub fn add_host(&mut self, role: &str) -> Ns {
        assert!(
            !role.is_empty() && role.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "lab role {role:?}: use [A-Za-z0-9-]"
        );
        let ns = Ns::new(format!("{}-{role}", self.prefix));
        assert!(!self.created.contains(&ns), "lab role {role:?} used twice");
        // Registered before creation so that Drop removes it even if setup fails midway.
        self.created.push(ns.clone());
        netns::create(ns.name()).unwrap_or_else(|e| panic!("create netns: {e}"));
        // Like a stale netns, a stale state directory can only be a killed earlier process's.
        let _ = std::fs::remove_dir_all(ns.state_dir());
        // No DAD: test addresses must be usable immediately, not "tentative".
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0");
        ns
    }

    /// A host netns `ref` holding `ruleset` (applied by `nft -f`): what a node's tables are
    /// compared with when a ruleset the agent printed must be what it applies.
    pub fn add_reference(&mut self, ruleset: &str) -> Ns {
        let reference = self.add_host("ref");
        reference
            .exec_stdin(&["nft", "-f", "-"], ruleset)
            .expect("nft -f accepts the ruleset");
        reference
    }

    /// A node netns: a host with IPv4 and IPv6 forwarding on.
    pub fn add_node(&mut self, role: &str) -> Ns {
        let ns = self.add_host(role);
        ns.sysctl("net.ipv4.ip_forward", "1");
        ns.sysctl("net.ipv6.conf.all.forwarding", "1");
        ns
    }

    /// A pod netns behind `node` with `addrs` (bare IPs, v4 and/or v6) on `eth0`, a default
    /// route via the node-side veth, and /32 or /128 routes to it in the node.
    pub fn add_pod(&mut self, node: &Ns, role: &str, addrs: &[&str]) -> Pod {
        let addrs: Vec<IpAddr> = addrs
            .iter()
            .map(|a| {
                a.parse()
                    .unwrap_or_else(|e| panic!("pod address {a:?}: {e}"))
            })
            .collect();
        assert!(!addrs.is_empty(), "pod {role} needs an address");
        let ns = self.add_host(role);
        let host_iface = self.next_iface(node, "veth");
        veth(node, &host_iface, &ns, "eth0");
        let has4 = addrs.iter().any(IpAddr::is_ipv4);
        let has6 = addrs.iter().any(IpAddr::is_ipv6);
        if has4 && self.nodes_with_gw4.insert(node.clone()) {
            let gw = format!("{POD_GW4}/32");
            node.run(&["ip", "addr", "add", &gw, "dev", "lo", "scope", "link"]);
        }
        if has4 {
            ns.run(&[
                "ip", "route", "add", POD_GW4, "dev", "eth0", "scope", "link",
            ]);
            ns.run(&[
                "ip", "route", "add", "default", "via", POD_GW4, "dev", "eth0",
            ]);
        }
        if has6 {
            let gw = format!("{POD_GW6}/64");
            node.run(&["ip", "addr", "add", &gw, "dev", &host_iface, "nodad"]);
            ns.run(&[
                "ip", "-6", "route", "add", "default", "via", POD_GW6, "dev", "eth0",
            ]);
        }
        for a in &addrs {
            let host = if a.is_ipv4() {
                format!("{a}/32")
            } else {
                format!("{a}/128")
            };
            add_addrs(&ns, "eth0", &[&host]);
            node.run(&["ip", "route", "add", &host, "dev", &host_iface]);
        }
        Pod {
            ns,
            node: node.clone(),
            addrs,
            iface: "eth0".into(),
            host_iface,
        }
    }

    /// A bridge `name` in `node` carrying `cidrs` (e.g. "10.128.0.1/24": the node is the
    /// gateway of the pods on it).
    pub fn add_bridge(&mut self, node: &Ns, name: &str, cidrs: &[&str]) -> Bridge {
        node.run(&["ip", "link", "add", name, "type", "bridge"]);
        node.run(&["ip", "link", "set", name, "up"]);
        add_addrs(node, name, cidrs);
        let gateways = cidr_addresses(cidrs, "bridge");
        Bridge {
            node: node.clone(),
            name: name.to_string(),
            gateways,
        }
    }

    /// A pod netns on a port of `bridge`: `cidrs` (address/prefix in the bridge's subnets)
    /// on `eth0`, default routes via the bridge's gateways. No per-pod routes in the node:
    /// the bridge's subnet covers the pod.
    pub fn add_bridged_pod(&mut self, bridge: &Bridge, role: &str, cidrs: &[&str]) -> Pod {
        let ns = self.add_host(role);
        let host_iface = self.next_iface(&bridge.node, "veth");
        veth(&bridge.node, &host_iface, &ns, "eth0");
        bridge
            .node
            .run(&["ip", "link", "set", &host_iface, "master", &bridge.name]);
        add_addrs(&ns, "eth0", cidrs);
        for gw in &bridge.gateways {
            let gw = gw.to_string();
            ns.run(&["ip", "route", "add", "default", "via", &gw, "dev", "eth0"]);
        }
        let addrs = cidr_addresses(cidrs, "pod");
        Pod {
            ns,
            node: bridge.node.clone(),
            addrs,
            iface: "eth0".into(),
            host_iface,
        }
    }

    /// `node`'s pods attached as `topology` says: routed, or on a bridge `br0` carrying
    /// `gateways` (e.g. "10.128.0.1/16", one per family), `br_netfilter` set as asked.
    pub fn pod_network(&mut self, node: &Ns, topology: Topology, gateways: &[&str]) -> PodNetwork {
        let bridge = match topology {
            Topology::Routed => None,
            Topology::Bridged { br_netfilter } => {
                let bridge = self.add_bridge(node, "br0", gateways);
                set_br_netfilter(node, br_netfilter);
                let prefixes = gateways
                    .iter()
                    .map(|g| g.split_once('/').map_or("", |(_, p)| p).to_string())
                    .collect();
                Some((bridge, prefixes))
            }
        };
        PodNetwork {
            node: node.clone(),
            topology,
            bridge,
        }
    }

    /// A pod in `net` with `addrs` (bare IPs): routed ([`Lab::add_pod`]) or on the bridge
    /// with the prefix length of its gateway of the same family ([`Lab::add_bridged_pod`]).
    pub fn add_pod_in(&mut self, net: &PodNetwork, role: &str, addrs: &[&str]) -> Pod {
        let Some((bridge, prefixes)) = &net.bridge else {
            return self.add_pod(&net.node, role, addrs);
        };
        let cidrs: Vec<String> = addrs
            .iter()
            .map(|a| {
                let v6 = a.contains(':');
                let at = bridge.gateways.iter().position(|g| g.is_ipv6() == v6);
                let prefix = at.unwrap_or_else(|| panic!("no gateway on br0 for pod address {a}"));
                format!("{a}/{}", prefixes[prefix])
            })
            .collect();
        let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
        self.add_bridged_pod(bridge, role, &cidrs)
    }

    /// A shared L2 segment (bridge `br0` in its own netns); join hosts with `attach`.
    pub fn add_segment(&mut self, role: &str) -> Segment {
        let ns = self.add_host(role);
        ns.run(&["ip", "link", "add", "br0", "type", "bridge"]);
        ns.run(&["ip", "link", "set", "br0", "up"]);
        Segment {
            ns,
            bridge: "br0".into(),
        }
    }

    /// Plugs `host` into `seg` with a new `ethN` carrying `cidrs` (e.g. "192.168.1.10/24");
    /// returns the interface name in `host`.
    pub fn attach(&mut self, host: &Ns, seg: &Segment, cidrs: &[&str]) -> String {
        let iface = self.next_iface(host, "eth");
        let port = self.next_iface(&seg.ns, "port");
        veth(host, &iface, &seg.ns, &port);
        seg.ns
            .run(&["ip", "link", "set", &port, "master", &seg.bridge]);
        add_addrs(host, &iface, cidrs);
        iface
    }

    /// A point-to-point veth between `a` and `b` (`ethN` on each side) with the given CIDRs.
    pub fn link(&mut self, a: &Ns, a_cidrs: &[&str], b: &Ns, b_cidrs: &[&str]) -> Link {
        let a_iface = self.next_iface(a, "eth");
        let b_iface = self.next_iface(b, "eth");
        veth(a, &a_iface, b, &b_iface);
        add_addrs(a, &a_iface, a_cidrs);
        add_addrs(b, &b_iface, b_cidrs);
        Link { a_iface, b_iface }
    }

    /// An external host `role` on a point-to-point uplink of `node`: node 192.168.1.1/24 and
    /// fd00:1::1/64, host .100 and ::100, with the host's routes to the pod networks
    /// (10.128.0.0/14, fd01::/48) via the node. The one-node topology of the kernel tests.
    pub fn add_uplink_host(&mut self, node: &Ns, role: &str) -> Ns {
        let host = self.add_host(role);
        self.link(
            node,
            &["192.168.1.1/24", "fd00:1::1/64"],
            &host,
            &["192.168.1.100/24", "fd00:1::100/64"],
        );
        self.add_route(&host, "10.128.0.0/14", "192.168.1.1");
        self.add_route(&host, "fd01::/48", "fd00:1::1");
        host
    }

    /// `ext` (an uplink host of `node`: [`Lab::add_uplink_host`]) owns `addrs` (bare IPs,
    /// on its `lo`: the "Internet" hosts of a test), and `node` routes `prefixes` (which
    /// cover them) to it.
    pub fn add_uplink_addrs(&self, node: &Ns, ext: &Ns, addrs: &[&str], prefixes: &[&str]) {
        for a in addrs {
            let host = if a.contains(':') { 128 } else { 32 };
            add_addrs(ext, "lo", &[&format!("{a}/{host}")]);
        }
        for p in prefixes {
            let via = if p.contains(':') {
                "fd00:1::100"
            } else {
                "192.168.1.100"
            };
            self.add_route(node, p, via);
        }
    }

    /// `ext` (an uplink host of `node`) answers on every address of the IPv4 `prefix` (a
    /// local route on its `lo`), and `node` routes `prefix` to it: any address a test's DNS
    /// server invents there is a reachable destination.
    pub fn add_uplink_prefix(&self, node: &Ns, ext: &Ns, prefix: &str) {
        ext.run(&["ip", "route", "add", "local", prefix, "dev", "lo"]);
        self.add_route(node, prefix, "192.168.1.100");
    }

    /// `ip route add DEST via VIA` in `ns` (family from the addresses).
    pub fn add_route(&self, ns: &Ns, dest: &str, via: &str) {
        ns.run(&["ip", "route", "add", dest, "via", via]);
    }

    /// Adds an address to a device, e.g. a test address on `lo` (no dummy interfaces here).
    pub fn add_addr(&self, ns: &Ns, dev: &str, cidr: &str) {
        add_addrs(ns, dev, &[cidr]);
    }

    fn next_iface(&mut self, ns: &Ns, base: &'static str) -> String {
        let n = self
            .iface_counters
            .entry((ns.name().to_string(), base))
            .or_insert(0);
        let name = format!("{base}{n}");
        *n += 1;
        assert!(name.len() <= 15, "interface name {name} too long");
        name
    }
}

impl Default for Lab {
    fn default() -> Self {
        Lab::new()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Never panic here: Drop may run during an unwind, where a panic aborts.
        for ns in self.created.iter().rev() {
            let _ = std::fs::remove_dir_all(ns.state_dir());
            if netns::exists(ns.name())
                && let Err(e) = netns::delete(ns.name())
            {
                eprintln!("netns lab: cleanup of {} failed: {e}", ns.name());
            }
        }
    }
}

/// `br_netfilter` on or off in `node` (`net.bridge.bridge-nf-call-iptables` and
/// `-ip6tables`, per netns on current kernels): whether bridged IP traffic also passes the
/// inet hooks.
pub fn set_br_netfilter(node: &Ns, on: bool) {
    let v = if on { "1" } else { "0" };
    node.sysctl("net.bridge.bridge-nf-call-iptables", v);
    node.sysctl("net.bridge.bridge-nf-call-ip6tables", v);
}

fn veth(a: &Ns, a_iface: &str, b: &Ns, b_iface: &str) {
    a.run(&[
        "ip",
        "link",
        "add",
        a_iface,
        "type",
        "veth",
        "peer",
        "name",
        b_iface,
        "netns",
        b.name(),
    ]);
    a.run(&["ip", "link", "set", a_iface, "up"]);
    b.run(&["ip", "link", "set", b_iface, "up"]);
}

/// The addresses of `cidrs` (address/prefix); `what` names their owner when one is bad.
fn cidr_addresses(cidrs: &[&str], what: &str) -> Vec<IpAddr> {
    cidrs
        .iter()
        .map(|c| {
            let addr = c.split('/').next().unwrap_or(c);
            addr.parse()
                .unwrap_or_else(|e| panic!("{what} address {c:?}: {e}"))
        })
        .collect()
}

fn add_addrs(ns: &Ns, dev: &str, cidrs: &[&str]) {
    for cidr in cidrs {
        let mut argv = vec!["ip", "addr", "add", cidr, "dev", dev];
        if cidr.contains(':') {
            argv.push("nodad");
        }
        ns.run(&argv);
    }
}
