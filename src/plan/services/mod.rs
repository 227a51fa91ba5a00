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
pub mod model;
pub mod names;
pub mod nodeports;
pub mod pools;
pub mod topology;

use super::base::chains as base_chains;
use super::base::sets as base_sets;
use super::{Feature, Inputs, ObjectStatus, Planned};
use crate::api::{EndpointSlice, Service};
use crate::config::Config;
use crate::nft::ir::*;
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
use claims::{Claim, Rank, externals_on, note, settle_claims, winner};
use ipnet::IpNet;
use model::{AddressRules, Sources};
use pools::Pool;
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

impl Memo {
    /// Takes this snapshot's node addresses; the services that asked for an address that
    /// became or stopped being a node's (refused, or claiming it) are re-planned.
    fn update_node_ips(
        &mut self,
        node_ips: BTreeMap<IpAddr, String>,
        changed: &mut BTreeSet<ObjectKey>,
    ) {
        if *self.node_ips == node_ips {
            return;
        }
        let (old, new) = (&*self.node_ips, &node_ips);
        let flipped = old
            .iter()
            .filter(|(ip, n)| new.get(ip) != Some(n))
            .chain(new.iter().filter(|(ip, n)| old.get(ip) != Some(n)))
            .map(|(ip, _)| *ip);
        for ip in flipped {
            let users = self.node_refused.get(&ip).into_iter().flatten();
            changed.extend(users.cloned());
            let cluster = self.claims.get(&Claim::Cluster(ip)).into_iter();
            let external = externals_on(&self.claims, ip).map(|(_, r)| r);
            for ranks in cluster.chain(external) {
                changed.extend(ranks.iter().map(|r| r.key.clone()));
            }
        }
        self.node_ips = Arc::new(node_ips);
    }

    /// Drops what the old plan of `key` held: its health-check port, pool users, claims
    /// (their owners before noted in `before`) and refused node addresses.
    fn forget(&mut self, key: &ObjectKey, old: &Entry, before: &mut BTreeMap<Claim, Option<Rank>>) {
        if let Some((port, _)) = old.health {
            self.health.remove(&port);
        }
        for n in &old.no_local {
            bump(&mut self.no_local, *n, -1);
        }
        self.release(old);
        for (c, _) in &old.claims {
            note(&self.claims, before, c);
            if let Some(ranks) = self.claims.get_mut(c) {
                if let Ok(i) = ranks.binary_search(&old.rank) {
                    ranks.remove(i);
                }
                if ranks.is_empty() {
                    self.claims.remove(c);
                }
            }
        }
        for ip in &old.node_refused {
            if let Some(keys) = self.node_refused.get_mut(ip) {
                keys.remove(key);
                if keys.is_empty() {
                    self.node_refused.remove(ip);
                }
            }
        }
    }

    /// Records the new plan of `key`: its claims (their owners before noted in `before`),
    /// refused node addresses, health-check port and pool users.
    fn remember(&mut self, key: &ObjectKey, e: Entry, before: &mut BTreeMap<Claim, Option<Rank>>) {
        for (c, _) in &e.claims {
            note(&self.claims, before, c);
            let ranks = self.claims.entry(c.clone()).or_default();
            if let Err(i) = ranks.binary_search(&e.rank) {
                ranks.insert(i, e.rank.clone());
            }
        }
        for ip in &e.node_refused {
            self.node_refused
                .entry(*ip)
                .or_default()
                .insert(key.clone());
        }
        if let Some(h) = e.health {
            self.health.insert(h.0, (key.to_string(), h.1));
        }
        for n in &e.no_local {
            bump(&mut self.no_local, *n, 1);
        }
        self.acquire(&e);
        self.entries.insert(part_key(key), Arc::new(e));
    }

    /// Settles `key`'s claims against the current owners: its part (or none) and error.
    fn settle(&mut self, key: &ObjectKey) {
        let pk = part_key(key);
        let Some(e) = self.entries.get(&pk) else {
            return;
        };
        let (part, error) = settle_claims(&self.claims, e);
        let same = error == e.error
            && match (&part, &e.part) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
        if !same {
            let mut e = (**e).clone();
            e.part = part;
            e.error = error;
            self.entries.insert(pk.clone(), Arc::new(e));
        }
        let e = &self.entries[&pk];
        match &e.part {
            Some(part) => self.parts.insert(pk.clone(), part.clone()),
            None => self.parts.remove(&pk),
        };
        match &e.error {
            Some(err) => self.errors.insert(
                pk.clone(),
                ObjectStatus {
                    kind: Kind::Service,
                    key: key.clone(),
                    result: Err(err.clone()),
                    event: None,
                },
            ),
            None => self.errors.remove(&pk),
        };
    }

