//! deploy/'s CRDs against the upstream ones they stand in for (copies under
//! tests/fixtures/upstream-crds/, origin and version in its ORIGIN file): OVN-Kubernetes'
//! EgressFirewall, EgressIP and EgressQoS, and OpenShift's CloudPrivateIPConfig. Every
//! difference in names (kind, listKind, plural, singular, short names), scope, printer
//! columns, subresources and the schema (each property, its description as `kubectl explain`
//! shows it, line breaks aside, type, format, pattern, enum, bound, required list and
//! `x-kubernetes-*` marker) must be listed, with its reason, in
//! tests/fixtures/upstream-crds/differences.txt; an unlisted difference or a listed one that
//! no longer exists fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nodeplane::api::crds;
use serde::Deserialize;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream-crds")
}

fn upstream(file: &str) -> Value {
    let path = fixtures().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut docs = serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null());
    docs.next().unwrap_or_else(|| panic!("{file}: no document"))
}

/// The upstream copy of each of our CRDs, by the CRD's name.
fn upstream_file(name: &str) -> String {
    format!("{name}.yaml")
}

fn words(v: &Value) -> String {
    v.as_str()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "-".into(),
        Some(v) => serde_json::to_string(v).unwrap(),
    }
}

/// Keys compared by value at every schema node (the rest is walked or skipped).
const COMPARED: &[&str] = &[
    "type",
    "format",
    "pattern",
    "enum",
    "nullable",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "anyOf",
    "oneOf",
    "allOf",
    "title",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
];

fn schema_diff(path: &str, ours: &Value, theirs: &Value, out: &mut Vec<String>) {
    // What `kubectl explain` shows, line breaks aside.
    let (da, db) = (words(&ours["description"]), words(&theirs["description"]));
    if da != db {
        out.push(format!("{path}: description {da:?} (upstream {db:?})"));
    }
    for key in COMPARED {
        let (a, b) = (ours.get(*key), theirs.get(*key));
        if a != b {
            out.push(format!("{path}: {key} {} (upstream {})", show(a), show(b)));
        }
    }
    let required = |v: &Value| -> BTreeSet<String> {
        (v.get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten())
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
    };
    let (ra, rb) = (required(ours), required(theirs));
    for r in ra.difference(&rb) {
        out.push(format!("{path}: requires {r} (upstream does not)"));
    }
    for r in rb.difference(&ra) {
        out.push(format!("{path}: does not require {r} (upstream does)"));
    }
    let props = |v: &Value| {
        v.get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (pa, pb) = (props(ours), props(theirs));
    for (name, a) in &pa {
        let p = format!("{path}.{name}");
        match pb.get(name) {
            Some(b) => schema_diff(&p, a, b, out),
            None => out.push(format!("{p}: not upstream")),
        }
    }
    for name in pb.keys().filter(|n| !pa.contains_key(*n)) {
        out.push(format!("{path}.{name}: missing (upstream has it)"));
    }
    for key in ["items", "additionalProperties"] {
        match (ours.get(key), theirs.get(key)) {
            (Some(a), Some(b)) if a.is_object() && b.is_object() => {
                let p = if key == "items" {
                    format!("{path}[]")
                } else {
                    format!("{path}{{}}")
                };
                schema_diff(&p, a, b, out)
            }
            (a, b) if a != b => {
                out.push(format!("{path}: {key} {} (upstream {})", show(a), show(b)))
            }
            _ => {}
        }
    }
}

/// Whole numbers as integers (the generator writes `1.0` where YAML says `1`).
fn canon(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15) {
                *v = Value::from(f as i64);
            }
        }
        Value::Object(o) => o.values_mut().for_each(canon),
        Value::Array(a) => a.iter_mut().for_each(canon),
        _ => {}
    }
}

/// Every difference of `ours` from `theirs`, one line each.
fn crd_diff(ours: &Value, theirs: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let (sa, sb) = (&ours["spec"], &theirs["spec"]);
    for key in [
        "kind",
        "listKind",
        "plural",
        "singular",
        "shortNames",
        "categories",
    ] {
        let (a, b) = (sa["names"].get(key), sb["names"].get(key));
        if a != b {
            out.push(format!("names.{key}: {} (upstream {})", show(a), show(b)));
        }
    }
    for key in ["group", "scope"] {
        if sa[key] != sb[key] {
            out.push(format!("{key}: {} (upstream {})", sa[key], sb[key]));
        }
    }
    let (va, vb) = (&sa["versions"][0], &sb["versions"][0]);
    for key in [
        "name",
        "served",
        "storage",
        "additionalPrinterColumns",
        "subresources",
        "selectableFields",
    ] {
        let (a, b) = (va.get(key), vb.get(key));
        if a != b {
            out.push(format!(
                "versions[0].{key}: {} (upstream {})",
                show(a),
                show(b)
            ));
        }
    }
    let (a, b) = (
        &va["schema"]["openAPIV3Schema"],
        &vb["schema"]["openAPIV3Schema"],
    );
    schema_diff("schema", a, b, &mut out);
    out
}

/// `crd-file | difference | reason` lines of differences.txt.
fn allowed() -> Vec<(String, String, String)> {
    let path = fixtures().join("differences.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(3, " | ").collect();
            assert!(
                f.len() == 3 && !f[2].trim().is_empty(),
                "differences.txt: no reason: {l}"
            );
            (f[0].into(), f[1].into(), f[2].into())
        })
        .collect()
}

#[test]
fn our_crds_differ_from_upstream_only_as_listed() {
    let allowed = allowed();
    let mut used = BTreeSet::new();
    let mut unlisted = Vec::new();
    for (_, crd) in crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        let mut ours = serde_json::to_value(&crd).unwrap();
        let mut theirs = upstream(&upstream_file(&name));
        canon(&mut ours);
        canon(&mut theirs);
        for d in crd_diff(&ours, &theirs) {
            match allowed
                .iter()
                .position(|(c, diff, _)| *c == name && *diff == d)
            {
                Some(i) => {
                    used.insert(i);
                }
                None => unlisted.push(format!("{name} | {d}")),
            }
        }
    }
    let stale: Vec<String> = (allowed.iter().enumerate())
        .filter(|(i, _)| !used.contains(i))
        .map(|(_, (c, d, _))| format!("{c} | {d}"))
        .collect();
    assert!(
        unlisted.is_empty() && stale.is_empty(),
        "differences from the upstream CRDs not in tests/fixtures/upstream-crds/differences.txt \
         (add each with its reason, or remove the difference):\n{}\n\nlisted but gone:\n{}",
        unlisted.join("\n"),
        stale.join("\n")
    );
}
