//! (current, desired) -> the minimal transaction. Unchanged chains are not touched, set
//! elements are added and removed one by one, and the ops are ordered so that every
//! reference (rule -> set, rule/element -> chain) is valid at each step of the batch.

use super::ir::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One nftables operation inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddTable,
    DeleteTable,
    /// Create a chain (empty); rules follow as [`Op::AddRule`].
    AddChain {
        name: String,
        base: Option<BaseChain>,
    },
    FlushChain(String),
    DeleteChain(String),
    AddRule {
        chain: String,
        rule: Rule,
    },
    /// Create a set/map with its declaration and initial elements.
    AddSet(Set),
    /// [`Op::AddSet`] whose initial elements are the set's own plus those `parts` put in it:
    /// a full sync of a table with parts references the parts instead of copying their
    /// elements (see [`Op::elements`]). They are sent part by part, not in one key order:
    /// the kernel does not care; only a listing of a concatenated interval set, which keeps
    /// insertion order, shows it.
    AddSetWithParts {
        set: Set,
        parts: Parts,
    },
    DeleteSet(String),
    /// Delete every element of a set (read-back repair of a set whose contents cannot be
    /// matched element by element; refilled in the same batch). Holds the declaration.
    FlushSet(Set),
    /// Add the elements of this set value (the declaration says how to encode them).
    AddElements(Set),
    /// Delete the elements (keys) of this set value.
    DeleteElements(Set),
}

/// A value describing one atomic change to `table inet <table>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub table: String,
    pub family: Family,
    pub ops: Vec<Op>,
}

impl Op {
    /// The set value of an op that creates a set or adds or deletes elements.
    pub fn set(&self) -> Option<&Set> {
        match self {
            Op::AddSet(s)
            | Op::AddSetWithParts { set: s, .. }
            | Op::AddElements(s)
            | Op::DeleteElements(s) => Some(s),
            _ => None,
        }
    }

    /// The elements a set op writes, in the order it sends them: the set value's own, then
    /// for [`Op::AddSetWithParts`] those each part puts in the set. Empty for other ops.
    pub fn elements(&self) -> impl Iterator<Item = (&ElemKey, &ElemValue)> {
        let own = self.set();
        let parts = match self {
            Op::AddSetWithParts { set, parts } => Some((set.name.as_str(), parts)),
            _ => None,
        };
        let from_parts = parts.into_iter().flat_map(|(name, parts)| {
            parts
                .values()
                .filter_map(move |p| p.elements.get(name))
                .flatten()
        });
        own.into_iter().flat_map(|s| &s.elements).chain(from_parts)
    }
}

