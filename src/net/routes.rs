//! Routes in agent-owned tables: validation, canonical form, diff, and netlink messages.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteNextHop,
    RouteNextHopFlags, RouteProtocol, RouteScope, RouteType,
};

use super::{KernelLink, outside, proto_name};
use super::{KernelRoute, KernelState, NetChanges, NetConfig, NetError, NextHop, RouteSpec};

fn invalid(route: &RouteSpec, reason: impl Into<String>) -> NetError {
    NetError::Invalid {
        object: format!("route {route}"),
        reason: reason.into(),
    }
}

/// The form the kernel reports a route in: nexthops sorted, a single path has weight 1.
pub fn canonical(route: &RouteSpec) -> RouteSpec {
    let mut out = route.clone();
    out.nexthops.sort();
    if let [only] = out.nexthops.as_mut_slice() {
        only.weight = 1;
    }
    out
}

/// Checks that `route` is expressible, owned by the agent, and accepted by the kernel.
pub(crate) fn validate(route: &RouteSpec, cfg: &NetConfig) -> Result<(), NetError> {
    if let Some(tables) = outside(&cfg.route_tables, route.table) {
        return Err(invalid(
            route,
            format!(
                "table {} is outside the agent-owned tables {tables}",
                route.table
            ),
        ));
    }
    if route.dst.trunc() != route.dst {
        return Err(invalid(
            route,
            format!("host bits set (the network is {})", route.dst.trunc()),
        ));
    }
    if route.nexthops.is_empty() {
        return Err(invalid(route, "no nexthop"));
    }
    let v6 = matches!(route.dst, IpNet::V6(_));
    let mut seen = BTreeSet::new();
    for nh in &route.nexthops {
        if nh.via.is_none() && nh.dev.is_none() {
            return Err(invalid(route, "a nexthop needs `via`, `dev` or both"));
        }
        if let Some(via) = nh.via {
            if via.is_ipv6() != v6 {
                return Err(invalid(
                    route,
                    format!("gateway {via} is of the other family"),
                ));
            }
            if via.is_unspecified() || via.is_multicast() {
                return Err(invalid(route, format!("gateway {via} is not unicast")));
            }
        }
        if nh.weight == 0 {
            return Err(invalid(route, "nexthop weight must be 1-255"));
        }
        if !seen.insert((nh.via, nh.dev.as_deref())) {
            return Err(invalid(route, "the same nexthop is listed twice"));
        }
        if v6 && route.nexthops.len() > 1 && nh.via.is_none() {
            return Err(invalid(route, "IPv6 multipath nexthops need a gateway"));
        }
    }
    Ok(())
}

/// Does the kernel's route do what `want` asks? A desired nexthop without `dev` accepts the
/// device the kernel resolved. Both sides are canonical.
fn satisfied_by(want: &RouteSpec, have: &RouteSpec) -> bool {
    if want.nexthops.len() != have.nexthops.len() || want.local != have.local {
        return false;
    }
    let mut free: Vec<&NextHop> = have.nexthops.iter().collect();
    // Specific nexthops first, so that wildcards cannot steal their match.
    let mut ordered: Vec<&NextHop> = want.nexthops.iter().collect();
    ordered.sort_by_key(|nh| nh.dev.is_none());
    ordered.into_iter().all(|w| {
        let pos = free.iter().position(|h| {
            // `onlink` is how a gateway is accepted, not a property to converge on.
            h.via == w.via && h.weight == w.weight && (w.dev.is_none() || h.dev == w.dev)
        });
        pos.map(|i| free.swap_remove(i)).is_some()
    })
}

pub(crate) fn plan(
    state: &KernelState,
    desired: &BTreeSet<RouteSpec>,
    cfg: &NetConfig,
    changes: &mut NetChanges,
) -> Result<(), NetError> {
    let mut want: BTreeMap<(u32, IpNet), RouteSpec> = BTreeMap::new();
    for route in desired {
        validate(route, cfg)?;
        if want
            .insert((route.table, route.dst), canonical(route))
            .is_some()
        {
            return Err(invalid(route, "desired twice with different nexthops"));
        }
    }
    let mut have: BTreeMap<(u32, IpNet), Vec<RouteSpec>> = BTreeMap::new();
    for r in &state.routes {
        if r.proto == cfg.protocol && cfg.route_tables.contains(&r.spec.table) {
            let spec = canonical(&r.spec);
            have.entry((spec.table, spec.dst)).or_default().push(spec);
        }
    }
    for (key, route) in want {
        match have.remove(&key) {
            None => changes.routes_add.push(route),
            Some(mut present) => {
                if let Some(i) = present.iter().position(|h| satisfied_by(&route, h)) {
                    present.remove(i);
                } else {
                    // Replacing keeps the destination routed throughout.
                    present.remove(0);
                    changes.routes_replace.push(route);
                }
                changes.routes_del.extend(present);
            }
        }
    }
    changes.routes_del.extend(have.into_values().flatten());
    Ok(())
}

