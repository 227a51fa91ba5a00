//! Sets and maps: declarations (flags, key/data types, userdata) and elements (intervals,
//! concatenations, timeouts, map data), encoded the way nft 1.0.6 encodes them.

use super::types::{
    ByteOrder, FieldInfo, concat_info, concat_typeof, encode_err, round4, type_info, value_bytes,
};
use super::udata::{self, Udata};
use crate::nft::engine::NftError;
use crate::nft::ir::{
    DataType, ElemData, ElemKey, ElemValue, KeyPart, Set, SetKind, Value, Verdict,
};
use ipnet::IpNet;

pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
pub const NFT_SET_CONCAT: u32 = 0x80;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
/// `NFT_DATA_VERDICT`: the data type of verdict maps.
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

/// One NEWSET message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    pub name: String,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    /// Data type and length (maps only).
    pub data: Option<(u32, u32)>,
    pub id: u32,
    pub timeout_ms: Option<u64>,
    /// `NFTA_SET_DESC_SIZE` (anonymous sets: the number of elements sent).
    pub desc_size: Option<u32>,
    /// `NFTA_SET_DESC_CONCAT` field lengths (concatenated interval sets).
    pub concat_fields: Vec<u32>,
    pub udata: Vec<u8>,
}

/// Map data of one element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSpec {
    /// Verdict code (`NF_ACCEPT`, `NFT_JUMP` ...) and target chain.
    Verdict(i32, Option<String>),
    Value(Vec<u8>),
}

/// One element as sent in NEWSETELEM/DELSETELEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElemSpec {
    pub key: Vec<u8>,
    pub key_end: Option<Vec<u8>>,
    pub flags: u32,
    pub timeout_ms: Option<u64>,
    pub data: Option<DataSpec>,
    pub udata: Option<Vec<u8>>,
    /// Index of the IR element this came from (`u32::MAX` for nft's leading 0 element).
    pub src: u32,
}

impl ElemSpec {
    /// Bytes [`write_elem_list`] writes for this element: used to split element lists
    /// across messages exactly where nft splits them.
    pub fn encoded_len(&self) -> usize {
        let attr = |len: usize| 4 + round4(len);
        let mut n = 4; // the element nest
        if self.flags != 0 {
            n += attr(4);
        }
        if self.timeout_ms.is_some() {
            n += attr(8);
        }
        n += 4 + attr(self.key.len());
        if let Some(end) = &self.key_end {
            n += 4 + attr(end.len());
        }
        match &self.data {
            None => {}
            Some(DataSpec::Verdict(_, chain)) => {
                n += 4 + 4 + attr(4) + chain.as_ref().map_or(0, |c| attr(c.len() + 1));
            }
            Some(DataSpec::Value(v)) => n += 4 + attr(v.len()),
        }
        if let Some(u) = &self.udata {
            n += attr(u.len());
        }
        n
    }
}

const NLA_F_NESTED: u16 = 0x8000;
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

/// Netlink attributes written into a buffer (`mnl_attr_put` semantics: zero padding).
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

