//! The agent binary against the real kernel, in network namespaces: what `--once` applies is
//! what `--dry-run` printed, run mode follows the manifests directory, SIGTERM leaves the
//! rules in place, `cleanup` removes only what the agent owns.

use nodeplane::config::DEFAULT_ADMIN_ADDRESS;
use nodeplane::testing::bombs::{alias_bomb, depth_bomb};
use nodeplane::testing::lab::{self, Lab, Ns, eventually, write_manifest};
use nodeplane::testing::listing;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster");

fn args<'a>(dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--manifests", dir, "--node-name", "worker-1"];
    v.extend_from_slice(extra);
    v
}

/// Someone else's tables, as a CNI or firewalld would have them.
const FOREIGN: &str = "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority 0; policy accept;\n\t\tip saddr 10.0.0.0/8 counter accept\n\t}\n}\ntable inet other {\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 1.2.3.4 }\n\t}\n\tchain c {\n\t\tip daddr @s drop\n\t}\n}\n";

fn foreign_listing(ns: &Ns) -> String {
    let a = ns
        .nft(&["list", "table", "ip", "filter"])
        .expect("ip filter");
    let b = ns
        .nft(&["list", "table", "inet", "other"])
        .expect("inet other");
    a + &b
}

#[test]
fn once_applies_exactly_what_dry_run_printed_and_cleanup_keeps_foreign_tables() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    // worker-1's node subnet, so that the example's egress IP has an interface to go on.
    lab.add_addr(&node, "lo", "192.168.50.11/24");
    node.exec_stdin(&["nft", "-f", "-"], FOREIGN)
        .expect("foreign tables");
    let foreign_before = foreign_listing(&node);

    let printed = node
        .run_agent(&[
            "--dry-run",
            "--manifests",
            EXAMPLES,
            "--node-name",
            "worker-1",
        ])
        .expect("dry-run");
    node.run_agent(&args(EXAMPLES, &["--once"]))
        .expect("--once");
    let reference = lab.add_reference(&printed);
    assert_eq!(
        listing::json(&node, "nodeplane"),
        listing::json(&reference, "nodeplane"),
        "kernel state after --once differs from the dry-run text"
    );
    assert_eq!(foreign_listing(&node), foreign_before);

    // A restart reads the table back and, with nothing changed, writes nothing.
    let bin = lab::agent_bin().to_str().unwrap().to_string();
    let mut argv = vec![bin.as_str()];
    argv.extend(args(EXAMPLES, &["--once"]));
    // The same state directory as run_agent gives it (never the host's /var/lib/nodeplane).
    let state = node.state_dir();
    let cmd = format!(
        "RUST_LOG=info NODEPLANE_STATE_DIR={} {} 2>&1",
        state.display(),
        argv.join(" ")
    );
    let second = node.exec(&["sh", "-c", &cmd]).expect("second --once");
    assert!(
        second.contains("nft_ops=0 "),
        "a restart with nothing changed wrote to the table:\n{second}"
    );
    assert_eq!(
        listing::json(&node, "nodeplane"),
        listing::json(&reference, "nodeplane")
    );
    assert_eq!(foreign_listing(&node), foreign_before);

    assert!(
        node.run(&["ip", "addr", "show", "dev", "lo"])
            .contains("192.168.50.100/32")
    );
    // A bridge table of ours (NetworkPolicy for bridged pods) goes with cleanup too; a
    // foreign one stays.
    node.nft(&["add", "table", "bridge", "nodeplane"]).unwrap();
    node.nft(&["add", "table", "bridge", "other"]).unwrap();
    node.run_agent(&["cleanup"]).expect("cleanup");
    assert!(
        !node
            .run(&["ip", "addr", "show", "dev", "lo"])
            .contains("192.168.50.100")
    );
    let all = node.nft(&["list", "tables"]).unwrap();
    assert!(
        !all.contains("nodeplane"),
        "table left after cleanup: {all}"
    );
    assert_eq!(foreign_listing(&node), foreign_before);
    assert!(node.nft(&["list", "table", "bridge", "other"]).is_ok());
    // Cleanup of nothing is fine too.
    node.run_agent(&["cleanup"]).expect("second cleanup");
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dst = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_dir(&entry.path(), &dst);
        } else {
            std::fs::copy(entry.path(), dst).unwrap();
        }
    }
}

