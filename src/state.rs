//! The last valid EgressFirewall and EgressQoS (per namespace) and EgressIP (per name), kept
//! on disk so that a restarted agent (or the next `--once`) still has them: when an object
//! turns invalid while the agent is down, the namespace keeps its last valid rules instead
//! of falling open.
//!
//! One file, `<state dir>/last-valid.json`:
//!
//! ```json
//! {"format": "nodeplane/last-valid/v1", "node": "worker-1", "agentVersion": "0.1.0",
//!  "egressFirewalls": [<EgressFirewall>...], "egressQoSes": [...], "egressIPs": [...]}
//! ```
//!
//! Each entry is the API object as the agent read it (JSON of the custom resource type).
//! The file is rewritten after a successful sync, and only when the objects in force changed
//! (a pointer or equality comparison per object, no serialisation otherwise). Writes are
//! atomic: a temporary file in the same directory, fsync, rename, fsync of the directory.
//!
//! Nothing read back is trusted blindly: a file that is not JSON, has another format string
//! or was written for another node is ignored as a whole, and each object is validated again
//! with the same code as objects from the API; one that does not validate is dropped. Every
//! such problem is a [`StateError`] that the caller logs; none of them stops the agent.

use crate::api::{
    EgressFirewall, EgressIP, EgressQoS, ValidatedEgressIp, ValidatedFirewall, ValidatedQos,
    ValidationError,
};
use crate::plan::Memory;
use crate::plan::in_force::{InForce, InForceMap, same_objects};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
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

/// The last valid objects, each validated again: what a fresh [`Memory`] is seeded with.
#[derive(Debug, Clone, Default)]
pub struct LastValid {
    /// Per namespace.
    pub firewalls: InForceMap<EgressFirewall, ValidatedFirewall>,
    /// Per namespace.
    pub qoses: InForceMap<EgressQoS, ValidatedQos>,
    /// Per EgressIP name.
    pub egress_ips: InForceMap<EgressIP, ValidatedEgressIp>,
}

impl LastValid {
    /// What `memory` holds in force (cheap: the maps hold `Arc`s).
    pub fn of(memory: &Memory) -> LastValid {
        LastValid {
            firewalls: memory.firewall.in_force.clone(),
            qoses: memory.qos.in_force.clone(),
            egress_ips: memory.egress_ip.clone(),
        }
    }

    /// A planner memory that plans an invalid object from these versions.
    pub fn into_memory(self) -> Memory {
        let mut memory = Memory::default();
        memory.firewall.in_force = self.firewalls;
        memory.qos.in_force = self.qoses;
        memory.egress_ip = self.egress_ips;
        memory
    }

    /// True when `memory` holds the same objects in force (O(objects) pointer comparisons
    /// when nothing changed).
    pub fn same_as(&self, memory: &Memory) -> bool {
        same_objects(&self.firewalls, &memory.firewall.in_force)
            && same_objects(&self.qoses, &memory.qos.in_force)
            && same_objects(&self.egress_ips, &memory.egress_ip)
    }

    /// The number of objects held.
    pub fn len(&self) -> usize {
        self.firewalls.len() + self.qoses.len() + self.egress_ips.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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

/// The state file of one node.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    node: String,
    /// What the file holds, as far as this agent knows; None when it must be (re)written at
    /// the next save (it was corrupt, foreign, partly invalid, or a write failed).
    saved: Option<LastValid>,
}

impl StateStore {
    pub fn new(dir: impl Into<PathBuf>, node: impl Into<String>) -> StateStore {
        StateStore {
            dir: dir.into(),
            node: node.into(),
            saved: Some(LastValid::default()),
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

    /// Writes the objects in force in `memory` unless the file already holds them.
    /// Ok(true) when it wrote. After a failed write the next call tries again.
    pub fn save(&mut self, memory: &Memory) -> Result<bool, StateError> {
        if self.saved.as_ref().is_some_and(|s| s.same_as(memory)) {
            return Ok(false);
        }
        let current = LastValid::of(memory);
        let bytes = encode(&current, &self.node);
        self.saved = None;
        write_atomic(&self.dir, &bytes).map_err(|e| StateError::Write {
            path: self.path(),
            reason: e.to_string(),
        })?;
        self.saved = Some(current);
        Ok(true)
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
        egress_firewalls: objects(&last_valid.firewalls),
        egress_qoses: objects(&last_valid.qoses),
        egress_ips: objects(&last_valid.egress_ips),
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

/// Parses the file's bytes: whole-file problems are the Err, per-object problems go to
/// `problems` and the object is left out.
fn decode(
    path: &Path,
    bytes: &[u8],
    node: &str,
    problems: &mut Vec<StateError>,
) -> Result<LastValid, StateError> {
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
    let mut reader = Reader { path, problems };
    Ok(LastValid {
        firewalls: reader.objects(FIREWALLS, firewalls, EgressFirewall::validate, |v| {
            v.namespace.clone()
        }),
        qoses: reader.objects(QOSES, qoses, EgressQoS::validate, |v| v.namespace.clone()),
        egress_ips: reader.objects(EGRESS_IPS, egress_ips, EgressIP::validate, |v| {
            v.name.clone()
        }),
    })
}

struct Reader<'a> {
    path: &'a Path,
    problems: &'a mut Vec<StateError>,
}

impl Reader<'_> {
    /// Decodes and validates each object of a list, keyed by `key`; the first object of a
    /// key wins (the agent never writes two).
    fn objects<T: DeserializeOwned, V>(
        &mut self,
        field: &str,
        items: Vec<serde_json::Value>,
        validate: impl Fn(&T) -> Result<V, ValidationError>,
        key: impl Fn(&V) -> String,
    ) -> InForceMap<T, V> {
        let mut map = InForceMap::new();
        for (i, item) in items.into_iter().enumerate() {
            let mut problem = |what: String, reason: String| {
                self.problems.push(StateError::Object {
                    path: self.path.to_path_buf(),
                    what,
                    reason,
                })
            };
            let object: T = match serde_json::from_value(item) {
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
#[path = "state_tests.rs"]
mod tests;
