//! A cloud-controller stand-in over [`FakeApi`]: what openshift/cloud-network-config-controller
//! does with CloudPrivateIPConfigs, without a cloud. For every object whose `spec.node` it has
//! not answered yet it writes `Assigned=False/CloudResponsePending` with `status.node` cleared
//! (a move releases the IP from the old node first), then, after the injectable delay,
//! `Assigned=True/CloudResponseSuccess` with `status.node = spec.node`, or
//! `Assigned=False/CloudResponseError` for an IP and node whose failure was injected. Like
//! the real controller it holds a finalizer on each object it works on, so a deleted object
//! stays (with its `deletionTimestamp`) until the stand-in released the IP, the same delay
//! later.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fakeapi::{FakeApi, Objects};
use crate::api::cloud_private_ip_config::name_for_ip;

/// How often the stand-in looks at the objects.
const POLL: Duration = Duration::from_millis(5);
/// The real controller's finalizer.
pub const FINALIZER: &str = "cloudprivateipconfig.cloud.network.openshift.io/finalizer";

#[derive(Default)]
struct Faults {
    delay: Duration,
    /// `(object name, node)` the cloud refuses.
    refuse: BTreeSet<(String, String)>,
}

/// Per object: the `(spec.node, uid)` being worked on and since when, and what was answered.
#[derive(Default)]
struct Work {
    started: BTreeMap<String, (String, String, Instant)>,
    answered: BTreeMap<String, (String, String)>,
    /// When `Assigned=True` was written, per `(object name, node)`.
    attached_at: BTreeMap<(String, String), Instant>,
    /// Objects being deleted, since when.
    releasing: BTreeMap<String, Instant>,
}

/// The running stand-in; stops when dropped.
pub struct CloudController {
    faults: Arc<Mutex<Faults>>,
    work: Arc<Mutex<Work>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CloudController {
    /// Starts answering the CloudPrivateIPConfigs of `api`, each after `delay`.
    pub fn start(api: &FakeApi, delay: Duration) -> CloudController {
        let faults = Arc::new(Mutex::new(Faults {
            delay,
            ..Faults::default()
        }));
        let work = Arc::new(Mutex::new(Work::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let objects = api.objects_handle();
        let thread = {
            let (faults, work, stop) = (faults.clone(), work.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    step(&objects, &faults, &work);
                    std::thread::sleep(POLL);
                }
            })
        };
        CloudController {
            faults,
            work,
            stop,
            thread: Some(thread),
        }
    }

    /// The cloud refuses `ip` on `node` (`CloudResponseError`) from now on.
    pub fn refuse(&self, ip: IpAddr, node: &str) {
        let mut f = self.faults.lock().unwrap();
        f.refuse.insert((name_for_ip(ip), node.to_string()));
    }

    /// The cloud accepts `ip` on `node` again.
    pub fn accept(&self, ip: IpAddr, node: &str) {
        let mut f = self.faults.lock().unwrap();
        f.refuse.remove(&(name_for_ip(ip), node.to_string()));
    }

    /// Answers wait `delay` from now on (`Duration::MAX` holds them until changed).
    pub fn set_delay(&self, delay: Duration) {
        self.faults.lock().unwrap().delay = delay;
    }

    /// When `Assigned=True` was written for `ip` on `node`, if it was.
    pub fn attached_at(&self, ip: IpAddr, node: &str) -> Option<Instant> {
        let w = self.work.lock().unwrap();
        w.attached_at
            .get(&(name_for_ip(ip), node.to_string()))
            .copied()
    }
}

impl Drop for CloudController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn step(objects: &Objects, faults: &Mutex<Faults>, work: &Mutex<Work>) {
    let (delay, refuse) = {
        let f = faults.lock().unwrap();
        (f.delay, f.refuse.clone())
    };
    let mut w = work.lock().unwrap();
    let now = Instant::now();
    let present: BTreeSet<String> = objects
        .list("CloudPrivateIPConfig")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
        .collect();
    w.started.retain(|n, _| present.contains(n));
    w.answered.retain(|n, _| present.contains(n));
    w.releasing.retain(|n, _| present.contains(n));
    for obj in objects.list("CloudPrivateIPConfig") {
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if !obj["metadata"]["deletionTimestamp"].is_null() {
            // Deleted: release the IP, then drop the finalizer (the object goes).
            let since = *w.releasing.entry(name.clone()).or_insert(now);
            if now.duration_since(since) >= delay {
                objects.update("CloudPrivateIPConfig", &name, |obj| {
                    obj["metadata"]["finalizers"] = json!([]);
                    true
                });
            }
            continue;
        }
        let Some(node) = obj["spec"]["node"].as_str().map(String::from) else {
            continue;
        };
        let request = (node.clone(), uid.clone());
        if w.answered.get(&name) == Some(&request) {
            continue;
        }
        match w.started.get(&name) {
            Some((n, u, since)) if (n, u) == (&node, &uid) => {
                if now.duration_since(*since) < delay {
                    continue;
                }
                let refused = refuse.contains(&(name.clone(), node.clone()));
                let status = if refused {
                    status(
                        None,
                        "False",
                        "CloudResponseError",
                        &format!("injected: the cloud refuses {name} on {node}"),
                    )
                } else {
                    w.attached_at.insert((name.clone(), node.clone()), now);
                    status(Some(&node), "True", "CloudResponseSuccess", "")
                };
                write_status(objects, &name, &request, status);
                w.started.remove(&name);
                w.answered.insert(name, request);
            }
            _ => {
                // Release (status.node cleared), then attach after the delay.
                let pending = status(None, "False", "CloudResponsePending", "");
                write_status(objects, &name, &request, pending);
                w.started.insert(name, (node, uid, now));
            }
        }
    }
}

/// Writes `status` unless the request changed since it was read (the assigner moved it).
fn write_status(objects: &Objects, name: &str, request: &(String, String), status: Value) {
    objects.update("CloudPrivateIPConfig", name, |obj| {
        let now = (
            obj["spec"]["node"].as_str().unwrap_or(""),
            obj["metadata"]["uid"].as_str().unwrap_or(""),
        );
        if now != (request.0.as_str(), request.1.as_str()) {
            return false;
        }
        obj["metadata"]["finalizers"] = json!([FINALIZER]);
        obj["status"] = status;
        true
    });
}

fn status(node: Option<&str>, status: &str, reason: &str, message: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut s = json!({"conditions": [{"type": "Assigned", "status": status, "reason": reason,
        "message": message, "lastTransitionTime": now}]});
    if let Some(node) = node {
        s["node"] = json!(node);
    }
    s
}
