//! The last valid EgressFirewall and EgressQoS (per namespace), EgressIP (per name) and
//! NetworkPolicy (per namespace/name), kept on disk so that a restarted agent (or the next
//! `--once`) still has them: when an object turns invalid while the agent is down, the
//! namespace keeps its last valid rules instead of falling open.
//!
//! One file, `<state dir>/last-valid.json`:
//!
//! ```json
//! {"format": "nodeplane/last-valid/v1", "node": "worker-1", "agentVersion": "0.1.0",
//!  "egressFirewalls": [<EgressFirewall>...], "egressQoSes": [...], "egressIPs": [...],
//!  "networkPolicies": [...]}
//! ```
//!
//! Each entry is the API object as the agent read it (JSON of the custom resource type).
//! The file is rewritten after a successful sync, and only when the objects in force changed
//! (a pointer or equality comparison per object, no serialisation otherwise), by a thread of
//! its own so that the reconcile loop never waits for the disk. Writes are atomic: a
//! temporary file in the same directory, fsync, rename, fsync of the directory.
//!
//! Nothing read back is trusted blindly: a file that is not JSON, has another format string
//! or was written for another node is ignored as a whole, and each object is validated again
//! with the same code as objects from the API; one that does not validate is dropped. Every
//! such problem is a [`StateError`] that the caller logs; none of them stops the agent.

use crate::api::network_policy;
use crate::api::{EgressFirewall, EgressIP, EgressQoS, NetworkPolicy, ValidationError};
use crate::plan::Memory;
use crate::plan::in_force::{InForce, InForceMap};
use serde::{Deserialize, Serialize};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tracing::{info, warn};

/// The state file's name inside the state directory.
pub const FILE_NAME: &str = "last-valid.json";
/// The format string this agent writes and reads; any other is ignored.
pub const FORMAT: &str = "nodeplane/last-valid/v1";
/// The temporary file a write goes through before the rename.
const TMP_NAME: &str = ".last-valid.json.tmp";

const FIREWALLS: &str = "egressFirewalls";
const QOSES: &str = "egressQoSes";
const EGRESS_IPS: &str = "egressIPs";
const NETWORK_POLICIES: &str = "networkPolicies";

/// Why (part of) the state file was not used, or could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}: cannot read: {reason}; ignored", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{}: corrupt ({reason}); ignored", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{}: unknown format {found} (this agent reads {FORMAT:?}); ignored", path.display())]
    UnknownFormat { path: PathBuf, found: String },
    #[error(
        "{}: written for node {found:?}, this agent serves node {node:?}; ignored",
        path.display()
    )]
    ForeignNode {
        path: PathBuf,
        found: String,
        node: String,
    },
    #[error("{}: {what}: {reason}; ignored", path.display())]
    Object {
        path: PathBuf,
        what: String,
        reason: String,
    },
    #[error("{}: cannot write: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
}

/// The last valid objects, each validated again: what a fresh [`crate::plan::Memory`] is
/// seeded with. Each feature says what of its memory it keeps ([`crate::plan::Remember`]);
/// this file reads and writes the lists.
pub type LastValid = crate::plan::Kept;

/// What reading the state file gave: the objects that can be trusted, and what was ignored.
#[derive(Debug, Default)]
pub struct Loaded {
    pub last_valid: LastValid,
    /// Every ignored file or object, with the reason (the caller logs them).
    pub problems: Vec<StateError>,
    /// False when there was no state file.
    pub found: bool,
}

impl Loaded {
    /// Logs what was read from `path` (info) and every problem (warn).
    pub fn log(&self, path: &Path) {
        for p in &self.problems {
            warn!("last valid objects: {p}");
        }
        if self.found {
            let n = self.last_valid.len();
            info!("{}: last valid objects read: {n}", path.display());
        }
    }
}

