//! A large synthetic table (kernel test and benchmark): many regular chains dispatched to
//! by a big verdict map, the shape of a cluster with many services.

use crate::nft::*;
use std::net::{IpAddr, Ipv4Addr};

/// `chains` regular chains with two rules each, and a verdict map of `elements`
/// `ipv4_addr . inet_proto . inet_service : goto chain` entries dispatching to them.
pub fn large_table(chains: u32, elements: u32) -> Table {
    let mut t = Table::new(TABLE_NAME);
    for i in 0..chains {
        let mut c = Chain::regular(format!("svc-{i}"));
        c.push(Rule::new(vec![
            Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
            Stmt::Nat(Nat {
                kind: NatKind::Dnat,
                family: IpFamily::V4,
                addr: NatAddr::Fixed(IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i)), Some(8080)),
            }),
        ]));
        c.push(Rule::new(vec![Stmt::Counter, Stmt::Verdict(Verdict::Drop)]));
        t.add_chain(c);
    }
    let mut svc = Set::new(
        "services",
        vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::VerdictMap,
    );
    for i in 0..elements {
        svc.insert_mapping(
            vec![
                Value::Ipv4(Ipv4Addr::from(0xac1e_0000 + i / 2)).into(),
                Value::Proto(proto::TCP).into(),
                Value::Port(80 + (i % 2) as u16).into(),
            ],
            ElemData::Verdict(Verdict::Goto(format!("svc-{}", i % chains.max(1)))),
        );
    }
    t.add_set(svc);
    let mut pre = Chain::base(
        "nat-prerouting",
        BaseChain {
            kind: ChainType::Nat,
            hook: Hook::Prerouting,
            priority: priority::DSTNAT,
            policy: Policy::Accept,
        },
    );
    pre.push(Rule::new(vec![Stmt::vmap(
        vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
        "services",
    )]));
    t.add_chain(pre);
    t
}
