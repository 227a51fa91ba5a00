//! Transparent sockets (IP_TRANSPARENT), safe through nix: the listeners the kernel's
//! `tproxy` hands steered pod DNS to, and the per-answer socket that sends a UDP answer to
//! the pod from the server's address (the address the pod asked).

use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn,
    SockaddrStorage, bind, listen, recvmsg, setsockopt, socket, sockopt,
};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};

fn v4(addr: SocketAddr) -> io::Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(io::Error::other(
            "IPv6 transparent sockets are not supported",
        )),
    }
}

fn transparent(kind: SockType) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Inet,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::IpTransparent, &true)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    Ok(fd)
}

/// The UDP listener at `0.0.0.0:port`: each datagram comes with its original destination.
pub fn udp_listener(port: u16) -> io::Result<tokio::net::UdpSocket> {
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let fd = transparent(SockType::Datagram)?;
    setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(v4(addr)?))?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// The TCP listener at `0.0.0.0:port`: an accepted connection's local address is the server
/// the pod connected to.
pub fn tcp_listener(port: u16, backlog: i32) -> io::Result<tokio::net::TcpListener> {
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let fd = transparent(SockType::Stream)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(v4(addr)?))?;
    listen(&fd, Backlog::new(backlog).map_err(io::Error::from)?)?;
    tokio::net::TcpListener::from_std(std::net::TcpListener::from(fd))
}

/// A UDP socket bound to `server` (not a local address: IP_TRANSPARENT allows it), for
/// sending one answer to the pod with the source it expects. Left unconnected: a connected
/// socket would catch the pod's next query from the same port before `tproxy` does.
pub fn answer_socket(server: SocketAddr) -> io::Result<tokio::net::UdpSocket> {
    let fd = transparent(SockType::Datagram)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(v4(server)?))?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// One datagram from the listener: its length, sender and original destination. Called
/// from `UdpSocket::async_io` (nonblocking: `WouldBlock` when there is none).
pub fn recv_with_orig_dst(
    sock: &tokio::net::UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, SocketAddr)> {
    let mut cmsg = nix::cmsg_space!(nix::libc::sockaddr_in);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
    )?;
    let from = msg
        .address
        .and_then(|a| a.as_sockaddr_in().map(|s| SocketAddr::V4((*s).into())))
        .ok_or_else(|| io::Error::other("datagram without an IPv4 source"))?;
    let orig = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::Ipv4OrigDstAddr(sa) => {
            Some(SocketAddr::V4(SockaddrIn::from(sa).into()))
        }
        _ => None,
    });
    let orig = orig.ok_or_else(|| io::Error::other("datagram without its original destination"))?;
    Ok((msg.bytes, from, orig))
}