/// A copy of the example cluster's manifests, for a test that edits them.
fn examples_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(Path::new(EXAMPLES), dir.path());
    dir
}

fn admin() -> SocketAddr {
    DEFAULT_ADMIN_ADDRESS.parse().unwrap()
}

/// The node's `node-ips-v4` set as nft lists it.
fn node_ips(node: &Ns) -> Result<String, String> {
    node.nft(&["list", "set", "inet", "nodeplane", "node-ips-v4"])
        .map_err(|e| e.to_string())
}

/// For `eventually`: whether the node's `node-ips-v4` set holds `ip` is `want` (else the set).
fn node_ips_hold(node: &Ns, ip: &'static str, want: bool) -> impl Fn() -> Result<(), String> {
    move || {
        node_ips(node).and_then(|s| {
            if s.contains(ip) == want {
                Ok(())
            } else {
                Err(s)
            }
        })
    }
}

const EXTRA_NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: worker-3
status:
  addresses:
  - type: InternalIP
    address: 192.168.50.13
"#;

#[test]
fn run_mode_follows_the_directory_and_leaves_rules_on_sigterm() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let dir = examples_copy();
    let dir_str = dir.path().to_str().unwrap();

    let agent = node.spawn_agent(&args(dir_str, &["--log-level", "debug"]));
    eventually(
        Duration::from_secs(10),
        node_ips_hold(&node, "192.168.50.11", true),
    );

    // A new Node object: its address joins the set within a second or two.
    std::fs::write(dir.path().join("worker-3.yaml"), EXTRA_NODE).unwrap();
    eventually(
        Duration::from_secs(3),
        node_ips_hold(&node, "192.168.50.13", true),
    );
    // And leaves it when the object is deleted.
    std::fs::remove_file(dir.path().join("worker-3.yaml")).unwrap();
    eventually(
        Duration::from_secs(3),
        node_ips_hold(&node, "192.168.50.13", false),
    );

    // A malformed file is reported and skipped; the rest stays applied.
    std::fs::write(
        dir.path().join("broken.yaml"),
        "kind: Node\nmetadata: [not a map\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(node_ips(&node).unwrap().contains("192.168.50.11"));

    let before = listing::json(&node, "nodeplane");
    let logs = agent.stop_ok();
    assert!(
        logs.contains("broken.yaml"),
        "problem not reported:\n{logs}"
    );
    // The admin and metrics servers, proxy health, manifest watch, snapshot forwarder, DNS
    // resolver, nftables monitor and DNS proxy listeners.
    lab::assert_every_task_stopped(&logs, 8);
    assert_eq!(
        listing::json(&node, "nodeplane"),
        before,
        "SIGTERM must leave the rules in place"
    );
}

