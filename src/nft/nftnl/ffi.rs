//! The FFI boundary: libnftnl objects built from the pure message specs and serialised
//! into an `nftnl::Batch`. Every libnftnl call of the crate is in this file.
//!
//! Invariants the SAFETY comments rely on:
//! - objects come from the matching `nftnl_*_alloc` (non-null, checked) and are freed
//!   exactly once by their RAII owner, unless ownership moved into a parent object
//!   (`nftnl_rule_add_expr`, `nftnl_set_elem_add`), after which only the parent is freed;
//! - libnftnl copies every string and buffer it is given (`*_set_str`, `*_set_data`), so
//!   Rust values only need to live for the duration of the call;
//! - `nftnl::Batch::add` hands `write` a buffer of at least `nft_nlmsg_maxsize()` bytes,
//!   and the lowering keeps every message below that (element lists are split at the
//!   64 KiB attribute limit, like nft does).

// The crate denies unsafe code (Cargo.toml [lints]); libnftnl is only reachable through FFI.
#![allow(unsafe_code)]

use super::expr::Expr;
use super::lower::{Msg, MsgBody};
use super::reply::NLA_F_NESTED;
use super::set::SetSpec;
use crate::nft::ir::Family;
use mnl::mnl_sys;
use nftnl::{Batch, FinalizedBatch, MsgType, NlMsg};
use nftnl_sys::{self as sys, libc};
use std::cell::Cell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::NonNull;

uapi!(u16: NLM_F_CREATE, NLM_F_APPEND);
uapi!(u32: NFT_BYTEORDER_HTON, NFT_LOOKUP_F_INV, NFT_DYNSET_OP_UPDATE);
const NFT_EXTHDR_OP_IPV6: u32 = 0;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub(super) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;

