//! EgressIP failover as an application sees it, printed (no timing assertions).
//!
//! `cargo bench --bench egress_failover` (root). Options after `--`: `--trials N` per case
//! (default 20; 1 under `cargo test`).
//!
//! The three-node kube-mode netns cluster of the kernel tests (`testing::eip_cluster`: nodes
//! 1 and 2 egress-assignable, node 3 leads the assigner and runs the sending pod) with a
//! datagram every 10 ms from node 3's pod to the external host. Per trial, the gap is the
//! longest time between two consecutive datagrams the external host received from the egress
//! IP, counted from the last one before the event: an undisturbed stream reads ~10 ms.
//! - `unplanned`: the hosting node's agent is SIGKILLed and its uplink cut at the same
//!   instant; the IP moves to the other node. The dead node then "reboots" (kernel state
//!   gone, uplink back, agent started) and the next trial kills the new host. Before each
//!   trial the assigner's Lease is handed to node 3 (`EipCluster::hand_lease_to`), so the
//!   killed node does not hold it.
//! - `leader`: the same, with the Lease handed to the hosting node first: the killed node
//!   holds the Lease and hosts the IP (a standby's probes prove it dead and it takes over
//!   early, then moves the IP).
//! - `planned`: the hosting node loses the egress-assignable label (it stays healthy); the
//!   label is put back once the IP has moved, and the next trial moves it back.
//! - `restart`: the hosting node's agent is SIGKILLed and started again (no move).
//!
//! Datagrams that reach the external host with any other source address are counted as
//! leaked (the fail-closed property: must be 0).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use nodeplane::testing::args::arg;
use nodeplane::testing::eip_cluster::{EIP, EXT, EipCluster};
use nodeplane::testing::lab::{DatagramSender, DatagramSink};
use nodeplane::testing::stats::percentile;

const WAIT: Duration = Duration::from_secs(20);

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then one trial per case proves the bench still works.
    let full = std::env::args().any(|a| a == "--bench");
    let trials = arg("--trials", if full { 20 } else { 1 });
    let c = EipCluster::new(3, &[0, 1]);
    c.start_agent(2);
    assert_eq!(c.wait_leader(WAIT), 2);
    c.start_agent(0);
    c.start_agent(1);
    c.put_egress_ip();
    c.wait_hosted(WAIT);
    let sink_addr: SocketAddr = format!("{EXT}:9999").parse().unwrap();
    let sink = DatagramSink::start(&c.ext, sink_addr);
    let _sender = DatagramSender::start(&c.pods[2].ns, sink_addr, Duration::from_millis(10));
    let eip: IpAddr = EIP.parse().unwrap();
    println!("egress IP failover, {trials} trials per case, datagram every 10 ms");
    // The noise floor: the longest gap in 2 s windows with no event (scheduling of the sender
    // and sink threads on this machine).
    let mut quiet = Vec::new();
    for _ in 0..trials {
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        let o = sink.outage(eip, t0);
        quiet.push(o.gap.expect("steady stream").as_secs_f64() * 1e3);
    }
    report("no event", &mut quiet, 0);
    for case in ["unplanned", "leader", "planned", "restart"] {
        let mut gaps = Vec::new();
        let mut leaked = 0;
        for _ in 0..trials {
            let host = c.wait_hosted(WAIT);
            match case {
                "unplanned" => c.hand_lease_to(2, WAIT),
                "leader" => c.hand_lease_to(host, WAIT),
                _ => {}
            }
            steady(&sink, eip);
            let t0 = Instant::now();
            let restore = event(&c, case, host);
            let o = c.wait(WAIT, || {
                let o = sink.outage(eip, t0);
                (o.delivered >= 30)
                    .then_some(o)
                    .ok_or_else(|| format!("{case}: no EIP traffic yet: {o:?}"))
            });
            gaps.push(o.gap.expect("delivered").as_secs_f64() * 1e3);
            leaked += o.leaked;
            restore(&c, host);
        }
        report(case, &mut gaps, leaked);
    }
}

fn report(case: &str, gaps: &mut [f64], leaked: usize) {
    gaps.sort_by(f64::total_cmp);
    let all: Vec<String> = gaps.iter().map(|g| format!("{g:.0}")).collect();
    println!(
        "  {case:9}: gap p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; leaked {leaked}; all (ms): {}",
        percentile(gaps, 0.5),
        percentile(gaps, 0.99),
        gaps[gaps.len() - 1],
        all.join(" "),
    );
}

/// Starts the case's event on the hosting node; returns what puts the cluster back.
fn event(c: &EipCluster, case: &str, host: usize) -> fn(&EipCluster, usize) {
    match case {
        "unplanned" | "leader" => {
            c.kill_agent(host);
            c.uplink(host, false);
            |c, dead| {
                c.wait_moved_off(dead, WAIT);
                c.forget_kernel_state(dead);
                c.uplink(dead, true);
                c.start_agent(dead);
                c.wait_ready(dead, WAIT);
                // Alive again for the prober after 3 answered rounds.
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        "planned" => {
            c.put_node(host, false);
            |c, old| {
                c.wait_moved_off(old, WAIT);
                c.put_node(old, true);
            }
        }
        "restart" => {
            c.kill_agent(host);
            c.start_agent(host);
            |c, host| c.wait_ready(host, WAIT)
        }
        other => panic!("unknown case {other}"),
    }
}

/// Waits until the last datagrams came from the egress IP without a pause.
fn steady(sink: &DatagramSink, eip: IpAddr) {
    let deadline = Instant::now() + WAIT;
    loop {
        let since = Instant::now() - Duration::from_millis(300);
        let o = sink.outage(eip, since);
        if o.delivered >= 25
            && o.leaked == 0
            && o.gap.is_some_and(|g| g < Duration::from_millis(40))
        {
            return;
        }
        assert!(Instant::now() < deadline, "stream not steady: {o:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
