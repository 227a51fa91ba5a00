//! Status write-back for EgressFirewall and EgressQoS, and Kubernetes Events for rejected
//! input and for EgressIP problems (the EgressIP status is `items` only, owned by the
//! assigning controller: an agent reports there through Warning Events, with
//! OVN-Kubernetes' reason where it has one, else `EgressIPNotApplied`, one per new problem
//! text, whose note names the node; see `plan::egress_ip`). The run loop's [`StatusObserver`] works out, after every sync, which objects need a
//! different status (see [`merge`]) and hands the patches to a tokio task that applies them
//! with server-side apply under the field manager `nodeplane-<node>`, retrying failures; the
//! reconcile thread never waits on the API server.

pub mod merge;

use crate::task::{OnExit, Task};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::observe::{SyncObserver, SyncOutcome};
use crate::snapshot::{AnyObject, Kind, ObjectKey, Snapshot};
use crate::source::kube::{Rejection, api_resource};
use merge::StatusPatch;

/// Kinds whose status this agent writes.
const KINDS: [Kind; 2] = [Kind::EgressFirewall, Kind::EgressQoS];
const RETRY: Duration = Duration::from_secs(2);

/// Work for the writer task.
#[derive(Debug)]
enum Job {
    Status {
        kind: Kind,
        key: ObjectKey,
        patch: StatusPatch,
    },
    Event {
        object: ObjectReference,
        reason: &'static str,
        note: String,
    },
}

/// Longest `note` the API server accepts on an Event, in bytes.
const EVENT_NOTE_MAX: usize = 1024;

/// Computes status patches and events on the reconcile thread; [`spawn_writer`] applies them.
pub struct StatusObserver {
    node: String,
    jobs: mpsc::UnboundedSender<Job>,
    /// Patches handed to the writer and not yet visible in the snapshot.
    sent: BTreeMap<(Kind, ObjectKey), StatusPatch>,
    /// The last rejection reported as an Event per object (one Event per new reason).
    reported: BTreeMap<(Kind, ObjectKey), String>,
    /// The last EgressIP problem reported as an Event per object.
    reported_eip: BTreeMap<ObjectKey, String>,
}

/// The field manager of this node's agent.
pub fn field_manager(node: &str) -> String {
    format!("nodeplane-{node}")
}

/// The writer task, the observer that feeds it from the run loop, and a sender for decode
/// rejections (reported as Events).
pub fn writer_task(client: Client, node: &str) -> (impl Task, StatusObserver, RejectionSink) {
    let (jobs, rx) = mpsc::unbounded_channel();
    let run = writer(client, node.to_string(), rx);
    let writer = crate::task::once("status-writer", OnExit::Finish, async move {
        run.await;
        Ok(())
    });
    let observer = StatusObserver::new(node, jobs.clone());
    (writer, observer, RejectionSink { jobs })
}

/// Turns objects that could not be decoded into Warning Events on them.
#[derive(Clone)]
pub struct RejectionSink {
    jobs: mpsc::UnboundedSender<Job>,
}

impl RejectionSink {
    pub fn report(&self, r: &Rejection) {
        let _ = self.jobs.send(Job::Event {
            object: reference(r.kind, &r.key, r.uid.clone()),
            reason: "Malformed",
            note: format!(
                "nodeplane cannot decode this object, it is ignored: {}",
                r.message
            ),
        });
    }
}

fn reference(kind: Kind, key: &ObjectKey, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version().to_string()),
        kind: Some(kind.as_str().to_string()),
        name: Some(key.name.clone()),
        namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
        uid,
        ..Default::default()
    }
}

