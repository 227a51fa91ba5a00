//! Set elements as nft 1.0.6 sends them: intervals (start/end elements, the leading 0,
//! open ends), concatenations (`KEY_END`), timeouts and map data, written straight into
//! `NFTA_SET_ELEM_LIST_ELEMENTS` buffers split where nft splits them. No allocation per
//! element: a 100k-element map is a few dozen 64 KiB buffers.

use super::reply::NLA_F_NESTED;
use super::set::{NFT_SET_ELEM_INTERVAL_END, verdict_code};
use super::types::{
    ByteOrder, Bytes, FieldInfo, IFNAMSIZ, encode_err, ifname_wildcard, round4, type_info,
    write_value,
};
use super::udata;
use crate::nft::engine::NftError;
use crate::nft::ir::{DataType, ElemData, ElemKey, ElemValue, KeyPart, SetKind, Value};
use ipnet::IpNet;

const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// The element list is one netlink attribute: its 16-bit length covers its header too.
pub const MAX_ELEM_LIST: usize = u16::MAX as usize - 4;

/// Map data of one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSpec<'a> {
    /// Verdict code (`NF_ACCEPT`, `NFT_JUMP` ...) and target chain.
    Verdict(i32, Option<&'a str>),
    Value(Bytes),
}

/// One element as sent in NEWSETELEM/DELSETELEM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElemSpec<'a> {
    pub key: Bytes,
    pub key_end: Option<Bytes>,
    pub flags: u32,
    pub timeout_ms: Option<u64>,
    pub data: Option<DataSpec<'a>>,
    /// The element's comment (userdata; on the start element of an interval).
    pub comment: Option<&'a str>,
    /// The interval runs to the top of the key space (userdata flag, no end element).
    pub open: bool,
    /// Index of the IR element this came from (`u32::MAX` for nft's leading 0 element).
    pub src: u32,
}

/// Netlink attributes appended to a buffer (`mnl_attr_put` semantics: zero padding).
struct Attrs<'a>(&'a mut Vec<u8>);

impl Attrs<'_> {
    fn put(&mut self, kind: u16, data: &[u8]) {
        self.0
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.0
            .resize(self.0.len() + round4(data.len()) - data.len(), 0);
    }

    /// An attribute whose payload `f` appends.
    fn put_with(&mut self, kind: u16, f: impl FnOnce(&mut Vec<u8>)) {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&kind.to_ne_bytes());
        f(self.0);
        let len = self.0.len() - start;
        self.0[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
        self.0.resize(start + round4(len), 0);
    }

    fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Attrs)) {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        f(self);
        let len = (self.0.len() - start) as u16;
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// One element nest, typed with its index truncated to 16 bits (C's `uint16_t`), with the
/// attributes in libnftnl's `nftnl_set_elem_nlmsg_build` order.
fn write_elem(out: &mut Vec<u8>, index: usize, e: &ElemSpec) {
    Attrs(out).nest(index as u16, |a| {
        if e.flags != 0 {
            a.put(NFTA_SET_ELEM_FLAGS, &e.flags.to_be_bytes());
        }
        if let Some(t) = e.timeout_ms {
            a.put(NFTA_SET_ELEM_TIMEOUT, &t.to_be_bytes());
        }
        a.nest(NFTA_SET_ELEM_KEY, |a| {
            a.put(NFTA_DATA_VALUE, e.key.as_slice())
        });
        if let Some(end) = &e.key_end {
            a.nest(NFTA_SET_ELEM_KEY_END, |a| {
                a.put(NFTA_DATA_VALUE, end.as_slice())
            });
        }
        match &e.data {
            None => {}
            Some(DataSpec::Verdict(code, chain)) => a.nest(NFTA_SET_ELEM_DATA, |a| {
                a.nest(NFTA_DATA_VERDICT, |a| {
                    a.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
                    if let Some(c) = chain {
                        let mut z = [0u8; 256];
                        let n = c.len().min(255);
                        z[..n].copy_from_slice(&c.as_bytes()[..n]);
                        a.put(NFTA_VERDICT_CHAIN, &z[..=n]);
                    }
                })
            }),
            Some(DataSpec::Value(v)) => {
                a.nest(NFTA_SET_ELEM_DATA, |a| a.put(NFTA_DATA_VALUE, v.as_slice()))
            }
        }
        if e.comment.is_some() || e.open {
            a.put_with(NFTA_SET_ELEM_USERDATA, |out| {
                if let Some(c) = e.comment {
                    udata::put_elem_comment(out, c);
                }
                if e.open {
                    out.extend_from_slice(&udata::INTERVAL_OPEN);
                }
            });
        }
    });
}

/// Elements of one message: the encoded list and, per element, its IR element index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElemChunk {
    pub list: Vec<u8>,
    pub srcs: Vec<u32>,
}

