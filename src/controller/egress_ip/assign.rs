//! Which node hosts which egress IP: a pure function of the EgressIPs, the nodes and the
//! current `status.items`, so every leader computes the same answer from the same snapshot.
//!
//! Rules, in the order they apply to each IP of each EgressIP (EgressIPs oldest first:
//! `creationTimestamp`, then name):
//! 1. an IP equal to any node's own address (its Node addresses or a `host-cidrs` address) is
//!    refused;
//! 2. an IP an older EgressIP already asks for is refused (the older one keeps it);
//! 3. an IP whose current node (from `status.items`) is still a candidate whose subnets fit it
//!    stays there (no reshuffle when nodes join); so does one on a candidate that has not
//!    published its subnets ([`NodeInfo::subnets_known`]: an agent not yet upgraded, or a
//!    malformed annotation), so that missing data never tears down a working assignment;
//! 4. otherwise it goes to the fitting candidate hosting the fewest IPs so far (ties: the
//!    name that sorts first), never to a node already hosting another IP of the same
//!    EgressIP.
//!
//! A candidate is a node labelled `k8s.ovn.org/egress-assignable` (any value), Ready, not
//! being deleted, and healthy ([`NodeInfo::healthy`]: the verdict of the leader's ICMP probes,
//! `super::probe`). A candidate *fits* an IP when one of its `k8s.ovn.org/host-cidrs` networks
//! contains it and the IP is neither that network's network nor broadcast address.
//!
//! Cost: O(EgressIPs × IPs × candidates × subnets per node).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// One node as the assigner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// Carries `k8s.ovn.org/egress-assignable` (any value).
    pub assignable: bool,
    /// The Ready condition is True.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The health probes' verdict (`true` without one): one more input of the candidate
    /// filter.
    pub healthy: bool,
    /// The node's own addresses (Node `status.addresses` and the `host-cidrs` addresses).
    pub addresses: Vec<IpAddr>,
    /// The subnets the node can host egress IPs in (from `k8s.ovn.org/host-cidrs`).
    pub host_cidrs: Vec<IpNet>,
    /// The annotation is present and valid. Without it the node gets no new IP but keeps
    /// the ones it has.
    pub subnets_known: bool,
}

/// Why a node is not a candidate (first failing check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCandidate {
    NotAssignable,
    NotReady,
    Deleting,
    Unhealthy,
}

impl NodeInfo {
    /// `Ok` when the node may host egress IPs.
    pub fn candidacy(&self) -> Result<(), NotCandidate> {
        if !self.assignable {
            Err(NotCandidate::NotAssignable)
        } else if self.deleting {
            Err(NotCandidate::Deleting)
        } else if !self.ready {
            Err(NotCandidate::NotReady)
        } else if !self.healthy {
            Err(NotCandidate::Unhealthy)
        } else {
            Ok(())
        }
    }

    /// True when one of the node's subnets can hold `ip`.
    pub fn fits(&self, ip: IpAddr) -> bool {
        self.host_cidrs.iter().any(|net| subnet_fits(net, ip))
    }
}

/// `net` contains `ip` and `ip` is not its network or (IPv4) broadcast address (the node
/// side refuses those too; /31, /32, /127 and /128 have no such addresses).
pub fn subnet_fits(net: &IpNet, ip: IpAddr) -> bool {
    if !net.contains(&ip) {
        return false;
    }
    let max = match net {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    };
    if net.prefix_len() + 1 >= max {
        return true;
    }
    let broadcast = matches!(net, IpNet::V4(_)) && ip == net.broadcast();
    ip != net.network() && !broadcast
}

/// One EgressIP as the assigner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressIpInfo {
    pub name: String,
    /// `metadata.creationTimestamp` in nanoseconds since the epoch; `None` sorts last.
    pub created: Option<i128>,
    /// `spec.egressIPs`, parsed, in spec order, without duplicates.
    pub ips: Vec<IpAddr>,
    /// The current `status.items` (IP -> node).
    pub current: BTreeMap<IpAddr, String>,
}

/// Why an IP is not assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// No node is a candidate at all.
    NoCandidate,
    /// Candidates exist, none has a subnet that fits the IP.
    NoFittingSubnet,
    /// Every fitting candidate already hosts another IP of this EgressIP.
    NoFreeNode { fitting: usize },
    /// The IP is a node's own address.
    NodeAddress { node: String },
    /// An older EgressIP asks for the same IP.
    Conflict { with: String },
}

