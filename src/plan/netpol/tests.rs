use super::*;
use crate::config::Config;
use crate::nft::diff::diff;
use crate::nft::render::render_full;
use crate::plan::{Desired, Memory, plan_with};
use crate::snapshot::{ObjectKey, Snapshot, SnapshotBuilder};
use crate::testing::nft_check::nft_check;
use crate::testing::objects;

/// The bridge table of a plan, if any.
pub(super) fn bridge_of(d: &Desired) -> Option<&Table> {
    d.extra_tables.get(Family::Bridge, TABLE_NAME)
}

pub(super) const NODE: &str = "worker-1";

pub(super) fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ips: &[&str]) -> crate::api::Pod {
    objects::pod(ns, name)
        .on(NODE)
        .labels(labels)
        .ips(ips)
        .object()
}

pub(super) fn policy(ns: &str, name: &str, spec: &str) -> NetworkPolicy {
    objects::network_policy(ns, name, spec).object()
}

const DB_POLICY: &str = "  podSelector: {matchLabels: {app: db}}\n  ingress:\n  - from:\n    \
    - podSelector: {matchLabels: {app: web}}\n    \
    - ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.128/25]}\n    \
    ports: [{port: 5432}, {protocol: UDP, port: 9000, endPort: 9100}, {port: metrics}, {protocol: SCTP, port: 7777}]\n";

fn cluster() -> SnapshotBuilder {
    let db = objects::pod("shop", "db")
        .on(NODE)
        .labels(&[("app", "db")])
        .ips(&["10.0.0.2", "fd00::2"])
        .named_ports(&[("metrics", "TCP", 9090)])
        .object();
    let remote_db = objects::pod("shop", "db-2")
        .on("worker-2")
        .labels(&[("app", "db")])
        .ips(&["10.0.1.2"])
        .object();
    Snapshot::builder()
        .with(objects::namespace("shop", &[]).object())
        .with(db)
        .with(remote_db)
        .with(pod("shop", "web", &[("app", "web")], &["10.0.0.3"]))
        .with(policy("shop", "db", DB_POLICY))
}

fn run(b: SnapshotBuilder, memory: &Memory) -> Desired {
    plan_with(&b.build(), &Config::for_node(NODE), memory)
}

#[test]
fn no_policy_adds_nothing() {
    let d = run(
        Snapshot::builder().with(pod("a", "p", &[], &["10.0.0.9"])),
        &Memory::default(),
    );
    let text = render_full(&d.ruleset);
    assert!(
        !text.contains("np-ingress") && !text.contains("np-forward"),
        "{text}"
    );
}

#[test]
fn the_bridge_table_exists_with_a_policy_shares_its_parts_and_keeps_state_without_ct() {
    let none = run(
        Snapshot::builder().with(pod("a", "p", &[], &["10.0.0.9"])),
        &Memory::default(),
    );
    assert!(bridge_of(&none).is_none());
    let d = run(cluster(), &Memory::default());
    let bridge = bridge_of(&d).expect("a bridge table while a policy is in force");
    assert_eq!(bridge.family, Family::Bridge);
    // The same parts, by pointer: a policy edit costs the same in both tables.
    let (a, b) = (d.ruleset.part("np/shop/db"), bridge.part("np/shop/db"));
    assert!(Arc::ptr_eq(a.unwrap(), b.unwrap()));
    let text = render_full(bridge);
    assert!(text.starts_with("table bridge nodeplane\n"), "{text}");
    assert!(
        !text.contains("ct state"),
        "no conntrack in a bridge table: {text}"
    );
    assert!(text.contains("@np-flows-v4 accept"), "{text}");
    assert!(text.contains("update @np-flows-v6"), "{text}");
    // A SYN is judged by the policies, never by the flow set.
    assert!(text.contains("tcp flags & (syn | ack) != syn"), "{text}");
    // Only flows with an isolated end are recorded.
    assert!(
        text.contains("ip saddr . ip saddr @np-self-v4 update"),
        "{text}"
    );
    assert!(
        text.contains("ip6 daddr . ip6 daddr @np-self-v6 update"),
        "{text}"
    );
    // `--dry-run` prints both; `nft -f` loads both.
    nft_check(&format!("{}{text}", render_full(&d.ruleset)));
}

