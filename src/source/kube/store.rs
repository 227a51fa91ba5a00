//! The reflector store: every kind's objects in one [`SnapshotBuilder`], replaced per kind
//! atomically when that kind's (re)list completes, and a record of which kinds have synced.

use std::collections::{BTreeMap, BTreeSet};

use crate::snapshot::{AnyObject, Kind, ObjectKey, Snapshot, SnapshotBuilder};

/// One change from a kind's watch, objects already decoded.
#[derive(Debug)]
pub enum Update {
    /// A (re)list starts: objects until `InitDone` replace the kind's objects.
    Init(Kind),
    InitApply(AnyObject),
    InitDone(Kind),
    Apply(AnyObject),
    Delete(Kind, ObjectKey),
}

/// What an update did to the store's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    None,
    /// Published after the debounce.
    Changed,
    /// Published at once: an EgressIP's `status.items` changed (an egress IP moved, was
    /// assigned or released), where every debounced millisecond is takeover time; or a
    /// CloudPrivateIPConfig's status did (the cloud attached or refused an egress IP, which
    /// the assigner turns into `status.items`).
    Urgent,
}

impl Change {
    pub fn any(self) -> bool {
        self != Change::None
    }
}

/// The `status.items` of an EgressIP (empty for another kind or no object).
fn egress_ip_items(obj: Option<&AnyObject>) -> Vec<(String, String)> {
    match obj {
        Some(AnyObject::EgressIP(e)) => e
            .status
            .iter()
            .flat_map(|s| &s.items)
            .map(|i| (i.egress_ip.clone(), i.node.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The status of a CloudPrivateIPConfig (None for another kind or no object).
fn cloud_status(obj: Option<&AnyObject>) -> Option<&crate::api::CloudPrivateIPConfigStatus> {
    match obj {
        Some(AnyObject::CloudPrivateIPConfig(c)) => c.status.as_ref(),
        _ => None,
    }
}

fn classify(before: Option<&AnyObject>, after: Option<&AnyObject>) -> Change {
    let eip = |o: Option<&AnyObject>| o.is_some_and(|o| o.kind() == Kind::EgressIP);
    let moved = (eip(before) || eip(after)) && egress_ip_items(before) != egress_ip_items(after);
    let cloud_answered = after.is_some() && cloud_status(before) != cloud_status(after);
    if moved || cloud_answered {
        Change::Urgent
    } else {
        Change::Changed
    }
}

#[derive(Debug, Default)]
pub struct Store {
    objects: SnapshotBuilder,
    /// Objects of a list in progress, per kind.
    listing: BTreeMap<Kind, Vec<AnyObject>>,
    /// Kinds whose first list completed.
    synced: BTreeSet<Kind>,
}

impl Store {
    /// Applies one update; says whether (and how urgently) the objects changed.
    pub fn apply(&mut self, update: Update) -> Change {
        match update {
            Update::Init(kind) => {
                self.listing.insert(kind, Vec::new());
                Change::None
            }
            Update::InitApply(obj) => {
                self.listing.entry(obj.kind()).or_default().push(obj);
                Change::None
            }
            Update::InitDone(kind) => {
                // A relist (after 410 Gone or a restart) replaces the kind wholesale, so
                // objects deleted while the watch was down disappear too.
                self.objects.clear_kind(kind);
                for obj in self.listing.remove(&kind).unwrap_or_default() {
                    self.objects.insert(obj);
                }
                self.synced.insert(kind);
                Change::Changed
            }
            Update::Apply(obj) => {
                let after = matches!(obj.kind(), Kind::EgressIP | Kind::CloudPrivateIPConfig)
                    .then(|| obj.clone());
                let before = self.objects.insert(obj);
                classify(before.as_ref(), after.as_ref())
            }
            Update::Delete(kind, key) => match self.objects.remove(kind, &key) {
                Some(before) => classify(Some(&before), None),
                None => Change::None,
            },
        }
    }

    /// Marks a kind as synced with no objects (its API is not served in this cluster).
    pub fn mark_absent(&mut self, kind: Kind) {
        self.synced.insert(kind);
    }

    pub fn is_synced(&self, kind: Kind) -> bool {
        self.synced.contains(&kind)
    }

    /// True once every kind's first list completed: never plan a partial view.
    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.synced.contains(k))
    }

    /// Kinds still waiting for their first list.
    pub fn unsynced(&self) -> Vec<Kind> {
        Kind::ALL
            .iter()
            .copied()
            .filter(|k| !self.synced.contains(k))
            .collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        self.objects.clone().build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Namespace;

    fn ns(name: &str) -> AnyObject {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.into());
        n.into()
    }

    #[test]
    fn relist_replaces_a_kind_and_sync_needs_every_kind() {
        let mut s = Store::default();
        s.apply(Update::Init(Kind::Namespace));
        s.apply(Update::InitApply(ns("a")));
        s.apply(Update::InitApply(ns("b")));
        assert_eq!(
            s.snapshot().count(Kind::Namespace),
            0,
            "nothing before InitDone"
        );
        assert!(s.apply(Update::InitDone(Kind::Namespace)).any());
        assert_eq!(s.snapshot().count(Kind::Namespace), 2);
        assert!(s.is_synced(Kind::Namespace) && !s.all_synced());

        s.apply(Update::Init(Kind::Namespace));
        s.apply(Update::InitApply(ns("c")));
        assert_eq!(
            s.snapshot().count(Kind::Namespace),
            2,
            "old view until relisted"
        );
        s.apply(Update::InitDone(Kind::Namespace));
        let snap = s.snapshot();
        assert_eq!(snap.count(Kind::Namespace), 1);
        assert!(
            snap.get(Kind::Namespace, &ObjectKey::cluster("c"))
                .is_some()
        );

        assert_eq!(
            s.apply(Update::Delete(Kind::Namespace, ObjectKey::cluster("c"))),
            Change::Changed
        );
        assert_eq!(
            s.apply(Update::Delete(Kind::Namespace, ObjectKey::cluster("c"))),
            Change::None
        );
        for k in Kind::ALL {
            s.mark_absent(*k);
        }
        assert!(s.all_synced() && s.unsynced().is_empty());
    }

    #[test]
    fn a_moved_egress_ip_is_urgent_and_other_changes_are_not() {
        use crate::testing::objects;
        let eip = |hosts: &[(&str, &str)], label: &str| -> AnyObject {
            objects::egress_ip("e", &["192.168.50.200"], &[("team", label)])
                .hosted(hosts)
                .object()
                .into()
        };
        let mut s = Store::default();
        let on1 = [("192.168.50.200", "node-1")];
        let on3 = [("192.168.50.200", "node-3")];
        assert_eq!(s.apply(Update::Apply(eip(&[], "a"))), Change::Changed);
        assert_eq!(
            s.apply(Update::Apply(eip(&on1, "a"))),
            Change::Urgent,
            "assigned"
        );
        assert_eq!(
            s.apply(Update::Apply(eip(&on1, "b"))),
            Change::Changed,
            "spec only"
        );
        assert_eq!(
            s.apply(Update::Apply(eip(&on3, "b"))),
            Change::Urgent,
            "moved"
        );
        assert_eq!(s.apply(Update::Apply(ns("x"))), Change::Changed);
        // The cloud's answer on a CloudPrivateIPConfig is urgent too; its spec is not.
        let cpic = |node: &str, status: Option<&str>| -> AnyObject {
            let mut v = serde_json::json!({"apiVersion": "cloud.network.openshift.io/v1",
                "kind": "CloudPrivateIPConfig", "metadata": {"name": "192.168.50.200"},
                "spec": {"node": node}});
            if let Some(st) = status {
                v["status"] = serde_json::json!({"node": node, "conditions": [{"type": "Assigned",
                    "status": st, "reason": "CloudResponseSuccess", "message": "",
                    "lastTransitionTime": "2024-01-01T00:00:00Z"}]});
            }
            let c: crate::api::CloudPrivateIPConfig = serde_json::from_value(v).unwrap();
            AnyObject::CloudPrivateIPConfig(std::sync::Arc::new(c))
        };
        assert_eq!(
            s.apply(Update::Apply(cpic("node-1", None))),
            Change::Changed
        );
        assert_eq!(
            s.apply(Update::Apply(cpic("node-1", Some("True")))),
            Change::Urgent,
            "attached"
        );
        assert_eq!(
            s.apply(Update::Apply(cpic("node-1", Some("True")))),
            Change::Changed
        );
        let key = ObjectKey::cluster("e");
        assert_eq!(
            s.apply(Update::Delete(Kind::EgressIP, key)),
            Change::Urgent,
            "released"
        );
    }
}
