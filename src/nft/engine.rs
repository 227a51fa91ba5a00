//! The engine keeps what the kernel holds and turns each desired table into the smallest
//! transaction; backends (netlink, fake) only execute transactions.

use super::diff::{Transaction, apply_to, diff};
use super::ir::Table;

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

/// Executes transactions. Implementations must apply a transaction atomically or not at all.
pub trait NftBackend {
    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError>;
}

/// An in-memory backend that applies transactions to a model table with the kernel's
/// referential rules, and can be told to reject the next transaction.
#[derive(Debug, Default)]
pub struct FakeBackend {
    pub table: Option<Table>,
    pub applied: Vec<Transaction>,
    pub reject_next: Option<String>,
}

impl NftBackend for FakeBackend {
    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError> {
        if let Some(reason) = self.reject_next.take() {
            return Err(NftError::Rejected {
                what: "transaction".into(),
                reason,
            });
        }
        let mut next = self.table.clone();
        apply_to(&mut next, tx).map_err(|reason| NftError::Rejected {
            what: "transaction".into(),
            reason,
        })?;
        self.table = next;
        self.applied.push(tx.clone());
        Ok(ApplyStats {
            ops: tx.op_count(),
            messages: tx.ops.len(),
        })
    }
}

/// Tracks the kernel's table and syncs desired states through a backend.
pub struct Engine<B: NftBackend> {
    backend: B,
    /// What the kernel holds, when known. `None` forces a full (atomic) replacement.
    current: Option<Table>,
}

impl<B: NftBackend> Engine<B> {
    pub fn new(backend: B) -> Self {
        Engine {
            backend,
            current: None,
        }
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

    /// The transaction that would bring the kernel to `desired`.
    pub fn plan(&self, desired: &Table) -> Transaction {
        match &self.current {
            Some(cur) => diff(cur, desired),
            None => Transaction::full(desired),
        }
    }

    /// Brings the kernel to `desired`. An empty diff sends nothing.
    pub fn sync(&mut self, desired: Table) -> Result<ApplyStats, NftError> {
        let Some(current) = &self.current else {
            return self.replace(desired);
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
            Err(e @ NftError::Rejected { .. }) => Err(e),
            Err(e) => {
                // Unknown outcome: the next sync replaces the table wholesale.
                self.current = None;
                Err(e)
            }
        }
    }

    /// Full, atomic replacement; the desired table moves through the transaction and back,
    /// so even a 100k-element table is never copied.
    /// A table with parts is kept structured, so the next diff can skip unchanged parts by
    /// pointer; its transaction references the parts' elements instead of copying them.
    fn replace(&mut self, desired: Table) -> Result<ApplyStats, NftError> {
        if !desired.parts.is_empty() {
            let stats = self.backend.apply(&Transaction::full(&desired))?;
            self.current = Some(desired);
            return Ok(stats);
        }
        let tx = Transaction::full_owned(desired);
        let stats = self.backend.apply(&tx)?;
        self.current = Some(tx.into_table());
        Ok(stats)
    }

    /// Forgets the kernel state so the next sync is a full replacement (periodic resync).
    pub fn invalidate(&mut self) {
        self.current = None;
    }

    /// Removes the table.
    pub fn delete_table(&mut self, table: &str) -> Result<ApplyStats, NftError> {
        let stats = self.backend.apply(&Transaction::delete(table))?;
        self.current = None;
        Ok(stats)
    }
}
