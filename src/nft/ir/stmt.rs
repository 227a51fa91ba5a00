//! Statements, the parts of a rule: matches, verdict maps, NAT, masquerade, marks, DSCP,
//! tproxy, reject, dynamic set updates and rate limits, logging and tracing, with the sets and
//! chains each statement refers to.

use super::elem::{ElemKey, Verdict};
use super::field::{Field, IpFamily};
use super::value::Value;
use std::net::IpAddr;

/// Right-hand side of a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchOp {
    /// `key == value` (one value per key field).
    Eq(Vec<Value>),
    /// `key != value`.
    Ne(Vec<Value>),
    /// `key @set`.
    InSet(String),
    /// `key != @set`.
    NotInSet(String),
    /// `key { a, b, c }`: an anonymous constant set.
    InAnon(Vec<ElemKey>),
    /// `ct state established,related`: any of the bits is set (`meta mark & BITS != 0` for
    /// other fields).
    AnyFlag(u32),
    /// `key & mask == value` (`eq`) or `!= value`: a bitmask test of one field.
    Masked { mask: Value, value: Value, eq: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// One field, or several for a concatenation.
    pub key: Vec<Field>,
    pub op: MatchOp,
}

/// Where a verdict map lookup goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapRef {
    Named(String),
    /// An anonymous constant verdict map (e.g. `numgen random mod 3 vmap { 0 : goto a, ... }`).
    Anon(Vec<(ElemKey, Verdict)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    Snat,
    Dnat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatAddr {
    /// A fixed address, optionally with a port (a port needs an L4 protocol match first).
    Fixed(IpAddr, Option<u16>),
    /// The address looked up in a data map: `snat ip to ip saddr map @m`.
    Map { key: Vec<Field>, map: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nat {
    pub kind: NatKind,
    pub family: IpFamily,
    pub addr: NatAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// `reject`: ICMP(v6) port unreachable.
    PortUnreachable,
    /// `reject with tcp reset` (needs a `meta l4proto tcp` match first).
    TcpReset,
    /// `reject with icmpx admin-prohibited`.
    AdminProhibited,
}

/// One nft statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    Match(Match),
    Counter,
    /// `log prefix "..." [group N]`: to the kernel log, or with a group to NFLOG (where a
    /// netlink listener bound to the group reads the packet and the prefix).
    Log {
        prefix: String,
        group: Option<u16>,
    },
    /// `key vmap @map` or `key vmap { ... }`.
    Vmap {
        key: Vec<Field>,
        map: MapRef,
    },
    Nat(Nat),
    /// `masquerade`, with `fully-random` port allocation when asked (kube-proxy's choice:
    /// random source ports avoid the conntrack insert races that drop UDP under load).
    Masquerade {
        fully_random: bool,
    },
    /// `ip dscp set N` / `ip6 dscp set N` (ECN bits kept).
    DscpSet {
        family: IpFamily,
        dscp: u8,
    },
    /// `meta mark set N`.
    MarkSet(u32),
    /// `tproxy ip to :PORT` (prerouting only): hands the packet to the transparent socket
    /// at the port if one exists; without one the rule does not match (the kernel's
    /// `NFT_BREAK`), so traffic goes on unchanged while nobody listens.
    Tproxy {
        family: IpFamily,
        port: u16,
    },
    /// `meta mark set meta mark or BITS`: sets bits, keeps the others.
    MarkOr(u32),
    /// `meta mark set meta mark and MASK`: clears the bits not in MASK.
    MarkAnd(u32),
    /// `update @set { key }`: add or refresh a dynamic set element from the packet;
    /// `update @set { key timeout Ns }` with a timeout of its own (seconds) instead of the
    /// set's.
    SetUpdate {
        set: String,
        key: Vec<Field>,
        timeout: Option<u32>,
    },
    Reject(Reject),
    /// `update @set { key limit rate over N/second burst B packets }`: a token bucket per
    /// key in a dynamic set (nft's meter). Matches (the rule goes on) when the key's
    /// packets are over the rate; a key the full set cannot take does not match.
    SetLimit {
        set: String,
        key: Vec<Field>,
        limit: Limit,
    },
    Verdict(Verdict),
    /// `meta nftrace set 1`: from here on the kernel reports every rule the packet meets, in
    /// every table and hook, to the trace netlink group (`agent explain --trace`).
    Trace,
}

/// A packet rate: `limit rate over PER_SECOND/second burst BURST packets` (`over` only: the
/// statement matches the packets beyond the rate). `burst` is the bucket's depth in
/// packets, what a key may send at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub per_second: u32,
    pub burst: u32,
}

impl Stmt {
    pub fn matches(field: Field, value: Value) -> Stmt {
        Stmt::Match(Match {
            key: vec![field],
            op: MatchOp::Eq(vec![value]),
        })
    }

    pub fn not_matches(field: Field, value: Value) -> Stmt {
        Stmt::Match(Match {
            key: vec![field],
            op: MatchOp::Ne(vec![value]),
        })
    }

    pub fn in_set(key: Vec<Field>, set: impl Into<String>) -> Stmt {
        Stmt::Match(Match {
            key,
            op: MatchOp::InSet(set.into()),
        })
    }

    pub fn not_in_set(key: Vec<Field>, set: impl Into<String>) -> Stmt {
        Stmt::Match(Match {
            key,
            op: MatchOp::NotInSet(set.into()),
        })
    }

    pub fn vmap(key: Vec<Field>, map: impl Into<String>) -> Stmt {
        Stmt::Vmap {
            key,
            map: MapRef::Named(map.into()),
        }
    }

    /// Names of the sets and maps this statement refers to.
    pub fn set_refs(&self) -> Vec<&str> {
        match self {
            Stmt::Match(Match {
                op: MatchOp::InSet(s) | MatchOp::NotInSet(s),
                ..
            }) => vec![s.as_str()],
            Stmt::Vmap {
                map: MapRef::Named(m),
                ..
            } => vec![m.as_str()],
            Stmt::Nat(Nat {
                addr: NatAddr::Map { map, .. },
                ..
            }) => vec![map.as_str()],
            Stmt::SetUpdate { set, .. } | Stmt::SetLimit { set, .. } => vec![set.as_str()],
            _ => Vec::new(),
        }
    }

    /// Names of the chains this statement can transfer control to.
    pub fn chain_refs(&self) -> Vec<&str> {
        match self {
            Stmt::Verdict(v) => v.target().into_iter().collect(),
            Stmt::Vmap {
                map: MapRef::Anon(entries),
                ..
            } => entries.iter().filter_map(|(_, v)| v.target()).collect(),
            _ => Vec::new(),
        }
    }
}
