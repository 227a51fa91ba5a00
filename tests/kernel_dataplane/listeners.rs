//! A pod that holds thousands of idle connections to the agent's listeners stops neither
//! the agent nor a listener: the agent runs under the soft limit of 1,024 open files that
//! systemd and containerd give it (and raises it), and every listener caps connections per
//! source address, so syncs, DNS answers through the proxy and health answers go on, and the
//! health-check port answers at once when the pod lets go.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nodeplane::testing::lab::dns::{DnsServer, Zone, lookup};
use nodeplane::testing::lab::{Ns, eventually, with_open_files};
use nodeplane::testing::objects::{self, Ep, ep};

use crate::services::{NODE, OTHER, expect_health, health, http_get, topo, write_local_lb};

const IDLE_CONNECTIONS: usize = 10_000;
/// The node's resolver on the uplink host; the pod's namespace has a `dnsName` rule, so its
/// queries are steered through the agent's DNS proxy (and reach the resolver from the node).
const RESOLVER: &str = "192.168.1.100:53";
const NODE_IP: &str = "192.168.1.1";

/// One lookup from `ns` answered through the proxy: the answer, and the resolver saw the
/// query come from the node, not from the pod.
fn lookup_through_proxy(ns: &Ns, resolver: &DnsServer) -> Result<(), String> {
    let _ = resolver.take_sources();
    let got = lookup(
        ns,
        RESOLVER.parse().unwrap(),
        "www.example.com",
        Duration::from_secs(2),
    )?;
    if got.addrs.first() != Some(&"198.51.100.7".parse().unwrap()) {
        return Err(format!("answer {:?}", got.addrs));
    }
    let sources = resolver.take_sources();
    let node: IpAddr = NODE_IP.parse().unwrap();
    if sources.contains(&node) {
        Ok(())
    } else {
        Err(format!("not proxied: the resolver saw {sources:?}"))
    }
}

/// Opens up to `count` connections from `ns`, spread over `targets`, and holds them (each
/// attempt waits at most 100 ms: a listener's backlog may be full).
fn hold_idle_connections(ns: &Ns, targets: &[&str], count: usize) -> Vec<TcpStream> {
    let targets: Vec<SocketAddr> = targets.iter().map(|t| t.parse().unwrap()).collect();
    ns.enter(move || {
        (0..count)
            .filter_map(|i| {
                let to = targets[i % targets.len()];
                TcpStream::connect_timeout(&to, Duration::from_millis(100)).ok()
            })
            .collect()
    })
}

/// systemd's and containerd's hard limit, or this host's if lower (raising a hard limit
/// needs CAP_SYS_RESOURCE, which a container may lack).
fn agent_hard_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    hard.min(524_288)
}

/// The test process holds the pod's side of every connection.
fn allow_many_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let needed = IDLE_CONNECTIONS as u64 + 4096;
    let limit = hard.max(needed);
    setrlimit(Resource::RLIMIT_NOFILE, limit, limit).unwrap_or_else(|e| {
        panic!("the test's pod needs {needed} open files; hard limit {hard}, raising it: {e}")
    });
}

#[test]
fn idle_connections_from_a_pod_exhaust_no_listener_and_no_descriptor() {
    allow_many_open_files();
    let t = topo();
    let write = |eps: &[Ep]| write_local_lb(&t, eps);
    let expect = |code: u16, local: u64| {
        expect_health(&t, code, local);
    };
    write(&[ep(&t.v4(&t.b1), NODE), ep(&t.v4(&t.b2), OTHER)]);
    // The flooding pod's namespace has a dnsName rule: its DNS goes through the proxy.
    let mut zone = Zone::default();
    let answer = vec!["198.51.100.7".parse().unwrap()];
    zone.fixed.insert("www.example.com".into(), (answer, 30));
    let resolver = DnsServer::start(&t.ext, RESOLVER.parse().unwrap(), zone);
    let resolv = t.agent.dir().join("resolv.conf.txt");
    std::fs::write(
        &resolv,
        "nameserver 192.168.1.100\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let pod = objects::pod("tenant", "c1").on(NODE).ips(&t.c1.addrs);
    t.agent.write("pods.yaml", &pod.to_string());
    let rules = "[{type: Allow, to: {dnsName: www.example.com}}]";
    let firewall = objects::egress_firewall("tenant", rules);
    t.agent.write("fw-tenant.yaml", &firewall.to_string());
    // As systemd and containerd start it: soft 1,024, hard 524,288 (or what this host allows).
    let hard = agent_hard_limit();
    let resolv_arg = resolv.to_str().unwrap();
    let agent = with_open_files(1024, hard, || t.agent.spawn(&["--resolv-conf", resolv_arg]));
    expect(200, 1);
    eventually(Duration::from_secs(15), || {
        lookup_through_proxy(&t.c1.ns, &resolver)
    });
    // Every listener at once: the proxy health and health-check ports, metrics, and the DNS
    // proxy's TCP listener (the pod's TCP port 53 is steered to it).
    let listeners = [
        "192.168.1.1:10256",
        "192.168.1.1:32095",
        "192.168.1.1:10249",
        RESOLVER,
    ];
    let held = hold_idle_connections(&t.c1.ns, &listeners, IDLE_CONNECTIONS);
    // The pod holds its side; the agent closed what it did not admit.
    assert!(
        held.len() > 1024,
        "the pod opened only {} connections",
        held.len()
    );

    // A sync goes on: the local endpoint terminates, the port says so.
    write(&[
        ep(&t.v4(&t.b1), NODE).terminating(),
        ep(&t.v4(&t.b2), OTHER),
    ]);
    expect(503, 0);
    for (addr, path) in [
        ("192.168.1.1:10256", "/healthz"),
        ("192.168.1.1:10249", "/metrics"),
    ] {
        eventually(Duration::from_secs(10), || {
            match http_get(&t.ext, addr, path) {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{addr}{path}: {other:?}")),
            }
        });
    }
    write(&[ep(&t.v4(&t.b1), NODE), ep(&t.v4(&t.b2), OTHER)]);
    expect(200, 1);
    // DNS through the proxy goes on, for the flooding pod itself.
    eventually(Duration::from_secs(10), || {
        lookup_through_proxy(&t.c1.ns, &resolver)
    });

    // The pod lets go: the port answers at once.
    drop(held);
    let start = Instant::now();
    let answer = health(&t.ext, "192.168.1.1:32095");
    assert!(
        matches!(answer, Ok((200, _))),
        "after the pod let go: {answer:?}"
    );
    let logs = agent.stop_ok();
    assert!(
        logs.contains(&format!(
            "soft limit raised from 1024 to the hard limit {hard}"
        )),
        "{logs}"
    );
    assert!(
        !logs.contains("Too many open files"),
        "the agent ran out of descriptors:\n{logs}"
    );
    println!(
        "{IDLE_CONNECTIONS} idle connections from one pod; the health-check port answered {} ms after they closed",
        start.elapsed().as_millis()
    );
}
