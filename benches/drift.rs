//! Drift detection costs and repair times, printed (no timing assertions).
//!
//! `cargo bench --bench drift` (root: builds network namespaces); under `cargo test` a
//! smoke-sized run. Options after `--`: `--services N` services x 10 endpoints for the listener
//! cost (default 10000), `--rounds N` alternating rounds of it (default 3), `--drifts N`
//! drifts repaired by the agent (default 50), `--drift-services N` services in that agent's
//! table (default 1000).
//!
//! 1. What a listener costs a large apply: the cold apply of N services x 10 endpoints
//!    (`Engine::sync` from empty) in a fresh netns, without and with a [`Monitor`] in it
//!    (the kernel only builds notifications while someone listens), and with the monitor but
//!    the apply sent in its quiet window (`Quiet`, as the agent does), in alternating rounds;
//!    the applying thread's wall and CPU time, the monitor thread's CPU time and what it read.
//! 2. Drift repair: the agent in run mode (an EgressFirewall and M services), then `--drifts`
//!    drifts in turn (`delete table`, `flush chain fw-dispatch`, a deleted map element, a rule
//!    inserted into `fw-dispatch`, `flush ruleset`). Per drift: the time from the drift's
//!    commit to the agent's repair commit as an independent listener in the node netns sees
//!    them, and the agent's own measure (`nodeplane_drift_last_repair_duration_seconds`: from
//!    its reader seeing the commit to the end of the repairing sync). p50/p99/max of both.

use nodeplane::api::{EndpointSlice, Service};
use nodeplane::config::Config;
use nodeplane::nft::monitor::{Drift, Monitor};
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::{Engine, TABLE_NAME};
use nodeplane::plan::plan;
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::args::arg;
use nodeplane::testing::lab::{Lab, Ns, run_cmd};
use nodeplane::testing::objects;
use nodeplane::testing::stats::{median, ms, percentile};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const ENDPOINTS: usize = 10;
const ADMIN: &str = "127.0.0.1:9942";

const HTTP_80: &str = "{name: http, port: 80, protocol: TCP}";
const HTTP_8080: &str = "{name: http, port: 8080, protocol: TCP}";

fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 30, 0, 10)) + i as u32)
}

/// Service `svc<i>` in namespace `bench`, port 80 to endpoints' 8080.
fn service_doc(i: usize) -> String {
    let ip = cluster_ip(i).to_string();
    let svc = objects::service_ips(&format!("svc{i}"), &[&ip], HTTP_80);
    svc.in_namespace("bench").to_string()
}

/// `ENDPOINTS` endpoints of service `i`, all on node-2.
fn slice_doc(i: usize) -> String {
    let eps: Vec<_> = (0..ENDPOINTS)
        .map(|j| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 129, 0, 0)) + (i * 16 + j) as u32);
            objects::ep(&ip.to_string(), "node-2")
        })
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

fn cluster(n: usize) -> Snapshot {
    let mut b = Snapshot::builder();
    for i in 0..n {
        let svc: Service = serde_norway::from_str(&service_doc(i)).unwrap();
        let slice: EndpointSlice = serde_norway::from_str(&slice_doc(i)).unwrap();
        b.insert(svc);
        b.insert(slice);
    }
    b.build()
}

/// CPU time (user + system) of thread `tid` of this process, 10 ms resolution.
fn thread_cpu(tid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let ticks = f.iter().sum::<u64>();
    Duration::from_millis(ticks * 10)
}

/// The thread id of this process's monitor reader (named `nft-monitor`).
fn monitor_tid() -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let e = e.ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "nft-monitor").then(|| e.file_name().to_str()?.parse().ok())?
    })
}

struct ColdApply {
    wall: Duration,
    cpu: Duration,
    monitor_cpu: Duration,
    messages: u64,
    bytes: u64,
    overruns: u64,
}

/// Who listens during a cold apply.
#[derive(Clone, Copy, PartialEq)]
enum Listen {
    Nobody,
    Monitor,
    /// The monitor, with the apply sent in its quiet window.
    Quiet,
}

