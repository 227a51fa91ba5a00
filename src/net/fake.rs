//! An in-memory [`NetBackend`] over a fake node (interfaces, addresses, routes, rules) that
//! follows the kernel's rules closely enough to test the planner and the reconciler: adds of
//! existing objects fail with `EEXIST`, deletes match on the protocol marker, routes and rules
//! without the marker are never touched.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;

use super::links::{OwnedLink, TunnelChanges};
use super::{
    KernelAddress, KernelLink, KernelRoute, KernelRule, KernelState, NetBackend, NetChanges,
    NetConfig, NetDesired, NetError, RouteSpec, RuleSpec, routes, rules,
};

/// A fake node. Build it with [`FakeNetBackend::with_link`] and friends.
#[derive(Debug, Clone)]
pub struct FakeNetBackend {
    pub config: NetConfig,
    pub state: KernelState,
    /// Every non-empty change set applied, in order.
    pub applied: Vec<NetChanges>,
    /// `(interface, address)` of every announcement sent.
    pub announced: Vec<(String, IpAddr)>,
    /// When set, the next `apply` fails with this reason (and changes nothing).
    pub fail_next: Option<String>,
}

fn kernel_err(object: String, op: &'static str, errno: i32) -> NetError {
    NetError::Kernel {
        object,
        op,
        source: io::Error::from_raw_os_error(errno),
    }
}

impl FakeNetBackend {
    pub fn new(config: NetConfig) -> Self {
        FakeNetBackend {
            config,
            state: KernelState::default(),
            applied: Vec::new(),
            announced: Vec::new(),
            fail_next: None,
        }
    }

    /// Adds an Ethernet interface (with a MAC derived from its index) or, for `lo`, a loopback.
    pub fn with_link(mut self, name: &str) -> Self {
        let index = self.state.links.iter().map(|l| l.index).max().unwrap_or(0) + 1;
        let mac = (name != "lo").then_some([0x02, 0, 0, 0, 0, index as u8]);
        self.state.links.push(KernelLink {
            index,
            name: name.to_string(),
            mac,
        });
        self
    }

    /// Adds a node (non-agent) address such as `"192.168.50.10/24"` to interface `dev`.
    pub fn with_address(self, dev: &str, cidr: &str) -> Self {
        self.with_marked_address(dev, cidr, 0)
    }

    /// Adds an address with an explicit `IFA_PROTO` (e.g. a leftover of the agent).
    pub fn with_marked_address(mut self, dev: &str, cidr: &str, proto: u8) -> Self {
        let net: IpNet = cidr.parse().expect("fake address: not a CIDR");
        let ifindex = self
            .state
            .link_by_name(dev)
            .expect("fake address: no such link")
            .index;
        self.state.addresses.push(KernelAddress {
            ifindex,
            addr: net.addr(),
            prefix_len: net.prefix_len(),
            proto,
        });
        self
    }

    /// Adds a route with protocol `proto` (use another protocol for a foreign route).
    pub fn with_route(mut self, spec: RouteSpec, proto: u8) -> Self {
        self.state.routes.push(KernelRoute { spec, proto });
        self
    }

    /// Adds a rule with protocol `proto`.
    pub fn with_rule(mut self, spec: RuleSpec, proto: u8) -> Self {
        self.state.rules.push(KernelRule { spec, proto });
        self
    }

    /// The addresses on `dev` as `(cidr, proto)`.
    pub fn addresses_on(&self, dev: &str) -> Vec<(String, u8)> {
        let Some(link) = self.state.link_by_name(dev) else {
            return Vec::new();
        };
        self.state
            .addresses
            .iter()
            .filter(|a| a.ifindex == link.index)
            .map(|a| (format!("{}/{}", a.addr, a.prefix_len), a.proto))
            .collect()
    }

    fn link_index(&self, object: &str, dev: &str) -> Result<u32, NetError> {
        self.state
            .link_by_name(dev)
            .map(|l| l.index)
            .ok_or_else(|| NetError::NoDevice {
                object: object.to_string(),
                dev: dev.to_string(),
            })
    }

    fn apply_addresses_add(
        &self,
        state: &mut KernelState,
        changes: &NetChanges,
    ) -> Result<Vec<(String, IpAddr)>, NetError> {
        let mut added = Vec::new();
        for a in &changes.addresses_add {
            let object = format!("address {} dev {}", a.spec.addr, a.dev);
            let ifindex = self.link_index(&object, &a.dev)?;
            if state
                .addresses
                .iter()
                .any(|k| k.ifindex == ifindex && k.addr == a.spec.addr)
            {
                return Err(kernel_err(object, "add", libc::EEXIST));
            }
            state.addresses.push(KernelAddress {
                ifindex,
                addr: a.spec.addr,
                prefix_len: a.spec.prefix_len,
                proto: changes.protocol,
            });
            if self
                .state
                .link_by_index(ifindex)
                .is_some_and(|l| l.mac.is_some())
            {
                added.push((a.dev.clone(), a.spec.addr));
            }
        }
        Ok(added)
    }

