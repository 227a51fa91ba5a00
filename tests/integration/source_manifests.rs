//! The manifest loader against real directories.

use std::fs;
use std::path::{Path, PathBuf};

use nodeplane::snapshot::{Kind, pod_ips};
use nodeplane::source::manifests::{LoadProblem, load_dir};

fn write(root: &Path, rel: &str, text: &str) -> PathBuf {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, text).unwrap();
    path
}

fn ns(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

fn pod(ns: &str, name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{app: {name}}}\n\
         spec:\n  nodeName: worker-1\n  containers: [{{name: c, image: busybox}}]\n\
         status:\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
    )
}

fn messages(problems: &[LoadProblem]) -> Vec<String> {
    problems.iter().map(ToString::to_string).collect()
}

#[test]
fn multi_document_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "---\n{}---\n# comment only\n---\n{}---\n{}",
        ns("a"),
        ns("b"),
        pod("a", "p", "10.128.0.5")
    );
    write(dir.path(), "all.yaml", &text);
    let r = load_dir(dir.path()).unwrap();
    assert!(r.problems.is_empty(), "{:?}", messages(&r.problems));
    assert_eq!(r.files, 1);
    assert_eq!(r.snapshot.count(Kind::Namespace), 2);
    let p = r.snapshot.pod("a", "p").unwrap();
    assert_eq!(
        pod_ips(p),
        ["10.128.0.5".parse::<std::net::IpAddr>().unwrap()]
    );
}

#[test]
fn kind_list_and_typed_list() {
    let dir = tempfile::tempdir().unwrap();
    // `kubectl get pods,ns -A -o yaml` output: a List whose items carry apiVersion and kind.
    let list = format!(
        "apiVersion: v1\nkind: List\nmetadata: {{resourceVersion: \"\"}}\nitems:\n{}",
        [
            ns("a"),
            pod("a", "p1", "10.128.0.5"),
            pod("a", "p2", "10.128.0.6")
        ]
        .iter()
        .map(|doc| {
            let mut lines = doc.lines();
            let first = format!("- {}\n", lines.next().unwrap());
            first + &lines.map(|l| format!("  {l}\n")).collect::<String>()
        })
        .collect::<String>()
    );
    write(dir.path(), "list.yaml", &list);
    // The raw API's NodeList: items without apiVersion/kind.
    write(
        dir.path(),
        "nodes.yaml",
        "apiVersion: v1\nkind: NodeList\nmetadata: {}\nitems:\n- metadata: {name: n1}\n- metadata: {name: n2}\n",
    );
    write(
        dir.path(),
        "empty-list.yaml",
        "apiVersion: v1\nkind: List\nitems: []\n",
    );
    let r = load_dir(dir.path()).unwrap();
    assert!(r.problems.is_empty(), "{:?}", messages(&r.problems));
    assert_eq!(r.snapshot.count(Kind::Namespace), 1);
    assert_eq!(r.snapshot.count(Kind::Pod), 2);
    assert_eq!(r.snapshot.count(Kind::Node), 2);
}

#[test]
fn json_single_list_and_stream() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "ns.json",
        r#"{"apiVersion": "v1", "kind": "List", "items": [
             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}]}"#,
    );
    write(
        dir.path(),
        "stream.json",
        "{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"c\"}}\n\
         {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": 7}}\n",
    );
    let r = load_dir(dir.path()).unwrap();
    assert_eq!(r.snapshot.count(Kind::Namespace), 3);
    let file = dir.path().join("stream.json");
    assert_eq!(
        messages(&r.problems),
        [format!(
            "{}:2: document 1: Namespace: invalid type: integer `7`, expected a string",
            file.display()
        )]
    );
}

#[test]
fn malformed_documents_are_skipped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = [
        ns("first"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: [unclosed\n".to_string(),
        "metadata: {name: nokind}\n".to_string(),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {containers: 3}\n".to_string(),
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: ok}}\n\
         - {apiVersion: v1, kind: Service, metadata: {name: s, namespace: a}, spec: {ports: [{port: x}]}}\n\
         - 42\n"
            .to_string(),
        ns("last"),
    ]
    .join("---\n");
    let file = write(dir.path(), "mixed.yaml", &text);
    let r = load_dir(dir.path()).unwrap();
    let names: Vec<&String> = r.snapshot.namespaces().keys().collect();
    assert_eq!(names, ["first", "last", "ok"]);
    let f = file.display();
    let got = messages(&r.problems);
    assert_eq!(got.len(), 5, "{got:#?}");
    assert!(
        got[0].starts_with(&format!("{f}:5: document 1: invalid YAML: ")),
        "{}",
        got[0]
    );
    assert!(got[0].contains("line 8 column 18"), "{}", got[0]);
    assert_eq!(got[1], format!("{f}:9: document 2: missing apiVersion"));
    assert_eq!(
        got[2],
        format!(
            "{f}:11: document 3: Pod a/p: spec.containers: invalid type: integer `3`, expected a sequence at line 15 column 20"
        )
    );
    assert_eq!(
        got[3],
        format!(
            "{f}:16: document 4 items[1]: Service a/s: spec.ports[0].port: invalid type: string \"x\", expected i32"
        )
    );
    assert_eq!(
        got[4],
        format!(
            "{f}:16: document 4 items[2]: expected an object with apiVersion and kind, found a number"
        )
    );
    assert_eq!(
        (r.problems[3].document, r.problems[3].item),
        (Some(4), Some(1))
    );
}

