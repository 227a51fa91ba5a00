//! Golden test of the renderer over every IR construct, and (as root) proof that `nft -c`
//! accepts the text. Regenerate the golden file with `UPDATE_GOLDEN=1 cargo test --test
//! integration render_golden` after an intended change, and review the diff.

use nodeplane::nft::render::{render_full, render_transaction};
use nodeplane::nft::*;
use nodeplane::testing::ir::{COUNTED_INTERVAL, address_map, service_vmap};
use nodeplane::testing::nft_check::nft_check;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn v4(s: &str) -> Value {
    Value::Ipv4(s.parse::<Ipv4Addr>().unwrap())
}

fn v6(s: &str) -> Value {
    Value::Ipv6(s.parse::<Ipv6Addr>().unwrap())
}

fn filter(hook: Hook, priority: i32) -> BaseChain {
    BaseChain {
        kind: ChainType::Filter,
        hook,
        priority,
        policy: Policy::Accept,
    }
}

fn nat(hook: Hook, priority: i32) -> BaseChain {
    BaseChain {
        kind: ChainType::Nat,
        hook,
        priority,
        policy: Policy::Accept,
    }
}

fn rich_table() -> Table {
    let mut t = Table::new(TABLE_NAME);
    let interval = SetFlags {
        interval: true,
        ..Default::default()
    };
    let mut cidrs = Set::new("cidrs", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(interval);
    cidrs.insert(vec![KeyPart::Prefix("10.128.0.0/14".parse().unwrap())]);
    cidrs.insert(vec![KeyPart::Range(v4("192.168.1.10"), v4("192.168.1.20"))]);
    t.add_set(cidrs);

    let svc_a = Verdict::Goto("svc-a".into());
    t.add_set(service_vmap(
        "services",
        &[("172.30.0.10", proto::TCP, 80, svc_a)],
    ));

    // Per-element counters and comments (EgressFirewall's rule maps).
    let mut rules = Set::new("fw-rules", vec![DataType::Ipv4Addr], SetKind::VerdictMap)
        .with_flags(COUNTED_INTERVAL);
    rules.insert_commented_mapping(
        vec![KeyPart::Prefix("0.0.0.0/0".parse().unwrap())],
        ElemData::Verdict(Verdict::Drop),
        "rule 1: Deny 0.0.0.0/0 \"x\"; y".into(),
    );
    t.add_set(rules);

    t.add_set(address_map("snat-v6", "fd01::5", "2001:db8::100"));

    let aff = Set::new("affinity", vec![DataType::Ipv4Addr], SetKind::Set)
        .with_flags(SetFlags {
            timeout: true,
            dynamic: true,
            ..Default::default()
        })
        .with_timeout(10800);
    t.add_set(aff);

    let mut fwd = Chain::base("filter-forward", filter(Hook::Forward, priority::FILTER));
    fwd.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::CtState],
            op: MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
        }),
        Stmt::Verdict(Verdict::Accept),
    ]));
    fwd.push(
        Rule::new(vec![
            Stmt::in_set(vec![Field::Ip4Daddr], "cidrs"),
            Stmt::Match(Match {
                key: vec![Field::L4Proto],
                op: MatchOp::InAnon(vec![
                    vec![Value::Proto(proto::TCP).into()],
                    vec![Value::Proto(proto::UDP).into()],
                ]),
            }),
            Stmt::matches(Field::ThDport, Value::Port(53)),
            Stmt::Counter,
            Stmt::Verdict(Verdict::Accept),
        ])
        .with_comment("ns \"evil\"; drop"),
    );
    fwd.push(Rule::new(vec![
        Stmt::matches(Field::IifName, Value::IfName("eth0".into())),
        Stmt::not_in_set(vec![Field::Ip4Saddr], "cidrs"),
        Stmt::Log {
            prefix: "nodeplane deny ".into(),
            group: None,
        },
        Stmt::Reject(Reject::AdminProhibited),
    ]));
    fwd.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
        Stmt::Reject(Reject::TcpReset),
    ]));
    fwd.push(Rule::new(vec![
        Stmt::matches(Field::NfProto, Value::NfProto(IpFamily::V6)),
        Stmt::not_matches(Field::Ip6Daddr, v6("fe80::1")),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    t.add_chain(fwd);

    let mut pre = Chain::base("nat-prerouting", nat(Hook::Prerouting, priority::DSTNAT));
    pre.push(Rule::new(vec![
        Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
        Stmt::Vmap {
            key: vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
            map: MapRef::Named("services".into()),
        },
    ]));
    t.add_chain(pre);

    let mut svc_a = Chain::regular("svc-a");
    svc_a.push(Rule::new(vec![Stmt::SetUpdate {
        set: "affinity".into(),
        key: vec![Field::Ip4Saddr],
        timeout: None,
    }]));
    svc_a.push(Rule::new(vec![Stmt::Vmap {
        key: vec![Field::NumgenRandom(2)],
        map: MapRef::Anon(vec![
            (vec![Value::Integer(0).into()], Verdict::Goto("ep-1".into())),
            (vec![Value::Integer(1).into()], Verdict::Goto("ep-2".into())),
        ]),
    }]));
    t.add_chain(svc_a);
    for (name, ip) in [("ep-1", "10.128.0.5"), ("ep-2", "10.128.2.5")] {
        let mut ep = Chain::regular(name);
        ep.push(Rule::new(vec![
            Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
            Stmt::Nat(Nat {
                kind: NatKind::Dnat,
                family: IpFamily::V4,
                addr: NatAddr::Fixed(ip.parse::<IpAddr>().unwrap(), Some(8080)),
            }),
        ]));
        t.add_chain(ep);
    }

    let mut post = Chain::base("nat-postrouting", nat(Hook::Postrouting, priority::SRCNAT));
    post.push(Rule::new(vec![
        Stmt::matches(Field::Mark, Value::Mark(0x4000)),
        Stmt::Masquerade {
            fully_random: false,
        },
    ]));
    post.push(Rule::new(vec![Stmt::Nat(Nat {
        kind: NatKind::Snat,
        family: IpFamily::V6,
        addr: NatAddr::Map {
            key: vec![Field::Ip6Saddr],
            map: "snat-v6".into(),
        },
    })]));
    post.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Saddr, v4("10.128.0.9")),
        Stmt::Nat(Nat {
            kind: NatKind::Snat,
            family: IpFamily::V4,
            addr: NatAddr::Fixed("192.168.50.100".parse().unwrap(), None),
        }),
    ]));
    t.add_chain(post);

    let mut mangle = Chain::base(
        "mangle-postrouting",
        filter(Hook::Postrouting, priority::MANGLE),
    );
    mangle.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Saddr, v4("10.128.0.5")),
        Stmt::DscpSet {
            family: IpFamily::V4,
            dscp: 46,
        },
        Stmt::MarkSet(0x10),
    ]));
    mangle.push(Rule::new(vec![
        Stmt::matches(Field::CtMark, Value::Mark(1)),
        Stmt::DscpSet {
            family: IpFamily::V6,
            dscp: 10,
        },
        Stmt::Verdict(Verdict::Jump("svc-a".into())),
    ]));
    t.add_chain(mangle);
    t
}

