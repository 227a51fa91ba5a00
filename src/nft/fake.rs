//! The in-memory kernel, as knftables' fake: [`apply_to`] applies a transaction to a model
//! table with the kernel's referential rules, and [`FakeBackend`] is an [`NftBackend`] over
//! that model (the engine's unit tests, the planners' and the reconciler's).

use super::engine::{ApplyStats, NftBackend, NftError};
use super::ir::*;
use super::readback::{self, Baseline};
use super::transaction::{Op, Transaction};

/// An in-memory backend that applies transactions to a model table with the kernel's
/// referential rules, and can be told to reject the next transaction.
#[derive(Debug, Default)]
pub struct FakeBackend {
    pub table: Option<Table>,
    pub applied: Vec<Transaction>,
    pub reject_next: Option<String>,
}

impl NftBackend for FakeBackend {
    fn apply(&mut self, tx: &Transaction) -> Result<ApplyStats, NftError> {
        if let Some(reason) = self.reject_next.take() {
            return Err(NftError::Rejected {
                what: "transaction".into(),
                reason,
            });
        }
        let mut next = self.table.clone();
        apply_to(&mut next, tx).map_err(|reason| NftError::Rejected {
            what: "transaction".into(),
            reason,
        })?;
        self.table = next;
        self.applied.push(tx.clone());
        Ok(ApplyStats {
            ops: tx.op_count(),
            messages: tx.ops.len(),
        })
    }

    fn read_back(&mut self, desired: &Table) -> Result<Baseline, NftError> {
        Ok(match &self.table {
            None => Baseline::default(),
            Some(model) => readback::mirror(&mut readback::ModelState::new(model), desired),
        })
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
    if let Op::AddTable | Op::AddOwnedTable = op {
        table.get_or_insert_with(|| Table::with_family(family, name));
        return Ok(());
    }
    let t = table
        .as_mut()
        .ok_or_else(|| format!("table {} {name} does not exist", family.keyword()))?;
    match op {
        Op::AddTable | Op::AddOwnedTable => {}
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
