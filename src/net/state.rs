//! What the kernel holds, as read by a backend (the pure diff against the desired state is
//! `KernelState::plan`, in the parent module, which calls each kind's planner).

use std::net::IpAddr;

use super::{RouteSpec, RuleSpec};

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

/// `(vni, port, local)` of a VXLAN device.
pub type VxlanId = (u32, u16, Option<IpAddr>);

/// A link the agent created (alias [`LINK_ALIAS`](super::LINK_ALIAS)), as read from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedLink {
    pub index: u32,
    pub name: String,
    /// When it is a VXLAN device.
    pub vxlan: Option<VxlanId>,
    pub mac: Option<[u8; 6]>,
    /// Its IPv4 `(rp_filter, src_valid_mark)` (None when the kernel did not report them).
    pub inet_conf: Option<(i32, i32)>,
    /// `IFLA_VXLAN_TOS` is 1 (`tos inherit`).
    pub tos_inherit: bool,
}

/// A permanent FDB entry on an owned link: frames to `mac` go to `dst`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FdbEntry {
    pub dev: String,
    pub mac: [u8; 6],
    pub dst: IpAddr,
}

/// A permanent neighbour entry on an owned link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NeighEntry {
    pub dev: String,
    pub ip: IpAddr,
    pub mac: [u8; 6],
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
    pub owned_links: Vec<OwnedLink>,
    pub fdb: Vec<FdbEntry>,
    pub neighbours: Vec<NeighEntry>,
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
}
