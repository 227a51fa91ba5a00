//! An nftables trace of chosen packets (`agent explain --trace`): a table of its own,
//! `nodeplane-trace`, whose chains run before every other (priority -500 at prerouting and
//! output, and at the bridge's prerouting) and set the trace bit of the packets that match,
//! and a listener on the kernel's trace group that collects what the packets meet.
//!
//! The table is added with the `owner` flag on the session's own socket: the kernel removes
//! it when that socket closes, so a trace ends even if the process dies mid-way. A session is
//! bounded in time and in packets by its caller; dropping it deletes the table at once.

pub mod wire;

use crate::nft::engine::{NftBackend, NftError};
use crate::nft::ir::{BaseChain, Chain, ChainType, Family, Hook, Match, Policy, Rule, Stmt, Table};
use crate::nft::nftnl::{NftnlBackend, socket};
use crate::nft::transaction::{Op, Transaction};
use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
pub use wire::{KernelVerdict, TraceEvent, TraceKind};

/// The trace table's name, in each family traced.
pub const TRACE_TABLE: &str = "nodeplane-trace";
/// Before every other chain of the node (raw is -300, conntrack -200).
const PRIORITY: i32 = -500;
/// After the last packet asked for, how long the events of its later hooks may take.
const SETTLE: Duration = Duration::from_millis(300);

/// The trace table of `family`: the packets matching `matches` get the trace bit.
pub fn trace_table(family: Family, matches: &[Match]) -> Table {
    let mut table = Table::with_family(family, TRACE_TABLE);
    let hooks: &[Hook] = match family {
        Family::Inet => &[Hook::Prerouting, Hook::Output],
        Family::Bridge => &[Hook::Prerouting],
    };
    for &hook in hooks {
        let name = format!("trace-{}", hook.keyword());
        let mut stmts: Vec<Stmt> = matches.iter().cloned().map(Stmt::Match).collect();
        stmts.push(Stmt::Trace);
        table.chains.insert(
            name.clone(),
            Chain {
                name,
                base: Some(BaseChain {
                    kind: ChainType::Filter,
                    hook,
                    priority: PRIORITY,
                    policy: Policy::Accept,
                }),
                rules: vec![Rule::new(stmts)],
            },
        );
    }
    table
}

/// A running trace: its tables exist while it lives.
pub struct Session {
    /// One backend per traced family: each holds the socket that owns its table.
    tables: Vec<(Family, NftnlBackend)>,
    listener: OwnedFd,
    /// Trace messages the kernel could not queue (the listener's buffer was full).
    pub lost: u64,
}

impl Session {
    /// Starts listening, then adds the trace tables (so no traced packet is missed).
    pub fn start(tables: Vec<Table>) -> Result<Session, NftError> {
        let listener = socket::netfilter_socket(1 << (wire::NFNLGRP_NFTRACE - 1))?;
        socket::set_buffer(&listener, socket::Buffer::Receive, 4 << 20)?;
        let timeout = nix::sys::time::TimeVal::new(0, 100_000);
        nix::sys::socket::setsockopt(
            &listener,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .map_err(std::io::Error::from)?;
        let mut session = Session {
            tables: Vec::new(),
            listener,
            lost: 0,
        };
        for table in tables {
            let mut tx = Transaction::create(&table);
            if let Some(first @ Op::AddTable) = tx.ops.first_mut() {
                *first = Op::AddOwnedTable;
            }
            let mut backend = NftnlBackend::new();
            backend.apply(&tx).map_err(|e| match e {
                NftError::Rejected { reason, .. } if reason.contains("Operation not permitted") => {
                    NftError::Rejected {
                        what: format!("table {} {TRACE_TABLE}", table.family.keyword()),
                        reason: "another trace is running".into(),
                    }
                }
                e => e,
            })?;
            session.tables.push((table.family, backend));
        }
        Ok(session)
    }

    /// The trace events until `deadline`, or until `packets` packets were seen (and
    /// [`SETTLE`] more for their later hooks). Events of the trace tables themselves are
    /// left out.
    pub fn collect(&mut self, deadline: Instant, packets: usize) -> Vec<TraceEvent> {
        let mut events = Vec::new();
        let mut ids = BTreeSet::new();
        let mut deadline = deadline;
        let mut buf = vec![0u8; 1 << 16];
        let mut datagrams = 0u64;
        while Instant::now() < deadline {
            match nix::sys::socket::recv(
                self.listener.as_raw_fd(),
                &mut buf,
                nix::sys::socket::MsgFlags::empty(),
            ) {
                Ok(n) => {
                    datagrams += 1;
                    for ev in wire::parse_datagram(&buf[..n]) {
                        if ev.table == TRACE_TABLE {
                            // The headers ride on the first event of each hook: keep them.
                            if ids.len() < packets || ids.contains(&ev.id) {
                                ids.insert(ev.id);
                                events.push(ev);
                            }
                            continue;
                        }
                        if ids.contains(&ev.id) {
                            events.push(ev);
                        }
                    }
                    if ids.len() >= packets {
                        deadline = deadline.min(Instant::now() + SETTLE);
                    }
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::ENOBUFS) => self.lost += 1,
                Err(e) => {
                    tracing::warn!("trace listener: {e}");
                    break;
                }
            }
        }
        tracing::debug!(
            datagrams,
            events = events.len(),
            packets = ids.len(),
            "trace collected"
        );
        events
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for (family, backend) in &mut self.tables {
            let tx = Transaction {
                table: TRACE_TABLE.into(),
                family: *family,
                ops: vec![Op::DeleteTable],
            };
            // Closing the owning socket right after removes it too.
            if let Err(e) = backend.apply(&tx) {
                tracing::debug!("trace table {}: {e}", family.keyword());
            }
        }
    }
}
