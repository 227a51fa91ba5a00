//! IR tables for the kernel tests: one that uses every statement, field and set kind the
//! IR has, a changed version of it (for diffs), and a large synthetic one.

use nodeplane::nft::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub fn v4(s: &str) -> Value {
    Value::Ipv4(s.parse::<Ipv4Addr>().unwrap())
}

pub fn v6(s: &str) -> Value {
    Value::Ipv6(s.parse::<Ipv6Addr>().unwrap())
}

fn net(s: &str) -> KeyPart {
    KeyPart::Prefix(s.parse().unwrap())
}

fn base(kind: ChainType, hook: Hook, priority: i32, policy: Policy) -> BaseChain {
    BaseChain {
        kind,
        hook,
        priority,
        policy,
    }
}

fn m(key: Vec<Field>, op: MatchOp) -> Stmt {
    Stmt::Match(Match { key, op })
}

fn anon(key: Vec<Field>, elems: Vec<Vec<KeyPart>>) -> Stmt {
    m(key, MatchOp::InAnon(elems))
}

fn verdict(v: Verdict) -> Stmt {
    Stmt::Verdict(v)
}

fn goto(c: &str) -> Verdict {
    Verdict::Goto(c.into())
}

fn jump(c: &str) -> Verdict {
    Verdict::Jump(c.into())
}

const INTERVAL: SetFlags = SetFlags {
    interval: true,
    timeout: false,
    dynamic: false,
};

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

    let mut svc = Set::new(
        "services",
        vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::VerdictMap,
    );
    let entries = [
        ("172.30.0.10", proto::TCP, 80, goto("svc-a")),
        ("172.30.0.10", proto::TCP, 443, jump("svc-b")),
        ("172.30.0.11", proto::UDP, 53, Verdict::Drop),
        ("172.30.0.12", proto::SCTP, 9, Verdict::Accept),
        ("172.30.0.13", proto::TCP, 1, Verdict::Return),
    ];
    for (ip, p, port, v) in entries {
        svc.insert_mapping(
            vec![
                v4(ip).into(),
                Value::Proto(p).into(),
                Value::Port(port).into(),
            ],
            ElemData::Verdict(v),
        );
    }
    t.add_set(svc);

    let mut cvm =
        Set::new("cidr-vmap", vec![DataType::Ipv4Addr], SetKind::VerdictMap).with_flags(INTERVAL);
    cvm.insert_mapping(vec![net("10.0.0.0/8")], ElemData::Verdict(Verdict::Accept));
    cvm.insert_mapping(
        vec![net("192.168.0.0/16")],
        ElemData::Verdict(jump("fw-log")),
    );
    t.add_set(cvm);

    let mut snat4 = Set::new(
        "snat4",
        vec![DataType::Ipv4Addr],
        SetKind::Map(vec![DataType::Ipv4Addr]),
    );
    snat4.insert_mapping(
        vec![v4("10.244.1.2").into()],
        ElemData::Values(vec![v4("192.168.50.10")]),
    );
    t.add_set(snat4);

    let mut snat6 = Set::new(
        "snat6",
        vec![DataType::Ipv6Addr],
        SetKind::Map(vec![DataType::Ipv6Addr]),
    );
    snat6.insert_mapping(
        vec![v6("fd00:10:244:1::2").into()],
        ElemData::Values(vec![v6("2001:db8::100")]),
    );
    t.add_set(snat6);

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

