//! Hand-written OpenAPI schemas for the k8s-openapi types the CRDs embed.
//!
//! k8s-openapi is built without its `schemars` feature, so `LabelSelector` and `Condition` do not
//! implement `JsonSchema`; these functions are wired in with `#[schemars(schema_with = ...)]`.
//! They follow the seed reference (and the upstream OpenAPI definitions) field for field.
//!
//! An `Option` field wired to one of them keeps `#[serde(default)]`: through `schema_with`
//! schemars cannot see the `Option`, and would list the field as required.

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
                            "description": "values is an array of string values. If the operator is In or NotIn, the values array must be non-empty. If the operator is Exists or DoesNotExist, the values array must be empty. This array is replaced during a strategic merge patch.",
                            "type": "array",
                            "items": { "type": "string" },
                            "x-kubernetes-list-type": "atomic"
                        }
                    },
                    "required": ["key", "operator"]
                },
                "x-kubernetes-list-type": "atomic"
            },
            "matchLabels": {
                "description": "matchLabels is a map of {key,value} pairs. A single {key,value} in the matchLabels map is equivalent to an element of matchExpressions, whose key field is \"key\", the operator is \"In\", and the values array contains only \"value\". The requirements are ANDed.",
                "type": "object",
                "additionalProperties": { "type": "string" }
            }
        },
        "x-kubernetes-map-type": "atomic"
    })
}

/// CloudPrivateIPConfig's `status.conditions`.
pub fn cloud_conditions(_: &mut SchemaGenerator) -> Schema {
    condition_list("condition is the assignment condition of the private IP and its status")
}

/// EgressQoS's `status.conditions`.
pub fn qos_conditions(_: &mut SchemaGenerator) -> Schema {
    condition_list(
        "An array of condition objects indicating details about status of EgressQoS object.",
    )
}

/// A list of `metav1.Condition`, keyed by `type` (list-type map, so each writer's
/// server-side apply owns its own entries), with the API's own field validations.
fn condition_list(description: &str) -> Schema {
    json_schema!({
        "description": description,
        "type": "array",
        "items": {
            "description": "Condition contains details for one aspect of the current state of this API Resource.",
            "type": "object",
            "properties": {
                "lastTransitionTime": {
                    "description": "lastTransitionTime is the last time the condition transitioned from one status to another. This should be when the underlying condition changed.  If that is not known, then using the time when the API field changed is acceptable.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "message is a human readable message indicating details about the transition. This may be an empty string.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "observedGeneration represents the .metadata.generation that the condition was set based upon. For instance, if .metadata.generation is currently 12, but the .status.conditions[x].observedGeneration is 9, the condition is out of date with respect to the current state of the instance.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "reason contains a programmatic identifier indicating the reason for the condition's last transition. Producers of specific condition types may define expected values and meanings for this field, and whether the values are considered a guaranteed API. The value should be a CamelCase string. This field may not be empty.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "status of the condition, one of True, False, Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "type of condition in CamelCase or in foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            },
            "required": ["lastTransitionTime", "message", "reason", "status", "type"]
        },
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"]
    })
}
