//! The cloud flow of egress IPs, as pure functions: on a cloud the assigner asks the cloud
//! controller to attach each assigned egress IP to its node's NIC, one CloudPrivateIPConfig
//! per IP (object name: `crate::api::cloud_private_ip_config::name_for_ip`, `spec.node`: the
//! chosen node), and writes the IP into the EgressIP's `status.items` only once the cloud
//! confirmed it (`status.node == spec.node`, condition `Assigned` True with reason
//! `CloudResponseSuccess`), so no node SNATs to an IP the fabric does not route to it yet.
//!
//! A move is a change of `spec.node`: the cloud controller releases the IP from the old node,
//! then attaches it to the new one; the IP leaves `status.items` at once (the old node stops
//! using it) and comes back with the new node once confirmed. `CloudResponsePending` waits;
//! `CloudResponseError` is a [`Failure`] (`super::cloud_sync` reports it and keeps the IP off
//! that node for a backoff, so the assignment picks another fitting node where one exists). A
//! CloudPrivateIPConfig whose IP no EgressIP is assigned is deleted.
//!
//! Capacity holds in the cloud, not only in the assignment: deletes are written first, and a
//! create or move onto a node is written only while every object that names the node
//! (`spec.node` or `status.node`, including one being deleted: the cloud controller keeps it
//! until the IP is released) leaves room for it under the node's `egress-ipconfig` capacity.
//! A request held back is pending; the snapshot in which the old object is gone writes it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use tracing::debug;

use super::assign::{Assignment, EgressIpInfo};
use super::egress_ipconfig::Capacity;
use crate::api::cloud_private_ip_config::{
    REASON_CLOUD_RESPONSE_ERROR, REASON_CLOUD_RESPONSE_SUCCESS,
};
use crate::snapshot::Snapshot;

/// What the cloud says about one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudState {
    /// No verdict yet, `CloudResponsePending`, or a release in progress.
    Pending,
    /// `Assigned` True, `CloudResponseSuccess`, on `status.node`.
    Attached,
    /// `CloudResponseError`: the cloud's message and the condition's lastTransitionTime
    /// (which tells a new refusal from the one a request was written over).
    Failed(String, String),
}

/// One CloudPrivateIPConfig of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudIp {
    /// `spec.node`.
    pub requested: Option<String>,
    /// `status.node`.
    pub node: Option<String>,
    pub state: CloudState,
    /// The object's resourceVersion: a failure is counted once per version.
    pub resource_version: Option<String>,
    /// `metadata.deletionTimestamp` is set: the cloud is releasing the IP.
    pub deleting: bool,
}

impl CloudIp {
    /// The cloud confirmed the IP on `node`, the node asked for.
    pub fn attached_to(&self, node: &str) -> bool {
        self.state == CloudState::Attached
            && self.node.as_deref() == Some(node)
            && self.requested.as_deref() == Some(node)
    }
}

/// The snapshot's CloudPrivateIPConfigs by IP (objects whose name is not an IP are skipped:
/// the node agents' validation reports them).
pub fn observe(snap: &Snapshot) -> BTreeMap<IpAddr, CloudIp> {
    let mut out = BTreeMap::new();
    for (name, obj) in snap.cloud_private_ip_configs() {
        let Ok(v) = obj.validate() else {
            debug!("CloudPrivateIPConfig {name}: name is not an IP, ignored");
            continue;
        };
        // A verdict about an older spec (the API server bumps `generation` with `spec.node`;
        // the cloud controller sets `observedGeneration`) is no verdict on this request.
        let generation = obj.metadata.generation;
        let condition = obj.assigned_condition().filter(
            |c| !matches!((c.observed_generation, generation), (Some(o), Some(g)) if o < g),
        );
        let state = match condition {
            Some(c) if c.status == "True" && c.reason == REASON_CLOUD_RESPONSE_SUCCESS => {
                CloudState::Attached
            }
            Some(c) if c.reason == REASON_CLOUD_RESPONSE_ERROR => {
                CloudState::Failed(c.message.clone(), c.last_transition_time.0.to_string())
            }
            _ => CloudState::Pending,
        };
        out.insert(
            v.ip,
            CloudIp {
                requested: v.desired_node,
                node: v.assigned_node,
                state,
                resource_version: obj.metadata.resource_version.clone(),
                deleting: obj.metadata.deletion_timestamp.is_some(),
            },
        );
    }
    out
}