/// Names were checked for NUL bytes by the lowering; a NUL here would be a bug, and the
/// kernel then sees an empty name and rejects the message.
fn cstring(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

macro_rules! owner {
    ($name:ident, $ty:ty, $alloc:path, $free:path, $set_str:path) => {
        struct $name(NonNull<$ty>);

        impl $name {
            fn new() -> Self {
                // SAFETY: plain allocation with no preconditions; null (OOM) is handled
                // like Rust's own allocation failure.
                let p = unsafe { $alloc() };
                $name(NonNull::new(p).unwrap_or_else(|| std::process::abort()))
            }

            fn ptr(&self) -> *mut $ty {
                self.0.as_ptr()
            }

            /// Sets a string attribute.
            fn str(&self, attr: u32, v: &CStr) -> &Self {
                // SAFETY: valid object of the setter's type; `v` is a valid C string for
                // the call and libnftnl copies it.
                unsafe { $set_str(self.ptr(), attr as u16, v.as_ptr()) };
                self
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: allocated by the matching alloc, not freed elsewhere (see the
                // module invariants: owners that hand their pointer over are forgotten).
                unsafe { $free(self.0.as_ptr()) }
            }
        }
    };
}

owner!(
    TableObj,
    sys::nftnl_table,
    sys::nftnl_table_alloc,
    sys::nftnl_table_free,
    sys::nftnl_table_set_str
);
owner!(
    ChainObj,
    sys::nftnl_chain,
    sys::nftnl_chain_alloc,
    sys::nftnl_chain_free,
    sys::nftnl_chain_set_str
);
owner!(
    RuleObj,
    sys::nftnl_rule,
    sys::nftnl_rule_alloc,
    sys::nftnl_rule_free,
    sys::nftnl_rule_set_str
);
owner!(
    SetObj,
    sys::nftnl_set,
    sys::nftnl_set_alloc,
    sys::nftnl_set_free,
    sys::nftnl_set_set_str
);

/// One expression being built; handed over to its rule with `add_to`.
struct ExprObj(NonNull<sys::nftnl_expr>);

impl ExprObj {
    fn new(name: &CStr) -> Self {
        // SAFETY: `name` is a valid C string for the duration of the call.
        let p = unsafe { sys::nftnl_expr_alloc(name.as_ptr()) };
        ExprObj(NonNull::new(p).unwrap_or_else(|| std::process::abort()))
    }

    fn u32(self, attr: u32, v: u32) -> Self {
        // SAFETY: valid expression; libnftnl ignores attributes foreign to the expression.
        unsafe { sys::nftnl_expr_set_u32(self.0.as_ptr(), attr as u16, v) };
        self
    }

    fn u16(self, attr: u32, v: u16) -> Self {
        // SAFETY: as in `u32`.
        unsafe { sys::nftnl_expr_set_u16(self.0.as_ptr(), attr as u16, v) };
        self
    }

    fn u8(self, attr: u32, v: u8) -> Self {
        // SAFETY: as in `u32`.
        unsafe { sys::nftnl_expr_set_u8(self.0.as_ptr(), attr as u16, v) };
        self
    }

    fn data(self, attr: u32, v: &[u8]) -> Self {
        // SAFETY: `v` is valid for `v.len()` bytes during the call; libnftnl copies it.
        unsafe {
            sys::nftnl_expr_set(
                self.0.as_ptr(),
                attr as u16,
                v.as_ptr().cast::<c_void>(),
                v.len() as u32,
            )
        };
        self
    }

    fn u64(self, attr: u32, v: u64) -> Self {
        // SAFETY: as in `u32`.
        unsafe { sys::nftnl_expr_set_u64(self.0.as_ptr(), attr as u16, v) };
        self
    }

    /// Sets an optional attribute: `set` with the value, when there is one.
    fn maybe<T>(self, v: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match v {
            Some(v) => set(self, v),
            None => self,
        }
    }

    /// Sets an attribute nft writes only in some cases: when `write`.
    fn u32_if(self, write: bool, attr: u32, v: u32) -> Self {
        if write { self.u32(attr, v) } else { self }
    }

    /// Hands `inner` to this expression (a dynset's per-element expression).
    fn nest(self, attr: u32, inner: ExprObj) -> Self {
        let p = inner.0.as_ptr();
        std::mem::forget(inner);
        // SAFETY: both valid; for `NFTNL_EXPR_DYNSET_EXPR` libnftnl takes the pointer (not
        // a copy) into the dynset's expression list and frees it with the dynset.
        unsafe { sys::nftnl_expr_set(self.0.as_ptr(), attr as u16, p.cast::<c_void>(), 0) };
        self
    }

    fn str(self, attr: u32, v: &str) -> Self {
        let v = cstring(v);
        // SAFETY: valid C string for the call; libnftnl copies it.
        unsafe { sys::nftnl_expr_set_str(self.0.as_ptr(), attr as u16, v.as_ptr()) };
        self
    }

    fn add_to(self, rule: &RuleObj) {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        // SAFETY: both valid; the rule takes ownership of the expression and frees it.
        unsafe { sys::nftnl_rule_add_expr(rule.ptr(), p) };
    }
}

impl Drop for ExprObj {
    fn drop(&mut self) {
        // SAFETY: still owned here (`add_to` forgets the owner before handing it over).
        unsafe { sys::nftnl_expr_free(self.0.as_ptr()) }
    }
}

/// One expression: the arms are split in three by what the expression does (each part
/// stays a readable table); the variants are listed here so a new one fails to compile.
fn build_expr(e: &Expr) -> ExprObj {
    match e {
        Expr::Meta { .. }
        | Expr::MetaSet { .. }
        | Expr::Payload { .. }
        | Expr::PayloadSet { .. }
        | Expr::Ct { .. }
        | Expr::Fib { .. }
        | Expr::Numgen { .. }
        | Expr::Exthdr { .. } => load_or_store(e),
        Expr::Cmp { .. }
        | Expr::Bitwise { .. }
        | Expr::Hton { .. }
        | Expr::Lookup { .. }
        | Expr::DynsetUpdate { .. }
        | Expr::DynsetLimit { .. } => compute_or_look_up(e),
        Expr::Immediate { .. }
        | Expr::Verdict { .. }
        | Expr::Counter
        | Expr::Log { .. }
        | Expr::Nat { .. }
        | Expr::Masq { .. }
        | Expr::Tproxy { .. }
        | Expr::Reject { .. } => statement(e),
    }
}

/// Loads a packet, meta or conntrack field into a register, or stores one.
fn load_or_store(e: &Expr) -> ExprObj {
    match e {
        Expr::Meta { key, dreg } => ExprObj::new(c"meta")
            .u32(sys::NFTNL_EXPR_META_KEY, *key)
            .u32(sys::NFTNL_EXPR_META_DREG, *dreg),
        Expr::MetaSet { key, sreg } => ExprObj::new(c"meta")
            .u32(sys::NFTNL_EXPR_META_KEY, *key)
            .u32(sys::NFTNL_EXPR_META_SREG, *sreg),
        Expr::Payload {
            base,
            offset,
            len,
            dreg,
        } => ExprObj::new(c"payload")
            .u32(sys::NFTNL_EXPR_PAYLOAD_DREG, *dreg)
            .u32(sys::NFTNL_EXPR_PAYLOAD_BASE, *base)
            .u32(sys::NFTNL_EXPR_PAYLOAD_OFFSET, *offset)
            .u32(sys::NFTNL_EXPR_PAYLOAD_LEN, *len),
        Expr::PayloadSet {
            base,
            offset,
            len,
            sreg,
            csum,
        } => ExprObj::new(c"payload")
            .u32(sys::NFTNL_EXPR_PAYLOAD_SREG, *sreg)
            .u32(sys::NFTNL_EXPR_PAYLOAD_BASE, *base)
            .u32(sys::NFTNL_EXPR_PAYLOAD_OFFSET, *offset)
            .u32(sys::NFTNL_EXPR_PAYLOAD_LEN, *len)
            .maybe(*csum, |e, (kind, off)| {
                e.u32(sys::NFTNL_EXPR_PAYLOAD_CSUM_TYPE, kind)
                    .u32(sys::NFTNL_EXPR_PAYLOAD_CSUM_OFFSET, off)
            }),
        Expr::Ct { key, dreg } => ExprObj::new(c"ct")
            .u32(sys::NFTNL_EXPR_CT_KEY, *key)
            .u32(sys::NFTNL_EXPR_CT_DREG, *dreg),
        Expr::Fib {
            flags,
            result,
            dreg,
        } => ExprObj::new(c"fib")
            .u32(sys::NFTNL_EXPR_FIB_FLAGS, *flags)
            .u32(sys::NFTNL_EXPR_FIB_RESULT, *result)
            .u32(sys::NFTNL_EXPR_FIB_DREG, *dreg),
        Expr::Numgen { modulus, dreg } => ExprObj::new(c"numgen")
            .u32(sys::NFTNL_EXPR_NG_DREG, *dreg)
            .u32(sys::NFTNL_EXPR_NG_MODULUS, *modulus)
            .u32(sys::NFTNL_EXPR_NG_TYPE, super::types::NFT_NG_RANDOM)
            .u32(sys::NFTNL_EXPR_NG_OFFSET, 0),
        // nft sends the op (ipv6) and the flags (none) explicitly.
        Expr::Exthdr {
            kind,
            offset,
            len,
            dreg,
        } => ExprObj::new(c"exthdr")
            .u32(sys::NFTNL_EXPR_EXTHDR_DREG, *dreg)
            .u8(sys::NFTNL_EXPR_EXTHDR_TYPE, *kind)
            .u32(sys::NFTNL_EXPR_EXTHDR_OFFSET, *offset)
            .u32(sys::NFTNL_EXPR_EXTHDR_LEN, *len)
            .u32(sys::NFTNL_EXPR_EXTHDR_OP, NFT_EXTHDR_OP_IPV6)
            .u32(sys::NFTNL_EXPR_EXTHDR_FLAGS, 0),
        _ => unreachable!("{e:?} is not built by load_or_store"),
    }
}

/// Compares, transforms, looks up or updates register contents.
fn compute_or_look_up(e: &Expr) -> ExprObj {
    match e {
        Expr::Cmp { op, sreg, data } => ExprObj::new(c"cmp")
            .u32(sys::NFTNL_EXPR_CMP_SREG, *sreg)
            .u32(sys::NFTNL_EXPR_CMP_OP, *op)
            .data(sys::NFTNL_EXPR_CMP_DATA, data),
        // NFT_BITWISE_BOOL (0), written explicitly only where nft writes it.
        Expr::Bitwise {
            reg,
            mask,
            xor,
            with_op,
        } => ExprObj::new(c"bitwise")
            .u32(sys::NFTNL_EXPR_BITWISE_SREG, *reg)
            .u32(sys::NFTNL_EXPR_BITWISE_DREG, *reg)
            .u32(sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32)
            .data(sys::NFTNL_EXPR_BITWISE_MASK, mask)
            .data(sys::NFTNL_EXPR_BITWISE_XOR, xor)
            .u32_if(*with_op, sys::NFTNL_EXPR_BITWISE_OP, 0),
        Expr::Hton { reg, len } => ExprObj::new(c"byteorder")
            .u32(sys::NFTNL_EXPR_BYTEORDER_SREG, *reg)
            .u32(sys::NFTNL_EXPR_BYTEORDER_DREG, *reg)
            .u32(sys::NFTNL_EXPR_BYTEORDER_OP, NFT_BYTEORDER_HTON)
            .u32(sys::NFTNL_EXPR_BYTEORDER_LEN, *len)
            .u32(sys::NFTNL_EXPR_BYTEORDER_SIZE, *len),
        Expr::Lookup {
            sreg,
            dreg,
            set,
            set_id,
            invert,
        } => ExprObj::new(c"lookup")
            .u32(sys::NFTNL_EXPR_LOOKUP_SREG, *sreg)
            .str(sys::NFTNL_EXPR_LOOKUP_SET, set)
            .maybe(*dreg, |e, d| e.u32(sys::NFTNL_EXPR_LOOKUP_DREG, d))
            .maybe(*set_id, |e, id| e.u32(sys::NFTNL_EXPR_LOOKUP_SET_ID, id))
            .u32_if(*invert, sys::NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV),
        Expr::DynsetUpdate {
            sreg,
            set,
            set_id,
            timeout_ms,
        } => dynset(*sreg, set, *set_id).maybe(*timeout_ms, |e, ms| {
            e.u64(sys::NFTNL_EXPR_DYNSET_TIMEOUT, ms)
        }),
        // The limit's attributes are the ones nft 1.0.6 sets, in its order.
        Expr::DynsetLimit {
            sreg,
            set,
            set_id,
            rate,
            unit,
            burst,
            flags,
        } => {
            let limit = ExprObj::new(c"limit")
                .u64(sys::NFTNL_EXPR_LIMIT_RATE, *rate)
                .u64(sys::NFTNL_EXPR_LIMIT_UNIT, *unit)
                .u32(sys::NFTNL_EXPR_LIMIT_TYPE, super::expr::NFT_LIMIT_PKTS)
                .u32_if(*burst > 0, sys::NFTNL_EXPR_LIMIT_BURST, *burst)
                .u32(sys::NFTNL_EXPR_LIMIT_FLAGS, *flags);
            dynset(*sreg, set, *set_id).nest(sys::NFTNL_EXPR_DYNSET_EXPR, limit)
        }
        _ => unreachable!("{e:?} is not built by compute_or_look_up"),
    }
}

/// Data, verdicts and the statements that act on the packet.
fn statement(e: &Expr) -> ExprObj {
    match e {
        Expr::Immediate { dreg, data } => ExprObj::new(c"immediate")
            .u32(sys::NFTNL_EXPR_IMM_DREG, *dreg)
            .data(sys::NFTNL_EXPR_IMM_DATA, data),
        Expr::Verdict { code, chain } => ExprObj::new(c"immediate")
            .u32(sys::NFTNL_EXPR_IMM_DREG, super::expr::NFT_REG_VERDICT)
            .u32(sys::NFTNL_EXPR_IMM_VERDICT, *code as u32)
            .maybe(chain.as_deref(), |e, c| e.str(sys::NFTNL_EXPR_IMM_CHAIN, c)),
        Expr::Counter => ExprObj::new(c"counter"),
        Expr::Log { prefix, group } => ExprObj::new(c"log")
            .str(sys::NFTNL_EXPR_LOG_PREFIX, prefix)
            .maybe(*group, |e, g| e.u16(sys::NFTNL_EXPR_LOG_GROUP, g)),
        Expr::Nat {
            kind,
            family,
            reg_addr,
            reg_proto,
            flags,
        } => ExprObj::new(c"nat")
            .u32(sys::NFTNL_EXPR_NAT_TYPE, *kind)
            .u32(sys::NFTNL_EXPR_NAT_FAMILY, *family)
            .u32(sys::NFTNL_EXPR_NAT_REG_ADDR_MIN, *reg_addr)
            .maybe(*reg_proto, |e, r| {
                e.u32(sys::NFTNL_EXPR_NAT_REG_PROTO_MIN, r)
            })
            .u32_if(*flags != 0, sys::NFTNL_EXPR_NAT_FLAGS, *flags),
        Expr::Masq { flags } => {
            ExprObj::new(c"masq").u32_if(*flags != 0, sys::NFTNL_EXPR_MASQ_FLAGS, *flags)
        }
        Expr::Tproxy { family, reg_port } => ExprObj::new(c"tproxy")
            .u32(sys::NFTNL_EXPR_TPROXY_FAMILY, *family)
            .u32(sys::NFTNL_EXPR_TPROXY_REG_PORT, *reg_port),
        Expr::Reject { kind, code } => ExprObj::new(c"reject")
            .u32(sys::NFTNL_EXPR_REJECT_TYPE, *kind)
            .u8(sys::NFTNL_EXPR_REJECT_CODE, *code),
        _ => unreachable!("{e:?} is not built by statement"),
    }
}

/// `update @set { key }` with the key in `sreg`; `set_id` names a set created in the same
/// batch.
fn dynset(sreg: u32, set: &str, set_id: Option<u32>) -> ExprObj {
    ExprObj::new(c"dynset")
        .u32(sys::NFTNL_EXPR_DYNSET_SREG_KEY, sreg)
        .str(sys::NFTNL_EXPR_DYNSET_SET_NAME, set)
        .u32(sys::NFTNL_EXPR_DYNSET_OP, NFT_DYNSET_OP_UPDATE)
        .maybe(set_id, |e, id| e.u32(sys::NFTNL_EXPR_DYNSET_SET_ID, id))
}

/// Sets a byte attribute of a set.
fn put_set_data(set: &SetObj, attr: u32, v: &[u8]) {
    // SAFETY: valid set; `v` is readable for its length and libnftnl copies it.
    unsafe {
        sys::nftnl_set_set_data(
            set.ptr(),
            attr as u16,
            v.as_ptr().cast::<c_void>(),
            v.len() as u32,
        )
    };
}

fn build_set(spec: &SetSpec, table: &CStr, family: u16) -> SetObj {
    let s = set_obj(table, &spec.name);
    let p = s.ptr();
    // SAFETY: valid set object; plain integer attributes.
    unsafe {
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FAMILY as u16, u32::from(family));
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FLAGS as u16, spec.flags);
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_TYPE as u16, spec.key_type);
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_LEN as u16, spec.key_len);
        if let Some((ty, len)) = spec.data {
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_DATA_TYPE as u16, ty);
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_DATA_LEN as u16, len);
        }
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_ID as u16, spec.id);
        if let Some(t) = spec.timeout_ms {
            sys::nftnl_set_set_u64(p, sys::NFTNL_SET_TIMEOUT as u16, t);
        }
        if let Some(n) = spec.desc_size {
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_DESC_SIZE as u16, n);
        }
    }
    if !spec.concat_fields.is_empty() {
        // libnftnl takes one byte per field and counts them up to the first zero.
        let lens: Vec<u8> = spec.concat_fields.iter().map(|l| *l as u8).collect();
        put_set_data(&s, sys::NFTNL_SET_DESC_CONCAT, &lens);
    }
    put_set_data(&s, sys::NFTNL_SET_USERDATA, &spec.udata);
    if spec.counter {
        let e = ExprObj::new(c"counter");
        let ep = e.0.as_ptr();
        std::mem::forget(e);
        // SAFETY: both valid; the set takes ownership of the expression and frees it.
        unsafe { sys::nftnl_set_add_expr(p, ep) };
    }
    s
}

