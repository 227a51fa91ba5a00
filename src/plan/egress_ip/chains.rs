//! The nftables side of the part `eip`: the SNAT and steering maps, the base chains
//! (`eip-prerouting` steering and marking tunnel arrivals, `eip-postrouting` SNAT,
//! `eip-tunnel-out` clearing the steering mark), one steering chain per set of hosting nodes
//! and the fail-closed `eip-unreachable`; destinations in the cluster, service and node sets
//! are never touched.

use super::tunnel::tunnel_guard;
use super::{
    MARK_MASK, POSTROUTING, POSTROUTING_PRIORITY, PREROUTING, PREROUTING_PRIORITY, SNAT_V4,
    SNAT_V6, STEER_V4, STEER_V6, TUNNEL_DEV, TUNNEL_OUT, TUNNEL_OUT_PRIORITY, TUNNELED,
    UNREACHABLE, mark,
};
use crate::nft::ir::*;
use crate::plan::base::sets;
use std::net::IpAddr;

/// The SNAT and steering maps, per family (index [`idx`]).
pub(super) struct Maps {
    pub(super) snat: [Set; 2],
    pub(super) steer: [Set; 2],
}

impl Maps {
    pub(super) fn new() -> Maps {
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
    pub(super) fn steer(&mut self, ip: IpAddr, chain: &str) {
        self.steer[idx(&ip)]
            .insert_mapping(key(ip), ElemData::Verdict(Verdict::Jump(chain.into())));
    }
}

fn map(name: &str, t: DataType) -> Set {
    Set::new(name, vec![t], SetKind::Map(vec![t]))
}

pub(super) fn idx(ip: &IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

pub(super) fn key(ip: IpAddr) -> ElemKey {
    vec![Value::ip(ip).into()]
}

pub(super) fn data(ip: IpAddr) -> ElemData {
    ElemData::Values(vec![Value::ip(ip)])
}

/// Group `n`'s chain: packets to destinations outside the cluster get the group's mark.
pub(super) fn steer_chain(part: &mut Part, n: usize) -> String {
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
pub(super) fn unreachable_chain(part: &mut Part) {
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

pub(super) fn add_base_chains(part: &mut Part) {
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
