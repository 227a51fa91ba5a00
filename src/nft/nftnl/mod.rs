//! The netlink backend: a [`Transaction`] becomes one nftables batch (begin ... end, atomic
//! in the kernel) with exactly the messages `nft -f` sends for the text `render.rs` prints.
//!
//! Layers, from pure to FFI:
//! - `types`, `udata`: nft's datatype and field tables, set userdata bytes;
//! - `rule` (with `expr`): statements -> kernel expressions (registers, dependencies,
//!   anonymous sets);
//! - `set`, `elems`: set declarations; elements (intervals, concatenations, data) encoded
//!   straight into the element-list attributes nft sends;
//! - `lower`: the transaction -> a list of messages, each tagged with its op;
//! - `ffi`: the messages -> libnftnl objects -> an `nftnl::Batch` (all the `unsafe`);
//! - `malloc`: glibc's malloc controls for `crate::heap` (FFI, so here with the rest);
//! - `socket`, `reply`: one `sendmsg`, then every ack and error read back and mapped to the
//!   op (and element or expression) that caused it.

mod counters;
mod dump;
mod elems;
mod expr;
mod ffi;
pub(crate) mod kept;
mod lower;
pub mod malloc;
mod readback;
pub(crate) mod reply;
mod rule;
mod set;
pub(crate) mod socket;
mod types;
mod udata;

pub use counters::{ElemCount, RuleCount, TableCounters, read_counters};
pub use dump::{Counted, read_table, rule_counts, rule_handles};

use crate::nft::engine::{ApplyStats, NftBackend, NftError};
use crate::nft::ir::Set;
use crate::nft::monitor::{QUIET_MIN_OPS, Quiet};
use crate::nft::render;
use crate::nft::transaction::{Op, Transaction};
use ffi::NFTA_SET_ELEM_LIST_ELEMENTS;
use lower::{Msg, MsgBody};
use reply::KernelError;
use rule::KnownSet;
use std::collections::BTreeMap;

/// `NFTA_RULE_EXPRESSIONS`: with `NFTA_SET_ELEM_LIST_ELEMENTS`, the lists an error offset
/// can point into.
const NFTA_RULE_EXPRESSIONS: u16 = 4;

/// Applies transactions to the kernel over netlink.
#[derive(Debug, Default)]
pub struct NftnlBackend {
    /// Declarations of the sets this backend created and that still exist: a rule added
    /// later may look one up, and interval sets keyed by host-order types need a byte
    /// swap in the rule.
    known: BTreeMap<String, KnownSet>,
    /// Kept open between applies: closing a netfilter netlink socket costs the kernel
    /// ~15 ms (measured with strace on 6.18), more than a small update itself. It belongs
    /// to the network namespace of the first apply.
    socket: Option<socket::NlSocket>,
    /// The drift monitor's handle: large transactions are sent in its quiet window.
    quiet: Option<Quiet>,
}

/// A transaction encoded as a batch, for inspection and tests.
pub struct EncodedBatch<'a> {
    encoded: ffi::Encoded,
    msgs: Vec<Msg<'a>>,
}

impl EncodedBatch<'_> {
    /// The batch bytes as sent (BATCH_BEGIN ... BATCH_END).
    pub fn bytes(&self) -> Vec<u8> {
        self.encoded.batch.iter().flatten().copied().collect()
    }

    /// nf_tables messages in the batch (excluding the begin/end markers).
    pub fn message_count(&self) -> usize {
        self.msgs.len()
    }
}

impl NftnlBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends transactions of [`QUIET_MIN_OPS`] or more operations in `quiet`'s window, so the
    /// kernel builds no notification per element for the drift monitor (same netns).
    pub fn with_quiet(mut self, quiet: Option<Quiet>) -> Self {
        self.quiet = quiet;
        self
    }

    /// Encodes `tx` without sending it.
    pub fn encode<'a>(&self, tx: &'a Transaction) -> Result<EncodedBatch<'a>, NftError> {
        let msgs = lower::lower(tx, &self.known)?;
        let encoded = ffi::encode(&msgs, tx.family, &tx.table);
        Ok(EncodedBatch { encoded, msgs })
    }

    fn remember(&mut self, tx: &Transaction) {
        for op in &tx.ops {
            match op {
                Op::DeleteTable => self.known.clear(),
                Op::AddSet(s) | Op::AddSetWithParts { set: s, .. } => {
                    self.known.insert(s.name.clone(), lower::known_set(s, None));
                }
                Op::DeleteSet(name) => {
                    self.known.remove(name);
                }
                _ => {}
            }
        }
    }
}