/// The set `name` of `table`, as a delete names it.
fn set_obj(table: &CStr, name: &str) -> SetObj {
    let s = SetObj::new();
    s.str(sys::NFTNL_SET_TABLE, table)
        .str(sys::NFTNL_SET_NAME, &cstring(name));
    s
}

fn chain_obj(table: &CStr, family: u16, name: &str) -> ChainObj {
    let c = ChainObj::new();
    c.str(sys::NFTNL_CHAIN_TABLE, table)
        .str(sys::NFTNL_CHAIN_NAME, &cstring(name));
    // SAFETY: valid chain, integer attribute.
    unsafe { sys::nftnl_chain_set_u32(c.ptr(), sys::NFTNL_CHAIN_FAMILY as u16, u32::from(family)) };
    c
}

/// A lowered message ready to be written into the batch; remembers its sequence number.
struct Writer<'a> {
    msg: &'a Msg<'a>,
    table: &'a CStr,
    /// `NFPROTO_INET` or `NFPROTO_BRIDGE`: the table's family, in every message.
    family: u16,
    seq: Cell<u32>,
}

/// `NFT_TABLE_F_OWNER`: the table lives as long as the netlink socket that added it.
const NFT_TABLE_F_OWNER: u32 = 2;

/// (message type, netlink flags) exactly as nft 1.0.6 sends them.
fn kind_and_flags(body: &MsgBody) -> (u32, u16) {
    match body {
        MsgBody::NewTable { .. } => (libc::NFT_MSG_NEWTABLE as u32, 0),
        MsgBody::DelTable => (libc::NFT_MSG_DELTABLE as u32, 0),
        MsgBody::NewChain { .. } => (libc::NFT_MSG_NEWCHAIN as u32, NLM_F_CREATE),
        MsgBody::DelChain(_) => (libc::NFT_MSG_DELCHAIN as u32, 0),
        MsgBody::FlushChain(_) => (libc::NFT_MSG_DELRULE as u32, 0),
        MsgBody::NewRule { .. } => (libc::NFT_MSG_NEWRULE as u32, NLM_F_CREATE | NLM_F_APPEND),
        MsgBody::NewSet(_) => (libc::NFT_MSG_NEWSET as u32, NLM_F_CREATE),
        MsgBody::DelSet(_) => (libc::NFT_MSG_DELSET as u32, 0),
        MsgBody::Elems { delete: false, .. } => (libc::NFT_MSG_NEWSETELEM as u32, NLM_F_CREATE),
        MsgBody::Elems { delete: true, .. } | MsgBody::FlushSet(_) => {
            (libc::NFT_MSG_DELSETELEM as u32, 0)
        }
    }
}

