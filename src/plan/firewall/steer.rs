//! Steering of pod DNS to the agent's transparent proxy, for the pods whose namespace's
//! EgressFirewall has `dnsName` rules (and only those), judged first by the same policies
//! as the query would be without the proxy.
//!
//! Four prerouting base chains, in hook order:
//! 1. `fw-dns-steer` (mangle priority, before service DNAT): a rate limit per input interface
//!    and source address (`fw-dns-rate-v4/v6`) drops what a pod sends beyond
//!    `--dns-rate-limit`; then `ip saddr @fw-dns-pods-v4 ip daddr @fw-dns-resolvers-v4 meta
//!    l4proto udp th dport 53 meta mark set meta mark or PENDING` picks the queries to a
//!    trusted resolver ([`trusted_resolvers`]). DNS to any other address is ordinary traffic
//!    that the EgressFirewall and NetworkPolicy judge, and a server a pod picks never teaches
//!    anything.
//! 2. Service DNAT (`nat-prerouting`, -100): a ClusterIP resolver becomes one of its backends.
//! 3. `fw-dns-judge` ([`JUDGE_PRIORITY`]): a pending query jumps to `fw-dispatch`, the
//!    EgressFirewall's own dispatch; NetworkPolicy adds its egress and ingress dispatch right
//!    after it, gated on the same mark (`plan::netpol`). So a query reaches the proxy only if
//!    the chains and maps that judge it in `forward` without the proxy accept it: the same
//!    rules, the same packet, after the same DNAT.
//! 4. `fw-dns-tproxy` ([`TPROXY_PRIORITY`]): `meta mark and ~PENDING`, then `tproxy to :PORT
//!    meta mark set meta mark or MARK accept`. The kernel hands the query to the transparent
//!    socket at PORT *if one exists*; otherwise the `tproxy` expression ends the rule without
//!    a match and the packet goes to its server unchanged (and `forward` judges it as
//!    always). So while the agent is absent (restarting, crashed) pod DNS goes direct without
//!    any rule change. The mark selects the `ip rule` whose table has `local default dev lo`,
//!    which delivers the steered packet to the local socket.

use super::learning::Learning;
use crate::api::Service;
use crate::config::Config;
use crate::net::{Family, NetDesired, NextHop, RouteSpec, RuleSpec};
use crate::nft::ir::*;
use crate::snapshot::{self, Snapshot};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

pub const CHAIN: &str = "fw-dns-steer";
/// The chain that sends pending queries through the EgressFirewall dispatch.
pub const JUDGE_CHAIN: &str = "fw-dns-judge";
/// The chain that hands judged queries to the proxy.
pub const TPROXY_CHAIN: &str = "fw-dns-tproxy";
/// Right after service DNAT: the judges see the backend a ClusterIP query goes to. The
/// EgressFirewall judges first, then NetworkPolicy egress and ingress (`plan::netpol`, at
/// `JUDGE_PRIORITY + 1` and `+ 2`), as on the forward hook.
pub const JUDGE_PRIORITY: i32 = priority::DSTNAT + 1;
/// After every judge.
pub const TPROXY_PRIORITY: i32 = JUDGE_PRIORITY + 3;
/// The mark bit of a query to a trusted resolver from a steered pod, from `fw-dns-steer`
/// until `fw-dns-tproxy` clears it: what the judges look at.
pub const PENDING: u32 = 0x0400_0000;
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
/// The mark bit of steered packets (EgressIP uses 0x00ff0000 and 0x02000000, services
/// 0x4000).
pub const MARK: u32 = 0x0100_0000;
/// The routing table with the local default route, and its `ip rule` priority (before the
/// EgressIP rules at 7100).
pub const ROUTE_TABLE: u32 = 7053;
pub const RULE_PRIORITY: u32 = 7053;
const DNS_PORT: u16 = 53;

/// Where the proxy may send a steered query: the trusted resolvers, and the DNS endpoints
/// of those that are a Service's ClusterIP (service DNAT picks one before the proxy sees the
/// query, and the policies judge that one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trusted {
    pub resolvers: BTreeSet<IpAddr>,
    /// Address and target port of each endpoint of a ClusterIP resolver's port 53.
    pub backends: BTreeSet<SocketAddr>,
}

