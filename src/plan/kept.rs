//! How what the features keep across restarts ([`super::Keep`]) reads and writes itself in
//! the state file (`crate::state`), so that the file's code names no feature: the file is
//! one JSON object, and each feature's kept objects are fields of it that the feature writes
//! and reads back. A feature of custom resources keeps its objects in force
//! ([`super::in_force::InForceMap`]), one list per kind: the kind says its field, how its
//! objects validate again and under which key they are in force ([`KeptKind`]).

use crate::api::ValidationError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::fmt::Debug;

/// An API kind whose objects in force a feature keeps across restarts, as one list of the
/// state file.
pub trait KeptKind: Serialize + DeserializeOwned + PartialEq + Debug + Send + Sync {
    /// The validated form the planner uses.
    type Valid: Debug + Send + Sync;

    /// The list's field in the state file.
    const FIELD: &'static str;

    /// Left out of the file when empty (a kind kept since a later agent: a file without it
    /// stays as older agents wrote it).
    const OMIT_EMPTY: bool = false;

    /// Validates an object read back, with the same code as objects from the API.
    fn revalidate(&self) -> Result<Self::Valid, ValidationError>;

    /// The key its validated form is in force under.
    fn key(valid: &Self::Valid) -> String;
}

/// Implements [`KeptKind`] for a kind that validates with its own `validate` method and is in
/// force under one `String` field of its validated form: the kind names only its validated
/// type, its field in the state file and that key field.
macro_rules! kept_kind {
    ($kind:ty => $valid:ty, field $field:literal, keyed by $key:ident) => {
        impl $crate::plan::kept::KeptKind for $kind {
            type Valid = $valid;
            const FIELD: &'static str = $field;

            fn revalidate(&self) -> Result<$valid, $crate::api::ValidationError> {
                self.validate()
            }

            fn key(valid: &$valid) -> String {
                valid.$key.clone()
            }
        }
    };
}
pub(crate) use kept_kind;

/// The state file's fields as read, for each feature to take its own; what a feature leaves
/// out is reported here.
#[derive(Debug, Default)]
pub struct KeptFile<'a> {
    fields: BTreeMap<String, &'a RawValue>,
    problems: Vec<(String, String)>,
}

impl<'a> KeptFile<'a> {
    /// The file's fields, by name.
    pub fn new(fields: BTreeMap<String, &'a RawValue>) -> Self {
        KeptFile {
            fields,
            problems: Vec::new(),
        }
    }

    /// The items of the list in field `name` (none when the file has no such field), each
    /// decoded as a `T` or with the reason it is not one; Err when the field is not a list.
    pub fn list<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<Result<T, String>>, String> {
        let Some(raw) = self.fields.get(name) else {
            return Ok(Vec::new());
        };
        // One typed pass for a list as this agent writes it; item by item otherwise, to say
        // which item is wrong and keep the others.
        if let Ok(items) = serde_json::from_str::<Vec<T>>(raw.get()) {
            return Ok(items.into_iter().map(Ok).collect());
        }
        let items = serde_json::from_str::<Vec<&RawValue>>(raw.get())
            .map_err(|_| format!("{name} is not a list"))?;
        let item = |raw: &RawValue| {
            let value: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
            serde_json::from_value(value).map_err(|e| e.to_string())
        };
        Ok(items.into_iter().map(item).collect())
    }

    /// Reports that `what` (a field's item) was left out, and why.
    pub fn problem(&mut self, what: String, reason: String) {
        self.problems.push((what, reason));
    }

    /// What was left out (what, why), in the order found.
    pub fn into_problems(self) -> Vec<(String, String)> {
        self.problems
    }
}
