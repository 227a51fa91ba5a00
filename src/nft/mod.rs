//! nftables engine: typed IR, text renderer, diff, and the backends that apply a
//! transaction (the kernel through netlink, or an in-memory fake for unit tests).

pub mod diff;
pub mod engine;
pub mod ir;
pub mod monitor;
pub mod names;
pub mod nftnl;
pub mod readback;
pub mod render;

pub use diff::{Op, Transaction, diff};
pub use engine::{ApplyStats, Engine, FakeBackend, NftBackend, NftError};
pub use ir::*;
