//! `table bridge nodeplane`: NetworkPolicy for pods on one Linux bridge. Without
//! `br_netfilter` only the bridge family's forward hook sees their frames; with it the inet
//! forward hook sees them too, after this table (see [`PRIORITY`]), and its policy chains
//! accept what this table marked as judged ([`BRIDGE_JUDGED`]): one judgement either way.
//!
//! The same parts as the inet table (shared `Arc`s: the policies' chains and sets, the
//! policy-set chains and the dispatch elements) and the same two base chains on the bridge
//! forward hook. The difference is state: a bridge table cannot use
//! `ct` without `nf_conntrack_bridge`, which kernels may lack (the test kernel does), so a
//! third base chain (`np-forward-flows`, after both) records every packet both accepted that
//! has an isolated end (`np-self-v4/v6` holds the isolated pods), as its TCP/UDP/SCTP tuple
//! in both orientations, in a timeout set (`np-flows-v4/v6`), and the
//! first rule of the other two accepts a packet whose tuple is there: replies of an allowed
//! connection pass, and so do later packets of it after a policy edit, as with conntrack in
//! inet, until the flow is idle for [`FLOW_TIMEOUT_SECS`] (UDP and SCTP: conntrack's
//! timeouts, `FLOW_TIMEOUTS`). A TCP SYN (without ACK) is never
//! accepted by the flow set: like conntrack, which judges a new connection on an old 4-tuple
//! anew, the policies judge it. Per packet that is one set lookup and one update more than
//! inet.
//!
//! The flows are kept per source: each bridge port with bound pod addresses (see
//! `binding`) has flow sets of its own, `np-fl-<port>-v4/v6` (elements of part `np-ports`,
//! like the binding), and a flow is recorded in the set of the port whose packet the policies
//! accepted first (the sender of a new flow), and refreshed where it is found. A lookup
//! tries the sets of the packet's input and output ports (`iifname` / `oifname vmap
//! @np-flow-ports`: a `jump` to the port's chain). So a pod filling the set of its port with
//! flows (one per port of an isolated pod it may reach) pushes out only its own flows. The
//! shared `np-flows-v4/v6` keep the flows of ports that are not bound (an uplink in the
//! bridge, a pod that could not be bound).

use super::{BRIDGE_JUDGED, SELF_V4, SELF_V6, add_hooks};
use crate::nft::ir::*;
use crate::nft::names::object_name;

pub const FLOWS_V4: &str = "np-flows-v4";
pub const FLOWS_V6: &str = "np-flows-v6";
pub const FORWARD_FLOWS: &str = "np-forward-flows";
/// `ip saddr . ip daddr` of the IPv4 first fragments both base chains accepted that have an
/// isolated end: the later fragments of the same packet carry no ports, and pass by this.
pub const FRAGS_V4: &str = "np-frags-v4";
/// `ip6 saddr . ip6 daddr`, the same for IPv6 (fragment extension header).
pub const FRAGS_V6: &str = "np-frags-v6";
/// A pair's entry expires after this (the kernel's reassembly timeout, `ipfrag_time`).
pub const FRAG_TIMEOUT_SECS: u32 = 30;
/// An idle flow's entry expires after this (conntrack keeps established TCP for days; a
/// bridged flow idle longer is judged again as new, in each direction).
pub const FLOW_TIMEOUT_SECS: u32 = 3600;

/// The bridge family's filter priority (`NF_BR_PRI_FILTER_BRIDGED`) + 10: before
/// `br_netfilter`'s forward hook (`NF_BR_PRI_BRNF`, 0), which runs the inet forward hook.
/// So with `br_netfilter` this table judges a bridged packet first and marks it
/// ([`BRIDGE_JUDGED`]), and the inet table's policy chains leave it alone; at 10 (after it)
/// both tables judged, logged and counted every allowed packet.
const PRIORITY: i32 = -200 + 10;

/// A port's flow sets and chains are named after this and the port.
const PORT_PREFIX: &str = "np-fl";
/// `port : jump <the port's lookup chain>`, for `iifname` and `oifname`.
pub const FLOW_PORTS: &str = "np-flow-ports";
/// `port : goto <the port's recording chain>`.
pub const FLOW_ADD: &str = "np-flow-add";

