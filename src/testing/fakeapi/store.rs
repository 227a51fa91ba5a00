//! The fake API server's data: objects per resource with a global resourceVersion, the event
//! history watches resume from (compactable, for `410 Gone`), and every write request made.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// REST coordinates of the kinds the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

pub const RESOURCES: &[Resource] = &[
    r("", "v1", "namespaces", "Namespace", false),
    r("", "v1", "pods", "Pod", true),
    r("", "v1", "nodes", "Node", false),
    r("", "v1", "services", "Service", true),
    r("", "v1", "endpoints", "Endpoints", true),
    r(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
    ),
    r(
        "k8s.ovn.org",
        "v1",
        "egressfirewalls",
        "EgressFirewall",
        true,
    ),
    r("k8s.ovn.org", "v1", "egressqoses", "EgressQoS", true),
    r("k8s.ovn.org", "v1", "egressips", "EgressIP", false),
    r(
        "cloud.network.openshift.io",
        "v1",
        "cloudprivateipconfigs",
        "CloudPrivateIPConfig",
        false,
    ),
    r(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
    ),
    r("coordination.k8s.io", "v1", "leases", "Lease", true),
];

const fn r(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
    }
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn by_kind(kind: &str) -> Resource {
        *RESOURCES
            .iter()
            .find(|r| r.kind == kind)
            .unwrap_or_else(|| panic!("fake API serves no kind {kind}"))
    }

    pub fn by_path(group: &str, version: &str, plural: &str) -> Option<Resource> {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .copied()
    }
}

/// `namespace/name` (namespace empty for cluster-scoped objects).
pub type Key = (String, String);

#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    pub resource: Resource,
    pub kind: &'static str,
    pub object: Value,
}

/// A write request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Recorded {
    /// A query parameter's value.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| v.to_string())
        })
    }
}

#[derive(Debug, Default)]
pub struct State {
    pub rv: u64,
    pub objects: BTreeMap<Resource, BTreeMap<Key, Value>>,
    pub history: Vec<WatchEvent>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    pub compacted_below: u64,
    pub writes: Vec<Recorded>,
    /// Completed list requests per kind.
    pub lists: BTreeMap<&'static str, usize>,
    /// Server-side-applied status per object and field manager (for the set-merged
    /// `status.messages`).
    pub status_by_manager: BTreeMap<(Resource, Key), BTreeMap<String, Value>>,
    /// Lease writes refused with `409` (stale resourceVersion, name taken).
    pub lease_conflicts: usize,
    /// Kinds served without a status subresource (as OVN-Kubernetes' EgressIP CRD): PATCH on
    /// `/status` is `404` and status is written with the object.
    pub no_status_subresource: std::collections::BTreeSet<&'static str>,
}

pub fn key_of(resource: Resource, obj: &Value) -> Key {
    let meta = &obj["metadata"];
    let ns = if resource.namespaced {
        meta["namespace"].as_str().unwrap_or("default").to_string()
    } else {
        String::new()
    };
    (
        ns,
        meta["name"].as_str().expect("metadata.name").to_string(),
    )
}

