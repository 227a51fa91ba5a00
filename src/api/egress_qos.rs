//! EgressQoS (k8s.ovn.org/v1, namespaced): DSCP marking of pod egress traffic. One per
//! namespace, named `default`; rules in order, first match wins.

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress_firewall::{EgressFirewallPort, parse_ports};
use super::selector::Selector;
use super::validate::{Ctx, Invalid, NamespaceRules, PortMatch, ValidationError, parse_cidr};

pub const MAX_EGRESS_QOS_RULES: usize = 1000;

pub const STATUS_APPLIED: &str = "EgressQoS Rules applied";
pub const STATUS_NOT_APPLIED_PREFIX: &str = "EgressQoS Rules not correctly applied";

/// EgressQoSSpec defines the desired state of EgressQoS
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressQoS",
    doc = "EgressQoS is a CRD that allows the user to define a DSCP value for pods egress traffic on its namespace to specified CIDRs. Traffic from these pods will be checked against each EgressQoSRule in the namespace's EgressQoS, and if there is a match the traffic is marked with the relevant DSCP value.",
    plural = "egressqoses",
    namespaced,
    status = "EgressQoSStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct EgressQoSSpec {
    /// a collection of Egress QoS rule objects
    pub egress: Vec<EgressQoSRule>,
}

#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressQoSRule {
    /// DSCP marking value for matching pods' traffic.
    pub dscp: i32,
    /// DstCIDR specifies the destination's CIDR. Only traffic heading to this CIDR will be marked
    /// with the DSCP value. This field is optional, and in case it is not set the rule is applied
    /// to all egress traffic regardless of the destination.
    #[serde(rename = "dstCIDR")]
    pub dst_cidr: Option<String>,
    /// PodSelector applies the QoS rule only to the pods in the namespace whose label matches
    /// this definition. This field is optional, and in case it is not set results in the rule
    /// being applied to all pods in the namespace.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::label_selector")]
    pub pod_selector: Option<LabelSelector>,
    /// nodeplane extension, not part of the OVN-Kubernetes API: restrict the rule to these
    /// destination ports (same shape as EgressFirewall `ports[]`). Unset means all traffic.
    /// Note that an API server with the upstream CRD prunes this field; it is meant for
    /// manifest-driven nodes or a CRD installed from nodeplane's own schema.
    pub ports: Option<Vec<EgressFirewallPort>>,
}