    /// Counts `e`'s use of the shared pool chains and hairpin elements.
    fn acquire(&mut self, e: &Entry) {
        for pool in &e.pools {
            if bump(&mut self.pools, *pool, 1) == 1 {
                let mut part = Part::default();
                part.add_chain(pool.chain());
                self.parts
                    .insert(format!("svc-pool/{}", pool.chain_name()), Arc::new(part));
            }
        }
        for shard in &e.shards {
            if bump(&mut self.shards, *shard, 1) == 1 {
                self.parts
                    .insert(shard_part_key(shard), Arc::new(shard_part(shard)));
            }
        }
        for ip in &e.hairpin {
            if bump(&mut self.hairpin, *ip, 1) == 1 {
                let mut part = Part::default();
                let key = vec![Value::ip(*ip).into(), Value::ip(*ip).into()];
                part.add_element(names::hairpin(IpFamily::of(*ip)), key);
                self.parts
                    .insert(format!("svc-hairpin/{ip}"), Arc::new(part));
            }
        }
    }

    /// Undoes [`Memo::acquire`]: what no service uses any more leaves the table.
    fn release(&mut self, e: &Entry) {
        for pool in &e.pools {
            if bump(&mut self.pools, *pool, -1) == 0 {
                self.parts
                    .remove(&format!("svc-pool/{}", pool.chain_name()));
            }
        }
        for shard in &e.shards {
            if bump(&mut self.shards, *shard, -1) == 0 {
                self.parts.remove(&shard_part_key(shard));
            }
        }
        for ip in &e.hairpin {
            if bump(&mut self.hairpin, *ip, -1) == 0 {
                self.parts.remove(&format!("svc-hairpin/{ip}"));
            }
        }
    }
}

/// Adds `by` to the count of `key` (dropping it at zero) and returns the new count.
fn bump<K: Ord + Clone>(counts: &mut imbl::OrdMap<K, usize>, key: K, by: isize) -> usize {
    let n = counts
        .get(&key)
        .copied()
        .unwrap_or(0)
        .saturating_add_signed(by);
    if n == 0 {
        counts.remove(&key);
    } else {
        counts.insert(key, n);
    }
    n
}

/// Services whose Service, EndpointSlices or Endpoints differ between two snapshots: the
/// cost is the size of the change (see `snapshot::changes`).
fn changed_services(prev: &Snapshot, cur: &Snapshot) -> BTreeSet<ObjectKey> {
    let mut out = BTreeSet::new();
    if prev.ptr_eq(cur) {
        return out;
    }
    out.extend(snapshot::changes(prev.services(), cur.services()).map(|c| c.0.clone()));
    out.extend(snapshot::changes(prev.endpoints(), cur.endpoints()).map(|c| c.0.clone()));
    for (k, old, new) in snapshot::changes(prev.endpoint_slices(), cur.endpoint_slices()) {
        for slice in old.into_iter().chain(new) {
            if let Some(svc) = snapshot::labels(&slice.metadata).get(snapshot::SERVICE_NAME_LABEL) {
                out.insert(ObjectKey::new(k.namespace.clone(), svc.clone()));
            }
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

/// The frontends a service asks for (ClusterIPs, external and LB address ports, NodePorts),
/// each with the field that names it, once each.
fn claims_of(model: &model::Model) -> Vec<(Claim, String)> {
    let mut claims = Vec::new();
    let field = |ip: &IpAddr| model.fields.get(ip).cloned().unwrap_or_default();
    for ip in &model.cluster_ips {
        claims.push((Claim::Cluster(*ip), field(ip)));
    }
    for ip in model.external_ips.iter().chain(&model.lb_ips) {
        for p in &model.ports {
            claims.push((Claim::External(*ip, p.proto, p.port), field(ip)));
        }
    }
    for (i, p) in model.ports.iter().enumerate() {
        if let Some(np) = p.node_port {
            let c = Claim::NodePort(p.proto, np);
            claims.push((c, format!("spec.ports[{i}].nodePort")));
        }
    }
    claims.sort();
    claims.dedup_by(|a, b| a.0 == b.0);
    claims
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

/// The fixed chains and maps every service shares, and the jumps from the base chains.
fn static_objects(t: &mut Table) {
    static_sets(t);
    dispatch_chain(t);
    masquerade_chains(t);
    check_chains(t);
    new_connection_checks(t);
    nat_jumps(t);
}

/// The dispatch and no-endpoint verdict maps, ClusterIP and hairpin sets, per family, and the
/// NodePort maps.
fn static_sets(t: &mut Table) {
    let verdict_map = |name: &str, key: Vec<DataType>| Set::new(name, key, SetKind::VerdictMap);
    for fam in [IpFamily::V4, IpFamily::V6] {
        let addr = DataType::addr(fam);
        t.add_set(verdict_map(names::dispatch_shards(fam), vec![addr]));
        t.add_set(verdict_map(names::check_shards(fam), vec![addr]));
        t.add_set(verdict_map(names::no_endpoints(fam), frontend_types(fam)));
        t.add_set(Set::new(
            names::hairpin(fam),
            vec![addr, addr],
            SetKind::Set,
        ));
    }
    let nodeport = vec![
        DataType::NfProto,
        DataType::InetProto,
        DataType::InetService,
    ];
    t.add_set(verdict_map(names::NODEPORTS, nodeport.clone()));
    t.add_set(verdict_map(names::NOEP_NODEPORTS, nodeport.clone()));
}

/// `svc-dispatch`: the frontend lookups, addresses by their shard's chain, then
/// (`svc-dispatch-nodeports`) NodePorts, but not on loopback.
fn dispatch_chain(t: &mut Table) {
    let mut d = Chain::regular(names::DISPATCH);
    for fam in [IpFamily::V4, IpFamily::V6] {
        d.push(Rule::new(vec![Stmt::vmap(
            vec![low_nibble_field(fam)],
            names::dispatch_shards(fam),
        )]));
    }
    d.push(Rule::new(vec![Stmt::Verdict(Verdict::Goto(
        names::DISPATCH_NODEPORTS.into(),
    ))]));
    t.add_chain(d);

    let mut n = Chain::regular(names::DISPATCH_NODEPORTS);
    // NodePorts are not offered on loopback addresses.
    n.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Ip4Daddr],
            op: MatchOp::InAnon(vec![vec![KeyPart::Prefix(
                "127.0.0.0/8".parse().expect("valid"),
            )]]),
        }),
        Stmt::Verdict(Verdict::Return),
    ]));
    n.push(Rule::new(vec![
        Stmt::matches(Field::Ip6Daddr, Value::Ipv6(std::net::Ipv6Addr::LOCALHOST)),
        Stmt::Verdict(Verdict::Return),
    ]));
    for rule in nodeports::lookups(names::NODEPORTS) {
        n.push(rule);
    }
    t.add_chain(n);
    nodeports::add_sets(t);
}

