//! API types: the four OVN-Kubernetes / OpenShift CRDs (field for field as in the OpenShift 4.13
//! network API reference), label selectors, and validation into parsed forms that planners use
//! without re-parsing strings. Core types come from k8s-openapi and are re-exported here,
//! except EndpointSlice and Service, whose reduced own types keep large clusters cheap to
//! hold and to decode.

/// `k8s_openapi::Resource` and `Metadata` for a reduced own type of a namespaced core kind
/// (its `metadata` field is an `ObjectMeta`).
macro_rules! namespaced_resource {
    ($ty:ty, api_version: $av:literal, group: $g:literal, version: $v:literal, kind: $k:literal, plural: $p:literal) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = $av;
            const GROUP: &'static str = $g;
            const KIND: &'static str = $k;
            const VERSION: &'static str = $v;
            const URL_PATH_SEGMENT: &'static str = $p;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}

pub mod acl_logging;
pub mod cloud_private_ip_config;
pub mod crds;
pub mod egress_firewall;
pub mod egress_ip;
pub mod egress_qos;
pub mod endpoint_slice;
pub mod exact;
pub mod network_policy;
mod schema;
pub mod selector;
pub mod service;
pub mod validate;

pub use cloud_private_ip_config::{
    CloudPrivateIPConfig, CloudPrivateIPConfigSpec, CloudPrivateIPConfigStatus,
    ValidatedCloudPrivateIp,
};
pub use egress_firewall::{
    Action, Destination, EgressFirewall, EgressFirewallDestination, EgressFirewallPort,
    EgressFirewallRule, EgressFirewallSpec, EgressFirewallStatus, FirewallRule, ValidatedFirewall,
};
pub use egress_ip::{
    EgressIP, EgressIPSpec, EgressIPStatus, EgressIPStatusItem, ValidatedEgressIp,
};
pub use egress_qos::{
    EgressQoS, EgressQoSRule, EgressQoSSpec, EgressQoSStatus, QosRule, ValidatedQos,
};
pub use selector::{Selector, SelectorError};
pub use validate::{Invalid, PortMatch, Protocol, ValidationError};

pub use endpoint_slice::EndpointSlice;
pub use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, Pod};
pub use k8s_openapi::api::networking::v1::NetworkPolicy;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
pub use network_policy::ValidatedPolicy;
pub use service::Service;
