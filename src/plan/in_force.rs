//! Which version of each custom resource (EgressFirewall, EgressQoS per namespace, EgressIP
//! per name) a feature plans from: the object itself when it validates, otherwise the last
//! valid version from memory, so a typo never makes a namespace fall open.
//!
//! What is in force keeps the API object it was validated from ([`InForce`]), so that the
//! reconciler can save the last valid objects and a restarted agent can plan from them
//! (`crate::state`).

use super::ObjectStatus;
use super::kept::{KeptFile, KeptKind};
use crate::api::ValidationError;
use crate::snapshot::{Kind, ObjectKey};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A validated object in force, with the API object it was validated from.
#[derive(Debug, PartialEq)]
pub struct InForce<T, V> {
    /// The API object as read (what `crate::state` saves).
    pub object: Arc<T>,
    /// Its validated form (what the planners use).
    pub valid: Arc<V>,
}

impl<T, V> Clone for InForce<T, V> {
    fn clone(&self) -> Self {
        InForce {
            object: self.object.clone(),
            valid: self.valid.clone(),
        }
    }
}

impl<T, V> InForce<T, V> {
    /// The same object (the same `Arc`, or an equal object): a cheap test of whether what is
    /// in force changed.
    pub fn same_object(&self, other: &Self) -> bool
    where
        T: PartialEq,
    {
        Arc::ptr_eq(&self.object, &other.object) || *self.object == *other.object
    }
}

/// What is in force per namespace (or per name for cluster-scoped kinds). A persistent map:
/// a plan's memory copies it in O(1) and changes only the keys whose object changed.
pub type InForceMap<T, V> = imbl::OrdMap<String, InForce<T, V>>;

/// True when both maps hold the same objects under the same keys: O(n) pointer comparisons
/// when nothing changed (the planners keep the `Arc` of an unchanged object).
pub fn same_objects<T: PartialEq, V>(a: &InForceMap<T, V>, b: &InForceMap<T, V>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && va.same_object(vb))
}

/// How objects of a kind govern: one object per namespace (EgressFirewall, EgressQoS: only
/// the object named `default` counts), each cluster-scoped object by its name (EgressIP), or
/// each namespaced object by `namespace/name` (kinds of which a namespace has many).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Keyed by namespace; only `default` falls back to its last valid version.
    Namespace,
    /// Keyed by name.
    Cluster,
    /// Keyed by `namespace/name`.
    Object,
}

impl Scope {
    fn key(self, key: &ObjectKey) -> String {
        match self {
            Scope::Namespace => key.namespace.clone(),
            Scope::Cluster => key.name.clone(),
            Scope::Object => format!("{}/{}", key.namespace, key.name),
        }
    }

    fn falls_back(self, key: &ObjectKey) -> bool {
        match self {
            Scope::Namespace => key.name == "default",
            Scope::Cluster | Scope::Object => true,
        }
    }
}

/// The one per-object validation every feature of custom resources uses, carried from one
/// plan to the next: the objects in force (valid now, or the last valid version when the
/// current one is invalid) and the validation result of every object, so that an unchanged
/// object (the same `Arc`, or an equal one) is not validated again: a plan of N unchanged
/// objects costs N comparisons, not N validations.
#[derive(Debug)]
pub struct Validated<T, V> {
    /// What is in force per namespace (or name, see [`Scope`]).
    pub in_force: InForceMap<T, V>,
    checks: Checks<T, V>,
}

impl<T, V> Default for Validated<T, V> {
    fn default() -> Self {
        Validated {
            in_force: InForceMap::new(),
            checks: Checks::new(),
        }
    }
}

impl<T, V> Clone for Validated<T, V> {
    fn clone(&self) -> Self {
        Validated {
            in_force: self.in_force.clone(),
            checks: self.checks.clone(),
        }
    }
}

impl<T, V> Validated<T, V> {
    /// Starts from objects known to be valid (the state saved across a restart).
    pub fn from_in_force(in_force: InForceMap<T, V>) -> Self {
        Validated {
            in_force,
            checks: Checks::new(),
        }
    }
}

