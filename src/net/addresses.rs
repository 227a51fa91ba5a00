//! Addresses: interface choice (longest prefix match), diff, and netlink messages.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol,
    AddressScope,
};

use super::{
    AddressChange, AddressSpec, KernelLink, KernelState, NetChanges, NetConfig, NetError,
    proto_name,
};

/// The interface an agent address goes on: the one whose non-agent subnet contains `spec.addr`
/// with the longest prefix (ties: the interface name that sorts first). Refuses an address
/// that is already one of the node's own (non-agent) addresses.
pub fn choose_interface<'a>(
    state: &'a KernelState,
    spec: &AddressSpec,
    cfg: &NetConfig,
) -> Result<&'a KernelLink, NetError> {
    let foreign = || state.addresses.iter().filter(|a| a.proto != cfg.protocol);
    if let Some(own) = foreign().find(|a| a.addr == spec.addr) {
        return Err(NetError::OwnAddress {
            addr: spec.addr,
            dev: state.link_name(own.ifindex),
        });
    }
    let (net, link) = foreign()
        .filter_map(|a| IpNet::new(a.addr, a.prefix_len).ok().map(|net| (net, a)))
        .filter(|(net, _)| net.contains(&spec.addr))
        .filter_map(|(net, a)| state.link_by_index(a.ifindex).map(|l| (net.trunc(), l)))
        .max_by_key(|(net, link)| (net.prefix_len(), Reverse(link.name.as_str())))
        .ok_or(NetError::NoSubnet { addr: spec.addr })?;
    // The subnet's own network and broadcast addresses are nobody's to take (an EgressIP
    // equal to one would be added and answer for the whole subnet). /31, /32, /127 and /128
    // have no such addresses.
    let (max, has_broadcast) = match net {
        IpNet::V4(_) => (32, true),
        IpNet::V6(_) => (128, false),
    };
    if net.prefix_len() + 1 < max {
        let what = if spec.addr == net.network() {
            Some("network")
        } else if has_broadcast && spec.addr == net.broadcast() {
            Some("broadcast")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(NetError::SubnetAddress {
                addr: spec.addr,
                what,
                net,
                dev: link.name.clone(),
            });
        }
    }
    Ok(link)
}

fn validate(spec: &AddressSpec) -> Result<(), NetError> {
    let invalid = |reason: &str| NetError::Invalid {
        object: format!("address {spec}"),
        reason: reason.to_string(),
    };
    let max = match spec.addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    if spec.prefix_len > max {
        return Err(invalid(&format!("prefix length above {max}")));
    }
    let usable = match spec.addr {
        IpAddr::V4(a) => !(a.is_unspecified() || a.is_multicast() || a.is_broadcast()),
        IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
    };
    if !usable {
        return Err(invalid("not a unicast address"));
    }
    Ok(())
}

/// The agent's addresses present in the kernel, with their interface names.
pub(crate) fn owned(state: &KernelState, cfg: &NetConfig) -> BTreeSet<AddressChange> {
    state
        .addresses
        .iter()
        .filter(|a| a.proto == cfg.protocol)
        .map(|a| AddressChange {
            spec: AddressSpec {
                addr: a.addr,
                prefix_len: a.prefix_len,
            },
            dev: state.link_name(a.ifindex),
        })
        .collect()
}

