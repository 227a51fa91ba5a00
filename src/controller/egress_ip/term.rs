//! One leadership term of the assigner: what it wrote, what failed, what it reported, and on
//! a cloud the [`CloudSync`] (see the module documentation of `super` for the status path).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::assign::{self, Problem};
use super::cloud_sync::{self, CloudSync, Note};
use super::platform::Platform;
use super::{
    Decision, EVENT_NOTE_MAX, FIELD_MANAGER, MOVED, RETRY, StatusPath, cloud, decisions,
    healthy_from, inputs, probe, status_body,
};
use crate::api::EgressIP;
use crate::snapshot::Snapshot;

/// Items written and the object's resourceVersion they were decided on.
type Sent = (Vec<(IpAddr, String)>, Option<String>);

/// One leadership term's memory.
pub(super) struct Term<'a> {
    api: &'a Api<EgressIP>,
    recorder: &'a Recorder,
    settings: &'a cloud_sync::Settings,
    cloud: CloudSync,
    /// The platform of the last sync (logged when it changes).
    platform: Option<Platform>,
    path: StatusPath,
    /// Items written per EgressIP and the resourceVersion the decision was made on: not
    /// written again until the snapshot shows a newer version of the object.
    sent: BTreeMap<String, Sent>,
    /// Writes that failed, to retry.
    failed: BTreeSet<String>,
    /// The last reason reported per (EgressIP, IP): one Event per new reason.
    reported: BTreeMap<(String, IpAddr), String>,
}

