//! The quiet window: the agent sends its own large commits while the monitor is out of
//! `NFNLGRP_NFTABLES`, because the kernel builds one notification per set element only while
//! the group has listeners (`nf_tables_setelem_notify`: 44 % of a 10,000-service cold start).
//!
//! What the monitor does not hear in the window is covered by the nftables generation
//! (`base_seq`, +1 per commit, bumped before a commit notifies anything): the window is
//! bracketed by two `NFT_MSG_GETGEN` requests sent *from the monitor's socket*, so their
//! replies are queued in order with the notifications and the reader checks, in stream order:
//! - at the opening reply (generation g0), that the last `NEWGEN` it read was g0: a commit
//!   still notifying when the window opened, whose `NEWGEN` the reader missed, fails it;
//! - at the closing reply, sent after re-joining (generation g1), that g1 is g0 plus the
//!   agent's own commits in the window: a foreign commit that bumped the generation before
//!   the re-join (even one whose notifications straddle it) fails it; one after is heard.
//!
//! A failed check is a `Drift` with `unseen` (the run loop reads the table back and repairs);
//! so is a window opened while the previous one never closed. Another listener on the host
//! (`nft monitor`, a second agent) makes the kernel build the notifications anyway.

use super::wire::NFNLGRP_NFTABLES;
use crate::nft::nftnl::reply::{NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST};
use crate::nft::nftnl::socket::set_membership;
use nix::sys::socket::{MsgFlags, NetlinkAddr, sendto};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Transactions of at least this many operations are sent in a quiet window. Notifications
/// cost the kernel ~1.6 us per element (measured on 6.18, see docs/performance.md), the
/// window two `GETGEN`s and two `setsockopt`s (tens of us); below this, commits keep their
/// notifications, so the monitor's stream (and `nft monitor`'s) stays complete for updates.
pub const QUIET_MIN_OPS: usize = 2000;

/// `nlmsg_seq` of the monitor's own `GETGEN` requests, echoed in the replies.
pub(super) const MARK_START: u32 = 1;
const MARK_OPEN: u32 = 2;
/// Closing marker: `MARK_CLOSE + n`, n the agent's commits in the window (0 or 1).
const MARK_CLOSE: u32 = 3;

uapi!(u16: NFT_MSG_GETGEN);

