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
//! assignments) only by one node, the object's [`reporter`], so thousands of nodes do not
//! each create the same Event.

use super::base::sets;
use super::in_force::{Scope, Validated};
use super::{BackendReport, Feature, Inputs, NodeEvent, ObjectStatus, Planned};
use crate::api::egress_ip::event_reason;
use crate::api::{EgressIP, ValidatedEgressIp};
use crate::config::Config;
use crate::net::TunnelSpec;
use crate::net::{AddressSpec, Family, NetDesired, NextHop, RouteSpec, RuleSpec, TunnelPeer};
use crate::nft::ir::*;
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// The feature's one table part: every chain and map below (the feature is planned whole).
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
/// Tunnel MACs are `0a:6e` + 4 bytes of the node's underlay address: locally administered,
/// unicast, and computable by every node from the Node objects alone.
const MAC_PREFIX: [u8; 2] = [0x0a, 0x6e];

/// Packet mark bits the agent uses for steering (`meta mark`), one value per set of hosting
/// nodes: `(n + 1) << 16`.
pub const MARK_MASK: u32 = 0x00ff_0000;
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

/// The SNAT and steering maps, per family (index [`idx`]).
struct Maps {
    snat: [Set; 2],
    steer: [Set; 2],
}

impl Maps {
    fn new() -> Maps {
        Maps {
            snat: [
                map(SNAT_V4, DataType::Ipv4Addr),
                map(SNAT_V6, DataType::Ipv6Addr),
            ],
            steer: [
                Set::new(STEER_V4, vec![DataType::Ipv4Addr], SetKind::VerdictMap),
                Set::new(STEER_V6, vec![DataType::Ipv6Addr], SetKind::VerdictMap),
            ],
        }
    }

