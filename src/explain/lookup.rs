//! Matching loaded values against rule operands and set elements: values, prefixes,
//! ranges, concatenations, in plain and interval sets alike (nft's lookup semantics).

use crate::nft::ir::{ElemKey, ElemValue, KeyPart, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A value as an unsigned number, for bit masks (marks, ct state, TCP flags, frag-off).
pub fn numeric(v: &Value) -> Option<u64> {
    Some(match v {
        Value::Proto(p) => u64::from(*p),
        Value::Port(p) => u64::from(*p),
        Value::Mark(m) | Value::Integer(m) => u64::from(*m),
        Value::TcpFlags(f) => u64::from(*f),
        _ => return None,
    })
}

/// Whether one key component matches one loaded value.
pub fn part_matches(part: &KeyPart, v: &Value) -> bool {
    match part {
        KeyPart::Value(x) => x == v,
        KeyPart::Prefix(net) => match v {
            Value::Ipv4(a) => net.contains(&IpAddr::V4(*a)),
            Value::Ipv6(a) => net.contains(&IpAddr::V6(*a)),
            _ => false,
        },
        KeyPart::Range(lo, hi) => same_kind(lo, v) && same_kind(hi, v) && lo <= v && v <= hi,
    }
}

fn same_kind(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Whether a (possibly concatenated) key matches the loaded values, part by part.
pub fn key_matches(key: &ElemKey, values: &[Value]) -> bool {
    key.len() == values.len() && key.iter().zip(values).all(|(p, v)| part_matches(p, v))
}

/// The element of `elements` that `values` hit: an exact lookup, then (for interval sets,
/// whose elements may be prefixes and ranges) the first element that covers them.
pub fn find<'a>(
    elements: &'a BTreeMap<ElemKey, ElemValue>,
    values: &[Value],
) -> Option<(&'a ElemKey, &'a ElemValue)> {
    let exact: ElemKey = values.iter().cloned().map(KeyPart::Value).collect();
    if let Some(hit) = elements.get_key_value(&exact) {
        return Some(hit);
    }
    elements.iter().find(|(k, _)| key_matches(k, values))
}

/// A key as nft prints it (the renderer's words: one place for them).
pub fn show_key(key: &ElemKey) -> String {
    crate::nft::render::elem_key_text(key)
}

/// A value as nft prints it.
pub fn show_value(v: &Value) -> String {
    crate::nft::render::value(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::Value::{Ipv4, Port, Proto};

    #[test]
    fn prefixes_ranges_and_concatenations_match_like_nft() {
        let mut set = BTreeMap::new();
        let key = vec![
            KeyPart::Prefix("203.0.113.0/24".parse().unwrap()),
            KeyPart::Value(Proto(6)),
            KeyPart::Range(Port(440), Port(450)),
        ];
        set.insert(key.clone(), ElemValue::default());
        let hit = |ip: &str, p: u8, port: u16| {
            find(&set, &[Ipv4(ip.parse().unwrap()), Proto(p), Port(port)]).is_some()
        };
        assert!(hit("203.0.113.10", 6, 443));
        assert!(hit("203.0.113.255", 6, 450));
        assert!(!hit("203.0.114.1", 6, 443));
        assert!(!hit("203.0.113.10", 17, 443));
        assert!(!hit("203.0.113.10", 6, 451));
        assert_eq!(show_key(&key), "203.0.113.0/24 . tcp . 440-450");
    }
}