/// Rules without peers (`ingress: [{}]`, `ingress: [{ports: ...}]`, `egress: [{}]`) once
/// compiled to `meta nfproto`, which never matches in a bridge table (its packets' nfproto
/// is `bridge`) and which `nft -f` refuses there. They look up the any-address sets now.
#[test]
fn rules_without_peers_work_in_the_bridge_table() {
    for spec in [
        "  podSelector: {}\n  ingress: [{}]\n",
        "  podSelector: {}\n  ingress: [{ports: [{port: 8080}, {protocol: UDP}]}]\n",
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{}]\n",
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: 53, protocol: UDP}]}]\n",
    ] {
        let b = Snapshot::builder()
            .with(pod("a", "p", &[("app", "p")], &["10.0.0.9", "fd00::9"]))
            .with(policy("a", "open", spec));
        let d = run(b, &Memory::default());
        let bridge = render_full(bridge_of(&d).expect("a bridge table"));
        assert!(!bridge.contains("nfproto"), "{spec}:\n{bridge}");
        assert!(bridge.contains("@np-any-v4"), "{spec}:\n{bridge}");
        assert!(bridge.contains("@np-any-v6"), "{spec}:\n{bridge}");
        nft_check(&format!("{}{bridge}", render_full(&d.ruleset)));
    }
}

#[test]
fn a_policy_isolates_its_local_pods_and_allows_its_peers_and_ports() {
    let d = run(cluster(), &Memory::default());
    let text = render_full(&d.ruleset);
    let base = object_name(PREFIX, "shop/db");
    // Only the local db pod is dispatched, in both families; the remote one is its node's.
    assert!(text.contains("10.0.0.2 : goto np-in-"), "{text}");
    assert!(text.contains("fd00::2 : goto np-in-"), "{text}");
    assert!(!text.contains("10.0.1.2 : goto"), "{text}");
    // Peers: the web pod and the ipBlock minus its except.
    // The rule's peers are a shared set of their own part.
    let chain = &d.ruleset.part("np/shop/db").unwrap().chains[&format!("{base}-in")];
    let peer_set = chain.rules[0].stmts[0].set_refs()[0];
    let peers = &d
        .ruleset
        .part(&format!("np-peers/{}", peer_set.trim_end_matches("-v4")))
        .unwrap()
        .sets[peer_set];
    let nets: Vec<String> = peers
        .elements
        .keys()
        .map(|k| format!("{:?}", k[0]))
        .collect();
    assert_eq!(nets, ["Prefix(10.0.0.3/32)", "Prefix(192.0.2.0/25)"]);
    // The named port resolves on the selected pod.
    assert!(text.contains("10.0.0.2 . tcp . 9090"), "{text}");
    assert!(text.contains("udp . 9000-9100"), "{text}");
    assert!(text.contains("sctp . 7777"), "{text}");
    assert!(
        text.contains("ct state established,related accept"),
        "{text}"
    );
    assert!(d.statuses.iter().all(|s| s.result.is_ok()));
    nft_check(&text);
}

#[test]
fn a_label_change_is_element_updates_only() {
    let first = run(cluster(), &Memory::default());
    let mut b = cluster();
    // A second web pod appears, the first one stops being web.
    b.insert(pod("shop", "web", &[("app", "old")], &["10.0.0.3"]));
    b.insert(pod("shop", "web-2", &[("app", "web")], &["10.0.0.4"]));
    let second = run(b, &first.memory);
    let tx = diff(&first.ruleset, &second.ruleset);
    crate::plan::assert_element_updates_only(&tx);
}