impl<'a> Term<'a> {
    pub(super) fn new(
        api: &'a Api<EgressIP>,
        recorder: &'a Recorder,
        cloud: CloudSync,
        settings: &'a cloud_sync::Settings,
    ) -> Term<'a> {
        Term {
            api,
            recorder,
            settings,
            cloud,
            platform: None,
            path: StatusPath::Subresource,
            sent: BTreeMap::new(),
            failed: BTreeSet::new(),
            reported: BTreeMap::new(),
        }
    }

    /// When to sync again without a new snapshot or verdict: a write to retry, a cloud
    /// backoff ending.
    pub(super) fn wake_in(&self) -> Option<Duration> {
        let retry = (!self.failed.is_empty()).then_some(RETRY);
        retry
            .into_iter()
            .chain(self.cloud.wake_in(Instant::now()))
            .min()
    }

    /// The decisions for `snap`; on a cloud, after writing the CloudPrivateIPConfigs they
    /// need (`super::cloud`).
    async fn decide(&mut self, snap: &Snapshot, verdicts: &probe::Verdicts) -> Vec<Decision> {
        let platform = self
            .settings
            .platform
            .resolve(snap.nodes().values().map(AsRef::as_ref));
        if self.platform != Some(platform) {
            info!("EgressIP assigner: platform {platform}");
            self.platform = Some(platform);
        }
        let (mut eips, nodes) = inputs(snap, healthy_from(verdicts), platform);
        if !platform.is_cloud() {
            let out = assign::assign(&eips, &nodes);
            return decisions(snap, &eips, out, None);
        }
        let now = Instant::now();
        let observed = cloud::observe(snap);
        cloud::stick_to_requests(&mut eips, &observed);
        self.cloud.avoid(&mut eips, now);
        let out = assign::assign(&eips, &nodes);
        let capacity = nodes
            .iter()
            .filter_map(|n| match &n.cloud {
                Some(Ok(nic)) => Some((n.name.clone(), nic.capacity)),
                _ => None,
            })
            .collect();
        let plan = cloud::plan(&out, &observed, &capacity);
        for note in self.cloud.apply(&plan, now).await {
            self.publish_note(snap, &note).await;
        }
        decisions(snap, &eips, out, Some(&plan.confirmed))
    }

    pub(super) async fn sync(
        &mut self,
        snap: &Snapshot,
        leading: &watch::Receiver<bool>,
        verdicts: &probe::Verdicts,
    ) {
        let decisions = self.decide(snap, verdicts).await;
        let names: BTreeSet<&str> = decisions.iter().map(|d| d.name.as_str()).collect();
        self.sent.retain(|n, _| names.contains(n.as_str()));
        self.failed.retain(|n| names.contains(n.as_str()));
        self.reported.retain(|(n, _), _| names.contains(n.as_str()));
        for d in &decisions {
            if !*leading.borrow() {
                return;
            }
            self.report(d).await;
            if !d.write {
                self.sent.remove(&d.name);
                self.failed.remove(&d.name);
                continue;
            }
            let this = (d.assignment.items.clone(), d.resource_version.clone());
            if self.sent.get(&d.name) == Some(&this) && !self.failed.contains(&d.name) {
                continue;
            }
            match self.write(&d.name, &d.assignment.items).await {
                Ok(()) => {
                    info!(
                        "EgressIP {}: status.items = {}",
                        d.name,
                        describe(&d.assignment.items)
                    );
                    self.failed.remove(&d.name);
                    self.report_moves(d).await;
                }
                Err(e) => {
                    warn!(
                        "EgressIP {}: cannot write status.items, retrying: {e}",
                        d.name
                    );
                    self.failed.insert(d.name.clone());
                }
            }
            self.sent.insert(d.name.clone(), this);
        }
    }

    /// Applies the items (see the module documentation for the path).
    async fn write(&mut self, name: &str, items: &[(IpAddr, String)]) -> Result<(), kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let body = status_body(name, items);
        let shows = |obj: &EgressIP| {
            let got: Vec<(String, String)> = obj
                .status
                .iter()
                .flat_map(|s| s.items.iter())
                .map(|i| (i.egress_ip.clone(), i.node.clone()))
                .collect();
            let want: Vec<(String, String)> = items
                .iter()
                .map(|(i, n)| (i.to_string(), n.clone()))
                .collect();
            got == want
        };
        if self.path == StatusPath::Subresource {
            match self
                .api
                .patch_status(name, &params, &Patch::Apply(&body))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                other => return other.map(|_| ()),
            }
        }
        match self.api.patch(name, &params, &Patch::Apply(&body)).await {
            Ok(obj) if shows(&obj) => {
                if self.path != StatusPath::Object {
                    info!(
                        "EgressIP CRD has no status subresource: status is written with the object"
                    );
                    self.path = StatusPath::Object;
                }
                Ok(())
            }
            Ok(_) if self.path == StatusPath::Object => {
                // The API server ignored the status: the CRD has a subresource now.
                self.path = StatusPath::Subresource;
                self.api
                    .patch_status(name, &params, &Patch::Apply(&body))
                    .await
                    .map(|_| ())
            }
            Ok(_) => Ok(()),
            // Gone: the next snapshot drops it.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!("EgressIP {name}: gone before its status was written");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn report(&mut self, d: &Decision) {
        let object = reference(d);
        let problems: BTreeMap<IpAddr, &Problem> =
            d.assignment.problems.iter().map(|p| (p.ip, p)).collect();
        self.reported
            .retain(|(n, ip), _| n != &d.name || problems.contains_key(ip));
        for (ip, p) in problems {
            let note = p.to_string();
            let key = (d.name.clone(), ip);
            if self.reported.get(&key) == Some(&note) {
                continue;
            }
            warn!("EgressIP {}: {note}", d.name);
            let reason = p.reason.event_reason(!d.assignment.items.is_empty());
            self.publish(&object, EventType::Warning, reason, &note)
                .await;
            self.reported.insert(key, note);
        }
    }

    /// Normal Events for the IPs a successful write moved.
    async fn report_moves(&self, d: &Decision) {
        let object = reference(d);
        for (ip, from, to) in &d.moved {
            let note = format!("{ip} moved from node {from} to node {to}");
            self.publish(&object, EventType::Normal, MOVED, &note).await;
        }
    }

    async fn publish(&self, object: &ObjectReference, type_: EventType, reason: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(crate::text::one_line_within(note, EVENT_NOTE_MAX).into_owned()),
            action: "Assign".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, object).await {
            warn!("cannot create Event for EgressIP {:?}: {e}", object.name);
        }
    }
}

impl Term<'_> {
    /// Publishes a cloud flow Event on its EgressIP (the EgressIP has no status field for
    /// messages: Events are where an operator reads them).
    async fn publish_note(&self, snap: &Snapshot, note: &Note) {
        let object = ObjectReference {
            api_version: Some("k8s.ovn.org/v1".into()),
            kind: Some("EgressIP".into()),
            name: Some(note.egress_ip.clone()),
            uid: snap
                .egress_ips()
                .get(&note.egress_ip)
                .and_then(|e| e.metadata.uid.clone()),
            ..Default::default()
        };
        let type_ = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.publish(&object, type_, note.reason, &note.text).await;
    }
}

fn reference(d: &Decision) -> ObjectReference {
    ObjectReference {
        api_version: Some("k8s.ovn.org/v1".into()),
        kind: Some("EgressIP".into()),
        name: Some(d.name.clone()),
        uid: d.uid.clone(),
        ..Default::default()
    }
}

fn describe(items: &[(IpAddr, String)]) -> String {
    let parts: Vec<String> = items.iter().map(|(ip, n)| format!("{ip} on {n}")).collect();
    if parts.is_empty() {
        "[]".into()
    } else {
        parts.join(", ")
    }
}
