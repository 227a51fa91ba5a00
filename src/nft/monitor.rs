//! Drift detection: a NETLINK_NETFILTER socket in the NFNLGRP_NFTABLES multicast group, read by
//! a dedicated thread, reports every transaction that changed `table inet <ours>` and was not
//! sent by this process.
//!
//! The kernel sends one notification per object a commit created or deleted (table, chain,
//! rule, set, element, ...), all carrying the netlink port id of the socket that sent the batch,
//! then one `NFT_MSG_NEWGEN` that closes the commit. Commits are serialised per network
//! namespace, so the notifications of one commit arrive together. A commit is "ours" when that
//! port id belongs to a NETLINK_NETFILTER socket this process holds (`/proc/self/fd` +
//! `/proc/thread-self/net/netlink`).
//!
//! `NFTA_GEN_PROC_PID` is not usable for that on its own (measured on 6.18): it is the
//! *thread* id of the sender (`task_pid_nr(current)`), so a batch sent from the agent's
//! reconcile thread carries that thread's id, not `std::process::id()`; and it is the id in
//! the initial pid namespace, which a containerised agent does not know. It only serves as a
//! fallback (a thread of ours with the same id and the same name) for a socket of ours that was
//! already closed when its notifications were read, and to name the sender in logs.
//!
//! Notifications are only generated while someone listens, and the agent's own batches are
//! notified too: the receive buffer is large (`SO_RCVBUFFORCE`), and a buffer overrun
//! (`ENOBUFS`, events lost) is reported as a possible drift so that the caller re-checks. The
//! agent's large commits are sent with the monitor out of the group ([`quiet`]).
//!
//! Parts: [`wire`] decodes a notification, [`drift`] collects what a commit changed into a
//! [`Drift`], [`own`] tells the agent's commits from others', [`quiet`] brackets the agent's
//! large commits; this file is the socket and its reader thread.

mod drift;
mod own;
mod quiet;
mod wire;
pub use drift::{Changes, Drift, Edits};
pub use quiet::{QUIET_MIN_OPS, Quiet};

use super::ir::Family;
use crate::nft::nftnl::socket::{Buffer, netfilter_socket, set_buffer};
use drift::record;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, NetlinkAddr, getsockname, recv, setsockopt, sockopt};
use nix::sys::time::TimeVal;
use own::OwnSockets;
use quiet::{Gens, MARK_START, Mark};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wire::{NFNLGRP_NFTABLES, Notification, messages};

/// Default receive buffer (the kernel doubles it): a 24k-op full sync of the agent's own
/// notifies ~3 MB of messages, and the reader drains while the kernel sends.
pub const DEFAULT_RCVBUF: usize = 8 << 20;
/// How often the reader thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// Bytes read per `recv`; the kernel packs notifications into skbs of at most a page or two.
const RECV_BUF: usize = 1 << 17;

/// Counters of the reader thread (for benchmarks and tests).
#[derive(Debug, Default)]
pub struct MonitorStats {
    /// nf_tables notifications read (any table).
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    /// Commits that touched our table, by this process and by others.
    pub own_commits: AtomicU64,
    pub foreign_commits: AtomicU64,
    /// Receive buffer overruns.
    pub overruns: AtomicU64,
    /// Quiet windows closed with nothing unseen, and those that reported a possible drift.
    pub quiet_windows: AtomicU64,
    pub quiet_unseen: AtomicU64,
}

/// A running listener; dropping it stops the reader thread within [`STOP_POLL`].
pub struct Monitor {
    stop: Arc<AtomicBool>,
    stats: Arc<MonitorStats>,
    thread: Option<JoinHandle<()>>,
    portid: u32,
    /// A duplicate of the socket, for [`Monitor::quiet`].
    fd: OwnedFd,
}

impl Monitor {
    /// Listens for changes to `table inet <table>` with a [`DEFAULT_RCVBUF`] buffer. The
    /// socket belongs to the calling thread's network namespace. `on_drift` runs on the
    /// reader thread for every foreign commit (and every overrun); it returns false to stop.
    pub fn start(
        table: &str,
        on_drift: impl FnMut(Drift) -> bool + Send + 'static,
    ) -> io::Result<Monitor> {
        Monitor::start_with(table, DEFAULT_RCVBUF, on_drift)
    }

