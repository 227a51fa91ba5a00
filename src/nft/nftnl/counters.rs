//! The kernel's counters of one table, for the per-rule metrics: one rule dump of the whole
//! table and one element dump per set that counts, whatever the number of rules; never a
//! request per rule. Safe Rust only, on the read-back's dump socket.

use super::dump::{
    Attrs, Counted, DumpSocket, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE, counted_in, counter_value, cstr,
};
use super::udata::comment_of;
use crate::nft::engine::NftError;
use crate::nft::ir::Family;
use std::collections::BTreeMap;

/// `NFTA_SET_ELEM_EXPR` (one expression) and `NFTA_SET_ELEM_EXPRESSIONS` (a list).
const NFTA_SET_ELEM_EXPR: u16 = 7;
const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
/// A dump the ruleset changed under is read again this often, then the read fails (the
/// caller keeps its last values: a rule missing from one read must not look like a reset).
const ATTEMPTS: usize = 4;

/// A rule with a `counter`: its chain, its comment and what it counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCount {
    pub chain: String,
    pub comment: Option<String>,
    pub counted: Counted,
}

/// A set element with a counter (a set declared with `counter`): its comment and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElemCount {
    pub comment: Option<String>,
    pub counted: Counted,
}

/// The counters of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableCounters {
    pub rules: Vec<RuleCount>,
    /// Set name -> its counting elements.
    pub elements: BTreeMap<String, Vec<ElemCount>>,
}

/// The rule counters of `table <family> <table>` and the element counters of `sets` (sets
/// the kernel does not hold are left out); `Ok(None)` if the kernel has no such table.
pub fn read_counters(
    family: Family,
    table: &str,
    sets: &[&str],
) -> Result<Option<TableCounters>, NftError> {
    let sock = DumpSocket::open(family)?;
    for _ in 0..ATTEMPTS {
        let mut exists = false;
        let mut intr = sock.dump(NFT_MSG_GETTABLE, &[], |a| {
            exists |= a.get(1).is_some_and(|n| n.string() == table);
        })?;
        if !exists {
            return Ok(None);
        }
        let mut counters = TableCounters::default();
        intr |= read_rules(&sock, table, &mut counters.rules)?;
        // Only sets the kernel holds: one it lacks would read as an interrupted dump.
        let mut held = std::collections::HashSet::new();
        intr |= sock.dump(NFT_MSG_GETSET, &[(1u16, cstr(table))], |a| {
            held.extend(a.get(2).map(|n| n.string()));
        })?;
        for set in sets.iter().filter(|s| held.contains(**s)) {
            let (elements, interrupted) = read_elements(&sock, table, set)?;
            intr |= interrupted;
            if !elements.is_empty() {
                counters.elements.insert(set.to_string(), elements);
            }
        }
        if !intr {
            return Ok(Some(counters));
        }
    }
    Err(NftError::Netlink(std::io::Error::other(format!(
        "table {} {table} kept changing while its counters were read",
        family.keyword()
    ))))
}

/// Every rule of the table that has a `counter`; whether the dump was interrupted.
fn read_rules(sock: &DumpSocket, table: &str, out: &mut Vec<RuleCount>) -> Result<bool, NftError> {
    sock.dump(NFT_MSG_GETRULE, &[(1u16, cstr(table))], |a| {
        if a.get(1).map(|x| x.string()).as_deref() != Some(table) {
            return;
        }
        let (Some(chain), Some(counted)) = (
            a.get(2).map(|x| x.string()),
            a.get(4).and_then(|l| counted_in(l.nested())),
        ) else {
            return;
        };
        out.push(RuleCount {
            chain,
            comment: a.get(7).and_then(|u| comment_of(u.data)),
            counted,
        });
    })
}

/// The counting elements of one set (an interval's end element has no counter: left out);
/// whether the dump was interrupted (a set that went away reads as interrupted).
fn read_elements(
    sock: &DumpSocket,
    table: &str,
    set: &str,
) -> Result<(Vec<ElemCount>, bool), NftError> {
    let mut out = Vec::new();
    let attrs = [(1u16, cstr(table)), (2u16, cstr(set))];
    let intr = sock.dump(NFT_MSG_GETSETELEM, &attrs, |a| {
        if let Some(list) = a.get(3) {
            out.extend(
                list.nested()
                    .into_iter()
                    .filter_map(|e| elem_count(e.nested())),
            );
        }
    })?;
    Ok((out, intr))
}

/// One element's count and comment, if it counts.
fn elem_count(e: Attrs) -> Option<ElemCount> {
    let counted = match e.get(NFTA_SET_ELEM_EXPR) {
        Some(one) => counter_value(one.nested()),
        None => counted_in(e.get(NFTA_SET_ELEM_EXPRESSIONS)?.nested()),
    }?;
    Some(ElemCount {
        comment: e.get(6).and_then(|u| comment_of(u.data)),
        counted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink attribute: length, type, payload, padding to 4 bytes.
    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = ((4 + data.len()) as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize((a.len() + 3) & !3, 0);
        a
    }

    /// `counter` with its NFTA_COUNTER_BYTES (1) and NFTA_COUNTER_PACKETS (2), big-endian.
    fn counter(packets: u64, bytes: u64) -> Vec<u8> {
        let data = [
            attr(1, &bytes.to_be_bytes()),
            attr(2, &packets.to_be_bytes()),
        ]
        .concat();
        [attr(1, b"counter\0"), attr(2, &data)].concat()
    }

    /// The two ways the kernel lists an element's expressions: `NFTA_SET_ELEM_EXPR` (one) and
    /// `NFTA_SET_ELEM_EXPRESSIONS` (a list); an element without a counter is left out.
    #[test]
    fn element_counts_and_comments_are_parsed_as_the_kernel_lists_them() {
        let comment = super::super::udata::rule_comment("rule 4: Deny 0.0.0.0/0");
        let one = [
            attr(1, &attr(1, &[10, 0, 0, 1])),
            attr(NFTA_SET_ELEM_EXPR, &counter(5, 640)),
            attr(6, &comment),
        ]
        .concat();
        let listed = attr(NFTA_SET_ELEM_EXPRESSIONS, &attr(1, &counter(2, 100)));
        let many = [attr(1, &attr(1, &[10, 0, 0, 2])), listed].concat();
        let plain = attr(1, &attr(1, &[10, 0, 0, 3]));
        let parsed: Vec<_> = [one, many, plain]
            .iter()
            .filter_map(|e| elem_count(Attrs(e)))
            .collect();
        let count = |packets, bytes| Counted { packets, bytes };
        assert_eq!(
            parsed,
            [
                ElemCount {
                    comment: Some("rule 4: Deny 0.0.0.0/0".into()),
                    counted: count(5, 640),
                },
                ElemCount {
                    comment: None,
                    counted: count(2, 100),
                },
            ]
        );
    }
}
