//! Per-object decoding. The watch itself reads `DynamicObject`s (metadata plus free-form
//! data), so a malformed spec never fails a list or a watch: each object is decoded on its own
//! and a bad one is reported by name and skipped while the rest of its kind flows on.

use kube::api::DynamicObject;
use serde_json::Value;

use super::prune::prune;
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

/// Decodes, prunes and normalises one watched object.
pub fn decode(kind: Kind, obj: DynamicObject) -> Result<AnyObject, Rejection> {
    let key = key_of(kind, &obj);
    let uid = obj.metadata.uid.clone();
    let reject = |message: String| Rejection {
        kind,
        key: key.clone(),
        uid: uid.clone(),
        message,
    };
    // The free-form data (spec, status...) moves over as it is; only the metadata is
    // serialized again (serializing the whole object was most of a cold start's decode).
    let metadata = serde_json::to_value(&obj.metadata).map_err(|e| reject(e.to_string()))?;
    let mut value = match obj.data {
        Value::Object(map) => Value::Object(map),
        Value::Null => Value::Object(serde_json::Map::new()),
        _ => return Err(reject("the object is not a JSON map".into())),
    };
    if let Some(map) = value.as_object_mut() {
        map.insert("metadata".into(), metadata);
        // List items come without their type; the typed decoders want it.
        map.insert("apiVersion".into(), Value::from(kind.api_version()));
        map.insert("kind".into(), Value::from(kind.as_str()));
    }
    prune(kind, &mut value);
    let mut decoded = AnyObject::deserialize(kind, value).map_err(|e| reject(e.to_string()))?;
    decoded.normalize();
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dynamic(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_bad_spec_is_a_rejection_naming_the_object() {
        let obj = dynamic(json!({
            "metadata": {"name": "default", "namespace": "shop", "uid": "u1"},
            "spec": {"egress": "not-a-list"}
        }));
        let r = decode(Kind::EgressFirewall, obj).unwrap_err();
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
        let obj = dynamic(json!({
            "metadata": {"name": "default", "namespace": "shop",
                "managedFields": [{"manager": "x"}]},
            "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}
        }));
        let o = decode(Kind::EgressFirewall, obj).unwrap();
        assert_eq!(o.key(), ObjectKey::new("shop", "default"));
        assert!(o.meta().managed_fields.is_none());
    }
}
