//! ACL logging of NetworkPolicy verdicts for bridged pods (the node of `netpol_bridged`: pods
//! a, b, c on `br0` in namespace `x`, annotated here), with and without `br_netfilter`: the
//! bridge table logs what it judges, one line per verdict.

use super::acl_log::{acl_lines, assert_fields, settle, wait_for_reader};
use super::netpol_bridged::{Bridged, br_netfilter, bridged, only};
use nodeplane::testing::lab::AgentProcess;
use nodeplane::testing::objects;
use std::net::SocketAddr;
use std::time::Duration;

/// Connects from pod `from` (source port `sport`) to a's port 80 and returns the one new
/// ACL line that gives, after `seen` lines.
#[track_caller]
fn one_more_line(
    b: &Bridged,
    agent: &AgentProcess,
    from: usize,
    sport: u16,
    seen: usize,
) -> String {
    let (a, client) = (&b.pods[0], &b.pods[from]);
    let (src, dst) = (
        SocketAddr::new(client.addr, sport),
        SocketAddr::new(a.addr, 80),
    );
    let allowed = client.name == "b";
    // A denied connect gives up before the first retransmission (1 s): one SYN.
    let wait = Duration::from_millis(if allowed { 5000 } else { 300 });
    let outcome = client.ns.tcp_connect_from_port(src, dst, wait);
    assert_eq!(outcome.is_reply(), allowed, "{src} -> {dst}: {outcome:?}");
    let lines = settle(agent, seen + 1, &format!("{src} -> {dst}"));
    let tuple = format!(
        "proto=tcp src={src_ip} sport={sport} dst={} dport=80",
        a.addr,
        src_ip = client.addr
    );
    assert!(
        lines[seen].contains(&tuple),
        "{tuple} missing in {}",
        lines[seen]
    );
    lines[seen].clone()
}

/// Pod a isolated for ingress, only b allowed (policy `only`); c is denied. A denied
/// connection gives one `deny` line (warning) naming the rule, an allowed one one `allow`
/// line (info) naming the policy and its rule. With `br_netfilter` the inet table's forward
/// hook sees the bridged packets too, after the bridge table: it leaves the packets the
/// bridge table judged alone, so an allowed connection still logs one line, not two.
#[test]
fn bridged_policy_verdicts_log_one_line_each_with_and_without_br_netfilter() {
    let b = bridged();
    let logging = r#"{"deny": "warning", "allow": "info"}"#;
    let x = objects::namespace("x", &[]).acl_logging(Some(logging));
    b.agent.write("ns.yaml", &x.to_string());
    b.agent.write("policies.yaml", &only("b", "a"));
    let agent = b.agent.spawn(&[]);
    wait_for_reader(&b.node, &agent, "bridge");
    let deny = [
        "WARN",
        "namespace=\"x\"",
        "kind=\"NetworkPolicy\"",
        "rule=\"ingress: isolated, no rule allows\"",
        "verdict=\"deny\"",
        "severity=\"warning\"",
    ];
    let allow = [
        "INFO",
        "namespace=\"x\"",
        "kind=\"NetworkPolicy\"",
        "object=\"only\"",
        "rule=\"ingress[0]\"",
        "verdict=\"allow\"",
        "severity=\"info\"",
    ];
    br_netfilter(&b.node, false);
    assert_fields(&one_more_line(&b, &agent, 2, 41001, 0), &deny);
    // The connection's first packet is judged (and logged); the rest are replies and
    // established (the flow set).
    assert_fields(&one_more_line(&b, &agent, 1, 41001, 1), &allow);
    br_netfilter(&b.node, true);
    assert_fields(&one_more_line(&b, &agent, 2, 41002, 2), &deny);
    assert_fields(&one_more_line(&b, &agent, 1, 41002, 3), &allow);
    assert_eq!(acl_lines(&agent).len(), 4);
}