fn forward(t: &mut Table) {
    let mut c = Chain::base(
        "filter-forward",
        base(
            ChainType::Filter,
            Hook::Forward,
            priority::FILTER,
            Policy::Accept,
        ),
    );
    let rules: Vec<Rule> = vec![
        Rule::new(vec![
            m(
                vec![Field::CtState],
                MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            m(vec![Field::CtState], MatchOp::AnyFlag(ct_state::INVALID)),
            Stmt::Counter,
            verdict(Verdict::Drop),
        ])
        .with_comment("drop \"invalid\"; state\n#1"),
        Rule::new(vec![
            Stmt::matches(Field::NfProto, Value::NfProto(IpFamily::V4)),
            Stmt::matches(Field::Ip4Saddr, v4("10.244.1.2")),
            Stmt::not_matches(Field::Ip4Daddr, v4("10.244.1.3")),
            verdict(jump("fw-pod")),
        ]),
        Rule::new(vec![
            Stmt::matches(Field::Ip6Saddr, v6("fd00:10:244:1::2")),
            Stmt::not_matches(Field::Ip6Daddr, v6("fe80::1")),
            verdict(goto("fw-pod")),
        ]),
        Rule::new(vec![
            Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
            Stmt::matches(Field::ThDport, Value::Port(22)),
            Stmt::not_matches(Field::ThSport, Value::Port(1)),
            verdict(Verdict::Continue),
        ]),
        Rule::new(vec![
            Stmt::not_matches(Field::L4Proto, Value::Proto(proto::ICMP)),
            Stmt::matches(Field::IifName, Value::IfName("eth0".into())),
            Stmt::matches(Field::OifName, Value::IfName("veth*".into())),
            Stmt::not_matches(Field::IifName, Value::IfName("lo".into())),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::matches(Field::Mark, Value::Mark(0x4000)),
            Stmt::not_matches(Field::CtMark, Value::Mark(7)),
            Stmt::not_matches(Field::NfProto, Value::NfProto(IpFamily::V6)),
            verdict(Verdict::Return),
        ]),
        Rule::new(vec![
            Stmt::in_set(vec![Field::Ip4Daddr], "cidrs4"),
            Stmt::not_in_set(vec![Field::Ip4Saddr], "pods"),
            Stmt::in_set(vec![Field::ThDport], "ports"),
            Stmt::in_set(vec![Field::L4Proto], "protos"),
            Stmt::Log {
                prefix: "nodeplane: deny ".into(),
            },
            verdict(Verdict::Drop),
        ]),
        Rule::new(vec![
            Stmt::in_set(vec![Field::Ip6Saddr], "cidrs6"),
            Stmt::not_in_set(vec![Field::Ip6Daddr], "pods6"),
            verdict(Verdict::Drop),
        ]),
        Rule::new(vec![
            Stmt::in_set(vec![Field::Mark], "marks"),
            Stmt::in_set(vec![Field::IifName], "ifaces"),
            Stmt::not_in_set(vec![Field::Mark], "plain-marks"),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::in_set(
                vec![Field::Ip4Saddr, Field::L4Proto, Field::ThDport],
                "pod-ports",
            ),
            Stmt::in_set(vec![Field::Ip4Daddr, Field::ThDport], "cidr-ports"),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::in_set(vec![Field::Mark, Field::Ip4Saddr], "mark-cidrs"),
            anon(
                vec![Field::IifName],
                vec![
                    vec![Value::IfName("eth*".into()).into()],
                    vec![Value::IfName("lo".into()).into()],
                ],
            ),
            anon(
                vec![Field::OifName],
                vec![vec![Value::IfName("veth*".into()).into()]],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::in_set(vec![Field::NfProto], "nfprotos"),
            Stmt::in_set(vec![Field::CtState], "states"),
            Stmt::in_set(vec![Field::FibDaddrType], "addrtypes"),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::Ip4Saddr],
                vec![vec![v4("10.244.1.2").into()], vec![v4("10.244.1.3").into()]],
            ),
            anon(vec![Field::Ip4Daddr], vec![vec![v4("1.1.1.1").into()]]),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(vec![Field::Ip4Saddr], vec![vec![net("10.0.0.0/8")]]),
            anon(vec![Field::Ip4Daddr], vec![vec![net("10.16.0.0/12")]]),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(vec![Field::Ip6Saddr], vec![vec![net("2001:db8::/33")]]),
            anon(vec![Field::Ip6Daddr], vec![vec![net("2001:db8:1::/48")]]),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::ThDport],
                vec![vec![KeyPart::Range(Value::Port(1000), Value::Port(2000))]],
            ),
            anon(
                vec![Field::Mark],
                vec![vec![KeyPart::Range(Value::Mark(1), Value::Mark(9))]],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::Ip4Daddr],
                vec![
                    vec![net("10.0.0.0/8")],
                    vec![net("10.1.0.0/16")],
                    vec![net("11.0.0.0/8")],
                    vec![v4("192.168.1.1").into()],
                ],
            ),
            anon(
                vec![Field::ThDport],
                vec![
                    vec![Value::Port(80).into()],
                    vec![Value::Port(443).into()],
                    vec![KeyPart::Range(Value::Port(8000), Value::Port(8999))],
                ],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::Ip4Saddr, Field::L4Proto, Field::ThDport],
                vec![
                    vec![
                        v4("1.1.1.1").into(),
                        Value::Proto(proto::TCP).into(),
                        Value::Port(80).into(),
                    ],
                    vec![
                        v4("2.2.2.2").into(),
                        Value::Proto(proto::UDP).into(),
                        Value::Port(53).into(),
                    ],
                ],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::Ip4Daddr, Field::ThDport],
                vec![
                    vec![net("10.0.0.0/8"), Value::Port(80).into()],
                    vec![
                        v4("5.6.7.8").into(),
                        KeyPart::Range(Value::Port(1), Value::Port(100)),
                    ],
                ],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::IifName, Field::Ip4Saddr],
                vec![vec![
                    Value::IfName("eth0".into()).into(),
                    v4("1.1.1.1").into(),
                ]],
            ),
            anon(
                vec![Field::Mark],
                vec![
                    vec![KeyPart::Range(Value::Mark(0x10), Value::Mark(0x20))],
                    vec![Value::Mark(0x40).into()],
                ],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::NfProto],
                vec![
                    vec![Value::NfProto(IpFamily::V4).into()],
                    vec![Value::NfProto(IpFamily::V6).into()],
                ],
            ),
            anon(
                vec![Field::L4Proto],
                vec![
                    vec![Value::Proto(proto::TCP).into()],
                    vec![Value::Proto(proto::UDP).into()],
                ],
            ),
            anon(
                vec![Field::CtMark],
                vec![vec![Value::Mark(1).into()], vec![Value::Mark(2).into()]],
            ),
            anon(
                vec![Field::OifName],
                vec![
                    vec![Value::IfName("eth0".into()).into()],
                    vec![Value::IfName("eth1".into()).into()],
                ],
            ),
            anon(
                vec![Field::ThSport],
                vec![vec![Value::Port(1).into()], vec![Value::Port(2).into()]],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            anon(
                vec![Field::Ip6Daddr],
                vec![vec![v6("::1").into()], vec![v6("::2").into()]],
            ),
            anon(
                vec![Field::NumgenRandom(4)],
                vec![
                    vec![Value::Integer(0).into()],
                    vec![Value::Integer(1).into()],
                ],
            ),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![Stmt::Vmap {
            key: vec![Field::Ip4Saddr],
            map: MapRef::Named("cidr-vmap".into()),
        }]),
        Rule::new(vec![Stmt::vmap(vec![Field::Mark], "mark-vmap")]),
        Rule::new(vec![Stmt::Vmap {
            key: vec![Field::Ip4Daddr, Field::ThDport],
            map: MapRef::Anon(vec![
                (
                    vec![v4("1.1.1.1").into(), Value::Port(80).into()],
                    Verdict::Accept,
                ),
                (
                    vec![v4("2.2.2.2").into(), Value::Port(53).into()],
                    jump("fw-log"),
                ),
            ]),
        }]),
        Rule::new(vec![Stmt::Vmap {
            key: vec![Field::Ip4Saddr],
            map: MapRef::Anon(vec![
                (vec![net("10.0.0.0/8")], Verdict::Accept),
                (vec![v4("2.2.2.2").into()], jump("fw-log")),
            ]),
        }]),
        Rule::new(vec![
            Stmt::SetUpdate {
                set: "affinity".into(),
                key: vec![Field::Ip4Saddr],
            },
            Stmt::in_set(vec![Field::ThDport], "timed"),
            verdict(jump("fw-log")),
        ]),
    ];
    for r in rules {
        c.push(r);
    }
    t.add_chain(c);

    let mut pod = Chain::regular("fw-pod");
    pod.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Daddr, v4("8.8.8.8")),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    pod.push(Rule::new(vec![
        Stmt::matches(Field::Ip6Daddr, v6("2001:4860::8888")),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    pod.push(Rule::new(vec![Stmt::Reject(Reject::TcpReset)]));
    pod.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
        Stmt::Reject(Reject::TcpReset),
    ]));
    pod.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Daddr, v4("8.8.4.4")),
        Stmt::Reject(Reject::AdminProhibited),
    ]));
    pod.push(Rule::new(vec![Stmt::Reject(Reject::PortUnreachable)]).with_comment("default"));
    t.add_chain(pod);

    let mut log = Chain::regular("fw-log");
    log.push(Rule::new(vec![
        Stmt::Counter,
        Stmt::Log {
            prefix: "np \"x\"; y ".into(),
        },
    ]));
    log.push(Rule::new(vec![Stmt::MarkSet(0x20)]));
    t.add_chain(log);

    let mut input = Chain::base(
        "filter-input",
        base(ChainType::Filter, Hook::Input, 10, Policy::Accept),
    );
    input.push(Rule::new(vec![
        Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
        Stmt::matches(Field::NfProto, Value::NfProto(IpFamily::V6)),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    input.push(Rule::new(vec![
        Stmt::matches(Field::NumgenRandom(10), Value::Integer(3)),
        verdict(Verdict::Drop),
    ]));
    t.add_chain(input);
}

fn nat(t: &mut Table) {
    let mut pre = Chain::base(
        "nat-prerouting",
        base(
            ChainType::Nat,
            Hook::Prerouting,
            priority::DSTNAT,
            Policy::Accept,
        ),
    );
    pre.push(Rule::new(vec![
        Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
        Stmt::vmap(
            vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
            "services",
        ),
    ]));
    pre.push(Rule::new(vec![Stmt::vmap(
        vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
        "services",
    )]));
    t.add_chain(pre);

    let mut out = Chain::base(
        "nat-output",
        base(
            ChainType::Nat,
            Hook::Output,
            priority::DSTNAT,
            Policy::Accept,
        ),
    );
    out.push(Rule::new(vec![Stmt::vmap(
        vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
        "services",
    )]));
    t.add_chain(out);

    let mut svc_a = Chain::regular("svc-a");
    svc_a.push(Rule::new(vec![Stmt::Vmap {
        key: vec![Field::NumgenRandom(3)],
        map: MapRef::Anon(vec![
            (vec![Value::Integer(0).into()], goto("ep-1")),
            (vec![Value::Integer(1).into()], goto("ep-2")),
            (vec![Value::Integer(2).into()], goto("ep-3")),
        ]),
    }]));
    t.add_chain(svc_a);
    let mut svc_b = Chain::regular("svc-b");
    svc_b.push(Rule::new(vec![verdict(goto("ep-1"))]));
    t.add_chain(svc_b);

    let eps: [(&str, IpAddr, Option<u16>, u8); 3] = [
        (
            "ep-1",
            "10.244.1.2".parse().unwrap(),
            Some(8080),
            proto::TCP,
        ),
        ("ep-2", "10.244.1.3".parse().unwrap(), None, proto::TCP),
        (
            "ep-3",
            "fd00:10:244:1::2".parse().unwrap(),
            Some(53),
            proto::UDP,
        ),
    ];
    for (name, addr, port, p) in eps {
        let mut ep = Chain::regular(name);
        let family = if addr.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        };
        let mut stmts = vec![Stmt::matches(Field::L4Proto, Value::Proto(p))];
        stmts.push(Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family,
            addr: NatAddr::Fixed(addr, port),
        }));
        ep.push(Rule::new(stmts).with_comment(format!("endpoint {name}")));
        t.add_chain(ep);
    }

    let mut post = Chain::base(
        "nat-postrouting",
        base(
            ChainType::Nat,
            Hook::Postrouting,
            priority::SRCNAT,
            Policy::Accept,
        ),
    );
    post.push(Rule::new(vec![
        Stmt::matches(Field::Mark, Value::Mark(0x4000)),
        Stmt::Masquerade,
    ]));
    post.push(Rule::new(vec![Stmt::Nat(Nat {
        kind: NatKind::Snat,
        family: IpFamily::V4,
        addr: NatAddr::Map {
            key: vec![Field::Ip4Saddr],
            map: "snat4".into(),
        },
    })]));
    post.push(Rule::new(vec![Stmt::Nat(Nat {
        kind: NatKind::Snat,
        family: IpFamily::V6,
        addr: NatAddr::Map {
            key: vec![Field::Ip6Saddr],
            map: "snat6".into(),
        },
    })]));
    post.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Saddr, v4("10.244.2.9")),
        Stmt::Nat(Nat {
            kind: NatKind::Snat,
            family: IpFamily::V4,
            addr: NatAddr::Fixed("192.168.50.100".parse().unwrap(), None),
        }),
    ]));
    post.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::UDP)),
        Stmt::Nat(Nat {
            kind: NatKind::Snat,
            family: IpFamily::V6,
            addr: NatAddr::Fixed("2001:db8::5".parse().unwrap(), Some(5353)),
        }),
    ]));
    t.add_chain(post);
}

