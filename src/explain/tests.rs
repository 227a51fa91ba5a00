//! The evaluator on small hand-built tables: one behaviour of the kernel per test.

use super::event::{Action, Verdict};
use super::packet::{NodeFacts, Packet};
use super::{Query, Tables, Topology, explain_paths, overall};
use crate::nft::ir::{
    BaseChain, Chain, ChainType, DataType, ElemData, Field, Hook, KeyPart, MapRef, Nat, NatAddr,
    NatKind, Policy, Rule, Set, SetFlags, SetKind, Stmt, Table, Value, Verdict as V, priority,
    proto,
};
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn base(name: &str, kind: ChainType, hook: Hook, prio: i32, policy: Policy) -> Chain {
    Chain::base(
        name,
        BaseChain {
            kind,
            hook,
            priority: prio,
            policy,
        },
    )
}

fn tcp(src: &str, dst: &str, dport: u16) -> Query {
    let packet = Packet::new(ip(src), ip(dst), proto::TCP, None, Some(dport)).unwrap();
    Query {
        packet,
        topology: Topology::Routed,
    }
}

fn run(table: &Table, q: &Query) -> Vec<super::Path> {
    explain_paths(&Tables::new(table, None), &NodeFacts::default(), q)
}

fn daddr_in(set: &str) -> Stmt {
    Stmt::in_set(vec![Field::Ip4Daddr], set)
}

#[test]
fn jump_returns_goto_does_not_and_the_policy_ends_the_base_chain() {
    let mut t = Table::new("t");
    let mut fwd = base("fwd", ChainType::Filter, Hook::Forward, 0, Policy::Drop);
    fwd.push(Rule::new(vec![Stmt::Verdict(V::Jump("a".into()))]));
    fwd.push(Rule::new(vec![
        Stmt::matches(Field::ThDport, Value::Port(80)),
        Stmt::Verdict(V::Accept),
    ]));
    let mut a = Chain::regular("a");
    a.push(Rule::new(vec![
        Stmt::matches(Field::ThDport, Value::Port(22)),
        Stmt::Verdict(V::Goto("b".into())),
    ]));
    let mut b = Chain::regular("b");
    b.push(Rule::new(vec![Stmt::Verdict(V::Return)]));
    for c in [fwd, a, b] {
        t.add_chain(c);
    }
    let verdict = |port| run(&t, &tcp("10.0.0.1", "10.0.0.2", port))[0].verdict;
    assert_eq!(verdict(80), Verdict::Forwarded);
    // goto b, whose return goes back to fwd (a's caller), which drops by policy.
    assert_eq!(verdict(22), Verdict::Dropped);
    let last = run(&t, &tcp("10.0.0.1", "10.0.0.2", 22))
        .remove(0)
        .events
        .pop()
        .unwrap();
    assert_eq!(
        (last.chain.as_str(), last.rule, last.action),
        ("fwd", None, Action::Drop)
    );
}

#[test]
fn interval_vmaps_and_concatenations_decide_with_the_element_named() {
    let mut t = Table::new("t");
    let key = vec![
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
    ];
    let flags = SetFlags {
        interval: true,
        ..Default::default()
    };
    let mut m = Set::new("fw", key, SetKind::VerdictMap).with_flags(flags);
    let k = vec![
        KeyPart::Prefix("203.0.113.0/24".parse().unwrap()),
        Value::Proto(proto::TCP).into(),
        KeyPart::Range(Value::Port(440), Value::Port(450)),
    ];
    m.insert_commented_mapping(k, ElemData::Verdict(V::Drop), "rule 0: Deny".into());
    t.add_set(m);
    let mut fwd = base("fwd", ChainType::Filter, Hook::Forward, 0, Policy::Accept);
    let key = vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport];
    fwd.push(Rule::new(vec![Stmt::Vmap {
        key,
        map: MapRef::Named("fw".into()),
    }]));
    t.add_chain(fwd);
    let p = run(&t, &tcp("10.0.0.1", "203.0.113.9", 443)).remove(0);
    assert_eq!(p.verdict, Verdict::Dropped);
    let hit = p.events[0].element.clone().unwrap();
    assert_eq!(
        (hit.set.as_str(), hit.comment.as_deref()),
        ("fw", Some("rule 0: Deny"))
    );
    assert_eq!(
        run(&t, &tcp("10.0.0.1", "203.0.113.9", 451))[0].verdict,
        Verdict::Forwarded
    );
    // An IPv6 packet never matches an `ip daddr` key.
    assert_eq!(
        run(&t, &tcp("fd00::1", "fd00::2", 443))[0].verdict,
        Verdict::Forwarded
    );
}

