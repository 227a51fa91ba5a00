//! Hostile manifests (nesting and alias bombs) and a way to run a command within a time and
//! memory budget, for the tests of the manifest resource limits (`source::limits`).

use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// One YAML document of about `bytes` bytes: flow mappings nested `{a: {a: ...}}`, the shape
/// libyaml parses in time quadratic in the depth.
pub fn depth_bomb(bytes: usize) -> String {
    let n = bytes / 5;
    format!("{}{}\n", "{a: ".repeat(n), "}".repeat(n))
}

/// One YAML document of about `6 * n` bytes: an anchored sequence of `n` scalars and a
/// sequence of `n` aliases of it, which stands for `n * n` scalars once expanded.
pub fn alias_bomb(n: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: bomb}}\na: &a [{}]\nb: [{}]\n",
        vec!["x"; n].join(","),
        vec!["*a"; n].join(",")
    )
}

/// What [`run_budgeted`] saw.
#[derive(Debug)]
pub struct Budgeted {
    /// None if the command was killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `program args` with its address space limited to `max_memory` bytes (`prlimit --as`:
/// an allocation beyond it fails and the process aborts) and kills it after `deadline`.
/// Output goes to files, so a chatty command never blocks on a pipe.
pub fn run_budgeted(
    program: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    deadline: Duration,
    max_memory: u64,
) -> Budgeted {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let started = Instant::now();
    let mut child = Command::new("prlimit")
        .arg(format!("--as={max_memory}"))
        .arg("--")
        .arg(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("stdout file"))
        .stderr(File::create(&err).expect("stderr file"))
        .spawn()
        .expect("spawn prlimit (util-linux)");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into();
    Budgeted {
        status,
        stdout: read(&out),
        stderr: read(&err),
        elapsed: started.elapsed(),
    }
}
