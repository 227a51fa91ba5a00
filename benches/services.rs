//! Services costs, printed (no timing assertions).
//!
//! `cargo bench --bench services` (root: builds network namespaces); under `cargo test` a
//! smoke-sized run. Options after `--`: `--services N` (default 10000), `--endpoints N`
//! (default 10), `--changes N` one-endpoint changes timed (default 50), `--conns N`
//! connections per latency round (default 2000).
//!
//! 1. Cold apply of N services x E endpoints from empty (plan + netlink apply), and the same
//!    services in kube-proxy's nftables layout through `nft -f` (the ratio is printed).
//! 2. One endpoint change (snapshot delta, plan, diff, apply), at N and at N/10 services.
//! 3. Connection latency from a pod to a ClusterIP with 10 and with N services installed,
//!    and to the backend directly.
//! 4. Resident memory of the agent (`agent` in run mode) holding N x E.
//! 5. `--kube-cold-start N1xE1,N2xE2 --runs R`: instead of 1-4, the real agent in
//!    Kubernetes mode against the test kit's fake API server holding N services x E
//!    endpoints, started R times into an empty table: time from spawn to its first
//!    `sync done` log line (written after the transaction committed), p50/p99, and RSS then
//!    and its peak (VmHWM).
//!    `BENCH_SHOW_LOG=1` prints each run's agent log (`NODEPLANE_LOG_LEVEL` is passed on).
//!
//! `--change-scales N1,N2,...` runs only 1 (without kube-proxy's layout) and 2 at each N, with
//! the p99 of a change and the kernel read-backs counted during the changes (expected: 0).

use nodeplane::api::{EndpointSlice, Service};
use nodeplane::config::Config;
use nodeplane::nft::Engine;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::plan::{Desired, plan};
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::fakeapi::FakeApi;
use nodeplane::testing::lab::{self, Lab, Ns};
use nodeplane::testing::objects;
use nodeplane::testing::stats::{median, ms, percentile};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const NODE: &str = "node-1";

struct Args {
    services: usize,
    endpoints: usize,
    changes: usize,
    conns: usize,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let full = argv.iter().any(|a| a == "--bench");
    let mut a = if full {
        Args {
            services: 10_000,
            endpoints: 10,
            changes: 50,
            conns: 2000,
        }
    } else {
        Args {
            services: 200,
            endpoints: 3,
            changes: 5,
            conns: 50,
        }
    };
    for w in argv.windows(2) {
        let n = || {
            w[1].parse()
                .unwrap_or_else(|_| panic!("{} needs a number", w[0]))
        };
        match w[0].as_str() {
            "--services" => a.services = n(),
            "--endpoints" => a.endpoints = n(),
            "--changes" => a.changes = n(),
            "--conns" => a.conns = n(),
            _ => {}
        }
    }
    a
}

const HTTP_80: &str = "{name: http, port: 80, protocol: TCP}";
const HTTP_8080: &str = "{name: http, port: 8080, protocol: TCP}";

fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 30, 0, 10)) + i as u32)
}

/// Endpoint `j` of service `i` (distinct addresses in 10.128.0.0/14); `gen` shifts them.
fn endpoint_ip(i: usize, j: usize, generation: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 129, 0, 0)) + (i * 16 + j + generation) as u32)
}

/// Service `svc<i>` in namespace `bench`, port 80 to endpoints' 8080.
fn service_doc(i: usize) -> String {
    let ip = cluster_ip(i).to_string();
    let svc = objects::service_ips(&format!("svc{i}"), &[&ip], HTTP_80);
    svc.in_namespace("bench").to_string()
}

/// The endpoints `ips` of service `i`, all on node-2.
fn slice_doc(i: usize, ips: &[Ipv4Addr]) -> String {
    let eps: Vec<_> = ips
        .iter()
        .map(|ip| objects::ep(&ip.to_string(), "node-2"))
        .collect();
    let slice = objects::endpoint_slice(
        &format!("svc{i}-abc"),
        &format!("svc{i}"),
        "IPv4",
        HTTP_8080,
        &eps,
    );
    slice.in_namespace("bench").to_string()
}

fn endpoints_of(i: usize, e: usize, generation: usize) -> Vec<Ipv4Addr> {
    (0..e).map(|j| endpoint_ip(i, j, generation)).collect()
}

