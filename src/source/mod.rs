//! Where objects come from. Every source produces the same [`Snapshot`](crate::snapshot::Snapshot).
//!
//! - [`manifests`]: a directory of YAML/JSON manifests (multi-document files, `kind: List`),
//!   within the resource [`limits`], with [`watch`] telling when to reload it and [`loader`]
//!   re-parsing only changed files on a thread of its own.
//! - [`kube`]: the Kubernetes API (one watch per kind, published once all have synced).

pub mod kube;
pub mod limits;
pub mod loader;
pub mod manifests;
mod parse;
pub mod watch;

pub use limits::Limits;
pub use manifests::{LoadError, LoadProblem, LoadReport, load_dir, load_dir_with, load_str};
pub use watch::{DEFAULT_DEBOUNCE, WatchError, watch_dir, watch_dir_with};