    /// [`Monitor::start`] with a receive buffer of `rcvbuf` bytes.
    pub fn start_with(
        table: &str,
        rcvbuf: usize,
        on_drift: impl FnMut(Drift) -> bool + Send + 'static,
    ) -> io::Result<Monitor> {
        Monitor::start_families(&[Family::Inet], table, rcvbuf, on_drift)
    }

    /// [`Monitor::start_with`] for the tables named `table` in each of `families` (one commit
    /// touching both is one drift). Objects of a non-inet table are named with their family
    /// (`bridge np-forward`).
    pub fn start_families(
        families: &[Family],
        table: &str,
        rcvbuf: usize,
        mut on_drift: impl FnMut(Drift) -> bool + Send + 'static,
    ) -> io::Result<Monitor> {
        // Groups below 32 can be joined at bind time: bit (group - 1).
        let fd = netfilter_socket(1 << (NFNLGRP_NFTABLES - 1))?;
        set_buffer(
            &fd,
            Buffer::Receive,
            rcvbuf.clamp(1 << 12, i32::MAX as usize / 2),
        )?;
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::new(0, STOP_POLL.as_micros() as _),
        )?;
        let portid = getsockname::<NetlinkAddr>(fd.as_raw_fd())?.pid();
        // The generation as of joining: quiet windows are checked against it.
        quiet::request_gen(&fd, MARK_START)?;
        let dup = fd.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(MonitorStats::default());
        let mut reader = Reader {
            fd,
            table: table.to_string(),
            families: families.to_vec(),
            pending: HashMap::new(),
            own: OwnSockets::default(),
            stats: stats.clone(),
            portid,
            gens: Gens::default(),
        };
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nft-monitor".into())
            .spawn(move || reader.run(&stop_flag, &mut on_drift))?;
        Ok(Monitor {
            stop,
            stats,
            thread: Some(thread),
            portid,
            fd: dup,
        })
    }

    /// A handle for sending the agent's large commits unheard ([`Quiet::during`]).
    pub fn quiet(&self) -> io::Result<Quiet> {
        Ok(Quiet::new(self.fd.try_clone()?))
    }

    /// The listening socket's port id.
    pub fn portid(&self) -> u32 {
        self.portid
    }

    pub fn stats(&self) -> &MonitorStats {
        &self.stats
    }

    /// Stops the reader and waits for it.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Reader {
    fd: OwnedFd,
    table: String,
    families: Vec<Family>,
    /// Changes to our table per sender port id, until the commit's NEWGEN.
    pending: HashMap<u32, Changes>,
    own: OwnSockets,
    stats: Arc<MonitorStats>,
    /// This socket's port id: a `NEWGEN` sent to it is the reply to one of its `GETGEN`s.
    portid: u32,
    gens: Gens,
}

impl Reader {
    fn run(&mut self, stop: &AtomicBool, on_drift: &mut dyn FnMut(Drift) -> bool) {
        let mut buf = vec![0u8; RECV_BUF];
        while !stop.load(Ordering::Relaxed) {
            let drifts = match recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_TRUNC) {
                Ok(n) if n > buf.len() => self.lost(),
                Ok(n) => {
                    self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    self.datagram(&buf[..n], Instant::now())
                }
                Err(Errno::EAGAIN | Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => self.lost(),
                Err(e) => {
                    tracing::error!("nftables monitor stopped: recv: {e}");
                    return;
                }
            };
            for d in drifts {
                if !on_drift(d) {
                    return;
                }
            }
        }
    }

    /// Notifications were dropped: anything may have changed. What was pending is
    /// incomplete and of unknown origin (most likely the agent's own big batch): dropped.
    fn lost(&mut self) -> Vec<Drift> {
        self.stats.overruns.fetch_add(1, Ordering::Relaxed);
        self.pending.clear();
        self.gens.lost();
        vec![Drift {
            at: Instant::now(),
            changes: Changes::default(),
            by: BTreeSet::new(),
            events_lost: true,
            unseen: false,
        }]
    }

