//! The shared test kit: unit tests, kernel tests and benches build objects, network
//! namespaces and checks the same way, from one place.
//!
//! Compiled for the crate's own unit tests and with the `testing` feature, which the
//! integration tests and benches turn on through a self dev-dependency in Cargo.toml; the
//! agent binary never contains it.
//!
//! - `objects`: manifests and typed objects of every kind the agent reads.
//! - `lab`: named network namespaces (nodes, pods, hosts), traffic, the agent as a process.
//! - `ir`: IR pieces the golden, backend and diff tests build alike.
//! - `listing`: the kernel's view of a table, normalised for comparisons.
//! - `large`: a large synthetic table (kernel tests and benches).
//! - `nft_check`: `nft -c`, the kernel's verdict on rendered text.
//! - `runtime`: tokio runtimes for tests that drive the agent's async parts themselves.
//! - `stats`: `percentile`, the one quantile every bench prints.
//! - `args`: command-line options of the harness-less benches.
//! - `bombs`: hostile manifests and running a command within a time and memory budget.
//! - `eip_cluster`: a multi-node EgressIP cluster in netns, in Kubernetes mode against `fakeapi`.
//! - `fakeapi`: an in-process Kubernetes API server (lists, watches, status writes, Leases).
//! - `cloud_controller`: a cloud-controller stand-in answering CloudPrivateIPConfigs over
//!   `fakeapi`, with an injectable delay and injectable `CloudResponseError`s.

pub mod args;
pub mod bombs;
pub mod cloud_controller;
pub mod eip_cluster;
pub mod fakeapi;
pub mod forged_probes;
pub mod ir;
pub mod lab;
pub mod large;
pub mod listing;
pub mod netlink;
pub mod nft_check;
pub mod objects;
pub mod runtime;
pub mod stats;
