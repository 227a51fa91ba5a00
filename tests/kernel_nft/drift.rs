//! Drift of `table inet nodeplane` against the kernel: someone else deletes the table, flushes
//! the ruleset or one of our chains, deletes a map element or inserts a rule into our chain,
//! and the agent in run mode (nftables notifications, `src/nft/monitor.rs`) repairs it at once.
//!
//! Node `node-1` forwards for pod `a1` (namespace `alpha`, EgressFirewall denying 203.0.113.20)
//! and backend pod `b1` (namespace `beta`, behind three ClusterIP services). The external host
//! owns 203.0.113.10 and 203.0.113.20 behind 192.168.1.100, with a TCP server on port 80 of
//! each. The node netns also holds someone else's `table inet other` with a rule.
//!
//! Times are printed, never asserted (`cargo test --test kernel_nft drift:: -- --nocapture`); the
//! p50/p99 over many drifts is `cargo bench --bench drift`.

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};
// The agent's default admin address, on the node netns' own loopback.
use nodeplane::config::DEFAULT_ADMIN_ADDRESS as ADMIN;
use nodeplane::nft::monitor::{DEFAULT_RCVBUF, Drift, Monitor};
use nodeplane::nft::names::object_name;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::{Engine, TABLE_NAME};
use nodeplane::testing::lab::{
    self, AgentProcess, Lab, Monitored, NODE, NodeLab, Ns, Pod, eventually, run_cmd,
};
use nodeplane::testing::large;
use nodeplane::testing::listing;
use nodeplane::testing::netlink::{attr, nfnl_msg};
use nodeplane::testing::objects::{self, endpoint_slice, ep, service_ips};
use serde_json::Value as Json;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const H10: &str = "203.0.113.10";
const H20: &str = "203.0.113.20";
const SERVICE: &str = "172.30.0.10:80";
/// How long a probe that should be dropped waits.
const SHORT: Duration = Duration::from_millis(400);
const WAIT: Duration = Duration::from_secs(10);
const FOREIGN_TABLE: &str = "table inet other {\n\tchain input {\n\t\t\
    type filter hook input priority 0; policy accept;\n\t\ttcp dport 9999 counter accept\n\t}\n}\n";

struct Topo {
    a1: Pod,
    site: NodeLab,
}

fn topo() -> Topo {
    let flags = [
        "--cluster-cidr",
        "10.128.0.0/14",
        "--service-cidr",
        "172.30.0.0/16",
    ];
    let mut site = NodeLab::new(&flags).with_hosts(&[H10, H20], &["203.0.113.0/24"]);
    let a1 = site.pod("a1", &["10.128.0.5"]);
    let b1 = site.pod("b1", &["10.128.0.11"]);
    site.servers = vec![
        site.ext.tcp_server(format!("{H10}:80"), "h10"),
        site.ext.tcp_server(format!("{H20}:80"), "h20"),
        b1.ns.tcp_server("0.0.0.0:8080", "b1"),
    ];
    site.node
        .exec_stdin(&["nft", "-f", "-"], FOREIGN_TABLE)
        .expect("someone else's table");
    let t = Topo { a1, site };
    t.site.agent.write_own_node(&["192.168.1.1"]);
    t.site.agent.write(
        "pods.yaml",
        &[
            pod_doc("alpha", "a1", "10.128.0.5"),
            pod_doc("beta", "b1", "10.128.0.11"),
        ]
        .join("---\n"),
    );
    t.write_firewall(&[H20]);
    let mut services = Vec::new();
    for i in 0..3 {
        let name = format!("web{i}");
        let ip = format!("172.30.0.{}", 10 + i);
        let port = "{name: http, port: 80, targetPort: 8080, protocol: TCP}";
        services.push(service_ips(&name, &[&ip], port).to_string());
        services.push(
            endpoint_slice(
                &format!("{name}-1"),
                &name,
                "IPv4",
                "{name: http, port: 8080, protocol: TCP}",
                &[ep("10.128.0.11", NODE)],
            )
            .to_string(),
        );
    }
    t.site.agent.write("services.yaml", &services.join("---\n"));
    t
}

fn pod_doc(ns: &str, name: &str, ip: &str) -> String {
    objects::pod(ns, name).on(NODE).ips(&[ip]).to_string()
}

impl Topo {
    /// Namespace `alpha`'s EgressFirewall: deny each host.
    fn write_firewall(&self, denied: &[&str]) {
        let rules: Vec<String> = denied
            .iter()
            .map(|h| format!("{{type: Deny, to: {{cidrSelector: {h}/32}}}}"))
            .collect();
        self.site.agent.write(
            "fw-alpha.yaml",
            &format!(
                "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\n\
                 metadata: {{name: default, namespace: alpha}}\nspec:\n  egress: [{}]\n",
                rules.join(", ")
            ),
        );
    }