    /// Steers the pod `ip` to `chain`.
    fn steer(&mut self, ip: IpAddr, chain: &str) {
        self.steer[idx(&ip)]
            .insert_mapping(key(ip), ElemData::Verdict(Verdict::Jump(chain.into())));
    }
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

/// The problems every node sees (no hosting node yet) and this node's own (hosting nodes it
/// cannot reach).
fn note_problems(
    entries: &mut [Entry],
    unreachable: BTreeMap<usize, BTreeMap<(IpAddr, String), String>>,
    node: &str,
) {
    for e in entries.iter_mut() {
        if e.hosted.is_empty() {
            e.problems.push(
                "status.items: no node hosts any of its egress IPs yet; the selected pods' \
                 traffic leaves as without EgressIP"
                    .into(),
            );
        }
    }
    for (i, hosts) in unreachable {
        for ((egress, host), why) in hosts {
            entries[i].local.push(format!(
                "status.items: {egress} is assigned to node {host}, which node {node} cannot \
                 reach through the tunnel: {why}"
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

/// One status per EgressIP (after those `validate_all` pushed): its problems, and the Event
/// this node writes (every problem on the object's reporter node, else this node's own).
fn push_statuses(
    statuses: &mut Vec<ObjectStatus>,
    snapshot: &Snapshot,
    node: &str,
    entries: Vec<Entry>,
    claims: &BTreeMap<IpAddr, Claim>,
) {
    for (i, e) in entries.into_iter().enumerate() {
        let reports = reporter(snapshot, &e, i, claims).as_deref() == Some(node);
        let all: Vec<&String> = e.problems.iter().chain(&e.local).collect();
        let result = if all.is_empty() {
            Ok(())
        } else {
            Err(join(&all))
        };
        let shown: Vec<&String> = if reports {
            all
        } else {
            e.local.iter().collect()
        };
        let reason = match e.reason {
            Some(r) if reports => r,
            _ => event_reason::NOT_APPLIED,
        };
        let event = (!shown.is_empty()).then(|| NodeEvent {
            reason,
            note: event_note(node, &join(&shown)),
        });
        statuses.push(ObjectStatus {
            kind: Kind::EgressIP,
            key: ObjectKey::cluster(e.key),
            result,
            event,
        });
    }
}

fn join(problems: &[&String]) -> String {
    problems
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The note of the Warning Event this node creates (names the node, reporting or not).
fn event_note(node: &str, problems: &str) -> String {
    format!("node {node}: {problems}")
}

/// The one node that reports the problems every node sees alike in an EgressIP as an Event:
/// the first (by name) of the nodes hosting its IPs, else of the nodes running pods it
/// selects, else of all nodes. All are nodes running an agent that plans this object, and
/// every agent computes the same answer from the same snapshot.
fn reporter(
    snapshot: &Snapshot,
    e: &Entry,
    index: usize,
    claims: &BTreeMap<IpAddr, Claim>,
) -> Option<String> {
    let hosting = e.hosted.iter().map(|(_, n)| n.as_str()).min();
    let selecting = || {
        claims
            .values()
            .filter(|c| c.entry == index)
            .map(|c| c.node.as_str())
            .min()
    };
    hosting
        .or_else(selecting)
        .or_else(|| snapshot.nodes().keys().next().map(String::as_str))
        .map(str::to_string)
}

/// Whether this node (tunnel source `local`) can steer `fam` traffic to `host`, else why not.
fn reach(
    snapshot: &Snapshot,
    local: Option<IpAddr>,
    host: &str,
    fam: Family,
) -> Result<(), String> {
    let Some(local) = local else {
        return Err("this node has no InternalIP to send the tunnel from".into());
    };
    let version = if local.is_ipv4() { "IPv4" } else { "IPv6" };
    if snapshot.node(host).is_none() {
        return Err(format!("there is no Node {host}"));
    }
    match underlay(snapshot, host) {
        Some(a) if a.is_ipv4() == local.is_ipv4() => {}
        _ => return Err(format!("node {host} has no {version} InternalIP")),
    }
    if fam == Family::V4 && gateway4(snapshot, host).is_none() {
        return Err(format!("node {host} has no IPv4 address"));
    }
    Ok(())
}

fn map(name: &str, t: DataType) -> Set {
    Set::new(name, vec![t], SetKind::Map(vec![t]))
}

fn idx(ip: &IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

fn key(ip: IpAddr) -> ElemKey {
    vec![Value::ip(ip).into()]
}

fn data(ip: IpAddr) -> ElemData {
    ElemData::Values(vec![Value::ip(ip)])
}

/// Valid objects in creation order (then name): the first one wins a contested pod or IP.
/// An invalid edit keeps the last valid version in force, like the other features: a typo
/// does not silently take the pods' egress IP away.
fn validate_all(
    snapshot: &Snapshot,
    memory: &EgressIpMemory,
    node: &str,
    statuses: &mut Vec<ObjectStatus>,
) -> (Vec<Entry>, EgressIpMemory) {
    let outcome = memory.update(
        Kind::EgressIP,
        Scope::Cluster,
        snapshot
            .egress_ips()
            .iter()
            .map(|(name, o)| (ObjectKey::cluster(name), o)),
        EgressIP::validate,
    );
    let mut entries = Vec::new();
    for status in outcome.statuses {
        let name = &status.key.name;
        let mut reason = None;
        let problems = match &status.result {
            Ok(()) => Vec::new(),
            Err(err) if outcome.fell_back.contains(name) => {
                reason = Some(event_reason::INVALID);
                vec![format!("{err} (the last valid version stays in force)")]
            }
            Err(err) => {
                // Nothing of it is in force: reported by the first node its status names, else
                // by the first node.
                let object = snapshot.egress_ips().get(name);
                let items = object
                    .iter()
                    .flat_map(|o| o.status.iter().flat_map(|s| &s.items));
                let first = items
                    .map(|i| i.node.as_str())
                    .filter(|n| !n.is_empty())
                    .min();
                let first = first.or_else(|| snapshot.nodes().keys().next().map(String::as_str));
                let event = (first == Some(node)).then(|| NodeEvent {
                    reason: event_reason::INVALID,
                    note: event_note(node, err),
                });
                statuses.push(ObjectStatus { event, ..status });
                continue;
            }
        };
        let in_force = &outcome.validated.in_force[name];
        entries.push(Entry {
            key: name.clone(),
            object: in_force.object.clone(),
            valid: in_force.valid.clone(),
            problems,
            reason,
            local: Vec::new(),
            hosted: Vec::new(),
        });
    }
    let ts = |e: &Entry| e.object.metadata.creation_timestamp.as_ref().map(|t| t.0);
    entries.sort_by(|a, b| (ts(a).is_none(), ts(a), &a.key).cmp(&(ts(b).is_none(), ts(b), &b.key)));
    (entries, outcome.validated)
}

/// Drops (and reports) IPs that are a node's own address or that an earlier EgressIP already
/// has, and a second IP of the same family assigned to one node.
fn check_addresses(snapshot: &Snapshot, entries: &mut [Entry]) {
    let mut node_of: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for (name, node) in snapshot.nodes() {
        for ip in snapshot::node_ips(node) {
            node_of.entry(ip).or_insert(name);
        }
    }
    let mut owner: BTreeMap<IpAddr, String> = BTreeMap::new();
    for e in entries.iter_mut() {
        let mut usable = BTreeSet::new();
        for (i, ip) in e.valid.ips.iter().enumerate() {
            let field = format!("spec.egressIPs[{i}]");
            if let Some(n) = node_of.get(ip) {
                e.problems
                    .push(format!("{field}: {ip} is an address of node {n}"));
                e.reason.get_or_insert(event_reason::CONFLICT_WITH_NODE);
            } else if let Some(first) = owner.get(ip) {
                e.problems.push(format!(
                    "{field}: {ip} is also requested by EgressIP {first}, created earlier, which wins"
                ));
                e.reason.get_or_insert(event_reason::ALREADY_ALLOCATED);
            } else {
                owner.insert(*ip, e.key.clone());
                usable.insert(*ip);
            }
        }
        let mut taken: BTreeSet<(String, bool)> = BTreeSet::new();
        for ip in &e.valid.ips {
            let Some(node) = e.valid.assignments.get(ip) else {
                continue;
            };
            if !usable.contains(ip) {
                continue;
            }
            if taken.insert((node.clone(), ip.is_ipv6())) {
                e.hosted.push((*ip, node.clone()));
            } else {
                e.problems.push(format!(
                    "status.items: {ip} is assigned to node {node}, which already hosts another \
                     IP of this EgressIP of the same family; it is not used"
                ));
            }
        }
    }
}

/// Pod address -> the first EgressIP (creation order) that selects the pod. Later objects
/// selecting the same pod are reported.
fn claim_pods(snapshot: &Snapshot, entries: &mut [Entry]) -> BTreeMap<IpAddr, Claim> {
    let mut claims: BTreeMap<IpAddr, Claim> = BTreeMap::new();
    let mut pod_owner: BTreeMap<ObjectKey, usize> = BTreeMap::new();
    for i in 0..entries.len() {
        let mut conflicts: Vec<String> = Vec::new();
        for (ns_name, ns) in snapshot.namespaces() {
            if !entries[i]
                .valid
                .namespace_selector
                .matches_meta(&ns.metadata)
            {
                continue;
            }
            for pod in snapshot.pods_in_namespace(ns_name) {
                let selected = entries[i].valid.pod_selector.matches_meta(&pod.metadata)
                    && !snapshot::pod_is_host_network(pod)
                    && !snapshot::pod_is_terminal(pod);
                let Some(node) = snapshot::pod_node_name(pod).filter(|_| selected) else {
                    continue;
                };
                let pod_key = ObjectKey::of(Kind::Pod, &pod.metadata);
                if let Some(first) = pod_owner.get(&pod_key) {
                    conflicts.push(format!("{pod_key} (EgressIP {})", entries[*first].key));
                    continue;
                }
                pod_owner.insert(pod_key, i);
                for ip in snapshot::pod_ips(pod) {
                    claims.entry(ip).or_insert(Claim {
                        entry: i,
                        node: node.to_string(),
                    });
                }
            }
        }
        if let Some(first) = conflicts.first() {
            let more = conflicts.len() - 1;
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            entries[i].problems.push(format!(
                "spec.podSelector: pod {first}{more} already selected by an EgressIP created \
                 earlier, which wins"
            ));
            entries[i]
                .reason
                .get_or_insert(event_reason::POD_ALREADY_SERVED);
        }
    }
    claims
}

/// This node's underlay address: its first InternalIP (IPv4 preferred).
fn underlay(snapshot: &Snapshot, node: &str) -> Option<IpAddr> {
    let ips = snapshot::node_internal_ips(snapshot.node(node)?);
    ips.iter().find(|ip| ip.is_ipv4()).or(ips.first()).copied()
}

/// The tunnel MAC every node computes for `underlay`.
pub fn tunnel_mac(underlay: IpAddr) -> [u8; 6] {
    let tail: [u8; 4] = match underlay {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [
        MAC_PREFIX[0],
        MAC_PREFIX[1],
        tail[0],
        tail[1],
        tail[2],
        tail[3],
    ]
}

/// IPv6 gateway on the tunnel for a peer: a link-local address derived from its MAC (only a
/// neighbour-table key: nobody owns it).
pub fn tunnel_gateway6(mac: [u8; 6]) -> Ipv6Addr {
    let seg = |a: u8, b: u8| u16::from_be_bytes([a, b]);
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        0,
        seg(mac[0], mac[1]),
        seg(mac[2], mac[3]),
        seg(mac[4], mac[5]),
    )
}

/// IPv4 gateway on the tunnel for a peer: its first IPv4 node address (onlink).
fn gateway4(snapshot: &Snapshot, node: &str) -> Option<IpAddr> {
    let n = snapshot.node(node)?;
    let internal = snapshot::node_internal_ips(n);
    let all = snapshot::node_ips(n);
    internal.into_iter().chain(all).find(IpAddr::is_ipv4)
}

/// The tunnel exists on every node while some EgressIP IP is hosted somewhere (hosting nodes
/// receive on it, others send on it); peers are the hosting nodes this node steers to.
fn tunnel_spec(
    snapshot: &Snapshot,
    node: &str,
    entries: &[Entry],
    groups: &[(Vec<String>, BTreeSet<Family>)],
) -> Option<TunnelSpec> {
    if entries.iter().all(|e| e.hosted.is_empty()) {
        return None;
    }
    let local = underlay(snapshot, node)?;
    let mut peers = BTreeSet::new();
    let names: BTreeSet<&String> = groups.iter().flat_map(|(n, _)| n).collect();
    for name in names {
        let Some(addr) = underlay(snapshot, name).filter(|a| a.is_ipv4() == local.is_ipv4()) else {
            continue;
        };
        let mac = tunnel_mac(addr);
        let mut gateways: Vec<IpAddr> = gateway4(snapshot, name).into_iter().collect();
        gateways.push(tunnel_gateway6(mac).into());
        peers.insert(TunnelPeer {
            underlay: addr,
            mac,
            gateways,
        });
    }
    Some(TunnelSpec {
        name: TUNNEL_DEV.into(),
        vni: TUNNEL_VNI,
        port: TUNNEL_PORT,
        local,
        mac: tunnel_mac(local),
        peers,
    })
}

/// Group `n`'s chain: packets to destinations outside the cluster get the group's mark.
fn steer_chain(part: &mut Part, n: usize) -> String {
    let name = format!("eip-steer-{n}");
    let mut chain = Chain::regular(&name);
    for rule in leaves_cluster() {
        chain.push(rule);
    }
    chain.push(Rule::new(vec![
        Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
        Stmt::Verdict(Verdict::Return),
    ]));
    // Only our bits change: other components' marks (e.g. service masquerade) survive.
    chain.push(Rule::new(vec![
        Stmt::MarkAnd(!MARK_MASK),
        Stmt::MarkOr(mark(n)),
        Stmt::Counter,
    ]));
    part.add_chain(chain);
    name
}

/// [`UNREACHABLE`]: packets to destinations outside the cluster are counted and dropped.
fn unreachable_chain(part: &mut Part) {
    let mut chain = Chain::regular(UNREACHABLE);
    for rule in leaves_cluster() {
        chain.push(rule);
    }
    chain.push(Rule::new(vec![
        Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
        Stmt::Verdict(Verdict::Return),
    ]));
    chain.push(Rule::new(vec![Stmt::Counter, Stmt::Verdict(Verdict::Drop)]));
    part.add_chain(chain);
}

pub fn mark(n: usize) -> u32 {
    ((n as u32) + 1) << 16
}

/// `return` for destinations in the cluster, service and node sets.
fn leaves_cluster() -> Vec<Rule> {
    let v4 = [sets::CLUSTER_V4, sets::SERVICE_V4, sets::NODE_IPS_V4];
    let v6 = [sets::CLUSTER_V6, sets::SERVICE_V6, sets::NODE_IPS_V6];
    let ret = |field: Field, set: &str| {
        Rule::new(vec![
            Stmt::in_set(vec![field], set),
            Stmt::Verdict(Verdict::Return),
        ])
    };
    v4.iter()
        .map(|s| ret(Field::Ip4Daddr, s))
        .chain(v6.iter().map(|s| ret(Field::Ip6Daddr, s)))
        .collect()
}

/// [`RETURN_TABLE`] and its rule (IPv4: IPv6 has no reverse-path filter in routing).
fn return_routing(config: &Config, tunnel: &TunnelSpec, net: &mut NetDesired) {
    let cidrs: Vec<IpNet> = config
        .cluster_cidrs
        .iter()
        .filter(|c| c.addr().is_ipv4())
        .copied()
        .collect();
    if cidrs.is_empty() {
        return;
    }
    for dst in cidrs {
        net.routes.insert(RouteSpec {
            table: RETURN_TABLE,
            dst,
            nexthops: vec![NextHop {
                via: None,
                dev: Some(tunnel.name.clone()),
                weight: 1,
                onlink: false,
            }],
            local: false,
        });
    }
    net.rules.insert(RuleSpec {
        priority: RETURN_RULE_PRIORITY,
        fwmark: Some((TUNNELED, TUNNELED)),
        from: None,
        table: RETURN_TABLE,
        family: Family::V4,
    });
}

/// The rule and multipath default route(s) of steering group `n`.
fn steer_routing(
    snapshot: &Snapshot,
    tunnel: &TunnelSpec,
    n: usize,
    nodes: &[String],
    families: &BTreeSet<Family>,
    net: &mut NetDesired,
) {
    let table = STEER_TABLE_BASE + n as u32;
    for family in families {
        let mut nexthops = Vec::new();
        for name in nodes {
            let Some(addr) = underlay(snapshot, name) else {
                continue;
            };
            let peer = tunnel.peers.iter().find(|p| p.underlay == addr);
            let Some(peer) = peer else { continue };
            let via = peer
                .gateways
                .iter()
                .find(|g| Family::of(g) == *family)
                .copied();
            if let Some(via) = via {
                nexthops.push(NextHop {
                    via: Some(via),
                    dev: Some(tunnel.name.clone()),
                    weight: 1,
                    onlink: via.is_ipv4(),
                });
            }
        }
        if nexthops.is_empty() {
            continue;
        }
        let dst: IpNet = match family {
            Family::V4 => "0.0.0.0/0".parse().expect("valid"),
            Family::V6 => "::/0".parse().expect("valid"),
        };
        net.routes.insert(RouteSpec {
            table,
            dst,
            nexthops,
            local: false,
        });
        net.rules.insert(RuleSpec {
            priority: STEER_RULE_PRIORITY,
            fwmark: Some((mark(n), MARK_MASK)),
            from: None,
            table,
            family: *family,
        });
    }
}

fn add_base_chains(part: &mut Part) {
    let base = |kind, hook, priority| BaseChain {
        kind,
        hook,
        priority,
        policy: Policy::Accept,
    };
    let mut pre = Chain::base(
        PREROUTING,
        base(ChainType::Filter, Hook::Prerouting, PREROUTING_PRIORITY),
    );
    for rule in tunnel_guard() {
        pre.push(rule);
    }
    // Only connections the pods opened: replies to inbound connections are not steered.
    let original = || Stmt::matches(Field::CtDirection, Value::CtDir(CtDir::Original));
    pre.push(Rule::new(vec![
        Stmt::matches(Field::IifName, Value::IfName(TUNNEL_DEV.into())),
        Stmt::MarkOr(TUNNELED),
    ]));
    pre.push(Rule::new(vec![
        original(),
        Stmt::vmap(vec![Field::Ip4Saddr], STEER_V4),
    ]));
    pre.push(Rule::new(vec![
        original(),
        Stmt::vmap(vec![Field::Ip6Saddr], STEER_V6),
    ]));
    part.add_chain(pre);
    let mut post = Chain::base(
        POSTROUTING,
        base(ChainType::Nat, Hook::Postrouting, POSTROUTING_PRIORITY),
    );
    for rule in leaves_cluster() {
        post.push(rule);
    }
    for (family, field, set) in [
        (IpFamily::V4, Field::Ip4Saddr, SNAT_V4),
        (IpFamily::V6, Field::Ip6Saddr, SNAT_V6),
    ] {
        post.push(Rule::new(vec![Stmt::Nat(Nat {
            kind: NatKind::Snat,
            family,
            addr: NatAddr::Map {
                key: vec![field],
                map: set.into(),
            },
        })]));
    }
    // Steered here but no SNAT on this node (a move in flight: the sender's node switched
    // before this one got the mapping, or away from it): drop, never let a CNI masquerade it
    // to this node's address. The dropped first packet leaves no conntrack entry, so the
    // flow's next packet meets the mapping once it is in place.
    post.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Mark],
            op: MatchOp::AnyFlag(TUNNELED),
        }),
        Stmt::Counter,
        Stmt::Verdict(Verdict::Drop),
    ]));
    part.add_chain(post);
    let mut out = Chain::base(
        TUNNEL_OUT,
        base(ChainType::Filter, Hook::Postrouting, TUNNEL_OUT_PRIORITY),
    );
    out.push(Rule::new(vec![
        Stmt::matches(Field::OifName, Value::IfName(TUNNEL_DEV.into())),
        Stmt::MarkAnd(!MARK_MASK),
    ]));
    part.add_chain(out);
}

/// The tunnel carries packets between nodes only. A node's own tunnel packets leave from the
/// output path; so any tunnel packet this node would forward to a node (a pod's, whatever
/// its CNI's masquerade later makes its source) is dropped, and one to this node must come
/// from a node address. Otherwise a pod or a host on the segment could have a hosting node
/// decapsulate an inner packet with another tenant's source and SNAT it to that tenant's
/// egress IP (the tunnel is exempt from the source checks).
fn tunnel_guard() -> Vec<Rule> {
    let udp = || Stmt::matches(Field::L4Proto, Value::Proto(17));
    let port = || Stmt::matches(Field::ThDport, Value::Port(TUNNEL_PORT));
    let local = |eq: bool| {
        let value = vec![Value::AddrType(AddrType::Local)];
        Stmt::Match(Match {
            key: vec![Field::FibDaddrType],
            op: if eq {
                MatchOp::Eq(value)
            } else {
                MatchOp::Ne(value)
            },
        })
    };
    let drop = |mut stmts: Vec<Stmt>, why: &str| {
        stmts.extend([Stmt::Counter, Stmt::Verdict(Verdict::Drop)]);
        Rule::new(stmts).with_comment(why)
    };
    [
        (Field::Ip4Saddr, Field::Ip4Daddr, sets::NODE_IPS_V4),
        (Field::Ip6Saddr, Field::Ip6Daddr, sets::NODE_IPS_V6),
    ]
    .into_iter()
    .flat_map(|(saddr, daddr, nodes)| {
        [
            drop(
                vec![
                    udp(),
                    port(),
                    Stmt::in_set(vec![daddr], nodes),
                    local(false),
                ],
                "EgressIP tunnel: only nodes send to a node's tunnel",
            ),
            drop(
                vec![
                    udp(),
                    port(),
                    local(true),
                    Stmt::not_in_set(vec![saddr], nodes),
                ],
                "EgressIP tunnel: only from a node address",
            ),
        ]
    })
    .collect()
}

/// Attributes an address the net backend could not place (no interface subnet contains it,
/// or it is the node's own) to the EgressIP that asked for it, and replaces the SNAT
/// elements that would send traffic from an address the node does not hold by steering
/// elements to [`UNREACHABLE`] (fail closed: the pods' traffic, local or arriving through the
/// tunnel, must not leave with the node's address instead).
fn address_refused(
    snapshot: &Snapshot,
    node: &str,
    table: &mut Table,
    statuses: &mut [ObjectStatus],
    ip: IpAddr,
    reason: &str,
) {
    let mut pods = 0;
    if let Some(part) = table.part_mut(PART) {
        for (snat, steer) in [(SNAT_V4, STEER_V4), (SNAT_V6, STEER_V6)] {
            let mut gone = Vec::new();
            if let Some(s) = part.sets.get_mut(snat) {
                s.elements.retain(|k, v| {
                    let keep = v.data != Some(data(ip));
                    if !keep {
                        gone.push(k.clone());
                    }
                    keep
                });
            }
            pods += gone.len();
            if let Some(s) = part.sets.get_mut(steer) {
                for k in gone {
                    s.insert_mapping(k, ElemData::Verdict(Verdict::Jump(UNREACHABLE.into())));
                }
            }
        }
        if pods > 0 && !part.chains.contains_key(UNREACHABLE) {
            unreachable_chain(part);
        }
    }
    for (name, object) in snapshot.egress_ips() {
        let Ok(valid) = object.validate() else {
            continue;
        };
        let Some(i) = valid.ips.iter().position(|x| *x == ip) else {
            continue;
        };
        let mut msg = format!("spec.egressIPs[{i}]: {ip}: {reason}");
        if pods > 0 {
            msg.push_str(&format!(
                "; the traffic of its {pods} selected pod address(es) to destinations outside \
                 the cluster is dropped on node {node}"
            ));
        }
        for s in statuses.iter_mut() {
            if s.kind == Kind::EgressIP && s.key.name == *name {
                s.result = match &s.result {
                    Ok(()) => Err(msg.clone()),
                    Err(e) => Err(format!("{e}; {msg}")),
                };
                // This node's own problem: reported by it whichever node reports the rest.
                s.event = Some(match s.event.take() {
                    None => NodeEvent {
                        reason: event_reason::NOT_APPLIED,
                        note: event_note(node, &msg),
                    },
                    Some(e) => NodeEvent {
                        note: format!("{}; {msg}", e.note),
                        ..e
                    },
                });
            }
        }
    }
}

mod conflicts;
use conflicts::report_conflicts;

#[cfg(test)]
mod tests;
