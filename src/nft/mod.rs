//! nftables engine: typed IR, text renderer, transactions and the diff that builds them, and
//! the backends that apply a transaction (the kernel through netlink, or the in-memory fake).

pub mod diff;
pub mod engine;
pub mod fake;
pub mod ir;
pub mod monitor;
pub mod names;
pub mod nftnl;
pub mod readback;
pub mod render;
pub mod trace;
pub mod transaction;

pub use diff::diff;
pub use engine::{ApplyStats, Engine, NftBackend, NftError};
pub use fake::FakeBackend;
pub use ir::*;
pub use transaction::{Op, Transaction};
