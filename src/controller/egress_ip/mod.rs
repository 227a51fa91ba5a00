//! The EgressIP control plane: which node hosts which egress IP.
//!
//! [`assign`] is the pure rule (candidates, spread, stickiness, conflicts); [`host_cidrs`]
//! publishes each node's egress-capable subnets on its Node object (every agent, for its own
//! node); [`run`] is the assigner task the leader runs: on every snapshot and every change of
//! the [`probe`] verdicts it recomputes the assignment ([`decide`]) and writes the
//! `status.items` that differ, with Warning Events for IPs it cannot place and Normal Events
//! for IPs it moves. The probes run for the whole candidacy, on the nodes of
//! [`probe_targets`] and the Lease holder's ([`Standby`]), signed only while leading.
//!
//! Writing `status.items`: server-side apply with one field manager for the role,
//! [`FIELD_MANAGER`] (not per node), and `force`, so a new leader owns exactly the fields the
//! old one did and never conflicts with them. nodeplane's CRD has a status subresource,
//! OVN-Kubernetes' EgressIP CRD does not: the assigner applies to `/status` first; a `404`
//! there means either no subresource or no object, so it applies the same body to the object
//! itself, and if that succeeds it writes there from then on ([`StatusPath::Object`]). A write
//! to the object whose answer does not show the new status (the CRD gained a subresource, so
//! the API server ignored the status) sends it back to `/status`. Each leadership term starts
//! with `/status`.

pub mod assign;
pub mod cloud;
pub mod cloud_sync;
pub mod egress_ipconfig;
pub mod fence;
pub mod host_cidrs;
pub use crate::config::platform;
pub mod probe;
pub mod probe_auth;
pub mod probe_filter;
pub mod probe_listener;
mod term;
pub mod uplinks;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::info;

use crate::api::egress_ip::EGRESS_ASSIGNABLE_LABEL;
use crate::api::{CloudPrivateIPConfig, EgressIP};
use crate::snapshot::{self, Snapshot};
use assign::{Assignment, EgressIpInfo, NodeInfo};
use cloud_sync::CloudSync;
use platform::Platform;
use term::Term;

/// The field manager of the assigner role, whichever agent leads.
pub const FIELD_MANAGER: &str = "nodeplane-egress-ip-assigner";
/// Normal Event reason for an IP moved to another node.
pub use crate::api::egress_ip::event_reason::MOVED;
const RETRY: Duration = Duration::from_secs(2);

const EVENT_NOTE_MAX: usize = 1024;

/// The assigner's view of the nodes and EgressIPs of a snapshot. `healthy` is the probes'
/// verdict per node name; on a cloud `platform`, each node's NIC limits come from its
/// `egress-ipconfig` annotation. EgressIPs that do not validate are left out (their status
/// is left alone; the node agents report why they are invalid).
pub fn inputs(
    snap: &Snapshot,
    healthy: impl Fn(&str) -> bool,
    platform: Platform,
) -> (Vec<EgressIpInfo>, Vec<NodeInfo>) {
    let nodes = snap
        .nodes()
        .iter()
        .map(|(name, node)| {
            let ready = node
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let host_cidrs = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(host_cidrs::ANNOTATION))
                .and_then(|v| host_cidrs::parse(v).ok());
            NodeInfo {
                name: name.clone(),
                assignable: snapshot::labels(&node.metadata).contains_key(EGRESS_ASSIGNABLE_LABEL),
                ready,
                deleting: node.metadata.deletion_timestamp.is_some(),
                healthy: healthy(name),
                addresses: snapshot::node_ips(node),
                subnets_known: host_cidrs.is_some(),
                host_cidrs: host_cidrs.unwrap_or_default(),
                cloud: platform.is_cloud().then(|| {
                    node.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(egress_ipconfig::ANNOTATION))
                        .ok_or_else(|| "is missing".to_string())
                        .and_then(|v| egress_ipconfig::parse(v))
                }),
            }
        })
        .collect();
    let eips = snap
        .egress_ips()
        .values()
        .filter_map(|e| {
            let v = e.validate().ok()?;
            Some(EgressIpInfo {
                created: e
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_nanosecond()),
                name: v.name,
                ips: v.ips,
                current: v.assignments,
                avoid: BTreeMap::new(),
            })
        })
        .collect();
    (eips, nodes)
}

