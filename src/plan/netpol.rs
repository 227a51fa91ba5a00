//! NetworkPolicy (networking.k8s.io/v1) for this node's pods.
//!
//! Per packet: `ct state established,related accept`, then one verdict-map lookup on the
//! local pod's address per direction (`np-egress-v4/v6` on the source, `np-ingress-v4/v6` on
//! the destination). A pod a policy isolates maps to `goto` the chain of its *policy set*
//! (the policies selecting it for that direction), which `jump`s to each of those policies'
//! chains and drops what none accepted. A policy's chain has one or two rules per policy
//! rule and family, each a lookup in named sets (peers, ports, named ports). So the cost is
//! one map lookup plus the rules of the policies that select the pod, whatever the number
//! of policies, namespaces or pods in the cluster.
//!
//! Parts: `np/<namespace>/<name>` per policy (its chains and sets: a policy edit rewrites
//! only it), and `np-set/<in|eg>/<chain>` per policy set in use (its chain and the dispatch
//! elements of its pods): pod churn and label changes are element updates, plus a new
//! policy-set chain the first time a combination of policies selects a pod.
//!
//! Hooks (only present while a policy is in force): forward only, at filter priority + 10
//! (egress) and + 11 (ingress), after service DNAT (policies see endpoints) and after
//! EgressFirewall's `filter-forward` (0): a packet leaves only when both accept it. Forward
//! sees routed pods and bridged pods with `br_netfilter`. Input and output are not hooked on
//! purpose: upstream, traffic between a pod and its own node is always allowed (kubelet
//! probes), and that traffic is exactly what those hooks see.

mod pods;
mod rules;

use super::in_force::{Scope, Validated};
use super::{Feature, Inputs, Planned};
use crate::api::NetworkPolicy;
use crate::api::network_policy::{self, ValidatedPolicy};
use crate::nft::ir::*;
use crate::nft::names::object_name;
use crate::snapshot::Kind;
use pods::PodIndex;
use rules::{Direction, add_direction};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

pub use rules::subtract;

/// Prefix of the parts and chains.
const PREFIX: &str = "np";

/// Dispatch maps: local pod address -> its policy-set chain.
pub const INGRESS_V4: &str = "np-ingress-v4";
pub const INGRESS_V6: &str = "np-ingress-v6";
pub const EGRESS_V4: &str = "np-egress-v4";
pub const EGRESS_V6: &str = "np-egress-v6";

/// Base chains on the forward hook, egress first: a pod-to-pod packet passes its source's
/// egress policies, then its destination's ingress policies.
pub mod chains {
    pub const FORWARD_EGRESS: &str = "np-forward-egress";
    pub const FORWARD_INGRESS: &str = "np-forward-ingress";
}
/// After EgressFirewall's `filter-forward` (filter priority).
const PRIORITY: i32 = priority::FILTER + 10;

/// What the NetworkPolicy planner carries between plans: the policies in force (an invalid
/// edit keeps the policy's last valid version: dropping it could open what it isolated) and
/// last plan's parts, reused when equal so the diff skips them by pointer.
#[derive(Debug, Clone, Default)]
pub struct NetpolMemory {
    pub validated: Validated<NetworkPolicy, ValidatedPolicy>,
    parts: BTreeMap<String, Arc<Part>>,
}

/// The NetworkPolicy feature (see the module documentation).
pub struct NetworkPolicies;

impl Feature for NetworkPolicies {
    const NAME: &'static str = PREFIX;
    type Memory = NetpolMemory;

