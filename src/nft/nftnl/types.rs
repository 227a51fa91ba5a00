//! What nft 1.0.6 knows about each datatype and packet field: type ids, lengths, byte
//! orders, how a field is loaded and how nft describes it in set userdata. Pure data, so
//! everything here is unit-testable without a kernel.

pub use super::udata::ByteOrder;
use super::udata::Udata;
use crate::nft::engine::NftError;
use crate::nft::ir::{AddrType, CtDir, DataType, Field, IpFamily, Value};
use crate::nft::render::sanitize_text;

/// A datatype as nft declares it: `type <name>` in a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// nft's `enum datatypes` value (`TYPE_IPADDR` = 7 ...).
    pub id: u32,
    /// Length in bytes of one value.
    pub len: usize,
    pub byteorder: ByteOrder,
}

/// Bits per component in a concatenated type id (`TYPE_BITS` in nft).
const TYPE_BITS: u32 = 6;

pub fn type_info(t: DataType) -> Result<TypeInfo, NftError> {
    let (id, len, byteorder) = match t {
        DataType::Verdict => {
            return Err(encode_err(
                "datatype verdict",
                "only valid as map data".into(),
            ));
        }
        DataType::NfProto => (2, 1, ByteOrder::Invalid),
        DataType::EtherType => (10, 2, ByteOrder::Host),
        DataType::Integer => (4, 4, ByteOrder::Host),
        DataType::Ipv4Addr => (7, 4, ByteOrder::Big),
        DataType::Ipv6Addr => (8, 16, ByteOrder::Big),
        DataType::InetProto => (12, 1, ByteOrder::Invalid),
        DataType::InetService => (13, 2, ByteOrder::Big),
        DataType::Mark => (19, 4, ByteOrder::Host),
        DataType::CtState => (26, 4, ByteOrder::Host),
        DataType::CtDir => (27, 1, ByteOrder::Invalid),
        DataType::AddrType => (38, 4, ByteOrder::Host),
        DataType::Boolean => (39, 4, ByteOrder::Host),
        DataType::TcpFlag => (15, 1, ByteOrder::Big),
        DataType::IfName => (41, 16, ByteOrder::Host),
    };
    Ok(TypeInfo { id, len, byteorder })
}

/// Type id, key length and byte order of a (possibly concatenated) key, as nft computes
/// them: ids are shifted by 6 bits per component, components are 4-byte aligned.
pub fn concat_info(types: &[DataType]) -> Result<TypeInfo, NftError> {
    match types {
        [] => Err(encode_err("set key", "empty key".into())),
        [one] => type_info(*one),
        many => {
            let mut id = 0;
            let mut len = 0;
            for t in many {
                let info = type_info(*t)?;
                id = (id << TYPE_BITS) | info.id;
                len += round4(info.len);
            }
            if len > Bytes::MAX {
                return Err(encode_err(
                    "concatenated key",
                    format!("{len} bytes, the kernel allows {}", Bytes::MAX),
                ));
            }
            Ok(TypeInfo {
                id,
                len,
                byteorder: ByteOrder::Invalid,
            })
        }
    }
}

pub fn round4(n: usize) -> usize {
    (n + 3) & !3
}

/// How the kernel loads a field into a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    Meta(u32),
    Payload {
        base: u32,
        offset: u32,
    },
    Ct(u32),
    /// `fib daddr type`: flags, result.
    Fib {
        flags: u32,
        result: u32,
    },
    /// `numgen random mod N`.
    Numgen {
        modulus: u32,
    },
    /// An IPv6 extension header's bytes at `offset` (`exthdr`, op ipv6): `kind` is the
    /// header's next-header number.
    Exthdr {
        kind: u8,
        offset: u32,
    },
}

