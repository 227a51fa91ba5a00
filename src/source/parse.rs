//! One manifest file's text -> its objects and problems (the parsing [`super::manifests`]
//! and [`super::loader`] share), and the report types of a load.
//!
//! A YAML file may hold several documents, and a document may be a `kind: List` or a typed
//! list such as `PodList`. One bad document never blocks the others: it becomes a
//! [`LoadProblem`] naming the file, the line where the document starts, the document index
//! and, inside a list, the item index. A document with a duplicate mapping key at any depth is
//! such a problem (naming the key and its path), not "the later key wins". Kinds the agent
//! does not use are skipped.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;
use thiserror::Error;
use tracing::debug;

use super::limits::{Breach, Limits};
use crate::snapshot::{AnyObject, Kind, Snapshot};

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read manifests at {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Something in one file that could not be loaded; everything else still was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadProblem {
    pub file: PathBuf,
    /// 1-based line where the document (or JSON value) starts; `None` for file-level problems.
    pub line: Option<usize>,
    /// 0-based index among the file's non-empty documents.
    pub document: Option<usize>,
    /// 0-based index in the document's `items` when the document is a list.
    pub item: Option<usize>,
    pub message: String,
}

impl fmt::Display for LoadProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(document) = self.document {
            write!(f, ": document {document}")?;
        }
        if let Some(item) = self.item {
            write!(f, " items[{item}]")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Debug, Clone)]
pub struct LoadReport {
    pub snapshot: Snapshot,
    pub problems: Vec<LoadProblem>,
    /// Manifest files read.
    pub files: usize,
    /// Well-formed objects of kinds the agent does not use.
    pub ignored: usize,
    /// Files that exceeded a resource limit ([`Limits`]), one problem each (also among
    /// `problems`), saying whether their previous version stayed in force.
    pub rejected: Vec<LoadProblem>,
}

/// the limits it exceeded.
#[derive(Debug, Default)]
pub(super) struct FileLoad {
    pub objects: Vec<Defined>,
    pub problems: Vec<LoadProblem>,
    /// Problems that are resource-limit breaches (not among `problems`).
    pub breaches: Vec<LoadProblem>,
    pub ignored: usize,
}

/// An object and where it was defined (a problem without message, and as text).
#[derive(Debug)]
pub(super) struct Defined {
    pub object: AnyObject,
    pub at: LoadProblem,
    pub here: String,
}

/// Parses one file's text within `limits` (its size already checked).
pub(super) fn load_file(file: &Path, text: &str, limits: &Limits) -> FileLoad {
    let mut loader = Loader {
        limits: *limits,
        file: FileLoad::default(),
    };
    loader.load_text(file, text);
    loader.file
}

/// A file rejected whole, e.g. for its size.
pub(super) fn rejected_file(file: &Path, breach: &Breach) -> FileLoad {
    FileLoad {
        breaches: vec![LoadProblem {
            file: file.to_path_buf(),
            line: None,
            document: None,
            item: None,
            message: breach.to_string(),
        }],
        ..FileLoad::default()
    }
}

pub(super) fn is_manifest(path: &Path) -> bool {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    matches!(ext.as_deref(), Some("yaml" | "yml" | "json"))
}

fn is_json(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Depth-first, entries sorted by name, so the load order (and which duplicate wins) is stable.
pub(super) fn collect_files(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    visited: &mut BTreeSet<PathBuf>,
    problems: &mut Vec<LoadProblem>,
) -> io::Result<()> {
    // Symlinks are followed, so guard against loops by canonical path.
    if !visited.insert(fs::canonicalize(dir)?) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    entries.sort();
    for path in entries {
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        let file_problem = |e: io::Error| LoadProblem {
            file: path.clone(),
            line: None,
            document: None,
            item: None,
            message: format!("cannot read: {e}"),
        };
        match fs::metadata(&path) {
            Err(e) => problems.push(file_problem(e)),
            Ok(m) if m.is_dir() => {
                if let Err(e) = collect_files(&path, out, visited, problems) {
                    problems.push(file_problem(e));
                }
            }
            Ok(m) if m.is_file() && is_manifest(&path) => out.push(path),
            Ok(_) => debug!(path = %path.display(), "not a manifest file, skipped"),
        }
    }
    Ok(())
}

/// One YAML document of a file.
#[derive(Debug, PartialEq, Eq)]
struct YamlDoc<'a> {
    /// 0-based line of the document's first line in the file.
    first_line: usize,
    text: &'a str,
}

