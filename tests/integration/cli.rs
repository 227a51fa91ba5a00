//! The `agent` binary as an operator uses it: dry-run output (unprivileged, accepted by
//! `nft -c`), option sources (flags, environment, config file), exit codes and messages.

use nodeplane::testing::nft_check::nft_check;
use std::process::{Command, Output};

const AGENT: &str = env!("CARGO_BIN_EXE_agent");
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster");

fn agent(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(AGENT);
    cmd.args(args).env_remove("NODE_NAME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run agent")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn dry_run_examples(extra: &[&str]) -> String {
    let mut args = vec![
        "--dry-run",
        "--manifests",
        EXAMPLES,
        "--node-name",
        "worker-1",
        // Not the host's resolv.conf: the output must not depend on the machine.
        "--dns-resolvers",
        "172.30.0.10",
    ];
    args.extend_from_slice(extra);
    let out = agent(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn dry_run_of_the_examples_matches_golden() {
    let text = dry_run_examples(&[]);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/examples-worker-1.nft"
    );
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &text).unwrap();
    }
    let expected = std::fs::read_to_string(path).expect("golden file (UPDATE_GOLDEN=1 creates it)");
    assert_eq!(text, expected);
}

#[test]
fn dry_run_is_accepted_by_nft_check_in_a_scratch_netns() {
    nft_check(&dry_run_examples(&[]));
}

#[test]
fn dry_run_needs_no_privileges() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "dropping to nobody needs root; run the test suite as root"
    );
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .args([
            AGENT,
            "--dry-run",
            "--manifests",
            EXAMPLES,
            "--node-name",
            "worker-1",
            "--dns-resolvers",
            "172.30.0.10",
        ])
        .output()
        .expect("setpriv (util-linux)");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), dry_run_examples(&[]));
}

#[test]
fn environment_and_config_file_fill_options_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.yaml");
    std::fs::write(
        &cfg,
        format!("manifests: {EXAMPLES}\nnode-name: worker-2\ncluster-cidr: [10.200.0.0/16]\n"),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();

    let out = agent(&["--dry-run", "--config", cfg], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("for node worker-2") && text.contains("10.200.0.0/16"),
        "{text}"
    );

    let env = [("NODEPLANE_CLUSTER_CIDR", "10.0.0.0/8,fd01::/48")];
    let text = stdout(&agent(&["--dry-run", "--config", cfg], &env));
    assert!(
        text.contains("10.0.0.0/8") && text.contains("fd01::/48"),
        "{text}"
    );
    assert!(
        !text.contains("10.200.0.0/16"),
        "environment wins over the file"
    );

    let text = stdout(&agent(
        &[
            "--dry-run",
            "--config",
            cfg,
            "--cluster-cidr",
            "10.1.0.0/16",
        ],
        &env,
    ));
    assert!(
        text.contains("10.1.0.0/16") && !text.contains("10.0.0.0/8"),
        "{text}"
    );
}

#[test]
fn node_name_defaults_to_node_name_env() {
    let out = agent(
        &["--dry-run", "--manifests", EXAMPLES],
        &[("NODE_NAME", "from-downward-api")],
    );
    assert!(stdout(&out).contains("for node from-downward-api"));
}

#[test]
fn bad_input_fails_with_a_precise_message() {
    let out = agent(
        &[
            "--dry-run",
            "--manifests",
            EXAMPLES,
            "--cluster-cidr",
            "10.0.0.1/8",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--cluster-cidr") && err.contains("10.0.0.1/8"),
        "{err}"
    );

    let out = agent(
        &[
            "--once",
            "--manifests",
            "/nonexistent/dir",
            "--node-name",
            "n",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/nonexistent/dir"),
        "{}",
        stderr(&out)
    );

    let out = agent(&["--dry-run", "--once"], &[]);
    assert!(!out.status.success(), "--dry-run and --once conflict");
}

#[test]
fn help_explains_every_option() {
    let help = stdout(&agent(&["--help"], &[]));
    for flag in [
        "--config",
        "--node-name",
        "--manifests",
        "--kubeconfig",
        "--cluster-cidr",
        "--service-cidr",
        "--dry-run",
        "--once",
        "--resync-seconds",
        "--log-level",
        "--egress-ip-assigner",
        "--leader-elect-namespace",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--egress-ip-probe-interval",
        "--egress-ip-probe-misses",
        "cleanup",
        "NODEPLANE_",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
}
