use super::*;
use crate::api::Pod;
use crate::nft::diff::diff;
use crate::nft::render::{render_table, rule_text};
use crate::plan::{Desired, Memory, plan_with_dns};
use crate::snapshot::SnapshotBuilder;
use crate::testing::listing::set_elements as elements;
use crate::testing::objects;

const NODE: &str = "worker-1";

fn pod_on(node: &str, ns: &str, name: &str, ips: &[&str]) -> Pod {
    objects::pod(ns, name).on(node).ips(ips).object()
}

fn node(name: &str, role: &str, ip: &str) -> crate::api::Node {
    objects::node(name, &[ip])
        .labels(&[("role", role)])
        .object()
}

fn fw(ns: &str, rules: &str) -> EgressFirewall {
    objects::egress_firewall(ns, rules).object()
}

const RULES: &str = "[\
    {type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: TCP, port: 443}]}, \
    {type: Allow, to: {dnsName: api.example.com}}, \
    {type: Allow, to: {nodeSelector: {matchLabels: {role: infra}}}}, \
    {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";

fn snapshot() -> SnapshotBuilder {
    let mut host_net = pod_on(NODE, "web", "hostnet", &["192.168.50.11"]);
    host_net.spec.as_mut().unwrap().host_network = Some(true);
    Snapshot::builder()
        .with(fw("web", RULES))
        .with(pod_on(NODE, "web", "a", &["10.128.0.5", "fd01::5"]))
        .with(pod_on("worker-2", "web", "remote", &["10.128.2.5"]))
        .with(pod_on(NODE, "other", "b", &["10.128.0.7"]))
        .with(host_net)
        .with(node("infra-1", "infra", "192.168.50.21"))
        .with(node("worker-2", "worker", "192.168.50.12"))
}

fn answers(ips: &[&str]) -> DnsAnswers {
    let mut a = DnsAnswers::default();
    a.insert(
        "api.example.com",
        ips.iter().map(|s| s.parse().unwrap()).collect(),
    );
    a
}

fn run(b: SnapshotBuilder, memory: &Memory, dns: &DnsAnswers) -> Desired {
    plan_with_dns(&b.build(), &Config::for_node(NODE), memory, dns)
}

