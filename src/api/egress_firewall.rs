//! EgressFirewall (k8s.ovn.org/v1, namespaced): ordered allow/deny rules for pod traffic
//! leaving the cluster. One per namespace, named `default`.

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::selector::Selector;
use super::validate::{
    Ctx, Invalid, NamespaceRules, PortMatch, Protocol, ValidationError, parse_cidr, parse_dns_name,
};

/// OVN-Kubernetes caps an EgressFirewall at 8000 rules.
pub const MAX_EGRESS_FIREWALL_RULES: usize = 8000;

pub const STATUS_APPLIED: &str = "EgressFirewall Rules applied";
pub const STATUS_NOT_APPLIED_PREFIX: &str = "EgressFirewall Rules not correctly applied";

/// Specification of the desired behavior of EgressFirewall.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressFirewall",
    doc = "EgressFirewall describes the current egress firewall for a Namespace. Traffic from a pod to an IP address outside the cluster will be checked against each EgressFirewallRule in the pod's namespace's EgressFirewall, in order. If no rule matches (or no EgressFirewall is present) then the traffic will be allowed by default.",
    plural = "egressfirewalls",
    namespaced,
    status = "EgressFirewallStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallSpec {
    /// a collection of egress firewall rule objects
    pub egress: Vec<EgressFirewallRule>,
}

/// EgressFirewallRule is a single egressfirewall rule object
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallRule {
    /// type marks this as an "Allow" or "Deny" rule
    #[serde(rename = "type")]
    pub type_: String,
    /// to is the target that traffic is allowed/denied to
    pub to: EgressFirewallDestination,
    /// ports specify what ports and protocols the rule applies to
    pub ports: Option<Vec<EgressFirewallPort>>,
}

/// to is the target that traffic is allowed/denied to
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallDestination {
    /// cidrSelector is the CIDR range to allow/deny traffic to. If this is set, dnsName and
    /// nodeSelector must be unset.
    pub cidr_selector: Option<String>,
    /// dnsName is the domain name to allow/deny traffic to. If this is set, cidrSelector and
    /// nodeSelector must be unset. For a wildcard DNS name, the '*' will match only one label.
    /// Additionally, only a single '*' can be used at the beginning of the wildcard DNS name.
    /// For example, '*.example.com' will match 'sub1.example.com' but won't match
    /// 'sub2.sub1.example.com'.
    pub dns_name: Option<String>,
    /// nodeSelector will allow/deny traffic to the Kubernetes node IP of selected nodes. If this
    /// is set, cidrSelector and DNSName must be unset.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::label_selector")]
    pub node_selector: Option<LabelSelector>,
}

/// EgressFirewallPort specifies the port to allow or deny traffic to
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallPort {
    /// protocol (tcp, udp, sctp) that the traffic must match.
    pub protocol: String,
    /// port that the traffic must match
    pub port: i32,
}

/// Observed status of EgressFirewall
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressFirewallStatus {
    pub status: Option<String>,
    /// One `<node>: <status>` entry per node agent, each written by that node's field manager
    /// (a list-type=set, merged by server-side apply, as OVN-Kubernetes zones do).
    pub messages: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Allow,
    Deny,
}

/// Where a rule sends its verdict. DNS names are lowercased without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    Cidr(IpNet),
    Dns(String),
    Nodes(Selector),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FirewallRule {
    pub action: Action,
    pub dest: Destination,
    /// Empty means all traffic to the destination. Sorted and deduplicated.
    pub ports: Vec<PortMatch>,
}

/// An EgressFirewall that passed validation.
pub type ValidatedFirewall = NamespaceRules<FirewallRule>;

impl EgressFirewall {
    /// Validates the whole object; any invalid rule rejects it (never half-apply a firewall).
    pub fn validate(&self) -> Result<ValidatedFirewall, ValidationError> {
        NamespaceRules::validate(
            "EgressFirewall",
            &self.metadata,
            &self.spec.egress,
            MAX_EGRESS_FIREWALL_RULES,
            validate_rule,
        )
    }
}

