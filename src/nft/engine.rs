//! The engine keeps what the kernel holds and turns each desired table into the smallest
//! transaction; backends (netlink, fake) only execute transactions.

use super::diff::diff;
use super::ir::{Family, Table};
use super::readback::Baseline;
use super::transaction::Transaction;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The kernel refused the batch; nothing was applied (batches are atomic).
    #[error("kernel rejected {what}: {reason}")]
    Rejected { what: String, reason: String },
    /// Talking to netlink failed (socket, permissions, truncated reply).
    #[error("netlink: {0}")]
    Netlink(#[from] std::io::Error),
    /// The IR could not be encoded (a value does not fit its field).
    #[error("cannot encode {what}: {reason}")]
    Encode { what: String, reason: String },
}

/// What one apply sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Transaction operations (one per table/chain/set/rule op and per element).
    pub ops: usize,
    /// Netlink messages in the batch (excluding begin/end markers).
    pub messages: usize,
}

/// Several transactions sent one after the other count as their sum.
impl std::ops::AddAssign for ApplyStats {
    fn add_assign(&mut self, other: ApplyStats) {
        self.ops += other.ops;
        self.messages += other.messages;
    }
}

/// Executes transactions and reads the table back.
pub trait NftBackend {
    /// Applies `tx` atomically or not at all.
    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError>;
    /// What the kernel holds of `desired.name`, judged against `desired` (see
    /// [`readback::mirror`]).
    fn read_back(&mut self, desired: &Table) -> Result<Baseline, NftError>;
}

/// Tracks the kernel's table and syncs desired states through a backend.
///
/// The table is never replaced: when what the kernel holds is unknown (start-up, periodic
/// resync, drift, a rejected batch) the engine reads it back and applies only the
/// difference, so a restart with nothing changed writes nothing, and base chains and
/// dynamic sets (session affinity) stay as they are.
pub struct Engine<B: NftBackend> {
    backend: B,
    /// What the kernel holds, when known. `None`: read it back before the next diff.
    current: Option<Table>,
    /// Read-backs done (start-up, resync, drift, after a rejection).
    read_backs: u64,
    /// Creating a table of more operations than this splits the elements of the sets the
    /// predicate names off into later transactions (see [`Transaction::create_chunked`]).
    chunks: Option<Chunking>,
}

/// Most elements per transaction after the first, and which sets may be deferred.
#[derive(Debug, Clone, Copy)]
struct Chunking {
    max_ops: usize,
    deferrable: fn(&str) -> bool,
}

impl<B: NftBackend> Engine<B> {
    pub fn new(backend: B) -> Self {
        Engine {
            backend,
            current: None,
            read_backs: 0,
            chunks: None,
        }
    }

    /// Creates large tables in transactions of at most `max_ops` elements after the first,
    /// deferring only the elements of the sets `deferrable` names.
    pub fn with_chunks(mut self, max_ops: usize, deferrable: fn(&str) -> bool) -> Self {
        self.chunks = Some(Chunking {
            max_ops,
            deferrable,
        });
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn current(&self) -> Option<&Table> {
        self.current.as_ref()
    }

    /// How many times the kernel's table was read back.
    pub fn read_backs(&self) -> u64 {
        self.read_backs
    }

    /// The transaction that would bring the kernel to `desired`, as far as the engine
    /// knows what the kernel holds (`--dry-run` and tests; `sync` reads back first).
    pub fn plan(&self, desired: &Table) -> Transaction {
        match &self.current {
            Some(cur) => diff(cur, desired),
            None => Transaction::full(desired),
        }
    }

    /// Brings the kernel to `desired`. An empty diff sends nothing. A rejected batch is
    /// never retried as it was: the table is read back and the difference applied once.
    pub fn sync(&mut self, desired: Table) -> Result<ApplyStats, NftError> {
        let Some(current) = &self.current else {
            return self.repair(desired);
        };
        let tx = diff(current, &desired);
        if tx.is_empty() {
            return Ok(ApplyStats::default());
        }
        match self.backend.apply(&tx) {
            Ok(stats) => {
                self.current = Some(desired);
                Ok(stats)
            }
            Err(e) => {
                // The kernel is not what we believed (someone changed it) or the outcome
                // is unknown: believe nothing, read it back, diff again.
                tracing::warn!("nftables update failed ({e}); reading the table back");
                self.current = None;
                self.repair(desired)
            }
        }
    }

    /// Reads the kernel's table back and applies the difference.
    fn repair(&mut self, desired: Table) -> Result<ApplyStats, NftError> {
        self.read_backs += 1;
        let baseline = self.backend.read_back(&desired)?;
        let tx = match (&baseline.table, self.chunks) {
            (None, Some(c)) => {
                let mut txs = Transaction::create_chunked(&desired, c.max_ops, &c.deferrable);
                if txs.len() > 1 {
                    return self.apply_chunks(txs, desired);
                }
                txs.remove(0)
            }
            (None, None) => Transaction::create(&desired),
            (Some(cur), _) => Transaction::from_baseline(cur, &desired, &baseline),
        };
        if tx.is_empty() {
            self.current = Some(desired);
            return Ok(ApplyStats::default());
        }
        let stats = self.backend.apply(&tx)?;
        self.current = Some(desired);
        Ok(stats)
    }

    /// Applies the transactions of a chunked creation in order. If one fails, what the kernel
    /// holds is unknown: the next sync reads it back.
    fn apply_chunks(
        &mut self,
        txs: Vec<Transaction>,
        desired: Table,
    ) -> Result<ApplyStats, NftError> {
        let mut total = ApplyStats::default();
        for tx in &txs {
            total += self.backend.apply(tx)?;
        }
        self.current = Some(desired);
        Ok(total)
    }

    /// Forgets what the kernel holds: the next sync reads the table back and repairs
    /// only what differs (periodic resync, drift).
    pub fn invalidate(&mut self) {
        self.current = None;
    }

    /// Removes `table <family> <table>` (absent is fine).
    pub fn delete_table(&mut self, family: Family, table: &str) -> Result<ApplyStats, NftError> {
        let stats = self.backend.apply(&Transaction::delete(family, table))?;
        self.current = None;
        Ok(stats)
    }
}
