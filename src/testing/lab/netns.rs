//! Named network namespaces: creation, deletion, running commands and Rust closures inside them.

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::ThreadId;

use nix::sched::{CloneFlags, setns};

/// `ip netns add/delete` race on the first mount of /run/netns; serialise them per process.
static NETNS_LOCK: Mutex<()> = Mutex::new(());
static LAB_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Kernel tests share a few binaries, so libtest runs several at a time. A test whose
/// assertions depend on timing (drift repair latency, failover) holds `exclusive()` for its whole run: it
/// starts once no lab exists and no other lab is created until it ends. Every `Lab` holds a
/// shared pass (`shared()`).
struct Gate {
    labs: usize,
    exclusive: bool,
    waiting: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    labs: 0,
    exclusive: false,
    waiting: 0,
});
static GATE_CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread holds `exclusive()`: its own labs pass.
    static HOLDS_EXCLUSIVE: Cell<bool> = const { Cell::new(false) };
    /// Shared passes this thread holds: a second lab of the same test never waits for an
    /// exclusive test that itself waits for the first (deadlock).
    static HELD_SHARED: Cell<usize> = const { Cell::new(0) };
}

fn gate() -> std::sync::MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// While held, this test's labs are the only ones in the process. Take it first thing in a
/// test whose assertions depend on timing.
pub struct Exclusive(());

pub fn exclusive() -> Exclusive {
    let mut g = gate();
    g.waiting += 1;
    while g.exclusive || g.labs > 0 {
        g = GATE_CHANGED.wait(g).unwrap_or_else(|p| p.into_inner());
    }
    g.waiting -= 1;
    g.exclusive = true;
    HOLDS_EXCLUSIVE.with(|h| h.set(true));
    Exclusive(())
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        gate().exclusive = false;
        HOLDS_EXCLUSIVE.with(|h| h.set(false));
        GATE_CHANGED.notify_all();
    }
}

/// A lab's pass; see `exclusive`.
pub(crate) struct Shared {
    counted: Option<ThreadId>,
}

pub(crate) fn shared() -> Shared {
    if HOLDS_EXCLUSIVE.with(Cell::get) {
        return Shared { counted: None };
    }
    let mut g = gate();
    if HELD_SHARED.with(Cell::get) == 0 {
        while g.exclusive || g.waiting > 0 {
            g = GATE_CHANGED.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
    g.labs += 1;
    HELD_SHARED.with(|h| h.set(h.get() + 1));
    Shared {
        counted: Some(std::thread::current().id()),
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(thread) = self.counted else { return };
        gate().labs -= 1;
        if thread == std::thread::current().id() {
            HELD_SHARED.with(|h| h.set(h.get() - 1));
        }
        GATE_CHANGED.notify_all();
    }
}

/// Short per-lab prefix, unique across processes (pid) and threads (counter): `np<pid36>x<n36>`.
pub(crate) fn unique_prefix() -> String {
    let n = LAB_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("np{}x{}", base36(std::process::id()), base36(n))
}

fn base36(mut v: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii")
}

/// Panics (never skips) when kernel tests cannot run here: CI must fail loudly.
pub(crate) fn require_environment() {
    // /proc/self is owned by the effective uid (nix's geteuid needs a feature we lack).
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid());
    if euid.ok() != Some(0) {
        panic!(
            "netns lab: kernel tests need root (network namespaces, nftables); \
             run them as root (scripts/test.sh) or as root of a user namespace \
             (scripts/test-unprivileged.sh)"
        );
    }
    if let Err(e) = run_host(&["ip", "netns", "list"]) {
        panic!("netns lab: `ip netns` is unusable (install iproute2?): {e}");
    }
}

/// A failed command, with everything needed to understand why.
pub struct CmdError {
    pub cmd: String,
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self
            .status
            .map_or("not started / killed".into(), |c| c.to_string());
        write!(f, "`{}` failed (exit {status})", self.cmd)?;
        write!(f, "\n--- stderr ---\n{}", self.stderr.trim_end())?;
        write!(f, "\n--- stdout ---\n{}", self.stdout.trim_end())
    }
}

// Debug = Display so that `.unwrap()` in tests prints a readable report.
impl fmt::Debug for CmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for CmdError {}

