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
    /// [`Self::set`] for many sets, answered in the order given (a backend may judge them in
    /// parallel).
    fn sets(&mut self, wanted: &[WantedSet]) -> Vec<Option<SetState>> {
        wanted.iter().map(|(s, e)| self.set(s, e)).collect()
    }
    /// Chains the kernel has that no desired chain asked about, with their hook.
    fn other_chains(&self) -> Vec<(String, Option<BaseChain>)>;
    /// Sets the kernel has that no desired set asked about.
    fn other_sets(&self) -> Vec<String>;
}

/// A desired set and every element wanted in it.
pub type WantedSet<'a> = (&'a Set, Vec<(&'a ElemKey, &'a ElemValue)>);

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

/// What the kernel holds of one desired part, while the table is judged.
#[derive(Default)]
struct Held<'a> {
    /// Its chains and sets as the kernel holds them (elements of its own sets included).
    part: Part,
    /// Its elements in top-level sets that the kernel holds as wanted, by reference: a
    /// part held whole is the desired `Arc` itself, so copies are made only for the rest.
    elements: Vec<(&'a str, &'a ElemKey, &'a ElemValue)>,
    /// Everything it wants is in the kernel as wanted.
    whole: bool,
}

/// What the kernel holds of each desired part, in the order of `Table::parts` (an index
/// rather than the part's key: a table at 50,000 services has 350,000 elements to note).
type HeldParts<'a> = Vec<Held<'a>>;

/// The elements parts put in each top-level set, with the index of the part putting them:
/// gathered in one pass, so judging the sets costs the number of elements, not sets x
/// parts.
type PartElementsBySet<'a> = BTreeMap<&'a str, Vec<(&'a ElemKey, &'a ElemValue, usize)>>;

/// Builds the current table from a backend's verdicts, shaped like `desired`.
pub fn mirror(kernel: &mut dyn KernelState, desired: &Table) -> Baseline {
    let mut cur = Table::new(desired.name.clone());
    let mut flush = Vec::new();
    let mut parts: HeldParts = desired
        .parts
        .keys()
        .map(|_| Held {
            whole: true,
            ..Default::default()
        })
        .collect();
    let by_set = part_elements_by_set(desired, &mut parts);
    mirror_chains(kernel, desired, &mut cur, &mut parts);
    mirror_sets(kernel, desired, by_set, &mut cur, &mut parts, &mut flush);
    for ((key, part), held) in desired.parts.iter().zip(parts) {
        cur.parts.insert(key.clone(), held.into_part(part));
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

impl Held<'_> {
    /// The part as held: the desired `Arc` itself when held whole.
    fn into_part(self, desired: &Arc<Part>) -> Arc<Part> {
        if self.whole {
            return desired.clone();
        }
        let mut p = self.part;
        for (set, k, v) in self.elements {
            p.elements
                .entry(set.to_string())
                .or_default()
                .insert(k.clone(), v.clone());
        }
        Arc::new(p)
    }
}

/// The elements the parts of `desired` put in its top-level sets; a part with elements for
/// a set nobody declares cannot be held whole (noted in `parts`).
fn part_elements_by_set<'a>(desired: &'a Table, parts: &mut HeldParts) -> PartElementsBySet<'a> {
    let mut by_set: PartElementsBySet = BTreeMap::new();
    for (i, part) in desired.parts.values().enumerate() {
        for (set, elements) in &part.elements {
            if !desired.sets.contains_key(set) {
                parts[i].whole = false;
                continue;
            }
            by_set
                .entry(set.as_str())
                .or_default()
                .extend(elements.iter().map(|(k, v)| (k, v, i)));
        }
    }
    by_set
}

/// The table's chains as the kernel holds them into `cur`, the parts' into `parts`.
fn mirror_chains(
    kernel: &mut dyn KernelState,
    desired: &Table,
    cur: &mut Table,
    parts: &mut HeldParts,
) {
    for chain in desired.chains.values() {
        if let Some(c) = mirror_chain(kernel, chain) {
            cur.add_chain(c);
        }
    }
    for (entry, part) in parts.iter_mut().zip(desired.parts.values()) {
        for chain in part.chains.values() {
            match mirror_chain(kernel, chain) {
                Some(c) => {
                    entry.whole &= c == *chain;
                    entry.part.add_chain(c);
                }
                None => entry.whole = false,
            }
        }
    }
}

