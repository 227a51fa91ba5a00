//! What is reported about each EgressIP: its problems (those every node sees alike, and this
//! node's own dataplane's), the status line, and the Warning Event this node writes, on the
//! object's one reporter node for the shared problems; and, after the net backend refused an
//! egress address, the fail-closed rewrite of its SNAT elements with the status that says so.

use super::chains::{data, unreachable_chain};
use super::{Claim, Entry, PART, SNAT_V4, SNAT_V6, STEER_V4, STEER_V6, UNREACHABLE};
use crate::api::egress_ip::event_reason;
use crate::nft::ir::*;
use crate::plan::{NodeEvent, ObjectStatus};
use crate::snapshot::{Kind, ObjectKey, Snapshot};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The problems every node sees (no hosting node yet) and this node's own (hosting nodes it
/// cannot reach).
pub(super) fn note_problems(
    entries: &mut [Entry],
    unreachable: BTreeMap<usize, BTreeMap<(IpAddr, String), String>>,
    node: &str,
) {
    for e in entries.iter_mut() {
        if e.hosted.is_empty() {
            e.problems.push(
                "status.items: no node hosts any of its egress IPs yet; the selected pods' \
                 traffic leaves as without EgressIP"
                    .into(),
            );
        }
    }
    for (i, hosts) in unreachable {
        for ((egress, host), why) in hosts {
            entries[i].local.push(format!(
                "status.items: {egress} is assigned to node {host}, which node {node} cannot \
                 reach through the tunnel: {why}"
            ));
        }
    }
}

/// One status per EgressIP (after those `validate_all` pushed): its problems, and the Event
/// this node writes (every problem on the object's reporter node, else this node's own).
pub(super) fn push_statuses(
    statuses: &mut Vec<ObjectStatus>,
    snapshot: &Snapshot,
    node: &str,
    entries: Vec<Entry>,
    claims: &BTreeMap<IpAddr, Claim>,
) {
    for (i, e) in entries.into_iter().enumerate() {
        let reports = reporter(snapshot, &e, i, claims).as_deref() == Some(node);
        let all: Vec<&String> = e.problems.iter().chain(&e.local).collect();
        let result = if all.is_empty() {
            Ok(())
        } else {
            Err(join(&all))
        };
        let shown: Vec<&String> = if reports {
            all
        } else {
            e.local.iter().collect()
        };
        let reason = match e.reason {
            Some(r) if reports => r,
            _ => event_reason::NOT_APPLIED,
        };
        let event = (!shown.is_empty()).then(|| NodeEvent {
            reason,
            note: event_note(node, &join(&shown)),
        });
        statuses.push(ObjectStatus {
            kind: Kind::EgressIP,
            key: ObjectKey::cluster(e.key),
            result,
            event,
        });
    }
}

fn join(problems: &[&String]) -> String {
    problems
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The note of the Warning Event this node creates (names the node, reporting or not).
pub(super) fn event_note(node: &str, problems: &str) -> String {
    format!("node {node}: {problems}")
}

/// The one node that reports the problems every node sees alike in an EgressIP as an Event:
/// the first (by name) of the nodes hosting its IPs, else of the nodes running pods it
/// selects, else of all nodes. All are nodes running an agent that plans this object, and
/// every agent computes the same answer from the same snapshot.
pub(super) fn reporter(
    snapshot: &Snapshot,
    e: &Entry,
    index: usize,
    claims: &BTreeMap<IpAddr, Claim>,
) -> Option<String> {
    let hosting = e.hosted.iter().map(|(_, n)| n.as_str()).min();
    let selecting = || {
        claims
            .values()
            .filter(|c| c.entry == index)
            .map(|c| c.node.as_str())
            .min()
    };
    hosting
        .or_else(selecting)
        .or_else(|| snapshot.nodes().keys().next().map(String::as_str))
        .map(str::to_string)
}

/// Attributes an address the net backend could not place (no interface subnet contains it,
/// or it is the node's own) to the EgressIP that asked for it, and replaces the SNAT
/// elements that would send traffic from an address the node does not hold by steering
/// elements to [`UNREACHABLE`] (fail closed: the pods' traffic, local or arriving through the
/// tunnel, must not leave with the node's address instead).
pub(super) fn address_refused(
    snapshot: &Snapshot,
    node: &str,
    table: &mut Table,
    statuses: &mut [ObjectStatus],
    ip: IpAddr,
    reason: &str,
) {
    let mut pods = 0;
    if let Some(part) = table.part_mut(PART) {
        for (snat, steer) in [(SNAT_V4, STEER_V4), (SNAT_V6, STEER_V6)] {
            let mut gone = Vec::new();
            if let Some(s) = part.sets.get_mut(snat) {
                s.elements.retain(|k, v| {
                    let keep = v.data != Some(data(ip));
                    if !keep {
                        gone.push(k.clone());
                    }
                    keep
                });
            }
            pods += gone.len();
            if let Some(s) = part.sets.get_mut(steer) {
                for k in gone {
                    s.insert_mapping(k, ElemData::Verdict(Verdict::Jump(UNREACHABLE.into())));
                }
            }
        }
        if pods > 0 && !part.chains.contains_key(UNREACHABLE) {
            unreachable_chain(part);
        }
    }
    for (name, object) in snapshot.egress_ips() {
        let Ok(valid) = object.validate() else {
            continue;
        };
        let Some(i) = valid.ips.iter().position(|x| *x == ip) else {
            continue;
        };
        let mut msg = format!("spec.egressIPs[{i}]: {ip}: {reason}");
        if pods > 0 {
            msg.push_str(&format!(
                "; the traffic of its {pods} selected pod address(es) to destinations outside \
                 the cluster is dropped on node {node}"
            ));
        }
        for s in statuses.iter_mut() {
            if s.kind == Kind::EgressIP && s.key.name == *name {
                s.result = match &s.result {
                    Ok(()) => Err(msg.clone()),
                    Err(e) => Err(format!("{e}; {msg}")),
                };
                // This node's own problem: reported by it whichever node reports the rest.
                s.event = Some(match s.event.take() {
                    None => NodeEvent {
                        reason: event_reason::NOT_APPLIED,
                        note: event_note(node, &msg),
                    },
                    Some(e) => NodeEvent {
                        note: format!("{}; {msg}", e.note),
                        ..e
                    },
                });
            }
        }
    }
}
