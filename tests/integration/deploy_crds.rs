//! deploy/'s CRDs: generated from the Rust types (`nodeplane::api::crds`) and kept in sync
//! (`UPDATE_DEPLOY=1 cargo test --test integration deploy_crds` rewrites them); every deploy/ document
//! parses; and the CRD schemas, checked with a JSON Schema validator, accept the examples and
//! reject the invalid cases the API reference names.

use std::path::{Path, PathBuf};

use nodeplane::api::crds;
use serde::Deserialize;
use serde_json::{Value, json};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

const HEADER: &str = "# Generated from the Rust types by `UPDATE_DEPLOY=1 cargo test --test integration deploy_crds`.\n";

#[test]
fn crds_in_deploy_match_the_types() {
    for (file, crd) in crds::all() {
        let want = format!("{HEADER}{}", serde_norway::to_string(&crd).unwrap());
        let path = repo("deploy").join(file);
        if std::env::var_os("UPDATE_DEPLOY").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{file} is stale: run UPDATE_DEPLOY=1 cargo test --test integration deploy_crds"
        );
    }
}

#[test]
fn every_deploy_document_is_a_kubernetes_object() {
    for entry in std::fs::read_dir(repo("deploy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let docs = documents(&path);
        assert!(!docs.is_empty(), "{}: no document", path.display());
        for d in docs {
            assert!(
                d["apiVersion"].is_string() && d["kind"].is_string(),
                "{}",
                path.display()
            );
            if d["kind"] != "Kustomization" {
                assert!(
                    d["metadata"]["name"].is_string(),
                    "{}: unnamed",
                    path.display()
                );
            }
        }
    }
}

/// A validator per custom resource kind, from the CRD's openAPIV3Schema (OpenAPI's extra
/// keywords such as `x-kubernetes-*` are ignored by JSON Schema).
fn validators() -> Vec<(String, jsonschema::Validator)> {
    crds::all()
        .into_iter()
        .map(|(_, crd)| {
            // Formats asserted as the API server does for the ones it knows (`ipv4` of a
            // CloudPrivateIPConfig name); the others (`cidr`, `int32`) are ignored here.
            let v = jsonschema::options()
                .should_validate_formats(true)
                .build(&crds::schema(&crd))
                .expect("schema compiles");
            (crd.spec.names.kind.clone(), v)
        })
        .collect()
}

fn check(validators: &[(String, jsonschema::Validator)], obj: &Value) -> Result<(), String> {
    let kind = obj["kind"].as_str().unwrap();
    let (_, v) = validators
        .iter()
        .find(|(k, _)| k == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    let errors: Vec<String> = v
        .iter_errors(obj)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[test]
fn crd_schemas_accept_the_examples() {
    let v = validators();
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("examples/cluster/policy")).unwrap() {
        for doc in documents(&entry.unwrap().path()) {
            if v.iter().any(|(k, _)| doc["kind"] == k.as_str()) {
                check(&v, &doc).unwrap_or_else(|e| panic!("{} rejected: {e}", doc["kind"]));
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} examples found");
}

fn firewall(rule: Value) -> Value {
    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default", "namespace": "a"}, "spec": {"egress": [rule]}})
}

fn qos(rule: Value) -> Value {
    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressQoS",
        "metadata": {"name": "default", "namespace": "a"}, "spec": {"egress": [rule]}})
}

#[test]
fn crd_schemas_reject_the_invalid_cases() {
    let v = validators();
    let good_rule = json!({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"},
        "ports": [{"protocol": "TCP", "port": 443}]});
    check(&v, &firewall(good_rule.clone())).unwrap();
    check(&v, &qos(json!({"dscp": 46, "dstCIDR": "10.0.0.0/8"}))).unwrap();
    let cloud_ip = |name: &str| {
        json!({"apiVersion": "cloud.network.openshift.io/v1", "kind": "CloudPrivateIPConfig",
            "metadata": {"name": name}, "spec": {"node": "worker-1"}})
    };
    // OpenShift's name validation: the IP itself, IPv6 fully expanded with '.' for ':'.
    check(&v, &cloud_ip("192.168.50.100")).unwrap();
    check(&v, &cloud_ip("fc00.f853.0ccd.e793.0000.0000.0000.0054")).unwrap();

    let mut misnamed = firewall(good_rule.clone());
    misnamed["metadata"]["name"] = json!("deny-all");
    let mut misnamed_qos = qos(json!({"dscp": 1}));
    misnamed_qos["metadata"]["name"] = json!("qos");
    let too_many = json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
        "metadata": {"name": "default"},
        "spec": {"egress": vec![good_rule.clone(); 8001]}});
    let invalid = [
        ("name must be default", misnamed),
        ("EgressQoS name must be default", misnamed_qos),
        (
            "type must be Allow or Deny",
            firewall(json!({"type": "Reject", "to": {"cidrSelector": "0.0.0.0/0"}})),
        ),
        ("to is required", firewall(json!({"type": "Deny"}))),
        (
            "one destination only",
            firewall(json!({"type": "Deny",
            "to": {"cidrSelector": "0.0.0.0/0", "dnsName": "example.com"}})),
        ),
        (
            "empty destination",
            firewall(json!({"type": "Deny", "to": {}})),
        ),
        (
            "port range",
            firewall(json!({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"},
            "ports": [{"protocol": "TCP", "port": 70000}]})),
        ),
        (
            "port protocol",
            firewall(json!({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"},
            "ports": [{"protocol": "ICMP", "port": 1}]})),
        ),
        (
            "port needs protocol",
            firewall(json!({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"},
            "ports": [{"port": 1}]})),
        ),
        (
            "dnsName syntax",
            firewall(json!({"type": "Deny", "to": {"dnsName": "bad name!"}})),
        ),
        ("at most 8000 rules", too_many),
        ("dscp 0-63", qos(json!({"dscp": 64}))),
        ("dscp not negative", qos(json!({"dscp": -1}))),
        ("dscp required", qos(json!({"dstCIDR": "10.0.0.0/8"}))),
        (
            "egressIPs required",
            json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
            "metadata": {"name": "e"}, "spec": {"namespaceSelector": {}}}),
        ),
        ("CloudPrivateIPConfig name not an IP", cloud_ip("worker-1")),
        (
            "CloudPrivateIPConfig IPv6 name not expanded",
            cloud_ip("fc00.f853.ccd.e793..54"),
        ),
        (
            "CloudPrivateIPConfig IPv4 name out of range",
            cloud_ip("192.168.50.300"),
        ),
        (
            "egressIPs not empty",
            json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
            "metadata": {"name": "e"}, "spec": {"egressIPs": [], "namespaceSelector": {}}}),
        ),
    ];
    for (what, obj) in invalid {
        assert!(check(&v, &obj).is_err(), "accepted but should not: {what}");
    }
}