fn golden(name: &str, actual: &str) {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run with UPDATE_GOLDEN=1 to create it)"));
    assert_eq!(actual, expected, "rendering differs from {path}");
}

#[test]
fn full_rendering_matches_golden_and_nft_accepts_it() {
    let text = render_full(&rich_table());
    golden("rich.nft", &text);
    nft_check(&text);
}

#[test]
fn transaction_rendering_is_accepted_by_nft() {
    let t = rich_table();
    let mut next = t.clone();
    next.chains.remove("ep-2");
    next.chains.get_mut("svc-a").unwrap().rules.truncate(1);
    next.sets.get_mut("cidrs").unwrap().elements.clear();
    next.sets
        .get_mut("fw-rules")
        .unwrap()
        .insert_commented_mapping(
            vec![KeyPart::Prefix("0.0.0.0/0".parse().unwrap())],
            ElemData::Verdict(Verdict::Drop),
            "rule 2: Deny 0.0.0.0/0".into(),
        );
    let tx = diff(&t, &next);
    let text = format!("{}{}", render_full(&t), render_transaction(&tx));
    golden("rich-diff.nft", &render_transaction(&tx));
    nft_check(&text);
}

#[test]
fn user_strings_cannot_inject_syntax() {
    let text = render_full(&rich_table());
    // The comment's quote and semicolon were neutralised, so the rule stays one statement.
    assert!(text.contains("comment \"ns _evil__ drop\""), "{text}");
    assert!(
        text.contains("comment \"rule 1: Deny 0.0.0.0/0 _x__ y\" : drop"),
        "{text}"
    );
}
