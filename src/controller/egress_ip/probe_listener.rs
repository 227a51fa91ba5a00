//! The receiving side of the probes, on a node being probed (fencing, [`super::fence`]): raw
//! ICMP and ICMPv6 sockets that pick out echo requests shaped like probes, each with the
//! interface it arrived on (`IP_PKTINFO` / `IPV6_PKTINFO`: the kernel's word, which no
//! forged header changes). Whether one is the assigner's is for the fence to say
//! ([`super::uplinks`], [`super::probe_auth`]).
//!
//! A raw socket sees every ICMP message of the node. Each listener socket carries a socket
//! filter ([`super::probe_filter`]) from its first moment: until the fence names the uplinks
//! it passes nothing, then only probe-shaped echo requests arriving on them, so a flood
//! (from a pod, or of anything else) is dropped in the kernel and cannot fill the receive
//! queue ahead of the assigner's probes.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockProtocol, SockaddrStorage, recvmsg,
    setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::probe::{ICMP_ECHO, ICMP6_ECHO, datagram, raw};
use super::probe_auth;
use super::probe_filter;

pub struct Listener {
    v4: Option<UdpSocket>,
    v6: Option<UdpSocket>,
}

impl Listener {
    /// Both families' sockets (one is enough), passing nothing yet.
    pub fn open() -> io::Result<Listener> {
        match (open_one(true), open_one(false)) {
            (Err(e), Err(_)) => Err(e),
            (v4, v6) => Ok(Listener {
                v4: v4.ok(),
                v6: v6.ok(),
            }),
        }
    }

    /// From now on the kernel queues only probe-shaped echo requests that arrive on
    /// `interfaces` (replacing the filter is atomic: no packet passes unfiltered).
    pub fn admit_only(&self, interfaces: &[u32]) -> io::Result<()> {
        for (sock, v4) in [(&self.v4, true), (&self.v6, false)] {
            if let Some(s) = sock {
                attach(s, &probe_filter::program(v4, interfaces))?;
            }
        }
        Ok(())
    }

    /// Waits for the next ICMP message: an echo request with a probe's magic, or `None`.
    pub async fn request(&self, b4: &mut [u8], b6: &mut [u8]) -> Option<Request> {
        async fn one(sock: Option<&UdpSocket>, buf: &mut [u8]) -> io::Result<Received> {
            match sock {
                Some(s) => {
                    s.async_io(Interest::READABLE, || recv_with_ifindex(s, buf))
                        .await
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            r = one(self.v4.as_ref(), b4) => r.ok().and_then(|r| parse_request(true, &b4[..r.len], r.from, r.ifindex)),
            r = one(self.v6.as_ref(), b6) => r.ok().and_then(|r| parse_request(false, &b6[..r.len], r.from, r.ifindex)),
        }
    }
}

fn open_one(v4: bool) -> io::Result<UdpSocket> {
    let fd = if v4 {
        raw(AddressFamily::Inet, SockProtocol::Icmp)?
    } else {
        raw(AddressFamily::Inet6, SockProtocol::IcmpV6)?
    };
    attach(&fd, &probe_filter::program(v4, &[]))?;
    // What arrived between socket() and the filter: dropped (the socket is nonblocking).
    let mut buf = [0u8; 64];
    while nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT).is_ok() {}
    if v4 {
        setsockopt(&fd, sockopt::Ipv4PacketInfo, &true)?;
    } else {
        setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true)?;
    }
    datagram(fd)
}

fn attach(sock: &impl AsFd, program: &[probe_filter::Insn]) -> io::Result<()> {
    let insns: Vec<socket2::SockFilter> = program
        .iter()
        .map(|&(code, jt, jf, k)| socket2::SockFilter::new(code, jt, jf, k))
        .collect();
    socket2::SockRef::from(sock).attach_filter(&insns)
}

struct Received {
    len: usize,
    from: Option<IpAddr>,
    ifindex: u32,
}

/// One message with its source and arrival interface (nonblocking: `WouldBlock` when none).
fn recv_with_ifindex(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg = nix::cmsg_space!(nix::libc::in6_pktinfo);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let from = msg.address.and_then(|a| {
        (a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())))
            .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
    });
    // 0 (no interface) when the kernel did not say: admitted nowhere.
    let mut ifindex = 0;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(info) => ifindex = info.ipi_ifindex as u32,
            ControlMessageOwned::Ipv6PacketInfo(info) => ifindex = info.ipi6_ifindex,
            _ => {}
        }
    }
    Ok(Received {
        len: msg.bytes,
        from,
        ifindex,
    })
}

/// An echo request that may be a probe: its source, the interface it arrived on and where
/// its payload lies in the buffer it was read into (the IPv4 one when `v4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub from: IpAddr,
    pub ifindex: u32,
    pub v4: bool,
    pub payload: std::ops::Range<usize>,
}

/// An echo request whose payload starts with the probes' magic (IPv4 raw packets start with
/// the IP header, whose source is taken; IPv6 ones with the ICMPv6 header, the source is the
/// socket's).
pub(super) fn parse_request(
    v4: bool,
    pkt: &[u8],
    from: Option<IpAddr>,
    ifindex: u32,
) -> Option<Request> {
    let (start, want, from) = if v4 {
        let ihl = usize::from(*pkt.first()? & 0x0f) * 4;
        let src = Ipv4Addr::from(<[u8; 4]>::try_from(pkt.get(12..16)?).ok()?);
        (ihl, ICMP_ECHO, IpAddr::V4(src))
    } else {
        (0, ICMP6_ECHO, from?)
    };
    let icmp = pkt.get(start..)?;
    let magic = icmp.get(8..16)? == probe_auth::MAGIC;
    (icmp[0] == want && icmp[1] == 0 && magic).then(|| Request {
        from,
        ifindex,
        v4,
        payload: start + 8..pkt.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::probe::{ICMP6_ECHO_REPLY, echo};
    use super::*;
    use crate::controller::egress_ip::ip;
    use probe_auth::PAYLOAD_LEN;

    use probe_auth::NO_KEY;

    #[test]
    fn a_probed_node_picks_out_requests_with_the_magic_and_their_source() {
        let any = Some(ip("fd00::9"));
        let v6 = echo(ICMP6_ECHO, 7, 1, &NO_KEY, false);
        let want6 = Request {
            from: ip("fd00::9"),
            ifindex: 2,
            v4: false,
            payload: 8..8 + PAYLOAD_LEN,
        };
        assert_eq!(parse_request(false, &v6, any, 2), Some(want6));
        assert_eq!(parse_request(false, &v6, None, 2), None, "no source");
        let mut v4 = vec![
            0x45u8, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 3, 10, 0, 0, 1,
        ];
        v4.extend_from_slice(&echo(ICMP_ECHO, 7, 1, &NO_KEY, true));
        let r = parse_request(true, &v4, any, 5).unwrap();
        assert_eq!(r.from, ip("10.0.0.3"), "the IPv4 header's source");
        assert_eq!(r.ifindex, 5);
        assert_eq!(&v4[r.payload], &NO_KEY);
        // Another ping, a reply, a truncated packet: not probes.
        let mut other = v4.clone();
        other[28..36].copy_from_slice(b"abcdefgh");
        assert_eq!(parse_request(true, &other, any, 2), None);
        let reply = echo(ICMP6_ECHO_REPLY, 7, 1, &NO_KEY, false);
        assert_eq!(parse_request(false, &reply, any, 2), None);
        assert_eq!(parse_request(true, &v4[..30], any, 2), None);
        assert_eq!(parse_request(true, &[], any, 2), None);
    }
}