/// The state file of one node. Writes happen on a thread of their own, so that the reconcile
/// loop never waits for the disk (serialising 1000 namespaces x 100 rules takes ~40 ms, and a
/// busy disk can hold an fsync far longer): [`StateStore::save`] only compares and queues,
/// the newest queued version wins, and dropping the store waits for the queued write.
pub struct StateStore {
    dir: PathBuf,
    node: String,
    /// What the file holds once the queued writes are done; None when it must be (re)written
    /// at the next save (it was corrupt, foreign or partly invalid).
    saved: Option<LastValid>,
    /// Started at the first write.
    writer: Option<Writer>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("path", &self.path())
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl StateStore {
    pub fn new(dir: impl Into<PathBuf>, node: impl Into<String>) -> StateStore {
        StateStore {
            dir: dir.into(),
            node: node.into(),
            saved: Some(LastValid::default()),
            writer: None,
        }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Reads the state file (see [`read`]) and remembers what it holds, so that the next
    /// [`StateStore::save`] writes only if something changed. A file with any problem is
    /// rewritten at the next save.
    pub fn load(&mut self) -> Loaded {
        let loaded = read(&self.path(), &self.node);
        self.saved = loaded
            .problems
            .is_empty()
            .then(|| loaded.last_valid.clone());
        loaded
    }

    /// Queues a write of the objects in force in `memory` unless the file holds them (or
    /// will once the queued write is done); true when it queued one. The write itself logs
    /// its outcome; after a failed write the next call queues the objects again.
    pub fn save(&mut self, memory: &Memory) -> bool {
        let failed = self.writer.as_ref().is_some_and(Writer::take_failed);
        if !failed && self.saved.as_ref().is_some_and(|s| s.same_as(memory)) {
            return false;
        }
        let current = LastValid::of(memory);
        let (dir, node) = (&self.dir, &self.node);
        self.writer
            .get_or_insert_with(|| Writer::start(dir.clone(), node.clone()))
            .queue(current.clone());
        self.saved = Some(current);
        true
    }

    /// Waits until the queued writes are done; the error of a write that failed since the
    /// last call, if any.
    pub fn flush(&self) -> Result<(), StateError> {
        match &self.writer {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for StateStore {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            w.stop();
        }
    }
}

/// The writer thread and the one slot it takes its work from.
struct Writer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    changed: Condvar,
}

#[derive(Default)]
struct Slot {
    /// The newest version to write (an older one not yet taken is replaced).
    pending: Option<LastValid>,
    /// A write is under way.
    busy: bool,
    stop: bool,
    /// A write failed since `save` last looked.
    failed: bool,
    /// The last failed write's error, until `flush` reports it.
    error: Option<StateError>,
}

impl Writer {
    fn start(dir: PathBuf, node: String) -> Writer {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || write_loop(&s, &dir, &node))
            .expect("spawn the state writer thread");
        Writer {
            shared,
            thread: Some(thread),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.shared.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn queue(&self, last_valid: LastValid) {
        self.lock().pending = Some(last_valid);
        self.shared.changed.notify_all();
    }

    fn take_failed(&self) -> bool {
        std::mem::take(&mut self.lock().failed)
    }

    fn flush(&self) -> Result<(), StateError> {
        let mut slot = self.lock();
        while slot.pending.is_some() || slot.busy {
            slot = self
                .shared
                .changed
                .wait(slot)
                .unwrap_or_else(|p| p.into_inner());
        }
        slot.error.take().map_or(Ok(()), Err)
    }

    /// Writes what is queued, then ends the thread.
    fn stop(mut self) {
        self.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(shared: &Shared, dir: &Path, node: &str) {
    let path = dir.join(FILE_NAME);
    let lock = || shared.slot.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let mut slot = lock();
        let job = loop {
            if let Some(job) = slot.pending.take() {
                break job;
            }
            if slot.stop {
                return;
            }
            slot = shared.changed.wait(slot).unwrap_or_else(|p| p.into_inner());
        };
        slot.busy = true;
        drop(slot);
        let written = write_atomic(dir, &encode(&job, node));
        let mut slot = lock();
        slot.busy = false;
        match written {
            Ok(()) => info!("{}: last valid objects saved", path.display()),
            Err(e) => {
                let e = StateError::Write {
                    path: path.clone(),
                    reason: e.to_string(),
                };
                warn!("last valid objects not saved: {e}");
                slot.failed = true;
                slot.error = Some(e);
            }
        }
        drop(slot);
        shared.changed.notify_all();
    }
}

/// The file as written. Objects are sorted by their key (namespace or name).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileOut<'a> {
    format: &'static str,
    node: &'a str,
    agent_version: &'static str,
    #[serde(rename = "egressFirewalls")]
    egress_firewalls: Vec<&'a EgressFirewall>,
    #[serde(rename = "egressQoSes")]
    egress_qoses: Vec<&'a EgressQoS>,
    #[serde(rename = "egressIPs")]
    egress_ips: Vec<&'a EgressIP>,
    /// Left out when empty: files without policies stay as older agents wrote them.
    #[serde(rename = "networkPolicies", skip_serializing_if = "Vec::is_empty")]
    network_policies: Vec<&'a NetworkPolicy>,
}

/// The state file's bytes for `last_valid` on `node`.
pub fn encode(last_valid: &LastValid, node: &str) -> Vec<u8> {
    fn objects<T, V>(map: &InForceMap<T, V>) -> Vec<&T> {
        map.values().map(|e| &*e.object).collect()
    }
    let out = FileOut {
        format: FORMAT,
        node,
        agent_version: env!("CARGO_PKG_VERSION"),
        egress_firewalls: objects(&last_valid.firewall),
        egress_qoses: objects(&last_valid.qos),
        egress_ips: objects(&last_valid.egress_ip),
        network_policies: objects(&last_valid.netpol),
    };
    serde_json::to_vec(&out).expect("API objects serialise to JSON")
}

/// Reads and checks the state file at `path` for `node`. A missing file is no problem
/// (nothing remembered yet); anything else that cannot be trusted is reported in
/// [`Loaded::problems`] and left out.
pub fn read(path: &Path, node: &str) -> Loaded {
    let mut loaded = Loaded::default();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return loaded,
        Err(e) => {
            loaded.problems.push(StateError::Read {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
            return loaded;
        }
    };
    loaded.found = true;
    match decode(path, &bytes, node, &mut loaded.problems) {
        Ok(last_valid) => loaded.last_valid = last_valid,
        Err(e) => loaded.problems.push(e),
    }
    loaded
}

/// The file as this agent writes it (the fast path of [`decode`]).
#[derive(Deserialize)]
struct FileIn {
    format: String,
    node: String,
    #[serde(rename = "egressFirewalls")]
    egress_firewalls: Vec<EgressFirewall>,
    #[serde(rename = "egressQoSes")]
    egress_qoses: Vec<EgressQoS>,
    #[serde(rename = "egressIPs")]
    egress_ips: Vec<EgressIP>,
    #[serde(rename = "networkPolicies", default)]
    network_policies: Vec<NetworkPolicy>,
}

/// Parses the file's bytes: whole-file problems are the Err, per-object problems go to
/// `problems` and the object is left out.
fn decode(
    path: &Path,
    bytes: &[u8],
    node: &str,
    problems: &mut Vec<StateError>,
) -> Result<LastValid, StateError> {
    // Fast path: a file as this agent writes it, decoded in one pass (a third of the time of
    // going through `serde_json::Value`). Anything else takes the path below, which looks
    // at each part on its own to say exactly what is wrong and keep what is right.
    if let Ok(file) = serde_json::from_slice::<FileIn>(bytes)
        && file.format == FORMAT
        && file.node == node
    {
        return Ok(Reader { path, problems }.last_valid(
            file.egress_firewalls.into_iter().map(Ok),
            file.egress_qoses.into_iter().map(Ok),
            file.egress_ips.into_iter().map(Ok),
            file.network_policies.into_iter().map(Ok),
        ));
    }
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let serde_json::Value::Object(mut file) = value else {
        return Err(corrupt("not a JSON object".into()));
    };
    match file.get("format") {
        Some(serde_json::Value::String(f)) if f == FORMAT => {}
        other => {
            return Err(StateError::UnknownFormat {
                path: path.to_path_buf(),
                found: other.map_or("(none)".into(), |f| f.to_string()),
            });
        }
    }
    match file.get("node").and_then(|n| n.as_str()) {
        Some(n) if n == node => {}
        other => {
            return Err(StateError::ForeignNode {
                path: path.to_path_buf(),
                found: other.unwrap_or("(none)").to_string(),
                node: node.to_string(),
            });
        }
    }
    let mut list = |field: &str| match file.remove(field) {
        None => Ok(Vec::new()),
        Some(serde_json::Value::Array(items)) => Ok(items),
        Some(_) => Err(corrupt(format!("{field} is not a list"))),
    };
    let (firewalls, qoses, egress_ips) = (list(FIREWALLS)?, list(QOSES)?, list(EGRESS_IPS)?);
    let network_policies = list(NETWORK_POLICIES)?;
    Ok(Reader { path, problems }.last_valid(
        firewalls.into_iter().map(serde_json::from_value),
        qoses.into_iter().map(serde_json::from_value),
        egress_ips.into_iter().map(serde_json::from_value),
        network_policies.into_iter().map(serde_json::from_value),
    ))
}

struct Reader<'a> {
    path: &'a Path,
    problems: &'a mut Vec<StateError>,
}

type Decoded<T> = Result<T, serde_json::Error>;

impl Reader<'_> {
    fn last_valid(
        mut self,
        firewalls: impl Iterator<Item = Decoded<EgressFirewall>>,
        qoses: impl Iterator<Item = Decoded<EgressQoS>>,
        egress_ips: impl Iterator<Item = Decoded<EgressIP>>,
        network_policies: impl Iterator<Item = Decoded<NetworkPolicy>>,
    ) -> LastValid {
        LastValid {
            firewall: self.objects(FIREWALLS, firewalls, EgressFirewall::validate, |v| {
                v.namespace.clone()
            }),
            qos: self.objects(QOSES, qoses, EgressQoS::validate, |v| v.namespace.clone()),
            egress_ip: self.objects(EGRESS_IPS, egress_ips, EgressIP::validate, |v| {
                v.name.clone()
            }),
            netpol: self.objects(
                NETWORK_POLICIES,
                network_policies,
                network_policy::validate,
                |v| format!("{}/{}", v.namespace, v.name),
            ),
            ..LastValid::default()
        }
    }

    /// Validates each decoded object of a list, keyed by `key`; the first object of a key
    /// wins (the agent never writes two).
    fn objects<T, V>(
        &mut self,
        field: &str,
        items: impl Iterator<Item = Decoded<T>>,
        validate: impl Fn(&T) -> Result<V, ValidationError>,
        key: impl Fn(&V) -> String,
    ) -> InForceMap<T, V> {
        let mut map = InForceMap::new();
        for (i, item) in items.enumerate() {
            let mut problem = |what: String, reason: String| {
                self.problems.push(StateError::Object {
                    path: self.path.to_path_buf(),
                    what,
                    reason,
                })
            };
            let object: T = match item {
                Ok(o) => o,
                Err(e) => {
                    problem(format!("{field}[{i}]"), format!("cannot decode: {e}"));
                    continue;
                }
            };
            let valid = match validate(&object) {
                Ok(v) => v,
                // The error names the object (kind and key), the field and the problem.
                Err(e) => {
                    problem(format!("{field}[{i}]"), format!("no longer valid: {e}"));
                    continue;
                }
            };
            let k = key(&valid);
            if map.contains_key(&k) {
                problem(format!("{field}[{i}]"), format!("a second object for {k}"));
                continue;
            }
            let entry = InForce {
                object: Arc::new(object),
                valid: Arc::new(valid),
            };
            map.insert(k, entry);
        }
        map
    }
}

/// Replaces `<dir>/last-valid.json` with `bytes` so that a reader (or a crash at any point)
/// sees either the old or the new file: write a temporary file in the same directory,
/// fsync it, rename it over the file, fsync the directory. Creates a missing directory
/// (mode 0700).
fn write_atomic(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = dir.join(TMP_NAME);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(FILE_NAME))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
