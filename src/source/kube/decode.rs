//! Per-object decoding. A list page is split into its items' JSON texts and each item is
//! decoded on its own (watch events likewise), so a malformed spec never fails a list or a
//! watch: a bad object is reported by name and skipped while the rest of its kind flows on.
//!
//! Items are decoded straight from their text into the typed object. Going through a
//! `DynamicObject` first (serde's flatten buffer, then a `serde_json::Value` tree, then the
//! type) allocated every field three times and was most of a cold start's decode.

use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::Value;

use super::prune::{needs_prune, prune};
use crate::snapshot::{AnyObject, Kind, ObjectKey};

/// An object that could not be decoded: who, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: Kind,
    pub key: ObjectKey,
    pub uid: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.key, self.message)
    }
}

pub fn key_of(kind: Kind, obj: &DynamicObject) -> ObjectKey {
    ObjectKey::of(kind, &obj.metadata)
}

/// Decodes, prunes and normalises one list item from its JSON text.
pub fn decode(kind: Kind, text: &str) -> Result<AnyObject, Rejection> {
    let decoded = if needs_prune(kind) {
        serde_json::from_str::<Value>(text).and_then(|value| from_value(kind, value))
    } else {
        let mut d = serde_json::Deserializer::from_str(text);
        AnyObject::deserialize(kind, &mut d).and_then(|o| d.end().map(|()| o))
    };
    decoded
        .map(normalized)
        .map_err(|e| rejection(kind, text, e.to_string()))
}

/// Decodes, prunes and normalises one watch event's object. kube has already parsed it into
/// metadata and a `Value` tree; the tree moves into the typed decoder as it is.
pub fn decode_dynamic(kind: Kind, obj: DynamicObject) -> Result<AnyObject, Rejection> {
    let key = key_of(kind, &obj);
    let uid = obj.metadata.uid.clone();
    let reject = |message: String| Rejection {
        kind,
        key: key.clone(),
        uid: uid.clone(),
        message,
    };
    let metadata = serde_json::to_value(&obj.metadata).map_err(|e| reject(e.to_string()))?;
    let mut map = match obj.data {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        _ => return Err(reject("the object is not a JSON map".into())),
    };
    map.insert("metadata".into(), metadata);
    from_value(kind, Value::Object(map))
        .map(normalized)
        .map_err(|e| reject(e.to_string()))
}

fn from_value(kind: Kind, mut value: Value) -> Result<AnyObject, serde_json::Error> {
    prune(kind, &mut value);
    AnyObject::deserialize(kind, value)
}

fn normalized(mut o: AnyObject) -> AnyObject {
    o.normalize();
    o
}

