//! The agent's rtnetlink side: IP addresses, routes, policy rules and neighbour announcements.
//!
//! Desired state is a value ([`NetDesired`]); a backend reads the kernel, diffs it against the
//! desired state ([`NetBackend::plan`], read-only, works unprivileged), and applies the result
//! ([`NetBackend::apply`]). What `agent --dry-run` prints ([`NetChanges::describe`]) is rendered
//! from the same [`NetChanges`] value that `apply` executes.
//!
//! # Ownership markers
//!
//! The agent only ever deletes objects that carry its marker (see [`NetConfig`]):
//! - addresses: `IFA_PROTO` = [`NODEPLANE_PROTO`] (`0x6e`, kernel 6.3+); IPv6 addresses are added
//!   with `IFA_F_NODAD` so they are usable (and announceable) at once;
//! - routes: `RTPROT` = [`NODEPLANE_PROTO`] **and** a table inside [`NetConfig::route_tables`];
//! - rules: `FRA_PROTOCOL` = [`NODEPLANE_PROTO`] **and** a priority inside
//!   [`NetConfig::rule_priorities`];
//! - links (the EgressIP tunnel): the alias (`IFLA_IFALIAS`) [`LINK_ALIAS`]; the FDB and
//!   neighbour entries on such a link are the agent's too (see [`links`]).
//!
//! An address the agent adds is put on the interface whose (non-agent) subnet contains it with
//! the longest prefix; ties go to the interface name that sorts first.

pub mod addresses;
pub mod announce;
pub mod bridge_ports;
pub mod conflict;
mod dump;
pub mod fake;
pub mod fence;
pub mod links;
pub mod routes;
pub mod rtnl;
pub mod rules;
pub mod state;

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use ipnet::IpNet;

pub use fake::FakeNetBackend;
pub use rtnl::RtnlBackend;
pub use state::{KernelAddress, KernelLink, KernelRoute, KernelRule, KernelState};

/// The protocol value that marks the agent's addresses (`IFA_PROTO`), routes (`RTPROT`) and
/// rules (`FRA_PROTOCOL`): 0x6e = 110 = ASCII `n`. Unused by the kernel and by the routing
/// daemons listed in iproute2's `rt_protos`. Shown by iproute2 as `proto 110`.
pub const NODEPLANE_PROTO: u8 = 0x6e;

/// Routing tables the agent owns by default.
pub const DEFAULT_ROUTE_TABLES: RangeInclusive<u32> = 7000..=7999;

/// Rule priorities the agent uses by default: after `local` (0), before `main` (32766).
pub const DEFAULT_RULE_PRIORITIES: RangeInclusive<u32> = 7000..=7999;

/// Address family of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        })
    }
}

/// An address the agent wants on the node (typically a /32 or /128 egress IP). The interface is
/// chosen by the backend (longest prefix match over the node's own subnets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressSpec {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl AddressSpec {
    /// A host address: /32 for IPv4, /128 for IPv6.
    pub fn host(addr: IpAddr) -> Self {
        let prefix_len = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        AddressSpec { addr, prefix_len }
    }
}

impl fmt::Display for AddressSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// One path of a route. `dev: None` lets the kernel resolve the device from `via`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NextHop {
    pub via: Option<IpAddr>,
    pub dev: Option<String>,
    /// Multipath weight, 1-255 (ignored, and normalised to 1, for single-path routes).
    pub weight: u8,
    /// `onlink`: the gateway is on `dev` even though no subnet of `dev` contains it (the
    /// agent's tunnel device has no addresses).
    pub onlink: bool,
}

impl NextHop {
    pub fn via(gw: IpAddr) -> Self {
        NextHop {
            via: Some(gw),
            dev: None,
            weight: 1,
            onlink: false,
        }
    }

    pub fn dev(dev: &str) -> Self {
        NextHop {
            via: None,
            dev: Some(dev.to_string()),
            weight: 1,
            onlink: false,
        }
    }
}

/// A unicast route in an agent-owned table. Several nexthops make a multipath route.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteSpec {
    pub table: u32,
    pub dst: IpNet,
    pub nexthops: Vec<NextHop>,
    /// `local` (type local, scope host): packets are delivered to this host whatever their
    /// destination, as transparent proxying needs (`local default dev lo`).
    pub local: bool,
}