/// What the probes watch: every node labelled egress-assignable and not being deleted (Ready
/// or not, so that a node coming back is known to answer), by its InternalIPs.
pub fn probe_targets(snap: &Snapshot) -> probe::Targets {
    snap.nodes()
        .iter()
        .filter(|(_, node)| {
            snapshot::labels(&node.metadata).contains_key(EGRESS_ASSIGNABLE_LABEL)
                && node.metadata.deletion_timestamp.is_none()
        })
        .map(|(name, node)| {
            (
                name.clone(),
                snapshot::node_addresses(node, &["InternalIP"]),
            )
        })
        .collect()
}

/// The health function of [`decide`] from published verdicts: a node without one is healthy.
pub fn healthy_from(verdicts: &probe::Verdicts) -> impl Fn(&str) -> bool + '_ {
    |n| verdicts.get(n).copied().unwrap_or(true)
}

/// What the assigner wants for one EgressIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub name: String,
    pub uid: Option<String>,
    /// The object's resourceVersion in the snapshot.
    pub resource_version: Option<String>,
    pub assignment: Assignment,
    /// `status.items` differs from `assignment.items` (order aside).
    pub write: bool,
    /// `(ip, from, to)` for IPs moved off a node that still exists in `status.items`.
    pub moved: Vec<(IpAddr, String, String)>,
}

/// The assignment of every valid EgressIP of the snapshot and whether its status must change.
pub fn decide(snap: &Snapshot, healthy: impl Fn(&str) -> bool) -> Vec<Decision> {
    let (eips, nodes) = inputs(snap, healthy, Platform::BareMetal);
    let out = assign::assign(&eips, &nodes);
    decisions(snap, &eips, out, None)
}

/// [`Decision`]s from the assignment `out` of `eips`. On a cloud, `confirmed` (the
/// `(ip, node)` pairs the cloud has attached, `cloud::Plan::confirmed`) limits what
/// `status.items` says: an IP is written only once attached where it is assigned.
pub fn decisions(
    snap: &Snapshot,
    eips: &[EgressIpInfo],
    mut out: BTreeMap<String, Assignment>,
    confirmed: Option<&BTreeSet<(IpAddr, String)>>,
) -> Vec<Decision> {
    eips.iter()
        .filter_map(|e| {
            let mut assignment = out.remove(&e.name)?;
            if let Some(confirmed) = confirmed {
                assignment
                    .items
                    .retain(|(ip, n)| confirmed.contains(&(*ip, n.clone())));
            }
            let obj = snap.egress_ips().get(&e.name)?;
            let want: BTreeSet<(String, String)> = assignment
                .items
                .iter()
                .map(|(ip, n)| (ip.to_string(), n.clone()))
                .collect();
            let raw = obj
                .status
                .as_ref()
                .map(|s| s.items.as_slice())
                .unwrap_or(&[]);
            let have: BTreeSet<(String, String)> = raw
                .iter()
                .map(|i| (i.egress_ip.clone(), i.node.clone()))
                .collect();
            let write = obj.status.is_none() || have != want || raw.len() != want.len();
            let moved = assignment
                .items
                .iter()
                .filter_map(|(ip, to)| {
                    let from = e.current.get(ip)?;
                    (from != to).then(|| (*ip, from.clone(), to.clone()))
                })
                .collect();
            Some(Decision {
                name: e.name.clone(),
                uid: obj.metadata.uid.clone(),
                resource_version: obj.metadata.resource_version.clone(),
                assignment,
                write,
                moved,
            })
        })
        .collect()
}

/// The server-side-apply body of an EgressIP's `status.items`.
pub fn status_body(name: &str, items: &[(IpAddr, String)]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(ip, node)| json!({"egressIP": ip.to_string(), "node": node}))
        .collect();
    json!({
        "apiVersion": "k8s.ovn.org/v1",
        "kind": "EgressIP",
        "metadata": {"name": name},
        "status": {"items": items},
    })
}

/// Where `status` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusPath {
    /// The `/status` subresource (nodeplane's CRD).
    Subresource,
    /// The object itself (a CRD without a status subresource, as OVN-Kubernetes' own).
    Object,
}

/// What a candidate that does not lead does for the role: it probes the Lease holder's node
/// too and publishes the nodes its probes prove dead, so that the election takes over from a
/// dead holder at once ([`crate::controller::lease::Candidate::set_dead`]) instead of after the
/// lease duration, and the new leader starts with verdicts already formed.
pub struct Standby {
    /// The Lease holder as the election last read it.
    pub holder: watch::Receiver<Option<String>>,
    /// The nodes the probes prove dead now.
    pub dead: watch::Sender<BTreeSet<String>>,
}