    fn apply_routes(&self, state: &mut KernelState, changes: &NetChanges) -> Result<(), NetError> {
        let key = |r: &RouteSpec| (r.table, r.dst);
        for r in changes.routes_add.iter().chain(&changes.routes_replace) {
            let object = format!("route {r}");
            // Resolving devices fails like the kernel does for an unknown interface.
            routes::add_message(r, &state.links, changes.protocol)?;
            let existing = state.routes.iter().position(|k| key(&k.spec) == key(r));
            let replace = changes.routes_replace.contains(r);
            match (existing, replace) {
                (Some(_), false) => return Err(kernel_err(object, "add", libc::EEXIST)),
                (Some(i), true) => {
                    state.routes.remove(i);
                }
                (None, _) => {}
            }
            state.routes.push(KernelRoute {
                spec: routes::canonical(r),
                proto: changes.protocol,
            });
        }
        for r in &changes.routes_del {
            if let Some(i) = state
                .routes
                .iter()
                .position(|k| key(&k.spec) == key(r) && k.proto == changes.protocol)
            {
                state.routes.remove(i);
            }
        }
        Ok(())
    }

    fn apply_rules(&self, state: &mut KernelState, changes: &NetChanges) -> Result<(), NetError> {
        let p = changes.protocol;
        for r in &changes.rules_add {
            let r = rules::canonical(r);
            if state.rules.iter().any(|k| k.spec == r && k.proto == p) {
                return Err(kernel_err(format!("rule {r}"), "add", libc::EEXIST));
            }
            state.rules.push(KernelRule { spec: r, proto: p });
        }
        for r in &changes.rules_del {
            if let Some(i) = state
                .rules
                .iter()
                .position(|k| &k.spec == r && k.proto == p)
            {
                state.rules.remove(i);
            }
        }
        Ok(())
    }
}

/// Creates the tunnel link (replacing an owned one of the same name) and adds its entries.
fn apply_tunnel_adds(state: &mut KernelState, t: &TunnelChanges) -> Result<(), NetError> {
    if let Some(spec) = &t.create {
        if t.delete.contains(&spec.name) {
            remove_link(state, &spec.name);
        }
        if state.link_by_name(&spec.name).is_some() {
            return Err(kernel_err(
                format!("link {}", spec.name),
                "add",
                libc::EEXIST,
            ));
        }
        let index = state.links.iter().map(|l| l.index).max().unwrap_or(0) + 1;
        state.links.push(KernelLink {
            index,
            name: spec.name.clone(),
            mac: Some(spec.mac),
        });
        state.owned_links.push(OwnedLink {
            index,
            name: spec.name.clone(),
            vxlan: Some((spec.vni, spec.port, Some(spec.local))),
            mac: Some(spec.mac),
            inet_conf: Some(super::links::TUNNEL_INET_CONF),
            tos_inherit: true,
        });
    }
    if let Some(dev) = &t.configure {
        match state.owned_links.iter_mut().find(|l| &l.name == dev) {
            Some(link) => link.inet_conf = Some(super::links::TUNNEL_INET_CONF),
            None => return Err(kernel_err(format!("link {dev}"), "set", libc::ENODEV)),
        }
    }
    if let Some(name) = &t.tos_inherit {
        match state.owned_links.iter_mut().find(|l| &l.name == name) {
            Some(link) => link.tos_inherit = true,
            None => {
                return Err(NetError::NoDevice {
                    object: format!("link {name}"),
                    dev: name.clone(),
                });
            }
        }
    }
    for f in &t.fdb_add {
        if state.link_by_name(&f.dev).is_none() {
            return Err(NetError::NoDevice {
                object: "fdb entry".into(),
                dev: f.dev.clone(),
            });
        }
        state
            .fdb
            .retain(|k| !(k.dev == f.dev && k.mac == f.mac && k.dst == f.dst));
        state.fdb.push(f.clone());
    }
    for n in &t.neigh_add {
        state
            .neighbours
            .retain(|k| !(k.dev == n.dev && k.ip == n.ip));
        state.neighbours.push(n.clone());
    }
    Ok(())
}

