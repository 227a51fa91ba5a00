//! Statement lowering: IR statements -> the kernel expressions nft 1.0.6 generates for the
//! text `render.rs` prints (same registers, same dependencies, same anonymous sets).

use super::elems::{
    ElemChunk, ElemLayout, ElemMode, Element, encode_elements, field_needs_hton, is_single_value,
    key_bounds,
};
use super::expr::*;
use super::set::{
    self, NFT_SET_ANONYMOUS, NFT_SET_CONCAT, NFT_SET_CONSTANT, NFT_SET_INTERVAL, NFT_SET_MAP,
    SetSpec, verdict_code,
};
use super::types::{
    ByteOrder, FieldInfo, IP6_FRAG_OFF_MASK, Load, NFT_PAYLOAD_LL_HEADER, concat_info, encode_err,
    field_info, ifname_wildcard, key_typeof, nfproto, value_bytes, verdict_typeof,
};
use super::udata::{self, Udata};
use crate::nft::engine::NftError;
use crate::nft::ir::*;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What the rule knows about the sets it may reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownSet {
    pub interval: bool,
    pub key: Vec<DataType>,
    pub kind: SetKind,
    /// Set id when the set is created in this batch (`NFTA_*_SET_ID`).
    pub id: Option<u32>,
}

/// An anonymous set (or map) created right before the rule that uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonSet {
    pub spec: SetSpec,
    pub elems: Vec<ElemChunk>,
}

#[derive(Debug, Default)]
pub struct LoweredRule {
    pub anon: Vec<AnonSet>,
    pub exprs: Vec<Expr>,
}

/// Whether an anonymous set needs the interval flag (nft decides from its elements).
fn any_interval<'a>(mut parts: impl Iterator<Item = &'a KeyPart>) -> Result<bool, NftError> {
    parts.try_fold(false, |acc, p| Ok(acc || !is_single_value(p)?))
}

/// What earlier statements established (nft's protocol context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L4 {
    Unknown,
    /// `meta l4proto <p>`.
    Exact(u8),
    /// A set lookup on `meta l4proto`: some transport protocol.
    Some,
}

pub struct RuleLowering<'a> {
    /// The table's family: it decides how a network-header dependency is expressed.
    table: Family,
    sets: &'a BTreeMap<String, KnownSet>,
    next_set_id: &'a mut u32,
    family: Option<IpFamily>,
    l4: L4,
    out: LoweredRule,
}

/// Lowers one rule. `next_set_id` numbers anonymous sets after the named ones, like nft.
pub fn lower_rule(
    rule: &Rule,
    table: Family,
    sets: &BTreeMap<String, KnownSet>,
    next_set_id: &mut u32,
) -> Result<LoweredRule, NftError> {
    let mut l = RuleLowering {
        table,
        sets,
        next_set_id,
        family: None,
        l4: L4::Unknown,
        out: LoweredRule::default(),
    };
    for stmt in &rule.stmts {
        l.stmt(stmt)?;
    }
    Ok(l.out)
}

use super::types::NFT_META_PROTOCOL;

/// ETH_P_IP / ETH_P_IPV6.
fn ethertype(fam: IpFamily) -> u16 {
    match fam {
        IpFamily::V4 => 0x0800,
        IpFamily::V6 => 0x86dd,
    }
}

