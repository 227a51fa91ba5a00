//! The agent's tunnel device (VXLAN) and its static forwarding (FDB) and neighbour entries:
//! diff and netlink messages.
//!
//! The device is the agent's when it carries the alias [`LINK_ALIAS`]; everything on it
//! (FDB and neighbour entries) is then the agent's too. A device with the tunnel's name but
//! without the alias is never touched: planning fails with an error naming it.
//!
//! No learning and no flooding: each peer has one permanent FDB entry (its MAC -> its
//! underlay address) and permanent neighbour entries (its gateways -> its MAC), so nothing is
//! resolved at packet time and no frame goes to a node it is not for.
//!
//! The device copies the inner packet's DSCP into the outer header (`tos inherit`,
//! `IFLA_VXLAN_TOS` 1), so an EgressQoS class crosses the underlay between the nodes. A
//! device created without it (an older agent's) is changed in place (`RTM_NEWLINK` on the
//! existing device, the kernel's changelink): its entries and the routes over it stay.

use std::collections::BTreeSet;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};

pub use super::state::{FdbEntry, NeighEntry, OwnedLink, VxlanId};
use super::{KernelState, LINK_ALIAS, NetError, TunnelSpec};

/// The tunnel's IPv4 settings: `src_valid_mark` 1, so that the reverse-path check of a
/// decapsulated packet looks its source up with the packet's mark (`TUNNELED`, set by
/// `eip-prerouting`) and finds the agent's route back over the tunnel, whatever
/// `rp_filter` the host has in `all`, `default` or here; and `rp_filter` 0 on the device,
/// which alone suffices while `all` is 0. Set through RTM_SETLINK (`IFLA_AF_SPEC` /
/// `IFLA_INET_CONF`), never through `/proc/sys`. (`rp_filter`, `src_valid_mark`)
pub const TUNNEL_INET_CONF: (i32, i32) = (0, 1);

/// `IFLA_VXLAN_TOS` value meaning "copy the inner packet's TOS" (iproute2's `tos inherit`).
const TOS_INHERIT: u8 = 1;

/// What changes on the tunnel side. Applied: `create`, then the adds (before routes are added,
/// so routes over the tunnel find their device), deletes, and `delete` last (after the routes
/// over it are gone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelChanges {
    pub create: Option<TunnelSpec>,
    /// An owned device to switch to `tos inherit` in place.
    pub tos_inherit: Option<String>,
    pub fdb_add: Vec<FdbEntry>,
    pub neigh_add: Vec<NeighEntry>,
    pub fdb_del: Vec<FdbEntry>,
    pub neigh_del: Vec<NeighEntry>,
    /// Owned links to delete (their entries and routes go with them).
    pub delete: Vec<String>,
    /// The owned link whose IPv4 settings are not [`TUNNEL_INET_CONF`] (a kept one, e.g.
    /// created by an older agent; a created one is configured as part of `create`).
    pub configure: Option<String>,
}

pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `fdb <verb> <mac> dev <dev> dst <underlay>`.
fn fdb_text(verb: &str, f: &FdbEntry) -> String {
    let mac = mac_text(&f.mac);
    format!("fdb {verb} {mac} dev {} dst {}", f.dev, f.dst)
}

