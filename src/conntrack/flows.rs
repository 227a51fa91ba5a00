//! The keep-alive pass's read of conntrack: (original source, original destination, TCP state)
//! of every entry, straight from the dump's bytes. Parsed into typed attributes
//! (`netlink-packet-netfilter`), a node's 20,000 entries cost ~60 ms of CPU per pass, about
//! as much as the kernel's side of the dump; the pass needs three fields of each.

use crate::nft::nftnl::reply::{NFNL_HDRLEN, NLMSG_DONE, NLMSG_ERROR, attrs, error_code, messages};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;

/// An entry's original source and destination, and its TCP state (none for other protocols).
pub(super) type Endpoints = (IpAddr, IpAddr, Option<u8>);

/// Appends the entries of one datagram of a dump to `out`; `Ok(true)` once the dump is done.
pub(super) fn read(datagram: &[u8], out: &mut Vec<Endpoints>) -> io::Result<bool> {
    for (kind, _, _, msg) in messages(datagram) {
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                return match error_code(msg) {
                    0 => Ok(true),
                    code => Err(io::Error::from_raw_os_error(-code)),
                };
            }
            _ => out.extend(endpoints(msg.get(NFNL_HDRLEN..).unwrap_or(&[]))),
        }
    }
    Ok(false)
}

fn endpoints(entry: &[u8]) -> Option<Endpoints> {
    let (mut src, mut dst, mut tcp_state) = (None, None, None);
    for (kind, data, _) in attrs(entry, 0) {
        match kind {
            CTA_TUPLE_ORIG => {
                for (kind, ips, _) in attrs(data, 0) {
                    if kind != CTA_TUPLE_IP {
                        continue;
                    }
                    for (kind, addr, _) in attrs(ips, 0) {
                        match kind {
                            CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = ip(addr),
                            CTA_IP_V4_DST | CTA_IP_V6_DST => dst = ip(addr),
                            _ => {}
                        }
                    }
                }
            }
            CTA_PROTOINFO => {
                let tcp = attrs(data, 0).find(|(kind, _, _)| *kind == CTA_PROTOINFO_TCP);
                if let Some((_, tcp, _)) = tcp {
                    tcp_state = attrs(tcp, 0)
                        .find(|(kind, _, _)| *kind == CTA_PROTOINFO_TCP_STATE)
                        .and_then(|(_, state, _)| state.first().copied());
                }
            }
            _ => {}
        }
    }
    Some((src?, dst?, tcp_state))
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?).into()),
        16 => Some(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?).into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_netfilter::conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple,
        Protocol, Tuple,
    };
    use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

    /// A dump message as the kernel sends it, encoded by the typed crate.
    fn entry(src: IpAddr, dst: IpAddr, tcp_state: Option<u8>) -> Vec<u8> {
        let tuple = |a: IpAddr, b: IpAddr| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(a),
                    IPTuple::DestinationAddress(b),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(if tcp_state.is_some() {
                        Protocol::Tcp
                    } else {
                        Protocol::Udp
                    }),
                    ProtoTuple::SourcePort(40000),
                    ProtoTuple::DestinationPort(443),
                ]),
            ]
        };
        let mut attrs = vec![
            ConntrackAttribute::CtaTupleOrig(tuple(src, dst)),
            ConntrackAttribute::CtaTupleReply(tuple(dst, src)),
        ];
        if let Some(s) = tcp_state {
            attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
                vec![ProtoInfoTCP::State(s)],
            )]));
        }
        let family = match src {
            IpAddr::V4(_) => NetfilterProtoFamily::IPv4,
            IpAddr::V6(_) => NetfilterProtoFamily::IPv6,
        };
        let mut msg = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(family, 0, 0),
                ConntrackMessage::New(attrs),
            )),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    fn control(kind: u16, code: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&20u32.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&code.to_ne_bytes());
        m
    }

    #[test]
    fn entries_of_both_families_are_read_until_the_dump_is_done() {
        let (pod, web): (IpAddr, IpAddr) = (
            "10.128.0.5".parse().unwrap(),
            "198.51.100.7".parse().unwrap(),
        );
        let (pod6, web6): (IpAddr, IpAddr) =
            ("fd00::5".parse().unwrap(), "2001:db8::7".parse().unwrap());
        let mut datagram = entry(pod, web, Some(3));
        datagram.extend(entry(pod6, web6, None));
        let mut out = Vec::new();
        assert!(!read(&datagram, &mut out).unwrap(), "no DONE yet");
        assert_eq!(out, [(pod, web, Some(3)), (pod6, web6, None)]);
        assert!(read(&control(NLMSG_DONE, 0), &mut out).unwrap());
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn an_error_ends_the_dump_with_its_errno() {
        let err = read(&control(NLMSG_ERROR, -libc::EPERM), &mut Vec::new()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        assert!(read(&control(NLMSG_ERROR, 0), &mut Vec::new()).unwrap());
    }
}