pub(crate) fn plan(
    state: &KernelState,
    desired: &BTreeSet<AddressSpec>,
    cfg: &NetConfig,
    changes: &mut NetChanges,
) -> Result<(), NetError> {
    let mut want = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for spec in desired {
        validate(spec)?;
        if !seen.insert(spec.addr) {
            return Err(NetError::Invalid {
                object: format!("address {}", spec.addr),
                reason: "desired twice with different prefix lengths".into(),
            });
        }
        let link = match choose_interface(state, spec, cfg) {
            Ok(link) => link,
            Err(
                e @ (NetError::NoSubnet { .. }
                | NetError::OwnAddress { .. }
                | NetError::SubnetAddress { .. }),
            ) => {
                let text = e.to_string();
                let prefix = format!("address {}: ", spec.addr);
                changes.refused.push(super::Refusal {
                    addr: spec.addr,
                    reason: text.strip_prefix(&prefix).unwrap_or(&text).to_string(),
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        want.insert(AddressChange {
            spec: *spec,
            dev: link.name.clone(),
        });
    }
    let have = owned(state, cfg);
    changes
        .addresses_add
        .extend(want.difference(&have).cloned());
    changes
        .addresses_del
        .extend(have.difference(&want).cloned());
    Ok(())
}

/// `address add 192.168.50.100/32 dev eth0 proto nodeplane`.
pub fn describe(verb: &str, change: &AddressChange, proto: u8) -> String {
    let nodad = if verb == "add" && change.spec.addr.is_ipv6() {
        " nodad"
    } else {
        ""
    };
    format!(
        "address {verb} {} dev {} proto {}{nodad}",
        change.spec,
        change.dev,
        proto_name(proto)
    )
}

fn base_message(spec: &AddressSpec, ifindex: u32) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = match spec.addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.prefix_len = spec.prefix_len;
    msg.header.index = ifindex;
    msg.header.scope = AddressScope::Universe;
    if spec.addr.is_ipv4() {
        msg.attributes.push(AddressAttribute::Local(spec.addr));
    }
    msg.attributes.push(AddressAttribute::Address(spec.addr));
    msg
}

/// `RTM_NEWADDR` for an agent address: marked with `IFA_PROTO`, IPv6 without DAD.
pub(crate) fn add_message(spec: &AddressSpec, ifindex: u32, proto: u8) -> AddressMessage {
    let mut msg = base_message(spec, ifindex);
    msg.attributes
        .push(AddressAttribute::Protocol(AddressProtocol::from(proto)));
    if spec.addr.is_ipv6() {
        msg.header.flags = AddressHeaderFlags::Nodad;
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    msg
}

/// `RTM_DELADDR` for an address the planner found marked.
pub(crate) fn del_message(spec: &AddressSpec, ifindex: u32) -> AddressMessage {
    base_message(spec, ifindex)
}

/// The kernel's `RTM_NEWADDR` as a [`KernelAddress`] (`None` for multicast/anycast entries).
pub(crate) fn parse(msg: &AddressMessage) -> Option<super::KernelAddress> {
    let mut local = None;
    let mut address = None;
    let mut proto = 0;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Address(a) => address = Some(*a),
            AddressAttribute::Protocol(p) => proto = u8::from(*p),
            _ => {}
        }
    }
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on point-to-point.
    Some(super::KernelAddress {
        ifindex: msg.header.index,
        addr: local.or(address)?,
        prefix_len: msg.header.prefix_len,
        proto,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::KernelAddress;

    fn state() -> KernelState {
        let link = |index, name: &str| KernelLink {
            index,
            name: name.into(),
            mac: Some([2, 0, 0, 0, 0, index as u8]),
        };
        let addr = |ifindex, a: &str, prefix_len, proto| KernelAddress {
            ifindex,
            addr: a.parse().unwrap(),
            prefix_len,
            proto,
        };
        KernelState {
            links: vec![
                link(1, "lo"),
                link(2, "eth0"),
                link(3, "eth1"),
                link(4, "eth2"),
            ],
            addresses: vec![
                addr(1, "127.0.0.1", 8, 0),
                addr(2, "10.0.0.1", 16, 0),
                addr(3, "10.0.5.1", 24, 0),
                addr(4, "10.0.5.2", 24, 0),
                addr(2, "10.0.9.9", 32, super::super::NODEPLANE_PROTO),
            ],
            ..Default::default()
        }
    }

    fn pick(a: &str) -> Result<String, NetError> {
        let st = state();
        let spec = AddressSpec::host(a.parse().unwrap());
        choose_interface(&st, &spec, &NetConfig::default()).map(|l| l.name.clone())
    }

    #[test]
    fn longest_prefix_wins_and_ties_go_to_first_name() {
        assert_eq!(pick("10.0.7.7").unwrap(), "eth0");
        assert_eq!(pick("10.0.5.100").unwrap(), "eth1");
    }

    #[test]
    fn agent_addresses_are_not_subnets_and_own_addresses_are_refused() {
        // 10.0.9.9/32 is ours: it neither counts as a subnet nor as a node address.
        assert_eq!(pick("10.0.9.9").unwrap(), "eth0");
        let err = pick("10.0.5.2").unwrap_err();
        assert_eq!(
            err.to_string(),
            "address 10.0.5.2: it is one of the node's own addresses (on eth2)"
        );
        let err = pick("192.168.50.100").unwrap_err();
        assert_eq!(
            err.to_string(),
            "address 192.168.50.100: no interface subnet contains it"
        );
    }

    #[test]
    fn network_and_broadcast_addresses_of_the_subnet_are_refused() {
        assert_eq!(
            pick("10.0.5.0").unwrap_err().to_string(),
            "address 10.0.5.0: it is the network address of 10.0.5.0/24 (on eth1)"
        );
        assert_eq!(
            pick("10.0.255.255").unwrap_err().to_string(),
            "address 10.0.255.255: it is the broadcast address of 10.0.0.0/16 (on eth0)"
        );
        // Through the plan step it is a refusal (the EgressIP feature reports it), not an
        // error that stops the other addresses.
        let desired = BTreeSet::from([
            AddressSpec::host("10.0.5.255".parse().unwrap()),
            AddressSpec::host("10.0.5.77".parse().unwrap()),
        ]);
        let mut changes = NetChanges::default();
        plan(&state(), &desired, &NetConfig::default(), &mut changes).unwrap();
        assert_eq!(changes.refused.len(), 1, "{changes:?}");
        assert_eq!(
            changes.refused[0].reason,
            "it is the broadcast address of 10.0.5.0/24 (on eth1)"
        );
        assert_eq!(changes.addresses_add.len(), 1);
    }

    #[test]
    fn add_message_carries_marker_and_nodad() {
        let spec = AddressSpec::host("2001:db8::5".parse().unwrap());
        let msg = add_message(&spec, 7, 0x6e);
        assert!(
            msg.attributes
                .contains(&AddressAttribute::Protocol(AddressProtocol::Other(0x6e)))
        );
        assert!(
            msg.attributes
                .contains(&AddressAttribute::Flags(AddressFlags::Nodad))
        );
        let parsed = parse(&msg).unwrap();
        assert_eq!(
            (parsed.ifindex, parsed.prefix_len, parsed.proto),
            (7, 128, 0x6e)
        );
    }
}
