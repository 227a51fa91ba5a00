//! One policy's part: a chain per direction it isolates, whose rules `accept` what one of
//! its rules allows and otherwise fall through (`return`), and the named sets those rules
//! look up. Peers and ports are set lookups, so the chain has a rule or two per policy rule
//! and family whatever the number of pods; pod churn changes set elements only.
//!
//! Per policy rule and family:
//! - `ip saddr|daddr @np-peers-<hash>-v4 [meta l4proto . th dport @ports] accept` (the
//!   peers' set, shared by every rule naming the same peers: `peers`) for numeric ports
//!   (ranges, whole protocols) or no port list; a rule without peers looks up
//!   `np-any-v4/v6` (every address of the family) instead, which works in the inet and the
//!   bridge table alike;
//! - `[ip saddr @peers] ip daddr . meta l4proto . th dport @named accept` (ingress) or
//!   `ip daddr . meta l4proto . th dport @named accept` (egress) for named ports, whose
//!   elements are resolved per pod: the selected pod's container ports for ingress, the
//!   peer pod's for egress (ipBlock peers have no container ports: a named port never
//!   matches them).

use super::peers::{Lookup, PeerKey, PeerSets, suffix};
use super::pods::{PodIndex, PodView};
use crate::api::Protocol;
use crate::api::network_policy::{Peer, PolicyRule, PortSpec, ValidatedPolicy};
use crate::nft::ir::*;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Which way a policy rule allows traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// `ingress`, `egress`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            Direction::Ingress => "in",
            Direction::Egress => "eg",
        }
    }
}

const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// The chain of `policy` for `direction` (named `<base>-<in|eg>`, returned) and its sets
/// into `part`; the rules' peers are shared sets (`peers`), looked up or created through
/// `shared`, their keys added to `keys`.
#[allow(clippy::too_many_arguments)]
pub fn add_direction(
    part: &mut Part,
    base: &str,
    policy: &ValidatedPolicy,
    direction: Direction,
    rules: &[PolicyRule],
    index: &PodIndex,
    selected: &[&PodView],
    shared: &mut Sharing,
) -> String {
    let chain_name = format!("{base}-{}", direction.suffix());
    let mut chain = Chain::regular(&chain_name);
    for (i, rule) in rules.iter().enumerate() {
        let at = RuleAt {
            policy,
            direction,
            i,
            sets: format!("{chain_name}{i}"),
            comment: format!(
                "NetworkPolicy {}/{} {}[{i}]",
                policy.namespace,
                policy.name,
                direction.name()
            ),
        };
        at.add(rule, &mut chain, part, index, selected, shared);
    }
    part.add_chain(chain);
    chain_name
}

/// Rule `i` of `policy`'s rules for `direction`, planned into the direction's chain.
struct RuleAt<'p> {
    policy: &'p ValidatedPolicy,
    direction: Direction,
    i: usize,
    /// The prefix of the names of the rule's own sets.
    sets: String,
    /// The comment on its chain rules.
    comment: String,
}

