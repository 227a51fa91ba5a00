//! Hostile names in `--dry-run` output: namespace and object names, labels and EgressFirewall
//! `dnsName` values full of newlines, `;`, `#`, quotes, braces, NUL, `\r`, U+2028 and
//! nft statements go through the agent binary's `--dry-run`; loading its output with
//! `nft -f` in a fresh netns of the lab must create exactly `table inet nodeplane`, and every
//! line before the table is one `#` comment line.
//!
//! Manifests are written as JSON (any string survives JSON encoding; the YAML builders of
//! `testing::objects` print names raw).

use nodeplane::testing::lab::{Lab, ManifestAgent, Ns};
use nodeplane::testing::nft_check::nft_check;
use proptest::prelude::*;
use serde_json::{Value, json};

const NODE: &str = "node-1";

/// The issue's exact namespace name.
const PWNED: &str = "x\nadd table ip PWNED4\n#";

fn manifests(ns: &str, name: &str, label: &str, dns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns, "labels": {"team": label}}},
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": NODE, "labels": {label: label}},
         "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": ns, "labels": {"app": label}},
         "spec": {"nodeName": NODE},
         "status": {"phase": "Running", "podIP": "10.128.0.5", "podIPs": [{"ip": "10.128.0.5"}]}},
        {"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
         "metadata": {"name": "default", "namespace": ns},
         "spec": {"egress": [
             {"type": "Allow", "to": {"dnsName": dns}},
             {"type": "Allow", "to": {"dnsName": "example.com"}},
             {"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}},
        {"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
         "metadata": {"name": name, "namespace": ns},
         "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}},
        {"apiVersion": "k8s.ovn.org/v1", "kind": "EgressQoS",
         "metadata": {"name": "default", "namespace": ns},
         "spec": {"egress": [
             {"dscp": 46, "podSelector": {"matchLabels": {"app": label}}},
             {"dscp": 99, "dstCIDR": label}]}},
        {"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP",
         "metadata": {"name": name},
         "spec": {"egressIPs": ["192.168.1.50", label],
                  "namespaceSelector": {"matchLabels": {"team": label}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": ns},
         "spec": {"clusterIP": "172.30.0.10", "clusterIPs": ["172.30.0.10"],
                  "ports": [{"name": label, "port": 80, "protocol": "TCP"}]}},
    ]})
}

/// Runs `--dry-run` over the manifests in `node`, loads the output into a fresh netns and
/// checks that it holds exactly the agent's table; returns the output.
fn dry_run_loads_only_our_table(lab: &mut Lab, node: &Ns, case: usize, doc: &Value) -> String {
    let agent = ManifestAgent::new(node, NODE, &["--cluster-cidr", "10.128.0.0/14,fd01::/48"]);
    agent.write("hostile.json", &doc.to_string());
    let printed = agent
        .dry_run(&[])
        .unwrap_or_else(|e| panic!("dry-run: {e}"));
    let table_at = printed
        .lines()
        .position(|l| l == "table inet nodeplane")
        .unwrap_or_else(|| panic!("no table line in:\n{printed}"));
    for line in printed.lines().take(table_at) {
        assert!(
            line.starts_with("# "),
            "header line {line:?} in:\n{printed}"
        );
    }
    assert!(
        !printed.contains('\0') && !printed.contains('\r'),
        "control characters in:\n{printed:?}"
    );
    nft_check(&printed);
    let fresh = lab.add_host(&format!("load{case}"));
    fresh
        .exec_stdin(&["nft", "-f", "-"], &printed)
        .unwrap_or_else(|e| panic!("nft -f: {e}\n{printed}"));
    let tables = fresh.nft(&["list", "tables"]).unwrap();
    assert_eq!(tables, "table inet nodeplane\n", "{printed}");
    printed
}

#[test]
fn the_issue_namespace_name_cannot_add_a_table() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let doc = manifests(PWNED, PWNED, PWNED, PWNED);
    let printed = dry_run_loads_only_our_table(&mut lab, &node, 0, &doc);
    assert!(
        printed.contains("x\\nadd table ip PWNED4\\n#"),
        "escaped visibly:\n{printed}"
    );
}

/// Pieces an attacker would put in a name.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "\n", "\r", "\r\n", "\0", ";", "#", "\"", "'", "{", "}", "\\", "\t", "\u{2028}",
            "\u{2029}", "\u{85}", "\u{1b}[2K", "\u{202e}", "x", "a.b", " ",
            "\nadd table ip PWNED\n", "\nflush ruleset\n", "; add table inet evil;",
            "table inet nodeplane {", "}\n", "\ninclude \"/etc/passwd\"\n", "\ndelete table inet nodeplane\n",
        ])
        .prop_map(str::to_string),
        1 => any::<char>().prop_map(String::from),
        1 => "[a-z]{1,300}",
    ]
}

fn hostile() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 1..10).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn hostile_names_add_nothing_to_the_ruleset(
        ns in hostile(), name in hostile(), label in hostile(), dns in hostile()
    ) {
        let mut lab = Lab::new();
        let node = lab.add_node("node");
        let doc = manifests(&ns, &name, &label, &dns);
        dry_run_loads_only_our_table(&mut lab, &node, 0, &doc);
    }
}
