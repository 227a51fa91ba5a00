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

mod quiet;
pub use quiet::{QUIET_MIN_OPS, Quiet};

use super::ir::Family;
use super::nftnl::reply;
use crate::nft::nftnl::socket::{Buffer, set_buffer};
use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, getsockname,
    recv, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use quiet::{Gens, MARK_START, Mark};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables change notifications.
const NFNLGRP_NFTABLES: u32 = 7;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NLMSG_HDRLEN: usize = 16;
/// nlmsghdr + nfgenmsg: where nf_tables attributes start.
const NFNL_HDRLEN: usize = NLMSG_HDRLEN + 4;

// enum nf_tables_msg_types
const NEWTABLE: u8 = 0;
const DELTABLE: u8 = 2;
const NEWCHAIN: u8 = 3;
const DELCHAIN: u8 = 5;
const NEWRULE: u8 = 6;
const DELRULE: u8 = 8;
const NEWSET: u8 = 9;
const DELSET: u8 = 11;
const NEWSETELEM: u8 = 12;
const DELSETELEM: u8 = 14;
const NEWGEN: u8 = 15;
const NEWOBJ: u8 = 18;
const DELOBJ: u8 = 20;
const NEWFLOWTABLE: u8 = 22;
const DELFLOWTABLE: u8 = 24;
const DESTROYTABLE: u8 = 26;
const DESTROYCHAIN: u8 = 27;
const DESTROYRULE: u8 = 28;
const DESTROYSET: u8 = 29;
const DESTROYSETELEM: u8 = 30;
const DESTROYOBJ: u8 = 31;
const DESTROYFLOWTABLE: u8 = 32;

/// Attribute 1 of every table/chain/rule/set/element/object/flowtable message is the table name.
const NFTA_TABLE: u16 = 1;
/// NFTA_CHAIN_NAME.
const NFTA_CHAIN_NAME: u16 = 3;
/// NFTA_RULE_CHAIN, NFTA_SET_NAME, NFTA_SET_ELEM_LIST_SET, NFTA_OBJ_NAME, NFTA_FLOWTABLE_NAME.
const NFTA_OBJECT_NAME: u16 = 2;
/// NFTA_SET_ELEM_LIST_ELEMENTS.
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_GEN_ID: u16 = 1;
const NFTA_GEN_PROC_PID: u16 = 2;
const NFTA_GEN_PROC_NAME: u16 = 3;

/// Default receive buffer (the kernel doubles it): a 24k-op full sync of the agent's own
/// notifies ~3 MB of messages, and the reader drains while the kernel sends.
pub const DEFAULT_RCVBUF: usize = 8 << 20;
/// How often the reader thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);
/// Bytes read per `recv`; the kernel packs notifications into skbs of at most a page or two.
const RECV_BUF: usize = 1 << 17;

/// Additions and removals to one object of the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Edits {
    /// The object itself was created.
    pub created: bool,
    /// The object itself was deleted.
    pub deleted: bool,
    /// Rules (of a chain) or elements (of a set) added.
    pub added: u32,
    /// Rules or elements removed.
    pub removed: u32,
}

/// What foreign commits changed in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub table_created: bool,
    pub table_deleted: bool,
    pub chains: BTreeMap<String, Edits>,
    pub sets: BTreeMap<String, Edits>,
    /// Stateful objects and flowtables (the agent has none).
    pub others: BTreeMap<String, Edits>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }

    fn merge(&mut self, other: &Changes) {
        self.table_created |= other.table_created;
        self.table_deleted |= other.table_deleted;
        for (mine, theirs) in [
            (&mut self.chains, &other.chains),
            (&mut self.sets, &other.sets),
            (&mut self.others, &other.others),
        ] {
            for (name, e) in theirs {
                let m = mine.entry(name.clone()).or_default();
                m.created |= e.created;
                m.deleted |= e.deleted;
                m.added += e.added;
                m.removed += e.removed;
            }
        }
    }
}