impl RuleAt<'_> {
    /// The chain rules of `rule` for each family (with its peers), numeric ports and named
    /// ports apart, and their sets into `part`.
    fn add(
        &self,
        rule: &PolicyRule,
        chain: &mut Chain,
        part: &mut Part,
        index: &PodIndex,
        selected: &[&PodView],
        shared: &mut Sharing,
    ) {
        let (numeric, named) = split_ports(rule);
        let ports_set = numeric.as_ref().filter(|n| !n.is_empty()).map(|n| {
            let set = ports_set(&format!("{}-ports", self.sets), n);
            let name = set.name.clone();
            part.add_set(set);
            name
        });
        let namespace = &self.policy.namespace;
        let peer_sets = rule
            .peers
            .as_ref()
            .map(|peers| shared.use_peers(PeerKey::of(namespace, peers), index));
        let owners = named_port_owners(rule, self.direction, &named, namespace, index, selected);
        for family in FAMILIES {
            let (peer_field, local_field) = fields(self.direction, family);
            let peer_match = match &peer_sets {
                None => None,
                Some(lookup) => match lookup.set(family) {
                    None => continue, // no peer of this family: nothing allowed
                    Some(set) => Some(Stmt::in_set(vec![peer_field], set)),
                },
            };
            let no_port_list = numeric.is_none() && named.is_empty();
            if no_port_list || ports_set.is_some() {
                // No peers: every address of the family. A lookup on the address field,
                // not `meta nfproto`, which never matches in the bridge family.
                let any = Stmt::in_set(vec![peer_field], any_addr_set(family));
                let mut stmts = vec![peer_match.clone().unwrap_or(any)];
                if let Some(set) = &ports_set {
                    stmts.push(Stmt::in_set(vec![Field::L4Proto, Field::ThDport], set));
                }
                self.push_allow(stmts, chain, part, shared);
            }
            if named.is_empty() {
                continue;
            }
            let set = named_set(
                &format!("{}-named-{}", self.sets, suffix(family)),
                family,
                &named,
                &owners,
            );
            if set.elements.is_empty() {
                continue;
            }
            let mut stmts: Vec<Stmt> = match self.direction {
                Direction::Ingress => peer_match.into_iter().collect(),
                Direction::Egress => Vec::new(),
            };
            let key = vec![
                local_or_peer_daddr(self.direction, local_field, peer_field),
                Field::L4Proto,
                Field::ThDport,
            ];
            stmts.push(Stmt::in_set(key, set.name.clone()));
            self.push_allow(stmts, chain, part, shared);
            part.add_set(set);
        }
    }

    /// Pushes onto `chain` the rule that counts (for the per-policy metrics) and allows
    /// what `matches` match: `accept`, or `goto` its logged chain (into `part`).
    fn push_allow(
        &self,
        mut matches: Vec<Stmt>,
        chain: &mut Chain,
        part: &mut Part,
        shared: &mut Sharing,
    ) {
        let acl = shared.acl.as_ref();
        let d = self.direction.name();
        let verdict =
            super::acl::allow_verdict(acl, self.policy, d, self.i, part, &mut shared.logged);
        matches.push(Stmt::Counter);
        matches.push(Stmt::Verdict(verdict));
        chain.push(Rule::new(matches).with_comment(self.comment.clone()));
    }
}

/// The pods whose container ports resolve `rule`'s named ports: the selected pods for
/// ingress; for egress the peer pods (every pod for a rule without peers).
fn named_port_owners<'i, 'a>(
    rule: &'i PolicyRule,
    direction: Direction,
    named: &[(Protocol, &str)],
    namespace: &'i str,
    index: &'i PodIndex<'a>,
    selected: &[&'i PodView<'a>],
) -> Vec<&'i PodView<'a>> {
    match (&rule.peers, direction) {
        _ if named.is_empty() => Vec::new(),
        (_, Direction::Ingress) => selected.to_vec(),
        (None, Direction::Egress) => index.pods.iter().collect(),
        (Some(peers), Direction::Egress) => peer_pods(index, namespace, peers),
    }
}

/// Where a policy's rules find their shared peer sets: the sets in use, the parts they are
/// planned into, and the keys this policy looked up.
pub struct Sharing<'m> {
    pub sets: &'m mut PeerSets,
    pub parts: &'m mut Parts,
    pub keys: Vec<Arc<PeerKey>>,
    /// The policy's namespace's ACL logging, and the logged verdicts of the policy.
    pub acl: Option<super::acl::Acl>,
    pub logged: super::acl::Logged,
}

impl Sharing<'_> {
    /// The shared sets of the peers `key`, its key recorded as one the policy uses.
    fn use_peers(&mut self, key: PeerKey, index: &PodIndex) -> Lookup {
        let lookup = self.sets.lookup(key, index, self.parts);
        if !self.keys.contains(&lookup.key) {
            self.keys.push(lookup.key.clone());
        }
        lookup
    }
}

/// The destination address field: the selected pod for ingress, the peer for egress.
fn local_or_peer_daddr(direction: Direction, local: Field, peer: Field) -> Field {
    match direction {
        Direction::Ingress => local,
        Direction::Egress => peer,
    }
}