#[test]
fn a_policy_edit_rewrites_only_that_policy() {
    let mut b = cluster();
    b.insert(policy(
        "shop",
        "other",
        "  podSelector: {matchLabels: {app: web}}\n",
    ));
    let first = run(b.clone(), &Memory::default());
    b.insert(policy(
        "shop",
        "other",
        "  podSelector: {matchLabels: {app: web}}\n  ingress: [{}]\n",
    ));
    let second = run(b, &first.memory);
    let (a, z) = (&first.ruleset, &second.ruleset);
    assert!(Arc::ptr_eq(
        a.part("np/shop/db").unwrap(),
        z.part("np/shop/db").unwrap()
    ));
    assert!(a.part("np/shop/other").unwrap() != z.part("np/shop/other").unwrap());
}

#[test]
fn two_policies_selecting_a_pod_are_a_union() {
    let mut b = cluster();
    b.insert(policy(
        "shop",
        "all-from-ns",
        "  podSelector: {}\n  ingress: [{from: [{podSelector: {}}]}]\n",
    ));
    let d = run(b, &Memory::default());
    let text = render_full(&d.ruleset);
    let db = object_name(PREFIX, "shop/db");
    let all = object_name(PREFIX, "shop/all-from-ns");
    // The db pod's policy-set chain jumps to both policies before dropping.
    let set_chain = d
        .ruleset
        .part_keys()
        .filter(|k| k.starts_with("np-set/in/"))
        .map(|k| d.ruleset.part(k).unwrap())
        .flat_map(|p| p.chains.values())
        .find(|c| c.rules.len() == 3)
        .expect("a chain for the pod both select");
    let rendered: Vec<String> = set_chain
        .rules
        .iter()
        .map(crate::nft::render::rule_text)
        .collect();
    assert_eq!(rendered[..2].len(), 2);
    assert!(
        rendered
            .iter()
            .any(|r| r.contains(&format!("jump {db}-in"))),
        "{rendered:?}"
    );
    assert!(
        rendered
            .iter()
            .any(|r| r.contains(&format!("jump {all}-in"))),
        "{rendered:?}"
    );
    nft_check(&text);
}

#[test]
fn an_invalid_edit_keeps_the_last_valid_version_and_the_rest_applies() {
    let first = run(cluster(), &Memory::default());
    let mut b = cluster();
    let bad = "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}}]}]\n";
    b.insert(policy("shop", "db", bad));
    b.insert(policy(
        "shop",
        "new",
        "  podSelector: {}\n  policyTypes: [Egress]\n",
    ));
    let second = run(b, &first.memory);
    let status = second
        .statuses
        .iter()
        .find(|s| s.key == ObjectKey::new("shop", "db"))
        .unwrap();
    assert_eq!(
        status.result,
        Err("spec.ingress[0].from[0].ipBlock.except[0]: 10.1.0.0/24 must be strictly inside the cidr 10.0.0.0/16".into())
    );
    assert!(Arc::ptr_eq(
        first.ruleset.part("np/shop/db").unwrap(),
        second.ruleset.part("np/shop/db").unwrap()
    ));
    assert!(second.ruleset.part("np/shop/new").is_some());
    // Without a last valid version (a fresh start) the invalid policy is skipped.
    let mut fresh = cluster();
    fresh.insert(policy("shop", "db", bad));
    assert!(
        run(fresh, &Memory::default())
            .ruleset
            .part("np/shop/db")
            .is_none()
    );
}

#[test]
fn host_network_pods_are_not_subject() {
    let mut host = pod("shop", "agent", &[("app", "db")], &["192.168.1.1"]);
    host.spec.as_mut().unwrap().host_network = Some(true);
    let d = run(cluster().with(host), &Memory::default());
    assert!(!render_full(&d.ruleset).contains("192.168.1.1 : goto"));
}

