//! NetworkPolicy costs, printed (no timing assertions).
//!
//! `cargo bench --bench netpol` (root: builds network namespaces); under `cargo test` a
//! smoke-sized run. Options after `--`: `--policies N` (default 1000), `--pods N` (default
//! 100), `--conns N` connections per latency round (default 2000; 0 skips part 1),
//! `--changes N` (default 20; 0 skips part 2), `--scale-pods N` (default 1000; 0 skips part 3),
//! `--scale-namespaces N` (default 50), `--edits N` (default 20), `--hogs N` busy-loop
//! processes running during the whole bench (default 0: measure on a busy machine).
//!
//! The cluster: `pods` local pods, one per namespace `ns-<i>` (10.128.0.1 ..), each labelled
//! app=web; `policies` policies `p-<j>` in namespace `ns-<j mod pods>`, each selecting app=web
//! and allowing TCP `8080 + j / pods` from role=client pods of every namespace. So every pod
//! is selected by policies / pods policies (10 at the defaults), and the server pod's
//! connections on 8080 are allowed by one of them. A client pod (role=client) connects to
//! the server pod (ns-0, 10.128.0.1).
//!
//! 1. Connection setup latency through the table: no policy, 1 policy (p-0), all policies.
//! 2. One pod label change (app=web -> app=idle and back) and one policy edit (a port):
//!    snapshot delta, plan, diff and apply: the time until the kernel has it, p50 and p99.
//! 3. `scale`: the cold apply of 10 policies per namespace over `--scale-pods` pods (both
//!    tables, nft operations counted) and the edit of one policy in it.

use nodeplane::api::NetworkPolicy;
use nodeplane::config::Config;
use nodeplane::nft::Engine;
use nodeplane::nft::ir::Table;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::plan::{Memory, plan_with};
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::args::arg;
use nodeplane::testing::lab::{self, Lab, Ns};
use nodeplane::testing::objects;
use nodeplane::testing::stats::{self, ms};
use std::net::Ipv4Addr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

#[path = "netpol/scale.rs"]
mod scale;

const NODE: &str = "node-1";
const SERVER: &str = "10.128.0.1:8080";

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 1)) + i as u32)
}

fn pod(i: usize, app: &str) -> nodeplane::api::Pod {
    objects::pod(&format!("ns-{i}"), "web")
        .on(NODE)
        .labels(&[("app", app)])
        .ips(&[pod_ip(i)])
        .object()
}

fn policy(j: usize, pods: usize, port: usize) -> NetworkPolicy {
    let spec = format!(
        "  podSelector: {{matchLabels: {{app: web}}}}\n  ingress:\n  - from: [{{namespaceSelector: {{}}, podSelector: {{matchLabels: {{role: client}}}}}}]\n    ports: [{{port: {port}}}]\n"
    );
    objects::network_policy(&format!("ns-{}", j % pods), &format!("p-{j}"), &spec).object()
}

fn cluster(policies: usize, pods: usize) -> Snapshot {
    let mut b = Snapshot::builder();
    b.insert(
        objects::pod("clients", "client")
            .on(NODE)
            .labels(&[("role", "client")])
            .ips(&["10.128.1.1"])
            .object(),
    );
    for i in 0..pods {
        b.insert(objects::namespace(&format!("ns-{i}"), &[]).object());
        b.insert(pod(i, "web"));
    }
    for j in 0..policies {
        b.insert(policy(j, pods, 8080 + j / pods));
    }
    b.build()
}

/// CPU time of this thread: planning is single-threaded and pure, so this is its cost
/// without the waiting a loaded machine adds to wall time.
/// (`/proc/thread-self/schedstat`: nanoseconds on a CPU first.)
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns = stat.split_whitespace().next().and_then(|n| n.parse().ok());
    Duration::from_nanos(ns.expect("schedstat: CPU time"))
}

/// Sorts `v` and takes its `p` quantile.
fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    stats::percentile(v, p)
}

/// `n` sequential connections from `ns` to the server, each timed.
fn connect_times(ns: &Ns, n: usize) -> Vec<Duration> {
    lab::connect_times(ns, SERVER, n)
}