/// Encoded element lists, split into messages exactly where nft splits them.
#[derive(Debug, Default)]
pub struct ElemChunks {
    pub chunks: Vec<ElemChunk>,
    cur: ElemChunk,
    /// nft numbers the element nests of one command across its messages.
    next_index: usize,
    count: usize,
}

impl ElemChunks {
    pub fn new() -> ElemChunks {
        ElemChunks {
            next_index: 1,
            ..Default::default()
        }
    }

    pub fn push(&mut self, e: &ElemSpec) {
        if self.cur.list.is_empty() {
            self.cur.list.reserve(MAX_ELEM_LIST);
        }
        let at = self.cur.list.len();
        write_elem(&mut self.cur.list, self.next_index, e);
        if self.cur.list.len() > MAX_ELEM_LIST && !self.cur.srcs.is_empty() {
            // nft built this element before finding it did not fit, so it moves to the
            // next message with the next index.
            let mut next = ElemChunk::default();
            next.list.reserve(MAX_ELEM_LIST);
            next.list.extend_from_slice(&self.cur.list[at..]);
            self.cur.list.truncate(at);
            self.chunks.push(std::mem::replace(&mut self.cur, next));
            self.next_index += 1;
            let kind = (self.next_index as u16) | NLA_F_NESTED;
            self.cur.list[2..4].copy_from_slice(&kind.to_ne_bytes());
        }
        self.cur.srcs.push(e.src);
        self.next_index += 1;
        self.count += 1;
    }

    /// Elements pushed so far (anonymous sets declare it as their size).
    pub fn count(&self) -> usize {
        self.count
    }

    pub fn finish(mut self) -> Vec<ElemChunk> {
        if !self.cur.srcs.is_empty() {
            self.chunks.push(self.cur);
        }
        self.chunks
    }
}

/// How elements are being sent: nft adds its leading `0` interval-end element only when it
/// creates a set together with its elements (and for anonymous sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemMode {
    Create,
    Add,
    Delete,
}

/// The shape of a set's keys and data, shared by named and anonymous sets.
#[derive(Debug, Clone)]
pub struct ElemLayout {
    pub key: Vec<DataType>,
    /// Per key component: stored big endian although the type is host order (interval
    /// sets need memcmp order; rules convert with a `byteorder` expression).
    pub to_big_endian: Vec<bool>,
    pub interval: bool,
    pub kind: SetKind,
}

impl ElemLayout {
    pub fn new(key: Vec<DataType>, interval: bool, kind: SetKind) -> Result<Self, NftError> {
        let mut to_big_endian = Vec::with_capacity(key.len());
        for t in &key {
            let info = type_info(*t)?;
            to_big_endian.push(interval && needs_hton(info.byteorder, info.len, *t));
        }
        Ok(ElemLayout {
            key,
            to_big_endian,
            interval,
            kind,
        })
    }
}

/// Host-order integers wider than a byte are byte-swapped for interval lookups.
pub fn needs_hton(bo: ByteOrder, len: usize, t: DataType) -> bool {
    bo == ByteOrder::Host && len > 1 && t != DataType::IfName
}

/// Whether a field needs `byteorder hton` before an interval lookup or range compare.
pub fn field_needs_hton(f: &FieldInfo) -> bool {
    needs_hton(f.byteorder, f.len, f.key_type)
}

