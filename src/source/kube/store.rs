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

#[derive(Debug, Default)]
pub struct Store {
    objects: SnapshotBuilder,
    /// Objects of a list in progress, per kind.
    listing: BTreeMap<Kind, Vec<AnyObject>>,
    /// Kinds whose first list completed.
    synced: BTreeSet<Kind>,
}

impl Store {
    /// Applies one update; true if the objects changed.
    pub fn apply(&mut self, update: Update) -> bool {
        match update {
            Update::Init(kind) => {
                self.listing.insert(kind, Vec::new());
                false
            }
            Update::InitApply(obj) => {
                self.listing.entry(obj.kind()).or_default().push(obj);
                false
            }
            Update::InitDone(kind) => {
                // A relist (after 410 Gone or a restart) replaces the kind wholesale, so
                // objects deleted while the watch was down disappear too.
                self.objects.clear_kind(kind);
                for obj in self.listing.remove(&kind).unwrap_or_default() {
                    self.objects.insert(obj);
                }
                self.synced.insert(kind);
                true
            }
            Update::Apply(obj) => {
                self.objects.insert(obj);
                true
            }
            Update::Delete(kind, key) => self.objects.remove(kind, &key).is_some(),
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
        assert!(s.apply(Update::InitDone(Kind::Namespace)));
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

        assert!(s.apply(Update::Delete(Kind::Namespace, ObjectKey::cluster("c"))));
        assert!(!s.apply(Update::Delete(Kind::Namespace, ObjectKey::cluster("c"))));
        for k in Kind::ALL {
            s.mark_absent(*k);
        }
        assert!(s.all_synced() && s.unsynced().is_empty());
    }
}
