//! EgressIP update costs, printed (no timing assertions).
//!
//! `cargo bench --bench egress_ip` (root: applies in a network namespace). Options after `--`:
//! `--pods N` selected pods (default 20000) spread over `--nodes N` nodes (default 100) and
//! `--eips N` EgressIPs (default 100, one namespace each, all hosted by node-1).
//!
//! For the hosting node (node-1) and a steering node (node-2): plan time and table size from
//! empty, then the cost of one pod added (plan, diff + apply, nft operations): pod churn must
//! be element updates, independent of the number of pods and EgressIPs. The per-packet path
//! is one `saddr` map lookup (`eip-steer` vmap in prerouting, `eip-snat` map on the first
//! packet of a connection) whatever the sizes.

use nodeplane::api::Pod;
use nodeplane::config::Config;
use nodeplane::nft::Engine;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::plan::plan;
use nodeplane::snapshot::{Snapshot, SnapshotBuilder};
use nodeplane::testing::args::arg;
use nodeplane::testing::lab::Lab;
use nodeplane::testing::objects;
use std::net::Ipv4Addr;
use std::time::Instant;

fn pod(i: usize, nodes: usize, eips: usize) -> Pod {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 10 + i as u32);
    let pod = objects::pod(&format!("ns{}", i % eips), &format!("p{i}"));
    let pod = pod
        .on(&format!("node-{}", 1 + i % nodes))
        .labels(&[("app", "api")]);
    pod.ips(&[ip]).object()
}

fn cluster(pods: usize, nodes: usize, eips: usize) -> SnapshotBuilder {
    let mut b = Snapshot::builder();
    for n in 1..=nodes {
        let ip = format!("192.168.{}.{}", n / 250, 1 + n % 250);
        b.insert(objects::node(&format!("node-{n}"), &[ip]).object());
    }
    for e in 0..eips {
        let label = format!("e{e}");
        b.insert(objects::namespace(&format!("ns{e}"), &[("eip", &label)]).object());
        let ip = format!("172.20.{}.{}", e / 250, 1 + e % 250);
        let eip = objects::egress_ip(&format!("e{e}"), &[&ip], &[("eip", &label)]);
        b.insert(eip.hosted(&[(&ip, "node-1")]).object());
    }
    for i in 0..pods {
        b.insert(pod(i, nodes, eips));
    }
    b
}

fn measure(node_name: &str, pods: usize, nodes: usize, eips: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let cfg = Config::for_node(node_name);
    let snap = cluster(pods, nodes, eips).build();
    let t = Instant::now();
    let first = plan(&snap, &cfg);
    let plan_full = t.elapsed();
    let objects = first.ruleset.object_count();
    let (full, plan_one, one, ops) = node.enter(move || {
        let mut engine = Engine::new(NftnlBackend::new());
        let t = Instant::now();
        engine.sync(first.ruleset).expect("full apply");
        let full = t.elapsed();
        // One more selected pod, on node-2 (remote for node-1, local for node-2).
        let mut b = snap.to_builder();
        b.insert(pod((pods / nodes + 1) * nodes + 1, nodes, eips));
        let snap2 = b.build();
        let t = Instant::now();
        let second = plan(&snap2, &cfg);
        let plan_one = t.elapsed();
        let t = Instant::now();
        let stats = engine.sync(second.ruleset).expect("one-pod apply");
        (full, plan_one, t.elapsed(), stats.ops)
    });
    println!(
        "{node_name}: {pods} selected pods on {nodes} nodes, {eips} EgressIPs ({objects} rules + elements)"
    );
    println!(
        "  plan from empty        {:8.1} ms",
        plan_full.as_secs_f64() * 1e3
    );
    println!(
        "  apply from empty       {:8.1} ms",
        full.as_secs_f64() * 1e3
    );
    println!(
        "  one pod added: plan {:6.1} ms, diff + apply {:6.2} ms ({ops} nft ops)",
        plan_one.as_secs_f64() * 1e3,
        one.as_secs_f64() * 1e3
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then a small smoke run proves the bench still works without costing CI minutes.
    let full = std::env::args().any(|a| a == "--bench");
    let size = |full_size, smoke| if full { full_size } else { smoke };
    let pods = arg("--pods", size(20_000, 200));
    let nodes = arg("--nodes", size(100, 5));
    let eips = arg("--eips", size(100, 5));
    measure("node-1", pods, nodes, eips);
    measure("node-2", pods, nodes, eips);
}
