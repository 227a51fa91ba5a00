//! (current, desired) -> the minimal transaction. Unchanged chains are not touched, set
//! elements are added and removed one by one, and the ops are ordered so that every
//! reference (rule -> set, rule/element -> chain) is valid at each step of the batch.

use super::ir::*;
use super::readback::Baseline;
use super::transaction::push_rules;
/// What [`diff`] returns.
pub use super::transaction::{Op, Transaction};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The minimal transaction from `current` (what the kernel holds) to `desired`.
/// `diff(x, x)` is empty.
///
/// Top-level chains and sets are compared one by one; parts ([`Table::parts`]) that are
/// pointer-equal are skipped without looking inside, so the cost is the number of parts
/// plus the size of what changed. Changed parts are compared chain by chain, set by set and
/// element by element, exactly like the top level.
pub fn diff(current: &Table, desired: &Table) -> Transaction {
    let mut d = Delta::default();
    d.sets(&current.sets, &desired.sets);
    d.chains(&current.chains, &desired.chains);
    let mut changed_parts = Vec::new();
    for change in current.parts.diff(&desired.parts) {
        use imbl::ordmap::DiffItem::*;
        let (old, new) = match change {
            Add(_, new) => (None, Some(new)),
            Remove(_, old) => (Some(old), None),
            Update { old, new } => {
                if Arc::ptr_eq(old.1, new.1) {
                    continue;
                }
                (Some(old.1), Some(new.1))
            }
        };
        changed_parts.push((old, new));
    }
    let empty = Part::default();
    for (old, new) in &changed_parts {
        let (old, new) = (old.map_or(&empty, |p| &**p), new.map_or(&empty, |p| &**p));
        d.sets(&old.sets, &new.sets);
        d.chains(&old.chains, &new.chains);
        d.contributions(old, new);
    }
    d.finish(current, desired)
}