/// "Our table may no longer hold what the agent applied."
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// When the reader saw the commit (the earliest, for merged reports).
    pub at: Instant,
    pub changes: Changes,
    /// Who committed, as the kernel names them: `nft (pid 1234)`.
    pub by: BTreeSet<String>,
    /// Notifications were lost (receive buffer overrun): anything may have changed.
    pub events_lost: bool,
    /// Someone committed while the monitor was out of the group for one of the agent's own
    /// large commits ([`Quiet`]): what changed is unknown.
    pub unseen: bool,
}

impl Drift {
    /// One report for a burst: the earliest time, every change and sender.
    pub fn merge(&mut self, other: Drift) {
        self.at = self.at.min(other.at);
        self.changes.merge(&other.changes);
        self.by.extend(other.by);
        self.events_lost |= other.events_lost;
        self.unseen |= other.unseen;
    }

    /// The largest kind of object touched, for a metric label: `table`, `chain`, `set`,
    /// `other` or `unknown` (events lost).
    pub fn object(&self) -> &'static str {
        let c = &self.changes;
        if c.table_created || c.table_deleted {
            "table"
        } else if !c.chains.is_empty() {
            "chain"
        } else if !c.sets.is_empty() {
            "set"
        } else if !c.others.is_empty() {
            "other"
        } else {
            "unknown"
        }
    }
}

/// How many named objects a description lists before "and N more".
const DESCRIBED: usize = 4;

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.changes;
        let mut parts: Vec<String> = Vec::new();
        if c.table_deleted {
            let n = c.chains.len() + c.sets.len() + c.others.len();
            parts.push(match (c.table_created, n) {
                (true, _) => "table deleted and created again".into(),
                (false, 0) => "table deleted".into(),
                (false, n) => format!("table deleted ({n} chains and sets with it)"),
            });
        } else {
            if c.table_created {
                parts.push("table created".into());
            }
            // Another family's table first (its chains and sets follow it).
            let (tables, objects): (Vec<_>, Vec<_>) =
                c.others.iter().partition(|(n, _)| n.starts_with("table "));
            let all = tables
                .into_iter()
                .map(|(n, e)| describe("", n, e, ""))
                .chain(
                    c.chains
                        .iter()
                        .map(|(n, e)| describe("chain", n, e, "rule")),
                )
                .chain(c.sets.iter().map(|(n, e)| describe("set", n, e, "element")))
                .chain(
                    objects
                        .into_iter()
                        .map(|(n, e)| describe("object", n, e, "")),
                );
            let all: Vec<String> = all.collect();
            let more = all.len().saturating_sub(DESCRIBED);
            parts.extend(all.into_iter().take(DESCRIBED));
            if more > 0 {
                parts.push(format!("and {more} more objects"));
            }
        }
        if self.unseen {
            parts.push(
                "a commit by someone else while the monitor was not listening (the agent's own \
                 large commit), the table may have changed"
                    .into(),
            );
        }
        if self.events_lost {
            parts.push(
                "notifications lost (receive buffer overrun), the table may have changed".into(),
            );
        }
        write!(f, "{}", parts.join("; "))?;
        if !self.by.is_empty() {
            let by: Vec<&str> = self.by.iter().map(String::as_str).collect();
            write!(f, " (by {})", by.join(", "))?;
        }
        Ok(())
    }
}

fn describe(kind: &str, name: &str, e: &Edits, item: &str) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    let mut what = Vec::new();
    match (e.created, e.deleted) {
        (true, true) => what.push("deleted and created".to_string()),
        (true, false) => what.push("created".into()),
        (false, true) => what.push("deleted".into()),
        (false, false) => {}
    }
    if !e.deleted || e.created {
        if e.added > 0 {
            what.push(format!("{} {item}{} added", e.added, plural(e.added)));
        }
        if e.removed > 0 {
            what.push(format!("{} {item}{} deleted", e.removed, plural(e.removed)));
        }
    }
    let name = if kind.is_empty() {
        name.to_string()
    } else {
        format!("{kind} {name}")
    };
    format!("{name} {}", what.join(", "))
}

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
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )?;
        // Groups below 32 can be joined at bind time: bit (group - 1).
        bind(
            fd.as_raw_fd(),
            &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
        )?;
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