impl Writer<'_> {
    /// Adds the table with `add_flags` (`Some`) or deletes it (`None`).
    fn table_msg(&self, nlh: *mut libc::nlmsghdr, add_flags: Option<u32>) {
        let t = TableObj::new();
        t.str(sys::NFTNL_TABLE_NAME, self.table);
        // nft always sends the flags on add (empty for the agent's own table).
        if let Some(flags) = add_flags {
            // SAFETY: valid table.
            unsafe { sys::nftnl_table_set_u32(t.ptr(), sys::NFTNL_TABLE_FLAGS as u16, flags) };
        }
        // SAFETY: `nlh` is the header just built in the batch buffer.
        unsafe { sys::nftnl_table_nlmsg_build_payload(nlh, t.ptr()) };
    }

    /// Adds the chain `name`, a base chain with its type, hook and policy when `base`.
    fn new_chain(
        &self,
        nlh: *mut libc::nlmsghdr,
        name: &str,
        base: Option<&super::lower::BaseSpec>,
    ) {
        let c = chain_obj(self.table, self.family, name);
        if let Some(b) = base {
            let kind = cstring(b.kind);
            c.str(sys::NFTNL_CHAIN_TYPE, &kind);
        }
        // SAFETY: header just built in the batch buffer; valid chain.
        unsafe { sys::nftnl_chain_nlmsg_build_payload(nlh, c.ptr()) };
        if let Some(b) = base {
            Self::chain_hook(nlh, b);
        }
    }

    /// Deletes the set `name`.
    fn del_set(&self, nlh: *mut libc::nlmsghdr, name: &str) {
        let s = set_obj(self.table, name);
        // SAFETY: header just built in the batch buffer; valid set.
        unsafe { sys::nftnl_set_nlmsg_build_payload(nlh, s.ptr()) };
    }

    /// Deletes every element of the set `set`.
    fn flush_set(&self, nlh: *mut libc::nlmsghdr, set: &str) {
        let name = cstring(set);
        // SAFETY: `nlh` is the message being built with room for a maximum-size message;
        // the strings are valid C strings.
        unsafe {
            mnl_sys::mnl_attr_put_strz(nlh.cast(), NFTA_SET_ELEM_LIST_TABLE, self.table.as_ptr());
            mnl_sys::mnl_attr_put_strz(nlh.cast(), NFTA_SET_ELEM_LIST_SET, name.as_ptr());
        }
    }

    /// Attributes nft writes itself, after libnftnl's: a base chain's policy and hook.
    fn chain_hook(nlh: *mut libc::nlmsghdr, b: &super::lower::BaseSpec) {
        let nlh = nlh.cast();
        // SAFETY: `nlh` is the message being built, with room for a maximum-size message;
        // these few bytes fit.
        unsafe {
            mnl_sys::mnl_attr_put_u32(nlh, NFTA_CHAIN_POLICY, b.policy.to_be());
            let nest = mnl_sys::mnl_attr_nest_start(nlh, NFTA_CHAIN_HOOK);
            mnl_sys::mnl_attr_put_u32(nlh, NFTA_HOOK_HOOKNUM, b.hook.to_be());
            mnl_sys::mnl_attr_put_u32(nlh, NFTA_HOOK_PRIORITY, (b.priority as u32).to_be());
            mnl_sys::mnl_attr_nest_end(nlh, nest);
        }
    }

    fn rule(&self, nlh: *mut libc::nlmsghdr, chain: &str) {
        let r = RuleObj::new();
        r.str(sys::NFTNL_RULE_TABLE, self.table)
            .str(sys::NFTNL_RULE_CHAIN, &cstring(chain));
        // SAFETY: valid rule, integer attribute.
        unsafe {
            sys::nftnl_rule_set_u32(
                r.ptr(),
                sys::NFTNL_RULE_FAMILY as u16,
                u32::from(self.family),
            )
        };
        if let MsgBody::NewRule { exprs, .. } = &self.msg.body {
            for e in exprs {
                build_expr(e).add_to(&r);
            }
        }
        // SAFETY: `nlh` is the header just built in the batch buffer; valid rule.
        unsafe { sys::nftnl_rule_nlmsg_build_payload(nlh, r.ptr()) };
        if let MsgBody::NewRule { udata: Some(u), .. } = &self.msg.body {
            // nft puts the comment after the expressions (libnftnl would put it first).
            // SAFETY: `nlh` is the message being built; `u` (a comment of at most 130
            // bytes) is readable for its length and fits the buffer.
            unsafe {
                mnl_sys::mnl_attr_put(nlh.cast(), NFTA_RULE_USERDATA, u.len(), u.as_ptr().cast())
            };
        }
    }

    /// nft writes the element message attributes itself; the list is already encoded.
    fn elems(&self, nlh: *mut libc::nlmsghdr, set: &str, set_id: Option<u32>, list: &[u8]) {
        let name = cstring(set);
        let nlh = nlh.cast();
        // SAFETY: `nlh` is the message being built with room for a maximum-size message;
        // the lowering keeps `list` below 64 KiB; the strings are valid C strings.
        unsafe {
            mnl_sys::mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, self.table.as_ptr());
            mnl_sys::mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, name.as_ptr());
            if let Some(id) = set_id {
                mnl_sys::mnl_attr_put_u32(nlh, NFTA_SET_ELEM_LIST_SET_ID, id.to_be());
            }
            mnl_sys::mnl_attr_put(
                nlh,
                NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED,
                list.len(),
                list.as_ptr().cast(),
            );
        }
    }
}

