//! What is watched for each kind, and why. The answer is per kind because each planner needs a
//! different slice of the cluster; README "Kubernetes mode" repeats this table for operators.
//!
//! | kind | scope | why |
//! |---|---|---|
//! | Namespace | all | namespace selectors (EgressIP), per-namespace features |
//! | Pod | all, pruned (containers keep only their named ports, for NetworkPolicy) | EgressFirewall/EgressQoS only need pods of this node, but EgressIP SNATs on the hosting node traffic of selected pods from every node |
//! | Node | all | EgressFirewall `nodeSelector` targets, node address sets, EgressIP eligibility |
//! | Service, EndpointSlice, Endpoints | all, without other proxies' objects | kube-proxy semantics: every service is reachable from every node |
//! | EgressFirewall, EgressQoS | all | namespaced, one per namespace; every namespace may have pods here |
//! | EgressIP, CloudPrivateIPConfig | all | cluster-scoped and few |
//! | NetworkPolicy | all | a policy selects pods here and peers anywhere |

use kube::api::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;

use crate::api::service::SERVICE_PROXY_NAME_LABEL;
use crate::snapshot::Kind;

/// The REST coordinates of a kind, for a `DynamicObject` API.
pub fn api_resource(kind: Kind) -> ApiResource {
    let (group, version) = match kind.api_version().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", kind.api_version()),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind.as_str());
    ApiResource::from_gvk_with_plural(&gvk, plural(kind))
}

fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::Namespace => "namespaces",
        Kind::Pod => "pods",
        Kind::Node => "nodes",
        Kind::Service => "services",
        Kind::Endpoints => "endpoints",
        Kind::EndpointSlice => "endpointslices",
        Kind::EgressFirewall => "egressfirewalls",
        Kind::EgressQoS => "egressqoses",
        Kind::EgressIP => "egressips",
        Kind::CloudPrivateIPConfig => "cloudprivateipconfigs",
        Kind::NetworkPolicy => "networkpolicies",
    }
}

/// The watch of one kind: label selectors where a part of the kind is never ours (objects
/// owned by another service proxy, as kube-proxy's watches; the planner skips such Services
/// too, for the manifests source).
pub fn watch_config(kind: Kind) -> watcher::Config {
    let config = watcher::Config::default();
    match kind {
        Kind::Service | Kind::EndpointSlice | Kind::Endpoints => {
            config.labels(&format!("!{SERVICE_PROXY_NAME_LABEL}"))
        }
        _ => config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_rest_coordinates() {
        for kind in Kind::ALL {
            let r = api_resource(*kind);
            assert_eq!(r.api_version, kind.api_version());
            assert_eq!(r.kind, kind.as_str());
            assert!(r.plural.ends_with('s'), "{}", r.plural);
        }
        assert_eq!(api_resource(Kind::EndpointSlice).group, "discovery.k8s.io");
        assert_eq!(api_resource(Kind::Pod).group, "");
    }
}