fn nexthop_text(nh: &NextHop) -> String {
    let mut s = String::new();
    if let Some(via) = nh.via {
        s.push_str(&format!(" via {via}"));
    }
    if let Some(dev) = &nh.dev {
        s.push_str(&format!(" dev {dev}"));
    }
    if nh.onlink {
        s.push_str(" onlink");
    }
    s
}

/// `route add 10.1.0.0/16 table 7000 proto nodeplane nexthop via 192.168.1.1 weight 1 ...`.
pub fn describe(verb: &str, route: &RouteSpec, proto: u8) -> String {
    let mut s = format!(
        "route {verb} {}{} table {} proto {}",
        if route.local { "local " } else { "" },
        route.dst,
        route.table,
        proto_name(proto)
    );
    if verb == "del" {
        return s;
    }
    match route.nexthops.as_slice() {
        [only] => s.push_str(&nexthop_text(only)),
        many => {
            for nh in many {
                s.push_str(&format!(
                    " nexthop{} weight {}",
                    nexthop_text(nh),
                    nh.weight
                ));
            }
        }
    }
    s
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn header(route: &RouteSpec, proto: u8) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = match route.dst {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    };
    msg.header.destination_prefix_length = route.dst.prefix_len();
    msg.header.table = u8::try_from(route.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    msg.header.protocol = RouteProtocol::from(proto);
    msg.attributes.push(RouteAttribute::Table(route.table));
    if route.dst.prefix_len() > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(route_address(route.dst.addr())));
    }
    msg
}

fn ifindex(route: &RouteSpec, dev: &Option<String>, links: &[KernelLink]) -> Result<u32, NetError> {
    match dev {
        None => Ok(0),
        Some(name) => links
            .iter()
            .find(|l| &l.name == name)
            .map(|l| l.index)
            .ok_or_else(|| NetError::NoDevice {
                object: format!("route {route}"),
                dev: name.clone(),
            }),
    }
}

/// `RTM_NEWROUTE` for an agent route (protocol marker, unicast, own table).
pub(crate) fn add_message(
    route: &RouteSpec,
    links: &[KernelLink],
    proto: u8,
) -> Result<RouteMessage, NetError> {
    let mut msg = header(route, proto);
    msg.header.kind = if route.local {
        RouteType::Local
    } else {
        RouteType::Unicast
    };
    let gateway_less = route.nexthops.iter().all(|nh| nh.via.is_none());
    msg.header.scope = if route.local {
        RouteScope::Host
    } else if gateway_less && route.dst.addr().is_ipv4() {
        RouteScope::Link
    } else {
        RouteScope::Universe
    };
    match route.nexthops.as_slice() {
        [only] => {
            if let Some(via) = only.via {
                msg.attributes
                    .push(RouteAttribute::Gateway(route_address(via)));
            }
            if only.dev.is_some() {
                let index = ifindex(route, &only.dev, links)?;
                msg.attributes.push(RouteAttribute::Oif(index));
            }
            if only.onlink {
                msg.header.flags |= RouteFlags::Onlink;
            }
        }
        many => {
            let mut hops = Vec::with_capacity(many.len());
            for nh in many {
                let mut hop = RouteNextHop::default();
                hop.hops = nh.weight.saturating_sub(1);
                hop.interface_index = ifindex(route, &nh.dev, links)?;
                if nh.onlink {
                    hop.flags |= RouteNextHopFlags::Onlink;
                }
                if let Some(via) = nh.via {
                    hop.attributes
                        .push(RouteAttribute::Gateway(route_address(via)));
                }
                hops.push(hop);
            }
            msg.attributes.push(RouteAttribute::MultiPath(hops));
        }
    }
    Ok(msg)
}

/// `RTM_DELROUTE` for a marked route: the whole route (all paths) at its table and destination,
/// restricted by the kernel to routes carrying `proto`.
pub(crate) fn del_message(route: &RouteSpec, proto: u8) -> RouteMessage {
    let mut msg = header(route, proto);
    msg.header.scope = RouteScope::NoWhere;
    msg.header.kind = RouteType::Unspec;
    msg
}

