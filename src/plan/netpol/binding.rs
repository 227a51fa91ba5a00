//! Bridged pods' addresses bound to their bridge ports, in `table bridge nodeplane`.
//!
//! A bridge forwards a frame by MAC, whatever source address it carries, and the bridge
//! family has no `fib` for a reverse-path check; and a pod's interface has addresses the API
//! does not list (its IPv6 link-local address, SLAAC, a second address), on which the
//! dispatch maps (keyed by listed `podIPs`) do not isolate it. So each bridged pod's
//! addresses are bound to its port, from what the kernel says is behind the port
//! ([`crate::net::bridge_ports`]: the veth peer's addresses, set by the CNI; never the
//! neighbour or FDB tables, which pods write), for the addresses the API lists for a local
//! pod, plus that interface's IPv6 link-local addresses:
//!
//! - **Anti-spoofing** (`--pod-source-check`): a frame whose source is a bound address but
//!   which enters from another port, or which enters from a bound port with a source not
//!   bound to it (`::`, duplicate address detection, excepted), is counted and dropped.
//! - **Isolation on every address** (always): from or to the port of an isolated pod, an IP
//!   packet passes only with one of the pod's listed addresses, except ICMPv6 router and
//!   neighbour solicitations and advertisements (IPv6 needs them on the link).
//!
//! An address found behind two ports (a pod that can add addresses to its own interface) is
//! bound to neither, and those ports are not judged by port; a local pod address inside a
//! bridge's subnet that no port carries is not bound. Both are reported (log and `/readyz`):
//! the pod is not protected.
//!
//! The sets are planned with the bridge table (so `--dry-run` shows them, empty); their
//! elements are part [`PART`], added at sync time by [`bind`] from the kernel's answer.

use crate::net::bridge_ports::BridgePorts;
use crate::nft::ir::*;
use crate::snapshot::{self, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// `addr . port` of every bound address (listed and link-local).
pub const BOUND_V4: &str = "np-bound-v4";
pub const BOUND_V6: &str = "np-bound-v6";
/// Every bound address.
pub const BOUND_ADDRS_V4: &str = "np-bound-addrs-v4";
pub const BOUND_ADDRS_V6: &str = "np-bound-addrs-v6";
/// Every port with a bound address.
pub const BOUND_PORTS: &str = "np-bound-ports";
/// `addr . port` of every listed address of an isolated pod.
pub const ISOLATED_V4: &str = "np-isolated-v4";
pub const ISOLATED_V6: &str = "np-isolated-v6";
/// The ports of isolated pods.
pub const ISOLATED_PORTS: &str = "np-isolated-ports";
/// The part holding the elements.
pub const PART: &str = "np-ports";
/// The comment on the anti-spoofing rules (`nft list chain bridge nodeplane
/// np-forward-egress` shows their counters).
pub const SPOOF_COMMENT: &str = "NetworkPolicy: source address not bound to the bridge port";
/// The comment on the isolation rules.
pub const UNLISTED_COMMENT: &str = "NetworkPolicy: isolated pod on an address it does not list";

/// Declares the sets in the bridge table `t`.
pub fn add_sets(t: &mut Table) {
    let (v4, v6, port) = (DataType::Ipv4Addr, DataType::Ipv6Addr, DataType::IfName);
    for (name, key) in [
        (BOUND_V4, vec![v4, port]),
        (BOUND_V6, vec![v6, port]),
        (BOUND_ADDRS_V4, vec![v4]),
        (BOUND_ADDRS_V6, vec![v6]),
        (BOUND_PORTS, vec![port]),
        (ISOLATED_V4, vec![v4, port]),
        (ISOLATED_V6, vec![v6, port]),
        (ISOLATED_PORTS, vec![port]),
    ] {
        t.add_set(Set::new(name, key, SetKind::Set));
    }
}

/// The first rules of the bridge table's `np-forward-egress` (the first chain a frame
/// meets): the anti-spoofing rules when `source_check`, then the isolation rules.
pub fn rules(source_check: bool) -> Vec<Rule> {
    let families = [
        (Field::Ip4Saddr, Field::Ip4Daddr, BOUND_V4, BOUND_ADDRS_V4),
        (Field::Ip6Saddr, Field::Ip6Daddr, BOUND_V6, BOUND_ADDRS_V6),
    ];
    let (iif, oif) = (Field::IifName, Field::OifName);
    let drop = |mut stmts: Vec<Stmt>, comment: &str| {
        stmts.extend([Stmt::Counter, Stmt::Verdict(Verdict::Drop)]);
        Rule::new(stmts).with_comment(comment)
    };
    let not_in = |key: Vec<Field>, set: &str| {
        Stmt::Match(Match {
            key,
            op: MatchOp::NotInSet(set.into()),
        })
    };
    let mut rules = Vec::new();
    if source_check {
        for (saddr, _, bound, addrs) in families {
            rules.push(drop(
                vec![
                    Stmt::in_set(vec![saddr], addrs),
                    not_in(vec![saddr, iif], bound),
                ],
                SPOOF_COMMENT,
            ));
            let mut stmts = vec![Stmt::in_set(vec![iif], BOUND_PORTS)];
            if saddr == Field::Ip6Saddr {
                stmts.push(Stmt::Match(Match {
                    key: vec![saddr],
                    op: MatchOp::Ne(vec![Value::Ipv6(std::net::Ipv6Addr::UNSPECIFIED)]),
                }));
            }
            stmts.push(not_in(vec![saddr, iif], bound));
            rules.push(drop(stmts, SPOOF_COMMENT));
        }
    }
    rules.push(ipv6_on_the_link());
    for ((saddr, daddr, _, _), isolated) in families.into_iter().zip([ISOLATED_V4, ISOLATED_V6]) {
        for (addr, port) in [(saddr, iif), (daddr, oif)] {
            rules.push(drop(
                vec![
                    Stmt::in_set(vec![port], ISOLATED_PORTS),
                    not_in(vec![addr, port], isolated),
                ],
                UNLISTED_COMMENT,
            ));
        }
    }
    rules
}

/// ICMPv6 router solicitation and advertisement, neighbour solicitation and advertisement
/// (types 133-136, code 0) accept: what IPv6 needs on the link, on any address.
fn ipv6_on_the_link() -> Rule {
    let types = (133u16..=136)
        .map(|t| {
            vec![
                KeyPart::Value(Value::Proto(proto::ICMPV6)),
                KeyPart::Value(Value::Port(t << 8)),
            ]
        })
        .collect();
    Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::L4Proto, Field::ThSport],
            op: MatchOp::InAnon(types),
        }),
        Stmt::Verdict(Verdict::Accept),
    ])
}

