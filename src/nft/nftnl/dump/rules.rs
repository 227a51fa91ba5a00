//! Per-rule reads that are not a whole table's read-back: the rule handles of every chain
//! (what a trace event is matched against) and the packets and bytes a rule's `counter`
//! statements have counted, found by the rule's comment; plus the summing of `counter`
//! expressions the per-rule metrics share.

use super::attrs::Attrs;
use super::socket::{DumpSocket, NFT_MSG_GETRULE, cstr};
use crate::nft::engine::NftError;
use crate::nft::ir::Family;
use std::collections::BTreeMap;

/// The rule handles of every chain of `table <family> <table>`, in the chain's order: what
/// a trace event's rule handle is looked up in (`nft::trace`). One rule dump.
pub fn rule_handles(family: Family, table: &str) -> Result<BTreeMap<String, Vec<u64>>, NftError> {
    let sock = DumpSocket::open(family)?;
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    sock.dump(NFT_MSG_GETRULE, &[(1u16, cstr(table))], |a| {
        if a.get(1).map(|x| x.string()).as_deref() != Some(table) {
            return;
        }
        if let (Some(chain), Some(handle)) = (a.get(2), a.get(3).and_then(|h| h.be64())) {
            out.entry(chain.string()).or_default().push(handle);
        }
    })?;
    Ok(out)
}

/// The packets and bytes a rule's `counter` statements have counted, found by the rule's
/// comment: what the kernel counts, which a read-back leaves out (see [`super::exprs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    pub packets: u64,
    pub bytes: u64,
}

/// The counts of the rules of `table <family> <table> chain <chain>` whose comment is
/// `comment` (summed over their `counter` statements); `Ok(None)` if the kernel has no such
/// rule. One rule dump of one chain, so polling it costs what the chain holds, not the table.
pub fn rule_counts(
    family: Family,
    table: &str,
    chain: &str,
    comment: &str,
) -> Result<Option<Counted>, NftError> {
    let sock = DumpSocket::open(family)?;
    let want = super::super::udata::rule_comment(comment);
    let attrs = [(1u16, cstr(table)), (2u16, cstr(chain))];
    let mut found: Option<Counted> = None;
    sock.dump(NFT_MSG_GETRULE, &attrs, |a| {
        let ours = a.get(1).map(|x| x.string()).as_deref() == Some(table)
            && a.get(2).map(|x| x.string()).as_deref() == Some(chain)
            && a.get(7).is_some_and(|u| u.data == want.as_slice());
        if !ours {
            return;
        }
        let total = found.get_or_insert_with(Counted::default);
        if let Some(c) = a.get(4).and_then(|l| counted_in(l.nested())) {
            total.add(c);
        }
    })?;
    Ok(found)
}

impl Counted {
    pub fn add(&mut self, other: Counted) {
        self.packets += other.packets;
        self.bytes += other.bytes;
    }
}

/// The sum of the `counter` expressions of an expression list (a rule's
/// `NFTA_RULE_EXPRESSIONS`, an element's `NFTA_SET_ELEM_EXPRESSIONS`); `None` if it has none.
pub(in crate::nft::nftnl) fn counted_in(list: Attrs) -> Option<Counted> {
    let mut total = None;
    for e in list {
        if let Some(c) = counter_value(e.nested()) {
            total.get_or_insert_with(Counted::default).add(c);
        }
    }
    total
}

/// The packets and bytes of one expression if it is a `counter`.
pub(in crate::nft::nftnl) fn counter_value(e: Attrs) -> Option<Counted> {
    if e.get(1).map(|n| n.string()).as_deref() != Some("counter") {
        return None;
    }
    let d = e.get(2).map(|d| d.nested()).unwrap_or(Attrs(&[]));
    // NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS.
    Some(Counted {
        bytes: d.get(1).and_then(|b| b.be64()).unwrap_or(0),
        packets: d.get(2).and_then(|p| p.be64()).unwrap_or(0),
    })
}
