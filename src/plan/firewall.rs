//! EgressFirewall: ordered allow/deny of the traffic this node's pods send out of the cluster.
//!
//! Per packet (`filter-forward`, after prerouting DNAT so service traffic is judged by its
//! real destination):
//!
//! 1. `jump fw-dispatch`: established/related traffic returns (a connection is judged by its
//!    first packet); destinations in the cluster CIDRs (pod-to-pod) and the service CIDRs (a
//!    ClusterIP nobody DNATed) return; then one verdict-map lookup on the source address,
//!    `ip saddr vmap @fw-pods-v4` (and v6): each address of a local pod of a namespace with a
//!    firewall maps to `goto <namespace chain>`.
//! 2. The namespace chain is four fixed rules: `ip daddr . meta l4proto . th dport vmap
//!    @<ns>-ports-v4`, then `ip daddr vmap @<ns>-v4` (and v6). The maps hold the object's rules
//!    compiled into disjoint address intervals ([`compile`]); no match falls through = allowed.
//! 3. A map element's value is the rule's verdict itself, `accept` or `drop`. The maps are
//!    declared with `counter`, so every element counts its packets and bytes, and each element's
//!    comment names the rule it was compiled from (`rule 3: Deny 0.0.0.0/0 ports tcp/80`):
//!    `nft list map` shows which rule decided. No chain per rule: a batch that adds a chain
//!    or a `goto` element makes nf_tables re-validate every chain reachable from the base
//!    chains at commit, while `accept`/`drop` elements commit in O(1) of the table.
//!
//! So a packet costs the same with 10 rules as with 8000. DNS answers, node addresses, rule
//! changes and pod addresses are map elements: their churn is an element update, never a
//! chain rewrite.

pub mod compile;
pub mod learning;
pub mod steer;
pub mod steps;

use super::acl_log;
use super::base::chains::FILTER_FORWARD;
use super::base::sets;
use super::in_force::{self, Scope, Validated};
use super::{Feature, Inputs, ObjectStatus, Planned};
use crate::api::acl_logging::AclLogging;
use crate::api::egress_firewall::{Action, Destination, FirewallRule};
use crate::api::{EgressFirewall, ValidatedFirewall};
use crate::config::Config;
use crate::config::acl_log::AclLogSettings;
use crate::nft::ir::*;
use crate::nft::names::object_name;
use crate::plan::DnsAnswers;
use crate::snapshot::{self, Kind, Snapshot};
use compile::{Compiled, PortKey, Segment};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use steps::Step;

/// The chain `filter-forward` jumps to.
pub const DISPATCH: &str = "fw-dispatch";
/// Verdict maps from a local pod's address to its namespace's chain.
pub const PODS_V4: &str = "fw-pods-v4";
pub const PODS_V6: &str = "fw-pods-v6";
/// Prefix of the per-namespace chains and maps (`fw-HASH-namespace`).
const PREFIX: &str = "fw";

/// The names of a namespace's chain and maps.
pub struct Names {
    pub chain: String,
}

impl Names {
    pub fn new(namespace: &str) -> Names {
        Names {
            chain: object_name(PREFIX, namespace),
        }
    }
    /// `ip daddr` interval verdict map of the chain's first run of painted rules.
    pub fn addr_map(&self, family: IpFamily) -> String {
        self.run_addr_map(0, family)
    }
    /// `ip daddr . meta l4proto . th dport` interval verdict map of the first run.
    pub fn ports_map(&self, family: IpFamily) -> String {
        self.run_ports_map(0, family)
    }
    /// The address map of painted run `run` (runs after the first follow a learned set).
    pub fn run_addr_map(&self, run: usize, family: IpFamily) -> String {
        format!("{}{}-{}", self.chain, run_suffix(run), suffix(family))
    }
    pub fn run_ports_map(&self, run: usize, family: IpFamily) -> String {
        format!("{}{}-ports-{}", self.chain, run_suffix(run), suffix(family))
    }
    /// The timeout set of addresses learned from DNS answers for `dns_name` (a validated
    /// name or wildcard): one per name, shared by the namespace's rules naming it.
    pub fn learned_set(&self, dns_name: &str, family: IpFamily) -> String {
        format!("{}-{}", object_name(&self.chain, dns_name), suffix(family))
    }
}

