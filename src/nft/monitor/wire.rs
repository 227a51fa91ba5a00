//! nf_tables change notifications as the kernel sends them: the message types and attributes
//! the monitor reads, and the decoding of one message into a [`Notification`].

use crate::nft::nftnl::reply::{self, NFNL_HDRLEN, NFNL_SUBSYS_NFTABLES, NLMSG_HDRLEN};

uapi!(pub(super) u32:
    /// The multicast group of nf_tables change notifications.
    NFNLGRP_NFTABLES,
);

// enum nf_tables_msg_types
pub(super) const NEWTABLE: u8 = 0;
pub(super) const DELTABLE: u8 = 2;
pub(super) const NEWCHAIN: u8 = 3;
pub(super) const DELCHAIN: u8 = 5;
pub(super) const NEWRULE: u8 = 6;
pub(super) const DELRULE: u8 = 8;
pub(super) const NEWSET: u8 = 9;
pub(super) const DELSET: u8 = 11;
pub(super) const NEWSETELEM: u8 = 12;
pub(super) const DELSETELEM: u8 = 14;
pub(super) const NEWGEN: u8 = 15;
pub(super) const NEWOBJ: u8 = 18;
pub(super) const DELOBJ: u8 = 20;
pub(super) const NEWFLOWTABLE: u8 = 22;
pub(super) const DELFLOWTABLE: u8 = 24;
pub(super) const DESTROYTABLE: u8 = 26;
pub(super) const DESTROYCHAIN: u8 = 27;
pub(super) const DESTROYRULE: u8 = 28;
pub(super) const DESTROYSET: u8 = 29;
pub(super) const DESTROYSETELEM: u8 = 30;
pub(super) const DESTROYOBJ: u8 = 31;
pub(super) const DESTROYFLOWTABLE: u8 = 32;

/// Attribute 1 of every table/chain/rule/set/element/object/flowtable message is the table name.
pub(super) const NFTA_TABLE: u16 = 1;
/// NFTA_CHAIN_NAME.
pub(super) const NFTA_CHAIN_NAME: u16 = 3;
/// NFTA_RULE_CHAIN, NFTA_SET_NAME, NFTA_SET_ELEM_LIST_SET, NFTA_OBJ_NAME, NFTA_FLOWTABLE_NAME.
pub(super) const NFTA_OBJECT_NAME: u16 = 2;
/// NFTA_SET_ELEM_LIST_ELEMENTS.
pub(super) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub(super) const NFTA_GEN_ID: u16 = 1;
pub(super) const NFTA_GEN_PROC_PID: u16 = 2;
pub(super) const NFTA_GEN_PROC_NAME: u16 = 3;

/// One nf_tables notification, borrowed from the datagram.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Notification<'a> {
    /// `NFT_MSG_NEWGEN`: the end of a commit sent from netlink port `portid`, or the reply
    /// to a `GETGEN` (`seq` echoes the request's), `generation` the generation it reports.
    Gen {
        portid: u32,
        seq: u32,
        pid: Option<u32>,
        comm: Option<&'a str>,
        generation: Option<u32>,
    },
    /// A change to an object of table `table`: `name` is the chain (for chains and rules),
    /// set (for sets and elements) or object; `items` the elements in a set element message.
    Object {
        portid: u32,
        family: u8,
        msg: u8,
        table: &'a [u8],
        name: Option<&'a [u8]>,
        items: u32,
    },
}

impl<'a> Notification<'a> {
    pub(super) fn parse(msg: &'a [u8]) -> Option<Notification<'a>> {
        let kind = u16_at(msg, 4)?;
        if kind >> 8 != NFNL_SUBSYS_NFTABLES {
            return None;
        }
        let seq = u32_at(msg, 8)?;
        let portid = u32_at(msg, 12)?;
        let family = *msg.get(NLMSG_HDRLEN)?;
        let body = msg.get(NFNL_HDRLEN..)?;
        let msg_type = (kind & 0xff) as u8;
        if msg_type == NEWGEN {
            let mut n = Notification::Gen {
                portid,
                seq,
                pid: None,
                comm: None,
                generation: None,
            };
            if let Notification::Gen {
                pid,
                comm,
                generation,
                ..
            } = &mut n
            {
                for (t, v) in attrs(body) {
                    match t {
                        NFTA_GEN_PROC_PID => *pid = be32(v),
                        NFTA_GEN_PROC_NAME => {
                            *comm = cstr(v).and_then(|s| std::str::from_utf8(s).ok())
                        }
                        NFTA_GEN_ID => *generation = be32(v),
                        _ => {}
                    }
                }
            }
            return Some(n);
        }
        let name_attr = match msg_type {
            NEWTABLE | DELTABLE | DESTROYTABLE => None,
            NEWCHAIN | DELCHAIN | DESTROYCHAIN => Some(NFTA_CHAIN_NAME),
            NEWRULE | DELRULE | DESTROYRULE | NEWSET | DELSET | DESTROYSET | NEWSETELEM
            | DELSETELEM | DESTROYSETELEM | NEWOBJ | DELOBJ | DESTROYOBJ | NEWFLOWTABLE
            | DELFLOWTABLE | DESTROYFLOWTABLE => Some(NFTA_OBJECT_NAME),
            // Get/reset replies and traces are not changes.
            _ => return None,
        };
        let is_elems = matches!(msg_type, NEWSETELEM | DELSETELEM | DESTROYSETELEM);
        let (mut table, mut name, mut items) = (None, None, 0);
        for (t, v) in attrs(body) {
            if t == NFTA_TABLE {
                table = cstr(v);
            } else if Some(t) == name_attr {
                name = cstr(v);
            } else if is_elems && t == NFTA_SET_ELEM_LIST_ELEMENTS {
                items = attrs(v).count() as u32;
            }
        }
        Some(Notification::Object {
            portid,
            family,
            msg: msg_type,
            table: table?,
            name,
            items: items.max(u32::from(is_elems)),
        })
    }
}

pub(super) fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

pub(super) fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

pub(super) fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated string attribute without its terminator.
pub(super) fn cstr(v: &[u8]) -> Option<&[u8]> {
    v.split(|b| *b == 0).next()
}

/// Netlink messages in a datagram.
pub(super) fn messages(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    reply::messages(buf).map(|(_, _, _, m)| m)
}

/// Netlink attributes: (type without flags, payload).
pub(super) fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    reply::attrs(buf, 0).map(|(k, v, _)| (k, v))
}