impl TunnelChanges {
    pub fn len(&self) -> usize {
        usize::from(self.create.is_some())
            + usize::from(self.configure.is_some())
            + usize::from(self.tos_inherit.is_some())
            + self.fdb_add.len()
            + self.neigh_add.len()
            + self.fdb_del.len()
            + self.neigh_del.len()
            + self.delete.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `link add np-eip type vxlan id 7100 dstport 4789 local 192.168.50.11 address ...`,
    /// `fdb append ...`, `neigh replace ...`.
    pub fn describe_adds(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(t) = &self.create {
            out.push(format!(
                "link add {} type vxlan id {} dstport {} local {} address {} nolearning tos inherit alias {LINK_ALIAS}",
                t.name,
                t.vni,
                t.port,
                t.local,
                mac_text(&t.mac)
            ));
        }
        if let Some(dev) = self
            .create
            .as_ref()
            .map(|t| &t.name)
            .or(self.configure.as_ref())
        {
            let (rp_filter, src_valid_mark) = TUNNEL_INET_CONF;
            out.push(format!(
                "link set {dev} ipv4 conf rp_filter {rp_filter} src_valid_mark {src_valid_mark}"
            ));
        }
        if let Some(name) = &self.tos_inherit {
            out.push(format!("link set {name} type vxlan tos inherit"));
        }
        for f in &self.fdb_add {
            out.push(format!("{} permanent", fdb_text("append", f)));
        }
        for n in &self.neigh_add {
            out.push(format!(
                "neigh replace {} lladdr {} dev {} nud permanent",
                n.ip,
                mac_text(&n.mac),
                n.dev
            ));
        }
        out
    }

    pub fn describe_dels(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.neigh_del {
            out.push(format!("neigh del {} dev {}", n.ip, n.dev));
        }
        for f in &self.fdb_del {
            out.push(fdb_text("del", f));
        }
        for name in &self.delete {
            out.push(format!("link del {name}"));
        }
        out
    }
}

/// The entries of `entries` on device `dev`.
fn on_device<T: Clone + Ord>(
    entries: &[T],
    dev: &str,
    dev_of: impl Fn(&T) -> &String,
) -> BTreeSet<T> {
    entries
        .iter()
        .filter(|e| dev_of(e) == dev)
        .cloned()
        .collect()
}

fn wanted_entries(t: &TunnelSpec) -> (BTreeSet<FdbEntry>, BTreeSet<NeighEntry>) {
    let mut fdb = BTreeSet::new();
    let mut neigh = BTreeSet::new();
    for p in &t.peers {
        fdb.insert(FdbEntry {
            dev: t.name.clone(),
            mac: p.mac,
            dst: p.underlay,
        });
        for g in &p.gateways {
            neigh.insert(NeighEntry {
                dev: t.name.clone(),
                ip: *g,
                mac: p.mac,
            });
        }
    }
    (fdb, neigh)
}

fn matches(link: &OwnedLink, t: &TunnelSpec) -> bool {
    link.name == t.name
        && link.mac == Some(t.mac)
        && link.vxlan == Some((t.vni, t.port, Some(t.local)))
}

/// The changes that bring the owned links to `desired`. Pure.
pub(crate) fn plan(
    state: &KernelState,
    desired: Option<&TunnelSpec>,
    changes: &mut TunnelChanges,
) -> Result<(), NetError> {
    let mut kept = None;
    for link in &state.owned_links {
        match desired {
            Some(t) if kept.is_none() && matches(link, t) => kept = Some(link),
            _ => changes.delete.push(link.name.clone()),
        }
    }
    let Some(t) = desired else { return Ok(()) };
    let (fdb, neigh) = wanted_entries(t);
    match kept {
        None => {
            let foreign = state.link_by_name(&t.name).is_some()
                && !state.owned_links.iter().any(|l| l.name == t.name);
            if foreign {
                return Err(NetError::Invalid {
                    object: format!("link {}", t.name),
                    reason: format!(
                        "exists and was not created by the agent (no alias {LINK_ALIAS}); \
                         not touching it"
                    ),
                });
            }
            changes.create = Some(t.clone());
            changes.fdb_add.extend(fdb);
            changes.neigh_add.extend(neigh);
        }
        Some(link) => {
            if link.inet_conf != Some(TUNNEL_INET_CONF) {
                changes.configure = Some(link.name.clone());
            }
            if !link.tos_inherit {
                changes.tos_inherit = Some(link.name.clone());
            }
            let have_fdb = on_device(&state.fdb, &link.name, |f| &f.dev);
            let have_neigh = on_device(&state.neighbours, &link.name, |n| &n.dev);
            changes.fdb_add.extend(fdb.difference(&have_fdb).cloned());
            changes.fdb_del.extend(have_fdb.difference(&fdb).cloned());
            changes
                .neigh_add
                .extend(neigh.difference(&have_neigh).cloned());
            // A changed MAC for the same gateway is a replace, not a delete.
            changes.neigh_del.extend(
                have_neigh
                    .difference(&neigh)
                    .filter(|h| !neigh.iter().any(|w| w.ip == h.ip))
                    .cloned(),
            );
        }
    }
    Ok(())
}

/// `RTM_NEWLINK` creating the VXLAN device (down; [`up_message`] brings it up).
pub(crate) fn create_message(t: &TunnelSpec) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::IfName(t.name.clone()));
    msg.attributes.push(LinkAttribute::Address(t.mac.to_vec()));
    let local = match t.local {
        IpAddr::V4(a) => InfoVxlan::Local(a),
        IpAddr::V6(a) => InfoVxlan::Local6(a),
    };
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(vec![
            InfoVxlan::Id(t.vni),
            InfoVxlan::Port(t.port),
            local,
            InfoVxlan::Learning(false),
            InfoVxlan::Tos(TOS_INHERIT),
        ])),
    ]));
    msg
}

