//! EgressFirewall DNS proxy: the latency it adds to a pod's lookup and how fast it learns.
//!
//! `cargo bench --bench dns_proxy` (root: builds network namespaces); under `cargo test` a
//! smoke-sized run. Options after `--`: `--lookups N` per latency mode (default 2000),
//! `--threads N` and `--answers N` for the throughput run (default 4 and 8000),
//! `--conntrack N` entries kept alive on the node while measuring (default 20000) and
//! `--spread-ms N` between lookups (default 5, so a run spans many keep-alive passes: a
//! periodic stall shows in the p99) and `--ttl N` of the learned answers (default 300; the
//! keep-alive pass dumps conntrack only while an element expires within its horizon, so
//! `--ttl 5`, the floor, makes every pass dump while learning: the worst case).
//!
//! Pod `a1` (namespace `alpha`: `Allow *.example.com`, then `Deny 0.0.0.0/0`) is steered to
//! the agent's proxy; pod `b1` (namespace `beta`, CIDR rules only) is not. The DNS server
//! runs on the uplink host. Latency modes, one lookup at a time from inside the pod:
//! `direct` (b1), `proxied, already learned` (a1, a fixed answer: parsed, nothing to write)
//! and `proxied, learning` (a1, a new address every answer: one netlink batch each, the
//! answer held until the kernel acknowledged it). Throughput: `--threads` pods' resolvers
//! asking in parallel for rotating answers (every answer written), with the kernel's per-pod
//! rate limit off (`--dns-rate-limit 0`).

use nodeplane::testing::args::arg;
use nodeplane::testing::lab::dns::{DnsServer, Zone, lookup_here};
use nodeplane::testing::lab::{Lab, ManifestAgent, Ns, eventually};
use nodeplane::testing::objects;
use nodeplane::testing::stats::percentile;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const DNS: &str = "192.168.1.100:53";
const TIMEOUT: Duration = Duration::from_secs(2);

