//! Transaction -> the list of netlink messages nft would send for the same change, each
//! tagged with the op it came from so a kernel error can be traced back. Messages borrow
//! names from the transaction; element lists are already encoded.

use super::elems::{ElemChunk, ElemLayout, ElemMode, Element, encode_elements};
use super::rule::{KnownSet, LoweredRule, lower_rule};
use super::set::{SetSpec, named_set_spec};
use super::types::encode_err;
use super::udata;
use crate::nft::engine::NftError;
use crate::nft::ir::*;
use crate::nft::transaction::{Op, Transaction};
use std::collections::BTreeMap;

/// A base chain's hook attributes in kernel numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseSpec {
    pub kind: &'static str,
    pub hook: u32,
    pub priority: i32,
    pub policy: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgBody<'a> {
    NewTable {
        owner: bool,
    },
    DelTable,
    NewChain {
        name: &'a str,
        base: Option<BaseSpec>,
    },
    DelChain(&'a str),
    FlushChain(&'a str),
    NewRule {
        chain: &'a str,
        exprs: Vec<super::expr::Expr>,
        udata: Option<Vec<u8>>,
    },
    NewSet(SetSpec),
    DelSet(&'a str),
    /// DELSETELEM without an element list: every element goes.
    FlushSet(&'a str),
    Elems {
        delete: bool,
        set: &'a str,
        set_id: Option<u32>,
        chunk: ElemChunk,
    },
}

/// Which op a message belongs to; `anon` marks an anonymous set created for a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub op: usize,
    pub anon: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg<'a> {
    pub body: MsgBody<'a>,
    pub origin: Origin,
}

/// Lowers a whole transaction. `known` describes sets that already exist in the kernel
/// (needed when a rule looks up an interval set keyed by a host-order type).
pub fn lower<'a>(
    tx: &'a Transaction,
    known: &BTreeMap<String, KnownSet>,
) -> Result<Vec<Msg<'a>>, NftError> {
    check_name("table", &tx.table)?;
    let mut sets = known.clone();
    let mut next_id = 1u32;
    let mut out = Vec::with_capacity(tx.ops.len());
    for (i, op) in tx.ops.iter().enumerate() {
        let origin = Origin { op: i, anon: false };
        let mut push = |body| out.push(Msg { body, origin });
        match op {
            Op::AddTable => push(MsgBody::NewTable { owner: false }),
            Op::AddOwnedTable => push(MsgBody::NewTable { owner: true }),
            Op::DeleteTable => {
                sets.clear();
                push(MsgBody::DelTable);
            }
            Op::AddChain { name, base } => {
                check_name("chain", name)?;
                push(MsgBody::NewChain {
                    name,
                    base: base.as_ref().map(base_spec),
                });
            }
            Op::FlushChain(name) => push(MsgBody::FlushChain(name)),
            Op::DeleteChain(name) => push(MsgBody::DelChain(name)),
            Op::DeleteSet(name) => {
                sets.remove(name);
                push(MsgBody::DelSet(name));
            }
            Op::FlushSet(set) => push(MsgBody::FlushSet(&set.name)),
            Op::AddRule { chain, rule } => {
                let lowered = lower_rule(rule, tx.family, &sets, &mut next_id)?;
                push_rule(&mut out, i, chain, rule, lowered);
            }
            Op::AddSet(set) | Op::AddSetWithParts { set, .. } => {
                check_name("set", &set.name)?;
                let id = next_id;
                next_id += 1;
                sets.insert(set.name.clone(), known_set(set, Some(id)));
                push_named_set(&mut out, origin, op, set, id)?;
            }
            Op::AddElements(set) => {
                let id = sets.get(&set.name).and_then(|s| s.id);
                let chunks = set_elements(op, ElemMode::Add)?;
                push_chunks(&mut out, origin, false, &set.name, id, chunks);
            }
            Op::DeleteElements(set) => {
                let chunks = set_elements(op, ElemMode::Delete)?;
                push_chunks(&mut out, origin, true, &set.name, None, chunks);
            }
        }
    }
    Ok(out)
}

/// A rule's messages: its anonymous sets (each with its elements) first, then the rule.
fn push_rule<'a>(
    out: &mut Vec<Msg<'a>>,
    op: usize,
    chain: &'a str,
    rule: &Rule,
    lowered: LoweredRule,
) {
    for anon in lowered.anon {
        let o = Origin { op, anon: true };
        let id = anon.spec.id;
        let name = if anon.spec.name == "__map%d" {
            "__map%d"
        } else {
            "__set%d"
        };
        out.push(Msg {
            body: MsgBody::NewSet(anon.spec),
            origin: o,
        });
        push_chunks(out, o, false, name, Some(id), anon.elems);
    }
    let udata = rule
        .comment
        .as_ref()
        .map(|c| udata::rule_comment(&crate::nft::render::sanitize_text(c)));
    out.push(Msg {
        body: MsgBody::NewRule {
            chain,
            exprs: lowered.exprs,
            udata,
        },
        origin: Origin { op, anon: false },
    });
}

