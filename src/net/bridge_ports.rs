//! The ports of the node's Linux bridges and the addresses behind them, read from the kernel
//! (read-only) for NetworkPolicy's binding of bridged pods' addresses to their ports.
//!
//! What a port stands for is taken from the kernel's own pairing, not from anything a pod
//! sends: a veth port's peer (`IFLA_LINK` in the netns `IFLA_LINK_NETNSID`) is the pod's
//! interface, and the addresses on it (read in that netns with `IFA_TARGET_NETNSID`) are the
//! ones its CNI configured. The neighbour and FDB tables are not used: a pod writes them with
//! gratuitous ARP / NA and frames from a spoofed MAC.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use rtnetlink::Handle;

use super::NetError;
use super::dump::dump;

/// A port of a Linux bridge of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgePort {
    /// The port's interface name (what `meta iifname` / `oifname` give in the bridge family).
    pub name: String,
    /// The bridge it is a port of.
    pub bridge: String,
    /// The addresses on the port's veth peer in another network namespace; `None` when the
    /// port is not such a veth (a tap, a physical NIC, a veth whose peer is in the node's
    /// netns): nothing tells what is behind it.
    pub peer_addrs: Option<Vec<IpAddr>>,
}

/// Every bridge port of the node, and the bridges' own subnets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgePorts {
    pub ports: Vec<BridgePort>,
    /// (bridge, subnet of an address on it): a pod address inside one is a bridged pod's.
    pub subnets: Vec<(String, IpNet)>,
}

struct LinkFacts {
    name: String,
    kind: Option<InfoKind>,
    master: Option<u32>,
    peer: Option<u32>,
    peer_netns: Option<i32>,
}

fn link_facts(msg: &LinkMessage) -> LinkFacts {
    let mut facts = LinkFacts {
        name: format!("if{}", msg.header.index),
        kind: None,
        master: None,
        peer: None,
        peer_netns: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => facts.name = n.clone(),
            LinkAttribute::Controller(m) => facts.master = Some(*m),
            LinkAttribute::Link(p) => facts.peer = Some(*p),
            LinkAttribute::LinkNetNsId(id) => facts.peer_netns = Some(*id),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    if let LinkInfo::Kind(k) = info {
                        facts.kind = Some(k.clone());
                    }
                }
            }
            _ => {}
        }
    }
    facts
}

/// (interface index, address, prefix length) of an address message.
fn address(msg: &AddressMessage) -> Option<(u32, IpAddr, u8)> {
    let mut addr = None;
    for attr in &msg.attributes {
        match attr {
            // IPv4: IFA_LOCAL is the interface's own address (IFA_ADDRESS the peer's on a
            // point-to-point link); IPv6 has only IFA_ADDRESS.
            AddressAttribute::Local(a) => addr = Some(*a),
            AddressAttribute::Address(a) if addr.is_none() => addr = Some(*a),
            _ => {}
        }
    }
    Some((msg.header.index, addr?, msg.header.prefix_len))
}

async fn addresses(
    handle: &Handle,
    netns: Option<i32>,
) -> Result<Vec<(u32, IpAddr, u8)>, NetError> {
    let mut req = AddressMessage::default();
    if let Some(id) = netns {
        req.attributes.push(AddressAttribute::TargetNetNsId(id));
    }
    let replies = dump(handle, "addresses", RouteNetlinkMessage::GetAddress(req)).await?;
    let mut out = Vec::new();
    for m in &replies {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        // A kernel that ignored the target (no strict checking on the socket) would answer
        // with the node's own addresses: every answer must name the netns asked for.
        if let Some(id) = netns
            && !a.attributes.contains(&AddressAttribute::TargetNetNsId(id))
        {
            return Err(NetError::Netlink {
                what: format!("addresses of netns id {id}"),
                reason: "the kernel answered without IFA_TARGET_NETNSID".into(),
            });
        }
        out.extend(address(a));
    }
    Ok(out)
}

/// What is behind each veth port, by (port ifindex, peer netns id, peer ifindex), as last
/// read. A re-created port has a new ifindex; entries of ports gone are dropped at each read.
#[derive(Debug, Default)]
pub struct PeerCache(BTreeMap<(u32, i32, u32), Vec<IpAddr>>);

/// Reads the bridges, their ports and what is behind each: one link dump and one address
/// dump of the node per call, plus one per peer netns whose port must be read again. `pods`
/// are the addresses of each of the node's pods (from the API, which lists them once the CNI
/// has configured them all): a port read before is read again only while what it had then
/// holds none of them or only part of a pod's. So a sync costs O(links), not a dump per pod,
/// and an address a pod adds to its own interface later is not seen (it could only be a
/// claim on a neighbour's address).
pub async fn read(
    handle: &Handle,
    cache: &mut PeerCache,
    pods: &[Vec<IpAddr>],
) -> Result<BridgePorts, NetError> {
    let complete = |addrs: &Vec<IpAddr>| {
        let mut owners = pods.iter().filter(|p| p.iter().any(|a| addrs.contains(a)));
        let mut any = false;
        let all = owners.all(|p| {
            any = true;
            p.iter().all(|a| addrs.contains(a))
        });
        any && all
    };
    let links = dump(
        handle,
        "links",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )
    .await?;
    let links: BTreeMap<u32, LinkFacts> = links
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some((l.header.index, link_facts(l))),
            _ => None,
        })
        .collect();
    let bridges: BTreeMap<u32, &str> = links
        .iter()
        .filter(|(_, l)| l.kind == Some(InfoKind::Bridge))
        .map(|(i, l)| (*i, l.name.as_str()))
        .collect();
    let mut out = BridgePorts::default();
    let mut seen = BTreeMap::new();
    if bridges.is_empty() {
        cache.0 = seen;
        return Ok(out);
    }
    for (index, addr, prefix) in addresses(handle, None).await? {
        if let (Some(bridge), Ok(net)) = (bridges.get(&index), IpNet::new(addr, prefix)) {
            out.subnets.push((bridge.to_string(), net.trunc()));
        }
    }
    let mut peers_by_netns: BTreeMap<i32, Vec<(u32, IpAddr)>> = BTreeMap::new();
    for (index, link) in &links {
        let Some(bridge) = link.master.and_then(|m| bridges.get(&m)) else {
            continue;
        };
        let peer = match (&link.kind, link.peer, link.peer_netns) {
            (Some(InfoKind::Veth), Some(peer), Some(netns)) => Some((*index, netns, peer)),
            _ => None,
        };
        let peer_addrs = match peer {
            Some(key) => {
                let addrs = match cache.0.get(&key).filter(|a| complete(a)) {
                    Some(addrs) => addrs.clone(),
                    None => {
                        let (_, netns, peer) = key;
                        if let Entry::Vacant(e) = peers_by_netns.entry(netns) {
                            let all = addresses(handle, Some(netns)).await?;
                            e.insert(all.into_iter().map(|(i, a, _)| (i, a)).collect());
                        }
                        let on_peer = peers_by_netns[&netns].iter().filter(|(i, _)| *i == peer);
                        on_peer.map(|(_, a)| *a).collect()
                    }
                };
                seen.insert(key, addrs.clone());
                Some(addrs)
            }
            None => None,
        };
        out.ports.push(BridgePort {
            name: link.name.clone(),
            bridge: bridge.to_string(),
            peer_addrs,
        });
    }
    cache.0 = seen;
    Ok(out)
}
