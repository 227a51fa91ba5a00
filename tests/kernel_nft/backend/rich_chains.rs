//! The chains of the rich test table: filter, nat, mangle and route base chains and the
//! regular chains they reach, using every statement and field of the IR.

use super::fixtures::*;
use nodeplane::nft::*;
use std::net::IpAddr;

pub fn forward(t: &mut Table) {
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
            Stmt::matches(Field::CtDirection, Value::CtDir(CtDir::Reply)),
            Stmt::matches(Field::Ip4Saddr, v4("10.244.1.9")),
            verdict(Verdict::Accept),
        ]),
        Rule::new(vec![
            Stmt::not_matches(Field::CtDirection, Value::CtDir(CtDir::Original)),
            Stmt::matches(Field::CtDirection, Value::CtDir(CtDir::Reply)),
            Stmt::Counter,
            verdict(Verdict::Return),
        ]),
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
                group: Some(7),
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
                timeout: None,
            },
            Stmt::in_set(vec![Field::ThDport], "timed"),
            verdict(jump("fw-log")),
        ]),
        Rule::new(vec![
            Stmt::matches(Field::L4Proto, Value::Proto(proto::UDP)),
            Stmt::matches(Field::ThDport, Value::Port(53)),
            verdict(jump("fw-meter")),
        ]),
    ];
    for r in rules {
        c.push(r);
    }
    t.add_chain(c);

    // A chain of its own, so that a drift test can rewrite just this rule.
    let mut meter = Chain::regular("fw-meter");
    meter.push(Rule::new(vec![
        Stmt::SetLimit {
            set: "meter4".into(),
            key: vec![Field::IifName, Field::Ip4Saddr],
            limit: Limit {
                per_second: 10,
                burst: 20,
            },
        },
        verdict(Verdict::Drop),
    ]));
    t.add_chain(meter);

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
            group: None,
        },
    ]));
    log.push(Rule::new(vec![Stmt::MarkSet(0x20)]));
    // Services: mark bits set/cleared/tested, and `fib saddr type local`.
    log.push(Rule::new(vec![Stmt::MarkOr(0x4000)]));
    log.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Mark],
            op: MatchOp::AnyFlag(0x4000),
        }),
        Stmt::MarkAnd(!0x4000),
        verdict(Verdict::Accept),
    ]));
    log.push(Rule::new(vec![
        Stmt::matches(Field::FibSaddrType, Value::AddrType(AddrType::Local)),
        verdict(Verdict::Return),
    ]));
    // NetworkPolicy's bridge flow set: a bitmask test of the TCP flags.
    log.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
        Stmt::Match(Match {
            key: vec![Field::TcpFlags],
            op: MatchOp::Masked {
                mask: Value::TcpFlags(tcp_flags::SYN | tcp_flags::ACK),
                value: Value::TcpFlags(tcp_flags::SYN),
                eq: false,
            },
        }),
        verdict(Verdict::Accept),
    ]));
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
    // NetworkPolicy's source check (a strict reverse-path test).
    input.push(Rule::new(vec![
        Stmt::matches(Field::FibSaddrIifOif, Value::Exists(false)),
        Stmt::Counter,
        verdict(Verdict::Drop),
    ]));
    t.add_chain(input);
}

pub fn nat(t: &mut Table) {
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
    for (daddr, family, map, n) in [
        (Field::Ip4Daddr, IpFamily::V4, "backends4", 2),
        (Field::Ip6Daddr, IpFamily::V6, "backends6", 1),
    ] {
        pre.push(Rule::new(vec![Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family,
            addr: NatAddr::Map {
                key: vec![
                    daddr,
                    Field::L4Proto,
                    Field::ThDport,
                    Field::NumgenRandom(n),
                ],
                map: map.into(),
            },
        })]));
    }
    pre.push(Rule::new(vec![Stmt::Nat(Nat {
        kind: NatKind::Dnat,
        family: IpFamily::V4,
        addr: NatAddr::Map {
            key: vec![Field::L4Proto, Field::ThDport, Field::NumgenRandom(3)],
            map: "np-backends4".into(),
        },
    })]));
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
        Stmt::Masquerade { fully_random: true },
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

pub fn mangle(t: &mut Table) {
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
