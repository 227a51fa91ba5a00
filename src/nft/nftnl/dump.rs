//! Reading a table back: netlink dumps of its chains, rules, sets and elements, parsed into
//! the same typed kernel-level values the lowering produces ([`Expr`], element specs), so
//! what the kernel holds and what the agent would send can be compared value for value.
//!
//! Safe Rust only: requests are a header plus one or two attributes, replies are walked as
//! netlink attributes. A dump the kernel marks as interrupted (the ruleset changed while it
//! ran, `NLM_F_DUMP_INTR`) is read again.

use super::expr::Expr;
use super::reply::{
    NFNL_HDRLEN, NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, error_code,
};
use crate::nft::engine::NftError;
use crate::nft::ir::Family;
use nix::sys::socket::{MsgFlags, recv, send, setsockopt, sockopt};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

uapi!(u16: NFT_MSG_GETCHAIN, NLM_F_DUMP, NLM_F_DUMP_INTR);
uapi!(pub(super) u16: NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFT_MSG_GETTABLE);

/// One netlink attribute: type (flags masked off) and payload.
#[derive(Clone, Copy)]
pub struct Attr<'a> {
    pub kind: u16,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn be32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.data.get(..4)?.try_into().ok()?))
    }

    pub fn be64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.data.get(..8)?.try_into().ok()?))
    }

    /// A NUL-terminated string attribute.
    pub fn string(&self) -> String {
        String::from_utf8_lossy(self.str_bytes()).into_owned()
    }

    /// A NUL-terminated string attribute's bytes, without the NUL.
    pub fn str_bytes(&self) -> &'a [u8] {
        let end = self
            .data
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.data.len());
        &self.data[..end]
    }

    pub fn nested(&self) -> Attrs<'a> {
        Attrs(self.data)
    }
}

/// The attributes of a payload, in order.
#[derive(Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Attrs<'a> {
    pub fn get(&self, kind: u16) -> Option<Attr<'a>> {
        self.into_iter().find(|a| a.kind == kind)
    }

    pub fn be32(&self, kind: u16) -> Option<u32> {
        self.get(kind)?.be32()
    }
}

/// The attributes of a payload in order. A named type, not a boxed iterator: a read-back
/// walks several attribute lists per element, hundreds of thousands of elements at a large
/// node's restart, and a box per walk was a malloc and a free each.
pub struct AttrIter<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let (kind, data, next) = super::reply::attr_at(self.buf, self.at)?;
        self.at = next;
        Some(Attr { kind, data })
    }
}

impl<'a> IntoIterator for Attrs<'a> {
    type Item = Attr<'a>;
    type IntoIter = AttrIter<'a>;

    fn into_iter(self) -> AttrIter<'a> {
        AttrIter { buf: self.0, at: 0 }
    }
}

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
/// comment: what the kernel counts, which a read-back leaves out (see [`parse_expr`]).
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
    let want = super::udata::rule_comment(comment);
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
pub(super) fn counted_in(list: Attrs) -> Option<Counted> {
    let mut total = None;
    for e in list {
        if let Some(c) = counter_value(e.nested()) {
            total.get_or_insert_with(Counted::default).add(c);
        }
    }
    total
}

