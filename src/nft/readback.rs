//! What the kernel holds, expressed as a [`Table`] shaped like the desired one, so that
//! `diff(kernel, desired)` repairs exactly what differs and nothing else.
//!
//! A backend reads its table back and judges each desired chain and set against what it
//! found ([`KernelState`]); [`mirror`] turns those verdicts into the "current" table:
//! - an object the kernel holds exactly as desired is the desired object itself (a part
//!   that matches entirely is the same `Arc`, which the diff skips by pointer);
//! - a chain whose rules differ becomes a chain with a rule no planner writes, so the diff
//!   rewrites it (flush and re-add, one atomic batch; a base chain is never deleted);
//! - elements are matched one by one; an element the kernel holds and nobody wants is kept
//!   with a value no planner writes, so the diff deletes it;
//! - a set whose contents cannot be matched element by element is flushed and refilled
//!   in the same batch ([`Baseline::flush`]); a dynamic set (filled by the packet path,
//!   e.g. session affinity) is never emptied;
//! - chains and sets nobody wants are deleted.

use super::ir::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The kernel's verdict on one desired chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainState {
    Same,
    /// The rules differ; `base` is the hook attachment the kernel has.
    Differs {
        base: Option<BaseChain>,
    },
}

/// The kernel's verdict on one desired set and the elements wanted in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetState {
    /// The declaration differs: the set is recreated.
    pub declaration_differs: bool,
    /// Per wanted element (in the order given), whether the kernel holds it as wanted.
    pub present: Vec<bool>,
    /// Keys the kernel holds that no wanted element accounts for: deleted.
    pub foreign: Vec<ElemKey>,
    /// The contents cannot be repaired element by element: flush and refill.
    pub flush: bool,
}

/// A backend's read-back of its table, judged object by object.
pub trait KernelState {
    /// `None` if the kernel has no chain of that name.
    fn chain(&mut self, want: &Chain) -> Option<ChainState>;
    /// `None` if the kernel has no set of that name; `elements` are every element wanted
    /// in it (its own and those parts put in it).
    fn set(&mut self, want: &Set, elements: &[(&ElemKey, &ElemValue)]) -> Option<SetState>;
    /// Chains the kernel has that no desired chain asked about, with their hook.
    fn other_chains(&self) -> Vec<(String, Option<BaseChain>)>;
    /// Sets the kernel has that no desired set asked about.
    fn other_sets(&self) -> Vec<String>;
}

/// What the kernel holds, as the engine diffs against it.
#[derive(Debug, Clone, Default)]
pub struct Baseline {
    /// `None`: the kernel has no table.
    pub table: Option<Table>,
    /// Sets to flush at the start of the repair (their contents are refilled by the diff).
    pub flush: Vec<String>,
    /// The table's flags differ (e.g. someone made it dormant, which detaches every hook):
    /// the repair re-adds the table with the agent's flags.
    pub table_flags_differ: bool,
}

/// A rule comment no planner writes (renderers strip NUL): marks a chain to rewrite.
const DIFFERS: &str = "\0differs-from-kernel";

/// An element value no planner writes: marks an element to delete.
pub fn foreign_value() -> ElemValue {
    ElemValue {
        comment: Some(Arc::from("\0foreign")),
        ..Default::default()
    }
}

/// Where a wanted element lives in the desired table.
#[derive(Clone, Copy)]
enum Place<'a> {
    /// In the set's own elements.
    Own,
    /// Put in a top-level set by this part.
    Part(&'a str),
}

/// Builds the current table from a backend's verdicts, shaped like `desired`.
pub fn mirror(kernel: &mut dyn KernelState, desired: &Table) -> Baseline {
    let mut cur = Table::new(desired.name.clone());
    let mut flush = Vec::new();
    let mut parts: HeldParts = desired
        .parts
        .keys()
        .map(|k| (k.as_str(), (Part::default(), true)))
        .collect();

    for chain in desired.chains.values() {
        if let Some(c) = mirror_chain(kernel, chain) {
            cur.add_chain(c);
        }
    }
    for (key, part) in &desired.parts {
        let entry = parts.get_mut(key.as_str()).expect("every part");
        for chain in part.chains.values() {
            match mirror_chain(kernel, chain) {
                Some(c) => {
                    entry.1 &= c == *chain;
                    entry.0.add_chain(c);
                }
                None => entry.1 = false,
            }
        }
    }

    // Sets: each with every element wanted in it, wherever the desired table puts it.
    let owners = desired.sets.values().map(|s| (None, s)).chain(
        desired
            .parts
            .iter()
            .flat_map(|(k, p)| p.sets.values().map(move |s| (Some(k.as_str()), s))),
    );
    for (owner, set) in owners {
        mirror_set(
            kernel, desired, owner, set, &mut parts, &mut flush, &mut cur,
        );
    }

    for (key, part) in &desired.parts {
        let (held, whole) = parts.remove(key.as_str()).expect("every part");
        let same = whole && held.elements.len() == part.elements.len();
        let held = if same { part.clone() } else { Arc::new(held) };
        cur.parts.insert(key.clone(), held);
    }
    for (name, base) in kernel.other_chains() {
        cur.add_chain(differing_chain(name, base));
    }
    for name in kernel.other_sets() {
        cur.add_set(Set::new(name, Vec::new(), SetKind::Set));
    }
    Baseline {
        table: Some(cur),
        flush,
        table_flags_differ: false,
    }
}