/// EgressQoSStatus defines the observed state of EgressQoS
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressQoSStatus {
    /// A concise indication of whether the EgressQoS resource is applied with success.
    pub status: Option<String>,
    /// An array of condition objects indicating details about status of EgressQoS object.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::qos_conditions")]
    // Each node agent owns one, `Ready-In-Zone-<node>` (every node is its own zone), under
    // its own field manager, as OVN-Kubernetes' zone controllers write them (`status::merge`).
    pub conditions: Option<Vec<Condition>>,
    /// nodeplane's own, not in OVN-Kubernetes' CRD (its API server prunes it): one
    /// `<node>: <status>` entry per node agent, each written by that node's field manager
    /// (a list-type=set, merged by server-side apply), the same verdicts as `conditions`.
    pub messages: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QosRule {
    pub dscp: u8,
    /// `None` means any destination.
    pub dst: Option<IpNet>,
    /// `Selector::everything()` when the rule has no podSelector.
    pub pods: Selector,
    /// Empty means all traffic. Sorted and deduplicated.
    pub ports: Vec<PortMatch>,
}

/// An EgressQoS that passed validation.
pub type ValidatedQos = NamespaceRules<QosRule>;

impl EgressQoS {
    pub fn validate(&self) -> Result<ValidatedQos, ValidationError> {
        NamespaceRules::validate(
            "EgressQoS",
            &self.metadata,
            &self.spec.egress,
            MAX_EGRESS_QOS_RULES,
            validate_rule,
        )
    }
}

fn validate_rule(ctx: &Ctx, field: &str, rule: &EgressQoSRule) -> Result<QosRule, ValidationError> {
    let dscp = u8::try_from(rule.dscp)
        .ok()
        .filter(|d| *d <= 63)
        .ok_or_else(|| ctx.err(format!("{field}.dscp"), Invalid::Dscp(rule.dscp)))?;
    let dst = rule
        .dst_cidr
        .as_deref()
        .map(|c| parse_cidr(c).map_err(|e| ctx.err(format!("{field}.dstCIDR"), e)))
        .transpose()?;
    let pods = match &rule.pod_selector {
        Some(selector) => ctx.selector(&format!("{field}.podSelector"), selector)?,
        None => Selector::everything(),
    };
    let ports = parse_ports(ctx, &format!("{field}.ports"), rule.ports.as_deref())?;
    Ok(QosRule {
        dscp,
        dst,
        pods,
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::Protocol;
    use kube::CustomResourceExt;

    const GOOD: &str = r#"
apiVersion: k8s.ovn.org/v1
kind: EgressQoS
metadata: {name: default, namespace: backend}
spec:
  egress:
  - dscp: 46
    dstCIDR: 203.0.113.0/24
    podSelector: {matchLabels: {app: voip}}
  - dscp: 10
    ports: [{protocol: udp, port: 5060}]
  - dscp: 0
    dstCIDR: 2001:db8::/32
"#;

    fn from_yaml(yaml: &str) -> EgressQoS {
        serde_norway::from_str(yaml).expect("test manifest parses")
    }

    #[test]
    fn validates_good_qos() {
        let q = from_yaml(GOOD).validate().unwrap();
        assert_eq!(q.namespace, "backend");
        assert_eq!(q.rules[0].dscp, 46);
        assert_eq!(q.rules[0].dst, Some("203.0.113.0/24".parse().unwrap()));
        assert_eq!(q.rules[0].pods.to_string(), "app=voip");
        assert!(q.rules[1].pods.is_everything());
        assert_eq!(q.rules[1].dst, None);
        assert_eq!(
            q.rules[1].ports,
            vec![PortMatch {
                protocol: Protocol::Udp,
                port: 5060
            }]
        );
        assert_eq!(q.rules[2].dst, Some("2001:db8::/32".parse().unwrap()));
    }

    fn with_rule(rule: &str) -> EgressQoS {
        from_yaml(&format!(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\nmetadata: {{name: default, namespace: ns1}}\n\
             spec:\n  egress:\n  - {{dscp: 1}}\n  - {rule}\n"
        ))
    }

    #[test]
    fn error_messages() {
        #[rustfmt::skip]
        let cases = [
            ("{dscp: 64}", "EgressQoS ns1/default: spec.egress[1].dscp: dscp 64 out of range 0-63"),
            ("{dscp: -1}", "EgressQoS ns1/default: spec.egress[1].dscp: dscp -1 out of range 0-63"),
            ("{dscp: 8, dstCIDR: 300.0.0.0/8}",
             r#"EgressQoS ns1/default: spec.egress[1].dstCIDR: invalid CIDR "300.0.0.0/8""#),
            ("{dscp: 8, podSelector: {matchExpressions: [{key: app, operator: In}]}}",
             "EgressQoS ns1/default: spec.egress[1].podSelector.matchExpressions[0].values: operator In requires at least one value"),
            ("{dscp: 8, ports: [{protocol: SCTP, port: 70000}]}",
             "EgressQoS ns1/default: spec.egress[1].ports[0].port: port 70000 out of range 1-65535"),
            ("{dscp: 8, ports: [{protocol: gre, port: 1}]}",
             r#"EgressQoS ns1/default: spec.egress[1].ports[0].protocol: invalid protocol "gre" (want TCP, UDP or SCTP)"#),
        ];
        for (rule, want) in cases {
            assert_eq!(with_rule(rule).validate().unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn name_and_rule_count() {
        let mut q = from_yaml(GOOD);
        q.metadata.name = Some("qos".into());
        assert_eq!(
            q.validate().unwrap_err().to_string(),
            r#"EgressQoS backend/qos: metadata.name: must be "default" (one object per namespace), got "qos""#
        );
        let mut q = from_yaml(GOOD);
        q.spec.egress = vec![q.spec.egress[1].clone(); MAX_EGRESS_QOS_RULES + 1];
        assert_eq!(
            q.validate().unwrap_err().to_string(),
            "EgressQoS backend/default: spec.egress: has 1001 rules, at most 1000 are allowed"
        );
    }

    #[test]
    fn field_names_and_crd() {
        let json = serde_json::to_value(from_yaml(GOOD)).unwrap();
        assert_eq!(json["spec"]["egress"][0]["dstCIDR"], "203.0.113.0/24");
        assert_eq!(
            json["spec"]["egress"][0]["podSelector"]["matchLabels"]["app"],
            "voip"
        );
        let crd = serde_json::to_value(EgressQoS::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "egressqoses.k8s.ovn.org");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["properties"]["egress"]["items"]["required"],
            serde_json::json!(["dscp"])
        );
    }
}