    fn datagram(&mut self, buf: &[u8], at: Instant) -> Vec<Drift> {
        let mut out = Vec::new();
        for msg in messages(buf) {
            let Some(n) = Notification::parse(msg) else {
                continue;
            };
            self.stats.messages.fetch_add(1, Ordering::Relaxed);
            match n {
                Notification::Gen {
                    portid,
                    seq,
                    generation,
                    ..
                } if portid == self.portid => {
                    if let Some(d) = self.marker(seq, generation, at) {
                        out.push(d);
                    }
                }
                Notification::Gen {
                    portid,
                    pid,
                    comm,
                    generation,
                    ..
                } => {
                    self.gens.commit(generation);
                    if let Some(d) = self.commit(portid, pid, comm, at) {
                        out.push(d);
                    }
                }
                Notification::Object {
                    portid,
                    family,
                    msg,
                    table,
                    name,
                    items,
                } => {
                    let Some(fam) = self.families.iter().find(|f| f.nfproto() == family) else {
                        continue;
                    };
                    if table != self.table.as_bytes() {
                        continue;
                    }
                    let changes = self.pending.entry(portid).or_default();
                    record(changes, *fam, msg, name, items);
                }
            }
        }
        out
    }

    /// The reply to one of this socket's `GETGEN`s: a quiet window's bracket.
    fn marker(&mut self, seq: u32, generation: Option<u32>, at: Instant) -> Option<Drift> {
        match self.gens.marker(seq, generation) {
            Mark::Clean => None,
            Mark::Closed => {
                self.stats.quiet_windows.fetch_add(1, Ordering::Relaxed);
                None
            }
            Mark::Unseen => {
                self.stats.quiet_unseen.fetch_add(1, Ordering::Relaxed);
                Some(Drift {
                    at,
                    changes: Changes::default(),
                    by: BTreeSet::new(),
                    events_lost: false,
                    unseen: true,
                })
            }
        }
    }

    /// A commit ended: what it did to our table, if someone else sent it.
    fn commit(
        &mut self,
        portid: u32,
        pid: Option<u32>,
        comm: Option<&str>,
        at: Instant,
    ) -> Option<Drift> {
        // Commits are serialised: anything pending belongs to this one (or to a commit whose
        // NEWGEN was lost, which an overrun already reported).
        let pending: Vec<(u32, Changes)> = self.pending.drain().collect();
        let mut drift: Option<Drift> = None;
        for (sender, changes) in pending {
            let (gen_pid, gen_comm) = if sender == portid {
                (pid, comm)
            } else {
                (None, None)
            };
            if self.own.is_own(sender, gen_pid, gen_comm) {
                self.stats.own_commits.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.stats.foreign_commits.fetch_add(1, Ordering::Relaxed);
            let mut by = BTreeSet::new();
            match (gen_comm, gen_pid) {
                (Some(c), Some(p)) => by.insert(format!("{c} (pid {p})")),
                _ => by.insert(format!("netlink port {sender}")),
            };
            let d = Drift {
                at,
                changes,
                by,
                events_lost: false,
                unseen: false,
            };
            match &mut drift {
                Some(all) => all.merge(d),
                None => drift = Some(d),
            }
        }
        drift
    }
}

#[cfg(test)]
mod tests {
    use super::wire::*;
    use super::*;
    use crate::nft::nftnl::reply::NFNL_SUBSYS_NFTABLES;
    use crate::testing::netlink::{attr, nfnl_msg};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

    fn nft_msg(msg: u8, family: u8, portid: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg);
        nfnl_msg(kind, 0, 0, portid, family, 0, &attrs.concat())
    }

