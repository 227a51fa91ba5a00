//! The kept dump socket: a NETLINK_NETFILTER socket that sends one dump request (a header
//! plus the request's attributes, [`cstr`] for names) and hands every reply message's
//! attributes to a callback, reporting whether the kernel flagged the dump as interrupted.
//! A socket whose last dump was read to its end goes back to the shared pool for the next
//! reader.

use super::super::reply::{
    NFNL_HDRLEN, NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, error_code,
};
use super::attrs::Attrs;
use crate::nft::engine::NftError;
use crate::nft::ir::Family;
use nix::sys::socket::{MsgFlags, recv, send, setsockopt, sockopt};
use std::os::fd::{AsRawFd, OwnedFd};

uapi!(pub(super) u16: NFT_MSG_GETCHAIN);
uapi!(u16: NLM_F_DUMP, NLM_F_DUMP_INTR);
uapi!(pub(in crate::nft::nftnl) u16:
    NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFT_MSG_GETTABLE);

pub(in crate::nft::nftnl) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A NETLINK_NETFILTER socket for dumps (separate from the batch socket: a dump's replies
/// must not mix with a batch's acks). Kept open for the next reader after a complete dump
/// ([`super::super::kept`]: closing one stalls the node's commits).
pub(in crate::nft::nftnl) struct DumpSocket {
    pub(super) fd: Option<OwnedFd>,
    seq: std::cell::Cell<u32>,
    /// Every request names it: the kernel dumps only that family's objects.
    family: Family,
    /// No dump left half-read: the socket may serve the next reader.
    pub(super) clean: std::cell::Cell<bool>,
}

static DUMP_SOCKETS: super::super::kept::Kept<OwnedFd> = super::super::kept::Kept::new();

impl DumpSocket {
    pub(in crate::nft::nftnl) fn open(family: Family) -> Result<DumpSocket, NftError> {
        let fd = match DUMP_SOCKETS.take() {
            Some(fd) => fd,
            None => {
                let fd = super::super::socket::netfilter_socket(0)?;
                // Large dumps come in many datagrams; room for a burst of them.
                super::super::socket::set_buffer(
                    &fd,
                    super::super::socket::Buffer::Receive,
                    4 << 20,
                )?;
                let timeout = nix::sys::time::TimeVal::new(10, 0);
                setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(std::io::Error::from)?;
                fd
            }
        };
        Ok(DumpSocket {
            fd: Some(fd),
            seq: std::cell::Cell::new(1),
            family,
            clean: std::cell::Cell::new(true),
        })
    }

    fn raw(&self) -> std::os::fd::RawFd {
        self.fd.as_ref().expect("open until dropped").as_raw_fd()
    }

    /// Sends one dump request and calls `each` with the attributes of every reply message.
    /// Returns whether the kernel flagged the dump as interrupted.
    pub(in crate::nft::nftnl) fn dump(
        &self,
        msg: u16,
        attrs: &[(u16, Vec<u8>)],
        mut each: impl FnMut(Attrs),
    ) -> Result<bool, NftError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let mut req = Vec::with_capacity(64);
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req.extend_from_slice(&seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[self.family.nfproto(), 0, 0, 0]);
        for (kind, data) in attrs {
            req.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            req.extend_from_slice(&kind.to_ne_bytes());
            req.extend_from_slice(data);
            req.resize((req.len() + 3) & !3, 0);
        }
        let len = req.len() as u32;
        req[..4].copy_from_slice(&len.to_ne_bytes());
        self.clean.set(false);
        send(self.raw(), &req, MsgFlags::empty()).map_err(std::io::Error::from)?;
        let mut buf = vec![0u8; 1 << 18];
        let mut intr = false;
        loop {
            let n = recv(self.raw(), &mut buf, MsgFlags::empty()).map_err(std::io::Error::from)?;
            for (kind, flags, mseq, m) in super::super::reply::messages(&buf[..n]) {
                if mseq != seq {
                    continue;
                }
                intr |= flags & NLM_F_DUMP_INTR != 0;
                match kind {
                    NLMSG_DONE => {
                        self.clean.set(true);
                        return Ok(intr);
                    }
                    NLMSG_ERROR => {
                        // The error ends the dump: nothing of it is left to read.
                        self.clean.set(true);
                        let errno = error_code(m);
                        if errno == 0 {
                            return Ok(intr);
                        }
                        // No such table/set (it went away mid-read): an empty answer.
                        if -errno == libc::ENOENT {
                            return Ok(true);
                        }
                        return Err(NftError::Netlink(std::io::Error::from_raw_os_error(-errno)));
                    }
                    _ => each(Attrs(m.get(NFNL_HDRLEN..).unwrap_or(&[]))),
                }
            }
        }
    }
}

impl Drop for DumpSocket {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take()
            && self.clean.get()
        {
            DUMP_SOCKETS.give_back(fd);
        }
    }
}
