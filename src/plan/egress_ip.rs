//! EgressIP: a fixed source address for the traffic that selected pods send out of the
//! cluster, hosted by the node(s) that `status.items` names.
//!
//! On a node that hosts an IP of an EgressIP:
//! - the IP is in [`NetDesired::addresses`] (the net backend puts it on the interface whose
//!   subnet contains it and announces it);
//! - `eip-postrouting` SNATs traffic of **every** pod the object selects (local pods, and
//!   pods of other nodes whose traffic arrives through the tunnel) to it, through the map
//!   `eip-snat-v4/v6` keyed on the pod address: pod churn is an element update.
//!
//! On a node whose local pods are selected by an EgressIP hosted elsewhere:
//! - `eip-prerouting` (filter, after service DNAT) marks their packets to destinations outside
//!   the cluster through the verdict map `eip-steer-v4/v6` (one lookup per packet);
//! - an `ip rule fwmark` sends marked packets to a routing table holding a multipath default
//!   route over the tunnel device `np-eip` to the hosting nodes (one table per set of hosting
//!   nodes, so EgressIPs hosted by the same nodes share it);
//! - the same `eip-snat` map maps the pod to its own address: that identity SNAT at priority
//!   srcnat-10 binds the connection's source before a CNI's masquerade (srcnat) can run, so
//!   the hosting node receives the pod's address (the first NAT chain that binds wins).
//!
//! Destinations in the cluster, service and node sets are never SNATed nor steered.
//!
//! Only packets of connections the pod opened are steered (`ct direction original`): the
//! replies of a connection opened from outside to a selected pod (a NodePort or LoadBalancer
//! with `externalTrafficPolicy: Local`, or the pod address routed directly) leave as they
//! came, from the pod's address. The SNAT chain needs no such match: NAT chains only see the
//! first packet of a connection, and a reply never is one.
//!
//! **Fail closed.** A selected pod whose EgressIP has an IP of the pod's family assigned in
//! `status.items` gets that IP or nothing: when none of the nodes hosting it can be reached
//! from here (no Node object, no InternalIP of the tunnel's family, this node has no
//! InternalIP, more than 255 distinct sets of hosting nodes), its steering element jumps to
//! [`UNREACHABLE`], which drops its packets to destinations outside the cluster (cluster,
//! service and node destinations still pass); and on a hosting node that cannot hold the IP
//! (refused by the net backend) the pods SNATed to it are dropped the same way instead of
//! leaving with the node's address. Both are reported (status line and a Warning Event).
//! An EgressIP with no IP of the family assigned at all (`status.items` empty, nothing
//! assignable) is the one documented case in which the pods leave as if not selected.
//!
//! **Reports.** The EgressIP CRD has no `status.messages` (its status is `items`, which the
//! assigning controller owns), so this planner's problems become Warning Events
//! ([`ObjectStatus::event`]; reason `InvalidEgressIP`, `EgressIPConflict`,
//! `UnsupportedRequest` or `UndefinedRequest` as OVN-Kubernetes names the case, else
//! `EgressIPNotApplied`) besides the status line of the log: a
//! problem of this node's own dataplane (an unreachable hosting node, a refused address) is
//! reported by this node; a problem every node sees alike (invalid spec, conflicts,
//! assignments) only by one node, the object's [`reporter`](status::reporter), so thousands
//! of nodes do not each create the same Event.

use super::in_force::Validated;
use super::{BackendReport, Feature, Inputs, ObjectStatus, Planned};
use crate::api::{EgressIP, ValidatedEgressIp};
use crate::config::Config;
use crate::net::{AddressSpec, Family, NetDesired, TunnelSpec};
use crate::nft::ir::*;
use crate::snapshot::Snapshot;
use chains::{Maps, add_base_chains, data, idx, key, steer_chain, unreachable_chain};
use conflicts::report_conflicts;
use status::{address_refused, note_problems, push_statuses};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use tunnel::{reach, return_routing, steer_routing, tunnel_spec, underlay};
use validate::{check_addresses, claim_pods, validate_all};

mod chains;
mod conflicts;
mod status;
mod tunnel;
mod validate;

pub use tunnel::{tunnel_gateway6, tunnel_mac};

/// The feature's one table part: every chain and map it plans (the feature is planned whole).
pub const PART: &str = "eip";

