//! Tables whose elements live in parts (the way Services and EgressFirewall plan), built
//! from the flat fixtures: a full sync of one must leave the kernel as `nft -f` of the
//! flattened text does.

use nodeplane::nft::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `t` with each top-level set's elements cut, in order, into `n` runs: the first stays at
/// the top level, run i goes to part `p{i:03}`. The full sync writes every set's elements in
/// the flat order, so its batch equals nft's for the flat table byte for byte.
pub fn chunked(mut t: Table, n: usize) -> Table {
    let mut parts: BTreeMap<String, Part> = BTreeMap::new();
    for set in t.sets.values_mut() {
        let per = set.elements.len().div_ceil(n).max(1);
        let all = std::mem::take(&mut set.elements);
        for (j, (k, v)) in all.into_iter().enumerate() {
            match j / per {
                0 => {
                    set.elements.insert(k, v);
                }
                i => {
                    let part = parts.entry(format!("p{i:03}")).or_default();
                    let elements = part.elements.entry(set.name.clone()).or_default();
                    elements.insert(k, v);
                }
            }
        }
    }
    for (k, p) in parts {
        t.insert_part(k, Arc::new(p));
    }
    t
}

/// `t` with its elements dealt to parts `a`, `b`, `c` and the top level in turn (so keys
/// of one set interleave across parts), every element of `only_in_parts` in part `a`,
/// the chains `chains` in part `b` and the sets `own_sets` (with their elements) owned by
/// part `c`.
pub fn dealt(mut t: Table, only_in_parts: &str, chains: &[&str], own_sets: &[&str]) -> Table {
    let names = ["top", "a", "b", "c"];
    let mut parts: BTreeMap<&str, Part> = BTreeMap::new();
    for name in chains {
        let chain = t.chains.remove(*name).expect("chain to move");
        parts.entry("b").or_default().add_chain(chain);
    }
    for name in own_sets {
        let set = t.sets.remove(*name).expect("set to move");
        parts.entry("c").or_default().add_set(set);
    }
    for set in t.sets.values_mut() {
        let all = std::mem::take(&mut set.elements);
        for (j, (k, v)) in all.into_iter().enumerate() {
            let to = if set.name == only_in_parts {
                "a"
            } else {
                names[j % names.len()]
            };
            if to == "top" {
                set.elements.insert(k, v);
            } else {
                let part = parts.entry(to).or_default();
                let elements = part.elements.entry(set.name.clone()).or_default();
                elements.insert(k, v);
            }
        }
    }
    for (k, p) in parts {
        t.insert_part(k, Arc::new(p));
    }
    t
}
