//! Services: ClusterIP, NodePort, externalIPs and LoadBalancer IPs load-balanced in
//! nftables, in the spirit of kube-proxy's nftables mode but cheaper to update.
//!
//! Per packet (first packet of a connection; conntrack does the rest):
//!
//! 1. `nat-prerouting` / `nat-output` jump to `svc-dispatch`: the destination's address
//!    shard (`ip daddr & 0.0.0.15`, [`names::AddrShard`]) picks the shard's chain, which
//!    does one verdict-map lookup on `ip daddr . meta l4proto . th dport`
//!    (`svc-dispatch-v4-<shard>`) for ClusterIPs, external IPs and LB IPs; then, for local
//!    destinations (`fib daddr type local`), one lookup on `meta nfproto . meta l4proto .
//!    th dport` (`svc-nodeports`) for NodePorts.
//! 2. The element's verdict is `goto` a shared [`pools`] chain, one per (family, frontend
//!    kind, traffic policy, number of backends, backends-map shard): e.g. `svc-v4-c3-s7`
//!    masquerades sources outside the cluster and then `dnat ip to ip daddr . meta l4proto
//!    . th dport . numgen random mod 3 map @svc-backends-v4-7`. The backends are data-map
//!    elements keyed by frontend and bucket ([`maps`]), so an endpoint change is an element
//!    update: no rule and no chain changes, nothing for nf_tables to re-validate at commit. A
//!    change in the number of backends re-points the service's dispatch elements to another
//!    pool chain.
//! 3. Services with session affinity or loadBalancerSourceRanges keep per-service chains
//!    ([`chains`]: per-endpoint DNAT chains with affinity sets, a source filter), as
//!    kube-proxy does; their endpoint changes rewrite that service's chains only.
//! 4. `nat-postrouting` masquerades marked packets and hairpin connections (`ip saddr . ip
//!    daddr @svc-hairpin-v4`: this node's endpoints reaching themselves).
//! 5. New connections that were not DNATed meet `svc-check` in the filter hooks: known
//!    external frontends without endpoints and allocated ClusterIPs (wrong port, no
//!    endpoints) are rejected; the rest of the service CIDRs is dropped.
//!
//! Each Service is planned into its own [`Part`] and memoized by the `Arc`s of its inputs
//! (Service, slices, Endpoints); see [`Memo`]. Pool chains, address shards and hairpin
//! elements are shared parts counted by the services using them. An endpoint change re-plans one service and
//! the diff touches only that service's elements.

pub mod chains;
mod claims;
pub mod maps;
mod memo;
pub mod model;
pub mod names;
pub mod nodeports;
pub mod pools;
mod skeleton;
pub mod topology;

use super::{Feature, Inputs, ObjectStatus, Planned};
use crate::api::{EndpointSlice, Service};
use crate::config::Config;
use crate::nft::ir::*;
use crate::snapshot::{self, ObjectKey, Snapshot};
use claims::{Claim, Rank, claims_of, externals_on, winner};
use ipnet::IpNet;
use memo::changed_services;
use model::{AddressRules, Sources};
use pools::Pool;
use skeleton::{address_backends_maps, address_shard_sets, static_objects};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// What was planned for one service, kept to re-use it while its inputs are the same.
#[derive(Debug, Clone)]
struct Entry {
    /// `want` without the frontends other services won (the same `Arc` when none).
    part: Option<Arc<Part>>,
    /// The part as planned from the service alone.
    want: Option<Arc<Part>>,
    rank: Rank,
    /// The frontends the service asks for, each with the field it comes from.
    claims: Vec<(Claim, String)>,
    /// What the service itself gets wrong (refused addresses, an invalid field).
    refused: Vec<String>,
    /// Refused addresses that are a node's (re-planned when node addresses change).
    node_refused: Vec<IpAddr>,
    /// UDP backends (address, port): removed ones get their conntrack entries deleted.
    udp: Vec<(IpAddr, u16)>,
    /// The UDP frontends with at least one endpoint: the ones new since the last plan get
    /// the entries of flows that met no endpoint there deleted.
    udp_frontends: Vec<UdpFrontend>,
    health: Option<(u16, usize)>,
    /// The service's ports with a Local traffic policy and no local endpoint, by family and
    /// policy (kube-proxy's `sync_proxy_rules_no_local_endpoints_total`).
    no_local: Vec<NoLocalEndpoints>,
    error: Option<String>,
    /// Shared pool chains the service's dispatch elements go to.
    pools: BTreeSet<Pool>,
    /// This node's endpoint addresses (hairpin masquerade elements).
    hairpin: BTreeSet<IpAddr>,
    /// The address shards the service's dispatch elements and ClusterIPs are in.
    shards: BTreeSet<names::AddrShard>,
}