fn record(c: &mut Changes, family: Family, msg: u8, name: Option<&[u8]>, items: u32) {
    let name = || {
        let n = String::from_utf8_lossy(name.unwrap_or_default());
        match family {
            Family::Inet => n.into_owned(),
            other => format!("{} {n}", other.keyword()),
        }
    };
    match msg {
        // Another family's table is named like its objects: `table bridge deleted`.
        NEWTABLE | DELTABLE | DESTROYTABLE if family != Family::Inet => {
            let e = c
                .others
                .entry(format!("table {}", family.keyword()))
                .or_default();
            e.created |= msg == NEWTABLE;
            e.deleted |= msg != NEWTABLE;
        }
        NEWTABLE => c.table_created = true,
        DELTABLE | DESTROYTABLE => c.table_deleted = true,
        NEWCHAIN => c.chains.entry(name()).or_default().created = true,
        DELCHAIN | DESTROYCHAIN => c.chains.entry(name()).or_default().deleted = true,
        NEWRULE => c.chains.entry(name()).or_default().added += 1,
        DELRULE | DESTROYRULE => c.chains.entry(name()).or_default().removed += 1,
        NEWSET => c.sets.entry(name()).or_default().created = true,
        DELSET | DESTROYSET => c.sets.entry(name()).or_default().deleted = true,
        NEWSETELEM => c.sets.entry(name()).or_default().added += items,
        DELSETELEM | DESTROYSETELEM => c.sets.entry(name()).or_default().removed += items,
        NEWOBJ | NEWFLOWTABLE => c.others.entry(name()).or_default().created = true,
        DELOBJ | DESTROYOBJ | DELFLOWTABLE | DESTROYFLOWTABLE => {
            c.others.entry(name()).or_default().deleted = true
        }
        _ => {}
    }
}

/// One nf_tables notification, borrowed from the datagram.
#[derive(Debug, PartialEq, Eq)]
enum Notification<'a> {
    /// `NFT_MSG_NEWGEN`: the end of a commit sent from netlink port `portid`, or the reply
    /// to a `GETGEN` (`seq` echoes the request's), `generation` the generation it reports.
    Gen {
        portid: u32,
        seq: u32,
        pid: Option<u32>,
        comm: Option<&'a str>,
        generation: Option<u32>,
    },
    /// A change to an object of table `table`: `name` is the chain (for chains and rules),
    /// set (for sets and elements) or object; `items` the elements in a set element message.
    Object {
        portid: u32,
        family: u8,
        msg: u8,
        table: &'a [u8],
        name: Option<&'a [u8]>,
        items: u32,
    },
}

