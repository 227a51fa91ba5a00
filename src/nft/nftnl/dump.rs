//! Reading a table back: netlink dumps of its chains, rules, sets and elements, parsed into
//! the same typed kernel-level values the lowering produces ([`Expr`], element specs), so
//! what the kernel holds and what the agent would send can be compared value for value.
//!
//! Safe Rust only: requests are a header plus one or two attributes, replies are walked as
//! netlink attributes. A dump the kernel marks as interrupted (the ruleset changed while it
//! ran, `NLM_F_DUMP_INTR`) is read again.

mod attrs;
mod exprs;
mod rules;
mod socket;
mod table;

pub use attrs::Attrs;
pub use rules::{Counted, rule_counts, rule_handles};
pub(super) use rules::{counted_in, counter_value};
pub(super) use socket::{
    DumpSocket, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFT_MSG_GETTABLE, cstr,
};
pub use table::{KElem, KRule, KSet, KernelTable, parse_elements};

use crate::nft::engine::NftError;
use crate::nft::ir::Family;
use exprs::parse_exprs;
use socket::NFT_MSG_GETCHAIN;
use table::{parse_chain, parse_set_decl};

/// Reads `table <family> <name>`; `Ok(None)` if the kernel has no such table.
pub fn read_table(family: Family, name: &str) -> Result<Option<KernelTable>, NftError> {
    // The ruleset may change under a dump; the kernel flags that and we read again.
    for _ in 0..8 {
        match read_once(family, name)? {
            Read::Done(t) => return Ok(t),
            Read::Interrupted => continue,
        }
    }
    Err(NftError::Netlink(std::io::Error::other(format!(
        "table {} {name} kept changing while it was read back",
        family.keyword()
    ))))
}

enum Read {
    Done(Option<KernelTable>),
    Interrupted,
}

fn read_once(family: Family, name: &str) -> Result<Read, NftError> {
    let sock = DumpSocket::open(family)?;
    let mut found = None;
    let mut intr = sock.dump(NFT_MSG_GETTABLE, &[], |a| {
        if a.get(1).is_some_and(|n| n.string() == name) {
            found = Some(a.be32(2).unwrap_or(0));
        }
    })?;
    let Some(flags) = found else {
        return Ok(if intr {
            Read::Interrupted
        } else {
            Read::Done(None)
        });
    };
    let table_attr = [(1u16, cstr(name))];
    let mut t = KernelTable {
        flags,
        ..Default::default()
    };
    intr |= sock.dump(NFT_MSG_GETCHAIN, &table_attr, |a| {
        if a.get(1).map(|x| x.string()).as_deref() != Some(name) {
            return;
        }
        let Some(chain) = a.get(3).map(|x| x.string()) else {
            return;
        };
        t.chains.insert(chain, parse_chain(a));
    })?;
    intr |= sock.dump(NFT_MSG_GETRULE, &table_attr, |a| {
        if a.get(1).map(|x| x.string()).as_deref() != Some(name) {
            return;
        }
        let Some(chain) = a.get(2).map(|x| x.string()) else {
            return;
        };
        let rule = KRule {
            exprs: a.get(4).and_then(|e| parse_exprs(e.nested())),
            udata: a.get(7).map(|u| u.data.to_vec()),
        };
        if let Some(c) = t.chains.get_mut(&chain) {
            c.rules.push(rule);
        }
    })?;
    let mut names = Vec::new();
    intr |= sock.dump(NFT_MSG_GETSET, &table_attr, |a| {
        if a.get(1).map(|x| x.string()).as_deref() != Some(name) {
            return;
        }
        if let Some(set) = a.get(2).map(|x| x.string()) {
            names.push(set.clone());
            t.sets.insert(
                set,
                KSet {
                    decl: parse_set_decl(a),
                    elem_bytes: Vec::new(),
                },
            );
        }
    })?;
    // A dynamic set is filled by the packet path or the DNS proxy, never judged element by
    // element (see `readback`): its elements are not read, so a node with a million learned
    // addresses reads its table back as fast as one with none.
    names.retain(|set| {
        t.sets
            .get(set)
            .is_some_and(|s| s.decl.flags & super::set::NFT_SET_EVAL == 0)
    });
    for (set, elems, interrupted) in read_sets(family, name, &names)? {
        intr |= interrupted;
        if let Some(s) = t.sets.get_mut(set) {
            s.elem_bytes = elems;
        }
    }
    Ok(if intr {
        Read::Interrupted
    } else {
        Read::Done(Some(t))
    })
}