uapi!(pub u32:
    NFT_META_MARK,
    /// `meta nftrace`: the packet's trace bit (set from a one-byte register).
    NFT_META_NFTRACE,
    NFT_META_IIFNAME,
    NFT_META_OIFNAME,
    NFT_META_NFPROTO,
    /// `meta protocol` (the ethertype).
    NFT_META_PROTOCOL,
    NFT_META_L4PROTO,
    NFT_PAYLOAD_LL_HEADER,
    NFT_PAYLOAD_NETWORK_HEADER,
    NFT_PAYLOAD_TRANSPORT_HEADER,
    NFT_CT_STATE,
    NFT_CT_DIRECTION,
    NFT_CT_MARK,
    NFT_NG_RANDOM,
);
uapi!(pub u8:
    /// The IPv6 fragment header's next-header number.
    IPPROTO_FRAGMENT,
);
/// `frag frag-off`'s bits in its 16-bit load (the low three are reserved and M).
pub const IP6_FRAG_OFF_MASK: u16 = 0xfff8;
pub const NFTA_FIB_F_SADDR: u32 = 1;
pub const NFTA_FIB_F_DADDR: u32 = 1 << 1;
pub const NFTA_FIB_F_IIF: u32 = 1 << 3;
pub const NFTA_FIB_F_PRESENT: u32 = 1 << 5;
pub const NFT_FIB_RESULT_OIF: u32 = 1;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;

/// nft's expression types (`enum expr_types`) used in set typeof userdata.
const EXPR_VERDICT: u32 = 1;
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CT: u32 = 12;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
const EXPR_FIB: u32 = 26;

/// nft's protocol descriptor ids and header field indices (payload typeof userdata).
const PROTO_DESC_TH: u32 = 11;
const PROTO_DESC_IP: u32 = 12;
const PROTO_DESC_IP6: u32 = 13;

/// Everything the encoder needs to know about one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    pub load: Load,
    /// Bytes loaded.
    pub len: usize,
    /// Byte order of the loaded value (decides `byteorder` conversions and set userdata).
    pub byteorder: ByteOrder,
    /// The set key datatype when this field keys an anonymous set.
    pub key_type: DataType,
    /// Address family the field needs (`meta nfproto` dependency in an inet table).
    pub family: Option<IpFamily>,
    /// A string (interface names): prefix matches compare bytes, no bitmask.
    pub string: bool,
    /// A mask the loaded value is `&`ed with before use (nft's `field & mask` binop).
    pub mask: Option<&'static [u8]>,
}

/// The masks of `ip daddr & 0.0.0.15` and `ip6 daddr & ::f`.
const LOW_NIBBLE_V4: [u8; 4] = [0, 0, 0, 0x0f];
const LOW_NIBBLE_V6: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0f];

