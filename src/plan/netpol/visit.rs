//! Which policies a plan looks at: those that can have changed, not all in force. A policy's
//! plan depends on the policy, on the pods of its namespace it selects, on the pods it
//! resolves a named egress port on and on the families of its shared peer sets (`memo`).
//! So a plan visits the policies whose object changed, the policies of the namespace of
//! each changed pod and the (few) policies with a named egress port; `still_current` then
//! decides which of them is planned again. A changed namespace or a peer set that gained or
//! lost a family visits every policy (rare).

use super::memo::Changes;
use super::peers::PeerKey;
use super::{NetworkPolicy, ValidatedPolicy};
use crate::plan::in_force::InForceMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The policies one plan visits, by `namespace/name`.
pub enum Visit {
    /// Every policy: the first plan, a namespace changed or a peer set flipped a family.
    All,
    /// These keys (in force or not any more).
    Only(BTreeSet<String>),
}

/// The policies a plan visits: `changed`, the keys whose policy in force changed (`None`:
/// unknown, visit all), and those the changed pods can touch.
pub fn policies(
    changed: Option<&BTreeSet<String>>,
    changes: &Changes,
    flipped: &BTreeSet<Arc<PeerKey>>,
    in_force: &InForceMap<NetworkPolicy, ValidatedPolicy>,
    named_egress: &imbl::OrdSet<String>,
) -> Visit {
    let Some(changed) = changed else {
        return Visit::All;
    };
    if changes.everything || !flipped.is_empty() {
        return Visit::All;
    }
    let mut keys = changed.clone();
    let pods = changes.pods.iter().flat_map(|(b, a)| [b, a]).flatten();
    for namespace in pods.filter_map(|pod| pod.metadata.namespace.as_deref()) {
        keys.extend(in_namespace(in_force, namespace).map(|(key, _)| key.clone()));
    }
    if !changes.pods.is_empty() {
        keys.extend(named_egress.iter().cloned());
    }
    Visit::Only(keys)
}

impl Visit {
    /// The visited entries of `map` (the policies in force, or the last plan's), in key order.
    pub fn entries<'a, V>(
        &'a self,
        map: &'a imbl::OrdMap<String, V>,
    ) -> Box<dyn Iterator<Item = (&'a String, &'a V)> + 'a> {
        match self {
            Visit::All => Box::new(map.iter()),
            Visit::Only(keys) => Box::new(keys.iter().filter_map(|k| map.get_key_value(k))),
        }
    }
}

/// Whether a policy of `namespace` is in force.
pub fn has_policies(
    in_force: &InForceMap<NetworkPolicy, ValidatedPolicy>,
    namespace: &str,
) -> bool {
    in_namespace(in_force, namespace).next().is_some()
}

/// The entries of `namespace` in a map keyed by `namespace/name`: the keys from `<ns>/` up to
/// `<ns>0` (`0` follows `/`; a namespace name has no `/`).
fn in_namespace<'a, V: Clone>(
    map: &'a imbl::OrdMap<String, V>,
    namespace: &str,
) -> impl Iterator<Item = (&'a String, &'a V)> + 'a {
    map.range(format!("{namespace}/")..format!("{namespace}0"))
}
