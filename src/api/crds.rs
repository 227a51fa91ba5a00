//! The CustomResourceDefinitions shipped in `deploy/`: generated from the Rust types (so the
//! schema cannot drift from what the agent decodes), tightened with the validations the
//! upstream OVN-Kubernetes CRDs carry and the API semantics (README) require (one object
//! named `default` per namespace, rule types, port and DSCP ranges, rule count limits). The
//! agent validates again on its own (`validate`), since a cluster may run other CRD versions.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::egress_firewall::MAX_EGRESS_FIREWALL_RULES;
use super::{CloudPrivateIPConfig, EgressFirewall, EgressIP, EgressQoS};

/// OVN-Kubernetes caps an EgressQoS at 1000 rules.
const MAX_EGRESS_QOS_RULES: usize = 1000;

/// `(file name under deploy/, CRD)` for the four custom resources.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        (
            "crd-egressfirewalls.yaml",
            tighten(EgressFirewall::crd(), firewall),
        ),
        ("crd-egressqoses.yaml", tighten(EgressQoS::crd(), qos)),
        ("crd-egressips.yaml", tighten(EgressIP::crd(), egress_ip)),
        (
            "crd-cloudprivateipconfigs.yaml",
            tighten(CloudPrivateIPConfig::crd(), |_| {}),
        ),
    ]
}

/// The openAPIV3Schema of a CRD's only version.
pub fn schema(crd: &CustomResourceDefinition) -> Value {
    let v = serde_json::to_value(crd).expect("CRD serialises");
    v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn tighten(crd: CustomResourceDefinition, f: impl Fn(&mut Value)) -> CustomResourceDefinition {
    let mut v = serde_json::to_value(crd).expect("CRD serialises");
    f(&mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
    serde_json::from_value(v).expect("tightened CRD decodes")
}

fn at<'a>(schema: &'a mut Value, pointer: &str) -> &'a mut Value {
    schema
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("CRD schema has no {pointer}"))
}

fn merge(schema: &mut Value, pointer: &str, extra: Value) {
    let target = at(schema, pointer).as_object_mut().expect("schema object");
    for (k, v) in extra.as_object().expect("object").clone() {
        target.insert(k, v);
    }
}

/// One per namespace, named `default`, as OVN-Kubernetes enforces.
fn named_default(schema: &mut Value) {
    schema["properties"]["metadata"] = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^default$"}}
    });
}

/// `status.messages` is merged across the node agents' field managers.
fn messages_set(schema: &mut Value) {
    merge(
        schema,
        "/properties/status/properties/messages",
        json!({"x-kubernetes-list-type": "set"}),
    );
}

fn firewall(s: &mut Value) {
    named_default(s);
    messages_set(s);
    merge(
        s,
        "/properties/spec/properties/egress",
        json!({"maxItems": MAX_EGRESS_FIREWALL_RULES}),
    );
    let rule = "/properties/spec/properties/egress/items/properties";
    merge(
        s,
        &format!("{rule}/type"),
        json!({"pattern": "^(Allow|Deny)$"}),
    );
    merge(
        s,
        &format!("{rule}/ports/items/properties/protocol"),
        json!({"pattern": "^(TCP|UDP|SCTP)$"}),
    );
    merge(
        s,
        &format!("{rule}/ports/items/properties/port"),
        json!({"minimum": 1, "maximum": 65535}),
    );
    merge(
        s,
        &format!("{rule}/to/properties/dnsName"),
        json!({"pattern": "^(\\*\\.)?([A-Za-z0-9-]+\\.)*[A-Za-z0-9-]+\\.?$"}),
    );
    // Exactly one destination (the OVN-Kubernetes CRD uses the same oneOf).
    merge(
        s,
        &format!("{rule}/to"),
        json!({"minProperties": 1, "maxProperties": 1}),
    );
}

fn qos(s: &mut Value) {
    named_default(s);
    messages_set(s);
    merge(
        s,
        "/properties/spec/properties/egress",
        json!({"maxItems": MAX_EGRESS_QOS_RULES}),
    );
    let rule = "/properties/spec/properties/egress/items";
    merge(s, rule, json!({"required": ["dscp"]}));
    merge(
        s,
        &format!("{rule}/properties/dscp"),
        json!({"minimum": 0, "maximum": 63}),
    );
}

fn egress_ip(s: &mut Value) {
    merge(
        s,
        "/properties/spec/properties/egressIPs",
        json!({"minItems": 1}),
    );
}
