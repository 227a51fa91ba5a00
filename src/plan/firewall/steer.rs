//! Steering of pod DNS to the agent's transparent proxy, for the pods whose namespace's
//! EgressFirewall has `dnsName` rules (and only those).
//!
//! `fw-dns-steer` (filter, prerouting, mangle priority) holds, per family and protocol,
//! `ip saddr @fw-dns-pods-v4 ip daddr @fw-dns-resolvers-v4 meta l4proto udp th dport 53
//! tproxy ip to :PORT meta mark set meta mark or MARK accept`. Only DNS to a trusted resolver
//! ([`trusted_resolvers`]) is steered: DNS to any other address is ordinary traffic that the
//! EgressFirewall and NetworkPolicy judge, and a server a pod picks never teaches anything. The kernel hands such a packet to the transparent socket at
//! PORT *if one exists*; otherwise the `tproxy` expression ends the rule without a match and
//! the packet goes to its server unchanged. So while the agent is absent (restarting, crashed)
//! pod DNS goes direct without any rule change. The mark selects the `ip rule` whose table
//! has `local default dev lo`, which delivers the steered packet to the local socket.
//! Before those, a rate limit per input interface and source address (`fw-dns-rate-v4/v6`)
//! drops what a pod sends beyond `--dns-rate-limit`.

use super::learning::Learning;
use crate::config::DnsProxySettings;
use crate::net::{Family, NetDesired, NextHop, RouteSpec, RuleSpec};
use crate::nft::ir::*;
use crate::snapshot::Snapshot;
use std::collections::BTreeSet;
use std::net::IpAddr;

pub const CHAIN: &str = "fw-dns-steer";
pub const PODS_V4: &str = "fw-dns-pods-v4";
pub const PODS_V6: &str = "fw-dns-pods-v6";
pub const RESOLVERS_V4: &str = "fw-dns-resolvers-v4";
pub const RESOLVERS_V6: &str = "fw-dns-resolvers-v6";
/// The per-pod rate buckets of steered DNS, keyed `iifname . ip saddr`.
pub const RATE_V4: &str = "fw-dns-rate-v4";
pub const RATE_V6: &str = "fw-dns-rate-v6";
/// A bucket idle this long is forgotten (it is full again by then anyway).
const RATE_IDLE_SECS: u32 = 60;
/// The most buckets per family (the kernel's default for dynamic sets, made explicit). Keys
/// are bounded anyway (a steered pod's address, on an interface of the node); a key the
/// full set cannot take is not limited (the namespace's in-flight share still is).
const RATE_SET_SIZE: u32 = 65_535;
/// The cluster DNS Services (upstream, then OpenShift) whose ClusterIPs are trusted by default.
pub const CLUSTER_DNS: [(&str, &str); 2] = [
    ("kube-system", "kube-dns"),
    ("openshift-dns", "dns-default"),
];
/// The mark bit of steered packets (EgressIP uses 0x00ff0000, services 0x4000).
pub const MARK: u32 = 0x0100_0000;
/// The routing table with the local default route, and its `ip rule` priority (before the
/// EgressIP rules at 7100).
pub const ROUTE_TABLE: u32 = 7053;
pub const RULE_PRIORITY: u32 = 7053;
const DNS_PORT: u16 = 53;