/// One key component as inclusive start and end bytes (equal for a single value).
fn part_bounds(part: &KeyPart, t: DataType, be: bool) -> Result<(Bytes, Bytes), NftError> {
    let conv = |v: &Value| -> Result<Bytes, NftError> {
        let mut b = Bytes::new();
        write_value(v, t, &mut b)?;
        // Host-order integers become big endian (what `byteorder hton` yields).
        if be && cfg!(target_endian = "little") {
            b.as_mut_slice().reverse();
        }
        Ok(b)
    };
    match part {
        KeyPart::Value(v) => {
            // `"eth*"` covers every name starting with `eth`: an interval, like a prefix.
            if let Some(prefix) = ifname_wildcard(v)? {
                let (mut lo, mut hi) = ([0u8; IFNAMSIZ], [0xffu8; IFNAMSIZ]);
                lo[..prefix.len()].copy_from_slice(&prefix);
                hi[..prefix.len()].copy_from_slice(&prefix);
                return Ok((Bytes::from_slice(&lo), Bytes::from_slice(&hi)));
            }
            let b = conv(v)?;
            Ok((b, b))
        }
        KeyPart::Range(a, b) => {
            let (a, b) = (conv(a)?, conv(b)?);
            if a > b {
                return Err(encode_err(
                    &format!("range {part:?}"),
                    "start is above end".into(),
                ));
            }
            Ok((a, b))
        }
        KeyPart::Prefix(net) => match (net, t) {
            (IpNet::V4(n), DataType::Ipv4Addr) => Ok((
                Bytes::from_slice(&n.network().octets()),
                Bytes::from_slice(&n.broadcast().octets()),
            )),
            (IpNet::V6(n), DataType::Ipv6Addr) => Ok((
                Bytes::from_slice(&n.network().octets()),
                Bytes::from_slice(&n.broadcast().octets()),
            )),
            _ => Err(encode_err(
                &format!("prefix {net}"),
                format!("not a {} value", crate::nft::render::data_type_name(t)),
            )),
        },
    }
}

/// The key of an element of a plain (non-interval) set: values only.
fn plain_key(layout: &ElemLayout, key: &ElemKey) -> Result<Bytes, NftError> {
    let concat = key.len() > 1;
    let mut out = Bytes::new();
    if key.len() != layout.key.len() {
        return key_bounds(layout, key).map(|(s, _)| s);
    }
    for (part, t) in key.iter().zip(&layout.key) {
        match part {
            KeyPart::Value(v) if !matches!(v, Value::IfName(_)) => write_value(v, *t, &mut out)?,
            // Interface names may be wildcards; prefixes and ranges are errors here.
            _ => return key_bounds(layout, key).map(|(s, _)| s),
        }
        if concat {
            out.pad4();
        }
    }
    Ok(out)
}

/// A key part that is one value (not a prefix, range or interface-name wildcard).
pub fn is_single_value(part: &KeyPart) -> Result<bool, NftError> {
    Ok(match part {
        KeyPart::Value(v) => ifname_wildcard(v)?.is_none(),
        _ => false,
    })
}

/// The key bounds of one IR element; concatenation components are padded to 4 bytes.
pub fn key_bounds(layout: &ElemLayout, key: &ElemKey) -> Result<(Bytes, Bytes), NftError> {
    if key.len() != layout.key.len() {
        return Err(encode_err(
            &format!("element key {key:?}"),
            format!(
                "has {} parts, the set key has {}",
                key.len(),
                layout.key.len()
            ),
        ));
    }
    let concat = key.len() > 1;
    let (mut start, mut end) = (Bytes::new(), Bytes::new());
    for ((part, t), be) in key.iter().zip(&layout.key).zip(&layout.to_big_endian) {
        if !layout.interval && !is_single_value(part)? {
            return Err(encode_err(
                &format!("element {part:?}"),
                "prefixes, ranges and wildcards need an interval set".into(),
            ));
        }
        let (s, e) = part_bounds(part, *t, *be)?;
        start.push(s.as_slice());
        end.push(e.as_slice());
        if concat {
            start.pad4();
            end.pad4();
        }
    }
    Ok((start, end))
}

fn data_spec<'a>(
    kind: &SetKind,
    data: &'a Option<ElemData>,
) -> Result<Option<DataSpec<'a>>, NftError> {
    match (kind, data) {
        (SetKind::Set, None) => Ok(None),
        (SetKind::VerdictMap, Some(ElemData::Verdict(v))) => {
            let (code, chain) = verdict_code(v);
            Ok(Some(DataSpec::Verdict(code, chain)))
        }
        (SetKind::Map(types), Some(ElemData::Values(vals))) if types.len() == vals.len() => {
            let mut b = Bytes::new();
            for (v, t) in vals.iter().zip(types) {
                write_value(v, *t, &mut b)?;
                if types.len() > 1 {
                    b.pad4();
                }
            }
            Ok(Some(DataSpec::Value(b)))
        }
        _ => Err(encode_err(
            &format!("element data {data:?}"),
            "does not match the set kind".into(),
        )),
    }
}

/// A key plus the data it maps to, in the order the caller wants them sent.
pub struct Element<'a> {
    pub key: &'a ElemKey,
    pub value: Option<&'a ElemValue>,
    pub src: u32,
}