impl<'a> Notification<'a> {
    fn parse(msg: &'a [u8]) -> Option<Notification<'a>> {
        let kind = u16_at(msg, 4)?;
        if kind >> 8 != NFNL_SUBSYS_NFTABLES {
            return None;
        }
        let seq = u32_at(msg, 8)?;
        let portid = u32_at(msg, 12)?;
        let family = *msg.get(NLMSG_HDRLEN)?;
        let body = msg.get(NFNL_HDRLEN..)?;
        let msg_type = (kind & 0xff) as u8;
        if msg_type == NEWGEN {
            let mut n = Notification::Gen {
                portid,
                seq,
                pid: None,
                comm: None,
                generation: None,
            };
            if let Notification::Gen {
                pid,
                comm,
                generation,
                ..
            } = &mut n
            {
                for (t, v) in attrs(body) {
                    match t {
                        NFTA_GEN_PROC_PID => *pid = be32(v),
                        NFTA_GEN_PROC_NAME => {
                            *comm = cstr(v).and_then(|s| std::str::from_utf8(s).ok())
                        }
                        NFTA_GEN_ID => *generation = be32(v),
                        _ => {}
                    }
                }
            }
            return Some(n);
        }
        let name_attr = match msg_type {
            NEWTABLE | DELTABLE | DESTROYTABLE => None,
            NEWCHAIN | DELCHAIN | DESTROYCHAIN => Some(NFTA_CHAIN_NAME),
            NEWRULE | DELRULE | DESTROYRULE | NEWSET | DELSET | DESTROYSET | NEWSETELEM
            | DELSETELEM | DESTROYSETELEM | NEWOBJ | DELOBJ | DESTROYOBJ | NEWFLOWTABLE
            | DELFLOWTABLE | DESTROYFLOWTABLE => Some(NFTA_OBJECT_NAME),
            // Get/reset replies and traces are not changes.
            _ => return None,
        };
        let is_elems = matches!(msg_type, NEWSETELEM | DELSETELEM | DESTROYSETELEM);
        let (mut table, mut name, mut items) = (None, None, 0);
        for (t, v) in attrs(body) {
            if t == NFTA_TABLE {
                table = cstr(v);
            } else if Some(t) == name_attr {
                name = cstr(v);
            } else if is_elems && t == NFTA_SET_ELEM_LIST_ELEMENTS {
                items = attrs(v).count() as u32;
            }
        }
        Some(Notification::Object {
            portid,
            family,
            msg: msg_type,
            table: table?,
            name,
            items: items.max(u32::from(is_elems)),
        })
    }
}

/// The netlink sockets of this process, to tell its own commits from others'.
#[derive(Default)]
struct OwnSockets {
    /// NETLINK_NETFILTER port ids of this process as of the last scan.
    portids: HashSet<u32>,
}

impl OwnSockets {
    fn is_own(&mut self, portid: u32, pid: Option<u32>, comm: Option<&str>) -> bool {
        if self.portids.contains(&portid) {
            return true;
        }
        // Unknown: a socket opened since the last scan, or someone else's. A failed scan
        // keeps the previous one (a wrong "foreign" only costs a re-check).
        match own_netfilter_portids() {
            Ok(now) => self.portids = now,
            Err(e) => tracing::warn!("nftables monitor: cannot list own sockets: {e}"),
        }
        self.portids.contains(&portid) || is_own_thread(pid, comm)
    }
}

/// Port ids of the NETLINK_NETFILTER sockets this process holds, in the reading thread's
/// network namespace.
fn own_netfilter_portids() -> io::Result<HashSet<u32>> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse::<u64>().ok())
        {
            inodes.insert(inode);
        }
    }
    let table = std::fs::read_to_string("/proc/thread-self/net/netlink")?;
    Ok(netfilter_portids(&table, &inodes))
}

/// `/proc/net/netlink`: `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`; protocol 12 is
/// NETLINK_NETFILTER, Pid the port id.
fn netfilter_portids(table: &str, inodes: &HashSet<u64>) -> HashSet<u32> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let proto: u32 = cols.get(1)?.parse().ok()?;
            let portid: u32 = cols.get(2)?.parse().ok()?;
            let inode: u64 = cols.last()?.parse().ok()?;
            (proto == libc::NETLINK_NETFILTER as u32 && inodes.contains(&inode)).then_some(portid)
        })
        .collect()
}

