//! Cached objects keep only what planners read. A pod carries its containers, volumes and
//! conditions; a node its images and its spec but the taints. In a large cluster that is most
//! of the memory a reflector would hold. (Every object's managedFields and last-applied
//! annotation go in `AnyObject::normalize`.)

use serde_json::{Map, Value};

use crate::snapshot::Kind;

/// Pod spec fields planners read; of the containers only their name (which the typed Pod
/// requires) and named ports (NetworkPolicy resolves named ports on them) are kept.
const POD_SPEC: &[&str] = &["nodeName", "hostNetwork", "containers"];
const CONTAINER_PORT_FIELDS: &[&str] = &["name", "containerPort", "protocol"];
const POD_STATUS: &[&str] = &["phase", "podIP", "podIPs"];
const NODE_STATUS: &[&str] = &["addresses", "conditions"];
/// The one node condition read (EgressIP candidates must be Ready), and its fields: the
/// heartbeat times change with every kubelet status update and would make every node's
/// update a new snapshot.
const NODE_CONDITION: &str = "Ready";
const CONDITION_FIELDS: &[&str] = &["type", "status"];
/// The node spec keeps only its taints (the proxy health server's node eligibility reads
/// `ToBeDeletedByClusterAutoscaler`), each only its key and effect: a taint's value and
/// `timeAdded` are nobody's input; and `providerID` (the EgressIP assigner's platform
/// detection).
const NODE_SPEC: &[&str] = &["taints", "providerID"];
const TAINT_FIELDS: &[&str] = &["key", "effect"];

/// Whether `kind` is pruned before it is decoded (the others decode straight from text).
pub fn needs_prune(kind: Kind) -> bool {
    matches!(kind, Kind::Pod | Kind::Node)
}

/// Strips unused data from a raw object before it is decoded.
pub fn prune(kind: Kind, value: &mut Value) {
    let Some(obj) = value.as_object_mut() else {
        return;
    };
    match kind {
        Kind::Pod => {
            keep_only(obj, "spec", POD_SPEC);
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                let containers = spec.remove("containers");
                let kept = containers
                    .into_iter()
                    .filter_map(|c| match c {
                        Value::Array(list) => Some(list),
                        _ => None,
                    })
                    .flatten()
                    .filter_map(named_ports_only)
                    .collect();
                spec.insert("containers".into(), Value::Array(kept));
            }
            keep_only(obj, "status", POD_STATUS);
        }
        Kind::Node => {
            keep_only(obj, "spec", NODE_SPEC);
            let taints = obj
                .get_mut("spec")
                .and_then(|s| s.get_mut("taints"))
                .and_then(Value::as_array_mut);
            for t in taints
                .into_iter()
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                t.retain(|k, _| TAINT_FIELDS.contains(&k.as_str()));
            }
            keep_only(obj, "status", NODE_STATUS);
            let conditions = obj
                .get_mut("status")
                .and_then(|s| s.get_mut("conditions"))
                .and_then(Value::as_array_mut);
            if let Some(conditions) = conditions {
                conditions.retain(|c| c["type"] == NODE_CONDITION);
                for c in conditions.iter_mut().filter_map(Value::as_object_mut) {
                    c.retain(|k, _| CONDITION_FIELDS.contains(&k.as_str()));
                }
            }
        }
        _ => {}
    }
}

/// A container reduced to its name and its named ports (`name`, `containerPort`,
/// `protocol`); `None` when it has no named port.
fn named_ports_only(container: Value) -> Option<Value> {
    let Value::Object(mut c) = container else {
        return None;
    };
    let ports: Vec<Value> = match c.remove("ports") {
        Some(Value::Array(ports)) => ports
            .into_iter()
            .filter_map(|p| match p {
                Value::Object(mut p) if p.contains_key("name") => {
                    p.retain(|k, _| CONTAINER_PORT_FIELDS.contains(&k.as_str()));
                    Some(Value::Object(p))
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if ports.is_empty() {
        return None;
    }
    let mut kept = Map::new();
    kept.insert("name".into(), c.remove("name").unwrap_or_default());
    kept.insert("ports".into(), Value::Array(ports));
    Some(Value::Object(kept))
}

fn keep_only(obj: &mut Map<String, Value>, field: &str, keep: &[&str]) {
    if let Some(inner) = obj.get_mut(field).and_then(Value::as_object_mut) {
        inner.retain(|k, _| keep.contains(&k.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::AnyObject;
    use serde_json::json;

    #[test]
    fn pods_keep_what_planners_read() {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "n", "labels": {"app": "x"},
                "annotations": {"keep": "me"}},
            "spec": {"nodeName": "w1", "hostNetwork": false,
                "containers": [{"name": "c", "image": "i"},
                    {"name": "web", "image": "i", "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP", "hostPort": 80},
                        {"containerPort": 9090}]}],
                "volumes": [{"name": "v"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                "conditions": [{"type": "Ready"}]}
        });
        prune(Kind::Pod, &mut pod);
        assert_eq!(
            pod,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a", "namespace": "n", "labels": {"app": "x"},
                    "annotations": {"keep": "me"}},
                "spec": {"nodeName": "w1", "hostNetwork": false, "containers": [
                    {"name": "web", "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}
            })
        );
        let decoded = AnyObject::deserialize(Kind::Pod, &pod).unwrap();
        assert_eq!(decoded.meta().name.as_deref(), Some("a"));
    }

    #[test]
    fn nodes_keep_addresses_ready_taints_provider_id_and_annotations_only() {
        let cidrs = r#"["192.0.2.1/24"]"#;
        let mut node = json!({
            "metadata": {"name": "w1", "labels": {"a": "b"},
                "annotations": {"k8s.ovn.org/host-cidrs": cidrs}},
            "spec": {"podCIDR": "10.0.0.0/24", "providerID": "aws:///us-east-1a/i-0abc",
                "taints": [{"key": "ToBeDeletedByClusterAutoscaler",
                "value": "1700000000", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": "2024-01-01T00:00:00Z"}],
                "images": [{"names": ["x"], "sizeBytes": 1}]}
        });
        prune(Kind::Node, &mut node);
        assert_eq!(
            node,
            json!({"metadata": {"name": "w1", "labels": {"a": "b"},
                    "annotations": {"k8s.ovn.org/host-cidrs": cidrs}},
                "spec": {"providerID": "aws:///us-east-1a/i-0abc",
                    "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                    "conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let decoded = AnyObject::deserialize(Kind::Node, &node).unwrap();
        assert_eq!(decoded.meta().name.as_deref(), Some("w1"));
    }
}