/// The packets and bytes of one expression if it is a `counter`.
pub(super) fn counter_value(e: Attrs) -> Option<Counted> {
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

pub(super) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn parse_chain(a: Attrs) -> KChain {
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

fn parse_set_decl(a: Attrs) -> KSetDecl {
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

/// A rule's expression list; `None` if any expression is one the agent never writes.
fn parse_exprs(list: Attrs) -> Option<Vec<Expr>> {
    list.into_iter()
        .map(|e| {
            let e = e.nested();
            let name = e.get(1)?.string();
            let d = e.get(2).map(|d| d.nested()).unwrap_or(Attrs(&[]));
            parse_expr(&name, d)
        })
        .collect()
}

fn value_of(a: Option<Attr>) -> Option<Vec<u8>> {
    Some(a?.nested().get(1)?.data.to_vec())
}

/// The inverse of `ffi::build_expr`, with the kernel's attribute numbers. Attributes the
/// kernel adds on its own (counter values, a zero lookup flag, the bitwise op) are
/// normalised away by [`Expr::canonical`].
fn parse_expr(name: &str, d: Attrs) -> Option<Expr> {
    match name {
        "meta" => parse_meta(&d),
        "payload" => parse_payload(&d),
        "ct" | "fib" | "numgen" | "exthdr" => parse_load(name, &d),
        "cmp" | "bitwise" | "byteorder" | "lookup" => parse_data_op(name, &d),
        "dynset" => parse_dynset(&d),
        "immediate" => parse_immediate(&d),
        "counter" => Some(Expr::Counter),
        "log" | "nat" | "masq" | "tproxy" | "reject" => parse_action(name, &d),
        _ => None,
    }
}

/// A meta load, or a meta write (`NFTA_META_SREG`).
fn parse_meta(d: &Attrs) -> Option<Expr> {
    Some(match d.be32(3) {
        Some(sreg) => Expr::MetaSet {
            key: d.be32(2)?,
            sreg,
        },
        None => Expr::Meta {
            key: d.be32(2)?,
            dreg: d.be32(1)?,
        },
    })
}

/// A load into a register from conntrack, a FIB lookup, a number generator or an IPv6
/// extension header.
fn parse_load(name: &str, d: &Attrs) -> Option<Expr> {
    Some(match name {
        "ct" if d.get(3).is_none() && d.get(4).is_none() => Expr::Ct {
            key: d.be32(2)?,
            dreg: d.be32(1)?,
        },
        "fib" => Expr::Fib {
            flags: d.be32(3)?,
            result: d.be32(2)?,
            dreg: d.be32(1)?,
        },
        "numgen"
            if d.be32(3) == Some(super::types::NFT_NG_RANDOM) && d.be32(4).unwrap_or(0) == 0 =>
        {
            Expr::Numgen {
                modulus: d.be32(2)?,
                dreg: d.be32(1)?,
            }
        }
        // NFTA_EXTHDR_*: an IPv6 header load (op 0), no flags, no write (sreg).
        "exthdr"
            if d.be32(6).unwrap_or(0) == 0 && d.be32(5).unwrap_or(0) == 0 && d.get(7).is_none() =>
        {
            Expr::Exthdr {
                kind: *d.get(2)?.data.first()?,
                offset: d.be32(3)?,
                len: d.be32(4)?,
                dreg: d.be32(1)?,
            }
        }
        _ => return None,
    })
}

/// A comparison, bit operation, byte-order conversion or set lookup on registers.
fn parse_data_op(name: &str, d: &Attrs) -> Option<Expr> {
    Some(match name {
        "cmp" => Expr::Cmp {
            sreg: d.be32(1)?,
            op: d.be32(2)?,
            data: value_of(d.get(3))?,
        },
        "bitwise" if d.be32(1) == d.be32(2) && d.be32(6).unwrap_or(0) == 0 => Expr::Bitwise {
            reg: d.be32(1)?,
            mask: value_of(d.get(4))?,
            xor: value_of(d.get(5))?,
            with_op: false,
        },
        "byteorder" if d.be32(1) == d.be32(2) && d.be32(3) == Some(1) && d.be32(4) == d.be32(5) => {
            Expr::Hton {
                reg: d.be32(1)?,
                len: d.be32(4)?,
            }
        }
        "lookup" => Expr::Lookup {
            set: d.get(1)?.string(),
            sreg: d.be32(2)?,
            dreg: d.be32(3),
            set_id: None,
            invert: d.be32(5).unwrap_or(0) & 1 != 0,
        },
        _ => return None,
    })
}

/// A set update from the packet path: with a per-element `limit`, or refreshing the
/// element's timeout.
fn parse_dynset(d: &Attrs) -> Option<Expr> {
    // NFTA_DYNSET_OP update (1), and no NFTA_DYNSET_SREG_DATA: not a map update.
    if d.be32(3) != Some(1) || d.get(5).is_some() {
        return None;
    }
    let Some(expr) = d.get(7) else {
        // NFTA_DYNSET_TIMEOUT (6): the element's own timeout in milliseconds, dumped always
        // (0: the set's).
        return Some(Expr::DynsetUpdate {
            set: d.get(1)?.string(),
            sreg: d.be32(4)?,
            set_id: None,
            timeout_ms: match d.get(6) {
                Some(t) => Some(t.be64()?).filter(|ms| *ms != 0),
                None => None,
            },
        });
    };
    // NFTA_DYNSET_EXPR: one `limit` per element (`update @s { key limit rate ... }`).
    let inner = expr.nested();
    if inner.get(1)?.string() != "limit" {
        return None;
    }
    let l = inner.get(2)?.nested();
    if l.be32(4) != Some(super::expr::NFT_LIMIT_PKTS) {
        return None;
    }
    Some(Expr::DynsetLimit {
        set: d.get(1)?.string(),
        sreg: d.be32(4)?,
        set_id: None,
        rate: l.get(1)?.be64()?,
        unit: l.get(2)?.be64()?,
        burst: l.be32(3).unwrap_or(0),
        flags: l.be32(5).unwrap_or(0),
    })
}

/// A statement that logs, translates addresses, hands the packet to a socket or rejects it.
fn parse_action(name: &str, d: &Attrs) -> Option<Expr> {
    Some(match name {
        // NFTA_LOG_GROUP (be16), NFTA_LOG_PREFIX.
        "log" => Expr::Log {
            prefix: d.get(2).map(|p| p.string()).unwrap_or_default(),
            group: d
                .get(1)
                .and_then(|g| Some(u16::from_be_bytes(g.data.get(..2)?.try_into().ok()?))),
        },
        "nat" => Expr::Nat {
            kind: d.be32(1)?,
            family: d.be32(2)?,
            reg_addr: d.be32(3)?,
            reg_proto: d.be32(5),
            flags: d.be32(7).unwrap_or(0),
        },
        // NFTA_MASQ_FLAGS; a masquerade to a port range (NFTA_MASQ_REG_PROTO_MIN) is not ours.
        "masq" if d.get(2).is_none() => Expr::Masq {
            flags: d.be32(1).unwrap_or(0),
        },
        // NFTA_TPROXY_FAMILY, NFTA_TPROXY_REG_PORT; a port-only tproxy has no address.
        "tproxy" if d.get(2).is_none() => Expr::Tproxy {
            family: d.be32(1)?,
            reg_port: d.be32(3)?,
        },
        "reject" => Expr::Reject {
            kind: d.be32(1)?,
            // No code is dumped for a TCP reset.
            code: d.get(2).and_then(|c| c.data.first().copied()).unwrap_or(0),
        },
        _ => return None,
    })
}

/// A payload load, or a payload write (`NFTA_PAYLOAD_SREG`) with its checksum update.
fn parse_payload(d: &Attrs) -> Option<Expr> {
    Some(match d.be32(5) {
        Some(sreg) => Expr::PayloadSet {
            base: d.be32(2)?,
            offset: d.be32(3)?,
            len: d.be32(4)?,
            sreg,
            csum: match d.be32(6).unwrap_or(0) {
                0 => None,
                kind => Some((kind, d.be32(7).unwrap_or(0))),
            },
        },
        None => Expr::Payload {
            base: d.be32(2)?,
            offset: d.be32(3)?,
            len: d.be32(4)?,
            dreg: d.be32(1)?,
        },
    })
}

/// An immediate: a verdict (to `NFT_REG_VERDICT`, maybe with a chain) or data to a register.
fn parse_immediate(d: &Attrs) -> Option<Expr> {
    let dreg = d.be32(1)?;
    let data = d.get(2)?.nested();
    if dreg == super::expr::NFT_REG_VERDICT {
        let v = data.get(2)?.nested();
        Some(Expr::Verdict {
            code: v.be32(1)? as i32,
            chain: v.get(2).map(|c| c.string()),
        })
    } else {
        Some(Expr::Immediate {
            dreg,
            data: data.get(1)?.data.to_vec(),
        })
    }
}

/// A NETLINK_NETFILTER socket for dumps (separate from the batch socket: a dump's replies
/// must not mix with a batch's acks). Kept open for the next reader after a complete dump
/// ([`super::kept`]: closing one stalls the node's commits).
pub(super) struct DumpSocket {
    fd: Option<OwnedFd>,
    seq: std::cell::Cell<u32>,
    /// Every request names it: the kernel dumps only that family's objects.
    family: Family,
    /// No dump left half-read: the socket may serve the next reader.
    clean: std::cell::Cell<bool>,
}

static DUMP_SOCKETS: super::kept::Kept<OwnedFd> = super::kept::Kept::new();

impl DumpSocket {
    pub(super) fn open(family: Family) -> Result<DumpSocket, NftError> {
        let fd = match DUMP_SOCKETS.take() {
            Some(fd) => fd,
            None => {
                let fd = super::socket::netfilter_socket(0)?;
                // Large dumps come in many datagrams; room for a burst of them.
                super::socket::set_buffer(&fd, super::socket::Buffer::Receive, 4 << 20)?;
                let timeout = nix::sys::time::TimeVal::new(10, 0);
                setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(std::io::Error::from)?;
                fd
            }
        };
        Ok(DumpSocket {
            fd: Some(fd),
            seq: std::cell::Cell::new(1),
            family,
            clean: std::cell::Cell::new(true),
        })
    }

    fn raw(&self) -> std::os::fd::RawFd {
        self.fd.as_ref().expect("open until dropped").as_raw_fd()
    }

    /// Sends one dump request and calls `each` with the attributes of every reply message.
    /// Returns whether the kernel flagged the dump as interrupted.
    pub(super) fn dump(
        &self,
        msg: u16,
        attrs: &[(u16, Vec<u8>)],
        mut each: impl FnMut(Attrs),
    ) -> Result<bool, NftError> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let mut req = Vec::with_capacity(64);
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req.extend_from_slice(&seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[self.family.nfproto(), 0, 0, 0]);
        for (kind, data) in attrs {
            req.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            req.extend_from_slice(&kind.to_ne_bytes());
            req.extend_from_slice(data);
            req.resize((req.len() + 3) & !3, 0);
        }
        let len = req.len() as u32;
        req[..4].copy_from_slice(&len.to_ne_bytes());
        self.clean.set(false);
        send(self.raw(), &req, MsgFlags::empty()).map_err(std::io::Error::from)?;
        let mut buf = vec![0u8; 1 << 18];
        let mut intr = false;
        loop {
            let n = recv(self.raw(), &mut buf, MsgFlags::empty()).map_err(std::io::Error::from)?;
            for (kind, flags, mseq, m) in super::reply::messages(&buf[..n]) {
                if mseq != seq {
                    continue;
                }
                intr |= flags & NLM_F_DUMP_INTR != 0;
                match kind {
                    NLMSG_DONE => {
                        self.clean.set(true);
                        return Ok(intr);
                    }
                    NLMSG_ERROR => {
                        // The error ends the dump: nothing of it is left to read.
                        self.clean.set(true);
                        let errno = error_code(m);
                        if errno == 0 {
                            return Ok(intr);
                        }
                        // No such table/set (it went away mid-read): an empty answer.
                        if -errno == libc::ENOENT {
                            return Ok(true);
                        }
                        return Err(NftError::Netlink(std::io::Error::from_raw_os_error(-errno)));
                    }
                    _ => each(Attrs(m.get(NFNL_HDRLEN..).unwrap_or(&[]))),
                }
            }
        }
    }
}

impl Drop for DumpSocket {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take()
            && self.clean.get()
        {
            DUMP_SOCKETS.give_back(fd);
        }
    }
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
