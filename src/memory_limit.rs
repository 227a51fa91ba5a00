//! The agent's memory against its cgroup's limit. A DaemonSet's `limits.memory` that is too
//! small for the cluster is an OOM kill during a cold start, which restarts the agent into the
//! same cold start: the log says so before it happens. Read-only: `/proc/self` and the cgroup
//! filesystem are only read.

use std::path::Path;

use tracing::{info, warn};

use crate::observe::{SyncObserver, SyncOutcome};

/// Above this share of the limit the log warns (once, until usage falls below `REARM`).
const WARN_AT: f64 = 0.8;
const REARM: f64 = 0.7;

/// The memory limit of the agent's cgroup in bytes: cgroup v2 `memory.max`, else v1
/// `memory.limit_in_bytes`; `None` when there is none ("max", or no cgroup filesystem).
pub fn cgroup_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(Path::new("/sys/fs/cgroup"), &own)
}

/// `cgroup` is the text of `/proc/self/cgroup`, `root` where the cgroup filesystem is mounted.
fn limit_from(root: &Path, cgroup: &str) -> Option<u64> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    // v2: "0::/path"; in a container with a cgroup namespace the path is "/".
    if let Some(path) = cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
        let dir = root.join(path.trim_start_matches('/'));
        for d in [dir.as_path(), root] {
            if let Some(v) = read(&d.join("memory.max")) {
                return parse_limit(&v);
            }
        }
    }
    read(&root.join("memory/memory.limit_in_bytes")).and_then(|v| parse_limit(&v))
}

fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    // cgroup v1 writes "no limit" as a huge page-rounded number.
    (v < 1 << 60).then_some(v)
}

/// The agent's resident memory in bytes (`VmRSS` of `/proc/self/status`).
pub fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

const MIB: u64 = 1 << 20;

/// Logs the limit at start and warns after a sync that leaves the agent near it.
pub struct MemoryWatch {
    limit: Option<u64>,
    warned: bool,
}

impl MemoryWatch {
    pub fn start() -> MemoryWatch {
        let limit = cgroup_limit();
        match limit {
            Some(l) => info!(
                "memory limit {} MiB (cgroup); measured peaks: README \"Memory\"",
                l / MIB
            ),
            None => info!("no memory limit (cgroup)"),
        }
        MemoryWatch {
            limit,
            warned: false,
        }
    }

    /// Whether `rss` should warn now (and updates the once-per-crossing state).
    fn check(&mut self, rss: u64) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        let share = rss as f64 / limit as f64;
        if share >= WARN_AT && !self.warned {
            self.warned = true;
            return true;
        }
        if share < REARM {
            self.warned = false;
        }
        false
    }
}

impl SyncObserver for MemoryWatch {
    fn observe(&mut self, _sync: &SyncOutcome<'_>) {
        let Some(rss) = rss() else { return };
        if self.check(rss) {
            warn!(
                "memory: {} MiB resident of a {} MiB limit: the cluster is larger than the \
                 limit allows for (a cold start needs more, README \"Memory\"); raise the \
                 DaemonSet's limits.memory before the agent is OOM-killed",
                rss / MIB,
                self.limit.unwrap_or(0) / MIB
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v2_v1_and_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(limit_from(root, "0::/\n"), None);
        std::fs::create_dir_all(root.join("kubepods/pod1")).unwrap();
        std::fs::write(root.join("kubepods/pod1/memory.max"), "268435456\n").unwrap();
        assert_eq!(limit_from(root, "0::/kubepods/pod1\n"), Some(256 * MIB));
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        assert_eq!(limit_from(root, "0::/\n"), None, "unlimited");
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("memory")).unwrap();
        let f = v1.path().join("memory/memory.limit_in_bytes");
        std::fs::write(&f, "536870912\n").unwrap();
        assert_eq!(limit_from(v1.path(), "4:memory:/x\n"), Some(512 * MIB));
        std::fs::write(&f, "9223372036854771712\n").unwrap();
        assert_eq!(limit_from(v1.path(), "4:memory:/x\n"), None);
    }

    #[test]
    fn warns_once_per_crossing() {
        let mut w = MemoryWatch {
            limit: Some(100 * MIB),
            warned: false,
        };
        assert!(!w.check(50 * MIB));
        assert!(w.check(85 * MIB));
        assert!(!w.check(90 * MIB), "once");
        assert!(!w.check(60 * MIB));
        assert!(w.check(81 * MIB), "again after falling back");
        assert!(rss().is_some_and(|r| r > MIB));
    }
}
