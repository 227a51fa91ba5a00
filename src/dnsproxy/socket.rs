//! Transparent sockets (IP_TRANSPARENT), safe through nix: the listeners the kernel's
//! `tproxy` hands steered pod DNS to, and the per-answer socket that sends a UDP answer to
//! the pod from the server's address (the address the pod asked). IP_TRANSPARENT at
//! `SOL_IP` also marks an IPv6 socket transparent (the kernel passes it down to the IPv4
//! option handler), which is what nix offers for both families.

use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn,
    SockaddrIn6, SockaddrStorage, bind, listen, recvmsg, setsockopt, socket, sockopt,
};
use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

fn transparent(kind: SockType, addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(
        family,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::IpTransparent, &true)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        // IPv4 has its own listener.
        setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    Ok(fd)
}

fn bind_to(fd: &OwnedFd, addr: SocketAddr) -> io::Result<()> {
    match addr {
        SocketAddr::V4(a) => bind(fd.as_raw_fd(), &SockaddrIn::from(a))?,
        SocketAddr::V6(a) => bind(fd.as_raw_fd(), &SockaddrIn6::from(a))?,
    }
    Ok(())
}

fn any(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

/// The UDP listener at `0.0.0.0:port` (or `[::]:port`): each datagram comes with its
/// original destination.
pub fn udp_listener(v6: bool, port: u16) -> io::Result<tokio::net::UdpSocket> {
    udp_listener_at(any(v6, port))
}

/// A transparent UDP listener at `addr` (a resolver's own address and port, not a local
/// one), each datagram with its original destination as from [`udp_listener`].
pub fn udp_listener_at(addr: SocketAddr) -> io::Result<tokio::net::UdpSocket> {
    let v6 = addr.is_ipv6();
    let fd = transparent(SockType::Datagram, addr)?;
    // The original destination, and the interface the datagram came in on (a forged
    // source address does not change it).
    if v6 {
        setsockopt(&fd, sockopt::Ipv6OrigDstAddr, &true)?;
        setsockopt(&fd, sockopt::Ipv6RecvPacketInfo, &true)?;
    } else {
        setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
        setsockopt(&fd, sockopt::Ipv4PacketInfo, &true)?;
    }
    // Every steered pod of the node shares this queue: the default (~200 KiB, a few hundred
    // datagrams) overflows under one pod's burst and drops its neighbours' queries (measured:
    // 2,000 junk datagrams from one pod lost the next lookup 3 times in 15 on a loaded
    // 2-core node). FORCE goes past net.core.rmem_max (we hold CAP_NET_ADMIN); the plain
    // option is the fallback, capped by the sysctl.
    if setsockopt(&fd, sockopt::RcvBufForce, &LISTENER_RCVBUF).is_err() {
        setsockopt(&fd, sockopt::RcvBuf, &LISTENER_RCVBUF)?;
    }
    bind_to(&fd, addr)?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// The UDP listener's receive queue: ~5,000 datagrams of a typical query.
const LISTENER_RCVBUF: usize = 4 << 20;

/// The TCP listener at `0.0.0.0:port` (or `[::]:port`): an accepted connection's local
/// address is the server the pod connected to.
pub fn tcp_listener(v6: bool, port: u16, backlog: i32) -> io::Result<tokio::net::TcpListener> {
    tcp_listener_at(any(v6, port), backlog)
}

/// A transparent TCP listener at `addr` (see [`udp_listener_at`]).
pub fn tcp_listener_at(addr: SocketAddr, backlog: i32) -> io::Result<tokio::net::TcpListener> {
    let fd = transparent(SockType::Stream, addr)?;
    bind_to(&fd, addr)?;
    listen(&fd, Backlog::new(backlog).map_err(io::Error::from)?)?;
    tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd))
}

/// Whether `addr` is one of the node's own addresses (a plain, non-transparent bind to it
/// works): a listener there would take the port from the node's own DNS server.
pub fn is_local(addr: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((addr, 0)).is_ok()
}

/// A UDP socket bound to `server` (not a local address: IP_TRANSPARENT allows it), for
/// sending one answer to the pod with the source it expects. Left unconnected: a connected
/// socket would catch the pod's next query from the same port before `tproxy` does.
pub fn answer_socket(server: SocketAddr) -> io::Result<tokio::net::UdpSocket> {
    let fd = transparent(SockType::Datagram, server)?;
    bind_to(&fd, server)?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// One datagram from a listener.
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// The original destination (the server the pod asked).
    pub orig_dst: SocketAddr,
    /// The interface it came in on (0 if the kernel did not say).
    pub ifindex: u32,
}

/// One datagram from a listener with its original destination and input interface. Called
/// from `UdpSocket::async_io` (nonblocking: `WouldBlock` when there is none).
pub fn recv_with_orig_dst(sock: &tokio::net::UdpSocket, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg = nix::cmsg_space!(nix::libc::sockaddr_in6, nix::libc::in6_pktinfo);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
    )?;
    let from = msg
        .address
        .and_then(|a| {
            a.as_sockaddr_in()
                .map(|s| SocketAddr::V4((*s).into()))
                .or_else(|| a.as_sockaddr_in6().map(|s| SocketAddr::V6((*s).into())))
        })
        .ok_or_else(|| io::Error::other("datagram without a source"))?;
    let (mut orig, mut ifindex) = (None, 0);
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4OrigDstAddr(sa) => {
                orig = Some(SocketAddr::V4(SockaddrIn::from(sa).into()))
            }
            ControlMessageOwned::Ipv6OrigDstAddr(sa) => {
                orig = Some(SocketAddr::V6(SockaddrIn6::from(sa).into()))
            }
            ControlMessageOwned::Ipv4PacketInfo(info) => ifindex = info.ipi_ifindex as u32,
            ControlMessageOwned::Ipv6PacketInfo(info) => ifindex = info.ipi6_ifindex,
            _ => {}
        }
    }
    let orig = orig.ok_or_else(|| io::Error::other("datagram without its original destination"))?;
    Ok(Received {
        len: msg.bytes,
        from,
        orig_dst: orig,
        ifindex,
    })
}

/// Which input interfaces are Linux bridges (`/sys/class/net/<name>/bridge`, read-only),
/// cached per interface index; forgotten all at once past [`Bridges::MAX`] (pods come and
/// go, and each new veth gets a new index).
#[derive(Clone, Default)]
pub struct Bridges(Arc<Mutex<HashMap<u32, bool>>>);

impl Bridges {
    const MAX: usize = 4096;

    pub fn is_bridge(&self, ifindex: u32) -> bool {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = known.get(&ifindex) {
            return *b;
        }
        let is = nix::net::if_::if_indextoname(ifindex).is_ok_and(|name| {
            std::path::Path::new("/sys/class/net")
                .join(name.to_string_lossy().as_ref())
                .join("bridge")
                .is_dir()
        });
        if known.len() >= Self::MAX {
            known.clear();
        }
        known.insert(ifindex, is);
        is
    }
}
