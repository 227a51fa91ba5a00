//! What the per-rule counters in `/metrics` cost, printed (no timing assertions).
//!
//! `cargo bench --bench rule_counters` (root: applies in a network namespace); under
//! `cargo test` a smoke-sized run. Options after `--`: `--namespaces N` (default 1000) each
//! with an EgressFirewall of `--rules N` rules (default 100), one pod and one
//! NetworkPolicy; `--reads N` reads (default 50).
//!
//! The planner's table is applied through the netlink backend in a fresh netns; then:
//! 1. the index (which object and rule each counter belongs to), built once per applied
//!    table;
//! 2. one read as the periodic reader does it (`rule_counters::read`): the rule dumps of the
//!    inet and bridge tables and one element dump per EgressFirewall map, then the sums per
//!    series, timed apart;
//! 3. one scrape: `/metrics` encoded with the published sums; and the exposition's size,
//!    with and without the per-rule series.

use nodeplane::admin::Metrics;
use nodeplane::admin::rule_counters::Index;
use nodeplane::config::Config;
use nodeplane::nft::Engine;
use nodeplane::nft::nftnl::{NftnlBackend, read_counters};
use nodeplane::nft::{Family, TABLE_NAME};
use nodeplane::plan::plan;
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::args::arg;
use nodeplane::testing::lab::Lab;
use nodeplane::testing::large::firewall_rules;
use nodeplane::testing::objects;
use nodeplane::testing::stats::{ms, percentile};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const POLICY: &str = "  podSelector: {}\n  ingress:\n  - from: [{podSelector: {}}]\n";

fn snapshot(namespaces: usize, rules: usize) -> Snapshot {
    let parse =
        |yaml: String| -> nodeplane::api::EgressFirewall { serde_norway::from_str(&yaml).unwrap() };
    let template = parse(objects::egress_firewall("x", &firewall_rules(rules)).to_string());
    let mut b = Snapshot::builder();
    for i in 0..namespaces {
        let ns = format!("ns{i}");
        let mut fw = template.clone();
        fw.metadata.namespace = Some(ns.clone());
        b.insert(fw);
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 10 + i as u32);
        b.insert(objects::pod(&ns, "p").on(NODE).ips(&[ip]).object());
        b.insert(objects::network_policy(&ns, "np", POLICY).object());
    }
    b.build()
}

/// p50 / p99 / max of `samples` in ms.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let v: Vec<f64> = samples.into_iter().map(ms).collect();
    format!(
        "p50 {:8.2} ms, p99 {:8.2} ms, max {:8.2} ms",
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v[v.len() - 1]
    )
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs a smoke-sized run.
    let full = std::env::args().any(|a| a == "--bench");
    let size = |full_size, smoke| if full { full_size } else { smoke };
    let namespaces = arg("--namespaces", size(1000, 20));
    let rules = arg("--rules", size(100, 10));
    let reads = arg("--reads", size(50, 3));
    let table = plan(&snapshot(namespaces, rules), &Config::for_node(NODE)).ruleset;
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let applied = table.clone();
    let (index_took, index, dump_times, sum_times, tally) = node.enter(move || {
        Engine::new(NftnlBackend::new())
            .sync(applied.clone())
            .expect("apply");
        let t = Instant::now();
        let index = Index::of(&applied);
        let index_took = t.elapsed();
        let (mut dumps, mut sums, mut tally) = (Vec::new(), Vec::new(), None);
        for _ in 0..reads {
            // What `rule_counters::read` does, in its two halves.
            let t = Instant::now();
            let sets = index.counting_sets();
            let inet = read_counters(Family::Inet, TABLE_NAME, &sets).expect("inet counters");
            let bridge = read_counters(Family::Bridge, TABLE_NAME, &[]).expect("bridge counters");
            let tables: Vec<_> = inet.into_iter().chain(bridge).collect();
            dumps.push(t.elapsed());
            let t = Instant::now();
            tally = Some(index.tally(&tables));
            sums.push(t.elapsed());
        }
        (index_took, index, dumps, sums, tally.expect("read"))
    });
    let series = tally.len();
    let metrics = Metrics::new();
    let bare = metrics.encode().len();
    metrics.rule_counters.publish(tally);
    let mut encode_times = Vec::new();
    let mut bytes = 0;
    for _ in 0..reads {
        let t = Instant::now();
        bytes = metrics.encode().len();
        encode_times.push(t.elapsed());
    }
    println!(
        "per-rule counters, {namespaces} namespaces x {rules} EgressFirewall rules + 1 NetworkPolicy each \
         ({series} series, {} counting maps):",
        index.counting_sets().len()
    );
    println!("  index of the applied table  {:8.2} ms", ms(index_took));
    println!("  read: kernel dumps, {reads}x    {}", summary(dump_times));
    println!("  read: sums per series, {reads}x {}", summary(sum_times));
    println!(
        "  scrape (encode), {reads}x       {}",
        summary(encode_times)
    );
    println!(
        "  exposition {:.2} MB ({:.2} MB without the per-rule series, {} bytes per series pair)",
        bytes as f64 / 1e6,
        bare as f64 / 1e6,
        (bytes - bare) / series.max(1)
    );
}
