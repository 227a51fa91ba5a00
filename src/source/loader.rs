//! Loading a manifests directory again and again: a per-file cache, the previous version of a
//! file that a new version exceeding a resource limit replaced, and (in run mode) a thread of
//! its own that publishes finished snapshots, so that parsing never runs on the control loop.
//!
//! *Cache.* Each file is remembered with the size, modification and change times, inode and
//! device it had when parsed; a reload stats every file and parses only those whose metadata
//! changed (a ConfigMap volume swap changes the inode behind the path, a rewrite the change
//! time). An unchanged file gives back the same objects, `Arc` for `Arc`, so the planners skip
//! them too.
//!
//! *Rejected files.* A file larger than `--manifest-max-bytes`, or with a YAML document beyond
//! `--manifest-max-depth` or `--manifest-max-alias-expansion`, is rejected. If a previous
//! version of it was accepted during this run, that version stays in force (a namespace's
//! EgressFirewall must not vanish because its file was replaced by a bomb); otherwise its
//! documents within the limits are loaded as usual, the others skipped. Either way
//! [`ManifestHealth`] makes `/readyz` report the file until it is fixed or removed. Deleting a
//! file removes its objects.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use super::limits::{Breach, Limits};
use super::parse::{
    FileLoad, LoadError, LoadProblem, LoadReport, collect_files, load_file, rejected_file,
};
use crate::snapshot::{Kind, ObjectKey, Snapshot, SnapshotBuilder};

/// How often the loader thread looks at the files without a change notification (a lost
/// event, an unreadable directory that became readable). Only changed files are parsed.
pub const RESCAN: Duration = Duration::from_secs(60);

/// What identifies a version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl Fingerprint {
    fn of(m: &fs::Metadata) -> Fingerprint {
        Fingerprint {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
        }
    }
}

struct Entry {
    /// None if the file could not be stat'ed (parsed again next time).
    fingerprint: Option<Fingerprint>,
    load: Arc<FileLoad>,
    /// The last accepted version, while the current one is rejected.
    kept: Option<Arc<FileLoad>>,
}

impl Entry {
    /// The version whose objects are in force.
    fn accepted(&self) -> Option<&Arc<FileLoad>> {
        if self.load.breaches.is_empty() {
            Some(&self.load)
        } else {
            self.kept.as_ref()
        }
    }
}

/// Loads a manifests directory (or single file), parsing only what changed since the last
/// [`load`](ManifestLoader::load).
pub struct ManifestLoader {
    limits: Limits,
    files: BTreeMap<PathBuf, Entry>,
}

impl ManifestLoader {
    pub fn new(limits: Limits) -> ManifestLoader {
        ManifestLoader {
            limits,
            files: BTreeMap::new(),
        }
    }

    /// See [`super::manifests::load_dir`]; only an unreadable `path` itself is an error.
    pub fn load(&mut self, path: &Path) -> Result<LoadReport, LoadError> {
        let io_err = |source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = fs::metadata(path).map_err(io_err)?;
        let mut problems = Vec::new();
        let mut paths = Vec::new();
        if meta.is_dir() {
            let mut visited = Default::default();
            collect_files(path, &mut paths, &mut visited, &mut problems).map_err(io_err)?;
        } else {
            paths.push(path.to_path_buf());
        }
        let mut previous = std::mem::take(&mut self.files);
        for file in &paths {
            let old = previous.remove(file);
            let entry = self.read(file, old);
            self.files.insert(file.clone(), entry);
        }
        // `paths` is in load order; the map is keyed by path, which sorts the same way only
        // within one directory, so merge in `paths` order.
        let loads: Vec<(PathBuf, FileVersion<'_>)> = paths
            .iter()
            .map(|p| {
                let e = &self.files[p];
                (p.clone(), FileVersion::of(e))
            })
            .collect();
        let mut report = merge_versions(&loads);
        problems.append(&mut report.problems);
        report.problems = problems;
        Ok(report)
    }

    fn read(&self, file: &Path, old: Option<Entry>) -> Entry {
        let meta = fs::metadata(file);
        let fingerprint = meta.as_ref().ok().map(Fingerprint::of);
        if let Some(old) = old {
            if fingerprint.is_some() && old.fingerprint == fingerprint {
                return old;
            }
            let load = Arc::new(self.parse(file, meta));
            let kept = if load.breaches.is_empty() {
                None
            } else {
                old.accepted().cloned()
            };
            return Entry {
                fingerprint,
                load,
                kept,
            };
        }
        Entry {
            fingerprint,
            load: Arc::new(self.parse(file, meta)),
            kept: None,
        }
    }

    fn parse(&self, file: &Path, meta: std::io::Result<fs::Metadata>) -> FileLoad {
        let max = self.limits.max_bytes;
        let too_big = |size| rejected_file(file, &Breach::Bytes { size, max });
        let cannot_read = |e: std::io::Error| FileLoad {
            problems: vec![file_problem(file, format!("cannot read: {e}"))],
            ..FileLoad::default()
        };
        match meta {
            Err(e) => return cannot_read(e),
            Ok(m) if m.len() > max => return too_big(m.len()),
            Ok(_) => {}
        }
        // The file may grow between stat and read: never read more than the limit.
        let mut bytes = Vec::new();
        let read = fs::File::open(file)
            .and_then(|f| f.take(max.saturating_add(1)).read_to_end(&mut bytes));
        if let Err(e) = read {
            return cannot_read(e);
        }
        if bytes.len() as u64 > max {
            return too_big(bytes.len() as u64);
        }
        match String::from_utf8(bytes) {
            Err(_) => FileLoad {
                problems: vec![file_problem(file, "not valid UTF-8".into())],
                ..FileLoad::default()
            },
            Ok(text) => load_file(file, &text, &self.limits),
        }
    }
}

fn file_problem(file: &Path, message: String) -> LoadProblem {
    LoadProblem {
        file: file.to_path_buf(),
        line: None,
        document: None,
        item: None,
        message,
    }
}

/// A file's current version and, if that one is rejected, the version kept in force.
struct FileVersion<'a> {
    current: &'a FileLoad,
    kept: Option<&'a FileLoad>,
}

