//! Which version of each namespaced, one-per-namespace custom resource (EgressFirewall,
//! EgressQoS) a feature plans from: the object itself when it validates, otherwise the last
//! valid version from memory, so a typo never makes a namespace fall open.
//!
//! What is in force keeps the API object it was validated from ([`InForce`]), so that the
//! reconciler can save the last valid objects and a restarted agent can plan from them
//! (`crate::state`).

use super::ObjectStatus;
use crate::api::ValidationError;
use crate::snapshot::{Kind, ObjectKey};
use std::collections::BTreeMap;
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

/// What is in force per namespace (or per name for cluster-scoped kinds).
pub type InForceMap<T, V> = BTreeMap<String, InForce<T, V>>;

/// True when both maps hold the same objects under the same keys: O(n) pointer comparisons
/// when nothing changed (the planners keep the `Arc` of an unchanged object).
pub fn same_objects<T: PartialEq, V>(a: &InForceMap<T, V>, b: &InForceMap<T, V>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && va.same_object(vb))
}

/// What a feature planner hands back besides what it adds to the table.
pub struct Outcome<T, V> {
    pub statuses: Vec<ObjectStatus>,
    /// The objects in force per namespace: valid now, or the last valid one if the current
    /// object is invalid. Namespaces without an object are dropped.
    pub memory: InForceMap<T, V>,
    /// This plan's validation results, for the next plan to reuse.
    pub checks: Checks<T, V>,
}

/// The validation result of one object, kept with the object it was computed from.
#[derive(Debug)]
pub struct Check<T, V> {
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

/// Validation results per object: an unchanged object (the same `Arc`, or an equal one) is not
/// validated again, so a plan of N unchanged objects costs N comparisons, not N validations.
pub type Checks<T, V> = BTreeMap<ObjectKey, Check<T, V>>;

/// Validates every object (reusing `checks` for unchanged ones) and returns the version in
/// force per namespace plus one status per object. Only the object named `default` governs
/// its namespace.
pub fn objects_in_force<T: PartialEq, V>(
    kind: Kind,
    objects: &BTreeMap<ObjectKey, Arc<T>>,
    validate: impl Fn(&T) -> Result<V, ValidationError>,
    memory: &InForceMap<T, V>,
    checks: &Checks<T, V>,
) -> Outcome<T, V> {
    let mut in_force = BTreeMap::new();
    let mut statuses = Vec::new();
    let mut next_checks = Checks::new();
    for (key, object) in objects {
        let check = match checks.get(key) {
            Some(c) if Arc::ptr_eq(&c.object, object) || *c.object == **object => c.clone(),
            _ => Check {
                object: object.clone(),
                result: validate(object).map(Arc::new),
            },
        };
        let result = match &check.result {
            Ok(valid) => {
                let entry = InForce {
                    object: check.object.clone(),
                    valid: valid.clone(),
                };
                in_force.insert(key.namespace.clone(), entry);
                Ok(())
            }
            Err(e) => {
                if key.name == "default"
                    && let Some(last) = memory.get(&key.namespace)
                {
                    in_force.insert(key.namespace.clone(), last.clone());
                }
                // The status line already names the object: field path and problem suffice.
                Err(format!("{}: {}", e.field, e.reason))
            }
        };
        statuses.push(ObjectStatus {
            kind,
            key: ObjectKey::new(&key.namespace, &key.name),
            result,
        });
        next_checks.insert(key.clone(), check);
    }
    Outcome {
        statuses,
        memory: in_force,
        checks: next_checks,
    }
}