pub fn field_info(f: Field) -> FieldInfo {
    use ByteOrder::*;
    let info = |load, len, byteorder| FieldInfo {
        load,
        len,
        byteorder,
        key_type: f.data_type(),
        family: f.family(),
        string: false,
        mask: None,
    };
    let nh = |offset| Load::Payload {
        base: NFT_PAYLOAD_NETWORK_HEADER,
        offset,
    };
    let th = |offset| Load::Payload {
        base: NFT_PAYLOAD_TRANSPORT_HEADER,
        offset,
    };
    let fib = |flags, result| info(Load::Fib { flags, result }, 4, Host);
    match f {
        Field::NfProto => info(Load::Meta(NFT_META_NFPROTO), 1, Host),
        Field::EtherType => info(Load::Meta(NFT_META_PROTOCOL), 2, Big),
        Field::L4Proto => info(Load::Meta(NFT_META_L4PROTO), 1, Host),
        Field::Ip4Saddr => info(nh(12), 4, Big),
        Field::Ip4Daddr => info(nh(16), 4, Big),
        Field::Ip6Saddr => info(nh(8), 16, Big),
        Field::Ip6Daddr => info(nh(24), 16, Big),
        Field::ThSport => info(th(0), 2, Big),
        Field::ThDport => info(th(2), 2, Big),
        Field::Mark => info(Load::Meta(NFT_META_MARK), 4, Host),
        Field::IifName | Field::OifName => {
            let key = if f == Field::IifName {
                NFT_META_IIFNAME
            } else {
                NFT_META_OIFNAME
            };
            FieldInfo {
                string: true,
                ..info(Load::Meta(key), 16, Host)
            }
        }
        Field::TcpFlags => info(th(13), 1, Big),
        Field::Ip4FragOff => info(nh(6), 2, Big),
        // The fragment header's second 16 bits: offset (13 bits), reserved (2), M (1).
        Field::Ip6FragOff => info(
            Load::Exthdr {
                kind: IPPROTO_FRAGMENT,
                offset: 2,
            },
            2,
            Big,
        ),
        Field::CtState => info(Load::Ct(NFT_CT_STATE), 4, Host),
        Field::CtMark => info(Load::Ct(NFT_CT_MARK), 4, Host),
        Field::CtDirection => info(Load::Ct(NFT_CT_DIRECTION), 1, Host),
        Field::FibDaddrType => fib(NFTA_FIB_F_DADDR, NFT_FIB_RESULT_ADDRTYPE),
        Field::FibSaddrType => fib(NFTA_FIB_F_SADDR, NFT_FIB_RESULT_ADDRTYPE),
        // With `present`, the kernel stores whether there is such a route in the register's
        // first byte (the rest zeroed); nft compares the whole 4-byte register.
        Field::FibSaddrIifOif => fib(
            NFTA_FIB_F_SADDR | NFTA_FIB_F_IIF | NFTA_FIB_F_PRESENT,
            NFT_FIB_RESULT_OIF,
        ),
        Field::NumgenRandom(modulus) => info(Load::Numgen { modulus }, 4, Host),
        Field::Ip4DaddrLowNibble => FieldInfo {
            mask: Some(&LOW_NIBBLE_V4),
            ..info(nh(16), 4, Big)
        },
        Field::Ip6DaddrLowNibble => FieldInfo {
            mask: Some(&LOW_NIBBLE_V6),
            ..info(nh(24), 16, Big)
        },
    }
}

/// nft's typeof description of a field (`NFTNL_UDATA_SET_TYPEOF_*` payload), written for
/// anonymous sets so `nft list` can print their elements with the key's own syntax.
fn field_typeof(f: Field, u: &mut Udata) {
    let info = field_info(f);
    if info.mask.is_some() {
        // A binop has no typeof of its own here: nft lists the elements by their type.
        return;
    }
    let (etype, attrs): (u32, Vec<u32>) = match info.load {
        Load::Meta(key) => (EXPR_META, vec![key]),
        Load::Payload { .. } => {
            let (desc, field) = match f {
                Field::Ip4Saddr => (PROTO_DESC_IP, 11),
                Field::Ip4Daddr => (PROTO_DESC_IP, 12),
                Field::Ip6Saddr => (PROTO_DESC_IP6, 8),
                Field::Ip6Daddr => (PROTO_DESC_IP6, 9),
                Field::ThSport => (PROTO_DESC_TH, 1),
                _ => (PROTO_DESC_TH, 2),
            };
            (EXPR_PAYLOAD, vec![desc, field])
        }
        // Direction: -1 (none given).
        Load::Ct(key) => (EXPR_CT, vec![key, u32::MAX]),
        Load::Fib { flags, result } => (EXPR_FIB, vec![result, flags]),
        Load::Numgen { modulus } => (EXPR_NUMGEN, vec![NFT_NG_RANDOM, modulus, 0]),
        // Never a set key (the lowering refuses it before a set is made).
        Load::Exthdr { .. } => return,
    };
    u.put_u32(0, etype);
    u.nest(1, |u| {
        for (i, a) in attrs.iter().enumerate() {
            u.put_u32(i as u8, *a);
        }
    });
}

/// The typeof userdata of a key expression (one field or a concatenation).
pub fn key_typeof(key: &[Field], u: &mut Udata) {
    match key {
        [one] => field_typeof(*one, u),
        many => {
            u.put_u32(0, EXPR_CONCAT);
            u.nest(1, |u| {
                for (i, f) in many.iter().enumerate() {
                    u.nest(i as u8, |u| field_typeof(*f, u));
                }
            });
        }
    }
}

