//! `v1` Service, reduced to the fields the proxy reads, with k8s-openapi's field names and
//! types so code reads it the same way.
//!
//! k8s-openapi's `ServiceSpec` carries some thirty fields, most of them nobody's input here
//! (`selector`, `ipFamilyPolicy`, `publishNotReadyAddresses`, `loadBalancerClass`, ...), and a
//! node holds every Service of the cluster. Unknown fields are ignored on decode, so any real
//! Service parses; a field that is present but of the wrong type still fails the object, as
//! with the full type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::exact;

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Service {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

namespaced_resource!(Service, api_version: "v1", group: "", version: "v1", kind: "Service", plural: "services");

/// The label that hands a Service (and, copied by the EndpointSlice controller, its slices)
/// to a named service proxy: kube-proxy leaves such objects alone, and so does the agent.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

impl Service {
    /// Labelled for another service proxy ([`SERVICE_PROXY_NAME_LABEL`], whatever its value).
    pub fn for_another_proxy(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL))
    }
}

/// `Option` wherever the API has a default, as in k8s-openapi.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs", default, deserialize_with = "exact::option_vec")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(
        rename = "externalIPs",
        default,
        deserialize_with = "exact::option_vec"
    )]
    pub external_ips: Option<Vec<String>>,
    #[serde(default, deserialize_with = "exact::option_vec")]
    pub load_balancer_source_ranges: Option<Vec<String>>,
    #[serde(default, deserialize_with = "exact::option_vec")]
    pub ports: Option<Vec<ServicePort>>,
    pub session_affinity: Option<String>,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub external_traffic_policy: Option<String>,
    pub internal_traffic_policy: Option<String>,
    pub health_check_node_port: Option<i32>,
    pub traffic_distribution: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<String>,
    /// Required, as in the API: a port without one fails its Service.
    pub port: i32,
    pub protocol: Option<String>,
    pub node_port: Option<i32>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    #[serde(rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    pub timeout_seconds: Option<i32>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerStatus {
    #[serde(default, deserialize_with = "exact::option_vec")]
    pub ingress: Option<Vec<LoadBalancerIngress>>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    pub ip: Option<String>,
    /// `VIP` or `Proxy` (the load balancer delivers to the node, not to the IP).
    pub ip_mode: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything a real Service carries decodes; the proxy's fields keep their values, and
    /// the full k8s-openapi type reads what this one writes back.
    #[test]
    fn a_full_service_decodes_and_keeps_what_the_proxy_reads() {
        let text = r#"{"apiVersion":"v1","kind":"Service",
            "metadata":{"name":"web","namespace":"shop","annotations":{"a":"b"}},
            "spec":{"type":"LoadBalancer","selector":{"app":"web"},
              "clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10","fd00::10"],
              "ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"PreferDualStack",
              "externalIPs":["192.0.2.1"],"loadBalancerSourceRanges":["198.51.100.0/24"],
              "ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP","nodePort":30080,
                "appProtocol":"http"}],
              "sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},
              "externalTrafficPolicy":"Local","internalTrafficPolicy":"Cluster",
              "healthCheckNodePort":31000,"trafficDistribution":"PreferClose",
              "publishNotReadyAddresses":true,"allocateLoadBalancerNodePorts":true},
            "status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.5","ipMode":"VIP",
              "ports":[{"port":80,"protocol":"TCP"}]}]},"conditions":[]}}"#;
        let s: Service = serde_json::from_str(text).unwrap();
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.cluster_ips.as_deref().unwrap(),
            ["10.96.0.10", "fd00::10"]
        );
        let p = &spec.ports.as_ref().unwrap()[0];
        assert_eq!((p.port, p.node_port), (80, Some(30080)));
        let timeout = spec
            .session_affinity_config
            .as_ref()
            .unwrap()
            .client_ip
            .as_ref();
        assert_eq!(timeout.unwrap().timeout_seconds, Some(60));
        assert_eq!(spec.health_check_node_port, Some(31000));
        assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
        let lb = s.status.as_ref().unwrap().load_balancer.as_ref().unwrap();
        let ingress = &lb.ingress.as_ref().unwrap()[0];
        assert_eq!(ingress.ip.as_deref(), Some("203.0.113.5"));
        assert_eq!(ingress.ip_mode.as_deref(), Some("VIP"));

        let full: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        let full_spec = full.spec.unwrap();
        assert_eq!(full_spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(
            full_spec.load_balancer_source_ranges.unwrap(),
            ["198.51.100.0/24"]
        );
    }

    #[test]
    fn a_port_without_a_number_or_a_mistyped_field_fails_the_service() {
        for bad in [
            r#"{"spec":{"ports":[{"name":"http"}]}}"#,
            r#"{"spec":{"clusterIP":7}}"#,
            r#"{"spec":{"healthCheckNodePort":"x"}}"#,
        ] {
            assert!(serde_json::from_str::<Service>(bad).is_err(), "{bad}");
        }
    }
}
