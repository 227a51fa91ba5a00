//! What the kernel holds in one table, as typed values: chains and their rules, set
//! declarations and their elements ([`KernelTable`] and its parts), and the parsing of a
//! chain's, a set's and an element list's attributes into them. Elements stay borrowed from
//! the dumped bytes; rules' expressions are decoded by the sibling `exprs`.

use super::super::expr::Expr;
use super::attrs::Attrs;
use std::collections::BTreeMap;

/// A chain as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KChain {
    /// Type name, hook number, priority, policy of a base chain.
    pub base: Option<(String, u32, i32, u32)>,
    pub rules: Vec<KRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KRule {
    /// `None` where an expression is not one the agent ever writes.
    pub exprs: Option<Vec<Expr>>,
    pub udata: Option<Vec<u8>>,
}

/// Map data of one element: a value's bytes, or a verdict code and its chain's name
/// (without the NUL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KData<'a> {
    Value(&'a [u8]),
    Verdict(i32, Option<&'a [u8]>),
}

/// One element as the kernel lists it (and as the agent encodes it: see
/// [`parse_elements`]), borrowed from the message bytes: a large node's restart reads and
/// judges hundreds of thousands of elements, and owned keys and data were allocations for
/// each. Counters, expirations and timeouts are left out: they are state or defaults, not
/// what the agent declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KElem<'a> {
    pub key: &'a [u8],
    pub key_end: Option<&'a [u8]>,
    pub flags: u32,
    pub data: Option<KData<'a>>,
    pub udata: Option<&'a [u8]>,
}

/// A set's declaration as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KSetDecl {
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data: Option<(u32, u32)>,
    pub timeout_ms: Option<u64>,
    /// `NFTA_SET_DESC_SIZE`, when declared.
    pub size: Option<u32>,
    pub concat_fields: Vec<u32>,
    pub udata: Vec<u8>,
    pub counter: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KSet {
    pub decl: KSetDecl,
    /// The element nests of every `NFTA_SET_ELEM_LIST_ELEMENTS` payload of the set's dump,
    /// one after the other (nests delimit themselves): one buffer, not one per element.
    pub elem_bytes: Vec<u8>,
}

impl KSet {
    pub fn elems(&self) -> impl Iterator<Item = KElem<'_>> {
        parse_elements(&self.elem_bytes)
    }
}

/// Everything the kernel holds in one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelTable {
    pub chains: BTreeMap<String, KChain>,
    /// Named and anonymous sets (anonymous ones are named `__set<N>` by the kernel).
    pub sets: BTreeMap<String, KSet>,
    /// `NFTA_TABLE_FLAGS` (`NFT_TABLE_F_DORMANT` = 1: no hook is attached).
    pub flags: u32,
}

pub(super) fn parse_chain(a: Attrs) -> KChain {
    let base = a.get(4).map(|hook| {
        let h = hook.nested();
        (
            a.get(7).map(|t| t.string()).unwrap_or_default(),
            h.be32(1).unwrap_or(u32::MAX),
            h.be32(2).unwrap_or(0) as i32,
            a.be32(5).unwrap_or(1),
        )
    });
    KChain {
        base,
        rules: Vec::new(),
    }
}

pub(super) fn parse_set_decl(a: Attrs) -> KSetDecl {
    let desc = a.get(9).map(|d| d.nested());
    let concat_fields = desc
        .and_then(|d| d.get(2))
        .map(|c| {
            c.nested()
                .into_iter()
                .filter_map(|f| f.nested().be32(1))
                .collect()
        })
        .unwrap_or_default();
    let flags = a.be32(3).unwrap_or(0);
    KSetDecl {
        flags,
        key_type: a.be32(4).unwrap_or(0),
        key_len: a.be32(5).unwrap_or(0),
        data: a.be32(6).map(|t| (t, a.be32(7).unwrap_or(0))),
        timeout_ms: a.get(11).and_then(|t| t.be64()),
        // The kernel lists 0 for a set declared without a size.
        size: desc.and_then(|d| d.be32(1)).filter(|n| *n != 0),
        concat_fields,
        udata: a.get(13).map(|u| u.data.to_vec()).unwrap_or_default(),
        counter: a.get(17).is_some() || a.get(18).is_some(),
    }
}

/// The element nests of an `NFTA_SET_ELEM_LIST_ELEMENTS` payload: what the kernel lists
/// and what the agent's own encoder writes, parsed by this one function.
pub fn parse_elements(list: &[u8]) -> impl Iterator<Item = KElem<'_>> {
    Attrs(list).into_iter().map(|e| {
        let e = e.nested();
        let value = |k: u16| e.get(k).and_then(|x| x.nested().get(1)).map(|v| v.data);
        let data = e.get(2).and_then(|d| {
            let d = d.nested();
            if let Some(v) = d.get(1) {
                return Some(KData::Value(v.data));
            }
            let v = d.get(2)?.nested();
            Some(KData::Verdict(
                v.be32(1)? as i32,
                v.get(2).map(|c| c.str_bytes()),
            ))
        });
        KElem {
            key: value(1).unwrap_or_default(),
            key_end: value(10),
            flags: e.be32(3).unwrap_or(0),
            data,
            udata: e.get(6).map(|u| u.data),
        }
    })
}
