//! Least privilege, as shipped in deploy/: every right each identity holds, from every Role
//! and ClusterRole bound to its ServiceAccount, equals a written list, so a rule that grants
//! more fails here. And the ValidatingAdmissionPolicy's CEL expressions admit and refuse what
//! they should (evaluated with cel-interpreter; no API server).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::{Value, json};

fn documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .collect()
}

/// Every document of the files deploy/kustomization.yaml lists, and of its components.
fn deploy() -> Vec<Value> {
    let mut files: Vec<String> = documents("deploy/kustomization.yaml")[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("deploy/{}", f.as_str().unwrap()))
        .collect();
    files.push("deploy/components/ovn-kubernetes-crds/clusterrole.yaml".into());
    files.iter().flat_map(|f| documents(f)).collect()
}

/// `verb group/resource[/name] [in namespace]` for every right of the ServiceAccount
/// `nodeplane/<account>`.
fn rights(docs: &[Value], account: &str) -> BTreeSet<String> {
    let roles: BTreeMap<(String, String), &Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .map(|d| {
            let kind = d["kind"].as_str().unwrap().to_string();
            (
                (kind, d["metadata"]["name"].as_str().unwrap().to_string()),
                d,
            )
        })
        .collect();
    let mut rights = BTreeSet::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let bound = binding["subjects"].as_array().unwrap().iter().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == "nodeplane"
        });
        if !bound {
            continue;
        }
        let key = (
            binding["roleRef"]["kind"].as_str().unwrap().to_string(),
            binding["roleRef"]["name"].as_str().unwrap().to_string(),
        );
        let role = roles
            .get(&key)
            .unwrap_or_else(|| panic!("{key:?} is bound but missing"));
        let scope = match binding["metadata"]["namespace"].as_str() {
            Some(ns) if binding["kind"] == "RoleBinding" => format!(" in {ns}"),
            _ => String::new(),
        };
        for rule in role["rules"].as_array().unwrap() {
            let names: Vec<String> = match rule["resourceNames"].as_array() {
                Some(n) => n
                    .iter()
                    .map(|n| format!("/{}", n.as_str().unwrap()))
                    .collect(),
                None => vec![String::new()],
            };
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        for name in &names {
                            let group = group.as_str().unwrap();
                            let group = if group.is_empty() { "core" } else { group };
                            rights.insert(format!(
                                "{} {group}/{}{name}{scope}",
                                verb.as_str().unwrap(),
                                resource.as_str().unwrap()
                            ));
                        }
                    }
                }
            }
        }
    }
    rights
}

fn read(resources: &[&str]) -> Vec<String> {
    resources
        .iter()
        .flat_map(|r| ["get", "list", "watch"].map(|v| format!("{v} {r}")))
        .collect()
}

fn assert_rights(account: &str, expected: Vec<String>) {
    let held = rights(&deploy(), account);
    let expected: BTreeSet<String> = expected.into_iter().collect();
    let more: Vec<_> = held.difference(&expected).collect();
    let less: Vec<_> = expected.difference(&held).collect();
    assert!(
        more.is_empty() && less.is_empty(),
        "{account}: more than allowed {more:#?}, missing {less:#?}"
    );
}

#[test]
fn the_node_agents_identity_writes_only_its_nodes_annotation_its_status_entries_and_events() {
    let mut expected = read(&[
        "core/namespaces",
        "core/pods",
        "core/nodes",
        "core/services",
        "core/endpoints",
        "discovery.k8s.io/endpointslices",
        "networking.k8s.io/networkpolicies",
        "k8s.ovn.org/egressfirewalls",
        "k8s.ovn.org/egressqoses",
        "k8s.ovn.org/egressips",
        "cloud.network.openshift.io/cloudprivateipconfigs",
    ]);
    expected.extend(
        [
            // Its own Node's k8s.ovn.org/host-cidrs (admission-policy.yaml keeps it to that).
            "patch core/nodes",
            // Its own entry of status.messages (ditto).
            "patch k8s.ovn.org/egressfirewalls/status",
            "patch k8s.ovn.org/egressqoses/status",
            "create events.k8s.io/events",
            "patch events.k8s.io/events",
        ]
        .map(String::from),
    );
    assert_rights("nodeplane-agent", expected);
}

