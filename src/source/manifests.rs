//! Loads a directory of manifests into a [`Snapshot`](crate::snapshot::Snapshot): the entry
//! points. Files `*.yaml`, `*.yml` and `*.json` are read recursively in sorted path order;
//! [`super::parse`] parses one file (multi-document YAML, `kind: List`, one problem per bad
//! document), [`super::loader`] keeps the per-file cache and merges the files.

use std::path::Path;

use super::limits::Limits;
use super::loader::{self, ManifestLoader};
use super::parse::load_file;
pub use super::parse::{LoadError, LoadProblem, LoadReport};

/// Loads every manifest under `path` (a directory, searched recursively, or a single file).
///
/// Entries whose name starts with `.` are skipped: a ConfigMap volume keeps its real files in
/// `..data`-style hidden directories and exposes them through symlinks, which are followed.
/// Problems are returned in the report for the caller to log (at `warn`) or print. Only an
/// unreadable `path` itself is an error, so that a reconcile loop can keep its previous snapshot.
pub fn load_dir(path: &Path) -> Result<LoadReport, LoadError> {
    load_dir_with(path, &Limits::default())
}

/// [`load_dir`] with the given resource limits: a file larger than `limits.max_bytes` is not
/// read, a YAML document nested too deep or expanding too much through aliases is not parsed;
/// each is reported like a malformed document (see [`crate::source::limits`]).
pub fn load_dir_with(path: &Path, limits: &Limits) -> Result<LoadReport, LoadError> {
    ManifestLoader::new(*limits).load(path)
}

/// Parses one manifest text as if read from `file` (the extension picks JSON or YAML).
pub fn load_str(file: &Path, text: &str) -> LoadReport {
    loader::merge(&[(
        file.to_path_buf(),
        load_file(file, text, &Limits::default()),
    )])
}