impl NftBackend for NftnlBackend {
    fn read_back(
        &mut self,
        desired: &crate::nft::ir::Table,
    ) -> Result<crate::nft::readback::Baseline, NftError> {
        let Some(kernel) = dump::read_table(desired.family, &desired.name)? else {
            self.known.clear();
            return Ok(crate::nft::readback::Baseline::default());
        };
        let held: std::collections::BTreeSet<String> = kernel.sets.keys().cloned().collect();
        let flags = kernel.flags;
        let mut judge = readback::Judge::new(kernel, desired);
        let mut baseline = crate::nft::readback::mirror(&mut judge, desired);
        // The agent's table has no flags (see `ffi`: `add table` sends 0).
        baseline.table_flags_differ = flags != 0;
        self.known = judge
            .known()
            .iter()
            .filter(|(name, _)| held.contains(*name))
            .map(|(n, k)| (n.clone(), k.clone()))
            .collect();
        Ok(baseline)
    }

    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError> {
        let batch = self.encode(tx)?;
        let pages: Vec<&[u8]> = batch.encoded.batch.iter().collect();
        let total: usize = pages.iter().map(|p| p.len()).sum();
        // Room for one capped error (~100 bytes) per message in the worst case.
        let (send, recv) = (total + 4096, 128 * batch.msgs.len() + (1 << 18));
        let sock = match self.socket.take() {
            Some(mut s) => {
                s.grow(send, recv)?;
                s
            }
            None => socket::NlSocket::open(send, recv)?,
        };
        let send_batch = || -> Result<_, NftError> {
            sock.send(&pages)?;
            read_errors(&sock)
        };
        let errors = match &mut self.quiet {
            Some(q) if tx.op_count() >= QUIET_MIN_OPS => {
                // Committed: the kernel acked every message. Unknown counts as not
                // committed, so a generation bump it cannot explain reads as a drift.
                q.during(send_batch, |r| r.as_ref().is_ok_and(|e| e.is_empty()))?
            }
            _ => send_batch()?,
        };
        self.socket = Some(sock);
        if let Some(first) = errors.first() {
            let err = rejected(tx, &batch, first, errors.len());
            tracing::warn!(table = %tx.table, errors = errors.len(), "nft batch rejected: {err}");
            return Err(err);
        }
        self.remember(tx);
        let stats = ApplyStats {
            ops: tx.op_count(),
            messages: batch.msgs.len(),
        };
        tracing::debug!(table = %tx.table, ops = stats.ops, messages = stats.messages, bytes = total, "nft batch applied");
        Ok(stats)
    }
}

/// Drains every reply queued for the batch and returns the errors in kernel order.
fn read_errors(sock: &socket::NlSocket) -> Result<Vec<KernelError>, NftError> {
    let mut buf = vec![0u8; 1 << 16];
    let mut errors = Vec::new();
    while let Some(n) = sock.recv_nowait(&mut buf)? {
        errors.extend(reply::parse_errors(&buf[..n]));
    }
    Ok(errors)
}

fn rejected(tx: &Transaction, batch: &EncodedBatch, e: &KernelError, count: usize) -> NftError {
    let mut reason = reply::errno_text(e.errno);
    if let Some(m) = &e.message {
        reason = format!("{m}: {reason}");
    }
    if count > 1 {
        reason.push_str(&format!(" (and {} more errors)", count - 1));
    }
    let what = match batch.encoded.seqs.iter().position(|s| *s == e.seq) {
        Some(i) => describe(tx, batch, i, e.offset),
        None => format!(
            "batch of {} messages for table {} {}",
            batch.msgs.len(),
            tx.family.keyword(),
            tx.table
        ),
    };
    NftError::Rejected { what, reason }
}

/// Names the op behind message `i`, down to the element or expression when the kernel
/// pointed at one.
fn describe(tx: &Transaction, batch: &EncodedBatch, i: usize, offset: Option<u32>) -> String {
    let msg = &batch.msgs[i];
    let op = &tx.ops[msg.origin.op];
    let t = &format!("{} {}", tx.family.keyword(), tx.table);
    let bytes = offset.and_then(|off| {
        let seq = batch.encoded.seqs[i];
        let all = batch.bytes();
        reply::messages(&all)
            .find(|(_, _, s, _)| *s == seq)
            .map(|(_, _, _, m)| (m.to_vec(), off))
    });
    match (&msg.body, op) {
        (MsgBody::NewRule { exprs, .. }, Op::AddRule { chain, rule }) => {
            let mut s = format!("add rule {t} {chain}: {}", render::rule_text(rule));
            let hit = bytes.and_then(|(m, off)| reply::entry_at(&m, NFTA_RULE_EXPRESSIONS, off));
            if let Some((k, e)) = hit.and_then(|k| exprs.get(k).map(|e| (k, e))) {
                s.push_str(&format!(" (kernel expression {}: {})", k + 1, e.name()));
            }
            s
        }
        (_, Op::AddRule { chain, rule }) => format!(
            "add rule {t} {chain}: {} (its anonymous set)",
            render::rule_text(rule)
        ),
        (MsgBody::Elems { chunk, .. }, op) if op.set().is_some() => {
            let set = op.set().expect("a set op");
            let hit = bytes
                .and_then(|(m, off)| reply::entry_at(&m, NFTA_SET_ELEM_LIST_ELEMENTS, off))
                .and_then(|k| chunk.srcs.get(k))
                .and_then(|src| op.elements().nth(*src as usize));
            let verb = if matches!(op, Op::DeleteElements(_)) {
                "delete"
            } else {
                "add"
            };
            match hit {
                Some((k, v)) => {
                    let mut one = set.clone_declaration();
                    one.elements.insert(k.clone(), v.clone());
                    op_text(tx, &elements_op(verb, one))
                }
                None => format!(
                    "{verb} element {t} {}: {} elements",
                    set.name,
                    op.elements().count()
                ),
            }
        }
        (_, Op::AddSet(set) | Op::AddSetWithParts { set, .. }) => {
            op_text(tx, &Op::AddSet(set.clone_declaration()))
        }
        _ => op_text(tx, op),
    }
}

fn elements_op(verb: &str, set: Set) -> Op {
    if verb == "delete" {
        Op::DeleteElements(set)
    } else {
        Op::AddElements(set)
    }
}

/// One op as the `nft -f` line `render_transaction` prints for it.
fn op_text(tx: &Transaction, op: &Op) -> String {
    let one = Transaction {
        table: tx.table.clone(),
        family: tx.family,
        ops: vec![op.clone()],
    };
    render::render_transaction(&one).trim_end().to_string()
}