impl State {
    /// Creates or replaces an object (the test's `kubectl apply`).
    pub fn put(&mut self, mut obj: Value) -> WatchEvent {
        let kind = obj["kind"].as_str().expect("kind").to_string();
        let resource = Resource::by_kind(&kind);
        let key = key_of(resource, &obj);
        self.rv += 1;
        let rv = self.rv;
        let map = self.objects.entry(resource).or_default();
        let existed = map.contains_key(&key);
        let released = obj["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
        if existed && released && !obj["metadata"]["deletionTimestamp"].is_null() {
            // The last finalizer of an object being deleted is gone: so is the object.
            map.remove(&key);
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            return self.record(rv, resource, "DELETED", obj);
        }
        let meta = obj["metadata"].as_object_mut().expect("metadata");
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("uid")
            .or_insert_with(|| json!(format!("uid-{}-{}", kind, key.1)));
        if resource.namespaced {
            meta.insert("namespace".into(), json!(key.0));
        }
        map.insert(key, obj.clone());
        self.record(
            rv,
            resource,
            if existed { "MODIFIED" } else { "ADDED" },
            obj,
        )
    }

    /// A DELETE request: an object with finalizers only gets its `deletionTimestamp` (watchers
    /// see MODIFIED) and goes once its last finalizer is removed ([`Self::put`] of it without
    /// one), as on a real API server; others go at once.
    pub fn request_delete(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<WatchEvent> {
        let resource = Resource::by_kind(kind);
        let key = (namespace.to_string(), name.to_string());
        let obj = self.objects.get(&resource)?.get(&key)?;
        let held = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !held {
            return self.delete(kind, namespace, name);
        }
        let mut obj = obj.clone();
        if obj["metadata"]["deletionTimestamp"].is_null() {
            let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
            obj["metadata"]["deletionTimestamp"] = json!(now.to_string());
        }
        Some(self.put(obj))
    }

    pub fn delete(&mut self, kind: &str, namespace: &str, name: &str) -> Option<WatchEvent> {
        let resource = Resource::by_kind(kind);
        let key = (namespace.to_string(), name.to_string());
        let mut obj = self.objects.get_mut(&resource)?.remove(&key)?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        Some(self.record(self.rv, resource, "DELETED", obj))
    }

    fn record(
        &mut self,
        rv: u64,
        resource: Resource,
        kind: &'static str,
        object: Value,
    ) -> WatchEvent {
        let ev = WatchEvent {
            rv,
            resource,
            kind,
            object,
        };
        self.history.push(ev.clone());
        ev
    }

    /// Forgets the history: every watch resuming from an older resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.compacted_below = self.rv + 1;
        self.history.clear();
    }

    /// Server-side apply of `status` by one field manager: `status.messages` is a
    /// list-type=set and `status.conditions` a list-type=map keyed by `type`, both merged
    /// across managers; other fields are last-writer-wins.
    pub fn apply_status(
        &mut self,
        resource: Resource,
        key: &Key,
        manager: &str,
        status: Value,
    ) -> Option<WatchEvent> {
        let mut obj = self.objects.get(&resource)?.get(key)?.clone();
        let per_manager = self
            .status_by_manager
            .entry((resource, key.clone()))
            .or_default();
        if per_manager.is_empty() {
            // Entries written before the first apply stay owned by their (update) writer.
            per_manager.insert("before-apply".into(), obj["status"].clone());
        }
        per_manager.insert(manager.to_string(), status.clone());
        let mut messages: Vec<Value> = Vec::new();
        for s in per_manager.values() {
            for m in s["messages"].as_array().into_iter().flatten() {
                if !messages.contains(m) {
                    messages.push(m.clone());
                }
            }
        }
        // Conditions by type: the last manager to apply a type owns that entry.
        let mut conditions: Vec<Value> = Vec::new();
        for s in per_manager.values() {
            for c in s["conditions"].as_array().into_iter().flatten() {
                conditions.retain(|o| o["type"] != c["type"]);
                conditions.push(c.clone());
            }
        }
        let mut merged = obj["status"].as_object().cloned().unwrap_or_default();
        for (k, v) in status.as_object().into_iter().flatten() {
            merged.insert(k.clone(), v.clone());
        }
        if !messages.is_empty() {
            merged.insert("messages".into(), Value::Array(messages));
        }
        if !conditions.is_empty() {
            merged.insert("conditions".into(), Value::Array(conditions));
        }
        obj["status"] = Value::Object(merged);
        Some(self.put(obj))
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let obj = target.as_object_mut().expect("object");
    for (k, v) in patch {
        if v.is_null() {
            obj.remove(k);
        } else {
            merge_patch(obj.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Label selector subset the agent uses: `key`, `!key`, `key=value`, `key!=value`, ANDed.
pub fn labels_match(selector: &str, obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim_end_matches('=')].as_str() == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

/// Field selector subset: `metadata.name=`, `metadata.namespace=`, `spec.nodeName=`.
pub fn fields_match(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((field, want)) = term.split_once('=') else {
            return false;
        };
        let pointer = format!("/{}", field.replace('.', "/"));
        obj.pointer(&pointer).and_then(Value::as_str).unwrap_or("") == want.trim_start_matches('=')
    })
}
