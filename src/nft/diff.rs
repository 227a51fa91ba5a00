//! (current, desired) -> the minimal transaction. Unchanged chains are not touched, set
//! elements are added and removed one by one, and the ops are ordered so that every
//! reference (rule -> set, rule/element -> chain) is valid at each step of the batch.

use super::ir::*;
use std::collections::{BTreeMap, BTreeSet};

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
    DeleteSet(String),
    /// Add the elements of this set value (the declaration says how to encode them).
    AddElements(Set),
    /// Delete the elements (keys) of this set value.
    DeleteElements(Set),
}

/// A value describing one atomic change to `table inet <table>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub table: String,
    pub ops: Vec<Op>,
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
                Op::AddElements(s) | Op::DeleteElements(s) => s.elements.len(),
                _ => 1,
            })
            .sum()
    }

    /// The full replacement of the table: used when the kernel state is unknown (start-up,
    /// resync). Still one atomic batch, so packets see the old table or the new one.
    pub fn full(desired: &Table) -> Transaction {
        let mut ops = vec![Op::AddTable, Op::DeleteTable, Op::AddTable];
        push_creation(&mut ops, desired.chains.values(), desired.sets.values());
        Transaction {
            table: desired.name.clone(),
            ops,
        }
    }

    /// [`Transaction::full`] that takes the table by value: sets and rules move into the ops
    /// instead of being copied (a full sync of 100k elements must not clone them).
    /// [`Transaction::into_table`] gives the table back.
    pub fn full_owned(desired: Table) -> Transaction {
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
            ops,
        }
    }

    /// The table a full transaction creates, rebuilt by moving its parts out of the ops.
    /// Meaningful for [`Transaction::full`]/[`Transaction::full_owned`] results only.
    pub fn into_table(self) -> Table {
        let mut table = Table::new(self.table);
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
                _ => {}
            }
        }
        table
    }

    /// `delete table`: what `agent cleanup` sends (preceded by `add` so it cannot fail
    /// when the table is already gone).
    pub fn delete(table: &str) -> Transaction {
        Transaction {
            table: table.to_string(),
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
pub fn diff(current: &Table, desired: &Table) -> Transaction {
    let sets = classify_sets(current, desired);
    // A chain is rewritten when its rules change, or when a set it uses is recreated
    // (the kernel will not delete a set that a rule still references).
    let chain_uses_recreated = |c: &Chain| {
        c.rules
            .iter()
            .flat_map(|r| r.stmts.iter())
            .flat_map(|s| s.set_refs())
            .any(|name| sets.recreated.contains(name))
    };

    let mut new_chains = Vec::new();
    let mut rewritten = Vec::new();
    let mut removed_chains = Vec::new();
    for (name, want) in &desired.chains {
        match current.chains.get(name) {
            None => new_chains.push(want),
            Some(have) if have.base != want.base => {
                removed_chains.push(name.clone());
                new_chains.push(want);
            }
            Some(have) if have.rules != want.rules || chain_uses_recreated(want) => {
                rewritten.push(want)
            }
            Some(_) => {}
        }
    }
    for name in current.chains.keys() {
        if !desired.chains.contains_key(name) {
            removed_chains.push(name.clone());
        }
    }

    let mut ops = Vec::new();
    // 1. Empty every chain that changes or goes, so nothing references what is deleted.
    for name in rewritten
        .iter()
        .map(|c| &c.name)
        .chain(removed_chains.iter())
    {
        ops.push(Op::FlushChain(name.clone()));
    }
    // 2. Element removals first: a vmap element may point at a chain about to go.
    ops.extend(sets.element_removals);
    // 3. Sets before chains: set elements may reference chains, not the other way round.
    for name in sets.removed.iter().chain(sets.recreated.iter()) {
        ops.push(Op::DeleteSet(name.clone()));
    }
    for name in &removed_chains {
        ops.push(Op::DeleteChain(name.clone()));
    }
    // 4. New chains, new sets (with elements), then rules.
    for c in &new_chains {
        ops.push(Op::AddChain {
            name: c.name.clone(),
            base: c.base,
        });
    }
    for name in sets.added.iter().chain(sets.recreated.iter()) {
        ops.push(Op::AddSet(desired.sets[name].clone()));
    }
    for c in new_chains.iter().chain(rewritten.iter()) {
        push_rules(&mut ops, c);
    }
    // 5. Element additions last: they may point at chains created above.
    ops.extend(sets.element_additions);

    Transaction {
        table: desired.name.clone(),
        ops,
    }
}

struct SetChanges {
    added: BTreeSet<String>,
    removed: BTreeSet<String>,
    /// Declaration changed: delete and create again.
    recreated: BTreeSet<String>,
    element_removals: Vec<Op>,
    element_additions: Vec<Op>,
}

fn classify_sets(current: &Table, desired: &Table) -> SetChanges {
    let mut ch = SetChanges {
        added: BTreeSet::new(),
        removed: BTreeSet::new(),
        recreated: BTreeSet::new(),
        element_removals: Vec::new(),
        element_additions: Vec::new(),
    };
    for (name, want) in &desired.sets {
        match current.sets.get(name) {
            None => {
                ch.added.insert(name.clone());
            }
            Some(have) if !have.same_declaration(want) => {
                ch.recreated.insert(name.clone());
            }
            Some(have) => {
                let (del, add) = element_delta(have, want);
                if !del.is_empty() {
                    ch.element_removals
                        .push(Op::DeleteElements(with_elements(want, del)));
                }
                if !add.is_empty() {
                    ch.element_additions
                        .push(Op::AddElements(with_elements(want, add)));
                }
            }
        }
    }
    for name in current.sets.keys() {
        if !desired.sets.contains_key(name) {
            ch.removed.insert(name.clone());
        }
    }
    ch
}

type Elements = BTreeMap<ElemKey, ElemValue>;

/// Elements to delete and to add. A changed value (new verdict, new timeout) is a delete
/// plus an add of the same key, which the kernel applies in order within the batch.
fn element_delta(have: &Set, want: &Set) -> (Elements, Elements) {
    use std::cmp::Ordering::*;
    let mut del = Elements::new();
    let mut add = Elements::new();
    // Both maps iterate in key order: one merge pass, no lookups (this runs over every
    // element of every set on each sync, so it must stay linear and cheap).
    let mut h = have.elements.iter().peekable();
    let mut w = want.elements.iter().peekable();
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

fn with_elements(decl: &Set, elements: Elements) -> Set {
    Set {
        elements,
        ..decl.clone_declaration()
    }
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
            elements: BTreeMap::new(),
        }
    }
}

/// Applies a transaction to an in-memory table: the model the fake backend uses and the
/// reconciler uses to track what the kernel holds after a successful apply.
pub fn apply_to(table: &mut Option<Table>, tx: &Transaction) -> Result<(), String> {
    for op in &tx.ops {
        apply_op(table, &tx.table, op)?;
    }
    Ok(())
}

fn apply_op(table: &mut Option<Table>, name: &str, op: &Op) -> Result<(), String> {
    if let Op::AddTable = op {
        table.get_or_insert_with(|| Table::new(name));
        return Ok(());
    }
    let t = table
        .as_mut()
        .ok_or_else(|| format!("table inet {name} does not exist"))?;
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
        Op::AddSet(s) => {
            check_element_targets(t, s)?;
            t.sets.insert(s.name.clone(), s.clone());
        }
        Op::DeleteSet(s) => {
            if set_in_use(t, s) {
                return Err(format!("set {s} is in use"));
            }
            t.sets
                .remove(s)
                .ok_or_else(|| format!("set {s} does not exist"))?;
        }
        Op::AddElements(s) => {
            check_element_targets(t, s)?;
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

fn check_element_targets(t: &Table, set: &Set) -> Result<(), String> {
    for v in set.elements.values() {
        if let Some(ElemData::Verdict(verdict)) = &v.data
            && let Some(c) = verdict.target()
            && !t.chains.contains_key(c)
        {
            return Err(format!("chain {c} does not exist"));
        }
    }
    Ok(())
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
