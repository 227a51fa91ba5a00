//! Kernel tests of `nodeplane::net` (root): each test builds its own network namespaces,
//! creates the backend inside its "node" namespace and checks the kernel's own view with `ip`.
//! A test that cannot run here fails with the reason.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use nodeplane::net::{
    AddressSpec, Family, NetBackend, NetConfig, NetDesired, NextHop, Refusal, RouteSpec,
    RtnlBackend, RuleSpec, TunnelPeer, TunnelSpec,
};
use nodeplane::testing::lab;
use serde_json::Value;

/// A bare named network namespace (no sysctls changed), deleted on drop (also when the test
/// panics). Created through the kit, whose lock serialises `ip netns add/delete` across the
/// tests of this binary and whose `Lab` holds the pass timing-sensitive tests wait for.
struct Netns {
    name: String,
    _lab: lab::Lab,
}

impl Netns {
    fn new(role: &str) -> Netns {
        require_root();
        let lab = lab::Lab::new();
        let name = format!("{}-{role}", lab.prefix());
        lab::create_netns(&name).unwrap_or_else(|e| panic!("create netns: {e}"));
        Netns { name, _lab: lab }
    }

    /// `ip -n NAME ARGS`, panicking with stderr on failure.
    #[track_caller]
    fn ip(&self, args: &[&str]) -> String {
        let mut argv = vec!["ip", "-n", &self.name];
        argv.extend_from_slice(args);
        run(&argv)
    }

    #[track_caller]
    fn ip_json(&self, args: &[&str]) -> Vec<Value> {
        let mut argv = vec!["-j"];
        argv.extend_from_slice(args);
        let out = self.ip(&argv);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip -j {args:?}: {e}: {out}"))
    }

    #[track_caller]
    fn sysctl(&self, key: &str, value: &str) {
        run(&[
            "ip",
            "netns",
            "exec",
            &self.name,
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ]);
    }

    /// Creates the backend on a thread that joined this namespace: its worker, and so every
    /// socket it opens, lives here whichever thread calls it later.
    fn backend(&self, config: NetConfig) -> RtnlBackend {
        let file = File::open(format!("/run/netns/{}", self.name)).expect("open netns");
        std::thread::spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            RtnlBackend::new(config)
        })
        .join()
        .expect("backend thread panicked")
        .expect("RtnlBackend::new")
    }

    fn mac(&self, dev: &str) -> String {
        self.ip_json(&["link", "show", "dev", dev])[0]["address"]
            .as_str()
            .expect("link address")
            .to_string()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = lab::delete_netns(&self.name);
    }
}