/// One cold apply of `snap` in a fresh netns, with or without a listener.
fn cold_apply(snap: &Snapshot, listen: Listen) -> ColdApply {
    let mut lab = Lab::new();
    let ns = lab.add_host("cost");
    let cfg = Config::for_node(NODE);
    let ruleset = plan(snap, &cfg).ruleset;
    let monitor = (listen != Listen::Nobody).then(|| {
        ns.enter(|| Monitor::start(TABLE_NAME, |_| true))
            .expect("monitor")
    });
    let monitor_before = monitor_tid().map(thread_cpu).unwrap_or_default();
    let quiet = monitor
        .as_ref()
        .filter(|_| listen == Listen::Quiet)
        .map(|m| m.quiet().expect("quiet"));
    let (wall, cpu) = ns.enter(move || {
        let mut engine = Engine::new(NftnlBackend::new().with_quiet(quiet));
        let tid = nix::unistd::gettid().as_raw();
        let cpu0 = thread_cpu(tid);
        let t = Instant::now();
        engine.sync(ruleset).expect("cold apply");
        (t.elapsed(), thread_cpu(tid) - cpu0)
    });
    let (mut messages, mut bytes, mut overruns, mut monitor_cpu) = (0, 0, 0, Duration::ZERO);
    if let Some(m) = monitor {
        // The reader is done when it has seen the commit's end (or lost it).
        let deadline = Instant::now() + Duration::from_secs(30);
        let s = m.stats();
        while s.own_commits.load(Relaxed) == 0
            && s.quiet_windows.load(Relaxed) == 0
            && s.overruns.load(Relaxed) == 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        monitor_cpu = monitor_tid().map(thread_cpu).unwrap_or_default() - monitor_before;
        messages = s.messages.load(Relaxed);
        bytes = s.bytes.load(Relaxed);
        overruns = s.overruns.load(Relaxed);
        m.stop();
    }
    ColdApply {
        wall,
        cpu,
        monitor_cpu,
        messages,
        bytes,
        overruns,
    }
}

fn listener_cost(services: usize, rounds: usize) {
    let snap = cluster(services);
    let (mut without, mut with, mut quiet) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        without.push(cold_apply(&snap, Listen::Nobody));
        with.push(cold_apply(&snap, Listen::Monitor));
        quiet.push(cold_apply(&snap, Listen::Quiet));
    }
    let wall = |v: &[ColdApply]| median(v.iter().map(|c| c.wall).collect());
    let cpu = |v: &[ColdApply]| median(v.iter().map(|c| c.cpu).collect());
    let (w0, w1) = (wall(&without), wall(&with));
    println!(
        "cold apply of {services} services x {ENDPOINTS} endpoints, median of {rounds} alternating rounds:"
    );
    println!(
        "  without a listener: {:.0} ms wall, {:.0} ms CPU (applying thread)",
        ms(w0),
        ms(cpu(&without))
    );
    println!(
        "  with the monitor:   {:.0} ms wall ({:+.1}%), {:.0} ms CPU (applying thread); \
         monitor thread {:.0} ms CPU",
        ms(w1),
        (w1.as_secs_f64() / w0.as_secs_f64() - 1.0) * 100.0,
        ms(cpu(&with)),
        ms(median(with.iter().map(|c| c.monitor_cpu).collect()))
    );
    let w2 = wall(&quiet);
    println!(
        "  monitor, quiet:     {:.0} ms wall ({:+.1}%), {:.0} ms CPU (applying thread); \
         monitor thread {:.0} ms CPU, {} notifications read",
        ms(w2),
        (w2.as_secs_f64() / w0.as_secs_f64() - 1.0) * 100.0,
        ms(cpu(&quiet)),
        ms(median(quiet.iter().map(|c| c.monitor_cpu).collect())),
        quiet.iter().map(|c| c.messages).max().unwrap_or(0)
    );
    for c in &with {
        println!(
            "    round: {:.0} ms, {} notifications ({:.1} MB) read, {} overruns",
            ms(c.wall),
            c.messages,
            c.bytes as f64 / 1e6,
            c.overruns
        );
    }
}

fn admin_get(ns: &Ns, path: &str) -> Option<String> {
    ns.enter(|| {
        let mut s = TcpStream::connect(ADMIN).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.starts_with("HTTP/1.1 200")
            .then(|| text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()))?
    })
}

