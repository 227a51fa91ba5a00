//! The services' fixed objects: the chains and maps every service shares (dispatch by
//! address shard and NodePort, masquerade, the no-endpoint checks in the filter hooks) and
//! the jumps to them from the base chains; plus the objects that exist while some service
//! uses them (an address shard's chains, sets and selector elements, the address
//! frontends' backends maps). Services' parts only add elements to these.

use super::names;
use super::nodeports;
use super::pools::{self, Pool};
use crate::nft::ir::*;
use crate::plan::base::chains as base_chains;
use crate::plan::base::sets as base_sets;
use std::collections::BTreeSet;

/// The fixed chains and maps every service shares, and the jumps from the base chains.
pub(super) fn static_objects(t: &mut Table) {
    static_sets(t);
    dispatch_chain(t);
    masquerade_chains(t);
    check_chains(t);
    new_connection_checks(t);
    nat_jumps(t);
}

/// The dispatch and no-endpoint verdict maps, ClusterIP and hairpin sets, per family, and the
/// NodePort maps.
fn static_sets(t: &mut Table) {
    let verdict_map = |name: &str, key: Vec<DataType>| Set::new(name, key, SetKind::VerdictMap);
    for fam in [IpFamily::V4, IpFamily::V6] {
        let addr = DataType::addr(fam);
        t.add_set(verdict_map(names::dispatch_shards(fam), vec![addr]));
        t.add_set(verdict_map(names::check_shards(fam), vec![addr]));
        t.add_set(verdict_map(names::no_endpoints(fam), frontend_types(fam)));
        t.add_set(Set::new(
            names::hairpin(fam),
            vec![addr, addr],
            SetKind::Set,
        ));
    }
    let nodeport = vec![
        DataType::NfProto,
        DataType::InetProto,
        DataType::InetService,
    ];
    t.add_set(verdict_map(names::NODEPORTS, nodeport.clone()));
    t.add_set(verdict_map(names::NOEP_NODEPORTS, nodeport.clone()));
}

/// `svc-dispatch`: the frontend lookups, addresses by their shard's chain, then
/// (`svc-dispatch-nodeports`) NodePorts, but not on loopback.
fn dispatch_chain(t: &mut Table) {
    let mut d = Chain::regular(names::DISPATCH);
    for fam in [IpFamily::V4, IpFamily::V6] {
        d.push(Rule::new(vec![Stmt::vmap(
            vec![low_nibble_field(fam)],
            names::dispatch_shards(fam),
        )]));
    }
    d.push(Rule::new(vec![Stmt::Verdict(Verdict::Goto(
        names::DISPATCH_NODEPORTS.into(),
    ))]));
    t.add_chain(d);

    let mut n = Chain::regular(names::DISPATCH_NODEPORTS);
    // NodePorts are not offered on loopback addresses.
    n.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Ip4Daddr],
            op: MatchOp::InAnon(vec![vec![KeyPart::Prefix(
                "127.0.0.0/8".parse().expect("valid"),
            )]]),
        }),
        Stmt::Verdict(Verdict::Return),
    ]));
    n.push(Rule::new(vec![
        Stmt::matches(Field::Ip6Daddr, Value::Ipv6(std::net::Ipv6Addr::LOCALHOST)),
        Stmt::Verdict(Verdict::Return),
    ]));
    for rule in nodeports::lookups(names::NODEPORTS) {
        n.push(rule);
    }
    t.add_chain(n);
    nodeports::add_sets(t);
}

fn low_nibble_field(fam: IpFamily) -> Field {
    match fam {
        IpFamily::V4 => Field::Ip4DaddrLowNibble,
        IpFamily::V6 => Field::Ip6DaddrLowNibble,
    }
}

/// An address frontend's key: `ip daddr . meta l4proto . th dport`.
fn frontend_types(fam: IpFamily) -> Vec<DataType> {
    vec![
        DataType::addr(fam),
        DataType::InetProto,
        DataType::InetService,
    ]
}

pub(super) fn shard_part_key(s: &names::AddrShard) -> String {
    format!("svc-shard/{}-{}", names::fam_suffix(s.family), s.shard)
}

/// An address shard in use: its dispatch chain (the shard's map, then the NodePort
/// lookups, as `svc-dispatch` went on before it was sharded), its check chain (the shard's
/// ClusterIPs are rejected), and their elements in the selector maps. The shard's map and
/// set are declared at the top ([`address_shard_sets`]): services' parts fill them.
pub(super) fn shard_part(s: &names::AddrShard) -> Part {
    let daddr = Field::daddr(s.family);
    let mut part = Part::default();
    let mut d = Chain::regular(s.dispatch_chain());
    d.push(Rule::new(vec![Stmt::vmap(
        vec![daddr, Field::L4Proto, Field::ThDport],
        s.dispatch_map(),
    )]));
    d.push(Rule::new(vec![Stmt::Verdict(Verdict::Goto(
        names::DISPATCH_NODEPORTS.into(),
    ))]));
    part.add_chain(d);
    let mut c = Chain::regular(s.check_chain());
    c.push(Rule::new(vec![
        Stmt::in_set(vec![daddr], s.cluster_ips_set()),
        Stmt::Verdict(Verdict::Goto(names::REJECT.into())),
    ]));
    part.add_chain(c);
    let key = vec![KeyPart::Value(s.selector())];
    let verdict = |v| ElemData::Verdict(v);
    part.add_mapping(
        names::dispatch_shards(s.family),
        key.clone(),
        verdict(Verdict::Goto(s.dispatch_chain())),
    );
    part.add_mapping(
        names::check_shards(s.family),
        key,
        verdict(Verdict::Jump(s.check_chain())),
    );
    part
}

