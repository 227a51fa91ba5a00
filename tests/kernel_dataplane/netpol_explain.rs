//! `agent explain` on the upstream NetworkPolicy scenarios (`netpol_scenarios`): for every
//! step and truth table, the evaluator's verdict over the tables planned for both nodes
//! equals the table the kernel tests (`netpol`) prove with real packets. Planning and
//! evaluating need no namespaces; the test sits here to share the scenarios' rows.
//!
//! A packet between two nodes is explained on each node it crosses (the sender's, then
//! the receiver's) and is allowed when both let it through. Routed pods only: on bridged
//! nodes the same policies are planned into `table bridge`, which `explain --bridged` walks
//! for same-bridge pairs (checked on the example cluster's rows).

use super::netpol::{NODES, PODS, always, cluster_docs};
use super::netpol_scenarios::upstream;
use nodeplane::config::Config;
use nodeplane::explain::Verdict;
use nodeplane::explain::offline::{Request, explain_desired};
use nodeplane::explain::output::text;
use nodeplane::plan::{Desired, Memory, plan_with};
use nodeplane::snapshot::Snapshot;
use nodeplane::source::manifests;
use nodeplane::testing::lab::Probe;
use std::net::IpAddr;

/// Each node's address on the link between them (IPv4, IPv6), as `netpol` builds it.
const NODE_ADDRS: [(&str, &str); 2] = [("192.168.2.1", "fd00:2::1"), ("192.168.2.2", "fd00:2::2")];

struct Endpoint {
    name: String,
    node: usize,
    addr: IpAddr,
}

fn endpoints(family: u8, with_nodes: bool) -> Vec<Endpoint> {
    let pick = |v4: &str, v6: &str| if family == 4 { v4 } else { v6 }.parse().unwrap();
    let mut out: Vec<Endpoint> = PODS
        .iter()
        .map(|(ns, name, node, v4, v6, _)| Endpoint {
            name: format!("{ns}/{name}"),
            node: *node,
            addr: pick(v4, v6),
        })
        .collect();
    if with_nodes {
        for (i, (v4, v6)) in NODE_ADDRS.iter().enumerate() {
            out.push(Endpoint {
                name: NODES[i].into(),
                node: i,
                addr: pick(v4, v6),
            });
        }
    }
    out
}

struct Planned {
    snapshot: Snapshot,
    desired: Desired,
}

fn plan_nodes(policies: &[String]) -> Vec<Planned> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), cluster_docs()).unwrap();
    std::fs::write(dir.path().join("policies.yaml"), policies.join("---\n")).unwrap();
    let snapshot = manifests::load_dir(dir.path()).unwrap().snapshot;
    NODES
        .iter()
        .map(|node| Planned {
            desired: plan_with(&snapshot, &Config::for_node(node), &Memory::default()),
            snapshot: snapshot.clone(),
        })
        .collect()
}

/// Whether `from` reaches `to` through every node it crosses; the explanation that
/// blocked it otherwise.
fn explained(
    nodes: &[Planned],
    from: &Endpoint,
    to: &Endpoint,
    probe: Probe,
) -> Result<(), String> {
    let (proto, dport) = match probe {
        Probe::Tcp(p) => ("tcp", p),
        Probe::Udp(p) => ("udp", p),
    };
    let hops = if from.node == to.node {
        vec![from.node]
    } else {
        vec![from.node, to.node]
    };
    for n in hops {
        let (v4, v6) = NODE_ADDRS[n];
        let req = Request {
            src: Some(from.addr),
            dst: Some(to.addr),
            proto: proto.into(),
            dport: Some(dport),
            local_addrs: vec![v4.parse().unwrap(), v6.parse().unwrap()],
            ..Default::default()
        };
        let p = &nodes[n];
        let report = explain_desired(NODES[n], &p.snapshot, &p.desired, &req).unwrap();
        let blocked = report
            .paths
            .iter()
            .any(|p| matches!(p.path.verdict, Verdict::Dropped | Verdict::Rejected));
        if blocked {
            return Err(text(&report));
        }
    }
    Ok(())
}

#[test]
fn explain_gives_the_upstream_truth_tables() {
    let mut checked = 0;
    for step in upstream() {
        let nodes = plan_nodes(&step.policies);
        for check in &step.checks {
            let mut wrong = Vec::new();
            for from in endpoints(check.family, true) {
                for to in endpoints(check.family, false) {
                    if from.name == to.name {
                        continue;
                    }
                    let expected =
                        always(&from.name, &to.name) || (check.allowed)(&from.name, &to.name);
                    let got = explained(&nodes, &from, &to, check.probe);
                    checked += 1;
                    if got.is_ok() != expected {
                        let why = got.err().unwrap_or_else(|| "allowed".into());
                        wrong.push(format!(
                            "{} -> {}: expected {expected}\n{why}",
                            from.name, to.name
                        ));
                    }
                }
            }
            assert!(
                wrong.is_empty(),
                "{}: {} cells differ:\n{}",
                check.label,
                wrong.len(),
                wrong.join("\n")
            );
        }
    }
    assert!(checked > 500, "only {checked} cells checked");
    eprintln!("{checked} cells explained");
}