fn metric(ns: &Ns, name: &str) -> Option<f64> {
    admin_get(ns, "/metrics")?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

#[track_caller]
fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not after {timeout:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn drift_repair(drifts: usize, services: usize) {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a1, namespace: alpha}\n\
         spec: {nodeName: node-1, containers: []}\n\
         status: {phase: Running, podIP: '10.128.0.5', podIPs: [{ip: '10.128.0.5'}]}\n---\n\
         apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: alpha}\n\
         spec:\n  egress: [{type: Allow, to: {cidrSelector: 203.0.113.10/32}}, \
         {type: Deny, to: {cidrSelector: 203.0.113.0/24}}]\n---\n",
    );
    for i in 0..services {
        text.push_str(&service_doc(i));
        text.push_str("---\n");
        text.push_str(&slice_doc(i));
        text.push_str("---\n");
    }
    std::fs::write(dir.path().join("cluster.yaml"), text).unwrap();
    let d = dir.path().to_str().unwrap();
    let agent = node.spawn_agent(&["--manifests", d, "--node-name", NODE]);
    wait_until("agent ready", Duration::from_secs(120), || {
        admin_get(&node, "/readyz").is_some()
    });
    let list = || {
        node.enter(|| run_cmd(&["nft", "list", "table", "inet", TABLE_NAME], None))
            .map(|t| {
                let mut l: Vec<String> = t.lines().map(String::from).collect();
                l.sort();
                l
            })
            .ok()
    };
    let expected = list().expect("our table");
    let (tx, rx) = mpsc::channel::<Drift>();
    let listener = node
        .enter(move || Monitor::start(TABLE_NAME, move |d| tx.send(d).is_ok()))
        .expect("listener");
    let commands = [
        format!("delete table inet {TABLE_NAME}"),
        format!("flush chain inet {TABLE_NAME} fw-dispatch"),
        format!("delete element inet {TABLE_NAME} svc-dispatch-v4-10 {{ 172.30.0.10 . tcp . 80 }}"),
        format!("insert rule inet {TABLE_NAME} fw-dispatch accept"),
        "flush ruleset".to_string(),
    ];
    let (mut seen, mut agent_measure) = (Vec::new(), Vec::new());
    let mut per_command = vec![Vec::new(); commands.len()];
    for k in 0..drifts {
        let command = &commands[k % commands.len()];
        let repairs = metric(&node, "nodeplane_drift_repairs_total").unwrap_or(0.0);
        node.enter(|| run_cmd(&["nft", command], None))
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        // The listener sees the drift's commit (by nft), then the agent's repair commit.
        let (mut drift_at, mut repair_at) = (None, None);
        while repair_at.is_none() {
            let d = rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("no repair of `{command}`:\n{}", agent.logs()));
            if d.by.iter().any(|b| b.starts_with("nft ")) {
                drift_at.get_or_insert(d.at);
            } else if drift_at.is_some() {
                repair_at = Some(d.at);
            }
        }
        seen.push(ms(repair_at.unwrap() - drift_at.unwrap()));
        wait_until("repair counted", Duration::from_secs(10), || {
            metric(&node, "nodeplane_drift_repairs_total").unwrap_or(0.0) > repairs
        });
        let own = metric(&node, "nodeplane_drift_last_repair_duration_seconds").unwrap();
        agent_measure.push(own * 1e3);
        per_command[k % commands.len()].push(own * 1e3);
        wait_until(
            "table equal to the applied one",
            Duration::from_secs(10),
            || list().as_ref() == Some(&expected),
        );
    }
    listener.stop();
    agent.stop_ok();
    seen.sort_by(f64::total_cmp);
    agent_measure.sort_by(f64::total_cmp);
    println!(
        "drift repair, {drifts} drifts (rotating: {}), agent table: {services} services x \
         {ENDPOINTS} endpoints + 1 EgressFirewall:",
        commands.join(" | ")
    );
    for (command, mut v) in commands.iter().zip(per_command) {
        v.sort_by(f64::total_cmp);
        if !v.is_empty() {
            println!(
                "  `nft {command}`: agent's measure, median of {}: {:.1} ms",
                v.len(),
                percentile(&v, 0.5)
            );
        }
    }
    for (what, v) in [
        (
            "drift commit -> repair commit (independent listener)",
            &seen,
        ),
        (
            "agent: detection -> end of repairing sync          ",
            &agent_measure,
        ),
    ] {
        println!(
            "  {what}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v[v.len() - 1]
        );
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let arg = |name, full_default, smoke| arg(name, if full { full_default } else { smoke });
    let services = arg("--services", 10_000, 200);
    let rounds = arg("--rounds", 3, 1);
    let drifts = arg("--drifts", 50, 5);
    let drift_services = arg("--drift-services", 1000, 20);
    listener_cost(services, rounds);
    drift_repair(drifts, drift_services);
}