/// The services planner's memory: the last plan of every service, keyed `svc/ns/name`.
/// Persistent maps, so carrying it from plan to plan is O(1) and an update O(change).
#[derive(Debug, Clone, Default)]
pub struct Memo {
    /// The snapshot the entries were planned from (to find what changed by pointer).
    snapshot: Option<Snapshot>,
    /// The configuration the entries were planned with; another one re-plans everything.
    settings: Option<Settings>,
    entries: imbl::OrdMap<String, Arc<Entry>>,
    parts: Parts,
    errors: imbl::OrdMap<String, ObjectStatus>,
    /// Every frontend asked for, with the services asking, oldest first: the first owns
    /// it (see [`winner`]), so the outcome depends on the objects, not on processing order.
    /// A sorted `Vec`: almost every frontend has one asker (a tree set per frontend would
    /// cost kilobytes each at 10,000 services).
    claims: imbl::OrdMap<Claim, Vec<Rank>>,
    /// Every Node's InternalIP/ExternalIP (no service frontend may be one).
    node_ips: Arc<BTreeMap<IpAddr, String>>,
    /// The services that had an address refused for being a node's, by address.
    node_refused: imbl::OrdMap<IpAddr, imbl::OrdSet<ObjectKey>>,
    /// healthCheckNodePort -> (service, ready local endpoints) of eTP=Local services.
    health: HealthChecks,
    /// Service ports with a Local traffic policy and no local endpoint, counted by family
    /// and policy (kept up to date by `remember`/`forget`: O(change)).
    no_local: imbl::OrdMap<NoLocalEndpoints, usize>,
    /// Shared objects by the number of services using them: each lives in its own part
    /// (`svc-pool/<chain>`, `svc-hairpin/<ip>`) while the count is above zero.
    pools: imbl::OrdMap<Pool, usize>,
    hairpin: imbl::OrdMap<IpAddr, usize>,
    /// Address shards (`svc-shard/<family>-<shard>`: their chains and selector elements).
    shards: imbl::OrdMap<names::AddrShard, usize>,
}

impl Memo {
    /// Every UDP backend currently in use (for a full conntrack sweep).
    pub fn udp_backends(&self) -> BTreeSet<(IpAddr, u16)> {
        self.entries
            .values()
            .flat_map(|e| e.udp.iter().copied())
            .collect()
    }
}

/// The configuration a service plan depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    node: String,
    service_cidrs: Vec<IpNet>,
    allowed: Vec<IpNet>,
    rejected: Vec<IpNet>,
    cluster_cidrs: Vec<IpNet>,
    lb_allowed: Vec<IpNet>,
    lb_rejected: Vec<IpNet>,
    /// This node's primary addresses (from its Node object): they rarely change, and a
    /// change re-plans every service.
    node_primary: Vec<IpAddr>,
    nodeport_addresses: crate::config::NodePortAddresses,
    /// This node's `topology.kubernetes.io/zone` label.
    zone: Option<String>,
}

impl Settings {
    fn of(config: &Config, snapshot: &Snapshot) -> Settings {
        let node = snapshot.nodes().get(&config.node_name);
        Settings {
            node: config.node_name.clone(),
            service_cidrs: config.service_cidrs.clone(),
            allowed: config.external_ip_allowed_cidrs.clone(),
            rejected: config.external_ip_rejected_cidrs.clone(),
            cluster_cidrs: config.cluster_cidrs.clone(),
            lb_allowed: config.load_balancer_ip_allowed_cidrs.clone(),
            lb_rejected: config.load_balancer_ip_rejected_cidrs.clone(),
            node_primary: node
                .map(|n| snapshot::node_primary_ips(n))
                .unwrap_or_default(),
            nodeport_addresses: config.nodeport_addresses.clone(),
            zone: node
                .and_then(|n| {
                    snapshot::labels(&n.metadata)
                        .get(topology::ZONE_LABEL)
                        .cloned()
                })
                .filter(|z| !z.is_empty()),
        }
    }
}