#[test]
fn compiles_rules_into_interval_maps_behind_a_source_dispatch() {
    let d = run(snapshot(), &Memory::default(), &answers(&["198.51.100.7"]));
    let n = Names::new("web");
    let c = &n.chain;
    assert_eq!(
        elements(&d.ruleset.flatten(), PODS_V4),
        [format!("10.128.0.5 : goto {c}")],
        "only local pod-network pods of namespaces with a firewall"
    );
    assert_eq!(
        elements(&d.ruleset.flatten(), PODS_V6),
        [format!("fd01::5 : goto {c}")]
    );
    // The dnsName rule 1 cuts the rules: rule 0 is painted in the first run, rules 1-3 (the
    // agent's own answer for rule 1 included) in the second, behind rule 1's learned set.
    assert!(elements(&d.ruleset.flatten(), &n.addr_map(IpFamily::V4)).is_empty());
    let mut v4 = elements(&d.ruleset.flatten(), &n.run_addr_map(1, IpFamily::V4));
    v4.sort();
    let deny = "comment \"rule 3: Deny 0.0.0.0/0\" : drop";
    assert_eq!(
        v4,
        [
            format!("0.0.0.0-192.168.50.20 {deny}"),
            "192.168.50.21 comment \"rule 2: Allow nodeSelector role=infra\" : accept".into(),
            format!("192.168.50.22-198.51.100.6 {deny}"),
            "198.51.100.7 comment \"rule 1: Allow dnsName api.example.com\" : accept".into(),
            format!("198.51.100.8-255.255.255.255 {deny}"),
        ]
    );
    assert_eq!(
        elements(&d.ruleset.flatten(), &n.ports_map(IpFamily::V4)),
        [
            "203.0.113.0/24 . tcp . 443 comment \"rule 0: Allow 203.0.113.0/24 ports TCP/443\" : accept"
        ]
    );
    let flat = d.ruleset.flatten();
    for family in [IpFamily::V4, IpFamily::V6] {
        for map in [n.addr_map(family), n.ports_map(family)] {
            assert!(flat.sets[&map].flags.counter, "{map} counts per element");
        }
    }
    assert!(elements(&d.ruleset.flatten(), &n.addr_map(IpFamily::V6)).is_empty());
    let chain: Vec<String> = d.ruleset.flatten().chains[c]
        .rules
        .iter()
        .map(rule_text)
        .collect();
    let learned = |f| n.learned_set("api.example.com", f);
    let comment = "comment \"rule 1: Allow dnsName api.example.com\"";
    assert_eq!(
        chain,
        [
            format!("ip daddr . meta l4proto . th dport vmap @{c}-ports-v4"),
            format!("ip daddr vmap @{c}-v4"),
            format!(
                "ip daddr @{} counter accept {comment}",
                learned(IpFamily::V4)
            ),
            format!("ip daddr . meta l4proto . th dport vmap @{c}-r1-ports-v4"),
            format!("ip daddr vmap @{c}-r1-v4"),
            format!("ip6 daddr . meta l4proto . th dport vmap @{c}-ports-v6"),
            format!("ip6 daddr vmap @{c}-v6"),
            format!(
                "ip6 daddr @{} counter accept {comment}",
                learned(IpFamily::V6)
            ),
        ],
        "the v6 rules after the learned set match nothing: no second run"
    );
    let set = &flat.sets[&learned(IpFamily::V4)];
    assert!(set.flags.timeout && set.flags.dynamic && set.elements.is_empty());
    // The namespace chain is the only one it has: no chain per rule.
    let ns_chains: Vec<&String> = flat.chains.keys().filter(|k| k.starts_with(c)).collect();
    assert_eq!(ns_chains, [c]);
    let dispatch: Vec<String> = d.ruleset.flatten().chains[DISPATCH]
        .rules
        .iter()
        .map(rule_text)
        .collect();
    assert_eq!(dispatch[0], "ct state established,related return");
    assert!(dispatch.contains(&"ip daddr @cluster-cidrs-v4 return".to_string()));
    assert_eq!(d.statuses.len(), 1);
    assert_eq!(d.statuses[0].result, Ok(()));
}

#[test]
fn dns_node_and_pod_changes_are_element_updates_only() {
    let before = run(snapshot(), &Memory::default(), &answers(&["198.51.100.7"]));
    let changes = [
        run(snapshot(), &Memory::default(), &answers(&["198.51.100.9"])),
        run(
            snapshot().with(node("worker-2", "infra", "192.168.50.12")),
            &Memory::default(),
            &answers(&["198.51.100.7"]),
        ),
        run(
            snapshot().with(pod_on(NODE, "web", "c", &["10.128.0.9"])),
            &Memory::default(),
            &answers(&["198.51.100.7"]),
        ),
    ];
    for after in changes {
        let tx = diff(&before.ruleset.flatten(), &after.ruleset.flatten());
        crate::plan::assert_element_updates_only(&tx);
    }
}

