//! Set and map declarations (flags, key/data types, userdata) as nft 1.0.6 sends them.

use super::types::{
    ByteOrder, FieldInfo, concat_info, concat_typeof, encode_err, key_typeof, type_info,
};
use super::udata::{self, Udata};
use crate::nft::engine::NftError;
use crate::nft::ir::{DataType, Set, SetKind, Verdict};

uapi!(pub u32:
    NFT_SET_ANONYMOUS,
    NFT_SET_CONSTANT,
    NFT_SET_INTERVAL,
    NFT_SET_MAP,
    NFT_SET_TIMEOUT,
    NFT_SET_EVAL,
    NFT_SET_ELEM_INTERVAL_END,
    /// The data type of verdict maps.
    NFT_DATA_VERDICT,
);
pub const NFT_SET_CONCAT: u32 = 0x80;

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
    /// A `counter` set expression (`NFTA_SET_EXPR`): the kernel gives every element its
    /// own counter. nft sends no per-element expressions for it.
    pub counter: bool,
}

/// Kernel verdict code and target chain.
pub fn verdict_code(v: &Verdict) -> (i32, Option<&str>) {
    match v {
        Verdict::Accept => (libc::NF_ACCEPT, None),
        Verdict::Drop => (libc::NF_DROP, None),
        Verdict::Continue => (libc::NFT_CONTINUE, None),
        Verdict::Return => (libc::NFT_RETURN, None),
        Verdict::Jump(c) => (libc::NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (libc::NFT_GOTO, Some(c)),
    }
}

/// The declaration of a named set (`add set` / `add map`).
pub fn named_set_spec(set: &Set, id: u32) -> Result<SetSpec, NftError> {
    refuse_untyped_integer(set)?;
    let key = concat_info(&set.key).map_err(|e| in_set(&set.name, e))?;
    let concat = set.key.len() > 1;
    let mut flags = key_flags(set, concat);
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
    put_typeof(set, concat, &mut u);
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
        desc_size: set.size,
        concat_fields,
        udata: u.into_bytes(),
        counter: set.flags.counter,
    })
}

/// `type integer` has no length; nft 1.0.6 wants `typeof` there.
fn refuse_untyped_integer(set: &Set) -> Result<(), NftError> {
    let data_types = match &set.kind {
        SetKind::Map(types) => types.as_slice(),
        _ => &[],
    };
    let integer = set
        .key
        .iter()
        .chain(data_types)
        .any(|t| *t == DataType::Integer);
    if set.typeof_decl.is_none() && integer {
        return Err(encode_err(
            &format!("set {}", set.name),
            "unqualified type integer cannot be declared (use typeof)".into(),
        ));
    }
    Ok(())
}

/// The set's flags but the map flag: interval (with concat for a `concat` key), timeout,
/// dynamic.
fn key_flags(set: &Set, concat: bool) -> u32 {
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
    flags
}

/// The key's and data's `typeof` in the set's user data, as nft writes them: the declared
/// expressions, else the concatenation marker for a concatenated key or data.
fn put_typeof(set: &Set, concat: bool, u: &mut Udata) {
    if let Some(decl) = &set.typeof_decl {
        u.nest(udata::SET_KEY_TYPEOF, |u| key_typeof(&decl.key, u));
        if !decl.data.is_empty() {
            u.nest(udata::SET_DATA_TYPEOF, |u| key_typeof(&decl.data, u));
        }
    } else {
        if concat {
            u.nest(udata::SET_KEY_TYPEOF, concat_typeof);
        }
        if let SetKind::Map(types) = &set.kind
            && types.len() > 1
        {
            u.nest(udata::SET_DATA_TYPEOF, concat_typeof);
        }
    }
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

/// Key byte order of an anonymous set keyed by `fields` (nft takes the expression's).
pub fn expr_byteorder(fields: &[FieldInfo]) -> ByteOrder {
    match fields {
        [one] => one.byteorder,
        _ => ByteOrder::Invalid,
    }
}

/// A verdict map keyed `ip daddr . meta l4proto . th dport`, an element for TCP port 80 of
/// each address (a test fixture for the encoders).
#[cfg(test)]
pub(super) fn tcp_80_vmap(elems: impl IntoIterator<Item = (std::net::Ipv4Addr, Verdict)>) -> Set {
    use crate::nft::ir::{ElemData, Value};
    let mut vm = Set::new(
        "vm",
        vec![
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ],
        SetKind::VerdictMap,
    );
    for (addr, verdict) in elems {
        vm.insert_mapping(
            vec![
                Value::Ipv4(addr).into(),
                Value::Proto(6).into(),
                Value::Port(80).into(),
            ],
            ElemData::Verdict(verdict),
        );
    }
    vm
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn declarations_match_nft_userdata() {
        let vm = tcp_80_vmap([(Ipv4Addr::new(10, 1, 1, 1), Verdict::Accept)]);
        let spec = named_set_spec(&vm, 1).unwrap();
        assert_eq!((spec.flags, spec.key_type, spec.key_len), (8, 0x730d, 12));
        assert_eq!(spec.data, Some((0xffff_ff00, 0)));
        // Bytes from `nft --debug=mnl` for the same declaration.
        let want: &[u8] = b"\x00\x04\x00\x00\x00\x00\x01\x04\x00\x00\x00\x00\x03\x08\x00\x04\
                            \x0d\x00\x00\x00\x01\x00\x06\x04\x00\x00\x00\x00";
        assert_eq!(spec.udata, want);
    }
}
