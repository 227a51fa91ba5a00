//! Typed nftables IR: the one description of the ruleset that is both rendered as text
//! (`--dry-run`) and encoded as netlink (the kernel apply). There is no second code path.
//!
//! The IR sits at the level of nft statements (`ip saddr @set`, `dnat ip to ...`), not of
//! bytecode, so that the renderer can print exactly what `nft -f` compiles to the same
//! bytecode the netlink backend emits. Every value is typed; user data never becomes syntax.

use ipnet::IpNet;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    /// The nft keyword (`hook prerouting`).
    pub fn keyword(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    Accept,
    Drop,
}

/// Well-known priorities (see nft(8) "CHAINS"), kept numeric in the IR.
pub mod priority {
    pub const RAW: i32 = -300;
    pub const MANGLE: i32 = -150;
    pub const DSTNAT: i32 = -100;
    pub const FILTER: i32 = 0;
    pub const SECURITY: i32 = 50;
    pub const SRCNAT: i32 = 100;
}

/// Hook attachment of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    /// `None` for a regular chain reached by jump/goto/vmap.
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Self {
        Chain {
            name: name.into(),
            base: None,
            rules: Vec::new(),
        }
    }

    pub fn base(name: impl Into<String>, base: BaseChain) -> Self {
        Chain {
            name: name.into(),
            base: Some(base),
            rules: Vec::new(),
        }
    }

    pub fn push(&mut self, rule: Rule) -> &mut Self {
        self.rules.push(rule);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    /// Shown by `nft list`; tells an operator which object a rule came from.
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(stmts: Vec<Stmt>) -> Self {
        Rule {
            stmts,
            comment: None,
        }
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
}

/// A packet field that can be loaded and matched, or used as (part of) a lookup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `meta nfproto` (ipv4 / ipv6).
    NfProto,
    /// `meta l4proto`.
    L4Proto,
    /// `meta protocol`: the frame's ethertype (IPv4, IPv6), in the inet and bridge families.
    EtherType,
    Ip4Saddr,
    Ip4Daddr,
    Ip6Saddr,
    Ip6Daddr,
    /// `th sport` (transport header, any L4 protocol with ports).
    ThSport,
    /// `th dport`.
    ThDport,
    /// `meta mark`.
    Mark,
    /// `meta iifname`.
    IifName,
    /// `meta oifname`.
    OifName,
    /// `tcp flags` (match with [`MatchOp::Masked`] and [`Value::TcpFlags`], after
    /// `meta l4proto tcp`).
    TcpFlags,
    /// `ip frag-off`: the IPv4 header's flags and fragment offset, 16 bits big-endian (match
    /// with [`MatchOp::Masked`] and [`Value::Port`] as the 16-bit value: `& 0x1fff != 0` is a
    /// non-first fragment, `& 0x3fff == 0x2000` a first fragment).
    Ip4FragOff,
    /// `frag frag-off`: the 13-bit fragment offset of an IPv6 fragment header (an extension
    /// header, found by walking the header chain); only compared with `==` / `!=` a value
    /// (`!= 0` is a non-first fragment, `0` a first one). A packet without a fragment header
    /// matches neither.
    Ip6FragOff,
    /// `ct state` (a bit mask: match with [`MatchOp::AnyFlag`]).
    CtState,
    /// `ct mark`.
    CtMark,
    /// `ct direction` (match with a [`Value::CtDir`]): `original` for packets going the way
    /// the connection's first packet went, `reply` for its answers.
    CtDirection,
    /// `fib daddr type` (match with an [`Value::AddrType`]).
    FibDaddrType,
    /// `fib saddr type`: `local` for packets the node itself sends.
    FibSaddrType,
    /// `fib saddr . iif oif` as a presence test (match with [`Value::Exists`]): whether the
    /// route back to the source leaves through the interface the packet came in on (a
    /// strict reverse-path check, whatever the `rp_filter` sysctl says).
    FibSaddrIifOif,
    /// `numgen random mod N`: a random number in 0..N, for load balancing.
    NumgenRandom(u32),
    /// `ip daddr & 0.0.0.15`: the destination address with all but its last four bits
    /// cleared, a key on its own (never in a concatenation): which of 16 shards a
    /// destination's map elements live in ([`low_nibble`]).
    Ip4DaddrLowNibble,
    /// `ip6 daddr & ::f`: the same for IPv6.
    Ip6DaddrLowNibble,
}

