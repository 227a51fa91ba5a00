//! The pods a NetworkPolicy can talk about, indexed once per plan: which are on this node
//! (the ones a policy isolates here), their labels, their namespace's labels, their IPs and
//! their named container ports.

use crate::api::Pod;
use crate::api::Protocol;
use crate::api::network_policy::{NamespaceScope, Peer};
use crate::snapshot::{self, Snapshot};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The label the API server puts on every namespace; manifests may lack it, so it is added
/// here (policies commonly select a namespace by it).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A pod on the pod network (not hostNetwork: such a pod is the node itself and no policy
/// applies to it; not terminal) with at least one IP.
pub struct PodView<'a> {
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    /// Named container ports: (name, protocol, port).
    pub named_ports: Vec<(&'a str, Protocol, u16)>,
    pub local: bool,
}

impl PodView<'_> {
    /// The number a named port stands for on this pod, if it has one of that protocol.
    pub fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.named_ports
            .iter()
            .find(|(n, p, _)| *n == name && *p == protocol)
            .map(|(_, _, port)| *port)
    }
}

/// Every pod a policy may select or name as a peer, and every namespace's labels.
pub struct PodIndex<'a> {
    pub pods: Vec<PodView<'a>>,
    namespaces: BTreeMap<&'a str, BTreeMap<String, String>>,
}

impl<'a> PodIndex<'a> {
    pub fn new(snapshot: &'a Snapshot, node: &str) -> PodIndex<'a> {
        let mut pods = Vec::new();
        let mut namespaces: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
        for (name, ns) in snapshot.namespaces() {
            let mut labels = snapshot::labels(&ns.metadata).clone();
            labels.insert(NAMESPACE_NAME_LABEL.into(), name.clone());
            namespaces.insert(name.as_str(), labels);
        }
        for pod in snapshot.pods().values() {
            if snapshot::pod_is_host_network(pod) || snapshot::pod_is_terminal(pod) {
                continue;
            }
            let ips = snapshot::pod_ips(pod);
            let Some(namespace) = pod.metadata.namespace.as_deref() else {
                continue;
            };
            if ips.is_empty() {
                continue;
            }
            namespaces.entry(namespace).or_insert_with(|| {
                BTreeMap::from([(NAMESPACE_NAME_LABEL.into(), namespace.to_string())])
            });
            pods.push(PodView {
                namespace,
                labels: snapshot::labels(&pod.metadata),
                ips,
                named_ports: named_ports(pod),
                local: snapshot::pod_node_name(pod) == Some(node),
            });
        }
        PodIndex { pods, namespaces }
    }

    /// This node's pods of `namespace` that `selector` picks: the pods a policy isolates.
    pub fn selected<'s>(
        &'s self,
        namespace: &'s str,
        selector: &'s crate::api::Selector,
    ) -> impl Iterator<Item = &'s PodView<'a>> + 's {
        self.pods
            .iter()
            .filter(move |p| p.local && p.namespace == namespace && selector.matches(p.labels))
    }

    /// The pods (on any node) a pod peer of a policy in `namespace` designates.
    pub fn peers<'s>(
        &'s self,
        namespace: &'s str,
        peer: &'s Peer,
    ) -> impl Iterator<Item = &'s PodView<'a>> + 's {
        let (scope, selector) = match peer {
            Peer::Pods { namespaces, pods } => (Some(namespaces), Some(pods)),
            Peer::Block { .. } => (None, None),
        };
        self.pods.iter().filter(move |p| {
            let (Some(scope), Some(selector)) = (scope, selector) else {
                return false;
            };
            let in_scope = match scope {
                NamespaceScope::Own => p.namespace == namespace,
                NamespaceScope::Matching(ns) => self
                    .namespaces
                    .get(p.namespace)
                    .is_some_and(|labels| ns.matches(labels)),
            };
            in_scope && selector.matches(p.labels)
        })
    }
}

/// The [`PodIndex`], built the first time a plan needs it (a plan that re-plans nothing
/// never does).
pub struct LazyIndex<'a> {
    snapshot: &'a Snapshot,
    node: &'a str,
    index: Option<PodIndex<'a>>,
}

impl<'a> LazyIndex<'a> {
    pub fn new(snapshot: &'a Snapshot, node: &'a str) -> LazyIndex<'a> {
        LazyIndex {
            snapshot,
            node,
            index: None,
        }
    }

    pub fn get(&mut self) -> &PodIndex<'a> {
        let (snapshot, node) = (self.snapshot, self.node);
        self.index
            .get_or_insert_with(|| PodIndex::new(snapshot, node))
    }
}

/// Whether `pod` is one of the pods `peer` of a policy in `namespace` designates.
pub fn peer_matches(namespace: &str, peer: &Peer, snapshot: &Snapshot, pod: &Pod) -> bool {
    let Some(pod_namespace) = pod.metadata.namespace.as_deref() else {
        return false;
    };
    match peer {
        Peer::Block { .. } => false,
        // The pod selector first: it rejects most pods without reading namespace labels.
        Peer::Pods { namespaces, pods } => {
            pods.matches(snapshot::labels(&pod.metadata))
                && match namespaces {
                    NamespaceScope::Own => pod_namespace == namespace,
                    NamespaceScope::Matching(selector) => {
                        selector.is_everything() || {
                            // The implied name label included, as `PodIndex` does.
                            let mut ns_labels = snapshot
                                .namespace_labels(pod_namespace)
                                .cloned()
                                .unwrap_or_default();
                            ns_labels.insert(NAMESPACE_NAME_LABEL.into(), pod_namespace.into());
                            selector.matches(&ns_labels)
                        }
                    }
                }
        }
    }
}

fn named_ports(pod: &crate::api::Pod) -> Vec<(&str, Protocol, u16)> {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    containers
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let name = p.name.as_deref()?;
            let protocol = Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
            let port = u16::try_from(p.container_port).ok().filter(|n| *n != 0)?;
            Some((name, protocol, port))
        })
        .collect()
}
