//! The packet `explain` follows and the node facts the evaluator needs: what a rule can load
//! from a packet ([`Packet::load`]), and what it cannot know offline ([`Loaded::Absent`] and
//! the assumptions [`Packet::assumptions`] lists).

use crate::nft::ir::{
    AddrType, CtDir, Field, IpFamily, Value, ct_state, low_nibble, proto, tcp_flags,
};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Bad packet input, naming the option at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    #[error("--src {src} and --dst {dst} are not of the same address family")]
    MixedFamilies { src: IpAddr, dst: IpAddr },
    #[error("--proto {0:?}: expected tcp, udp, sctp, icmp, icmpv6 or a protocol number 0-255")]
    Proto(String),
    #[error("--{option} is given but protocol {proto} has no ports (use tcp, udp or sctp)")]
    PortWithoutPorts { option: &'static str, proto: String },
    #[error("--ct-state {0:?}: expected new, established, related, invalid or untracked")]
    CtState(String),
    #[error("--proto icmp is IPv4 only and --proto icmpv6 IPv6 only")]
    IcmpFamily,
}

/// The packet as it stands at a point of its walk: NAT and marks change it on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    /// `meta iifname`; `None`: not given, assumed to be no interface the table names.
    pub iif: Option<String>,
    /// `meta oifname` (known after routing); `None` as for `iif`.
    pub oif: Option<String>,
    pub tcp_flags: u8,
    pub ct_state: u32,
    pub mark: u32,
    /// ICMP type and code (`th sport` of an ICMP packet is `type << 8 | code`).
    pub icmp: (u8, u8),
}

/// What the evaluator knows about the node: the addresses `fib ... type local` answers for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub local: BTreeSet<IpAddr>,
}

impl NodeFacts {
    pub fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local.contains(&ip)
    }
}

/// A loaded field: its value, or nothing to match (an IPv4 field of an IPv6 packet, ports of
/// a protocol without ports: nft's implicit dependency makes the match fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    Value(Value),
    Absent,
}

/// Parses `--proto`: a name or a number.
pub fn parse_proto(s: &str) -> Result<u8, PacketError> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(proto::TCP),
        "udp" => Ok(proto::UDP),
        "sctp" => Ok(proto::SCTP),
        "icmp" => Ok(proto::ICMP),
        "icmpv6" | "ipv6-icmp" => Ok(proto::ICMPV6),
        n => n.parse().map_err(|_| PacketError::Proto(s.to_string())),
    }
}

/// Parses `--ct-state`.
pub fn parse_ct_state(s: &str) -> Result<u32, PacketError> {
    match s.to_ascii_lowercase().as_str() {
        "new" => Ok(ct_state::NEW),
        "established" => Ok(ct_state::ESTABLISHED),
        "related" => Ok(ct_state::RELATED),
        "invalid" => Ok(ct_state::INVALID),
        "untracked" => Ok(ct_state::UNTRACKED),
        _ => Err(PacketError::CtState(s.to_string())),
    }
}

/// True for the protocols whose transport header starts with two ports.
pub fn has_ports(p: u8) -> bool {
    matches!(p, proto::TCP | proto::UDP | proto::SCTP)
}

/// The protocol's name for output (`tcp`, or its number).
pub fn proto_name(p: u8) -> String {
    match p {
        proto::TCP => "tcp".into(),
        proto::UDP => "udp".into(),
        proto::SCTP => "sctp".into(),
        proto::ICMP => "icmp".into(),
        proto::ICMPV6 => "icmpv6".into(),
        n => n.to_string(),
    }
}

