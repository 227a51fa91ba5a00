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

#[path = "../tests/lab/mod.rs"]
mod lab;

use lab::{Lab, Ns, Pod};
use nodeplane::config::Config;
use nodeplane::dns::DnsAnswers;
use nodeplane::nft::Engine;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::plan::{Memory, plan_with_dns};
use nodeplane::snapshot::Snapshot;
use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const SERVER: &str = "203.0.113.10:80";

fn arg(name: &str, default: usize) -> usize {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].parse().expect("a number"))
        .unwrap_or(default)
}

/// `n` rules that do not match the server (distinct /32s in 198.18.0.0/15, a quarter with a
/// TCP port), then Allow the server's /24, then Deny all.
fn rules(n: usize) -> String {
    let mut r: Vec<String> = (0..n.saturating_sub(2) as u32)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
            let action = if i % 2 == 0 { "Allow" } else { "Deny" };
            if i % 4 == 0 {
                format!(
                    "{{type: {action}, to: {{cidrSelector: {ip}/32}}, ports: [{{protocol: TCP, port: {}}}]}}",
                    1 + i % 1000
                )
            } else {
                format!("{{type: {action}, to: {{cidrSelector: {ip}/32}}}}")
            }
        })
        .collect();
    r.push("{type: Allow, to: {cidrSelector: 203.0.113.0/24}}".into());
    r.push("{type: Deny, to: {cidrSelector: 0.0.0.0/0}}".into());
    format!("[{}]", r.join(", "))
}

fn fw_doc(ns: &str, rules: &str) -> String {
    format!(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: {ns}}}\n\
         spec:\n  egress: {rules}\n"
    )
}

fn pod_doc(ns: &str, name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec: {{nodeName: {NODE}, containers: []}}\nstatus: {{phase: Running, podIP: '{ip}', podIPs: [{{ip: '{ip}'}}]}}\n"
    )
}

/// `n` sequential TCP connections (connect, read the server's line, close) from inside `ns`.
fn connect_loop(ns: &Ns, n: usize) -> Duration {
    ns.enter(move || {
        let start = Instant::now();
        for _ in 0..n {
            let mut s =
                TcpStream::connect_timeout(&SERVER.parse().unwrap(), Duration::from_secs(1))
                    .expect("the server is allowed");
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).expect("reply");
        }
        start.elapsed()
    })
}

/// A blocking accept loop (the lab's servers poll, which would dominate the numbers): one
/// byte per connection, then close. The thread lives until the process exits.
fn fast_server(ext: &Ns) {
    use std::io::Write;
    let listener = ext.enter(|| std::net::TcpListener::bind(SERVER).expect("bind server"));
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            let _ = c.write_all(b"x");
        }
    });
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
    fast_server(&ext);
    let dir = tempfile::tempdir().unwrap();
    let mut docs = vec![fw_doc("fw10", &rules(10)), fw_doc("fw8000", &rules(8000))];
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
    let template = parse(&fw_doc("x", &rules_text));
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
    let (full, one, plan_one, ops) = node.enter(move || {
        let mut engine = Engine::new(NftnlBackend::new());
        let t = Instant::now();
        engine.sync(first.ruleset.clone()).expect("full apply");
        let full = t.elapsed();
        // One changed rule in one namespace: its port changes.
        let mut b = snap.to_builder();
        let mut fw = template.clone();
        fw.metadata.namespace = Some("ns7".into());
        let ports = fw.spec.egress[0].ports.as_mut().unwrap();
        ports[0].port = 4242;
        b.insert(fw);
        let snap2 = b.build();
        let t = Instant::now();
        let second = plan_with_dns(&snap2, &cfg, &first.memory, &dns);
        let plan_one = t.elapsed();
        let t = Instant::now();
        let stats = engine.sync(second.ruleset).expect("one-rule apply");
        (full, t.elapsed(), plan_one, stats.ops)
    });
    println!("apply, {namespaces} namespaces x {rules_per_ns} rules ({objects} rules + elements):");
    println!(
        "  plan from empty       {:8.1} ms",
        plan_full.as_secs_f64() * 1e3
    );
    println!(
        "  apply from empty      {:8.1} ms",
        full.as_secs_f64() * 1e3
    );
    println!(
        "  one changed rule: plan {:6.1} ms, diff + apply {:6.2} ms ({ops} ops)",
        plan_one.as_secs_f64() * 1e3,
        one.as_secs_f64() * 1e3
    );
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
