//! nodeplane: a node-level network dataplane agent.
//!
//! Data flows one way: sources -> snapshot -> planner -> desired state -> backends.
//! See ARCHITECTURE.md for a paragraph on each module.

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