/// The objects in force, by key: what the features of custom resources keep, one list of
/// the state file per kind (the API objects, in key order).
impl<T: KeptKind> super::Keep for InForceMap<T, T::Valid> {
    fn len(&self) -> usize {
        imbl::OrdMap::len(self)
    }

    fn save<M: serde::ser::SerializeMap>(&self, file: &mut M) -> Result<(), M::Error> {
        if T::OMIT_EMPTY && self.is_empty() {
            return Ok(());
        }
        let objects: Vec<&T> = self.values().map(|e| &*e.object).collect();
        file.serialize_entry(T::FIELD, &objects)
    }

    fn load(file: &mut KeptFile<'_>) -> Result<Self, String> {
        let items = file.list::<T>(T::FIELD)?;
        Ok(validated_again(items, &mut |what, why| {
            file.problem(what, why)
        }))
    }

    fn decode_field<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        problems: &mut Vec<(String, String)>,
    ) -> Result<bool, A::Error> {
        if name != T::FIELD {
            return Ok(false);
        }
        let items: Vec<T> = map.next_value()?;
        let items = items.into_iter().map(Ok);
        *self = validated_again(items, &mut |what, why| problems.push((what, why)));
        Ok(true)
    }
}

/// The objects of a kind's list read back, each validated again and keyed as the planner
/// keys it; what is left out goes to `problem` (which item, why). The first object of a key
/// wins (the agent never writes two).
fn validated_again<T: KeptKind>(
    items: impl IntoIterator<Item = Result<T, String>>,
    problem: &mut dyn FnMut(String, String),
) -> InForceMap<T, T::Valid> {
    let mut map = InForceMap::new();
    for (i, item) in items.into_iter().enumerate() {
        let what = format!("{}[{i}]", T::FIELD);
        let object = match item {
            Ok(o) => o,
            Err(e) => {
                problem(what, format!("cannot decode: {e}"));
                continue;
            }
        };
        let valid = match object.revalidate() {
            Ok(v) => v,
            // The error names the object (kind and key), the field and the problem.
            Err(e) => {
                problem(what, format!("no longer valid: {e}"));
                continue;
            }
        };
        let key = T::key(&valid);
        if map.contains_key(&key) {
            problem(what, format!("a second object for {key}"));
            continue;
        }
        let entry = InForce {
            object: Arc::new(object),
            valid: Arc::new(valid),
        };
        map.insert(key, entry);
    }
    map
}

/// The objects in force are what a feature of custom resources keeps across restarts.
impl<T: KeptKind> super::Remember for Validated<T, T::Valid> {
    type Kept = InForceMap<T, T::Valid>;

    fn kept(&self) -> Self::Kept {
        self.in_force.clone()
    }

    fn restore(kept: Self::Kept) -> Self {
        Validated::from_in_force(kept)
    }

    fn keeps(&self, kept: &Self::Kept) -> bool {
        same_objects(kept, &self.in_force)
    }
}

/// [`super::Remember`] for a feature memory whose kept objects are those of its `Validated`
/// field (held directly or in an `Arc`); the rest of the memory is rebuilt by the first plan.
macro_rules! remember_through {
    ($memory:ty, $field:ident: $validated:ty) => {
        impl $crate::plan::Remember for $memory {
            type Kept = <$validated as $crate::plan::Remember>::Kept;

            fn kept(&self) -> Self::Kept {
                let validated: &$validated = std::borrow::Borrow::borrow(&self.$field);
                $crate::plan::Remember::kept(validated)
            }

            fn restore(kept: Self::Kept) -> Self {
                let validated: $validated = $crate::plan::Remember::restore(kept);
                Self {
                    $field: validated.into(),
                    ..Default::default()
                }
            }

            fn keeps(&self, kept: &Self::Kept) -> bool {
                let validated: &$validated = std::borrow::Borrow::borrow(&self.$field);
                $crate::plan::Remember::keeps(validated, kept)
            }
        }
    };
}
pub(crate) use remember_through;

