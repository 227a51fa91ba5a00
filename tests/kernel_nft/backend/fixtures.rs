//! IR tables for the kernel tests: one that uses every statement, field and set kind the
//! IR has (chains in `rich_chains.rs`), and a changed version of it (for diffs).

use super::rich_chains;
use nodeplane::nft::*;
use nodeplane::testing::ir::{COUNTED_INTERVAL, address_map, service_vmap};
use std::net::{Ipv4Addr, Ipv6Addr};

pub fn v4(s: &str) -> Value {
    Value::Ipv4(s.parse::<Ipv4Addr>().unwrap())
}

pub fn v6(s: &str) -> Value {
    Value::Ipv6(s.parse::<Ipv6Addr>().unwrap())
}

pub fn net(s: &str) -> KeyPart {
    KeyPart::Prefix(s.parse().unwrap())
}

pub fn base(kind: ChainType, hook: Hook, priority: i32, policy: Policy) -> BaseChain {
    BaseChain {
        kind,
        hook,
        priority,
        policy,
    }
}

pub fn m(key: Vec<Field>, op: MatchOp) -> Stmt {
    Stmt::Match(Match { key, op })
}

pub fn anon(key: Vec<Field>, elems: Vec<Vec<KeyPart>>) -> Stmt {
    m(key, MatchOp::InAnon(elems))
}

pub fn verdict(v: Verdict) -> Stmt {
    Stmt::Verdict(v)
}

pub fn goto(c: &str) -> Verdict {
    Verdict::Goto(c.into())
}

pub fn jump(c: &str) -> Verdict {
    Verdict::Jump(c.into())
}

pub const INTERVAL: SetFlags = SetFlags {
    interval: true,
    timeout: false,
    dynamic: false,
    counter: false,
};

pub fn comment(s: &str) -> std::sync::Arc<str> {
    s.into()
}