/// Splits a YAML stream into documents on `---` and `...` marker lines. YAML forbids these
/// markers at column 0 inside a document's content, so a line-based split is exact, and it
/// lets a syntax error in one document leave the others loadable. Documents holding nothing
/// but blanks and comments are dropped.
fn split_yaml(text: &str) -> Vec<YamlDoc<'_>> {
    let is_marker = |line: &str, marker: &str| {
        line.strip_prefix(marker)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
    };
    let mut docs = Vec::new();
    let mut start = 0; // byte offset of the current document
    let mut start_line = 0;
    let mut offset = 0;
    fn push<'a>(docs: &mut Vec<YamlDoc<'a>>, doc: &'a str, first_line: usize) {
        if !is_blank_yaml(doc) {
            docs.push(YamlDoc {
                first_line,
                text: doc,
            });
        }
    }
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            // The `---` line opens the next document (it may carry content: `--- {a: 1}`).
            push(&mut docs, &text[start..offset], start_line);
            start = offset;
            start_line = n;
        } else if is_marker(bare, "...") {
            push(&mut docs, &text[start..offset], start_line);
            start = offset + line.len();
            start_line = n + 1;
        }
        offset += line.len();
    }
    push(&mut docs, &text[start..], start_line);
    docs
}

fn is_blank_yaml(doc: &str) -> bool {
    doc.lines().all(|line| {
        let line = line.strip_prefix("---").unwrap_or(line).trim();
        line.is_empty() || line.starts_with('#')
    })
}

/// Where a value came from, for problems and duplicate reports.
#[derive(Debug, Clone)]
struct Loc<'a> {
    file: &'a Path,
    line: usize,
    document: usize,
    item: Option<usize>,
}

impl Loc<'_> {
    fn problem(&self, message: String) -> LoadProblem {
        LoadProblem {
            file: self.file.to_path_buf(),
            line: Some(self.line),
            document: Some(self.document),
            item: self.item,
            message,
        }
    }
}

impl fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} document {}",
            self.file.display(),
            self.line,
            self.document
        )?;
        if let Some(item) = self.item {
            write!(f, " items[{item}]")?;
        }
        Ok(())
    }
}

struct Loader {
    limits: Limits,
    file: FileLoad,
}

impl Loader {
    fn problem_at(&mut self, loc: &Loc<'_>, message: String) {
        self.file.problems.push(loc.problem(message));
    }

    fn load_text(&mut self, file: &Path, text: &str) {
        if is_json(file) {
            self.load_json(file, text);
        } else {
            self.load_yaml(file, text);
        }
    }

    fn load_yaml(&mut self, file: &Path, text: &str) {
        for (document, doc) in split_yaml(text).into_iter().enumerate() {
            let loc = Loc {
                file,
                line: doc.first_line + 1,
                document,
                item: None,
            };
            if let Err(breach) = self.limits.check_yaml(doc.text, doc.first_line) {
                self.file.breaches.push(loc.problem(breach.to_string()));
                continue;
            }
            match serde_norway::from_str::<Checked>(doc.text) {
                Ok(Checked {
                    duplicate: Some(d), ..
                }) => self.problem_at(&loc, d),
                Ok(Checked {
                    value: Value::Null, ..
                }) => {}
                Ok(Checked { value, .. }) => self.load_value(&loc, value, Some(&doc)),
                Err(_) => {
                    let message =
                        yaml_error_in_file(&doc, |d| serde_norway::from_str::<Value>(d).map(drop));
                    self.problem_at(&loc, format!("invalid YAML: {message}"));
                }
            }
        }
    }