impl Standby {
    /// Adds the Lease holder's node to the probe `targets` (unless it is this agent,
    /// `instance`, or a candidate already).
    fn add_holder(&mut self, snap: &Snapshot, instance: &str, targets: &mut probe::Targets) {
        let holder = self.holder.borrow_and_update().clone();
        if let Some(h) = holder.filter(|h| *h != instance && !targets.contains_key(h)) {
            let node = snap.nodes().get(&h).cloned();
            let addrs = node.map(|n| snapshot::node_addresses(&n, &["InternalIP"]));
            targets.insert(h, addrs.unwrap_or_default());
        }
    }

    /// Publishes the nodes `verdicts` prove dead.
    fn publish_dead(&self, verdicts: &probe::Verdicts) {
        let dead: BTreeSet<String> = verdicts
            .iter()
            .filter(|(_, alive)| !**alive)
            .map(|(n, _)| n.clone())
            .collect();
        publish(&self.dead, dead);
    }
}

/// Sends `value` on `tx` unless it holds that already (no wake-up for an equal value).
fn publish<T: PartialEq>(tx: &watch::Sender<T>, value: T) {
    tx.send_if_modified(|old| {
        let differ = *old != value;
        if differ {
            *old = value;
        }
        differ
    });
}

/// Runs the assigner: probes the candidates ([`probe_targets`], and with a [`Standby`] the
/// Lease holder) for as long as it runs, signing the probes only while `leading`; while
/// leading, recomputes on every snapshot and verdict change and writes what differs.
/// `instance` names this agent in Events. Ends when a channel closes.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    mut leading: watch::Receiver<bool>,
    mut snapshots: watch::Receiver<Option<Snapshot>>,
    instance: String,
    probes: probe::Settings,
    probe_key: Option<probe_auth::ProbeKey>,
    cloud: cloud_sync::Settings,
    mut standby: Option<Standby>,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(instance.clone()),
        },
    );
    let cloud_api: Api<CloudPrivateIPConfig> = Api::all(client.clone());
    let api: Api<EgressIP> = Api::all(client);
    // One prober for the whole candidacy: a standby's verdicts carry over into its term, so
    // a takeover from a dead leader acts on them at once (every node is alive until proven
    // dead, so a takeover alone moves nothing).
    let (targets_tx, targets_rx) = watch::channel(probe::Targets::new());
    let (verdicts_tx, mut verdicts) = watch::channel(probe::Verdicts::new());
    let prober = tokio::spawn(probe::run(
        probes,
        probe_key,
        targets_rx,
        verdicts_tx,
        leading.clone(),
    ));
    let _stop_prober = AbortOnDrop(prober);
    let mut term: Option<Term> = None;
    loop {
        let now_leading = *leading.borrow_and_update();
        if now_leading && term.is_none() {
            info!("EgressIP assigner: leading");
            let cloud_sync = CloudSync::new(cloud_api.clone(), &cloud);
            term = Some(Term::new(&api, &recorder, cloud_sync, &cloud));
        } else if !now_leading && term.take().is_some() {
            info!("EgressIP assigner: no longer leading");
        }
        let snap = snapshots.borrow_and_update().clone();
        if let Some(snap) = snap {
            let mut targets = probe_targets(&snap);
            if let Some(s) = standby.as_mut() {
                s.add_holder(&snap, &instance, &mut targets);
            }
            publish(&targets_tx, targets);
            let v = verdicts.borrow_and_update().clone();
            if let Some(s) = &standby {
                s.publish_dead(&v);
            }
            if let Some(term) = term.as_mut() {
                term.sync(&snap, &leading, &v).await;
            }
        }
        let wake = term.as_ref().and_then(Term::wake_in);
        let holder_changed = async {
            match standby.as_mut() {
                Some(s) => s.holder.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { return },
            changed = snapshots.changed() => if changed.is_err() { return },
            // The prober ends only with its targets: a closed channel cannot happen here.
            Ok(()) = verdicts.changed() => {}
            changed = holder_changed => if changed.is_err() { standby = None },
            _ = tokio::time::sleep(wake.unwrap_or_default()), if wake.is_some() => {}
        }
    }
}