#[test]
fn an_invalid_object_keeps_the_remembered_rules_and_names_the_rule() {
    let first = run(snapshot(), &Memory::default(), &DnsAnswers::default());
    let bad = "[{type: Deny, to: {cidrSelector: 203.0.113.0/24}}, {type: Allow, to: {cidrSelector: 1.1.1.1/32}}, \
               {type: Allow, to: {cidrSelector: 1.1.1.2/32}}, {type: Allow, to: {cidrSelector: 10.0.0.0/33}}]";
    let b = snapshot().with(fw("web", bad)).with(fw("other", "[]"));
    let d = run(b, &first.memory, &DnsAnswers::default());
    let web = d.statuses.iter().find(|s| s.key.namespace == "web");
    assert_eq!(
        web.unwrap().result,
        Err("spec.egress[3].to.cidrSelector: invalid CIDR \"10.0.0.0/33\"".into())
    );
    // The remembered rules' elements (rule 1's name resolves to nothing here).
    let flat = d.ruleset.flatten();
    let prefix = Names::new("web").chain;
    let comments: BTreeSet<&str> = flat
        .sets
        .iter()
        .filter(|(name, _)| name.starts_with(&prefix))
        .flat_map(|(_, s)| s.elements.values())
        .filter_map(|v| v.comment.as_deref())
        .collect();
    assert_eq!(
        comments.into_iter().collect::<Vec<_>>(),
        [
            "rule 0: Allow 203.0.113.0/24 ports TCP/443",
            "rule 2: Allow nodeSelector role=infra",
            "rule 3: Deny 0.0.0.0/0"
        ],
        "the remembered rules"
    );
    assert_eq!(
        d.memory.firewall.validated.in_force["web"],
        first.memory.firewall.validated.in_force["web"]
    );
    assert!(d.memory.firewall.validated.in_force.contains_key("other"));
    // Without a remembered object there is nothing to keep: the namespace is not dispatched.
    let d = run(
        snapshot().with(fw("web", bad)),
        &Memory::default(),
        &DnsAnswers::default(),
    );
    assert!(elements(&d.ruleset.flatten(), PODS_V4).is_empty());
}

#[test]
fn dns_names_are_shared_and_lowercase() {
    let snap = snapshot()
        .with(fw(
            "other",
            "[{type: Deny, to: {dnsName: API.Example.com.}}, {type: Deny, to: {dnsName: b.example.com}}]",
        ))
        .build();
    let names: Vec<String> = dns_names(&snap, &Default::default()).into_iter().collect();
    assert_eq!(names, ["api.example.com", "b.example.com"]);
}

#[test]
fn a_wildcard_rule_learns_only_and_keeps_its_ports_and_place() {
    let snap = Snapshot::builder()
        .with(fw(
            "web",
            "[{type: Allow, to: {dnsName: '*.Example.com'}, ports: [{protocol: TCP, port: 443}, {protocol: UDP, port: 53}]}, \
              {type: Deny, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
        ))
        .with(pod_on(NODE, "web", "a", &["10.128.0.5"]));
    let names: Vec<String> = dns_names(&snap.clone().build(), &Default::default())
        .into_iter()
        .collect();
    assert!(names.is_empty(), "a wildcard has nothing to resolve");
    let d = run(snap, &Memory::default(), &DnsAnswers::default());
    assert_eq!(d.statuses[0].result, Ok(()));
    let n = Names::new("web");
    let flat = d.ruleset.flatten();
    let chain: Vec<String> = flat.chains[&n.chain].rules.iter().map(rule_text).collect();
    let set = n.learned_set("*.example.com", IpFamily::V4);
    let allow =
        "counter accept comment \"rule 0: Allow dnsName *.example.com ports TCP/443,UDP/53\"";
    assert_eq!(
        chain[2..6],
        [
            format!("ip daddr @{set} meta l4proto tcp th dport 443 {allow}"),
            format!("ip daddr @{set} meta l4proto udp th dport 53 {allow}"),
            // Both rules name the same set; the second consults it for the other ports.
            format!("ip daddr @{set} counter drop comment \"rule 1: Deny dnsName *.example.com\""),
            format!(
                "ip daddr . meta l4proto . th dport vmap @{}-r1-ports-v4",
                n.chain
            ),
        ]
    );
    assert!(flat.sets.contains_key(&set));
}

