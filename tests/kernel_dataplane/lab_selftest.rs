//! Proves the netns lab itself: topology, real traffic, teardown, isolation between labs.

use std::net::IpAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use nodeplane::testing::lab::{self, Lab, Ns, Outcome, Pod, SECOND, netns_exists};

/// node + 2 pods (one dual-stack) + an external host on a bridge segment, routed both ways.
struct Topo {
    lab: Lab,
    node: Ns,
    ext: Ns,
    pods: [Pod; 2],
}

fn topo() -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let pod1 = lab.add_pod(&node, "pod1", &["10.244.1.2", "fd00:10:244:1::2"]);
    let pod2 = lab.add_pod(&node, "pod2", &["10.244.1.3"]);
    let ext = lab.add_host("ext");
    let lan = lab.add_segment("lan");
    lab.attach(&node, &lan, &["192.168.50.1/24", "fd00:50::1/64"]);
    lab.attach(&ext, &lan, &["192.168.50.100/24", "fd00:50::100/64"]);
    lab.add_route(&ext, "10.244.0.0/16", "192.168.50.1");
    lab.add_route(&ext, "fd00:10:244::/48", "fd00:50::1");
    Topo {
        lab,
        node,
        ext,
        pods: [pod1, pod2],
    }
}

#[test]
fn pod_to_external_traffic_keeps_pod_source() {
    let t = topo();
    let _tcp = t.ext.tcp_server("[::]:8080", "ext");
    let _udp4 = t.ext.udp_server("0.0.0.0:5353", "ext-udp");
    let _udp6 = t.ext.udp_server("[fd00:50::100]:5353", "ext-udp6");
    for pod in &t.pods {
        let reply = pod
            .ns
            .tcp_connect("192.168.50.100:8080", SECOND)
            .expect_reply();
        assert_eq!(reply.server, "ext");
        assert_eq!(reply.src_ip(), pod.ip(), "no SNAT without the agent");

        let reply = pod
            .ns
            .udp_exchange("192.168.50.100:5353", SECOND)
            .expect_reply();
        assert_eq!((reply.src_ip(), reply.dscp()), (pod.ip(), Some(0)));
        assert!(pod.ns.ping("192.168.50.100"));
    }
    let v6 = t.pods[0].ip6().expect("pod1 is dual-stack");
    let reply = t.pods[0]
        .ns
        .tcp_connect("[fd00:50::100]:8080", SECOND)
        .expect_reply();
    assert_eq!(reply.src_ip(), v6);
    let reply = t.pods[0]
        .ns
        .udp_exchange("[fd00:50::100]:5353", SECOND)
        .expect_reply();
    assert_eq!((reply.src_ip(), reply.server.as_str()), (v6, "ext-udp6"));
    assert!(t.pods[0].ns.ping("fd00:50::100"));
}

#[test]
fn pod_to_pod_and_node_to_pod() {
    let t = topo();
    let _srv = t.pods[1].ns.tcp_server("0.0.0.0:80", "pod2");
    let reply = t.pods[0]
        .ns
        .tcp_connect("10.244.1.3:80", SECOND)
        .expect_reply();
    assert_eq!(reply.src_ip(), t.pods[0].ip());
    // Node-originated traffic uses the node's real address, not the pod gateway.
    let reply = t.node.tcp_connect("10.244.1.3:80", SECOND).expect_reply();
    assert_eq!(reply.src_ip(), "192.168.50.1".parse::<IpAddr>().unwrap());
}

#[test]
fn closed_port_is_refused_and_blackhole_times_out() {
    let t = topo();
    let pod = &t.pods[0].ns;
    assert_eq!(
        pod.tcp_connect("192.168.50.100:9", SECOND),
        Outcome::Refused
    );
    assert_eq!(
        pod.udp_exchange("192.168.50.100:9", SECOND),
        Outcome::Refused
    );
    t.ext.run(&["nft", "add table inet t; add chain inet t in { type filter hook input priority 0; tcp dport 9 drop; udp dport 9 drop; }"]);
    let short = Duration::from_millis(300);
    assert_eq!(pod.tcp_connect("192.168.50.100:9", short), Outcome::Timeout);
    assert_eq!(
        pod.udp_exchange("192.168.50.100:9", short),
        Outcome::Timeout
    );
    assert!(!pod.ping("192.168.50.99"), "nobody has that address");
}

