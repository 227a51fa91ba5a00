//! EgressIP (k8s.ovn.org/v1, cluster-scoped): a fixed source IP for egress traffic of the
//! selected pods. `status.items` says which node hosts which IP.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::selector::Selector;
use super::validate::{Ctx, Invalid, ValidationError, parse_unicast_ip};

/// Nodes are eligible to host egress IPs only with this label (any value).
pub const EGRESS_ASSIGNABLE_LABEL: &str = "k8s.ovn.org/egress-assignable";

/// The reasons of the Events on EgressIPs: OVN-Kubernetes' own wherever it has one for the
/// same situation (its cluster manager's `recorder.Eventf` calls), so alerts written for it
/// keep working; README "Events and status texts" lists the mapping.
pub mod event_reason {
    /// No node can host the IP (none assignable, none with a fitting subnet, none free, no
    /// cloud capacity).
    pub const NO_MATCHING_NODE: &str = "NoMatchingNodeFound";
    /// Some IPs of the EgressIP are assigned, this one cannot be (no node can host it).
    pub const UNASSIGNED_REQUEST: &str = "UnassignedRequest";
    /// The IP is an address of a node.
    pub const CONFLICT_WITH_NODE: &str = "EgressIPConflict";
    /// The IP is already another (older) EgressIP's.
    pub const ALREADY_ALLOCATED: &str = "UnsupportedRequest";
    /// A pod is already served by another (older) EgressIP.
    pub const POD_ALREADY_SERVED: &str = "UndefinedRequest";
    /// The object does not validate (OVN-Kubernetes: an unparsable IP).
    pub const INVALID: &str = "InvalidEgressIP";
    /// Creating, moving or deleting a CloudPrivateIPConfig failed at the API server.
    pub const CLOUD_ASSIGNMENT_FAILED: &str = "CloudAssignmentFailed";
    pub const CLOUD_UPDATE_FAILED: &str = "CloudUpdateFailed";
    pub const CLOUD_DELETION_FAILED: &str = "CloudDeletionFailed";
    /// nodeplane's own, no counterpart: the cloud refused the IP on a node
    /// (`CloudResponseError`).
    pub const CLOUD_ERROR: &str = "EgressIPCloudError";
    /// nodeplane's own: the IP was requested from the cloud (Normal).
    pub const CLOUD_REQUESTED: &str = "EgressIPCloudRequested";
    /// nodeplane's own: the IP moved to another node (Normal).
    pub const MOVED: &str = "EgressIPMoved";
    /// nodeplane's own: this node's dataplane cannot apply the object as asked (an address
    /// no interface takes, an unreachable hosting node, a fenced node).
    pub const NOT_APPLIED: &str = "EgressIPNotApplied";
}

/// Specification of the desired behavior of EgressIP.
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "k8s.ovn.org",
    version = "v1",
    kind = "EgressIP",
    doc = "EgressIP is a CRD allowing the user to define a fixed source IP for all egress traffic originating from any pods which match the EgressIP resource according to its spec definition.",
    plural = "egressips",
    status = "EgressIPStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct EgressIPSpec {
    /// EgressIPs is the list of egress IP addresses requested. Can be IPv4 and/or IPv6.
    /// This field is mandatory.
    #[serde(rename = "egressIPs")]
    pub egress_ips: Vec<String>,
    /// NamespaceSelector applies the egress IP only to the namespace(s) whose label matches
    /// this definition. This field is mandatory.
    #[schemars(schema_with = "super::schema::label_selector")]
    pub namespace_selector: LabelSelector,
    /// PodSelector applies the egress IP only to the pods whose label matches this definition.
    /// This field is optional, and in case it is not set: results in the egress IP being
    /// applied to all pods in the namespace(s) matched by the NamespaceSelector. In case it is
    /// set: is intersected with the NamespaceSelector, thus applying the egress IP to the pods
    /// (in the namespace(s) already matched by the NamespaceSelector) which match this pod
    /// selector.
    #[serde(default)]
    #[schemars(schema_with = "super::schema::label_selector")]
    pub pod_selector: Option<LabelSelector>,
}