/// What [`Validated::update`] found.
pub struct Outcome<T, V> {
    /// One per object: `Ok`, or `Err("<field>: <problem>")` (the status line names the
    /// object already).
    pub statuses: Vec<ObjectStatus>,
    /// The next memory: in force are the valid objects and, for invalid ones, their last
    /// valid version. Keys without an object are dropped.
    pub validated: Validated<T, V>,
    /// Keys whose object is invalid and whose last valid version is in force instead.
    pub fell_back: BTreeSet<String>,
}

impl<T: PartialEq, V> Validated<T, V> {
    /// Validates every object (reusing this memory's results for unchanged ones) and returns
    /// the version in force per key plus one status per object.
    pub fn update<'a>(
        &self,
        kind: Kind,
        scope: Scope,
        objects: impl IntoIterator<Item = (ObjectKey, &'a Arc<T>)>,
        validate: impl Fn(&T) -> Result<V, ValidationError>,
    ) -> Outcome<T, V>
    where
        T: 'a,
    {
        let mut next = Validated::default();
        let mut statuses = Vec::new();
        let mut fell_back = BTreeSet::new();
        for (key, object) in objects {
            let check = match self.checks.get(&key) {
                Some(c) if Arc::ptr_eq(&c.object, object) || *c.object == **object => c.clone(),
                _ => Check {
                    object: object.clone(),
                    result: validate(object).map(Arc::new),
                },
            };
            let governs = scope.key(&key);
            let result = match &check.result {
                Ok(valid) => {
                    let entry = InForce {
                        object: check.object.clone(),
                        valid: valid.clone(),
                    };
                    next.in_force.insert(governs, entry);
                    Ok(())
                }
                Err(e) => {
                    if scope.falls_back(&key)
                        && let Some(last) = self.in_force.get(&governs)
                    {
                        next.in_force.insert(governs.clone(), last.clone());
                        fell_back.insert(governs);
                    }
                    Err(format!("{}: {}", e.field, e.reason))
                }
            };
            statuses.push(ObjectStatus {
                kind,
                key: key.clone(),
                result,
                event: None,
            });
            next.checks.insert(key, check);
        }
        Outcome {
            statuses,
            validated: next,
            fell_back,
        }
    }

    /// [`Validated::update`] for only the objects that changed since the objects this memory
    /// was computed from: `changes` holds each changed key with its object now (`None`: it
    /// went), e.g. from `snapshot::changes`. Every other object keeps its result, so a plan
    /// costs the size of the change, not of the kind. Only for scopes where one object
    /// governs one key (`Object`, `Cluster`): under `Namespace` the other objects of the
    /// namespace would have to be looked at again.
    pub fn update_changed<'a>(
        &self,
        kind: Kind,
        scope: Scope,
        changes: impl IntoIterator<Item = (ObjectKey, Option<&'a Arc<T>>)>,
        validate: impl Fn(&T) -> Result<V, ValidationError>,
    ) -> Delta<T, V>
    where
        T: 'a,
    {
        assert!(scope != Scope::Namespace, "one object per key only");
        let mut next = self.clone();
        let mut statuses = Vec::new();
        let mut changed = BTreeSet::new();
        for (key, object) in changes {
            let governs = scope.key(&key);
            let Some(object) = object else {
                next.checks.remove(&key);
                next.in_force.remove(&governs);
                statuses.push((key, None));
                changed.insert(governs);
                continue;
            };
            let check = match self.checks.get(&key) {
                Some(c) if Arc::ptr_eq(&c.object, object) || *c.object == **object => c.clone(),
                _ => Check {
                    object: object.clone(),
                    result: validate(object).map(Arc::new),
                },
            };
            // As in `update`: valid is in force; invalid keeps the last valid version, which
            // is what `next` (a copy of this memory) holds under the key, if any.
            let result = match &check.result {
                Ok(valid) => {
                    let entry = InForce {
                        object: check.object.clone(),
                        valid: valid.clone(),
                    };
                    next.in_force.insert(governs.clone(), entry);
                    Ok(())
                }
                Err(e) => Err(format!("{}: {}", e.field, e.reason)),
            };
            let status = ObjectStatus {
                kind,
                key: key.clone(),
                result,
                event: None,
            };
            statuses.push((key.clone(), Some(status)));
            next.checks.insert(key, check);
            changed.insert(governs);
        }
        Delta {
            validated: next,
            statuses,
            changed,
        }
    }
}