#[cfg(test)]
impl RouteSpec {
    /// A route of `table` to `dst` straight out of `dev`.
    pub fn out_of(table: u32, dst: &str, dev: &str) -> Self {
        RouteSpec {
            table,
            dst: dst.parse().unwrap(),
            nexthops: vec![NextHop::dev(dev)],
            local: false,
        }
    }
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} table {}", self.dst, self.table)
    }
}

/// A policy rule `priority P [from NET] [fwmark M/MASK] lookup TABLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleSpec {
    pub priority: u32,
    /// `(mark, mask)`.
    pub fwmark: Option<(u32, u32)>,
    pub from: Option<IpNet>,
    pub table: u32,
    pub family: Family,
}

impl fmt::Display for RuleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} priority {}", self.family, self.priority)
    }
}

/// Everything the agent wants in the kernel's routing side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetDesired {
    pub addresses: BTreeSet<AddressSpec>,
    pub routes: BTreeSet<RouteSpec>,
    pub rules: BTreeSet<RuleSpec>,
    /// The agent's tunnel device (EgressIP steering), if any.
    pub tunnel: Option<TunnelSpec>,
    /// The addresses of each pod whose bridge port a feature needs (NetworkPolicy's
    /// binding): read, never changed ([`NetBackend::bridge_ports`]).
    pub bridge_pods: Vec<Vec<IpAddr>>,
}

/// What the node holds that a plan asked to know ([`NetBackend::read_facts`]): read, never
/// changed, and handed to the features with the backend's refusals.
#[derive(Debug, Default)]
pub struct NodeFacts {
    /// The bridge ports of [`NetDesired::bridge_pods`] (`None`: none asked for); the read's
    /// error as text.
    pub bridge_ports: Option<Result<bridge_ports::BridgePorts, String>>,
}

/// A VXLAN device the agent creates and owns (marked with the alias [`LINK_ALIAS`]), with
/// static forwarding (FDB) and neighbour entries towards its peers: no learning, no flooding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelSpec {
    /// Interface name (`np-` prefix).
    pub name: String,
    pub vni: u32,
    pub port: u16,
    /// This node's underlay address (source of the outer packets; its family is the
    /// underlay's).
    pub local: IpAddr,
    pub mac: [u8; 6],
    pub peers: BTreeSet<TunnelPeer>,
}

/// A remote end: frames to `mac` go to `underlay`; `gateways` resolve to `mac` on the tunnel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TunnelPeer {
    pub underlay: IpAddr,
    pub mac: [u8; 6],
    pub gateways: Vec<IpAddr>,
}

/// The alias (`IFLA_IFALIAS`) that marks links the agent created; only such links are ever
/// changed or deleted.
pub const LINK_ALIAS: &str = "nodeplane";

/// An address together with the interface it goes on (or comes off).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressChange {
    pub spec: AddressSpec,
    pub dev: String,
}

/// The changes that bring the kernel to a desired state. Applied in this order: addresses
/// added, routes added, routes replaced, rules added, rules deleted, routes deleted, addresses
/// deleted (new paths exist before old ones go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetChanges {
    /// The marker the added objects carry and the deletes are restricted to.
    pub protocol: u8,
    pub addresses_add: Vec<AddressChange>,
    pub addresses_del: Vec<AddressChange>,
    pub routes_add: Vec<RouteSpec>,
    /// Routes whose table and destination exist (marked) with other nexthops.
    pub routes_replace: Vec<RouteSpec>,
    pub routes_del: Vec<RouteSpec>,
    pub rules_add: Vec<RuleSpec>,
    pub rules_del: Vec<RuleSpec>,
    /// Tunnel device, forwarding and neighbour entries (see [`links`]).
    pub tunnel: links::TunnelChanges,
    /// Desired addresses that cannot be placed (no interface subnet contains them, or they
    /// are the node's own): left out, so that the rest still applies.
    pub refused: Vec<Refusal>,
}

/// An egress address this node holds that another host on the segment answered for too
/// when it was added (after the wait of `conflict`): two hosts answer ARP / NA for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressConflict {
    pub addr: IpAddr,
    pub dev: String,
    /// The other host's MAC, as `ip neigh` prints it.
    pub holder: String,
}

/// A desired address the backend left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub addr: IpAddr,
    pub reason: String,
}

impl Default for NetChanges {
    fn default() -> Self {
        NetChanges::new(NODEPLANE_PROTO)
    }
}