/// healthCheckNodePort -> (service, ready local endpoints) of `externalTrafficPolicy: Local`
/// services. A persistent map: handing it on is O(1).
pub type HealthChecks = imbl::OrdMap<u16, (String, usize)>;

/// A UDP service frontend: an address and port (ClusterIP, external IP, LB IP), or a
/// NodePort (any local address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UdpFrontend {
    Addr(IpAddr, u16),
    NodePort(u16),
}

/// A service port with `internalTrafficPolicy` (`external: false`) or
/// `externalTrafficPolicy` (`external: true`) `Local` and no endpoint on this node, in one
/// address family (kube-proxy counts these per family and policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NoLocalEndpoints {
    pub family: IpFamily,
    pub external: bool,
}

/// What the conntrack cleanup after a commit did in one address family.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ConntrackReconciled {
    pub took: std::time::Duration,
    pub deleted: usize,
}

/// What the services hand to the world besides their table.
#[derive(Debug, Clone, Default)]
pub struct ServicesOutput {
    /// UDP service backends that went away: their conntrack entries are to be deleted
    /// (`crate::conntrack`, after the commit).
    pub stale_udp: Vec<(IpAddr, u16)>,
    /// UDP service frontends that just got their first endpoint: the entries of flows that
    /// met no endpoint there (never DNATed) are to be deleted.
    pub new_udp_frontends: Vec<UdpFrontend>,
    /// The health-check ports to serve.
    pub health_checks: HealthChecks,
    /// Service ports with a Local traffic policy and no local endpoint (absent: none).
    pub no_local_endpoints: imbl::OrdMap<NoLocalEndpoints, usize>,
    /// What the conntrack cleanup after the commit did, IPv4 then IPv6 (set by
    /// `after_commit`; `None` when there was nothing to clean up or it failed).
    pub conntrack: Option<[ConntrackReconciled; 2]>,
}

/// The services feature (see the module documentation).
pub struct Services;

/// The services keep nothing across restarts: their objects have no last valid version.
impl crate::plan::Remember for Memo {
    type Kept = ();

    fn kept(&self) {}

    fn restore(_: ()) -> Self {
        Memo::default()
    }

    fn keeps(&self, _: &()) -> bool {
        true
    }
}

impl Feature for Services {
    const NAME: &'static str = "svc";
    const SWITCH: crate::features::Switch = crate::features::Switch::Services;
    type Memory = Memo;
    type Output = ServicesOutput;

    fn is_bulk_map(name: &str) -> bool {
        names::is_bulk_map(name)
    }

    fn plan(inputs: &Inputs, memo: &Memo, out: &mut Planned, output: &mut ServicesOutput) -> Memo {
        let outcome = plan(inputs.snapshot, inputs.config, memo, &mut out.ruleset);
        out.statuses.extend(outcome.statuses);
        output.stale_udp.extend(outcome.stale_udp);
        output.new_udp_frontends.extend(outcome.new_udp_frontends);
        output.health_checks = outcome.memo.health.clone();
        output.no_local_endpoints = outcome.memo.no_local.clone();
        outcome.memo
    }
}

/// What the services planner hands back besides what it adds to the table.
#[derive(Debug, Clone, Default)]
struct Outcome {
    pub statuses: Vec<ObjectStatus>,
    pub memo: Memo,
    /// UDP backends that stopped being used since the last plan (flows to them must go).
    pub stale_udp: Vec<(IpAddr, u16)>,
    /// UDP frontends that got their first endpoint since the last plan.
    pub new_udp_frontends: Vec<UdpFrontend>,
}

fn part_key(k: &ObjectKey) -> String {
    format!("svc/{}/{}", k.namespace, k.name)
}