    fn plan(inputs: &Inputs, memory: &NetpolMemory, out: &mut Planned) -> NetpolMemory {
        let snapshot = inputs.snapshot;
        let outcome = memory.validated.update(
            Kind::NetworkPolicy,
            Scope::Object,
            snapshot
                .network_policies()
                .iter()
                .map(|(k, o)| (k.clone(), o)),
            network_policy::validate,
        );
        out.statuses.extend(outcome.statuses);
        let in_force = &outcome.validated.in_force;
        let mut parts = BTreeMap::new();
        if !in_force.is_empty() {
            let index = PodIndex::new(snapshot, &inputs.config.node_name);
            let mut sets: BTreeMap<Direction, BTreeMap<IpAddr, Vec<String>>> = BTreeMap::new();
            for policy in in_force.values().map(|p| &p.valid) {
                let base = object_name(PREFIX, &format!("{}/{}", policy.namespace, policy.name));
                let selected: Vec<_> = index.selected(&policy.namespace, &policy.pods).collect();
                let mut part = Part::default();
                for (direction, rules) in [
                    (Direction::Ingress, &policy.ingress),
                    (Direction::Egress, &policy.egress),
                ] {
                    let Some(rules) = rules else { continue };
                    add_direction(
                        &mut part, &base, policy, direction, rules, &index, &selected,
                    );
                    let chain = format!("{base}-{}", direction.suffix());
                    for ip in selected.iter().flat_map(|p| &p.ips) {
                        let entry = sets.entry(direction).or_default().entry(*ip).or_default();
                        entry.push(chain.clone());
                    }
                }
                part.shrink_to_fit();
                parts.insert(
                    format!("{PREFIX}/{}/{}", policy.namespace, policy.name),
                    part,
                );
            }
            for (direction, by_pod) in &sets {
                for (key, part) in policy_set_parts(*direction, by_pod) {
                    parts.insert(key, part);
                }
            }
            add_hooks(&mut out.ruleset);
        }
        let table = &mut out.ruleset;
        let mut kept = BTreeMap::new();
        for (key, part) in parts {
            let part = match memory.parts.get(&key) {
                Some(old) if **old == part => old.clone(),
                _ => Arc::new(part),
            };
            table.insert_part(key.clone(), part.clone());
            kept.insert(key, part);
        }
        NetpolMemory {
            validated: outcome.validated,
            parts: kept,
        }
    }
}

/// One part per distinct policy set: its chain (`jump` each policy chain, then drop) and the
/// dispatch elements of the pods it governs.
fn policy_set_parts(
    direction: Direction,
    by_pod: &BTreeMap<IpAddr, Vec<String>>,
) -> Vec<(String, Part)> {
    let mut groups: BTreeMap<&[String], Vec<IpAddr>> = BTreeMap::new();
    for (ip, policies) in by_pod {
        groups.entry(policies.as_slice()).or_default().push(*ip);
    }
    let (v4, v6) = match direction {
        Direction::Ingress => (INGRESS_V4, INGRESS_V6),
        Direction::Egress => (EGRESS_V4, EGRESS_V6),
    };
    groups
        .into_iter()
        .map(|(policies, ips)| {
            let name = object_name(
                &format!("{PREFIX}{}", direction.suffix()),
                &policies.join(","),
            );
            let mut chain = Chain::regular(&name);
            for policy_chain in policies {
                chain.push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(
                    policy_chain.clone(),
                ))]));
            }
            chain.push(Rule::new(vec![Stmt::Counter, Stmt::Verdict(Verdict::Drop)]));
            let mut part = Part::default();
            part.add_chain(chain);
            for ip in ips {
                let map = if ip.is_ipv4() { v4 } else { v6 };
                let goto = ElemData::Verdict(Verdict::Goto(name.clone()));
                part.add_mapping(map, vec![Value::ip(ip).into()], goto);
            }
            part.shrink_to_fit();
            (format!("{PREFIX}-set/{}/{name}", direction.suffix()), part)
        })
        .collect()
}

/// The dispatch maps and the base chains that look them up.
fn add_hooks(table: &mut Table) {
    for (name, addr) in [
        (INGRESS_V4, DataType::Ipv4Addr),
        (INGRESS_V6, DataType::Ipv6Addr),
        (EGRESS_V4, DataType::Ipv4Addr),
        (EGRESS_V6, DataType::Ipv6Addr),
    ] {
        table.add_set(Set::new(name, vec![addr], SetKind::VerdictMap));
    }
    let egress = [(Field::Ip4Saddr, EGRESS_V4), (Field::Ip6Saddr, EGRESS_V6)];
    let ingress = [(Field::Ip4Daddr, INGRESS_V4), (Field::Ip6Daddr, INGRESS_V6)];
    for (name, prio, lookups) in [
        (chains::FORWARD_EGRESS, PRIORITY, egress),
        (chains::FORWARD_INGRESS, PRIORITY + 1, ingress),
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
        chain.push(Rule::new(vec![
            Stmt::Match(Match {
                key: vec![Field::CtState],
                op: MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
            }),
            Stmt::Verdict(Verdict::Accept),
        ]));
        chain.push(neighbour_discovery());
        for (field, map) in lookups {
            chain.push(Rule::new(vec![Stmt::vmap(vec![field], map)]));
        }
        table.add_chain(chain);
    }
}

/// ICMPv6 neighbour solicitations and advertisements (types 135, 136, code 0) are accepted:
/// between bridged pods (with `br_netfilter`) they cross the forward hook, and dropping them
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
