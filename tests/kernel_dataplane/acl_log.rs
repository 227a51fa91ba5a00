//! ACL logging (`k8s.ovn.org/acl-logging`) with real packets: the agent in run mode reads
//! NFLOG and writes one `ACL verdict` line per logged packet, within the kernel's rate limit.
//!
//! Node `node-1` forwards for pod `a1` (namespace `alpha`, annotated; dual-stack) and `b1`
//! (namespace `beta`, not annotated); both have the same EgressFirewall: allow 203.0.113.20
//! and 2001:db8::20, deny everything else. The external host serves TCP 80 and UDP 443 on
//! 203.0.113.10 and .20, and TCP 80 on 2001:db8::10 and ::20.

use nodeplane::acl_log::MESSAGE;
use nodeplane::testing::lab::{AgentProcess, Lab, ManifestAgent, Ns, Pod, Server, eventually};
use nodeplane::testing::objects;
use nodeplane::testing::stats::percentile;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const NODE: &str = "node-1";
const DENIED: &str = "203.0.113.10";
const ALLOWED: &str = "203.0.113.20";
const DENIED6: &str = "2001:db8::10";
const ALLOWED6: &str = "2001:db8::20";
const RULES: &str = "[{type: Allow, to: {cidrSelector: 203.0.113.20/32}}, \
    {type: Deny, to: {cidrSelector: 0.0.0.0/0}}, \
    {type: Allow, to: {cidrSelector: '2001:db8::20/128'}}, \
    {type: Deny, to: {cidrSelector: '::/0'}}]";
/// The default rate limit (OVN-Kubernetes' `acl-logging-rate-limit`), also the burst.
const RATE: u64 = 20;

struct Topo {
    node: Ns,
    a1: Pod,
    b1: Pod,
    manifests: ManifestAgent,
    agent: AgentProcess,
    _servers: Vec<Server>,
    _lab: Lab,
}

fn namespace(name: &str, acl_logging: Option<&str>) -> String {
    objects::namespace(name, &[])
        .acl_logging(acl_logging)
        .to_string()
}

fn topo(alpha_logging: &str) -> Topo {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let a1 = lab.add_pod(&node, "a1", &["10.128.0.5", "fd01::5"]);
    let b1 = lab.add_pod(&node, "b1", &["10.128.0.7"]);
    let ext = lab.add_uplink_host(&node, "ext");
    let hosts = [DENIED, ALLOWED, DENIED6, ALLOWED6];
    lab.add_uplink_addrs(&node, &ext, &hosts, &["203.0.113.0/24", "2001:db8::/32"]);
    let mut servers = Vec::new();
    for host in [DENIED, ALLOWED] {
        servers.push(ext.tcp_server(format!("{host}:80"), "ext"));
        servers.push(ext.udp_server(format!("{host}:443"), "ext"));
    }
    for host in [DENIED6, ALLOWED6] {
        servers.push(ext.tcp_server(format!("[{host}]:80"), "ext"));
    }
    let flags = [
        "--cluster-cidr",
        "10.128.0.0/14",
        "--cluster-cidr",
        "fd01::/48",
    ];
    let manifests = ManifestAgent::new(&node, NODE, &flags);
    let docs = [
        namespace("alpha", Some(alpha_logging)),
        namespace("beta", None),
        a1.manifest("alpha", "a1", NODE),
        b1.manifest("beta", "b1", NODE),
        objects::egress_firewall("alpha", RULES).to_string(),
        objects::egress_firewall("beta", RULES).to_string(),
    ];
    manifests.write("all.yaml", &docs.join("---\n"));
    let agent = manifests.spawn(&[]);
    let t = Topo {
        node,
        a1,
        b1,
        manifests,
        agent,
        _servers: servers,
        _lab: lab,
    };
    wait_for_reader(&t.node, &t.agent, "inet");
    t
}