fn validate_rule(
    ctx: &Ctx,
    field: &str,
    rule: &EgressFirewallRule,
) -> Result<FirewallRule, ValidationError> {
    let action = match rule.type_.as_str() {
        "Allow" => Action::Allow,
        "Deny" => Action::Deny,
        other => {
            return Err(ctx.err(
                format!("{field}.type"),
                Invalid::RuleType(other.to_string()),
            ));
        }
    };
    let dest = validate_destination(ctx, &format!("{field}.to"), &rule.to)?;
    let ports = parse_ports(ctx, &format!("{field}.ports"), rule.ports.as_deref())?;
    Ok(FirewallRule {
        action,
        dest,
        ports,
    })
}

fn validate_destination(
    ctx: &Ctx,
    field: &str,
    to: &EgressFirewallDestination,
) -> Result<Destination, ValidationError> {
    match (&to.cidr_selector, &to.dns_name, &to.node_selector) {
        (Some(cidr), None, None) => parse_cidr(cidr)
            .map(Destination::Cidr)
            .map_err(|e| ctx.err(format!("{field}.cidrSelector"), e)),
        (None, Some(name), None) => parse_dns_name(name)
            .map(Destination::Dns)
            .map_err(|e| ctx.err(format!("{field}.dnsName"), e)),
        (None, None, Some(selector)) => ctx
            .selector(&format!("{field}.nodeSelector"), selector)
            .map(Destination::Nodes),
        (cidr, dns, nodes) => {
            let set: Vec<&str> = [
                cidr.as_ref().map(|_| "cidrSelector"),
                dns.as_ref().map(|_| "dnsName"),
                nodes.as_ref().map(|_| "nodeSelector"),
            ]
            .into_iter()
            .flatten()
            .collect();
            let found = if set.is_empty() {
                "none".to_string()
            } else {
                set.join(" and ")
            };
            Err(ctx.err(field, Invalid::Destination(found)))
        }
    }
}