    fn newgen(portid: u32, pid: u32, comm: &str) -> Vec<u8> {
        nft_msg(
            NEWGEN,
            0,
            portid,
            &[
                attr(NFTA_GEN_ID, &7u32.to_be_bytes()),
                attr(NFTA_GEN_PROC_PID, &pid.to_be_bytes()),
                attr(NFTA_GEN_PROC_NAME, format!("{comm}\0").as_bytes()),
            ],
        )
    }

    fn table_attr(t: &str) -> Vec<u8> {
        attr(NFTA_TABLE, format!("{t}\0").as_bytes())
    }

    /// A message from another process about `table` of `family`, with the object's `attrs`.
    fn foreign(msg: u8, family: u8, table: &str, attrs: &[Vec<u8>]) -> Vec<u8> {
        let attrs = [&[table_attr(table)], attrs].concat();
        nft_msg(msg, family, FOREIGN, &attrs)
    }

    /// The name of a rule's chain or of a set (`NFTA_OBJECT_NAME`).
    fn object(name: &str) -> Vec<u8> {
        attr(NFTA_OBJECT_NAME, format!("{name}\0").as_bytes())
    }

    fn chain(name: &str) -> Vec<u8> {
        attr(NFTA_CHAIN_NAME, format!("{name}\0").as_bytes())
    }

    fn reader() -> Reader {
        // A socket only to own an fd; these tests never read from it.
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        Reader {
            fd,
            table: "nodeplane".into(),
            families: vec![Family::Inet],
            pending: HashMap::new(),
            own: OwnSockets::default(),
            stats: Arc::default(),
            portid: 1,
            gens: Gens::default(),
        }
    }

    const NFPROTO_INET: u8 = 1;

    /// A port id no socket of this process has (the kernel never hands out 0 to a user socket).
    const FOREIGN: u32 = 0x7fff_fff1;