/// Until the logged chains are in `node`'s table of `family` (`inet`, `bridge`) and the
/// agent's reader bound its group.
pub fn wait_for_reader(node: &Ns, agent: &AgentProcess, family: &str) {
    eventually(Duration::from_secs(30), || {
        let table = (node.exec(&["nft", "list", "table", family, "nodeplane"])).unwrap_or_default();
        let logs = agent.logs();
        if table.contains("log prefix \"acl:") && logs.contains("reading NFLOG group") {
            Ok(())
        } else {
            Err(format!("not ready:\n{logs}"))
        }
    });
}

/// The agent's ACL verdict lines so far.
pub fn acl_lines(agent: &AgentProcess) -> Vec<String> {
    let logs = agent.logs();
    logs.lines()
        .filter(|l| l.contains(MESSAGE))
        .map(String::from)
        .collect()
}

/// Waits until `want` lines are there, then a while longer to see that no more come:
/// panics (with `what`) unless there are exactly `want`.
#[track_caller]
pub fn settle(agent: &AgentProcess, want: usize, what: &str) -> Vec<String> {
    eventually(Duration::from_secs(20), || {
        let n = acl_lines(agent).len();
        (n >= want)
            .then_some(())
            .ok_or(format!("{n} lines, want {want}"))
    });
    std::thread::sleep(Duration::from_secs(1));
    let lines = acl_lines(agent);
    assert_eq!(lines.len(), want, "{what}: {lines:#?}");
    lines
}

/// Panics unless `line` has every one of `fields`.
#[track_caller]
pub fn assert_fields(line: &str, fields: &[&str]) {
    for want in fields {
        assert!(line.contains(want), "{want} missing in {line}");
    }
}

/// Waits for the first ACL line and panics unless it is the only one, a denial by `rule` of
/// `alpha`'s EgressFirewall `default`, with `more` fields; returns the lines.
#[track_caller]
fn assert_one_denial(agent: &AgentProcess, rule: &str, more: &[&str]) -> Vec<String> {
    let lines = settle(agent, 1, "ACL lines");
    let rule = format!("rule=\"{rule}\"");
    let denial = [
        "namespace=\"alpha\"",
        "kind=\"EgressFirewall\"",
        "object=\"default\"",
        &rule,
        "verdict=\"deny\"",
    ];
    assert_fields(&lines[0], &denial);
    assert_fields(&lines[0], more);
    lines
}

