//! What the features keep across restarts ([`crate::plan::Kept`]: the last valid
//! EgressFirewall and EgressQoS per namespace, EgressIP per name and NetworkPolicy per
//! namespace/name), kept on disk so that a restarted agent (or the next `--once`) still has
//! them: when an object turns invalid while the agent is down, the namespace keeps its last
//! valid rules instead of falling open.
//!
//! One file, `<state dir>/last-valid.json`:
//!
//! ```json
//! {"format": "nodeplane/last-valid/v1", "node": "worker-1", "agentVersion": "0.1.0",
//!  "egressFirewalls": [<EgressFirewall>...], "egressQoSes": [...], "egressIPs": [...],
//!  "networkPolicies": [...]}
//! ```
//!
//! This file writes and checks the header; the lists are the features' own fields, which
//! each writes and reads back itself (`crate::plan::kept`), so nothing here names a feature.
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

use crate::plan::Memory;
use crate::plan::kept::KeptFile;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
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

/// The file as written: the header, then each feature's fields ([`crate::plan::Keep`]), in
/// registry order; the objects of a list sorted by their key.
struct FileOut<'a> {
    node: &'a str,
    last_valid: &'a LastValid,
}

impl Serialize for FileOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut file = s.serialize_map(None)?;
        file.serialize_entry("format", FORMAT)?;
        file.serialize_entry("node", self.node)?;
        file.serialize_entry("agentVersion", env!("CARGO_PKG_VERSION"))?;
        self.last_valid.save(&mut file)?;
        file.end()
    }
}

/// The state file's bytes for `last_valid` on `node`.
pub fn encode(last_valid: &LastValid, node: &str) -> Vec<u8> {
    let out = FileOut { node, last_valid };
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

/// The file as this agent writes it, decoded in one pass (the fast path of [`decode`]): the
/// header, and each feature's fields decoded by that feature.
#[derive(Default)]
struct FileIn {
    format: Option<String>,
    node: Option<String>,
    last_valid: LastValid,
    /// Objects left out: which, and why.
    problems: Vec<(String, String)>,
}

impl<'de> Deserialize<'de> for FileIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FileInVisitor)
    }
}

struct FileInVisitor;

impl<'de> Visitor<'de> for FileInVisitor {
    type Value = FileIn;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a state file")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FileIn, A::Error> {
        let mut file = FileIn::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "format" => file.format = Some(map.next_value()?),
                "node" => file.node = Some(map.next_value()?),
                _ => {
                    let problems = &mut file.problems;
                    if !file.last_valid.decode_field(&key, &mut map, problems)? {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
        }
        Ok(file)
    }
}

/// Parses the file's bytes: whole-file problems are the Err, per-object problems go to
/// `problems` and the object is left out.
fn decode(
    path: &Path,
    bytes: &[u8],
    node: &str,
    problems: &mut Vec<StateError>,
) -> Result<LastValid, StateError> {
    let left_out = |found: Vec<(String, String)>| {
        found.into_iter().map(|(what, reason)| StateError::Object {
            path: path.to_path_buf(),
            what,
            reason,
        })
    };
    // Fast path: a file as this agent writes it, in one typed pass (half the time of the
    // path below). Anything else takes the path below, which looks at each part on
    // its own to say exactly what is wrong and keep what is right.
    if let Ok(file) = serde_json::from_slice::<FileIn>(bytes)
        && file.format.as_deref() == Some(FORMAT)
        && file.node.as_deref() == Some(node)
    {
        problems.extend(left_out(file.problems));
        return Ok(file.last_valid);
    }
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    // The top level in one pass that leaves each field's text as it is: each feature
    // decodes its own lists.
    let fields: BTreeMap<String, &RawValue> = match serde_json::from_slice(bytes) {
        Ok(fields) => fields,
        Err(_) => {
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    Ok(_) => corrupt("not a JSON object".into()),
                    Err(e) => corrupt(format!("not JSON: {e}")),
                },
            );
        }
    };
    let text = |field: &str| fields.get(field).map(|raw| raw.get());
    let string = |field: &str| text(field).and_then(|t| serde_json::from_str::<String>(t).ok());
    if string("format").as_deref() != Some(FORMAT) {
        // As JSON (a string in quotes), whatever it is.
        let found = text("format").map(|t| {
            serde_json::from_str::<serde_json::Value>(t).map_or(t.to_string(), |v| v.to_string())
        });
        return Err(StateError::UnknownFormat {
            path: path.to_path_buf(),
            found: found.unwrap_or_else(|| "(none)".into()),
        });
    }
    match string("node") {
        Some(n) if n == node => {}
        other => {
            return Err(StateError::ForeignNode {
                path: path.to_path_buf(),
                found: other.unwrap_or_else(|| "(none)".into()),
                node: node.to_string(),
            });
        }
    }
    let mut file = KeptFile::new(fields);
    let last_valid = LastValid::load(&mut file).map_err(corrupt)?;
    problems.extend(left_out(file.into_problems()));
    Ok(last_valid)
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