#[test]
fn unknown_kinds_ignored_and_version_mismatch_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "misc.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: a}\ndata: {k: v}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n\
         apiVersion: k8s.ovn.org/v1beta1\nkind: EgressFirewall\nmetadata: {name: default, namespace: a}\nspec: {egress: []}\n",
    );
    let r = load_dir(dir.path()).unwrap();
    assert_eq!(r.ignored, 2);
    assert!(r.snapshot.is_empty());
    assert_eq!(
        messages(&r.problems),
        [format!(
            "{}:9: document 2: EgressFirewall apiVersion \"k8s.ovn.org/v1beta1\" is not supported (want \"k8s.ovn.org/v1\")",
            dir.path().join("misc.yaml").display()
        )]
    );
}

#[test]
fn nested_dirs_sorted_hidden_skipped_and_duplicates_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b/z.yml", &ns("from-b"));
    write(dir.path(), "a/deeper/x.yaml", &pod("a", "p", "10.128.0.5"));
    write(
        dir.path(),
        "a/y.json",
        r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}"#,
    );
    write(dir.path(), "c.yaml", &pod("a", "p", "10.128.0.9"));
    write(dir.path(), "notes.txt", "not: a manifest");
    write(dir.path(), "..2024_05_01/hidden.yaml", &ns("hidden"));
    write(dir.path(), ".git/config.yaml", &ns("git"));
    let r = load_dir(dir.path()).unwrap();
    assert_eq!(r.files, 4);
    let names: Vec<&String> = r.snapshot.namespaces().keys().collect();
    assert_eq!(names, ["a", "from-b"]);
    // a/deeper/x.yaml loads before c.yaml, so c.yaml's pod wins and is reported.
    let p = r.snapshot.pod("a", "p").unwrap();
    assert_eq!(
        p.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.128.0.9")
    );
    assert_eq!(
        messages(&r.problems),
        [format!(
            "{}:1: document 0: Pod a/p is defined again (first at {}:1 document 0); the later definition wins",
            dir.path().join("c.yaml").display(),
            dir.path().join("a/deeper/x.yaml").display()
        )]
    );
}

#[cfg(unix)]
#[test]
fn configmap_style_symlinks_are_followed_once() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "..2024_05_01_10_00_00.123/ns.yaml", &ns("a"));
    std::os::unix::fs::symlink("..2024_05_01_10_00_00.123", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/ns.yaml", dir.path().join("ns.yaml")).unwrap();
    // A loop must not hang the loader.
    std::os::unix::fs::symlink(".", dir.path().join("loop")).unwrap();
    let r = load_dir(dir.path()).unwrap();
    assert!(r.problems.is_empty(), "{:?}", messages(&r.problems));
    assert_eq!(r.files, 1);
    assert_eq!(r.snapshot.count(Kind::Namespace), 1);
}

#[test]
fn normalization_on_load() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "x.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  managedFields:\n  - {manager: kubectl, operation: Apply}\n---\n\
         apiVersion: v1\nkind: Node\nmetadata: {name: n, namespace: stray}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {generateName: x-}\n",
    );
    let r = load_dir(dir.path()).unwrap();
    let p = r
        .snapshot
        .pod("default", "p")
        .expect("namespace defaults to `default`");
    assert!(p.metadata.managed_fields.is_none());
    assert!(r.snapshot.node("n").unwrap().metadata.namespace.is_none());
    assert_eq!(
        messages(&r.problems),
        [format!(
            "{}:11: document 2: Namespace without metadata.name (generateName is not supported)",
            dir.path().join("x.yaml").display()
        )]
    );
}

#[test]
fn single_file_and_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "one.yaml", &ns("a"));
    assert_eq!(load_dir(&file).unwrap().snapshot.count(Kind::Namespace), 1);
    let err = load_dir(&dir.path().join("nope")).unwrap_err();
    assert!(
        err.to_string().starts_with("cannot read manifests at "),
        "{err}"
    );
}

#[test]
fn duplicate_keys_reject_their_document_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n  name: c\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: a}}\n\
         spec: {{containers: [{{name: c, image: i, image: j}}]}}\n---\n\
         apiVersion: v1\nkind: List\nitems:\n- {{apiVersion: v1, kind: Namespace, metadata: {{name: d}}}}\n\
         - {{apiVersion: v1, kind: Namespace, metadata: {{name: e, labels: {{x: '1', x: '2'}}}}}}\n",
        ns("a"),
    );
    write(dir.path(), "dup.yaml", &yaml);
    write(
        dir.path(),
        "dup.json",
        "{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"f\"}}\n\
         {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"g\"}}\n\
         {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"h\", \"name\": \"i\"}}\n\
         {\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"j\"}}\n",
    );
    let r = load_dir(dir.path()).unwrap();
    let root = dir.path().display();
    assert_eq!(
        messages(&r.problems),
        vec![
            format!("{root}/dup.json:2: document 1: duplicate key \"kind\" at the top level"),
            format!("{root}/dup.json:3: document 2: duplicate key \"name\" in metadata"),
            format!("{root}/dup.yaml:5: document 1: duplicate key \"name\" in metadata"),
            format!(
                "{root}/dup.yaml:11: document 2: duplicate key \"image\" in spec.containers[0]"
            ),
            format!(
                "{root}/dup.yaml:16: document 3: duplicate key \"x\" in items[1].metadata.labels"
            ),
        ]
    );
    let names: Vec<&String> = r.snapshot.namespaces().keys().collect();
    assert_eq!(names, ["a", "f", "j"]);
    assert_eq!(r.snapshot.count(Kind::Pod), 0);
}
