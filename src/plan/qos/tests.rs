use super::*;
use crate::api::Pod;
use crate::nft::diff::diff;
use crate::nft::render::rule_text;
use crate::plan::{Desired, Memory, plan_with};
use crate::snapshot::ObjectKey;
use crate::testing::listing::set_elements as elements;
use crate::testing::objects;

const NODE: &str = "worker-1";

fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ips: &[&str]) -> Pod {
    pod_on(NODE, ns, name, labels, ips)
}

fn pod_on(node: &str, ns: &str, name: &str, labels: &[(&str, &str)], ips: &[&str]) -> Pod {
    objects::pod(ns, name)
        .on(node)
        .labels(labels)
        .ips(ips)
        .object()
}

fn qos(ns: &str, rules: &str) -> EgressQoS {
    objects::egress_qos(ns, rules).object()
}

const VOICE_RULES: &str = "[\
    {dscp: 46, dstCIDR: 203.0.113.0/24, podSelector: {matchLabels: {app: voip}}}, \
    {dscp: 26, ports: [{protocol: UDP, port: 5060}, {protocol: tcp, port: 5060}]}, \
    {dscp: 8, dstCIDR: '2001:db8::/32'}, \
    {dscp: 4, dstCIDR: 0.0.0.0/0}]";

fn voice_snapshot() -> crate::snapshot::SnapshotBuilder {
    let mut host_net = pod("voice", "agent", &[("app", "voip")], &["192.168.50.11"]);
    host_net.spec.as_mut().unwrap().host_network = Some(true);
    let mut done = pod("voice", "job", &[("app", "voip")], &["10.128.0.9"]);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    Snapshot::builder()
        .with(qos("voice", VOICE_RULES))
        .with(pod(
            "voice",
            "sip",
            &[("app", "voip")],
            &["10.128.0.5", "fd01::5"],
        ))
        .with(pod("voice", "web", &[("app", "web")], &["10.128.0.6"]))
        .with(pod("voice", "pending", &[("app", "voip")], &[]))
        .with(pod_on(
            "worker-2",
            "voice",
            "remote",
            &[("app", "voip")],
            &["10.128.2.5"],
        ))
        .with(host_net)
        .with(done)
        .with(pod("other", "db", &[("app", "voip")], &["10.128.0.7"]))
}

/// The plan, its table flattened (namespace parts merged) to look up chains and sets by name.
fn run(builder: crate::snapshot::SnapshotBuilder, memory: &Memory) -> Desired {
    let mut d = plan_with(&builder.build(), &Config::for_node(NODE), memory);
    d.ruleset = d.ruleset.flatten();
    d
}

fn rules(table: &Table, chain: &str) -> Vec<String> {
    table.chains[chain].rules.iter().map(rule_text).collect()
}

#[test]
fn chain_holds_the_rules_in_order_per_family() {
    let d = run(voice_snapshot(), &Memory::default());
    let chain = object_name("qos", "voice");
    let c = &chain;
    assert_eq!(
        rules(&d.ruleset, c),
        [
            format!(
                "ip saddr @{c}-r0-v4 ip daddr {{ 203.0.113.0/24 }} counter ip dscp set 46 return \
                 comment \"EgressQoS voice rule 0\""
            ),
            "meta nfproto ipv4 meta l4proto . th dport { tcp . 5060, udp . 5060 } counter \
             ip dscp set 26 return comment \"EgressQoS voice rule 1\""
                .into(),
            "meta nfproto ipv6 meta l4proto . th dport { tcp . 5060, udp . 5060 } counter \
             ip6 dscp set 26 return comment \"EgressQoS voice rule 1\""
                .into(),
            "ip6 daddr { 2001:db8::/32 } counter ip6 dscp set 8 return \
             comment \"EgressQoS voice rule 2\""
                .into(),
            "meta nfproto ipv4 counter ip dscp set 4 return comment \"EgressQoS voice rule 3\""
                .into(),
        ]
    );
    // Only local, running, pod-network pods with an IP; only the selected one in the rule set.
    assert_eq!(elements(&d.ruleset, &format!("{c}-r0-v4")), ["10.128.0.5"]);
    assert!(
        !d.ruleset.sets.contains_key(&format!("{c}-r0-v6")),
        "v4-only rule"
    );
    assert_eq!(
        elements(&d.ruleset, PODS_V4),
        [
            format!("10.128.0.5 : jump {c}"),
            format!("10.128.0.6 : jump {c}")
        ]
    );
    assert_eq!(
        elements(&d.ruleset, PODS_V6),
        [format!("fd01::5 : jump {c}")]
    );
    assert_eq!(
        rules(&d.ruleset, MANGLE_POSTROUTING),
        ["ip saddr vmap @qos-pods-v4", "ip6 saddr vmap @qos-pods-v6"]
    );
    assert_eq!(d.statuses.len(), 1);
    assert_eq!(d.statuses[0].result, Ok(()));
    assert_eq!(d.memory.qos.in_force["voice"].valid.rules.len(), 4);
}