/// A synthetic cluster: `n` services with `e` endpoints each (one slice per service).
/// Service 0 may be given real backend addresses (`first`).
fn cluster(n: usize, e: usize, first: Option<&[Ipv4Addr]>) -> Snapshot {
    let mut b = Snapshot::builder();
    for i in 0..n {
        let svc: Service = serde_norway::from_str(&service_doc(i)).unwrap();
        let ips = match (i, first) {
            (0, Some(f)) => f.to_vec(),
            _ => endpoints_of(i, e, 0),
        };
        let slice: EndpointSlice = serde_norway::from_str(&slice_doc(i, &ips)).unwrap();
        b.insert(svc);
        b.insert(slice);
    }
    b.build()
}

/// The same services as kube-proxy's nftables mode lays them out (its chain, map and rule
/// shapes: a service chain per port with masquerade check and numgen vmap, an endpoint
/// chain per endpoint, the service-ips verdict map), for `nft -f`.
fn kube_proxy_text(n: usize, e: usize) -> String {
    let mut t = String::from("table ip kube-proxy {\n");
    t.push_str("\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = {\n");
    for i in 0..n {
        let sep = if i + 1 == n { "" } else { "," };
        let _ = writeln!(
            t,
            "\t\t\t{} . tcp . 80 : goto service-{i}-bench/svc{i}/tcp/http{sep}",
            cluster_ip(i)
        );
    }
    t.push_str("\t\t}\n\t}\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = {\n");
    for i in 0..n {
        let sep = if i + 1 == n { "" } else { "," };
        let _ = writeln!(t, "\t\t\t{}{sep}", cluster_ip(i));
    }
    t.push_str("\t\t}\n\t}\n");
    t.push_str("\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark or 0x4000\n\t}\n");
    t.push_str(
        "\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n",
    );
    t.push_str("\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n");
    for i in 0..n {
        let ips = endpoints_of(i, e, 0);
        let arms: Vec<String> = (0..e)
            .map(|j| {
                format!(
                    "{j} : goto endpoint-{i}-{j}-bench/svc{i}/tcp/http__{}/8080",
                    ips[j]
                )
            })
            .collect();
        let _ = writeln!(
            t,
            "\tchain service-{i}-bench/svc{i}/tcp/http {{\n\t\tip daddr {} tcp dport 80 ip saddr != 10.128.0.0/14 jump mark-for-masquerade\n\t\tnumgen random mod {e} vmap {{ {} }}\n\t}}",
            cluster_ip(i),
            arms.join(", ")
        );
        for (j, ip) in ips.iter().enumerate() {
            let _ = writeln!(
                t,
                "\tchain endpoint-{i}-{j}-bench/svc{i}/tcp/http__{ip}/8080 {{\n\t\tip saddr {ip} jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat to {ip}:8080\n\t}}"
            );
        }
    }
    t.push_str("}\n");
    t
}

fn nft_stdin(text: &str) -> Duration {
    let start = Instant::now();
    lab::run_cmd(&["nft", "-f", "-"], Some(text)).unwrap_or_else(|e| panic!("{e}"));
    start.elapsed()
}