/// Typeof userdata of a concatenation declared by type (`type a . b`): no components.
pub fn concat_typeof(u: &mut Udata) {
    u.put_u32(0, EXPR_CONCAT);
    u.nest(1, |_| {});
}

/// Typeof userdata of verdict map data.
pub fn verdict_typeof(u: &mut Udata) {
    u.put_u32(0, EXPR_VERDICT);
    u.nest(1, |_| {});
}

/// The datatype of a value (for type checks against fields and set keys).
pub fn value_type(v: &Value) -> DataType {
    match v {
        Value::Ipv4(_) => DataType::Ipv4Addr,
        Value::Ipv6(_) => DataType::Ipv6Addr,
        Value::Proto(_) => DataType::InetProto,
        Value::Port(_) => DataType::InetService,
        Value::Mark(_) => DataType::Mark,
        Value::IfName(_) => DataType::IfName,
        Value::NfProto(_) => DataType::NfProto,
        Value::AddrType(_) => DataType::AddrType,
        Value::CtDir(_) => DataType::CtDir,
        Value::Integer(_) => DataType::Integer,
        Value::Exists(_) => DataType::Boolean,
        Value::TcpFlags(_) => DataType::TcpFlag,
    }
}

/// `NFPROTO_IPV4` / `NFPROTO_IPV6`.
pub fn nfproto(f: IpFamily) -> u8 {
    match f {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

uapi!(u32: RTN_LOCAL);
pub const IFNAMSIZ: usize = 16;

/// A value or key as the kernel sees it, kept inline (at most `NFT_DATA_VALUE_MAXLEN`
/// = 64 bytes) so that encoding 100k elements allocates nothing per element.
#[derive(Clone, Copy)]
pub struct Bytes {
    len: u8,
    buf: [u8; 64],
}

impl Bytes {
    pub const MAX: usize = 64;

    pub fn new() -> Bytes {
        Bytes {
            len: 0,
            buf: [0; 64],
        }
    }

    pub fn from_slice(b: &[u8]) -> Bytes {
        let mut out = Bytes::new();
        out.push(b);
        out
    }

    /// Appends `b`; callers keep keys within 64 bytes (checked by `concat_info`).
    pub fn push(&mut self, b: &[u8]) {
        let at = self.len as usize;
        let end = (at + b.len()).min(Self::MAX);
        self.buf[at..end].copy_from_slice(&b[..end - at]);
        self.len = end as u8;
    }

    /// Zero padding up to the next multiple of 4 (concatenation components).
    pub fn pad4(&mut self) {
        self.len = round4(self.len as usize).min(Self::MAX) as u8;
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len as usize]
    }
}

impl Default for Bytes {
    fn default() -> Self {
        Bytes::new()
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

impl PartialOrd for Bytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// memcmp order: the order of the kernel's interval trees for same-length keys.
impl Ord for Bytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x?}", self.as_slice())
    }
}

/// Appends the bytes of `v` as the kernel compares them, checked against the expected type.
pub fn write_value(v: &Value, want: DataType, out: &mut Bytes) -> Result<(), NftError> {
    let got = value_type(v);
    if got != want {
        return Err(encode_err(
            &format!("value {v:?}"),
            format!(
                "expected a {} value",
                crate::nft::render::data_type_name(want)
            ),
        ));
    }
    match v {
        Value::Ipv4(a) => out.push(&a.octets()),
        Value::Ipv6(a) => out.push(&a.octets()),
        Value::Proto(p) => out.push(&[*p]),
        Value::Port(p) => out.push(&p.to_be_bytes()),
        Value::Mark(m) | Value::Integer(m) => out.push(&m.to_ne_bytes()),
        Value::IfName(name) => {
            let mut b = [0u8; IFNAMSIZ];
            let text = ifname_text(name)?;
            b[..text.len()].copy_from_slice(text.as_bytes());
            out.push(&b);
        }
        Value::NfProto(f) => out.push(&[nfproto(*f)]),
        Value::AddrType(AddrType::Local) => out.push(&RTN_LOCAL.to_ne_bytes()),
        Value::CtDir(CtDir::Original) => out.push(&[0]),
        Value::CtDir(CtDir::Reply) => out.push(&[1]),
        Value::Exists(e) => out.push(&u32::from(*e).to_ne_bytes()),
        Value::TcpFlags(f) => out.push(&[*f]),
    }
    Ok(())
}

