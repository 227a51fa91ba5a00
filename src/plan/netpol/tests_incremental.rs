//! The incremental planner against a planner from scratch: long seeded random sequences of
//! edits (policies added, edited, made invalid and removed; pods added, relabelled, moved
//! between nodes and removed; namespaces relabelled and annotated for ACL logging), and after
//! each step the tables, statuses, ACL log book and isolated pods must be those of a fresh
//! planner that starts from the same policies in force (`LastValid`, so an invalid edit
//! falls back the same way).

use super::tests::{NODE, policy};
use crate::config::Config;
use crate::nft::render::render_full;
use crate::plan::{Desired, Memory, plan_with};
use crate::snapshot::{Kind, ObjectKey, Snapshot};
use crate::state::LastValid;
use crate::testing::objects;

const NAMESPACES: [&str; 3] = ["ns-a", "ns-b", "ns-c"];
const PODS: usize = 10;
const POLICIES: usize = 8;

/// Policy specs: selected and peer pods by labels, namespaces by label, ipBlocks, rules
/// without peers, named ports on either side, both directions, deny-all, and one invalid.
const SPECS: [&str; 10] = [
    "  podSelector: {matchLabels: {app: web}}\n  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}], ports: [{port: 8080}]}]\n",
    "  podSelector: {}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {tag: t}}}]}]\n",
    "  podSelector: {matchLabels: {app: db}}\n  ingress: [{}]\n",
    "  podSelector: {matchLabels: {app: web}}\n  policyTypes: [Egress]\n  egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: metrics}]}]\n",
    "  podSelector: {matchLabels: {app: db}}\n  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.128/25]}}, {namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]}]\n",
    "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n  egress: [{ports: [{port: metrics}]}]\n",
    "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n",
    "  podSelector: {matchLabels: {app: web}}\n  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: metrics}, {protocol: UDP, port: 53}]}]\n",
    "  podSelector: {matchLabels: {role: client}}\n  policyTypes: [Egress]\n  egress: [{to: [{namespaceSelector: {matchLabels: {tag: u}}, podSelector: {}}]}]\n",
    // Invalid: an unknown protocol. An edit to it keeps the last valid version in force.
    "  podSelector: {}\n  ingress: [{ports: [{protocol: XTP, port: 80}]}]\n",
];

