//! Services against the kernel with real packets.
//!
//! Node `node-1` (192.168.1.1 towards `ext`, 192.168.2.1 towards `ext2`) forwards for the
//! client pod `c1` and the backend pods `b1`, `b2`, `b3` (TCP 8080 on IPv4 and IPv6, UDP
//! 5353). Endpoints say which node each backend is on, so `b1` is "local" and `b2`/`b3` are
//! "remote" for the traffic policies even though every pod hangs off this node.

use nodeplane::testing::lab::{Lab, ManifestAgent, Ns, Outcome, Pod, SECOND, Server, eventually};
use nodeplane::testing::objects::{self, Ep, endpoint_slice, ep, service_ips};
use std::collections::BTreeSet;
use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

pub(crate) const NODE: &str = "node-1";
pub(crate) const OTHER: &str = "node-2";
/// How long a probe that should be dropped waits.
pub(crate) const SHORT: Duration = Duration::from_millis(400);
pub(crate) const TCP_PORTS: &str = "{name: http, port: 8080, protocol: TCP}";

pub(crate) struct Topo {
    pub(crate) node: Ns,
    pub(crate) ext: Ns,
    pub(crate) ext2: Ns,
    pub(crate) c1: Pod,
    pub(crate) b1: Pod,
    pub(crate) b2: Pod,
    pub(crate) b3: Pod,
    pub(crate) agent: ManifestAgent,
    _servers: Vec<Server>,
    // Last: servers and agents must stop before the namespaces go.
    _lab: Lab,
}

pub(crate) fn topo() -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let c1 = lab.add_pod(&node, "c1", &["10.128.0.5", "fd01::5"]);
    let b1 = lab.add_pod(&node, "b1", &["10.128.0.11", "fd01::11"]);
    let b2 = lab.add_pod(&node, "b2", &["10.128.0.12", "fd01::12"]);
    let b3 = lab.add_pod(&node, "b3", &["10.128.0.13", "fd01::13"]);
    let ext = lab.add_uplink_host(&node, "ext");
    let ext2 = lab.add_host("ext2");
    lab.link(&node, &["192.168.2.1/24"], &ext2, &["192.168.2.100/24"]);
    lab.add_route(&ext2, "10.128.0.0/14", "192.168.2.1");
    lab.add_route(&ext2, "192.168.1.1/32", "192.168.2.1");
    for (host, gw) in [(&ext, "192.168.1.1"), (&ext2, "192.168.2.1")] {
        for net in ["172.30.0.0/16", "203.0.113.0/24"] {
            lab.add_route(host, net, gw);
        }
    }
    lab.add_route(&ext, "fd02::/112", "fd00:1::1");
    // Like a real node: a default route (the node reaches ClusterIPs, forwards external IPs).
    lab.add_route(&node, "default", "192.168.1.100");
    let mut servers = Vec::new();
    for (pod, tag) in [(&b1, "b1"), (&b2, "b2"), (&b3, "b3")] {
        servers.push(pod.ns.tcp_server("0.0.0.0:8080", tag));
        servers.push(pod.ns.tcp_server(format!("[{}]:8080", pod.addrs[1]), tag));
        servers.push(pod.ns.udp_server("0.0.0.0:5353", tag));
    }
    let agent = ManifestAgent::new(
        &node,
        NODE,
        &[
            "--cluster-cidr",
            "10.128.0.0/14,fd01::/48",
            "--service-cidr",
            "172.30.0.0/16,fd02::/112",
        ],
    );
    let t = Topo {
        node,
        ext,
        ext2,
        c1,
        b1,
        b2,
        b3,
        agent,
        _servers: servers,
        _lab: lab,
    };
    t.agent.write_own_node(&["192.168.1.1"]);
    t
}

impl Topo {
    pub(crate) fn v4(&self, pod: &Pod) -> String {
        pod.addrs[0].to_string()
    }
}

/// The servers that answered `n` TCP connections from `from` to `dst`.
pub(crate) fn tcp_servers(from: &Ns, dst: &str, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| from.tcp_connect(dst, SECOND).expect_reply().server)
        .collect()
}