#[test]
fn segments_become_prefixes_points_or_ranges() {
    let seg = |start: u128, end: u128| Segment {
        start,
        end,
        rule: 0,
    };
    let v4 = |s: &str| u128::from(u32::from(s.parse::<Ipv4Addr>().unwrap()));
    let text = |k: KeyPart| match k {
        KeyPart::Prefix(n) => n.to_string(),
        KeyPart::Value(v) => format!("{v:?}"),
        KeyPart::Range(a, b) => format!("{a:?}-{b:?}"),
    };
    assert_eq!(
        text(key_part(IpFamily::V4, &seg(0, u128::from(u32::MAX)))),
        "0.0.0.0/0"
    );
    assert_eq!(
        text(key_part(
            IpFamily::V4,
            &seg(v4("10.0.0.0"), v4("10.0.0.255"))
        )),
        "10.0.0.0/24"
    );
    assert!(text(key_part(IpFamily::V4, &seg(v4("10.0.0.1"), v4("10.0.0.2")))).contains('-'));
    assert_eq!(text(key_part(IpFamily::V6, &seg(0, u128::MAX))), "::/0");
}

/// Replanning with the previous memory reuses every part whose inputs did not change
/// (the same `Arc`, which the diff skips), and rebuilds exactly the ones that did.
#[test]
fn unchanged_namespaces_keep_their_part() {
    let base = || snapshot().with(fw("other", "[{type: Deny, to: {cidrSelector: 0.0.0.0/0}}]"));
    let dns = answers(&["198.51.100.7"]);
    let first = run(base(), &Memory::default(), &dns);
    let same = |d: &Desired, key: &str| {
        Arc::ptr_eq(
            d.ruleset.part(key).unwrap(),
            first.ruleset.part(key).unwrap(),
        )
    };
    let again = run(base(), &first.memory, &dns);
    assert!(same(&again, "fw/web") && same(&again, "fw/other"));

    // A new pod in `other`: only that namespace's part changes, by one element.
    let more_pods = run(
        base().with(pod_on(NODE, "other", "c", &["10.128.0.8"])),
        &first.memory,
        &dns,
    );
    assert!(same(&more_pods, "fw/web") && !same(&more_pods, "fw/other"));
    let tx = diff(&first.ruleset, &more_pods.ruleset);
    assert_eq!(tx.op_count(), 1, "{tx:?}");

    // A new DNS answer: only the namespace with the dnsName rule changes.
    let new_answer = run(base(), &first.memory, &answers(&["198.51.100.8"]));
    assert!(!same(&new_answer, "fw/web") && same(&new_answer, "fw/other"));
    // A relabelled node: the nodeSelector rule follows.
    let relabelled = run(
        base().with(node("worker-2", "infra", "192.168.50.12")),
        &first.memory,
        &dns,
    );
    assert!(!same(&relabelled, "fw/web") && same(&relabelled, "fw/other"));
}

#[test]
fn node_selector_takes_every_host_cidrs_address_and_follows_the_annotation() {
    let infra = |cidrs: &[&str]| {
        objects::node("infra-1", &["192.168.50.21"])
            .labels(&[("role", "infra")])
            .host_cidrs(cidrs)
            .object()
    };
    let dns = answers(&["198.51.100.7"]);
    let text = |d: &Desired| render_table(&d.ruleset.flatten());
    let storage = "10.20.0.5 comment \"rule 2: Allow nodeSelector role=infra\" : accept";
    let storage6 = "fd00:9::5 comment \"rule 2: Allow nodeSelector role=infra\" : accept";
    let annotated = ["192.168.50.21/24", "10.20.0.5/16", "fd00:9::5/64"];
    let d = run(snapshot().with(infra(&annotated)), &Memory::default(), &dns);
    assert!(text(&d).contains(storage), "{}", text(&d));
    assert!(text(&d).contains(storage6), "{}", text(&d));
    // The annotation loses the storage address: the next plan drops it.
    let d2 = run(
        snapshot().with(infra(&["192.168.50.21/24"])),
        &d.memory,
        &dns,
    );
    assert!(!text(&d2).contains("10.20.0.5"), "{}", text(&d2));
    assert!(text(&d2).contains("192.168.50.21 comment \"rule 2"));
    // A malformed annotation counts as absent: InternalIP/ExternalIP still apply.
    let mut bad = infra(&[]);
    bad.metadata.annotations =
        Some([("k8s.ovn.org/host-cidrs".to_string(), "not json".to_string())].into());
    let d3 = run(snapshot().with(bad), &d2.memory, &dns);
    assert!(text(&d3).contains("192.168.50.21 comment \"rule 2"));
}