// SAFETY: `write` stays within the `nft_nlmsg_maxsize()` bytes `Batch::add` provides: the
// lowering bounds every message (module invariants).
unsafe impl NlMsg for Writer<'_> {
    unsafe fn write(&self, buf: *mut c_void, seq: u32, _: MsgType) {
        self.seq.set(seq);
        let (kind, flags) = kind_and_flags(&self.msg.body);
        // SAFETY: `buf` is the batch's current position with room for a full message.
        let nlh = unsafe {
            sys::nftnl_nlmsg_build_hdr(buf.cast::<c_char>(), kind as u16, self.family, flags, seq)
        };
        match &self.msg.body {
            MsgBody::NewTable { owner } => {
                let flags = if *owner { NFT_TABLE_F_OWNER } else { 0 };
                self.table_msg(nlh, Some(flags))
            }
            MsgBody::DelTable => self.table_msg(nlh, None),
            MsgBody::NewChain { name, base } => self.new_chain(nlh, name, base.as_ref()),
            MsgBody::DelChain(name) => {
                let c = chain_obj(self.table, self.family, name);
                // SAFETY: header just built in the batch buffer; valid chain.
                unsafe { sys::nftnl_chain_nlmsg_build_payload(nlh, c.ptr()) };
            }
            MsgBody::FlushChain(chain) | MsgBody::NewRule { chain, .. } => self.rule(nlh, chain),
            MsgBody::NewSet(spec) => {
                let s = build_set(spec, self.table, self.family);
                // SAFETY: header just built in the batch buffer; valid set.
                unsafe { sys::nftnl_set_nlmsg_build_payload(nlh, s.ptr()) };
            }
            MsgBody::DelSet(name) => self.del_set(nlh, name),
            MsgBody::Elems {
                set, set_id, chunk, ..
            } => self.elems(nlh, set, *set_id, &chunk.list),
            MsgBody::FlushSet(set) => self.flush_set(nlh, set),
        }
    }
}