/// The resolvers whose answers are learned: `--dns-resolvers` when given, else the cluster
/// DNS Services' ClusterIPs and the nameservers of `--resolv-conf`.
pub fn trusted_resolvers(snapshot: &Snapshot, settings: &DnsProxySettings) -> BTreeSet<IpAddr> {
    if !settings.resolvers.is_empty() {
        return settings.resolvers.iter().copied().collect();
    }
    let mut out: BTreeSet<IpAddr> = settings.resolv_conf_nameservers.iter().copied().collect();
    for (ns, name) in CLUSTER_DNS {
        let Some(svc) = snapshot.service(ns, name) else {
            continue;
        };
        let spec = svc.spec.as_ref();
        let ips = spec.and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
        let single = spec.and_then(|s| s.cluster_ip.clone());
        out.extend(
            ips.iter()
                .chain(single.iter())
                .filter_map(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    out
}

/// Adds the steering chain, the pods' sets and the policy routing, when some local pod's
/// namespace has `dnsName` rules.
///
/// With `rate_limit` (packets per second, also the burst), each family's steering rules
/// are preceded by one that drops what a pod sends beyond it (UDP queries and TCP
/// connection openings), counted per input interface and source address: a pod that forges
/// its neighbour's address spends its own bucket (its interface), not the neighbour's.
pub fn plan(
    learning: &Learning,
    proxy_port: u16,
    rate_limit: u32,
    table: &mut Table,
    net: &mut NetDesired,
) {
    if learning.is_empty() {
        return;
    }
    let mut chain = Chain::base(
        CHAIN,
        BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Prerouting,
            priority: priority::MANGLE,
            policy: Policy::Accept,
        },
    );
    for (family, saddr, daddr, set, resolvers_set, rate_set, key) in [
        (
            IpFamily::V4,
            Field::Ip4Saddr,
            Field::Ip4Daddr,
            PODS_V4,
            RESOLVERS_V4,
            RATE_V4,
            DataType::Ipv4Addr,
        ),
        (
            IpFamily::V6,
            Field::Ip6Saddr,
            Field::Ip6Daddr,
            PODS_V6,
            RESOLVERS_V6,
            RATE_V6,
            DataType::Ipv6Addr,
        ),
    ] {
        let mut pods = Set::new(set, vec![key], SetKind::Set);
        for pod in learning.pods().filter(|p| IpFamily::of(*p) == family) {
            pods.insert(vec![Value::ip(pod).into()]);
        }
        let mut resolvers = Set::new(resolvers_set, vec![key], SetKind::Set);
        for r in learning
            .resolvers()
            .iter()
            .filter(|r| IpFamily::of(**r) == family)
        {
            resolvers.insert(vec![Value::ip(*r).into()]);
        }
        // A family no steered pod or no trusted resolver has gets no rules, set or routing.
        if pods.elements.is_empty() || resolvers.elements.is_empty() {
            continue;
        }
        table.add_set(pods);
        table.add_set(resolvers);
        let steered = |proto: u8| {
            vec![
                Stmt::in_set(vec![saddr], set),
                Stmt::in_set(vec![daddr], resolvers_set),
                Stmt::matches(Field::L4Proto, Value::Proto(proto)),
                Stmt::matches(Field::ThDport, Value::Port(DNS_PORT)),
            ]
        };
        if rate_limit > 0 {
            table.add_set(
                Set::new(rate_set, vec![DataType::IfName, key], SetKind::Set)
                    .with_flags(SetFlags {
                        timeout: true,
                        dynamic: true,
                        ..Default::default()
                    })
                    .with_timeout(RATE_IDLE_SECS)
                    .with_size(RATE_SET_SIZE),
            );
            let over = Stmt::SetLimit {
                set: rate_set.into(),
                key: vec![Field::IifName, saddr],
                limit: Limit {
                    per_second: rate_limit,
                    burst: rate_limit,
                },
            };
            let mut udp = steered(proto::UDP);
            udp.extend([over.clone(), Stmt::Verdict(Verdict::Drop)]);
            chain.push(Rule::new(udp));
            // TCP: connection openings only (a long answer's ACKs are not queries).
            let mut tcp = steered(proto::TCP);
            tcp.extend([
                Stmt::Match(Match {
                    key: vec![Field::TcpFlags],
                    op: MatchOp::Masked {
                        mask: Value::TcpFlags(tcp_flags::SYN | tcp_flags::ACK),
                        value: Value::TcpFlags(tcp_flags::SYN),
                        eq: true,
                    },
                }),
                over,
                Stmt::Verdict(Verdict::Drop),
            ]);
            chain.push(Rule::new(tcp));
        }
        for proto in [proto::UDP, proto::TCP] {
            let mut stmts = steered(proto);
            stmts.extend([
                Stmt::Tproxy {
                    family,
                    port: proxy_port,
                },
                Stmt::MarkOr(MARK),
                Stmt::Verdict(Verdict::Accept),
            ]);
            chain.push(Rule::new(stmts));
        }
        let (net_family, any) = match family {
            IpFamily::V4 => (Family::V4, "0.0.0.0/0"),
            IpFamily::V6 => (Family::V6, "::/0"),
        };
        net.rules.insert(RuleSpec {
            priority: RULE_PRIORITY,
            fwmark: Some((MARK, MARK)),
            from: None,
            table: ROUTE_TABLE,
            family: net_family,
        });
        net.routes.insert(RouteSpec {
            table: ROUTE_TABLE,
            dst: any.parse().expect("valid"),
            nexthops: vec![NextHop {
                via: None,
                dev: Some("lo".into()),
                weight: 1,
                onlink: false,
            }],
            local: true,
        });
    }
    table.add_chain(chain);
}
