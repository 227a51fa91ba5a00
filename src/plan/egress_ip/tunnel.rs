//! The tunnel between nodes: the VXLAN device `np-eip` with its peers, MACs and gateways (all
//! derived from the Node objects), whether a hosting node can be reached through it, the
//! `ip rule`s and routing tables that send steered packets into it and let packets arriving
//! through it pass the reverse-path check, and the nftables guard that keeps anything but
//! node-to-node traffic out of it.

use super::{
    Entry, MARK_MASK, RETURN_RULE_PRIORITY, RETURN_TABLE, STEER_RULE_PRIORITY, STEER_TABLE_BASE,
    TUNNEL_DEV, TUNNEL_PORT, TUNNEL_VNI, TUNNELED, mark,
};
use crate::config::Config;
use crate::net::{Family, NetDesired, NextHop, RouteSpec, RuleSpec, TunnelPeer, TunnelSpec};
use crate::nft::ir::*;
use crate::plan::base::sets;
use crate::snapshot::{self, Snapshot};
use ipnet::IpNet;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

/// Tunnel MACs are `0a:6e` + 4 bytes of the node's underlay address: locally administered,
/// unicast, and computable by every node from the Node objects alone.
const MAC_PREFIX: [u8; 2] = [0x0a, 0x6e];

/// Whether this node (tunnel source `local`) can steer `fam` traffic to `host`, else why not.
pub(super) fn reach(
    snapshot: &Snapshot,
    local: Option<IpAddr>,
    host: &str,
    fam: Family,
) -> Result<(), String> {
    let Some(local) = local else {
        return Err("this node has no InternalIP to send the tunnel from".into());
    };
    let version = if local.is_ipv4() { "IPv4" } else { "IPv6" };
    if snapshot.node(host).is_none() {
        return Err(format!("there is no Node {host}"));
    }
    match underlay(snapshot, host) {
        Some(a) if a.is_ipv4() == local.is_ipv4() => {}
        _ => return Err(format!("node {host} has no {version} InternalIP")),
    }
    if fam == Family::V4 && gateway4(snapshot, host).is_none() {
        return Err(format!("node {host} has no IPv4 address"));
    }
    Ok(())
}

/// This node's underlay address: its first InternalIP (IPv4 preferred).
pub(super) fn underlay(snapshot: &Snapshot, node: &str) -> Option<IpAddr> {
    let ips = snapshot::node_internal_ips(snapshot.node(node)?);
    ips.iter().find(|ip| ip.is_ipv4()).or(ips.first()).copied()
}

/// The tunnel MAC every node computes for `underlay`.
pub fn tunnel_mac(underlay: IpAddr) -> [u8; 6] {
    let tail: [u8; 4] = match underlay {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [
        MAC_PREFIX[0],
        MAC_PREFIX[1],
        tail[0],
        tail[1],
        tail[2],
        tail[3],
    ]
}

/// IPv6 gateway on the tunnel for a peer: a link-local address derived from its MAC (only a
/// neighbour-table key: nobody owns it).
pub fn tunnel_gateway6(mac: [u8; 6]) -> Ipv6Addr {
    let seg = |a: u8, b: u8| u16::from_be_bytes([a, b]);
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        0,
        seg(mac[0], mac[1]),
        seg(mac[2], mac[3]),
        seg(mac[4], mac[5]),
    )
}

/// IPv4 gateway on the tunnel for a peer: its first IPv4 node address (onlink).
fn gateway4(snapshot: &Snapshot, node: &str) -> Option<IpAddr> {
    let n = snapshot.node(node)?;
    let internal = snapshot::node_internal_ips(n);
    let all = snapshot::node_ips(n);
    internal.into_iter().chain(all).find(IpAddr::is_ipv4)
}

/// The tunnel exists on every node while some EgressIP IP is hosted somewhere (hosting nodes
/// receive on it, others send on it); peers are the hosting nodes this node steers to.
pub(super) fn tunnel_spec(
    snapshot: &Snapshot,
    node: &str,
    entries: &[Entry],
    groups: &[(Vec<String>, BTreeSet<Family>)],
) -> Option<TunnelSpec> {
    if entries.iter().all(|e| e.hosted.is_empty()) {
        return None;
    }
    let local = underlay(snapshot, node)?;
    let mut peers = BTreeSet::new();
    let names: BTreeSet<&String> = groups.iter().flat_map(|(n, _)| n).collect();
    for name in names {
        let Some(addr) = underlay(snapshot, name).filter(|a| a.is_ipv4() == local.is_ipv4()) else {
            continue;
        };
        let mac = tunnel_mac(addr);
        let mut gateways: Vec<IpAddr> = gateway4(snapshot, name).into_iter().collect();
        gateways.push(tunnel_gateway6(mac).into());
        peers.insert(TunnelPeer {
            underlay: addr,
            mac,
            gateways,
        });
    }
    Some(TunnelSpec {
        name: TUNNEL_DEV.into(),
        vni: TUNNEL_VNI,
        port: TUNNEL_PORT,
        local,
        mac: tunnel_mac(local),
        peers,
    })
}

