//! Judges a table read back from the kernel ([`KernelTable`]) against the desired IR by
//! encoding the desired objects with the same lowering the apply uses and comparing the
//! typed kernel-level values: expressions ([`Expr`]), set declarations and element specs.
//! Comparing encodings rather than decoding the kernel into IR avoids guessing which of
//! several equivalent IR forms (a prefix or a range, say) produced what the kernel holds.

use super::dump::{KElem, KSet, KernelTable, parse_elements};
use super::elems::{ElemLayout, ElemMode, Element, encode_elements};
use super::expr::Expr;
use super::lower::known_set;
use super::rule::{AnonSet, KnownSet, lower_rule};
use super::set::{NFT_DATA_VERDICT, NFT_SET_ELEM_INTERVAL_END, named_set_spec};
use super::types::type_info;
use super::udata;
use crate::nft::ir::*;
use crate::nft::readback::{ChainState, KernelState, SetState, WantedSet};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Threads that judge a large table's sets at once.
const JUDGES: usize = 4;

/// Fewer wanted elements than this are judged on the calling thread.
const PARALLEL_FROM: usize = 20_000;

/// A read-back table being judged; remembers which kernel objects were asked about.
pub struct Judge {
    kernel: KernelTable,
    family: Family,
    known: BTreeMap<String, KnownSet>,
    asked_chains: BTreeSet<String>,
    asked_sets: BTreeSet<String>,
}

impl Judge {
    /// `desired` declares the sets the desired rules may look up.
    pub fn new(kernel: KernelTable, desired: &Table) -> Judge {
        let known = all_sets(desired)
            .map(|s| (s.name.clone(), known_set(s, None)))
            .collect();
        Judge {
            kernel,
            family: desired.family,
            known,
            asked_chains: BTreeSet::new(),
            asked_sets: BTreeSet::new(),
        }
    }

    /// The sets the backend may treat as existing once the repair is applied.
    pub fn known(&self) -> &BTreeMap<String, KnownSet> {
        &self.known
    }

    /// The verdict on one set; `None` if the kernel has no set of that name.
    fn judge_set(&self, want: &Set, elements: &[(&ElemKey, &ElemValue)]) -> Option<SetState> {
        let have = self.kernel.sets.get(&want.name)?;
        let differs = SetState {
            declaration_differs: true,
            ..Default::default()
        };
        let Ok(spec) = named_set_spec(want, 0) else {
            return Some(differs);
        };
        let d = &have.decl;
        // A verdict map's data length is the kernel's (sizeof struct nft_verdict).
        let data =
            |d: Option<(u32, u32)>| d.map(|(t, l)| (t, if t == NFT_DATA_VERDICT { 0 } else { l }));
        let same_decl = d.flags == spec.flags
            && d.key_type == spec.key_type
            && d.key_len == spec.key_len
            && data(d.data) == data(spec.data)
            && d.timeout_ms == spec.timeout_ms
            && same_size(d.size, &spec)
            && d.concat_fields == spec.concat_fields
            && d.udata == spec.udata
            && d.counter == spec.counter;
        if !same_decl {
            tracing::debug!(set = %want.name, "kernel set declaration differs");
            return Some(differs);
        }
        if want.flags.dynamic {
            // Filled by the packet path (affinity): the kernel's elements are the truth.
            return Some(SetState::default());
        }
        Some(judge_elements(want, have, elements))
    }

    fn rule_same(&self, have: &super::dump::KRule, want: &Rule) -> bool {
        let Some(exprs) = &have.exprs else {
            return false;
        };
        let udata = want
            .comment
            .as_ref()
            .map(|c| udata::rule_comment(&crate::nft::render::sanitize_text(c)));
        if udata != have.udata {
            return false;
        }
        let mut id = 1u32 << 30;
        let Ok(lowered) = lower_rule(want, self.family, &self.known, &mut id) else {
            return false;
        };
        if lowered.exprs.len() != exprs.len() {
            return false;
        }
        let anon: HashMap<u32, &AnonSet> = lowered.anon.iter().map(|a| (a.spec.id, a)).collect();
        lowered.exprs.iter().zip(exprs).all(|(w, h)| {
            match (w, h) {
                (
                    Expr::Lookup {
                        set_id: Some(id), ..
                    },
                    Expr::Lookup { set, .. },
                ) if anon.contains_key(id) => {
                    // An anonymous set: the kernel named it; compare what it holds.
                    let same_rest =
                        w.clone().canonical_without_set() == h.clone().canonical_without_set();
                    same_rest
                        && self
                            .kernel
                            .sets
                            .get(set)
                            .is_some_and(|k| anon_same(k, anon[id]))
                }
                _ => w.clone().canonical() == h.clone().canonical(),
            }
        })
    }
}