fn low_nibble_field(fam: IpFamily) -> Field {
    match fam {
        IpFamily::V4 => Field::Ip4DaddrLowNibble,
        IpFamily::V6 => Field::Ip6DaddrLowNibble,
    }
}

/// An address frontend's key: `ip daddr . meta l4proto . th dport`.
fn frontend_types(fam: IpFamily) -> Vec<DataType> {
    vec![
        DataType::addr(fam),
        DataType::InetProto,
        DataType::InetService,
    ]
}

fn shard_part_key(s: &names::AddrShard) -> String {
    format!("svc-shard/{}-{}", names::fam_suffix(s.family), s.shard)
}

/// An address shard in use: its dispatch chain (the shard's map, then the NodePort
/// lookups, as `svc-dispatch` went on before it was sharded), its check chain (the shard's
/// ClusterIPs are rejected), and their elements in the selector maps. The shard's map and
/// set are declared at the top ([`address_shard_sets`]): services' parts fill them.
fn shard_part(s: &names::AddrShard) -> Part {
    let daddr = Field::daddr(s.family);
    let mut part = Part::default();
    let mut d = Chain::regular(s.dispatch_chain());
    d.push(Rule::new(vec![Stmt::vmap(
        vec![daddr, Field::L4Proto, Field::ThDport],
        s.dispatch_map(),
    )]));
    d.push(Rule::new(vec![Stmt::Verdict(Verdict::Goto(
        names::DISPATCH_NODEPORTS.into(),
    ))]));
    part.add_chain(d);
    let mut c = Chain::regular(s.check_chain());
    c.push(Rule::new(vec![
        Stmt::in_set(vec![daddr], s.cluster_ips_set()),
        Stmt::Verdict(Verdict::Goto(names::REJECT.into())),
    ]));
    part.add_chain(c);
    let key = vec![KeyPart::Value(s.selector())];
    let verdict = |v| ElemData::Verdict(v);
    part.add_mapping(
        names::dispatch_shards(s.family),
        key.clone(),
        verdict(Verdict::Goto(s.dispatch_chain())),
    );
    part.add_mapping(
        names::check_shards(s.family),
        key,
        verdict(Verdict::Jump(s.check_chain())),
    );
    part
}

/// The dispatch maps and ClusterIP sets of the address shards in use.
fn address_shard_sets(t: &mut Table, shards: &imbl::OrdMap<names::AddrShard, usize>) {
    for s in shards.keys() {
        let map = Set::new(
            s.dispatch_map(),
            frontend_types(s.family),
            SetKind::VerdictMap,
        );
        t.add_set(map);
        let addr = DataType::addr(s.family);
        t.add_set(Set::new(s.cluster_ips_set(), vec![addr], SetKind::Set));
    }
}