/// Aborts the task when dropped (the prober of a leadership term).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An address written in a test.
#[cfg(test)]
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::objects::{egress_ip, node};

    const LABEL: (&str, &str) = (EGRESS_ASSIGNABLE_LABEL, "");

    /// Node `name` at 192.168.1.1`n`/24, labelled egress-assignable, with its host-cidrs.
    fn assignable(name: &str, n: &str, ready: bool) -> k8s_openapi::api::core::v1::Node {
        let ip = format!("192.168.1.1{n}");
        node(name, &[ip.as_str()])
            .labels(&[LABEL])
            .ready(ready)
            .host_cidrs(&[format!("{ip}/24").as_str()])
            .object()
    }

    fn snap(eips: &[crate::testing::objects::EgressIp]) -> Snapshot {
        let mut b = Snapshot::builder()
            .with(assignable("w1", "1", true))
            .with(assignable("w2", "2", false))
            // Ready and fitting, but not labelled.
            .with(
                node("w3", &["192.168.1.13"])
                    .ready(true)
                    .host_cidrs(&["192.168.1.13/24"])
                    .object(),
            );
        for e in eips {
            b.insert(e.object());
        }
        b.build()
    }

    /// `ip` is the decision's one item, moved from node `from` to `to`, and written.
    fn assert_moved(d: &Decision, ip: &str, from: &str, to: &str) {
        let ip: IpAddr = ip.parse().unwrap();
        assert!(d.write);
        assert_eq!(d.assignment.items, vec![(ip, to.to_string())]);
        assert_eq!(d.moved, vec![(ip, from.to_string(), to.to_string())]);
    }

    #[test]
    fn decides_from_the_snapshot_and_writes_only_what_differs() {
        let a = egress_ip("a", &["192.168.1.100"], &[("team", "a")])
            .created(Some("2024-01-01T00:00:00Z"))
            // On w2, which is not Ready: it moves to w1.
            .hosted(&[("192.168.1.100", "w2")]);
        let b = egress_ip("b", &["192.168.1.100", "192.168.1.12"], &[("team", "b")])
            .created(Some("2024-01-02T00:00:00Z"));
        let d = decide(&snap(&[a, b]), |_| true);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].name, "a");
        assert_moved(&d[0], "192.168.1.100", "w2", "w1");
        let problems: Vec<String> = d[1]
            .assignment
            .problems
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            problems,
            [
                "spec.egressIPs[0]: 192.168.1.100 is not assigned: EgressIP a, created earlier, asks for the same IP",
                "spec.egressIPs[1]: 192.168.1.12 is not assigned: it is an address of node w2",
            ]
        );
        // b's status already has no items: nothing to write.
        assert!(!d[1].write);
        assert_eq!(
            status_body("b", &d[1].assignment.items),
            json!({"apiVersion": "k8s.ovn.org/v1", "kind": "EgressIP", "metadata": {"name": "b"},
                "status": {"items": []}})
        );

        // Status already says it.
        let a =
            egress_ip("a", &["192.168.1.100"], &[("team", "a")]).hosted(&[("192.168.1.100", "w1")]);
        let d = decide(&snap(&[a]), |_| true);
        assert!(!d[0].write && d[0].moved.is_empty());
        // An unhealthy verdict from the probes moves it like a NotReady node.
        let a =
            egress_ip("a", &["192.168.1.100"], &[("team", "a")]).hosted(&[("192.168.1.100", "w1")]);
        let d = decide(&snap(&[a]), |n| n != "w1");
        assert_eq!(
            d[0].assignment.problems[0].reason,
            assign::Reason::NoCandidate
        );
    }

    #[test]
    fn a_dead_verdict_moves_the_ip_and_an_alive_one_keeps_it() {
        let a =
            egress_ip("a", &["192.168.1.100"], &[("team", "a")]).hosted(&[("192.168.1.100", "w1")]);
        let snap = Snapshot::builder()
            .with(assignable("w1", "1", true))
            .with(assignable("w2", "2", true))
            .with(node("w3", &["192.168.1.13"]).ready(true).object())
            .with(a.object())
            .build();
        // The probes watch the assignable nodes by InternalIP.
        let targets = probe_targets(&snap);
        assert_eq!(
            targets.keys().map(String::as_str).collect::<Vec<_>>(),
            ["w1", "w2"]
        );
        assert_eq!(
            targets["w1"],
            vec!["192.168.1.11".parse::<IpAddr>().unwrap()]
        );

        // No verdict yet (a new term), then alive: the IP stays.
        for verdicts in [
            probe::Verdicts::new(),
            probe::Verdicts::from([("w1".into(), true), ("w2".into(), true)]),
        ] {
            let d = decide(&snap, healthy_from(&verdicts));
            assert!(!d[0].write && d[0].moved.is_empty(), "{verdicts:?}");
        }
        // w1 dead: the IP moves to w2, with an Event's worth of move.
        let verdicts = probe::Verdicts::from([("w1".into(), false), ("w2".into(), true)]);
        let d = decide(&snap, healthy_from(&verdicts));
        assert_moved(&d[0], "192.168.1.100", "w1", "w2");
    }
}