#[test]
fn namespace_without_egress_qos_gets_nothing() {
    let d = run(voice_snapshot(), &Memory::default());
    let table = &d.ruleset;
    let qos_chains: Vec<_> = table
        .chains
        .keys()
        .filter(|c| c.starts_with("qos-"))
        .collect();
    assert_eq!(qos_chains, [&object_name("qos", "voice")]);
    assert!(
        !elements(&d.ruleset, PODS_V4)
            .iter()
            .any(|e| e.contains("10.128.0.7"))
    );

    let empty = run(
        Snapshot::builder().with(pod("a", "p", &[], &["10.128.0.3"])),
        &Memory::default(),
    );
    assert!(empty.ruleset.sets[PODS_V4].elements.is_empty());
    assert!(empty.statuses.is_empty() && empty.memory.qos.in_force.is_empty());
}

#[test]
fn pod_churn_and_relabelling_are_element_updates_only() {
    let before = run(voice_snapshot(), &Memory::default()).ruleset;
    let mut b = voice_snapshot();
    // The web pod becomes a voip pod, a new pod starts, the sip pod goes away.
    b.insert(pod("voice", "web", &[("app", "voip")], &["10.128.0.6"]));
    b.insert(pod("voice", "new", &[], &["10.128.0.8", "fd01::8"]));
    b.remove(Kind::Pod, &ObjectKey::new("voice", "sip"));
    let after = run(b, &Memory::default()).ruleset;
    let tx = diff(&before, &after);
    crate::plan::assert_element_updates_only(&tx);
    let c = object_name("qos", "voice");
    assert_eq!(elements(&after, &format!("{c}-r0-v4")), ["10.128.0.6"]);
    assert_eq!(elements(&after, PODS_V6), [format!("fd01::8 : jump {c}")]);
}

#[test]
fn invalid_update_keeps_the_last_valid_rules_of_that_namespace_only() {
    let first = run(
        voice_snapshot().with(qos("other", "[{dscp: 10}]")),
        &Memory::default(),
    );
    let broken = voice_snapshot()
        .with(qos("voice", "[{dscp: 12}, {dscp: 99}]"))
        .with(qos("other", "[{dscp: 20}]"));
    let second = run(broken, &first.memory);
    let voice = object_name("qos", "voice");
    assert_eq!(
        rules(&second.ruleset, &voice),
        rules(&first.ruleset, &voice)
    );
    assert_eq!(
        second.memory.qos.in_force["voice"],
        first.memory.qos.in_force["voice"]
    );
    let other = rules(&second.ruleset, &object_name("qos", "other"));
    assert!(other[0].contains("ip dscp set 20"), "{other:?}");
    let voice_status = second
        .statuses
        .iter()
        .find(|s| s.key.namespace == "voice")
        .unwrap();
    assert_eq!(
        voice_status.result,
        Err("spec.egress[1].dscp: dscp 99 out of range 0-63".into())
    );
    // The kept rules follow the current pods.
    let mut b = voice_snapshot().with(qos("voice", "[{dscp: 99}]"));
    b.insert(pod("voice", "new", &[], &["10.128.0.8"]));
    let third = run(b, &second.memory);
    assert!(elements(&third.ruleset, PODS_V4).contains(&format!("10.128.0.8 : jump {voice}")));

    // Invalid with nothing remembered (fresh start): nothing planned, error reported.
    let fresh = run(
        voice_snapshot().with(qos("voice", "[{dscp: 64}]")),
        &Memory::default(),
    );
    assert!(!fresh.ruleset.chains.contains_key(&voice));
    assert!(fresh.memory.qos.in_force.is_empty());
    assert!(fresh.statuses[0].result.is_err());

    // Deleting the object removes its rules and forgets it.
    let mut b = voice_snapshot();
    b.remove(Kind::EgressQoS, &ObjectKey::new("voice", "default"));
    let gone = run(b, &second.memory);
    assert!(!gone.ruleset.chains.contains_key(&voice));
    assert!(!gone.memory.qos.in_force.contains_key("voice"));
}