impl Packet {
    /// A new connection's first packet (`ct state new`, a TCP SYN, an ICMP echo request),
    /// checked for consistency. A port-carrying protocol without `--sport` gets 40000.
    pub fn new(
        src: IpAddr,
        dst: IpAddr,
        proto_num: u8,
        sport: Option<u16>,
        dport: Option<u16>,
    ) -> Result<Packet, PacketError> {
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(PacketError::MixedFamilies { src, dst });
        }
        let ports = has_ports(proto_num);
        for (option, given) in [("sport", sport), ("dport", dport)] {
            if given.is_some() && !ports {
                let proto = proto_name(proto_num);
                return Err(PacketError::PortWithoutPorts { option, proto });
            }
        }
        let icmp = match (proto_num, src.is_ipv4()) {
            (proto::ICMP, true) => (8, 0),
            (proto::ICMPV6, false) => (128, 0),
            (proto::ICMP, false) | (proto::ICMPV6, true) => return Err(PacketError::IcmpFamily),
            _ => (0, 0),
        };
        Ok(Packet {
            src,
            dst,
            proto: proto_num,
            sport: ports.then(|| sport.unwrap_or(40000)),
            dport: ports.then(|| dport.unwrap_or(0)),
            iif: None,
            oif: None,
            tcp_flags: if proto_num == proto::TCP {
                tcp_flags::SYN
            } else {
                0
            },
            ct_state: ct_state::NEW,
            mark: 0,
            icmp,
        })
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.dst)
    }

    /// What the evaluator assumes because the packet or the node facts leave it open.
    pub fn assumptions(&self) -> Vec<String> {
        let mut out = vec![
            "the source address is routed back through the input interface (fib saddr . iif oif exists)".to_string(),
            "the packet is not a fragment".to_string(),
        ];
        if self.iif.is_none() {
            out.push("input interface not given: none the table names".into());
        }
        if self.oif.is_none() {
            out.push("output interface not given: none the table names".into());
        }
        out
    }

    /// The value a rule loads for `field`.
    pub fn load(&self, field: Field, facts: &NodeFacts) -> Loaded {
        let v4 = self.family() == IpFamily::V4;
        let ip = |a: IpAddr, want_v4: bool| {
            if v4 == want_v4 {
                Loaded::Value(Value::ip(a))
            } else {
                Loaded::Absent
            }
        };
        let val = |v: Value| Loaded::Value(v);
        match field {
            Field::NfProto => val(Value::NfProto(self.family())),
            // `meta protocol`: only ever a rate bucket's key (ACL logging), never compared.
            Field::EtherType => val(Value::Integer(if v4 { 0x0800 } else { 0x86dd })),
            Field::L4Proto => val(Value::Proto(self.proto)),
            Field::Ip4Saddr => ip(self.src, true),
            Field::Ip4Daddr => ip(self.dst, true),
            Field::Ip6Saddr => ip(self.src, false),
            Field::Ip6Daddr => ip(self.dst, false),
            Field::Ip4DaddrLowNibble => ip(low_nibble(self.dst), true),
            Field::Ip6DaddrLowNibble => ip(low_nibble(self.dst), false),
            Field::ThSport => self.sport_value(),
            Field::ThDport => self.dport.map_or(Loaded::Absent, |p| val(Value::Port(p))),
            Field::Mark => val(Value::Mark(self.mark)),
            Field::CtMark => val(Value::Mark(0)),
            Field::IifName => val(Value::IfName(self.iif.clone().unwrap_or_default())),
            Field::OifName => val(Value::IfName(self.oif.clone().unwrap_or_default())),
            Field::TcpFlags if self.proto == proto::TCP => val(Value::TcpFlags(self.tcp_flags)),
            Field::TcpFlags => Loaded::Absent,
            Field::Ip4FragOff if v4 => val(Value::Port(0)),
            Field::Ip4FragOff | Field::Ip6FragOff => Loaded::Absent,
            Field::CtState => val(Value::Integer(self.ct_state)),
            Field::CtDirection => val(Value::CtDir(CtDir::Original)),
            Field::FibDaddrType => self.addr_type(self.dst, facts),
            Field::FibSaddrType => self.addr_type(self.src, facts),
            Field::FibSaddrIifOif => val(Value::Exists(true)),
            // Chosen by the evaluator (every bucket is tried), never loaded here.
            Field::NumgenRandom(_) => Loaded::Absent,
        }
    }

    fn sport_value(&self) -> Loaded {
        match self.sport {
            Some(p) => Loaded::Value(Value::Port(p)),
            None if matches!(self.proto, proto::ICMP | proto::ICMPV6) => {
                let (t, c) = self.icmp;
                Loaded::Value(Value::Port(u16::from(t) << 8 | u16::from(c)))
            }
            None => Loaded::Absent,
        }
    }

    /// `fib ... type`: `local` or not; only `local` is ever compared, so any other address
    /// loads as a value no rule names.
    fn addr_type(&self, ip: IpAddr, facts: &NodeFacts) -> Loaded {
        if facts.is_local(ip) {
            Loaded::Value(Value::AddrType(AddrType::Local))
        } else {
            Loaded::Value(Value::Integer(u32::MAX))
        }
    }
}