/// Connection setup with no policy, one policy and all of them, in alternating rounds
/// (re-installing the table each time) so drift on a shared machine hits all alike.
fn latency(policies: usize, pods: usize, conns: usize) {
    const ROUNDS: usize = 5;
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let client = lab.add_pod(&node, "client", &["10.128.1.1"]);
    let server = lab.add_pod(&node, "server", &["10.128.0.1"]);
    lab::byte_server(&server.ns, "0.0.0.0:8080");
    client.ns.sysctl("net.ipv4.tcp_tw_reuse", "1");
    let cfg = Config::for_node(NODE);
    let tables: Vec<(String, Table)> = [
        (0, "no policy"),
        (1, "1 policy"),
        (policies, "all policies"),
    ]
    .into_iter()
    .map(|(n, label)| {
        let table = plan_with(&cluster(n, pods), &cfg, &Memory::default()).ruleset;
        (format!("{label} ({n})"), table)
    })
    .collect();
    let mut engine = node.enter(|| Engine::new(NftnlBackend::new()));
    let per_round = conns / ROUNDS + 1;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); tables.len()];
    for _ in 0..ROUNDS {
        for (i, (_, table)) in tables.iter().enumerate() {
            node.enter(|| {
                engine.invalidate();
                engine.sync(table.clone()).expect("apply")
            });
            std::thread::sleep(Duration::from_millis(300));
            connect_times(&client.ns, per_round / 10 + 1); // warm-up
            samples[i].extend(connect_times(&client.ns, per_round));
        }
    }
    println!(
        "connection setup to a selected pod, {} connections per table ({pods} pods):",
        per_round * ROUNDS
    );
    for ((label, _), mut s) in tables.iter().zip(samples) {
        println!(
            "  {label:>20}: p50 {:6.1} us, p99 {:6.1} us",
            percentile(&mut s, 0.5).as_secs_f64() * 1e6,
            percentile(&mut s, 0.99).as_secs_f64() * 1e6
        );
    }
}

/// One pod label change and one policy edit: snapshot delta, plan, diff + apply.
fn change_costs(policies: usize, pods: usize, changes: usize) {
    let mut lab = Lab::new();
    let host = lab.add_host("bench");
    let cfg = Config::for_node(NODE);
    host.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let mut snap = cluster(policies, pods);
        let t = Instant::now();
        let d = plan_with(&snap, &cfg, &Memory::default());
        let cold_plan = t.elapsed();
        let objects = d.ruleset.object_count();
        let t = Instant::now();
        engine.sync(d.ruleset).expect("cold apply");
        println!(
            "{policies} policies x {pods} pods: cold plan {:.1} ms, apply {:.1} ms, {objects} rules + elements",
            ms(cold_plan),
            ms(t.elapsed())
        );
        let mut memory = d.memory;
        let mut costs: [Vec<(Duration, Duration, usize, Duration)>; 2] = [Vec::new(), Vec::new()];
        for k in 0..changes * 2 {
            let kind = k % 2;
            let mut b = snap.to_builder();
            let i = 1 + (k / 2) % (pods - 1);
            if kind == 0 {
                let app = if (k / 2) % 2 == 0 { "idle" } else { "web" };
                b.insert(pod(i, app));
            } else {
                let j = (k * 7919) % policies;
                b.insert(policy(j, pods, 9000 + k));
            }
            snap = b.build();
            let (t, cpu) = (Instant::now(), thread_cpu());
            let d = plan_with(&snap, &cfg, &memory);
            let (planned, plan_cpu) = (t.elapsed(), thread_cpu() - cpu);
            let ops = engine.plan(&d.ruleset).op_count();
            let t = Instant::now();
            engine.sync(d.ruleset).expect("apply a change");
            costs[kind].push((planned, t.elapsed(), ops, plan_cpu));
            memory = d.memory;
        }
        for (label, mut c) in ["one pod label change", "one policy edit"].into_iter().zip(costs) {
            let mut plan: Vec<Duration> = c.iter().map(|x| x.0).collect();
            let mut apply: Vec<Duration> = c.iter().map(|x| x.1).collect();
            let mut total: Vec<Duration> = c.iter().map(|x| x.0 + x.1).collect();
            let mut plan_cpu: Vec<Duration> = c.iter().map(|x| x.3).collect();
            c.sort_by_key(|x| x.2);
            println!(
                "  {label} (median of {}): {:.2} ms = plan {:.2} ms (CPU {:.2} ms) + diff and apply {:.2} ms, p99 total {:.2} ms, <= {} kernel ops",
                c.len(),
                ms(percentile(&mut total, 0.5)),
                ms(percentile(&mut plan, 0.5)),
                ms(percentile(&mut plan_cpu, 0.5)),
                ms(percentile(&mut apply, 0.5)),
                ms(percentile(&mut total, 0.99)),
                c.last().map_or(0, |x| x.2)
            );
        }
    });
}

/// Busy-loop processes (`sh -c 'while :; do :; done'`), killed when dropped: the bench's
/// own load, so "measured on a busy machine" is part of the command.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(n: usize) -> Hogs {
        let spawn = |_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("start a busy loop")
        };
        Hogs((0..n).map(spawn).collect())
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (policies, pods, conns, changes, scale_pods, namespaces, edits) = if full {
        (1000, 100, 2000, 20, 1000, 50, 20)
    } else {
        (50, 10, 50, 3, 40, 4, 2)
    };
    let policies = arg("--policies", policies);
    let pods = arg("--pods", pods);
    let hogs = Hogs::start(arg("--hogs", 0));
    println!("{} busy-loop processes running", hogs.0.len());
    let conns = arg("--conns", conns);
    if conns > 0 {
        latency(policies, pods, conns);
    }
    let changes = arg("--changes", changes);
    if changes > 0 {
        change_costs(policies, pods, changes);
    }
    let scale_pods = arg("--scale-pods", scale_pods);
    if scale_pods > 0 {
        scale::run(
            arg("--scale-namespaces", namespaces),
            scale_pods,
            arg("--edits", edits),
        );
    }
}
