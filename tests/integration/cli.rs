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

/// The dry run of the examples for `worker-1`.
const DRY_RUN_EXAMPLES: [&str; 7] = [
    "--dry-run",
    "--manifests",
    EXAMPLES,
    "--node-name",
    "worker-1",
    // Not the host's resolv.conf: the output must not depend on the machine.
    "--dns-resolvers",
    "172.30.0.10",
];

fn dry_run_examples(extra: &[&str]) -> String {
    let mut args = DRY_RUN_EXAMPLES.to_vec();
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

/// Each feature switched off leaves nothing of its own in the ruleset (chains, sets, maps) or
/// in the network changes (`#` lines), and the others stay exactly as with every feature on.
#[test]
fn a_feature_switched_off_leaves_nothing_of_its_own_and_the_rest_unchanged() {
    // Feature name -> the prefix of its table objects, and a word only its `#` lines use.
    let features = [
        ("egress-firewall", "fw-", None),
        ("egress-qos", "qos-", None),
        ("egress-ip", "eip-", Some("192.168.50.100")),
        ("services", "svc-", None),
        ("network-policy", "np-", None),
    ];
    let all = dry_run_examples(&[]);
    let names = |text: &str, prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = ["chain ", "set ", "map "]
                    .iter()
                    .find_map(|k| l.strip_prefix(k))?;
                let name = rest.split_whitespace().next()?;
                name.starts_with(prefix).then(|| name.to_string())
            })
            .collect()
    };
    for (name, prefix, word) in features {
        assert!(
            !names(&all, prefix).is_empty(),
            "{name}: none in the examples"
        );
        let off = dry_run_examples(&["--disable-features", name]);
        assert_eq!(
            names(&off, prefix),
            Vec::<String>::new(),
            "{name} off:\n{off}"
        );
        if let Some(w) = word {
            assert!(all.contains(w) && !off.contains(w), "{name} off:\n{off}");
        }
        for (other, other_prefix, _) in features.iter().filter(|f| f.0 != name) {
            assert_eq!(
                names(&off, other_prefix),
                names(&all, other_prefix),
                "{other} changed when {name} is off"
            );
        }
        nft_check(&off);
        // --features lists what runs: the same as disabling the rest.
        let rest: Vec<&str> = features
            .iter()
            .map(|f| f.0)
            .filter(|f| *f != name)
            .collect();
        assert_eq!(dry_run_examples(&["--features", &rest.join(",")]), off);
    }
    let bad = agent(
        &[
            "--dry-run",
            "--manifests",
            EXAMPLES,
            "--node-name",
            "w",
            "--features",
            "dns",
        ],
        &[],
    );
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("--features") && stderr(&bad).contains("\"dns\""),
        "{}",
        stderr(&bad)
    );
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
        .arg(AGENT)
        .args(DRY_RUN_EXAMPLES)
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
        "--api-server",
        "--features",
        "--disable-features",
        "--load-balancer-ip-allowed-cidrs",
        "--load-balancer-ip-rejected-cidrs",
        "cleanup",
        "NODEPLANE_",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
    // The first line names every feature's objects, as the README's feature table does.
    let summary = help.lines().next().unwrap_or_default();
    for kind in nodeplane::snapshot::Kind::ALL {
        let always = ["Namespace", "Pod", "Node"];
        if !always.contains(&kind.as_str()) {
            assert!(summary.contains(kind.as_str()), "{kind} not in {summary:?}");
        }
    }
    for feature in nodeplane::features::Switch::ALL {
        assert!(help.contains(feature.as_str()), "--help lacks {feature}");
    }
}

/// `service.kubernetes.io/service-proxy-name` marks a Service (and its EndpointSlices) as
/// another proxy's: kube-proxy does not program it, and neither does the agent, in manifests
/// mode as in Kubernetes mode.
#[test]
fn dry_run_skips_services_labelled_for_another_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let svc = |name: &str, ip: &str, labels: &str| {
        format!(
            "apiVersion: v1\nkind: Service\n\
             metadata: {{name: {name}, namespace: default, labels: {{{labels}}}}}\n\
             spec: {{clusterIP: {ip}, ports: [{{name: http, port: 80, protocol: TCP}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}-1, namespace: default, \
             labels: {{kubernetes.io/service-name: {name}, {labels}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints: [{{addresses: ['10.128.0.9'], nodeName: worker-1}}]\n"
        )
    };
    let docs = [
        svc("ours", "172.30.0.10", "app: web"),
        svc(
            "theirs",
            "172.30.0.20",
            "'service.kubernetes.io/service-proxy-name': other-proxy",
        ),
    ];
    std::fs::write(dir.path().join("services.yaml"), docs.join("---\n")).unwrap();
    let out = agent(
        &[
            "--dry-run",
            "--manifests",
            dir.path().to_str().unwrap(),
            "--node-name",
            "worker-1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("172.30.0.10"), "{text}");
    assert!(
        !text.contains("172.30.0.20"),
        "a Service labelled for another proxy is programmed:\n{text}"
    );
}