impl Reason {
    /// A stable one-word form (Event annotations, logs, tests).
    pub fn code(&self) -> &'static str {
        match self {
            Reason::NoCandidate => "NoCandidate",
            Reason::NoFittingSubnet => "NoFittingSubnet",
            Reason::NoFreeNode { .. } => "NoFreeNode",
            Reason::NodeAddress { .. } => "NodeAddress",
            Reason::Conflict { .. } => "Conflict",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoCandidate => write!(
                f,
                "no node is a candidate (labelled k8s.ovn.org/egress-assignable, Ready, not being deleted)"
            ),
            Reason::NoFittingSubnet => write!(
                f,
                "no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)"
            ),
            Reason::NoFreeNode { fitting } => write!(
                f,
                "each of the {fitting} candidate node(s) whose subnet contains it already hosts another IP of this EgressIP"
            ),
            Reason::NodeAddress { node } => write!(f, "it is an address of node {node}"),
            Reason::Conflict { with } => {
                write!(f, "EgressIP {with}, created earlier, asks for the same IP")
            }
        }
    }
}

/// One IP that is not assigned, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `spec.egressIPs[<i>]`.
    pub field: String,
    pub ip: IpAddr,
    pub reason: Reason,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} is not assigned: {}",
            self.field, self.ip, self.reason
        )
    }
}

/// What one EgressIP's status should say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// `(ip, node)` in spec order: the `status.items` to write.
    pub items: Vec<(IpAddr, String)>,
    pub problems: Vec<Problem>,
}

/// The assignment of every EgressIP (see the module documentation), keyed by name.
pub fn assign(eips: &[EgressIpInfo], nodes: &[NodeInfo]) -> BTreeMap<String, Assignment> {
    let mut candidates: Vec<&NodeInfo> = nodes.iter().filter(|n| n.candidacy().is_ok()).collect();
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    candidates.dedup_by(|a, b| a.name == b.name);
    let candidate = |name: &str| {
        candidates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| candidates[i])
    };
    // Every node's own addresses, the first node in name order naming it.
    let mut node_of: BTreeMap<IpAddr, &str> = BTreeMap::new();
    let mut by_name: Vec<&NodeInfo> = nodes.iter().collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    for n in &by_name {
        for ip in n
            .addresses
            .iter()
            .copied()
            .chain(n.host_cidrs.iter().map(IpNet::addr))
        {
            node_of.entry(ip).or_insert(n.name.as_str());
        }
    }
    let mut order: Vec<&EgressIpInfo> = eips.iter().collect();
    order.sort_by(|a, b| {
        (a.created.is_none(), &a.created, &a.name).cmp(&(b.created.is_none(), &b.created, &b.name))
    });

    // Pass 1: refusals and the assignments that stay.
    let mut owner: BTreeMap<IpAddr, &str> = BTreeMap::new();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    // Per EgressIP (in `order`): per spec index, the node or the problem; None = to place.
    let mut slots: Vec<Vec<Option<Result<String, Reason>>>> = Vec::with_capacity(order.len());
    for e in &order {
        let mut used: BTreeSet<&str> = BTreeSet::new();
        let mut row = Vec::with_capacity(e.ips.len());
        for ip in &e.ips {
            if let Some(node) = node_of.get(ip) {
                row.push(Some(Err(Reason::NodeAddress {
                    node: node.to_string(),
                })));
                continue;
            }
            if let Some(first) = owner.get(ip) {
                row.push(Some(Err(Reason::Conflict {
                    with: first.to_string(),
                })));
                continue;
            }
            owner.insert(*ip, e.name.as_str());
            let stays =
                e.current.get(ip).and_then(|n| candidate(n)).filter(|n| {
                    (n.fits(*ip) || !n.subnets_known) && !used.contains(n.name.as_str())
                });
            match stays {
                Some(n) => {
                    used.insert(n.name.as_str());
                    *count.entry(n.name.clone()).or_default() += 1;
                    row.push(Some(Ok(n.name.clone())));
                }
                None => row.push(None),
            }
        }
        slots.push(row);
    }

    // Pass 2: place the rest, oldest EgressIP first, in spec order.
    let mut out = BTreeMap::new();
    for (e, row) in order.iter().zip(slots) {
        let mut used: BTreeSet<String> = row
            .iter()
            .filter_map(|s| match s {
                Some(Ok(n)) => Some(n.clone()),
                _ => None,
            })
            .collect();
        let mut a = Assignment::default();
        for (i, (ip, slot)) in e.ips.iter().zip(row).enumerate() {
            let result = match slot {
                Some(r) => r,
                None => {
                    let placed = place(*ip, &candidates, &used, &count);
                    if let Ok(node) = &placed {
                        used.insert(node.clone());
                        *count.entry(node.clone()).or_default() += 1;
                    }
                    placed
                }
            };
            match result {
                Ok(node) => a.items.push((*ip, node)),
                Err(reason) => a.problems.push(Problem {
                    field: format!("spec.egressIPs[{i}]"),
                    ip: *ip,
                    reason,
                }),
            }
        }
        out.insert(e.name.clone(), a);
    }
    out
}

