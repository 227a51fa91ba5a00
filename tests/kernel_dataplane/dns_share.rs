//! EgressFirewall DNS fairness between two pods of one namespace: one pod flooding a
//! trusted resolver that never answers (each query holds a proxy slot for the upstream
//! timeout) with its own address must not take its neighbour's lookups, on every topology.
//! Bridged pods all come in on the bridge (`br0`) when `br_netfilter` is off, so the input
//! interface alone does not tell them apart there. (A pod that forges its bridge
//! neighbour's address is stopped by `--pod-source-check` at its bridge port while a
//! NetworkPolicy is in force, not by the proxy: README, limits.)
//!
//! The topology of `dns_attacks` with the attacker in `alpha` too.

use crate::dns_attacks::{ENOUGH_FLOOD, topo_on, zone_with};
use nodeplane::testing::lab::Topology;
use nodeplane::testing::lab::dns::a_query;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `alpha`'s pod `m` asks the silent resolver with its own address, from a fresh port per
/// query (as a resolver's retries look), ~1,000 queries a second.
fn a_pods_flood_leaves_its_neighbour_its_lookups(topology: Topology) {
    let t = topo_on(topology, zone_with("v.example.com", "198.18.13.1"), "alpha");
    let running = t.spawn(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let flood = t.attacker.ns.spawn(move || {
        let silent: SocketAddr = "192.168.1.222:53".parse().unwrap();
        let mut sent = 0u32;
        while !flag.load(Ordering::Relaxed) {
            let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let q = a_query(&format!("q{sent}.example.com"), sent as u16);
            if sock.send_to(&q, silent).is_ok() {
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    });
    let (failures, sent) = t.lookups_under(&stop, flood);
    running.stop_ok();
    assert!(
        sent > ENOUGH_FLOOD,
        "{topology:?}: the flood was too small to prove anything: {sent}"
    );
    assert!(
        failures.is_empty(),
        "{topology:?}: {} of 10 lookups failed under its neighbour's flood of {sent} queries: {failures:?}",
        failures.len()
    );
}

#[test]
fn a_routed_pods_flood_leaves_its_neighbour_its_lookups() {
    a_pods_flood_leaves_its_neighbour_its_lookups(Topology::Routed);
}

#[test]
fn a_bridged_pods_flood_leaves_its_bridge_neighbour_its_lookups() {
    a_pods_flood_leaves_its_neighbour_its_lookups(Topology::Bridged {
        br_netfilter: false,
    });
}

#[test]
fn a_bridged_pods_flood_leaves_its_bridge_neighbour_its_lookups_with_br_netfilter() {
    a_pods_flood_leaves_its_neighbour_its_lookups(Topology::Bridged { br_netfilter: true });
}
