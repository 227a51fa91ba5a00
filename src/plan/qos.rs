//! EgressQoS: DSCP marking of the traffic of this node's pods, per namespace.
//!
//! Per packet, `mangle-postrouting` does one verdict-map lookup on the source address
//! (`ip saddr vmap @qos-pods-v4`, `ip6 saddr vmap @qos-pods-v6`); each local pod IP of a
//! namespace with an EgressQoS maps to `jump <namespace chain>`, so the cost does not grow with
//! the number of namespaces. The namespace chain holds the object's rules in order, each ending
//! in `dscp set N` + `return`, so the first match wins. Pod IPs live in set elements (the
//! vmap and one set per podSelector rule and family): pod churn and relabelling are element
//! updates; a chain is rewritten only when its object's rules change.
//!
//! The chain runs at mangle priority (-150) in postrouting: after prerouting DNAT (so
//! `dstCIDR` sees the real destination of service traffic) and before srcnat (so the pod's
//! own source address is matched whatever SNAT/masquerade happens next).

use super::base::chains::MANGLE_POSTROUTING;
use super::in_force::{InForceMap, Scope, Validated};
use super::{Feature, Inputs, Planned};
use crate::api::{EgressQoS, QosRule, ValidatedQos};
use crate::config::Config;
use crate::nft::ir::*;
use crate::nft::names::object_name;
use crate::snapshot::{self, Kind, Snapshot};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// Verdict maps from a local pod's address to its namespace's QoS chain.
pub const PODS_V4: &str = "qos-pods-v4";
pub const PODS_V6: &str = "qos-pods-v6";

/// Prefix of the per-namespace chains (`qos-HASH-namespace`); per-rule pod sets append
/// `-r<index>-v4` / `-v6`.
const PREFIX: &str = "qos";

/// What the QoS planner carries from one plan to the next (see [`super::Memory`]): the
/// object in force per namespace, and the validation cache.
pub type QosMemory = Validated<EgressQoS, ValidatedQos>;

// The last valid EgressQoS of each namespace is kept across restarts.
super::kept::kept_kind!(EgressQoS => ValidatedQos, field "egressQoSes", keyed by namespace);

/// The EgressQoS feature (see the module documentation).
pub struct Qos;

impl Feature for Qos {
    const NAME: &'static str = PREFIX;
    const SWITCH: crate::features::Switch = crate::features::Switch::EgressQos;
    type Memory = QosMemory;
    type Output = ();

    /// Adds the dispatch maps and rules, and one part (`qos/<namespace>`: the namespace's
    /// chain, its per-rule pod sets and its pods' dispatch elements) per namespace with an
    /// EgressQoS in force.
    fn plan(inputs: &Inputs, memory: &QosMemory, out: &mut Planned, _: &mut ()) -> QosMemory {
        let (snapshot, config) = (inputs.snapshot, inputs.config);
        let outcome = memory.update(
            Kind::EgressQoS,
            Scope::Namespace,
            snapshot.egress_qoses().iter().map(|(k, o)| (k.clone(), o)),
            EgressQoS::validate,
        );
        let table = &mut out.ruleset;
        let in_force = &outcome.validated.in_force;
        let pods = local_pods(snapshot, config, in_force);
        for (ns, qos) in in_force {
            let ns_pods = pods.get(ns.as_str()).map(Vec::as_slice).unwrap_or_default();
            let part = namespace_part(&qos.valid, ns_pods);
            table.insert_part(format!("{PREFIX}/{ns}"), Arc::new(part));
        }
        let base = table
            .chains
            .get_mut(MANGLE_POSTROUTING)
            .expect("base skeleton has mangle-postrouting");
        base.push(Rule::new(vec![Stmt::vmap(vec![Field::Ip4Saddr], PODS_V4)]));
        base.push(Rule::new(vec![Stmt::vmap(vec![Field::Ip6Saddr], PODS_V6)]));
        table.add_set(Set::new(
            PODS_V4,
            vec![DataType::Ipv4Addr],
            SetKind::VerdictMap,
        ));
        table.add_set(Set::new(
            PODS_V6,
            vec![DataType::Ipv6Addr],
            SetKind::VerdictMap,
        ));
        out.statuses.extend(outcome.statuses);
        outcome.validated
    }
}

/// A pod whose traffic may be marked: labels to evaluate selectors, and its IPs.
struct LocalPod<'a> {
    labels: &'a BTreeMap<String, String>,
    ips: Vec<IpAddr>,
}

