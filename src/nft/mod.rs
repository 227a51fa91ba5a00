//! nftables engine: typed IR, text renderer, transactions and the diff that builds them, and
//! the backends that apply a transaction (the kernel through netlink, or the in-memory fake).

/// Kernel constants `libc` defines (mostly as `c_int`), in the width the agent writes them:
/// `uapi!(pub u32: NFT_CMP_EQ, NFT_CMP_NEQ);` is `pub const NFT_CMP_EQ: u32 =
/// libc::NFT_CMP_EQ as u32;` for each name.
macro_rules! uapi {
    ($vis:vis $ty:ty: $($(#[$attr:meta])* $name:ident),+ $(,)?) => {
        $($(#[$attr])* $vis const $name: $ty = ::libc::$name as $ty;)+
    };
}

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
