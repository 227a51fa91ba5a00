//! ACL logging of NetworkPolicy verdicts (`k8s.ovn.org/acl-logging`).

use super::tests::{NODE, bridge_of, pod, policy};
use crate::config::Config;
use crate::nft::diff::diff;
use crate::nft::render::render_full;
use crate::plan::acl_log::{Action, chain_name};
use crate::plan::{Desired, Memory, plan_with};
use crate::snapshot::{Snapshot, SnapshotBuilder};
use crate::testing::nft_check::nft_check;
use crate::testing::objects;

const WEB_ONLY: &str = "  podSelector: {matchLabels: {app: db}}\n  ingress:\n  - from:\n    \
    - podSelector: {matchLabels: {app: web}}\n";

fn namespace(name: &str, acl_logging: Option<&str>) -> crate::api::Namespace {
    objects::namespace(name, &[])
        .acl_logging(acl_logging)
        .object()
}

fn cluster(shop: Option<&str>) -> SnapshotBuilder {
    Snapshot::builder()
        .with(namespace("shop", shop))
        .with(namespace("other", None))
        .with(pod("shop", "db", &[("app", "db")], &["10.0.0.2"]))
        .with(pod("shop", "web", &[("app", "web")], &["10.0.0.3"]))
        .with(pod("other", "db", &[("app", "db")], &["10.0.0.4"]))
        .with(policy("shop", "db", WEB_ONLY))
        .with(policy("other", "db", WEB_ONLY))
}

fn run(b: SnapshotBuilder, memory: &Memory) -> Desired {
    plan_with(&b.build(), &Config::for_node(NODE), memory)
}

#[test]
fn allow_and_deny_of_an_annotated_namespace_go_to_logged_chains() {
    let plain = run(cluster(None), &Memory::default());
    let plain_text = render_full(&plain.ruleset);
    assert!(!plain_text.contains("acl-") && plain.outputs.netpol.acl.entries.is_empty());
    let d = run(
        cluster(Some(r#"{"deny": "alert", "allow": "info"}"#)),
        &Memory::default(),
    );
    let book = &d.outputs.netpol.acl;
    let mut entries: Vec<_> = book.entries.iter().collect();
    entries.sort_by_key(|(_, e)| e.action);
    let rules: Vec<_> = entries
        .iter()
        .map(|(_, e)| {
            (
                e.namespace.as_str(),
                e.object.as_str(),
                e.rule.as_str(),
                e.action,
            )
        })
        .collect();
    assert!(
        rules.contains(&("shop", "db", "ingress[0]", Action::Allow)),
        "{rules:?}"
    );
    assert!(
        rules.contains(&(
            "shop",
            "",
            "ingress: isolated, no rule allows",
            Action::Deny
        )),
        "{rules:?}"
    );
    assert!(
        rules.iter().all(|r| r.0 == "shop"),
        "other is not logged: {rules:?}"
    );
    let text = render_full(&d.ruleset);
    let deny = entries
        .iter()
        .find(|(_, e)| e.rule == "ingress: isolated, no rule allows")
        .unwrap()
        .0;
    assert!(
        text.contains(&format!("jump {}", chain_name(*deny))),
        "{text}"
    );
    // The dry-run text (inet and bridge tables) is what the kernel accepts.
    nft_check(&text);
    if let Some(bridge) = bridge_of(&d) {
        nft_check(&render_full(bridge));
    }
}

#[test]
fn changing_the_annotation_touches_only_that_namespace() {
    let first = run(cluster(None), &Memory::default());
    let logged = run(cluster(Some(r#"{"deny": "alert"}"#)), &first.memory);
    let tx = diff(&first.ruleset, &logged.ruleset);
    let other = crate::nft::names::object_name("np", "other/db");
    let text = format!("{tx:?}");
    assert!(!text.contains(&other), "other's chains untouched: {text}");
    // The policy set of shop's pod: its chain replaced (flush, delete, add with 3 rules) and
    // its dispatch element (delete, add); the two deny chains of 2 rules each and the rate
    // set: 15, whatever the other namespaces hold.
    assert_eq!(tx.op_count(), 15, "{text}");
    // Back to no annotation: the plain table again.
    let off = run(cluster(None), &logged.memory);
    assert_eq!(render_full(&off.ruleset), render_full(&first.ruleset));
}