fn run_suffix(run: usize) -> String {
    match run {
        0 => String::new(),
        n => format!("-r{n}"),
    }
}

/// What the firewall planner carries from one plan to the next (see [`super::Memory`]).
#[derive(Debug, Clone, Default)]
pub struct FirewallMemory {
    /// The object in force per namespace, and the validation cache.
    pub validated: Validated<EgressFirewall, ValidatedFirewall>,
    /// Each namespace's part with the inputs it was built from: a namespace whose inputs did
    /// not change keeps its part (the same `Arc`, which the diff skips).
    built: BTreeMap<String, Built>,
    /// The trusted resolvers as last planned ([`steer::trusted_resolvers`]).
    resolvers: steer::Trusted,
}

#[derive(Debug, Clone)]
struct Built {
    inputs: PartInputs,
    part: Arc<Part>,
    /// The logged verdicts of the part (ACL logging), by id.
    logged: Arc<Vec<(u64, Arc<acl_log::Entry>)>>,
}

/// Everything a namespace's part is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartInputs {
    firewall: Arc<ValidatedFirewall>,
    /// The addresses of the `dnsName` and `nodeSelector` rules, by rule index.
    resolved: Vec<(usize, Vec<IpAddr>)>,
    /// The namespace's local pod addresses (the dispatch elements).
    pods: Vec<IpAddr>,
    /// The namespace's ACL logging (`k8s.ovn.org/acl-logging`), if it logs anything.
    logging: Option<(AclLogging, AclLogSettings)>,
}

/// The EgressFirewall feature (see the module documentation).
pub struct Firewall;

/// What the firewall hands to the world besides its table: whose DNS answers the proxy
/// learns from, and into which sets.
#[derive(Debug, Clone, Default)]
pub struct FirewallOutput {
    pub learning: std::sync::Arc<learning::Learning>,
    /// The logged verdicts of the plan, for the ACL log reader.
    pub acl: Arc<acl_log::Book>,
}

impl super::Output for FirewallOutput {}

// The objects in force are kept across restarts; the rest is rebuilt by the first plan.
in_force::remember_through!(FirewallMemory, validated: Validated<EgressFirewall, ValidatedFirewall>);

// The last valid EgressFirewall of each namespace is kept across restarts.
super::kept::kept_kind!(EgressFirewall => ValidatedFirewall, field "egressFirewalls", keyed by namespace);

impl Feature for Firewall {
    const NAME: &'static str = PREFIX;
    const SWITCH: crate::features::Switch = crate::features::Switch::EgressFirewall;
    type Memory = FirewallMemory;
    type Output = FirewallOutput;

    fn plan(
        inputs: &Inputs,
        memory: &FirewallMemory,
        out: &mut Planned,
        output: &mut FirewallOutput,
    ) -> FirewallMemory {
        let (statuses, memory, acl) = plan(
            inputs.snapshot,
            inputs.config,
            inputs.dns,
            memory,
            &mut out.ruleset,
        );
        output.acl = Arc::new(acl);
        out.statuses.extend(statuses);
        let mut memory = memory;
        memory.resolvers = steer::trusted_resolvers(inputs.snapshot, inputs.config);
        let learning = learning::learning(&memory);
        if let Some(port) = inputs.config.dns_proxy.port {
            let rate = inputs.config.dns_proxy.rate_limit;
            steer::plan(&learning, port, rate, &mut out.ruleset, &mut out.net);
        }
        output.learning = std::sync::Arc::new(learning);
        memory
    }

    fn dns_names(inputs: &Inputs, memory: &FirewallMemory) -> BTreeSet<String> {
        dns_names(inputs.snapshot, memory)
    }
}

