//! NetworkPolicy (networking.k8s.io/v1) for this node's pods.
//!
//! Per packet: `ct state established,related accept` (ICMPv6 neighbour discovery and a pod
//! reaching itself through a Service too), then one verdict-map lookup on the
//! local pod's address per direction (`np-egress-v4/v6` on the source, `np-ingress-v4/v6` on
//! the destination). A pod a policy isolates maps to `goto` the chain of its *policy set*
//! (the policies selecting it for that direction), which `jump`s to each of those policies'
//! chains and drops what none accepted. A policy's chain has one or two rules per policy
//! rule and family, each a lookup in named sets (peers, ports, named ports). So the cost is
//! one map lookup plus the rules of the policies that select the pod, whatever the number
//! of policies, namespaces or pods in the cluster.
//!
//! Parts: `np/<namespace>/<name>` per policy selecting a pod of this node (its chains and
//! sets: a policy edit rewrites only it), `np-peers/<name>` per distinct peer list (the peer
//! sets every rule naming those peers shares, counted by the policies using it: `peers`),
//! `np-set/<in|eg>/<chain>` per policy set in use (its chain and the dispatch elements of its
//! pods) and `np-self` (the hairpin elements): pod churn and label changes are element
//! updates, plus a new policy-set chain the first time a combination of policies selects a
//! pod. `memo` decides what is planned again, `visit` which policies a plan looks at.
//!
//! Hooks (only present while a policy is in force): forward, at filter priority + 10
//! (egress) and + 11 (ingress), after service DNAT (policies see endpoints) and after
//! EgressFirewall's `filter-forward` (0): a packet leaves only when both accept it. The same
//! rules again on prerouting (`np-dns-egress`/`-ingress`) for the DNS queries the
//! EgressFirewall's proxy takes, which never reach forward (they carry its pending mark). Forward
//! sees routed pods and bridged pods with `br_netfilter`; `bridge` puts the same parts into
//! `table bridge nodeplane` for bridged pods, which judges them first, with `br_netfilter`
//! or without: the inet forward chains accept a packet it marked as judged
//! ([`BRIDGE_JUDGED`]) as it is. Input and output are not hooked on
//! purpose: upstream, traffic between a pod and its own node is always allowed (kubelet
//! probes), and that traffic is exactly what those hooks see.

mod acl;
pub mod binding;
pub mod bridge;
mod dispatch;
mod memo;
mod peers;
mod pods;
mod rules;
mod visit;

use super::firewall::steer::{self, PENDING};
use super::in_force::{InForceMap, Scope, Validated};
use super::{Feature, Inputs, ObjectStatus, Planned};
use crate::api::NetworkPolicy;
use crate::api::network_policy::{self, ValidatedPolicy};
use crate::net::bridge_ports::BridgePorts;
use crate::nft::ir::*;
use crate::nft::names::object_name;
use crate::snapshot::{self, Kind};
use peers::PeerSets;
use pods::{LazyIndex, PodIndex};
use rules::{Direction, Sharing, add_direction};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

/// Prefix of the parts and chains.
const PREFIX: &str = "np";

/// Dispatch maps: local pod address -> its policy-set chain.
pub const INGRESS_V4: &str = "np-ingress-v4";
pub const INGRESS_V6: &str = "np-ingress-v6";
pub const EGRESS_V4: &str = "np-egress-v4";
pub const EGRESS_V6: &str = "np-egress-v6";
/// `pod . pod` of every isolated local pod: a pod reaching itself through a Service (hairpin,
/// DNAT back to itself) crosses forward, and a pod cannot block access to itself.
pub const SELF_V4: &str = "np-self-v4";
pub const SELF_V6: &str = "np-self-v6";
/// Every address of a family (`0.0.0.0/0`, `::/0`): what a rule without peers looks up.
pub const ANY_V4: &str = "np-any-v4";
pub const ANY_V6: &str = "np-any-v6";
/// The part holding the elements of `np-self-v4/v6`.
const SELF_PART: &str = "np-self";

