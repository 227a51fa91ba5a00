//! Tokio runtimes for the tests that drive the agent's async parts themselves (fake API
//! clients, probes, netlink), with I/O and time enabled as the agent's own runtime has them.

use tokio::runtime::{Builder, Runtime};

/// A runtime on the calling thread.
pub fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A runtime with `workers` threads of its own.
pub fn multi_thread(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
