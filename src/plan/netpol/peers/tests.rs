use super::*;
use crate::api::network_policy::validate;
use crate::config::Config;
use crate::nft::diff::{Op, diff};
use crate::nft::render::render_full;
use crate::plan::netpol::tests::{NODE, pod, policy};
use crate::plan::{Desired, Memory, plan_with};
use crate::snapshot::{Kind, ObjectKey, SnapshotBuilder};
use crate::testing::nft_check::nft_check;
use crate::testing::objects;

const FROM_MONITORING: &str = "  podSelector: {}\n  ingress:\n  - from: [{namespaceSelector: {matchLabels: {purpose: monitoring}}}]\n    ports: [{port: 9090}]\n";
const FROM_OWN_WEB: &str =
    "  podSelector: {}\n  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]\n";

/// Namespaces `a` and `b` with a server and a web pod each, and `mon` (purpose=monitoring)
/// with one pod.
fn cluster() -> SnapshotBuilder {
    Snapshot::builder()
        .with(objects::namespace("a", &[]).object())
        .with(objects::namespace("b", &[]).object())
        .with(objects::namespace("mon", &[("purpose", "monitoring")]).object())
        .with(pod("a", "server", &[("app", "server")], &["10.0.0.1"]))
        .with(pod("a", "web", &[("app", "web")], &["10.0.0.2"]))
        .with(pod("b", "server", &[("app", "server")], &["10.0.0.3"]))
        .with(pod("b", "web", &[("app", "web")], &["10.0.0.4"]))
        .with(pod("mon", "prom", &[("app", "prom")], &["10.0.9.1"]))
}

fn run(b: &SnapshotBuilder, memory: &Memory) -> Desired {
    plan_with(&b.clone().build(), &Config::for_node(NODE), memory)
}

/// [`cluster`] with one monitoring policy in `a` and one in `b` (two users of one peer
/// set), and its plan.
fn monitored_from_a_and_b() -> (SnapshotBuilder, Desired) {
    let b = cluster()
        .with(policy("a", "mon", FROM_MONITORING))
        .with(policy("b", "mon", FROM_MONITORING));
    let first = run(&b, &Memory::default());
    (b, first)
}

/// The name of the shared peer set of `key`.
fn set_name(d: &Desired, key: &PeerKey) -> String {
    d.memory.netpol.peer_sets.name(key).unwrap().to_string()
}

fn key(ns: &str, spec: &str) -> PeerKey {
    let v = validate(&policy(ns, "x", spec)).expect("a valid policy");
    let rule = &v.ingress.as_ref().unwrap()[0];
    PeerKey::of(ns, rule.peers.as_deref().unwrap())
}

/// The names of the shared peer sets the chains of part `np/<ns>/<name>` look up.
fn looked_up(d: &Desired, policy: &str) -> BTreeSet<String> {
    let part = d
        .ruleset
        .part(&format!("np/{policy}"))
        .expect("the policy's part");
    part.chains
        .values()
        .flat_map(|c| &c.rules)
        .flat_map(|r| &r.stmts)
        .flat_map(|s| s.set_refs())
        .filter(|s| s.starts_with("np-peers-"))
        .map(str::to_string)
        .collect()
}

fn peer_parts(d: &Desired) -> Vec<&str> {
    d.ruleset
        .part_keys()
        .filter(|k| k.starts_with("np-peers/"))
        .collect()
}

#[test]
fn keys_are_canonical_and_own_namespace_peers_are_per_namespace() {
    let a = "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.2.0.0/16, 10.1.0.0/16]}}, {namespaceSelector: {matchLabels: {x: y}}}]}]\n";
    let b = "  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {x: y}}}, {ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 10.2.0.0/16]}}, {namespaceSelector: {matchLabels: {x: y}}}]}]\n";
    // Order, duplicates and the namespace do not matter to selectors of other namespaces.
    assert_eq!(key("a", a), key("b", b));
    assert_eq!(key("a", a).canonical(), key("b", b).canonical());
    // A peer without namespaceSelector means the policy's own namespace.
    assert_eq!(key("a", FROM_OWN_WEB), key("a", FROM_OWN_WEB));
    assert_ne!(key("a", FROM_OWN_WEB), key("b", FROM_OWN_WEB));
    assert_ne!(
        key("a", FROM_OWN_WEB).canonical(),
        key("b", FROM_OWN_WEB).canonical()
    );
}