/// Parses `ports[]` (EgressFirewall, and the EgressQoS extension). The result is sorted and
/// deduplicated: the order of ports carries no meaning.
pub(crate) fn parse_ports(
    ctx: &Ctx,
    field: &str,
    ports: Option<&[EgressFirewallPort]>,
) -> Result<Vec<PortMatch>, ValidationError> {
    let mut out = Vec::new();
    for (i, EgressFirewallPort { protocol, port }) in ports.unwrap_or_default().iter().enumerate() {
        let protocol = Protocol::parse(protocol).ok_or_else(|| {
            ctx.err(
                format!("{field}[{i}].protocol"),
                Invalid::Protocol(protocol.to_string()),
            )
        })?;
        let port = u16::try_from(*port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ctx.err(format!("{field}[{i}].port"), Invalid::Port(*port)))?;
        out.push(PortMatch { protocol, port });
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    fn from_yaml(yaml: &str) -> EgressFirewall {
        serde_norway::from_str(yaml).expect("test manifest parses")
    }

    const GOOD: &str = r#"
apiVersion: k8s.ovn.org/v1
kind: EgressFirewall
metadata: {name: default, namespace: ns1}
spec:
  egress:
  - type: Allow
    to: {cidrSelector: 10.1.2.3/16}
    ports: [{protocol: tcp, port: 443}, {protocol: UDP, port: 53}, {protocol: TCP, port: 443}]
  - type: Allow
    to: {dnsName: Registry.Example.com}
  - type: Allow
    to:
      nodeSelector:
        matchLabels: {node-role.kubernetes.io/worker: ""}
  - type: Deny
    to: {cidrSelector: 0.0.0.0/0}
"#;

    #[test]
    fn validates_good_firewall() {
        let fw = from_yaml(GOOD).validate().unwrap();
        assert_eq!(fw.namespace, "ns1");
        assert_eq!(fw.rules.len(), 4);
        assert_eq!(fw.rules[0].action, Action::Allow);
        assert_eq!(
            fw.rules[0].dest,
            Destination::Cidr("10.1.0.0/16".parse().unwrap())
        );
        assert_eq!(
            fw.rules[0].ports,
            vec![
                PortMatch {
                    protocol: Protocol::Tcp,
                    port: 443
                },
                PortMatch {
                    protocol: Protocol::Udp,
                    port: 53
                }
            ]
        );
        assert_eq!(
            fw.rules[1].dest,
            Destination::Dns("registry.example.com".into())
        );
        assert!(
            matches!(&fw.rules[2].dest, Destination::Nodes(s) if s.to_string() == "node-role.kubernetes.io/worker=")
        );
        assert_eq!(fw.rules[3].action, Action::Deny);
        assert!(fw.rules[3].ports.is_empty());
    }

    fn with_rule(rule: &str) -> String {
        format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {{name: default, namespace: ns1}}\n\
             spec:\n  egress:\n  - {{type: Allow, to: {{cidrSelector: 1.1.1.1/32}}}}\n  - {rule}\n"
        )
    }

    #[test]
    fn error_messages() {
        #[rustfmt::skip]
        let cases = [
            ("{type: Allow, to: {cidrSelector: 10.0.0.0/33}}",
             r#"EgressFirewall ns1/default: spec.egress[1].to.cidrSelector: invalid CIDR "10.0.0.0/33""#),
            ("{type: Deny, to: {cidrSelector: '::ffff:203.0.113.0/120'}}",
             "EgressFirewall ns1/default: spec.egress[1].to.cidrSelector: ::ffff:203.0.113.0/120 is an IPv4-mapped IPv6 CIDR, which no packet matches (write 203.0.113.0/24)"),
            ("{type: Allow, to: {cidrSelector: '::ffff:0:0/96'}}",
             "EgressFirewall ns1/default: spec.egress[1].to.cidrSelector: ::ffff:0.0.0.0/96 is an IPv4-mapped IPv6 CIDR, which no packet matches (write 0.0.0.0/0)"),
            ("{type: Allow, to: {cidrSelector: 10.0.0.1}}",
             r#"EgressFirewall ns1/default: spec.egress[1].to.cidrSelector: invalid CIDR "10.0.0.1": missing /prefix-length"#),
            ("{type: allow, to: {cidrSelector: 10.0.0.0/8}}",
             r#"EgressFirewall ns1/default: spec.egress[1].type: must be "Allow" or "Deny", got "allow""#),
            ("{type: Deny, to: {}}",
             "EgressFirewall ns1/default: spec.egress[1].to: exactly one of cidrSelector, dnsName, nodeSelector must be set, found none"),
            ("{type: Deny, to: {cidrSelector: 10.0.0.0/8, dnsName: a.com}}",
             "EgressFirewall ns1/default: spec.egress[1].to: exactly one of cidrSelector, dnsName, nodeSelector must be set, found cidrSelector and dnsName"),
            ("{type: Deny, to: {dnsName: a.com, nodeSelector: {}}}",
             "EgressFirewall ns1/default: spec.egress[1].to: exactly one of cidrSelector, dnsName, nodeSelector must be set, found dnsName and nodeSelector"),
            ("{type: Deny, to: {dnsName: '*.*.example.com'}}",
             r#"EgressFirewall ns1/default: spec.egress[1].to.dnsName: invalid DNS name "*.*.example.com": invalid name after the wildcard label"#),
            ("{type: Deny, to: {dnsName: 'bad..name'}}",
             r#"EgressFirewall ns1/default: spec.egress[1].to.dnsName: invalid DNS name "bad..name": empty label"#),
            ("{type: Deny, to: {nodeSelector: {matchExpressions: [{key: a, operator: Is}]}}}",
             r#"EgressFirewall ns1/default: spec.egress[1].to.nodeSelector.matchExpressions[0].operator: unknown operator "Is" (want In, NotIn, Exists or DoesNotExist)"#),
            ("{type: Deny, to: {cidrSelector: 10.0.0.0/8}, ports: [{protocol: TCP, port: 80}, {protocol: ICMP, port: 1}]}",
             r#"EgressFirewall ns1/default: spec.egress[1].ports[1].protocol: invalid protocol "ICMP" (want TCP, UDP or SCTP)"#),
            ("{type: Deny, to: {cidrSelector: 10.0.0.0/8}, ports: [{protocol: TCP, port: 0}]}",
             "EgressFirewall ns1/default: spec.egress[1].ports[0].port: port 0 out of range 1-65535"),
            ("{type: Deny, to: {cidrSelector: 10.0.0.0/8}, ports: [{protocol: TCP, port: 65536}]}",
             "EgressFirewall ns1/default: spec.egress[1].ports[0].port: port 65536 out of range 1-65535"),
        ];
        for (rule, want) in cases {
            let err = from_yaml(&with_rule(rule)).validate().expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn name_and_rule_count() {
        let mut fw = from_yaml(GOOD);
        fw.metadata.name = Some("other".into());
        assert_eq!(
            fw.validate().unwrap_err().to_string(),
            r#"EgressFirewall ns1/other: metadata.name: must be "default" (one object per namespace), got "other""#
        );
        let mut fw = from_yaml(GOOD);
        fw.metadata.namespace = None;
        assert_eq!(
            fw.validate().unwrap_err().to_string(),
            "EgressFirewall <no namespace>/default: metadata.namespace: must be set"
        );
        let mut fw = from_yaml(GOOD);
        let rule = fw.spec.egress[3].clone();
        fw.spec.egress = vec![rule; MAX_EGRESS_FIREWALL_RULES];
        assert!(fw.validate().is_ok());
        fw.spec.egress.push(fw.spec.egress[0].clone());
        assert_eq!(
            fw.validate().unwrap_err().to_string(),
            "EgressFirewall ns1/default: spec.egress: has 8001 rules, at most 8000 are allowed"
        );
    }

    #[test]
    fn serde_round_trip_uses_api_field_names() {
        let fw = from_yaml(GOOD);
        let json = serde_json::to_value(&fw).unwrap();
        assert_eq!(json["apiVersion"], "k8s.ovn.org/v1");
        assert_eq!(json["kind"], "EgressFirewall");
        assert_eq!(json["spec"]["egress"][0]["type"], "Allow");
        assert_eq!(
            json["spec"]["egress"][0]["to"]["cidrSelector"],
            "10.1.2.3/16"
        );
        assert_eq!(
            json["spec"]["egress"][2]["to"]["nodeSelector"]["matchLabels"]["node-role.kubernetes.io/worker"],
            ""
        );
        assert!(json["spec"]["egress"][1].get("ports").is_none());
        let back: EgressFirewall = serde_json::from_value(json).unwrap();
        assert_eq!(back, fw);
    }

    #[test]
    fn crd_matches_reference() {
        let crd = serde_json::to_value(EgressFirewall::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "egressfirewalls.k8s.ovn.org");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(schema["required"], serde_json::json!(["egress"]));
        let rule = &schema["properties"]["egress"]["items"];
        assert_eq!(rule["required"], serde_json::json!(["to", "type"]));
        assert_eq!(
            rule["properties"]["ports"]["items"]["required"],
            serde_json::json!(["port", "protocol"])
        );
        let to = &rule["properties"]["to"];
        assert!(to.get("required").is_none());
        assert_eq!(
            to["properties"]["nodeSelector"]["properties"]["matchExpressions"]["items"]["required"],
            serde_json::json!(["key", "operator"])
        );
    }
}