/// Adds the EgressFirewall dispatch to `table` and one part (`fw/<namespace>`) per namespace
/// with a firewall in force; a namespace whose inputs are unchanged reuses its part (the
/// same `Arc`, which the diff skips without looking inside).
fn plan(
    snapshot: &Snapshot,
    config: &Config,
    dns: &DnsAnswers,
    memory: &FirewallMemory,
    table: &mut Table,
) -> (Vec<ObjectStatus>, FirewallMemory, acl_log::Book) {
    let outcome = objects_in_force(snapshot, memory);
    for (name, key) in [(PODS_V4, DataType::Ipv4Addr), (PODS_V6, DataType::Ipv6Addr)] {
        table.add_set(Set::new(name, vec![key], SetKind::VerdictMap));
    }
    table.add_chain(dispatch_chain());
    table
        .chains
        .get_mut(FILTER_FORWARD)
        .expect("base skeleton has filter-forward")
        .push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(
            DISPATCH.into(),
        ))]));
    let in_force = &outcome.validated.in_force;
    let mut pods = local_pod_ips(snapshot, config, in_force);
    let mut built = BTreeMap::new();
    let mut book = acl_log::Book::default();
    for (ns, fw) in in_force {
        let logging = acl_log::namespace_logging(snapshot, ns, &mut book.problems);
        let inputs = PartInputs {
            firewall: fw.valid.clone(),
            resolved: resolve(&fw.valid, snapshot, dns),
            pods: pods.remove(ns.as_str()).unwrap_or_default(),
            logging: logging.map(|l| (l, config.acl_log)),
        };
        let (part, logged) = match memory.built.get(ns) {
            Some(b) if b.inputs == inputs => (b.part.clone(), b.logged.clone()),
            _ => {
                let (part, logged) = namespace_part(&inputs);
                (Arc::new(part), Arc::new(logged))
            }
        };
        table.insert_part(format!("{PREFIX}/{ns}"), part.clone());
        if !logged.is_empty() {
            let rate = acl_log::rate_part(ns);
            table.insert_part(acl_log::rate_part_key(ns), Arc::new(rate));
            book.entries
                .extend(logged.iter().map(|(id, e)| (*id, e.clone())));
        }
        let b = Built {
            inputs,
            part,
            logged,
        };
        built.insert(ns.clone(), b);
    }
    let memory = FirewallMemory {
        validated: outcome.validated,
        built,
        resolvers: steer::Trusted::default(),
    };
    (outcome.statuses, memory, book)
}

/// The DNS names the objects in force (or remembered) refer to: what the resolver must keep
/// fresh. Sorted, lowercase, one entry per name whatever the number of namespaces using it.
fn dns_names(snapshot: &Snapshot, memory: &FirewallMemory) -> BTreeSet<String> {
    objects_in_force(snapshot, memory)
        .validated
        .in_force
        .values()
        .flat_map(|fw| &fw.valid.rules)
        .filter_map(|r| match &r.dest {
            // A wildcard has no answer of its own: only the proxy learns its addresses.
            Destination::Dns(name) if !name.starts_with("*.") => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// `fw-dispatch`: exempt established traffic and cluster/service destinations, then one
/// lookup on the source address per family.
fn dispatch_chain() -> Chain {
    let mut c = Chain::regular(DISPATCH);
    c.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::CtState],
            op: MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
        }),
        Stmt::Verdict(Verdict::Return),
    ]));
    for (field, set) in [
        (Field::Ip4Daddr, sets::CLUSTER_V4),
        (Field::Ip4Daddr, sets::SERVICE_V4),
        (Field::Ip6Daddr, sets::CLUSTER_V6),
        (Field::Ip6Daddr, sets::SERVICE_V6),
    ] {
        c.push(Rule::new(vec![
            Stmt::in_set(vec![field], set),
            Stmt::Verdict(Verdict::Return),
        ]));
    }
    c.push(Rule::new(vec![Stmt::vmap(vec![Field::Ip4Saddr], PODS_V4)]));
    c.push(Rule::new(vec![Stmt::vmap(vec![Field::Ip6Saddr], PODS_V6)]));
    c
}