    /// A JSON file holds one value or several concatenated values.
    fn load_json(&mut self, file: &Path, text: &str) {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Checked>();
        let mut document = 0;
        // Lines are counted incrementally: a stream may hold many values.
        let (mut counted_to, mut line) = (0, 1);
        loop {
            let before = stream.byte_offset();
            let start = before + (text[before..].len() - text[before..].trim_start().len());
            line += text[counted_to..start].matches('\n').count();
            counted_to = start;
            let loc = Loc {
                file,
                line,
                document,
                item: None,
            };
            match stream.next() {
                None => break,
                Some(Ok(Checked {
                    duplicate: Some(d), ..
                })) => self.problem_at(&loc, d),
                Some(Ok(Checked { value, .. })) => self.load_value(&loc, value, None),
                Some(Err(e)) => {
                    // The stream cannot resynchronise after a syntax error.
                    self.problem_at(&loc, format!("invalid JSON: {e}"));
                    break;
                }
            }
            document += 1;
        }
    }

    /// `doc` is the YAML text of a top-level document, used for line-accurate decode errors.
    fn load_value(&mut self, loc: &Loc<'_>, mut value: Value, doc: Option<&YamlDoc<'_>>) {
        let Some(obj) = value.as_object_mut() else {
            let found = json_type(&value);
            return self.problem_at(
                loc,
                format!("expected an object with apiVersion and kind, found {found}"),
            );
        };
        let (api_version, kind) = match (type_field(obj, "apiVersion"), type_field(obj, "kind")) {
            (Ok(a), Ok(k)) => (a, k),
            (Err(e), _) | (_, Err(e)) => return self.problem_at(loc, e),
        };
        if kind == "List" || (kind.ends_with("List") && obj.contains_key("items")) {
            return self.load_list(loc, &api_version, &kind, obj.remove("items"));
        }
        let Some(k) = Kind::from_type(&api_version, &kind) else {
            if let Some(known) = Kind::from_name(&kind) {
                let want = known.api_version();
                return self.problem_at(
                    loc,
                    format!("{kind} apiVersion {api_version:?} is not supported (want {want:?})"),
                );
            }
            debug!(%loc, api_version, kind, "kind not used by the agent, skipped");
            self.file.ignored += 1;
            return;
        };
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        let identity = identity(k, &value);
        let mut object = match AnyObject::deserialize(k, &value) {
            Ok(o) => o,
            Err(e) => {
                let message = decode_error(k, &value, doc).unwrap_or_else(|| e.to_string());
                return self.problem_at(loc, format!("{identity}: {message}"));
            }
        };
        object.normalize();
        if object.meta().name.as_deref().unwrap_or_default().is_empty() {
            return self.problem_at(
                loc,
                format!("{kind} without metadata.name (generateName is not supported)"),
            );
        }
        self.file.objects.push(Defined {
            object,
            at: loc.problem(String::new()),
            here: loc.to_string(),
        });
    }

    fn load_list(&mut self, loc: &Loc<'_>, api_version: &str, kind: &str, items: Option<Value>) {
        if loc.item.is_some() {
            return self.problem_at(loc, format!("nested {kind} inside a list is not supported"));
        }
        let items = match items {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                return self.problem_at(
                    loc,
                    format!("items: expected an array, found {}", json_type(&other)),
                );
            }
        };
        // Typed lists (`PodList` from the raw API) omit apiVersion and kind on their items.
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        for (i, mut item) in items.into_iter().enumerate() {
            if let (Some(item_kind), Some(obj)) = (item_kind, item.as_object_mut()) {
                obj.entry("apiVersion")
                    .or_insert_with(|| api_version.into());
                obj.entry("kind").or_insert_with(|| item_kind.into());
            }
            let item_loc = Loc {
                item: Some(i),
                ..loc.clone()
            };
            self.load_value(&item_loc, item, None);
        }
    }
}

