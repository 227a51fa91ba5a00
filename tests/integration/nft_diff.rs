//! Diff and engine properties against the faithful in-memory backend (no root needed):
//! applying diff(a, b) on top of a yields b, an unchanged table costs zero operations,
//! an element change costs exactly that element, and a rejected transaction changes nothing.

use nodeplane::nft::fake::apply_to;
use nodeplane::nft::*;
use nodeplane::testing::ir::COUNTED_INTERVAL;
use proptest::prelude::*;
use std::net::Ipv4Addr;

fn table(chains: &[(&str, usize)], elements: &[(u8, &str)]) -> Table {
    let mut t = Table::new(TABLE_NAME);
    let mut base = Chain::base(
        "forward",
        BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Forward,
            priority: 0,
            policy: Policy::Accept,
        },
    );
    base.push(Rule::new(vec![Stmt::vmap(
        vec![Field::Ip4Daddr],
        "dispatch",
    )]));
    t.add_chain(base);
    for (name, rules) in chains {
        let mut c = Chain::regular(*name);
        for i in 0..*rules {
            c.push(Rule::new(vec![
                Stmt::matches(Field::ThDport, Value::Port(1000 + i as u16)),
                Stmt::Counter,
                Stmt::Verdict(Verdict::Drop),
            ]));
        }
        t.add_chain(c);
    }
    let mut m = Set::new("dispatch", vec![DataType::Ipv4Addr], SetKind::VerdictMap);
    for (last_octet, chain) in elements {
        m.insert_mapping(
            vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(
                10,
                0,
                0,
                *last_octet,
            )))],
            ElemData::Verdict(Verdict::Goto(chain.to_string())),
        );
    }
    t.add_set(m);
    t
}

fn after(current: &Table, tx: &Transaction) -> Table {
    let mut model = Some(current.clone());
    apply_to(&mut model, tx).expect("transaction applies to the model");
    model.expect("table still exists")
}

#[test]
fn unchanged_table_is_an_empty_transaction() {
    let t = table(&[("a", 2), ("b", 1)], &[(1, "a"), (2, "b")]);
    assert!(diff(&t, &t).is_empty());
}

#[test]
fn one_element_change_costs_one_operation() {
    let a = table(&[("a", 2), ("b", 1)], &[(1, "a"), (2, "b")]);
    let b = table(&[("a", 2), ("b", 1)], &[(1, "a"), (2, "b"), (3, "b")]);
    let tx = diff(&a, &b);
    assert_eq!(tx.op_count(), 1, "{tx:#?}");
    assert!(matches!(&tx.ops[0], Op::AddElements(s) if s.elements.len() == 1));
    assert_eq!(after(&a, &tx), b);
}

#[test]
fn changed_verdict_is_delete_then_add_of_that_element() {
    let a = table(&[("a", 1), ("b", 1)], &[(1, "a")]);
    let b = table(&[("a", 1), ("b", 1)], &[(1, "b")]);
    let tx = diff(&a, &b);
    assert_eq!(tx.op_count(), 2);
    assert_eq!(after(&a, &tx), b);
}

/// A counted interval map with one commented element.
fn counted(comment: &str, v: Verdict) -> Table {
    let mut t = table(&[("a", 1)], &[]);
    let mut m = Set::new("rules", vec![DataType::Ipv4Addr], SetKind::VerdictMap)
        .with_flags(COUNTED_INTERVAL);
    m.insert_commented_mapping(
        vec![KeyPart::Prefix("10.0.0.0/8".parse().unwrap())],
        ElemData::Verdict(v),
        comment.into(),
    );
    t.add_set(m);
    t
}

#[test]
fn changed_element_comment_is_delete_then_add_and_counter_flag_recreates_the_map() {
    let a = counted("rule 0: Deny 10.0.0.0/8", Verdict::Drop);
    assert!(diff(&a, &a.clone()).is_empty());
    // A plain add of an existing key keeps the kernel's old comment: the comment only
    // changes through a delete and an add of the key.
    let b = counted("rule 1: Deny 10.0.0.0/8", Verdict::Drop);
    let tx = diff(&a, &b);
    assert_eq!(tx.op_count(), 2, "{tx:#?}");
    assert!(matches!(&tx.ops[0], Op::DeleteElements(_)));
    assert!(matches!(&tx.ops[1], Op::AddElements(s) if s.flags.counter));
    assert_eq!(after(&a, &tx), b);
    // Counters are a declaration property: dropping them recreates the map.
    let mut c = b.clone();
    c.sets.get_mut("rules").unwrap().flags.counter = false;
    let tx = diff(&b, &c);
    assert!(
        tx.ops
            .iter()
            .any(|op| matches!(op, Op::DeleteSet(n) if n == "rules"))
    );
    assert_eq!(after(&b, &tx), c);
}