/// The resolvers whose answers are learned: `--dns-resolvers` when given, else the cluster
/// DNS Services' ClusterIPs and the nameservers of `--resolv-conf`; with the endpoints of
/// those that are a Service's ClusterIP, whichever Service (found through the snapshot's
/// ClusterIP index: O(resolvers x log services), never a pass over the Services).
pub fn trusted_resolvers(snapshot: &Snapshot, config: &Config) -> Trusted {
    let settings = &config.dns_proxy;
    let resolvers: BTreeSet<IpAddr> = if settings.resolvers.is_empty() {
        let mut out: BTreeSet<IpAddr> = settings.resolv_conf_nameservers.iter().copied().collect();
        let dns_services = CLUSTER_DNS
            .iter()
            .filter_map(|(ns, name)| snapshot.service(ns, name));
        out.extend(dns_services.flat_map(|s| snapshot::service_cluster_ips(s)));
        out
    } else {
        settings.resolvers.iter().copied().collect()
    };
    let mut backends = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for r in &resolvers {
        for svc in snapshot.services_with_cluster_ip(*r) {
            // A dual-stack Service whose two ClusterIPs are both resolvers counts once.
            if seen.insert(Arc::as_ptr(svc)) {
                backends.extend(dns_endpoints(snapshot, svc));
            }
        }
    }
    Trusted {
        resolvers,
        backends,
    }
}

/// The endpoints (address, target port) of `svc`'s port 53, from its EndpointSlices (whose
/// ports name the service port they serve).
fn dns_endpoints(snapshot: &Snapshot, svc: &Service) -> Vec<SocketAddr> {
    let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
        return Vec::new();
    };
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
    let names: Vec<&Option<String>> = ports
        .into_iter()
        .flatten()
        .filter(|p| p.port == i32::from(DNS_PORT))
        .map(|p| &p.name)
        .collect();
    let mut out = Vec::new();
    for slice in snapshot.endpoint_slices_for_service(ns, name) {
        let targets: Vec<u16> = slice
            .ports
            .iter()
            .flatten()
            .filter(|p| names.contains(&&p.name))
            .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
            .collect();
        for ep in &slice.endpoints {
            for ip in ep.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
                out.extend(targets.iter().map(|port| SocketAddr::new(ip, *port)));
            }
        }
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
    let mut chain = Chain::base(CHAIN, prerouting(priority::MANGLE));
    let mut tproxy = Chain::base(TPROXY_CHAIN, prerouting(TPROXY_PRIORITY));
    for names in [FamilyNames::V4, FamilyNames::V6] {
        // A family no steered pod or no trusted resolver has gets no rules, set or routing.
        let Some((pods, resolvers)) = names.sets(learning) else {
            continue;
        };
        table.add_set(pods);
        table.add_set(resolvers);
        if rate_limit > 0 {
            names.add_rate_limit(rate_limit, table, &mut chain);
        }
        names.add_steering(proxy_port, &mut chain, &mut tproxy);
        add_local_route(names.family, net);
    }
    table.add_chain(chain);
    table.add_chain(tproxy);
    table.add_chain(judge_chain());
}

/// One family's fields, sets and key type.
struct FamilyNames {
    family: IpFamily,
    saddr: Field,
    daddr: Field,
    pods: &'static str,
    resolvers: &'static str,
    rate: &'static str,
    key: DataType,
}

impl FamilyNames {
    const V4: FamilyNames = FamilyNames {
        family: IpFamily::V4,
        saddr: Field::Ip4Saddr,
        daddr: Field::Ip4Daddr,
        pods: PODS_V4,
        resolvers: RESOLVERS_V4,
        rate: RATE_V4,
        key: DataType::Ipv4Addr,
    };
    const V6: FamilyNames = FamilyNames {
        family: IpFamily::V6,
        saddr: Field::Ip6Saddr,
        daddr: Field::Ip6Daddr,
        pods: PODS_V6,
        resolvers: RESOLVERS_V6,
        rate: RATE_V6,
        key: DataType::Ipv6Addr,
    };

