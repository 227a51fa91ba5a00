//! The CustomResourceDefinitions shipped in `deploy/`: generated from the Rust types (so the
//! schema cannot drift from what the agent decodes), tightened with the validations the
//! upstream OVN-Kubernetes CRDs carry and the API semantics (README) require (one object
//! named `default` per namespace, rule types, port and DSCP ranges, rule count limits). The
//! agent validates again on its own (`validate`), since a cluster may run other CRD versions.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::egress_firewall::MAX_EGRESS_FIREWALL_RULES;
use super::egress_qos::MAX_EGRESS_QOS_RULES;
use super::{CloudPrivateIPConfig, EgressFirewall, EgressIP, EgressQoS};

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
            tighten(CloudPrivateIPConfig::crd(), cloud_private_ip),
        ),
    ]
}

/// The openAPIV3Schema of a CRD's only version.
pub fn schema(crd: &CustomResourceDefinition) -> Value {
    let v = serde_json::to_value(crd).expect("CRD serialises");
    v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Brings a generated CRD to the upstream one's shape (tests/integration/crd_upstream.rs
/// lists what still differs, and why): `listKind`, no `nullable` (upstream has none: a null
/// is pruned, which is how the agent reads an absent field anyway), no schemars `title`, the
/// `apiVersion` and `kind` properties; then `f` adds the kind's own (printer columns, short
/// names, validations) to the CRD and its schema.
fn tighten(
    crd: CustomResourceDefinition,
    f: impl Fn(&mut Value, &mut Value),
) -> CustomResourceDefinition {
    let mut v = serde_json::to_value(crd).expect("CRD serialises");
    let kind = v["spec"]["names"]["kind"]
        .as_str()
        .expect("kind")
        .to_string();
    v["spec"]["names"]["listKind"] = json!(format!("{kind}List"));
    let mut schema = v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].take();
    strip_nullable(&mut schema);
    let root = schema.as_object_mut().expect("schema object");
    root.remove("title");
    let props = root["properties"].as_object_mut().expect("properties");
    props.insert("apiVersion".into(), api_version());
    props.insert("kind".into(), kind_property());
    f(&mut v, &mut schema);
    v["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = schema;
    serde_json::from_value(v).expect("tightened CRD decodes")
}

fn strip_nullable(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("nullable");
            o.values_mut().for_each(strip_nullable);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nullable),
        _ => {}
    }
}

fn api_version() -> Value {
    json!({
        "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
        "type": "string"
    })
}

fn kind_property() -> Value {
    json!({
        "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
        "type": "string"
    })
}

/// OVN-Kubernetes' printer columns (`kubectl get` output), `(name, jsonPath)`, all strings.
fn printer_columns(crd: &mut Value, columns: &[(&str, &str)]) {
    let columns: Vec<Value> = (columns.iter())
        .map(|(name, path)| json!({"jsonPath": path, "name": name, "type": "string"}))
        .collect();
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = json!(columns);
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

/// What EgressFirewall and EgressQoS share: one object per namespace named `default`, at most
/// `max_rules` rules in `spec.egress`, `status.messages` merged across the node agents.
fn per_namespace_rules(s: &mut Value, max_rules: usize) {
    named_default(s);
    messages_set(s);
    merge(
        s,
        "/properties/spec/properties/egress",
        json!({"maxItems": max_rules}),
    );
}

fn firewall(crd: &mut Value, s: &mut Value) {
    printer_columns(crd, &[("EgressFirewall Status", ".status.status")]);
    per_namespace_rules(s, MAX_EGRESS_FIREWALL_RULES);
    let rule = "/properties/spec/properties/egress/items/properties";
    for (field, extra) in [
        ("type", json!({"pattern": "^(Allow|Deny)$"})),
        (
            "ports/items/properties/protocol",
            json!({"pattern": "^(TCP|UDP|SCTP)$"}),
        ),
        (
            "ports/items/properties/port",
            json!({"minimum": 1, "maximum": 65535}),
        ),
        (
            "to/properties/dnsName",
            json!({"pattern": "^(\\*\\.)?([A-Za-z0-9-]+\\.)*[A-Za-z0-9-]+\\.?$"}),
        ),
        // Exactly one destination (the OVN-Kubernetes CRD uses the same oneOf).
        ("to", json!({"minProperties": 1, "maxProperties": 1})),
    ] {
        merge(s, &format!("{rule}/{field}"), extra);
    }
}

fn qos(crd: &mut Value, s: &mut Value) {
    printer_columns(crd, &[("Status", ".status.status")]);
    per_namespace_rules(s, MAX_EGRESS_QOS_RULES);
    let rule = "/properties/spec/properties/egress/items";
    merge(s, rule, json!({"required": ["dscp"]}));
    merge(
        s,
        &format!("{rule}/properties/dscp"),
        json!({"minimum": 0, "maximum": 63}),
    );
    // As upstream: an integer without a declared width, a CIDR by format.
    at(s, &format!("{rule}/properties/dscp"))
        .as_object_mut()
        .expect("dscp schema")
        .remove("format");
    merge(
        s,
        &format!("{rule}/properties/dstCIDR"),
        json!({"format": "cidr"}),
    );
}

fn egress_ip(crd: &mut Value, s: &mut Value) {
    crd["spec"]["names"]["shortNames"] = json!(["eip"]);
    printer_columns(
        crd,
        &[
            ("EgressIPs", ".spec.egressIPs[*]"),
            ("Assigned Node", ".status.items[*].node"),
            ("Assigned EgressIPs", ".status.items[*].egressIP"),
        ],
    );
    s["properties"]["metadata"] = json!({"type": "object"});
    merge(
        s,
        "/properties/spec/properties/egressIPs",
        json!({"minItems": 1}),
    );
}

/// OpenShift's name validation: the IP the object stands for, IPv4 dotted, or IPv6 fully
/// expanded with `.` for `:` (`cloud_private_ip_config::name_for_ip`).
fn cloud_private_ip(_: &mut Value, s: &mut Value) {
    s["properties"]["metadata"] = json!({
        "type": "object",
        "properties": {"name": {
            "type": "string",
            "anyOf": [
                {"format": "ipv4"},
                {"pattern": "^[0-9a-f]{4}(\\.[0-9a-f]{4}){7}$"}
            ]
        }}
    });
}
