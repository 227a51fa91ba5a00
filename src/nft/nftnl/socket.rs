//! A NETLINK_NETFILTER socket sized for one batch: the whole batch goes out in a single
//! `sendmsg` (the kernel only treats it as one transaction if it arrives in one skb), and
//! replies are read until the socket is empty.

// The crate denies unsafe code (Cargo.toml [lints]); nix has no setter for the netlink
// socket options NETLINK_CAP_ACK/NETLINK_EXT_ACK and NETLINK_{ADD,DROP}_MEMBERSHIP, so `set_int`
// calls setsockopt itself.
#![allow(unsafe_code)]

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendmsg,
    setsockopt, socket, sockopt,
};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};

const SOL_NETLINK: libc::c_int = 270;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;

/// A NETLINK_NETFILTER socket bound to a port id of the kernel's choosing, joined to the
/// multicast `groups` (a bit mask, bit `group - 1`; 0 for none).
pub(crate) fn netfilter_socket(groups: u32) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    Ok(fd)
}

/// Which socket buffer [`set_buffer`] sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Buffer {
    Send,
    Receive,
}

/// Sizes a socket buffer past `net.core.[rw]mem_max` with `SO_*BUFFORCE`. That needs
/// CAP_NET_ADMIN in the initial user namespace; as root of a user namespace (a test run under
/// `unshare --user`), where nf_tables itself works, it fails with EPERM and the buffer is
/// sized as far as `[rw]mem_max` allows instead: a batch larger than that is then refused
/// with EMSGSIZE, which names the problem.
pub(crate) fn set_buffer(fd: &OwnedFd, which: Buffer, bytes: usize) -> io::Result<()> {
    let forced = match which {
        Buffer::Send => setsockopt(fd, sockopt::SndBufForce, &bytes),
        Buffer::Receive => setsockopt(fd, sockopt::RcvBufForce, &bytes),
    };
    match forced {
        Err(nix::errno::Errno::EPERM) => {
            tracing::debug!("{which:?} buffer: SO_*BUFFORCE not permitted, capped by [rw]mem_max");
            match which {
                Buffer::Send => setsockopt(fd, sockopt::SndBuf, &bytes)?,
                Buffer::Receive => setsockopt(fd, sockopt::RcvBuf, &bytes)?,
            }
            Ok(())
        }
        other => Ok(other?),
    }
}

const NETLINK_ADD_MEMBERSHIP: libc::c_int = 1;
const NETLINK_DROP_MEMBERSHIP: libc::c_int = 2;

/// Joins or leaves netlink multicast group `group` (the drift monitor's quiet window).
pub(crate) fn set_membership(fd: &OwnedFd, group: u32, join: bool) -> io::Result<()> {
    let opt = if join {
        NETLINK_ADD_MEMBERSHIP
    } else {
        NETLINK_DROP_MEMBERSHIP
    };
    set_int(fd, opt, group as libc::c_int)
}

fn set_int(fd: &OwnedFd, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: valid open fd; `v` is a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            SOL_NETLINK,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[derive(Debug)]
pub struct NlSocket {
    fd: OwnedFd,
    send_bytes: usize,
    recv_bytes: usize,
}

impl NlSocket {
    /// Opens a socket whose buffers hold `send_bytes` of batch and `recv_bytes` of replies.
    /// The `*BUFFORCE` options bypass `net.core.[rw]mem_max` (CAP_NET_ADMIN, which nft
    /// needs anyway).
    pub fn open(send_bytes: usize, recv_bytes: usize) -> io::Result<NlSocket> {
        let mut s = NlSocket {
            fd: netfilter_socket(0)?,
            send_bytes: 0,
            recv_bytes: 0,
        };
        s.grow(send_bytes.max(1), recv_bytes.max(1))?;
        // Errors carry only the failing message's header (not its up to 64 KiB payload)
        // plus extended-ack attributes: the kernel's message and the failing attribute.
        s.set_int(NETLINK_CAP_ACK, 1)?;
        s.set_int(NETLINK_EXT_ACK, 1)?;
        Ok(s)
    }

    /// Grows the buffers, in place, to hold a batch of `send_bytes` and `recv_bytes` of
    /// replies. In place because closing any netfilter socket runs nf_tables' release
    /// notifier, which takes the commit mutex and waits out the pending transaction clean-up
    /// (an RCU grace period): every other commit on the node, the DNS learner's included,
    /// waits with it.
    pub fn grow(&mut self, send_bytes: usize, recv_bytes: usize) -> io::Result<()> {
        // The kernel doubles the value and refuses a message larger than the buffer.
        let clamp = |n: usize| n.clamp(1 << 16, i32::MAX as usize / 2);
        if send_bytes > self.send_bytes {
            set_buffer(&self.fd, Buffer::Send, clamp(send_bytes))?;
            self.send_bytes = send_bytes;
        }
        if recv_bytes > self.recv_bytes {
            set_buffer(&self.fd, Buffer::Receive, clamp(recv_bytes))?;
            self.recv_bytes = recv_bytes;
        }
        Ok(())
    }

    fn set_int(&self, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
        set_int(&self.fd, opt, v)
    }

    /// Sends all pages of a batch as one message.
    pub fn send(&self, pages: &[&[u8]]) -> io::Result<()> {
        let iov: Vec<IoSlice> = pages.iter().map(|p| IoSlice::new(p)).collect();
        let total: usize = pages.iter().map(|p| p.len()).sum();
        let kernel = NetlinkAddr::new(0, 0);
        let sent = sendmsg(
            self.fd.as_raw_fd(),
            &iov,
            &[],
            MsgFlags::empty(),
            Some(&kernel),
        )?;
        if sent != total {
            return Err(io::Error::other(format!(
                "netlink sendmsg sent {sent} of {total} bytes"
            )));
        }
        Ok(())
    }

    /// One datagram of replies, or `None` when nothing is queued. The kernel processes
    /// a batch inside `sendmsg`, so every reply is queued by the time it returns.
    pub fn recv_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match recv(self.fd.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => Ok(Some(n)),
            Err(nix::errno::Errno::EAGAIN) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffers(s: &NlSocket) -> (usize, usize) {
        let send = nix::sys::socket::getsockopt(&s.fd, sockopt::SndBuf).unwrap();
        let recv = nix::sys::socket::getsockopt(&s.fd, sockopt::RcvBuf).unwrap();
        (send, recv)
    }

    /// Sizes below the default `[rw]mem_max` (212,992), so the test needs no privilege; the
    /// kernel reports twice what was set.
    #[test]
    fn a_socket_grows_in_place_and_never_shrinks() {
        let mut s = NlSocket::open(1, 1).expect("a netfilter socket");
        assert_eq!(buffers(&s), (2 << 16, 2 << 16), "the 64 KiB floor");
        s.grow(100_000, 1).unwrap();
        assert_eq!(buffers(&s), (200_000, 2 << 16));
        s.grow(50_000, 90_000).unwrap();
        assert_eq!(
            buffers(&s),
            (200_000, 180_000),
            "only the larger need changes"
        );
    }
}
