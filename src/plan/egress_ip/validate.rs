//! Which EgressIPs are in force and what each gets: the valid objects in creation order (an
//! invalid edit keeps the last valid version), the egress IPs each may use (not a node's
//! address, not an earlier object's, one per family and node), and the pods each claims
//! (a pod selected twice goes to the earlier object). Every node computes the same answer.

use super::status::event_note;
use super::{Claim, EgressIpMemory, Entry};
use crate::api::EgressIP;
use crate::api::egress_ip::event_reason;
use crate::plan::in_force::Scope;
use crate::plan::{NodeEvent, ObjectStatus};
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Valid objects in creation order (then name): the first one wins a contested pod or IP.
/// An invalid edit keeps the last valid version in force, like the other features: a typo
/// does not silently take the pods' egress IP away.
pub(super) fn validate_all(
    snapshot: &Snapshot,
    memory: &EgressIpMemory,
    node: &str,
    statuses: &mut Vec<ObjectStatus>,
) -> (Vec<Entry>, EgressIpMemory) {
    let outcome = memory.update(
        Kind::EgressIP,
        Scope::Cluster,
        snapshot
            .egress_ips()
            .iter()
            .map(|(name, o)| (ObjectKey::cluster(name), o)),
        EgressIP::validate,
    );
    let mut entries = Vec::new();
    for status in outcome.statuses {
        let name = &status.key.name;
        let mut reason = None;
        let problems = match &status.result {
            Ok(()) => Vec::new(),
            Err(err) if outcome.fell_back.contains(name) => {
                reason = Some(event_reason::INVALID);
                vec![format!("{err} (the last valid version stays in force)")]
            }
            Err(err) => {
                // Nothing of it is in force: reported by the first node its status names, else
                // by the first node.
                let object = snapshot.egress_ips().get(name);
                let items = object
                    .iter()
                    .flat_map(|o| o.status.iter().flat_map(|s| &s.items));
                let first = items
                    .map(|i| i.node.as_str())
                    .filter(|n| !n.is_empty())
                    .min();
                let first = first.or_else(|| snapshot.nodes().keys().next().map(String::as_str));
                let event = (first == Some(node)).then(|| NodeEvent {
                    reason: event_reason::INVALID,
                    note: event_note(node, err),
                });
                statuses.push(ObjectStatus { event, ..status });
                continue;
            }
        };
        let in_force = &outcome.validated.in_force[name];
        entries.push(Entry {
            key: name.clone(),
            object: in_force.object.clone(),
            valid: in_force.valid.clone(),
            problems,
            reason,
            local: Vec::new(),
            hosted: Vec::new(),
        });
    }
    let ts = |e: &Entry| e.object.metadata.creation_timestamp.as_ref().map(|t| t.0);
    entries.sort_by(|a, b| (ts(a).is_none(), ts(a), &a.key).cmp(&(ts(b).is_none(), ts(b), &b.key)));
    (entries, outcome.validated)
}

/// Drops (and reports) IPs that are a node's own address or that an earlier EgressIP already
/// has, and a second IP of the same family assigned to one node.
pub(super) fn check_addresses(snapshot: &Snapshot, entries: &mut [Entry]) {
    let mut node_of: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for (name, node) in snapshot.nodes() {
        for ip in snapshot::node_ips(node) {
            node_of.entry(ip).or_insert(name);
        }
    }
    let mut owner: BTreeMap<IpAddr, String> = BTreeMap::new();
    for e in entries.iter_mut() {
        let mut usable = BTreeSet::new();
        for (i, ip) in e.valid.ips.iter().enumerate() {
            let field = format!("spec.egressIPs[{i}]");
            if let Some(n) = node_of.get(ip) {
                e.problems
                    .push(format!("{field}: {ip} is an address of node {n}"));
                e.reason.get_or_insert(event_reason::CONFLICT_WITH_NODE);
            } else if let Some(first) = owner.get(ip) {
                e.problems.push(format!(
                    "{field}: {ip} is also requested by EgressIP {first}, created earlier, which wins"
                ));
                e.reason.get_or_insert(event_reason::ALREADY_ALLOCATED);
            } else {
                owner.insert(*ip, e.key.clone());
                usable.insert(*ip);
            }
        }
        let mut taken: BTreeSet<(String, bool)> = BTreeSet::new();
        for ip in &e.valid.ips {
            let Some(node) = e.valid.assignments.get(ip) else {
                continue;
            };
            if !usable.contains(ip) {
                continue;
            }
            if taken.insert((node.clone(), ip.is_ipv6())) {
                e.hosted.push((*ip, node.clone()));
            } else {
                e.problems.push(format!(
                    "status.items: {ip} is assigned to node {node}, which already hosts another \
                     IP of this EgressIP of the same family; it is not used"
                ));
            }
        }
    }
}

/// Pod address -> the first EgressIP (creation order) that selects the pod. Later objects
/// selecting the same pod are reported.
pub(super) fn claim_pods(snapshot: &Snapshot, entries: &mut [Entry]) -> BTreeMap<IpAddr, Claim> {
    let mut claims: BTreeMap<IpAddr, Claim> = BTreeMap::new();
    let mut pod_owner: BTreeMap<ObjectKey, usize> = BTreeMap::new();
    for i in 0..entries.len() {
        let mut conflicts: Vec<String> = Vec::new();
        for (ns_name, ns) in snapshot.namespaces() {
            if !entries[i]
                .valid
                .namespace_selector
                .matches_meta(&ns.metadata)
            {
                continue;
            }
            for pod in snapshot.pods_in_namespace(ns_name) {
                let selected = entries[i].valid.pod_selector.matches_meta(&pod.metadata)
                    && !snapshot::pod_is_host_network(pod)
                    && !snapshot::pod_is_terminal(pod);
                let Some(node) = snapshot::pod_node_name(pod).filter(|_| selected) else {
                    continue;
                };
                let pod_key = ObjectKey::of(Kind::Pod, &pod.metadata);
                if let Some(first) = pod_owner.get(&pod_key) {
                    conflicts.push(format!("{pod_key} (EgressIP {})", entries[*first].key));
                    continue;
                }
                pod_owner.insert(pod_key, i);
                for ip in snapshot::pod_ips(pod) {
                    claims.entry(ip).or_insert(Claim {
                        entry: i,
                        node: node.to_string(),
                    });
                }
            }
        }
        if let Some(first) = conflicts.first() {
            let more = conflicts.len() - 1;
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            entries[i].problems.push(format!(
                "spec.podSelector: pod {first}{more} already selected by an EgressIP created \
                 earlier, which wins"
            ));
            entries[i]
                .reason
                .get_or_insert(event_reason::POD_ALREADY_SERVED);
        }
    }
    claims
}
