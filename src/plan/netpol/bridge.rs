//! `table bridge nodeplane`: NetworkPolicy for pods on one Linux bridge without
//! `br_netfilter`, whose frames only the bridge family's forward hook sees.
//!
//! The same parts as the inet table (shared `Arc`s: the policies' chains and sets, the
//! policy-set chains and the dispatch elements) and the same two base chains, at the same
//! priorities on the bridge forward hook. The difference is state: a bridge table cannot use
//! `ct` without `nf_conntrack_bridge`, which kernels may lack (the test kernel does), so a
//! third base chain (`np-forward-flows`, after both) records every packet both accepted that
//! has an isolated end (`np-self-v4/v6` holds the isolated pods), as its TCP/UDP/SCTP tuple
//! in both orientations, in a timeout set (`np-flows-v4/v6`), and the
//! first rule of the other two accepts a packet whose tuple is there: replies of an allowed
//! connection pass, and so do later packets of it after a policy edit, as with conntrack in
//! inet, until the flow is idle for [`FLOW_TIMEOUT_SECS`]. A TCP SYN (without ACK) is never
//! accepted by the flow set: like conntrack, which judges a new connection on an old 4-tuple
//! anew, the policies judge it. Per packet that is one set lookup and one update more than
//! inet.

use super::{PRIORITY, SELF_V4, SELF_V6, add_hooks};
use crate::nft::ir::*;

pub const FLOWS_V4: &str = "np-flows-v4";
pub const FLOWS_V6: &str = "np-flows-v6";
pub const FORWARD_FLOWS: &str = "np-forward-flows";
/// An idle flow's entry expires after this (conntrack keeps established TCP for days; a
/// bridged flow idle longer is judged again as new, in each direction).
pub const FLOW_TIMEOUT_SECS: u32 = 3600;

/// The bridge table of a plan whose netpol parts are `parts`; `source_check`: the
/// anti-spoofing rules of [`binding`](super::binding).
pub fn table(parts: &Parts, source_check: bool) -> Table {
    let mut t = Table::with_family(Family::Bridge, TABLE_NAME);
    t.extend_parts(parts);
    let families = [
        (
            FLOWS_V4,
            DataType::Ipv4Addr,
            Field::Ip4Saddr,
            Field::Ip4Daddr,
        ),
        (
            FLOWS_V6,
            DataType::Ipv6Addr,
            Field::Ip6Saddr,
            Field::Ip6Daddr,
        ),
    ];
    let (l4, sport, dport) = (Field::L4Proto, Field::ThSport, Field::ThDport);
    let mut known = Vec::new();
    let mut record = Chain::base(
        FORWARD_FLOWS,
        BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Forward,
            priority: PRIORITY + 2,
            policy: Policy::Accept,
        },
    );
    for ((set, addr, saddr, daddr), self_set) in families.into_iter().zip([SELF_V4, SELF_V6]) {
        // saddr . l4proto . sport . daddr . dport
        let (proto, port) = (DataType::InetProto, DataType::InetService);
        let key = vec![addr, proto, port, addr, port];
        t.add_set(
            Set::new(set, key, SetKind::Set)
                .with_flags(SetFlags {
                    timeout: true,
                    dynamic: true,
                    ..Default::default()
                })
                .with_timeout(FLOW_TIMEOUT_SECS),
        );
        // A TCP SYN is never let through by the flow set: it opens a connection, and the
        // policies judge it now (a client denied since cannot reuse an old 4-tuple).
        let tuple = || Stmt::in_set(vec![saddr, l4, sport, daddr, dport], set);
        known.push(Rule::new(vec![
            Stmt::matches(l4, Value::Proto(proto::TCP)),
            Stmt::Match(Match {
                key: vec![Field::TcpFlags],
                op: MatchOp::Masked {
                    mask: Value::TcpFlags(tcp_flags::SYN | tcp_flags::ACK),
                    value: Value::TcpFlags(tcp_flags::SYN),
                    eq: false,
                },
            }),
            tuple(),
            Stmt::Verdict(Verdict::Accept),
        ]));
        known.push(Rule::new(vec![
            Stmt::Match(Match {
                key: vec![l4],
                op: MatchOp::InAnon(
                    [proto::UDP, proto::SCTP]
                        .map(|p| vec![KeyPart::Value(Value::Proto(p))])
                        .to_vec(),
                ),
            }),
            tuple(),
            Stmt::Verdict(Verdict::Accept),
        ]));
        // Only flows with an isolated end: between pods no policy isolates nothing needs
        // remembering, so their traffic (a flood included) takes no room in the set.
        for (end, verdict) in [(saddr, Some(Verdict::Accept)), (daddr, None)] {
            let ports = [proto::TCP, proto::UDP, proto::SCTP]
                .map(|p| vec![KeyPart::Value(Value::Proto(p))])
                .to_vec();
            let mut stmts = vec![
                Stmt::Match(Match {
                    key: vec![l4],
                    op: MatchOp::InAnon(ports),
                }),
                Stmt::in_set(vec![end, end], self_set),
                Stmt::SetUpdate {
                    set: set.into(),
                    key: vec![saddr, l4, sport, daddr, dport],
                },
                Stmt::SetUpdate {
                    set: set.into(),
                    key: vec![daddr, l4, dport, saddr, sport],
                },
            ];
            stmts.extend(verdict.map(Stmt::Verdict));
            record.push(Rule::new(stmts));
        }
    }
    // No fib in the bridge family: bridged pods' addresses are bound to their ports instead.
    super::binding::add_sets(&mut t);
    add_hooks(&mut t, known, super::binding::rules(source_check));
    t.add_chain(record);
    t
}