fn objects_in_force(
    snapshot: &Snapshot,
    memory: &FirewallMemory,
) -> in_force::Outcome<EgressFirewall, ValidatedFirewall> {
    memory.validated.update(
        Kind::EgressFirewall,
        Scope::Namespace,
        snapshot
            .egress_firewalls()
            .iter()
            .map(|(k, o)| (k.clone(), o)),
        EgressFirewall::validate,
    )
}

/// Addresses of pods on this node (not host-network, not terminal), per namespace with a
/// firewall in force.
fn local_pod_ips<'a>(
    snapshot: &'a Snapshot,
    config: &Config,
    in_force: &in_force::InForceMap<EgressFirewall, ValidatedFirewall>,
) -> BTreeMap<&'a str, Vec<IpAddr>> {
    let mut by_ns: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for pod in snapshot.pod_network_pods_on_node(&config.node_name) {
        let Some(ns) = pod.metadata.namespace.as_deref() else {
            continue;
        };
        if in_force.contains_key(ns) {
            by_ns.entry(ns).or_default().extend(snapshot::pod_ips(pod));
        }
    }
    by_ns
}

/// A namespace's chain and maps, and the dispatch elements of its pods; with ACL logging,
/// the chains of its logged verdicts and their entries.
fn namespace_part(inputs: &PartInputs) -> (Part, Vec<(u64, Arc<acl_log::Entry>)>) {
    let fw = &inputs.firewall;
    let names = Names::new(&fw.namespace);
    let mut verdicts: Vec<RuleVerdict> = fw.rules.iter().enumerate().map(rule_verdict).collect();
    let mut f = Part::default();
    let logged = match &inputs.logging {
        Some((logging, settings)) => log_verdicts(fw, logging, settings, &mut verdicts, &mut f),
        None => Vec::new(),
    };
    let mut chain = Chain::regular(&names.chain);
    for family in [IpFamily::V4, IpFamily::V6] {
        let (daddr, addr_type) = match family {
            IpFamily::V4 => (Field::Ip4Daddr, DataType::Ipv4Addr),
            IpFamily::V6 => (Field::Ip6Daddr, DataType::Ipv6Addr),
        };
        let mut resolved = inputs.resolved.iter().peekable();
        let rules: Vec<compile::Rule> = fw
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let addrs = resolved
                    .next_if(|(at, _)| *at == i)
                    .map(|(_, a)| a.as_slice());
                compile_input(r, family, addrs.unwrap_or_default())
            })
            .collect();
        let learned: Vec<bool> = fw
            .rules
            .iter()
            .map(|r| matches!(r.dest, Destination::Dns(_)))
            .collect();
        let mut runs = 0;
        for step in steps::steps(&rules, &learned, max_addr(family)) {
            match step {
                Step::Painted(compiled) => {
                    let (ports_map, addr_map) =
                        maps(&names, runs, family, addr_type, &compiled, &verdicts);
                    chain.push(Rule::new(vec![Stmt::vmap(
                        vec![daddr, Field::L4Proto, Field::ThDport],
                        &ports_map.name,
                    )]));
                    chain.push(Rule::new(vec![Stmt::vmap(vec![daddr], &addr_map.name)]));
                    f.add_set(ports_map);
                    f.add_set(addr_map);
                    runs += 1;
                }
                Step::Learned(i) => {
                    let Destination::Dns(name) = &fw.rules[i].dest else {
                        unreachable!("only dnsName rules learn")
                    };
                    let set = names.learned_set(name, family);
                    for rule in learned_rules(daddr, &set, &fw.rules[i], &verdicts[i]) {
                        chain.push(rule);
                    }
                    f.add_set(learned_set(set, addr_type));
                }
            }
        }
    }
    for ip in &inputs.pods {
        let map = if ip.is_ipv6() { PODS_V6 } else { PODS_V4 };
        let goto = ElemData::Verdict(Verdict::Goto(names.chain.clone()));
        f.add_mapping(map, vec![Value::ip(*ip).into()], goto);
    }
    f.add_chain(chain);
    (f, logged)
}