/// A flow set of one address family and the fields of a packet's tuple.
struct Flows {
    set: String,
    addr: DataType,
    saddr: Field,
    daddr: Field,
    isolated: &'static str,
}

fn families(v4: String, v6: String) -> [Flows; 2] {
    [
        Flows {
            set: v4,
            addr: DataType::Ipv4Addr,
            saddr: Field::Ip4Saddr,
            daddr: Field::Ip4Daddr,
            isolated: SELF_V4,
        },
        Flows {
            set: v6,
            addr: DataType::Ipv6Addr,
            saddr: Field::Ip6Saddr,
            daddr: Field::Ip6Daddr,
            isolated: SELF_V6,
        },
    ]
}

const L4: Field = Field::L4Proto;

fn tuple(f: &Flows) -> Vec<Field> {
    vec![f.saddr, L4, Field::ThSport, f.daddr, Field::ThDport]
}

fn reverse(f: &Flows) -> Vec<Field> {
    vec![f.daddr, L4, Field::ThDport, f.saddr, Field::ThSport]
}

fn protocols(p: &[u8]) -> Stmt {
    Stmt::Match(Match {
        key: vec![L4],
        op: MatchOp::InAnon(
            p.iter()
                .map(|p| vec![KeyPart::Value(Value::Proto(*p))])
                .collect(),
        ),
    })
}

/// The flow set of `f`: saddr . l4proto . sport . daddr . dport, timeout.
fn flow_set(f: &Flows) -> Set {
    let (proto, port) = (DataType::InetProto, DataType::InetService);
    Set::new(
        &f.set,
        vec![f.addr, proto, port, f.addr, port],
        SetKind::Set,
    )
    .with_flags(SetFlags {
        timeout: true,
        dynamic: true,
        ..Default::default()
    })
    .with_timeout(FLOW_TIMEOUT_SECS)
}

/// How long an idle flow's entry lasts, per protocol (`None`: the set's
/// [`FLOW_TIMEOUT_SECS`]). UDP and SCTP take conntrack's timeouts for an established flow of
/// each (kernel 6.18 defaults, read on the test machine: `nf_conntrack_udp_timeout_stream`
/// 120 s, `nf_conntrack_sctp_timeout_established` 210 s): a client that a policy edit denies
/// can go on using an old 4-tuple only while it is as busy as conntrack would let it be in
/// inet, not for an hour. TCP keeps the hour: its connections are judged anew by their SYN.
const FLOW_TIMEOUTS: [(u8, Option<u32>); 3] = [
    (proto::TCP, None),
    (proto::UDP, Some(120)),
    (proto::SCTP, Some(210)),
];

/// The rules that accept a packet whose tuple is in the flow sets (a TCP SYN never: it opens
/// a connection, and the policies judge it now, so a client denied since cannot reuse an
/// old 4-tuple); with `refresh`, they also refresh the entries (a port's sets, whose lookup
/// chain is also the recording chain's way to find where a flow is kept).
fn known(families: &[Flows; 2], refresh: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    // Without refreshing, one rule serves UDP and SCTP alike.
    let groups: Vec<(Stmt, Option<u32>, bool)> = if refresh {
        FLOW_TIMEOUTS
            .iter()
            .map(|(p, t)| (Stmt::matches(L4, Value::Proto(*p)), *t, *p == proto::TCP))
            .collect()
    } else {
        vec![
            (Stmt::matches(L4, Value::Proto(proto::TCP)), None, true),
            (protocols(&[proto::UDP, proto::SCTP]), None, false),
        ]
    };
    for f in families {
        for (protocol, timeout, tcp) in &groups {
            let (timeout, tcp) = (*timeout, *tcp);
            let mut stmts = vec![protocol.clone()];
            if tcp {
                stmts.push(Stmt::Match(Match {
                    key: vec![Field::TcpFlags],
                    op: MatchOp::Masked {
                        mask: Value::TcpFlags(tcp_flags::SYN | tcp_flags::ACK),
                        value: Value::TcpFlags(tcp_flags::SYN),
                        eq: false,
                    },
                }));
            }
            stmts.push(Stmt::in_set(tuple(f), f.set.as_str()));
            if refresh {
                stmts.extend(updates(f, timeout));
            }
            stmts.push(Stmt::Verdict(Verdict::Accept));
            rules.push(Rule::new(stmts));
        }
    }
    rules
}