pub(crate) fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `web` (dual-stack, three endpoints by port name, one local), `one` (one local endpoint,
/// numeric target port), `empty` (no endpoints), `dead` (none ready) and `headless`.
fn cluster_ip_services(t: &Topo) -> [String; 9] {
    let (b1, b2, b3) = (t.v4(&t.b1), t.v4(&t.b2), t.v4(&t.b3));
    [
        service_ips(
            "web",
            &["172.30.0.10", "fd02::10"],
            "{name: http, port: 80, protocol: TCP, targetPort: http}",
        )
        .to_string(),
        endpoint_slice(
            "web-v4",
            "web",
            "IPv4",
            TCP_PORTS,
            &[ep(&b1, NODE), ep(&b2, OTHER), ep(&b3, OTHER)],
        )
        .to_string(),
        endpoint_slice(
            "web-v6",
            "web",
            "IPv6",
            TCP_PORTS,
            &[
                ep("fd01::11", NODE),
                ep("fd01::12", OTHER),
                ep("fd01::13", OTHER),
            ],
        )
        .to_string(),
        service_ips(
            "one",
            &["172.30.0.11"],
            "{port: 81, protocol: TCP, targetPort: 8080}",
        )
        .to_string(),
        endpoint_slice(
            "one",
            "one",
            "IPv4",
            "{port: 8080, protocol: TCP}",
            &[ep(&b1, NODE)],
        )
        .to_string(),
        service_ips("empty", &["172.30.0.12"], "{port: 80, protocol: TCP}").to_string(),
        service_ips("dead", &["172.30.0.13"], "{port: 80, protocol: TCP}").to_string(),
        endpoint_slice(
            "dead",
            "dead",
            "IPv4",
            TCP_PORTS,
            &[ep(&b2, OTHER).ready(false)],
        )
        .to_string(),
        service_ips("headless", &["None"], "{port: 80, protocol: TCP}").to_string(),
    ]
}

#[test]
fn cluster_ip_balances_rejects_and_drops() {
    let t = topo();
    t.agent
        .write("services.yaml", &cluster_ip_services(&t).join("---\n"));
    t.agent.once(&[]);

    let c1 = &t.c1.ns;
    // Several endpoints: all of them answer, over many connections, on both families.
    assert_eq!(
        tcp_servers(c1, "172.30.0.10:80", 40),
        set(&["b1", "b2", "b3"])
    );
    assert_eq!(
        tcp_servers(c1, "[fd02::10]:80", 40),
        set(&["b1", "b2", "b3"])
    );
    // One endpoint, numeric target port; the pod's own address is seen (no masquerade).
    let r = c1.tcp_connect("172.30.0.11:81", SECOND).expect_reply();
    assert_eq!((r.server.as_str(), r.src_ip()), ("b1", t.c1.addrs[0]));
    // The node itself reaches a ClusterIP (nat-output).
    assert_eq!(
        t.node
            .tcp_connect("172.30.0.11:81", SECOND)
            .expect_reply()
            .server,
        "b1"
    );
    // Wrong port and wrong protocol on a ClusterIP: rejected, not left to time out.
    assert_eq!(c1.tcp_connect("172.30.0.10:81", SECOND), Outcome::Refused);
    assert_eq!(c1.udp_exchange("172.30.0.10:80", SECOND), Outcome::Refused);
    // No endpoints (none at all, or none ready): rejected.
    assert_eq!(c1.tcp_connect("172.30.0.12:80", SECOND), Outcome::Refused);
    assert_eq!(c1.tcp_connect("172.30.0.13:80", SECOND), Outcome::Refused);
    assert_eq!(
        t.node.tcp_connect("172.30.0.12:80", SECOND),
        Outcome::Refused
    );
    // An unallocated address in the service CIDR: dropped.
    assert_eq!(c1.tcp_connect("172.30.0.99:80", SHORT), Outcome::Timeout);
    // Hairpin: b1 reaches itself through the service, masqueraded so the reply returns.
    let r = t.b1.ns.tcp_connect("172.30.0.11:81", SECOND).expect_reply();
    assert_eq!(r.server, "b1");
    assert_ne!(
        r.src_ip(),
        t.b1.addrs[0],
        "hairpin traffic must be masqueraded"
    );
}

#[test]
fn nodeport_external_ip_and_load_balancer_source_ranges() {
    let t = topo();
    let (b1, b2) = (t.v4(&t.b1), t.v4(&t.b2));
    let lb = service_ips(
        "lb",
        &["172.30.0.21"],
        "{name: http, port: 80, protocol: TCP, nodePort: 30081}",
    )
    .spec("type: LoadBalancer, loadBalancerSourceRanges: ['192.168.1.0/24']")
    .lb_ingress(&["203.0.113.60"])
    .to_string();
    let docs = [
        service_ips(
            "np",
            &["172.30.0.20"],
            "{name: http, port: 80, protocol: TCP, nodePort: 30080}",
        )
        .spec("type: NodePort, externalIPs: ['203.0.113.50']")
        .to_string(),
        endpoint_slice(
            "np",
            "np",
            "IPv4",
            TCP_PORTS,
            &[ep(&b1, NODE), ep(&b2, OTHER)],
        )
        .to_string(),
        lb,
        endpoint_slice("lb", "lb", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
        service_ips(
            "np-empty",
            &["172.30.0.22"],
            "{port: 80, protocol: TCP, nodePort: 30082}",
        )
        .spec("type: NodePort, externalIPs: ['203.0.113.51']")
        .to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    // externalIPs are honoured only where allowed (none by default).
    t.agent
        .once(&["--external-ip-allowed-cidrs", "203.0.113.0/24"]);

    let ext_ip: IpAddr = "192.168.1.100".parse().unwrap();
    // NodePort from outside: answered, masqueraded (eTP=Cluster), by every endpoint.
    let r = t
        .ext
        .tcp_connect("192.168.1.1:30080", SECOND)
        .expect_reply();
    assert_ne!(
        r.src_ip(),
        ext_ip,
        "eTP=Cluster external traffic is masqueraded"
    );
    assert_eq!(
        tcp_servers(&t.ext, "192.168.1.1:30080", 30),
        set(&["b1", "b2"])
    );
    // Not on the node's other address: --nodeport-addresses defaults to the primary one
    // (the node's own stack answers there).
    assert_eq!(
        t.ext2.tcp_connect("192.168.2.1:30080", SECOND),
        Outcome::Refused
    );
    // externalIP.
    assert!(t.ext.tcp_connect("203.0.113.50:80", SECOND).is_reply());
    // LB IP: allowed source range answers, other sources are dropped...
    assert_eq!(
        t.ext
            .tcp_connect("203.0.113.60:80", SECOND)
            .expect_reply()
            .server,
        "b1"
    );
    assert_eq!(
        t.ext2.tcp_connect("203.0.113.60:80", SHORT),
        Outcome::Timeout
    );
    // ...but not on the NodePort, which source ranges do not cover.
    assert!(t.ext2.tcp_connect("192.168.1.1:30081", SECOND).is_reply());
    // No endpoints: NodePort and externalIP are rejected.
    assert_eq!(
        t.ext.tcp_connect("192.168.1.1:30082", SECOND),
        Outcome::Refused
    );
    assert_eq!(
        t.ext.tcp_connect("203.0.113.51:80", SECOND),
        Outcome::Refused
    );
}

#[test]
fn hostile_service_addresses_neither_break_the_node_nor_hijack_a_cluster_ip() {
    let t = topo();
    let (b1, b2) = (t.v4(&t.b1), t.v4(&t.b2));
    // The node's own services: one on loopback, one on every address.
    let _local = t.node.tcp_server("127.0.0.1:7000", "local");
    let _any = t.node.tcp_server("0.0.0.0:7001", "node");
    let port80 = "{name: http, port: 80, protocol: TCP}";
    let docs = [
        // A ClusterIP on loopback and one on the node's address.
        service_ips("lo", &["127.0.0.1"], port80).to_string(),
        endpoint_slice("lo", "lo", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
        service_ips("nodeip", &["192.168.1.1"], port80).to_string(),
        endpoint_slice("nodeip", "nodeip", "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
        // The victim, and a younger Service in another namespace (sorting first) whose
        // externalIP is the victim's ClusterIP.
        service_ips("db", &["172.30.0.30"], port80)
            .in_namespace("zz")
            .created("2024-01-01T00:00:00Z")
            .to_string(),
        endpoint_slice("db", "db", "IPv4", TCP_PORTS, &[ep(&b1, NODE)])
            .in_namespace("zz")
            .to_string(),
        service_ips("grab", &["172.30.0.31"], port80)
            .in_namespace("aa")
            .spec("externalIPs: ['172.30.0.30']")
            .created("2025-01-01T00:00:00Z")
            .to_string(),
        endpoint_slice("grab", "grab", "IPv4", TCP_PORTS, &[ep(&b2, OTHER)])
            .in_namespace("aa")
            .to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    // Even with every externalIP allowed, a ClusterIP is never taken over.
    let allow_all = ["--external-ip-allowed-cidrs", "0.0.0.0/0,::/0"];
    let mut dry = vec!["--dry-run"];
    dry.extend_from_slice(&allow_all);
    let printed = t
        .node
        .run_agent(&t.agent.args(&dry))
        .expect("agent --dry-run");
    for want in [
        "spec.clusterIPs[0]: 127.0.0.1 is a loopback address",
        "spec.clusterIPs[0]: 192.168.1.1 is an address of node node-1",
        "spec.externalIPs[0]: 172.30.0.30 is the ClusterIP of Service zz/db",
    ] {
        assert!(printed.contains(want), "{want:?} not in\n{printed}");
    }
    t.agent.once(&allow_all);

    // Loopback TCP from the node to another local port still connects.
    let r = t.node.tcp_connect("127.0.0.1:7000", SECOND).expect_reply();
    assert_eq!(r.server, "local");
    // External TCP to the node's address on another port still connects.
    let r = t.ext.tcp_connect("192.168.1.1:7001", SECOND).expect_reply();
    assert_eq!(r.server, "node");
    // A pod's connection to the victim's ClusterIP reaches the victim's endpoint only.
    assert_eq!(tcp_servers(&t.c1.ns, "172.30.0.30:80", 20), set(&["b1"]));
    // The hijacker keeps its own ClusterIP.
    assert_eq!(tcp_servers(&t.c1.ns, "172.30.0.31:80", 5), set(&["b2"]));
}

#[test]
fn affinity_and_traffic_policies() {
    let t = topo();
    let (b1, b2, b3) = (t.v4(&t.b1), t.v4(&t.b2), t.v4(&t.b3));
    let all = [ep(&b1, NODE), ep(&b2, OTHER), ep(&b3, OTHER)];
    let docs = [
        service_ips(
            "sticky",
            &["172.30.0.30"],
            "{name: http, port: 80, protocol: TCP}",
        )
        .spec("sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}")
        .to_string(),
        endpoint_slice("sticky", "sticky", "IPv4", TCP_PORTS, &all).to_string(),
        service_ips(
            "local",
            &["172.30.0.31"],
            "{name: http, port: 80, protocol: TCP, nodePort: 30090}",
        )
        .spec("type: NodePort, externalTrafficPolicy: Local, healthCheckNodePort: 32090")
        .to_string(),
        endpoint_slice("local", "local", "IPv4", TCP_PORTS, &all).to_string(),
        service_ips(
            "itp",
            &["172.30.0.32"],
            "{name: http, port: 80, protocol: TCP}",
        )
        .spec("internalTrafficPolicy: Local")
        .to_string(),
        endpoint_slice(
            "itp",
            "itp",
            "IPv4",
            TCP_PORTS,
            &[ep(&b2, OTHER), ep(&b3, OTHER)],
        )
        .to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    t.agent.once(&[]);

    // Session affinity: one client stays on one backend.
    let seen = tcp_servers(&t.c1.ns, "172.30.0.30:80", 20);
    assert_eq!(seen.len(), 1, "{seen:?}");
    // eTP=Local: external clients reach only this node's endpoint and keep their source.
    for _ in 0..10 {
        let r = t
            .ext
            .tcp_connect("192.168.1.1:30090", SECOND)
            .expect_reply();
        assert_eq!(r.server, "b1");
        assert_eq!(r.src_ip(), "192.168.1.100".parse::<IpAddr>().unwrap());
    }
    // ...while pods still reach every endpoint through the ClusterIP and the NodePort.
    assert_eq!(
        tcp_servers(&t.c1.ns, "172.30.0.31:80", 40),
        set(&["b1", "b2", "b3"])
    );
    assert_eq!(
        tcp_servers(&t.c1.ns, "192.168.1.1:30090", 40),
        set(&["b1", "b2", "b3"])
    );
    // iTP=Local with no local endpoint: dropped.
    assert_eq!(
        t.c1.ns.tcp_connect("172.30.0.32:80", SHORT),
        Outcome::Timeout
    );
}

/// A UDP socket bound in `ns` with a fixed source port, so every exchange is one flow.
fn udp_flow(ns: &Ns) -> UdpSocket {
    ns.enter(|| {
        let s = UdpSocket::bind("0.0.0.0:40000").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    })
}

/// Sends on the flow until a reply comes (or the deadline); returns the server tag.
fn udp_ask(sock: &UdpSocket, dst: &str, within: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + within;
    let mut buf = [0u8; 256];
    while std::time::Instant::now() < deadline {
        sock.send_to(b"lab", dst).unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            return text.split_whitespace().next().map(str::to_string);
        }
    }
    None
}

/// Writes `service` (named `dns`) and its slice of `eps`, whose ports are `dns` 5353/UDP
/// and `http` 8080/TCP.
fn write_dns_service(t: &Topo, service: objects::Service, eps: &[Ep]) {
    let slice = endpoint_slice(
        "dns",
        "dns",
        "IPv4",
        "{name: dns, port: 5353, protocol: UDP}, {name: http, port: 8080, protocol: TCP}",
        eps,
    );
    let docs = [service.to_string(), slice.to_string()];
    t.agent.write("services.yaml", &docs.join("---\n"));
}

#[test]
pub(crate) fn removed_endpoint_gets_no_new_connections_and_its_udp_flow_moves() {
    let t = topo();
    let (b1, b2) = (t.v4(&t.b1), t.v4(&t.b2));
    let write = |eps: &[Ep]| {
        let ports = "{name: dns, port: 53, protocol: UDP}, {name: http, port: 80, protocol: TCP}";
        write_dns_service(&t, service_ips("dns", &["172.30.0.40"], ports), eps);
    };
    write(&[ep(&b1, NODE)]);
    let agent = t.agent.spawn(&[]);
    let flow = udp_flow(&t.c1.ns);
    let first = eventually(Duration::from_secs(10), || {
        udp_ask(&flow, "172.30.0.40:53", SECOND).ok_or_else(|| "no UDP reply".to_string())
    });
    assert_eq!(first, "b1");
    // b1 goes away (its server still runs: only conntrack cleanup moves the flow).
    write(&[ep(&b2, OTHER)]);
    eventually(Duration::from_secs(10), || {
        match t.c1.ns.tcp_connect("172.30.0.40:80", SECOND) {
            Outcome::Reply(r) if r.server == "b2" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(tcp_servers(&t.c1.ns, "172.30.0.40:80", 20), set(&["b2"]));
    let moved = eventually(Duration::from_secs(5), || {
        match udp_ask(&flow, "172.30.0.40:53", SECOND) {
            Some(s) if s == "b2" => Ok(s),
            other => Err(format!("UDP flow still answered by {other:?}")),
        }
    });
    assert_eq!(moved, "b2");
    // kube-proxy's conntrack reconciler series saw the deletion, under its family.
    let admin = "127.0.0.1:9942".parse().unwrap();
    let deleted = |family: &str| {
        let name = format!(
            "kubeproxy_conntrack_reconciler_deleted_entries_total{{ip_family=\"{family}\"}}"
        );
        agent.metric(admin, &name)
    };
    eventually(Duration::from_secs(10), || match deleted("IPv4") {
        Some(n) if n >= 1.0 => Ok(()),
        other => Err(format!("IPv4 conntrack deletions: {other:?}")),
    });
    assert_eq!(deleted("IPv6"), Some(0.0));
}

/// `GET path` over HTTP from `ns`: (status code, body).
pub(crate) fn http_get(ns: &Ns, addr: &str, path: &str) -> Result<(u16, String), String> {
    ns.http_get(addr.parse().unwrap(), path, SECOND)
}

/// `GET /` on a health-check port: (status code, JSON body).
pub(crate) fn health(ns: &Ns, addr: &str) -> Result<(u16, serde_json::Value), String> {
    let (code, body) = http_get(ns, addr, "/")?;
    let json = serde_json::from_str(&body).map_err(|e| format!("{e}: {body:?}"))?;
    Ok((code, json))
}

/// A `LoadBalancer` service `default/local` with `externalTrafficPolicy: Local`, NodePort
/// 30095 and health-check port 32095, and its slice with `eps`.
pub(crate) fn write_local_lb(t: &Topo, eps: &[Ep]) {
    let docs = [
        service_ips(
            "local",
            &["172.30.0.50"],
            "{name: http, port: 80, protocol: TCP, nodePort: 30095}",
        )
        .spec("type: LoadBalancer, externalTrafficPolicy: Local, healthCheckNodePort: 32095")
        .to_string(),
        endpoint_slice("local", "local", "IPv4", TCP_PORTS, eps).to_string(),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
}

/// Waits until the health-check port 32095 answers `code` with `local` endpoints; its body.
pub(crate) fn expect_health(t: &Topo, code: u16, local: u64) -> serde_json::Value {
    eventually(Duration::from_secs(10), || {
        match health(&t.ext, "192.168.1.1:32095") {
            Ok((c, body)) if c == code && body["localEndpoints"] == local => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
}

/// The health-check port counts this node's *ready* endpoints: with only a terminating one
/// left the node fails the check (load balancers drain it) while that endpoint still serves
/// the connections that arrive (kube-proxy's TestHealthCheckNodePortWhenTerminating).
#[test]
pub(crate) fn health_check_node_port_counts_ready_local_endpoints() {
    let t = topo();
    let (b1, b2) = (t.v4(&t.b1), t.v4(&t.b2));
    let write = |eps: &[Ep]| write_local_lb(&t, eps);
    let expect = |code: u16, local: u64| expect_health(&t, code, local);
    write(&[ep(&b1, NODE), ep(&b2, OTHER)]);
    let agent = t.agent.spawn(&[]);
    let body = expect(200, 1);
    assert_eq!(
        body,
        serde_json::json!({"service": {"namespace": "default", "name": "local"},
            "localEndpoints": 1, "serviceProxyHealthy": true})
    );
    write(&[ep(&b1, NODE).terminating(), ep(&b2, OTHER)]);
    let body = expect(503, 0);
    assert_eq!(body["serviceProxyHealthy"], true, "{body}");
    // Draining, not dropping: the terminating local endpoint still answers the NodePort.
    let served = tcp_servers(&t.ext, "192.168.1.1:30095", 3);
    assert_eq!(served, set(&["b1"]));
    write(&[ep(&b2, OTHER)]);
    expect(503, 0);
    // kube-proxy's series say so: the one port of the eTP=Local service has no local
    // endpoint; the start-up sync was a full one, the endpoint changes partial ones.
    let admin = "127.0.0.1:9942".parse().unwrap();
    let series = |name: &str| agent.metric(admin, name);
    eventually(Duration::from_secs(10), || {
        let name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv4\"}";
        match series(name) {
            Some(1.0) => Ok(()),
            other => Err(format!("{name}: {other:?}")),
        }
    });
    let count = |kind: &str| {
        let name = format!(
            "kubeproxy_sync_{kind}_proxy_rules_duration_seconds_count{{ip_family=\"IPv4\"}}"
        );
        series(&name).unwrap_or_else(|| panic!("{name} not served"))
    };
    assert!(count("full") >= 1.0, "no full sync");
    assert!(
        count("partial") >= 2.0,
        "endpoint changes were not partial syncs"
    );
}

/// kube-proxy's node-level health on `--healthz-bind-address` (default 0.0.0.0:10256, both
/// families): `/healthz` fails while the Node is tainted ToBeDeletedByClusterAutoscaler or
/// being deleted, `/livez` does not.
#[test]
fn proxy_healthz_follows_node_eligibility() {
    let t = topo();
    let _agent = t.agent.spawn(&[]);
    let get = |addr: &str, path: &str, code: u16| {
        eventually(Duration::from_secs(10), || {
            match http_get(&t.ext, addr, path) {
                Ok((c, body)) if c == code => serde_json::from_str::<serde_json::Value>(&body)
                    .map_err(|e| format!("{e}: {body}")),
                other => Err(format!("{path}: {other:?}")),
            }
        })
    };
    for addr in ["192.168.1.1:10256", "[fd00:1::1]:10256"] {
        let body = get(addr, "/healthz", 200);
        assert_eq!(body["nodeEligible"], true, "{body}");
        assert_eq!(body["lastUpdated"], body["currentTime"], "{body}");
        get(addr, "/livez", 200);
    }
    let node = objects::node(NODE, &["192.168.1.1"]);
    t.agent.write(
        "nodes.yaml",
        &node
            .clone()
            .taint("ToBeDeletedByClusterAutoscaler")
            .to_string(),
    );
    let body = get("192.168.1.1:10256", "/healthz", 503);
    assert_eq!(body["nodeEligible"], false, "{body}");
    get("192.168.1.1:10256", "/livez", 200);
    t.agent.write("nodes.yaml", &node.to_string());
    get("192.168.1.1:10256", "/healthz", 200);
    t.agent.write("nodes.yaml", &node.deleting().to_string());
    get("192.168.1.1:10256", "/healthz", 503);
    get("192.168.1.1:10256", "/livez", 200);
}

/// A UDP flow to a NodePort that is not programmed yet gets a conntrack entry the node answers
/// itself (never DNATed); it must go once the first endpoint comes, or the flow keeps
/// missing the service for as long as it sends. Datagrams rejected for want of endpoints
/// leave no entry (checked on the ClusterIP and the NodePort of the same socket).
#[test]
fn udp_flow_sent_before_the_first_endpoint_reaches_it() {
    let t = topo();
    let b1 = t.v4(&t.b1);
    let write = |eps: &[Ep]| {
        let ports = "{name: dns, port: 53, protocol: UDP, nodePort: 30053}, \
                     {name: http, port: 80, protocol: TCP, nodePort: 30054}";
        let service = service_ips("dns", &["172.30.0.41"], ports).spec("type: NodePort");
        write_dns_service(&t, service, eps);
    };
    // No service yet: the node answers the NodePort datagrams itself (port unreachable).
    t.agent.once(&[]);
    let flow = udp_flow(&t.c1.ns);
    assert_eq!(udp_ask(&flow, "192.168.1.1:30053", SHORT), None);
    let _agent = t.agent.spawn(&[]);
    write(&[]);
    eventually(Duration::from_secs(10), || {
        match t.c1.ns.tcp_connect("172.30.0.41:80", SECOND) {
            Outcome::Refused => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // The flows' next datagrams find no endpoint.
    assert_eq!(udp_ask(&flow, "172.30.0.41:53", SHORT), None);
    assert_eq!(udp_ask(&flow, "192.168.1.1:30053", SHORT), None);
    write(&[ep(&b1, NODE)]);
    eventually(Duration::from_secs(10), || {
        match t.c1.ns.tcp_connect("172.30.0.41:80", SECOND) {
            Outcome::Reply(r) if r.server == "b1" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // The same socket (same 5-tuples) now reaches the endpoint.
    for dst in ["172.30.0.41:53", "192.168.1.1:30053"] {
        let answered = eventually(Duration::from_secs(5), || {
            udp_ask(&flow, dst, SECOND).ok_or_else(|| format!("no UDP reply from {dst}"))
        });
        assert_eq!(answered, "b1", "{dst}");
    }
}