/// The dispatch maps and ClusterIP sets of the address shards in use.
pub(super) fn address_shard_sets(t: &mut Table, shards: &imbl::OrdMap<names::AddrShard, usize>) {
    for s in shards.keys() {
        let map = Set::new(
            s.dispatch_map(),
            frontend_types(s.family),
            SetKind::VerdictMap,
        );
        t.add_set(map);
        let addr = DataType::addr(s.family);
        t.add_set(Set::new(s.cluster_ips_set(), vec![addr], SetKind::Set));
    }
}

/// The masquerade mark, the masquerade chain (marked and hairpin packets) and the pools'
/// backend maps.
fn masquerade_chains(t: &mut Table) {
    let mut mark = Chain::regular(names::MARK_MASQ);
    mark.push(Rule::new(vec![Stmt::MarkOr(names::MASQ_BIT)]));
    t.add_chain(mark);

    let mut masq = Chain::regular(names::MASQ);
    masq.push(Rule::new(vec![
        Stmt::Match(Match {
            key: vec![Field::Mark],
            op: MatchOp::AnyFlag(names::MASQ_BIT),
        }),
        Stmt::MarkAnd(!names::MASQ_BIT),
        Stmt::Masquerade { fully_random: true },
    ]));
    for (fam, saddr, daddr) in [
        (IpFamily::V4, Field::Ip4Saddr, Field::Ip4Daddr),
        (IpFamily::V6, Field::Ip6Saddr, Field::Ip6Daddr),
    ] {
        masq.push(Rule::new(vec![
            Stmt::in_set(vec![saddr, daddr], names::hairpin(fam)),
            Stmt::Masquerade { fully_random: true },
        ]));
    }
    t.add_chain(masq);
    for set in pools::nodeport_maps() {
        t.add_set(set);
    }
}

/// The address frontends' backends maps, each declared while a pool chain in use reads it:
/// a small cluster's table shows the shards it uses, not all of them.
pub(super) fn address_backends_maps(t: &mut Table, pools: &imbl::OrdMap<Pool, usize>) {
    let maps: BTreeSet<names::BackendsMap> = pools
        .keys()
        .filter(|p| p.frontend == names::Frontend::Addr)
        .flat_map(Pool::maps)
        .collect();
    for map in maps {
        t.add_set(pools::backends_map(map));
    }
}

/// `svc-reject` and `svc-check`: new connections to a frontend without endpoints are
/// rejected, to an unknown service address dropped.
fn check_chains(t: &mut Table) {
    let frontend_key = |f: Field| vec![f, Field::L4Proto, Field::ThDport];

    let mut reject = Chain::regular(names::REJECT);
    reject.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
        Stmt::Reject(Reject::TcpReset),
    ]));
    reject.push(Rule::new(vec![Stmt::Reject(Reject::PortUnreachable)]));
    t.add_chain(reject);

    let mut check = Chain::regular(names::CHECK);
    for (f, fam) in [
        (Field::Ip4Daddr, IpFamily::V4),
        (Field::Ip6Daddr, IpFamily::V6),
    ] {
        check.push(Rule::new(vec![Stmt::vmap(
            frontend_key(f),
            names::no_endpoints(fam),
        )]));
    }
    for rule in nodeports::lookups(names::NOEP_NODEPORTS) {
        check.push(rule);
    }
    for (f, fam, cidrs) in [
        (Field::Ip4Daddr, IpFamily::V4, base_sets::SERVICE_V4),
        (Field::Ip6Daddr, IpFamily::V6, base_sets::SERVICE_V6),
    ] {
        check.push(Rule::new(vec![Stmt::vmap(
            vec![low_nibble_field(fam)],
            names::check_shards(fam),
        )]));
        check.push(Rule::new(vec![
            Stmt::in_set(vec![f], cidrs),
            Stmt::Verdict(Verdict::Drop),
        ]));
    }
    t.add_chain(check);
}

/// The filter base chains that send new connections through `svc-check`.
fn new_connection_checks(t: &mut Table) {
    let new_conn = Stmt::Match(Match {
        key: vec![Field::CtState],
        op: MatchOp::AnyFlag(ct_state::NEW),
    });
    for (name, hook) in [
        ("svc-filter-input", Hook::Input),
        ("svc-filter-forward", Hook::Forward),
        ("svc-filter-output", Hook::Output),
    ] {
        let mut c = Chain::base(
            name,
            BaseChain {
                kind: ChainType::Filter,
                hook,
                // Before the filter-priority chains (EgressFirewall), like kube-proxy.
                priority: priority::FILTER - 10,
                policy: Policy::Accept,
            },
        );
        c.push(Rule::new(vec![
            new_conn.clone(),
            Stmt::Verdict(Verdict::Jump(names::CHECK.into())),
        ]));
        t.add_chain(c);
    }
}

/// The jumps from the nat base chains to dispatch and masquerade.
fn nat_jumps(t: &mut Table) {
    for (base, target) in [
        (base_chains::NAT_PREROUTING, names::DISPATCH),
        (base_chains::NAT_OUTPUT, names::DISPATCH),
        (base_chains::NAT_POSTROUTING, names::MASQ),
    ] {
        t.chains
            .get_mut(base)
            .expect("base skeleton has the nat chains")
            .push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(target.into()))]));
    }
}