impl NetChanges {
    pub fn new(protocol: u8) -> Self {
        NetChanges {
            protocol,
            addresses_add: Vec::new(),
            addresses_del: Vec::new(),
            routes_add: Vec::new(),
            routes_replace: Vec::new(),
            routes_del: Vec::new(),
            rules_add: Vec::new(),
            rules_del: Vec::new(),
            tunnel: links::TunnelChanges::default(),
            refused: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of kernel operations.
    pub fn len(&self) -> usize {
        self.addresses_add.len()
            + self.addresses_del.len()
            + self.routes_add.len()
            + self.routes_replace.len()
            + self.routes_del.len()
            + self.rules_add.len()
            + self.rules_del.len()
            + self.tunnel.len()
    }

    /// `ip`-like lines in apply order, e.g.
    /// `address add 192.168.50.100/32 dev eth0 proto nodeplane`.
    pub fn describe(&self) -> Vec<String> {
        let p = self.protocol;
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.tunnel.describe_adds());
        describe_each(&mut out, "add", &self.addresses_add, p, addresses::describe);
        describe_each(&mut out, "add", &self.routes_add, p, routes::describe);
        describe_each(
            &mut out,
            "replace",
            &self.routes_replace,
            p,
            routes::describe,
        );
        describe_each(&mut out, "add", &self.rules_add, p, rules::describe);
        describe_each(&mut out, "del", &self.rules_del, p, rules::describe);
        describe_each(&mut out, "del", &self.routes_del, p, routes::describe);
        describe_each(&mut out, "del", &self.addresses_del, p, addresses::describe);
        out.extend(self.tunnel.describe_dels());
        out
    }
}

/// Appends `describe(verb, item, protocol)` for each of `items`.
fn describe_each<T>(
    out: &mut Vec<String>,
    verb: &str,
    items: &[T],
    protocol: u8,
    describe: fn(&str, &T, u8) -> String,
) {
    out.extend(items.iter().map(|i| describe(verb, i, protocol)));
}

/// Which objects belong to the agent, and how it announces addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Marker for addresses, routes and rules.
    pub protocol: u8,
    /// Routing tables owned by the agent: it may add routes there and removes its marked ones.
    pub route_tables: RangeInclusive<u32>,
    /// Priorities the agent's rules use.
    pub rule_priorities: RangeInclusive<u32>,
    /// How many times each new address is announced (0 = never).
    pub announce_count: u32,
    /// Delay between two announcements of the same address.
    pub announce_interval: Duration,
    /// How long to wait for another host's answer to a conflict probe before adding an
    /// address (`conflict`); zero skips the probes.
    pub conflict_probe: Duration,
    /// How long to wait at most for another holder of an address to let it go.
    pub conflict_max_wait: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            protocol: NODEPLANE_PROTO,
            route_tables: DEFAULT_ROUTE_TABLES,
            rule_priorities: DEFAULT_RULE_PRIORITIES,
            // 0 ms .. 1 s after a takeover: neighbours that ignore a gratuitous ARP inside
            // their lock time (Linux `arp_accept` paths, `locktime` 1 s) still get a later one.
            announce_count: 6,
            announce_interval: Duration::from_millis(200),
            conflict_probe: Duration::from_millis(20),
            conflict_max_wait: Duration::from_secs(1),
        }
    }
}

impl NetConfig {
    /// Rejects markers and ranges that would make the agent claim kernel or system objects.
    pub fn validate(&self) -> Result<(), NetError> {
        let bad = |reason: String| NetError::Config { reason };
        // 0-4: unspec, redirect, kernel, boot, static (what `ip` uses by default).
        if self.protocol <= 4 {
            return Err(bad(format!(
                "protocol {} is reserved for the kernel and iproute2 (use 5-255)",
                self.protocol
            )));
        }
        let (t0, t1) = (*self.route_tables.start(), *self.route_tables.end());
        if t0 > t1 {
            return Err(bad(format!("route tables {t0}-{t1}: empty range")));
        }
        for reserved in [0u32, 253, 254, 255] {
            if self.route_tables.contains(&reserved) {
                return Err(bad(format!(
                    "route tables {t0}-{t1} include the reserved table {reserved}"
                )));
            }
        }
        let (p0, p1) = (*self.rule_priorities.start(), *self.rule_priorities.end());
        if p0 == 0 || p0 > p1 || p1 >= 32766 {
            return Err(bad(format!(
                "rule priorities {p0}-{p1}: must be a non-empty range inside 1-32765 \
                 (0 is `local`, 32766 `main`)"
            )));
        }
        Ok(())
    }
}