/// What [`Validated::update_changed`] found.
pub struct Delta<T, V> {
    /// The next memory.
    pub validated: Validated<T, V>,
    /// The status of each changed object (`None`: the object went).
    pub statuses: Vec<(ObjectKey, Option<ObjectStatus>)>,
    /// The keys of `in_force` whose entry may have changed (appeared, went or replaced).
    pub changed: BTreeSet<String>,
}

/// The validation result of one object, kept with the object it was computed from.
#[derive(Debug)]
struct Check<T, V> {
    object: Arc<T>,
    result: Result<Arc<V>, ValidationError>,
}

impl<T, V> Clone for Check<T, V> {
    fn clone(&self) -> Self {
        Check {
            object: self.object.clone(),
            result: self.result.clone(),
        }
    }
}

/// Validation results per object.
type Checks<T, V> = imbl::OrdMap<ObjectKey, Check<T, V>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::Invalid;

    /// A stand-in kind: valid when its value is even.
    #[derive(Debug, PartialEq)]
    struct Obj(u32);

    fn validate(o: &Obj) -> Result<u32, ValidationError> {
        if o.0.is_multiple_of(2) {
            Ok(o.0)
        } else {
            Err(ValidationError {
                kind: "Obj",
                object: String::new(),
                field: "spec.value".into(),
                reason: Invalid::Missing,
            })
        }
    }

    fn run(
        memory: &Validated<Obj, u32>,
        scope: Scope,
        objects: &[(&str, &str, u32)],
    ) -> Outcome<Obj, u32> {
        let objects: Vec<(ObjectKey, Arc<Obj>)> = objects
            .iter()
            .map(|(ns, name, v)| (ObjectKey::new(*ns, *name), Arc::new(Obj(*v))))
            .collect();
        memory.update(
            Kind::EgressQoS,
            scope,
            objects.iter().map(|(k, o)| (k.clone(), o)),
            validate,
        )
    }

    #[test]
    fn each_scope_keys_and_falls_back_as_documented() {
        let first = run(
            &Validated::default(),
            Scope::Object,
            &[("a", "p", 2), ("a", "q", 4)],
        );
        assert_eq!(
            first.validated.in_force.keys().collect::<Vec<_>>(),
            ["a/p", "a/q"]
        );
        // q turns invalid: its last valid version stays in force, p is unaffected.
        let next = run(
            &first.validated,
            Scope::Object,
            &[("a", "p", 2), ("a", "q", 5)],
        );
        assert_eq!(*next.validated.in_force["a/q"].valid, 4);
        assert!(next.fell_back.contains("a/q") && !next.fell_back.contains("a/p"));
        assert_eq!(
            next.statuses[1].result,
            Err("spec.value: must be set".into())
        );
        // Namespace scope: only `default` falls back.
        let ns = run(
            &Validated::default(),
            Scope::Namespace,
            &[("a", "default", 2)],
        );
        let bad = run(&ns.validated, Scope::Namespace, &[("a", "default", 3)]);
        assert_eq!(*bad.validated.in_force["a"].valid, 2);
        let other = run(&ns.validated, Scope::Namespace, &[("a", "other", 3)]);
        assert!(other.validated.in_force.is_empty());
        // Cluster scope: keyed by name.
        let c = run(&Validated::default(), Scope::Cluster, &[("", "e", 2)]);
        assert!(c.validated.in_force.contains_key("e"));
    }
}