fn apply_tunnel_dels(state: &mut KernelState, t: &TunnelChanges) {
    state.fdb.retain(|k| !t.fdb_del.contains(k));
    state.neighbours.retain(|k| !t.neigh_del.contains(k));
    for name in &t.delete {
        if t.create.as_ref().is_none_or(|c| &c.name != name) {
            remove_link(state, name);
        }
    }
}

fn remove_link(state: &mut KernelState, name: &str) {
    let dev = Some(name.to_string());
    state.links.retain(|l| l.name != name);
    state.owned_links.retain(|l| l.name != name);
    state.fdb.retain(|k| k.dev != name);
    state.neighbours.retain(|k| k.dev != name);
    state
        .routes
        .retain(|r| !r.spec.nexthops.iter().any(|h| h.dev == dev));
}

impl NetBackend for FakeNetBackend {
    fn plan(&mut self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        self.state.plan(desired, &self.config)
    }

    /// All or nothing (unlike the kernel, which keeps the operations before a failure: the
    /// planner copes with both).
    fn apply(&mut self, changes: &NetChanges) -> Result<(), NetError> {
        if let Some(reason) = self.fail_next.take() {
            return Err(NetError::Netlink {
                what: "fake".into(),
                reason,
            });
        }
        if changes.is_empty() {
            return Ok(());
        }
        let mut next = self.state.clone();
        let announced = self.apply_addresses_add(&mut next, changes)?;
        apply_tunnel_adds(&mut next, &changes.tunnel)?;
        self.apply_routes(&mut next, changes)?;
        self.apply_rules(&mut next, changes)?;
        apply_tunnel_dels(&mut next, &changes.tunnel);
        next.addresses.retain(|k| {
            k.proto != changes.protocol
                || !changes.addresses_del.iter().any(|a| {
                    a.spec.addr == k.addr
                        && a.spec.prefix_len == k.prefix_len
                        && self.state.link_by_name(&a.dev).map(|l| l.index) == Some(k.ifindex)
                })
        });
        self.state = next;
        self.announced.extend(announced);
        self.applied.push(changes.clone());
        Ok(())
    }