/// Errors of the net module; each names the object it is about.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("address {addr}: {}", NO_SUBNET)]
    NoSubnet { addr: IpAddr },
    #[error("address {addr}: it is one of the node's own addresses (on {dev})")]
    OwnAddress { addr: IpAddr, dev: String },
    /// The network (or IPv4 broadcast) address of the interface subnet it would go in.
    #[error("address {addr}: it is the {what} address of {net} (on {dev})")]
    SubnetAddress {
        addr: IpAddr,
        what: &'static str,
        net: ipnet::IpNet,
        dev: String,
    },
    /// A desired object that cannot be expressed or would not be owned by the agent.
    #[error("{object}: {reason}")]
    Invalid { object: String, reason: String },
    /// An interface named by a change does not exist (any more).
    #[error("{object}: no interface named {dev}")]
    NoDevice { object: String, dev: String },
    /// The kernel refused one operation (earlier operations of the same apply stay applied;
    /// the next plan starts from what the kernel holds).
    #[error("{object}: {op} failed: {source}")]
    Kernel {
        object: String,
        op: &'static str,
        source: std::io::Error,
    },
    /// Reading kernel state, or talking to netlink, failed.
    #[error("netlink {what}: {reason}")]
    Netlink { what: String, reason: String },
    #[error("net config: {reason}")]
    Config { reason: String },
}

const NO_SUBNET: &str = "no interface subnet contains it";

/// The agent's view of one side-effecting network backend.
///
/// The real backend ([`RtnlBackend`]) is blocking: call it from a plain thread or from
/// `tokio::task::spawn_blocking`, not directly from an async task (it never nests runtimes,
/// but it would block a worker thread for the duration of a netlink round trip).
pub trait NetBackend {
    /// Reads the kernel (read-only; no privileges needed) and returns the changes that bring
    /// the agent's marked objects to `desired`. Unmarked objects are never in the result.
    fn plan(&mut self, desired: &NetDesired) -> Result<NetChanges, NetError>;
    /// Performs `changes` and announces the added addresses.
    fn apply(&mut self, changes: &NetChanges) -> Result<(), NetError>;
    /// Removes every marked object and returns what was removed.
    fn cleanup(&mut self) -> Result<NetChanges, NetError>;
    /// The node's bridge ports and what is behind each (read-only; see [`bridge_ports`]);
    /// `pods`: the addresses of each of the node's pods. Backends without a kernel have none.
    fn bridge_ports(
        &mut self,
        _pods: &[Vec<IpAddr>],
    ) -> Result<bridge_ports::BridgePorts, NetError> {
        Ok(bridge_ports::BridgePorts::default())
    }

    /// What `desired` asks to know of the node (read-only; see [`NodeFacts`]).
    fn read_facts(&mut self, desired: &NetDesired) -> NodeFacts {
        let pods = &desired.bridge_pods;
        NodeFacts {
            bridge_ports: (!pods.is_empty())
                .then(|| self.bridge_ports(pods).map_err(|e| e.to_string())),
        }
    }

    /// Addresses refused whatever the kernel holds (see [`fence::Fenced`]): what the
    /// features must not program even when `plan` fails.
    fn standing_refusals(&self, _desired: &NetDesired) -> Vec<Refusal> {
        Vec::new()
    }

    /// The addresses this node holds that another host still answered for when they were
    /// added ([`AddressConflict`]); an entry goes with its address. Backends without a
    /// segment have none.
    fn conflicts(&self) -> Vec<AddressConflict> {
        Vec::new()
    }

    /// `plan` then `apply`; returns what was applied.
    fn sync(&mut self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        let changes = self.plan(desired)?;
        self.apply(&changes)?;
        Ok(changes)
    }
}

/// `ip`'s name for a protocol value: the agent's own shows as `nodeplane`.
pub(crate) fn proto_name(proto: u8) -> String {
    if proto == NODEPLANE_PROTO {
        "nodeplane".to_string()
    } else {
        proto.to_string()
    }
}

/// `range` as `first-last` when `v` is outside it (a table or priority not the agent's).
pub(crate) fn outside(range: &RangeInclusive<u32>, v: u32) -> Option<String> {
    (!range.contains(&v)).then(|| format!("{}-{}", range.start(), range.end()))
}

/// Planning the kernel side is the parent's: it wires the object kinds (their files each
/// take the [`KernelState`] they diff against).
impl KernelState {
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