    /// The family's steered pods and trusted resolvers, or `None` when either is empty.
    fn sets(&self, learning: &Learning) -> Option<(Set, Set)> {
        let mut pods = Set::new(self.pods, vec![self.key], SetKind::Set);
        for pod in learning.pods().filter(|p| IpFamily::of(*p) == self.family) {
            pods.insert(vec![Value::ip(pod).into()]);
        }
        let mut resolvers = Set::new(self.resolvers, vec![self.key], SetKind::Set);
        for r in learning
            .resolvers()
            .iter()
            .filter(|r| IpFamily::of(**r) == self.family)
        {
            resolvers.insert(vec![Value::ip(*r).into()]);
        }
        if pods.elements.is_empty() || resolvers.elements.is_empty() {
            return None;
        }
        Some((pods, resolvers))
    }

    /// The matches of a steered pod's query over `proto` to a trusted resolver.
    fn steered(&self, proto: u8) -> Vec<Stmt> {
        vec![
            Stmt::in_set(vec![self.saddr], self.pods),
            Stmt::in_set(vec![self.daddr], self.resolvers),
            Stmt::matches(Field::L4Proto, Value::Proto(proto)),
            Stmt::matches(Field::ThDport, Value::Port(DNS_PORT)),
        ]
    }

    /// The rate buckets and the rules in `chain` that drop a pod's queries (UDP) and
    /// connection openings (TCP) beyond `rate_limit` per second.
    fn add_rate_limit(&self, rate_limit: u32, table: &mut Table, chain: &mut Chain) {
        table.add_set(
            Set::new(self.rate, vec![DataType::IfName, self.key], SetKind::Set)
                .with_flags(SetFlags {
                    timeout: true,
                    dynamic: true,
                    ..Default::default()
                })
                .with_timeout(RATE_IDLE_SECS)
                .with_size(RATE_SET_SIZE),
        );
        let over = Stmt::SetLimit {
            set: self.rate.into(),
            key: vec![Field::IifName, self.saddr],
            limit: Limit {
                per_second: rate_limit,
                burst: rate_limit,
            },
        };
        let mut udp = self.steered(proto::UDP);
        udp.extend([over.clone(), Stmt::Verdict(Verdict::Drop)]);
        chain.push(Rule::new(udp));
        // TCP: connection openings only (a long answer's ACKs are not queries).
        let mut tcp = self.steered(proto::TCP);
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

    /// Per protocol: the rule in `chain` that marks a query pending, and the one in `tproxy`
    /// that hands the judged query to the proxy's socket at `proxy_port`.
    fn add_steering(&self, proxy_port: u16, chain: &mut Chain, tproxy: &mut Chain) {
        for proto in [proto::UDP, proto::TCP] {
            let mut stmts = self.steered(proto);
            stmts.push(Stmt::MarkOr(PENDING));
            chain.push(Rule::new(stmts));
            // Judged by now (a denied query is dropped): the pending bit goes, then the
            // proxy's socket, if there is one, takes the query.
            tproxy.push(Rule::new(vec![
                Stmt::matches(Field::NfProto, Value::NfProto(self.family)),
                pending(),
                Stmt::matches(Field::L4Proto, Value::Proto(proto)),
                Stmt::MarkAnd(!PENDING),
                Stmt::Tproxy {
                    family: self.family,
                    port: proxy_port,
                },
                Stmt::MarkOr(MARK),
                Stmt::Verdict(Verdict::Accept),
            ]));
        }
    }
}

/// The `ip rule` that sends `MARK`ed packets of `family` to `ROUTE_TABLE`, whose local
/// default route delivers them to the proxy's socket.
fn add_local_route(family: IpFamily, net: &mut NetDesired) {
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

/// `fw-dns-judge`: a pending query goes through the EgressFirewall dispatch.
fn judge_chain() -> Chain {
    let mut judge = Chain::base(JUDGE_CHAIN, prerouting(JUDGE_PRIORITY));
    judge.push(Rule::new(vec![
        pending(),
        Stmt::Verdict(Verdict::Jump(super::DISPATCH.into())),
    ]));
    judge
}

fn prerouting(priority: i32) -> BaseChain {
    BaseChain {
        kind: ChainType::Filter,
        hook: Hook::Prerouting,
        priority,
        policy: Policy::Accept,
    }
}

/// `meta mark & PENDING != 0`: a query to a trusted resolver from a steered pod, not yet
/// handed to the proxy.
pub fn pending() -> Stmt {
    Stmt::Match(Match {
        key: vec![Field::Mark],
        op: MatchOp::AnyFlag(PENDING),
    })
}