/// On a cloud an IP sticks to the node its CloudPrivateIPConfig asks for (the request in
/// flight), not only to `status.items`, which names it only once attached.
pub fn stick_to_requests(eips: &mut [EgressIpInfo], cloud: &BTreeMap<IpAddr, CloudIp>) {
    for e in eips {
        for ip in &e.ips {
            if let Some(node) = cloud.get(ip).and_then(|c| c.requested.clone()) {
                e.current.insert(*ip, node);
            }
        }
    }
}

/// A write to a CloudPrivateIPConfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Create {
        ip: IpAddr,
        node: String,
    },
    /// `spec.node` changes: the cloud releases the IP from `from` first.
    Move {
        ip: IpAddr,
        from: Option<String>,
        to: String,
    },
    Delete {
        ip: IpAddr,
    },
}

/// The cloud refused an IP on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub egress_ip: String,
    pub ip: IpAddr,
    pub node: String,
    pub message: String,
    /// The condition's lastTransitionTime.
    pub since: String,
    pub resource_version: Option<String>,
}

/// What to do about the cloud, from the assignment and the CloudPrivateIPConfigs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// `(ip, node)` the cloud attached where the assignment wants them: the only ones
    /// `status.items` may name.
    pub confirmed: BTreeSet<(IpAddr, String)>,
    /// `(egress IP, ip, node)` waiting for the cloud.
    pub pending: Vec<(String, IpAddr, String)>,
    pub failures: Vec<Failure>,
    /// Per IP whose object shows a refusal now: `(message, lastTransitionTime)`.
    pub refused: BTreeMap<IpAddr, (String, String)>,
}

/// The plan for `assignments` (by EgressIP name) given the cloud's state and each node's
/// capacity (a node without one has no limit here: the assignment already refused it).
pub fn plan(
    assignments: &BTreeMap<String, Assignment>,
    cloud: &BTreeMap<IpAddr, CloudIp>,
    capacity: &BTreeMap<String, Capacity>,
) -> Plan {
    let mut p = Plan::default();
    let mut wanted: BTreeSet<IpAddr> = BTreeSet::new();
    let mut requests = Vec::new();
    for (eip, a) in assignments {
        for (ip, node) in &a.items {
            wanted.insert(*ip);
            let Some(c) = cloud.get(ip) else {
                requests.push(Write::Create {
                    ip: *ip,
                    node: node.clone(),
                });
                p.pending.push((eip.clone(), *ip, node.clone()));
                continue;
            };
            if c.deleting {
                // Being released: asked again once gone.
                p.pending.push((eip.clone(), *ip, node.clone()));
            } else if c.requested.as_deref() != Some(node) {
                requests.push(Write::Move {
                    ip: *ip,
                    from: c.requested.clone(),
                    to: node.clone(),
                });
                p.pending.push((eip.clone(), *ip, node.clone()));
            } else if c.attached_to(node) {
                p.confirmed.insert((*ip, node.clone()));
            } else if let CloudState::Failed(message, since) = &c.state {
                p.failures.push(Failure {
                    egress_ip: eip.clone(),
                    ip: *ip,
                    node: node.clone(),
                    message: message.clone(),
                    since: since.clone(),
                    resource_version: c.resource_version.clone(),
                });
            } else {
                p.pending.push((eip.clone(), *ip, node.clone()));
            }
        }
    }
    for (ip, c) in cloud {
        if let CloudState::Failed(message, since) = &c.state {
            p.refused.insert(*ip, (message.clone(), since.clone()));
        }
    }
    for (ip, c) in cloud {
        if !wanted.contains(ip) && !c.deleting {
            p.writes.push(Write::Delete { ip: *ip });
        }
    }
    let mut occupied = occupancy(cloud);
    for w in requests {
        let (ip, node) = match &w {
            Write::Create { ip, node } | Write::Move { ip, to: node, .. } => (*ip, node),
            Write::Delete { .. } => unreachable!("requests are creates and moves"),
        };
        let load = occupied.entry(node.clone()).or_default();
        let room = load.0.contains(&ip)
            || capacity
                .get(node)
                .is_none_or(|c| c.has_room(load.len_v4(), load.len_v6(), ip));
        if room {
            load.insert(ip);
            p.writes.push(w);
        } else {
            debug!("egress IP {ip}: node {node} has no free slot in the cloud yet, waiting");
        }
    }
    p
}

