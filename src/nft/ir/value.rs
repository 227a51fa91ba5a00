//! Typed scalars: the values a field is compared with or a set element is keyed by (addresses,
//! protocols, ports, marks, interface names, ...), totally ordered so they can key sorted maps.

#[cfg(doc)]
use super::consts::tcp_flags;
use super::field::IpFamily;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A typed scalar. Ordering is total so values can key sorted maps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    /// IP protocol number (6 = tcp, 17 = udp, 132 = sctp, 1 = icmp, 58 = icmpv6).
    Proto(u8),
    Port(u16),
    Mark(u32),
    IfName(String),
    NfProto(IpFamily),
    /// Address type for `fib daddr type` (only `local` is used).
    AddrType(AddrType),
    /// A conntrack direction (`ct direction original`).
    CtDir(CtDir),
    /// A plain 32-bit integer (numgen results).
    Integer(u32),
    /// `exists` (true) / `missing` (false), for presence tests.
    Exists(bool),
    /// TCP flags (bits of [`tcp_flags`]).
    TcpFlags(u8),
}

impl Value {
    pub fn ip(addr: IpAddr) -> Value {
        match addr {
            IpAddr::V4(a) => Value::Ipv4(a),
            IpAddr::V6(a) => Value::Ipv6(a),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrType {
    Local,
}

/// Conntrack directions (kernel `IP_CT_DIR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CtDir {
    Original,
    Reply,
}