fn all_sets(t: &Table) -> impl Iterator<Item = &Set> {
    t.sets
        .values()
        .chain(t.parts.values().flat_map(|p| p.sets.values()))
}

fn anon_same(k: &KSet, want: &AnonSet) -> bool {
    let mut have: Vec<KElem> = k.elems().collect();
    let mut wanted: Vec<KElem> = want
        .elems
        .iter()
        .flat_map(|c| parse_elements(&c.list))
        .collect();
    have.sort();
    wanted.sort();
    k.decl.key_type == want.spec.key_type && k.decl.key_len == want.spec.key_len && have == wanted
}

fn decode_base(b: &(String, u32, i32, u32)) -> Option<BaseChain> {
    let kind = match b.0.as_str() {
        "filter" => ChainType::Filter,
        "nat" => ChainType::Nat,
        "route" => ChainType::Route,
        _ => return None,
    };
    let hook = match b.1 {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        _ => return None,
    };
    let policy = match b.3 {
        0 => Policy::Drop,
        1 => Policy::Accept,
        _ => return None,
    };
    Some(BaseChain {
        kind,
        hook,
        priority: b.2,
        policy,
    })
}

/// A hook attachment no planner uses: a base chain the agent cannot describe is replaced.
const UNKNOWN_BASE: BaseChain = BaseChain {
    kind: ChainType::Route,
    hook: Hook::Forward,
    priority: i32::MIN,
    policy: Policy::Drop,
};

impl KernelState for Judge {
    fn chain(&mut self, want: &Chain) -> Option<ChainState> {
        let have = self.kernel.chains.get(&want.name)?;
        self.asked_chains.insert(want.name.clone());
        let base = have
            .base
            .as_ref()
            .map(|b| decode_base(b).unwrap_or(UNKNOWN_BASE));
        if base != want.base
            || have.rules.len() != want.rules.len()
            || !have
                .rules
                .iter()
                .zip(&want.rules)
                .all(|(h, w)| self.rule_same(h, w))
        {
            tracing::debug!(chain = %want.name, "kernel chain differs from the desired one");
            return Some(ChainState::Differs { base });
        }
        Some(ChainState::Same)
    }

    fn set(&mut self, want: &Set, elements: &[(&ElemKey, &ElemValue)]) -> Option<SetState> {
        if self.kernel.sets.contains_key(&want.name) {
            self.asked_sets.insert(want.name.clone());
        }
        self.judge_set(want, elements)
    }

