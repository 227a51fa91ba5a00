//! The 5-tuple of a logged packet, from the first bytes of its IP header (what NFLOG
//! copies). Pure; a truncated or foreign header gives what it can.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Source, destination, protocol and ports (0 for protocols without ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiveTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or the number.
pub struct ProtoName(pub u8);

impl fmt::Display for ProtoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("icmp"),
            6 => f.write_str("tcp"),
            17 => f.write_str("udp"),
            58 => f.write_str("icmpv6"),
            132 => f.write_str("sctp"),
            n => write!(f, "{n}"),
        }
    }
}

/// The 5-tuple of an IPv4 or IPv6 packet (`None`: not IP or too short for addresses).
/// IPv6 extension headers are not walked: the protocol is then the first next-header.
pub fn five_tuple(packet: &[u8]) -> Option<FiveTuple> {
    let (src, dst, proto, l4) = match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let addr = |at: usize| -> Option<IpAddr> {
                let b: [u8; 4] = packet.get(at..at + 4)?.try_into().ok()?;
                Some(Ipv4Addr::from(b).into())
            };
            // A non-first fragment has no L4 header.
            let frag_off = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x1fff;
            let l4 = if frag_off == 0 {
                packet.get(ihl..)
            } else {
                None
            };
            (addr(12)?, addr(16)?, *packet.get(9)?, l4)
        }
        6 => {
            let addr = |at: usize| -> Option<IpAddr> {
                let b: [u8; 16] = packet.get(at..at + 16)?.try_into().ok()?;
                Some(Ipv6Addr::from(b).into())
            };
            (addr(8)?, addr(24)?, *packet.get(6)?, packet.get(40..))
        }
        _ => return None,
    };
    let has_ports = matches!(proto, 6 | 17 | 132);
    let port = |at: usize| -> u16 {
        l4.filter(|_| has_ports)
            .and_then(|l4| Some(u16::from_be_bytes([*l4.get(at)?, *l4.get(at + 1)?])))
            .unwrap_or(0)
    };
    Some(FiveTuple {
        src,
        dst,
        proto,
        sport: port(0),
        dport: port(2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_tcp_and_ipv6_udp_headers_give_their_tuple() {
        let mut v4 = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        v4.extend([10, 128, 0, 5, 203, 0, 113, 10]);
        v4.extend([0x9c, 0x40, 0, 80]);
        let t = five_tuple(&v4).unwrap();
        assert_eq!(t.src, "10.128.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(t.dst, "203.0.113.10".parse::<IpAddr>().unwrap());
        assert_eq!((t.proto, t.sport, t.dport), (6, 40000, 80));
        assert_eq!(ProtoName(t.proto).to_string(), "tcp");

        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend("fd01::5".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend("2001:db8:1::10".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend([0, 53, 1, 187]);
        let t = five_tuple(&v6).unwrap();
        assert_eq!((t.proto, t.sport, t.dport), (17, 53, 443));
        assert_eq!(t.dst, "2001:db8:1::10".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn short_foreign_and_fragmented_packets_do_not_panic() {
        assert_eq!(five_tuple(&[]), None);
        assert_eq!(five_tuple(&[0x45, 0, 0]), None);
        assert_eq!(five_tuple(&[0x20; 64]), None);
        // A non-first IPv4 fragment: addresses, no ports.
        let mut frag = vec![0x45, 0, 0, 40, 0, 0, 0x00, 0x10, 64, 17, 0, 0];
        frag.extend([10, 0, 0, 1, 10, 0, 0, 2, 0, 53, 0, 53]);
        let t = five_tuple(&frag).unwrap();
        assert_eq!((t.sport, t.dport), (0, 0));
        // ICMP: no ports even with bytes after the header.
        let mut icmp = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0];
        icmp.extend([10, 0, 0, 1, 10, 0, 0, 2, 8, 0, 0, 0]);
        assert_eq!(five_tuple(&icmp).unwrap().sport, 0);
    }
}