#[test]
fn the_assigners_identity_writes_egress_ip_status_cloud_configs_and_its_lease_only() {
    let mut expected = read(&[
        "core/namespaces",
        "core/pods",
        "core/nodes",
        "k8s.ovn.org/egressips",
        "cloud.network.openshift.io/cloudprivateipconfigs",
    ]);
    let lease = nodeplane::app::EGRESS_IP_ASSIGNER_LEASE;
    let ns = nodeplane::config::DEFAULT_LEADER_ELECT_NAMESPACE;
    expected.extend([
        "patch k8s.ovn.org/egressips/status".to_string(),
        // Only with OVN-Kubernetes' CRD (components/ovn-kubernetes-crds).
        "patch k8s.ovn.org/egressips".to_string(),
        "create cloud.network.openshift.io/cloudprivateipconfigs".to_string(),
        "patch cloud.network.openshift.io/cloudprivateipconfigs".to_string(),
        "delete cloud.network.openshift.io/cloudprivateipconfigs".to_string(),
        "create events.k8s.io/events".to_string(),
        "patch events.k8s.io/events".to_string(),
        format!("get coordination.k8s.io/leases/{lease} in {ns}"),
        format!("update coordination.k8s.io/leases/{lease} in {ns}"),
        // `create` cannot be limited to a name.
        format!("create coordination.k8s.io/leases in {ns}"),
    ]);
    assert_rights("nodeplane-assigner", expected);
}

#[test]
fn the_assigner_runs_under_its_own_identity_and_the_agents_stand_for_no_election() {
    let docs = deploy();
    let workload = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))["spec"]["template"]["spec"]
            .clone()
    };
    let assigner = workload("Deployment", "nodeplane-assigner");
    assert_eq!(assigner["serviceAccountName"], "nodeplane-assigner");
    assert_eq!(assigner["containers"][0]["args"][0], "assigner");
    assert_eq!(
        workload("DaemonSet", "nodeplane-agent")["serviceAccountName"],
        "nodeplane-agent"
    );
    let config: serde_json::Value = serde_norway::from_str(
        documents("deploy/configmap.yaml")[0]["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(config["egress-ip-assigner-candidate"], false);
}

/// The policy's variables, then its validations, for one request: the messages of the
/// validations that refuse it (empty: admitted); `None` when the policy does not apply.
fn admission(
    user: &str,
    node: Option<&str>,
    resource: &str,
    old: Value,
    new: Value,
) -> Option<Vec<String>> {
    let policy = documents("deploy/admission-policy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let spec = &policy["spec"];
    let extra = match node {
        Some(n) => json!({"authentication.kubernetes.io/node-name": [n]}),
        None => json!({}),
    };
    let request = json!({"userInfo": {"username": user, "extra": extra},
        "resource": {"resource": resource}});
    let mut ctx = Context::default();
    ctx.add_variable("request", request).unwrap();
    ctx.add_variable("object", new).unwrap();
    ctx.add_variable("oldObject", old).unwrap();
    let eval = |ctx: &Context, expr: &str| -> Cel {
        let program = Program::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        program
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
    };
    for condition in spec["matchConditions"].as_array().unwrap() {
        if eval(&ctx, condition["expression"].as_str().unwrap()) != Cel::Bool(true) {
            return None;
        }
    }
    let mut variables = BTreeMap::new();
    for v in spec["variables"].as_array().unwrap() {
        let value = eval(&ctx, v["expression"].as_str().unwrap());
        variables.insert(v["name"].as_str().unwrap().to_string(), value);
        let map: std::collections::HashMap<String, Cel> = variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        ctx.add_variable_from_value("variables", map);
    }
    Some(
        spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| eval(&ctx, v["expression"].as_str().unwrap()) != Cel::Bool(true))
            .map(|v| v["message"].as_str().unwrap().to_string())
            .collect(),
    )
}

const AGENT: &str = "system:serviceaccount:nodeplane:nodeplane-agent";

fn node(name: &str, labels: Value, annotations: Value, taints: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints}})
}