/// Sends each verdict `logging` logs to its ACL log chain (added to `part`).
fn log_verdicts(
    fw: &ValidatedFirewall,
    logging: &AclLogging,
    settings: &AclLogSettings,
    verdicts: &mut [RuleVerdict],
    part: &mut Part,
) -> Vec<(u64, Arc<acl_log::Entry>)> {
    let mut logged = Vec::new();
    for (rule, v) in fw.rules.iter().zip(verdicts.iter_mut()) {
        let action = match rule.action {
            Action::Allow => acl_log::Action::Allow,
            Action::Deny => acl_log::Action::Deny,
        };
        let object = "default";
        let text = v.comment.to_string();
        let kind = "EgressFirewall";
        let Some(entry) =
            acl_log::Entry::logged(logging, &fw.namespace, kind, object, text, action)
        else {
            continue;
        };
        let id = entry.id();
        part.add_chain(acl_log::chain(&entry, settings));
        v.verdict = Verdict::Goto(acl_log::chain_name(id));
        logged.push((id, Arc::new(entry)));
    }
    logged
}

/// The current addresses of each `dnsName` (DNS answers) and `nodeSelector` (every address
/// of the matching Nodes: `k8s.ovn.org/host-cidrs`, InternalIP, ExternalIP) rule, by rule
/// index.
fn resolve(
    fw: &ValidatedFirewall,
    snapshot: &Snapshot,
    dns: &DnsAnswers,
) -> Vec<(usize, Vec<IpAddr>)> {
    let mut out = Vec::new();
    for (i, rule) in fw.rules.iter().enumerate() {
        let addrs = match &rule.dest {
            Destination::Cidr(_) => continue,
            Destination::Dns(name) => dns.get(name).to_vec(),
            Destination::Nodes(selector) => snapshot
                .nodes()
                .values()
                .filter(|n| selector.matches_meta(&n.metadata))
                .flat_map(|n| snapshot::node_host_addresses(n))
                .collect(),
        };
        out.push((i, addrs));
    }
    out
}

/// The compiler's view of a rule for one family: its destination as address intervals
/// (`resolved`: the addresses of a DNS or node rule, as single points) and its ports.
fn compile_input(rule: &FirewallRule, family: IpFamily, resolved: &[IpAddr]) -> compile::Rule {
    let ranges = match &rule.dest {
        Destination::Cidr(net) if IpFamily::of(net.addr()) == family => {
            vec![(num(net.network()), num(net.broadcast()))]
        }
        Destination::Cidr(_) => Vec::new(),
        Destination::Dns(_) | Destination::Nodes(_) => resolved
            .iter()
            .filter(|ip| IpFamily::of(**ip) == family)
            .map(|ip| (num(*ip), num(*ip)))
            .collect(),
    };
    let ports = rule
        .ports
        .iter()
        .map(|p| PortKey {
            proto: p.protocol.ip_number(),
            port: p.port,
        })
        .collect();
    compile::Rule { ranges, ports }
}

/// A learned set: addresses the DNS proxy adds with their answer's TTL (`flags timeout`),
/// never by a plan (`dynamic`: the kernel's elements are the truth, the diff keeps them).
fn learned_set(name: String, addr_type: DataType) -> Set {
    Set::new(name, vec![addr_type], SetKind::Set).with_flags(SetFlags {
        timeout: true,
        dynamic: true,
        ..Default::default()
    })
}

/// The rules consulting a learned set at its rule's place: one per listed port (a rule
/// without ports is one rule for every packet).
fn learned_rules(daddr: Field, set: &str, rule: &FirewallRule, v: &RuleVerdict) -> Vec<Rule> {
    let matched = |extra: Vec<Stmt>| {
        let mut stmts = vec![Stmt::in_set(vec![daddr], set)];
        stmts.extend(extra);
        // The maps count per element; a rule counts with `counter` (the per-rule metrics).
        stmts.push(Stmt::Counter);
        stmts.push(Stmt::Verdict(v.verdict.clone()));
        Rule::new(stmts).with_comment(v.comment.to_string())
    };
    if rule.ports.is_empty() {
        return vec![matched(Vec::new())];
    }
    rule.ports
        .iter()
        .map(|p| {
            matched(vec![
                Stmt::matches(Field::L4Proto, Value::Proto(p.protocol.ip_number())),
                Stmt::matches(Field::ThDport, Value::Port(p.port)),
            ])
        })
        .collect()
}