/// Cold apply, kube-proxy layout, and one-endpoint changes at `n` services.
fn apply_cost(n: usize, e: usize, changes: usize, compare_kube_proxy: bool) {
    let mut lab = Lab::new();
    let ours = lab.add_host("ours");
    let snap = cluster(n, e, None);
    let cfg = Config::for_node(NODE);
    println!("{n} services x {e} endpoints:");
    let (cold_plan, cold_apply, objects, one) = ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let t = Instant::now();
        let Desired {
            ruleset, memory, ..
        } = plan(&snap, &cfg);
        let cold_plan = t.elapsed();
        let objects = ruleset.object_count();
        let t = Instant::now();
        engine.sync(ruleset.clone()).expect("cold apply");
        let cold_apply = t.elapsed();
        // A restart with nothing changed: a new engine reads the table back, compares, and
        // must write nothing.
        let mut restarts = Vec::new();
        for _ in 0..5 {
            // The agent hands its plan over by value: the copy is not part of a restart.
            let wanted = ruleset.clone();
            let t = Instant::now();
            let mut restarted = Engine::new(NftnlBackend::new());
            let stats = restarted.sync(wanted).expect("restart");
            restarts.push(t.elapsed());
            // The agent keeps its engine: freeing it is not part of a restart either.
            drop(restarted);
            assert_eq!(stats.ops, 0, "a restart with nothing changed wrote to the table");
        }
        restarts.sort();
        println!(
            "  restart with nothing changed (read-back + compare, 0 ops), 5 runs: min {:.0} ms, median {:.0} ms, max {:.0} ms",
            ms(restarts[0]),
            ms(restarts[2]),
            ms(restarts[4])
        );
        // One endpoint of one service replaced, `changes` times on different services. The
        // incremental path must not read the kernel's table back.
        let reads_before = engine.read_backs();
        let (mut memory, mut snap) = (memory, snap.clone());
        let mut one = Vec::new();
        for k in 0..changes {
            let i = (k * 7919) % n;
            let mut ips = endpoints_of(i, e, 0);
            ips[0] = endpoint_ip(i, e + 1, k);
            let slice: EndpointSlice = serde_norway::from_str(&slice_doc(i, &ips)).unwrap();
            let t0 = Instant::now();
            let mut b = snap.to_builder();
            b.insert(slice);
            snap = b.build();
            let t1 = Instant::now();
            let d = nodeplane::plan::plan_with(&snap, &cfg, &memory);
            let t2 = Instant::now();
            // The diff alone (sync computes it again), to tell it from the kernel's share.
            let ops = engine.plan(&d.ruleset).op_count();
            let t_diff = t2.elapsed();
            let t3 = Instant::now();
            engine.sync(d.ruleset).expect("one change");
            let t4 = Instant::now();
            memory = d.memory;
            one.push((t1 - t0, t2 - t1, t4 - t3, ops, t_diff));
        }
        let reads = engine.read_backs() - reads_before;
        println!("  kernel read-backs during the {changes} endpoint changes: {reads}");
        (cold_plan, cold_apply, objects, one)
    });
    println!(
        "  cold apply: {:.0} ms (plan {:.0} ms + apply {:.0} ms), {objects} rules + elements",
        ms(cold_plan + cold_apply),
        ms(cold_plan),
        ms(cold_apply)
    );
    if compare_kube_proxy {
        let theirs = lab.add_host("kp");
        let text = kube_proxy_text(n, e);
        let kp = theirs.enter(|| nft_stdin(&text));
        println!(
            "  kube-proxy layout via nft -f: {:.0} ms ({:.1}x our cold apply)",
            ms(kp),
            kp.as_secs_f64() / (cold_plan + cold_apply).as_secs_f64()
        );
    }
    if !one.is_empty() {
        let snapshot = median(one.iter().map(|o| o.0).collect());
        let planned = median(one.iter().map(|o| o.1).collect());
        let applied = median(one.iter().map(|o| o.2).collect());
        let diffed = median(one.iter().map(|o| o.4).collect());
        // End to end in the agent: the snapshot delta, the plan, the diff and the apply.
        let mut totals: Vec<Duration> = one.iter().map(|o| o.0 + o.1 + o.2).collect();
        totals.sort();
        let total = percentile(&totals, 0.5);
        let p99 = percentile(&totals, 0.99);
        let ops = one.iter().map(|o| o.3).max().unwrap_or(0);
        println!(
            "  one endpoint change (median of {}): {:.2} ms = snapshot delta {:.2} ms + plan {:.2} ms \
             + diff and apply {:.2} ms (diff alone {:.2} ms), <= {ops} kernel ops; \
             p99 snapshot + plan + diff + apply {:.2} ms (max {:.2} ms)",
            one.len(),
            ms(total),
            ms(snapshot),
            ms(planned),
            ms(applied),
            ms(diffed),
            ms(p99),
            ms(totals[totals.len() - 1])
        );
    }
}

/// `n` sequential connections from `ns` to `dst`: the mean per connection.
fn connect_loop(ns: &Ns, dst: &str, n: usize) -> Duration {
    lab::connect_times(ns, dst, n).into_iter().sum::<Duration>() / n as u32
}