#[test]
fn a_node_agent_may_patch_only_its_own_nodes_host_cidrs_annotation() {
    let labels = json!({"kubernetes.io/hostname": "w1"});
    let old = node("w1", labels.clone(), json!({"a": "1"}), json!([]));
    let cidrs = json!({"a": "1", "k8s.ovn.org/host-cidrs": "[\"192.168.50.0/24\"]"});
    let ok = node("w1", labels.clone(), cidrs.clone(), json!([]));
    let nodes = |user, as_node, old: &Value, new: &Value| {
        admission(user, as_node, "nodes", old.clone(), new.clone())
    };
    assert_eq!(nodes(AGENT, Some("w1"), &old, &ok), Some(vec![]));
    // Another node's Node.
    let other = node("w2", labels.clone(), cidrs.clone(), json!([]));
    let refused = nodes(
        AGENT,
        Some("w1"),
        &node("w2", labels.clone(), json!({"a": "1"}), json!([])),
        &other,
    );
    assert_eq!(
        refused.unwrap(),
        ["a nodeplane agent may patch only its own Node"]
    );
    // Its own Node, but a label, a taint or another annotation.
    let label = node(
        "w1",
        json!({"kubernetes.io/hostname": "w1", "k8s.ovn.org/egress-assignable": ""}),
        cidrs.clone(),
        json!([]),
    );
    let taint = node(
        "w1",
        labels.clone(),
        cidrs.clone(),
        json!([{"key": "x", "effect": "NoExecute"}]),
    );
    let annotation = node("w1", labels.clone(), json!({"a": "2"}), json!([]));
    let dropped = node("w1", labels.clone(), json!({}), json!([]));
    for new in [label, taint, annotation, dropped] {
        assert_eq!(
            nodes(AGENT, Some("w1"), &old, &new).unwrap(),
            ["a nodeplane agent may change only the k8s.ovn.org/host-cidrs annotation of its Node"],
            "{new}"
        );
    }
    // A token without a node name is refused; other users are not this policy's business.
    assert!(!nodes(AGENT, None, &old, &ok).unwrap().is_empty());
    assert_eq!(
        nodes(
            "system:serviceaccount:nodeplane:nodeplane-assigner",
            Some("w1"),
            &old,
            &ok
        ),
        None
    );
}

#[test]
fn a_node_agent_may_change_only_its_own_status_entry() {
    let status = |messages: &[&str]| json!({"metadata": {"name": "default"}, "status": {"status": "EgressFirewall Rules applied", "messages": messages}});
    let old = status(&[
        "w1: EgressFirewall Rules applied",
        "w2: EgressFirewall Rules applied",
    ]);
    let check =
        |new: Value| admission(AGENT, Some("w1"), "egressfirewalls", old.clone(), new).unwrap();
    assert!(
        check(status(&[
            "w1: EgressFirewall Rules not correctly applied: x",
            "w2: EgressFirewall Rules applied"
        ]))
        .is_empty()
    );
    let own_entry_only =
        ["a nodeplane agent may change only its own node's entry of status.messages"];
    assert_eq!(
        check(status(&["w1: EgressFirewall Rules applied"])),
        own_entry_only,
        "w2's removed"
    );
    assert_eq!(
        check(status(&["w1: EgressFirewall Rules applied", "w2: forged"])),
        own_entry_only
    );
    assert_eq!(
        check(status(&[
            "w1: EgressFirewall Rules applied",
            "w2: EgressFirewall Rules applied",
            "w3: forged"
        ])),
        own_entry_only
    );
}

/// EgressQoS conditions: only this node's `Ready-In-Zone-<node>` may change.
#[test]
fn a_node_agent_may_change_only_its_own_zone_condition() {
    let cond = |zone: &str, status: &str| {
        json!({"type": format!("Ready-In-Zone-{zone}"), "status": status,
            "reason": "SetupSucceeded", "message": "EgressQoS Rules applied",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let status = |conditions: Vec<Value>| {
        json!({"metadata": {"name": "default"},
            "status": {"status": "EgressQoS Rules applied", "conditions": conditions}})
    };
    let old = status(vec![cond("w1", "True"), cond("w2", "True")]);
    let check = |new: Value| admission(AGENT, Some("w1"), "egressqoses", old.clone(), new).unwrap();
    assert!(check(status(vec![cond("w1", "False"), cond("w2", "True")])).is_empty());
    // The first condition a node writes.
    let first = admission(
        AGENT,
        Some("w1"),
        "egressqoses",
        status(vec![]),
        status(vec![cond("w1", "True")]),
    );
    assert_eq!(first, Some(vec![]));
    let own_only = [
        "a nodeplane agent may change only its own node's condition (Ready-In-Zone-<node>) of status.conditions",
    ];
    assert_eq!(
        check(status(vec![cond("w1", "True")])),
        own_only,
        "w2's removed"
    );
    assert_eq!(
        check(status(vec![cond("w1", "True"), cond("w2", "False")])),
        own_only,
        "w2's forged"
    );
    assert_eq!(
        check(status(vec![
            cond("w1", "True"),
            cond("w2", "True"),
            cond("w3", "True")
        ])),
        own_only
    );
}