#[test]
fn a_denied_and_an_allowed_connection_each_log_one_line_naming_object_and_rule() {
    let t = topo(r#"{"deny": "warning", "allow": "info"}"#);
    // One SYN: the connect gives up before the first retransmission (1 s).
    let short = Duration::from_millis(500);
    assert!(
        !t.a1
            .ns
            .tcp_connect(format!("{DENIED}:80"), short)
            .is_reply()
    );
    let fields = [
        "severity=\"warning\"",
        "proto=tcp",
        "src=10.128.0.5",
        "dst=203.0.113.10",
        "dport=80",
        "WARN",
    ];
    assert_one_denial(&t.agent, "rule 1: Deny 0.0.0.0/0", &fields);
    // Allowed: the connection's first packet is judged (and logged), the rest are
    // established.
    assert!(
        t.a1.ns
            .tcp_connect(format!("{ALLOWED}:80"), short)
            .is_reply()
    );
    let lines = settle(&t.agent, 2, "ACL lines");
    assert!(
        lines[1].contains("verdict=\"allow\"")
            && lines[1].contains("rule=\"rule 0: Allow 203.0.113.20/32\"")
            && lines[1].contains("INFO"),
        "{}",
        lines[1]
    );
    // beta is not annotated: its verdicts are not logged.
    assert!(
        !t.b1
            .ns
            .tcp_connect(format!("{DENIED}:80"), short)
            .is_reply()
    );
    assert!(
        t.b1.ns
            .tcp_connect(format!("{ALLOWED}:80"), short)
            .is_reply()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(acl_lines(&t.agent).len(), 2, "{:#?}", acl_lines(&t.agent));
    let _ = &t.manifests;
}

/// IPv6: one denied connection of the dual-stack pod gives one line with its IPv6 5-tuple
/// (source port pinned, so the line can be checked whole).
#[test]
fn a_denied_ipv6_connection_logs_one_line_with_its_ipv6_five_tuple() {
    let t = topo(r#"{"deny": "warning"}"#);
    let src: SocketAddr = "[fd01::5]:40123".parse().unwrap();
    let dst: SocketAddr = format!("[{DENIED6}]:80").parse().unwrap();
    // One SYN: the connect gives up before the first retransmission (1 s).
    let outcome = (t.a1.ns).tcp_connect_from_port(src, dst, Duration::from_millis(300));
    assert!(!outcome.is_reply(), "denied: {outcome:?}");
    let fields = ["proto=tcp src=fd01::5 sport=40123 dst=2001:db8::10 dport=80"];
    let lines = assert_one_denial(&t.agent, "rule 3: Deny ::/0", &fields);
    // The IPv6 allow rule is not logged (allow has no severity here) and lets it through.
    let allowed = format!("[{ALLOWED6}]:80");
    assert!(
        t.a1.ns
            .tcp_connect(allowed, Duration::from_secs(5))
            .is_reply()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(acl_lines(&t.agent), lines);
}

/// Sends `count` UDP datagrams from `pod` to the denied host as fast as it can.
fn flood(pod: &Pod, count: u32) -> std::thread::JoinHandle<Duration> {
    pod.ns.spawn(move || {
        let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
        socket.connect(format!("{DENIED}:443")).expect("connect");
        let started = Instant::now();
        for _ in 0..count {
            // A full queue (ENOBUFS) drops a datagram: sent or not, it was an attempt.
            let _ = socket.send(b"x");
        }
        started.elapsed()
    })
}

/// `plan_ms + nft_ms + net_ms` of each `sync done` line in `logs`.
fn sync_times(logs: &str) -> Vec<f64> {
    logs.lines()
        .filter(|l| l.contains("sync done"))
        .map(|l| {
            ["plan_ms=", "nft_ms=", "net_ms="]
                .iter()
                .filter_map(|k| {
                    let v = l.split(k).nth(1)?.split_whitespace().next()?;
                    v.parse::<f64>().ok()
                })
                .sum()
        })
        .collect()
}

/// Replaces beta's firewall with one whose rule names `port`: one more plan and commit.
fn write_beta(t: &Topo, port: u32) {
    let rules = format!(
        "[{{type: Deny, to: {{cidrSelector: 198.51.100.0/24}}, ports: [{{protocol: TCP, port: {port}}}]}}]"
    );
    t.manifests.write(
        "beta-fw.yaml",
        &objects::egress_firewall("beta", &rules).to_string(),
    );
    std::thread::sleep(Duration::from_millis(200));
}

/// Prints p50/p99 of `syncs` (panics on none).
fn print_syncs(what: &str, mut syncs: Vec<f64>) {
    assert!(!syncs.is_empty(), "no sync {what}");
    syncs.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "syncs {what}: {}, p50 {:.1} ms, p99 {:.1} ms",
        syncs.len(),
        percentile(&syncs, 0.5),
        percentile(&syncs, 0.99)
    );
}

/// Floods from `pod` while writing beta's firewall every 200 ms (from `port` on, at least 5
/// times); returns the next port, the flood's length, and the sync times during it.
fn flood_and_sync(t: &Topo, pod: &Pod, mut port: u32) -> (u32, f64, Vec<f64>) {
    let before = sync_times(&t.agent.logs()).len();
    let started = Instant::now();
    let sender = flood(pod, 100_000);
    let first = port;
    while !sender.is_finished() || port < first + 5 {
        write_beta(t, port);
        port += 1;
    }
    let sent_in = sender.join().unwrap();
    let secs = started.elapsed().as_secs_f64();
    // The last write is applied: the agent kept syncing through the flood.
    let last = format!(". {} ", port - 1);
    eventually(Duration::from_secs(20), || {
        let table = t.node.run(&["nft", "list", "table", "inet", "nodeplane"]);
        table.contains(&last).then_some(()).ok_or(last.clone())
    });
    eprintln!("100000 datagrams sent in {:.2} s", sent_in.as_secs_f64());
    (port, secs, sync_times(&t.agent.logs())[before..].to_vec())
}

#[test]
fn a_flood_of_denied_packets_logs_at_most_the_rate_limit_and_syncs_go_on() {
    let t = topo(r#"{"deny": "alert"}"#);
    // Quiet syncs first, and a flood from the namespace that logs nothing, for comparison.
    let first = sync_times(&t.agent.logs()).len();
    let mut port = 1000;
    for _ in 0..8 {
        write_beta(&t, port);
        port += 1;
    }
    std::thread::sleep(Duration::from_secs(1));
    let quiet = sync_times(&t.agent.logs())[first..].to_vec();
    let (port, _, unlogged) = flood_and_sync(&t, &t.b1, port);
    assert!(
        acl_lines(&t.agent).is_empty(),
        "beta logs nothing: {:#?}",
        acl_lines(&t.agent)
    );
    let (_, flood_secs, logged) = flood_and_sync(&t, &t.a1, port);
    std::thread::sleep(Duration::from_secs(2));
    let lines = acl_lines(&t.agent);
    let bound = RATE + (RATE as f64 * (flood_secs + 1.0)).ceil() as u64;
    eprintln!("flood of alpha: {} log lines (bound {bound})", lines.len());
    assert!(!lines.is_empty(), "the flood was logged at all");
    assert!(
        lines.len() as u64 <= bound,
        "{} lines in {flood_secs:.1} s, more than the rate limit lets through ({bound})",
        lines.len()
    );
    print_syncs("quiet", quiet);
    print_syncs("during a flood from beta (not logged)", unlogged);
    print_syncs("during a flood from alpha (logged)", logged);
}

#[test]
fn network_policy_allow_and_isolation_deny_are_logged_with_the_policy_and_rule() {
    let t = topo(r#"{"deny": "warning", "allow": "info"}"#);
    let spec = "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - to:\n    \
        - ipBlock: {cidr: 203.0.113.20/32}\n    ports: [{protocol: TCP, port: 80}]\n";
    t.manifests.write(
        "np.yaml",
        &objects::network_policy("alpha", "web-out", spec).to_string(),
    );
    eventually(Duration::from_secs(30), || {
        let table = t.node.run(&["nft", "list", "table", "inet", "nodeplane"]);
        let logged_jump = table.contains("jump acl-");
        logged_jump.then_some(()).ok_or("no policy set".to_string())
    });
    let short = Duration::from_millis(500);
    // Allowed by the firewall (rule 0) and by the policy (egress[0]): two lines.
    assert!(
        t.a1.ns
            .tcp_connect(format!("{ALLOWED}:80"), short)
            .is_reply()
    );
    let lines = settle(&t.agent, 2, "ACL lines");
    let np = lines
        .iter()
        .find(|l| l.contains("kind=\"NetworkPolicy\""))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        np.contains("object=\"web-out\"")
            && np.contains("rule=\"egress[0]\"")
            && np.contains("verdict=\"allow\""),
        "{np}"
    );
    // One UDP datagram to 443 (each would be judged: a dropped first packet confirms no
    // flow): the firewall allows, the policy isolates: one allow and one deny line.
    t.a1.ns
        .spawn(|| {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
            socket
                .send_to(b"x", format!("{ALLOWED}:443"))
                .expect("send");
        })
        .join()
        .unwrap();
    let lines = settle(&t.agent, 4, "ACL lines");
    let deny = &lines[3];
    assert!(
        deny.contains("kind=\"NetworkPolicy\"")
            && deny.contains("rule=\"egress: isolated, no rule allows\"")
            && deny.contains("verdict=\"deny\"")
            && deny.contains("proto=udp"),
        "{lines:#?}"
    );
}