    #[test]
    fn a_flushed_chain_and_a_deleted_element_are_named() {
        let mut r = reader();
        let elems = attr(
            NFTA_SET_ELEM_LIST_ELEMENTS | 0x8000,
            &[attr(1, &[0; 8]), attr(1, &[1; 8])].concat(),
        );
        let mut buf = Vec::new();
        for _ in 0..3 {
            buf.extend(foreign(
                DELRULE,
                NFPROTO_INET,
                "nodeplane",
                &[object("fw-dispatch")],
            ));
        }
        buf.extend(foreign(
            DELSETELEM,
            NFPROTO_INET,
            "nodeplane",
            &[object("fw-pods-v4"), elems],
        ));
        // Someone else's table and another family's table of the same name: ignored.
        buf.extend(foreign(DELRULE, NFPROTO_INET, "other", &[object("c")]));
        buf.extend(foreign(DELTABLE, 2, "nodeplane", &[]));
        buf.extend(newgen(FOREIGN, 4_000_000, "nft"));
        let drifts = r.datagram(&buf, Instant::now());
        assert_eq!(drifts.len(), 1, "{drifts:?}");
        let d = &drifts[0];
        assert_eq!(d.object(), "chain");
        assert_eq!(
            d.to_string(),
            "chain fw-dispatch 3 rules deleted; set fw-pods-v4 2 elements deleted \
             (by nft (pid 4000000))"
        );
        assert_eq!(r.stats.foreign_commits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_bridge_table_is_watched_when_asked_and_named_by_family() {
        let mut r = reader();
        r.families = vec![Family::Inet, Family::Bridge];
        let mut buf = foreign(
            DELRULE,
            Family::Bridge.nfproto(),
            "nodeplane",
            &[object("np-forward")],
        );
        buf.extend(newgen(FOREIGN, 42, "nft"));
        let drifts = r.datagram(&buf, Instant::now());
        assert_eq!(drifts.len(), 1, "{drifts:?}");
        assert_eq!(
            drifts[0].to_string(),
            "chain bridge np-forward 1 rule deleted (by nft (pid 42))"
        );
    }

    #[test]
    fn a_deleted_bridge_table_is_named_first() {
        let mut r = reader();
        r.families = vec![Family::Inet, Family::Bridge];
        let bridge = Family::Bridge.nfproto();
        let mut buf = Vec::new();
        for name in ["a", "b", "c", "d", "e"] {
            buf.extend(foreign(DELCHAIN, bridge, "nodeplane", &[chain(name)]));
        }
        buf.extend(foreign(DELTABLE, bridge, "nodeplane", &[]));
        buf.extend(newgen(FOREIGN, 42, "nft"));
        let drifts = r.datagram(&buf, Instant::now());
        assert!(
            drifts[0]
                .to_string()
                .starts_with("table bridge deleted; chain bridge a deleted"),
            "{}",
            drifts[0]
        );
    }

    #[test]
    fn a_deleted_table_is_one_report_and_other_tables_none() {
        let mut r = reader();
        let mut buf = Vec::new();
        buf.extend(foreign(
            DELCHAIN,
            NFPROTO_INET,
            "nodeplane",
            &[chain("fw-dispatch")],
        ));
        buf.extend(foreign(DELTABLE, NFPROTO_INET, "nodeplane", &[]));
        buf.extend(foreign(DELTABLE, NFPROTO_INET, "other", &[]));
        buf.extend(newgen(FOREIGN, 42, "nft"));
        // A commit that touched only another table.
        buf.extend(foreign(NEWTABLE, NFPROTO_INET, "other", &[]));
        buf.extend(newgen(FOREIGN, 43, "nft"));
        let drifts = r.datagram(&buf, Instant::now());
        assert_eq!(drifts.len(), 1, "{drifts:?}");
        assert_eq!(drifts[0].object(), "table");
        assert_eq!(
            drifts[0].to_string(),
            "table deleted (1 chains and sets with it) (by nft (pid 42))"
        );
    }

    #[test]
    fn commits_from_a_socket_of_this_process_are_not_drift() {
        // Any NETLINK_NETFILTER socket this process holds counts as its own.
        let fd = netfilter_socket(0).unwrap();
        let own = getsockname::<NetlinkAddr>(fd.as_raw_fd()).unwrap().pid();
        let mut r = reader();
        let mut buf = nft_msg(
            NEWRULE,
            NFPROTO_INET,
            own,
            &[table_attr("nodeplane"), object("fw-dispatch")],
        );
        // The kernel reports the sending thread's id, which is not a thread of ours here.
        buf.extend(newgen(own, 4_000_000, "agent"));
        assert_eq!(r.datagram(&buf, Instant::now()), vec![]);
        assert_eq!(r.stats.own_commits.load(Ordering::Relaxed), 1);
        assert!(r.own.portids.contains(&own));
    }

    #[test]
    fn an_overrun_is_a_possible_drift_of_unknown_origin() {
        let mut r = reader();
        let buf = foreign(NEWRULE, NFPROTO_INET, "nodeplane", &[object("fw-dispatch")]);
        assert!(r.datagram(&buf, Instant::now()).is_empty(), "no NEWGEN yet");
        let lost = r.lost();
        assert_eq!(lost.len(), 1);
        assert!(lost[0].events_lost);
        assert_eq!(lost[0].object(), "unknown");
        assert_eq!(
            lost[0].to_string(),
            "notifications lost (receive buffer overrun), the table may have changed"
        );
        assert!(r.pending.is_empty());
    }

    #[test]
    fn merged_reports_keep_the_earliest_time_and_every_change() {
        let t0 = Instant::now();
        let one = |at, chain: &str| {
            let mut changes = Changes::default();
            changes.chains.insert(
                chain.to_string(),
                Edits {
                    removed: 1,
                    ..Edits::default()
                },
            );
            Drift {
                at,
                changes,
                by: ["nft (pid 1)".to_string()].into(),
                events_lost: false,
                unseen: false,
            }
        };
        let mut d = one(t0 + Duration::from_millis(5), "a");
        d.merge(one(t0, "a"));
        d.merge(one(t0, "b"));
        assert_eq!(d.at, t0);
        assert_eq!(d.changes.chains["a"].removed, 2);
        assert_eq!(
            d.to_string(),
            "chain a 2 rules deleted; chain b 1 rule deleted (by nft (pid 1))"
        );
    }
}