#[test]
fn identical_selectors_share_one_set_counted_by_its_users() {
    let b = cluster()
        .with(policy("a", "mon", FROM_MONITORING))
        .with(policy("b", "mon", FROM_MONITORING))
        .with(policy("a", "web", FROM_OWN_WEB))
        .with(policy("a", "web-2", FROM_OWN_WEB))
        .with(policy("b", "web", FROM_OWN_WEB));
    let d = run(&b, &Memory::default());
    let sets = &d.memory.netpol.peer_sets;
    let (mon, own_a) = (key("a", FROM_MONITORING), key("a", FROM_OWN_WEB));
    assert_eq!(sets.users(&mon), Some(2));
    assert_eq!(sets.users(&own_a), Some(2));
    assert_eq!(sets.users(&key("b", FROM_OWN_WEB)), Some(1));
    assert_eq!(sets.len(), 3);
    assert_eq!(peer_parts(&d).len(), 3);
    // Both monitoring policies look up the one set; it holds the monitoring pod.
    let name = set_name(&d, &mon);
    let expected = BTreeSet::from([format!("{name}-v4")]);
    assert_eq!(looked_up(&d, "a/mon"), expected);
    assert_eq!(looked_up(&d, "b/mon"), expected);
    let text = render_full(&d.ruleset);
    assert!(
        text.contains(&format!("set {name}-v4 {{")) && text.contains("10.0.9.1"),
        "{text}"
    );
    assert_eq!(text.matches(&format!("set {name}-v4 {{")).count(), 1);
    // Own-namespace peers: a's two policies share, b's has its own.
    assert_eq!(looked_up(&d, "a/web"), looked_up(&d, "a/web-2"));
    assert_ne!(looked_up(&d, "a/web"), looked_up(&d, "b/web"));
    nft_check(&text);
}

#[test]
fn a_shared_set_leaves_with_its_last_user() {
    let (mut b, first) = monitored_from_a_and_b();
    let mon = key("a", FROM_MONITORING);
    let name = set_name(&first, &mon);
    let part_key = format!("np-peers/{name}");
    // One user goes: the set stays as it is (the same part), the diff leaves it alone.
    b.remove(Kind::NetworkPolicy, &ObjectKey::new("a", "mon"));
    let second = run(&b, &first.memory);
    assert_eq!(second.memory.netpol.peer_sets.users(&mon), Some(1));
    assert!(Arc::ptr_eq(
        first.ruleset.part(&part_key).unwrap(),
        second.ruleset.part(&part_key).unwrap()
    ));
    let tx = diff(&first.ruleset, &second.ruleset);
    assert!(
        tx.ops.iter().all(|op| !format!("{op:?}").contains(&name)),
        "{:?}",
        tx.ops
    );
    // The last user goes: so does the set.
    b.remove(Kind::NetworkPolicy, &ObjectKey::new("b", "mon"));
    b.insert(policy("b", "deny", "  podSelector: {}\n"));
    let third = run(&b, &second.memory);
    assert_eq!(third.memory.netpol.peer_sets.users(&mon), None);
    assert!(third.ruleset.part(&part_key).is_none());
    let tx = diff(&second.ruleset, &third.ruleset);
    assert!(
        tx.ops
            .iter()
            .any(|op| matches!(op, Op::DeleteSet(s) if *s == format!("{name}-v4"))),
        "{:?}",
        tx.ops
    );
}