fn ip_of(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

/// The kernel's unicast or local route as a [`KernelRoute`]; `None` for other kinds
/// (broadcast, blackhole...) and families, which the agent never owns.
pub(crate) fn parse(msg: &RouteMessage, state: &KernelState) -> Option<KernelRoute> {
    let local = match msg.header.kind {
        RouteType::Unicast => false,
        RouteType::Local => true,
        _ => return None,
    };
    let v6 = match msg.header.address_family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut table = u32::from(msg.header.table);
    let mut dst = None;
    let mut single = NextHop {
        via: None,
        dev: None,
        weight: 1,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
    };
    let mut multipath = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(a) => dst = ip_of(a),
            RouteAttribute::Gateway(a) => single.via = ip_of(a),
            RouteAttribute::Oif(i) => single.dev = Some(state.link_name(*i)),
            RouteAttribute::MultiPath(hops) => multipath = Some(hops),
            _ => {}
        }
    }
    let unspecified: IpAddr = if v6 {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let dst = IpNet::new(
        dst.unwrap_or(unspecified),
        msg.header.destination_prefix_length,
    )
    .ok()?;
    let nexthops = match multipath {
        None => vec![single],
        Some(hops) => hops
            .iter()
            .map(|h| NextHop {
                via: h.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Gateway(g) => ip_of(g),
                    _ => None,
                }),
                dev: (h.interface_index != 0).then(|| state.link_name(h.interface_index)),
                weight: h.hops.saturating_add(1),
                onlink: h.flags.contains(RouteNextHopFlags::Onlink),
            })
            .collect(),
    };
    Some(KernelRoute {
        spec: RouteSpec {
            table,
            dst,
            nexthops,
            local,
        },
        proto: u8::from(msg.header.protocol),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(table: u32, dst: &str, hops: &[(&str, Option<&str>, u8)]) -> RouteSpec {
        RouteSpec {
            table,
            dst: dst.parse().unwrap(),
            nexthops: hops
                .iter()
                .map(|(via, dev, weight)| NextHop {
                    via: Some(via.parse().unwrap()),
                    dev: dev.map(str::to_string),
                    weight: *weight,
                    onlink: false,
                })
                .collect(),
            local: false,
        }
    }

    fn links() -> Vec<KernelLink> {
        vec![KernelLink {
            index: 2,
            name: "eth0".into(),
            mac: None,
        }]
    }

    #[test]
    fn wildcard_dev_is_satisfied_by_resolved_dev() {
        let want = canonical(&route(7000, "10.1.0.0/16", &[("192.168.1.1", None, 9)]));
        let have = canonical(&route(
            7000,
            "10.1.0.0/16",
            &[("192.168.1.1", Some("eth0"), 1)],
        ));
        assert!(satisfied_by(&want, &have));
        let other = canonical(&route(
            7000,
            "10.1.0.0/16",
            &[("192.168.1.2", Some("eth0"), 1)],
        ));
        assert!(!satisfied_by(&want, &other));
    }

    #[test]
    fn validation_names_the_route() {
        let cfg = NetConfig::default();
        let err = validate(
            &route(254, "10.1.0.0/16", &[("192.168.1.1", None, 1)]),
            &cfg,
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "route 10.1.0.0/16 table 254: table 254 is outside the agent-owned tables 7000-7999"
        );
        let err = validate(
            &route(7000, "10.1.0.1/16", &[("192.168.1.1", None, 1)]),
            &cfg,
        );
        assert!(err.unwrap_err().to_string().contains("host bits set"));
        let err = validate(
            &route(7000, "10.1.0.0/16", &[("2001:db8::1", None, 1)]),
            &cfg,
        );
        assert!(err.unwrap_err().to_string().contains("other family"));
    }

    #[test]
    fn multipath_message_round_trips() {
        let st = KernelState {
            links: links(),
            ..Default::default()
        };
        let r = canonical(&route(
            7001,
            "10.1.0.0/16",
            &[
                ("192.168.1.1", Some("eth0"), 3),
                ("192.168.1.2", Some("eth0"), 1),
            ],
        ));
        let mut msg = add_message(&r, &st.links, 0x6e).unwrap();
        assert_eq!(msg.header.table, RouteHeader::RT_TABLE_UNSPEC);
        msg.header.kind = RouteType::Unicast;
        let parsed = parse(&msg, &st).unwrap();
        assert_eq!(parsed.proto, 0x6e);
        assert_eq!(canonical(&parsed.spec), r);
    }

    #[test]
    fn unknown_device_is_reported() {
        let r = RouteSpec::out_of(7000, "10.2.0.0/16", "nope0");
        let err = add_message(&r, &links(), 0x6e).unwrap_err();
        assert_eq!(
            err.to_string(),
            "route 10.2.0.0/16 table 7000: no interface named nope0"
        );
    }
}