/// The bytes of `v` as the kernel compares them (see [`write_value`]).
pub fn value_bytes(v: &Value, want: DataType) -> Result<Vec<u8>, NftError> {
    let mut b = Bytes::new();
    write_value(v, want, &mut b)?;
    Ok(b.as_slice().to_vec())
}

/// The interface name as the renderer prints it (sanitised, so both paths store the same
/// bytes); errors when it cannot fit `IFNAMSIZ`.
fn ifname_text(name: &str) -> Result<String, NftError> {
    let text = sanitize_text(name);
    if text.len() >= IFNAMSIZ {
        return Err(encode_err(
            &format!("interface name {name:?}"),
            "longer than 15 bytes".into(),
        ));
    }
    Ok(text)
}

/// `iifname "veth*"`: nft compares only the bytes before a trailing `*` (the renderer's
/// sanitising removes backslashes, so a star can never be escaped). Returns those bytes.
pub fn ifname_wildcard(v: &Value) -> Result<Option<Vec<u8>>, NftError> {
    match v {
        Value::IfName(n) => {
            let text = ifname_text(n)?;
            Ok(text.strip_suffix('*').map(|p| p.as_bytes().to_vec()))
        }
        _ => Ok(None),
    }
}

pub fn encode_err(what: &str, reason: String) -> NftError {
    NftError::Encode {
        what: what.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_type_ids_and_lengths_follow_nft() {
        let vm = concat_info(&[
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ])
        .unwrap();
        // `nft --debug=netlink`: key type 0x730d, key len 12.
        assert_eq!((vm.id, vm.len), (0x730d, 12));
        let j = concat_info(&[DataType::Ipv4Addr, DataType::IfName]).unwrap();
        assert_eq!((j.id, j.len), (0x1e9, 20));
        let single = concat_info(&[DataType::InetProto]).unwrap();
        assert_eq!((single.id, single.len), (12, 1));
        assert!(concat_info(&[DataType::Verdict]).is_err());
    }

    #[test]
    fn values_encode_in_kernel_byte_order() {
        let port = value_bytes(&Value::Port(80), DataType::InetService).unwrap();
        assert_eq!(port, vec![0, 80]);
        let mark = value_bytes(&Value::Mark(0x10), DataType::Mark).unwrap();
        assert_eq!(mark, 0x10u32.to_ne_bytes());
        let name = value_bytes(&Value::IfName("eth0".into()), DataType::IfName).unwrap();
        assert_eq!(&name[..5], b"eth0\0");
        assert_eq!(name.len(), 16);
        assert!(value_bytes(&Value::Port(1), DataType::Ipv4Addr).is_err());
        assert!(value_bytes(&Value::IfName("x".repeat(16)), DataType::IfName).is_err());
    }

    #[test]
    fn typeof_userdata_matches_nft() {
        // `ip saddr . th dport { ... }` as nft 1.0.6 writes it.
        let mut u = Udata::default();
        key_typeof(&[Field::Ip4Saddr, Field::ThDport], &mut u);
        let want = "00040d000000012c0014000407000000010c00040c00000001040b000000\
                    0114000407000000010c00040b000000010402000000";
        assert_eq!(hex(&u.into_bytes()), want);
        let mut u = Udata::default();
        key_typeof(&[Field::CtState], &mut u);
        assert_eq!(
            hex(&u.into_bytes()),
            "00040c000000010c0004000000000104ffffffff"
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
