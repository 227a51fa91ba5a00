//! The assigner's side of the cloud flow that talks to the API server and remembers across
//! snapshots (one leadership term): writes the CloudPrivateIPConfigs of a [`cloud::Plan`],
//! counts each `CloudResponseError` once (per object version), keeps the IP off that node for
//! an exponential backoff (so the assignment moves it to another fitting node where one
//! exists, or, with none, releases it and asks the same node again when the backoff ends),
//! and times the cloud (request written to `Assigned=True` seen).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tracing::{info, warn};

use super::FIELD_MANAGER;
use super::assign::EgressIpInfo;
use super::cloud::{Failure, Plan, Write};
use super::platform::PlatformChoice;
use crate::api::cloud_private_ip_config::name_for_ip;
use crate::api::{CloudPrivateIPConfig, CloudPrivateIPConfigSpec};
use crate::timing::Backoff;

use crate::api::egress_ip::event_reason;
/// Warning Event reason for an IP the cloud refused; Normal Event reason for an IP requested
/// from the cloud (created or moved).
pub use crate::api::egress_ip::event_reason::{CLOUD_ERROR, CLOUD_REQUESTED};
/// Backoff of an IP the cloud refused on a node.
const REFUSAL_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// Retry of a failed write to the API server.
const WRITE_RETRY: Duration = Duration::from_secs(2);

/// The cloud flow's settings: the platform and where to record the cloud's latency.
#[derive(Debug, Clone)]
pub struct Settings {
    pub platform: PlatformChoice,
    /// `nodeplane_egress_ip_cloud_attach_seconds` (a detached histogram by default).
    pub attach_seconds: Histogram,
}

/// `nodeplane_egress_ip_cloud_attach_seconds`' buckets: 50 ms to ~100 s (clouds take seconds).
pub fn attach_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 12))
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            platform: PlatformChoice::Auto,
            attach_seconds: attach_histogram(),
        }
    }
}

/// An IP the cloud refused.
#[derive(Debug, Clone)]
struct Refusal {
    node: String,
    backoff: Backoff,
    until: Instant,
    /// The resourceVersion of the object whose error was counted.
    counted: Option<String>,
}

/// An Event to publish on an EgressIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub egress_ip: String,
    pub warning: bool,
    pub reason: &'static str,
    pub text: String,
}

pub struct CloudSync {
    api: Api<CloudPrivateIPConfig>,
    attach_seconds: Histogram,
    refusals: BTreeMap<IpAddr, Refusal>,
    /// Requests written and when, until confirmed: the cloud's latency.
    requested: BTreeMap<IpAddr, (String, Instant)>,
    write_failed: bool,
    /// Per IP, the refusal `(message, lastTransitionTime)` a request was written over: until
    /// the cloud controller answers the new request the object may still show it (without
    /// `observedGeneration` to tell), and it is no refusal of the new node.
    superseded: BTreeMap<IpAddr, (String, String)>,
    /// A new refusal: look again at once, so the IP moves without waiting for a snapshot.
    recheck: bool,
}

impl CloudSync {
    pub fn new(api: Api<CloudPrivateIPConfig>, settings: &Settings) -> CloudSync {
        CloudSync {
            api,
            attach_seconds: settings.attach_seconds.clone(),
            refusals: BTreeMap::new(),
            requested: BTreeMap::new(),
            write_failed: false,
            superseded: BTreeMap::new(),
            recheck: false,
        }
    }

    /// Keeps each IP off the node the cloud refused it on while its backoff runs.
    pub fn avoid(&self, eips: &mut [EgressIpInfo], now: Instant) {
        for e in eips {
            for ip in &e.ips {
                if let Some(r) = self.refusals.get(ip).filter(|r| r.until > now) {
                    e.avoid
                        .entry(*ip)
                        .or_insert_with(BTreeSet::new)
                        .insert(r.node.clone());
                }
            }
        }
    }

    /// When the assigner must look again without a new snapshot: a backoff ending, a write
    /// to retry.
    pub fn wake_in(&self, now: Instant) -> Option<Duration> {
        let backoff = self
            .refusals
            .values()
            .filter(|r| r.until > now)
            .map(|r| r.until - now)
            .min();
        let retry = self.write_failed.then_some(WRITE_RETRY);
        let recheck = self.recheck.then_some(Duration::ZERO);
        backoff.into_iter().chain(retry).chain(recheck).min()
    }

    /// Writes the plan's CloudPrivateIPConfigs and returns the Events to publish.
    pub async fn apply(&mut self, plan: &Plan, now: Instant) -> Vec<Note> {
        self.recheck = false;
        self.take_confirmed(plan, now);
        let mut notes = self.take_failures(plan, now);
        notes.extend(self.write_all(plan, now).await);
        notes.extend(requested_notes(plan));
        notes
    }

    /// The IPs the cloud attached where asked: no longer refused, and how long it took.
    fn take_confirmed(&mut self, plan: &Plan, now: Instant) {
        for (ip, node) in &plan.confirmed {
            self.refusals.remove(ip);
            if let Some((_, since)) = self.requested.remove(ip).filter(|(n, _)| n == node) {
                let took = now.saturating_duration_since(since);
                self.attach_seconds.observe(took.as_secs_f64());
                info!("egress IP {ip}: attached to node {node} by the cloud in {took:?}");
            }
        }
    }