#[test]
fn only_the_changed_chain_is_rewritten() {
    let a = table(&[("a", 2), ("b", 1)], &[(1, "a")]);
    let b = table(&[("a", 3), ("b", 1)], &[(1, "a")]);
    let tx = diff(&a, &b);
    assert_eq!(tx.ops[0], Op::FlushChain("a".into()));
    assert_eq!(tx.ops.len(), 4, "flush + 3 rules: {tx:#?}");
    assert!(tx.ops.iter().all(|op| match op {
        Op::AddRule { chain, .. } => chain == "a",
        _ => true,
    }));
}

#[test]
fn removed_chain_loses_its_map_elements_before_it_is_deleted() {
    let a = table(&[("a", 1), ("b", 1)], &[(1, "a"), (2, "b")]);
    let b = table(&[("a", 1)], &[(1, "a")]);
    let tx = diff(&a, &b);
    let pos = |pred: &dyn Fn(&Op) -> bool| tx.ops.iter().position(pred).unwrap();
    let del_elem = pos(&|op| matches!(op, Op::DeleteElements(_)));
    let del_chain = pos(&|op| matches!(op, Op::DeleteChain(c) if c == "b"));
    assert!(del_elem < del_chain);
    assert_eq!(after(&a, &tx), b);
}

#[test]
fn engine_sends_nothing_the_second_time_and_reads_back_after_a_rejection() {
    let mut engine = Engine::new(FakeBackend::default());
    let a = table(&[("a", 1)], &[(1, "a")]);
    let first = engine.sync(a.clone()).unwrap();
    assert!(first.ops > 0);
    assert_eq!(engine.sync(a.clone()).unwrap(), ApplyStats::default());

    let b = table(&[("a", 1)], &[(1, "a"), (2, "a")]);
    engine.backend_mut().reject_next = Some("EINVAL".into());
    // Rejected once: the engine reads the table back and applies the one-element repair.
    let repaired = engine.sync(b.clone()).unwrap();
    assert_eq!(repaired.ops, 1);
    assert_eq!(engine.read_backs(), 2);
    assert_eq!(engine.backend().table.as_ref(), Some(&b));
}

#[test]
fn a_restarted_engine_reads_back_and_writes_nothing_or_only_the_change() {
    let a = table(&[("a", 1), ("b", 2)], &[(1, "a"), (2, "b")]);
    let mut engine = Engine::new(FakeBackend::default());
    engine.sync(a.clone()).unwrap();
    let model = engine.backend().table.clone();
    // A new process: a fresh engine over the same kernel state.
    let mut restarted = Engine::new(FakeBackend {
        table: model.clone(),
        ..Default::default()
    });
    assert_eq!(restarted.sync(a.clone()).unwrap(), ApplyStats::default());
    assert!(restarted.backend().applied.is_empty(), "nothing sent");
    let b = table(&[("a", 1), ("b", 2)], &[(1, "a"), (3, "b")]);
    let stats = restarted.sync(b.clone()).unwrap();
    assert_eq!(stats.ops, 2, "one element out, one in");
    let sent = &restarted.backend().applied[0];
    assert!(
        !sent
            .ops
            .iter()
            .any(|op| matches!(op, Op::DeleteTable | Op::DeleteChain(_))),
        "{sent:?}"
    );
    assert_eq!(restarted.backend().table.as_ref(), Some(&b));
}