/// Runs `argv` with optional stdin; Ok(stdout) on exit 0.
pub fn run_cmd(argv: &[&str], stdin: Option<&str>) -> Result<String, CmdError> {
    let cmd_text = argv.join(" ");
    let fail = |status, stdout: &[u8], stderr: String| CmdError {
        cmd: cmd_text.clone(),
        status,
        stdout: String::from_utf8_lossy(stdout).into_owned(),
        stderr,
    };
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(None, b"", format!("cannot spawn {}: {e}", argv[0])))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error (EPIPE) shows up as the command's own failure below.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out: Output = child
        .wait_with_output()
        .map_err(|e| fail(None, b"", format!("wait failed: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        Err(fail(out.status.code(), &out.stdout, stderr))
    }
}

pub(crate) fn run_host(argv: &[&str]) -> Result<String, CmdError> {
    run_cmd(argv, None)
}

/// Creates a named netns (`ip netns add`, loopback up), serialised with every other lab's.
/// A stale one with the same name can only come from a killed
/// earlier process with our pid (names embed the pid), so it is replaced.
pub fn create(name: &str) -> Result<(), CmdError> {
    let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if exists(name) {
        run_host(&["ip", "netns", "delete", name])?;
    }
    run_host(&["ip", "netns", "add", name])?;
    run_host(&["ip", "-n", name, "link", "set", "lo", "up"]).map(drop)
}

/// Deletes a named netns (`ip netns delete`), serialised like `create`.
pub fn delete(name: &str) -> Result<(), CmdError> {
    let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    run_host(&["ip", "netns", "delete", name]).map(drop)
}

pub fn exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}

/// Handle to a named netns owned by a `Lab`. Cheap to clone; only a name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ns {
    name: String,
}

impl Ns {
    pub(crate) fn new(name: String) -> Self {
        Ns { name }
    }

    /// The netns name, as used by `ip netns exec NAME` and `ip -n NAME`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This netns's own agent state directory (`--state-dir`, the node's disk): agents
    /// started in it use it unless given `--state-dir`, so parallel tests never share the
    /// host's /var/lib/nodeplane. Removed with the lab.
    pub fn state_dir(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{}-state", self.name))
    }

    /// Runs `argv` inside this netns; Ok(stdout), Err carries exit status, stdout and stderr.
    pub fn exec(&self, argv: &[&str]) -> Result<String, CmdError> {
        self.exec_stdin(argv, "")
    }

    /// Like `exec`, feeding `stdin` to the command (e.g. `nft -f -`).
    pub fn exec_stdin(&self, argv: &[&str], stdin: &str) -> Result<String, CmdError> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(argv);
        run_cmd(&full, (!stdin.is_empty()).then_some(stdin))
    }

    /// `exec` that panics with the full error report: for setup steps that must work.
    #[track_caller]
    pub fn run(&self, argv: &[&str]) -> String {
        self.exec(argv)
            .unwrap_or_else(|e| panic!("in netns {}: {e}", self.name))
    }

    /// Runs `nft ARGS` in this netns.
    pub fn nft(&self, args: &[&str]) -> Result<String, CmdError> {
        let mut argv = vec!["nft"];
        argv.extend_from_slice(args);
        self.exec(&argv)
    }

    /// Writes a sysctl of this netns (`key` in dotted form, e.g. `net.ipv4.ip_forward`).
    #[track_caller]
    pub fn sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let res = self.enter(|| std::fs::write(&path, value));
        if let Err(e) = res {
            panic!("in netns {}: sysctl {key}={value}: {e}", self.name);
        }
    }

    /// Runs `f` on a fresh thread that has joined this netns (setns), so the caller's thread
    /// never changes namespace. Panics inside `f` propagate to the caller.
    pub fn enter<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        let file = self.open();
        std::thread::scope(|s| {
            let handle = s.spawn(move || {
                join_netns(&file, &self.name);
                f()
            });
            handle
                .join()
                .unwrap_or_else(|payload| std::panic::resume_unwind(payload))
        })
    }

    /// Spawns a detached thread inside this netns (for servers that outlive the call).
    pub fn spawn<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> std::thread::JoinHandle<T> {
        let file = self.open();
        let name = self.name.clone();
        std::thread::spawn(move || {
            join_netns(&file, &name);
            f()
        })
    }

    fn open(&self) -> File {
        let path = format!("/run/netns/{}", self.name);
        File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e} (netns deleted?)"))
    }
}

fn join_netns(file: &File, name: &str) {
    setns(file, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns into {name}: {e}"));
}