#[test]
fn dnat_in_prerouting_is_seen_by_forward_and_every_numgen_bucket_is_a_path() {
    let mut t = Table::new("t");
    let mut backends = Set::typeof_map(
        "be",
        vec![Field::NumgenRandom(2)],
        vec![Field::Ip4Daddr, Field::ThDport],
    );
    for (i, addr) in ["10.1.0.1", "10.1.0.2"].iter().enumerate() {
        let data = vec![Value::ip(ip(addr)), Value::Port(8080)];
        backends.insert_mapping(
            vec![Value::Integer(i as u32).into()],
            ElemData::Values(data),
        );
    }
    t.add_set(backends);
    let mut pre = base(
        "pre",
        ChainType::Nat,
        Hook::Prerouting,
        priority::DSTNAT,
        Policy::Accept,
    );
    let addr = NatAddr::Map {
        key: vec![Field::NumgenRandom(2)],
        map: "be".into(),
    };
    pre.push(Rule::new(vec![Stmt::Nat(Nat {
        kind: NatKind::Dnat,
        family: crate::nft::ir::IpFamily::V4,
        addr,
    })]));
    let mut fwd = base("fwd", ChainType::Filter, Hook::Forward, 0, Policy::Accept);
    fwd.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Daddr, Value::ip(ip("10.1.0.2"))),
        Stmt::Verdict(V::Drop),
    ]));
    t.add_chain(pre);
    t.add_chain(fwd);
    let paths = run(&t, &tcp("10.0.0.1", "172.30.0.1", 80));
    assert_eq!(paths.len(), 2);
    assert_eq!(paths[0].verdict, Verdict::Forwarded);
    assert_eq!(paths[0].packet.dst, ip("10.1.0.1"));
    assert_eq!(paths[1].verdict, Verdict::Dropped);
    assert_eq!(
        paths[1].events[0].action,
        Action::Dnat {
            to: "10.1.0.2:8080".into()
        }
    );
    assert_eq!(overall(&paths), None);
}

#[test]
fn marks_set_in_one_chain_are_tested_in_the_next_and_learned_sets_are_reported() {
    let mut t = Table::new("t");
    let flags = SetFlags {
        dynamic: true,
        timeout: true,
        ..Default::default()
    };
    t.add_set(Set::new("learned", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(flags));
    let mut first = base(
        "first",
        ChainType::Filter,
        Hook::Forward,
        -10,
        Policy::Accept,
    );
    first.push(Rule::new(vec![Stmt::MarkOr(0x4000)]));
    let mut second = base(
        "second",
        ChainType::Filter,
        Hook::Forward,
        0,
        Policy::Accept,
    );
    second.push(Rule::new(vec![
        daddr_in("learned"),
        Stmt::Verdict(V::Accept),
    ]));
    second.push(Rule::new(vec![
        Stmt::Match(crate::nft::ir::Match {
            key: vec![Field::Mark],
            op: crate::nft::ir::MatchOp::AnyFlag(0x4000),
        }),
        Stmt::Reject(crate::nft::ir::Reject::TcpReset),
    ]));
    t.add_chain(first);
    t.add_chain(second);
    let p = run(&t, &tcp("10.0.0.1", "10.0.0.2", 80)).remove(0);
    assert_eq!(p.verdict, Verdict::Rejected);
    assert_eq!(
        p.events[0].action,
        Action::Mark {
            from: 0,
            to: 0x4000
        }
    );
    assert!(
        matches!(&p.events[1].action, Action::Unknown { what, .. } if what.contains("@learned"))
    );
}

#[test]
fn host_traffic_takes_output_and_local_traffic_input() {
    let mut t = Table::new("t");
    for (name, hook) in [
        ("out", Hook::Output),
        ("in", Hook::Input),
        ("pre", Hook::Prerouting),
    ] {
        let mut c = base(name, ChainType::Filter, hook, 0, Policy::Accept);
        c.push(Rule::new(vec![Stmt::Log {
            prefix: name.into(),
            group: None,
        }]));
        t.add_chain(c);
    }
    let facts = NodeFacts {
        local: [ip("192.168.1.1")].into(),
    };
    let tables = Tables::new(&t, None);
    let hooks = |src, dst| {
        explain_paths(&tables, &facts, &tcp(src, dst, 80))
            .remove(0)
            .hooks
    };
    assert_eq!(
        hooks("192.168.1.1", "8.8.8.8"),
        ["inet output", "inet postrouting"]
    );
    assert_eq!(
        hooks("8.8.8.8", "192.168.1.1"),
        ["inet prerouting", "inet input"]
    );
}

#[test]
fn a_packet_the_node_sends_has_no_input_interface_to_match() {
    let mut t = Table::new("t");
    let mut out = base("out", ChainType::Filter, Hook::Output, 0, Policy::Accept);
    let ne = Stmt::not_matches(Field::IifName, Value::IfName("eth0".into()));
    out.push(Rule::new(vec![ne, Stmt::Verdict(V::Drop)]));
    t.add_chain(out);
    let facts = NodeFacts {
        local: [ip("192.168.1.1")].into(),
    };
    let q = tcp("192.168.1.1", "8.8.8.8", 80);
    let paths = explain_paths(&Tables::new(&t, None), &facts, &q);
    assert_eq!(paths[0].verdict, Verdict::Forwarded);
}