/// Asks the kernel for the current generation; the reply goes to this socket's queue.
pub(super) fn request_gen(fd: &OwnedFd, seq: u32) -> io::Result<()> {
    let mut msg = Vec::with_capacity(20);
    msg.extend_from_slice(&20u32.to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: AF_UNSPEC, version 0, res_id 0.
    msg.extend_from_slice(&[0, 0, 0, 0]);
    sendto(
        fd.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    Ok(())
}

/// A handle on the monitor's socket for the agent's large commits ([`Quiet::during`]).
#[derive(Debug)]
pub struct Quiet {
    /// A duplicate of the monitor's socket: membership is the socket's, not the fd's.
    fd: OwnedFd,
}

impl Quiet {
    pub(super) fn new(fd: OwnedFd) -> Quiet {
        Quiet { fd }
    }

    /// Runs `commit` (one batch of the agent's) with the monitor out of the group.
    /// `committed` says whether the batch was committed (it bumped the generation once).
    /// Any failure to open the window leaves the monitor listening (a normal commit).
    pub fn during<T>(
        &mut self,
        commit: impl FnOnce() -> T,
        committed: impl FnOnce(&T) -> bool,
    ) -> T {
        let opened = request_gen(&self.fd, MARK_OPEN).is_ok();
        let left = opened && set_membership(&self.fd, NFNLGRP_NFTABLES, false).is_ok();
        let out = commit();
        let own = u32::from(committed(&out));
        if left {
            // Cannot fail for a group the socket could join at bind; never stay deaf silently.
            if let Err(e) = retry(|| set_membership(&self.fd, NFNLGRP_NFTABLES, true)) {
                tracing::error!(
                    "nftables monitor: cannot re-join the group, drift goes unseen: {e}"
                );
            }
        }
        if opened && let Err(e) = retry(|| request_gen(&self.fd, MARK_CLOSE + own)) {
            // The next window reports the unclosed one as a possible drift.
            tracing::warn!("nftables monitor: cannot close the quiet window: {e}");
        }
        out
    }
}

fn retry(mut f: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let mut last = Ok(());
    for _ in 0..3 {
        last = f();
        if last.is_ok() {
            break;
        }
    }
    last
}

/// The reader's side: the generations it has read, in stream order.
#[derive(Debug, Default)]
pub(super) struct Gens {
    /// The generation of the last `NEWGEN` or marker reply read; `None` after an overrun.
    last: Option<u32>,
    /// The generation at the opening marker of the window in progress.
    open: Option<u32>,
}

/// What a marker reply meant.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Mark {
    /// Nothing unseen.
    Clean,
    /// A window closed with nothing unseen.
    Closed,
    /// A commit may have gone unheard.
    Unseen,
}

impl Gens {
    /// A commit's `NEWGEN`.
    pub(super) fn commit(&mut self, generation: Option<u32>) {
        self.last = generation;
    }

    /// Notifications were lost: the last generation read is no longer known.
    pub(super) fn lost(&mut self) {
        self.last = None;
        self.open = None;
    }

    /// The reply to one of the monitor's own `GETGEN`s, `seq` its marker.
    pub(super) fn marker(&mut self, seq: u32, generation: Option<u32>) -> Mark {
        let last = std::mem::replace(&mut self.last, generation);
        match seq {
            MARK_START => Mark::Clean,
            MARK_OPEN => {
                let unclosed = std::mem::replace(&mut self.open, generation).is_some();
                if unclosed || generation.is_none() || last != generation {
                    Mark::Unseen
                } else {
                    Mark::Clean
                }
            }
            s if s == MARK_CLOSE || s == MARK_CLOSE + 1 => {
                let expected = self.open.take().map(|g0| next_gen(g0, s - MARK_CLOSE));
                if expected.is_some() && expected == generation {
                    Mark::Closed
                } else {
                    Mark::Unseen
                }
            }
            // Not a request of ours.
            _ => {
                self.last = last;
                Mark::Clean
            }
        }
    }
}

/// The generation `n` commits after `g` (the kernel skips 0 when it wraps).
fn next_gen(g: u32, n: u32) -> u32 {
    (0..n).fold(g, |g, _| match g.wrapping_add(1) {
        0 => 1,
        x => x,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_with_only_the_agents_commit_is_clean() {
        let mut g = Gens::default();
        assert_eq!(g.marker(MARK_START, Some(10)), Mark::Clean);
        g.commit(Some(11));
        assert_eq!(g.marker(MARK_OPEN, Some(11)), Mark::Clean);
        assert_eq!(g.marker(MARK_CLOSE + 1, Some(12)), Mark::Closed);
        // A rejected batch bumps nothing.
        assert_eq!(g.marker(MARK_OPEN, Some(12)), Mark::Clean);
        assert_eq!(g.marker(MARK_CLOSE, Some(12)), Mark::Closed);
    }

    #[test]
    fn an_unheard_commit_before_or_inside_the_window_is_unseen() {
        let mut g = Gens::default();
        g.marker(MARK_START, Some(10));
        // A commit bumped to 11 but its NEWGEN was not read before the window opened.
        assert_eq!(g.marker(MARK_OPEN, Some(11)), Mark::Unseen);
        // Someone committed inside the window besides the agent.
        assert_eq!(g.marker(MARK_CLOSE + 1, Some(13)), Mark::Unseen);
        // A rejected batch of ours while someone committed.
        g.marker(MARK_OPEN, Some(13));
        assert_eq!(g.marker(MARK_CLOSE, Some(14)), Mark::Unseen);
    }

    #[test]
    fn overruns_unclosed_windows_and_missing_generations_are_unseen() {
        let mut g = Gens::default();
        g.marker(MARK_START, Some(10));
        g.lost();
        assert_eq!(g.marker(MARK_OPEN, Some(10)), Mark::Unseen);
        // The closing reply was never read: the next window says so.
        assert_eq!(g.marker(MARK_OPEN, Some(11)), Mark::Unseen);
        assert_eq!(g.marker(MARK_CLOSE + 1, None), Mark::Unseen);
        // A close without an open.
        assert_eq!(g.marker(MARK_CLOSE, Some(12)), Mark::Unseen);
    }

    #[test]
    fn generations_skip_zero_when_they_wrap() {
        assert_eq!(next_gen(u32::MAX, 1), 1);
        assert_eq!(next_gen(5, 0), 5);
        assert_eq!(next_gen(5, 1), 6);
    }
}