/// A rejection naming the object as far as its metadata can still be read.
fn rejection(kind: Kind, text: &str, message: String) -> Rejection {
    #[derive(Deserialize, Default)]
    struct Head {
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(Deserialize, Default)]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
    }
    // Whatever follows the object does not matter here.
    let head = Head::deserialize(&mut serde_json::Deserializer::from_str(text)).unwrap_or_default();
    let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: head.metadata.name,
        namespace: head.metadata.namespace,
        ..Default::default()
    };
    Rejection {
        kind,
        key: ObjectKey::of(kind, &meta),
        uid: head.metadata.uid,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: Value) -> String {
        v.to_string()
    }

    #[test]
    fn a_bad_spec_is_a_rejection_naming_the_object() {
        let obj = text(json!({
            "metadata": {"name": "default", "namespace": "shop", "uid": "u1"},
            "spec": {"egress": "not-a-list"}
        }));
        let r = decode(Kind::EgressFirewall, &obj).unwrap_err();
        assert_eq!(r.key, ObjectKey::new("shop", "default"));
        assert_eq!(r.uid.as_deref(), Some("u1"));
        assert!(
            r.to_string().starts_with("EgressFirewall shop/default: "),
            "{r}"
        );
        assert!(r.message.contains("invalid type"), "{r}");
    }

    #[test]
    fn good_objects_decode_without_type_meta() {
        let obj = text(json!({
            "metadata": {"name": "default", "namespace": "shop",
                "managedFields": [{"manager": "x"}]},
            "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}
        }));
        let o = decode(Kind::EgressFirewall, &obj).unwrap();
        assert_eq!(o.key(), ObjectKey::new("shop", "default"));
        assert!(o.meta().managed_fields.is_none());
    }

    /// Straight from text (Service) or through the pruned tree (Pod): the same metadata
    /// is dropped, and list items need no apiVersion or kind.
    #[test]
    fn managed_fields_and_last_applied_are_dropped_on_both_paths() {
        let meta = json!({"name": "a", "namespace": "n", "uid": "u",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}});
        for (kind, obj) in [
            (
                Kind::Service,
                json!({"metadata": meta, "spec": {"clusterIP": "10.96.0.1"}}),
            ),
            (
                Kind::Pod,
                json!({"metadata": meta, "spec": {"containers": []}}),
            ),
            (
                Kind::EndpointSlice,
                json!({"metadata": meta, "addressType": "IPv4", "endpoints": []}),
            ),
            (
                Kind::EgressIP,
                json!({"metadata": meta, "spec": {"egressIPs": [], "namespaceSelector": {}}}),
            ),
        ] {
            let o = decode(kind, &text(obj)).unwrap_or_else(|r| panic!("{r}"));
            assert!(o.meta().managed_fields.is_none(), "{kind}");
            let annotations = o.meta().annotations.clone().unwrap_or_default();
            assert_eq!(annotations.keys().collect::<Vec<_>>(), ["keep"], "{kind}");
        }
    }

    /// A watch event's object (kube's `DynamicObject`) decodes to exactly what the same
    /// object decodes to as a list item, pruned kinds included; a bad one is a rejection by
    /// name on both paths.
    #[test]
    fn the_watch_path_decodes_like_the_list_path() {
        let meta = json!({"name": "a", "namespace": "n", "uid": "u",
            "managedFields": [{"manager": "kubectl"}]});
        for (kind, obj) in [
            (
                Kind::Service,
                json!({"metadata": meta, "spec": {"clusterIP": "10.96.0.1",
                "ports": [{"port": 80}], "selector": {"app": "x"}}}),
            ),
            (
                Kind::Pod,
                json!({"metadata": meta, "spec": {"nodeName": "w1",
                "containers": [{"name": "c", "image": "i"}]}, "status": {"podIP": "10.0.0.1"}}),
            ),
            (
                Kind::EndpointSlice,
                json!({"metadata": meta, "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"]}]}),
            ),
        ] {
            let listed = decode(kind, &text(obj.clone())).unwrap_or_else(|r| panic!("{r}"));
            let dynamic: DynamicObject = serde_json::from_value(obj).unwrap();
            let watched = decode_dynamic(kind, dynamic).unwrap_or_else(|r| panic!("{r}"));
            assert_eq!(watched, listed, "{kind}");
        }
        let bad = json!({"metadata": {"name": "b", "namespace": "n", "uid": "u2"},
            "spec": {"ports": "not-a-list"}});
        for r in [
            decode(Kind::Service, &text(bad.clone())).unwrap_err(),
            decode_dynamic(Kind::Service, serde_json::from_value(bad).unwrap()).unwrap_err(),
        ] {
            assert_eq!(
                (r.key, r.uid.as_deref()),
                (ObjectKey::new("n", "b"), Some("u2"))
            );
            assert!(r.message.contains("invalid type"), "{}", r.message);
        }
    }

    #[test]
    fn trailing_garbage_and_unreadable_metadata_are_rejections() {
        let r = decode(
            Kind::Service,
            r#"{"metadata": {"name": "a", "namespace": "n"}} x"#,
        )
        .unwrap_err();
        assert_eq!(r.key, ObjectKey::new("n", "a"));
        let r = decode(Kind::Service, "[1]").unwrap_err();
        assert_eq!(r.key, ObjectKey::new("", ""), "{r}");
    }
}
