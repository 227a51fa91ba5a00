//! Unit tests of statement lowering (no kernel needed).

use super::*;
use std::net::Ipv4Addr;

fn lower(stmts: Vec<Stmt>) -> LoweredRule {
    let sets = BTreeMap::new();
    let mut id = 1;
    lower_rule(&Rule::new(stmts), Family::Inet, &sets, &mut id).unwrap()
}

#[test]
fn ip_match_in_inet_gets_one_nfproto_dependency() {
    let r = lower(vec![
        Stmt::matches(Field::Ip4Saddr, Value::Ipv4(Ipv4Addr::new(1, 2, 3, 4))),
        Stmt::matches(Field::Ip4Daddr, Value::Ipv4(Ipv4Addr::new(5, 6, 7, 8))),
        Stmt::Verdict(Verdict::Drop),
    ]);
    assert_eq!(
        r.exprs,
        vec![
            Expr::Meta { key: 15, dreg: 1 },
            Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: 1,
                data: vec![2]
            },
            Expr::Payload {
                base: 1,
                offset: 12,
                len: 4,
                dreg: 1
            },
            Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: 1,
                data: vec![1, 2, 3, 4]
            },
            Expr::Payload {
                base: 1,
                offset: 16,
                len: 4,
                dreg: 1
            },
            Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: 1,
                data: vec![5, 6, 7, 8]
            },
            Expr::Verdict {
                code: 0,
                chain: None
            },
        ]
    );
}

#[test]
fn concatenations_use_32_bit_registers() {
    let r = lower(vec![Stmt::vmap(
        vec![Field::Ip4Saddr, Field::L4Proto, Field::ThDport],
        "vm",
    )]);
    let regs: Vec<u32> = r
        .exprs
        .iter()
        .filter_map(|e| match e {
            Expr::Meta { dreg, .. } | Expr::Payload { dreg, .. } => Some(*dreg),
            _ => None,
        })
        .collect();
    // nfproto dependency, ip saddr, l4proto, th dport.
    assert_eq!(regs, vec![1, 1, 9, 10]);
    assert_eq!(kernel_reg(5), 2);
}

#[test]
fn ct_state_flags_and_dscp_masks() {
    let r = lower(vec![Stmt::Match(Match {
        key: vec![Field::CtState],
        op: MatchOp::AnyFlag(ct_state::ESTABLISHED | ct_state::RELATED),
    })]);
    assert!(r.exprs.contains(&Expr::Bitwise {
        reg: 1,
        mask: 6u32.to_ne_bytes().to_vec(),
        xor: vec![0; 4],
        with_op: false
    }));
    let r = lower(vec![Stmt::DscpSet {
        family: IpFamily::V6,
        dscp: 10,
    }]);
    assert!(r.exprs.contains(&Expr::Bitwise {
        reg: 1,
        mask: vec![0xf0, 0x3f],
        xor: vec![0x02, 0x80],
        with_op: true
    }));
}

#[test]
fn single_prefix_is_a_shortened_compare() {
    let r = lower(vec![Stmt::Match(Match {
        key: vec![Field::Ip4Saddr],
        op: MatchOp::InAnon(vec![vec![KeyPart::Prefix("10.0.0.0/8".parse().unwrap())]]),
    })]);
    assert_eq!(
        &r.exprs[2..],
        &[
            Expr::Payload {
                base: 1,
                offset: 12,
                len: 1,
                dreg: 1
            },
            Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: 1,
                data: vec![10]
            }
        ]
    );
}

#[test]
fn port_nat_needs_a_transport_match() {
    let nat = Stmt::Nat(Nat {
        kind: NatKind::Dnat,
        family: IpFamily::V4,
        addr: NatAddr::Fixed(IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1)), Some(8080)),
    });
    let sets = BTreeMap::new();
    let mut id = 1;
    assert!(lower_rule(&Rule::new(vec![nat.clone()]), Family::Inet, &sets, &mut id).is_err());
    let r = lower(vec![Stmt::matches(Field::L4Proto, Value::Proto(6)), nat]);
    assert!(r.exprs.contains(&Expr::Nat {
        kind: NFT_NAT_DNAT,
        family: 2,
        reg_addr: 1,
        reg_proto: Some(2),
        flags: NF_NAT_RANGE_PROTO_SPECIFIED,
    }));
}

#[test]
fn ip_match_in_bridge_checks_the_ethertype_like_nft() {
    // `nft --debug=netlink add rule bridge t c ip6 saddr ::1`: meta load protocol, cmp 0x86dd.
    let mut id = 1;
    let rule = Rule::new(vec![Stmt::matches(
        Field::Ip6Saddr,
        Value::Ipv6(std::net::Ipv6Addr::LOCALHOST),
    )]);
    let r = lower_rule(&rule, Family::Bridge, &BTreeMap::new(), &mut id).unwrap();
    assert_eq!(r.exprs[0], Expr::Meta { key: 1, dreg: 1 });
    assert_eq!(
        r.exprs[1],
        Expr::Cmp {
            op: NFT_CMP_EQ,
            sreg: 1,
            data: vec![0x86, 0xdd]
        }
    );
}