#[test]
fn drift_in_the_model_is_repaired_and_dynamic_sets_keep_their_elements() {
    let mut a = table(&[("a", 1)], &[(1, "a")]);
    let mut dynamic =
        Set::new("aff", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(SetFlags {
            dynamic: true,
            timeout: true,
            ..Default::default()
        });
    a.add_set(dynamic.clone());
    let mut engine = Engine::new(FakeBackend::default());
    engine.sync(a.clone()).unwrap();
    // The packet path added an affinity entry; someone deleted a vmap element and added a
    // foreign chain.
    let model = engine.backend_mut().table.as_mut().unwrap();
    dynamic.insert(vec![Value::Ipv4("10.0.0.9".parse().unwrap()).into()]);
    model.sets.insert("aff".into(), dynamic.clone());
    model.sets.get_mut("dispatch").unwrap().elements.clear();
    model.add_chain(Chain::regular("foreign"));
    engine.invalidate();
    let stats = engine.sync(a.clone()).unwrap();
    assert!(stats.ops > 0);
    let after = engine.backend().table.as_ref().unwrap();
    assert!(!after.chains.contains_key("foreign"));
    assert_eq!(after.sets["dispatch"].elements, a.sets["dispatch"].elements);
    assert_eq!(after.sets["aff"].elements.len(), 1, "affinity entry kept");
}

#[test]
fn first_sync_replaces_the_table_atomically() {
    let t = table(&[("a", 1)], &[(1, "a")]);
    let tx = Transaction::full(&t);
    assert_eq!(&tx.ops[..3], &[Op::AddTable, Op::DeleteTable, Op::AddTable]);
    let mut model = Some(table(&[("stale", 1)], &[]));
    apply_to(&mut model, &tx).unwrap();
    assert_eq!(model, Some(t));
}

fn arb_table() -> impl Strategy<Value = Table> {
    let names = ["a", "b", "c", "d"];
    (
        proptest::collection::vec(0usize..3, 4),
        proptest::collection::btree_map(1u8..20, 0usize..4, 0..12),
    )
        .prop_map(move |(rules, elems)| {
            let chains: Vec<(&str, usize)> = names
                .iter()
                .zip(&rules)
                .filter(|(_, r)| **r > 0)
                .map(|(n, r)| (*n, *r))
                .collect();
            let elements: Vec<(u8, &str)> = elems
                .iter()
                .filter_map(|(ip, idx)| chains.get(*idx % chains.len().max(1)).map(|c| (*ip, c.0)))
                .collect();
            table(&chains, &elements)
        })
}

proptest! {
    #[test]
    fn diff_takes_any_table_to_any_other(a in arb_table(), b in arb_table()) {
        let tx = diff(&a, &b);
        prop_assert_eq!(after(&a, &tx), b.clone());
        prop_assert!(diff(&b, &b).is_empty());
    }
}

#[test]
fn owned_full_transaction_equals_borrowed_and_gives_the_table_back() {
    let t = table(&[("a", 2), ("b", 1)], &[(1, "a"), (2, "b")]);
    let owned = Transaction::full_owned(t.clone());
    let borrowed = Transaction::full(&t);
    let sorted = |tx: &Transaction| {
        let mut v: Vec<String> = tx.ops.iter().map(|o| format!("{o:?}")).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&owned), sorted(&borrowed));
    assert_eq!(owned.into_table(), t);
    let mut model = None;
    apply_to(&mut model, &Transaction::full_owned(t.clone())).unwrap();
    assert_eq!(model, Some(t));
}

/// `t` with some chains (and the dispatch elements that point at them) moved into parts:
/// `place[i]` puts chain i at the top level (0) or in part "x" (1) or "y" (2). Part "x"
/// also owns a set of its own whose elements depend on `extra`.
fn with_parts(mut t: Table, place: &[usize], extra: u8) -> Table {
    let names = ["a", "b", "c", "d"];
    let mut parts: std::collections::BTreeMap<&str, Part> = Default::default();
    for (name, p) in names.iter().zip(place) {
        if *p == 0 {
            continue;
        }
        let Some(chain) = t.chains.remove(*name) else {
            continue;
        };
        let key = if *p == 1 { "x" } else { "y" };
        let part = parts.entry(key).or_default();
        let dispatch = t.sets.get_mut("dispatch").unwrap();
        let mine: Vec<ElemKey> = dispatch
            .elements
            .iter()
            .filter(
                |(_, v)| matches!(&v.data, Some(ElemData::Verdict(Verdict::Goto(c))) if c == name),
            )
            .map(|(k, _)| k.clone())
            .collect();
        for k in mine {
            let v = dispatch.elements.remove(&k).unwrap();
            part.add_mapping("dispatch", k, v.data.unwrap());
        }
        part.add_chain(chain);
    }
    if let Some(x) = parts.get_mut("x") {
        let mut own = Set::new("x-own", vec![DataType::Ipv4Addr], SetKind::Set);
        for i in 0..extra {
            own.insert(vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(
                10, 9, 0, i,
            )))]);
        }
        x.add_set(own);
    }
    for (k, p) in parts {
        t.insert_part(k, std::sync::Arc::new(p));
    }
    t
}

