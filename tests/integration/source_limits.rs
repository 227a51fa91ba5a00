//! Resource limits on manifests (`--manifest-max-*`): nesting and alias bombs and oversize
//! files are rejected quickly, within a memory budget, naming file, document and limit, while
//! the rest of the directory loads; a rejected file keeps its previous version in force.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nodeplane::snapshot::Kind;
use nodeplane::source::limits::Limits;
use nodeplane::source::loader::ManifestLoader;
use nodeplane::testing::bombs::{alias_bomb, depth_bomb, run_budgeted};
use nodeplane::testing::lab::write_manifest;

const AGENT: &str = env!("CARGO_BIN_EXE_agent");

/// A bomb must be rejected in seconds, by an agent that never needs more than this address
/// space (the debug agent maps ~100 MB of binary; parsing the bombs unchecked took minutes to
/// hours, or gigabytes).
const TIME: Duration = Duration::from_secs(30);
const MEMORY: u64 = 1 << 30;

fn node(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {ip}\n"
    )
}

/// `agent --dry-run` on `dir` within the budget: (stdout, stderr).
fn dry_run(dir: &Path, envs: &[(&str, &str)]) -> (String, String) {
    let state = tempfile::tempdir().unwrap();
    let state = state.path().to_str().unwrap();
    let mut all = vec![("NODEPLANE_STATE_DIR", state)];
    all.extend_from_slice(envs);
    let dir = dir.to_str().unwrap();
    let args = ["--dry-run", "--manifests", dir, "--node-name", "worker-1"];
    let run = run_budgeted(Path::new(AGENT), &args, &all, TIME, MEMORY);
    let status = run.status.unwrap_or_else(|| {
        panic!(
            "agent --dry-run still running after {TIME:?}:\n{}",
            run.stderr
        )
    });
    assert!(status.success(), "agent {status}:\n{}", run.stderr);
    (run.stdout, run.stderr)
}

/// A directory with a good file and `bomb.yaml` = a valid Node document, then `bomb`.
fn dir_with_bomb(bomb: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_manifest(dir.path(), "good.yaml", &node("worker-2", "192.168.50.12"));
    let text = format!("{}---\n{bomb}", node("worker-3", "192.168.50.13"));
    write_manifest(dir.path(), "bomb.yaml", &text);
    dir
}

fn assert_rejected(stderr: &str, what: &str) {
    let line = stderr
        .lines()
        .find(|l| l.contains("bomb.yaml:9: document 1: ") && l.contains(what))
        .unwrap_or_else(|| panic!("no rejection of bomb.yaml document 1 by {what}:\n{stderr}"));
    assert!(line.contains("WARN"), "{line}");
}

#[test]
fn a_depth_bomb_is_rejected_in_time_and_the_rest_loads() {
    // 1 MB of `{a: {a: ...`: unchecked, libyaml needed 11 s for 100 KB of it (debug build),
    // hours for this.
    let dir = dir_with_bomb(&depth_bomb(1 << 20));
    let (stdout, stderr) = dry_run(dir.path(), &[]);
    assert_rejected(
        &stderr,
        "nested deeper than 100 levels at line 10 (--manifest-max-depth)",
    );
    assert!(
        stdout.contains("192.168.50.12"),
        "good.yaml lost:\n{stdout}"
    );
    assert!(
        stdout.contains("192.168.50.13"),
        "bomb.yaml document 0 lost:\n{stdout}"
    );

    // Block nesting and the limit as an option.
    let block = "a:\n".to_string() + &"- ".repeat(30) + "x\n";
    let dir = dir_with_bomb(&block);
    let (_, stderr) = dry_run(dir.path(), &[("NODEPLANE_MANIFEST_MAX_DEPTH", "20")]);
    assert_rejected(&stderr, "nested deeper than 20 levels");
}

#[test]
fn an_alias_bomb_is_rejected_in_time_and_memory() {
    // ~340 KB that stands for 3.2 billion scalars: unchecked, the agent aborted out of memory.
    let dir = dir_with_bomb(&alias_bomb(57_000));
    let (stdout, stderr) = dry_run(dir.path(), &[]);
    assert_rejected(
        &stderr,
        "aliases expand to more than 1048576 bytes at line 14 (--manifest-max-alias-expansion)",
    );
    assert!(stdout.contains("192.168.50.12") && stdout.contains("192.168.50.13"));

    // A few aliases are fine.
    let dir = dir_with_bomb(&alias_bomb(10));
    let (_, stderr) = dry_run(dir.path(), &[]);
    assert!(!stderr.contains("bomb.yaml"), "{stderr}");
}