/// What changes, collected over the top level and the changed parts before ops are ordered.
#[derive(Default)]
struct Delta<'a> {
    new_chains: BTreeMap<&'a str, &'a Chain>,
    rewritten: BTreeMap<&'a str, &'a Chain>,
    /// Name -> the base it had (a name both removed and new with the same base moved).
    removed_chains: BTreeMap<String, Option<BaseChain>>,
    rebased: BTreeSet<String>,
    added_sets: BTreeMap<&'a str, &'a Set>,
    removed_sets: BTreeSet<String>,
    /// Declaration changed: delete and create again.
    recreated: BTreeMap<&'a str, &'a Set>,
    /// Per set: elements to delete and to add, and the set they belong to (for parts'
    /// contributions to top-level sets, looked up at the end).
    element_removals: BTreeMap<String, (Option<&'a Set>, Elements)>,
    element_additions: BTreeMap<String, (Option<&'a Set>, Elements)>,
}

impl<'a> Delta<'a> {
    fn chains(&mut self, have: &'a BTreeMap<String, Chain>, want: &'a BTreeMap<String, Chain>) {
        for (name, w) in want {
            match have.get(name) {
                None => {
                    self.new_chains.insert(name, w);
                }
                Some(h) if h.base != w.base => {
                    self.removed_chains.insert(name.clone(), h.base);
                    self.rebased.insert(name.clone());
                    self.new_chains.insert(name, w);
                }
                Some(h) if h.rules != w.rules => {
                    self.rewritten.insert(name, w);
                }
                Some(_) => {}
            }
        }
        for (name, h) in have {
            if !want.contains_key(name) {
                self.removed_chains.insert(name.clone(), h.base);
            }
        }
    }

    fn sets(&mut self, have: &'a BTreeMap<String, Set>, want: &'a BTreeMap<String, Set>) {
        for (name, w) in want {
            match have.get(name) {
                None => {
                    self.added_sets.insert(name, w);
                }
                Some(h) if !h.same_declaration(w) => {
                    self.recreated.insert(name, w);
                }
                Some(h) => self.elements(name, Some(w), &h.elements, &w.elements),
            }
        }
        for name in have.keys() {
            if !want.contains_key(name) {
                self.removed_sets.insert(name.clone());
            }
        }
    }

    fn elements<'e>(
        &mut self,
        set: &str,
        decl: Option<&'a Set>,
        have: impl IntoIterator<Item = (&'e ElemKey, &'e ElemValue)>,
        want: impl IntoIterator<Item = (&'e ElemKey, &'e ElemValue)>,
    ) {
        let (del, add) = element_delta(have, want);
        for (map, elements) in [
            (&mut self.element_removals, del),
            (&mut self.element_additions, add),
        ] {
            if !elements.is_empty() {
                let entry = map
                    .entry(set.to_string())
                    .or_insert((decl, Elements::new()));
                entry.0 = entry.0.or(decl);
                entry.1.extend(elements);
            }
        }
    }

    /// Elements a changed part puts in top-level sets.
    fn contributions(&mut self, old: &Part, new: &Part) {
        let none = PartElements::default();
        for (set, want) in &new.elements {
            self.elements(set, None, old.elements.get(set).unwrap_or(&none), want);
        }
        for (set, have) in &old.elements {
            if !new.elements.contains_key(set) {
                self.elements(set, None, have, &none);
            }
        }
    }

    /// A name that leaves one place and appears in another (top level <-> part, part <->
    /// part) is the same kernel object: rewritten instead of deleted and created.
    fn keep_moved_objects(&mut self) {
        let moved: Vec<String> = self
            .removed_chains
            .iter()
            .filter(|(n, base)| {
                !self.rebased.contains(*n)
                    && self
                        .new_chains
                        .get(n.as_str())
                        .is_some_and(|c| c.base == **base)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in moved {
            self.removed_chains.remove(&name);
            let (k, c) = self.new_chains.remove_entry(name.as_str()).expect("moved");
            self.rewritten.insert(k, c);
        }
        let moved: Vec<String> = self
            .removed_sets
            .iter()
            .filter(|n| self.added_sets.contains_key(n.as_str()))
            .cloned()
            .collect();
        for name in moved {
            self.removed_sets.remove(&name);
            let (k, s) = self.added_sets.remove_entry(name.as_str()).expect("moved");
            self.recreated.insert(k, s);
        }
    }

    /// Recreated sets (rare): every chain using one is rewritten (the kernel will not
    /// delete a set that a rule references), and parts' elements go in with it. Returns the
    /// sets to create again, whole.
    fn recreate_sets(&mut self, desired: &'a Table) -> Vec<Set> {
        let mut recreated_sets: Vec<Set> = Vec::new();
        if !self.recreated.is_empty() {
            for c in all_chains(desired) {
                let uses = c
                    .rules
                    .iter()
                    .flat_map(|r| r.stmts.iter())
                    .flat_map(|s| s.set_refs())
                    .any(|name| self.recreated.contains_key(name));
                if uses && !self.new_chains.contains_key(c.name.as_str()) {
                    self.rewritten.insert(&c.name, c);
                }
            }
            for (name, set) in &self.recreated {
                let mut full = (*set).clone();
                for part in desired.parts.values() {
                    if let Some(e) = part.elements.get(*name) {
                        full.elements
                            .extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                }
                self.element_removals.remove(*name);
                self.element_additions.remove(*name);
                recreated_sets.push(full);
            }
        }
        recreated_sets
    }

    fn finish(mut self, current: &'a Table, desired: &'a Table) -> Transaction {
        self.keep_moved_objects();
        let recreated_sets = self.recreate_sets(desired);
        let set_decl = |name: &str, known: Option<&Set>| -> Option<Set> {
            known
                .or_else(|| desired.sets.get(name))
                .or_else(|| current.sets.get(name))
                .map(Set::clone_declaration)
        };

        let mut ops = Vec::new();
        // 1. Empty every chain that changes or goes, so nothing references what is deleted.
        for name in self.rewritten.keys().map(|n| n.to_string()) {
            ops.push(Op::FlushChain(name));
        }
        for name in self.removed_chains.keys() {
            ops.push(Op::FlushChain(name.clone()));
        }
        // 2. Element removals first: a vmap element may point at a chain about to go.
        for (name, (known, elements)) in self.element_removals {
            // Elements of a set that goes away go with it.
            if self.removed_sets.contains(&name) {
                continue;
            }
            if let Some(decl) = set_decl(&name, known) {
                ops.push(Op::DeleteElements(Set { elements, ..decl }));
            }
        }
        // 3. Sets before chains: set elements may reference chains, not the other way round.
        for name in self
            .removed_sets
            .iter()
            .map(String::as_str)
            .chain(recreated_sets.iter().map(|s| s.name.as_str()))
        {
            ops.push(Op::DeleteSet(name.to_string()));
        }
        for name in self.removed_chains.keys() {
            ops.push(Op::DeleteChain(name.clone()));
        }
        // 4. New chains, new sets (with elements), then rules.
        for c in self.new_chains.values() {
            ops.push(Op::AddChain {
                name: c.name.clone(),
                base: c.base,
            });
        }
        for s in self.added_sets.values() {
            let mut s = (*s).clone();
            // A new top-level set gets the elements parts put in it.
            if desired.sets.contains_key(&s.name) {
                for part in desired.parts.values() {
                    if let Some(e) = part.elements.get(&s.name) {
                        s.elements
                            .extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                }
                self.element_additions.remove(&s.name);
            }
            ops.push(Op::AddSet(s));
        }
        ops.extend(recreated_sets.into_iter().map(Op::AddSet));
        for c in self.new_chains.values().chain(self.rewritten.values()) {
            push_rules(&mut ops, c);
        }
        // 5. Element additions last: they may point at chains created above.
        for (name, (known, elements)) in self.element_additions {
            if let Some(decl) = set_decl(&name, known) {
                ops.push(Op::AddElements(Set { elements, ..decl }));
            }
        }
        Transaction {
            table: desired.name.clone(),
            family: desired.family,
            ops,
        }
    }
}

fn all_chains(t: &Table) -> impl Iterator<Item = &Chain> {
    t.chains
        .values()
        .chain(t.parts.values().flat_map(|p| p.chains.values()))
}

type Elements = BTreeMap<ElemKey, ElemValue>;

/// Elements to delete and to add. A changed value (new verdict, new timeout) is a delete
/// plus an add of the same key, which the kernel applies in order within the batch.
fn element_delta<'e>(
    have: impl IntoIterator<Item = (&'e ElemKey, &'e ElemValue)>,
    want: impl IntoIterator<Item = (&'e ElemKey, &'e ElemValue)>,
) -> (Elements, Elements) {
    use std::cmp::Ordering::*;
    let mut del = Elements::new();
    let mut add = Elements::new();
    // Both sides iterate in key order: one merge pass, no lookups (this runs over every
    // element of every set on each sync, so it must stay linear and cheap).
    let mut h = have.into_iter().peekable();
    let mut w = want.into_iter().peekable();
    loop {
        match (h.peek(), w.peek()) {
            (None, None) => break,
            (Some(_), None) => {
                let (k, v) = h.next().expect("peeked");
                del.insert(k.clone(), v.clone());
            }
            (None, Some(_)) => {
                let (k, v) = w.next().expect("peeked");
                add.insert(k.clone(), v.clone());
            }
            (Some((hk, _)), Some((wk, _))) => match hk.cmp(wk) {
                Less => {
                    let (k, v) = h.next().expect("peeked");
                    del.insert(k.clone(), v.clone());
                }
                Greater => {
                    let (k, v) = w.next().expect("peeked");
                    add.insert(k.clone(), v.clone());
                }
                Equal => {
                    let ((k, hv), (_, wv)) = (h.next().expect("peeked"), w.next().expect("peeked"));
                    if hv != wv {
                        del.insert(k.clone(), hv.clone());
                        add.insert(k.clone(), wv.clone());
                    }
                }
            },
        }
    }
    (del, add)
}

/// Repairs: a diff with sets flushed first.
impl Transaction {
    /// A repair transaction: flush `sets` first, then `diff(current, desired)`.
    pub fn repair(current: &Table, desired: &Table, flush: &[String]) -> Transaction {
        let mut tx = diff(current, desired);
        let decls = flush.iter().filter_map(|name| {
            let in_parts = || desired.parts.values().find_map(|p| p.sets.get(name));
            desired
                .sets
                .get(name)
                .or_else(in_parts)
                .map(Set::clone_declaration)
        });
        tx.ops.splice(0..0, decls.map(Op::FlushSet));
        tx
    }

    /// [`Transaction::repair`] of a read-back baseline that has a table.
    pub fn from_baseline(current: &Table, desired: &Table, base: &Baseline) -> Transaction {
        let mut tx = Transaction::repair(current, desired, &base.flush);
        if base.table_flags_differ {
            // `add table` sends the agent's flags (none): a dormant table wakes up.
            tx.ops.insert(0, Op::AddTable);
        }
        tx
    }
}