fn arb_parted_table() -> impl Strategy<Value = Table> {
    (arb_table(), proptest::collection::vec(0usize..3, 4), 0u8..3)
        .prop_map(|(t, place, extra)| with_parts(t, &place, extra))
}

proptest! {
    #[test]
    fn diff_with_parts_takes_any_table_to_any_other(a in arb_parted_table(), b in arb_parted_table()) {
        let tx = diff(&a, &b);
        prop_assert_eq!(after(&a.flatten(), &tx), b.flatten());
        prop_assert!(diff(&b, &b.clone()).is_empty());
    }
}

#[test]
fn pointer_equal_parts_are_skipped_and_a_changed_part_costs_its_change() {
    let base = with_parts(
        table(&[("a", 1), ("b", 2)], &[(1, "a"), (2, "b")]),
        &[1, 2, 0, 0],
        1,
    );
    // Same parts by pointer: nothing to do.
    let same = base.clone();
    assert!(diff(&base, &same).is_empty());
    // Part "x" gets one more dispatch element: exactly one element op.
    let mut next = base.clone();
    let mut x = (**next.part("x").unwrap()).clone();
    x.add_mapping(
        "dispatch",
        vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(10, 0, 0, 9)))],
        ElemData::Verdict(Verdict::Goto("a".into())),
    );
    next.insert_part("x", std::sync::Arc::new(x));
    let tx = diff(&base, &next);
    assert_eq!(tx.op_count(), 1, "{:?}", tx.ops);
    assert_eq!(after(&base.flatten(), &tx), next.flatten());
    // The engine keeps the structured table after a full sync, so the next diff is small.
    let mut engine = Engine::new(FakeBackend::default());
    engine.sync(base.clone()).unwrap();
    assert_eq!(engine.backend().table.as_ref(), Some(&base.flatten()));
    let stats = engine.sync(next.clone()).unwrap();
    assert_eq!(stats.ops, 1);
    assert_eq!(engine.backend().table.as_ref(), Some(&next.flatten()));
}

/// `op` with the elements it writes copied into its set value (what `full` sent before it
/// referenced parts).
fn copied(op: &Op) -> Op {
    match op {
        Op::AddSetWithParts { set, .. } => {
            let mut s = set.clone_declaration();
            s.elements
                .extend(op.elements().map(|(k, v)| (k.clone(), v.clone())));
            Op::AddSet(s)
        }
        other => other.clone(),
    }
}

proptest! {
    /// A full sync of a table with parts writes what the flattened table's full sync
    /// writes, op for op, but the parts' elements stay in the parts: the ops hold the
    /// table's own part map (the same `Arc`s), never a copy of a part element.
    #[test]
    fn full_sync_with_parts_references_part_elements(t in arb_parted_table()) {
        let flat = t.flatten();
        let tx = Transaction::full(&t);
        let ops: Vec<Op> = tx.ops.iter().map(copied).collect();
        prop_assert_eq!(&ops, &Transaction::full(&flat).ops);
        prop_assert_eq!(tx.op_count(), Transaction::full(&flat).op_count());
        let part_keys: Vec<&ElemKey> = t
            .part_keys()
            .flat_map(|k| t.part(k).unwrap().elements.values().flat_map(|e| e.keys()))
            .collect();
        for op in &tx.ops {
            if let Some(set) = op.set() {
                prop_assert!(set.elements.keys().all(|k| !part_keys.contains(&k)), "{op:?}");
            }
            if let Op::AddSetWithParts { set, parts } = op {
                // The table's own parts (the same `Arc`s), only those with elements in the set.
                for a in parts {
                    let own = t.part_keys().any(|k| std::sync::Arc::ptr_eq(a, t.part(k).unwrap()));
                    prop_assert!(own);
                    prop_assert!(a.elements.contains_key(&set.name));
                }
            }
        }
        prop_assert_eq!(
            tx.ops.iter().any(|op| matches!(op, Op::AddSetWithParts { .. })),
            !part_keys.is_empty()
        );
        let mut model = None;
        apply_to(&mut model, &tx).unwrap();
        prop_assert_eq!(model.as_ref(), Some(&flat));
        prop_assert_eq!(Transaction::full_owned(t.clone()), tx.clone());
        prop_assert_eq!(tx.into_table(), flat);
    }
}

