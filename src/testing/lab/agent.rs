//! Running the `agent` binary under test inside a netns.

use std::cell::Cell;
use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use super::netns::{CmdError, Ns};
use super::sandbox;

thread_local! {
    static OPEN_FILES: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Agents started from this thread inside `f` run under `prlimit --nofile=soft:hard`, as
/// systemd and containerd start services (a soft limit of 1,024).
pub fn with_open_files<T>(soft: u64, hard: u64, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<(u64, u64)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OPEN_FILES.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OPEN_FILES.with(|o| o.replace(Some((soft, hard)))));
    f()
}

/// The `agent` binary Cargo built next to the running test or bench: Cargo puts those in
/// `target/<profile>/deps/` and the binaries they need in `target/<profile>/`. The kit is a
/// library, so it cannot use `env!("CARGO_BIN_EXE_agent")`, which only integration tests see.
/// `NODEPLANE_AGENT_BIN` names another binary.
pub fn agent_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NODEPLANE_AGENT_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("path of the running test");
    exe.parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("agent"))
        .filter(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no agent binary next to {} (run through cargo test/bench, which builds it, \
                 or set NODEPLANE_AGENT_BIN)",
                exe.display()
            )
        })
}

/// A long-running agent (`ip netns exec` execs it, so the child pid is the agent's).
/// Output goes to a log file, not a pipe, so a chatty agent can never block on a full pipe.
/// Dropping it kills the agent.
pub struct AgentProcess {
    child: Child,
    log: PathBuf,
    ns: Ns,
    /// Started in the DaemonSet's sandbox: stopping it checks that the sandbox denied it
    /// nothing (see `sandbox::denials`).
    sandboxed: bool,
    _dir: tempfile::TempDir,
}

impl AgentProcess {
    /// Everything the agent wrote to stdout and stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's process id (for /proc readings such as its resident memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// None while running, else its exit status.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait on agent")
    }

    /// SIGTERM, then SIGKILL after 5 s; returns the exit status and the logs.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let status = self.terminate();
        (status, self.logs())
    }

    /// [`AgentProcess::stop`], asserting a clean exit; returns the logs.
    #[track_caller]
    pub fn stop_ok(self) -> String {
        let (status, logs) = self.stop();
        assert!(status.success(), "agent exit {status:?}:\n{logs}");
        logs
    }

    /// Panics if the agent ran sandboxed and its log shows the sandbox denying it something.
    fn check_sandbox(&self) {
        if !self.sandboxed {
            return;
        }
        let logs = self.logs();
        let denied = sandbox::denials(&logs);
        assert!(
            denied.is_empty(),
            "the DaemonSet's sandbox denied the agent:\n{}\n--- log ---\n{logs}",
            denied.join("\n")
        );
    }

    /// SIGKILL at once (no shutdown path runs); returns the exit status and the logs.
    pub fn kill(mut self) -> (ExitStatus, String) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
        }
        let status = self.child.wait().expect("wait on killed agent");
        (status, self.logs())
    }

    /// Polls `GET /readyz` on the admin address `admin` (see `--admin-address`) in the
    /// agent's netns every 50 ms until it answers 200 (the first sync succeeded); returns how
    /// long that took. Panics with the logs if the agent exits or `timeout` passes.
    #[track_caller]
    pub fn wait_ready(&mut self, admin: SocketAddr, timeout: Duration) -> Duration {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < timeout {
            if let Some(status) = self.try_status() {
                panic!("agent exited ({status}) before ready:\n{}", self.logs());
            }
            match self.ns.http_get(admin, "/readyz", Duration::from_secs(1)) {
                Ok((200, _)) => return started.elapsed(),
                Ok((code, body)) => last = format!("{code} {}", body.trim()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "agent not ready after {timeout:?} (last /readyz: {last}):\n{}",
            self.logs()
        );
    }

    /// The value of the Prometheus sample `name` (e.g. `nodeplane_sync_duration_seconds_count`)
    /// from `GET /metrics` on `admin`; None if the agent does not answer or has no such sample.
    pub fn metric(&self, admin: SocketAddr, name: &str) -> Option<f64> {
        let (code, body) = self
            .ns
            .http_get(admin, "/metrics", Duration::from_secs(1))
            .ok()?;
        if code != 200 {
            return None;
        }
        body.lines().find_map(|l| {
            let (key, value) = l.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok()).flatten()
        })
    }

    fn terminate(&mut self) -> ExitStatus {
        if !std::thread::panicking() {
            self.check_sandbox();
        }
        if let Some(s) = self.try_status() {
            return s;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(s) = self.try_status() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().expect("wait on killed agent")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.terminate();
    }
}

impl Ns {
    /// Runs the agent to completion in this netns (e.g. `--dry-run`, `--once`, `cleanup`);
    /// Ok(stdout), Err includes stderr. Like `spawn_agent`, with this netns's state
    /// directory (`Ns::state_dir`) unless `args` name another.
    pub fn run_agent(&self, args: &[&str]) -> Result<String, CmdError> {
        let state = format!("NODEPLANE_STATE_DIR={}", self.state_dir().display());
        let argv = self.agent_argv(args);
        let mut full: Vec<&str> = vec!["env", &state];
        full.extend(argv.iter().map(|a| a.to_str().expect("utf-8 argument")));
        self.exec(&full)
    }

    /// `agent args...`, inside the DaemonSet's sandbox when the caller runs `sandboxed`.
    fn agent_argv(&self, args: &[&str]) -> Vec<OsString> {
        let mut argv = vec![OsString::from(agent_bin())];
        argv.extend(args.iter().map(OsString::from));
        if sandbox::is_sandboxed() {
            argv = sandbox::wrap(&self.state_dir(), &argv);
        }
        if let Some((soft, hard)) = OPEN_FILES.with(Cell::get) {
            let limit = [
                "prlimit".into(),
                format!("--nofile={soft}:{hard}").into(),
                "--".into(),
            ];
            argv.splice(0..0, limit);
        }
        argv
    }

    /// Starts the agent in the background in this netns.
    pub fn spawn_agent(&self, args: &[&str]) -> AgentProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("agent.log");
        let out = File::create(&log).expect("create agent log");
        let err = out.try_clone().expect("dup agent log");
        let child = Command::new("ip")
            .args(["netns", "exec", self.name()])
            .args(self.agent_argv(args))
            .env("NODEPLANE_STATE_DIR", self.state_dir())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn agent in {}: {e}", self.name()));
        AgentProcess {
            child,
            log,
            ns: self.clone(),
            sandboxed: sandbox::is_daemonset_sandbox(),
            _dir: dir,
        }
    }
}

