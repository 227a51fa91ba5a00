//! The DaemonSet's sandbox for the agents a test starts (`sandboxed(|| ...)`).
//!
//! `deploy/daemonset.yaml` runs the agent as uid 0 (the image's user) in the node's netns
//! (`hostNetwork`) with every capability dropped but [`CAPABILITIES`], no privilege
//! escalation, a read-only root filesystem except its state directory, and, as every
//! container runtime does for an unprivileged container, `/proc/sys` and `/sys` read-only.
//! Inside `sandboxed`, every agent the lab starts (`Ns::spawn_agent`, `Ns::run_agent`, and
//! so `ManifestAgent` and `eip_cluster`) runs exactly so: `ip netns exec` (the netns),
//! `unshare --mount` (a mount namespace of its own, in which `/proc/sys` is bind-mounted
//! read-only and every other mount but `/proc`, `/dev` and the netns's state directory is
//! remounted read-only), then `setpriv --no-new-privs --bounding-set` (root keeps only the
//! capabilities of the bounding set). A kernel test of a feature, run inside, proves that the
//! feature needs nothing the DaemonSet does not grant.
//!
//! Not non-root: Kubernetes gives a non-root container's added capabilities to its bounding
//! set only (no ambient capabilities), and with `allowPrivilegeEscalation: false` file
//! capabilities do not apply either, so the shipped image runs as uid 0 and the sandbox does
//! the same.

use std::cell::Cell;
use std::ffi::OsString;
use std::path::Path;

/// The capabilities `deploy/daemonset.yaml` adds and `systemd/nodeplane-agent.service`
/// bounds the agent to (a deploy test keeps the three equal). Why each: README
/// "Capabilities".
pub const CAPABILITIES: &[&str] = &["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"];

type Caps = &'static [&'static str];

thread_local! {
    /// The capabilities of the sandbox agents started from this thread get, if any.
    static SANDBOXED: Cell<Option<Caps>> = const { Cell::new(None) };
}

/// Runs `f` with every agent the lab starts from this thread inside the DaemonSet's
/// sandbox (see the module documentation); restored afterwards, also after a panic. An
/// agent stopped or dropped there must not have been denied anything (`denials`).
pub fn sandboxed<T>(f: impl FnOnce() -> T) -> T {
    sandboxed_with(CAPABILITIES, f)
}

/// `sandboxed` with other capabilities than the DaemonSet's (to see what the agent says
/// when one is missing); denials are then expected and not checked.
pub fn sandboxed_with<T>(capabilities: Caps, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Caps>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SANDBOXED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SANDBOXED.with(|s| s.replace(Some(capabilities))));
    f()
}

/// Whether agents started from this thread now run sandboxed.
pub fn is_sandboxed() -> bool {
    SANDBOXED.with(Cell::get).is_some()
}

/// Whether agents started from this thread now run in exactly the DaemonSet's sandbox.
pub(crate) fn is_daemonset_sandbox() -> bool {
    SANDBOXED.with(Cell::get) == Some(CAPABILITIES)
}

/// What the kernel says when the sandbox denies something: a write to a read-only mount, a
/// missing capability.
const DENIALS: &[&str] = &[
    "Read-only file system",
    "Operation not permitted",
    "Permission denied",
    "missing capability",
];

/// The log lines of a sandboxed agent that show the sandbox denying it something (checked
/// when the lab stops or drops the agent).
pub fn denials(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| DENIALS.iter().any(|d| l.contains(d)))
        .collect()
}

/// Sets up the mounts, then execs `setpriv` (so the agent keeps the pid `ip netns exec`
/// started: signals and `/proc/<pid>` reach it). `$1` is the writable state directory, `$2`
/// the capability list in setpriv's form, the rest the agent's command line. Mounts hidden
/// under a later mount at the same place or above it (the `/sys` that `ip netns exec`
/// mounts over the host's, with the host's cgroup mounts below) cannot be reached and are
/// skipped; every other one is remounted read-only keeping its flags (a user namespace, as
/// in `scripts/test-unprivileged.sh`, refuses to drop locked ones). A mount that cannot be
/// made read-only fails the start: a sandbox that is not the DaemonSet's must not pass for
/// one.
const SETUP: &str = r#"
state=$1; caps=$2; shift 2
mkdir -p "$state"
mount --bind "$state" "$state"
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
awk '{ t[NR] = $5; o[NR] = $6 }
  END {
    for (i = 1; i <= NR; i++) {
      hidden = 0
      for (j = i + 1; j <= NR; j++)
        if (t[j] == "/" || t[j] == t[i] || index(t[i], t[j] "/") == 1) { hidden = 1; break }
      if (!hidden) print t[i], o[i]
    }
  }' /proc/self/mountinfo | while read -r m opts; do
  case "$m" in "$state"|/proc|/proc/*|/dev|/dev/*|/run/netns/*) continue;; esac
  mount -o "remount,bind,ro,${opts#rw,}" "$m"
done
exec setpriv --no-new-privs --bounding-set=-all,"$caps" -- "$@"
"#;

/// The command line that runs `agent argv...` in the sandbox, to be run by `ip netns exec`.
pub(crate) fn wrap(state_dir: &Path, agent: &[OsString]) -> Vec<OsString> {
    let caps: Vec<String> = SANDBOXED
        .with(Cell::get)
        .unwrap_or(CAPABILITIES)
        .iter()
        .map(|c| format!("+{}", c.to_ascii_lowercase()))
        .collect();
    let mut argv: Vec<OsString> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-euc",
        SETUP,
        "nodeplane-sandbox",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    argv.push(state_dir.into());
    argv.push(caps.join(",").into());
    argv.extend(agent.iter().cloned());
    argv
}