impl FileVersion<'_> {
    fn of(e: &Entry) -> FileVersion<'_> {
        FileVersion {
            current: &e.load,
            kept: e.kept.as_deref(),
        }
    }
}

/// Builds the report of files loaded without history (`load_str`).
pub(super) fn merge(files: &[(PathBuf, FileLoad)]) -> LoadReport {
    let versions: Vec<(PathBuf, FileVersion<'_>)> = files
        .iter()
        .map(|(p, l)| {
            let v = FileVersion {
                current: l,
                kept: None,
            };
            (p.clone(), v)
        })
        .collect();
    merge_versions(&versions)
}

/// One snapshot from the files in load order: later definitions win, and a definition
/// repeated across or within files is reported with both places.
fn merge_versions(files: &[(PathBuf, FileVersion<'_>)]) -> LoadReport {
    let mut builder = SnapshotBuilder::new();
    let mut origins: BTreeMap<(Kind, ObjectKey), &str> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut rejected = Vec::new();
    let mut ignored = 0;
    for (_, v) in files {
        let current = v.current;
        problems.extend(current.problems.iter().cloned());
        problems.extend(current.breaches.iter().cloned());
        if let Some(first) = current.breaches.first() {
            let outcome = if v.kept.is_some() {
                "its previous version stays in force"
            } else {
                "its documents within the limits are loaded"
            };
            rejected.push(LoadProblem {
                message: format!("{}; {outcome}", first.message),
                ..first.clone()
            });
        }
        let in_force = v.kept.unwrap_or(current);
        ignored += in_force.ignored;
        for d in &in_force.objects {
            let kind = d.object.kind();
            let key = d.object.key();
            if let Some(first) = origins.insert((kind, key.clone()), &d.here) {
                problems.push(LoadProblem {
                    message: format!(
                        "{kind} {key} is defined again (first at {first}); the later definition wins"
                    ),
                    ..d.at.clone()
                });
            }
            builder.insert(d.object.clone());
        }
    }
    LoadReport {
        snapshot: builder.build(),
        problems,
        files: files.len(),
        ignored,
        rejected,
    }
}

/// Whether the manifests are loaded as they are on disk, for `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct ManifestHealth(Arc<Mutex<Option<String>>>);

impl ManifestHealth {
    /// Ok, or which files are rejected or why the directory cannot be read.
    pub fn check(&self) -> Result<(), String> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = problem;
    }
}

/// Starts the loader thread of run mode: it loads `dir` at once and again after every
/// `changes` notification (and every [`RESCAN`]), and publishes each snapshot that differs
/// from the last on the returned channel (None until the first load succeeds). It stops when
/// `changes` is disconnected or every receiver is gone.
pub fn spawn(
    dir: PathBuf,
    limits: Limits,
    changes: std_mpsc::Receiver<()>,
    health: ManifestHealth,
) -> std::io::Result<watch::Receiver<Option<Snapshot>>> {
    let (tx, rx) = watch::channel(None);
    thread::Builder::new()
        .name("manifest-load".into())
        .spawn(move || {
            let mut loader = ManifestLoader::new(limits);
            let mut logged: Vec<LoadProblem> = Vec::new();
            loop {
                match loader.load(&dir) {
                    Ok(report) => {
                        // Logged when they change, not on every rescan.
                        if report.problems != logged {
                            for p in &report.problems {
                                warn!("skipped: {p}");
                            }
                            logged = report.problems.clone();
                        }
                        let rejected: Vec<String> =
                            report.rejected.iter().map(ToString::to_string).collect();
                        health.set(
                            (!rejected.is_empty())
                                .then(|| format!("manifest rejected: {}", rejected.join("; "))),
                        );
                        let changed = tx.borrow().as_ref() != Some(&report.snapshot);
                        if changed {
                            info!(
                                files = report.files,
                                objects = report.snapshot.len(),
                                "manifests loaded"
                            );
                            tx.send_replace(Some(report.snapshot));
                        }
                    }
                    Err(e) => {
                        warn!("{e}; keeping the objects last loaded");
                        health.set(Some(e.to_string()));
                    }
                }
                if tx.is_closed() {
                    return;
                }
                match changes.recv_timeout(RESCAN) {
                    // One load covers every notification queued meanwhile.
                    Ok(()) => while changes.try_recv().is_ok() {},
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
    Ok(rx)
}