/// A pod of `web` learning `*.example.com`, the cluster DNS (`kube-system/kube-dns`, its
/// endpoint 10.128.3.3:5353), a tenant's own Service on port 53, and a node nameserver
/// 192.168.50.1: the snapshot and the config.
fn steering_cluster() -> (SnapshotBuilder, Config) {
    let kube_dns = objects::service_ips(
        "kube-dns",
        &["172.30.0.10", "fd02::a"],
        "{port: 53, protocol: UDP}",
    )
    .in_namespace("kube-system");
    let kube_dns_slice = objects::endpoint_slice(
        "kube-dns-1",
        "kube-dns",
        "IPv4",
        "{port: 5353, protocol: UDP}",
        &[objects::ep("10.128.3.3", NODE)],
    )
    .in_namespace("kube-system");
    let rogue = objects::service("dns-default", "172.30.9.9", "{port: 53, protocol: UDP}")
        .in_namespace("tenant");
    let snap = Snapshot::builder()
        .with(fw("web", "[{type: Allow, to: {dnsName: '*.example.com'}}]"))
        .with(pod_on(NODE, "web", "a", &["10.128.0.5", "fd01::5"]))
        .with(kube_dns.object())
        .with(kube_dns_slice.object())
        .with(rogue.object());
    let mut config = Config::for_node(NODE);
    config.dns_proxy.resolv_conf_nameservers = vec!["192.168.50.1".parse().unwrap()];
    (snap, config)
}

fn steered(snap: SnapshotBuilder, config: &Config) -> Desired {
    plan_with_dns(
        &snap.build(),
        config,
        &Memory::default(),
        &DnsAnswers::default(),
    )
}

#[test]
fn only_dns_to_the_trusted_resolvers_is_steered() {
    let (snap, config) = steering_cluster();
    let flat = steered(snap, &config).ruleset.flatten();
    assert_eq!(
        elements(&flat, steer::RESOLVERS_V4),
        ["172.30.0.10", "192.168.50.1"]
    );
    assert_eq!(elements(&flat, steer::RESOLVERS_V6), ["fd02::a"]);
    let rules: Vec<String> = flat.chains[steer::CHAIN]
        .rules
        .iter()
        .map(rule_text)
        .collect();
    // First what a pod sends beyond its rate (per interface and source), then the steering.
    let steered = "ip saddr @fw-dns-pods-v4 ip daddr @fw-dns-resolvers-v4 meta l4proto";
    assert_eq!(
        rules[0],
        format!(
            "{steered} udp th dport 53 update @fw-dns-rate-v4 {{ iifname . ip saddr limit rate over 100/second burst 100 packets }} drop"
        ),
    );
    assert_eq!(
        rules[1],
        format!(
            "{steered} tcp th dport 53 tcp flags & (syn | ack) == syn update @fw-dns-rate-v4 {{ iifname . ip saddr limit rate over 100/second burst 100 packets }} drop"
        ),
    );
    // Then the query is marked pending: judged after service DNAT, handed to the proxy last.
    assert_eq!(
        rules[2],
        format!("{steered} udp th dport 53 meta mark set meta mark or 0x04000000"),
    );
}

