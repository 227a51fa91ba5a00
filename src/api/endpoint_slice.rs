//! `discovery.k8s.io/v1` EndpointSlice, reduced to the fields the agent reads.
//!
//! k8s-openapi's `Endpoint` is 352 bytes before its strings, almost all of it fields a
//! proxy never looks at (targetRef, deprecatedTopology, hostname); `zone` and `hints` are
//! kept for topology-aware routing
//! (`hints.forZones` and, Kubernetes 1.33+, `hints.forNodes`). A node
//! holds every slice of the cluster: at 100,000 endpoints that type alone costs ~45 MB,
//! this one ~12 MB. Unknown fields are ignored on decode, so any real slice parses.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::exact;

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN`.
    #[serde(default)]
    pub address_type: String,
    #[serde(default, deserialize_with = "exact::vec")]
    pub endpoints: Vec<Endpoint>,
    #[serde(default, deserialize_with = "exact::option_vec")]
    pub ports: Option<Vec<EndpointPort>>,
}

namespaced_resource!(EndpointSlice, api_version: "discovery.k8s.io/v1", group: "discovery.k8s.io", version: "v1", kind: "EndpointSlice", plural: "endpointslices");

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, deserialize_with = "exact::vec")]
    pub addresses: Vec<String>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub hints: Option<EndpointHints>,
}

/// Where the EndpointSlice controller wants the endpoint used (topology-aware routing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints {
    #[serde(default, deserialize_with = "exact::vec")]
    pub for_zones: Vec<ForZone>,
    /// Kubernetes 1.33+, for `trafficDistribution: PreferSameNode`.
    #[serde(
        default,
        deserialize_with = "exact::vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub for_nodes: Vec<ForNode>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForNode {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForZone {
    #[serde(default)]
    pub name: String,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    pub name: Option<String>,
    pub port: Option<i32>,
    pub protocol: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_slice_decodes_and_keeps_what_the_proxy_reads() {
        let s: EndpointSlice = serde_json::from_str(
            r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
            "metadata":{"name":"web-abc","namespace":"shop",
              "labels":{"kubernetes.io/service-name":"web"}},
            "addressType":"IPv4",
            "endpoints":[{"addresses":["10.128.0.5"],
              "conditions":{"ready":false,"serving":true,"terminating":true},
              "hostname":"web-0","nodeName":"worker-1","zone":"a",
              "targetRef":{"kind":"Pod","name":"web-0","namespace":"shop"},
              "hints":{"forZones":[{"name":"a"}],"forNodes":[{"name":"worker-1"}]}}],
            "ports":[{"name":"http","port":8080,"protocol":"TCP","appProtocol":"http"}]}"#,
        )
        .unwrap();
        assert_eq!(s.address_type, "IPv4");
        let e = &s.endpoints[0];
        assert_eq!(e.addresses, ["10.128.0.5"]);
        assert_eq!(e.node_name.as_deref(), Some("worker-1"));
        assert_eq!(e.zone.as_deref(), Some("a"));
        let hints = e.hints.as_ref().unwrap();
        assert_eq!(hints.for_zones[0].name, "a");
        assert_eq!(hints.for_nodes[0].name, "worker-1");
        assert_eq!(
            e.conditions,
            Some(EndpointConditions {
                ready: Some(false),
                serving: Some(true),
                terminating: Some(true)
            })
        );
        let p = &s.ports.as_ref().unwrap()[0];
        assert_eq!(
            (p.name.as_deref(), p.port, p.protocol.as_deref()),
            (Some("http"), Some(8080), Some("TCP"))
        );
    }
}