/// `RTM_NEWLINK` on the existing device `index` (no `NLM_F_CREATE`: the kernel's changelink)
/// switching it to `tos inherit`; the rest of its configuration stays.
pub(crate) fn tos_inherit_message(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(vec![InfoVxlan::Tos(TOS_INHERIT)])),
    ]));
    msg
}

/// `RTM_NEWLINK` (set) marking the device as ours and bringing it up.
pub(crate) fn up_message(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.header.flags = LinkFlags::Up;
    msg.header.change_mask = LinkFlags::Up;
    msg.attributes
        .push(LinkAttribute::IfAlias(LINK_ALIAS.to_string()));
    msg
}

pub(crate) fn delete_message(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

fn neigh_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// `RTM_NEWNEIGH`/`RTM_DELNEIGH` for an FDB entry (family bridge, `self`, permanent).
pub(crate) fn fdb_message(f: &FdbEntry, index: u32) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    msg.header.ifindex = index;
    msg.header.state = NeighbourState::Permanent;
    msg.header.flags = NeighbourFlags::Own;
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(f.mac.to_vec()));
    msg.attributes
        .push(NeighbourAttribute::Destination(neigh_address(f.dst)));
    msg
}

/// `RTM_NEWNEIGH`/`RTM_DELNEIGH` for a permanent neighbour entry.
pub(crate) fn neigh_message(n: &NeighEntry, index: u32) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = match n.ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    msg.header.ifindex = index;
    msg.header.state = NeighbourState::Permanent;
    msg.attributes
        .push(NeighbourAttribute::Destination(neigh_address(n.ip)));
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(n.mac.to_vec()));
    msg
}

/// An owned link from the kernel's `RTM_NEWLINK`; `None` for links without our alias.
pub(crate) fn parse_owned(msg: &LinkMessage) -> Option<OwnedLink> {
    let mut alias = None;
    let mut name = None;
    let mut mac = None;
    let mut vxlan = None;
    let mut inet_conf = None;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::AfSpecUnspec(specs) => inet_conf = parse_inet_conf(specs),
            LinkAttribute::IfAlias(a) => alias = Some(a.as_str()),
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Address(a) => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            LinkAttribute::LinkInfo(infos) => vxlan = parse_vxlan(infos),
            _ => {}
        }
    }
    (alias == Some(LINK_ALIAS)).then(|| OwnedLink {
        index: msg.header.index,
        name: name.unwrap_or_else(|| format!("if{}", msg.header.index)),
        vxlan: vxlan.map(|(v, _)| v),
        mac,
        inet_conf,
        tos_inherit: vxlan.is_some_and(|(_, tos)| tos == TOS_INHERIT),
    })
}

fn parse_inet_conf(specs: &[AfSpecUnspec]) -> Option<(i32, i32)> {
    specs.iter().find_map(|s| match s {
        AfSpecUnspec::Inet(inet) => inet.iter().find_map(|i| match i {
            AfSpecInet::DevConf(c) => Some((c.rp_filter, c.src_vmark)),
            _ => None,
        }),
        _ => None,
    })
}

/// `RTM_NEWLINK` (set) giving link `index` the IPv4 settings [`TUNNEL_INET_CONF`].
/// netlink-packet-route's `DevConfRequest` leaves out zero values, so the nested
/// `IFLA_INET_CONF` (one `u32` attribute per `IPV4_DEVCONF_*` index) is built here.
pub(crate) fn inet_conf_message(index: u32) -> LinkMessage {
    const IFLA_INET_CONF: u16 = 1;
    const IPV4_DEVCONF_RP_FILTER: u16 = 8;
    const IPV4_DEVCONF_SRC_VMARK: u16 = 24;
    let (rp_filter, src_valid_mark) = TUNNEL_INET_CONF;
    let settings = [
        DefaultNla::new(
            IPV4_DEVCONF_RP_FILTER,
            (rp_filter as u32).to_ne_bytes().to_vec(),
        ),
        DefaultNla::new(
            IPV4_DEVCONF_SRC_VMARK,
            (src_valid_mark as u32).to_ne_bytes().to_vec(),
        ),
    ];
    let mut nested = vec![0u8; settings.as_slice().buffer_len()];
    settings.as_slice().emit(&mut nested);
    let conf = DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested);
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg.attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
            AfSpecInet::Other(conf),
        ])]));
    msg
}

