//! nodeplane: a node-level network dataplane agent.
//!
//! Data flows one way: sources -> snapshot -> planner -> desired state -> backends.
//! See ARCHITECTURE.md for a paragraph on each module.

/// An enum of unit variants, each spelled one way on the wire (API, flags): the enum (a plain value:
/// copied, compared, ordered, hashed), `ALL` (in declaration order), `as_str` and a `Display`
/// that writes that spelling, from one list.
macro_rules! wire_named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident { $($(#[$vmeta:meta])* $variant:ident = $name:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $ty { $($(#[$vmeta])* $variant),+ }

        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod acl_log;
pub mod admin;
pub mod api;
pub mod app;
pub mod cli;
pub mod config;
pub mod conntrack;
pub mod controller;
pub mod dns;
pub mod dnsproxy;
pub mod explain;
pub mod features;
pub mod healthcheck;
pub mod heap;
pub mod host;
pub mod listener;
pub mod memory_limit;
pub mod net;
pub mod nft;
pub mod observe;
pub mod plan;
pub mod reconcile;
pub mod snapshot;
pub mod source;
pub mod state;
pub mod status;
pub mod task;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod timing;
