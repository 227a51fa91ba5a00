//! Named sets and maps: their kind (set, data map, verdict map), key and data types, flags,
//! timeout, size and `typeof` declaration, and the elements they hold, so an update is an
//! element diff.

use super::elem::{ElemData, ElemKey, ElemValue};
use super::field::{DataType, Field};
use std::collections::BTreeMap;
use std::sync::Arc;

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
