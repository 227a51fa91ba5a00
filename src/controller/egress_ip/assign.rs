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
//! On a cloud ([`NodeInfo::cloud`] set) a node also needs room and a subnet in the cloud: an
//! IP stays or goes on it only while its NIC's `egress-ipconfig` subnets contain the IP and
//! its capacity (per family and shared) is not used up, so a node never hosts more than its
//! capacity. A node whose annotation is missing or malformed gets no new IP (it keeps the
//! ones it has, as with unknown subnets).
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

use super::egress_ipconfig::{self, CloudNic, subnet_fits};

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
    /// On a cloud: the node's NIC from `cloud.network.openshift.io/egress-ipconfig`, or why
    /// it cannot be read. `None` on bare metal (no cloud limits).
    pub cloud: Option<Result<CloudNic, String>>,
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

/// One EgressIP as the assigner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressIpInfo {
    pub name: String,
    /// `metadata.creationTimestamp` in nanoseconds since the epoch; `None` sorts last.
    pub created: Option<i128>,
    /// `spec.egressIPs`, parsed, in spec order, without duplicates.
    pub ips: Vec<IpAddr>,
    /// The current `status.items` (IP -> node); on a cloud, where each IP's
    /// CloudPrivateIPConfig asks for it.
    pub current: BTreeMap<IpAddr, String>,
    /// Nodes the cloud recently failed to attach an IP to: not chosen for it (a current
    /// assignment there does not stay).
    pub avoid: BTreeMap<IpAddr, BTreeSet<String>>,
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
    /// Candidates fit by host subnet, none has room for it in the cloud: why, per node.
    NoCloudRoom { nodes: Vec<String> },
    /// The IP is a node's own address.
    NodeAddress { node: String },
    /// An older EgressIP asks for the same IP.
    Conflict { with: String },
}

impl Reason {
    /// The reason of the Warning Event reporting it: OVN-Kubernetes' for the same case
    /// (`partly`: other IPs of the EgressIP are assigned).
    pub fn event_reason(&self, partly: bool) -> &'static str {
        use crate::api::egress_ip::event_reason::*;
        match self {
            Reason::NoCandidate
            | Reason::NoFittingSubnet
            | Reason::NoFreeNode { .. }
            | Reason::NoCloudRoom { .. } => {
                if partly {
                    UNASSIGNED_REQUEST
                } else {
                    NO_MATCHING_NODE
                }
            }
            Reason::NodeAddress { .. } => CONFLICT_WITH_NODE,
            Reason::Conflict { .. } => ALREADY_ALLOCATED,
        }
    }

    /// A stable one-word form (Event annotations, logs, tests).
    pub fn code(&self) -> &'static str {
        match self {
            Reason::NoCandidate => "NoCandidate",
            Reason::NoFittingSubnet => "NoFittingSubnet",
            Reason::NoFreeNode { .. } => "NoFreeNode",
            Reason::NoCloudRoom { .. } => "NoCloudRoom",
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
            Reason::NoCloudRoom { nodes } => write!(
                f,
                "no candidate node can host it in the cloud: {}",
                nodes.join("; ")
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
    let order = oldest_first(eips);
    let mut count: BTreeMap<String, Load> = BTreeMap::new();
    // Pass 1: refusals and the assignments that stay.
    let rows = keep_current(&order, &candidates, &node_addresses(nodes), &mut count);
    // Pass 2: place the rest, oldest EgressIP first, in spec order.
    order
        .iter()
        .zip(rows)
        .map(|(e, row)| (e.name.clone(), place_rest(e, row, &candidates, &mut count)))
        .collect()
}

/// Per spec index of one EgressIP: the node or the problem; `None`: to place.
type Row = Vec<Option<Result<String, Reason>>>;

/// Pass 1, per EgressIP in `order`: the IPs refused (a node's own address, or one an older
/// EgressIP has) and those that stay on their current node (still a fitting, unavoided
/// `candidates` node, not used twice by the EgressIP, with cloud capacity), counted in
/// `count`.
fn keep_current(
    order: &[&EgressIpInfo],
    candidates: &[&NodeInfo],
    node_of: &BTreeMap<IpAddr, &str>,
    count: &mut BTreeMap<String, Load>,
) -> Vec<Row> {
    let candidate = |name: &str| {
        candidates
            .binary_search_by(|c| c.name.as_str().cmp(name))
            .ok()
            .map(|i| candidates[i])
    };
    let mut owner: BTreeMap<IpAddr, &str> = BTreeMap::new();
    let mut rows = Vec::with_capacity(order.len());
    for e in order {
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
            let avoided = |n: &NodeInfo| e.avoid.get(ip).is_some_and(|a| a.contains(&n.name));
            let stays = e.current.get(ip).and_then(|n| candidate(n)).filter(|n| {
                (n.fits(*ip) || !n.subnets_known)
                    && !avoided(n)
                    && !used.contains(n.name.as_str())
                    && cloud_refusal(n, *ip, count).is_none_or(|r| r.keeps())
            });
            match stays {
                Some(n) => {
                    used.insert(n.name.as_str());
                    count.entry(n.name.clone()).or_default().add(*ip);
                    row.push(Some(Ok(n.name.clone())));
                }
                None => row.push(None),
            }
        }
        rows.push(row);
    }
    rows
}