const ACL_LOGGING: [Option<&str>; 3] = [
    None,
    Some(r#"{"deny": "alert", "allow": "notice"}"#),
    Some(r#"{"deny": "loud"}"#),
];

/// splitmix64: a seeded sequence, the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Pod `i` with random labels, node and named port; its addresses depend on `i` only.
fn random_pod(rng: &mut Rng, i: usize) -> crate::api::Pod {
    let ns = *rng.pick(&NAMESPACES);
    let mut labels = vec![("app", *rng.pick(&["web", "db", "none"]))];
    if rng.below(2) == 0 {
        labels.push(("role", "client"));
    }
    let node = *rng.pick(&[NODE, NODE, "worker-2"]);
    let (v4, v6) = (format!("10.0.{i}.1"), format!("fd00::{i}:1"));
    let ips: Vec<&str> = match rng.below(3) {
        0 => vec![&v4],
        1 => vec![&v4, &v6],
        _ => vec![&v6],
    };
    let port = 9000 + rng.below(3) as u16;
    objects::pod(ns, &format!("p{i}"))
        .on(node)
        .labels(&labels)
        .ips(&ips[..])
        .named_ports(&[("metrics", "TCP", port)])
        .object()
}

fn random_namespace(rng: &mut Rng, name: &str) -> crate::api::Namespace {
    let tag = *rng.pick(&["t", "u", "v"]);
    objects::namespace(name, &[("tag", tag)])
        .acl_logging(*rng.pick(&ACL_LOGGING))
        .object()
}

/// Where pod `i` is now (it may have moved namespace), to remove or replace it.
fn pod_key(snapshot: &Snapshot, i: usize) -> Option<ObjectKey> {
    let name = format!("p{i}");
    snapshot.pods().keys().find(|k| k.name == name).cloned()
}

fn policy_key(snapshot: &Snapshot, j: usize) -> Option<ObjectKey> {
    let name = format!("q{j}");
    snapshot
        .network_policies()
        .keys()
        .find(|k| k.name == name)
        .cloned()
}

/// One random edit of `snapshot`.
fn step(rng: &mut Rng, snapshot: &Snapshot) -> Snapshot {
    let mut b = snapshot.to_builder();
    match rng.below(10) {
        0..=2 => {
            let j = rng.below(POLICIES);
            if let Some(key) = policy_key(snapshot, j) {
                b.remove(Kind::NetworkPolicy, &key);
            }
            let ns = *rng.pick(&NAMESPACES);
            b.insert(policy(ns, &format!("q{j}"), rng.pick::<&str>(&SPECS)));
        }
        3 => {
            if let Some(key) = policy_key(snapshot, rng.below(POLICIES)) {
                b.remove(Kind::NetworkPolicy, &key);
            }
        }
        4..=6 => {
            let i = rng.below(PODS);
            if let Some(key) = pod_key(snapshot, i) {
                b.remove(Kind::Pod, &key);
            }
            b.insert(random_pod(rng, i));
        }
        7 => {
            if let Some(key) = pod_key(snapshot, rng.below(PODS)) {
                b.remove(Kind::Pod, &key);
            }
        }
        _ => {
            let name = *rng.pick(&NAMESPACES);
            b.insert(random_namespace(rng, name));
        }
    }
    b.build()
}

fn plan(snapshot: &Snapshot, memory: &Memory) -> Desired {
    plan_with(snapshot, &Config::for_node(NODE), memory)
}

/// Asserts that the incremental plan equals the fresh one in everything NetworkPolicy
/// hands on.
fn assert_same(incremental: &Desired, fresh: &Desired, at: &str) {
    assert_eq!(
        render_full(&incremental.ruleset),
        render_full(&fresh.ruleset),
        "{at}: inet table"
    );
    assert_eq!(
        super::tests::bridge_of(incremental).map(render_full),
        super::tests::bridge_of(fresh).map(render_full),
        "{at}: bridge table"
    );
    assert_eq!(incremental.statuses, fresh.statuses, "{at}: statuses");
    let (i, f) = (&incremental.outputs.netpol, &fresh.outputs.netpol);
    assert_eq!(i.acl, f.acl, "{at}: ACL log book");
    assert_eq!(
        incremental.memory.netpol.isolated(),
        fresh.memory.netpol.isolated(),
        "{at}: isolated pods"
    );
}

#[test]
fn random_edit_sequences_plan_incrementally_what_a_fresh_planner_plans() {
    for seed in 1..=6u64 {
        let mut rng = Rng(seed);
        let mut b = Snapshot::builder();
        for name in NAMESPACES {
            b.insert(random_namespace(&mut rng, name));
        }
        for i in 0..PODS {
            b.insert(random_pod(&mut rng, i));
        }
        for j in 0..POLICIES / 2 {
            let ns = *rng.pick(&NAMESPACES);
            b.insert(policy(ns, &format!("q{j}"), rng.pick::<&str>(&SPECS[..9])));
        }
        let mut snapshot = b.build();
        let mut memory = plan(&snapshot, &Memory::default()).memory;
        for n in 0..150 {
            snapshot = step(&mut rng, &snapshot);
            let fresh = plan(&snapshot, &LastValid::of(&memory).into_memory());
            let incremental = plan(&snapshot, &memory);
            assert_same(&incremental, &fresh, &format!("seed {seed}, step {n}"));
            memory = incremental.memory;
        }
    }
}

/// What makes a plan cheap: a pod change in one namespace visits only that namespace's
/// policies (and those with a named egress port), a policy edit only that policy; the
/// other policies are not looked at.
#[test]
fn a_change_visits_only_the_policies_it_can_touch() {
    let mut b = Snapshot::builder();
    for i in 0..20 {
        let ns = format!("ns-{i}");
        b.insert(objects::namespace(&ns, &[]).object());
        b.insert(
            objects::pod(&ns, "web")
                .on(NODE)
                .labels(&[("app", "web")])
                .ips(&[format!("10.0.{i}.1").as_str()])
                .object(),
        );
        b.insert(policy(&ns, "web", SPECS[0]));
    }
    b.insert(policy("ns-9", "named", SPECS[3]));
    let first = plan(&b.clone().build(), &Memory::default());
    let memory = &first.memory.netpol;
    let visited = |snapshot: &Snapshot| {
        let validation = super::validate(memory, snapshot.network_policies());
        let in_force = &validation.validated.in_force;
        let changes = memory.seen.changes(snapshot);
        let visit = super::visit::policies(
            validation.changed.as_ref(),
            &changes,
            &Default::default(),
            in_force,
            &memory.named_egress,
        );
        let keys: Vec<String> = visit.entries(in_force).map(|(k, _)| k.clone()).collect();
        keys
    };
    let mut relabel = b.clone();
    relabel.insert(
        objects::pod("ns-3", "web")
            .on(NODE)
            .labels(&[("app", "idle")])
            .ips(&["10.0.3.1"])
            .object(),
    );
    assert_eq!(visited(&relabel.build()), ["ns-3/web", "ns-9/named"]);
    let mut edit = b.clone();
    edit.insert(policy("ns-5", "web", SPECS[2]));
    assert_eq!(visited(&edit.build()), ["ns-5/web"]);
    assert!(visited(&b.build()).is_empty(), "nothing changed");
}