/// (peer field, selected pod's field) per direction and family.
fn fields(direction: Direction, family: IpFamily) -> (Field, Field) {
    let (saddr, daddr) = match family {
        IpFamily::V4 => (Field::Ip4Saddr, Field::Ip4Daddr),
        IpFamily::V6 => (Field::Ip6Saddr, Field::Ip6Daddr),
    };
    match direction {
        Direction::Ingress => (saddr, daddr),
        Direction::Egress => (daddr, saddr),
    }
}

/// Numeric port entries (`None`: the rule has no port list) and named ones.
#[allow(clippy::type_complexity)]
fn split_ports(rule: &PolicyRule) -> (Option<Vec<(Protocol, u16, u16)>>, Vec<(Protocol, &str)>) {
    let Some(ports) = &rule.ports else {
        return (None, Vec::new());
    };
    let mut numeric = Vec::new();
    let mut named = Vec::new();
    for p in ports {
        match &p.port {
            PortSpec::All => numeric.push((p.protocol, 0, u16::MAX)),
            PortSpec::Range(lo, hi) => numeric.push((p.protocol, *lo, *hi)),
            PortSpec::Named(name) => named.push((p.protocol, name.as_str())),
        }
    }
    (Some(numeric), named)
}

fn peer_pods<'i, 'a>(
    index: &'i PodIndex<'a>,
    namespace: &'i str,
    peers: &'i [Peer],
) -> Vec<&'i PodView<'a>> {
    let mut out: Vec<&PodView> = Vec::new();
    for peer in peers {
        for pod in index.peers(namespace, peer) {
            if !out.iter().any(|p| std::ptr::eq(*p, pod)) {
                out.push(pod);
            }
        }
    }
    out
}

/// `meta l4proto . th dport` with port ranges, merged per protocol so elements are disjoint.
fn ports_set(name: &str, entries: &[(Protocol, u16, u16)]) -> Set {
    let mut set = Set::new(
        name,
        vec![DataType::InetProto, DataType::InetService],
        SetKind::Set,
    )
    .with_flags(SetFlags {
        interval: true,
        ..Default::default()
    });
    let mut sorted = entries.to_vec();
    sorted.sort();
    let mut merged: Vec<(Protocol, u16, u16)> = Vec::new();
    for (proto, lo, hi) in sorted {
        match merged.last_mut() {
            Some((p, _, end)) if *p == proto && u32::from(lo) <= u32::from(*end) + 1 => {
                *end = (*end).max(hi);
            }
            _ => merged.push((proto, lo, hi)),
        }
    }
    for (proto, lo, hi) in merged {
        let port = if lo == hi {
            KeyPart::Value(Value::Port(lo))
        } else {
            KeyPart::Range(Value::Port(lo), Value::Port(hi))
        };
        set.insert(vec![Value::Proto(proto.ip_number()).into(), port]);
    }
    set
}

/// `ip daddr . meta l4proto . th dport` of each pod in `owners` that has one of the named
/// ports.
fn named_set(name: &str, family: IpFamily, named: &[(Protocol, &str)], owners: &[&PodView]) -> Set {
    let mut set = Set::new(
        name,
        vec![
            DataType::addr(family),
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::Set,
    );
    let mut elements = BTreeSet::new();
    for pod in owners {
        for (protocol, port_name) in named {
            let Some(port) = pod.resolve(port_name, *protocol) else {
                continue;
            };
            for ip in pod.ips.iter().filter(|ip| IpFamily::of(**ip) == family) {
                elements.insert((*ip, protocol.ip_number(), port));
            }
        }
    }
    for (ip, proto, port) in elements {
        set.insert(vec![
            Value::ip(ip).into(),
            Value::Proto(proto).into(),
            Value::Port(port).into(),
        ]);
    }
    set
}

/// The set holding every address of `family` (`0.0.0.0/0`, `::/0`; declared with the
/// dispatch maps).
pub fn any_addr_set(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => super::ANY_V4,
        IpFamily::V6 => super::ANY_V6,
    }
}