/// The agent of one lab node fed from a manifests directory: the directory, the command line
/// every run shares (`--manifests DIR --node-name NODE` plus the test's own flags), and the
/// ways a test runs it (`--once`, `--dry-run`, run mode). One place for what every kernel test
/// that drives the agent binary needs.
pub struct ManifestAgent {
    node: Ns,
    node_name: String,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl ManifestAgent {
    /// An empty manifests directory for the agent of `node`, which runs as `node_name` with
    /// `flags` added to every command line.
    pub fn new(node: &Ns, node_name: &str, flags: &[&str]) -> ManifestAgent {
        let dir = tempfile::tempdir().expect("manifests tempdir");
        let mut args = vec![
            "--manifests".to_string(),
            dir.path().to_str().expect("utf-8 path").to_string(),
            "--node-name".to_string(),
            node_name.to_string(),
        ];
        args.extend(flags.iter().map(|f| f.to_string()));
        ManifestAgent {
            node: node.clone(),
            node_name: node_name.to_string(),
            dir,
            args,
        }
    }

    /// The manifests directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Writes (or replaces) the manifest `name` atomically.
    pub fn write(&self, name: &str, text: &str) {
        super::write_manifest(self.dir.path(), name, text);
    }

    /// The agent reads its resolvers from `text` (a resolv.conf in the manifests directory,
    /// `--resolv-conf` on every command line from now on), not from the host's.
    pub fn set_resolv_conf(&mut self, text: &str) {
        let path = self.dir.path().join("resolv.conf.txt");
        std::fs::write(&path, text).expect("write resolv.conf");
        self.args.push("--resolv-conf".to_string());
        self.args
            .push(path.to_str().expect("utf-8 path").to_string());
    }

    /// Writes the agent's own Node object (`nodes.yaml`) with `ips` (its InternalIPs, e.g.
    /// the uplink address of [`Lab::add_uplink_host`](super::Lab::add_uplink_host)).
    pub fn write_own_node(&self, ips: &[&str]) {
        let node = crate::testing::objects::node(&self.node_name, ips);
        self.write("nodes.yaml", &node.to_string());
    }

    /// The shared command line plus `extra`.
    pub fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v: Vec<&str> = self.args.iter().map(String::as_str).collect();
        v.extend_from_slice(extra);
        v
    }

    /// `agent --once ...extra` in the node's namespace; panics with the agent's output on
    /// failure.
    pub fn once(&self, extra: &[&str]) -> String {
        let mut args = self.args(&["--once"]);
        args.extend_from_slice(extra);
        self.node
            .run_agent(&args)
            .unwrap_or_else(|e| panic!("agent --once: {e}"))
    }

    /// `agent --once` in the node's namespace, returning its log (stderr) too: e.g. to see
    /// `nft_ops=0` when the kernel already holds what it plans.
    pub fn once_logs(&self) -> String {
        let bin = agent_bin();
        let command = format!(
            "NODEPLANE_STATE_DIR={} {} {} 2>&1",
            self.node.state_dir().display(),
            bin.display(),
            self.args(&["--once"]).join(" ")
        );
        self.node.run(&["sh", "-c", &command])
    }

    /// `agent --dry-run ...extra` in the node's namespace.
    pub fn dry_run(&self, extra: &[&str]) -> Result<String, CmdError> {
        let mut args = self.args(&["--dry-run"]);
        args.extend_from_slice(extra);
        self.node.run_agent(&args)
    }

    /// The agent in run mode with `extra` flags.
    pub fn spawn(&self, extra: &[&str]) -> AgentProcess {
        self.node.spawn_agent(&self.args(extra))
    }
}

/// The task runtime's last words in `logs` ("stopped 12 of 12 tasks in 31 ms"): panics unless
/// every task stopped by itself within the deadline and there were at least `at_least`.
pub fn assert_every_task_stopped(logs: &str, at_least: usize) {
    let line = logs
        .lines()
        .rfind(|l| l.contains(" tasks in ") && l.contains("stopped "))
        .unwrap_or_else(|| panic!("no task runtime shutdown line:\n{logs}"));
    let counts: Vec<usize> = line
        .split_whitespace()
        .skip_while(|w| *w != "stopped")
        .filter_map(|w| w.parse().ok())
        .take(2)
        .collect();
    let [stopped, total] = counts[..] else {
        panic!("unreadable shutdown line: {line}");
    };
    assert_eq!(stopped, total, "tasks dropped at the deadline: {line}");
    assert!(
        total >= at_least,
        "only {total} tasks, expected {at_least}+: {line}"
    );
    assert!(!line.contains("dropped"), "{line}");
}