    /// The cloud's new refusals (not those a later write superseded, nor one counted
    /// already): each backs its node off for that IP and is a warning Event.
    fn take_failures(&mut self, plan: &Plan, now: Instant) -> Vec<Note> {
        let refused_now: BTreeSet<IpAddr> = plan.refused.keys().copied().collect();
        self.superseded.retain(|ip, _| refused_now.contains(ip));
        let stale =
            |f: &Failure| self.superseded.get(&f.ip) == Some(&(f.message.clone(), f.since.clone()));
        let failures: Vec<Failure> = plan
            .failures
            .iter()
            .filter(|f| !stale(f))
            .cloned()
            .collect();
        let mut notes = Vec::new();
        for f in &failures {
            let r = self.refusals.entry(f.ip).or_insert_with(|| Refusal {
                node: f.node.clone(),
                backoff: REFUSAL_BACKOFF,
                until: now,
                counted: None,
            });
            if r.counted == f.resource_version && r.node == f.node {
                continue;
            }
            let delay = r.backoff.next_delay();
            r.node = f.node.clone();
            r.until = now + delay;
            r.counted = f.resource_version.clone();
            self.recheck = true;
            self.requested.remove(&f.ip);
            let text = format!(
                "{}: the cloud could not attach it to node {}: {}; node {} is avoided for {:?} \
                 (another fitting node takes it if there is one, else it is retried there)",
                f.ip, f.node, f.message, f.node, delay
            );
            warn!("EgressIP {}: {text}", f.egress_ip);
            notes.push(Note {
                egress_ip: f.egress_ip.clone(),
                warning: true,
                reason: CLOUD_ERROR,
                text,
            });
        }
        notes
    }

    /// Sends the plan's writes, remembering what was asked of the cloud and when; a failed
    /// write is retried (and may be an Event).
    async fn write_all(&mut self, plan: &Plan, now: Instant) -> Vec<Note> {
        let mut notes = Vec::new();
        self.write_failed = false;
        for w in &plan.writes {
            if let Err(e) = self.write(w).await {
                warn!("CloudPrivateIPConfig write {w:?} failed, retrying: {e}");
                self.write_failed = true;
                if let Some(note) = write_failure_note(plan, w, &e) {
                    notes.push(note);
                }
                continue;
            }
            match w {
                Write::Create { ip, node } | Write::Move { ip, to: node, .. } => {
                    self.requested.insert(*ip, (node.clone(), now));
                    if let Some(r) = plan.refused.get(ip) {
                        self.superseded.insert(*ip, r.clone());
                    }
                }
                Write::Delete { ip } => {
                    self.requested.remove(ip);
                }
            }
        }
        notes
    }

    async fn write(&self, w: &Write) -> Result<(), kube::Error> {
        let ok_if = |code: u16| {
            move |r: Result<(), kube::Error>| match r {
                Err(kube::Error::Api(s)) if s.code == code => Ok(()),
                other => other,
            }
        };
        match w {
            Write::Create { ip, node } => {
                let obj = CloudPrivateIPConfig::new(
                    &name_for_ip(*ip),
                    CloudPrivateIPConfigSpec {
                        node: Some(node.clone()),
                    },
                );
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                info!(
                    "CloudPrivateIPConfig {}: create for node {node}",
                    name_for_ip(*ip)
                );
                // Already there: the next snapshot shows it.
                ok_if(409)(self.api.create(&params, &obj).await.map(|_| ()))
            }
            Write::Move { ip, from, to } => {
                info!(
                    "CloudPrivateIPConfig {}: spec.node {from:?} -> {to}",
                    name_for_ip(*ip)
                );
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                };
                let patch = Patch::Merge(json!({"spec": {"node": to}}));
                ok_if(404)(
                    self.api
                        .patch(&name_for_ip(*ip), &params, &patch)
                        .await
                        .map(|_| ()),
                )
            }
            Write::Delete { ip } => {
                info!("CloudPrivateIPConfig {}: delete", name_for_ip(*ip));
                ok_if(404)(
                    self.api
                        .delete(&name_for_ip(*ip), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )
            }
        }
    }
}

/// An Event for each pending IP the plan has just asked the cloud for.
fn requested_notes(plan: &Plan) -> Vec<Note> {
    let mut notes = Vec::new();
    for (eip, ip, node) in &plan.pending {
        let just_asked = plan.writes.iter().any(|w| match w {
            Write::Create { ip: i, .. } | Write::Move { ip: i, .. } => i == ip,
            Write::Delete { .. } => false,
        });
        if just_asked {
            notes.push(Note {
                egress_ip: eip.clone(),
                warning: false,
                reason: CLOUD_REQUESTED,
                text: format!("{ip} requested from the cloud on node {node}"),
            });
        }
    }
    notes
}

/// The Warning Event for a CloudPrivateIPConfig write the API server refused, on the
/// EgressIP the IP belongs to, with OVN-Kubernetes' reason and wording (an IP being deleted
/// belongs to none: logged only).
fn write_failure_note(plan: &Plan, w: &Write, e: &kube::Error) -> Option<Note> {
    let (ip, reason, verb) = match w {
        Write::Create { ip, .. } => (ip, event_reason::CLOUD_ASSIGNMENT_FAILED, "created"),
        Write::Move { ip, .. } => (ip, event_reason::CLOUD_UPDATE_FAILED, "updated"),
        Write::Delete { ip } => (ip, event_reason::CLOUD_DELETION_FAILED, "deleted"),
    };
    // A deleted IP is no longer any EgressIP's: its failure is logged only.
    let egress_ip = plan
        .pending
        .iter()
        .find(|(_, i, _)| i == ip)
        .map(|(eip, _, _)| eip.clone())?;
    Some(Note {
        text: format!(
            "egress IP: {ip} for object EgressIP: {egress_ip} could not be {verb}, err: {e}"
        ),
        egress_ip,
        warning: true,
        reason,
    })
}