fn type_field(obj: &serde_json::Map<String, Value>, field: &str) -> Result<String, String> {
    match obj.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        None | Some(Value::Null) => Err(format!("missing {field}")),
        Some(Value::String(_)) => Err(format!("empty {field}")),
        Some(other) => Err(format!(
            "{field}: expected a string, found {}",
            json_type(other)
        )),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `Kind namespace/name` as far as the raw value tells.
fn identity(kind: Kind, value: &Value) -> String {
    let field = |f: &str| {
        value
            .pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
    };
    match (field("namespace"), field("name")) {
        (Some(ns), Some(name)) if kind.is_namespaced() => format!("{kind} {ns}/{name}"),
        (None, Some(name)) if kind.is_namespaced() => format!("{kind} default/{name}"),
        (_, Some(name)) => format!("{kind} {name}"),
        (_, None) => kind.to_string(),
    }
}

/// serde_json reports type errors without the field path; decoding again through serde_norway
/// names the path (`spec.ports[0].port: invalid type ...`). From the document's own text the
/// line is right too; from re-serialised list items it would not be, so it is dropped.
fn decode_error(kind: Kind, value: &Value, doc: Option<&YamlDoc<'_>>) -> Option<String> {
    let decode = |text: &str| {
        AnyObject::deserialize(kind, serde_norway::Deserializer::from_str(text)).map(drop)
    };
    if let Some(doc) = doc {
        return Some(yaml_error_in_file(doc, decode)).filter(|m| !m.is_empty());
    }
    let text = serde_norway::to_string(value).ok()?;
    let err = decode(&text).err()?;
    let message = err.to_string();
    Some(match err.location() {
        Some(l) => message.replace(&format!(" at line {} column {}", l.line(), l.column()), ""),
        None => message,
    })
}

/// A document parsed like [`Value`] (the later of two equal keys wins) that also notes the
/// first duplicate mapping key, at any depth: neither serde_json nor serde_norway reports
/// one, and a document whose meaning depends on which of two keys counts is rejected.
struct Checked {
    value: Value,
    /// `duplicate key "k" in a.b[0]`.
    duplicate: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let duplicate = std::cell::RefCell::new(None);
        let value = d.deserialize_any(Tracked {
            duplicate: &duplicate,
            at: None,
        })?;
        Ok(Checked {
            value,
            duplicate: duplicate.into_inner(),
        })
    }
}

/// Where a value sits in its document: a key of its parent mapping or an index of its
/// parent sequence.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

struct PathTo<'a> {
    parent: Option<&'a PathTo<'a>>,
    step: Step<'a>,
}

impl fmt::Display for PathTo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.parent {
            write!(f, "{p}")?;
        }
        match self.step {
            Step::Key(k) if self.parent.is_some() => write!(f, ".{k}"),
            Step::Key(k) => write!(f, "{k}"),
            Step::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// Builds the [`Value`] as its own `Deserialize` does, noting duplicates on the way.
#[derive(Clone, Copy)]
struct Tracked<'a> {
    duplicate: &'a std::cell::RefCell<Option<String>>,
    at: Option<&'a PathTo<'a>>,
}

