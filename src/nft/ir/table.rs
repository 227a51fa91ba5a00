//! The table and its parts: `table <family> nodeplane` with its top-level chains and sets,
//! and the [`Part`]s features plan one per object (shared by `Arc` between plans so a diff
//! skips what did not change), with the elements a part adds to the table's top-level sets.

use super::chain::Chain;
use super::elem::{ElemData, ElemKey, ElemValue};
use super::set::Set;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The name of the agent's tables (`table inet nodeplane`, and `table bridge nodeplane` for
/// bridged pods when NetworkPolicy needs it).
pub const TABLE_NAME: &str = "nodeplane";

/// A table's address family. `inet` sees routed traffic (and bridged IP traffic when
/// `br_netfilter` hands it to the IP hooks); `bridge` sees the frames a Linux bridge forwards,
/// which no inet table sees without `br_netfilter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Family {
    #[default]
    Inet,
    Bridge,
}

impl Family {
    /// The nft keyword (`table inet`, `table bridge`).
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Inet => "inet",
            Family::Bridge => "bridge",
        }
    }

    /// `NFPROTO_INET` / `NFPROTO_BRIDGE`, the family of every nf_tables message.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Bridge => 7,
        }
    }
}

/// A whole `table <family> <name>`; containers are sorted so output is deterministic.
///
/// Large features plan into [`Part`]s instead of the top-level maps: one part per object
/// (e.g. per Service), shared by `Arc` between successive plans. `diff` skips parts that
/// are pointer-equal, so an update costs what changed, not the size of the table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table {
    pub name: String,
    pub family: Family,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    /// Independently planned pieces, by a key unique in the table (e.g. `svc/ns/name`).
    /// A persistent map: cloning it is O(1), so a planner can keep last plan's parts and
    /// replace only the changed ones. Private to `nft`: features add parts through
    /// [`Table::insert_part`] / [`Table::extend_parts`]; only the diff, the read-back and the
    /// renderer look inside.
    pub(in crate::nft) parts: Parts,
}

/// See [`Table::parts`].
pub type Parts = imbl::OrdMap<String, Arc<Part>>;

/// An object's share of the table: chains and sets it owns (names unique in the table) and
/// elements it adds to the table's top-level sets and maps (keys unique across parts: the
/// planner guarantees it, as it guarantees unique chain names).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Part {
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    /// Top-level set name -> elements this part puts in it.
    pub elements: BTreeMap<String, PartElements>,
}

/// The elements a part puts in one top-level set, sorted by key. A sorted vector rather
/// than a `BTreeMap`: a part typically puts one to a dozen elements in a set, and a
/// `BTreeMap` allocates room for 11 entries on its first insert (~900 bytes here), which at
/// 10,000 services x 3 sets was ~25 MB of empty slots.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartElements(Vec<(ElemKey, ElemValue)>);

type PartElementsIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (ElemKey, ElemValue)>,
    fn(&'a (ElemKey, ElemValue)) -> (&'a ElemKey, &'a ElemValue),
>;

impl PartElements {
    /// Inserts or replaces. Appending in key order (the usual case) is O(1).
    pub fn insert(&mut self, key: ElemKey, value: ElemValue) {
        match self.0.last() {
            Some((last, _)) if *last < key => self.0.push((key, value)),
            None => self.0.push((key, value)),
            _ => match self.0.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(i) => self.0[i].1 = value,
                Err(i) => self.0.insert(i, (key, value)),
            },
        }
    }

    pub fn get(&self, key: &ElemKey) -> Option<&ElemValue> {
        let i = self.0.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&self.0[i].1)
    }

    pub fn contains_key(&self, key: &ElemKey) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> PartElementsIter<'_> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &ElemKey> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&ElemKey, &ElemValue) -> bool) {
        self.0.retain(|(k, v)| keep(k, v));
    }
}

impl<'a> IntoIterator for &'a PartElements {
    type Item = (&'a ElemKey, &'a ElemValue);
    type IntoIter = PartElementsIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl Part {
    pub fn add_chain(&mut self, chain: Chain) {
        self.chains.insert(chain.name.clone(), chain);
    }

    pub fn add_set(&mut self, set: Set) {
        self.sets.insert(set.name.clone(), set);
    }

    /// Adds `key : data` to the top-level map `set`.
    pub fn add_mapping(&mut self, set: &str, key: ElemKey, data: ElemData) {
        self.elements.entry(set.to_string()).or_default().insert(
            key,
            ElemValue {
                data: Some(data),
                ..Default::default()
            },
        );
    }

    /// Adds `key` to the top-level set `set`.
    pub fn add_element(&mut self, set: &str, key: ElemKey) {
        self.elements
            .entry(set.to_string())
            .or_default()
            .insert(key, ElemValue::default());
    }

    /// Gives back the spare capacity of the element vectors (call once the part is built).
    pub fn shrink_to_fit(&mut self) {
        for e in self.elements.values_mut() {
            e.0.shrink_to_fit();
        }
    }

    fn object_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum::<usize>()
            + self.sets.values().map(|s| s.elements.len()).sum::<usize>()
            + self.elements.values().map(PartElements::len).sum::<usize>()
    }
}