#[track_caller]
fn run(argv: &[&str]) -> String {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e} (is iproute2 installed?)"));
    if !out.status.success() {
        panic!(
            "{} failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn require_root() {
    if run(&["id", "-u"]).trim() != "0" {
        panic!("net_kernel tests need root (network namespaces, netlink writes); run as root");
    }
}

/// A node namespace linked to an "external" namespace by two veth pairs:
/// n0 10.10.0.1/16 2001:db8:0::1/64  <->  e0 10.10.0.2/16 2001:db8:0::2/64
/// n1 10.10.5.1/24 2001:db8:5::1/64  <->  e1 10.10.5.2/24 2001:db8:5::2/64
struct Lab {
    node: Netns,
    ext: Netns,
}

fn lab() -> Lab {
    let node = Netns::new("node");
    let ext = Netns::new("ext");
    for (n, e, v4n, v4e, v6n, v6e) in [
        (
            "n0",
            "e0",
            "10.10.0.1/16",
            "10.10.0.2/16",
            "2001:db8:0::1/64",
            "2001:db8:0::2/64",
        ),
        (
            "n1",
            "e1",
            "10.10.5.1/24",
            "10.10.5.2/24",
            "2001:db8:5::1/64",
            "2001:db8:5::2/64",
        ),
    ] {
        node.ip(&[
            "link", "add", n, "type", "veth", "peer", "name", e, "netns", &ext.name,
        ]);
        for (ns, dev, v4, v6) in [(&node, n, v4n, v6n), (&ext, e, v4e, v6e)] {
            ns.ip(&["addr", "add", v4, "dev", dev]);
            ns.ip(&["addr", "add", v6, "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
        }
    }
    for (ns, dev) in [(&node, "n0"), (&node, "n1"), (&ext, "e0"), (&ext, "e1")] {
        wait_ipv6_ready(ns, dev);
    }
    Lab { node, ext }
}

/// IPv6 configures a link (its ff00::/8 route among others) only once the deferred link-watch
/// work has seen the carrier, up to a second after `link set up`; packets to ff02::1 that
/// arrive earlier are dropped as unroutable.
fn wait_ipv6_ready(ns: &Netns, dev: &str) {
    let start = Instant::now();
    loop {
        let local = ns.ip_json(&["-6", "route", "show", "table", "local", "dev", dev]);
        if local.iter().any(|r| r["dst"] == "ff00::/8") {
            return;
        }
        if start.elapsed() > Duration::from_secs(5) {
            panic!(
                "{dev} in {}: IPv6 not configured after 5 s: {local:?}",
                ns.name
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn host(a: &str) -> AddressSpec {
    AddressSpec::host(a.parse().unwrap())
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

/// Quiet config for tests that do not look at announcements.
fn cfg() -> NetConfig {
    NetConfig {
        announce_count: 0,
        ..NetConfig::default()
    }
}

/// `(local, prefixlen)` of `dev`'s addresses, per `ip -j addr`.
fn addrs(ns: &Netns, dev: &str) -> BTreeSet<(String, u64)> {
    ns.ip_json(&["addr", "show", "dev", dev])[0]["addr_info"]
        .as_array()
        .expect("addr_info")
        .iter()
        .map(|a| {
            (
                a["local"].as_str().unwrap().to_string(),
                a["prefixlen"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `IFA_PROTO` of every address in the namespace, read with rtnetlink's own address dump
/// (iproute2 6.1 does not print it).
fn address_protocols(ns: &Netns) -> Vec<(IpAddr, u8)> {
    use futures::TryStreamExt;
    use netlink_packet_route::address::AddressAttribute;
    let file = File::open(format!("/run/netns/{}", ns.name)).expect("open netns");
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let rt = nodeplane::testing::runtime::current_thread();
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection().unwrap();
            tokio::spawn(conn);
            let msgs: Vec<_> = handle
                .address()
                .get()
                .execute()
                .try_collect()
                .await
                .unwrap();
            msgs.iter()
                .filter_map(|m| {
                    let mut addr = None;
                    let mut proto = 0;
                    for a in &m.attributes {
                        match a {
                            AddressAttribute::Address(x) => addr = Some(*x),
                            AddressAttribute::Protocol(p) => proto = u8::from(*p),
                            _ => {}
                        }
                    }
                    Some((addr?, proto))
                })
                .collect()
        })
    })
    .join()
    .unwrap()
}

#[test]
fn addresses_land_by_longest_prefix_with_marker_and_spare_foreign_ones() {
    let lab = lab();
    let node = &lab.node;
    // An address the operator added by hand on the same interface.
    node.ip(&["addr", "add", "10.10.5.50/32", "dev", "n1"]);
    let mut b = node.backend(cfg());
    let desired = NetDesired {
        addresses: [
            host("10.10.5.100"),
            host("10.10.9.100"),
            host("2001:db8:5::100"),
        ]
        .into(),
        ..Default::default()
    };
    let changes = b.plan(&desired).unwrap();
    assert_eq!(
        changes.describe(),
        vec![
            "address add 10.10.5.100/32 dev n1 proto nodeplane",
            "address add 10.10.9.100/32 dev n0 proto nodeplane",
            "address add 2001:db8:5::100/128 dev n1 proto nodeplane nodad",
        ]
    );
    // plan only reads.
    assert!(!addrs(node, "n1").contains(&("10.10.5.100".into(), 32)));
    b.apply(&changes).unwrap();

    let n1 = addrs(node, "n1");
    assert!(n1.contains(&("10.10.5.100".into(), 32)), "{n1:?}");
    assert!(n1.contains(&("2001:db8:5::100".into(), 128)), "{n1:?}");
    assert!(addrs(node, "n0").contains(&("10.10.9.100".into(), 32)));
    let protos = address_protocols(node);
    for a in ["10.10.5.100", "10.10.9.100", "2001:db8:5::100"] {
        assert!(
            protos.contains(&(ip(a), 0x6e)),
            "{a} without marker: {protos:?}"
        );
    }
    assert!(protos.contains(&(ip("10.10.5.50"), 0)));
    // NODAD: usable at once, never tentative.
    let v6 = node.ip_json(&["-6", "addr", "show", "dev", "n1"]);
    let ours = v6[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["local"] == "2001:db8:5::100")
        .expect("v6 address");
    assert_eq!(ours.get("tentative"), None, "{ours}");
    assert_eq!(ours["nodad"], true, "{ours}");

    // Idempotent.
    assert!(b.plan(&desired).unwrap().is_empty());

    // The node's own addresses and addresses outside every subnet are refused by name.
    let own = NetDesired {
        addresses: [host("10.10.5.50")].into(),
        ..Default::default()
    };
    let refused = b.plan(&own).unwrap().refused;
    assert_eq!(
        refused,
        vec![Refusal {
            addr: ip("10.10.5.50"),
            reason: "it is one of the node's own addresses (on n1)".into()
        }]
    );
    let nowhere = NetDesired {
        addresses: [host("172.16.0.1")].into(),
        ..Default::default()
    };
    assert_eq!(
        b.plan(&nowhere).unwrap().refused[0].reason,
        "no interface subnet contains it"
    );

    // Dropping one address from the desired state removes only it.
    let fewer = NetDesired {
        addresses: [host("10.10.5.100")].into(),
        ..Default::default()
    };
    let changes = b.sync(&fewer).unwrap();
    assert_eq!(changes.addresses_del.len(), 2);
    assert!(!addrs(node, "n0").contains(&("10.10.9.100".into(), 32)));
    assert!(addrs(node, "n1").contains(&("10.10.5.50".into(), 32)));

    // Cleanup removes ours only.
    let removed = b.cleanup().unwrap();
    assert_eq!(
        removed.describe(),
        vec!["address del 10.10.5.100/32 dev n1 proto nodeplane"]
    );
    let n1 = addrs(node, "n1");
    assert!(!n1.contains(&("10.10.5.100".into(), 32)), "{n1:?}");
    assert!(n1.contains(&("10.10.5.50".into(), 32)), "{n1:?}");
    assert!(n1.contains(&("10.10.5.1".into(), 24)), "{n1:?}");
    assert!(b.cleanup().unwrap().is_empty());
}

fn nexthop(via: &str, dev: Option<&str>, weight: u8) -> NextHop {
    NextHop {
        via: Some(ip(via)),
        dev: dev.map(str::to_string),
        weight,
        onlink: false,
    }
}

/// A route (not `local`) to `dst` in `table`.
fn route(table: u32, dst: &str, nexthops: Vec<NextHop>) -> RouteSpec {
    RouteSpec {
        table,
        dst: dst.parse().unwrap(),
        nexthops,
        local: false,
    }
}

/// A multipath default route (table 7000), a multipath IPv6 route (table 7001) and a route
/// whose nexthop names no device (the kernel resolves it: the plan must still converge).
fn multipath_routes() -> (RouteSpec, RouteSpec, RouteSpec) {
    let v4 = route(
        7000,
        "0.0.0.0/0",
        vec![
            nexthop("10.10.0.2", Some("n0"), 3),
            nexthop("10.10.5.2", Some("n1"), 1),
        ],
    );
    let v6 = route(
        7001,
        "2001:db8:99::/64",
        vec![
            nexthop("2001:db8::2", Some("n0"), 1),
            nexthop("2001:db8:5::2", Some("n1"), 2),
        ],
    );
    let single = route(7000, "10.20.0.0/16", vec![nexthop("10.10.5.2", None, 1)]);
    (v4, v6, single)
}

/// A route's nexthops as `ip -j` lists them: (gateway, device, weight).
fn nexthops_of(route: &Value) -> Vec<(String, String, u64)> {
    let hops = route["nexthops"].as_array().expect("multipath");
    hops.iter()
        .map(|h| {
            let w = h["weight"].as_u64().unwrap_or(1);
            let text = |k: &str| h[k].as_str().unwrap_or_default().to_string();
            (text("gateway"), text("dev"), w)
        })
        .collect()
}

/// The routes of [`multipath_routes`] as the kernel holds them, with the agent's marker.
fn assert_multipath_routes_held(node: &Netns) {
    let t7000 = node.ip_json(&["route", "show", "table", "7000"]);
    let default = t7000
        .iter()
        .find(|r| r["dst"] == "default")
        .expect("default route");
    assert_eq!(default["protocol"], "110");
    assert_eq!(
        nexthops_of(default),
        vec![
            ("10.10.0.2".into(), "n0".into(), 3),
            ("10.10.5.2".into(), "n1".into(), 1)
        ]
    );
    let r20 = t7000.iter().find(|r| r["dst"] == "10.20.0.0/16").unwrap();
    assert_eq!(
        (&r20["dev"], &r20["protocol"]),
        (&"n1".into(), &"110".into())
    );
    let t7001 = node.ip_json(&["-6", "route", "show", "table", "7001"]);
    let r6 = t7001
        .iter()
        .find(|r| r["dst"] == "2001:db8:99::/64")
        .expect("v6 route");
    assert_eq!(r6["protocol"], "110");
    assert_eq!(nexthops_of(r6).len(), 2);
}

#[test]
fn multipath_routes_in_agent_tables_with_replace_and_cleanup() {
    let lab = lab();
    let node = &lab.node;
    // Foreign routes: one in an agent table without the marker, one with the marker outside
    // the agent tables.
    node.ip(&"route add 10.77.0.0/16 via 10.10.0.2 table 7000"
        .split(' ')
        .collect::<Vec<_>>());
    let marked_elsewhere = "route add 10.78.0.0/16 via 10.10.0.2 table 100 proto 110";
    node.ip(&marked_elsewhere.split(' ').collect::<Vec<_>>());
    let mut b = node.backend(cfg());
    let (v4, v6, single) = multipath_routes();
    let mut desired = NetDesired {
        routes: [v4.clone(), v6.clone(), single].into(),
        ..Default::default()
    };
    let changes = b.sync(&desired).unwrap();
    assert_eq!(changes.routes_add.len(), 3);
    assert_multipath_routes_held(node);
    assert!(
        b.plan(&desired).unwrap().is_empty(),
        "second plan not empty"
    );

    // New nexthops replace the route in place (IPv4 and IPv6).
    let mut v4b = v4.clone();
    v4b.nexthops = vec![nexthop("10.10.5.2", Some("n1"), 1)];
    let mut v6b = v6.clone();
    v6b.nexthops[1].weight = 5;
    desired.routes.remove(&v4);
    desired.routes.remove(&v6);
    desired.routes.extend([v4b, v6b]);
    let changes = b.sync(&desired).unwrap();
    assert_eq!(
        (changes.routes_replace.len(), changes.len()),
        (2, 2),
        "{:?}",
        changes.describe()
    );
    let default = node.ip_json(&["route", "show", "table", "7000", "default"]);
    assert_eq!(default.len(), 1, "{default:?}");
    assert_eq!(default[0]["gateway"], "10.10.5.2");
    let r6 = node.ip_json(&["-6", "route", "show", "table", "7001"]);
    assert_eq!(r6.len(), 1, "{r6:?}");
    let weights: Vec<u64> = nexthops_of(&r6[0]).into_iter().map(|h| h.2).collect();
    assert_eq!(weights, vec![1, 5]);
    assert!(b.plan(&desired).unwrap().is_empty());

    // Cleanup removes the three marked routes and nothing else.
    let removed = b.cleanup().unwrap();
    assert_eq!(removed.routes_del.len(), 3, "{:?}", removed.describe());
    let t7000 = node.ip_json(&["route", "show", "table", "7000"]);
    assert_eq!(t7000.len(), 1, "{t7000:?}");
    assert_eq!(t7000[0]["dst"], "10.77.0.0/16");
    assert!(
        node.ip_json(&["-6", "route", "show", "table", "7001"])
            .is_empty()
    );
    assert_eq!(node.ip_json(&["route", "show", "table", "100"]).len(), 1);
    assert!(b.cleanup().unwrap().is_empty());
}

#[test]
fn fwmark_rules_with_marker_spare_foreign_rules() {
    let lab = lab();
    let node = &lab.node;
    // A hand-made rule identical to one of ours except for the protocol.
    node.ip(&[
        "rule",
        "add",
        "priority",
        "7000",
        "fwmark",
        "0x100/0xff00",
        "lookup",
        "7000",
    ]);
    let mut b = node.backend(cfg());
    let desired = NetDesired {
        rules: [
            RuleSpec {
                priority: 7000,
                fwmark: Some((0x100, 0xff00)),
                from: None,
                table: 7000,
                family: Family::V4,
            },
            RuleSpec {
                priority: 7001,
                fwmark: None,
                from: Some("10.10.5.0/24".parse().unwrap()),
                table: 7000,
                family: Family::V4,
            },
            RuleSpec {
                priority: 7002,
                fwmark: Some((0x200, u32::MAX)),
                from: Some("2001:db8:5::/64".parse().unwrap()),
                table: 7001,
                family: Family::V6,
            },
        ]
        .into(),
        ..Default::default()
    };
    let changes = b.sync(&desired).unwrap();
    assert_eq!(
        changes.describe(),
        vec![
            "rule add priority 7000 from all fwmark 0x100/0xff00 lookup 7000 protocol nodeplane",
            "rule add priority 7001 from 10.10.5.0/24 lookup 7000 protocol nodeplane",
            "-6 rule add priority 7002 from 2001:db8:5::/64 fwmark 0x200/0xffffffff lookup 7001 \
             protocol nodeplane",
        ]
    );
    let v4 = node.ip_json(&["rule", "show"]);
    let ours: Vec<&Value> = v4.iter().filter(|r| r["protocol"] == "110").collect();
    assert_eq!(ours.len(), 2, "{v4:?}");
    assert_eq!(ours[0]["fwmark"], "0x100");
    assert_eq!(ours[0]["fwmask"], "0xff00");
    assert_eq!(ours[0]["table"], "7000");
    assert_eq!(
        (&ours[1]["src"], &ours[1]["srclen"]),
        (&"10.10.5.0".into(), &24.into())
    );
    let v6 = node.ip_json(&["-6", "rule", "show"]);
    let r6 = v6.iter().find(|r| r["protocol"] == "110").expect("v6 rule");
    assert_eq!(
        (&r6["priority"], &r6["fwmark"]),
        (&7002.into(), &"0x200".into())
    );
    let again = b.plan(&desired).unwrap();
    assert!(
        again.is_empty(),
        "second plan not empty: {:?}",
        again.describe()
    );

    let removed = b.cleanup().unwrap();
    assert_eq!(removed.rules_del.len(), 3);
    let left: Vec<Value> = node
        .ip_json(&["rule", "show"])
        .into_iter()
        .filter(|r| r["priority"] == 7000)
        .collect();
    assert_eq!(left.len(), 1, "the hand-made rule must stay: {left:?}");
    assert_ne!(left[0]["protocol"], "110");
    assert!(
        node.ip_json(&["-6", "rule", "show"])
            .iter()
            .all(|r| r["protocol"] != "110")
    );
}

/// Polls `ip neigh` in `ns` until `addr` is known with `mac`, for at most `timeout`.
fn wait_neighbour(ns: &Netns, dev: &str, addr: &str, mac: &str, timeout: Duration) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let neigh = ns.ip_json(&["neigh", "show", "dev", dev]);
        let found = neigh
            .iter()
            .any(|n| n["dst"] == addr && n["lladdr"].as_str() == Some(mac));
        if found || start.elapsed() > timeout {
            return neigh;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn new_addresses_are_announced_to_neighbours() {
    let lab = lab();
    let (node, ext) = (&lab.node, &lab.ext);
    // IPv4: accept gratuitous ARP for unknown addresses.
    ext.sysctl("net.ipv4.conf.e1.arp_accept", "1");
    // IPv6: a stale entry with a wrong MAC that only an NA with the override flag can fix.
    ext.ip(&[
        "neigh",
        "add",
        "2001:db8:5::100",
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        "e1",
        "nud",
        "stale",
    ]);
    let mac = node.mac("n1");
    let config = NetConfig {
        announce_count: 3,
        announce_interval: Duration::from_millis(50),
        ..NetConfig::default()
    };
    let mut b = node.backend(config);
    let before = ext.ip_json(&["neigh", "show", "dev", "e1"]);
    assert!(
        before.iter().all(|n| n["dst"] != "10.10.5.100"),
        "ext already knows the address: {before:?}"
    );
    let desired = NetDesired {
        addresses: [host("10.10.5.100"), host("2001:db8:5::100")].into(),
        ..Default::default()
    };
    b.sync(&desired).unwrap();
    let timeout = Duration::from_secs(3);
    let neigh = wait_neighbour(ext, "e1", "10.10.5.100", &mac, timeout);
    assert!(
        neigh
            .iter()
            .any(|n| n["dst"] == "10.10.5.100" && n["lladdr"] == mac.as_str()),
        "no gratuitous ARP for 10.10.5.100 from {mac} seen: {neigh:?}"
    );
    let neigh = wait_neighbour(ext, "e1", "2001:db8:5::100", &mac, timeout);
    assert!(
        neigh
            .iter()
            .any(|n| n["dst"] == "2001:db8:5::100" && n["lladdr"] == mac.as_str()),
        "no unsolicited NA for 2001:db8:5::100 from {mac} seen: {neigh:?}"
    );
    // Three rounds in all: the first during apply, two from the background thread.
    b.wait_announcements();
    let snmp6 = run(&["ip", "netns", "exec", &ext.name, "cat", "/proc/net/snmp6"]);
    let received = snmp6
        .lines()
        .find_map(|l| l.strip_prefix("Icmp6InNeighborAdvertisements"))
        .map(|v| v.trim().to_string());
    assert_eq!(received.as_deref(), Some("3"), "{snmp6}");
    b.cleanup().unwrap();
}

#[test]
fn backend_stays_in_its_namespace() {
    let lab = lab();
    let mut b = lab.node.backend(cfg());
    let state = b.read_state().unwrap();
    let names: BTreeSet<&str> = state.links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["lo", "n0", "n1"]));
    // The caller (this thread) is in another namespace; the backend still acts in "node".
    let d = NetDesired {
        addresses: [host("10.10.5.101")].into(),
        ..Default::default()
    };
    b.sync(&d).unwrap();
    assert!(addrs(&lab.node, "n1").contains(&("10.10.5.101".into(), 32)));
    drop(b);
    // A fresh backend finds the marked address and removes it.
    let mut b = lab.node.backend(cfg());
    assert_eq!(b.cleanup().unwrap().addresses_del.len(), 1);
}

/// The EgressIP tunnel copies the inner DSCP into the outer header (`tos inherit`): a new
/// device is created so, and a device of the agent's without it (an older agent's) is
/// changed in place: same ifindex, no link delete. The second sync is empty (the FDB entry
/// the first one appended is read back).
#[test]
fn the_tunnel_inherits_the_tos_and_an_old_device_is_changed_in_place() {
    let lab = lab();
    let node = &lab.node;
    let spec = TunnelSpec {
        name: "np-eip".into(),
        vni: 7100,
        port: 4789,
        local: ip("10.10.0.1"),
        mac: [0x0a, 0x6e, 10, 10, 0, 1],
        peers: [TunnelPeer {
            underlay: ip("10.10.0.2"),
            mac: [0x0a, 0x6e, 10, 10, 0, 2],
            gateways: vec![ip("10.10.0.2")],
        }]
        .into(),
    };
    // As an older agent left it: ours (the alias), without `tos inherit`.
    node.ip(&[
        "link",
        "add",
        "np-eip",
        "address",
        "0a:6e:0a:0a:00:01",
        "type",
        "vxlan",
        "id",
        "7100",
        "dstport",
        "4789",
        "local",
        "10.10.0.1",
        "nolearning",
    ]);
    node.ip(&["link", "set", "np-eip", "alias", "nodeplane", "up"]);
    node.ip(&[
        "neigh",
        "replace",
        "10.10.0.2",
        "lladdr",
        "0a:6e:0a:0a:00:02",
        "dev",
        "np-eip",
        "nud",
        "permanent",
    ]);
    node.ip(&["link", "set", "np-eip", "type", "vxlan", "tos", "0"]);
    let before = node.ip_json(&["-d", "link", "show", "np-eip"]);
    // `ip -j` prints IFLA_VXLAN_TOS in hex: 0x1 is what its text form calls `tos inherit`.
    let tos = |link: &[Value]| link[0]["linkinfo"]["info_data"]["tos"].clone();
    assert_ne!(tos(&before), "0x1", "{before:?}");
    let mut b = node.backend(cfg());
    let desired = NetDesired {
        tunnel: Some(spec),
        ..Default::default()
    };
    let changes = b.sync(&desired).unwrap();
    let described = changes.describe();
    assert!(
        !described
            .iter()
            .any(|d| d.starts_with("link add") || d.starts_with("link del")),
        "{described:?}"
    );
    assert!(
        described.contains(&"link set np-eip type vxlan tos inherit".to_string()),
        "{described:?}"
    );
    let after = node.ip_json(&["-d", "link", "show", "np-eip"]);
    assert_eq!(tos(&after), "0x1", "{after:?}");
    assert_eq!(after[0]["ifindex"], before[0]["ifindex"], "the same device");
    let again = b.sync(&desired).unwrap();
    assert!(again.is_empty(), "not converged: {:?}", again.describe());
}