/// Encodes elements for NEWSETELEM (or DELSETELEM: `mode` Delete sends keys only).
/// `merge` joins overlapping and adjacent intervals (nft does it for anonymous sets).
pub fn encode_elements<'a>(
    layout: &ElemLayout,
    elems: impl Iterator<Item = Element<'a>>,
    mode: ElemMode,
    merge: bool,
) -> Result<ElemChunks, NftError> {
    let single_interval = layout.interval && layout.key.len() == 1;
    let mut out = ElemChunks::new();
    let mut ranges = Vec::new();
    for e in elems {
        let (start, end) = if layout.interval {
            key_bounds(layout, e.key)?
        } else {
            (plain_key(layout, e.key)?, Bytes::new())
        };
        let (data, timeout_ms, comment) = match (mode, e.value) {
            (ElemMode::Delete, _) | (_, None) => (None, None, None),
            (_, Some(v)) => (
                data_spec(&layout.kind, &v.data)?,
                v.timeout.map(|s| u64::from(s) * 1000),
                v.comment.as_deref(),
            ),
        };
        let spec = ElemSpec {
            key: start,
            key_end: None,
            flags: 0,
            timeout_ms,
            data,
            comment,
            open: false,
            src: e.src,
        };
        if single_interval {
            ranges.push((spec, end));
        } else {
            let key_end = layout.interval.then_some(end);
            out.push(&ElemSpec { key_end, ..spec });
        }
    }
    if single_interval {
        interval_elements(ranges, mode, merge, &mut out)?;
    }
    Ok(out)
}

/// nft's interval encoding: a start element per interval, an end element (flagged) at
/// end + 1 unless the interval runs to the top of the key space (then the start carries
/// the "open" userdata), sorted, and for created sets a leading end element at 0.
fn interval_elements(
    mut ranges: Vec<(ElemSpec, Bytes)>,
    mode: ElemMode,
    merge: bool,
    out: &mut ElemChunks,
) -> Result<(), NftError> {
    ranges.sort_by_key(|r| r.0.key);
    if merge {
        ranges = merge_ranges(ranges);
    } else if let Some(w) = ranges.windows(2).find(|w| w[1].0.key <= w[0].1) {
        return Err(encode_err(
            &format!("interval starting at {:?}", w[1].0.key),
            "conflicting intervals specified (overlaps the previous one)".into(),
        ));
    }
    let end_elem = |key: Bytes, src| ElemSpec {
        key,
        key_end: None,
        flags: NFT_SET_ELEM_INTERVAL_END,
        timeout_ms: None,
        data: None,
        comment: None,
        open: false,
        src,
    };
    if let Some((first, _)) = ranges.first()
        && mode == ElemMode::Create
        && first.key.as_slice().iter().any(|b| *b != 0)
    {
        let mut zero = first.key;
        zero.as_mut_slice().fill(0);
        out.push(&end_elem(zero, u32::MAX));
    }
    for (mut start, end) in ranges {
        match increment(end) {
            Some(next) => {
                out.push(&start);
                out.push(&end_elem(next, start.src));
            }
            None => {
                start.open = true;
                out.push(&start);
            }
        }
    }
    Ok(())
}

/// Joins sorted intervals that overlap or touch (anonymous sets: nft's automerge).
fn merge_ranges<'a>(ranges: Vec<(ElemSpec<'a>, Bytes)>) -> Vec<(ElemSpec<'a>, Bytes)> {
    let mut out: Vec<(ElemSpec, Bytes)> = Vec::with_capacity(ranges.len());
    for (spec, end) in ranges {
        if let Some((_, last_end)) = out.last_mut() {
            let touches = increment(*last_end).is_none_or(|next| spec.key <= next);
            if touches {
                if end > *last_end {
                    *last_end = end;
                }
                continue;
            }
        }
        out.push((spec, end));
    }
    out
}