#[test]
fn an_oversize_file_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    write_manifest(dir.path(), "good.yaml", &node("worker-2", "192.168.50.12"));
    let big = (0..2000)
        .map(|i| format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: ns-{i}}}\n"))
        .collect::<Vec<_>>()
        .join("---\n");
    assert!(big.len() > 100_000);
    write_manifest(dir.path(), "big.yaml", &big);
    let (stdout, stderr) = dry_run(dir.path(), &[("NODEPLANE_MANIFEST_MAX_BYTES", "100000")]);
    let expected = format!(
        "big.yaml: file of {} bytes is larger than 100000 bytes (--manifest-max-bytes)",
        big.len()
    );
    assert!(stderr.contains(&expected), "{expected} not in:\n{stderr}");
    assert!(stdout.contains("192.168.50.12"), "{stdout}");
    // Within the default limit it loads.
    let (stdout, stderr) = dry_run(dir.path(), &[]);
    assert!(!stderr.contains("big.yaml"), "{stderr}");
    assert!(stdout.contains("(2001 objects read)"), "{stdout}");
}

#[test]
fn a_rejected_file_keeps_its_previous_version_and_only_changed_files_are_parsed() {
    let dir = tempfile::tempdir().unwrap();
    write_manifest(dir.path(), "a.yaml", &node("worker-2", "192.168.50.12"));
    write_manifest(dir.path(), "b.yaml", &node("worker-3", "192.168.50.13"));
    let mut loader = ManifestLoader::new(Limits::default());
    let first = loader.load(dir.path()).unwrap();
    assert_eq!(first.snapshot.count(Kind::Node), 2);
    assert!(first.rejected.is_empty());

    // Unchanged files are not parsed again: the same objects come back.
    write_manifest(dir.path(), "a.yaml", &node("worker-2", "192.168.50.22"));
    let second = loader.load(dir.path()).unwrap();
    let (n2, n3) = (&second.snapshot, &first.snapshot);
    assert!(Arc::ptr_eq(
        n2.node("worker-3").unwrap(),
        n3.node("worker-3").unwrap()
    ));
    assert!(!Arc::ptr_eq(
        n2.node("worker-2").unwrap(),
        n3.node("worker-2").unwrap()
    ));

    // b.yaml replaced by a bomb: its last accepted version stays in force, reported.
    write_manifest(dir.path(), "b.yaml", &depth_bomb(10_000));
    let third = loader.load(dir.path()).unwrap();
    assert!(
        third.snapshot.node("worker-3").is_some(),
        "worker-3 vanished"
    );
    assert_eq!(third.rejected.len(), 1);
    let reason = third.rejected[0].to_string();
    assert!(
        reason.contains("b.yaml:1: document 0: nested deeper than 100 levels")
            && reason.ends_with("its previous version stays in force"),
        "{reason}"
    );
    // A fresh loader (a restart, --once) has no previous version.
    let fresh = ManifestLoader::new(Limits::default())
        .load(dir.path())
        .unwrap();
    assert!(fresh.snapshot.node("worker-3").is_none());
    assert!(
        fresh.rejected[0]
            .to_string()
            .ends_with("its documents within the limits are loaded")
    );

    // Fixed: the new version is in force and nothing is rejected; deleted: its objects go.
    write_manifest(dir.path(), "b.yaml", &node("worker-4", "192.168.50.14"));
    let fixed = loader.load(dir.path()).unwrap();
    assert!(fixed.rejected.is_empty());
    assert!(fixed.snapshot.node("worker-3").is_none() && fixed.snapshot.node("worker-4").is_some());
    write_manifest(dir.path(), "b.yaml", &depth_bomb(10_000));
    loader.load(dir.path()).unwrap();
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    let gone = loader.load(dir.path()).unwrap();
    assert!(gone.rejected.is_empty());
    assert_eq!(gone.snapshot.count(Kind::Node), 1);
}