/// The masquerade mark, the masquerade chain (marked and hairpin packets) and the pools'
/// backend maps.
fn masquerade_chains(t: &mut Table) {
    let mut mark = Chain::regular(names::MARK_MASQ);
    mark.push(Rule::new(vec![Stmt::MarkOr(names::MASQ_BIT)]));
    t.add_chain(mark);

    let mut masq = Chain::regular(names::MASQ);
    masq.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Mark],
            op: MatchOp::AnyFlag(names::MASQ_BIT),
        }),
        Stmt::MarkAnd(!names::MASQ_BIT),
        Stmt::Masquerade { fully_random: true },
    ]));
    for (fam, saddr, daddr) in [
        (IpFamily::V4, Field::Ip4Saddr, Field::Ip4Daddr),
        (IpFamily::V6, Field::Ip6Saddr, Field::Ip6Daddr),
    ] {
        masq.push(Rule::new(vec![
            Stmt::in_set(vec![saddr, daddr], names::hairpin(fam)),
            Stmt::Masquerade { fully_random: true },
        ]));
    }
    t.add_chain(masq);
    for set in pools::nodeport_maps() {
        t.add_set(set);
    }
}

/// The address frontends' backends maps, each declared while a pool chain in use reads it:
/// a small cluster's table shows the shards it uses, not all of them.
fn address_backends_maps(t: &mut Table, pools: &imbl::OrdMap<Pool, usize>) {
    let maps: BTreeSet<names::BackendsMap> = pools
        .keys()
        .filter(|p| p.frontend == names::Frontend::Addr)
        .flat_map(Pool::maps)
        .collect();
    for map in maps {
        t.add_set(pools::backends_map(map));
    }
}

/// `svc-reject` and `svc-check`: new connections to a frontend without endpoints are
/// rejected, to an unknown service address dropped.
fn check_chains(t: &mut Table) {
    let frontend_key = |f: Field| vec![f, Field::L4Proto, Field::ThDport];

    let mut reject = Chain::regular(names::REJECT);
    reject.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
        Stmt::Reject(Reject::TcpReset),
    ]));
    reject.push(Rule::new(vec![Stmt::Reject(Reject::PortUnreachable)]));
    t.add_chain(reject);

    let mut check = Chain::regular(names::CHECK);
    for (f, fam) in [
        (Field::Ip4Daddr, IpFamily::V4),
        (Field::Ip6Daddr, IpFamily::V6),
    ] {
        check.push(Rule::new(vec![Stmt::vmap(
            frontend_key(f),
            names::no_endpoints(fam),
        )]));
    }
    for rule in nodeports::lookups(names::NOEP_NODEPORTS) {
        check.push(rule);
    }
    for (f, fam, cidrs) in [
        (Field::Ip4Daddr, IpFamily::V4, base_sets::SERVICE_V4),
        (Field::Ip6Daddr, IpFamily::V6, base_sets::SERVICE_V6),
    ] {
        check.push(Rule::new(vec![Stmt::vmap(
            vec![low_nibble_field(fam)],
            names::check_shards(fam),
        )]));
        check.push(Rule::new(vec![
            Stmt::in_set(vec![f], cidrs),
            Stmt::Verdict(Verdict::Drop),
        ]));
    }
    t.add_chain(check);
}

/// The filter base chains that send new connections through `svc-check`.
fn new_connection_checks(t: &mut Table) {
    let new_conn = Stmt::Match(Match {
        key: vec![Field::CtState],
        op: MatchOp::AnyFlag(ct_state::NEW),
    });
    for (name, hook) in [
        ("svc-filter-input", Hook::Input),
        ("svc-filter-forward", Hook::Forward),
        ("svc-filter-output", Hook::Output),
    ] {
        let mut c = Chain::base(
            name,
            BaseChain {
                kind: ChainType::Filter,
                hook,
                // Before the filter-priority chains (EgressFirewall), like kube-proxy.
                priority: priority::FILTER - 10,
                policy: Policy::Accept,
            },
        );
        c.push(Rule::new(vec![
            new_conn.clone(),
            Stmt::Verdict(Verdict::Jump(names::CHECK.into())),
        ]));
        t.add_chain(c);
    }
}

/// The jumps from the nat base chains to dispatch and masquerade.
fn nat_jumps(t: &mut Table) {
    for (base, target) in [
        (base_chains::NAT_PREROUTING, names::DISPATCH),
        (base_chains::NAT_OUTPUT, names::DISPATCH),
        (base_chains::NAT_POSTROUTING, names::MASQ),
    ] {
        t.chains
            .get_mut(base)
            .expect("base skeleton has the nat chains")
            .push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(target.into()))]));
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_parity;