/// Base chains on the forward hook, egress first: a pod-to-pod packet passes its source's
/// egress policies, then its destination's ingress policies.
pub mod chains {
    pub const FORWARD_EGRESS: &str = "np-forward-egress";
    pub const FORWARD_INGRESS: &str = "np-forward-ingress";
    /// The same two on the prerouting hook, for the queries the DNS proxy is about to take.
    pub const DNS_EGRESS: &str = "np-dns-egress";
    pub const DNS_INGRESS: &str = "np-dns-ingress";
}
/// After EgressFirewall's `filter-forward` (filter priority).
const PRIORITY: i32 = priority::FILTER + 10;
/// The mark bit of a packet `table bridge nodeplane` judged and accepted (set by
/// `bridge::FORWARD_FLOWS`, after both its policy chains). With `br_netfilter` the inet
/// forward hook sees a bridged packet after the bridge table; its policy chains accept a
/// packet with this bit without judging it again (one verdict, one ACL log line, one count).
/// No pod can set it: a packet crossing a veth into the node's namespace has its mark
/// cleared. The agent's other bits: services' masquerade 0x4000, EgressIP 0x00ff0000 and
/// 0x02000000, EgressFirewall DNS steering 0x01000000 and 0x04000000.
pub const BRIDGE_JUDGED: u32 = 0x0800_0000;
/// A query to a trusted resolver that the EgressFirewall DNS proxy is about to take (mark
/// `PENDING`) never reaches forward: these chains judge it on prerouting instead, after
/// service DNAT and the EgressFirewall's judge, before the proxy's `tproxy`
/// (`plan::firewall::steer`), with the same rules as the forward chains.
const DNS_PRIORITY: i32 = steer::JUDGE_PRIORITY + 1;

/// What the NetworkPolicy planner carries between plans: the policies in force (an invalid
/// edit keeps the policy's last valid version: dropping it could open what it isolated),
/// each policy's last plan, last plan's pods and namespaces (to find what changed) and the
/// policy-set parts (reused when equal, so the diff skips them by pointer).
#[derive(Debug, Clone, Default)]
pub struct NetpolMemory {
    pub validated: Arc<Validated<NetworkPolicy, ValidatedPolicy>>,
    /// The policies `validated` was computed from (`None`: not computed from a snapshot,
    /// e.g. restored from the state file): the next plan validates what changed since.
    validated_from: Option<PolicyObjects>,
    /// One status per policy object, by key.
    statuses: Statuses,
    policies: Policies,
    /// The policies with an egress rule on a named port: a change of any pod may change
    /// their plan (`memo::touches`), so each pod change visits them.
    named_egress: imbl::OrdSet<String>,
    /// The policies with logged verdicts (ACL logging): what the log book is made of.
    logging: imbl::OrdSet<String>,
    /// The namespaces' ACL logging, kept until a namespace changes.
    acl_lookup: acl::Lookup,
    seen: memo::Seen,
    /// Which policies govern each local pod, and the policy-set parts.
    dispatch: dispatch::Dispatch,
    /// The peer sets the policies share, counted by their users.
    peer_sets: PeerSets,
    /// Every part above, kept up to date by key: handed to the table in O(1) (see
    /// `Table::extend_parts`) instead of one insert per policy.
    parts: Parts,
    /// The namespaces whose verdicts are logged (ACL logging parts in `parts`).
    acl_namespaces: BTreeSet<String>,
}

type PolicyObjects = crate::snapshot::ObjectMap<crate::snapshot::ObjectKey, NetworkPolicy>;
/// Each policy's last plan, by `namespace/name`.
type Policies = imbl::OrdMap<String, Arc<memo::Planned>>;
type Statuses = imbl::OrdMap<crate::snapshot::ObjectKey, ObjectStatus>;

