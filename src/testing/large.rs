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

/// EgressFirewall rules (a YAML flow list), `n` in all: rules that do not match
/// 203.0.113.0/24 (distinct /32s in 198.18.0.0/15, a quarter with a TCP port), then Allow
/// 203.0.113.0/24, then Deny all: each namespace of the firewall and rule-counter benches.
pub fn firewall_rules(n: usize) -> String {
    let mut r: Vec<String> = (0..n.saturating_sub(2) as u32)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
            let action = if i % 2 == 0 { "Allow" } else { "Deny" };
            if i % 4 == 0 {
                format!(
                    "{{type: {action}, to: {{cidrSelector: {ip}/32}}, ports: [{{protocol: TCP, port: {}}}]}}",
                    1 + i % 1000
                )
            } else {
                format!("{{type: {action}, to: {{cidrSelector: {ip}/32}}}}")
            }
        })
        .collect();
    r.push("{type: Allow, to: {cidrSelector: 203.0.113.0/24}}".into());
    r.push("{type: Deny, to: {cidrSelector: 0.0.0.0/0}}".into());
    format!("[{}]", r.join(", "))
}