/// Big-endian `bytes + 1`; `None` on overflow (the interval is open-ended).
pub fn increment(mut v: Bytes) -> Option<Bytes> {
    for b in v.as_mut_slice().iter_mut().rev() {
        let (n, carry) = b.overflowing_add(1);
        *b = n;
        if !carry {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::{ElemKey, Set, SetFlags};
    use std::net::Ipv4Addr;

    /// (key, flags) of every element, walking the encoded lists.
    fn decoded(chunks: &[ElemChunk]) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for c in chunks {
            let mut i = 0;
            while i < c.list.len() {
                let len = u16::from_ne_bytes([c.list[i], c.list[i + 1]]) as usize;
                let body = &c.list[i + 4..i + len];
                let (mut key, mut flags, mut j) = (String::new(), 0, 0);
                while j < body.len() {
                    let alen = u16::from_ne_bytes([body[j], body[j + 1]]) as usize;
                    let kind = u16::from_ne_bytes([body[j + 2], body[j + 3]]) & 0x3fff;
                    let v = &body[j + 4..j + alen];
                    match kind {
                        NFTA_SET_ELEM_FLAGS => flags = u32::from_be_bytes(v.try_into().unwrap()),
                        NFTA_SET_ELEM_KEY => {
                            let k: Vec<String> = v[4..].iter().map(|b| b.to_string()).collect();
                            key = k.join(".");
                        }
                        _ => {}
                    }
                    j += round4(alen);
                }
                out.push((key, flags));
                i += len;
            }
        }
        out
    }

    fn net(s: &str) -> ElemKey {
        vec![KeyPart::Prefix(s.parse().unwrap())]
    }

    fn v4set(interval: bool) -> Set {
        Set::new("s", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(SetFlags {
            interval,
            ..Default::default()
        })
    }

    fn encode(
        set: &Set,
        keys: &[ElemKey],
        mode: ElemMode,
        merge: bool,
    ) -> Result<Vec<ElemChunk>, NftError> {
        let layout = ElemLayout::new(set.key.clone(), set.flags.interval, set.kind.clone())?;
        let elems = keys.iter().enumerate().map(|(i, k)| Element {
            key: k,
            value: None,
            src: i as u32,
        });
        Ok(encode_elements(&layout, elems, mode, merge)?.finish())
    }

    #[test]
    fn intervals_get_end_elements_and_a_leading_zero_on_create() {
        let keys = [net("10.0.0.0/8"), net("11.0.0.0/8"), net("128.0.0.0/1")];
        let chunks = encode(&v4set(true), &keys, ElemMode::Create, false).unwrap();
        // The sequence `nft --debug=netlink` prints for this set.
        let want: Vec<(String, u32)> = [
            ("0.0.0.0", 1),
            ("10.0.0.0", 0),
            ("11.0.0.0", 1),
            ("11.0.0.0", 0),
            ("12.0.0.0", 1),
            ("128.0.0.0", 0),
        ]
        .iter()
        .map(|(k, f)| (k.to_string(), *f))
        .collect();
        assert_eq!(decoded(&chunks), want);
        // Deletes never carry the leading zero.
        let del = encode(&v4set(true), &keys[..1], ElemMode::Delete, false).unwrap();
        assert_eq!(decoded(&del).len(), 2);
    }

    #[test]
    fn anonymous_intervals_merge_and_named_ones_must_not_overlap() {
        let keys = [net("10.0.0.0/8"), net("10.1.0.0/16"), net("11.0.0.0/8")];
        let merged = encode(&v4set(true), &keys, ElemMode::Create, true).unwrap();
        let want = vec![
            ("0.0.0.0".to_string(), 1),
            ("10.0.0.0".to_string(), 0),
            ("12.0.0.0".to_string(), 1),
        ];
        assert_eq!(decoded(&merged), want);
        assert!(encode(&v4set(true), &keys, ElemMode::Create, false).is_err());
    }

    #[test]
    fn plain_sets_refuse_prefixes() {
        assert!(encode(&v4set(false), &[net("10.0.0.0/8")], ElemMode::Add, false).is_err());
        let k = vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(1, 2, 3, 4)))];
        let chunks = encode(&v4set(false), &[k], ElemMode::Add, false).unwrap();
        // nest 4 + key nest (4 + value attr 8) = 16: the size in nft's own message.
        assert_eq!(chunks[0].list.len(), 16);
    }

    #[test]
    fn lists_split_at_the_attribute_limit_with_nft_numbering() {
        let keys: Vec<ElemKey> = (0..5000u32)
            .map(|i| vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::from(i)))])
            .collect();
        let chunks = encode(&v4set(false), &keys, ElemMode::Add, false).unwrap();
        assert_eq!(chunks.len(), 2);
        // 16 bytes per element: 4095 fit below 65531; the next one starts message two
        // with index 4097 (index 4096 was spent on the element that did not fit).
        assert_eq!(chunks[0].srcs.len(), 4095);
        let kind = u16::from_ne_bytes([chunks[1].list[2], chunks[1].list[3]]);
        assert_eq!(kind & 0x3fff, 4097 & 0x3fff);
        assert_eq!(chunks[1].srcs[0], 4095);
    }
}