impl Transaction {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Operations counted the way the kernel sees them: one per table/chain/set/rule op and
    /// one per set element.
    pub fn op_count(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::AddSet(s) => 1 + s.elements.len(),
                Op::AddSetWithParts { set, parts } => {
                    let from_parts = parts.values().filter_map(|p| p.elements.get(&set.name));
                    1 + set.elements.len() + from_parts.map(PartElements::len).sum::<usize>()
                }
                Op::AddElements(s) | Op::DeleteElements(s) => s.elements.len(),
                _ => 1,
            })
            .sum()
    }

    /// The full replacement of the table: used when the kernel state is unknown (start-up,
    /// resync). Still one atomic batch, so packets see the old table or the new one.
    ///
    /// A table with parts is written as its flattened form would be, in the same order,
    /// but without building that copy: part chains and sets are cloned (small), the
    /// elements parts put in top-level sets are referenced through [`Op::AddSetWithParts`]
    /// (an O(1) clone of the part map), which is most of a large table.
    pub fn full(desired: &Table) -> Transaction {
        let mut ops = vec![Op::AddTable, Op::DeleteTable, Op::AddTable];
        if desired.parts.is_empty() {
            push_creation(&mut ops, desired.chains.values(), desired.sets.values());
        } else {
            push_creation_with_parts(&mut ops, desired);
        }
        Transaction {
            table: desired.name.clone(),
            family: desired.family,
            ops,
        }
    }

    /// Creation of the table where the kernel has none (a fresh node): everything
    /// [`Transaction::full`] writes, without deleting anything first, so it can never
    /// replace a table someone created in the meantime (that batch fails instead).
    pub fn create(desired: &Table) -> Transaction {
        let mut tx = Transaction::full(desired);
        tx.ops.drain(1..3);
        tx
    }

    /// [`Transaction::create`] split for a large new table: the first transaction creates
    /// everything but the elements parts put in `deferrable` sets, which follow in
    /// transactions of at most `max_ops` elements. nf_tables holds its per-netns commit lock
    /// for a whole batch, so one batch of 350,000 elements kept every other nftables user of
    /// the node waiting ~0.6 s (21 ms in batches of 10,000; see docs/performance.md). Only
    /// sets whose missing elements let nothing through may be deferrable: everything that
    /// filters stays in the first, atomic transaction. Interval sets are never split.
    pub fn create_chunked(
        desired: &Table,
        max_ops: usize,
        deferrable: &dyn Fn(&str) -> bool,
    ) -> Vec<Transaction> {
        let mut first = Transaction::create(desired);
        if first.op_count() <= max_ops.max(1) {
            return vec![first];
        }
        let mut later = Chunks {
            table: first.table.clone(),
            family: first.family,
            max_ops: max_ops.max(1),
            done: Vec::new(),
            ops: Vec::new(),
            count: 0,
        };
        for op in &mut first.ops {
            let Op::AddSetWithParts { set, parts } = op else {
                continue;
            };
            // Interval sets stay whole: their ranges are encoded against their neighbours
            // (end markers), so pieces sent apart do not add up to the same kernel set.
            if !deferrable(&set.name) || set.flags.interval {
                continue;
            }
            for part in parts.values() {
                if let Some(elements) = part.elements.get(&set.name) {
                    for (k, v) in elements {
                        later.push(set, k, v);
                    }
                }
            }
            *op = Op::AddSet(set.clone());
        }
        let mut txs = vec![first];
        txs.extend(later.finish());
        txs
    }

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
    pub fn from_baseline(
        current: &Table,
        desired: &Table,
        base: &super::readback::Baseline,
    ) -> Transaction {
        let mut tx = Transaction::repair(current, desired, &base.flush);
        if base.table_flags_differ {
            // `add table` sends the agent's flags (none): a dormant table wakes up.
            tx.ops.insert(0, Op::AddTable);
        }
        tx
    }

    /// [`Transaction::full`] that takes the table by value: sets and rules move into the ops
    /// instead of being copied (a full sync of 100k elements must not clone them).
    /// [`Transaction::into_table`] gives the table back (flattened, for a table with parts,
    /// whose top level is copied: the parts hold the bulk and are referenced anyway).
    pub fn full_owned(desired: Table) -> Transaction {
        if !desired.parts.is_empty() {
            return Transaction::full(&desired);
        }
        let mut ops = vec![Op::AddTable, Op::DeleteTable, Op::AddTable];
        let mut rules = Vec::new();
        for (name, chain) in desired.chains {
            ops.push(Op::AddChain {
                name: name.clone(),
                base: chain.base,
            });
            rules.extend(chain.rules.into_iter().map(|rule| Op::AddRule {
                chain: name.clone(),
                rule,
            }));
        }
        ops.extend(desired.sets.into_values().map(Op::AddSet));
        ops.extend(rules);
        Transaction {
            table: desired.name,
            family: desired.family,
            ops,
        }
    }

    /// The table a full transaction creates, rebuilt by moving its parts out of the ops.
    /// Meaningful for [`Transaction::full`]/[`Transaction::full_owned`] results only.
    pub fn into_table(self) -> Table {
        let mut table = Table::with_family(self.family, self.table);
        for op in self.ops {
            match op {
                Op::AddChain { name, base } => table.add_chain(Chain {
                    name,
                    base,
                    rules: Vec::new(),
                }),
                Op::AddRule { chain, rule } => {
                    if let Some(c) = table.chains.get_mut(&chain) {
                        c.rules.push(rule);
                    }
                }
                Op::AddSet(set) => table.add_set(set),
                Op::AddSetWithParts { mut set, parts } => {
                    for part in parts.values() {
                        if let Some(e) = part.elements.get(&set.name) {
                            set.elements
                                .extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
                        }
                    }
                    table.add_set(set);
                }
                _ => {}
            }
        }
        table
    }

    /// `delete table`: what `agent cleanup` sends (preceded by `add` so it cannot fail
    /// when the table is already gone).
    pub fn delete(family: Family, table: &str) -> Transaction {
        Transaction {
            table: table.to_string(),
            family,
            ops: vec![Op::AddTable, Op::DeleteTable],
        }
    }
}