/// The NetworkPolicy feature (see the module documentation).
pub struct NetworkPolicies;

// The policies in force are kept across restarts; the rest is rebuilt by the first plan.
super::in_force::remember_through!(NetpolMemory, validated: Validated<NetworkPolicy, ValidatedPolicy>);

/// The last valid version of each NetworkPolicy is kept across restarts (left out of a file
/// without any, as agents from before NetworkPolicy wrote it).
impl super::kept::KeptKind for NetworkPolicy {
    type Valid = ValidatedPolicy;
    const FIELD: &'static str = "networkPolicies";
    const OMIT_EMPTY: bool = true;

    fn revalidate(&self) -> Result<ValidatedPolicy, crate::api::ValidationError> {
        network_policy::validate(self)
    }

    fn key(valid: &ValidatedPolicy) -> String {
        format!("{}/{}", valid.namespace, valid.name)
    }
}

impl Feature for NetworkPolicies {
    const NAME: &'static str = PREFIX;
    const SWITCH: crate::features::Switch = crate::features::Switch::NetworkPolicy;
    type Memory = NetpolMemory;
    type Output = NetpolOutput;
    const TABLES: &'static [(Family, &'static str)] = &[(Family::Bridge, TABLE_NAME)];

    fn plan(
        inputs: &Inputs,
        memory: &NetpolMemory,
        out: &mut Planned,
        output: &mut NetpolOutput,
    ) -> NetpolMemory {
        let snapshot = inputs.snapshot;
        let objects = snapshot.network_policies();
        let validation = validate(memory, objects);
        out.statuses.extend(validation.statuses.values().cloned());
        let in_force = &validation.validated.in_force;
        let changes = memory.seen.changes(snapshot);
        let mut index = LazyIndex::new(snapshot, &inputs.config.node_name);
        let mut work = Work::from(memory);
        // The shared peer sets first: a policy whose sets gained or lost a family is planned
        // again (its rules of that family appear or go).
        let flipped = work.peer_sets.refresh(
            changes.everything,
            &changes.pods,
            snapshot,
            &mut index,
            &mut work.parts,
        );
        let mut acl_lookup = memory.acl_lookup.carried(changes.everything);
        let visit = visit::policies(
            validation.changed.as_ref(),
            &changes,
            &flipped,
            in_force,
            &memory.named_egress,
        );
        work.retire_gone(&memory.policies, in_force, &visit);
        for (key, in_force) in visit.entries(in_force) {
            let policy = &in_force.valid;
            let last = memory.policies.get(key);
            if last.is_some_and(|last| still_current(last, policy, &changes, &flipped, snapshot)) {
                continue;
            }
            let acl = acl_lookup.get(snapshot, &policy.namespace, inputs.config.acl_log);
            work.replan(key, policy, last, acl, index.get());
        }
        let problems = acl_lookup.problems(|ns| visit::has_policies(in_force, ns));
        let (book, acl_namespaces) = work.log_namespaces(inputs, memory, &mut acl_lookup, problems);
        output.acl = Arc::new(book);
        let finished = work.finish();
        out.ruleset.extend_parts(&finished.parts);
        if !in_force.is_empty() {
            add_shared(out, inputs, &finished.parts);
        }
        NetpolMemory {
            validated: validation.validated,
            validated_from: Some(objects.clone()),
            statuses: validation.statuses,
            policies: finished.policies,
            named_egress: finished.named_egress,
            logging: finished.logging,
            acl_lookup,
            seen: memo::Seen::of(snapshot),
            dispatch: finished.dispatch,
            peer_sets: finished.peer_sets,
            parts: finished.parts,
            acl_namespaces,
        }
    }

    fn settle(
        inputs: &Inputs,
        memory: &NetpolMemory,
        report: &crate::plan::BackendReport,
        out: &mut Planned,
        output: &mut NetpolOutput,
    ) {
        let table = out.extra_tables.get_mut(Family::Bridge, TABLE_NAME);
        if let (Some(table), Some(ports)) = (table, report.bridge_ports) {
            output.pod_binding =
                bind_bridge_ports(table, inputs.snapshot, inputs.config, memory, ports);
        }
    }
}

