//! Decoding a rule's expressions back into the IR: the inverse of the lowering, one function
//! per family of expressions (loads, data operations, set updates, actions, payload and
//! immediates), with the kernel's attribute numbers. An expression the agent never writes
//! makes the whole rule undecodable (`None`), so it reads as different from what is wanted.

use super::super::expr::Expr;
use super::attrs::{Attr, Attrs};

/// A rule's expression list; `None` if any expression is one the agent never writes.
pub(super) fn parse_exprs(list: Attrs) -> Option<Vec<Expr>> {
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
            if d.be32(3) == Some(super::super::types::NFT_NG_RANDOM)
                && d.be32(4).unwrap_or(0) == 0 =>
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
    if l.be32(4) != Some(super::super::expr::NFT_LIMIT_PKTS) {
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
    if dreg == super::super::expr::NFT_REG_VERDICT {
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