/// Pass 2 for one EgressIP: places the IPs of `row` that pass 1 left open on `candidates`,
/// counted in `count`, and turns the row into its status.
fn place_rest(
    e: &EgressIpInfo,
    row: Row,
    candidates: &[&NodeInfo],
    count: &mut BTreeMap<String, Load>,
) -> Assignment {
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
                let avoid = e.avoid.get(ip).cloned().unwrap_or_default();
                let placed = place(*ip, candidates, &used, &avoid, count);
                if let Ok(node) = &placed {
                    used.insert(node.clone());
                    count.entry(node.clone()).or_default().add(*ip);
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
    a
}

/// Every node's own addresses, the first node in name order naming it.
fn node_addresses(nodes: &[NodeInfo]) -> BTreeMap<IpAddr, &str> {
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
    node_of
}

/// EgressIPs by creation time (those without one last), then name.
fn oldest_first(eips: &[EgressIpInfo]) -> Vec<&EgressIpInfo> {
    let mut order: Vec<&EgressIpInfo> = eips.iter().collect();
    order.sort_by(|a, b| {
        (a.created.is_none(), &a.created, &a.name).cmp(&(b.created.is_none(), &b.created, &b.name))
    });
    order
}

/// IPs a node hosts so far, per family.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    v4: usize,
    v6: usize,
}

impl Load {
    fn add(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(_) => self.v4 += 1,
            IpAddr::V6(_) => self.v6 += 1,
        }
    }

    fn total(&self) -> usize {
        self.v4 + self.v6
    }
}

/// Why the cloud will not take `ip` on a node.
enum CloudRefusal {
    /// The egress-ipconfig annotation is missing or malformed.
    Unknown(String),
    OutsideSubnets(Vec<IpNet>),
    Full(egress_ipconfig::Capacity),
}

impl CloudRefusal {
    /// A node whose cloud limits are unknown keeps what it has.
    fn keeps(&self) -> bool {
        matches!(self, CloudRefusal::Unknown(_))
    }

    fn describe(&self, node: &str) -> String {
        match self {
            CloudRefusal::Unknown(why) => format!("node {node}: {why}"),
            CloudRefusal::OutsideSubnets(nets) => {
                let nets: Vec<String> = nets.iter().map(IpNet::to_string).collect();
                format!(
                    "node {node}: not in its cloud subnets ({})",
                    nets.join(", ")
                )
            }
            CloudRefusal::Full(c) => {
                let limit = |name: &str, v: Option<u32>| v.map(|v| format!("{name} {v}"));
                let limits: Vec<String> = [
                    limit("ipv4", c.ipv4),
                    limit("ipv6", c.ipv6),
                    limit("ip", c.ip),
                ]
                .into_iter()
                .flatten()
                .collect();
                format!("node {node}: at capacity ({})", limits.join(", "))
            }
        }
    }
}

/// `None` when the node has no cloud limits or room for `ip` in the cloud.
fn cloud_refusal(n: &NodeInfo, ip: IpAddr, count: &BTreeMap<String, Load>) -> Option<CloudRefusal> {
    let nic = match n.cloud.as_ref()? {
        Ok(nic) => nic,
        Err(why) => {
            return Some(CloudRefusal::Unknown(format!(
                "annotation {}: {why}",
                egress_ipconfig::ANNOTATION
            )));
        }
    };
    let load = count.get(&n.name).copied().unwrap_or_default();
    if !nic.fits(ip) {
        Some(CloudRefusal::OutsideSubnets(nic.subnets.clone()))
    } else if !nic.capacity.has_room(load.v4, load.v6, ip) {
        Some(CloudRefusal::Full(nic.capacity))
    } else {
        None
    }
}

/// The fitting candidate with the fewest IPs (ties by name) not already hosting an IP of the
/// same EgressIP, with room in the cloud and not in `avoid`.
fn place(
    ip: IpAddr,
    candidates: &[&NodeInfo],
    used: &BTreeSet<String>,
    avoid: &BTreeSet<String>,
    count: &BTreeMap<String, Load>,
) -> Result<String, Reason> {
    if candidates.is_empty() {
        return Err(Reason::NoCandidate);
    }
    let fitting: Vec<&&NodeInfo> = candidates.iter().filter(|c| c.fits(ip)).collect();
    if fitting.is_empty() {
        return Err(Reason::NoFittingSubnet);
    }
    let mut refusals = Vec::new();
    let fitting: Vec<&&NodeInfo> = fitting
        .into_iter()
        .filter(|c| match cloud_refusal(c, ip, count) {
            None if avoid.contains(&c.name) => {
                refusals.push(format!(
                    "node {}: the cloud failed to attach it there, retrying later",
                    c.name
                ));
                false
            }
            None => true,
            Some(r) => {
                refusals.push(r.describe(&c.name));
                false
            }
        })
        .collect();
    if fitting.is_empty() {
        return Err(Reason::NoCloudRoom { nodes: refusals });
    }
    fitting
        .iter()
        .filter(|c| !used.contains(&c.name))
        .min_by_key(|c| (count.get(&c.name).map_or(0, Load::total), &c.name))
        .map(|c| c.name.clone())
        .ok_or(Reason::NoFreeNode {
            fitting: fitting.len(),
        })
}

#[cfg(test)]
mod tests;