fn mangle(t: &mut Table) {
    let mut c = Chain::base(
        "mangle-postrouting",
        base(
            ChainType::Filter,
            Hook::Postrouting,
            priority::MANGLE,
            Policy::Accept,
        ),
    );
    c.push(Rule::new(vec![
        Stmt::matches(Field::Ip4Saddr, v4("10.244.1.2")),
        Stmt::DscpSet {
            family: IpFamily::V4,
            dscp: 46,
        },
        Stmt::MarkSet(0x10),
    ]));
    c.push(Rule::new(vec![
        Stmt::matches(Field::CtMark, Value::Mark(1)),
        Stmt::DscpSet {
            family: IpFamily::V6,
            dscp: 10,
        },
    ]));
    c.push(Rule::new(vec![Stmt::DscpSet {
        family: IpFamily::V4,
        dscp: 0,
    }]));
    t.add_chain(c);

    let mut route = Chain::base(
        "route-output",
        base(
            ChainType::Route,
            Hook::Output,
            priority::MANGLE,
            Policy::Accept,
        ),
    );
    route.push(Rule::new(vec![
        Stmt::in_set(vec![Field::Ip4Daddr], "cidrs4"),
        Stmt::MarkSet(0x4000),
    ]));
    t.add_chain(route);

    let mut drop_in = Chain::base(
        "raw-prerouting",
        base(
            ChainType::Filter,
            Hook::Prerouting,
            priority::RAW,
            Policy::Drop,
        ),
    );
    drop_in.push(Rule::new(vec![verdict(Verdict::Accept)]));
    t.add_chain(drop_in);
}

/// Every statement, field, set kind and base-chain kind of the IR.
pub fn rich_table() -> Table {
    let mut t = Table::new(TABLE_NAME);
    sets(&mut t);
    forward(&mut t);
    nat(&mut t);
    mangle(&mut t);
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
        c.push(Rule::new(vec![Stmt::Counter, verdict(Verdict::Drop)]));
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
            ElemData::Verdict(goto(&format!("svc-{}", i % chains.max(1)))),
        );
    }
    t.add_set(svc);
    let mut pre = Chain::base(
        "nat-prerouting",
        base(
            ChainType::Nat,
            Hook::Prerouting,
            priority::DSTNAT,
            Policy::Accept,
        ),
    );
    pre.push(Rule::new(vec![Stmt::vmap(
        vec![Field::Ip4Daddr, Field::L4Proto, Field::ThDport],
        "services",
    )]));
    t.add_chain(pre);
    t
}
