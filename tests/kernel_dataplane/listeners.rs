//! A pod that holds thousands of idle connections to the agent's listeners stops neither
//! the agent nor a listener: the agent runs under the soft limit of 1,024 open files that
//! systemd and containerd give it (and raises it), and every listener caps connections per
//! source address, so syncs and health answers go on, and the health-check port answers at
//! once when the pod lets go.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nodeplane::testing::lab::{Ns, eventually, with_open_files};
use nodeplane::testing::objects::{Ep, ep};

use crate::services::{NODE, OTHER, expect_health, health, http_get, topo, write_local_lb};

const IDLE_CONNECTIONS: usize = 10_000;

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
    // As systemd and containerd start it: soft 1,024, hard 524,288 (or what this host allows).
    let hard = agent_hard_limit();
    let agent = with_open_files(1024, hard, || t.agent.spawn(&[]));
    expect(200, 1);
    let listeners = [
        "192.168.1.1:10256",
        "192.168.1.1:32095",
        "192.168.1.1:10249",
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

    // The pod lets go: the port answers at once.
    drop(held);
    let start = Instant::now();
    let answer = health(&t.ext, "192.168.1.1:32095");
    assert!(
        matches!(answer, Ok((200, _))),
        "after the pod let go: {answer:?}"
    );
    let (status, logs) = agent.stop();
    assert!(status.success(), "agent exit {status:?}:\n{logs}");
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