/// A table whose parts put `n` elements in the data map "bulk" and one in the verdict map
/// "dispatch" (a filtering map, never deferred).
fn bulk_table(n: u16) -> Table {
    let mut t = table(&[("a", 1)], &[(1, "a")]);
    t.add_set(Set::new(
        "bulk",
        vec![DataType::Ipv4Addr],
        SetKind::Map(vec![DataType::InetService]),
    ));
    for p in 0..4u16 {
        let mut part = Part::default();
        for i in (0..n).filter(|i| i % 4 == p) {
            let ip = Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8);
            part.add_mapping(
                "bulk",
                vec![KeyPart::Value(Value::Ipv4(ip))],
                ElemData::Values(vec![Value::Port(i)]),
            );
        }
        if p == 0 {
            part.add_mapping(
                "dispatch",
                vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(10, 0, 0, 9)))],
                ElemData::Verdict(Verdict::Goto("a".into())),
            );
        }
        t.insert_part(format!("p{p}"), std::sync::Arc::new(part));
    }
    t
}

#[test]
fn a_large_new_table_is_created_in_chunks_with_every_filtering_element_in_the_first() {
    let desired = bulk_table(250);
    let mut engine =
        Engine::new(FakeBackend::default()).with_chunks(100, |name: &str| name == "bulk");
    let stats = engine.sync(desired.clone()).unwrap();
    let sent = &engine.backend().applied;
    // The first transaction creates everything but the bulk elements; 250 follow in 3.
    assert_eq!(
        sent.len(),
        4,
        "{:?}",
        sent.iter().map(|t| t.op_count()).collect::<Vec<_>>()
    );
    assert!(
        sent[0]
            .ops
            .iter()
            .any(|op| matches!(op, Op::AddSetWithParts { set, .. } if set.name == "dispatch"))
    );
    assert!(sent[0].ops.iter().all(|op| {
        op.set()
            .is_none_or(|s| s.name != "bulk" || op.elements().next().is_none())
    }));
    assert_eq!(
        sent[1..]
            .iter()
            .map(Transaction::op_count)
            .collect::<Vec<_>>(),
        [100, 100, 50]
    );
    assert_eq!(
        stats.ops,
        sent.iter().map(Transaction::op_count).sum::<usize>()
    );
    // Same kernel state as one transaction, and a restart finds nothing to write.
    assert_eq!(engine.backend().table.as_ref(), Some(&desired.flatten()));
    let mut restarted = Engine::new(FakeBackend {
        table: engine.backend().table.clone(),
        ..Default::default()
    });
    assert_eq!(
        restarted.sync(desired.clone()).unwrap(),
        ApplyStats::default()
    );
    // Small tables, and tables that exist, are not split.
    let mut small = Engine::new(FakeBackend::default()).with_chunks(1000, |_: &str| true);
    small.sync(desired).unwrap();
    assert_eq!(small.backend().applied.len(), 1);
}

#[test]
fn a_failed_chunk_leaves_the_engine_reading_back_and_finishing_the_table() {
    let desired = bulk_table(250);
    let mut engine = Engine::new(FailThird::default()).with_chunks(100, |n: &str| n == "bulk");
    // The creation and the first 100 elements go in, then the backend refuses: the sync
    // fails...
    assert!(engine.sync(desired.clone()).is_err());
    // ...and the next one reads the half-filled table back and adds only what is missing.
    let stats = engine.sync(desired.clone()).unwrap();
    assert_eq!(stats.ops, 150, "the two chunks that never went in");
    assert_eq!(engine.backend().0.table.as_ref(), Some(&desired.flatten()));
}

/// A backend that refuses the third transaction it is given.
#[derive(Default)]
struct FailThird(FakeBackend, usize);

impl NftBackend for FailThird {
    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError> {
        self.1 += 1;
        if self.1 == 3 {
            self.0.reject_next = Some("EBUSY".into());
        }
        self.0.apply(tx)
    }
    fn read_back(
        &mut self,
        desired: &Table,
    ) -> Result<nodeplane::nft::readback::Baseline, NftError> {
        self.0.read_back(desired)
    }
}
