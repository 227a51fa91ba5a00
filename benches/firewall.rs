//! EgressFirewall costs, printed (no timing assertions).
//!
//! `cargo bench --bench firewall` (root: builds network namespaces). Options after `--`:
//! `--conns N` connections per round (default 2000), `--rounds N` (default 5),
//! `--namespaces N` and `--rules N` for the apply part (default 1000 x 100).
//!
//! 1. Packet cost: three pods behind one node connect to the same allowed external TCP
//!    server, N connections each, round after round (order rotated so drift hits all alike):
//!    `none` (namespace without a firewall), `10` (10 rules) and `8000` (8000 rules). Each
//!    connection's SYN goes through the dispatch and the namespace's interval maps.
//! 2. Apply cost: the planner's table for `--namespaces` namespaces x `--rules` rules applied
//!    from empty through the netlink backend, then one changed rule (plan + diff + apply).

use nodeplane::config::Config;
use nodeplane::nft::Engine;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::plan::DnsAnswers;
use nodeplane::plan::{Memory, plan_with_dns};
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::args::arg;
use nodeplane::testing::lab::{self, Lab, Ns, Pod};
use nodeplane::testing::objects;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const SERVER: &str = "203.0.113.10:80";

/// `n` rules that do not match the server, then Allow its /24, then Deny all.
fn rules(n: usize) -> String {
    nodeplane::testing::large::firewall_rules(n)
}

fn pod_doc(ns: &str, name: &str, ip: &str) -> String {
    objects::pod(ns, name).on(NODE).ips(&[ip]).to_string()
}

/// `n` sequential connections from `ns` to the server (connect, read its byte, close).
fn connect_loop(ns: &Ns, n: usize) -> Duration {
    lab::connect_times(ns, SERVER, n).into_iter().sum()
}

fn packet_cost(conns: usize, rounds: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pods: Vec<(&str, Pod)> = [
        ("none", "10.128.0.4"),
        ("10", "10.128.0.5"),
        ("8000", "10.128.0.6"),
    ]
    .into_iter()
    .map(|(label, ip)| (label, lab.add_pod(&node, &format!("p{label}"), &[ip])))
    .collect();
    let ext = lab.add_host("ext");
    lab.link(&node, &["192.168.1.1/24"], &ext, &["192.168.1.100/24"]);
    lab.add_addr(&ext, "lo", "203.0.113.10/32");
    lab.add_route(&node, "203.0.113.0/24", "192.168.1.100");
    lab.add_route(&ext, "10.128.0.0/14", "192.168.1.1");
    lab::byte_server(&ext, SERVER);
    let dir = tempfile::tempdir().unwrap();
    let mut docs = vec![
        objects::egress_firewall("fw10", &rules(10)).to_string(),
        objects::egress_firewall("fw8000", &rules(8000)).to_string(),
    ];
    for (label, ns) in [("none", "plain"), ("10", "fw10"), ("8000", "fw8000")] {
        let pod = &pods.iter().find(|(l, _)| *l == label).unwrap().1;
        docs.push(pod_doc(ns, label, &pod.addrs[0].to_string()));
    }
    std::fs::write(dir.path().join("all.yaml"), docs.join("---\n")).unwrap();
    let d = dir.path().to_str().unwrap();
    node.run_agent(&["--once", "--manifests", d, "--node-name", NODE])
        .expect("agent --once");
    // Time-wait sockets pile up on the pods; let them be reused.
    for (_, p) in &pods {
        p.ns.sysctl("net.ipv4.tcp_tw_reuse", "1");
        connect_loop(&p.ns, 200); // warm-up
    }
    let mut totals = vec![Duration::ZERO; pods.len()];
    for round in 0..rounds {
        // Rotate who goes first, so that drift (conntrack growth, ...) hits all alike.
        for k in 0..pods.len() {
            let i = (round + k) % pods.len();
            totals[i] += connect_loop(&pods[i].1.ns, conns);
        }
    }
    println!("connection setup, {rounds} rounds x {conns} connections per pod:");
    let base = totals[0].as_secs_f64();
    for ((label, _), t) in pods.iter().zip(&totals) {
        let n = (conns * rounds) as f64;
        println!(
            "  rules {label:>5}: {:8.0} conn/s, {:6.1} us/conn ({:+.1}% vs no firewall)",
            n / t.as_secs_f64(),
            t.as_secs_f64() * 1e6 / n,
            (t.as_secs_f64() / base - 1.0) * 100.0
        );
    }
}