/// The object's current `status.conditions` (EgressQoS).
fn current_conditions(
    obj: &AnyObject,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    match obj {
        AnyObject::EgressQoS(o) => (o.status.as_ref())
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The object's current `status.status` and `status.messages`.
fn current_status(obj: &AnyObject) -> (Option<String>, Vec<String>) {
    let status = match obj {
        AnyObject::EgressFirewall(o) => o.status.as_ref().map(|s| (&s.status, &s.messages)),
        AnyObject::EgressQoS(o) => o.status.as_ref().map(|s| (&s.status, &s.messages)),
        _ => None,
    };
    match status {
        Some((s, m)) => (s.clone(), m.clone().unwrap_or_default()),
        None => (None, Vec::new()),
    }
}

impl StatusObserver {
    fn new(node: &str, jobs: mpsc::UnboundedSender<Job>) -> StatusObserver {
        StatusObserver {
            node: node.to_string(),
            jobs,
            sent: BTreeMap::new(),
            reported: BTreeMap::new(),
            reported_eip: BTreeMap::new(),
        }
    }

    /// EgressIP problems this node is to report ([`crate::plan::ObjectStatus::event`]): an
    /// Event per new text, nothing while it stays the same, forgotten once solved (so a
    /// recurrence is reported again).
    fn egress_ip_events(&mut self, sync: &SyncOutcome<'_>, snapshot: &Snapshot) {
        let Ok(report) = sync.result else {
            return;
        };
        let mut seen = BTreeSet::new();
        for s in report.statuses.iter().filter(|s| s.kind == Kind::EgressIP) {
            let Some(event) = &s.event else { continue };
            let note = &event.note;
            let Some(obj) = snapshot.get(Kind::EgressIP, &s.key) else {
                continue;
            };
            seen.insert(s.key.clone());
            if self.reported_eip.get(&s.key) == Some(note) {
                continue;
            }
            self.reported_eip.insert(s.key.clone(), note.clone());
            let _ = self.jobs.send(Job::Event {
                object: reference(Kind::EgressIP, &s.key, obj.meta().uid.clone()),
                reason: event.reason,
                note: note.clone(),
            });
        }
        self.reported_eip.retain(|k, _| seen.contains(k));
    }

    /// The verdict per object: the planner's, or the apply error for all of them.
    fn verdicts(
        sync: &SyncOutcome<'_>,
        snapshot: &Snapshot,
    ) -> Vec<(Kind, ObjectKey, Option<String>)> {
        match sync.result {
            Ok(report) => report
                .statuses
                .iter()
                .filter(|s| KINDS.contains(&s.kind))
                .map(|s| (s.kind, s.key.clone(), s.result.clone().err()))
                .collect(),
            Err(e) => snapshot
                .objects()
                .filter(|o| KINDS.contains(&o.kind()))
                .map(|o| (o.kind(), o.key(), Some(e.to_string())))
                .collect(),
        }
    }
}

impl SyncObserver for StatusObserver {
    fn observe(&mut self, sync: &SyncOutcome<'_>) {
        let Some(snapshot) = sync.snapshot else {
            return;
        };
        let mut seen = BTreeSet::new();
        for (kind, key, failure) in Self::verdicts(sync, snapshot) {
            let Some(obj) = snapshot.get(kind, &key) else {
                continue;
            };
            let id = (kind, key.clone());
            seen.insert(id.clone());
            let (status, messages) = current_status(&obj);
            let conditions = current_conditions(&obj);
            let messages = merge::entries_with_zone_conditions(&messages, &conditions, &self.node);
            let verdict = merge::verdict(kind.as_str(), failure.as_deref());
            let wanted = merge::desired(
                kind.as_str(),
                &self.node,
                &verdict,
                status.as_deref(),
                &messages,
            );
            let wanted = if kind == Kind::EgressQoS {
                let now = merge::rfc3339(&k8s_openapi::jiff::Timestamp::now());
                let applied = failure.is_none();
                let mut z =
                    merge::ZoneCondition::new(&self.node, &verdict, applied, &conditions, &now);
                // Sent and not visible yet: the same transition, not a new one each sync.
                if let Some(sent) = self.sent.get(&id).and_then(|p| p.condition.as_ref())
                    && sent.type_ == z.type_
                    && sent.status == z.status
                    && sent.message == z.message
                {
                    z.last_transition_time = sent.last_transition_time.clone();
                }
                let (k, node) = (kind.as_str(), &self.node);
                merge::desired_with_condition(wanted, k, node, &verdict, &messages, z, &conditions)
            } else {
                wanted
            };
            match wanted {
                None => {
                    self.sent.remove(&id);
                }
                Some(patch) if self.sent.get(&id) != Some(&patch) => {
                    self.sent.insert(id.clone(), patch.clone());
                    let _ = self.jobs.send(Job::Status {
                        kind,
                        key: key.clone(),
                        patch,
                    });
                }
                Some(_) => {}
            }
            match failure {
                Some(reason) if self.reported.get(&id) != Some(&reason) => {
                    self.reported.insert(id, reason.clone());
                    let _ = self.jobs.send(Job::Event {
                        object: reference(kind, &key, obj.meta().uid.clone()),
                        reason: "RulesNotApplied",
                        note: verdict,
                    });
                }
                Some(_) => {}
                None => {
                    self.reported.remove(&id);
                }
            }
        }
        self.sent.retain(|id, _| seen.contains(id));
        self.reported.retain(|id, _| seen.contains(id));
        self.egress_ip_events(sync, snapshot);
    }
}

async fn writer(client: Client, node: String, mut rx: mpsc::UnboundedReceiver<Job>) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "nodeplane".into(),
            instance: Some(node.clone()),
        },
    );
    let params = PatchParams::apply(&field_manager(&node)).force();
    // Latest patch per object: a newer verdict replaces one still waiting for a retry.
    let mut pending: BTreeMap<(Kind, ObjectKey), StatusPatch> = BTreeMap::new();
    loop {
        // With patches waiting for a retry, wake up after RETRY even without new work.
        let job = if pending.is_empty() {
            match rx.recv().await {
                Some(job) => Some(job),
                None => return,
            }
        } else {
            match tokio::time::timeout(RETRY, rx.recv()).await {
                Ok(Some(job)) => Some(job),
                Ok(None) => return,
                Err(_) => None,
            }
        };
        match job {
            Some(Job::Status { kind, key, patch }) => {
                pending.insert((kind, key), patch);
            }
            Some(Job::Event {
                object,
                reason,
                note,
            }) => {
                let event = Event {
                    type_: EventType::Warning,
                    reason: reason.into(),
                    // One line, and within the API's 1 KiB limit on a note.
                    note: Some(crate::text::one_line_within(&note, EVENT_NOTE_MAX).into_owned()),
                    action: "Apply".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&event, &object).await {
                    warn!(
                        "cannot create Event for {:?}/{:?}: {e}",
                        object.namespace, object.name
                    );
                }
            }
            None => {}
        }
        let mut done = Vec::new();
        for ((kind, key), patch) in &pending {
            match apply(&client, *kind, key, patch, &params).await {
                Ok(()) => {
                    debug!("{kind} {key}: status {:?}", patch.status);
                    done.push((*kind, key.clone()));
                }
                Err(kube::Error::Api(s)) if s.code == 404 => done.push((*kind, key.clone())),
                Err(e) => warn!("{kind} {key}: cannot write status, retrying: {e}"),
            }
        }
        for id in done {
            pending.remove(&id);
        }
    }
}