/// Adds the services objects to `table`, re-planning only services whose inputs changed,
/// and the services that won or lost a frontend because of them.
fn plan(snapshot: &Snapshot, config: &Config, memo: &Memo, table: &mut Table) -> Outcome {
    static_objects(table);
    let mut memo = memo.clone();
    let settings = Settings::of(config, snapshot);
    let node_ips = node_ips(snapshot);
    let mut changed: BTreeSet<ObjectKey> = match &memo.snapshot {
        Some(prev) if memo.settings.as_ref() == Some(&settings) => changed_services(prev, snapshot),
        _ => {
            memo = Memo::default();
            let addrs =
                nodeports::addresses_part(&settings.nodeport_addresses, &settings.node_primary);
            memo.parts.insert(nodeports::PART.into(), Arc::new(addrs));
            snapshot.services().keys().cloned().collect()
        }
    };
    memo.update_node_ips(node_ips, &mut changed);
    let rules = AddressRules {
        node_ips: &memo.node_ips.clone(),
        node_primary: &settings.node_primary,
        service_cidrs: &config.service_cidrs,
        external_allowed: &config.external_ip_allowed_cidrs,
        external_rejected: &config.external_ip_rejected_cidrs,
        cluster_cidrs: &config.cluster_cidrs,
        lb_allowed: &config.load_balancer_ip_allowed_cidrs,
        lb_rejected: &config.load_balancer_ip_rejected_cidrs,
    };
    let mut stale_udp = Vec::new();
    let mut new_udp_frontends = Vec::new();
    // The owner of every claim a changed service drops or makes, before the change.
    let mut before: BTreeMap<Claim, Option<Rank>> = BTreeMap::new();
    let mut settle: BTreeSet<ObjectKey> = BTreeSet::new();
    let zone = settings.zone.as_deref();
    for key in &changed {
        let pk = part_key(key);
        let new = snapshot
            .services()
            .get(key)
            .map(|svc| plan_service(snapshot, config, &rules, zone, key, svc));
        let old_frontends = memo.entries.get(&pk).map(|e| e.udp_frontends.clone());
        if let Some(e) = &new {
            let old = old_frontends.unwrap_or_default();
            new_udp_frontends.extend(e.udp_frontends.iter().filter(|f| !old.contains(f)));
        }
        if let Some(old) = memo.entries.remove(&pk) {
            let keep: BTreeSet<_> = new.iter().flat_map(|e| e.udp.iter()).collect();
            stale_udp.extend(old.udp.iter().filter(|b| !keep.contains(b)).copied());
            memo.forget(key, &old, &mut before);
        }
        memo.errors.remove(&pk);
        memo.parts.remove(&pk);
        let Some(e) = new else { continue };
        memo.remember(key, e, &mut before);
        settle.insert(key.clone());
    }
    // Whoever asks for a frontend whose owner changed is settled again (it may have won or
    // lost it, or lost it to someone else), unchanged or not.
    for (c, was) in &before {
        if winner(&memo.claims, c) == was.as_ref() {
            continue;
        }
        let mut askers: Vec<&Vec<Rank>> = memo.claims.get(c).into_iter().collect();
        if let Claim::Cluster(ip) = c {
            askers.extend(externals_on(&memo.claims, *ip).map(|(_, r)| r));
        }
        settle.extend(askers.into_iter().flatten().map(|r| r.key.clone()));
    }
    for key in &settle {
        memo.settle(key);
    }
    memo.snapshot = Some(snapshot.clone());
    memo.settings = Some(settings);
    table.extend_parts(&memo.parts);
    address_backends_maps(table, &memo.pools);
    address_shard_sets(table, &memo.shards);
    Outcome {
        statuses: memo.errors.values().cloned().collect(),
        memo,
        stale_udp,
        new_udp_frontends,
    }
}

/// Every Node's InternalIP/ExternalIP with the (first by name) node that has it.
fn node_ips(snapshot: &Snapshot) -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    for (name, node) in snapshot.nodes() {
        for ip in snapshot::node_ips(node) {
            out.entry(ip).or_insert_with(|| name.clone());
        }
    }
    out
}

impl Entry {
    /// A service planned to nothing yet (a service that is not proxied stays so).
    fn empty(rank: Rank) -> Entry {
        Entry {
            part: None,
            want: None,
            rank,
            claims: Vec::new(),
            refused: Vec::new(),
            node_refused: Vec::new(),
            udp: Vec::new(),
            udp_frontends: Vec::new(),
            health: None,
            no_local: Vec::new(),
            error: None,
            pools: BTreeSet::new(),
            hairpin: BTreeSet::new(),
            shards: BTreeSet::new(),
        }
    }
}