fn apply_cost(namespaces: usize, rules_per_ns: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let mut b = Snapshot::builder();
    let rules_text = rules(rules_per_ns);
    let parse =
        |yaml: &str| -> nodeplane::api::EgressFirewall { serde_norway::from_str(yaml).unwrap() };
    let template = parse(&objects::egress_firewall("x", &rules_text).to_string());
    for i in 0..namespaces {
        let ns = format!("ns{i}");
        let mut fw = template.clone();
        fw.metadata.namespace = Some(ns.clone());
        b.insert(fw);
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + 10 + i as u32);
        let pod: nodeplane::api::Pod =
            serde_norway::from_str(&pod_doc(&ns, "p", &ip.to_string())).unwrap();
        b.insert(pod);
    }
    let snap = b.build();
    let cfg = Config::for_node(NODE);
    let dns = DnsAnswers::default();
    let t = Instant::now();
    let first = plan_with_dns(&snap, &cfg, &Memory::default(), &dns);
    let plan_full = t.elapsed();
    let objects = first.ruleset.object_count();
    let steps = node.enter(move || {
        let mut engine = Engine::new(NftnlBackend::new());
        let t = Instant::now();
        engine.sync(first.ruleset.clone()).expect("full apply");
        let full = t.elapsed();
        // Alternately: one changed rule in one namespace (its port), one new pod in
        // another; then both back. The minimum over the rounds is the cost on a quiet
        // machine (other load only ever adds time).
        let base = snap.to_builder();
        let mut changed = base.clone();
        let mut fw = template.clone();
        fw.metadata.namespace = Some("ns7".into());
        fw.spec.egress[0].ports.as_mut().unwrap()[0].port = 4242;
        changed.insert(fw);
        let mut with_pod = base.clone();
        let pod: nodeplane::api::Pod =
            serde_norway::from_str(&pod_doc("ns9", "q", "10.129.0.9")).unwrap();
        with_pod.insert(pod);
        let (base, changed, with_pod) = (base.build(), changed.build(), with_pod.build());
        let mut memory = first.memory;
        let (mut rule, mut pod): (Option<Step>, Option<Step>) = (None, None);
        for _ in 0..UPDATE_ROUNDS {
            for (snap, best) in [
                (&changed, &mut rule),
                (&base, &mut None),
                (&with_pod, &mut pod),
                (&base, &mut None),
            ] {
                let s = step(&mut engine, snap, &cfg, &memory, &dns);
                memory = s.memory.clone();
                *best = Some(match best.take() {
                    Some(b) => b.min(s),
                    None => s,
                });
            }
        }
        (full, rule.expect("measured"), pod.expect("measured"))
    });
    let (full, rule, pod) = steps;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("apply, {namespaces} namespaces x {rules_per_ns} rules ({objects} rules + elements):");
    println!("  plan from empty          {:8.1} ms", ms(plan_full));
    println!("  apply from empty         {:8.1} ms", ms(full));
    for (what, s) in [("one changed rule", rule), ("one new pod     ", pod)] {
        println!(
            "  {what}: plan {:6.2} ms, diff {:6.3} ms, apply {:7.2} ms ({} ops)",
            ms(s.plan),
            ms(s.diff),
            ms(s.apply),
            s.ops
        );
    }
}

/// Each update is measured this many times; the minimum is reported.
const UPDATE_ROUNDS: usize = 5;

/// The three costs of one update: plan, diff against the kernel's known state, apply.
#[derive(Clone)]
struct Step {
    plan: Duration,
    diff: Duration,
    apply: Duration,
    ops: usize,
    memory: Memory,
}

impl Step {
    /// The per-phase minimum of two measurements of the same update.
    fn min(self, other: Step) -> Step {
        Step {
            plan: self.plan.min(other.plan),
            diff: self.diff.min(other.diff),
            apply: self.apply.min(other.apply),
            ..other
        }
    }
}

fn step(
    engine: &mut Engine<NftnlBackend>,
    snap: &Snapshot,
    cfg: &Config,
    memory: &Memory,
    dns: &DnsAnswers,
) -> Step {
    let t = Instant::now();
    let desired = plan_with_dns(snap, cfg, memory, dns);
    let plan = t.elapsed();
    let t = Instant::now();
    drop(engine.plan(&desired.ruleset));
    let diff = t.elapsed();
    // `sync` diffs again and applies: the apply is the rest.
    let t = Instant::now();
    let stats = engine.sync(desired.ruleset).expect("apply");
    let apply = t.elapsed().saturating_sub(diff);
    Step {
        plan,
        diff,
        apply,
        ops: stats.ops,
        memory: desired.memory,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then a small smoke run proves the bench still works without costing CI minutes.
    let full = std::env::args().any(|a| a == "--bench");
    let size = |full_size, smoke| if full { full_size } else { smoke };
    let conns = arg("--conns", size(2000, 50));
    let rounds = arg("--rounds", size(5, 1));
    packet_cost(conns, rounds);
    apply_cost(
        arg("--namespaces", size(1000, 20)),
        arg("--rules", size(100, 10)),
    );
}