/// [`RETURN_TABLE`] and its rule (IPv4: IPv6 has no reverse-path filter in routing).
pub(super) fn return_routing(config: &Config, tunnel: &TunnelSpec, net: &mut NetDesired) {
    let cidrs: Vec<IpNet> = config
        .cluster_cidrs
        .iter()
        .filter(|c| c.addr().is_ipv4())
        .copied()
        .collect();
    if cidrs.is_empty() {
        return;
    }
    for dst in cidrs {
        net.routes.insert(RouteSpec {
            table: RETURN_TABLE,
            dst,
            nexthops: vec![NextHop {
                via: None,
                dev: Some(tunnel.name.clone()),
                weight: 1,
                onlink: false,
            }],
            local: false,
        });
    }
    net.rules.insert(RuleSpec {
        priority: RETURN_RULE_PRIORITY,
        fwmark: Some((TUNNELED, TUNNELED)),
        from: None,
        table: RETURN_TABLE,
        family: Family::V4,
    });
}

/// The rule and multipath default route(s) of steering group `n`.
pub(super) fn steer_routing(
    snapshot: &Snapshot,
    tunnel: &TunnelSpec,
    n: usize,
    nodes: &[String],
    families: &BTreeSet<Family>,
    net: &mut NetDesired,
) {
    let table = STEER_TABLE_BASE + n as u32;
    for family in families {
        let mut nexthops = Vec::new();
        for name in nodes {
            let Some(addr) = underlay(snapshot, name) else {
                continue;
            };
            let peer = tunnel.peers.iter().find(|p| p.underlay == addr);
            let Some(peer) = peer else { continue };
            let via = peer
                .gateways
                .iter()
                .find(|g| Family::of(g) == *family)
                .copied();
            if let Some(via) = via {
                nexthops.push(NextHop {
                    via: Some(via),
                    dev: Some(tunnel.name.clone()),
                    weight: 1,
                    onlink: via.is_ipv4(),
                });
            }
        }
        if nexthops.is_empty() {
            continue;
        }
        let dst: IpNet = match family {
            Family::V4 => "0.0.0.0/0".parse().expect("valid"),
            Family::V6 => "::/0".parse().expect("valid"),
        };
        net.routes.insert(RouteSpec {
            table,
            dst,
            nexthops,
            local: false,
        });
        net.rules.insert(RuleSpec {
            priority: STEER_RULE_PRIORITY,
            fwmark: Some((mark(n), MARK_MASK)),
            from: None,
            table,
            family: *family,
        });
    }
}

/// The tunnel carries packets between nodes only. A node's own tunnel packets leave from the
/// output path; so any tunnel packet this node would forward to a node (a pod's, whatever
/// its CNI's masquerade later makes its source) is dropped, and one to this node must come
/// from a node address. Otherwise a pod or a host on the segment could have a hosting node
/// decapsulate an inner packet with another tenant's source and SNAT it to that tenant's
/// egress IP (the tunnel is exempt from the source checks).
pub(super) fn tunnel_guard() -> Vec<Rule> {
    let udp = || Stmt::matches(Field::L4Proto, Value::Proto(17));
    let port = || Stmt::matches(Field::ThDport, Value::Port(TUNNEL_PORT));
    let local = |eq: bool| {
        let value = vec![Value::AddrType(AddrType::Local)];
        Stmt::Match(Match {
            key: vec![Field::FibDaddrType],
            op: if eq {
                MatchOp::Eq(value)
            } else {
                MatchOp::Ne(value)
            },
        })
    };
    let drop = |mut stmts: Vec<Stmt>, why: &str| {
        stmts.extend([Stmt::Counter, Stmt::Verdict(Verdict::Drop)]);
        Rule::new(stmts).with_comment(why)
    };
    [
        (Field::Ip4Saddr, Field::Ip4Daddr, sets::NODE_IPS_V4),
        (Field::Ip6Saddr, Field::Ip6Daddr, sets::NODE_IPS_V6),
    ]
    .into_iter()
    .flat_map(|(saddr, daddr, nodes)| {
        [
            drop(
                vec![
                    udp(),
                    port(),
                    Stmt::in_set(vec![daddr], nodes),
                    local(false),
                ],
                "EgressIP tunnel: only nodes send to a node's tunnel",
            ),
            drop(
                vec![
                    udp(),
                    port(),
                    local(true),
                    Stmt::not_in_set(vec![saddr], nodes),
                ],
                "EgressIP tunnel: only from a node address",
            ),
        ]
    })
    .collect()
}