/// The policies in force, their statuses, and which keys of `in_force` may have changed
/// since last plan (`None`: any, the first plan or one after a restart).
struct Validation {
    validated: Arc<Validated<NetworkPolicy, ValidatedPolicy>>,
    statuses: Statuses,
    changed: Option<BTreeSet<String>>,
}

/// Validates the policy objects that changed since last plan (found by a diff of the
/// persistent object maps, which skips the subtrees they share): last plan's result when the
/// map is the same, O(change) otherwise; every object only the first time.
fn validate(memory: &NetpolMemory, objects: &PolicyObjects) -> Validation {
    match &memory.validated_from {
        Some(from) if from.ptr_eq(objects) => Validation {
            validated: memory.validated.clone(),
            statuses: memory.statuses.clone(),
            changed: Some(BTreeSet::new()),
        },
        Some(from) => {
            let changed = snapshot::changes(from, objects).map(|(k, _, now)| (k.clone(), now));
            let delta = memory.validated.update_changed(
                Kind::NetworkPolicy,
                Scope::Object,
                changed,
                network_policy::validate,
            );
            let mut statuses = memory.statuses.clone();
            for (key, status) in delta.statuses {
                match status {
                    Some(status) => statuses.insert(key, status),
                    None => statuses.remove(&key),
                };
            }
            Validation {
                validated: Arc::new(delta.validated),
                statuses,
                changed: Some(delta.changed),
            }
        }
        None => {
            let outcome = memory.validated.update(
                Kind::NetworkPolicy,
                Scope::Object,
                objects.iter().map(|(k, o)| (k.clone(), o)),
                network_policy::validate,
            );
            let statuses = outcome.statuses.into_iter();
            Validation {
                validated: Arc::new(outcome.validated),
                statuses: statuses.map(|s| (s.key.clone(), s)).collect(),
                changed: None,
            }
        }
    }
}

/// Whether last plan of `policy` (`last`) still holds: the same policy, no namespace
/// changed, none of its peer sets gained or lost a family (`flipped`) and no changed pod
/// touches it (`memo::touches`).
fn still_current(
    last: &memo::Planned,
    policy: &Arc<ValidatedPolicy>,
    changes: &memo::Changes,
    flipped: &BTreeSet<Arc<peers::PeerKey>>,
    snapshot: &crate::snapshot::Snapshot,
) -> bool {
    Arc::ptr_eq(&last.policy, policy)
        && !changes.everything
        && !last.peer_keys.iter().any(|k| flipped.contains(k))
        && !changes.pods.iter().any(|(before, after)| {
            [before, after]
                .into_iter()
                .flatten()
                .any(|pod| memo::touches(policy, snapshot, pod))
        })
}

/// The hooks, judges and bridge table every policy in force needs, and the bridged pods
/// whose binding `settle` completes once the backend has read the bridge ports.
fn add_shared(out: &mut Planned, inputs: &Inputs, parts: &Parts) {
    let check = inputs.config.pod_source_check;
    let source_check = check.then(source_check).into_iter().collect();
    let state = vec![bridge_judged(), established()];
    add_hooks(&mut out.ruleset, PRIORITY, state, source_check);
    add_dns_judges(&mut out.ruleset);
    out.extra_tables.insert(bridge::table(parts, check));
    // The binding is settled once the backend read the bridge ports (`settle`).
    let pods = binding::local_pods(inputs.snapshot, &inputs.config.node_name);
    out.net.bridge_pods = pods.into_iter().map(|(_, ips)| ips).collect();
}

/// What one plan updates in place, starting from last plan's memory.
struct Work<'m> {
    policies: Policies,
    named_egress: imbl::OrdSet<String>,
    logging: imbl::OrdSet<String>,
    dispatch: dispatch::Update<'m>,
    parts: Parts,
    peer_sets: PeerSets,
}