/// The encoded batch and the sequence number of every message in it.
pub struct Encoded {
    pub batch: FinalizedBatch,
    /// `seqs[i]` is the sequence number of `msgs[i]`.
    pub seqs: Vec<u32>,
}

/// Writes all messages into one nftnl batch (begin ... end).
pub fn encode(msgs: &[Msg], family: Family, table: &str) -> Encoded {
    let table = cstring(table);
    // Large pages: fewer iovecs for big transactions; the batch grows page by page.
    let mut batch = Batch::with_page_size(1 << 20);
    let mut seqs = Vec::with_capacity(msgs.len());
    for msg in msgs {
        let w = Writer {
            msg,
            table: &table,
            family: u16::from(family.nfproto()),
            seq: Cell::new(0),
        };
        batch.add(&w, MsgType::Add);
        seqs.push(w.seq.get());
    }
    Encoded {
        batch: batch.finalize(),
        seqs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::nftnl::elems::{DataSpec, ElemChunks, ElemSpec};
    use crate::nft::nftnl::set::NFT_SET_ELEM_INTERVAL_END;
    use crate::nft::nftnl::types::Bytes;
    use crate::nft::nftnl::udata::{INTERVAL_OPEN, put_elem_comment};

    fn elem_data(e: *mut sys::nftnl_set_elem, attr: u32, v: &[u8]) {
        // SAFETY: valid element; `v` readable during the call; libnftnl copies it.
        unsafe {
            sys::nftnl_set_elem_set(e, attr as u16, v.as_ptr().cast::<c_void>(), v.len() as u32)
        };
    }

    /// libnftnl's own encoding of an element list (nests numbered from 1): the reference
    /// for the Rust encoder.
    fn libnftnl_elem_list(elems: &[ElemSpec]) -> Vec<u8> {
        let s = SetObj::new();
        for spec in elems {
            // SAFETY: plain allocation, checked below.
            let e = unsafe { sys::nftnl_set_elem_alloc() };
            assert!(!e.is_null());
            let chain = match &spec.data {
                Some(DataSpec::Verdict(_, Some(c))) => Some(cstring(c)),
                _ => None,
            };
            // SAFETY: `e` is a live element; integer attributes, and `chain` is a valid C
            // string for the call (libnftnl copies it).
            unsafe {
                if spec.flags != 0 {
                    sys::nftnl_set_elem_set_u32(e, sys::NFTNL_SET_ELEM_FLAGS as u16, spec.flags);
                }
                if let Some(t) = spec.timeout_ms {
                    sys::nftnl_set_elem_set_u64(e, sys::NFTNL_SET_ELEM_TIMEOUT as u16, t);
                }
                if let Some(DataSpec::Verdict(code, _)) = &spec.data {
                    let verdict = sys::NFTNL_SET_ELEM_VERDICT as u16;
                    sys::nftnl_set_elem_set_u32(e, verdict, *code as u32);
                }
                if let Some(c) = &chain {
                    sys::nftnl_set_elem_set_str(e, sys::NFTNL_SET_ELEM_CHAIN as u16, c.as_ptr());
                }
            }
            elem_data(e, sys::NFTNL_SET_ELEM_KEY, spec.key.as_slice());
            if let Some(end) = &spec.key_end {
                elem_data(e, sys::NFTNL_SET_ELEM_KEY_END, end.as_slice());
            }
            if let Some(DataSpec::Value(v)) = &spec.data {
                elem_data(e, sys::NFTNL_SET_ELEM_DATA, v.as_slice());
            }
            if spec.comment.is_some() || spec.open {
                let mut u = Vec::new();
                if let Some(c) = spec.comment {
                    put_elem_comment(&mut u, c);
                }
                if spec.open {
                    u.extend_from_slice(&INTERVAL_OPEN);
                }
                elem_data(e, sys::NFTNL_SET_ELEM_USERDATA, &u);
            }
            // SAFETY: both valid; the set takes ownership of the element.
            unsafe { sys::nftnl_set_elem_add(s.ptr(), e) };
        }
        let mut buf = vec![0u8; 1 << 17];
        // SAFETY: `buf` has room for a maximum-size message; valid set and elements.
        let nlh = unsafe {
            let nlh = sys::nftnl_nlmsg_build_hdr(
                buf.as_mut_ptr().cast(),
                12,
                libc::NFPROTO_INET as u16,
                0,
                1,
            );
            sys::nftnl_set_elems_nlmsg_build_payload(nlh, s.ptr());
            nlh
        };
        // SAFETY: `nlh` points at the start of `buf`, a header libnftnl just completed.
        let len = unsafe { (*nlh).nlmsg_len } as usize;
        // Skip nlmsghdr + nfgenmsg and the list attribute's own header.
        buf[24..len].to_vec()
    }

    #[test]
    fn element_lists_match_libnftnl_bytes() {
        let spec = |key: &[u8]| ElemSpec {
            key: Bytes::from_slice(key),
            key_end: None,
            flags: 0,
            timeout_ms: None,
            data: None,
            comment: None,
            open: false,
            src: 0,
        };
        let elems = vec![
            ElemSpec {
                flags: NFT_SET_ELEM_INTERVAL_END,
                ..spec(&[0; 4])
            },
            ElemSpec {
                key_end: Some(Bytes::from_slice(&[
                    10, 255, 255, 255, 6, 0, 0, 0, 0, 90, 0, 0,
                ])),
                timeout_ms: Some(30_000),
                data: Some(DataSpec::Verdict(-4, Some("svc-a"))),
                comment: Some("rule 3: Deny \"x\""),
                open: true,
                ..spec(&[10, 0, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0])
            },
            ElemSpec {
                data: Some(DataSpec::Value(Bytes::from_slice(&[
                    192, 168, 0, 1, 0, 80, 0, 0,
                ]))),
                ..spec(&[1, 2])
            },
            ElemSpec {
                data: Some(DataSpec::Verdict(1, None)),
                comment: Some("odd length"),
                ..spec(&[7; 16])
            },
        ];
        let mut chunks = ElemChunks::new();
        for e in &elems {
            chunks.push(e);
        }
        let ours = chunks.finish();
        assert_eq!(ours.len(), 1);
        assert_eq!(libnftnl_elem_list(&elems), ours[0].list);
    }
}