async fn apply(
    client: &Client,
    kind: Kind,
    key: &ObjectKey,
    patch: &StatusPatch,
    params: &PatchParams,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &key.namespace, &api_resource(kind));
    let mut status = json!({"status": patch.status, "messages": [patch.message]});
    if let Some(c) = &patch.condition {
        // Keyed by type (list-type map): this node's field manager owns this entry alone.
        status["conditions"] = json!([{
            "type": c.type_,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": c.last_transition_time,
        }]);
    }
    let body = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.as_str(),
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": status,
    });
    api.patch_status(&key.name, params, &Patch::Apply(&body))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::Table;
    use crate::observe::SyncReport;
    use crate::plan::{NodeEvent, ObjectStatus};
    use crate::testing::objects;

    fn observe(o: &mut StatusObserver, snap: &Snapshot, event: Option<&str>) {
        let report = SyncReport {
            statuses: vec![ObjectStatus {
                kind: Kind::EgressIP,
                key: ObjectKey::cluster("backend"),
                result: Err("x".into()),
                event: event.map(|note| NodeEvent {
                    reason: "InvalidEgressIP",
                    note: note.to_string(),
                }),
            }],
            ..SyncReport::default()
        };
        let table = Table::new("nodeplane");
        o.observe(&SyncOutcome::plain(Some(snap), &Ok(report), Some(&table)));
    }

    fn events(rx: &mut mpsc::UnboundedReceiver<Job>) -> Vec<(String, &'static str, String)> {
        let mut out = Vec::new();
        while let Ok(job) = rx.try_recv() {
            match job {
                Job::Event {
                    object,
                    reason,
                    note,
                } => out.push((object.kind.unwrap_or_default(), reason, note)),
                Job::Status { kind, key, .. } => panic!("no status for {kind} {key}"),
            }
        }
        out
    }

    #[test]
    fn egress_ip_problems_become_one_event_per_new_problem_and_no_status_patch() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut o = StatusObserver::new("worker-2", tx);
        let eip = objects::egress_ip("backend", &["192.168.50.200"], &[("team", "backend")]);
        let snap = Snapshot::builder().with(eip.object()).build();
        let note = "node worker-2: traffic of 1 selected pod address(es) is dropped";
        observe(&mut o, &snap, Some(note));
        assert_eq!(
            events(&mut rx),
            vec![("EgressIP".to_string(), "InvalidEgressIP", note.to_string())],
            "the planner's reason"
        );
        observe(&mut o, &snap, Some(note));
        assert!(events(&mut rx).is_empty(), "same problem: no new Event");
        // Not this node's to report, or solved: nothing; a recurrence is reported again.
        observe(&mut o, &snap, None);
        assert!(events(&mut rx).is_empty());
        observe(&mut o, &snap, Some(note));
        assert_eq!(events(&mut rx).len(), 1);
    }

    /// With OVN-Kubernetes' EgressQoS CRD the API server prunes `status.messages`: the node
    /// never sees its entry, yet writes once (with its zone condition), not after every sync.
    #[test]
    fn pruned_messages_are_written_once_with_the_zone_condition() {
        use crate::api::egress_qos::EgressQoSStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut o = StatusObserver::new("w1", tx);
        let mut qos = objects::egress_qos("shop", "[{dscp: 46}]").object();
        // What the API server kept of an earlier write: status and condition, no messages.
        qos.status = Some(EgressQoSStatus {
            status: Some("EgressQoS Rules applied".into()),
            conditions: Some(vec![Condition {
                type_: "Ready-In-Zone-w1".into(),
                status: "True".into(),
                reason: "SetupSucceeded".into(),
                message: "EgressQoS Rules applied".into(),
                last_transition_time: Time("2026-01-01T00:00:00Z".parse().unwrap()),
                observed_generation: None,
            }]),
            messages: None,
        });
        let snap = Snapshot::builder().with(qos).build();
        let sync = |o: &mut StatusObserver| {
            let report = SyncReport {
                statuses: vec![ObjectStatus {
                    kind: Kind::EgressQoS,
                    key: ObjectKey::new("shop", "default"),
                    result: Ok(()),
                    event: None,
                }],
                ..SyncReport::default()
            };
            let table = Table::new("nodeplane");
            o.observe(&SyncOutcome::plain(Some(&snap), &Ok(report), Some(&table)));
        };
        let mut patches = Vec::new();
        for _ in 0..3 {
            sync(&mut o);
            while let Ok(job) = rx.try_recv() {
                if let Job::Status { patch, .. } = job {
                    patches.push(patch);
                }
            }
        }
        assert_eq!(patches.len(), 1, "{patches:?}");
        let c = patches[0].condition.as_ref().unwrap();
        assert_eq!(c.type_, "Ready-In-Zone-w1");
        // The condition did not transition: its time stays.
        assert_eq!(c.last_transition_time, "2026-01-01T00:00:00Z");
    }
}