#[test]
fn a_steered_query_is_judged_then_handed_to_the_proxy_within_a_bounded_rate() {
    let (snap, config) = steering_cluster();
    let flat = steered(snap, &config).ruleset.flatten();
    let chain_text = |name: &str| -> Vec<String> {
        let chain = &flat.chains[name];
        let base = chain.base.as_ref().expect("a base chain");
        let mut lines = vec![format!("{:?} {}", base.hook, base.priority)];
        lines.extend(chain.rules.iter().map(rule_text));
        lines
    };
    assert_eq!(
        chain_text(steer::JUDGE_CHAIN),
        [
            "Prerouting -99",
            "meta mark & 0x04000000 != 0 jump fw-dispatch"
        ]
    );
    assert_eq!(
        chain_text(steer::TPROXY_CHAIN)[..2],
        [
            "Prerouting -96".to_string(),
            "meta nfproto ipv4 meta mark & 0x04000000 != 0 meta l4proto udp meta mark set meta mark and 0xfbffffff tproxy ip to :15353 meta mark set meta mark or 0x01000000 accept".to_string(),
        ]
    );
    let rate = &flat.sets[steer::RATE_V4];
    assert_eq!(
        (rate.flags.dynamic, rate.timeout, rate.size),
        (true, Some(60), Some(65_535)),
        "a bounded set of buckets that forgets idle ones"
    );
}

#[test]
fn the_cluster_dns_and_its_endpoints_are_trusted_and_a_tenants_dns_service_is_not() {
    let (snap, config) = steering_cluster();
    let d = steered(snap, &config);
    let learning = learning::learning(&d.memory.firewall);
    assert!(learning.is_trusted("172.30.0.10".parse().unwrap()));
    // The endpoint service DNAT picks for the ClusterIP is trusted too (and listened at).
    assert!(learning.is_trusted("10.128.3.3".parse().unwrap()));
    assert!(
        learning
            .listen_at()
            .contains(&"10.128.3.3:5353".parse().unwrap())
    );
    assert!(
        !learning.is_trusted("172.30.9.9".parse().unwrap()),
        "a tenant's own Service"
    );
}

#[test]
fn dns_resolvers_replace_the_default_resolvers() {
    let (snap, mut config) = steering_cluster();
    config.dns_proxy.resolvers = vec!["10.0.0.53".parse().unwrap()];
    let flat = steered(snap, &config).ruleset.flatten();
    assert_eq!(elements(&flat, steer::RESOLVERS_V4), ["10.0.0.53"]);
    assert!(
        !flat.sets.contains_key(steer::RESOLVERS_V6),
        "no IPv6 resolver, no IPv6 steering"
    );
}

/// A `--dns-resolvers` address that is the ClusterIP of a Service other than the cluster DNS
/// (a tenant-independent resolver the operator runs) is found through the snapshot's
/// ClusterIP index: its endpoints are trusted, and follow the Service when its address moves.
#[test]
fn a_resolver_that_is_another_services_cluster_ip_trusts_that_services_endpoints() {
    let resolver = |ip: &str| {
        objects::service_ips("resolver", &[ip], "{name: dns, port: 53, protocol: UDP}")
            .in_namespace("infra")
            .object()
    };
    let slice = objects::endpoint_slice(
        "resolver-1",
        "resolver",
        "IPv4",
        "{name: dns, port: 5353, protocol: UDP}",
        &[objects::ep("10.128.7.7", NODE)],
    )
    .in_namespace("infra");
    let mut b = Snapshot::builder()
        .with(fw("web", "[{type: Allow, to: {dnsName: '*.example.com'}}]"))
        .with(pod_on(NODE, "web", "a", &["10.128.0.5"]))
        .with(resolver("172.30.5.5"))
        .with(slice.object());
    let mut config = Config::for_node(NODE);
    config.dns_proxy.resolvers = vec!["172.30.5.5".parse().unwrap()];
    let trusted = steer::trusted_resolvers(&b.clone().build(), &config);
    assert_eq!(
        trusted.backends,
        ["10.128.7.7:5353".parse().unwrap()].into(),
        "the endpoints of the resolver's Service"
    );
    // The Service moves to another ClusterIP: the old address is no Service's any more.
    b.insert(resolver("172.30.6.6"));
    let snap = b.build();
    assert!(steer::trusted_resolvers(&snap, &config).backends.is_empty());
    config.dns_proxy.resolvers = vec!["172.30.6.6".parse().unwrap()];
    assert_eq!(steer::trusted_resolvers(&snap, &config).backends.len(), 1);
}