#[test]
fn except_holes_are_cut_out_as_prefixes() {
    let cut = peers::subtract(
        "10.0.0.0/8".parse().unwrap(),
        &[
            "10.128.0.0/9".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
        ],
    );
    let got: Vec<String> = cut.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "10.0.0.0/16",
            "10.2.0.0/15",
            "10.4.0.0/14",
            "10.8.0.0/13",
            "10.16.0.0/12",
            "10.32.0.0/11",
            "10.64.0.0/10"
        ]
    );
}

#[test]
fn incremental_plans_equal_fresh_plans() {
    // Each step changes pods or namespaces some policy selects or names, or none does; the
    // memoized plan must render exactly what a plan from scratch renders.
    let mut b = cluster();
    b.insert(policy(
        "shop",
        "from-tagged-ns",
        "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n  ingress: [{from: [{namespaceSelector: {matchLabels: {tag: t}}}]}]\n  egress: [{ports: [{port: metrics}]}]\n",
    ));
    let mut memory = run(b.clone(), &Memory::default()).memory;
    type Step = Box<dyn Fn(&mut SnapshotBuilder)>;
    let steps: Vec<Step> = vec![
        Box::new(|b| {
            b.insert(pod("other", "x", &[("app", "none")], &["10.0.0.50"]));
        }),
        Box::new(|b| {
            b.insert(objects::namespace("other", &[("tag", "t")]).object());
        }),
        Box::new(|b| {
            b.insert(pod("shop", "web", &[("app", "web")], &["10.0.0.33"]));
        }),
        Box::new(|b| {
            b.insert(
                objects::pod("other", "m")
                    .on("worker-2")
                    .ips(&["10.0.1.9"])
                    .named_ports(&[("metrics", "TCP", 7070)])
                    .object(),
            );
        }),
        // Policy sets: a pod moves between them, policies come and go over shared pods.
        Box::new(|b| {
            b.insert(policy(
                "shop",
                "web-in",
                "  podSelector: {matchLabels: {app: web}}\n  ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]\n",
            ));
        }),
        Box::new(|b| {
            b.insert(pod("shop", "web", &[("app", "db")], &["10.0.0.33"]));
        }),
        Box::new(|b| {
            b.insert(pod(
                "shop",
                "web-3",
                &[("app", "web")],
                &["10.0.0.34", "fd00::34"],
            ));
        }),
        Box::new(|b| {
            b.remove(Kind::NetworkPolicy, &ObjectKey::new("shop", "db"));
        }),
        Box::new(|b| {
            b.remove(
                Kind::NetworkPolicy,
                &ObjectKey::new("shop", "from-tagged-ns"),
            );
        }),
        Box::new(|b| {
            b.insert(pod("shop", "web", &[("app", "web")], &["10.0.0.33"]));
        }),
        Box::new(|b| {
            b.remove(Kind::Pod, &ObjectKey::new("shop", "db"));
        }),
        Box::new(|b| {
            b.remove(Kind::NetworkPolicy, &ObjectKey::new("shop", "web-in"));
        }),
    ];
    for (i, step) in steps.iter().enumerate() {
        step(&mut b);
        let incremental = run(b.clone(), &memory);
        let fresh = run(b.clone(), &Memory::default());
        assert_eq!(
            render_full(&incremental.ruleset),
            render_full(&fresh.ruleset),
            "step {i}"
        );
        memory = incremental.memory;
    }
}

#[test]
fn a_policy_selecting_no_local_pod_plans_nothing_here() {
    let mut b = cluster();
    // db-2 is the only app=db2 pod, and it runs on worker-2.
    b.insert(
        objects::pod("shop", "db-2")
            .on("worker-2")
            .labels(&[("app", "db2")])
            .ips(&["10.0.1.2"])
            .object(),
    );
    b.insert(policy(
        "shop",
        "remote",
        "  podSelector: {matchLabels: {app: db2}}\n",
    ));
    let first = run(b.clone(), &Memory::default());
    assert!(first.ruleset.part("np/shop/remote").is_none());
    // The pod moves here (a new pod of that name): the policy's chains appear.
    b.insert(pod("shop", "db-2", &[("app", "db2")], &["10.0.0.7"]));
    let second = run(b, &first.memory);
    assert!(second.ruleset.part("np/shop/remote").is_some());
    assert!(render_full(&second.ruleset).contains("10.0.0.7 : goto np-in-"));
}