/// `n` sequential lookups of `name` inside `ns`, `spread` apart; the latencies in ms.
fn latencies(ns: &Ns, name: &str, n: usize, spread: Duration) -> Vec<f64> {
    let name = name.to_string();
    let server: SocketAddr = DNS.parse().unwrap();
    let mut v = ns.enter(move || {
        (0..n)
            .map(|_| {
                std::thread::sleep(spread);
                let t = Instant::now();
                lookup_here(server, &name, TIMEOUT).expect("lookup");
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect::<Vec<f64>>()
    });
    v.sort_by(f64::total_cmp);
    v
}

fn report(what: &str, sorted: &[f64]) {
    println!(
        "  {what:<28} p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms, {} over 50 ms ({} lookups)",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99),
        percentile(sorted, 0.999),
        sorted[sorted.len() - 1],
        sorted.iter().filter(|ms| **ms > 50.0).count(),
        sorted.len()
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let arg = |name, full_default, smoke| arg(name, if full { full_default } else { smoke });
    let lookups = arg("--lookups", 2000, 50);
    let threads = arg("--threads", 4, 2);
    let answers = arg("--answers", 8000, 100);
    let conntrack = arg("--conntrack", 20_000, 2000);
    let spread = Duration::from_millis(arg("--spread-ms", 5, 1) as u64);
    let ttl = arg("--ttl", 300, 300) as u32;

    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let a1 = lab.add_pod(&node, "a1", &["10.128.0.5"]);
    let b1 = lab.add_pod(&node, "b1", &["10.128.0.7"]);
    let ext = lab.add_uplink_host(&node, "ext");
    let mut zone = Zone::default();
    zone.fixed.insert(
        "fixed.example.com".into(),
        (vec!["198.18.0.1".parse().unwrap()], 300),
    );
    zone.rotating.insert(
        "rot.example.com".into(),
        ("198.18.16.0".parse().unwrap(), ttl),
    );
    let dns = DnsServer::start(&ext, DNS.parse().unwrap(), zone);
    let agent = ManifestAgent::new(&node, NODE, &["--cluster-cidr", "10.128.0.0/14"]);
    let pods = [
        objects::pod("alpha", "a1")
            .on(NODE)
            .ips(&a1.addrs)
            .to_string(),
        objects::pod("beta", "b1")
            .on(NODE)
            .ips(&b1.addrs)
            .to_string(),
    ];
    agent.write("pods.yaml", &pods.join("---\n"));
    let alpha = "[{type: Allow, to: {cidrSelector: 192.168.1.100/32}}, \
                 {type: Allow, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";
    agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall("alpha", alpha).to_string(),
    );
    let beta = "[{type: Deny, to: {cidrSelector: 198.51.100.0/24}}]";
    agent.write(
        "fw-beta.yaml",
        &objects::egress_firewall("beta", beta).to_string(),
    );
    // The lab's server is the node's resolver (so the proxy trusts it).
    let resolv = agent.dir().join("resolv.conf.txt");
    std::fs::write(&resolv, "nameserver 192.168.1.100\n").unwrap();
    // The throughput run asks from one pod as fast as the proxy answers, far past the kernel's
    // per-pod limit on steered DNS (`--dns-rate-limit`): off, so the proxy is measured.
    let resolv = resolv.to_str().unwrap();
    let process = agent.spawn(&["--resolv-conf", resolv, "--dns-rate-limit", "0"]);
    eventually(Duration::from_secs(15), || {
        let _ = dns.take_sources();
        a1.ns
            .enter(|| lookup_here(DNS.parse().unwrap(), "fixed.example.com", TIMEOUT))?;
        let s = dns.take_sources();
        s.contains(&"192.168.1.1".parse().unwrap())
            .then_some(())
            .ok_or(format!("not proxied yet: {s:?}"))
    });

    // Learn something first, so that the keep-alive thread has something to look after.
    latencies(&a1.ns, "rot.example.com", 10, Duration::ZERO);
    let load = ConntrackLoad::start(&node, conntrack);
    let entries = eventually(Duration::from_secs(60), || {
        let n = conntrack_entries(&node);
        (n >= conntrack)
            .then_some(n)
            .ok_or(format!("{n} conntrack entries"))
    });
    println!(
        "DNS lookup latency (one at a time, {} ms apart, from inside the pod; {entries} conntrack entries on the node; learned TTL {ttl} s):",
        spread.as_millis()
    );
    report(
        "direct (not steered)",
        &latencies(&b1.ns, "fixed.example.com", lookups, spread),
    );
    report(
        "proxied, already learned",
        &latencies(&a1.ns, "fixed.example.com", lookups, spread),
    );
    report(
        "proxied, learning",
        &latencies(&a1.ns, "rot.example.com", lookups, spread),
    );
    drop(load);

    let per_thread = answers / threads;
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| latencies(&a1.ns, "rot.example.com", per_thread, Duration::ZERO));
        }
    });
    let elapsed = started.elapsed();
    println!(
        "learning throughput: {} answers (each a new address) by {threads} resolvers in {:.2} s: {:.0} answers/s",
        per_thread * threads,
        elapsed.as_secs_f64(),
        (per_thread * threads) as f64 / elapsed.as_secs_f64()
    );
    let (status, logs) = process.stop();
    assert!(status.success(), "{status}:\n{logs}");
}

/// Keeps `n` UDP conntrack entries alive on the node: one datagram from the node to each of
/// `n` ports of the uplink host, again every 10 s (the UDP timeout is 30 s).
struct ConntrackLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConntrackLoad {
    fn start(node: &Ns, n: usize) -> ConntrackLoad {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = node.spawn(move || {
            let socks: Vec<std::net::UdpSocket> = (0..n.div_ceil(10_000))
                .map(|_| std::net::UdpSocket::bind("0.0.0.0:0").expect("bind"))
                .collect();
            while !flag.load(Ordering::Relaxed) {
                for i in 0..n {
                    let port = 20_000 + (i % 10_000) as u16;
                    let _ = socks[i / 10_000].send_to(b"x", ("192.168.1.100", port));
                }
                for _ in 0..100 {
                    if flag.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        ConntrackLoad {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for ConntrackLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The node's conntrack entries (`/proc/sys/net/netfilter/nf_conntrack_count` of its netns).
fn conntrack_entries(node: &Ns) -> usize {
    node.enter(|| std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