impl Table {
    /// An empty `table inet <name>`.
    pub fn new(name: impl Into<String>) -> Self {
        Table {
            name: name.into(),
            ..Default::default()
        }
    }

    /// An empty table of `family`.
    pub fn with_family(family: Family, name: impl Into<String>) -> Self {
        Table {
            family,
            ..Table::new(name)
        }
    }

    /// Adds a chain, replacing one of the same name.
    pub fn add_chain(&mut self, chain: Chain) {
        self.chains.insert(chain.name.clone(), chain);
    }

    /// Adds a set or map, replacing one of the same name.
    pub fn add_set(&mut self, set: Set) {
        self.sets.insert(set.name.clone(), set);
    }

    /// Adds (or replaces) the part `key`.
    pub fn insert_part(&mut self, key: impl Into<String>, part: Arc<Part>) {
        self.parts.insert(key.into(), part);
    }

    /// Adds every part of `parts`. Costs the smaller of the two maps: the larger persistent
    /// map is shared (an O(1) clone), and the smaller one's parts are inserted into it.
    pub fn extend_parts(&mut self, parts: &Parts) {
        if parts.len() <= self.parts.len() {
            for (k, p) in parts.iter() {
                self.parts.insert(k.clone(), p.clone());
            }
        } else {
            let mine = std::mem::replace(&mut self.parts, parts.clone());
            for (k, p) in mine {
                self.parts.insert(k, p);
            }
        }
    }

    /// The part `key`, if planned.
    pub fn part(&self, key: &str) -> Option<&Arc<Part>> {
        self.parts.get(key)
    }

    /// The part `key` to modify (copied first if shared).
    pub fn part_mut(&mut self, key: &str) -> Option<&mut Part> {
        self.parts.get_mut(key).map(Arc::make_mut)
    }

    /// The keys of the planned parts, sorted.
    pub fn part_keys(&self) -> impl Iterator<Item = &str> {
        self.parts.keys().map(String::as_str)
    }

    /// Number of parts.
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// Every chain with its rules, top-level and in parts (what the kernel holds).
    pub fn all_chains(&self) -> impl Iterator<Item = &Chain> {
        self.chains
            .values()
            .chain(self.parts.values().flat_map(|p| p.chains.values()))
    }

    /// Every set's name and number of elements as the kernel holds it: a top-level set
    /// counts the elements parts put in it, and sets owned by parts are included.
    pub fn element_counts(&self) -> BTreeMap<&str, usize> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for set in self.sets.values() {
            *counts.entry(&set.name).or_default() += set.elements.len();
        }
        for part in self.parts.values() {
            for set in part.sets.values() {
                *counts.entry(&set.name).or_default() += set.elements.len();
            }
            for (set, elements) in &part.elements {
                if let Some(s) = self.sets.get(set) {
                    *counts.entry(&s.name).or_default() += elements.len();
                }
            }
        }
        counts
    }

    /// Number of rules plus set elements: a rough size for metrics and logs.
    pub fn object_count(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum::<usize>()
            + self.sets.values().map(|s| s.elements.len()).sum::<usize>()
            + self.parts.values().map(|p| p.object_count()).sum::<usize>()
    }

    /// The same table with every part merged into the top-level maps: what the kernel holds.
    /// Used where the whole table is written anyway (full sync, rendering).
    pub fn flatten(&self) -> Table {
        let mut t = Table {
            name: self.name.clone(),
            family: self.family,
            chains: self.chains.clone(),
            sets: self.sets.clone(),
            parts: Parts::new(),
        };
        for part in self.parts.values() {
            t.chains
                .extend(part.chains.iter().map(|(k, v)| (k.clone(), v.clone())));
            t.sets
                .extend(part.sets.iter().map(|(k, v)| (k.clone(), v.clone())));
            for (set, elements) in &part.elements {
                if let Some(s) = t.sets.get_mut(set) {
                    s.elements
                        .extend(elements.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        t
    }
}