impl<'a> Tracked<'a> {
    fn below(self, at: &'a PathTo<'a>) -> Tracked<'a> {
        Tracked {
            duplicate: self.duplicate,
            at: Some(at),
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Tracked<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Scalars go through `Value`'s own `Deserialize`, so they convert exactly as before.
fn scalar<'de, E: serde::de::Error>(
    d: impl serde::Deserializer<'de, Error = serde::de::value::Error>,
) -> Result<Value, E> {
    <Value as serde::Deserialize>::deserialize(d).map_err(E::custom)
}

impl<'de> serde::de::Visitor<'de> for Tracked<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        scalar(serde::de::IntoDeserializer::into_deserializer(v))
    }
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        scalar(serde::de::IntoDeserializer::into_deserializer(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        scalar(serde::de::IntoDeserializer::into_deserializer(v))
    }
    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        scalar(serde::de::IntoDeserializer::into_deserializer(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        scalar(serde::de::IntoDeserializer::into_deserializer(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        loop {
            let at = PathTo {
                parent: self.at,
                step: Step::Index(out.len()),
            };
            match seq.next_element_seed(self.below(&at))? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = PathTo {
                parent: self.at,
                step: Step::Key(&key),
            };
            let value = map.next_value_seed(self.below(&at))?;
            if out.contains_key(&key) {
                let mut first = self.duplicate.borrow_mut();
                if first.is_none() {
                    *first = Some(match self.at {
                        Some(p) => format!("duplicate key {key:?} in {p}"),
                        None => format!("duplicate key {key:?} at the top level"),
                    });
                }
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Runs `parse` on the document padded with the lines before it, so that the positions in the
/// error message are file positions. Only done on the error path: padding costs O(offset).
fn yaml_error_in_file(
    doc: &YamlDoc<'_>,
    parse: impl Fn(&str) -> Result<(), serde_norway::Error>,
) -> String {
    let padded = format!("{}{}", "\n".repeat(doc.first_line), doc.text);
    parse(&padded)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::manifests::load_str;

    #[test]
    fn split_yaml_documents() {
        let text = "# header comment\n---\na: 1\n---\n# only a comment\n---   \nb: 2\n...\n---\n--- {c: 3}\nd: |\n  ---not a marker\n";
        let docs = split_yaml(text);
        let got: Vec<(usize, &str)> = docs.iter().map(|d| (d.first_line, d.text)).collect();
        assert_eq!(
            got,
            vec![
                (1, "---\na: 1\n"),
                (5, "---   \nb: 2\n"),
                (9, "--- {c: 3}\nd: |\n  ---not a marker\n"),
            ]
        );
        assert_eq!(split_yaml("a: 1").len(), 1);
        assert!(split_yaml("").is_empty());
        assert!(split_yaml("---\n---\n").is_empty());
        // `----` and `---x` are content, not markers.
        assert_eq!(split_yaml("a: |\n ok\n----\n").len(), 1);
    }

    #[test]
    fn problem_display() {
        let p = LoadProblem {
            file: "dir/a.yaml".into(),
            line: Some(12),
            document: Some(2),
            item: Some(3),
            message: "missing kind".into(),
        };
        assert_eq!(
            p.to_string(),
            "dir/a.yaml:12: document 2 items[3]: missing kind"
        );
        let p = LoadProblem {
            line: None,
            document: None,
            item: None,
            ..p
        };
        assert_eq!(p.to_string(), "dir/a.yaml: missing kind");
    }

    #[test]
    fn decode_errors_name_the_field_and_line() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  ports:\n  - port: eighty\n";
        let r = load_str(Path::new("x.yaml"), text);
        assert_eq!(r.snapshot.count(Kind::Namespace), 1);
        assert_eq!(r.problems.len(), 1);
        assert_eq!(
            r.problems[0].to_string(),
            r#"x.yaml:4: document 1: Service shop/web: spec.ports[0].port: invalid type: string "eighty", expected i32 at line 12 column 11"#
        );
    }

    #[test]
    fn syntax_errors_report_file_lines() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: [Namespace\nmetadata: {name: b}\n";
        let r = load_str(Path::new("x.yaml"), text);
        assert_eq!(r.snapshot.count(Kind::Namespace), 1);
        let msg = r.problems[0].to_string();
        assert!(
            msg.starts_with("x.yaml:4: document 1: invalid YAML: "),
            "{msg}"
        );
        assert!(msg.contains("line 7"), "{msg}");
    }
}
