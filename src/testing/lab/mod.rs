//! Network-namespace lab of the kernel tests and benches (`nodeplane::testing::lab`).
//!
//! ```text
//! let mut lab = Lab::new();                       // panics if not root: never skips
//! let node = lab.add_node("node");
//! let pod = lab.add_pod(&node, "pod", &["10.244.1.2"]);
//! let ext = lab.add_host("ext");
//! lab.link(&node, &["192.168.1.1/24"], &ext, &["192.168.1.100/24"]);
//! lab.add_route(&ext, "10.244.0.0/16", "192.168.1.1");
//! let _srv = ext.tcp_server("0.0.0.0:8080", "ext");
//! let reply = pod.ns.tcp_connect("192.168.1.100:8080", SECOND).expect_reply();
//! assert_eq!(reply.src_ip(), pod.ip());
//! ```
mod agent;
mod byte_server;
mod datagrams;
pub mod dns;
mod echo;
mod matrix;
mod monitored;
mod netns;
mod node_lab;
pub mod sandbox;
mod stream;
mod topology;
mod traffic;

use std::time::{Duration, Instant};

pub use agent::{
    AgentProcess, ManifestAgent, agent_bin, assert_every_task_stopped, with_open_files,
};
pub use byte_server::{byte_server, connect_times};
pub use datagrams::{Arrival, DatagramSender, DatagramSink, Outage};
pub use echo::{EchoConn, line_echo_server};
pub use matrix::{Endpoint, Probe, Truth, assert_truth, probe_all};
pub use monitored::Monitored;
pub use netns::{
    CmdError, Exclusive, Ns, create as create_netns, delete as delete_netns, exclusive, run_cmd,
};
pub use node_lab::{NODE, NodeLab};
pub use sandbox::{sandboxed, sandboxed_with};
pub use stream::{ConnStream, StreamTally};
pub use topology::{
    Bridge, Lab, Link, POD_GW4, POD_GW6, Pod, PodNetwork, Segment, Topology, set_br_netfilter,
};
pub use traffic::{Outcome, Reply, Server};

/// A sensible default timeout for probes that are expected to succeed.
pub const SECOND: Duration = Duration::from_secs(1);

/// Writes the manifest `name` into `dir` by write-then-rename, so an agent watching the
/// directory never reads half a file.
pub fn write_manifest(dir: &std::path::Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// True if a netns with this name exists (for cleanup assertions).
pub fn netns_exists(name: &str) -> bool {
    netns::exists(name)
}

/// Retries `f` every 100 ms until it returns Ok or `timeout` passes, then panics with the
/// last error (for state the agent converges to asynchronously).
#[track_caller]
pub fn eventually<T>(timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("not true after {timeout:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Polls `now` until it returns `want`, for `secs` seconds (the agent applies changes
/// asynchronously), then panics with the last value.
#[track_caller]
pub fn wait_for<T: PartialEq + std::fmt::Debug>(secs: u64, want: T, mut now: impl FnMut() -> T) {
    eventually(Duration::from_secs(secs), || {
        let got = now();
        if got == want {
            Ok(())
        } else {
            Err(format!("got {got:?}, want {want:?}"))
        }
    });
}