#[test]
fn port_ranges_merge_and_egress_named_ports_resolve_on_the_peer() {
    let mut b = cluster();
    b.insert(policy(
        "shop",
        "web-out",
        "  podSelector: {matchLabels: {app: web}}\n  policyTypes: [Egress]\n  egress:\n  \
         - ports: [{port: 80, endPort: 90}, {port: 85, endPort: 100}, {protocol: UDP}]\n  \
         - to: [{podSelector: {matchLabels: {app: db}}}]\n    ports: [{port: metrics}]\n",
    ));
    let d = run(b, &Memory::default());
    let part = d.ruleset.part("np/shop/web-out").unwrap();
    let base = object_name(PREFIX, "shop/web-out");
    let keys = |set: &str| -> Vec<String> {
        part.sets[set]
            .elements
            .keys()
            .map(|k| {
                k.iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(" . ")
            })
            .collect()
    };
    assert_eq!(
        keys(&format!("{base}-eg0-ports")),
        [
            "Value(Proto(6)) . Range(Port(80), Port(100))",
            "Value(Proto(17)) . Range(Port(0), Port(65535))"
        ]
    );
    // Only the db pod that has a port named metrics (the remote one has none).
    assert_eq!(
        keys(&format!("{base}-eg1-named-v4")),
        ["Value(Ipv4(10.0.0.2)) . Value(Proto(6)) . Value(Port(9090))"]
    );
    nft_check(&render_full(&d.ruleset));
}

/// Bridged pods' addresses are bound to the ports the kernel has them behind: db (isolated)
/// behind veth-db, web behind veth-web and, claimed by a second port too (a pod that added
/// web's address to its own interface), behind veth-x: web's address is bound to neither and
/// reported, as is a pod inside the bridge's subnet that no port carries.
/// The example bridge behind which the pods sit, bound by a plan of `cluster()` plus a pod
/// no port claims: the plan, the bridge table's text and the problems found. veth-db holds
/// db's addresses (and an unlisted one), veth-web and veth-x both claim web's IPv4 address,
/// veth-idle holds no pod's address and tap0 could not be read.
fn bound_example_bridge() -> (Desired, String, Vec<String>) {
    use crate::net::bridge_ports::{BridgePort, BridgePorts};
    let b = cluster().with(pod("shop", "lost", &[], &["10.0.0.9"]));
    let snapshot = b.build();
    let config = Config::for_node(NODE);
    let mut d = plan_with(&snapshot, &config, &Memory::default());
    let port = |name: &str, addrs: Option<&[&str]>| BridgePort {
        name: name.into(),
        bridge: "br0".into(),
        peer_addrs: addrs.map(|a| a.iter().map(|a| a.parse().unwrap()).collect()),
    };
    let ports = BridgePorts {
        ports: vec![
            port(
                "veth-db",
                Some(&["10.0.0.2", "fd00::2", "fe80::2", "fd00::99"]),
            ),
            port("veth-web", Some(&["10.0.0.3", "fe80::3"])),
            port("veth-x", Some(&["10.0.0.3", "fe80::9"])),
            port("veth-idle", Some(&["10.0.0.77"])),
            port("tap0", None),
        ],
        subnets: vec![("br0".into(), "10.0.0.0/24".parse().unwrap())],
    };
    let bridge = d.extra_tables.get_mut(Family::Bridge, TABLE_NAME).unwrap();
    let problems = bind_bridge_ports(bridge, &snapshot, &config, &d.memory.netpol, &Ok(ports));
    let text = render_full(bridge);
    (d, text, problems)
}