/// The fitting candidate with the fewest IPs (ties by name) not already hosting an IP of the
/// same EgressIP.
fn place(
    ip: IpAddr,
    candidates: &[&NodeInfo],
    used: &BTreeSet<String>,
    count: &BTreeMap<String, usize>,
) -> Result<String, Reason> {
    if candidates.is_empty() {
        return Err(Reason::NoCandidate);
    }
    let fitting: Vec<&&NodeInfo> = candidates.iter().filter(|c| c.fits(ip)).collect();
    if fitting.is_empty() {
        return Err(Reason::NoFittingSubnet);
    }
    fitting
        .iter()
        .filter(|c| !used.contains(&c.name))
        .min_by_key(|c| (count.get(&c.name).copied().unwrap_or(0), &c.name))
        .map(|c| c.name.clone())
        .ok_or(Reason::NoFreeNode {
            fitting: fitting.len(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(name: &str, addr: &str, cidrs: &[&str]) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            assignable: true,
            ready: true,
            deleting: false,
            healthy: true,
            addresses: vec![ip(addr)],
            host_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            subnets_known: true,
        }
    }

    /// `created` 0: no creationTimestamp.
    fn eip(name: &str, created: i128, ips: &[&str], current: &[(&str, &str)]) -> EgressIpInfo {
        EgressIpInfo {
            name: name.into(),
            created: (created != 0).then_some(created),
            ips: ips.iter().map(|i| ip(i)).collect(),
            current: current
                .iter()
                .map(|(i, n)| (ip(i), n.to_string()))
                .collect(),
        }
    }

    fn items(a: &Assignment) -> Vec<(String, String)> {
        a.items
            .iter()
            .map(|(i, n)| (i.to_string(), n.clone()))
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn three() -> Vec<NodeInfo> {
        vec![
            node("w1", "192.168.1.11", &["192.168.1.11/24", "fd00::11/64"]),
            node("w2", "192.168.1.12", &["192.168.1.12/24", "fd00::12/64"]),
            node("w3", "192.168.2.13", &["192.168.2.13/24"]),
        ]
    }

    #[test]
    fn spreads_by_count_and_never_puts_two_ips_of_one_egress_ip_on_one_node() {
        let eips = [
            eip("a", 1, &["192.168.1.100", "192.168.1.101"], &[]),
            eip("b", 2, &["192.168.1.102", "fd00::100"], &[]),
        ];
        let out = assign(&eips, &three());
        assert_eq!(
            items(&out["a"]),
            pairs(&[("192.168.1.100", "w1"), ("192.168.1.101", "w2")])
        );
        // w1 and w2 have one each: ties by name.
        assert_eq!(
            items(&out["b"]),
            pairs(&[("192.168.1.102", "w1"), ("fd00::100", "w2")])
        );
        assert!(out["a"].problems.is_empty() && out["b"].problems.is_empty());

        // A third IP in the 192.168.1.0/24 subnet: only two nodes fit.
        let eips = [eip(
            "a",
            0,
            &["192.168.1.100", "192.168.1.101", "192.168.1.102"],
            &[],
        )];
        let out = assign(&eips, &three());
        assert_eq!(out["a"].items.len(), 2);
        assert_eq!(
            out["a"].problems[0].to_string(),
            "spec.egressIPs[2]: 192.168.1.102 is not assigned: each of the 2 candidate node(s) \
             whose subnet contains it already hosts another IP of this EgressIP"
        );
    }

    #[test]
    fn refusals_name_their_reason() {
        let eips = [
            eip("old", 1, &["192.168.1.50"], &[]),
            // Created later, asks for the same IP, and currently has it in status.
            eip(
                "young",
                3,
                &[
                    "192.168.1.50",
                    "192.168.1.12",
                    "10.9.9.9",
                    "192.168.1.0",
                    "192.168.1.255",
                ],
                &[("192.168.1.50", "w2")],
            ),
        ];
        let out = assign(&eips, &three());
        assert_eq!(items(&out["old"]), pairs(&[("192.168.1.50", "w1")]));
        let young: Vec<String> = out["young"]
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            young,
            [
                "spec.egressIPs[0]: 192.168.1.50 is not assigned: EgressIP old, created earlier, asks for the same IP",
                "spec.egressIPs[1]: 192.168.1.12 is not assigned: it is an address of node w2",
                "spec.egressIPs[2]: 10.9.9.9 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
                "spec.egressIPs[3]: 192.168.1.0 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
                "spec.egressIPs[4]: 192.168.1.255 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
            ]
        );
        assert!(out["young"].items.is_empty());
        // No creation time sorts last; then by name.
        let eips = [
            eip("a", 0, &["192.168.1.50"], &[]),
            eip("z", 1, &["192.168.1.50"], &[]),
        ];
        let out = assign(&eips, &three());
        assert_eq!(out["z"].items.len(), 1);
        assert_eq!(out["a"].problems[0].reason.code(), "Conflict");
        // No candidate at all.
        let mut nodes = three();
        nodes.iter_mut().for_each(|n| n.assignable = false);
        let out = assign(&[eip("a", 0, &["192.168.1.50"], &[])], &nodes);
        assert_eq!(out["a"].problems[0].reason, Reason::NoCandidate);
    }

    #[test]
    fn sticky_while_the_node_stays_a_candidate_and_moves_when_it_does_not() {
        let current = [("192.168.1.100", "w2")];
        let eips = [eip("a", 0, &["192.168.1.100"], &current)];
        // w1 has fewer IPs, but the IP stays on w2.
        let out = assign(&eips, &three());
        assert_eq!(items(&out["a"]), pairs(&[("192.168.1.100", "w2")]));
        // A node joining moves nothing.
        let mut nodes = three();
        nodes.push(node("w0", "192.168.1.10", &["192.168.1.10/24"]));
        assert_eq!(
            items(&assign(&eips, &nodes)["a"]),
            pairs(&[("192.168.1.100", "w2")])
        );
        // w2 stops being a candidate, for each reason: the IP moves to w1.
        for edit in [
            (|n: &mut NodeInfo| n.ready = false) as fn(&mut NodeInfo),
            |n| n.assignable = false,
            |n| n.deleting = true,
            |n| n.healthy = false,
            |n| n.host_cidrs = vec!["192.168.9.0/24".parse().unwrap()],
        ] {
            let mut nodes = three();
            edit(&mut nodes[1]);
            let out = assign(&eips, &nodes);
            assert_eq!(items(&out["a"]), pairs(&[("192.168.1.100", "w1")]));
        }
        // Subnets not published (yet): the IP stays, but nothing new goes there.
        let mut nodes = three();
        nodes[1].host_cidrs.clear();
        nodes[1].subnets_known = false;
        assert_eq!(
            items(&assign(&eips, &nodes)["a"]),
            pairs(&[("192.168.1.100", "w2")])
        );
        let fresh = [eip("b", 0, &["192.168.1.101", "192.168.1.102"], &[])];
        let out = assign(&fresh, &nodes);
        assert_eq!(items(&out["b"]), pairs(&[("192.168.1.101", "w1")]));
        assert_eq!(
            out["b"].problems[0].reason,
            Reason::NoFreeNode { fitting: 1 }
        );
        // A status naming two IPs of one EgressIP on one node keeps the first only.
        let eips = [eip(
            "a",
            0,
            &["192.168.1.100", "192.168.1.101"],
            &[("192.168.1.100", "w2"), ("192.168.1.101", "w2")],
        )];
        let out = assign(&eips, &three());
        assert_eq!(
            items(&out["a"]),
            pairs(&[("192.168.1.100", "w2"), ("192.168.1.101", "w1")])
        );
    }

    #[test]
    fn candidacy_reports_the_first_failing_check() {
        let mut n = node("w1", "192.168.1.11", &[]);
        assert_eq!(n.candidacy(), Ok(()));
        n.healthy = false;
        assert_eq!(n.candidacy(), Err(NotCandidate::Unhealthy));
        n.ready = false;
        assert_eq!(n.candidacy(), Err(NotCandidate::NotReady));
        n.deleting = true;
        assert_eq!(n.candidacy(), Err(NotCandidate::Deleting));
        n.assignable = false;
        assert_eq!(n.candidacy(), Err(NotCandidate::NotAssignable));
        let net: IpNet = "10.0.0.0/31".parse().unwrap();
        assert!(subnet_fits(&net, ip("10.0.0.0")) && subnet_fits(&net, ip("10.0.0.1")));
        let net: IpNet = "fd00::/64".parse().unwrap();
        assert!(!subnet_fits(&net, ip("fd00::")) && subnet_fits(&net, ip("fd00::ffff")));
    }

    prop_compose! {
        fn arb_node()(
            i in 0u8..6,
            flags in proptest::collection::vec(any::<bool>(), 4),
            subnets in proptest::collection::btree_set(0u8..3, 0..3),
        ) -> NodeInfo {
            NodeInfo {
                name: format!("n{i}"),
                assignable: flags[0] || flags[1],
                ready: flags[1] || flags[2],
                deleting: false,
                healthy: true,
                addresses: vec![IpAddr::from([10, 0, 9, i])],
                host_cidrs: subnets
                    .iter()
                    .map(|s| IpNet::new(IpAddr::from([10, 0, *s, 10 + i]), 24).unwrap())
                    .collect(),
                subnets_known: flags[3] || !subnets.is_empty(),
            }
        }
    }

    prop_compose! {
        fn arb_eip()(
            name in 0u8..5,
            created in proptest::option::of(0u8..3),
            ips in proptest::collection::btree_set((0u8..4, 0u8..6), 1..4),
            current in proptest::collection::vec((0u8..4, 0u8..6, 0u8..6), 0..4),
        ) -> EgressIpInfo {
            let addr = |(s, h): (u8, u8)| if s == 3 {
                IpAddr::from([10, 0, 9, h]) // some are node addresses
            } else {
                IpAddr::from([10, 0, s, 100 + h])
            };
            let ips: Vec<IpAddr> = ips.into_iter().map(addr).collect();
            let current = current
                .into_iter()
                .map(|(s, h, n)| (addr((s, h)), format!("n{n}")))
                .filter(|(ip, _)| ips.contains(ip))
                .collect();
            EgressIpInfo {
                name: format!("e{name}"),
                created: created.map(i128::from),
                ips,
                current,
            }
        }
    }

    proptest! {
        #[test]
        fn invariants(
            nodes in proptest::collection::vec(arb_node(), 0..6),
            eips in proptest::collection::vec(arb_eip(), 0..5),
        ) {
            let mut eips = eips;
            eips.sort_by(|a, b| a.name.cmp(&b.name));
            eips.dedup_by(|a, b| a.name == b.name);
            let mut nodes = nodes;
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            nodes.dedup_by(|a, b| a.name == b.name);
            let out = assign(&eips, &nodes);
            // Deterministic, also whatever the input order.
            let mut rev_e = eips.clone();
            rev_e.reverse();
            let mut rev_n = nodes.clone();
            rev_n.reverse();
            prop_assert_eq!(&out, &assign(&rev_e, &rev_n));
            let node_addrs: BTreeSet<IpAddr> = nodes
                .iter()
                .flat_map(|n| n.addresses.iter().copied().chain(n.host_cidrs.iter().map(IpNet::addr)))
                .collect();
            let mut hosted: BTreeSet<IpAddr> = BTreeSet::new();
            for e in &eips {
                let a = &out[&e.name];
                // Every IP is either assigned or has a problem, exactly once.
                prop_assert_eq!(a.items.len() + a.problems.len(), e.ips.len());
                let mut on: BTreeSet<&str> = BTreeSet::new();
                for (ip, node) in &a.items {
                    // No two IPs of one EgressIP on one node.
                    prop_assert!(on.insert(node.as_str()), "{} twice on {}", e.name, node);
                    let n = nodes.iter().find(|n| &n.name == node).unwrap();
                    prop_assert!(n.candidacy().is_ok());
                    // Inside the node's host-cidrs (or kept on a node whose are unknown).
                    prop_assert!(
                        n.fits(*ip) || (!n.subnets_known && e.current.get(ip) == Some(node))
                    );
                    // Never a node's address; never two EgressIPs on one IP.
                    prop_assert!(!node_addrs.contains(ip));
                    prop_assert!(hosted.insert(*ip));
                }
                // Sticky: a current assignment to a fitting candidate, not refused, stays
                // unless it is the second IP of this EgressIP on that node.
                for (ip, node) in &e.current {
                    let kept = nodes.iter().any(|n| {
                        &n.name == node
                            && n.candidacy().is_ok()
                            && (n.fits(*ip) || !n.subnets_known)
                    });
                    let refused = a.problems.iter().any(|p| p.ip == *ip);
                    let first_on_node = e.ips.iter().take_while(|i| *i != ip).all(|i| {
                        e.current.get(i) != Some(node)
                            || a.items.iter().all(|(x, n)| x != i || n != node)
                    });
                    if kept && !refused && first_on_node {
                        prop_assert!(a.items.contains(&(*ip, node.clone())), "{} left {}", ip, node);
                    }
                }
            }
        }
    }
}