/// What [`Work::finish`] hands to the next memory.
struct Finished {
    policies: Policies,
    named_egress: imbl::OrdSet<String>,
    logging: imbl::OrdSet<String>,
    dispatch: dispatch::Dispatch,
    peer_sets: PeerSets,
    parts: Parts,
}

impl<'m> Work<'m> {
    fn from(memory: &'m NetpolMemory) -> Work<'m> {
        Work {
            policies: memory.policies.clone(),
            named_egress: memory.named_egress.clone(),
            logging: memory.logging.clone(),
            dispatch: memory.dispatch.update(),
            parts: memory.parts.clone(),
            peer_sets: memory.peer_sets.clone(),
        }
    }

    /// Takes out the policies of last plan (`before`) among those visited that are no
    /// longer in force.
    fn retire_gone(
        &mut self,
        before: &Policies,
        in_force: &InForceMap<NetworkPolicy, ValidatedPolicy>,
        visit: &visit::Visit,
    ) {
        for (key, gone) in visit.entries(before) {
            if !in_force.contains_key(key) {
                self.parts.remove(&gone.part_key);
                self.peer_sets.release(&gone.peer_keys);
                self.dispatch.remove(key, gone);
                self.policies.remove(key);
                self.named_egress.remove(key);
                self.logging.remove(key);
            }
        }
    }

    /// Plans `policy` (key `key`, last planned as `last`) again: its part, its peer sets'
    /// users and its pods' dispatch.
    fn replan(
        &mut self,
        key: &str,
        policy: &Arc<ValidatedPolicy>,
        last: Option<&Arc<memo::Planned>>,
        acl: Option<acl::Acl>,
        index: &PodIndex,
    ) {
        let mut sharing = Sharing {
            sets: &mut self.peer_sets,
            parts: &mut self.parts,
            keys: Vec::new(),
            acl,
            logged: Vec::new(),
        };
        let (part, selected, chains) = policy_part(policy, index, &mut sharing);
        let (peer_keys, logged) = (sharing.keys, sharing.logged);
        let deny = chains
            .iter()
            .filter_map(|(d, _)| {
                let chain = acl::deny_chain(acl.as_ref(), &policy.namespace, d.name())?;
                Some((*d, chain))
            })
            .collect();
        let part = match last {
            Some(old) if *old.part == part => old.part.clone(),
            _ => Arc::new(part),
        };
        let part_key = format!("{PREFIX}/{}/{}", policy.namespace, policy.name);
        // A policy selecting no pod of this node is other nodes' business: no chains
        // here until it selects one.
        if selected.is_empty() {
            self.parts.remove(&part_key);
        } else {
            self.parts.insert(part_key.clone(), part.clone());
        }
        // Counted before the old version is released: a set both use stays.
        self.peer_sets.acquire(&peer_keys);
        if let Some(old) = last {
            self.peer_sets.release(&old.peer_keys);
            self.dispatch.remove(key, old);
        }
        let planned = memo::Planned {
            policy: policy.clone(),
            part_key,
            part,
            selected,
            chains,
            peer_keys,
            logged,
            deny,
        };
        self.dispatch.add(key, &planned);
        mark(&mut self.named_egress, key, memo::has_named_egress(policy));
        let logs = !planned.logged.is_empty() || !planned.deny.is_empty();
        mark(&mut self.logging, key, logs);
        self.policies.insert(key.to_string(), Arc::new(planned));
    }

    /// The ACL log book of the plan and the logged namespaces, their parts updated.
    fn log_namespaces(
        &mut self,
        inputs: &Inputs,
        memory: &NetpolMemory,
        lookup: &mut acl::Lookup,
        problems: BTreeSet<String>,
    ) -> (crate::plan::acl_log::Book, BTreeSet<String>) {
        let policies = &self.policies;
        let logged = self.logging.iter().map(|key| {
            let p = &**policies.get(key).expect("a logging policy is planned");
            (p.policy.namespace.as_str(), &p.logged, !p.deny.is_empty())
        });
        acl::finish(
            logged,
            &memory.acl_namespaces,
            lookup,
            problems,
            inputs.snapshot,
            inputs.config.acl_log,
            &mut self.parts,
        )
    }

    /// Completes the peer sets' and the dispatch's parts; what the next memory keeps.
    fn finish(mut self) -> Finished {
        self.peer_sets.finish(&mut self.parts);
        let dispatch = self.dispatch.finish(&mut self.parts);
        Finished {
            policies: self.policies,
            named_egress: self.named_egress,
            logging: self.logging,
            dispatch,
            peer_sets: self.peer_sets,
            parts: self.parts,
        }
    }
}

/// Puts `key` into `set` or takes it out.
fn mark(set: &mut imbl::OrdSet<String>, key: &str, member: bool) {
    if member {
        if !set.contains(key) {
            set.insert(key.to_string());
        }
    } else {
        set.remove(key);
    }
}

impl NetpolMemory {
    /// The addresses of this node's pods that a policy in force isolates (either direction).
    pub fn isolated(&self) -> BTreeSet<IpAddr> {
        self.dispatch.isolated()
    }
}

/// Binds this node's bridged pods' addresses to their bridge ports in the bridge table `t`
/// (see [`binding`]), from what the backend found in the kernel at sync time (`ports`);
/// returns what could not be bound, one line each (a failed read binds nothing and says so).
pub fn bind_bridge_ports(
    t: &mut Table,
    snapshot: &crate::snapshot::Snapshot,
    config: &crate::config::Config,
    memory: &NetpolMemory,
    ports: &Result<BridgePorts, String>,
) -> Vec<String> {
    let pods = binding::local_pods(snapshot, &config.node_name);
    match ports {
        Ok(ports) => {
            let mut bound = binding::bind(&pods, &memory.isolated(), ports);
            for port in std::mem::take(&mut bound.flow_ports) {
                bridge::add_port(&mut bound.part, &port);
            }
            binding::add_to(t, bound)
        }
        Err(e) => vec![format!(
            "bridge ports not read ({e}): no bridged pod is bound"
        )],
    }
}

/// What NetworkPolicy hands on besides its tables: the bridged pods' addresses it could not
/// bind to their ports (a `/readyz` warning and a log line each).
#[derive(Debug, Clone, Default)]
pub struct NetpolOutput {
    pub pod_binding: Vec<String>,
    /// The logged verdicts of the plan, for the ACL log reader.
    pub acl: Arc<crate::plan::acl_log::Book>,
}

/// The `/readyz` warning topic of [`NetpolOutput::pod_binding`].
pub const POD_BINDING: &str = "networkpolicy pod binding";

impl crate::plan::Output for NetpolOutput {
    fn warnings(&self) -> Option<(&'static str, &[String])> {
        Some((POD_BINDING, &self.pod_binding))
    }
}

/// The policy's part (its chains and sets), the addresses of the local pods it selects and
/// its chain per isolated direction.
#[allow(clippy::type_complexity)]
fn policy_part(
    policy: &ValidatedPolicy,
    index: &PodIndex,
    shared: &mut Sharing,
) -> (Part, Vec<IpAddr>, Vec<(Direction, Arc<str>)>) {
    let base = object_name(PREFIX, &format!("{}/{}", policy.namespace, policy.name));
    let selected: Vec<_> = index.selected(&policy.namespace, &policy.pods).collect();
    let mut part = Part::default();
    let mut chains = Vec::new();
    if selected.is_empty() {
        return (part, Vec::new(), chains);
    }
    for (direction, rules) in [
        (Direction::Ingress, &policy.ingress),
        (Direction::Egress, &policy.egress),
    ] {
        if let Some(rules) = rules {
            let chain = add_direction(
                &mut part, &base, policy, direction, rules, index, &selected, shared,
            );
            chains.push((direction, Arc::from(chain)));
        }
    }
    part.shrink_to_fit();
    let ips = selected
        .iter()
        .flat_map(|p| p.ips.iter().copied())
        .collect();
    (part, ips, chains)
}

/// The dispatch maps, the self sets and the two base chains, at `priority` and the next;
/// `state` are the rules that pass packets of allowed connections first (conntrack in inet,
/// see `bridge` otherwise), after `first` in the egress chain (the first chain a pod's
/// packet meets: anti-spoofing).
fn add_hooks(table: &mut Table, priority: i32, state: Vec<Rule>, first: Vec<Rule>) {
    for (name, addr) in [
        (INGRESS_V4, DataType::Ipv4Addr),
        (INGRESS_V6, DataType::Ipv6Addr),
        (EGRESS_V4, DataType::Ipv4Addr),
        (EGRESS_V6, DataType::Ipv6Addr),
    ] {
        table.add_set(Set::new(name, vec![addr], SetKind::VerdictMap));
    }
    table.add_set(Set::new(
        SELF_V4,
        vec![DataType::Ipv4Addr, DataType::Ipv4Addr],
        SetKind::Set,
    ));
    table.add_set(Set::new(
        SELF_V6,
        vec![DataType::Ipv6Addr, DataType::Ipv6Addr],
        SetKind::Set,
    ));
    for (name, any) in [(ANY_V4, "0.0.0.0/0"), (ANY_V6, "::/0")] {
        let any: ipnet::IpNet = any.parse().expect("a valid prefix");
        let family = IpFamily::of(any.addr());
        let mut set =
            Set::new(name, vec![DataType::addr(family)], SetKind::Set).with_flags(SetFlags {
                interval: true,
                ..Default::default()
            });
        set.insert(vec![KeyPart::Prefix(any)]);
        table.add_set(set);
    }
    let egress = [(Field::Ip4Saddr, EGRESS_V4), (Field::Ip6Saddr, EGRESS_V6)];
    let ingress = [(Field::Ip4Daddr, INGRESS_V4), (Field::Ip6Daddr, INGRESS_V6)];
    for (name, prio, lookups) in [
        (chains::FORWARD_EGRESS, priority, egress),
        (chains::FORWARD_INGRESS, priority + 1, ingress),
    ] {
        let mut chain = Chain::base(
            name,
            BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Forward,
                priority: prio,
                policy: Policy::Accept,
            },
        );
        if name == chains::FORWARD_EGRESS {
            for rule in &first {
                chain.push(rule.clone());
            }
        }
        for rule in &state {
            chain.push(rule.clone());
        }
        chain.push(neighbour_discovery());
        for (key, set) in [
            (vec![Field::Ip4Saddr, Field::Ip4Daddr], SELF_V4),
            (vec![Field::Ip6Saddr, Field::Ip6Daddr], SELF_V6),
        ] {
            chain.push(Rule::new(vec![
                Stmt::in_set(key, set),
                Stmt::Verdict(Verdict::Accept),
            ]));
        }
        for (field, map) in lookups {
            chain.push(Rule::new(vec![Stmt::vmap(vec![field], map)]));
        }
        table.add_chain(chain);
    }
}