/// Connection setup from a pod to a ClusterIP with 10 and with `n` services installed, and
/// to the backend directly. Rounds alternate between the three (re-installing the table each
/// time) and the median round is reported, so drift on a shared machine (TIME_WAIT and
/// conntrack entries piling up, neighbours' load) hits all three alike.
fn latency(n: usize, e: usize, conns: usize) {
    const ROUNDS: usize = 5;
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let client = lab.add_pod(&node, "client", &["10.128.0.5"]);
    let backend = lab.add_pod(&node, "backend", &["10.128.0.6"]);
    lab::byte_server(&backend.ns, "0.0.0.0:8080");
    client.ns.sysctl("net.ipv4.tcp_tw_reuse", "1");
    let cfg = Config::for_node(NODE);
    let real = [Ipv4Addr::new(10, 128, 0, 6)];
    let mut engine = node.enter(|| Engine::new(NftnlBackend::new()));
    let tables: Vec<_> = [10, n]
        .iter()
        .map(|count| (*count, plan(&cluster(*count, e, Some(&real)), &cfg).ruleset))
        .collect();
    let per_round = conns / ROUNDS + 1;
    let mut rounds: Vec<Vec<Duration>> = vec![Vec::new(); tables.len() + 1];
    for _ in 0..ROUNDS {
        for (i, (_, table)) in tables.iter().enumerate() {
            node.enter(|| {
                engine.invalidate();
                engine.sync(table.clone()).expect("apply")
            });
            // Let the kernel finish deferred work (hash table resizes) before timing.
            std::thread::sleep(Duration::from_secs(1));
            connect_loop(&client.ns, "172.30.0.10:80", per_round / 10 + 1); // warm-up
            rounds[i].push(connect_loop(&client.ns, "172.30.0.10:80", per_round));
        }
        rounds[tables.len()].push(connect_loop(&client.ns, "10.128.0.6:8080", per_round));
    }
    let medians: Vec<Duration> = rounds.into_iter().map(median).collect();
    println!("connection setup, median of {ROUNDS} alternating rounds of {per_round} connections:");
    let base = medians[0];
    for ((count, _), t) in tables.iter().zip(&medians) {
        println!(
            "  ClusterIP with {count:>6} services: {:6.1} us/conn ({:+.1}% vs 10)",
            t.as_secs_f64() * 1e6,
            (t.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0
        );
    }
    println!(
        "  backend directly:               {:6.1} us/conn",
        medians[tables.len()].as_secs_f64() * 1e6
    );
}

/// Resident memory of the agent in run mode holding `n` x `e` from a manifests directory.
fn agent_rss(n: usize, e: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&service_doc(i));
        text.push_str("---\n");
        text.push_str(&slice_doc(i, &endpoints_of(i, e, 0)));
        text.push_str("---\n");
    }
    std::fs::write(dir.path().join("services.yaml"), text).unwrap();
    let d = dir.path().to_str().unwrap();
    let agent = node.spawn_agent(&["--manifests", d, "--node-name", NODE]);
    let start = Instant::now();
    lab::eventually(Duration::from_secs(300), || {
        if agent.logs().contains("sync done") {
            Ok(())
        } else {
            Err(agent.logs())
        }
    });
    let synced = start.elapsed();
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_string();
    println!(
        "agent in run mode, {n} x {e} from manifests: first sync after {:.1} s, {rss}",
        synced.as_secs_f64()
    );
}

/// One scale of `--kube-cold-start`: `N x E` (services x endpoints each).
fn scales() -> Option<Vec<(usize, usize)>> {
    let argv: Vec<String> = std::env::args().collect();
    let i = argv.iter().position(|a| a == "--kube-cold-start")?;
    let list = argv
        .get(i + 1)
        .expect("--kube-cold-start needs N1xE1,N2xE2,...");
    Some(
        list.split(',')
            .map(|s| {
                let (n, e) = s.split_once('x').expect("NxE, e.g. 10000x10");
                (n.parse().expect("N"), e.parse().expect("E"))
            })
            .collect(),
    )
}