/// A thread of this process with the id and name the kernel reported. Only meaningful when
/// the agent shares the initial pid namespace (the kernel reports ids from there).
fn is_own_thread(pid: Option<u32>, comm: Option<&str>) -> bool {
    let (Some(pid), Some(comm)) = (pid, comm) else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/self/task/{pid}/comm"))
        .is_ok_and(|c| c.trim_end_matches('\n') == comm)
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated string attribute without its terminator.
fn cstr(v: &[u8]) -> Option<&[u8]> {
    v.split(|b| *b == 0).next()
}

/// Netlink messages in a datagram.
fn messages(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    reply::messages(buf).map(|(_, _, _, m)| m)
}

/// Netlink attributes: (type without flags, payload).
fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    reply::attrs(buf, 0).map(|(k, v, _)| (k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn nft_msg(msg: u8, family: u8, portid: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        body.extend(attrs.concat());
        let mut v = Vec::new();
        v.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg)).to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&portid.to_ne_bytes());
        v.extend(body);
        v
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
            buf.extend(nft_msg(
                DELRULE,
                NFPROTO_INET,
                FOREIGN,
                &[
                    table_attr("nodeplane"),
                    attr(NFTA_OBJECT_NAME, b"fw-dispatch\0"),
                ],
            ));
        }
        buf.extend(nft_msg(
            DELSETELEM,
            NFPROTO_INET,
            FOREIGN,
            &[
                table_attr("nodeplane"),
                attr(NFTA_OBJECT_NAME, b"fw-pods-v4\0"),
                elems,
            ],
        ));
        // Someone else's table and another family's table of the same name: ignored.
        buf.extend(nft_msg(
            DELRULE,
            NFPROTO_INET,
            FOREIGN,
            &[table_attr("other"), attr(NFTA_OBJECT_NAME, b"c\0")],
        ));
        buf.extend(nft_msg(DELTABLE, 2, FOREIGN, &[table_attr("nodeplane")]));
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
        let mut buf = nft_msg(
            DELRULE,
            Family::Bridge.nfproto(),
            FOREIGN,
            &[
                table_attr("nodeplane"),
                attr(NFTA_OBJECT_NAME, b"np-forward\0"),
            ],
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
        for chain in ["a", "b", "c", "d", "e"] {
            let name = format!("{chain}\0");
            let attrs = [
                table_attr("nodeplane"),
                attr(NFTA_CHAIN_NAME, name.as_bytes()),
            ];
            buf.extend(nft_msg(DELCHAIN, bridge, FOREIGN, &attrs));
        }
        buf.extend(nft_msg(
            DELTABLE,
            bridge,
            FOREIGN,
            &[table_attr("nodeplane")],
        ));
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
        buf.extend(nft_msg(
            DELCHAIN,
            NFPROTO_INET,
            FOREIGN,
            &[
                table_attr("nodeplane"),
                attr(NFTA_CHAIN_NAME, b"fw-dispatch\0"),
            ],
        ));
        buf.extend(nft_msg(
            DELTABLE,
            NFPROTO_INET,
            FOREIGN,
            &[table_attr("nodeplane")],
        ));
        buf.extend(nft_msg(
            DELTABLE,
            NFPROTO_INET,
            FOREIGN,
            &[table_attr("other")],
        ));
        buf.extend(newgen(FOREIGN, 42, "nft"));
        // A commit that touched only another table.
        buf.extend(nft_msg(
            NEWTABLE,
            NFPROTO_INET,
            FOREIGN,
            &[table_attr("other")],
        ));
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
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .unwrap();
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).unwrap();
        let own = getsockname::<NetlinkAddr>(fd.as_raw_fd()).unwrap().pid();
        let mut r = reader();
        let mut buf = nft_msg(
            NEWRULE,
            NFPROTO_INET,
            own,
            &[
                table_attr("nodeplane"),
                attr(NFTA_OBJECT_NAME, b"fw-dispatch\0"),
            ],
        );
        // The kernel reports the sending thread's id, which is not a thread of ours here.
        buf.extend(newgen(own, 4_000_000, "agent"));
        assert_eq!(r.datagram(&buf, Instant::now()), vec![]);
        assert_eq!(r.stats.own_commits.load(Ordering::Relaxed), 1);
        assert!(r.own.portids.contains(&own));
    }

    #[test]
    fn a_thread_of_ours_with_its_name_is_ours_even_without_the_socket() {
        let tid = nix::unistd::gettid().as_raw() as u32;
        let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        assert!(is_own_thread(Some(tid), Some(comm.trim_end())));
        assert!(!is_own_thread(Some(tid), Some("nft")));
        assert!(!is_own_thread(None, Some("nft")));
    }

    #[test]
    fn an_overrun_is_a_possible_drift_of_unknown_origin() {
        let mut r = reader();
        let buf = nft_msg(
            NEWRULE,
            NFPROTO_INET,
            FOREIGN,
            &[
                table_attr("nodeplane"),
                attr(NFTA_OBJECT_NAME, b"fw-dispatch\0"),
            ],
        );
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

    #[test]
    fn proc_net_netlink_lines_map_inodes_to_port_ids() {
        let table = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
                     ffff8881 0   1234       00000000 0        0        0     2        0        111\n\
                     ffff8882 12  3164021135 00000040 0        0        0     2        0        222\n\
                     ffff8883 12  77         00000000 0        0        0     2        0        333\n";
        let ours: HashSet<u64> = [111, 222].into();
        assert_eq!(netfilter_portids(table, &ours), [3_164_021_135].into());
    }
}
