//! `agent explain --live --bridged` and `--trace` on bridged pods (the node of
//! `netpol_bridged`: pods a, b, c on `br0`; a isolated for ingress, only b allowed): the live
//! answer walks the bridge table the agent applied, and the kernel's trace of a real refused
//! connection, with and without br_netfilter, names the policy that dropped it and agrees
//! with the prediction.

use super::netpol_bridged::{br_netfilter, bridged, only};
use nodeplane::testing::lab::{Endpoint, Ns, eventually};
use std::net::SocketAddr;
use std::time::Duration;

const ADMIN: &str = "127.0.0.1:9942";
/// Generous: a debug build on a busy 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(60);
const ISOLATED: &str = "ingress isolated by NetworkPolicy \"x/only\": no rule allows";

/// The question for a first packet from `from` to `to`'s port 80, which enters the bridge
/// on `from`'s port (the bridge table binds each pod's addresses to its port).
fn packet(node: &Ns, from: &Endpoint, to: &Endpoint) -> Vec<String> {
    let (src, dst) = (from.addr.to_string(), to.addr.to_string());
    let iif = port_of(node, from);
    let args = [
        "--src", &src, "--dst", &dst, "--proto", "tcp", "--dport", "80", "--iif", &iif,
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// The node's end of the pod's veth: the link whose index the pod's `eth0` names as its peer.
fn port_of(node: &Ns, pod: &Endpoint) -> String {
    let peer = pod
        .ns
        .exec(&["cat", "/sys/class/net/eth0/iflink"])
        .expect("iflink");
    let links = node.exec(&["ip", "-o", "link", "show"]).expect("ip link");
    let prefix = format!("{}: ", peer.trim());
    links
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(['@', ':']).next())
        .unwrap_or_else(|| panic!("no link {peer} on the node:\n{links}"))
        .to_string()
}

fn explain(node: &Ns, flags: &[&str], packet: &[String]) -> String {
    let mut args = vec!["explain", "--live", "--bridged"];
    args.extend(flags);
    args.extend(packet.iter().map(String::as_str));
    node.run_agent(&args)
        .unwrap_or_else(|e| panic!("agent {args:?}: {e}"))
}

fn trace_table_exists(node: &Ns) -> bool {
    let tables = node
        .exec(&["nft", "list", "tables"])
        .expect("nft list tables");
    tables.contains("nodeplane-trace")
}

#[test]
fn live_and_traced_bridged_verdicts_name_the_policy_with_and_without_br_netfilter() {
    let b = bridged();
    b.agent.write("policies.yaml", &only("b", "a"));
    let mut agent = b.agent.spawn(&["--admin-address", ADMIN]);
    let admin: SocketAddr = ADMIN.parse().unwrap();
    agent.wait_ready(admin, TIMEOUT);
    let pod = |name: &str| b.pods.iter().find(|p| p.name == name).expect("pod");
    let (a, allowed, denied) = (pod("a"), pod("b"), pod("c"));
    let refused = explain(&b.node, &[], &packet(&b.node, denied, a));
    for needle in ["verdict  DROPPED", "  bridge forward", ISOLATED] {
        assert!(refused.contains(needle), "no {needle:?} in:\n{refused}");
    }
    let admitted = explain(&b.node, &[], &packet(&b.node, allowed, a));
    assert!(
        admitted.contains("verdict  ALLOWED (bridged)"),
        "{admitted}"
    );

    for on in [false, true] {
        br_netfilter(&b.node, on);
        let mut flags = vec!["--trace".to_string(), "20".to_string()];
        if on {
            flags.push("--br-netfilter".into());
        }
        let tracer = {
            let (node, packet) = (b.node.clone(), packet(&b.node, denied, a));
            std::thread::spawn(move || {
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                explain(&node, &flags, &packet)
            })
        };
        eventually(TIMEOUT, || {
            trace_table_exists(&b.node)
                .then_some(())
                .ok_or_else(|| "no trace table yet".to_string())
        });
        let dst = SocketAddr::new(a.addr, 80);
        let outcome = denied.ns.tcp_connect(dst, Duration::from_secs(2));
        assert!(
            !outcome.is_reply(),
            "br_netfilter {on}: c reached a: {outcome:?}"
        );
        let report = tracer.join().expect("tracer thread");
        let traced = report
            .split("traced   packet 1/1")
            .nth(1)
            .unwrap_or_else(|| panic!("br_netfilter {on}: nothing traced:\n{report}"));
        assert!(
            traced.contains("kernel   DROPPED; explain predicts DROPPED: agrees"),
            "br_netfilter {on}:\n{report}"
        );
        let drop = traced
            .lines()
            .find(|l| l.contains(ISOLATED))
            .unwrap_or_else(|| panic!("br_netfilter {on}: no isolation in:\n{traced}"));
        // br_netfilter runs the inet forward hook inside the bridge's at priority -1, after
        // the bridge table's chains (-190..-188): the bridge table decides either way.
        assert!(
            drop.starts_with("  bridge forward") && drop.contains(" drop "),
            "br_netfilter {on}: {drop}\n{traced}"
        );
        assert!(!trace_table_exists(&b.node), "the trace table stayed");
    }
    agent.stop();
}