/// `n` x `e` in a fake API server; the agent started `runs` times against it, each into an
/// empty table (cold start): spawn to first committed sync, and RSS then.
fn kube_cold_start(n: usize, e: usize, runs: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let listener = node
        .enter(|| std::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind the fake API server in the node netns");
    let api = FakeApi::start(listener);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let loading = Instant::now();
    let node_doc = objects::node(NODE, &["192.168.50.11"]).to_string();
    let json = |doc: &str| -> serde_json::Value { serde_norway::from_str(doc).unwrap() };
    api.put(json(&node_doc));
    api.put(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "bench"}}));
    for i in 0..n {
        api.put(json(&service_doc(i)));
        api.put(json(&slice_doc(i, &endpoints_of(i, e, 0))));
    }
    println!(
        "fake API holds {n} services x {e} endpoints ({:.1} s to load)",
        loading.elapsed().as_secs_f64()
    );
    let mut took = Vec::new();
    let mut rss = Vec::new();
    let mut peak = Vec::new();
    // `--neighbour`: another nftables user of the node, one-element commits to its own table
    // in a loop while the agent starts. Its longest wait is how long our commits hold the
    // kernel's nftables lock (plus the `nft` process's own ~5 ms). It keeps a core busy, so
    // the start-up figures are taken without it.
    let neighbour = std::env::args().any(|a| a == "--neighbour");
    if neighbour {
        node.nft(&["add", "table", "inet", "neighbour"]).unwrap();
        node.nft(&[
            "add",
            "set",
            "inet",
            "neighbour",
            "s",
            "{ type ipv4_addr; }",
        ])
        .unwrap();
    }
    let mut waits: Vec<Duration> = Vec::new();
    for _ in 0..runs {
        let _ = node.nft(&["delete", "table", "inet", "nodeplane"]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let start = Instant::now();
        std::thread::scope(|scope| {
            let probe = scope.spawn(|| {
                let mut worst = Duration::ZERO;
                let mut i = 0u32;
                while neighbour && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let elem = format!(
                        "{{ 10.{}.{}.{} }}",
                        (i >> 16) & 255,
                        (i >> 8) & 255,
                        i & 255
                    );
                    let t = Instant::now();
                    node.nft(&["add", "element", "inet", "neighbour", "s", &elem])
                        .unwrap();
                    worst = worst.max(t.elapsed());
                    i += 1;
                }
                worst
            });
            let agent = node.spawn_agent(&[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--node-name",
                NODE,
                "--egress-ip-assigner=false",
                "--admin-address",
                "127.0.0.1:0",
                "--healthz-bind-address",
                "",
            ]);
            let deadline = start + Duration::from_secs(600);
            while !agent.logs().contains("sync done") {
                assert!(Instant::now() < deadline, "no sync: {}", agent.logs());
                std::thread::sleep(Duration::from_millis(5));
            }
            took.push(start.elapsed());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            waits.push(probe.join().unwrap());
            let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
            let kb = |field: &str| -> u64 {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                    .unwrap_or(0)
            };
            rss.push(kb("VmRSS:"));
            peak.push(kb("VmHWM:"));
            let (_, logs) = agent.stop();
            if std::env::var_os("BENCH_SHOW_LOG").is_some() {
                println!("{logs}");
            }
        });
    }
    waits.sort();
    if neighbour {
        println!(
            "  another nftables user's one-element commits during the start: longest wait per run {:?} ms",
            waits.iter().map(|w| w.as_millis()).collect::<Vec<_>>()
        );
    }
    took.sort();
    println!(
        "kube cold start, {n} x {e}, {runs} runs: spawn to first committed sync p50 {:.0} ms, \
         p99 {:.0} ms (min {:.0}, max {:.0}); RSS then {} MiB (max), peak RSS {} MiB (max)",
        ms(percentile(&took, 0.5)),
        ms(percentile(&took, 0.99)),
        ms(took[0]),
        ms(took[took.len() - 1]),
        rss.iter().max().copied().unwrap_or(0) / 1024,
        peak.iter().max().copied().unwrap_or(0) / 1024
    );
}

fn main() {
    if let Some(scales) = scales() {
        let argv: Vec<String> = std::env::args().collect();
        let runs = argv
            .windows(2)
            .find(|w| w[0] == "--runs")
            .map_or(5, |w| w[1].parse().expect("--runs N"));
        for (n, e) in scales {
            kube_cold_start(n, e, runs);
        }
        return;
    }
    let a = args();
    // `--change-scales N1,N2,...`: cold apply and one-endpoint changes only, at each N.
    let argv: Vec<String> = std::env::args().collect();
    if let Some(w) = argv.windows(2).find(|w| w[0] == "--change-scales") {
        for n in w[1].split(',') {
            apply_cost(
                n.parse().expect("--change-scales N1,N2"),
                a.endpoints,
                a.changes,
                false,
            );
        }
        return;
    }
    // `--skip-apply`: only latency and RSS (the cold applies dominate the run time).
    if !std::env::args().any(|x| x == "--skip-apply") {
        apply_cost(a.services, a.endpoints, a.changes, true);
        apply_cost((a.services / 10).max(1), a.endpoints, a.changes, false);
    }
    latency(a.services, a.endpoints, a.conns);
    agent_rss(a.services, a.endpoints);
}