/// What binding found: the elements, and what could not be bound (one line each).
#[derive(Debug, Default)]
pub struct Binding {
    pub part: Part,
    pub problems: Vec<String>,
    /// Bound ports, each to keep the flows its pod opens in sets of its own
    /// (`bridge::add_port`, added by the caller).
    pub flow_ports: Vec<String>,
}

fn is_link_local(addr: &IpAddr) -> bool {
    matches!(addr, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// This node's pods on the pod network ("namespace/name", listed addresses).
pub fn local_pods(snapshot: &Snapshot, node: &str) -> Vec<(String, Vec<IpAddr>)> {
    let pods = snapshot.pods().values().filter(|pod| {
        snapshot::pod_node_name(pod) == Some(node)
            && !snapshot::pod_is_host_network(pod)
            && !snapshot::pod_is_terminal(pod)
    });
    pods.map(|pod| {
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        (name, snapshot::pod_ips(pod))
    })
    .filter(|(_, ips)| !ips.is_empty())
    .collect()
}

/// Binds the listed addresses of `local` pods (and their interfaces' link-local ones) to the
/// bridge ports behind which the kernel has them; `isolated` are the addresses of the pods a
/// policy isolates (either direction).
pub fn bind(
    local: &[(String, Vec<IpAddr>)],
    isolated: &BTreeSet<IpAddr>,
    ports: &BridgePorts,
) -> Binding {
    let pods: BTreeMap<IpAddr, &str> = local
        .iter()
        .flat_map(|(name, ips)| ips.iter().map(move |ip| (*ip, name.as_str())))
        .collect();
    let claims = claims(&pods, ports);
    let disputed = disputed(&claims);
    let mut binding = Binding::default();
    for (addr, claimants) in &claims {
        let [port] = claimants.iter().collect::<Vec<_>>()[..] else {
            binding
                .problems
                .push(behind_several_ports(*addr, &pods, claimants));
            continue;
        };
        let judged = !disputed.contains(port);
        add_bound(
            &mut binding.part,
            *addr,
            port,
            judged,
            isolated.contains(addr),
        );
    }
    binding
        .problems
        .extend(behind_no_port(&pods, &claims, ports));
    binding.flow_ports = flow_ports(&claims);
    binding.part.shrink_to_fit();
    binding
}

/// Every port claiming each address: a pod's port is one whose peer has a listed address
/// (of `pods`); it claims those and its link-local ones.
fn claims<'p>(
    pods: &BTreeMap<IpAddr, &str>,
    ports: &'p BridgePorts,
) -> BTreeMap<IpAddr, BTreeSet<&'p str>> {
    let mut claims: BTreeMap<IpAddr, BTreeSet<&str>> = BTreeMap::new();
    for port in &ports.ports {
        let Some(addrs) = &port.peer_addrs else {
            continue;
        };
        if !addrs.iter().any(|a| pods.contains_key(a)) {
            continue;
        }
        for a in addrs
            .iter()
            .filter(|a| pods.contains_key(a) || is_link_local(a))
        {
            claims.entry(*a).or_default().insert(&port.name);
        }
    }
    claims
}