fn updates(f: &Flows, timeout: Option<u32>) -> [Stmt; 2] {
    [
        Stmt::SetUpdate {
            set: f.set.clone(),
            key: tuple(f),
            timeout,
        },
        Stmt::SetUpdate {
            set: f.set.clone(),
            key: reverse(f),
            timeout,
        },
    ]
}

/// The rules that record an accepted packet's flow, both orientations, when it has an
/// isolated end: between pods no policy isolates nothing needs remembering, so their traffic
/// (a flood included) takes no room. In a port's own sets (`full_drops`) a flow that does
/// not fit is dropped: the port's pod has used up its share, and letting the flow pass
/// unrecorded would have its peer's answer recorded as a new flow of the peer's, in the
/// peer's share.
fn record(families: &[Flows; 2], full_drops: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    for f in families {
        for (end, verdict) in [(f.saddr, Some(Verdict::Accept)), (f.daddr, None)] {
            for (protocol, timeout) in FLOW_TIMEOUTS {
                let mut stmts = vec![
                    Stmt::matches(L4, Value::Proto(protocol)),
                    Stmt::in_set(vec![end, end], f.isolated),
                ];
                stmts.extend(updates(f, timeout));
                let verdict = if full_drops {
                    Some(Verdict::Accept)
                } else {
                    verdict.clone()
                };
                stmts.extend(verdict.map(Stmt::Verdict));
                rules.push(Rule::new(stmts));
            }
        }
    }
    if full_drops {
        let tracked = || protocols(&[proto::TCP, proto::UDP, proto::SCTP]);
        for f in families {
            for end in [f.saddr, f.daddr] {
                rules.push(
                    Rule::new(vec![
                        tracked(),
                        Stmt::in_set(vec![end, end], f.isolated),
                        Stmt::Counter,
                        Stmt::Verdict(Verdict::Drop),
                    ])
                    .with_comment(FULL_COMMENT),
                );
            }
        }
    }
    rules
}

/// The comment on the drops of a new flow that its port's sets have no room for.
pub const FULL_COMMENT: &str = "NetworkPolicy: the port's flow set is full";

/// `ip frag-off & mask ==/!= value`.
fn frag_off(mask: u16, value: u16, eq: bool) -> Stmt {
    Stmt::Match(Match {
        key: vec![Field::Ip4FragOff],
        op: MatchOp::Masked {
            mask: Value::Port(mask),
            value: Value::Port(value),
            eq,
        },
    })
}

/// Fragments without conntrack's reassembly: a non-first fragment (offset not 0, so no ports
/// for the policies or the flow sets) passes when a first fragment between the same two
/// addresses was accepted in the last [`FRAG_TIMEOUT_SECS`] (`known`); the recording chain
/// records that pair for first fragments with an isolated end (`record`). A non-first
/// fragment cannot complete a datagram without its first, which the policies judged (Linux
/// drops overlapping fragments), so the pair is enough. IPv4 reads the header's `frag-off`
/// (a first fragment: offset 0, more fragments); IPv6 the fragment extension header, after
/// the addresses (their `meta protocol` test keeps the header walk off IPv4 packets).
fn fragments() -> (Vec<Rule>, Vec<Rule>) {
    let v4 = vec![Field::Ip4Saddr, Field::Ip4Daddr];
    let v6 = vec![Field::Ip6Saddr, Field::Ip6Daddr];
    let ip6_frag_off = |eq: bool| {
        Stmt::Match(Match {
            key: vec![Field::Ip6FragOff],
            op: if eq {
                MatchOp::Eq(vec![Value::Port(0)])
            } else {
                MatchOp::Ne(vec![Value::Port(0)])
            },
        })
    };
    let known = vec![
        Rule::new(vec![
            frag_off(0x1fff, 0, false),
            Stmt::in_set(v4.clone(), FRAGS_V4),
            Stmt::Verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::in_set(v6.clone(), FRAGS_V6),
            ip6_frag_off(false),
            Stmt::Verdict(Verdict::Accept),
        ]),
    ];
    let mut record = Vec::new();
    for end in [Field::Ip4Saddr, Field::Ip4Daddr] {
        record.push(Rule::new(vec![
            frag_off(0x3fff, 0x2000, true),
            Stmt::in_set(vec![end, end], SELF_V4),
            Stmt::SetUpdate {
                set: FRAGS_V4.into(),
                key: v4.clone(),
                timeout: None,
            },
        ]));
    }
    for end in [Field::Ip6Saddr, Field::Ip6Daddr] {
        record.push(Rule::new(vec![
            Stmt::in_set(vec![end, end], SELF_V6),
            ip6_frag_off(true),
            Stmt::SetUpdate {
                set: FRAGS_V6.into(),
                key: v6.clone(),
                timeout: None,
            },
        ]));
    }
    (known, record)
}