/// Pods on this node (not host-network, whose address is the node's; not terminal, whose IP
/// may already belong to another pod) with IPs, grouped by namespace, for namespaces with an
/// object in force.
fn local_pods<'a>(
    snapshot: &'a Snapshot,
    config: &Config,
    in_force: &InForceMap<EgressQoS, ValidatedQos>,
) -> BTreeMap<&'a str, Vec<LocalPod<'a>>> {
    let mut by_ns: BTreeMap<&str, Vec<LocalPod>> = BTreeMap::new();
    for pod in snapshot.pod_network_pods_on_node(&config.node_name) {
        let Some(ns) = pod.metadata.namespace.as_deref() else {
            continue;
        };
        let ips = snapshot::pod_ips(pod);
        if in_force.contains_key(ns) && !ips.is_empty() {
            by_ns.entry(ns).or_default().push(LocalPod {
                labels: snapshot::labels(&pod.metadata),
                ips,
            });
        }
    }
    by_ns
}

/// The namespace's chain, its per-rule pod sets and its pods' dispatch elements.
fn namespace_part(qos: &ValidatedQos, pods: &[LocalPod]) -> Part {
    let mut part = Part::default();
    let name = object_name(PREFIX, &qos.namespace);
    let mut chain = Chain::regular(&name);
    for (i, rule) in qos.rules.iter().enumerate() {
        for family in [IpFamily::V4, IpFamily::V6] {
            if rule.dst.is_some_and(|d| IpFamily::of(d.addr()) != family) {
                continue;
            }
            let pod_set = (!rule.pods.is_everything()).then(|| {
                let set = rule_pod_set(
                    &format!("{name}-r{i}-{}", suffix(family)),
                    rule,
                    pods,
                    family,
                );
                let set_name = set.name.clone();
                part.add_set(set);
                set_name
            });
            let comment = format!("EgressQoS {} rule {i}", qos.namespace);
            chain.push(Rule::new(rule_stmts(rule, family, pod_set)).with_comment(comment));
        }
    }
    part.add_chain(chain);
    for ip in pods.iter().flat_map(|p| &p.ips) {
        let map = [PODS_V4, PODS_V6][family_index(ip)];
        let jump = ElemData::Verdict(Verdict::Jump(name.clone()));
        part.add_mapping(map, vec![Value::ip(*ip).into()], jump);
    }
    part.shrink_to_fit();
    part
}

/// The IPs (of `family`) of the pods the rule's podSelector picks.
fn rule_pod_set(name: &str, rule: &QosRule, pods: &[LocalPod], family: IpFamily) -> Set {
    let mut set = Set::new(name, vec![DataType::addr(family)], SetKind::Set);
    for pod in pods.iter().filter(|p| rule.pods.matches(p.labels)) {
        for ip in pod.ips.iter().filter(|ip| IpFamily::of(**ip) == family) {
            set.insert(vec![Value::ip(*ip).into()]);
        }
    }
    set
}

/// `[ip saddr @set] [ip daddr CIDR] [meta l4proto . th dport { .. }] counter ip dscp set N
/// return`. A rule with no address match starts with `meta nfproto` instead, so that only
/// packets of its family are counted and marked.
fn rule_stmts(rule: &QosRule, family: IpFamily, pod_set: Option<String>) -> Vec<Stmt> {
    let (saddr, daddr) = match family {
        IpFamily::V4 => (Field::Ip4Saddr, Field::Ip4Daddr),
        IpFamily::V6 => (Field::Ip6Saddr, Field::Ip6Daddr),
    };
    let mut stmts = Vec::new();
    if let Some(set) = pod_set {
        stmts.push(Stmt::in_set(vec![saddr], set));
    }
    // A /0 destination is just "this family", which the nfproto match below expresses.
    if let Some(dst) = rule.dst.filter(|d| d.prefix_len() > 0) {
        stmts.push(Stmt::Match(Match {
            key: vec![daddr],
            op: MatchOp::InAnon(vec![vec![KeyPart::Prefix(dst)]]),
        }));
    }
    if stmts.is_empty() {
        stmts.push(Stmt::matches(Field::NfProto, Value::NfProto(family)));
    }
    if !rule.ports.is_empty() {
        let elems = rule
            .ports
            .iter()
            .map(|p| {
                let proto = Value::Proto(p.protocol.ip_number());
                vec![proto.into(), Value::Port(p.port).into()]
            })
            .collect();
        stmts.push(Stmt::Match(Match {
            key: vec![Field::L4Proto, Field::ThDport],
            op: MatchOp::InAnon(elems),
        }));
    }
    stmts.extend([
        Stmt::Counter,
        Stmt::DscpSet {
            family,
            dscp: rule.dscp,
        },
        Stmt::Verdict(Verdict::Return),
    ]);
    stmts
}

fn family_index(ip: &IpAddr) -> usize {
    match IpFamily::of(*ip) {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
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