/// The ports with an address another port claims too. Such a port is not judged by port
/// (neither for its sources nor as an isolated pod's port): its pod's own traffic on that
/// address, now unbound, would be dropped, and a neighbour that can add addresses to its
/// own interface could cut it off that way.
fn disputed<'p>(claims: &BTreeMap<IpAddr, BTreeSet<&'p str>>) -> BTreeSet<&'p str> {
    claims
        .values()
        .filter(|c| c.len() > 1)
        .flat_map(|c| c.iter().copied())
        .collect()
}

/// The elements that bind `addr` to `port`; a `judged` port is checked by port, and for an
/// `isolated` address also as an isolated pod's port.
fn add_bound(part: &mut Part, addr: IpAddr, port: &str, judged: bool, isolated: bool) {
    let port = Value::IfName(port.to_string());
    let (bound, addrs, isolated_set) = match addr {
        IpAddr::V4(_) => (BOUND_V4, BOUND_ADDRS_V4, ISOLATED_V4),
        IpAddr::V6(_) => (BOUND_V6, BOUND_ADDRS_V6, ISOLATED_V6),
    };
    let ip = Value::ip(addr);
    part.add_element(bound, vec![ip.clone().into(), port.clone().into()]);
    part.add_element(addrs, vec![ip.clone().into()]);
    if judged {
        part.add_element(BOUND_PORTS, vec![port.clone().into()]);
    }
    if judged && isolated {
        part.add_element(isolated_set, vec![ip.into(), port.clone().into()]);
        part.add_element(ISOLATED_PORTS, vec![port.into()]);
    }
}

/// The problem of an address claimed by several ports (`claimants`): bound to neither.
fn behind_several_ports(
    addr: IpAddr,
    pods: &BTreeMap<IpAddr, &str>,
    claimants: &BTreeSet<&str>,
) -> String {
    let owner = pods
        .get(&addr)
        .map(|p| format!(" (pod {p})"))
        .unwrap_or_default();
    let list: Vec<&str> = claimants.iter().copied().collect();
    format!(
        "address {addr}{owner} is behind bridge ports {}: bound to neither",
        list.join(", ")
    )
}

/// The problems of the bridged pods' addresses (inside a bridge's subnet) that no port
/// claims: not bound.
fn behind_no_port(
    pods: &BTreeMap<IpAddr, &str>,
    claims: &BTreeMap<IpAddr, BTreeSet<&str>>,
    ports: &BridgePorts,
) -> Vec<String> {
    let unpaired: Vec<&str> = ports
        .ports
        .iter()
        .filter(|p| p.peer_addrs.is_none())
        .map(|p| p.name.as_str())
        .collect();
    let mut problems = Vec::new();
    for (addr, pod) in pods {
        let Some((bridge, _)) = ports.subnets.iter().find(|(_, net)| net.contains(addr)) else {
            continue; // not a bridged pod (routed: the inet table's fib check covers it)
        };
        if claims.contains_key(addr) {
            continue;
        }
        let mut why = format!(
            "address {addr} of pod {pod} (bridge {bridge}) is behind no bridge port's veth peer: not bound"
        );
        if !unpaired.is_empty() {
            why.push_str(&format!(
                " (ports that are not veths to a pod: {})",
                unpaired.join(", ")
            ));
        }
        problems.push(why);
    }
    problems
}

/// The ports with an address of their own: each keeps the flows its pod opens (see
/// `bridge`).
fn flow_ports(claims: &BTreeMap<IpAddr, BTreeSet<&str>>) -> Vec<String> {
    let ports: BTreeSet<&str> = claims
        .values()
        .filter_map(|c| match c.iter().collect::<Vec<_>>()[..] {
            [port] => Some(*port),
            _ => None,
        })
        .collect();
    ports.into_iter().map(String::from).collect()
}

/// Adds what [`bind`] found to the bridge table `t` as part [`PART`]; returns the problems.
pub fn add_to(t: &mut Table, binding: Binding) -> Vec<String> {
    if binding.part != Part::default() {
        t.insert_part(PART, Arc::new(binding.part));
    }
    binding.problems
}