/// The content of `NFTA_SET_ELEM_LIST_ELEMENTS` for `elems`: one nest per element, typed
/// with a running index like nft does (truncated to 16 bits, as C's `uint16_t` does), and
/// the attributes in libnftnl's `nftnl_set_elem_nlmsg_build` order.
pub fn write_elem_list(elems: &[ElemSpec], first_index: usize, out: &mut Vec<u8>) {
    let mut a = Attrs(out);
    for (i, e) in elems.iter().enumerate() {
        a.nest((first_index + i) as u16, |a| {
            if e.flags != 0 {
                a.put(NFTA_SET_ELEM_FLAGS, &e.flags.to_be_bytes());
            }
            if let Some(t) = e.timeout_ms {
                a.put(NFTA_SET_ELEM_TIMEOUT, &t.to_be_bytes());
            }
            a.nest(NFTA_SET_ELEM_KEY, |a| a.put(NFTA_DATA_VALUE, &e.key));
            if let Some(end) = &e.key_end {
                a.nest(NFTA_SET_ELEM_KEY_END, |a| a.put(NFTA_DATA_VALUE, end));
            }
            match &e.data {
                None => {}
                Some(DataSpec::Verdict(code, chain)) => a.nest(NFTA_SET_ELEM_DATA, |a| {
                    a.nest(NFTA_DATA_VERDICT, |a| {
                        a.put(NFTA_VERDICT_CODE, &code.to_be_bytes());
                        if let Some(c) = chain {
                            let mut z = c.as_bytes().to_vec();
                            z.push(0);
                            a.put(NFTA_VERDICT_CHAIN, &z);
                        }
                    })
                }),
                Some(DataSpec::Value(v)) => {
                    a.nest(NFTA_SET_ELEM_DATA, |a| a.put(NFTA_DATA_VALUE, v))
                }
            }
            if let Some(u) = &e.udata {
                a.put(NFTA_SET_ELEM_USERDATA, u);
            }
        });
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

pub fn verdict_code(v: &Verdict) -> (i32, Option<String>) {
    const NF_DROP: i32 = 0;
    const NF_ACCEPT: i32 = 1;
    const NFT_CONTINUE: i32 = -1;
    const NFT_JUMP: i32 = -3;
    const NFT_GOTO: i32 = -4;
    const NFT_RETURN: i32 = -5;
    match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c.clone())),
        Verdict::Goto(c) => (NFT_GOTO, Some(c.clone())),
    }
}

/// The declaration of a named set (`add set` / `add map`).
pub fn named_set_spec(set: &Set, id: u32) -> Result<SetSpec, NftError> {
    let key = concat_info(&set.key).map_err(|e| in_set(&set.name, e))?;
    let concat = set.key.len() > 1;
    let mut flags = 0;
    if set.flags.interval {
        flags |= NFT_SET_INTERVAL;
        if concat {
            flags |= NFT_SET_CONCAT;
        }
    }
    if set.flags.timeout {
        flags |= NFT_SET_TIMEOUT;
    }
    if set.flags.dynamic {
        flags |= NFT_SET_EVAL;
    }
    let mut u = Udata::default();
    u.put_byteorder(udata::SET_KEYBYTEORDER, key.byteorder);
    let data = match &set.kind {
        SetKind::Set => None,
        SetKind::VerdictMap => {
            flags |= NFT_SET_MAP;
            u.put_byteorder(udata::SET_DATABYTEORDER, ByteOrder::Invalid);
            Some((NFT_DATA_VERDICT, 0))
        }
        SetKind::Map(types) => {
            flags |= NFT_SET_MAP;
            let d = concat_info(types).map_err(|e| in_set(&set.name, e))?;
            u.put_byteorder(udata::SET_DATABYTEORDER, d.byteorder);
            Some((d.id, d.len as u32))
        }
    };
    if concat {
        u.nest(udata::SET_KEY_TYPEOF, concat_typeof);
    }
    if let SetKind::Map(types) = &set.kind
        && types.len() > 1
    {
        u.nest(udata::SET_DATA_TYPEOF, concat_typeof);
    }
    if data.is_some() {
        u.put_u32(udata::SET_DATA_INTERVAL, 0);
    }
    let concat_fields = if flags & NFT_SET_CONCAT != 0 {
        field_lengths(&set.key)?
    } else {
        Vec::new()
    };
    Ok(SetSpec {
        name: set.name.clone(),
        flags,
        key_type: key.id,
        key_len: key.len as u32,
        data,
        id,
        timeout_ms: set.timeout.map(|s| u64::from(s) * 1000),
        desc_size: None,
        concat_fields,
        udata: u.into_bytes(),
    })
}

pub fn field_lengths(types: &[DataType]) -> Result<Vec<u32>, NftError> {
    types
        .iter()
        .map(|t| type_info(*t).map(|i| i.len as u32))
        .collect()
}

fn in_set(name: &str, e: NftError) -> NftError {
    match e {
        NftError::Encode { what, reason } => encode_err(&format!("set {name}: {what}"), reason),
        other => other,
    }
}