/// The UDP frontends of the `served` ports (port, NodePort) that have endpoints.
fn udp_frontends(model: &model::Model, served: BTreeSet<(u16, Option<u16>)>) -> Vec<UdpFrontend> {
    let mut out = Vec::new();
    let addrs = || {
        model
            .cluster_ips
            .iter()
            .chain(&model.external_ips)
            .chain(&model.lb_ips)
    };
    for (port, node_port) in served {
        out.extend(addrs().map(|ip| UdpFrontend::Addr(*ip, port)));
        out.extend(node_port.map(UdpFrontend::NodePort));
    }
    out.sort();
    out.dedup();
    out
}

fn plan_service(
    snapshot: &Snapshot,
    config: &Config,
    rules: &AddressRules,
    zone: Option<&str>,
    key: &ObjectKey,
    svc: &Arc<Service>,
) -> Entry {
    let slices: Vec<Arc<EndpointSlice>> = snapshot
        .endpoint_slices_for_service(&key.namespace, &key.name)
        .cloned()
        .collect();
    let endpoints = if slices.is_empty() {
        snapshot
            .endpoints_for_service(&key.namespace, &key.name)
            .cloned()
    } else {
        None
    };
    let mut entry = Entry::empty(Rank::of(key, svc));
    let model = match model::parse(svc, rules) {
        Ok(Some(m)) => m,
        Ok(None) => return entry,
        Err(e) => {
            entry.refused.push(e);
            return entry;
        }
    };
    entry.refused = model.refused.clone();
    entry.node_refused = model.node_refused.clone();
    entry.claims = claims_of(&model);
    let sources = if slices.is_empty() {
        Sources::Endpoints(endpoints.as_deref())
    } else {
        Sources::Slices(&slices)
    };
    let node = &config.node_name;
    let (ports, local_ready, served) = port_backends(&model, &sources, node, zone, &mut entry);
    entry.udp.sort();
    entry.udp.dedup();
    entry.udp_frontends = udp_frontends(&model, served);
    entry.health = model.health_check_node_port.map(|p| (p, local_ready.len()));
    let part = if model.affinity.is_some() || !model.lb_source_ranges.is_empty() {
        chains::service_part(&key.to_string(), &model, &ports)
    } else {
        let planned = maps::service_part(&model, &ports);
        entry.pools = planned.pools;
        entry.hairpin = planned.hairpin;
        planned.part
    };
    entry.shards = part
        .elements
        .keys()
        .filter_map(|set| names::AddrShard::of_set(set))
        .collect();
    entry.want = Some(Arc::new(part));
    entry
}

/// Each port's backends per family, noted in `entry` as kube-proxy counts them (UDP
/// backends, each port of each family whose Local policy finds no endpoint on this node);
/// with this node's ready endpoints and the UDP ports (port, NodePort) that have a backend.
#[allow(clippy::type_complexity)]
fn port_backends<'m>(
    model: &'m model::Model,
    sources: &Sources,
    node: &str,
    zone: Option<&str>,
    entry: &mut Entry,
) -> (
    Vec<model::PortBackends<'m>>,
    BTreeSet<IpAddr>,
    BTreeSet<(u16, Option<u16>)>,
) {
    let mut ports = Vec::new();
    let mut local_ready = BTreeSet::new();
    let mut served = BTreeSet::new();
    for fam in model.families() {
        for p in &model.ports {
            let model::Chosen {
                all,
                local,
                local_ready: ready,
            } = model::backends(sources, p, fam, node, zone);
            if p.proto == proto::UDP {
                entry.udp.extend(all.iter().map(|b| (b.ip, b.port)));
                if !all.is_empty() {
                    served.insert((p.port, p.node_port));
                }
            }
            local_ready.extend(ready);
            if local.is_empty() {
                let policies = [(model.internal_local, false), (model.external_local, true)];
                for (_, external) in policies.into_iter().filter(|(on, _)| *on) {
                    let family = fam;
                    entry.no_local.push(NoLocalEndpoints { family, external });
                }
            }
            ports.push(model::PortBackends {
                port: p,
                family: fam,
                all,
                local,
            });
        }
    }
    (ports, local_ready, served)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_parity;