/// The bridge table of a plan whose netpol parts are `parts`; `source_check`: the
/// anti-spoofing rules of [`binding`](super::binding).
pub fn table(parts: &Parts, source_check: bool) -> Table {
    let mut t = Table::with_family(Family::Bridge, TABLE_NAME);
    t.extend_parts(parts);
    let shared = families(FLOWS_V4.into(), FLOWS_V6.into());
    for f in &shared {
        t.add_set(flow_set(f));
    }
    for (name, kind) in [
        (FLOW_PORTS, SetKind::VerdictMap),
        (FLOW_ADD, SetKind::VerdictMap),
    ] {
        t.add_set(Set::new(name, vec![DataType::IfName], kind));
    }
    for (name, addr) in [
        (FRAGS_V4, DataType::Ipv4Addr),
        (FRAGS_V6, DataType::Ipv6Addr),
    ] {
        t.add_set(
            Set::new(name, vec![addr, addr], SetKind::Set)
                .with_flags(SetFlags {
                    timeout: true,
                    dynamic: true,
                    ..Default::default()
                })
                .with_timeout(FRAG_TIMEOUT_SECS),
        );
    }
    let (mut state, record_fragments) = fragments();
    let by_port = |field| Rule::new(vec![Stmt::vmap(vec![field], FLOW_PORTS)]);
    state.push(by_port(Field::IifName));
    state.push(by_port(Field::OifName));
    state.extend(known(&shared, false));
    let mut recorder = Chain::base(
        FORWARD_FLOWS,
        BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Forward,
            priority: PRIORITY + 2,
            policy: Policy::Accept,
        },
    );
    // Judged here (both policy chains accepted): the inet policy chains that `br_netfilter`
    // runs next accept the packet as it is.
    recorder.push(Rule::new(vec![Stmt::MarkOr(BRIDGE_JUDGED)]));
    for rule in record_fragments {
        recorder.push(rule);
    }
    // Found in the sender's or the receiver's port's sets or the shared ones: refreshed
    // there; else a new flow, recorded in the sender's port's sets (or the shared ones for a
    // port not bound).
    recorder.push(by_port(Field::IifName));
    recorder.push(by_port(Field::OifName));
    for rule in known(&shared, true) {
        recorder.push(rule);
    }
    recorder.push(Rule::new(vec![Stmt::vmap(vec![Field::IifName], FLOW_ADD)]));
    for rule in record(&shared, false) {
        recorder.push(rule);
    }
    // No fib in the bridge family: bridged pods' addresses are bound to their ports instead.
    super::binding::add_sets(&mut t);
    add_hooks(&mut t, PRIORITY, state, super::binding::rules(source_check));
    t.add_chain(recorder);
    t
}

/// A bound port's flow sets, its lookup chain (`np-flow-ports`) and its recording chain
/// (`np-flow-add`), into `part`.
pub fn add_port(part: &mut Part, port: &str) {
    let base = object_name(PORT_PREFIX, port);
    let own = families(format!("{base}-v4"), format!("{base}-v6"));
    for f in &own {
        part.add_set(flow_set(f));
    }
    let (lookup, add) = (format!("{base}-known"), format!("{base}-add"));
    let mut chain = Chain::regular(&lookup);
    for rule in known(&own, true) {
        chain.push(rule);
    }
    part.add_chain(chain);
    let mut chain = Chain::regular(&add);
    for rule in record(&own, true) {
        chain.push(rule);
    }
    part.add_chain(chain);
    let key = || vec![Value::IfName(port.into()).into()];
    part.add_mapping(FLOW_PORTS, key(), ElemData::Verdict(Verdict::Jump(lookup)));
    part.add_mapping(FLOW_ADD, key(), ElemData::Verdict(Verdict::Goto(add)));
}