/// A named set's messages (transaction id `id`): the set, then its elements in chunks.
fn push_named_set<'a>(
    out: &mut Vec<Msg<'a>>,
    origin: Origin,
    op: &Op,
    set: &'a Set,
    id: u32,
) -> Result<(), NftError> {
    let spec = named_set_spec(set, id)?;
    out.push(Msg {
        body: MsgBody::NewSet(spec),
        origin,
    });
    let chunks = set_elements(op, ElemMode::Create)?;
    push_chunks(out, origin, false, &set.name, Some(id), chunks);
    Ok(())
}

pub fn known_set(set: &Set, id: Option<u32>) -> KnownSet {
    KnownSet {
        interval: set.flags.interval,
        key: set.key.clone(),
        kind: set.kind.clone(),
        id,
    }
}

/// nft identifiers never contain NUL; anything else is the kernel's to judge.
fn check_name(what: &str, name: &str) -> Result<(), NftError> {
    if name.is_empty() || name.contains('\0') {
        return Err(encode_err(
            &format!("{what} name {name:?}"),
            "empty or contains NUL".into(),
        ));
    }
    Ok(())
}

fn base_spec(b: &BaseChain) -> BaseSpec {
    BaseSpec {
        kind: match b.kind {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        },
        // NF_INET_* hook numbers.
        hook: match b.hook {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        },
        priority: b.priority,
        policy: match b.policy {
            Policy::Drop => 0,
            Policy::Accept => 1,
        },
    }
}

/// Every element a set op writes ([`Op::elements`]), encoded with its set's declaration
/// and split into messages like nft; `src` numbers them in that order.
fn set_elements(op: &Op, mode: ElemMode) -> Result<Vec<ElemChunk>, NftError> {
    let set = op.set().expect("a set op");
    let layout = ElemLayout::new(set.key.clone(), set.flags.interval, set.kind.clone())?;
    let elems = op.elements().enumerate().map(|(i, (k, v))| Element {
        key: k,
        value: Some(v),
        src: i as u32,
    });
    match encode_elements(&layout, elems, mode, false) {
        Ok(chunks) => Ok(chunks.finish()),
        Err(NftError::Encode { what, reason }) => {
            Err(encode_err(&format!("set {}: {what}", set.name), reason))
        }
        Err(other) => Err(other),
    }
}

fn push_chunks<'a>(
    out: &mut Vec<Msg<'a>>,
    origin: Origin,
    delete: bool,
    set: &'a str,
    set_id: Option<u32>,
    chunks: Vec<ElemChunk>,
) {
    for chunk in chunks {
        out.push(Msg {
            body: MsgBody::Elems {
                delete,
                set,
                set_id,
                chunk,
            },
            origin,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn big_map(n: u32) -> Set {
        super::super::set::tcp_80_vmap((0..n).map(|i| {
            let goto = Verdict::Goto(format!("svc-{}", i % 100));
            (Ipv4Addr::from(0x0a00_0000 + i), goto)
        }))
    }

    #[test]
    fn large_element_lists_are_split_below_the_attribute_limit() {
        let mut t = Table::new("nodeplane");
        t.add_set(big_map(10_000));
        let tx = Transaction::full(&t);
        let msgs = lower(&tx, &BTreeMap::new()).unwrap();
        let chunks: Vec<&ElemChunk> = msgs
            .iter()
            .filter_map(|m| match &m.body {
                MsgBody::Elems { chunk, .. } => Some(chunk),
                _ => None,
            })
            .collect();
        assert!(chunks.len() > 1, "10k elements need several messages");
        assert_eq!(chunks.iter().map(|c| c.srcs.len()).sum::<usize>(), 10_000);
        for c in chunks {
            assert!(c.list.len() + 4 <= u16::MAX as usize);
        }
    }

    #[test]
    fn set_ids_number_named_then_anonymous_sets_in_batch_order() {
        let mut t = Table::new("nodeplane");
        t.add_set(big_map(1));
        let mut c = Chain::regular("c");
        c.push(Rule::new(vec![Stmt::Match(Match {
            key: vec![Field::ThDport],
            op: MatchOp::InAnon(vec![
                vec![Value::Port(80).into()],
                vec![Value::Port(443).into()],
            ]),
        })]));
        t.add_chain(c);
        let tx = Transaction::full(&t);
        let msgs = lower(&tx, &BTreeMap::new()).unwrap();
        let ids: Vec<(String, u32)> = msgs
            .iter()
            .filter_map(|m| match &m.body {
                MsgBody::NewSet(s) => Some((s.name.clone(), s.id)),
                _ => None,
            })
            .collect();
        assert_eq!(ids, vec![("vm".into(), 1), ("__set%d".into(), 2)]);
        let bad = Transaction::full(&Table::new("bad\0name"));
        assert!(lower(&bad, &BTreeMap::new()).is_err());
    }
}