/// Observed status of EgressIP. Read-only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressIPStatus {
    /// The list of assigned egress IPs and their corresponding node assignment.
    pub items: Vec<EgressIPStatusItem>,
}

/// The per node status, for those egress IPs who have been assigned.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressIPStatusItem {
    /// Assigned egress IP
    #[serde(rename = "egressIP")]
    pub egress_ip: String,
    /// Assigned node name
    pub node: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValidatedEgressIp {
    pub name: String,
    /// In spec order, without duplicates.
    pub ips: Vec<IpAddr>,
    pub namespace_selector: Selector,
    /// `Selector::everything()` when spec.podSelector is unset.
    pub pod_selector: Selector,
    /// Which node hosts which IP, from status. Status entries for IPs no longer in spec are
    /// dropped: status lags spec while the controller reassigns.
    pub assignments: BTreeMap<IpAddr, String>,
}

impl ValidatedEgressIp {
    /// The IPs that `status` assigns to `node`.
    pub fn ips_on_node<'a>(&'a self, node: &'a str) -> impl Iterator<Item = IpAddr> + 'a {
        self.assignments
            .iter()
            .filter(move |(_, n)| n.as_str() == node)
            .map(|(ip, _)| *ip)
    }
}

impl EgressIP {
    pub fn validate(&self) -> Result<ValidatedEgressIp, ValidationError> {
        let ctx = Ctx::cluster("EgressIP", &self.metadata);
        let name = match self.metadata.name.as_deref() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => return Err(ctx.err("metadata.name", Invalid::Missing)),
        };
        if self.spec.egress_ips.is_empty() {
            return Err(ctx.err("spec.egressIPs", Invalid::Empty));
        }
        let mut ips: Vec<IpAddr> = Vec::with_capacity(self.spec.egress_ips.len());
        for (i, raw) in self.spec.egress_ips.iter().enumerate() {
            let field = format!("spec.egressIPs[{i}]");
            let ip = parse_unicast_ip(raw).map_err(|e| ctx.err(&field, e))?;
            // Compare parsed addresses: "fd00::1" and "fd00:0::1" are the same IP.
            if let Some(first) = ips.iter().position(|seen| *seen == ip) {
                return Err(ctx.err(
                    field,
                    Invalid::Duplicate(format!("spec.egressIPs[{first}]")),
                ));
            }
            ips.push(ip);
        }
        let namespace_selector =
            ctx.selector("spec.namespaceSelector", &self.spec.namespace_selector)?;
        let pod_selector = match &self.spec.pod_selector {
            Some(selector) => ctx.selector("spec.podSelector", selector)?,
            None => Selector::everything(),
        };
        let mut assignments = BTreeMap::new();
        for (i, item) in self.status.iter().flat_map(|s| s.items.iter()).enumerate() {
            let ip: IpAddr = item.egress_ip.parse().map_err(|_| {
                ctx.err(
                    format!("status.items[{i}].egressIP"),
                    Invalid::IpAddr(item.egress_ip.clone()),
                )
            })?;
            if item.node.is_empty() {
                return Err(ctx.err(format!("status.items[{i}].node"), Invalid::Missing));
            }
            if ips.contains(&ip) {
                assignments.insert(ip, item.node.clone());
            }
        }
        Ok(ValidatedEgressIp {
            name,
            ips,
            namespace_selector,
            pod_selector,
            assignments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    const GOOD: &str = r#"
apiVersion: k8s.ovn.org/v1
kind: EgressIP
metadata: {name: egress-backend}
spec:
  egressIPs: [192.168.50.100, "fd00:0::100"]
  namespaceSelector: {matchLabels: {team: backend}}
  podSelector: {matchExpressions: [{key: app, operator: In, values: [api]}]}
status:
  items:
  - {egressIP: 192.168.50.100, node: worker-1}
  - {egressIP: "fd00::100", node: worker-2}
  - {egressIP: 192.168.50.99, node: worker-2}
"#;

    fn from_yaml(yaml: &str) -> EgressIP {
        serde_norway::from_str(yaml).expect("test manifest parses")
    }

    #[test]
    fn validates_good_egress_ip() {
        let e = from_yaml(GOOD).validate().unwrap();
        assert_eq!(e.name, "egress-backend");
        let v4: IpAddr = "192.168.50.100".parse().unwrap();
        let v6: IpAddr = "fd00::100".parse().unwrap();
        assert_eq!(e.ips, vec![v4, v6]);
        assert_eq!(e.namespace_selector.to_string(), "team=backend");
        assert_eq!(e.pod_selector.to_string(), "app=api");
        // The stale status entry for .99 is not in spec and is dropped.
        assert_eq!(
            e.assignments,
            BTreeMap::from([(v4, "worker-1".to_string()), (v6, "worker-2".to_string())])
        );
        assert_eq!(e.ips_on_node("worker-1").collect::<Vec<_>>(), vec![v4]);
    }

    #[test]
    fn error_messages() {
        let base = from_yaml(GOOD);
        let check = |edit: &dyn Fn(&mut EgressIP), want: &str| {
            let mut e = base.clone();
            edit(&mut e);
            assert_eq!(e.validate().unwrap_err().to_string(), want);
        };
        check(
            &|e| e.spec.egress_ips.clear(),
            "EgressIP egress-backend: spec.egressIPs: must not be empty",
        );
        check(
            &|e| e.spec.egress_ips[1] = "192.168.50.300".into(),
            r#"EgressIP egress-backend: spec.egressIPs[1]: invalid IP address "192.168.50.300""#,
        );
        check(
            &|e| e.spec.egress_ips.push("fd00::0100".into()),
            "EgressIP egress-backend: spec.egressIPs[2]: duplicate of spec.egressIPs[1]",
        );
        check(
            &|e| e.spec.egress_ips[0] = "127.0.0.1".into(),
            "EgressIP egress-backend: spec.egressIPs[0]: 127.0.0.1 is not a unicast address",
        );
        check(
            &|e| e.spec.egress_ips[0] = "::ffff:192.168.50.100".into(),
            "EgressIP egress-backend: spec.egressIPs[0]: ::ffff:192.168.50.100 is an IPv4-mapped \
             IPv6 address, which no packet carries (write 192.168.50.100)",
        );
        check(
            &|e| {
                e.spec.namespace_selector.match_labels =
                    Some(BTreeMap::from([("team".into(), "a b".into())]))
            },
            r#"EgressIP egress-backend: spec.namespaceSelector.matchLabels[team]: invalid label value "a b": must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric"#,
        );
        check(
            &|e| {
                e.spec
                    .pod_selector
                    .as_mut()
                    .unwrap()
                    .match_expressions
                    .as_mut()
                    .unwrap()[0]
                    .operator = "Exist".into()
            },
            r#"EgressIP egress-backend: spec.podSelector.matchExpressions[0].operator: unknown operator "Exist" (want In, NotIn, Exists or DoesNotExist)"#,
        );
        check(
            &|e| e.status.as_mut().unwrap().items[1].egress_ip = "nope".into(),
            r#"EgressIP egress-backend: status.items[1].egressIP: invalid IP address "nope""#,
        );
        check(
            &|e| e.metadata.name = None,
            "EgressIP <no name>: metadata.name: must be set",
        );
    }

    #[test]
    fn missing_namespace_selector_is_a_decode_error() {
        let err = serde_norway::from_str::<EgressIP>(
            "apiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {name: x}\nspec: {egressIPs: [10.0.0.1]}\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("missing field `namespaceSelector`"),
            "{err}"
        );
    }

    #[test]
    fn field_names_and_crd() {
        let json = serde_json::to_value(from_yaml(GOOD)).unwrap();
        assert_eq!(json["spec"]["egressIPs"][0], "192.168.50.100");
        assert_eq!(json["status"]["items"][0]["egressIP"], "192.168.50.100");
        let crd = serde_json::to_value(EgressIP::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "egressips.k8s.ovn.org");
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert_eq!(
            props["spec"]["required"],
            serde_json::json!(["egressIPs", "namespaceSelector"])
        );
        assert_eq!(props["status"]["required"], serde_json::json!(["items"]));
        assert_eq!(
            props["status"]["properties"]["items"]["items"]["required"],
            serde_json::json!(["egressIP", "node"])
        );
    }
}