/// `np-dns-egress`/`-ingress`: the rules of the two forward chains of `table` (as
/// [`add_hooks`] made them), on prerouting behind `meta mark & PENDING == 0 accept`, so the
/// queries on their way to the EgressFirewall DNS proxy meet exactly those rules (see
/// [`DNS_PRIORITY`]). Inet only: the proxy's steering is.
fn add_dns_judges(table: &mut Table) {
    for (forward, name, priority) in [
        (chains::FORWARD_EGRESS, chains::DNS_EGRESS, DNS_PRIORITY),
        (
            chains::FORWARD_INGRESS,
            chains::DNS_INGRESS,
            DNS_PRIORITY + 1,
        ),
    ] {
        let mut chain = Chain::base(
            name,
            BaseChain {
                kind: ChainType::Filter,
                hook: Hook::Prerouting,
                priority,
                policy: Policy::Accept,
            },
        );
        chain.push(Rule::new(vec![
            Stmt::Match(Match {
                key: vec![Field::Mark],
                op: MatchOp::Masked {
                    mask: Value::Mark(PENDING),
                    value: Value::Mark(0),
                    eq: true,
                },
            }),
            Stmt::Verdict(Verdict::Accept),
        ]));
        for rule in &table.chains[forward].rules {
            chain.push(rule.clone());
        }
        table.add_chain(chain);
    }
}

