//! What a rule loads from a packet: the address families, the packet fields that are matched
//! or used as lookup keys, and the nft datatypes of their values (also the datatypes of set
//! and map declarations).

#[cfg(doc)]
use super::{MatchOp, Value};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

/// A packet field that can be loaded and matched, or used as (part of) a lookup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `meta nfproto` (ipv4 / ipv6).
    NfProto,
    /// `meta l4proto`.
    L4Proto,
    /// `meta protocol`: the frame's ethertype (IPv4, IPv6), in the inet and bridge families.
    EtherType,
    Ip4Saddr,
    Ip4Daddr,
    Ip6Saddr,
    Ip6Daddr,
    /// `th sport` (transport header, any L4 protocol with ports).
    ThSport,
    /// `th dport`.
    ThDport,
    /// `meta mark`.
    Mark,
    /// `meta iifname`.
    IifName,
    /// `meta oifname`.
    OifName,
    /// `tcp flags` (match with [`MatchOp::Masked`] and [`Value::TcpFlags`], after
    /// `meta l4proto tcp`).
    TcpFlags,
    /// `ip frag-off`: the IPv4 header's flags and fragment offset, 16 bits big-endian (match
    /// with [`MatchOp::Masked`] and [`Value::Port`] as the 16-bit value: `& 0x1fff != 0` is a
    /// non-first fragment, `& 0x3fff == 0x2000` a first fragment).
    Ip4FragOff,
    /// `frag frag-off`: the 13-bit fragment offset of an IPv6 fragment header (an extension
    /// header, found by walking the header chain); only compared with `==` / `!=` a value
    /// (`!= 0` is a non-first fragment, `0` a first one). A packet without a fragment header
    /// matches neither.
    Ip6FragOff,
    /// `ct state` (a bit mask: match with [`MatchOp::AnyFlag`]).
    CtState,
    /// `ct mark`.
    CtMark,
    /// `ct direction` (match with a [`Value::CtDir`]): `original` for packets going the way
    /// the connection's first packet went, `reply` for its answers.
    CtDirection,
    /// `fib daddr type` (match with an [`Value::AddrType`]).
    FibDaddrType,
    /// `fib saddr type`: `local` for packets the node itself sends.
    FibSaddrType,
    /// `fib saddr . iif oif` as a presence test (match with [`Value::Exists`]): whether the
    /// route back to the source leaves through the interface the packet came in on (a
    /// strict reverse-path check, whatever the `rp_filter` sysctl says).
    FibSaddrIifOif,
    /// `numgen random mod N`: a random number in 0..N, for load balancing.
    NumgenRandom(u32),
    /// `ip daddr & 0.0.0.15`: the destination address with all but its last four bits
    /// cleared, a key on its own (never in a concatenation): which of 16 shards a
    /// destination's map elements live in ([`low_nibble`]).
    Ip4DaddrLowNibble,
    /// `ip6 daddr & ::f`: the same for IPv6.
    Ip6DaddrLowNibble,
}

/// The address with all but its last four bits cleared: what [`Field::Ip4DaddrLowNibble`]
/// and [`Field::Ip6DaddrLowNibble`] load.
pub fn low_nibble(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(a.to_bits() & 0xf)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(a.to_bits() & 0xf)),
    }
}

impl Field {
    /// The nft datatype of the field's values.
    pub fn data_type(self) -> DataType {
        match self {
            Field::NfProto => DataType::NfProto,
            Field::L4Proto => DataType::InetProto,
            Field::EtherType => DataType::EtherType,
            Field::Ip4Saddr | Field::Ip4Daddr | Field::Ip4DaddrLowNibble => DataType::Ipv4Addr,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Ip6DaddrLowNibble => DataType::Ipv6Addr,
            Field::ThSport | Field::ThDport | Field::Ip4FragOff | Field::Ip6FragOff => {
                DataType::InetService
            }
            Field::Mark | Field::CtMark => DataType::Mark,
            Field::IifName | Field::OifName => DataType::IfName,
            Field::CtState => DataType::CtState,
            Field::CtDirection => DataType::CtDir,
            Field::FibDaddrType | Field::FibSaddrType => DataType::AddrType,
            Field::FibSaddrIifOif => DataType::Boolean,
            Field::TcpFlags => DataType::TcpFlag,
            Field::NumgenRandom(_) => DataType::Integer,
        }
    }

    /// `ip daddr` or `ip6 daddr`.
    pub fn daddr(family: IpFamily) -> Field {
        match family {
            IpFamily::V4 => Field::Ip4Daddr,
            IpFamily::V6 => Field::Ip6Daddr,
        }
    }

    /// `ip saddr` or `ip6 saddr`.
    pub fn saddr(family: IpFamily) -> Field {
        match family {
            IpFamily::V4 => Field::Ip4Saddr,
            IpFamily::V6 => Field::Ip6Saddr,
        }
    }

    /// The address family a field implies, if any (nft adds `meta nfproto` for it).
    pub fn family(self) -> Option<IpFamily> {
        match self {
            Field::Ip4Saddr | Field::Ip4Daddr | Field::Ip4FragOff | Field::Ip4DaddrLowNibble => {
                Some(IpFamily::V4)
            }
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Ip6FragOff | Field::Ip6DaddrLowNibble => {
                Some(IpFamily::V6)
            }
            _ => None,
        }
    }
}

/// nft datatypes used in set/map declarations and as field types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Mark,
    IfName,
    NfProto,
    /// `ether_type`.
    EtherType,
    CtState,
    /// `ct_dir`: a conntrack direction.
    CtDir,
    AddrType,
    /// `exists` / `missing`.
    Boolean,
    /// `tcp_flag`: a TCP header's flags byte.
    TcpFlag,
    Integer,
    Verdict,
}

impl DataType {
    /// `ipv4_addr` or `ipv6_addr`.
    pub fn addr(family: IpFamily) -> DataType {
        match family {
            IpFamily::V4 => DataType::Ipv4Addr,
            IpFamily::V6 => DataType::Ipv6Addr,
        }
    }
}