/// Most of a large table's read-back is its sets' elements, and most of that the kernel's
/// walk of each set in the reading thread's own syscalls: sets are read by up to this many
/// threads, each with its own socket (measured at 50,000 services: see docs/performance.md).
const SET_READERS: usize = 4;

/// A set's name, its element nests ([`KSet::elem_bytes`]), and whether the read is to be
/// taken as interrupted.
type SetRead<'a> = (&'a str, Vec<u8>, bool);

/// The elements of `sets`, each with whether its read is to be taken as interrupted, read
/// in parallel by up to [`SET_READERS`] threads that take the next unread set in turn.
fn read_sets<'a>(
    family: Family,
    table: &str,
    sets: &'a [String],
) -> Result<Vec<SetRead<'a>>, NftError> {
    let readers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, SET_READERS)
        .min(sets.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let read = || -> Result<Vec<SetRead<'a>>, NftError> {
        let sock = DumpSocket::open(family)?;
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(set) = sets.get(i) else {
                return Ok(out);
            };
            let (elems, intr) = read_elements(&sock, table, set)?;
            out.push((set.as_str(), elems, intr));
        }
    };
    if readers <= 1 {
        return read();
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..readers).map(|_| scope.spawn(read)).collect();
        let mut all = Vec::with_capacity(sets.len());
        for w in workers {
            all.extend(w.join().expect("a set reader panicked")?);
        }
        Ok(all)
    })
}

/// Waits before a set's elements are read again after a dump that returned one twice: the
/// kernel's resize of a large hash table takes a few milliseconds to a few hundred.
const REPEAT_WAITS_MS: [u64; 7] = [2, 5, 10, 20, 50, 100, 250];

/// The element nests of one set ([`KSet::elem_bytes`]), and whether the read is to be
/// taken as interrupted.
///
/// A hash set's element dump walks the hash table afresh for every reply message and skips
/// as many elements as earlier messages returned. While the kernel still resizes the table
/// after a bulk insert or delete (a deferred worker), the walk order changes between
/// messages: the dump returns some elements twice and as many not at all, and does not flag
/// itself as interrupted. Measured on kernel 6.18: 200,000 `ipv4_addr` elements loaded with
/// `nft -f` and listed at once came back as 200,000 entries of which 178,629 to 198,000
/// distinct (15 of 16 loads); listed 50 ms later, all distinct. An element missed that way
/// and no longer wanted would never be deleted, so a dump with a repeated element is read
/// again.
fn read_elements(sock: &DumpSocket, table: &str, set: &str) -> Result<(Vec<u8>, bool), NftError> {
    let attrs = [(1u16, cstr(table)), (2u16, cstr(set))];
    let mut waits = REPEAT_WAITS_MS.iter();
    loop {
        let mut elems = Vec::new();
        let intr = sock.dump(NFT_MSG_GETSETELEM, &attrs, |a| {
            if let Some(list) = a.get(3) {
                elems.extend_from_slice(list.data);
            }
        })?;
        if intr || !has_repeats(&elems) {
            return Ok((elems, intr));
        }
        tracing::debug!(
            "set {set}: its element dump repeated an element (a hash resize); reading again"
        );
        match waits.next() {
            Some(ms) => std::thread::sleep(std::time::Duration::from_millis(*ms)),
            None => return Ok((elems, true)),
        }
    }
}

/// Whether an element (key, range end and flags) appears twice in `elem_bytes`.
fn has_repeats(elem_bytes: &[u8]) -> bool {
    let mut seen = std::collections::HashSet::with_hasher(foldhash::fast::RandomState::default());
    !parse_elements(elem_bytes).all(|e| seen.insert((e.key, e.key_end, e.flags)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The socket's inode: unlike its descriptor number, never that of a closed socket.
    fn inode(s: &DumpSocket) -> u64 {
        nix::sys::stat::fstat(s.fd.as_ref().unwrap())
            .unwrap()
            .st_ino
    }

    #[test]
    fn a_dump_socket_is_kept_after_a_complete_dump_and_closed_after_an_unfinished_one() {
        let first = DumpSocket::open(Family::Inet).unwrap();
        let kept = inode(&first);
        drop(first);
        let again = DumpSocket::open(Family::Inet).unwrap();
        assert_eq!(inode(&again), kept, "kept and reused");
        // As `dump` leaves it when a read fails half-way.
        again.clean.set(false);
        drop(again);
        let fresh = DumpSocket::open(Family::Inet).unwrap();
        assert_ne!(
            inode(&fresh),
            kept,
            "a half-read socket is closed, not handed on"
        );
    }
}