#[test]
fn exec_errors_carry_stderr_and_enter_does_not_move_the_caller() {
    let t = topo();
    let err = t
        .lab
        .exec(&t.node, &["nft", "list", "table", "inet", "nope"])
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("nft list table inet nope") && text.contains("No such file"),
        "{text}"
    );

    let own_ns = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let forward = t
        .node
        .enter(|| std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward"));
    assert_eq!(forward.unwrap().trim(), "1", "node forwards");
    let inside = t
        .node
        .enter(|| std::fs::read_link("/proc/thread-self/ns/net").unwrap());
    assert_ne!(inside, own_ns);
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        own_ns
    );
    let host = t.ext.run(&["cat", "/proc/sys/net/ipv4/ip_forward"]);
    assert_eq!(host.trim(), "0", "external hosts do not forward");
}

#[test]
fn namespaces_are_deleted_on_drop() {
    let t = topo();
    let names = t.lab.namespaces();
    assert_eq!(names.len(), 5);
    assert!(
        names
            .iter()
            .all(|n| n.starts_with(t.lab.prefix()) && netns_exists(n))
    );
    drop(t);
    let left: Vec<_> = names.iter().filter(|n| netns_exists(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn namespaces_are_deleted_after_a_panic_and_a_failed_setup() {
    let mut names = Vec::new();
    let res = catch_unwind(AssertUnwindSafe(|| {
        let t = topo();
        names = t.lab.namespaces();
        panic!("test body fails");
    }));
    assert!(res.is_err());
    let mut names2 = Vec::new();
    let res = catch_unwind(AssertUnwindSafe(|| {
        let mut lab = Lab::new();
        let node = lab.add_node("node");
        lab.add_pod(&node, "good", &["10.0.0.1"]);
        names2 = lab.namespaces();
        names2.push(format!("{}-dup", lab.prefix()));
        // Its netns and veth exist before the duplicate node route makes setup panic.
        lab.add_pod(&node, "dup", &["10.0.0.1"]);
    }));
    assert!(res.is_err());
    assert_eq!((names.len(), names2.len()), (5, 3));
    names.extend(names2);
    let left: Vec<_> = names.iter().filter(|n| netns_exists(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn parallel_labs_do_not_collide() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let t = topo();
                let _srv = t.ext.tcp_server("0.0.0.0:8080", "ext");
                let reply = t.pods[1].ns.tcp_connect("192.168.50.100:8080", SECOND);
                assert_eq!(reply.expect_reply().src_ip(), t.pods[1].ip());
                t.lab.prefix().to_string()
            })
        })
        .collect();
    let mut prefixes: Vec<String> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    prefixes.sort();
    prefixes.dedup();
    assert_eq!(prefixes.len(), 4);
}

#[test]
fn agent_runs_inside_a_netns() {
    assert!(lab::agent_bin().is_file(), "{}", lab::agent_bin().display());
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let help = node.run_agent(&["--help"]).unwrap();
    assert!(help.contains("Usage"), "{help}");
    let err = node.run_agent(&["--no-such-flag"]).unwrap_err();
    assert!(err.stderr.contains("--no-such-flag"), "{err}");
    let mut agent = node.spawn_agent(&["--help"]);
    // Wait for the exit itself: the usage text is written a moment before it, and a stop in
    // between would end it with SIGTERM.
    lab::eventually(Duration::from_secs(5), || match agent.try_status() {
        Some(_) => Ok(()),
        None => Err(format!("still running: {:?}", agent.logs())),
    });
    let (status, logs) = agent.stop();
    assert!(
        status.success() && logs.contains("Usage"),
        "{status}: {logs}"
    );
}

#[test]
fn udp_server_reports_the_dscp_it_received() {
    let t = topo();
    let _v4 = t.ext.udp_server("0.0.0.0:5000", "v4");
    let _v6 = t.ext.udp_server("[fd00:50::100]:5000", "v6");
    let rules = "add table inet q
        add chain inet q post { type filter hook postrouting priority -150; }
        add rule inet q post ip dscp set 46
        add rule inet q post ip6 dscp set 10";
    t.node.exec_stdin(&["nft", "-f", "-"], rules).unwrap();
    let pod = &t.pods[0].ns;
    let reply = pod
        .udp_exchange("192.168.50.100:5000", SECOND)
        .expect_reply();
    assert_eq!((reply.server.as_str(), reply.dscp()), ("v4", Some(46)));
    let reply = pod
        .udp_exchange("[fd00:50::100]:5000", SECOND)
        .expect_reply();
    assert_eq!((reply.server.as_str(), reply.dscp()), ("v6", Some(10)));
}