/// IPs the cloud holds or is asked to hold, per node: every object counts on its `spec.node`
/// and its `status.node`, whatever its state (a release in progress still occupies a slot).
fn occupancy(cloud: &BTreeMap<IpAddr, CloudIp>) -> BTreeMap<String, Slots> {
    let mut out: BTreeMap<String, Slots> = BTreeMap::new();
    for (ip, c) in cloud {
        for node in c.requested.iter().chain(c.node.iter()) {
            out.entry(node.clone()).or_default().insert(*ip);
        }
    }
    out
}

/// The IPs occupying one node's slots.
#[derive(Debug, Default)]
struct Slots(BTreeSet<IpAddr>);

impl Slots {
    fn insert(&mut self, ip: IpAddr) {
        self.0.insert(ip);
    }

    fn len_v4(&self) -> usize {
        self.0.iter().filter(|ip| ip.is_ipv4()).count()
    }

    fn len_v6(&self) -> usize {
        self.0.iter().filter(|ip| ip.is_ipv6()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CloudPrivateIPConfig;
    use crate::controller::egress_ip::ip;
    use serde_json::json;

    /// What the cloud has reported on a CloudPrivateIPConfig.
    enum Cloud<'a> {
        Silent,
        AttachedTo(&'a str),
        Refused(&'a str),
    }
    use Cloud::*;

    fn cpic(name: &str, spec: &str, cloud: Cloud) -> CloudPrivateIPConfig {
        let mut v = json!({"apiVersion": "cloud.network.openshift.io/v1",
            "kind": "CloudPrivateIPConfig",
            "metadata": {"name": name, "resourceVersion": "7"}, "spec": {"node": spec}});
        let status = match cloud {
            Silent => None,
            AttachedTo(node) => Some((node, "True", "CloudResponseSuccess", "")),
            Refused(message) => Some(("", "False", "CloudResponseError", message)),
        };
        if let Some((node, status, reason, message)) = status {
            v["status"] = json!({"node": node, "conditions": [{"type": "Assigned",
                "status": status, "reason": reason, "message": message,
                "lastTransitionTime": "2024-01-01T00:00:00Z", "observedGeneration": 1}]});
        }
        serde_json::from_value(v).unwrap()
    }

    fn assignments(items: &[(&str, &str, &str)]) -> BTreeMap<String, Assignment> {
        let mut out: BTreeMap<String, Assignment> = BTreeMap::new();
        for (eip, i, node) in items {
            out.entry(eip.to_string())
                .or_default()
                .items
                .push((ip(i), node.to_string()));
        }
        out
    }

    #[test]
    fn observes_states_and_ipv6_names() {
        let snap = Snapshot::builder()
            .with(cpic("10.0.0.5", "w1", AttachedTo("w1")))
            .with(cpic("10.0.0.6", "w2", Refused("quota")))
            .with(cpic(
                "fd00.0000.0000.0000.0000.0000.0000.0007",
                "w1",
                Silent,
            ))
            .with(cpic("not-an-ip", "w1", Silent))
            .build();
        let seen = observe(&snap);
        assert_eq!(seen.len(), 3);
        assert!(seen[&ip("10.0.0.5")].attached_to("w1"));
        assert!(!seen[&ip("10.0.0.5")].attached_to("w2"));
        assert_eq!(
            seen[&ip("10.0.0.6")].state,
            CloudState::Failed("quota".into(), "2024-01-01T00:00:00Z".into())
        );
        assert_eq!(seen[&ip("fd00::7")].state, CloudState::Pending);
        assert_eq!(seen[&ip("fd00::7")].requested.as_deref(), Some("w1"));
    }

    #[test]
    fn creates_moves_deletes_and_confirms_only_what_the_cloud_attached() {
        let snap = Snapshot::builder()
            // Attached where wanted.
            .with(cpic("10.0.0.1", "w1", AttachedTo("w1")))
            // Attached on w1, now wanted on w2: a move.
            .with(cpic("10.0.0.2", "w1", AttachedTo("w1")))
            // Asked on w2, the cloud still on w1 (release in progress): pending.
            .with(cpic("10.0.0.3", "w2", AttachedTo("w1")))
            // Refused by the cloud.
            .with(cpic("10.0.0.4", "w3", Refused("no room")))
            // Nobody wants it.
            .with(cpic("10.0.0.9", "w1", Silent))
            .build();
        let a = assignments(&[
            ("a", "10.0.0.1", "w1"),
            ("a", "10.0.0.2", "w2"),
            ("b", "10.0.0.3", "w2"),
            ("b", "10.0.0.4", "w3"),
            ("b", "fd00::1", "w3"),
        ]);
        let p = plan(&a, &observe(&snap), &BTreeMap::new());
        assert_eq!(
            p.writes,
            vec![
                Write::Delete { ip: ip("10.0.0.9") },
                Write::Move {
                    ip: ip("10.0.0.2"),
                    from: Some("w1".into()),
                    to: "w2".into()
                },
                Write::Create {
                    ip: ip("fd00::1"),
                    node: "w3".into()
                },
            ]
        );
        assert_eq!(
            p.confirmed,
            BTreeSet::from([(ip("10.0.0.1"), "w1".to_string())])
        );
        assert_eq!(
            p.failures,
            vec![Failure {
                egress_ip: "b".into(),
                ip: ip("10.0.0.4"),
                node: "w3".into(),
                message: "no room".into(),
                since: "2024-01-01T00:00:00Z".into(),
                resource_version: Some("7".into()),
            }]
        );
        assert_eq!(p.pending.len(), 3);
    }

    #[test]
    fn a_request_waits_for_a_slot_until_the_object_holding_it_is_gone() {
        let one = Capacity {
            ipv4: Some(1),
            ipv6: Some(1),
            ip: None,
        };
        let capacity = BTreeMap::from([("w1".to_string(), one)]);
        let wanted = assignments(&[("b", "10.0.0.2", "w1")]);
        let attached = cpic("10.0.0.1", "w1", AttachedTo("w1"));
        // Unwanted and present: deleted, and the create waits.
        let snap = Snapshot::builder().with(attached.clone()).build();
        let p = plan(&wanted, &observe(&snap), &capacity);
        assert_eq!(p.writes, vec![Write::Delete { ip: ip("10.0.0.1") }]);
        assert_eq!(p.pending.len(), 1);
        // Being deleted (the cloud releasing it): no second delete, still no create.
        let mut deleting = attached;
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2024-01-01T00:00:00Z".parse().unwrap(),
            ));
        let snap = Snapshot::builder().with(deleting.clone()).build();
        assert_eq!(plan(&wanted, &observe(&snap), &capacity).writes, vec![]);
        // A move onto w1 waits the same way; another family has its own slot.
        let moving = assignments(&[("b", "10.0.0.2", "w1"), ("b", "fd00::2", "w1")]);
        let snap = Snapshot::builder()
            .with(deleting)
            .with(cpic("10.0.0.2", "w2", Silent))
            .build();
        assert_eq!(
            plan(&moving, &observe(&snap), &capacity).writes,
            vec![Write::Create {
                ip: ip("fd00::2"),
                node: "w1".into()
            }]
        );
        // Gone: the slot is free.
        let snap = Snapshot::builder().build();
        assert_eq!(
            plan(&wanted, &observe(&snap), &capacity).writes,
            vec![Write::Create {
                ip: ip("10.0.0.2"),
                node: "w1".into()
            }]
        );
    }

    #[test]
    fn a_verdict_on_an_older_generation_is_pending() {
        let mut old = cpic("10.0.0.6", "w2", Refused("quota"));
        old.metadata.generation = Some(2);
        let snap = Snapshot::builder().with(old.clone()).build();
        assert_eq!(observe(&snap)[&ip("10.0.0.6")].state, CloudState::Pending);
        old.metadata.generation = Some(1);
        let snap = Snapshot::builder().with(old).build();
        assert!(matches!(
            observe(&snap)[&ip("10.0.0.6")].state,
            CloudState::Failed(..)
        ));
    }

    #[test]
    fn ips_stick_to_the_node_their_request_names() {
        let snap = Snapshot::builder()
            .with(cpic("10.0.0.2", "w2", Silent))
            .build();
        let mut eips = [EgressIpInfo {
            name: "a".into(),
            created: None,
            ips: vec![ip("10.0.0.2"), ip("10.0.0.3")],
            current: BTreeMap::from([(ip("10.0.0.2"), "w1".to_string())]),
            avoid: BTreeMap::new(),
        }];
        stick_to_requests(&mut eips, &observe(&snap));
        assert_eq!(
            eips[0].current,
            BTreeMap::from([(ip("10.0.0.2"), "w2".to_string())])
        );
    }
}
