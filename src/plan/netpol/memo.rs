//! What makes a NetworkPolicy plan O(change): the pods and namespaces last plan saw (their
//! `Arc`s), and per policy the part and selected addresses it produced. A policy is planned
//! again only when it changed, when a pod that changed is one it selects (before or after
//! the change) or resolves a named port on, or when a shared peer set it looks up gained or
//! lost a family; a pod that is only a peer changes the shared sets it is in (`peers`); a
//! namespace change re-plans everything (rare).

use super::peers::PeerKey;
use super::pods::peer_matches;
use crate::api::network_policy::{PolicyRule, PortSpec, ValidatedPolicy};
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
    /// The shared peer sets its chains look up (distinct, counted in `PeerSets`).
    pub peer_keys: Vec<Arc<PeerKey>>,
    /// Its logged allow verdicts (ACL logging, `super::acl`).
    pub logged: super::acl::Logged,
    /// Per direction it isolates, the namespace's logged deny chain, when it logs denies.
    pub deny: Vec<(super::Direction, Arc<str>)>,
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
/// the policy's namespace and selected, or it can own a named port an egress rule resolves
/// on its peers (a peer of such a rule, or any pod for a rule without peers). Being one of a
/// rule's peers otherwise changes the shared peer set, not the policy (`peers`).
pub fn touches(policy: &ValidatedPolicy, snapshot: &Snapshot, pod: &Pod) -> bool {
    let Some(namespace) = pod.metadata.namespace.as_deref() else {
        return false;
    };
    if namespace == policy.namespace && policy.pods.matches(snapshot::labels(&pod.metadata)) {
        return true;
    }
    named_egress(policy).any(|rule| match &rule.peers {
        None => true,
        Some(peers) => peers
            .iter()
            .any(|peer| peer_matches(&policy.namespace, peer, snapshot, pod)),
    })
}

/// The egress rules of `policy` with a named port: the pods they resolve it on are its peers.
fn named_egress(policy: &ValidatedPolicy) -> impl Iterator<Item = &PolicyRule> {
    policy.egress.iter().flatten().filter(|r| {
        r.ports
            .iter()
            .flatten()
            .any(|p| matches!(p.port, PortSpec::Named(_)))
    })
}

/// Whether `policy` has an egress rule on a named port: a pod in any namespace may touch it.
pub fn has_named_egress(policy: &ValidatedPolicy) -> bool {
    named_egress(policy).next().is_some()
}