/// The address with all but its last four bits cleared: what [`Field::Ip4DaddrLowNibble`]
/// and [`Field::Ip6DaddrLowNibble`] load.
pub fn low_nibble(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(a.to_bits() & 0xf)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(a.to_bits() & 0xf)),
    }
}

impl Field {
    /// The nft datatype of the field's values.
    pub fn data_type(self) -> DataType {
        match self {
            Field::NfProto => DataType::NfProto,
            Field::L4Proto => DataType::InetProto,
            Field::EtherType => DataType::EtherType,
            Field::Ip4Saddr | Field::Ip4Daddr | Field::Ip4DaddrLowNibble => DataType::Ipv4Addr,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Ip6DaddrLowNibble => DataType::Ipv6Addr,
            Field::ThSport | Field::ThDport | Field::Ip4FragOff | Field::Ip6FragOff => {
                DataType::InetService
            }
            Field::Mark | Field::CtMark => DataType::Mark,
            Field::IifName | Field::OifName => DataType::IfName,
            Field::CtState => DataType::CtState,
            Field::CtDirection => DataType::CtDir,
            Field::FibDaddrType | Field::FibSaddrType => DataType::AddrType,
            Field::FibSaddrIifOif => DataType::Boolean,
            Field::TcpFlags => DataType::TcpFlag,
            Field::NumgenRandom(_) => DataType::Integer,
        }
    }

    /// `ip daddr` or `ip6 daddr`.
    pub fn daddr(family: IpFamily) -> Field {
        match family {
            IpFamily::V4 => Field::Ip4Daddr,
            IpFamily::V6 => Field::Ip6Daddr,
        }
    }

    /// `ip saddr` or `ip6 saddr`.
    pub fn saddr(family: IpFamily) -> Field {
        match family {
            IpFamily::V4 => Field::Ip4Saddr,
            IpFamily::V6 => Field::Ip6Saddr,
        }
    }

    /// The address family a field implies, if any (nft adds `meta nfproto` for it).
    pub fn family(self) -> Option<IpFamily> {
        match self {
            Field::Ip4Saddr | Field::Ip4Daddr | Field::Ip4FragOff | Field::Ip4DaddrLowNibble => {
                Some(IpFamily::V4)
            }
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Ip6FragOff | Field::Ip6DaddrLowNibble => {
                Some(IpFamily::V6)
            }
            _ => None,
        }
    }
}

/// nft datatypes used in set/map declarations and as field types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Mark,
    IfName,
    NfProto,
    /// `ether_type`.
    EtherType,
    CtState,
    /// `ct_dir`: a conntrack direction.
    CtDir,
    AddrType,
    /// `exists` / `missing`.
    Boolean,
    /// `tcp_flag`: a TCP header's flags byte.
    TcpFlag,
    Integer,
    Verdict,
}

impl DataType {
    /// `ipv4_addr` or `ipv6_addr`.
    pub fn addr(family: IpFamily) -> DataType {
        match family {
            IpFamily::V4 => DataType::Ipv4Addr,
            IpFamily::V6 => DataType::Ipv6Addr,
        }
    }
}

/// A typed scalar. Ordering is total so values can key sorted maps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    /// IP protocol number (6 = tcp, 17 = udp, 132 = sctp, 1 = icmp, 58 = icmpv6).
    Proto(u8),
    Port(u16),
    Mark(u32),
    IfName(String),
    NfProto(IpFamily),
    /// Address type for `fib daddr type` (only `local` is used).
    AddrType(AddrType),
    /// A conntrack direction (`ct direction original`).
    CtDir(CtDir),
    /// A plain 32-bit integer (numgen results).
    Integer(u32),
    /// `exists` (true) / `missing` (false), for presence tests.
    Exists(bool),
    /// TCP flags (bits of [`tcp_flags`]).
    TcpFlags(u8),
}