/// Chains, then sets with their elements (vmap elements may name the chains), then rules
/// (which may name both).
fn push_creation<'a>(
    ops: &mut Vec<Op>,
    chains: impl Iterator<Item = &'a Chain> + Clone,
    sets: impl Iterator<Item = &'a Set>,
) {
    for c in chains.clone() {
        ops.push(Op::AddChain {
            name: c.name.clone(),
            base: c.base,
        });
    }
    for s in sets {
        ops.push(Op::AddSet(s.clone()));
    }
    for c in chains {
        push_rules(ops, c);
    }
}

/// [`push_creation`] of the flattened table, in the flattened order (chains and sets by
/// name across the top level and the parts), with top-level sets that parts put elements
/// in created by [`Op::AddSetWithParts`].
fn push_creation_with_parts(ops: &mut Vec<Op>, desired: &Table) {
    let mut chains: BTreeMap<&str, &Chain> = desired
        .chains
        .iter()
        .map(|(k, c)| (k.as_str(), c))
        .collect();
    let mut sets: BTreeMap<&str, &Set> =
        desired.sets.iter().map(|(k, s)| (k.as_str(), s)).collect();
    let mut filled: BTreeSet<&str> = BTreeSet::new();
    for part in desired.parts.values() {
        chains.extend(part.chains.iter().map(|(k, c)| (k.as_str(), c)));
        sets.extend(part.sets.iter().map(|(k, s)| (k.as_str(), s)));
        filled.extend(part.elements.keys().map(String::as_str));
    }
    for c in chains.values() {
        ops.push(Op::AddChain {
            name: c.name.clone(),
            base: c.base,
        });
    }
    for (name, s) in sets {
        // Parts' elements go to top-level sets only (as `diff` looks them up).
        if filled.contains(name) && desired.sets.contains_key(name) {
            ops.push(Op::AddSetWithParts {
                set: s.clone(),
                parts: desired.parts.clone(),
            });
        } else {
            ops.push(Op::AddSet(s.clone()));
        }
    }
    for c in chains.values() {
        push_rules(ops, c);
    }
}

fn push_rules(ops: &mut Vec<Op>, chain: &Chain) {
    for r in &chain.rules {
        ops.push(Op::AddRule {
            chain: chain.name.clone(),
            rule: r.clone(),
        });
    }
}

/// The minimal transaction from `current` (what the kernel holds) to `desired`.
/// `diff(x, x)` is empty.
///
/// The element transactions of [`Transaction::create_chunked`], filled in order.
struct Chunks {
    table: String,
    family: Family,
    max_ops: usize,
    done: Vec<Transaction>,
    ops: Vec<Op>,
    count: usize,
}

impl Chunks {
    fn push(&mut self, set: &Set, key: &ElemKey, value: &ElemValue) {
        if self.count == self.max_ops {
            self.flush();
        }
        let same_set = matches!(self.ops.last(), Some(Op::AddElements(s)) if s.name == set.name);
        if !same_set {
            self.ops.push(Op::AddElements(set.clone_declaration()));
        }
        if let Some(Op::AddElements(s)) = self.ops.last_mut() {
            s.elements.insert(key.clone(), value.clone());
        }
        self.count += 1;
    }

    fn flush(&mut self) {
        if !self.ops.is_empty() {
            self.done.push(Transaction {
                table: self.table.clone(),
                family: self.family,
                ops: std::mem::take(&mut self.ops),
            });
        }
        self.count = 0;
    }