/// The two interval verdict maps of a painted run of a namespace and family; every element
/// counts its hits.
fn maps(
    names: &Names,
    run: usize,
    family: IpFamily,
    addr_type: DataType,
    compiled: &Compiled,
    verdicts: &[RuleVerdict],
) -> (Set, Set) {
    let interval = SetFlags {
        interval: true,
        counter: true,
        ..Default::default()
    };
    let mut ports = Set::new(
        names.run_ports_map(run, family),
        vec![addr_type, DataType::InetProto, DataType::InetService],
        SetKind::VerdictMap,
    )
    .with_flags(interval);
    let insert = |set: &mut Set, key: ElemKey, s: &Segment| {
        let v = &verdicts[s.rule];
        let data = ElemData::Verdict(v.verdict.clone());
        set.insert_commented_mapping(key, data, v.comment.clone());
    };
    for (p, segments) in &compiled.ports {
        for s in segments {
            let key = vec![
                key_part(family, s),
                Value::Proto(p.proto).into(),
                Value::Port(p.port).into(),
            ];
            insert(&mut ports, key, s);
        }
    }
    let mut addrs = Set::new(
        names.run_addr_map(run, family),
        vec![addr_type],
        SetKind::VerdictMap,
    )
    .with_flags(interval);
    for s in &compiled.other {
        insert(&mut addrs, vec![key_part(family, s)], s);
    }
    (ports, addrs)
}

/// What the elements compiled from one rule map to.
struct RuleVerdict {
    verdict: Verdict,
    /// `rule 3: Deny 0.0.0.0/0 ports tcp/80`, shared by all the rule's elements.
    comment: Arc<str>,
}

fn rule_verdict((index, rule): (usize, &FirewallRule)) -> RuleVerdict {
    let (verdict, action) = match rule.action {
        Action::Allow => (Verdict::Accept, "Allow"),
        Action::Deny => (Verdict::Drop, "Deny"),
    };
    let dest = match &rule.dest {
        Destination::Cidr(net) => net.to_string(),
        Destination::Dns(name) => format!("dnsName {name}"),
        Destination::Nodes(sel) => format!("nodeSelector {sel}"),
    };
    let ports: Vec<String> = rule.ports.iter().map(|p| p.to_string()).collect();
    let ports = if ports.is_empty() {
        String::new()
    } else {
        format!(" ports {}", ports.join(","))
    };
    RuleVerdict {
        verdict,
        comment: format!("rule {index}: {action} {dest}{ports}").into(),
    }
}

/// A segment as a map key part: a single address, a prefix when it is exactly one, else an
/// inclusive range.
fn key_part(family: IpFamily, s: &Segment) -> KeyPart {
    let ip = |n: u128| match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    };
    if s.start == s.end {
        return KeyPart::Value(Value::ip(ip(s.start)));
    }
    let bits: u8 = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    // The segment is a prefix when its size is 2^k and its start is aligned to it.
    let span = s.end - s.start; // size - 1
    if span.wrapping_add(1) & span == 0 && s.start & span == 0 {
        let host_bits = (span.count_ones()) as u8;
        let net = match family {
            IpFamily::V4 => {
                Ipv4Net::new(Ipv4Addr::from(s.start as u32), bits - host_bits).map(IpNet::V4)
            }
            IpFamily::V6 => Ipv6Net::new(Ipv6Addr::from(s.start), bits - host_bits).map(IpNet::V6),
        };
        if let Ok(net) = net {
            return KeyPart::Prefix(net);
        }
    }
    KeyPart::Range(Value::ip(ip(s.start)), Value::ip(ip(s.end)))
}

fn num(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn max_addr(family: IpFamily) -> u128 {
    match family {
        IpFamily::V4 => u128::from(u32::MAX),
        IpFamily::V6 => u128::MAX,
    }
}

fn suffix(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "v4",
        IpFamily::V6 => "v6",
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_acl;