impl Value {
    pub fn ip(addr: IpAddr) -> Value {
        match addr {
            IpAddr::V4(a) => Value::Ipv4(a),
            IpAddr::V6(a) => Value::Ipv6(a),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrType {
    Local,
}

/// Conntrack directions (kernel `IP_CT_DIR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CtDir {
    Original,
    Reply,
}

/// IP protocol numbers (`meta l4proto`).
pub mod proto {
    pub const ICMP: u8 = libc::IPPROTO_ICMP as u8;
    pub const TCP: u8 = libc::IPPROTO_TCP as u8;
    pub const UDP: u8 = libc::IPPROTO_UDP as u8;
    pub const ICMPV6: u8 = libc::IPPROTO_ICMPV6 as u8;
    pub const SCTP: u8 = libc::IPPROTO_SCTP as u8;
}

/// TCP header flag bits.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECN: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// `ct state` bits (kernel NF_CT_STATE_*).
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}

/// One component of a set element key: a single value, or (interval sets only) a prefix or
/// an inclusive range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    Value(Value),
    Prefix(IpNet),
    Range(Value, Value),
}

impl From<Value> for KeyPart {
    fn from(v: Value) -> Self {
        KeyPart::Value(v)
    }
}

/// A set element key; more than one part for concatenated keys (`a . b . c`).
pub type ElemKey = Vec<KeyPart>;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
}

impl Verdict {
    /// The chain this verdict transfers control to, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

/// What a map element maps to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElemData {
    Verdict(Verdict),
    /// A (possibly concatenated) data value for a data map.
    Values(Vec<Value>),
}

#[derive(Debug, Clone, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub struct ElemValue {
    /// `None` for plain sets; required for maps.
    pub data: Option<ElemData>,
    /// Per-element timeout in seconds (sets with the timeout flag).
    pub timeout: Option<u32>,
    /// Shown by `nft list` next to the element (and its counter, in a `counter` set): says
    /// which object the element came from. Shared (`Arc`) because one rule's comment is
    /// on every element compiled from it.
    pub comment: Option<Arc<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    Set,
    /// A data map `key : data`.
    Map(Vec<DataType>),
    /// A verdict map `key : verdict`.
    VerdictMap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub struct SetFlags {
    /// Elements may be prefixes and ranges.
    pub interval: bool,
    /// Elements may expire (`flags timeout`).
    pub timeout: bool,
    /// Rules may add elements from the packet path (`update @set { ... }`).
    pub dynamic: bool,
    /// `counter` in the declaration: every element carries its own packet/byte counter,
    /// listed by `nft list set|map` (a set expression, not a kernel set flag).
    pub counter: bool,
}

/// A named set or map. Elements live here so that an update is an element diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    pub key: Vec<DataType>,
    pub kind: SetKind,
    pub flags: SetFlags,
    /// Default element timeout in seconds.
    pub timeout: Option<u32>,
    /// `size N`: the most elements the set holds (a dynamic set the packet path fills
    /// adds nothing once full).
    pub size: Option<u32>,
    /// Declared with `typeof` expressions rather than datatypes (`key` and `kind` still
    /// hold the datatypes): needed where a key part, like numgen, has no sized datatype.
    pub typeof_decl: Option<TypeofDecl>,
    pub elements: BTreeMap<ElemKey, ElemValue>,
}

/// `typeof KEY : DATA` of a set or data map (empty `data` for a plain set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeofDecl {
    pub key: Vec<Field>,
    pub data: Vec<Field>,
}

impl Set {
    /// The declaration without elements (cheap for large sets).
    pub fn clone_declaration(&self) -> Set {
        Set {
            name: self.name.clone(),
            key: self.key.clone(),
            kind: self.kind.clone(),
            flags: self.flags,
            timeout: self.timeout,
            size: self.size,
            typeof_decl: self.typeof_decl.clone(),
            elements: BTreeMap::new(),
        }
    }
}

impl Set {
    pub fn new(name: impl Into<String>, key: Vec<DataType>, kind: SetKind) -> Self {
        Set {
            name: name.into(),
            key,
            kind,
            flags: SetFlags::default(),
            timeout: None,
            size: None,
            typeof_decl: None,
            elements: BTreeMap::new(),
        }
    }

    /// A data map declared as `typeof KEY : DATA` (e.g. a key ending in `numgen random mod
    /// 1`, whose elements are keyed by the bucket number).
    pub fn typeof_map(name: impl Into<String>, key: Vec<Field>, data: Vec<Field>) -> Self {
        let types = |fields: &[Field]| fields.iter().map(|f| f.data_type()).collect();
        let mut set = Set::new(name, types(&key), SetKind::Map(types(&data)));
        set.typeof_decl = Some(TypeofDecl { key, data });
        set
    }