/// `((vni, port, local), tos)` of a VXLAN device.
fn parse_vxlan(infos: &[LinkInfo]) -> Option<(VxlanId, u8)> {
    let data = infos.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vxlan(d)) => Some(d),
        _ => None,
    })?;
    let (mut vni, mut port, mut local, mut tos) = (0, 0, None, 0);
    for d in data {
        match d {
            InfoVxlan::Id(v) => vni = *v,
            InfoVxlan::Port(p) => port = *p,
            InfoVxlan::Local(a) => local = Some(IpAddr::V4(*a)),
            InfoVxlan::Local6(a) => local = Some(IpAddr::V6(*a)),
            InfoVxlan::Tos(t) => tos = *t,
            _ => {}
        }
    }
    Some(((vni, port, local), tos))
}

/// A permanent FDB or neighbour entry on an owned link (`None` for anything else).
pub(crate) enum ParsedNeigh {
    Fdb(FdbEntry),
    Neigh(NeighEntry),
}

pub(crate) fn parse_neigh(msg: &NeighbourMessage, state: &KernelState) -> Option<ParsedNeigh> {
    let link = state
        .owned_links
        .iter()
        .find(|l| l.index == msg.header.ifindex)?;
    if msg.header.state != NeighbourState::Permanent {
        return None;
    }
    let mut ip = None;
    let mut mac = None;
    for attr in &msg.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some((*a).into()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some((*a).into()),
            // An FDB entry (family bridge): the crate cannot know the address family and
            // keeps the bytes; 4 or 16 of them are the underlay address.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                ip = <[u8; 4]>::try_from(b.as_slice())
                    .map(IpAddr::from)
                    .or_else(|_| <[u8; 16]>::try_from(b.as_slice()).map(IpAddr::from))
                    .ok();
            }
            NeighbourAttribute::LinkLayerAddress(a) => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            _ => {}
        }
    }
    let (ip, mac) = (ip?, mac?);
    let dev = link.name.clone();
    Some(if msg.header.family == AddressFamily::Bridge {
        ParsedNeigh::Fdb(FdbEntry { dev, mac, dst: ip })
    } else {
        ParsedNeigh::Neigh(NeighEntry { dev, ip, mac })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{KernelLink, TunnelPeer};

    fn spec(peers: &[(&str, u8)]) -> TunnelSpec {
        TunnelSpec {
            name: "np-eip".into(),
            vni: 7100,
            port: 4789,
            local: "192.168.50.11".parse().unwrap(),
            mac: [0x0a, 0x6e, 192, 168, 50, 11],
            peers: peers
                .iter()
                .map(|(ip, last)| TunnelPeer {
                    underlay: ip.parse().unwrap(),
                    mac: [0x0a, 0x6e, 192, 168, 50, *last],
                    gateways: vec![ip.parse().unwrap()],
                })
                .collect(),
        }
    }

    fn owned_state(t: &TunnelSpec) -> KernelState {
        KernelState {
            links: vec![KernelLink {
                index: 9,
                name: t.name.clone(),
                mac: Some(t.mac),
            }],
            owned_links: vec![OwnedLink {
                index: 9,
                name: t.name.clone(),
                vxlan: Some((t.vni, t.port, Some(t.local))),
                mac: Some(t.mac),
                inet_conf: Some(TUNNEL_INET_CONF),
                tos_inherit: true,
            }],
            fdb: wanted_entries(t).0.into_iter().collect(),
            neighbours: wanted_entries(t).1.into_iter().collect(),
            ..Default::default()
        }
    }

    /// A kept tunnel without its IPv4 settings (an older agent's, or reset by someone) gets
    /// them again; the message is RTM_SETLINK with `IFLA_AF_SPEC` / `AF_INET` /
    /// `IFLA_INET_CONF` holding both values, the zero included, as the kernel parses it
    /// (`inet_set_link_af`), and the link dump's `IFLA_INET_CONF` reads back as they were set.
    #[test]
    fn tunnel_ipv4_settings_are_set_through_netlink_and_repaired() {
        let t = spec(&[]);
        let mut st = owned_state(&t);
        st.owned_links[0].inet_conf = Some((1, 0));
        let mut c = TunnelChanges::default();
        plan(&st, Some(&t), &mut c).unwrap();
        assert_eq!(c.configure.as_deref(), Some("np-eip"));
        assert_eq!(
            c.describe_adds(),
            vec!["link set np-eip ipv4 conf rp_filter 0 src_valid_mark 1"]
        );
        st.owned_links[0].inet_conf = Some(TUNNEL_INET_CONF);
        let mut c = TunnelChanges::default();
        plan(&st, Some(&t), &mut c).unwrap();
        assert!(c.is_empty(), "{c:?}");

        let msg = inet_conf_message(9);
        assert_eq!(msg.header.index, 9);
        let mut bytes = vec![0u8; msg.buffer_len()];
        msg.emit(&mut bytes);
        // After the 16-byte ifinfomsg: IFLA_AF_SPEC (26) > AF_INET (2) > IFLA_INET_CONF
        // (1, nested) > [RP_FILTER (8) = 0, SRC_VMARK (24) = 1], native-endian u32s.
        let nla = |len: u16, kind: u16| [len.to_ne_bytes(), kind.to_ne_bytes()].concat();
        let mut want = nla(28, 26);
        want.extend(nla(24, 2));
        want.extend(nla(20, 1 | NLA_F_NESTED));
        want.extend(nla(8, 8));
        want.extend(0u32.to_ne_bytes());
        want.extend(nla(8, 24));
        want.extend(1u32.to_ne_bytes());
        assert_eq!(&bytes[16..], want.as_slice());
    }

    #[test]
    fn create_then_converge_then_peer_change_is_entries_only() {
        let t = spec(&[("192.168.50.12", 12)]);
        let mut c = TunnelChanges::default();
        plan(&KernelState::default(), Some(&t), &mut c).unwrap();
        assert_eq!(c.create.as_ref(), Some(&t));
        assert_eq!(c.len(), 3, "link, one fdb and one neighbour entry");

        let st = owned_state(&t);
        let mut c = TunnelChanges::default();
        plan(&st, Some(&t), &mut c).unwrap();
        assert!(c.is_empty(), "{c:?}");

        let t2 = spec(&[("192.168.50.13", 13)]);
        let mut c = TunnelChanges::default();
        plan(&st, Some(&t2), &mut c).unwrap();
        assert_eq!(c.create, None);
        assert_eq!(
            c.describe_adds(),
            vec![
                "fdb append 0a:6e:c0:a8:32:0d dev np-eip dst 192.168.50.13 permanent",
                "neigh replace 192.168.50.13 lladdr 0a:6e:c0:a8:32:0d dev np-eip nud permanent",
            ]
        );
        assert_eq!(
            c.describe_dels(),
            vec![
                "neigh del 192.168.50.12 dev np-eip",
                "fdb del 0a:6e:c0:a8:32:0c dev np-eip dst 192.168.50.12",
            ]
        );

        let mut c = TunnelChanges::default();
        plan(&st, None, &mut c).unwrap();
        assert_eq!(c.delete, vec!["np-eip".to_string()]);
    }

    #[test]
    fn a_device_without_tos_inherit_is_changed_in_place() {
        let t = spec(&[("192.168.50.12", 12)]);
        let mut st = owned_state(&t);
        st.owned_links[0].tos_inherit = false;
        let mut c = TunnelChanges::default();
        plan(&st, Some(&t), &mut c).unwrap();
        assert_eq!(
            (c.create.as_ref(), c.delete.len()),
            (None, 0),
            "kept, not recreated"
        );
        assert_eq!(
            c.describe_adds(),
            vec!["link set np-eip type vxlan tos inherit"]
        );
    }

    #[test]
    fn a_foreign_link_with_our_name_is_refused() {
        let t = spec(&[]);
        let st = KernelState {
            links: vec![KernelLink {
                index: 4,
                name: "np-eip".into(),
                mac: None,
            }],
            ..Default::default()
        };
        let err = plan(&st, Some(&t), &mut TunnelChanges::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("link np-eip: exists and was not created")
        );
    }
}
