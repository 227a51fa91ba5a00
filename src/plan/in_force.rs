//! Which version of each namespaced, one-per-namespace custom resource (EgressFirewall,
//! EgressQoS) a feature plans from: the object itself when it validates, otherwise the last
//! valid version from memory, so a typo never makes a namespace fall open.

use super::ObjectStatus;
use crate::api::ValidationError;
use crate::snapshot::{Kind, ObjectKey};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a feature planner hands back besides what it adds to the table.
pub struct Outcome<V> {
    pub statuses: Vec<ObjectStatus>,
    /// The objects in force per namespace: valid now, or the last valid one if the current
    /// object is invalid. Namespaces without an object are dropped.
    pub memory: BTreeMap<String, V>,
}

/// Validates every object and returns the version in force per namespace plus one status
/// per object. Only the object named `default` governs its namespace.
pub fn objects_in_force<T, V: Clone>(
    kind: Kind,
    objects: &BTreeMap<ObjectKey, Arc<T>>,
    validate: impl Fn(&T) -> Result<V, ValidationError>,
    memory: &BTreeMap<String, V>,
) -> (BTreeMap<String, V>, Vec<ObjectStatus>) {
    let mut in_force = BTreeMap::new();
    let mut statuses = Vec::new();
    for (key, object) in objects {
        let result = match validate(object) {
            Ok(valid) => {
                in_force.insert(key.namespace.clone(), valid);
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
    }
    (in_force, statuses)
}