    fn finish(mut self) -> Vec<Transaction> {
        self.flush();
        self.done
    }
}

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

    fn finish(mut self, current: &'a Table, desired: &'a Table) -> Transaction {
        // A name that leaves one place and appears in another (top level <-> part, part <->
        // part) is the same kernel object: rewrite it instead of deleting it.
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
        // Recreated sets (rare): every chain using one is rewritten (the kernel will not
        // delete a set that a rule references), and parts' elements go in with it.
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

impl Set {
    /// The declaration without elements (cheap for large sets).
    pub fn clone_declaration(&self) -> Set {
        Set {
            name: self.name.clone(),
            key: self.key.clone(),
            kind: self.kind.clone(),
            flags: self.flags,
            timeout: self.timeout,
            typeof_decl: self.typeof_decl.clone(),
            elements: BTreeMap::new(),
        }
    }
}

/// Applies a transaction to an in-memory table: the model the fake backend uses and the
/// reconciler uses to track what the kernel holds after a successful apply.
pub fn apply_to(table: &mut Option<Table>, tx: &Transaction) -> Result<(), String> {
    for op in &tx.ops {
        apply_op(table, tx.family, &tx.table, op)?;
    }
    Ok(())
}

fn apply_op(table: &mut Option<Table>, family: Family, name: &str, op: &Op) -> Result<(), String> {
    if let Op::AddTable = op {
        table.get_or_insert_with(|| Table::with_family(family, name));
        return Ok(());
    }
    let t = table
        .as_mut()
        .ok_or_else(|| format!("table {} {name} does not exist", family.keyword()))?;
    match op {
        Op::AddTable => {}
        Op::DeleteTable => *table = None,
        Op::AddChain { name, base } => {
            t.chains.entry(name.clone()).or_insert_with(|| Chain {
                name: name.clone(),
                base: *base,
                rules: Vec::new(),
            });
        }
        Op::FlushChain(c) => chain_mut(t, c)?.rules.clear(),
        Op::DeleteChain(c) => {
            if !chain_mut(t, c)?.rules.is_empty() {
                return Err(format!("chain {c} is not empty"));
            }
            if chain_in_use(t, c) {
                return Err(format!("chain {c} is in use"));
            }
            t.chains.remove(c);
        }
        Op::AddRule { chain, rule } => {
            check_rule_refs(t, rule)?;
            chain_mut(t, chain)?.rules.push(rule.clone())
        }
        Op::AddSet(s) | Op::AddSetWithParts { set: s, .. } => {
            check_element_targets(t, op.elements())?;
            let mut set = s.clone_declaration();
            set.elements
                .extend(op.elements().map(|(k, v)| (k.clone(), v.clone())));
            t.sets.insert(s.name.clone(), set);
        }
        Op::FlushSet(s) => set_mut(t, &s.name)?.elements.clear(),
        Op::DeleteSet(s) => {
            if set_in_use(t, s) {
                return Err(format!("set {s} is in use"));
            }
            t.sets
                .remove(s)
                .ok_or_else(|| format!("set {s} does not exist"))?;
        }
        Op::AddElements(s) => {
            check_element_targets(t, op.elements())?;
            let set = set_mut(t, &s.name)?;
            for (k, v) in &s.elements {
                set.elements.insert(k.clone(), v.clone());
            }
        }
        Op::DeleteElements(s) => {
            let set = set_mut(t, &s.name)?;
            for k in s.elements.keys() {
                set.elements
                    .remove(k)
                    .ok_or_else(|| format!("element not in set {}", s.name))?;
            }
        }
    }
    Ok(())
}

fn rule_stmts(t: &Table) -> impl Iterator<Item = &Stmt> {
    t.chains
        .values()
        .flat_map(|c| c.rules.iter())
        .flat_map(|r| r.stmts.iter())
}

/// The kernel refuses to delete a chain that a rule or a map element still points at.
fn chain_in_use(t: &Table, chain: &str) -> bool {
    rule_stmts(t).any(|s| s.chain_refs().contains(&chain))
        || t.sets.values().flat_map(|s| s.elements.values()).any(|v| {
            matches!(&v.data, Some(ElemData::Verdict(verdict)) if verdict.target() == Some(chain))
        })
}

fn set_in_use(t: &Table, set: &str) -> bool {
    rule_stmts(t).any(|s| s.set_refs().contains(&set))
}

fn check_rule_refs(t: &Table, rule: &Rule) -> Result<(), String> {
    for stmt in &rule.stmts {
        if let Some(s) = stmt
            .set_refs()
            .into_iter()
            .find(|s| !t.sets.contains_key(*s))
        {
            return Err(format!("set {s} does not exist"));
        }
        if let Some(c) = stmt
            .chain_refs()
            .into_iter()
            .find(|c| !t.chains.contains_key(*c))
        {
            return Err(format!("chain {c} does not exist"));
        }
    }
    Ok(())
}

fn check_element_targets<'a>(
    t: &Table,
    mut elements: impl Iterator<Item = (&'a ElemKey, &'a ElemValue)>,
) -> Result<(), String> {
    elements.try_for_each(|(_, v)| {
        if let Some(ElemData::Verdict(verdict)) = &v.data
            && let Some(c) = verdict.target()
            && !t.chains.contains_key(c)
        {
            return Err(format!("chain {c} does not exist"));
        }
        Ok(())
    })
}

fn chain_mut<'a>(t: &'a mut Table, name: &str) -> Result<&'a mut Chain, String> {
    t.chains
        .get_mut(name)
        .ok_or_else(|| format!("chain {name} does not exist"))
}

fn set_mut<'a>(t: &'a mut Table, name: &str) -> Result<&'a mut Set, String> {
    t.sets
        .get_mut(name)
        .ok_or_else(|| format!("set {name} does not exist"))
}