    pub fn with_flags(mut self, flags: SetFlags) -> Self {
        self.flags = flags;
        self
    }

    pub fn with_timeout(mut self, secs: u32) -> Self {
        self.timeout = Some(secs);
        self
    }

    pub fn with_size(mut self, size: u32) -> Self {
        self.size = Some(size);
        self
    }

    /// Same declaration (everything but the elements): an element-only change keeps the set.
    pub fn same_declaration(&self, other: &Set) -> bool {
        self.name == other.name
            && self.key == other.key
            && self.kind == other.kind
            && self.flags == other.flags
            && self.timeout == other.timeout
            && self.size == other.size
            && self.typeof_decl == other.typeof_decl
    }

    pub fn insert(&mut self, key: ElemKey) {
        self.elements.insert(key, ElemValue::default());
    }

    pub fn insert_mapping(&mut self, key: ElemKey, data: ElemData) {
        self.elements.insert(
            key,
            ElemValue {
                data: Some(data),
                ..Default::default()
            },
        );
    }

    /// `key comment "..." : data`.
    pub fn insert_commented_mapping(&mut self, key: ElemKey, data: ElemData, comment: Arc<str>) {
        self.elements.insert(
            key,
            ElemValue {
                data: Some(data),
                timeout: None,
                comment: Some(comment),
            },
        );
    }
}

/// Right-hand side of a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchOp {
    /// `key == value` (one value per key field).
    Eq(Vec<Value>),
    /// `key != value`.
    Ne(Vec<Value>),
    /// `key @set`.
    InSet(String),
    /// `key != @set`.
    NotInSet(String),
    /// `key { a, b, c }`: an anonymous constant set.
    InAnon(Vec<ElemKey>),
    /// `ct state established,related`: any of the bits is set (`meta mark & BITS != 0` for
    /// other fields).
    AnyFlag(u32),
    /// `key & mask == value` (`eq`) or `!= value`: a bitmask test of one field.
    Masked { mask: Value, value: Value, eq: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// One field, or several for a concatenation.
    pub key: Vec<Field>,
    pub op: MatchOp,
}