/// The shape of a set's keys and data, shared by named and anonymous sets.
#[derive(Debug, Clone)]
pub struct ElemLayout {
    pub key: Vec<DataType>,
    /// Per key component: stored big endian although the type is host order (interval
    /// sets need memcmp order; nft converts with a `byteorder` expression).
    pub to_big_endian: Vec<bool>,
    pub interval: bool,
    pub kind: SetKind,
}

impl ElemLayout {
    pub fn of_set(set: &Set) -> Result<ElemLayout, NftError> {
        ElemLayout::new(set.key.clone(), set.flags.interval, set.kind.clone())
    }

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
fn part_bounds(part: &KeyPart, t: DataType, be: bool) -> Result<(Vec<u8>, Vec<u8>), NftError> {
    let conv = |v: &Value| -> Result<Vec<u8>, NftError> {
        let mut b = value_bytes(v, t)?;
        // Host-order integers become big endian (what `byteorder hton` yields).
        if be && cfg!(target_endian = "little") {
            b.reverse();
        }
        Ok(b)
    };
    match part {
        KeyPart::Value(v) => {
            let b = conv(v)?;
            Ok((b.clone(), b))
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
        KeyPart::Prefix(net) => {
            let ok = matches!(
                (net, t),
                (IpNet::V4(_), DataType::Ipv4Addr) | (IpNet::V6(_), DataType::Ipv6Addr)
            );
            if !ok {
                return Err(encode_err(
                    &format!("prefix {net}"),
                    format!("not a {} value", crate::nft::render::data_type_name(t)),
                ));
            }
            Ok(match net {
                IpNet::V4(n) => (
                    n.network().octets().to_vec(),
                    n.broadcast().octets().to_vec(),
                ),
                IpNet::V6(n) => (
                    n.network().octets().to_vec(),
                    n.broadcast().octets().to_vec(),
                ),
            })
        }
    }
}

/// Concatenated key bytes: each component padded to 4 bytes (a single component is not).
fn pad_concat(parts: Vec<Vec<u8>>) -> Vec<u8> {
    if parts.len() == 1 {
        return parts.into_iter().next().unwrap_or_default();
    }
    let mut out = Vec::with_capacity(parts.iter().map(|p| round4(p.len())).sum());
    for p in parts {
        let padded = round4(p.len());
        out.extend_from_slice(&p);
        out.resize(out.len() + padded - p.len(), 0);
    }
    out
}

/// The key bounds of one IR element.
pub fn key_bounds(layout: &ElemLayout, key: &ElemKey) -> Result<(Vec<u8>, Vec<u8>), NftError> {
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
    let mut starts = Vec::with_capacity(key.len());
    let mut ends = Vec::with_capacity(key.len());
    for ((part, t), be) in key.iter().zip(&layout.key).zip(&layout.to_big_endian) {
        if !layout.interval && !matches!(part, KeyPart::Value(_)) {
            return Err(encode_err(
                &format!("element {part:?}"),
                "prefixes and ranges need an interval set".into(),
            ));
        }
        let (s, e) = part_bounds(part, *t, *be)?;
        starts.push(s);
        ends.push(e);
    }
    Ok((pad_concat(starts), pad_concat(ends)))
}

pub fn data_spec(kind: &SetKind, data: &Option<ElemData>) -> Result<Option<DataSpec>, NftError> {
    match (kind, data) {
        (SetKind::Set, None) => Ok(None),
        (SetKind::VerdictMap, Some(ElemData::Verdict(v))) => {
            let (code, chain) = verdict_code(v);
            Ok(Some(DataSpec::Verdict(code, chain)))
        }
        (SetKind::Map(types), Some(ElemData::Values(vals))) if types.len() == vals.len() => {
            let parts = vals
                .iter()
                .zip(types)
                .map(|(v, t)| value_bytes(v, *t))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(DataSpec::Value(pad_concat(parts))))
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
) -> Result<Vec<ElemSpec>, NftError> {
    let single_interval = layout.interval && layout.key.len() == 1;
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    for e in elems {
        let (start, end) = key_bounds(layout, e.key)?;
        let (data, timeout_ms) = match (mode, e.value) {
            (ElemMode::Delete, _) | (_, None) => (None, None),
            (_, Some(v)) => (
                data_spec(&layout.kind, &v.data)?,
                v.timeout.map(|s| u64::from(s) * 1000),
            ),
        };
        let spec = ElemSpec {
            key: start,
            key_end: None,
            flags: 0,
            timeout_ms,
            data,
            udata: None,
            src: e.src,
        };
        if single_interval {
            ranges.push((spec, end));
        } else {
            let key_end = layout.interval.then_some(end);
            out.push(ElemSpec { key_end, ..spec });
        }
    }
    if single_interval {
        out = interval_elements(ranges, mode, merge)?;
    }
    Ok(out)
}

/// nft's interval encoding: a start element per interval, an end element (flagged) at
/// end + 1 unless the interval runs to the top of the key space (then the start carries
/// the "open" userdata), sorted, and for created sets a leading end element at 0.
fn interval_elements(
    mut ranges: Vec<(ElemSpec, Vec<u8>)>,
    mode: ElemMode,
    merge: bool,
) -> Result<Vec<ElemSpec>, NftError> {
    ranges.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    if merge {
        ranges = merge_ranges(ranges);
    } else if let Some(w) = ranges.windows(2).find(|w| w[1].0.key <= w[0].1) {
        return Err(encode_err(
            &format!("interval starting at {:02x?}", w[1].0.key),
            "conflicting intervals specified (overlaps the previous one)".into(),
        ));
    }
    let mut out = Vec::with_capacity(ranges.len() * 2 + 1);
    if let Some((first, _)) = ranges.first()
        && mode == ElemMode::Create
        && first.key.iter().any(|b| *b != 0)
    {
        out.push(ElemSpec {
            key: vec![0; first.key.len()],
            key_end: None,
            flags: NFT_SET_ELEM_INTERVAL_END,
            timeout_ms: None,
            data: None,
            udata: None,
            src: u32::MAX,
        });
    }
    for (mut start, end) in ranges {
        let src = start.src;
        match increment(&end) {
            Some(next) => {
                out.push(start);
                out.push(ElemSpec {
                    key: next,
                    key_end: None,
                    flags: NFT_SET_ELEM_INTERVAL_END,
                    timeout_ms: None,
                    data: None,
                    udata: None,
                    src,
                });
            }
            None => {
                start.udata = Some(udata::interval_open());
                out.push(start);
            }
        }
    }
    Ok(out)
}

/// Joins sorted intervals that overlap or touch (anonymous sets: nft's automerge).
fn merge_ranges(ranges: Vec<(ElemSpec, Vec<u8>)>) -> Vec<(ElemSpec, Vec<u8>)> {
    let mut out: Vec<(ElemSpec, Vec<u8>)> = Vec::with_capacity(ranges.len());
    for (spec, end) in ranges {
        if let Some((_, last_end)) = out.last_mut() {
            let touches = increment(last_end).is_none_or(|next| spec.key <= next);
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
pub fn increment(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut v = bytes.to_vec();
    for b in v.iter_mut().rev() {
        let (n, carry) = b.overflowing_add(1);
        *b = n;
        if !carry {
            return Some(v);
        }
    }
    None
}

/// Key byte order of an anonymous set keyed by `fields` (nft takes the expression's).
pub fn expr_byteorder(fields: &[FieldInfo]) -> ByteOrder {
    match fields {
        [one] => one.byteorder,
        _ => ByteOrder::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::SetFlags;
    use std::net::Ipv4Addr;

    fn v4set(interval: bool) -> Set {
        Set::new("s", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(SetFlags {
            interval,
            ..Default::default()
        })
    }

    fn keys(specs: &[ElemSpec]) -> Vec<(String, u32)> {
        specs
            .iter()
            .map(|s| {
                let k: Vec<String> = s.key.iter().map(|b| b.to_string()).collect();
                (k.join("."), s.flags)
            })
            .collect()
    }

    fn net(s: &str) -> ElemKey {
        vec![KeyPart::Prefix(s.parse().unwrap())]
    }

    #[test]
    fn intervals_get_end_elements_and_a_leading_zero_on_create() {
        let mut set = v4set(true);
        set.insert(net("10.0.0.0/8"));
        set.insert(net("11.0.0.0/8"));
        set.insert(net("128.0.0.0/1"));
        let layout = ElemLayout::of_set(&set).unwrap();
        let elems = set.elements.iter().enumerate().map(|(i, (k, v))| Element {
            key: k,
            value: Some(v),
            src: i as u32,
        });
        let specs = encode_elements(&layout, elems, ElemMode::Create, false).unwrap();
        // Same sequence as `nft --debug=netlink` prints for this set.
        assert_eq!(
            keys(&specs),
            vec![
                ("0.0.0.0".into(), 1),
                ("10.0.0.0".into(), 0),
                ("11.0.0.0".into(), 1),
                ("11.0.0.0".into(), 0),
                ("12.0.0.0".into(), 1),
                ("128.0.0.0".into(), 0),
            ]
        );
        assert_eq!(specs[5].udata, Some(udata::interval_open()));
    }

    #[test]
    fn anonymous_intervals_merge_and_named_ones_must_not_overlap() {
        let set = v4set(true);
        let layout = ElemLayout::of_set(&set).unwrap();
        let ks = [net("10.0.0.0/8"), net("10.1.0.0/16"), net("11.0.0.0/8")];
        let elems = || {
            ks.iter().map(|k| Element {
                key: k,
                value: None,
                src: 0,
            })
        };
        let merged = encode_elements(&layout, elems(), ElemMode::Create, true).unwrap();
        assert_eq!(
            keys(&merged),
            vec![
                ("0.0.0.0".into(), 1),
                ("10.0.0.0".into(), 0),
                ("12.0.0.0".into(), 1)
            ]
        );
        assert!(encode_elements(&layout, elems(), ElemMode::Create, false).is_err());
    }

    #[test]
    fn plain_sets_refuse_prefixes_and_encoded_len_matches_libnftnl() {
        let set = v4set(false);
        let layout = ElemLayout::of_set(&set).unwrap();
        let k = net("10.0.0.0/8");
        let one = std::iter::once(Element {
            key: &k,
            value: None,
            src: 0,
        });
        assert!(encode_elements(&layout, one, ElemMode::Add, false).is_err());
        let k = vec![KeyPart::Value(Value::Ipv4(Ipv4Addr::new(1, 2, 3, 4)))];
        let one = std::iter::once(Element {
            key: &k,
            value: None,
            src: 0,
        });
        let specs = encode_elements(&layout, one, ElemMode::Add, false).unwrap();
        // nest 4 + key nest (4 + value attr 8) = 16: `0x10` in nft's own message.
        assert_eq!(specs[0].encoded_len(), 16);
    }

    #[test]
    fn declarations_match_nft_userdata() {
        let mut vm = Set::new(
            "vm",
            vec![
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ],
            SetKind::VerdictMap,
        );
        vm.insert_mapping(
            vec![
                Value::Ipv4(Ipv4Addr::new(10, 1, 1, 1)).into(),
                Value::Proto(6).into(),
                Value::Port(80).into(),
            ],
            ElemData::Verdict(Verdict::Accept),
        );
        let spec = named_set_spec(&vm, 1).unwrap();
        assert_eq!((spec.flags, spec.key_type, spec.key_len), (8, 0x730d, 12));
        assert_eq!(spec.data, Some((0xffff_ff00, 0)));
        // Bytes from `nft --debug=mnl` for the same declaration.
        let want: &[u8] = b"\x00\x04\x00\x00\x00\x00\x01\x04\x00\x00\x00\x00\x03\x08\x00\x04\
                            \x0d\x00\x00\x00\x01\x00\x06\x04\x00\x00\x00\x00";
        assert_eq!(spec.udata, want);
    }
}
