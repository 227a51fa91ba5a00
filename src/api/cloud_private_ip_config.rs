//! CloudPrivateIPConfig (cloud.network.openshift.io/v1, cluster-scoped): a request to attach a
//! private IP to a node's cloud NIC. The object name is the IP itself (IPv6 fully expanded, with
//! `.` in place of `:` because names cannot contain colons).

use std::net::{IpAddr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::validate::{Ctx, Invalid, ValidationError};

/// The single condition type the cloud controller sets.
pub const CONDITION_ASSIGNED: &str = "Assigned";
pub const REASON_CLOUD_RESPONSE_PENDING: &str = "CloudResponsePending";
pub const REASON_CLOUD_RESPONSE_ERROR: &str = "CloudResponseError";
pub const REASON_CLOUD_RESPONSE_SUCCESS: &str = "CloudResponseSuccess";

/// spec is the definition of the desired private IP request.
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cloud.network.openshift.io",
    version = "v1",
    kind = "CloudPrivateIPConfig",
    doc = "CloudPrivateIPConfig performs an assignment of a private IP address to the primary NIC associated with cloud VMs. This is done by specifying the IP and Kubernetes node which the IP should be assigned to. This CRD is intended to be used by the network plugin which manages the cluster network. The spec side represents the desired state requested by the network plugin, and the status side represents the current state that this CRD's controller has executed. No users will have permission to modify it, and if a cluster-admin decides to edit it for some reason, their changes will be overwritten the next time the network plugin reconciles the object. Note: the CR's name must specify the requested private IP address (can be IPv4 or IPv6). Compatibility level 1: Stable within a major release for a minimum of 12 months or 3 minor releases (whichever is longer).",
    plural = "cloudprivateipconfigs",
    status = "CloudPrivateIPConfigStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct CloudPrivateIPConfigSpec {
    /// node is the node name, as specified by the Kubernetes field: node.metadata.name
    pub node: Option<String>,
}

/// status is the observed status of the desired private IP request. Read-only.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudPrivateIPConfigStatus {
    /// condition is the assignment condition of the private IP and its status
    #[schemars(schema_with = "super::schema::cloud_conditions")]
    pub conditions: Vec<Condition>,
    /// node is the node name, as specified by the Kubernetes field: node.metadata.name
    pub node: Option<String>,
}

/// The object name for an IP: IPv4 dotted quad, or IPv6 as 8 groups of 4 hex digits joined by `.`.
pub fn name_for_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|s| format!("{s:04x}"))
            .collect::<Vec<_>>()
            .join("."),
    }
}

/// The IP an object name stands for. Lenient like the cloud controller: any IPv6 spelling with
/// `.` for `:` is accepted, not only the fully expanded one.
pub fn ip_from_name(name: &str) -> Option<IpAddr> {
    if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(ip));
    }
    if name.contains(':') {
        return None; // object names cannot contain ':'
    }
    name.replace('.', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// The parsed form: what the planner needs to know about one cloud IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValidatedCloudPrivateIp {
    pub ip: IpAddr,
    /// Where the IP should be (spec.node).
    pub desired_node: Option<String>,
    /// Where the cloud says it is (status.node), if any.
    pub assigned_node: Option<String>,
    /// `(status, reason)` of the `Assigned` condition, if present.
    pub assigned: Option<(String, String)>,
}

impl ValidatedCloudPrivateIp {
    /// True once the cloud confirmed the IP on `node`.
    pub fn is_assigned_to(&self, node: &str) -> bool {
        self.assigned_node.as_deref() == Some(node)
            && self
                .assigned
                .as_ref()
                .is_some_and(|(status, _)| status == "True")
    }
}

impl CloudPrivateIPConfig {
    pub fn ip(&self) -> Option<IpAddr> {
        self.metadata.name.as_deref().and_then(ip_from_name)
    }

    pub fn assigned_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ASSIGNED)
    }

    pub fn validate(&self) -> Result<ValidatedCloudPrivateIp, ValidationError> {
        let ctx = Ctx::cluster("CloudPrivateIPConfig", &self.metadata);
        let name = self.metadata.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return Err(ctx.err("metadata.name", Invalid::Missing));
        }
        let ip = ip_from_name(name).ok_or_else(|| {
            ctx.err(
                "metadata.name",
                Invalid::CloudPrivateIpName(name.to_string()),
            )
        })?;
        let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        Ok(ValidatedCloudPrivateIp {
            ip,
            desired_node: non_empty(&self.spec.node),
            assigned_node: self.status.as_ref().and_then(|s| non_empty(&s.node)),
            assigned: self
                .assigned_condition()
                .map(|c| (c.status.clone(), c.reason.clone())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn names_and_ips() {
        let v6: IpAddr = "fc00:f853:ccd:e793::54".parse().unwrap();
        assert_eq!(name_for_ip(v6), "fc00.f853.0ccd.e793.0000.0000.0000.0054");
        assert_eq!(
            ip_from_name("fc00.f853.0ccd.e793.0000.0000.0000.0054"),
            Some(v6)
        );
        assert_eq!(ip_from_name("fc00.f853.ccd.e793..54"), Some(v6));
        let v4: IpAddr = "192.168.50.100".parse().unwrap();
        assert_eq!(name_for_ip(v4), "192.168.50.100");
        assert_eq!(ip_from_name("192.168.50.100"), Some(v4));
        assert_eq!(ip_from_name("worker-1"), None);
        assert_eq!(
            ip_from_name("fc00:f853::54"),
            None,
            "colons are not valid in names"
        );
    }

    const GOOD: &str = r#"
apiVersion: cloud.network.openshift.io/v1
kind: CloudPrivateIPConfig
metadata: {name: 192.168.50.100}
spec: {node: worker-1}
status:
  node: worker-1
  conditions:
  - type: Assigned
    status: "True"
    reason: CloudResponseSuccess
    message: IP address successfully added
    lastTransitionTime: "2024-05-01T10:00:00Z"
"#;

    #[test]
    fn validates() {
        let c: CloudPrivateIPConfig = serde_norway::from_str(GOOD).unwrap();
        let v = c.validate().unwrap();
        assert_eq!(v.ip, "192.168.50.100".parse::<IpAddr>().unwrap());
        assert_eq!(v.desired_node.as_deref(), Some("worker-1"));
        assert_eq!(
            v.assigned,
            Some(("True".into(), REASON_CLOUD_RESPONSE_SUCCESS.into()))
        );
        assert!(v.is_assigned_to("worker-1"));
        assert!(!v.is_assigned_to("worker-2"));

        let mut bad = c.clone();
        bad.metadata.name = Some("fc00:f853::54".into());
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            r#"CloudPrivateIPConfig fc00:f853::54: metadata.name: "fc00:f853::54" is not an IP address in CloudPrivateIPConfig form (IPv6 fully expanded, '.' for ':')"#
        );
    }

    #[test]
    fn field_names_and_crd() {
        let c: CloudPrivateIPConfig = serde_norway::from_str(GOOD).unwrap();
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["apiVersion"], "cloud.network.openshift.io/v1");
        assert_eq!(
            json["status"]["conditions"][0]["lastTransitionTime"],
            "2024-05-01T10:00:00Z"
        );
        let crd = serde_json::to_value(CloudPrivateIPConfig::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "cloudprivateipconfigs.cloud.network.openshift.io"
        );
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert!(props["spec"].get("required").is_none());
        assert_eq!(
            props["status"]["required"],
            serde_json::json!(["conditions"])
        );
    }
}
