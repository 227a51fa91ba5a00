//! Hand-written OpenAPI schemas for the k8s-openapi types the CRDs embed.
//!
//! k8s-openapi is built without its `schemars` feature, so `LabelSelector` and `Condition` do not
//! implement `JsonSchema`; these functions are wired in with `#[schemars(schema_with = ...)]`.
//! They follow the seed reference (and the upstream OpenAPI definitions) field for field.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `metav1.LabelSelector`: `matchLabels` and `matchExpressions`, ANDed.
pub fn label_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A label selector is a label query over a set of resources. The result of matchLabels and matchExpressions are ANDed. An empty label selector matches all objects.",
        "type": "object",
        "properties": {
            "matchExpressions": {
                "description": "matchExpressions is a list of label selector requirements. The requirements are ANDed.",
                "type": "array",
                "items": {
                    "description": "A label selector requirement is a selector that contains values, a key, and an operator that relates the key and values.",
                    "type": "object",
                    "properties": {
                        "key": {
                            "description": "key is the label key that the selector applies to.",
                            "type": "string"
                        },
                        "operator": {
                            "description": "operator represents a key's relationship to a set of values. Valid operators are In, NotIn, Exists and DoesNotExist.",
                            "type": "string"
                        },
                        "values": {
                            "description": "values is an array of string values. If the operator is In or NotIn, the values array must be non-empty. If the operator is Exists or DoesNotExist, the values array must be empty.",
                            "type": "array",
                            "items": { "type": "string" }
                        }
                    },
                    "required": ["key", "operator"]
                }
            },
            "matchLabels": {
                "description": "matchLabels is a map of {key,value} pairs. The requirements are ANDed.",
                "type": "object",
                "additionalProperties": { "type": "string" }
            }
        },
        "x-kubernetes-map-type": "atomic"
    })
}

/// A list of `metav1.Condition`.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "condition is the assignment condition of the private IP and its status",
        "type": "array",
        "items": {
            "description": "Condition contains details for one aspect of the current state of this API Resource.",
            "type": "object",
            "properties": {
                "lastTransitionTime": { "type": "string", "format": "date-time" },
                "message": { "type": "string", "maxLength": 32768 },
                "observedGeneration": { "type": "integer", "format": "int64", "minimum": 0 },
                "reason": { "type": "string", "maxLength": 1024, "minLength": 1 },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "type": { "type": "string", "maxLength": 316 }
            },
            "required": ["lastTransitionTime", "message", "reason", "status", "type"]
        }
    })
}
