//! A transaction: the ops of one atomic change to a table, in an order where every reference
//! (rule -> set, rule/element -> chain) is valid at each step of the batch, and the ways to
//! build one without a current table (create, full sync, chunked creation, delete). The
//! minimal change between two tables is [`super::diff`]; applying one to an in-memory table,
//! [`super::fake`].

use super::ir::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One nftables operation inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddTable,
    /// `add table ... { flags owner; }`: the kernel deletes the table when the netlink
    /// socket that added it closes, so a process that dies cannot leave it behind (kernel
    /// 5.12+; `agent explain --trace`'s table).
    AddOwnedTable,
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
    /// elements (see [`Op::elements`]). Only the parts that put elements in the set: a set
    /// op that walked every part cost sets x parts lookups per pass (50,000 parts at
    /// 50,000 services). They are sent part by part, not in one key order:
    /// the kernel does not care; only a listing of a concatenated interval set, which keeps
    /// insertion order, shows it.
    AddSetWithParts {
        set: Set,
        parts: Vec<Arc<Part>>,
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
                .iter()
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
                    let from_parts = parts.iter().filter_map(|p| p.elements.get(&set.name));
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
            for part in parts.iter() {
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
                    for part in &parts {
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
    // The parts that put elements in each set, in the parts' order.
    let mut filled: BTreeMap<&str, Vec<Arc<Part>>> = BTreeMap::new();
    for part in desired.parts.values() {
        chains.extend(part.chains.iter().map(|(k, c)| (k.as_str(), c)));
        sets.extend(part.sets.iter().map(|(k, s)| (k.as_str(), s)));
        for name in part.elements.keys() {
            filled.entry(name).or_default().push(part.clone());
        }
    }
    for c in chains.values() {
        ops.push(Op::AddChain {
            name: c.name.clone(),
            base: c.base,
        });
    }
    for (name, s) in sets {
        // Parts' elements go to top-level sets only (as `diff` looks them up).
        let parts = filled
            .remove(name)
            .filter(|_| desired.sets.contains_key(name));
        if let Some(parts) = parts {
            ops.push(Op::AddSetWithParts {
                set: s.clone(),
                parts,
            });
        } else {
            ops.push(Op::AddSet(s.clone()));
        }
    }
    for c in chains.values() {
        push_rules(ops, c);
    }
}

pub(super) fn push_rules(ops: &mut Vec<Op>, chain: &Chain) {
    for r in &chain.rules {
        ops.push(Op::AddRule {
            chain: chain.name.clone(),
            rule: r.clone(),
        });
    }
}

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