/// SNAT maps: pod address -> source address (the egress IP, or the pod's own for steered
/// traffic).
pub const SNAT_V4: &str = "eip-snat-v4";
pub const SNAT_V6: &str = "eip-snat-v6";
/// Verdict maps: local pod address -> `jump eip-steer-<n>` (marks the packet), or
/// `jump eip-unreachable` (fail closed).
pub const STEER_V4: &str = "eip-steer-v4";
pub const STEER_V6: &str = "eip-steer-v6";
/// Where selected pods go whose egress IP is assigned but cannot be used from here: their
/// packets to destinations outside the cluster are counted and dropped.
pub const UNREACHABLE: &str = "eip-unreachable";
/// nat postrouting at srcnat - 10: before a CNI's masquerade at srcnat.
pub const POSTROUTING: &str = "eip-postrouting";
pub const POSTROUTING_PRIORITY: i32 = priority::SRCNAT - 10;
/// filter prerouting at dstnat + 10: sees service traffic after DNAT; the routing decision
/// that follows all prerouting hooks uses the mark.
pub const PREROUTING: &str = "eip-prerouting";
pub const PREROUTING_PRIORITY: i32 = priority::DSTNAT + 10;

/// filter postrouting after NAT: packets routed into the tunnel lose the steering mark, since
/// the VXLAN driver routes the outer packet with the inner packet's mark (the `ip rule` would
/// send it back into the tunnel).
pub const TUNNEL_OUT: &str = "eip-tunnel-out";
pub const TUNNEL_OUT_PRIORITY: i32 = priority::SRCNAT + 10;

/// The tunnel device: VXLAN (the only encapsulation every kernel we target has built in;
/// IPIP/GRE/GENEVE may be missing), our own UDP port and VNI.
pub const TUNNEL_DEV: &str = "np-eip";
pub const TUNNEL_VNI: u32 = 7100;
pub const TUNNEL_PORT: u16 = 4789;

/// Packet mark bits the agent uses for steering (`meta mark`), one value per set of hosting
/// nodes: `(n + 1) << 16`.
pub const MARK_MASK: u32 = 0x00ff_0000;

/// The steering mark of group `n` (within [`MARK_MASK`]).
pub fn mark(n: usize) -> u32 {
    ((n as u32) + 1) << 16
}

/// Set on packets that arrived through the tunnel (`eip-prerouting`): steered here from
/// another node for SNAT to an egress IP.
pub const TUNNELED: u32 = 0x0200_0000;
/// The reverse-path table: the cluster's IPv4 CIDRs over the tunnel, looked up (`ip rule
/// fwmark TUNNELED`) only for packets that arrived through it. With `src_valid_mark` on the
/// tunnel (`net::links::TUNNEL_INET_CONF`) the kernel's reverse-path check of such a packet
/// uses its mark, finds its pod source routed back over the tunnel and passes in strict and
/// loose mode, whatever `rp_filter` says in `all`, `default` or on the uplink. The forward
/// lookup of the same packet (to a destination outside the cluster) finds nothing here and
/// goes on to the main table.
pub const RETURN_TABLE: u32 = 7090;
pub const RETURN_RULE_PRIORITY: u32 = 7090;
/// Steering tables `STEER_TABLE_BASE + n` and the priority of their `ip rule`s.
pub const STEER_TABLE_BASE: u32 = 7100;
pub const STEER_RULE_PRIORITY: u32 = 7100;
const MAX_GROUPS: usize = 255;

/// An EgressIP as planned: the validated object plus what this planner found wrong with it.
struct Entry {
    key: String,
    /// The API object `valid` was validated from (the current one, or the last valid one).
    object: Arc<EgressIP>,
    valid: Arc<ValidatedEgressIp>,
    problems: Vec<String>,
    /// The Event reason of the first of `problems` that OVN-Kubernetes has a reason for.
    reason: Option<&'static str>,
    /// Problems of this node's own dataplane (reported by this node whatever the reporter).
    local: Vec<String>,
    /// Usable `(ip, node)` assignments.
    hosted: Vec<(IpAddr, String)>,
}

/// A selected pod address and where the pod runs.
struct Claim {
    entry: usize,
    node: String,
}

/// What the EgressIP planner carries from one plan to the next: the version in force per
/// EgressIP name, with the API object it came from, and the validation cache.
pub type EgressIpMemory = Validated<EgressIP, ValidatedEgressIp>;

// The last valid version of each EgressIP is kept across restarts.
super::kept::kept_kind!(EgressIP => ValidatedEgressIp, field "egressIPs", keyed by name);

/// The EgressIP feature (see the module documentation).
pub struct EgressIp;

impl Feature for EgressIp {
    const NAME: &'static str = PART;
    const SWITCH: crate::features::Switch = crate::features::Switch::EgressIp;
    type Memory = EgressIpMemory;
    type Output = ();

