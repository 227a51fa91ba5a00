//! What makes a NetworkPolicy plan O(change): the pods and namespaces last plan saw (their
//! `Arc`s), and per policy the part and selected addresses it produced. A policy is planned
//! again only when it changed, or when a pod that changed is one it selects or names as a
//! peer (before or after the change); a namespace change re-plans everything (rare).

use super::pods::NAMESPACE_NAME_LABEL;
use crate::api::network_policy::{NamespaceScope, Peer, PortSpec, ValidatedPolicy};
use crate::api::{Namespace, Pod};
use crate::nft::ir::Part;
use crate::snapshot::{self, ObjectKey, ObjectMap, Snapshot};
use std::net::IpAddr;
use std::sync::Arc;

/// One policy as last planned.
#[derive(Debug, Clone)]
pub struct Planned {
    pub policy: Arc<ValidatedPolicy>,
    /// `np/<namespace>/<name>`.
    pub part_key: String,
    pub part: Arc<Part>,
    /// Addresses of the local pods it selects.
    pub selected: Vec<IpAddr>,
    /// Its chain per direction it isolates.
    pub chains: Vec<(super::Direction, Arc<str>)>,
}

/// One policy set as last planned: the part key, the pods it governs, the part.
#[derive(Debug, Clone)]
pub struct PolicySet {
    pub key: String,
    pub ips: Vec<IpAddr>,
    pub part: Arc<Part>,
}

/// The inputs of last plan that decide what must be planned again.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pods: ObjectMap<ObjectKey, Pod>,
    namespaces: ObjectMap<String, Namespace>,
}

/// What changed since [`Seen`]: every namespace (re-plan all) or these pods.
pub struct Changes<'a> {
    pub everything: bool,
    /// (before, after) of each pod that changed, appeared or went.
    pub pods: Vec<(Option<&'a Pod>, Option<&'a Pod>)>,
}

impl Seen {
    pub fn of(snapshot: &Snapshot) -> Seen {
        Seen {
            pods: snapshot.pods().clone(),
            namespaces: snapshot.namespaces().clone(),
        }
    }

    /// The difference of two snapshots: O(change), see `snapshot::changes`.
    pub fn changes<'a>(&'a self, snapshot: &'a Snapshot) -> Changes<'a> {
        let same_ns = snapshot::changes(&self.namespaces, snapshot.namespaces())
            .next()
            .is_none();
        let pods = snapshot::changes(&self.pods, snapshot.pods())
            .map(|(_, old, new)| (old.map(|p| &**p), new.map(|p| &**p)))
            .collect();
        Changes {
            everything: !same_ns,
            pods,
        }
    }
}

/// Whether `pod` (one version of a changed pod) can change what `policy` plans: it is in
/// the policy's namespace and selected, or a pod peer of one of its rules matches it, or a
/// rule with every peer resolves named ports on peers (egress).
pub fn touches(policy: &ValidatedPolicy, snapshot: &Snapshot, pod: &Pod) -> bool {
    let Some(namespace) = pod.metadata.namespace.as_deref() else {
        return false;
    };
    let labels = snapshot::labels(&pod.metadata);
    if namespace == policy.namespace && policy.pods.matches(labels) {
        return true;
    }
    let rules = policy.ingress.iter().chain(&policy.egress).flatten();
    let egress_named = policy.egress.iter().flatten().any(|r| {
        r.peers.is_none()
            && r.ports
                .iter()
                .flatten()
                .any(|p| matches!(p.port, PortSpec::Named(_)))
    });
    if egress_named {
        return true;
    }
    rules
        .flat_map(|r| r.peers.iter().flatten())
        .any(|peer| match peer {
            Peer::Block { .. } => false,
            // The pod selector first: it rejects most pods without reading namespace labels.
            Peer::Pods { namespaces, pods } => {
                pods.matches(labels)
                    && match namespaces {
                        NamespaceScope::Own => namespace == policy.namespace,
                        NamespaceScope::Matching(selector) => {
                            selector.is_everything() || {
                                // The implied name label included, as `PodIndex` does.
                                let mut ns_labels = snapshot
                                    .namespace_labels(namespace)
                                    .cloned()
                                    .unwrap_or_default();
                                ns_labels.insert(NAMESPACE_NAME_LABEL.into(), namespace.into());
                                selector.matches(&ns_labels)
                            }
                        }
                    }
            }
        })
}