/// The comment on the reverse-path rule: `nft list chain inet nodeplane np-forward-egress`
/// shows its counter, the packets dropped for a source not their interface's.
pub const SOURCE_CHECK_COMMENT: &str = "NetworkPolicy: source address not routed via its interface";

/// `fib saddr . iif oif missing counter drop`: a forwarded packet whose source address is not
/// routed back through the interface it came in on is dropped, whatever `rp_filter` says.
/// For a routed pod that interface is its veth, whose routes are exactly its addresses: a
/// pod cannot send with another pod's (or any other) address. First, before conntrack: a
/// spoofed packet must not pass as a reply either. Inet only: the bridge family has no fib.
/// Not for packets decapsulated from the EgressIP tunnel: they come from another node's pods,
/// are routed back over the uplink, and were checked on their own node when they left the pod.
fn source_check() -> Rule {
    Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::IifName],
            op: MatchOp::Ne(vec![Value::IfName(super::egress_ip::TUNNEL_DEV.into())]),
        }),
        Stmt::matches(Field::FibSaddrIifOif, Value::Exists(false)),
        Stmt::Counter,
        Stmt::Verdict(Verdict::Drop),
    ])
    .with_comment(SOURCE_CHECK_COMMENT)
}

/// `meta mark & BRIDGE_JUDGED == BRIDGE_JUDGED accept`: a bridged packet that reached the
/// inet forward hook through `br_netfilter` after `table bridge nodeplane` judged and
/// accepted it (see [`BRIDGE_JUDGED`]) is not judged, logged and counted a second time.
/// After the source check: only the policies' judgement is left out. In the prerouting copies
/// (`add_dns_judges`) it never matches (the bridge forward hook comes later) and keeps them
/// copies.
fn bridge_judged() -> Rule {
    Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Mark],
            op: MatchOp::Masked {
                mask: Value::Mark(BRIDGE_JUDGED),
                value: Value::Mark(BRIDGE_JUDGED),
                eq: true,
            },
        }),
        Stmt::Verdict(Verdict::Accept),
    ])
}

/// `ct state established,related accept`.
fn established() -> Rule {
    Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::CtState],
            op: MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
        }),
        Stmt::Verdict(Verdict::Accept),
    ])
}

/// ICMPv6 neighbour solicitations and advertisements (types 135, 136, code 0) are accepted:
/// between bridged pods they cross the (inet or bridge) forward hook, and dropping them
/// breaks IPv6 between pods the policies allow. They are matched as `th sport` (the first two
/// bytes of the ICMPv6 header: type << 8 | code), which needs no ICMPv6 field in the IR.
fn neighbour_discovery() -> Rule {
    let nd = |icmp_type: u16| {
        vec![
            KeyPart::Value(Value::Proto(proto::ICMPV6)),
            KeyPart::Value(Value::Port(icmp_type << 8)),
        ]
    };
    Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::L4Proto, Field::ThSport],
            op: MatchOp::InAnon(vec![nd(135), nd(136)]),
        }),
        Stmt::Verdict(Verdict::Accept),
    ])
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_acl;
#[cfg(test)]
mod tests_incremental;