/// Part key -> what the kernel holds of it, and whether that is all of it.
type HeldParts<'a> = BTreeMap<&'a str, (Part, bool)>;

/// One set of `desired` (top-level, or of part `owner`), with every element wanted in it
/// wherever the desired table puts it: what the kernel holds of it goes into `cur` or its
/// part's entry, a set to flush into `flush`.
fn mirror_set<'a>(
    kernel: &mut dyn KernelState,
    desired: &'a Table,
    owner: Option<&'a str>,
    set: &'a Set,
    parts: &mut HeldParts<'a>,
    flush: &mut Vec<String>,
    cur: &mut Table,
) {
    let mut wanted: Vec<(&ElemKey, &ElemValue)> = set.elements.iter().collect();
    let mut places: Vec<Place> = vec![Place::Own; wanted.len()];
    if owner.is_none() {
        for (key, part) in &desired.parts {
            if let Some(e) = part.elements.get(&set.name) {
                wanted.extend(e.iter());
                places.extend(std::iter::repeat_n(Place::Part(key), e.len()));
            }
        }
    }
    let state = kernel.set(set, &wanted);
    let mut held = set.clone_declaration();
    if state.as_ref().is_none_or(|s| s.declaration_differs) {
        for place in &places {
            if let Place::Part(p) = place {
                parts.get_mut(p).expect("every part").1 = false;
            }
        }
    }
    let whole = match &state {
        None => false,
        Some(s) if s.declaration_differs => {
            // A declaration no planner writes: the diff recreates the set.
            held.key.clear();
            false
        }
        Some(s) => {
            if s.flush {
                flush.push(set.name.clone());
            }
            let mut whole = !s.flush && s.foreign.is_empty();
            for (i, ((k, v), place)) in wanted.iter().zip(&places).enumerate() {
                let here = s.present.get(i).copied().unwrap_or(false) && !s.flush;
                match place {
                    Place::Own if here => {
                        held.elements.insert((*k).clone(), (*v).clone());
                    }
                    Place::Own => whole = false,
                    Place::Part(p) if here => {
                        let entry = parts.get_mut(p).expect("every part");
                        entry
                            .0
                            .elements
                            .entry(set.name.clone())
                            .or_default()
                            .insert((*k).clone(), (*v).clone());
                    }
                    Place::Part(p) => parts.get_mut(p).expect("every part").1 = false,
                }
            }
            for k in &s.foreign {
                held.elements.insert(k.clone(), foreign_value());
            }
            whole
        }
    };
    let present = state.is_some();
    match owner {
        None if present => cur.add_set(held),
        None => {}
        Some(p) => {
            let entry = parts.get_mut(p).expect("every part");
            entry.1 &= whole;
            if present {
                entry.0.add_set(held);
            }
        }
    }
}

fn mirror_chain(kernel: &mut dyn KernelState, chain: &Chain) -> Option<Chain> {
    match kernel.chain(chain)? {
        ChainState::Same => Some(chain.clone()),
        ChainState::Differs { base } => Some(differing_chain(chain.name.clone(), base)),
    }
}

fn differing_chain(name: String, base: Option<BaseChain>) -> Chain {
    Chain {
        name,
        base,
        rules: vec![Rule::new(Vec::new()).with_comment(DIFFERS)],
    }
}

/// [`KernelState`] of an in-memory model table (the fake backend's): objects compare as IR.
pub struct ModelState<'a> {
    model: &'a Table,
    asked_chains: std::collections::BTreeSet<String>,
    asked_sets: std::collections::BTreeSet<String>,
}

impl<'a> ModelState<'a> {
    pub fn new(model: &'a Table) -> Self {
        ModelState {
            model,
            asked_chains: Default::default(),
            asked_sets: Default::default(),
        }
    }
}

impl KernelState for ModelState<'_> {
    fn chain(&mut self, want: &Chain) -> Option<ChainState> {
        let have = self.model.chains.get(&want.name)?;
        self.asked_chains.insert(want.name.clone());
        Some(if have == want {
            ChainState::Same
        } else {
            ChainState::Differs { base: have.base }
        })
    }

    fn set(&mut self, want: &Set, elements: &[(&ElemKey, &ElemValue)]) -> Option<SetState> {
        let have = self.model.sets.get(&want.name)?;
        self.asked_sets.insert(want.name.clone());
        if !have.same_declaration(want) {
            return Some(SetState {
                declaration_differs: true,
                ..Default::default()
            });
        }
        if want.flags.dynamic {
            return Some(SetState::default());
        }
        let present: Vec<bool> = elements
            .iter()
            .map(|(k, v)| have.elements.get(*k) == Some(*v))
            .collect();
        let wanted: BTreeMap<&ElemKey, &ElemValue> = elements.iter().copied().collect();
        let foreign = have
            .elements
            .iter()
            .filter(|(k, v)| wanted.get(k) != Some(v))
            .map(|(k, _)| k.clone())
            .collect();
        Some(SetState {
            present,
            foreign,
            ..Default::default()
        })
    }

    fn other_chains(&self) -> Vec<(String, Option<BaseChain>)> {
        self.model
            .chains
            .values()
            .filter(|c| !self.asked_chains.contains(&c.name))
            .map(|c| (c.name.clone(), c.base))
            .collect()
    }

    fn other_sets(&self) -> Vec<String> {
        self.model
            .sets
            .keys()
            .filter(|s| !self.asked_sets.contains(*s))
            .cloned()
            .collect()
    }
}