fn sets(t: &mut Table) {
    let mut cidrs = Set::new("cidrs4", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(INTERVAL);
    for k in [net("10.0.0.0/8"), net("11.0.0.0/8"), net("128.0.0.0/1")] {
        cidrs.insert(vec![k]);
    }
    cidrs.insert(vec![KeyPart::Range(v4("1.2.3.4"), v4("1.2.3.10"))]);
    cidrs.insert(vec![v4("1.1.1.1").into()]);
    t.add_set(cidrs);

    let mut cidrs6 =
        Set::new("cidrs6", vec![DataType::Ipv6Addr], SetKind::Set).with_flags(INTERVAL);
    cidrs6.insert(vec![net("fd00::/8")]);
    cidrs6.insert(vec![net("2001:db8::/32")]);
    t.add_set(cidrs6);

    let mut ports =
        Set::new("ports", vec![DataType::InetService], SetKind::Set).with_flags(INTERVAL);
    ports.insert(vec![KeyPart::Range(Value::Port(1000), Value::Port(2000))]);
    ports.insert(vec![Value::Port(80).into()]);
    ports.insert(vec![KeyPart::Range(Value::Port(60000), Value::Port(65535))]);
    t.add_set(ports);

    let mut marks = Set::new("marks", vec![DataType::Mark], SetKind::Set).with_flags(INTERVAL);
    marks.insert(vec![KeyPart::Range(Value::Mark(0x10), Value::Mark(0x20))]);
    marks.insert(vec![Value::Mark(0x100).into()]);
    t.add_set(marks);

    let mut pods = Set::new("pods", vec![DataType::Ipv4Addr], SetKind::Set);
    for ip in ["10.244.1.2", "10.244.1.3", "10.244.2.9"] {
        pods.insert(vec![v4(ip).into()]);
    }
    t.add_set(pods);

    let mut pods6 = Set::new("pods6", vec![DataType::Ipv6Addr], SetKind::Set);
    pods6.insert(vec![v6("fd00:10:244:1::2").into()]);
    t.add_set(pods6);

    let mut ifaces = Set::new("ifaces", vec![DataType::IfName], SetKind::Set);
    ifaces.insert(vec![Value::IfName("eth0".into()).into()]);
    ifaces.insert(vec![Value::IfName("ens3".into()).into()]);
    t.add_set(ifaces);

    let mut protos = Set::new("protos", vec![DataType::InetProto], SetKind::Set);
    for p in [proto::TCP, proto::UDP, proto::SCTP] {
        protos.insert(vec![Value::Proto(p).into()]);
    }
    t.add_set(protos);

    let mut misc = Set::new(
        "pod-ports",
        vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::Set,
    );
    misc.insert(vec![
        v4("10.244.1.2").into(),
        Value::Proto(proto::TCP).into(),
        Value::Port(8080).into(),
    ]);
    t.add_set(misc);

    let mut civ = Set::new(
        "cidr-ports",
        vec![DataType::Ipv4Addr, DataType::InetService],
        SetKind::Set,
    )
    .with_flags(INTERVAL);
    civ.insert(vec![net("10.0.0.0/8"), Value::Port(80).into()]);
    civ.insert(vec![
        v4("192.168.1.1").into(),
        KeyPart::Range(Value::Port(1), Value::Port(1024)),
    ]);
    t.add_set(civ);

    let mut mark_cidrs = Set::new(
        "mark-cidrs",
        vec![DataType::Mark, DataType::Ipv4Addr],
        SetKind::Set,
    )
    .with_flags(INTERVAL);
    mark_cidrs.insert(vec![
        KeyPart::Range(Value::Mark(0x10), Value::Mark(0x20)),
        net("10.0.0.0/8"),
    ]);
    t.add_set(mark_cidrs);

    let entries = [
        ("172.30.0.10", proto::TCP, 80, goto("svc-a")),
        ("172.30.0.10", proto::TCP, 443, jump("svc-b")),
        ("172.30.0.11", proto::UDP, 53, Verdict::Drop),
        ("172.30.0.12", proto::SCTP, 9, Verdict::Accept),
        ("172.30.0.13", proto::TCP, 1, Verdict::Return),
    ];
    t.add_set(service_vmap("services", &entries));

    // Counters on every element, comments on some: one on an open-ended interval (userdata
    // with both the comment and the open flag), one that must be sanitized, one at the cap.
    let mut cvm = Set::new("cidr-vmap", vec![DataType::Ipv4Addr], SetKind::VerdictMap)
        .with_flags(COUNTED_INTERVAL);
    cvm.insert_commented_mapping(
        vec![net("10.0.0.0/8")],
        ElemData::Verdict(Verdict::Accept),
        comment("rule 0: Allow 10.0.0.0/8"),
    );
    cvm.insert_mapping(
        vec![net("192.168.0.0/16")],
        ElemData::Verdict(jump("fw-log")),
    );
    cvm.insert_commented_mapping(
        vec![KeyPart::Range(v4("203.0.113.7"), v4("203.0.113.9"))],
        ElemData::Verdict(Verdict::Drop),
        comment("rule 1: Deny \"quoted\"; #x"),
    );
    cvm.insert_commented_mapping(
        vec![net("240.0.0.0/4")],
        ElemData::Verdict(Verdict::Drop),
        comment(&format!(
            "rule 2: Deny dnsName {}.example.com",
            "a".repeat(140)
        )),
    );
    t.add_set(cvm);

    let mut pvm = Set::new(
        "port-vmap",
        vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::VerdictMap,
    )
    .with_flags(COUNTED_INTERVAL);
    pvm.insert_commented_mapping(
        vec![
            net("198.51.100.0/24"),
            Value::Proto(proto::TCP).into(),
            Value::Port(443).into(),
        ],
        ElemData::Verdict(Verdict::Accept),
        comment("rule 4: Allow 198.51.100.0/24 ports tcp/443"),
    );
    pvm.insert_commented_mapping(
        vec![
            KeyPart::Range(v4("0.0.0.0"), v4("198.51.99.255")),
            Value::Proto(proto::UDP).into(),
            Value::Port(53).into(),
        ],
        ElemData::Verdict(Verdict::Drop),
        comment("rule 5: Deny 0.0.0.0/0 ports udp/53"),
    );
    t.add_set(pvm);
    t.add_set(
        Set::new(
            "counted-empty",
            vec![DataType::Ipv6Addr],
            SetKind::VerdictMap,
        )
        .with_flags(COUNTED_INTERVAL),
    );

    t.add_set(address_map("snat4", "10.244.1.2", "192.168.50.10"));
    t.add_set(address_map("snat6", "fd00:10:244:1::2", "2001:db8::100"));

    let mut egress = Set::new(
        "egress",
        vec![DataType::Ipv4Addr, DataType::IfName],
        SetKind::Map(vec![DataType::Ipv4Addr, DataType::InetService]),
    );
    egress.insert_mapping(
        vec![v4("10.244.1.3").into(), Value::IfName("eth1".into()).into()],
        ElemData::Values(vec![v4("192.168.50.11"), Value::Port(4000)]),
    );
    t.add_set(egress);

    // Load-balancing data maps keyed by frontend and numgen bucket (typeof declarations).
    let lb_key = |daddr| {
        vec![
            daddr,
            Field::L4Proto,
            Field::ThDport,
            Field::NumgenRandom(1),
        ]
    };
    let mut lb4 = Set::typeof_map(
        "backends4",
        lb_key(Field::Ip4Daddr),
        vec![Field::Ip4Daddr, Field::ThDport],
    );
    for (i, ep) in ["10.244.1.5", "10.244.2.5"].iter().enumerate() {
        lb4.insert_mapping(
            vec![
                v4("172.30.0.20").into(),
                Value::Proto(proto::TCP).into(),
                Value::Port(80).into(),
                Value::Integer(i as u32).into(),
            ],
            ElemData::Values(vec![v4(ep), Value::Port(8080)]),
        );
    }
    t.add_set(lb4);
    let mut lb6 = Set::typeof_map(
        "backends6",
        lb_key(Field::Ip6Daddr),
        vec![Field::Ip6Daddr, Field::ThDport],
    );
    lb6.insert_mapping(
        vec![
            v6("fd00:30::20").into(),
            Value::Proto(proto::UDP).into(),
            Value::Port(53).into(),
            Value::Integer(0).into(),
        ],
        ElemData::Values(vec![v6("fd00:10:244:1::5"), Value::Port(5353)]),
    );
    t.add_set(lb6);
    let mut np4 = Set::typeof_map(
        "np-backends4",
        vec![Field::L4Proto, Field::ThDport, Field::NumgenRandom(1)],
        vec![Field::Ip4Daddr, Field::ThDport],
    );
    np4.insert_mapping(
        vec![
            Value::Proto(proto::TCP).into(),
            Value::Port(30080).into(),
            Value::Integer(0).into(),
        ],
        ElemData::Values(vec![v4("10.244.1.5"), Value::Port(8080)]),
    );
    t.add_set(np4);

    let mut marks_map = Set::new("mark-vmap", vec![DataType::Mark], SetKind::VerdictMap);
    marks_map.insert_mapping(
        vec![Value::Mark(1).into()],
        ElemData::Verdict(Verdict::Accept),
    );
    t.add_set(marks_map);

    t.add_set(
        Set::new("affinity", vec![DataType::Ipv4Addr], SetKind::Set)
            .with_flags(SetFlags {
                timeout: true,
                dynamic: true,
                ..Default::default()
            })
            .with_timeout(10800),
    );
    t.add_set(
        Set::new(
            "meter4",
            vec![DataType::IfName, DataType::Ipv4Addr],
            SetKind::Set,
        )
        .with_flags(SetFlags {
            timeout: true,
            dynamic: true,
            ..Default::default()
        })
        .with_timeout(60)
        .with_size(4096),
    );
    let mut timed = Set::new("timed", vec![DataType::InetService], SetKind::Set)
        .with_flags(SetFlags {
            timeout: true,
            ..Default::default()
        })
        .with_timeout(3600);
    timed.elements.insert(
        vec![Value::Port(22).into()],
        ElemValue {
            data: None,
            timeout: Some(600),
            comment: Some(comment("ssh")),
        },
    );
    timed.insert(vec![Value::Port(23).into()]);
    t.add_set(timed);

    for (name, ty) in [
        ("nfprotos", DataType::NfProto),
        ("states", DataType::CtState),
        ("addrtypes", DataType::AddrType),
        ("plain-marks", DataType::Mark),
    ] {
        t.add_set(Set::new(name, vec![ty], SetKind::Set));
    }
}

/// Every statement, field, set kind and base-chain kind of the IR.
pub fn rich_table() -> Table {
    let mut t = Table::new(TABLE_NAME);
    sets(&mut t);
    rich_chains::forward(&mut t);
    rich_chains::nat(&mut t);
    rich_chains::mangle(&mut t);
    t
}

/// `rich_table` with element, rule, chain and set changes: what a diff must carry.
pub fn rich_table_changed() -> Table {
    let mut t = rich_table();
    let pods = t.sets.get_mut("pods").unwrap();
    pods.elements.remove(&vec![v4("10.244.1.3").into()]);
    pods.insert(vec![v4("10.244.3.3").into()]);
    let cidrs = t.sets.get_mut("cidrs4").unwrap();
    cidrs.elements.remove(&vec![net("11.0.0.0/8")]);
    cidrs.insert(vec![net("100.64.0.0/10")]);
    let svc = t.sets.get_mut("services").unwrap();
    svc.insert_mapping(
        vec![
            v4("172.30.0.10").into(),
            Value::Proto(proto::TCP).into(),
            Value::Port(80).into(),
        ],
        ElemData::Verdict(goto("svc-b")),
    );
    // A changed comment (same verdict) and a changed verdict (same comment): both are a
    // delete and an add of the key; an unchanged element keeps its counter.
    let cvm = t.sets.get_mut("cidr-vmap").unwrap();
    cvm.insert_commented_mapping(
        vec![net("10.0.0.0/8")],
        ElemData::Verdict(Verdict::Accept),
        comment("rule 0: Allow 10.0.0.0/8 ports tcp/80"),
    );
    cvm.insert_commented_mapping(
        vec![KeyPart::Range(v4("203.0.113.7"), v4("203.0.113.9"))],
        ElemData::Verdict(Verdict::Accept),
        comment("rule 1: Deny \"quoted\"; #x"),
    );
    let pvm = t.sets.get_mut("port-vmap").unwrap();
    pvm.insert_commented_mapping(
        vec![
            net("198.51.100.0/24"),
            Value::Proto(proto::TCP).into(),
            Value::Port(443).into(),
        ],
        ElemData::Verdict(Verdict::Drop),
        comment("rule 4: Deny 198.51.100.0/24 ports tcp/443"),
    );
    let civ = t.sets.get_mut("cidr-ports").unwrap();
    civ.insert(vec![
        net("172.16.0.0/12"),
        KeyPart::Range(Value::Port(10), Value::Port(20)),
    ]);
    // Declaration change: the set is recreated, and rules using it are rewritten.
    let timed = t.sets.get_mut("timed").unwrap();
    timed.timeout = Some(7200);
    t.sets.remove("egress");
    let log = t.chains.get_mut("fw-log").unwrap();
    log.rules[0] = Rule::new(vec![Stmt::Log {
        prefix: "np changed ".into(),
        group: None,
    }]);
    t.chains.remove("ep-3");
    let svc_a = t.chains.get_mut("svc-a").unwrap();
    svc_a.rules = vec![Rule::new(vec![Stmt::Vmap {
        key: vec![Field::NumgenRandom(2)],
        map: MapRef::Anon(vec![
            (vec![Value::Integer(0).into()], goto("ep-1")),
            (vec![Value::Integer(1).into()], goto("ep-2")),
        ]),
    }])];
    let mut extra = Chain::regular("fw-new");
    extra.push(Rule::new(vec![verdict(Verdict::Drop)]));
    t.add_chain(extra);
    t
}