    fn plan(
        inputs: &Inputs,
        memory: &EgressIpMemory,
        out: &mut Planned,
        _: &mut (),
    ) -> EgressIpMemory {
        let (statuses, memory) = plan(
            inputs.snapshot,
            inputs.config,
            memory,
            &mut out.ruleset,
            &mut out.net,
        );
        out.statuses.extend(statuses);
        memory
    }

    /// An address the net backend cannot place (no interface subnet contains it, or it is
    /// the node's own): the pods SNATed to it fail closed, and its EgressIP's status says why.
    fn settle(
        inputs: &Inputs,
        _memory: &EgressIpMemory,
        report: &BackendReport,
        out: &mut Planned,
        _: &mut (),
    ) {
        for r in report.refused {
            address_refused(
                inputs.snapshot,
                &inputs.config.node_name,
                &mut out.ruleset,
                &mut out.statuses,
                r.addr,
                &r.reason,
            );
        }
    }

    /// An address another host still answered for when it was added: reported with its
    /// EgressIP as long as it lasts.
    fn report_applied(
        inputs: &Inputs,
        report: &crate::plan::AppliedReport,
        statuses: &mut [ObjectStatus],
    ) {
        report_conflicts(
            inputs.snapshot,
            &inputs.config.node_name,
            report.conflicts,
            statuses,
        );
    }
}

/// Adds the EgressIP part ([`PART`]: its chains and maps) to `table` and the addresses,
/// routes, rules and tunnel to `net`; returns one status per EgressIP and the next memory.
fn plan(
    snapshot: &Snapshot,
    config: &Config,
    memory: &EgressIpMemory,
    table: &mut Table,
    net: &mut NetDesired,
) -> (Vec<ObjectStatus>, EgressIpMemory) {
    let mut statuses = Vec::new();
    if snapshot.egress_ips().is_empty() {
        return (statuses, EgressIpMemory::default());
    }
    let node = config.node_name.as_str();
    let (mut entries, validated) = validate_all(snapshot, memory, node, &mut statuses);
    check_addresses(snapshot, &mut entries);
    let claims = claim_pods(snapshot, &mut entries);

    let mut part = Part::default();
    let mut maps = Maps::new();
    let Routed {
        groups,
        steered,
        unreachable,
        mut dropped,
    } = route_claims(snapshot, node, &claims, &entries, &mut maps.snat);
    let mut groups: Vec<(Vec<String>, BTreeSet<Family>)> = groups.into_iter().collect();
    drop_unmarked_groups(
        &mut groups,
        &steered,
        &claims,
        &mut dropped,
        &mut entries,
        node,
    );
    note_problems(&mut entries, unreachable, node);
    fail_closed(&mut entries, &dropped, &mut maps, node);
    let tunnel = tunnel_spec(snapshot, node, &entries, &groups);
    if let Some(tunnel) = &tunnel {
        steer_groups(
            snapshot, tunnel, &groups, &steered, &mut part, &mut maps, net,
        );
    }
    add_hosted_addresses(&entries, node, net);
    if let Some(tunnel) = &tunnel {
        return_routing(config, tunnel, net);
    }
    net.tunnel = tunnel;
    if !dropped.is_empty() {
        unreachable_chain(&mut part);
    }
    add_base_chains(&mut part);
    for set in maps.snat.into_iter().chain(maps.steer) {
        part.add_set(set);
    }
    table.insert_part(PART, Arc::new(part));
    push_statuses(&mut statuses, snapshot, node, entries, &claims);
    statuses.sort_by(|a, b| a.key.cmp(&b.key));
    (statuses, validated)
}