    /// The agent in run mode, once its first sync made the firewall and services work.
    fn spawn(&self) -> AgentProcess {
        let agent = self.site.agent.spawn(&[]);
        wait_admin(&self.site.node, "/readyz", 200, "drift repairs: 0");
        eventually(WAIT, || self.check_traffic());
        agent
    }

    /// The denied host is refused, the allowed one and a service answer.
    fn check_traffic(&self) -> Result<(), String> {
        let ok = |dst: &str| self.a1.ns.tcp_connect(dst, SHORT).is_reply();
        match (
            ok(&format!("{H20}:80")),
            ok(&format!("{H10}:80")),
            ok(SERVICE),
        ) {
            (false, true, true) => Ok(()),
            got => Err(format!(
                "(denied host answers, allowed host answers, service answers) = {got:?}"
            )),
        }
    }
}

/// `GET path` on the agent's admin server in `ns`: (status, body).
fn admin_get(ns: &Ns, path: &str) -> Result<(u16, String), String> {
    ns.http_get(ADMIN.parse().unwrap(), path, Duration::from_secs(5))
}

#[track_caller]
fn wait_admin(ns: &Ns, path: &str, code: u16, needle: &str) -> String {
    ns.wait_http(ADMIN.parse().unwrap(), path, code, needle, WAIT)
}

