//! The engine on a `bridge` family table (NetworkPolicy for bridged pods without
//! `br_netfilter`): what the netlink backend writes equals `nft -f` of the rendered text,
//! reads back as unchanged, lives beside the inet table of the same name and is deleted alone.

use super::fixtures::{base, v4, v6};
use super::{T, nft_apply};
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::render::render_full;
use nodeplane::nft::*;
use nodeplane::testing::lab::Lab;
use nodeplane::testing::listing;

/// A forward chain dispatching on IPv4/IPv6 addresses (a `meta protocol` dependency each),
/// a set, a verdict map whose elements `goto` a regular chain, an L4 match, and the reply
/// tuples a bridge table needs where it has no conntrack: a dynamic timeout set that accepted
/// packets update with their reverse tuple and that packets are looked up in; IPv4
/// fragments (`ip frag-off` bitmask tests), IPv6 ones (`frag frag-off`, an extension header
/// load: first in a rule with an `ether type` dependency, after the addresses without) and
/// the address pairs they are tracked by.
fn bridge_table(second: bool) -> Table {
    let mut t = Table::with_family(Family::Bridge, T);
    let mut pods = Set::new("pods-v4", vec![DataType::Ipv4Addr], SetKind::Set);
    pods.elements
        .insert(vec![v4("10.128.5.2").into()], ElemValue::default());
    if second {
        pods.elements
            .insert(vec![v4("10.128.5.3").into()], ElemValue::default());
    }
    t.add_set(pods);
    let mut vmap = Set::new("in-v6", vec![DataType::Ipv6Addr], SetKind::VerdictMap);
    vmap.insert_mapping(
        vec![v6("fd01:5::2").into()],
        ElemData::Verdict(Verdict::Goto("pol".into())),
    );
    t.add_set(vmap);
    let tuple = vec![
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
        DataType::Ipv4Addr,
        DataType::InetService,
    ];
    t.add_set(
        Set::new("replies-v4", tuple, SetKind::Set)
            .with_flags(SetFlags {
                timeout: true,
                dynamic: true,
                ..Default::default()
            })
            .with_timeout(120),
    );
    // Fragments: first fragments of accepted packets record the address pair, later
    // fragments (no ports) pass by it.
    let frags = |name: &str, addr: DataType| {
        Set::new(name, vec![addr, addr], SetKind::Set)
            .with_flags(SetFlags {
                timeout: true,
                dynamic: true,
                ..Default::default()
            })
            .with_timeout(30)
    };
    t.add_set(frags("frags-v4", DataType::Ipv4Addr));
    let frag_off = |mask: u16, value: u16, eq: bool| {
        Stmt::Match(Match {
            key: vec![Field::Ip4FragOff],
            op: MatchOp::Masked {
                mask: Value::Port(mask),
                value: Value::Port(value),
                eq,
            },
        })
    };
    let pair = vec![Field::Ip4Saddr, Field::Ip4Daddr];
    let pair6 = vec![Field::Ip6Saddr, Field::Ip6Daddr];
    t.add_set(frags("frags-v6", DataType::Ipv6Addr));
    let frag6 = |offset: u16, eq: bool| {
        let v = vec![Value::Port(offset)];
        Stmt::Match(Match {
            key: vec![Field::Ip6FragOff],
            op: if eq { MatchOp::Eq(v) } else { MatchOp::Ne(v) },
        })
    };
    let mut frags = Chain::regular("frags");
    frags
        .push(Rule::new(vec![
            frag_off(0x1fff, 0, false),
            Stmt::in_set(pair.clone(), "frags-v4"),
            Stmt::Verdict(Verdict::Accept),
        ]))
        .push(Rule::new(vec![
            frag_off(0x3fff, 0x2000, true),
            Stmt::SetUpdate {
                set: "frags-v4".into(),
                key: pair,
                timeout: None,
            },
        ]))
        .push(Rule::new(vec![
            frag6(0, false),
            Stmt::in_set(pair6.clone(), "frags-v6"),
            Stmt::Verdict(Verdict::Accept),
        ]))
        .push(Rule::new(vec![
            Stmt::in_set(pair6.clone(), "frags-v6"),
            frag6(0, true),
            Stmt::SetUpdate {
                set: "frags-v6".into(),
                key: pair6,
                timeout: None,
            },
        ]))
        .push(Rule::new(vec![
            frag6(185, true),
            Stmt::Verdict(Verdict::Drop),
        ]));
    t.add_chain(frags);
    let mut pol = Chain::regular("pol");
    pol.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(6)),
        Stmt::matches(Field::ThDport, Value::Port(80)),
        Stmt::Verdict(Verdict::Accept),
    ]))
    .push(Rule::new(vec![Stmt::Verdict(Verdict::Drop)]));
    t.add_chain(pol);
    let mut fwd = Chain::base(
        "forward",
        base(ChainType::Filter, Hook::Forward, 0, Policy::Accept),
    );
    let (l4, sp, dp) = (Field::L4Proto, Field::ThSport, Field::ThDport);
    fwd.push(Rule::new(vec![
        Stmt::in_set(
            vec![Field::Ip4Saddr, l4, sp, Field::Ip4Daddr, dp],
            "replies-v4",
        ),
        Stmt::Verdict(Verdict::Accept),
    ]))
    .push(Rule::new(vec![
        Stmt::SetUpdate {
            set: "replies-v4".into(),
            key: vec![Field::Ip4Daddr, l4, dp, Field::Ip4Saddr, sp],
            timeout: Some(120),
        },
        Stmt::in_set(vec![Field::Ip4Saddr], "pods-v4"),
        Stmt::Verdict(Verdict::Accept),
    ]))
    .push(Rule::new(vec![Stmt::Vmap {
        key: vec![Field::Ip6Daddr],
        map: MapRef::Named("in-v6".into()),
    }]));
    t.add_chain(fwd);
    t
}

#[test]
fn a_bridge_table_is_what_nft_makes_of_its_text_and_reads_back_unchanged() {
    let mut lab = Lab::new();
    let (ours, theirs) = (lab.add_host("ours"), lab.add_host("theirs"));
    // An inet table of the same name: the bridge table's engine never touches it.
    nft_apply(
        &ours,
        &format!("table inet {T} {{\n\tchain c {{\n\t}}\n}}\n"),
    );
    let inet_before = ours.nft(&["list", "table", "inet", T]).unwrap();
    let text = render_full(&bridge_table(true));
    assert!(text.starts_with(&format!("table bridge {T}\n")), "{text}");
    nft_apply(&theirs, &text);
    ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        engine.sync(bridge_table(false)).expect("create");
        engine.sync(bridge_table(true)).expect("diff");
        engine.invalidate();
        let again = engine.sync(bridge_table(true)).expect("read back");
        assert_eq!(
            again.ops, 0,
            "the read-back must judge the bridge table unchanged"
        );
    });
    let (a, b) = (
        listing::bytecode_of(&ours, "bridge", T),
        listing::bytecode_of(&theirs, "bridge", T),
    );
    assert_eq!(a, b, "{}", listing::first_difference(&a, &b));
    assert_eq!(
        listing::json_of(&ours, "bridge", T),
        listing::json_of(&theirs, "bridge", T)
    );
    assert_eq!(
        ours.nft(&["list", "table", "inet", T]).unwrap(),
        inet_before
    );
    ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        engine.delete_table(Family::Bridge, T).expect("delete");
    });
    assert!(ours.nft(&["list", "table", "bridge", T]).is_err());
    assert_eq!(
        ours.nft(&["list", "table", "inet", T]).unwrap(),
        inet_before
    );
}
