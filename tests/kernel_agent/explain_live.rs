//! `agent explain --live` against a running agent: the admin endpoint explains a packet
//! against the table the agent applied, with the same decisions as the offline explanation
//! of the same manifests where the live state is the planned one; a bad question is
//! answered with the parameter at fault.
//!
//! Where they differ, live is right: here the example's EgressIP 192.168.50.100 fits no
//! interface of the lab node, so the running agent steers the selected pods' traffic to
//! `eip-unreachable` (dropped), which the offline plan cannot know.

use nodeplane::testing::lab::{AgentProcess, Lab, Ns, eventually};
use nodeplane::testing::listing;
use std::time::Duration;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/cluster");
/// prometheus (monitoring) to the backend API pod: NetworkPolicy isolation, no EgressIP.
const PACKET: [&str; 8] = [
    "--src",
    "10.128.0.12",
    "--dst",
    "10.128.0.11",
    "--proto",
    "tcp",
    "--dport",
    "8443",
];

const COMMON: [&str; 4] = ["--manifests", EXAMPLES, "--node-name", "worker-1"];
const ADMIN: &str = "127.0.0.1:9942";

/// The example cluster's agent on `node` (as worker-1), once it applied its table.
fn examples_agent(node: &Ns) -> AgentProcess {
    let agent = node.spawn_agent(&COMMON);
    let admin: std::net::SocketAddr = ADMIN.parse().unwrap();
    let wait = Duration::from_secs(10);
    eventually(wait, || match node.http_get(admin, "/ruleset", wait) {
        Ok((200, body)) if body.contains("table inet nodeplane") => Ok(()),
        other => Err(format!("{other:?}\n{}", agent.logs())),
    });
    agent
}

#[test]
fn live_explains_with_the_applied_table_like_offline() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    lab.add_addr(&node, "lo", "192.168.50.11/32");
    let agent = examples_agent(&node);
    let admin: std::net::SocketAddr = ADMIN.parse().unwrap();
    let wait = Duration::from_secs(10);
    let mut live_args = vec!["explain", "--live"];
    live_args.extend(PACKET);
    let live = node
        .run_agent(&live_args)
        .unwrap_or_else(|e| panic!("explain --live: {e}"));
    let mut offline_args = vec!["explain"];
    offline_args.extend(COMMON);
    offline_args.extend(PACKET);
    let offline = node.run_agent(&offline_args).expect("explain offline");
    for needle in [
        "verdict  DROPPED",
        "ingress isolated by NetworkPolicy \"backend/api-from-web\": no rule allows",
    ] {
        assert!(
            live.contains(needle),
            "no {needle:?} in the live answer:\n{live}"
        );
    }
    let decisions = |s: &str| {
        s.lines()
            .filter(|l| l.starts_with("  inet"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        decisions(&live),
        decisions(&offline),
        "live:\n{live}\noffline:\n{offline}"
    );
    let unplaced = [
        "explain",
        "--live",
        "--src",
        "10.128.0.11",
        "--dst",
        "8.8.8.8",
        "--dport",
        "443",
    ];
    let unplaced = node.run_agent(&unplaced).expect("explain --live");
    assert!(
        unplaced.contains("eip-unreachable") && unplaced.contains("verdict  DROPPED"),
        "{unplaced}"
    );
    live_args.extend(["--output", "json"]);
    let json = node
        .run_agent(&live_args)
        .expect("explain --live --output json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["verdict"], "dropped", "{json}");
    let (code, body) = node
        .http_get(admin, "/explain?src=10.0.0.1&dport=70000", wait)
        .expect("answer");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("\"dport\""), "{body}");
    agent.stop();
}

fn trace_table_exists(node: &Ns) -> bool {
    listing::has_table(node, "nodeplane-trace")
}

/// `--trace`: a real packet from the monitoring pod to the isolated API pod is refused, and
/// the kernel's trace of it names the NetworkPolicy isolation that dropped it, agrees with
/// the prediction, and leaves no trace table behind. A second trace while one runs is
/// refused; an agent killed mid-trace leaves no table either (it is owned by the agent's
/// socket).
#[test]
fn trace_names_the_policy_the_kernel_met_and_leaves_nothing_behind() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    lab.add_addr(&node, "lo", "192.168.50.11/32");
    let monitoring = lab.add_pod(&node, "mon", &["10.128.0.12"]);
    let api = lab.add_pod(&node, "api", &["10.128.0.11"]);
    let _server = api.ns.tcp_server("10.128.0.11:8443", "api");
    let agent = examples_agent(&node);
    let admin: std::net::SocketAddr = ADMIN.parse().unwrap();
    let wait = Duration::from_secs(10);
    let mut args = vec!["explain", "--live", "--trace", "20"];
    args.extend(PACKET);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let tracer = {
        let node = node.clone();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            node.run_agent(&args)
        })
    };
    eventually(wait, || {
        trace_table_exists(&node)
            .then_some(())
            .ok_or_else(|| "no trace table yet".to_string())
    });
    let busy = node
        .http_get(admin, "/explain?src=10.0.0.1&dst=10.0.0.2&trace=1", wait)
        .expect("an answer");
    assert_eq!(busy.0, 409, "a second trace while one runs: {busy:?}");
    let outcome = monitoring
        .ns
        .tcp_connect("10.128.0.11:8443", Duration::from_secs(2));
    assert!(
        !outcome.is_reply(),
        "the isolated pod was reached: {outcome:?}"
    );
    let report = tracer
        .join()
        .expect("tracer thread")
        .unwrap_or_else(|e| panic!("explain --live --trace: {e}"));
    for needle in [
        "traced   packet 1/1",
        "tcp 10.128.0.12:",
        "-> 10.128.0.11:8443",
        "kernel   DROPPED; explain predicts DROPPED: agrees",
        "ingress isolated by NetworkPolicy \"backend/api-from-web\": no rule allows",
    ] {
        assert!(report.contains(needle), "no {needle:?} in:\n{report}");
    }
    let traced = report
        .split("traced   packet")
        .nth(1)
        .expect("a traced packet");
    assert!(
        traced
            .lines()
            .any(|l| l.starts_with("  inet forward") && l.contains(" drop")),
        "no drop at the forward hook in the trace:\n{traced}"
    );
    assert!(!trace_table_exists(&node), "the trace table stayed");

    // Killed mid-trace: the kernel removes the table with the agent's socket.
    let background = {
        let node = node.clone();
        std::thread::spawn(move || {
            node.http_get(admin, "/explain?src=10.0.0.1&dst=10.0.0.2&trace=30", wait)
        })
    };
    eventually(wait, || {
        trace_table_exists(&node)
            .then_some(())
            .ok_or_else(|| "no trace table yet".to_string())
    });
    agent.kill();
    eventually(wait, || {
        (!trace_table_exists(&node))
            .then_some(())
            .ok_or_else(|| "the trace table outlived its agent".to_string())
    });
    let _ = background.join();
}