#[test]
fn an_edit_moves_the_policy_to_another_set_and_the_old_one_stays_for_its_other_user() {
    let (mut b, first) = monitored_from_a_and_b();
    let other = "  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {purpose: logging}}}, {podSelector: {}}]}]\n";
    b.insert(policy("a", "mon", other));
    let second = run(&b, &first.memory);
    let sets = &second.memory.netpol.peer_sets;
    assert_eq!(sets.users(&key("a", FROM_MONITORING)), Some(1));
    assert_eq!(sets.users(&key("a", other)), Some(1));
    assert_ne!(looked_up(&second, "a/mon"), looked_up(&second, "b/mon"));
    // The edit cost that policy's part and its new set; b's part is the same `Arc`.
    assert!(Arc::ptr_eq(
        first.ruleset.part("np/b/mon").unwrap(),
        second.ruleset.part("np/b/mon").unwrap()
    ));
    b.insert(policy("b", "mon", other));
    let third = run(&b, &second.memory);
    let sets = &third.memory.netpol.peer_sets;
    assert_eq!(sets.users(&key("a", FROM_MONITORING)), None);
    assert_eq!(
        peer_parts(&third).len(),
        2,
        "a's and b's own-namespace peers"
    );
    assert_eq!(
        render_full(&third.ruleset),
        render_full(&run(&b, &Memory::default()).ruleset)
    );
}

#[test]
fn a_peer_pod_change_rewrites_the_shared_set_not_the_policies() {
    let (mut b, first) = monitored_from_a_and_b();
    b.insert(pod("mon", "prom-2", &[("app", "prom")], &["10.0.9.2"]));
    let second = run(&b, &first.memory);
    for policy in ["np/a/mon", "np/b/mon"] {
        assert!(Arc::ptr_eq(
            first.ruleset.part(policy).unwrap(),
            second.ruleset.part(policy).unwrap()
        ));
    }
    let tx = diff(&first.ruleset, &second.ruleset);
    let name = set_name(&second, &key("a", FROM_MONITORING));
    // The new peer is one element of the shared set (aggregated with its neighbour).
    assert!(
        tx.ops.iter().all(|op| match op {
            Op::AddElements(s) | Op::DeleteElements(s) => s.name == format!("{name}-v4"),
            _ => false,
        }),
        "{:?}",
        tx.ops
    );
}

#[test]
fn a_family_appearing_in_a_shared_set_adds_its_users_rules() {
    let (mut b, first) = monitored_from_a_and_b();
    assert!(!render_full(&first.ruleset).contains("ip6 saddr @np-peers-"));
    b.insert(pod("mon", "prom-6", &[("app", "prom")], &["fd00::9"]));
    let second = run(&b, &first.memory);
    let text = render_full(&second.ruleset);
    assert_eq!(
        text.matches("ip6 saddr @np-peers-").count(),
        2,
        "both users' chains: {text}"
    );
    assert_eq!(text, render_full(&run(&b, &Memory::default()).ruleset));
    // And goes again.
    b.remove(Kind::Pod, &ObjectKey::new("mon", "prom-6"));
    let third = run(&b, &second.memory);
    assert_eq!(
        render_full(&third.ruleset),
        render_full(&first.ruleset),
        "back to the first plan"
    );
}

#[test]
fn colliding_names_never_share_a_set() {
    let mon = key("a", FROM_MONITORING);
    let first_choice = candidate(&mon.canonical(), 0);
    let mut sets = PeerSets::default();
    // Another key already holds the name this one hashes to.
    sets.reserve_for_test(&first_choice, key("a", FROM_OWN_WEB));
    let snapshot = cluster().build();
    let index = PodIndex::new(&snapshot, NODE);
    let mut parts = Parts::new();
    let lookup = sets.lookup(mon.clone(), &index, &mut parts);
    let name = sets.name(&mon).unwrap();
    assert_ne!(name, first_choice);
    assert_eq!(name, candidate(&mon.canonical(), 1));
    assert_eq!(lookup.set(IpFamily::V4), Some(format!("{name}-v4")));
    assert!(parts.contains_key(&format!("np-peers/{name}")));
}