/// Every set as the kernel holds it, judged in one call so that a backend may judge them
/// in parallel: first the table's own sets (with the elements parts put in them, `by_set`)
/// into `cur`, then the parts' into `parts`; sets to flush into `flush`.
fn mirror_sets<'a>(
    kernel: &mut dyn KernelState,
    desired: &'a Table,
    mut by_set: PartElementsBySet<'a>,
    cur: &mut Table,
    parts: &mut HeldParts<'a>,
    flush: &mut Vec<String>,
) {
    let mut jobs: Vec<SetJob> = desired
        .sets
        .values()
        .map(|set| {
            let from_parts = by_set.remove(set.name.as_str()).unwrap_or_default();
            (set, from_parts, None)
        })
        .collect();
    for (i, part) in desired.parts.values().enumerate() {
        jobs.extend(part.sets.values().map(|set| (set, Vec::new(), Some(i))));
    }
    let wanted: Vec<WantedSet> = jobs
        .iter()
        .map(|(set, from_parts, _)| {
            let mut wanted: Vec<_> = set.elements.iter().collect();
            wanted.extend(from_parts.iter().map(|(k, v, _)| (*k, *v)));
            (*set, wanted)
        })
        .collect();
    let states = kernel.sets(&wanted);
    drop(wanted);
    for ((set, from_parts, owner), state) in jobs.into_iter().zip(states) {
        let held = held_set(set, &from_parts, state, parts, flush);
        match (owner, held) {
            (None, Some((held, _))) => cur.add_set(held),
            (None, None) => {}
            (Some(i), Some((held, whole))) => {
                parts[i].whole &= whole;
                parts[i].part.add_set(held);
            }
            (Some(i), None) => parts[i].whole = false,
        }
    }
}

/// A set to judge: the set, the elements parts put in it with the index of the part
/// putting them, and the part declaring it (`None`: the table itself).
type SetJob<'a> = (
    &'a Set,
    Vec<(&'a ElemKey, &'a ElemValue, usize)>,
    Option<usize>,
);

/// What the kernel holds of one desired set with its own elements and `from_parts` (the
/// elements parts put in it), given the kernel's verdict on it (`None`: no such set), and
/// whether that is all of the set's own; the parts' held elements are noted in `parts` and a
/// set to flush in `flush`.
fn held_set<'a>(
    set: &'a Set,
    from_parts: &[(&'a ElemKey, &'a ElemValue, usize)],
    state: Option<SetState>,
    parts: &mut HeldParts<'a>,
    flush: &mut Vec<String>,
) -> Option<(Set, bool)> {
    let own = set.elements.len();
    let mut held = set.clone_declaration();
    let s = match &state {
        Some(s) if !s.declaration_differs => s,
        _ => {
            for (_, _, p) in from_parts {
                parts[*p].whole = false;
            }
            if state.is_some() {
                // A declaration no planner writes: the diff recreates the set.
                held.key.clear();
            }
            return state.map(|_| (held, false));
        }
    };
    let mut whole = !s.flush && s.foreign.is_empty();
    if s.flush {
        flush.push(set.name.clone());
    }
    let here = |i: usize| s.present.get(i).copied().unwrap_or(false) && !s.flush;
    for (i, (k, v)) in set.elements.iter().enumerate() {
        if here(i) {
            held.elements.insert(k.clone(), v.clone());
        } else {
            whole = false;
        }
    }
    for (i, (k, v, p)) in from_parts.iter().enumerate() {
        let entry = &mut parts[*p];
        if here(own + i) {
            entry.elements.push((set.name.as_str(), k, v));
        } else {
            entry.whole = false;
        }
    }
    for k in &s.foreign {
        held.elements.insert(k.clone(), foreign_value());
    }
    Some((held, whole))
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