/// The pods that can use no egress IP of their family (`dropped`, by entry) fail closed:
/// steered to [`UNREACHABLE`], and their EgressIPs say so.
fn fail_closed(
    entries: &mut [Entry],
    dropped: &BTreeMap<(usize, Family), Vec<IpAddr>>,
    maps: &mut Maps,
    node: &str,
) {
    for ((i, fam), ips) in dropped {
        let family = match fam {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        entries[*i].local.push(format!(
            "{} selected pod address(es) on node {node} ({}{}) cannot use any {family} egress \
             IP of this EgressIP: their traffic to destinations outside the cluster is dropped",
            ips.len(),
            ips[0],
            if ips.len() > 1 { ", ..." } else { "" },
        ));
        for ip in ips {
            maps.steer(*ip, UNREACHABLE);
        }
    }
}

/// Per group of hosting nodes: its steering chain, its pods (`steered`) steered there with
/// an identity SNAT (the pod keeps its address through any later masquerade), and its
/// routing through `tunnel`.
fn steer_groups(
    snapshot: &Snapshot,
    tunnel: &TunnelSpec,
    groups: &[(Vec<String>, BTreeSet<Family>)],
    steered: &[(IpAddr, Vec<String>)],
    part: &mut Part,
    maps: &mut Maps,
    net: &mut NetDesired,
) {
    for (n, (nodes, families)) in groups.iter().enumerate() {
        let chain = steer_chain(part, n);
        for (ip, _) in steered.iter().filter(|(_, g)| g == nodes) {
            maps.steer(*ip, &chain);
            maps.snat[idx(ip)].insert_mapping(key(*ip), data(*ip));
        }
        steer_routing(snapshot, tunnel, n, nodes, families, net);
    }
}

/// The egress IPs this node hosts, as host addresses of its interfaces.
fn add_hosted_addresses(entries: &[Entry], node: &str, net: &mut NetDesired) {
    for e in entries {
        for (ip, n) in &e.hosted {
            if n == node {
                net.addresses.insert(AddressSpec::host(*ip));
            }
        }
    }
}

/// No mark is left for the groups past [`MAX_GROUPS`]: their pods fail closed (into
/// `dropped`), and the EgressIPs say so.
fn drop_unmarked_groups(
    groups: &mut Vec<(Vec<String>, BTreeSet<Family>)>,
    steered: &[(IpAddr, Vec<String>)],
    claims: &BTreeMap<IpAddr, Claim>,
    dropped: &mut BTreeMap<(usize, Family), Vec<IpAddr>>,
    entries: &mut [Entry],
    node: &str,
) {
    for (nodes, _) in groups.split_off(MAX_GROUPS.min(groups.len())) {
        for (ip, _) in steered.iter().filter(|(_, g)| *g == nodes) {
            let entry = claims[ip].entry;
            dropped
                .entry((entry, Family::of(ip)))
                .or_default()
                .push(*ip);
            entries[entry].local.push(format!(
                "node {node}: more than {MAX_GROUPS} distinct sets of hosting nodes to steer \
                 to; the set {} gets no mark",
                nodes.join(",")
            ));
        }
    }
}

/// Where this node sends the pods EgressIPs claimed: SNAT here (into `snat`), steered
/// through the tunnel to reachable hosting nodes, or dropped.
struct Routed {
    /// Sets of hosting nodes steered to, with the families steered to each.
    groups: BTreeMap<Vec<String>, BTreeSet<Family>>,
    steered: Vec<(IpAddr, Vec<String>)>,
    /// Per entry: hosting nodes this node cannot reach, and why.
    unreachable: BTreeMap<usize, BTreeMap<(IpAddr, String), String>>,
    /// Per entry and family: its local pods with no reachable egress IP.
    dropped: BTreeMap<(usize, Family), Vec<IpAddr>>,
}

fn route_claims(
    snapshot: &Snapshot,
    node: &str,
    claims: &BTreeMap<IpAddr, Claim>,
    entries: &[Entry],
    snat: &mut [Set; 2],
) -> Routed {
    let mut groups: BTreeMap<Vec<String>, BTreeSet<Family>> = BTreeMap::new();
    let mut steered: Vec<(IpAddr, Vec<String>)> = Vec::new();
    let local = underlay(snapshot, node);
    // Per entry: hosting nodes this node cannot reach, and its local pods dropped per family.
    let mut unreachable: BTreeMap<usize, BTreeMap<(IpAddr, String), String>> = BTreeMap::new();
    let mut dropped: BTreeMap<(usize, Family), Vec<IpAddr>> = BTreeMap::new();
    for (ip, claim) in claims {
        let e = &entries[claim.entry];
        let fam = Family::of(ip);
        let hosts: Vec<&(IpAddr, String)> = e
            .hosted
            .iter()
            .filter(|(h, _)| Family::of(h) == fam)
            .collect();
        if let Some((egress, _)) = hosts.iter().find(|(_, n)| n == node) {
            snat[idx(ip)].insert_mapping(key(*ip), data(*egress));
        } else if claim.node == node && !hosts.is_empty() {
            let mut nodes: Vec<String> = Vec::new();
            for (egress, host) in &hosts {
                match reach(snapshot, local, host, fam) {
                    Ok(()) => nodes.push(host.clone()),
                    Err(why) => {
                        let e = unreachable.entry(claim.entry).or_default();
                        e.insert((*egress, host.clone()), why);
                    }
                }
            }
            if nodes.is_empty() {
                dropped.entry((claim.entry, fam)).or_default().push(*ip);
            } else {
                groups.entry(nodes.clone()).or_default().insert(fam);
                steered.push((*ip, nodes));
            }
        }
    }
    Routed {
        groups,
        steered,
        unreachable,
        dropped,
    }
}

#[cfg(test)]
mod tests;