/// The declaration of `set` in a rendered table `text`, elements included.
fn declaration(text: &str, set: &str) -> String {
    let start = text.find(&format!(" {set} {{")).expect("declared");
    let block = &text[start..];
    block[..block.find("\n\t}").unwrap()].to_string()
}

#[test]
fn bridged_pods_addresses_are_bound_to_their_ports() {
    let (_, text, problems) = bound_example_bridge();
    let elements = |set: &str| declaration(&text, set);
    let bound = elements("np-bound-v6");
    assert!(bound.contains("fd00::2 . \"veth-db\""), "{text}");
    assert!(
        bound.contains("fe80::2 . \"veth-db\""),
        "link-local too: {text}"
    );
    assert!(
        !bound.contains("fd00::99"),
        "unlisted: not the pod's: {text}"
    );
    assert!(bound.contains("fe80::3 . \"veth-web\""), "{text}");
    // web's IPv4 address is claimed by two ports: bound to neither, and neither port is
    // judged by port (web's own IPv4 traffic must not be dropped as unbound).
    let bound_ports = elements("np-bound-ports");
    assert!(bound_ports.contains("\"veth-db\""), "{text}");
    assert!(
        !bound_ports.contains("veth-web") && !bound_ports.contains("veth-x"),
        "{text}"
    );
    let bound4 = elements("np-bound-v4");
    assert!(bound4.contains("10.0.0.2 . \"veth-db\""), "{text}");
    assert!(
        !bound4.contains("10.0.0.3") && !bound4.contains("10.0.0.77"),
        "{text}"
    );
    let isolated = elements("np-isolated-v6");
    assert!(isolated.contains("fd00::2 . \"veth-db\""), "{text}");
    assert!(!isolated.contains("fe80"), "{text}");
    assert!(
        elements("np-isolated-ports").contains("\"veth-db\""),
        "{text}"
    );
    assert!(!elements("np-isolated-ports").contains("web"), "{text}");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("10.0.0.3 (pod shop/web) is behind bridge ports veth-web, veth-x"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("10.0.0.9 of pod shop/lost (bridge br0)")
            && problems[1].contains("tap0"),
        "{problems:?}"
    );
    assert!(
        text.contains("ip saddr . iifname != @np-bound-v4 counter"),
        "{text}"
    );
    assert!(
        text.contains("oifname @np-isolated-ports ip6 daddr . oifname != @np-isolated-v6"),
        "{text}"
    );
}

#[test]
fn each_bridge_port_with_a_bound_address_keeps_its_own_flows() {
    let (d, text, _) = bound_example_bridge();
    // Sets and chains of its own, reached by port.
    let flows = declaration(&text, "np-flow-ports");
    let base = crate::nft::names::object_name("np-fl", "veth-db");
    assert!(
        flows.contains(&format!("\"veth-db\" : jump {base}-known")),
        "{text}"
    );
    assert!(text.contains(&format!("set {base}-v6 {{")), "{text}");
    assert!(text.contains(&format!("update @{base}-v4 {{")), "{text}");
    // fe80::3 and fe80::9 are unique: veth-web and veth-x keep their own flows too.
    assert!(
        flows.contains("veth-x") && flows.contains("veth-web"),
        "{text}"
    );
    assert!(!flows.contains("veth-idle"), "no pod's address: {text}");
    assert!(
        declaration(&text, "np-flow-add").contains("\"veth-db\" : goto np-fl-"),
        "{text}"
    );
    nft_check(&format!("{}{text}", render_full(&d.ruleset)));
}