#[test]
fn an_object_not_named_default_is_reported_and_ignored() {
    let d = run(
        voice_snapshot().with(
            objects::egress_qos("voice", "[{dscp: 1}]")
                .named("qos")
                .object(),
        ),
        &Memory::default(),
    );
    let reported: Vec<_> = d
        .statuses
        .iter()
        .map(|s| (s.key.to_string(), s.result.clone()))
        .collect();
    assert_eq!(
        reported,
        [
            ("voice/default".to_string(), Ok(())),
            (
                "voice/qos".to_string(),
                Err(
                    r#"metadata.name: must be "default" (one object per namespace), got "qos""#
                        .into()
                )
            ),
        ]
    );
    assert_eq!(d.memory.qos.in_force["voice"].valid.rules[0].dscp, 46);
}

#[test]
fn the_ruleset_is_deterministic_and_every_name_is_a_safe_identifier() {
    let a = run(voice_snapshot(), &Memory::default());
    let b = run(voice_snapshot(), &Memory::default());
    assert_eq!(a.ruleset, b.ruleset);
    let table = &a.ruleset;
    let names = table.chains.keys().chain(table.sets.keys());
    for n in names {
        assert!(crate::nft::names::is_valid_identifier(n), "{n}");
    }
}

/// 1000 rules (all with a podSelector) x 1000 local pods: prints the planning time.
/// `cargo test --release --lib plan::qos::tests::scale -- --nocapture`
#[test]
fn scale_1000_rules_by_1000_pods() {
    let rules: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                "{{dscp: {}, dstCIDR: 198.18.{}.0/24, podSelector: {{matchLabels: {{app: a{}}}}}}}",
                i % 64,
                i % 256,
                i % 100
            )
        })
        .collect();
    let mut b = Snapshot::builder().with(qos("big", &format!("[{}]", rules.join(", "))));
    for i in 0..1000u32 {
        let ip = format!("10.128.{}.{}", i / 250, i % 250 + 1);
        b.insert(pod(
            "big",
            &format!("p{i}"),
            &[("app", &format!("a{}", i % 100))],
            &[&ip],
        ));
    }
    let snap = b.build();
    let cfg = Config::for_node(NODE);
    let start = std::time::Instant::now();
    let d = plan_with(&snap, &cfg, &Memory::default());
    let took = start.elapsed();
    let chain = object_name("qos", "big");
    let flat = d.ruleset.flatten();
    assert_eq!(flat.chains[&chain].rules.len(), 1000);
    assert_eq!(flat.sets[PODS_V4].elements.len(), 1000);
    // Each rule's set holds the 10 pods with its label.
    assert_eq!(flat.sets[&format!("{chain}-r7-v4")].elements.len(), 10);

    // Relabelling one pod from a0 to a1: it leaves the sets of the 10 rules selecting a0
    // and joins the 10 selecting a1, nothing else.
    let mut b = snap.to_builder();
    b.insert(pod("big", "p0", &[("app", "a1")], &["10.128.0.1"]));
    let relabelled = plan_with(&b.build(), &cfg, &Memory::default());
    let start = std::time::Instant::now();
    let tx = diff(&d.ruleset, &relabelled.ruleset);
    let diff_took = start.elapsed();
    assert_eq!(tx.op_count(), 20, "{tx:?}");
    println!(
        "qos plan: 1000 rules x 1000 local pods in {took:?}; diff after one relabel: {} \
         element ops in {diff_took:?}",
        tx.op_count()
    );
}