/// Where a verdict map lookup goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapRef {
    Named(String),
    /// An anonymous constant verdict map (e.g. `numgen random mod 3 vmap { 0 : goto a, ... }`).
    Anon(Vec<(ElemKey, Verdict)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    Snat,
    Dnat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatAddr {
    /// A fixed address, optionally with a port (a port needs an L4 protocol match first).
    Fixed(IpAddr, Option<u16>),
    /// The address looked up in a data map: `snat ip to ip saddr map @m`.
    Map { key: Vec<Field>, map: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nat {
    pub kind: NatKind,
    pub family: IpFamily,
    pub addr: NatAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// `reject`: ICMP(v6) port unreachable.
    PortUnreachable,
    /// `reject with tcp reset` (needs a `meta l4proto tcp` match first).
    TcpReset,
    /// `reject with icmpx admin-prohibited`.
    AdminProhibited,
}

/// One nft statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    Match(Match),
    Counter,
    /// `log prefix "..." [group N]`: to the kernel log, or with a group to NFLOG (where a
    /// netlink listener bound to the group reads the packet and the prefix).
    Log {
        prefix: String,
        group: Option<u16>,
    },
    /// `key vmap @map` or `key vmap { ... }`.
    Vmap {
        key: Vec<Field>,
        map: MapRef,
    },
    Nat(Nat),
    /// `masquerade`, with `fully-random` port allocation when asked (kube-proxy's choice:
    /// random source ports avoid the conntrack insert races that drop UDP under load).
    Masquerade {
        fully_random: bool,
    },
    /// `ip dscp set N` / `ip6 dscp set N` (ECN bits kept).
    DscpSet {
        family: IpFamily,
        dscp: u8,
    },
    /// `meta mark set N`.
    MarkSet(u32),
    /// `tproxy ip to :PORT` (prerouting only): hands the packet to the transparent socket
    /// at the port if one exists; without one the rule does not match (the kernel's
    /// `NFT_BREAK`), so traffic goes on unchanged while nobody listens.
    Tproxy {
        family: IpFamily,
        port: u16,
    },
    /// `meta mark set meta mark or BITS`: sets bits, keeps the others.
    MarkOr(u32),
    /// `meta mark set meta mark and MASK`: clears the bits not in MASK.
    MarkAnd(u32),
    /// `update @set { key }`: add or refresh a dynamic set element from the packet;
    /// `update @set { key timeout Ns }` with a timeout of its own (seconds) instead of the
    /// set's.
    SetUpdate {
        set: String,
        key: Vec<Field>,
        timeout: Option<u32>,
    },
    Reject(Reject),
    /// `update @set { key limit rate over N/second burst B packets }`: a token bucket per
    /// key in a dynamic set (nft's meter). Matches (the rule goes on) when the key's
    /// packets are over the rate; a key the full set cannot take does not match.
    SetLimit {
        set: String,
        key: Vec<Field>,
        limit: Limit,
    },
    Verdict(Verdict),
    /// `meta nftrace set 1`: from here on the kernel reports every rule the packet meets, in
    /// every table and hook, to the trace netlink group (`agent explain --trace`).
    Trace,
}

/// A packet rate: `limit rate over PER_SECOND/second burst BURST packets` (`over` only: the
/// statement matches the packets beyond the rate). `burst` is the bucket's depth in
/// packets, what a key may send at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub per_second: u32,
    pub burst: u32,
}

impl Stmt {
    pub fn matches(field: Field, value: Value) -> Stmt {
        Stmt::Match(Match {
            key: vec![field],
            op: MatchOp::Eq(vec![value]),
        })
    }

    pub fn not_matches(field: Field, value: Value) -> Stmt {
        Stmt::Match(Match {
            key: vec![field],
            op: MatchOp::Ne(vec![value]),
        })
    }

    pub fn in_set(key: Vec<Field>, set: impl Into<String>) -> Stmt {
        Stmt::Match(Match {
            key,
            op: MatchOp::InSet(set.into()),
        })
    }

    pub fn not_in_set(key: Vec<Field>, set: impl Into<String>) -> Stmt {
        Stmt::Match(Match {
            key,
            op: MatchOp::NotInSet(set.into()),
        })
    }

    pub fn vmap(key: Vec<Field>, map: impl Into<String>) -> Stmt {
        Stmt::Vmap {
            key,
            map: MapRef::Named(map.into()),
        }
    }

    /// Names of the sets and maps this statement refers to.
    pub fn set_refs(&self) -> Vec<&str> {
        match self {
            Stmt::Match(Match {
                op: MatchOp::InSet(s) | MatchOp::NotInSet(s),
                ..
            }) => vec![s.as_str()],
            Stmt::Vmap {
                map: MapRef::Named(m),
                ..
            } => vec![m.as_str()],
            Stmt::Nat(Nat {
                addr: NatAddr::Map { map, .. },
                ..
            }) => vec![map.as_str()],
            Stmt::SetUpdate { set, .. } | Stmt::SetLimit { set, .. } => vec![set.as_str()],
            _ => Vec::new(),
        }
    }

    /// Names of the chains this statement can transfer control to.
    pub fn chain_refs(&self) -> Vec<&str> {
        match self {
            Stmt::Verdict(v) => v.target().into_iter().collect(),
            Stmt::Vmap {
                map: MapRef::Anon(entries),
                ..
            } => entries.iter().filter_map(|(_, v)| v.target()).collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod part_elements_tests {
    use super::*;

    fn key(n: u16) -> ElemKey {
        vec![Value::Port(n).into()]
    }

    #[test]
    fn part_elements_stay_sorted_and_unique_whatever_the_insert_order() {
        let mut e = PartElements::default();
        for n in [5, 1, 9, 3, 9] {
            e.insert(key(n), ElemValue::default());
        }
        let data = ElemValue {
            data: Some(ElemData::Verdict(Verdict::Accept)),
            ..Default::default()
        };
        e.insert(key(3), data.clone());
        let keys: Vec<_> = e.keys().cloned().collect();
        assert_eq!(keys, [key(1), key(3), key(5), key(9)]);
        assert_eq!(e.get(&key(3)), Some(&data));
        assert!(!e.contains_key(&key(4)));
        e.retain(|k, _| *k != key(5));
        assert_eq!(e.len(), 3);
        assert_eq!(e.iter().count(), 3);
    }
}