/// The agent's resident memory in kB.
/// A pod reads the node's metrics on kube-proxy's port and nothing else: the rules, learned
/// addresses and pod IPs of `/ruleset` and the state in `/readyz` stay on the loopback admin
/// server.
#[test]
fn metrics_face_the_network_and_the_ruleset_stays_on_loopback() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pod = lab.add_pod(&node, "pod", &["10.128.0.5"]);
    lab.add_addr(&node, "lo", "192.168.50.11/32");
    let agent = node.spawn_agent(&args(EXAMPLES, &[]));
    let admin = admin();
    let metrics: std::net::SocketAddr = "192.168.50.11:10249".parse().unwrap();
    let wait = Duration::from_secs(10);
    let ruleset = eventually(wait, || match node.http_get(admin, "/ruleset", wait) {
        Ok((200, body)) if body.contains("table inet nodeplane") => Ok(body),
        other => Err(format!("{other:?}\n{}", agent.logs())),
    });
    assert!(ruleset.contains("10.128.0.11"), "pod IPs in /ruleset");
    let (code, body) = pod.ns.http_get(metrics, "/metrics", wait).expect("metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("nodeplane_sync_duration_seconds"), "{body}");
    for path in ["/ruleset", "/readyz", "/"] {
        let (code, body) = pod.ns.http_get(metrics, path, wait).expect("answer");
        assert_eq!(code, 404, "{path} served to a pod: {body}");
        assert!(!body.contains("10.128.0.11"), "{path}: {body}");
    }
    let refused = pod
        .ns
        .http_get("192.168.50.11:9942".parse().unwrap(), "/ruleset", wait);
    assert!(
        refused.is_err(),
        "the admin server is reachable from a pod: {refused:?}"
    );
    agent.stop();
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn run_mode_rejects_bombs_and_keeps_following_the_other_files() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let dir = examples_copy();
    let dir_str = dir.path().to_str().unwrap();
    let admin = admin();
    let mut agent = node.spawn_agent(&args(dir_str, &[]));
    agent.wait_ready(admin, Duration::from_secs(20));
    let readyz = || node.http_get(admin, "/readyz", Duration::from_secs(1));

    // A 5 MB nesting bomb (unchecked: every sync blocked for minutes) and a 340 KB alias
    // bomb (unchecked: gigabytes); a change in another file still reaches the kernel promptly.
    write_manifest(dir.path(), "depth-bomb.yaml", &depth_bomb(5 << 20));
    write_manifest(dir.path(), "alias-bomb.yaml", &alias_bomb(57_000));
    write_manifest(dir.path(), "worker-3.yaml", EXTRA_NODE);
    eventually(
        Duration::from_secs(5),
        node_ips_hold(&node, "192.168.50.13", true),
    );
    eventually(Duration::from_secs(5), || match readyz() {
        Ok((503, body)) if body.contains("depth-bomb.yaml") && body.contains("alias-bomb.yaml") => {
            Ok(())
        }
        other => Err(format!("{other:?}")),
    });

    // A file that was valid and becomes a bomb keeps its objects in force.
    write_manifest(dir.path(), "worker-3.yaml", &alias_bomb(57_000));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        node_ips(&node).unwrap().contains("192.168.50.13"),
        "worker-3 vanished"
    );
    let rss = rss_kb(agent.pid());
    assert!(rss < 300_000, "agent resident memory {rss} kB");

    // Bombs removed and the file deleted: ready again, and the node's address goes.
    for f in ["depth-bomb.yaml", "alias-bomb.yaml", "worker-3.yaml"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    eventually(
        Duration::from_secs(5),
        node_ips_hold(&node, "192.168.50.13", false),
    );
    eventually(Duration::from_secs(5), || match readyz() {
        Ok((200, _)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let logs = agent.stop_ok();
    assert!(
        logs.contains("depth-bomb.yaml:1: document 0: nested deeper than 100 levels"),
        "{logs}"
    );
}

/// Pods whose traffic never crosses the node's forward hook (the CNI keeps it elsewhere, as
/// OVN-Kubernetes keeps it in OVS) leave every feature without effect: once the node runs a
/// pod, no packet counted within `--pod-traffic-check-seconds` is a `/readyz` warning and a
/// log line; the first pod packet routed through the node clears it.
#[test]
fn pod_traffic_that_never_crosses_the_forward_hook_is_a_readyz_warning() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pod = lab.add_pod(&node, "pod", &["10.128.0.5"]);
    lab.add_uplink_host(&node, "ext");
    let mut agent = node.spawn_agent(&args(EXAMPLES, &["--pod-traffic-check-seconds", "2"]));
    let admin = admin();
    let wait = Duration::from_secs(20);
    agent.wait_ready(admin, wait);
    // The examples run pods on worker-1; none of their packets reached this node.
    let warned = eventually(wait, || match node.http_get(admin, "/readyz", wait) {
        Ok((200, body)) if body.contains("warning: pod traffic: no packet") => Ok(body),
        other => Err(format!("{other:?}\n{}", agent.logs())),
    });
    assert!(
        warned.starts_with("ready"),
        "a warning, not unready: {warned}"
    );
    assert!(
        agent
            .logs()
            .contains("pod traffic: no packet from the cluster CIDRs"),
        "{}",
        agent.logs()
    );
    // One echo from the pod, routed through the node (no EgressFirewall selects it).
    assert!(pod.ns.ping("192.168.1.100"), "{}", agent.logs());
    eventually(wait, || match node.http_get(admin, "/readyz", wait) {
        Ok((200, body)) if !body.contains("pod traffic") => Ok(()),
        other => Err(format!("{other:?}\n{}", agent.logs())),
    });
    let (_, logs) = agent.stop();
    assert!(
        logs.contains("pod traffic crosses this node's netfilter forward hook"),
        "{logs}"
    );
}
