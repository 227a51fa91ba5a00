//! What the kernel holds, as read by a backend, and the pure diff against the desired state.

use std::net::IpAddr;

use super::{
    NetChanges, NetConfig, NetDesired, NetError, RouteSpec, RuleSpec, addresses, links, routes,
    rules,
};

/// A network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLink {
    pub index: u32,
    pub name: String,
    /// The hardware address of Ethernet-like links (the ones addresses are announced on).
    pub mac: Option<[u8; 6]>,
}

/// One address of one interface, with its `IFA_PROTO` (0 when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelAddress {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub proto: u8,
}

/// A unicast route (as far as a [`RouteSpec`] can express it) and its `RTPROT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    pub spec: RouteSpec,
    pub proto: u8,
}

/// A `lookup` rule (as far as a [`RuleSpec`] can express it) and its `FRA_PROTOCOL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRule {
    pub spec: RuleSpec,
    pub proto: u8,
}

/// A snapshot of the kernel state the planner needs. Backends may leave out routes and rules
/// that do not carry the configured protocol (they can never be the agent's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelState {
    pub links: Vec<KernelLink>,
    pub addresses: Vec<KernelAddress>,
    pub routes: Vec<KernelRoute>,
    pub rules: Vec<KernelRule>,
    /// Links carrying the agent's alias, and the permanent entries on them.
    pub owned_links: Vec<links::OwnedLink>,
    pub fdb: Vec<links::FdbEntry>,
    pub neighbours: Vec<links::NeighEntry>,
}

impl KernelState {
    pub fn link_by_index(&self, index: u32) -> Option<&KernelLink> {
        self.links.iter().find(|l| l.index == index)
    }

    pub fn link_by_name(&self, name: &str) -> Option<&KernelLink> {
        self.links.iter().find(|l| l.name == name)
    }

    /// The interface name of `index`, or `if<index>` for a link that vanished meanwhile.
    pub fn link_name(&self, index: u32) -> String {
        self.link_by_index(index)
            .map_or_else(|| format!("if{index}"), |l| l.name.clone())
    }

    /// The changes that bring the marked objects to `desired`. Pure.
    pub fn plan(&self, desired: &NetDesired, cfg: &NetConfig) -> Result<NetChanges, NetError> {
        cfg.validate()?;
        let mut changes = NetChanges::new(cfg.protocol);
        addresses::plan(self, &desired.addresses, cfg, &mut changes)?;
        routes::plan(self, &desired.routes, cfg, &mut changes)?;
        rules::plan(self, &desired.rules, cfg, &mut changes)?;
        links::plan(self, desired.tunnel.as_ref(), &mut changes.tunnel)?;
        Ok(changes)
    }

    /// The changes that remove every marked object. Pure.
    pub fn plan_cleanup(&self, cfg: &NetConfig) -> Result<NetChanges, NetError> {
        self.plan(&NetDesired::default(), cfg)
    }
}