#[test]
fn without_pod_source_check_or_a_read_of_the_ports_no_pod_is_bound() {
    let snapshot = cluster()
        .with(pod("shop", "lost", &[], &["10.0.0.9"]))
        .build();
    // Without --pod-source-check only the isolation rules remain.
    let off = Config {
        pod_source_check: false,
        ..Config::for_node(NODE)
    };
    let d = plan_with(&snapshot, &off, &Memory::default());
    let text = render_full(bridge_of(&d).unwrap());
    assert!(!text.contains("np-bound-v4 counter"), "{text}");
    assert!(text.contains("np-isolated-v4 counter"), "{text}");
    // A failed read binds nothing and says so.
    let mut t = bridge_of(&d).unwrap().clone();
    let err = crate::net::NetError::Netlink {
        what: "links".into(),
        reason: "gone".into(),
    };
    let problems = bind_bridge_ports(
        &mut t,
        &snapshot,
        &off,
        &d.memory.netpol,
        &Err(err.to_string()),
    );
    assert!(
        problems[0].contains("no bridged pod is bound"),
        "{problems:?}"
    );
}

/// The DNS queries the EgressFirewall proxy takes never reach forward: the same rules judge
/// them on prerouting, after service DNAT, behind a test of the proxy's pending mark.
#[test]
fn pending_dns_queries_meet_the_forward_rules_on_prerouting() {
    let d = run(cluster(), &Memory::default());
    let flat = d.ruleset.flatten();
    for (dns, forward, priority) in [
        (chains::DNS_EGRESS, chains::FORWARD_EGRESS, -98),
        (chains::DNS_INGRESS, chains::FORWARD_INGRESS, -97),
    ] {
        let (dns, forward) = (&flat.chains[dns], &flat.chains[forward]);
        let base = dns.base.as_ref().expect("a base chain");
        assert_eq!((base.hook, base.priority), (Hook::Prerouting, priority));
        let gate = crate::nft::render::rule_text(&dns.rules[0]);
        assert_eq!(gate, "meta mark & 0x04000000 == 0x00000000 accept");
        assert_eq!(dns.rules[1..], forward.rules[..], "the forward rules");
    }
}

/// A pod change leaves the policies as they were (the same persistent map): their
/// validation is reused, not run over every policy again, and reports the same statuses.
#[test]
fn a_pod_change_reuses_the_policies_validation() {
    let cfg = Config::for_node(NODE);
    let snapshot = cluster().build();
    let first = plan_with(&snapshot, &cfg, &Memory::default());
    let mut b = snapshot.to_builder();
    b.insert(pod("shop", "web-9", &[("app", "web")], &["10.0.0.9"]));
    let second = plan_with(&b.build(), &cfg, &first.memory);
    let (a, z) = (&first.memory.netpol, &second.memory.netpol);
    assert!(Arc::ptr_eq(&a.validated, &z.validated));
    assert_eq!(first.statuses, second.statuses);
    assert!(!second.statuses.is_empty());
    // A policy edit validates again.
    let mut b = snapshot.to_builder();
    b.insert(policy("shop", "db", "  podSelector: {}\n"));
    let third = plan_with(&b.build(), &cfg, &second.memory);
    assert!(!Arc::ptr_eq(&z.validated, &third.memory.netpol.validated));
}

/// The mark bits the agent uses are disjoint: one feature's bit never reads as another's.
#[test]
fn the_agents_mark_bits_are_disjoint() {
    use crate::plan::{egress_ip, services::names::MASQ_BIT};
    let bits = [
        ("services masquerade", MASQ_BIT),
        ("EgressIP steering", egress_ip::MARK_MASK),
        ("EgressIP tunnel", egress_ip::TUNNELED),
        ("DNS steering", steer::MARK),
        ("DNS pending", PENDING),
        ("bridge judged", BRIDGE_JUDGED),
    ];
    for (i, (a, x)) in bits.iter().enumerate() {
        for (b, y) in &bits[i + 1..] {
            assert_eq!(x & y, 0, "{a} {x:#x} and {b} {y:#x} overlap");
        }
    }
}

