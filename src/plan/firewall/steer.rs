//! Steering of pod DNS to the agent's transparent proxy, for the pods whose namespace's
//! EgressFirewall has `dnsName` rules (and only those).
//!
//! `fw-dns-steer` (filter, prerouting, mangle priority) holds, per family and protocol,
//! `ip saddr @fw-dns-pods-v4 meta l4proto udp th dport 53 tproxy ip to :PORT meta mark set
//! meta mark or MARK accept`. The kernel hands such a packet to the transparent socket at
//! PORT *if one exists*; otherwise the `tproxy` expression ends the rule without a match and
//! the packet goes to its server unchanged. So while the agent is absent (restarting, crashed)
//! pod DNS goes direct without any rule change. The mark selects the `ip rule` whose table
//! has `local default dev lo`, which delivers the steered packet to the local socket.

use super::learning::Learning;
use crate::net::{Family, NetDesired, NextHop, RouteSpec, RuleSpec};
use crate::nft::ir::*;

pub const CHAIN: &str = "fw-dns-steer";
pub const PODS_V4: &str = "fw-dns-pods-v4";
pub const PODS_V6: &str = "fw-dns-pods-v6";
/// The mark bit of steered packets (EgressIP uses 0x00ff0000, services 0x4000).
pub const MARK: u32 = 0x0100_0000;
/// The routing table with the local default route, and its `ip rule` priority (before the
/// EgressIP rules at 7100).
pub const ROUTE_TABLE: u32 = 7053;
pub const RULE_PRIORITY: u32 = 7053;
const DNS_PORT: u16 = 53;

/// Adds the steering chain, the pods' sets and the policy routing, when some local pod's
/// namespace has `dnsName` rules.
pub fn plan(learning: &Learning, proxy_port: u16, table: &mut Table, net: &mut NetDesired) {
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
    for (family, saddr, set, key) in [
        (IpFamily::V4, Field::Ip4Saddr, PODS_V4, DataType::Ipv4Addr),
        (IpFamily::V6, Field::Ip6Saddr, PODS_V6, DataType::Ipv6Addr),
    ] {
        let mut pods = Set::new(set, vec![key], SetKind::Set);
        for pod in learning.pods().filter(|p| IpFamily::of(*p) == family) {
            pods.insert(vec![Value::ip(pod).into()]);
        }
        // A family no steered pod has gets no rules, set or routing.
        if pods.elements.is_empty() {
            continue;
        }
        table.add_set(pods);
        for proto in [libc::IPPROTO_UDP as u8, libc::IPPROTO_TCP as u8] {
            chain.push(Rule::new(vec![
                Stmt::in_set(vec![saddr], set),
                Stmt::matches(Field::L4Proto, Value::Proto(proto)),
                Stmt::matches(Field::ThDport, Value::Port(DNS_PORT)),
                Stmt::Tproxy {
                    family,
                    port: proxy_port,
                },
                Stmt::MarkOr(MARK),
                Stmt::Verdict(Verdict::Accept),
            ]));
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
