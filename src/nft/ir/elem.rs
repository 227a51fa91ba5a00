//! Set and map elements: keys (values, prefixes, ranges, concatenations), the verdicts and
//! data values a map element maps to, and an element's timeout and comment.

use super::value::Value;
use ipnet::IpNet;
use std::sync::Arc;

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