    fn cleanup(&mut self) -> Result<NetChanges, NetError> {
        let changes = self.state.plan_cleanup(&self.config)?;
        self.apply(&changes)?;
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::net::{AddressChange, AddressSpec, Family, NODEPLANE_PROTO, NextHop};

    fn node() -> FakeNetBackend {
        FakeNetBackend::new(NetConfig::default())
            .with_link("lo")
            .with_link("eth0")
            .with_link("eth1")
            .with_address("lo", "127.0.0.1/8")
            .with_address("eth0", "192.168.0.10/16")
            .with_address("eth1", "192.168.50.10/24")
            .with_address("eth1", "2001:db8:50::10/64")
    }

    fn host(a: &str) -> AddressSpec {
        AddressSpec::host(a.parse().unwrap())
    }

    fn desired() -> NetDesired {
        NetDesired {
            addresses: [
                host("192.168.50.100"),
                host("192.168.7.7"),
                host("2001:db8:50::100"),
            ]
            .into(),
            routes: [RouteSpec {
                table: 7000,
                dst: "0.0.0.0/0".parse().unwrap(),
                nexthops: vec![
                    NextHop {
                        via: Some("192.168.50.1".parse().unwrap()),
                        dev: Some("eth1".into()),
                        weight: 2,
                        onlink: false,
                    },
                    NextHop {
                        via: Some("192.168.50.2".parse().unwrap()),
                        dev: Some("eth1".into()),
                        weight: 1,
                        onlink: false,
                    },
                ],
                local: false,
            }]
            .into(),
            rules: [RuleSpec {
                priority: 7000,
                fwmark: Some((0x6e00, 0xff00)),
                from: None,
                table: 7000,
                family: Family::V4,
            }]
            .into(),
            tunnel: None,
            bridge_pods: Vec::new(),
        }
    }

    #[test]
    fn plan_apply_is_idempotent_and_describes_itself() {
        let mut b = node();
        let changes = b.plan(&desired()).unwrap();
        assert_eq!(
            changes.describe(),
            vec![
                "address add 192.168.7.7/32 dev eth0 proto nodeplane",
                "address add 192.168.50.100/32 dev eth1 proto nodeplane",
                "address add 2001:db8:50::100/128 dev eth1 proto nodeplane nodad",
                "route add 0.0.0.0/0 table 7000 proto nodeplane \
                 nexthop via 192.168.50.1 dev eth1 weight 2 \
                 nexthop via 192.168.50.2 dev eth1 weight 1",
                "rule add priority 7000 from all fwmark 0x6e00/0xff00 lookup 7000 \
                 protocol nodeplane",
            ]
        );
        b.apply(&changes).unwrap();
        assert!(b.plan(&desired()).unwrap().is_empty());
        assert_eq!(b.announced.len(), 3);
        assert!(
            b.addresses_on("eth1")
                .contains(&("192.168.50.100/32".into(), NODEPLANE_PROTO))
        );
    }

    #[test]
    fn changed_nexthops_replace_and_stale_objects_go() {
        let mut b = node();
        let changes = b.plan(&desired()).unwrap();
        b.apply(&changes).unwrap();
        let mut d = desired();
        let mut route = d.routes.pop_first().unwrap();
        route.nexthops.truncate(1);
        d.routes.insert(route.clone());
        d.addresses.remove(&host("192.168.7.7"));
        let changes = b.plan(&d).unwrap();
        assert_eq!(changes.routes_replace, vec![routes::canonical(&route)]);
        assert_eq!(
            changes.addresses_del,
            vec![AddressChange {
                spec: host("192.168.7.7"),
                dev: "eth0".into()
            }]
        );
        assert_eq!(changes.len(), 2);
        b.apply(&changes).unwrap();
        assert!(b.plan(&d).unwrap().is_empty());
    }

    #[test]
    fn foreign_objects_are_never_touched() {
        let foreign_route = RouteSpec::out_of(7000, "10.9.0.0/16", "eth0");
        let foreign_rule = RuleSpec {
            priority: 7000,
            fwmark: None,
            from: None,
            table: 7000,
            family: Family::V4,
        };
        let mut b = node()
            .with_address("eth1", "192.168.50.11/24")
            .with_marked_address("eth1", "192.168.50.12/32", 99)
            .with_route(foreign_route.clone(), 4)
            // Ours by protocol but outside the owned tables: not ours.
            .with_route(
                RouteSpec {
                    table: 100,
                    ..foreign_route.clone()
                },
                NODEPLANE_PROTO,
            )
            .with_rule(foreign_rule, 4)
            .with_rule(
                RuleSpec {
                    priority: 100,
                    ..foreign_rule
                },
                NODEPLANE_PROTO,
            );
        let before = b.state.clone();
        b.sync(&desired()).unwrap();
        let removed = b.cleanup().unwrap();
        assert_eq!(removed.addresses_del.len(), 3);
        assert_eq!(removed.routes_del.len(), 1);
        assert_eq!(removed.rules_del.len(), 1);
        assert_eq!(b.state, before);
        assert!(b.cleanup().unwrap().is_empty());
    }

    #[test]
    fn refusals_name_the_address() {
        let mut b = node();
        let mut d = NetDesired {
            addresses: BTreeSet::from([host("192.168.50.10")]),
            ..Default::default()
        };
        let refused = |b: &mut FakeNetBackend, d: &NetDesired| {
            let changes = b.plan(d).unwrap();
            assert!(changes.addresses_add.is_empty());
            let r = &changes.refused[0];
            format!("address {}: {}", r.addr, r.reason)
        };
        assert_eq!(
            refused(&mut b, &d),
            "address 192.168.50.10: it is one of the node's own addresses (on eth1)"
        );
        d.addresses = BTreeSet::from([host("10.1.2.3")]);
        assert_eq!(
            refused(&mut b, &d),
            "address 10.1.2.3: no interface subnet contains it"
        );
    }

    #[test]
    fn address_follows_its_subnet_to_another_interface() {
        let mut b = node();
        let d = NetDesired {
            addresses: [host("192.168.50.100")].into(),
            ..Default::default()
        };
        b.sync(&d).unwrap();
        // The /24 moves from eth1 to eth0.
        b.state
            .addresses
            .retain(|a| a.addr.to_string() != "192.168.50.10");
        b = b.with_address("eth0", "192.168.50.20/24");
        let changes = b.plan(&d).unwrap();
        assert_eq!(
            changes.describe(),
            vec![
                "address add 192.168.50.100/32 dev eth0 proto nodeplane",
                "address del 192.168.50.100/32 dev eth1 proto nodeplane",
            ]
        );
        b.apply(&changes).unwrap();
        assert!(b.plan(&d).unwrap().is_empty());
    }

    #[test]
    fn failed_apply_changes_nothing() {
        let mut b = node();
        let changes = b.plan(&desired()).unwrap();
        b.fail_next = Some("boom".into());
        assert!(b.apply(&changes).is_err());
        assert_eq!(b.plan(&desired()).unwrap(), changes);
    }
}