#[test]
fn ip_frag_off_masks_like_nft() {
    // `nft --debug=netlink add rule bridge t c ip frag-off & 0x1fff != 0`: meta load protocol,
    // cmp 0x0800, payload load 2b @ network header + 6, bitwise & 0x1fff, cmp neq 0.
    let mut id = 1;
    let rule = Rule::new(vec![Stmt::Match(Match {
        key: vec![Field::Ip4FragOff],
        op: MatchOp::Masked {
            mask: Value::Port(0x1fff),
            value: Value::Port(0),
            eq: false,
        },
    })]);
    let r = lower_rule(&rule, Family::Bridge, &BTreeMap::new(), &mut id).unwrap();
    assert_eq!(
        r.exprs[1],
        Expr::Cmp {
            op: NFT_CMP_EQ,
            sreg: 1,
            data: vec![0x08, 0x00]
        }
    );
    assert_eq!(
        r.exprs[2],
        Expr::Payload {
            dreg: 1,
            base: crate::nft::nftnl::types::NFT_PAYLOAD_NETWORK_HEADER,
            offset: 6,
            len: 2
        }
    );
    assert!(r.exprs.contains(&Expr::Bitwise {
        reg: 1,
        mask: vec![0x1f, 0xff],
        xor: vec![0, 0],
        with_op: true
    }));
    assert_eq!(
        r.exprs.last(),
        Some(&Expr::Cmp {
            op: NFT_CMP_NEQ,
            sreg: 1,
            data: vec![0, 0]
        })
    );
}

#[test]
fn ip6_frag_off_is_an_exthdr_load_like_nft() {
    // `nft --debug=netlink add rule bridge t c frag frag-off != 0`: payload load 2b @ link
    // header + 12, cmp 0x86dd, exthdr load ipv6 2b @ 44 + 2, bitwise & 0xfff8, cmp neq 0.
    let frag = |eq: bool, off: u16| {
        let v = vec![Value::Port(off)];
        Stmt::Match(Match {
            key: vec![Field::Ip6FragOff],
            op: if eq { MatchOp::Eq(v) } else { MatchOp::Ne(v) },
        })
    };
    let mut id = 1;
    let r = lower_rule(
        &Rule::new(vec![frag(false, 0)]),
        Family::Bridge,
        &BTreeMap::new(),
        &mut id,
    )
    .unwrap();
    let load = Expr::Exthdr {
        kind: 44,
        offset: 2,
        len: 2,
        dreg: 1,
    };
    let bitwise = Expr::Bitwise {
        reg: 1,
        mask: vec![0xff, 0xf8],
        xor: vec![0, 0],
        with_op: true,
    };
    assert_eq!(
        r.exprs,
        vec![
            Expr::Payload {
                base: crate::nft::nftnl::types::NFT_PAYLOAD_LL_HEADER,
                offset: 12,
                len: 2,
                dreg: 1
            },
            Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: 1,
                data: vec![0x86, 0xdd]
            },
            load.clone(),
            bitwise.clone(),
            Expr::Cmp {
                op: NFT_CMP_NEQ,
                sreg: 1,
                data: vec![0, 0]
            },
        ]
    );
    // In inet, and after an IPv6 address in a bridge table: the usual dependency, once; the
    // offset is shifted to its 13 bits (`frag frag-off 185`: 185 << 3).
    let after_addr = Rule::new(vec![
        Stmt::matches(Field::Ip6Saddr, Value::Ipv6(std::net::Ipv6Addr::LOCALHOST)),
        frag(true, 185),
    ]);
    for family in [Family::Inet, Family::Bridge] {
        let r = lower_rule(&after_addr, family, &BTreeMap::new(), &mut id).unwrap();
        assert_eq!(
            r.exprs
                .iter()
                .filter(|e| matches!(e, Expr::Meta { .. }))
                .count(),
            1
        );
        assert_eq!(
            r.exprs[r.exprs.len() - 3..],
            [
                load.clone(),
                bitwise.clone(),
                Expr::Cmp {
                    op: NFT_CMP_EQ,
                    sreg: 1,
                    data: (185u16 << 3).to_be_bytes().to_vec()
                }
            ]
        );
    }
    // Only compared: as a set key, or an offset beyond 13 bits, it is an error.
    let keyed = Rule::new(vec![Stmt::in_set(vec![Field::Ip6FragOff], "s")]);
    let err = lower_rule(&keyed, Family::Bridge, &BTreeMap::new(), &mut id).unwrap_err();
    assert!(err.to_string().contains("frag frag-off"), "{err}");
    let big = Rule::new(vec![frag(true, 0x2000)]);
    let err = lower_rule(&big, Family::Bridge, &BTreeMap::new(), &mut id).unwrap_err();
    assert!(err.to_string().contains("13 bits"), "{err}");
}