/// Bridged packets are judged once: the bridge table's chains run before `br_netfilter`'s
/// forward hook (priority 0, which runs the inet one) and mark what both policy chains
/// accepted; the inet forward chains accept a marked packet after the source check, before
/// any policy rule.
#[test]
fn the_bridge_table_judges_first_and_the_inet_forward_chains_skip_what_it_judged() {
    let d = run(cluster(), &Memory::default());
    let bridge = bridge_of(&d).expect("a bridge table").flatten();
    let mut priorities = Vec::new();
    for name in [
        chains::FORWARD_EGRESS,
        chains::FORWARD_INGRESS,
        bridge::FORWARD_FLOWS,
    ] {
        let base = bridge.chains[name].base.as_ref().expect("a base chain");
        assert_eq!(base.hook, Hook::Forward);
        priorities.push(base.priority);
    }
    assert_eq!(priorities, [-190, -189, -188]);
    let recorder = &bridge.chains[bridge::FORWARD_FLOWS].rules;
    let mark = crate::nft::render::rule_text(&recorder[0]);
    assert_eq!(mark, "meta mark set meta mark or 0x08000000");
    let inet = d.ruleset.flatten();
    let skip = "meta mark & 0x08000000 == 0x08000000 accept";
    for (name, at) in [(chains::FORWARD_EGRESS, 1), (chains::FORWARD_INGRESS, 0)] {
        let rules: Vec<String> = (inet.chains[name].rules.iter())
            .map(crate::nft::render::rule_text)
            .collect();
        assert_eq!(rules[at], skip, "{name}: {rules:#?}");
        assert_eq!(
            rules.iter().filter(|r| *r == skip).count(),
            1,
            "{name}: {rules:#?}"
        );
        if at == 1 {
            assert!(
                rules[0].contains("fib saddr . iif oif missing"),
                "{rules:#?}"
            );
        }
    }
    // The bridge table never skips: it is the judge.
    let bridge_text = render_full(bridge_of(&d).unwrap());
    assert!(!bridge_text.contains("== 0x08000000"), "{bridge_text}");
}

/// `explain --bridged --br-netfilter` (the bridge table, then the inet hooks, the mark
/// carried across) gives what the kernel does: an allowed packet between bridged pods meets
/// the policy's allow rule once, in the bridge table, and the inet policy chains' skip.
#[test]
fn explain_bridged_with_br_netfilter_judges_an_allowed_packet_once() {
    use crate::explain::packet::{NodeFacts, Packet};
    use crate::explain::{Query, Tables, Topology, Verdict as Walked, explain_paths};
    let d = run(cluster(), &Memory::default());
    let (web, db) = ("10.0.0.3".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let packet = Packet::new(web, db, proto::TCP, None, Some(5432)).unwrap();
    let query = Query {
        packet,
        topology: Topology::Bridged { br_netfilter: true },
    };
    let tables = Tables::new(&d.ruleset, bridge_of(&d));
    let paths = explain_paths(&tables, &NodeFacts::default(), &query);
    assert_eq!(paths.len(), 1);
    let path = &paths[0];
    assert_eq!(path.verdict, Walked::Bridged, "{:#?}", path.events);
    let allows: Vec<&str> = (path.events.iter())
        .filter(|e| (e.comment.as_deref()).is_some_and(|c| c.starts_with("NetworkPolicy shop/db")))
        .map(|e| e.table)
        .collect();
    assert_eq!(allows, ["bridge"], "{:#?}", path.events);
    let skip = "meta mark & 0x08000000 == 0x08000000 accept";
    let skipped: Vec<(&str, &str)> = (path.events.iter())
        .filter(|e| e.rule_text.as_deref() == Some(skip))
        .map(|e| (e.table, e.base.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("inet", chains::FORWARD_EGRESS),
            ("inet", chains::FORWARD_INGRESS)
        ],
        "{:#?}",
        path.events
    );
}