/// The sum of every sample of metric `name` (all label values).
fn metric_sum(ns: &Ns, name: &str) -> f64 {
    let (_, body) = admin_get(ns, "/metrics").expect("metrics");
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A listing in a canonical order: objects sorted, elements sorted, rules kept in order
/// within their chain (handles, counters and timers dropped by `listing::json`).
fn canonical(mut v: Json) -> Vec<String> {
    sort_elements(&mut v);
    let mut position = std::collections::HashMap::new();
    let mut out: Vec<String> = v["nftables"]
        .as_array()
        .expect("nftables array")
        .iter()
        .map(|item| match item.get("rule") {
            Some(rule) => {
                let chain = rule["chain"].as_str().unwrap_or_default().to_string();
                let n = position.entry(chain.clone()).or_insert(0);
                *n += 1;
                format!("rule {chain} #{n:04}: {item}")
            }
            None => item.to_string(),
        })
        .collect();
    out.sort();
    out
}

fn sort_elements(v: &mut Json) {
    match v {
        Json::Object(map) => {
            if let Some(Json::Array(elems)) = map.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
            map.values_mut().for_each(sort_elements);
        }
        Json::Array(items) => items.iter_mut().for_each(sort_elements),
        _ => {}
    }
}

/// Our table now, canonical; None if it does not exist. `nft` runs from a thread inside the
/// netns (no `ip netns exec`), so a poll costs one `nft` process.
fn table_now(ns: &Ns) -> Option<Vec<String>> {
    let out = ns.enter(|| run_cmd(&["nft", "-j", "list", "table", "inet", TABLE_NAME], None));
    let mut v: Json = serde_json::from_str(&out.ok()?).ok()?;
    if let Some(items) = v.get_mut("nftables").and_then(Json::as_array_mut) {
        items.retain(|i| i.get("metainfo").is_none());
    }
    listing::scrub(&mut v);
    Some(canonical(v))
}

/// Polls (every 2 ms plus one `nft` listing) until our table equals `expected`; returns the
/// time since `since`.
#[track_caller]
fn wait_repaired(ns: &Ns, expected: &[String], since: Instant, agent: &AgentProcess) -> Duration {
    loop {
        let now = table_now(ns);
        if now.as_deref() == Some(expected) {
            return since.elapsed();
        }
        if since.elapsed() > WAIT {
            let now = now.unwrap_or_default();
            let missing: Vec<&String> = expected.iter().filter(|l| !now.contains(l)).collect();
            let extra: Vec<&String> = now.iter().filter(|l| !expected.contains(l)).collect();
            panic!(
                "table not repaired after {WAIT:?}\nmissing: {missing:#?}\nextra: {extra:#?}\n\
                 agent logs:\n{}",
                agent.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
pub(crate) fn each_drift_is_repaired_at_once_and_other_tables_are_untouched() {
    // Repair latency is part of what these tests check: no other lab runs meanwhile.
    let _alone = lab::exclusive();
    let t = topo();
    let agent = t.spawn();
    let expected = table_now(&t.site.node).expect("our table");
    let other = listing::json(&t.site.node, "other");
    let fw_map = format!("{}-v4", object_name("fw", "alpha"));
    // (command, what the agent's warning names)
    let cases = [
        (
            format!("delete table inet {TABLE_NAME}"),
            "table deleted".to_string(),
        ),
        (
            format!("flush chain inet {TABLE_NAME} fw-dispatch"),
            "changed by someone else: chain fw-dispatch ".into(),
        ),
        (
            format!("delete element inet {TABLE_NAME} {fw_map} {{ {H20} }}"),
            // One interval element is two kernel entries (start and end).
            format!("set {fw_map} 2 elements deleted"),
        ),
        (
            format!(
                "delete element inet {TABLE_NAME} svc-dispatch-v4-10 {{ 172.30.0.10 . tcp . 80 }}"
            ),
            "set svc-dispatch-v4-10 1 element deleted".into(),
        ),
        (
            format!("insert rule inet {TABLE_NAME} fw-dispatch accept"),
            "chain fw-dispatch 1 rule added".into(),
        ),
        // Last: it also deletes `table inet other`.
        ("flush ruleset".to_string(), "table deleted".into()),
    ];
    for (i, (command, named)) in cases.iter().enumerate() {
        let log_before = agent.logs().len();
        t.site
            .node
            .nft(&[command])
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        let returned = Instant::now();
        let took = wait_repaired(&t.site.node, &expected, returned, &agent);
        eprintln!("`nft {command}`: table repaired {took:?} after the command returned");
        eventually(WAIT, || t.check_traffic());
        let repairs = format!("drift repairs: {}", i + 1);
        wait_admin(&t.site.node, "/readyz", 200, &repairs);
        let logs = agent.logs();
        let warning = logs[log_before..]
            .lines()
            .find(|l| l.contains("changed by someone else"))
            .unwrap_or_else(|| panic!("no drift warning after `{command}`:\n{logs}"));
        assert!(warning.contains(named), "{warning}");
        assert!(warning.contains("(by nft (pid "), "{warning}");
        if command == "flush ruleset" {
            // `flush ruleset` deletes every table: someone else's too. Only ours comes back.
            assert!(
                t.site
                    .node
                    .nft(&["list", "table", "inet", "other"])
                    .is_err()
            );
        } else {
            assert_eq!(
                listing::json(&t.site.node, "other"),
                other,
                "after `{command}`"
            );
        }
    }
    // Each drift was one detection and one repair; the agent's own syncs were none.
    let n = cases.len() as f64;
    assert_eq!(
        metric_sum(&t.site.node, "nodeplane_drift_detected_total"),
        n
    );
    assert_eq!(metric_sum(&t.site.node, "nodeplane_drift_repairs_total"), n);
    let last = metric_sum(&t.site.node, "nodeplane_drift_last_repair_duration_seconds");
    assert!(last > 0.0, "{last}");
    eprintln!(
        "agent's own measure of the last repair (detection to end of sync): {:.1} ms",
        last * 1e3
    );
    let logs = agent.stop_ok();
    assert_eq!(
        logs.matches("changed by someone else").count(),
        cases.len(),
        "one warning per repair:\n{logs}"
    );
}

#[test]
fn a_manifest_change_right_after_a_drift_applies() {
    // Repair latency is part of what these tests check: no other lab runs meanwhile.
    let _alone = lab::exclusive();
    let mut t = topo();
    let agent = t.spawn();
    t.site
        .node
        .nft(&["delete", "table", "inet", TABLE_NAME])
        .expect("delete table");
    t.write_firewall(&[H20, H10]);
    let refused = |dst: &str| !t.a1.ns.tcp_connect(dst, SHORT).is_reply();
    eventually(WAIT, || {
        match (refused(&format!("{H10}:80")), refused(&format!("{H20}:80"))) {
            (true, true) => Ok(()),
            got => Err(format!("(H10 refused, H20 refused) = {got:?}")),
        }
    });
    assert!(t.a1.ns.tcp_connect(SERVICE, SHORT).is_reply(), "service");
    wait_admin(&t.site.node, "/readyz", 200, "drift repairs: 1");
    // The kernel holds exactly what `--dry-run` prints for the new manifests.
    let (_, reference) = t.site.dry_run_reference();
    assert_eq!(table_now(&t.site.node), table_now(&reference));
    agent.stop_ok();
}

/// A table of `large::large_table` shape with `elements` map elements.
fn table(elements: u32) -> nodeplane::nft::Table {
    large::large_table(20, elements)
}

#[test]
fn the_monitor_reports_others_commits_to_our_table_only() {
    let m = Monitored::start("mon", DEFAULT_RCVBUF);
    // The agent's own commits, from two threads other than the monitor's (the kernel names
    // each sending thread; the socket is what makes them ours).
    let engine = Engine::new(NftnlBackend::new());
    let mut engine = m.ns.enter(move || {
        let mut engine = engine;
        engine.sync(table(2000)).expect("first apply");
        engine
    });
    m.ns.enter(|| engine.sync(table(2001)).expect("second apply"));
    // Someone else's table: not ours.
    m.ns.nft(&["add table inet other"]).unwrap();
    m.ns.nft(&["add chain inet other c"]).unwrap();
    // Someone else's change to ours.
    m.ns.nft(&[&format!("add rule inet {TABLE_NAME} svc-3 accept")])
        .unwrap();
    let d = m.rx.recv_timeout(WAIT).expect("a drift report");
    let text = d.to_string();
    assert!(
        text.starts_with("chain svc-3 1 rule added (by nft (pid "),
        "{text}"
    );
    assert!(!d.events_lost);
    // Reports come in commit order: nothing was reported for the commits before it.
    assert!(m.rx.try_recv().is_err());
    let stats = m.monitor.stats();
    use std::sync::atomic::Ordering::Relaxed;
    assert!(stats.own_commits.load(Relaxed) >= 2);
    assert_eq!(stats.foreign_commits.load(Relaxed), 1);
    assert_eq!(stats.overruns.load(Relaxed), 0);
    eprintln!(
        "notifications read: {} messages, {} bytes",
        stats.messages.load(Relaxed),
        stats.bytes.load(Relaxed)
    );
    m.monitor.stop();
}

#[test]
fn lost_notifications_are_reported_as_a_possible_drift() {
    // A buffer far too small for the notifications of a 50,000-element apply.
    let m = Monitored::start("mon", 4096);
    // The reader sometimes keeps up even so (the sender is preempted, the reader drains):
    // apply and remove 50,000 elements until an overrun happens.
    let mut engine = Engine::new(NftnlBackend::new());
    let stats = m.monitor.stats();
    let mut report = None;
    for round in 0..10 {
        let elements = if round % 2 == 0 { 50_000 } else { 1 };
        m.ns.enter(|| engine.sync(table(elements)).expect("apply"));
        if let Ok(d) = m.rx.recv_timeout(Duration::from_millis(500)) {
            report = Some(d);
            break;
        }
    }
    let d =
        report.unwrap_or_else(|| panic!("no report of lost notifications; monitor read {stats:?}"));
    assert!(d.events_lost, "{d}");
    assert_eq!(d.object(), "unknown");
    assert!(stats.overruns.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    m.monitor.stop();
}

// --- The table `owner` and `persist` flags (NFT_TABLE_F_OWNER = 2, NFT_TABLE_F_PERSIST = 4,
// kernel >= 6.9), sent over raw netlink: nft 1.0.6 cannot set `persist`.

const NFT_TABLE_F_OWNER: u32 = 2;
const NFT_TABLE_F_PERSIST: u32 = 4;

/// A NETLINK_NETFILTER socket that sends one-message nf_tables batches.
struct RawNft {
    fd: OwnedFd,
}

impl RawNft {
    fn open(ns: &Ns) -> RawNft {
        ns.enter(|| {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkNetFilter,
            )
            .expect("netlink socket");
            bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).expect("bind");
            RawNft { fd }
        })
    }

    /// `add table inet <name>` with `flags` (None: no flags attribute) and a regular chain
    /// `c`; Ok or the kernel's errno.
    fn add_table(&self, name: &str, flags: Option<u32>) -> Result<(), nix::errno::Errno> {
        fn msg(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
            nfnl_msg(kind, flags, seq, 0, family, res_id, attrs)
        }
        const REQUEST_ACK_CREATE: u16 = 0x1 | 0x4 | 0x400;
        let name_attr = attr(1, format!("{name}\0").as_bytes());
        let mut table = name_attr.clone();
        if let Some(f) = flags {
            table.extend(attr(2, &f.to_be_bytes()));
        }
        let mut chain = name_attr;
        chain.extend(attr(3, b"c\0"));
        let mut batch = msg(0x10, 1, 1, 0, 10, &[]);
        batch.extend(msg(10 << 8, REQUEST_ACK_CREATE, 2, 1, 0, &table));
        batch.extend(msg((10 << 8) | 3, REQUEST_ACK_CREATE, 3, 1, 0, &chain));
        batch.extend(msg(0x11, 1, 4, 0, 10, &[]));
        send(self.fd.as_raw_fd(), &batch, MsgFlags::empty()).expect("send batch");
        let mut buf = vec![0u8; 1 << 16];
        let mut first_error = None;
        // Two acks (or an error and, for an aborted batch, nothing more).
        while let Ok(n) = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            let mut i = 0;
            while i + 20 <= n {
                let len = u32::from_ne_bytes(buf[i..i + 4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(buf[i + 4..i + 6].try_into().unwrap());
                let errno = i32::from_ne_bytes(buf[i + 16..i + 20].try_into().unwrap());
                if kind == 2 && errno != 0 && first_error.is_none() {
                    first_error = Some(nix::errno::Errno::from_raw(-errno));
                }
                i += len.next_multiple_of(4).max(20);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[test]
fn owned_persistent_tables_on_this_kernel() {
    // Repair latency is part of what these tests check: no other lab runs meanwhile.
    let _alone = lab::exclusive();
    use nix::errno::Errno;
    let mut lab = Lab::new();
    let ns = lab.add_host("own");
    let nft = |cmd: &str| ns.nft(&[cmd]).map(drop).map_err(|e| e.stderr);
    let owned = NFT_TABLE_F_OWNER | NFT_TABLE_F_PERSIST;
    let owner = RawNft::open(&ns);
    owner
        .add_table("t", Some(owned))
        .expect("kernel >= 6.9 accepts owner + persist");
    // Nobody else can change an owned table; `flush ruleset` skips it.
    for cmd in [
        "add rule inet t c accept",
        "add chain inet t c2",
        "delete table inet t",
    ] {
        let err = nft(cmd).expect_err(cmd);
        assert!(err.contains("Operation not permitted"), "{cmd}: {err}");
    }
    nft("add table inet other").unwrap();
    nft("flush ruleset").expect("flush ruleset succeeds");
    assert_eq!(ns.nft(&["list", "tables"]).unwrap(), "table inet t\n");
    let listing = ns.nft(&["list", "table", "inet", "t"]).unwrap();
    assert!(listing.contains("flags owner"), "{listing}");
    // Another socket cannot take it over.
    let rival = RawNft::open(&ns);
    assert_eq!(rival.add_table("t", Some(owned)), Err(Errno::EPERM));
    // The owner cannot give up `persist` or ownership by an update.
    assert_eq!(
        owner.add_table("t", Some(NFT_TABLE_F_OWNER)),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(owner.add_table("t", Some(0)), Err(Errno::EOPNOTSUPP));
    assert_eq!(
        owner.add_table("t", None),
        Ok(()),
        "no flags attribute: no change"
    );
    // The owning socket closes (as when the process is killed): the table stays, orphaned,
    // and anyone can change it again.
    drop(owner);
    eventually(WAIT, || nft("add rule inet t c counter accept"));
    let listing = ns.nft(&["list", "table", "inet", "t"]).unwrap();
    assert!(
        listing.contains("counter packets 0 bytes 0 accept"),
        "{listing}"
    );
    // A new process adopts it by setting the flags again (persist included), rules intact.
    assert_eq!(
        rival.add_table("t", Some(NFT_TABLE_F_OWNER)),
        Err(Errno::EOPNOTSUPP)
    );
    rival.add_table("t", Some(owned)).expect("adopt an orphan");
    assert!(nft("delete table inet t").is_err(), "adopted: owned again");
    let listing = ns.nft(&["list", "table", "inet", "t"]).unwrap();
    assert!(
        listing.contains("counter packets 0 bytes 0 accept"),
        "{listing}"
    );
    drop(rival);
    eventually(WAIT, || nft("delete table inet t"));
    // Owner without persist: the table goes with the socket (a killed agent's firewall would
    // vanish), and the kernel notifies no one.
    let (tx, rx) = mpsc::channel::<Drift>();
    let monitor = ns
        .enter(move || Monitor::start("gone", move |d| tx.send(d).is_ok()))
        .expect("monitor");
    let short_lived = RawNft::open(&ns);
    short_lived
        .add_table("gone", Some(NFT_TABLE_F_OWNER))
        .unwrap();
    drop(short_lived);
    eventually(WAIT, || {
        match ns.nft(&["list", "tables"]).unwrap().as_str() {
            "" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    // Its removal produced no notification: the first report is of a later commit by `nft`
    // (the creation was this process's own, not reported).
    nft("add table inet gone").unwrap();
    let next = rx.recv_timeout(WAIT).expect("report");
    assert!(
        next.changes.table_created && !next.changes.table_deleted,
        "{next}"
    );
    monitor.stop();
}