    /// Judges the sets on up to [`JUDGES`] threads: encoding the wanted elements is most of
    /// a large table's compare, and sets are independent.
    fn sets(&mut self, wanted: &[WantedSet]) -> Vec<Option<SetState>> {
        for (want, _) in wanted {
            if self.kernel.sets.contains_key(&want.name) {
                self.asked_sets.insert(want.name.clone());
            }
        }
        let total: usize = wanted.iter().map(|(_, e)| e.len()).sum();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, JUDGES);
        if threads == 1 || total < PARALLEL_FROM {
            return wanted.iter().map(|(s, e)| self.judge_set(s, e)).collect();
        }
        // Contiguous runs of about equal element counts, one per thread, in order.
        let mut runs = vec![Vec::new(); threads];
        let mut seen = 0;
        for (i, (_, e)) in wanted.iter().enumerate() {
            runs[(seen * threads / total).min(threads - 1)].push(i);
            seen += e.len();
        }
        let this = &*self;
        std::thread::scope(|scope| {
            let workers: Vec<_> = runs
                .iter()
                .map(|run| {
                    scope.spawn(move || {
                        run.iter()
                            .map(|i| this.judge_set(wanted[*i].0, &wanted[*i].1))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a set judge panicked"))
                .collect()
        })
    }

    fn other_chains(&self) -> Vec<(String, Option<BaseChain>)> {
        self.kernel
            .chains
            .iter()
            .filter(|(n, _)| !self.asked_chains.contains(*n))
            .map(|(n, c)| {
                let base = c
                    .base
                    .as_ref()
                    .map(|b| decode_base(b).unwrap_or(UNKNOWN_BASE));
                (n.clone(), base)
            })
            .collect()
    }

    fn other_sets(&self) -> Vec<String> {
        self.kernel
            .sets
            .iter()
            // Anonymous sets belong to their rule and go with it.
            .filter(|(n, s)| {
                s.decl.flags & super::set::NFT_SET_ANONYMOUS == 0 && !self.asked_sets.contains(*n)
            })
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// The kernel gives a dynamic set used by a rule and declared without a size its own
/// bound, 65535 elements (`nft_dynset_init`).
fn same_size(have: Option<u32>, want: &super::set::SetSpec) -> bool {
    const KERNEL_DYNSET_SIZE: u32 = 65_535;
    have == want.desc_size
        || (want.desc_size.is_none()
            && want.flags & super::set::NFT_SET_EVAL != 0
            && have == Some(KERNEL_DYNSET_SIZE))
}

fn flush_all(n: usize) -> SetState {
    SetState {
        present: vec![false; n],
        flush: true,
        ..Default::default()
    }
}

/// Matches wanted elements against the kernel's, by their encoding.
fn judge_elements(want: &Set, have: &KSet, elements: &[(&ElemKey, &ElemValue)]) -> SetState {
    let Ok(layout) = ElemLayout::new(want.key.clone(), want.flags.interval, want.kind.clone())
    else {
        return flush_all(elements.len());
    };
    let single_interval = want.flags.interval && want.key.len() == 1;
    let elems = elements.iter().enumerate().map(|(i, (k, v))| Element {
        key: k,
        value: Some(v),
        src: i as u32,
    });
    let mode = if single_interval {
        ElemMode::Create
    } else {
        ElemMode::Add
    };
    let Ok(chunks) = encode_elements(&layout, elems, mode, false) else {
        return flush_all(elements.len());
    };
    let chunks = chunks.finish();
    if single_interval {
        // Start and end elements of neighbouring intervals are shared knowledge of the
        // whole set: compare the whole set (nft's leading end element at 0 may or may not
        // be there, depending on whether the set was created with its elements).
        let zero_end =
            |e: &KElem| e.flags & NFT_SET_ELEM_INTERVAL_END != 0 && e.key.iter().all(|b| *b == 0);
        let mut wanted: Vec<KElem> = chunks
            .iter()
            .flat_map(|c| parse_elements(&c.list))
            .filter(|e| !zero_end(e))
            .collect();
        let mut held: Vec<KElem> = have.elems().filter(|e| !zero_end(e)).collect();
        wanted.sort();
        held.sort();
        return if wanted == held {
            SetState {
                present: vec![true; elements.len()],
                ..Default::default()
            }
        } else {
            flush_all(elements.len())
        };
    }
    // foldhash, seeded per process: SipHash was a tenth of a 50,000-service restart's compare.
    let mut held: HashMap<KElem, bool, foldhash::fast::RandomState> =
        have.elems().map(|e| (e, false)).collect();
    let mut present = vec![false; elements.len()];
    for c in &chunks {
        for (src, e) in c.srcs.iter().zip(parse_elements(&c.list)) {
            if let Some(used) = held.get_mut(&e) {
                *used = true;
                present[*src as usize] = true;
            }
        }
    }
    let mut foreign = Vec::new();
    for (e, used) in held {
        if used {
            continue;
        }
        if want.flags.interval {
            return flush_all(elements.len());
        }
        match decode_key(&want.key, e.key).filter(|k| encodes_to(&layout, k, e.key)) {
            Some(k) => foreign.push(k),
            None => return flush_all(elements.len()),
        }
    }
    SetState {
        present,
        foreign,
        ..Default::default()
    }
}

/// Whether `key` is written as exactly `bytes` (so deleting it deletes that element).
fn encodes_to(layout: &ElemLayout, key: &ElemKey, bytes: &[u8]) -> bool {
    let one = Element {
        key,
        value: None,
        src: 0,
    };
    encode_elements(layout, std::iter::once(one), ElemMode::Delete, false)
        .map(|c| c.finish())
        .ok()
        .is_some_and(|c| {
            c.first().is_some_and(|c| {
                let mut e = parse_elements(&c.list);
                e.next().is_some_and(|e| e.key == bytes) && e.next().is_none()
            })
        })
}

/// A plain (non-interval) key back to IR values; `None` for a type the agent cannot
/// write back byte for byte (the set is then flushed and refilled instead).
fn decode_key(types: &[DataType], bytes: &[u8]) -> Option<ElemKey> {
    let mut out = Vec::with_capacity(types.len());
    let mut at = 0;
    for t in types {
        let len = type_info(*t).ok()?.len;
        let b = bytes.get(at..at + len)?;
        at += len.div_ceil(4) * 4;
        let v = match t {
            DataType::Ipv4Addr => Value::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
            DataType::Ipv6Addr => Value::Ipv6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
            DataType::InetProto => Value::Proto(b[0]),
            DataType::InetService => Value::Port(u16::from_be_bytes(b.try_into().ok()?)),
            DataType::Mark => Value::Mark(u32::from_ne_bytes(b.try_into().ok()?)),
            DataType::Integer => Value::Integer(u32::from_ne_bytes(b.try_into().ok()?)),
            DataType::IfName => {
                let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
                Value::IfName(String::from_utf8(b[..end].to_vec()).ok()?)
            }
            DataType::NfProto => Value::NfProto(match b[0] {
                2 => IpFamily::V4,
                10 => IpFamily::V6,
                _ => return None,
            }),
            _ => return None,
        };
        out.push(KeyPart::Value(v));
    }
    Some(out)
}
