//! ACL logging of EgressFirewall verdicts (`k8s.ovn.org/acl-logging`).

use super::*;
use crate::nft::diff::{Op, diff};
use crate::nft::render::render_table;
use crate::plan::{Desired, Memory, plan_with_dns};
use crate::snapshot::SnapshotBuilder;
use crate::testing::objects;

const NODE: &str = "worker-1";
const RULES: &str = "[\
    {type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: TCP, port: 443}]}, \
    {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";

fn namespace(name: &str, acl_logging: Option<&str>) -> crate::api::Namespace {
    objects::namespace(name, &[])
        .acl_logging(acl_logging)
        .object()
}

fn snapshot(web: Option<&str>, other: Option<&str>) -> SnapshotBuilder {
    let pod = |ns: &str, name: &str, ip: &str| objects::pod(ns, name).on(NODE).ips(&[ip]).object();
    Snapshot::builder()
        .with(namespace("web", web))
        .with(namespace("other", other))
        .with(objects::egress_firewall("web", RULES).object())
        .with(objects::egress_firewall("other", RULES).object())
        .with(pod("web", "a", "10.128.0.5"))
        .with(pod("other", "b", "10.128.0.7"))
}

fn run(b: SnapshotBuilder, memory: &Memory) -> Desired {
    plan_with_dns(
        &b.build(),
        &Config::for_node(NODE),
        memory,
        &DnsAnswers::default(),
    )
}

#[test]
fn without_the_annotation_nothing_is_logged_and_nothing_changes() {
    let plain = run(snapshot(None, None), &Memory::default());
    let text = render_table(&plain.ruleset);
    assert!(!text.contains("log ") && !text.contains("acl-"), "{text}");
    assert!(plain.outputs.firewall.acl.entries.is_empty());
    // An annotation that logs nothing (empty severities) is no annotation.
    let empty = run(
        snapshot(Some(r#"{"deny": "", "allow": ""}"#), None),
        &Memory::default(),
    );
    assert_eq!(render_table(&empty.ruleset), text);
}

#[test]
fn a_logged_deny_goes_to_its_chain_and_the_book_names_object_and_rule() {
    let d = run(
        snapshot(Some(r#"{"deny": "alert"}"#), None),
        &Memory::default(),
    );
    let book = &d.outputs.firewall.acl;
    assert_eq!(book.entries.len(), 1, "only the deny rule of web: {book:?}");
    let (id, entry) = book.entries.iter().next().unwrap();
    assert_eq!(
        (entry.namespace.as_str(), entry.kind, entry.object.as_str()),
        ("web", "EgressFirewall", "default")
    );
    assert_eq!(entry.rule, "rule 1: Deny 0.0.0.0/0");
    assert_eq!(entry.action, acl_log::Action::Deny);
    let text = render_table(&d.ruleset);
    let chain = acl_log::chain_name(*id);
    assert!(text.contains(&format!(": goto {chain}")), "{text}");
    assert!(
        text.contains(&format!("log prefix \"acl:{id:016x}\" group 100 drop")),
        "{text}"
    );
    // The allow rule and the other namespace keep their plain verdicts.
    assert_eq!(text.matches("goto acl-").count(), 1, "{text}");
    assert!(text.contains(&acl_log::rate_set("web")));
    assert!(!text.contains(&acl_log::rate_set("other")));
}

#[test]
fn changing_the_annotation_touches_only_that_namespace() {
    let first = run(snapshot(None, None), &Memory::default());
    let logged = run(
        snapshot(Some(r#"{"deny": "alert", "allow": "info"}"#), None),
        &first.memory,
    );
    assert!(Arc::ptr_eq(
        logged.ruleset.part("fw/other").unwrap(),
        first.ruleset.part("fw/other").unwrap()
    ));
    let tx = diff(&first.ruleset, &logged.ruleset);
    let web = Names::new("web").chain;
    for op in &tx.ops {
        let name = match op {
            Op::AddChain { name, .. } | Op::AddRule { chain: name, .. } => name,
            Op::AddSet(s) | Op::AddElements(s) | Op::DeleteElements(s) => &s.name,
            other => panic!("unexpected {other:?}"),
        };
        let ours = name.starts_with("acl-") || name.starts_with(&web);
        assert!(ours && !name.contains("other"), "{name}: {tx:?}");
    }
    // Two chains of two rules and the rate set (7), and the verdicts of the two rules'
    // elements replaced, each deleted and added again (4): 11, whatever the other
    // namespaces hold.
    assert_eq!(tx.op_count(), 11, "{tx:?}");
    // And back: the plain table again.
    let off = run(snapshot(None, None), &logged.memory);
    assert_eq!(render_table(&off.ruleset), render_table(&first.ruleset));
}

#[test]
fn an_invalid_annotation_is_reported_and_leaves_other_namespaces_logged() {
    let d = run(
        snapshot(Some(r#"{"deny": "loud"}"#), Some(r#"{"deny": "notice"}"#)),
        &Memory::default(),
    );
    let book = &d.outputs.firewall.acl;
    let problems: Vec<_> = book.problems.iter().collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains(r#"Namespace "web""#) && problems[0].contains(".deny"));
    let namespaces: Vec<_> = book
        .entries
        .values()
        .map(|e| e.namespace.as_str())
        .collect();
    assert_eq!(namespaces, ["other"]);
}

#[test]
fn a_hostile_namespace_name_reaches_neither_the_prefix_nor_nft_syntax() {
    let hostile = "x\"; flush ruleset; \n#";
    // The builders write YAML: the name goes in afterwards.
    let mut ns = namespace(
        "placeholder",
        Some(r#"{"deny": "alert", "allow": "debug"}"#),
    );
    ns.metadata.name = Some(hostile.into());
    let mut fw: EgressFirewall = objects::egress_firewall("placeholder", RULES).object();
    fw.metadata.namespace = Some(hostile.into());
    let mut pod: crate::api::Pod = objects::pod("placeholder", "a")
        .on(NODE)
        .ips(&["10.128.0.5"])
        .object();
    pod.metadata.namespace = Some(hostile.into());
    let b = Snapshot::builder().with(ns).with(fw).with(pod);
    let d = run(b, &Memory::default());
    let book = &d.outputs.firewall.acl;
    assert_eq!(book.entries.len(), 2, "{book:?}");
    let text = render_table(&d.ruleset);
    for line in text.lines().filter(|l| l.contains("log prefix")) {
        assert!(!line.contains("flush"), "tenant text in the prefix: {line}");
    }
    // The text `--dry-run` prints is what the kernel accepts.
    crate::testing::nft_check::nft_check(&text);
}