impl RuleLowering<'_> {
    fn push(&mut self, e: Expr) {
        self.out.exprs.push(e);
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), NftError> {
        match s {
            Stmt::Match(m) => self.matches(m)?,
            Stmt::Counter => self.push(Expr::Counter),
            Stmt::Log { prefix, group } => {
                let prefix = crate::nft::render::sanitize_text(prefix);
                let group = *group;
                self.push(Expr::Log { prefix, group });
            }
            Stmt::Vmap { key, map } => self.vmap(key, map)?,
            Stmt::Nat(nat) => self.nat(nat)?,
            Stmt::Masquerade { fully_random } => {
                let flags = if *fully_random {
                    NF_NAT_RANGE_PROTO_RANDOM_FULLY
                } else {
                    0
                };
                self.push(Expr::Masq { flags });
            }
            Stmt::DscpSet { family, dscp } => self.dscp(*family, *dscp)?,
            Stmt::Tproxy { family, port } => self.tproxy(*family, *port),
            Stmt::MarkSet(mark) => {
                self.meta_set(super::types::NFT_META_MARK, mark.to_ne_bytes().to_vec())
            }
            Stmt::Trace => self.meta_set(super::types::NFT_META_NFTRACE, vec![1]),
            Stmt::MarkOr(bits) => self.mark_bitwise(!bits, *bits),
            Stmt::MarkAnd(mask) => self.mark_bitwise(*mask, 0),
            Stmt::SetUpdate { set, key, timeout } => self.set_update(set, key, *timeout)?,
            Stmt::SetLimit { set, key, limit } => self.set_limit(set, key, limit)?,
            Stmt::Reject(r) => self.reject(*r)?,
            Stmt::Verdict(v) => {
                let (code, chain) = verdict_code(v);
                self.push(Expr::Verdict {
                    code,
                    chain: chain.map(str::to_string),
                });
            }
        }
        Ok(())
    }

    /// `tproxy to :port`: the port in a register, then the tproxy expression.
    fn tproxy(&mut self, family: IpFamily, port: u16) {
        let reg_port = kernel_reg(NFT_REG_1);
        self.push(Expr::Immediate {
            dreg: reg_port,
            data: port.to_be_bytes().to_vec(),
        });
        self.push(Expr::Tproxy {
            family: u32::from(nfproto(family)),
            reg_port,
        });
    }

    /// `meta KEY set VALUE` (`mark`, `nftrace`): the value in a register, then the meta
    /// write.
    fn meta_set(&mut self, key: u32, data: Vec<u8>) {
        let sreg = kernel_reg(NFT_REG_1);
        self.push(Expr::Immediate { dreg: sreg, data });
        self.push(Expr::MetaSet { key, sreg });
    }

    /// Loads `key` for an update of `set`: its register, and the set's id when it is created
    /// in the same batch.
    fn dynset_key(&mut self, set: &str, key: &[Field]) -> Result<(u32, Option<u32>), NftError> {
        let fields = self.key_fields(key)?;
        let sreg = self.load_key(&fields, false);
        Ok((sreg, self.sets.get(set).and_then(|s| s.id)))
    }

    /// `update @set { key [timeout T] }`.
    fn set_update(
        &mut self,
        set: &str,
        key: &[Field],
        timeout: Option<u32>,
    ) -> Result<(), NftError> {
        let (sreg, set_id) = self.dynset_key(set, key)?;
        self.push(Expr::DynsetUpdate {
            sreg,
            set: set.to_string(),
            set_id,
            timeout_ms: timeout.map(|s| u64::from(s) * 1000),
        });
        Ok(())
    }

    /// `update @set { key limit rate over N/second burst B packets }`.
    fn set_limit(&mut self, set: &str, key: &[Field], limit: &Limit) -> Result<(), NftError> {
        if limit.per_second == 0 || limit.burst == 0 {
            // The kernel would turn a zero burst into 5 (and read back differently).
            return Err(encode_err(
                &format!("limit on @{set}"),
                "rate and burst must be at least 1".into(),
            ));
        }
        let (sreg, set_id) = self.dynset_key(set, key)?;
        self.push(Expr::DynsetLimit {
            sreg,
            set: set.to_string(),
            set_id,
            rate: u64::from(limit.per_second),
            unit: 1,
            burst: limit.burst,
            flags: NFT_LIMIT_F_INV,
        });
        Ok(())
    }

    /// Field infos of a key, with the `meta nfproto` dependency emitted first if needed.
    fn key_fields(&mut self, key: &[Field]) -> Result<Vec<FieldInfo>, NftError> {
        if key.is_empty() {
            return Err(encode_err("statement", "empty key".into()));
        }
        if key.contains(&Field::Ip6FragOff) {
            return Err(encode_err(
                "frag frag-off",
                "only compared with == or != a value".into(),
            ));
        }
        let infos: Vec<FieldInfo> = key.iter().map(|f| field_info(*f)).collect();
        for fam in infos.iter().filter_map(|i| i.family) {
            self.need_family(fam)?;
        }
        Ok(infos)
    }

    /// `frag frag-off == / != value`: the 13 bits masked out of their 16-bit load, the
    /// value shifted to them. As the first network field of a bridge rule, nft checks the
    /// frame's `ether type` (a link-header load) instead of `meta protocol`.
    fn ip6_frag_off(&mut self, v: &Value, eq: bool) -> Result<(), NftError> {
        let Value::Port(off) = v else {
            return Err(encode_err("frag frag-off", format!("not an offset: {v:?}")));
        };
        if *off > 0x1fff {
            return Err(encode_err(
                "frag frag-off",
                format!("{off} exceeds 13 bits"),
            ));
        }
        if self.family.is_none() && self.table == Family::Bridge {
            let reg = kernel_reg(NFT_REG_1);
            self.push(Expr::Payload {
                base: NFT_PAYLOAD_LL_HEADER,
                offset: 12,
                len: 2,
                dreg: reg,
            });
            self.push(Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: reg,
                data: ethertype(IpFamily::V6).to_be_bytes().to_vec(),
            });
            self.family = Some(IpFamily::V6);
        }
        self.need_family(IpFamily::V6)?;
        let info = field_info(Field::Ip6FragOff);
        let reg = self.load_key(&[info], false);
        self.push(Expr::Bitwise {
            reg,
            mask: IP6_FRAG_OFF_MASK.to_be_bytes().to_vec(),
            xor: vec![0; 2],
            with_op: true,
        });
        self.push(Expr::Cmp {
            op: if eq { NFT_CMP_EQ } else { NFT_CMP_NEQ },
            sreg: reg,
            data: (off << 3).to_be_bytes().to_vec(),
        });
        Ok(())
    }

    /// A network-header field needs its protocol checked first, once: `meta nfproto <family>`
    /// in an inet table, `meta protocol <ethertype>` in a bridge table (what nft emits; a
    /// bridge packet's nfproto is always `bridge`).
    fn need_family(&mut self, fam: IpFamily) -> Result<(), NftError> {
        match self.family {
            Some(have) if have == fam => Ok(()),
            Some(have) => Err(encode_err(
                "rule",
                format!("conflicting protocols: {have:?} then {fam:?}"),
            )),
            None => {
                let reg = kernel_reg(NFT_REG_1);
                let (key, data) = match self.table {
                    Family::Inet => (super::types::NFT_META_NFPROTO, vec![nfproto(fam)]),
                    Family::Bridge => (NFT_META_PROTOCOL, ethertype(fam).to_be_bytes().to_vec()),
                };
                self.push(Expr::Meta { key, dreg: reg });
                self.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    sreg: reg,
                    data,
                });
                self.family = Some(fam);
                Ok(())
            }
        }
    }

    fn load(&mut self, f: &FieldInfo, slot: u32, len: usize) {
        let dreg = kernel_reg(slot);
        self.push(match f.load {
            Load::Meta(key) => Expr::Meta { key, dreg },
            Load::Payload { base, offset } => Expr::Payload {
                base,
                offset,
                len: len as u32,
                dreg,
            },
            Load::Ct(key) => Expr::Ct { key, dreg },
            Load::Fib { flags, result } => Expr::Fib {
                flags,
                result,
                dreg,
            },
            Load::Numgen { modulus } => Expr::Numgen { modulus, dreg },
            Load::Exthdr { kind, offset } => Expr::Exthdr {
                kind,
                offset,
                len: len as u32,
                dreg,
            },
        });
        if let Some(mask) = f.mask {
            // nft names the boolean op of an explicit `field & mask` binop.
            self.push(Expr::Bitwise {
                reg: dreg,
                mask: mask.to_vec(),
                xor: vec![0; mask.len()],
                with_op: true,
            });
        }
    }

    /// `meta mark set meta mark and MASK xor XOR` (nft's lowering of `or` / `and`; nft
    /// names the boolean op explicitly in statements, unlike in matches).
    fn mark_bitwise(&mut self, mask: u32, xor: u32) {
        let reg = kernel_reg(NFT_REG_1);
        self.push(Expr::Meta {
            key: super::types::NFT_META_MARK,
            dreg: reg,
        });
        self.push(Expr::Bitwise {
            reg,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
            with_op: true,
        });
        self.push(Expr::MetaSet {
            key: super::types::NFT_META_MARK,
            sreg: reg,
        });
    }

    /// Loads a (possibly concatenated) key from slot 1 on; `interval` adds the byte swap
    /// host-order integers need for interval lookups. Returns the kernel register.
    fn load_key(&mut self, fields: &[FieldInfo], interval: bool) -> u32 {
        let mut slot = NFT_REG_1;
        for f in fields {
            self.load(f, slot, f.len);
            if interval && field_needs_hton(f) {
                self.push(Expr::Hton {
                    reg: kernel_reg(slot),
                    len: f.len as u32,
                });
            }
            slot += (f.len as u32).div_ceil(4);
        }
        kernel_reg(NFT_REG_1)
    }

    fn matches(&mut self, m: &Match) -> Result<(), NftError> {
        match &m.op {
            MatchOp::Eq(vals) | MatchOp::Ne(vals) => {
                let eq = matches!(m.op, MatchOp::Eq(_));
                match (m.key.as_slice(), vals.as_slice()) {
                    ([f], [v]) => self.compare(*f, v, eq),
                    _ => Err(encode_err(
                        "match",
                        "use concatenations with sets and maps, not singleton values (nft 1.0.6)"
                            .into(),
                    )),
                }
            }
            MatchOp::AnyFlag(bits) => {
                let [f] = m.key.as_slice() else {
                    return Err(encode_err("flag match", "needs one field".into()));
                };
                let fields = self.key_fields(&[*f])?;
                let reg = self.load_key(&fields, false);
                let len = fields[0].len;
                let mut mask = vec![0; len];
                mask.copy_from_slice(&bits.to_ne_bytes()[..len]);
                // `ct state a,b` is a flag match; `meta mark & X != 0` an explicit binop,
                // for which nft names the boolean op.
                self.push(Expr::Bitwise {
                    reg,
                    mask,
                    xor: vec![0; len],
                    with_op: *f != Field::CtState,
                });
                self.push(Expr::Cmp {
                    op: NFT_CMP_NEQ,
                    sreg: reg,
                    data: vec![0; len],
                });
                Ok(())
            }
            MatchOp::Masked { mask, value, eq } => {
                let [f] = m.key.as_slice() else {
                    return Err(encode_err("masked match", "needs one field".into()));
                };
                let fields = self.key_fields(&[*f])?;
                let info = fields[0];
                let mask = value_bytes(mask, info.key_type)?;
                let data = value_bytes(value, info.key_type)?;
                let reg = self.load_key(&fields, false);
                self.push(Expr::Bitwise {
                    reg,
                    xor: vec![0; mask.len()],
                    mask,
                    with_op: true,
                });
                self.push(Expr::Cmp {
                    op: if *eq { NFT_CMP_EQ } else { NFT_CMP_NEQ },
                    sreg: reg,
                    data,
                });
                Ok(())
            }
            MatchOp::InSet(name) | MatchOp::NotInSet(name) => {
                let invert = matches!(m.op, MatchOp::NotInSet(_));
                if m.key == [Field::L4Proto] && !invert {
                    self.l4 = L4::Some;
                }
                let fields = self.key_fields(&m.key)?;
                let known = self.sets.get(name);
                let sreg = self.load_key(&fields, known.is_some_and(|s| s.interval));
                self.push(Expr::Lookup {
                    sreg,
                    dreg: None,
                    set: name.clone(),
                    set_id: known.and_then(|s| s.id),
                    invert,
                });
                Ok(())
            }
            MatchOp::InAnon(elems) => self.in_anon(&m.key, elems),
        }
    }

    /// `field value` / `field != value`; also sets the protocol context like nft.
    fn compare(&mut self, f: Field, v: &Value, eq: bool) -> Result<(), NftError> {
        if f == Field::Ip6FragOff {
            return self.ip6_frag_off(v, eq);
        }
        let fields = self.key_fields(&[f])?;
        let info = fields[0];
        let data = match ifname_wildcard(v)? {
            Some(prefix) if info.string => prefix,
            _ => value_bytes(v, info.key_type)?,
        };
        let reg = self.load_key(&fields, false);
        self.push(Expr::Cmp {
            op: if eq { NFT_CMP_EQ } else { NFT_CMP_NEQ },
            sreg: reg,
            data,
        });
        if eq {
            match (f, v) {
                (Field::NfProto, Value::NfProto(fam)) => self.family = Some(*fam),
                (Field::L4Proto, Value::Proto(p)) => self.l4 = L4::Exact(*p),
                _ => {}
            }
        }
        Ok(())
    }

    /// `key { a, b }`: nft turns a single plain element into a compare, a single prefix
    /// into a (shortened) masked compare and a single range into two compares.
    fn in_anon(&mut self, key: &[Field], elems: &[ElemKey]) -> Result<(), NftError> {
        if elems.is_empty() {
            return Err(encode_err("anonymous set", "no elements".into()));
        }
        if let ([f], [elem]) = (key, elems)
            && let [part] = elem.as_slice()
        {
            return match part {
                KeyPart::Value(v) => self.compare(*f, v, true),
                KeyPart::Prefix(net) => self.prefix(*f, net),
                KeyPart::Range(a, b) => self.range(*f, a, b),
            };
        }
        if key == [Field::L4Proto] {
            self.l4 = L4::Some;
        }
        let fields = self.key_fields(key)?;
        let interval = any_interval(elems.iter().flatten())?;
        let layout = ElemLayout::new(
            fields.iter().map(|f| f.key_type).collect(),
            interval,
            SetKind::Set,
        )?;
        let specs = encode_elements(
            &layout,
            elems.iter().map(|k| Element {
                key: k,
                value: None,
                src: 0,
            }),
            ElemMode::Create,
            true,
        )?;
        let id = self.anon_set(key, &fields, &layout, specs, false)?;
        let sreg = self.load_key(&fields, interval);
        self.push(Expr::Lookup {
            sreg,
            dreg: None,
            set: "__set%d".into(),
            set_id: Some(id),
            invert: false,
        });
        Ok(())
    }

    fn prefix(&mut self, f: Field, net: &ipnet::IpNet) -> Result<(), NftError> {
        let fields = self.key_fields(&[f])?;
        let info = fields[0];
        let (start, _) = key_bounds(
            &ElemLayout::new(vec![info.key_type], true, SetKind::Set)?,
            &vec![KeyPart::Prefix(*net)],
        )?;
        let start = start.as_slice();
        let bits = net.prefix_len() as usize;
        if bits > 0 && bits.is_multiple_of(8) {
            // Byte-aligned: load just the prefix bytes and compare them.
            let len = bits / 8;
            self.load(&info, NFT_REG_1, len);
            self.push(Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: kernel_reg(NFT_REG_1),
                data: start[..len].to_vec(),
            });
        } else {
            let reg = self.load_key(&fields, false);
            let mut mask = vec![0u8; info.len];
            for (i, b) in mask.iter_mut().enumerate() {
                let have = bits.saturating_sub(i * 8).min(8);
                *b = (0xffu16 << (8 - have)) as u8;
            }
            self.push(Expr::Bitwise {
                reg,
                mask,
                xor: vec![0; info.len],
                with_op: false,
            });
            self.push(Expr::Cmp {
                op: NFT_CMP_EQ,
                sreg: reg,
                data: start.to_vec(),
            });
        }
        Ok(())
    }

    fn range(&mut self, f: Field, a: &Value, b: &Value) -> Result<(), NftError> {
        let fields = self.key_fields(&[f])?;
        let info = fields[0];
        let layout = ElemLayout::new(vec![info.key_type], true, SetKind::Set)?;
        let (lo, hi) = key_bounds(&layout, &vec![KeyPart::Range(a.clone(), b.clone())])?;
        let reg = self.load_key(&fields, true);
        self.push(Expr::Cmp {
            op: NFT_CMP_GTE,
            sreg: reg,
            data: lo.as_slice().to_vec(),
        });
        self.push(Expr::Cmp {
            op: NFT_CMP_LTE,
            sreg: reg,
            data: hi.as_slice().to_vec(),
        });
        Ok(())
    }

    /// Declares an anonymous set/map the way nft does and returns its set id.
    fn anon_set(
        &mut self,
        key: &[Field],
        fields: &[FieldInfo],
        layout: &ElemLayout,
        elems: super::elems::ElemChunks,
        verdict_map: bool,
    ) -> Result<u32, NftError> {
        let types: Vec<DataType> = fields.iter().map(|f| f.key_type).collect();
        let info = concat_info(&types)?;
        let concat = key.len() > 1;
        let mut flags = NFT_SET_ANONYMOUS | NFT_SET_CONSTANT;
        if layout.interval {
            flags |= NFT_SET_INTERVAL;
            if concat {
                flags |= NFT_SET_CONCAT;
            }
        }
        let mut u = Udata::default();
        u.put_byteorder(udata::SET_KEYBYTEORDER, set::expr_byteorder(fields));
        if verdict_map {
            flags |= NFT_SET_MAP;
            u.put_byteorder(udata::SET_DATABYTEORDER, ByteOrder::Invalid);
            if concat {
                u.nest(udata::SET_KEY_TYPEOF, |u| key_typeof(key, u));
            }
            u.nest(udata::SET_DATA_TYPEOF, verdict_typeof);
            u.put_u32(udata::SET_DATA_INTERVAL, 0);
        } else {
            if layout.interval {
                u.put_u32(udata::SET_MERGE_ELEMENTS, 1);
            }
            u.nest(udata::SET_KEY_TYPEOF, |u| key_typeof(key, u));
        }
        let id = *self.next_set_id;
        *self.next_set_id += 1;
        let spec = SetSpec {
            name: if verdict_map { "__map%d" } else { "__set%d" }.into(),
            flags,
            key_type: info.id,
            key_len: info.len as u32,
            data: verdict_map.then_some((0xffff_ff00, 0)),
            id,
            timeout_ms: None,
            desc_size: Some(elems.count() as u32),
            concat_fields: if flags & NFT_SET_CONCAT != 0 {
                set::field_lengths(&types)?
            } else {
                Vec::new()
            },
            udata: u.into_bytes(),
            counter: false,
        };
        self.out.anon.push(AnonSet {
            spec,
            elems: elems.finish(),
        });
        Ok(id)
    }

    fn vmap(&mut self, key: &[Field], map: &MapRef) -> Result<(), NftError> {
        let fields = self.key_fields(key)?;
        let (name, set_id, interval) = match map {
            MapRef::Named(name) => {
                let known = self.sets.get(name);
                (
                    name.clone(),
                    known.and_then(|s| s.id),
                    known.is_some_and(|s| s.interval),
                )
            }
            MapRef::Anon(entries) => {
                if entries.is_empty() {
                    return Err(encode_err("anonymous verdict map", "no elements".into()));
                }
                let interval = any_interval(entries.iter().flat_map(|(k, _)| k))?;
                let layout = ElemLayout::new(
                    fields.iter().map(|f| f.key_type).collect(),
                    interval,
                    SetKind::VerdictMap,
                )?;
                let values: Vec<ElemValue> = entries
                    .iter()
                    .map(|(_, v)| ElemValue {
                        data: Some(ElemData::Verdict(v.clone())),
                        ..Default::default()
                    })
                    .collect();
                let specs = encode_elements(
                    &layout,
                    entries.iter().zip(&values).map(|((k, _), v)| Element {
                        key: k,
                        value: Some(v),
                        src: 0,
                    }),
                    ElemMode::Create,
                    false,
                )?;
                let id = self.anon_set(key, &fields, &layout, specs, true)?;
                ("__map%d".to_string(), Some(id), interval)
            }
        };
        let sreg = self.load_key(&fields, interval);
        self.push(Expr::Lookup {
            sreg,
            dreg: Some(NFT_REG_VERDICT),
            set: name,
            set_id,
            invert: false,
        });
        Ok(())
    }

    fn nat(&mut self, nat: &Nat) -> Result<(), NftError> {
        let kind = match nat.kind {
            NatKind::Snat => NFT_NAT_SNAT,
            NatKind::Dnat => NFT_NAT_DNAT,
        };
        let reg_addr = kernel_reg(NFT_REG_1);
        let (reg_proto, flags) = match &nat.addr {
            NatAddr::Fixed(addr, port) => self.nat_to(*addr, *port, nat.family, reg_addr)?,
            NatAddr::Map { key, map } => (self.nat_map(key, map, nat.family, reg_addr)?, 0),
        };
        self.push(Expr::Nat {
            kind,
            family: u32::from(nfproto(nat.family)),
            reg_addr,
            reg_proto,
            flags,
        });
        Ok(())
    }

    /// `to ADDR[:PORT]`: the address into `reg_addr`, the port into the next 128-bit
    /// register; returns the port's register and the nat flags.
    fn nat_to(
        &mut self,
        addr: IpAddr,
        port: Option<u16>,
        family: IpFamily,
        reg_addr: u32,
    ) -> Result<(Option<u32>, u32), NftError> {
        let data = match (addr, family) {
            (IpAddr::V4(a), IpFamily::V4) => a.octets().to_vec(),
            (IpAddr::V6(a), IpFamily::V6) => a.octets().to_vec(),
            _ => {
                return Err(encode_err(
                    &format!("nat to {addr}"),
                    "address family differs from the nat family".into(),
                ));
            }
        };
        self.push(Expr::Immediate {
            dreg: reg_addr,
            data,
        });
        let Some(port) = port else {
            return Ok((None, 0));
        };
        if self.l4 == L4::Unknown {
            return Err(encode_err(
                &format!("nat to {addr} port {port}"),
                "transport protocol mapping is only valid after transport protocol match".into(),
            ));
        }
        // The next 128-bit register (slot 5).
        let reg = kernel_reg(NFT_REG_1 + 4);
        self.push(Expr::Immediate {
            dreg: reg,
            data: port.to_be_bytes().to_vec(),
        });
        Ok((Some(reg), NF_NAT_RANGE_PROTO_SPECIFIED))
    }

    /// `to KEY map @MAP`: the lookup of `key` in `map` into `reg_addr`; returns the port's
    /// register when the map's data is `addr . port`.
    fn nat_map(
        &mut self,
        key: &[Field],
        map: &str,
        family: IpFamily,
        reg_addr: u32,
    ) -> Result<Option<u32>, NftError> {
        let fields = self.key_fields(key)?;
        let known = self.sets.get(map);
        let mut reg_proto = None;
        if let Some(SetKind::Map(data)) = known.map(|s| &s.kind) {
            let (want, slots) = match family {
                IpFamily::V4 => (DataType::Ipv4Addr, 1),
                IpFamily::V6 => (DataType::Ipv6Addr, 4),
            };
            match data.as_slice() {
                [a] if *a == want => {}
                // `addr . port` data: the port lands in the 32-bit register right after the
                // address.
                [a, DataType::InetService] if *a == want => {
                    reg_proto = Some(kernel_reg(NFT_REG_1 + slots));
                }
                _ => {
                    return Err(encode_err(
                        &format!("nat map @{map}"),
                        "map data must be an address of the nat family, optionally with a port"
                            .into(),
                    ));
                }
            }
        }
        let interval = known.is_some_and(|s| s.interval);
        let sreg = self.load_key(&fields, interval);
        self.push(Expr::Lookup {
            sreg,
            dreg: Some(reg_addr),
            set: map.to_string(),
            set_id: known.and_then(|s| s.id),
            invert: false,
        });
        Ok(reg_proto)
    }

    /// `ip dscp set N` rewrites the 6 DSCP bits of the 16-bit word at the start of the
    /// header, keeping ECN; IPv4 also fixes the header checksum.
    fn dscp(&mut self, family: IpFamily, dscp: u8) -> Result<(), NftError> {
        if dscp > 63 {
            return Err(encode_err(&format!("dscp {dscp}"), "must be 0..=63".into()));
        }
        self.need_family(family)?;
        let (mask, xor, csum) = match family {
            IpFamily::V4 => (
                vec![0xff, 0x03],
                vec![0, dscp << 2],
                Some((NFT_PAYLOAD_CSUM_INET, 10)),
            ),
            IpFamily::V6 => (vec![0xf0, 0x3f], vec![dscp >> 2, (dscp & 3) << 6], None),
        };
        let reg = kernel_reg(NFT_REG_1);
        let base = super::types::NFT_PAYLOAD_NETWORK_HEADER;
        self.push(Expr::Payload {
            base,
            offset: 0,
            len: 2,
            dreg: reg,
        });
        self.push(Expr::Bitwise {
            reg,
            mask,
            xor,
            with_op: true,
        });
        self.push(Expr::PayloadSet {
            base,
            offset: 0,
            len: 2,
            sreg: reg,
            csum,
        });
        Ok(())
    }

    fn reject(&mut self, r: Reject) -> Result<(), NftError> {
        let (kind, code) = match r {
            Reject::TcpReset => {
                match self.l4 {
                    L4::Exact(proto::TCP) => {}
                    L4::Exact(p) => {
                        return Err(encode_err(
                            "reject with tcp reset",
                            format!("conflicts with the transport protocol match ({p})"),
                        ));
                    }
                    // nft adds the `meta l4proto tcp` dependency itself.
                    _ => self.compare(Field::L4Proto, &Value::Proto(proto::TCP), true)?,
                }
                (NFT_REJECT_TCP_RST, 0)
            }
            Reject::AdminProhibited => {
                (NFT_REJECT_ICMPX_UNREACH, NFT_REJECT_ICMPX_ADMIN_PROHIBITED)
            }
            // With a known network protocol nft picks the family's own ICMP code.
            Reject::PortUnreachable => match self.family {
                Some(IpFamily::V4) => (NFT_REJECT_ICMP_UNREACH, ICMP_PORT_UNREACH),
                Some(IpFamily::V6) => (NFT_REJECT_ICMP_UNREACH, ICMPV6_PORT_UNREACH),
                None => (NFT_REJECT_ICMPX_UNREACH, NFT_REJECT_ICMPX_PORT_UNREACH),
            },
        };
        self.push(Expr::Reject { kind, code });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
