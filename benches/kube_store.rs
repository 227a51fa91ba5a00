//! Kubernetes source costs, printed (no timing assertions; no root needed).
//!
//! `cargo bench --bench kube_store [-- --pods N]` (default 50,000 pods in 1,000 namespaces on
//! 500 nodes; `cargo test --all-targets` runs a 500-pod smoke version):
//!
//! 1. decode: one watched pod (a realistic kubelet-written object with containers, volumes,
//!    conditions and managedFields) pruned and decoded into the typed Pod;
//! 2. initial list: every pod through the store (Init, InitApply..., InitDone) plus the first
//!    snapshot;
//! 3. one change: one pod update applied to the store plus the snapshot published for it (the
//!    snapshot clones the store's maps of `Arc`s and rebuilds the indexes: O(objects)).
//!
//! Also printed: the JSON size of a pod before and after pruning.

use nodeplane::testing::args::arg;
use std::time::Instant;

use nodeplane::snapshot::Kind;
use nodeplane::source::kube::{Store, Update, decode};
use serde_json::{Value, json};

fn pod(i: usize) -> Value {
    let ip = format!("10.{}.{}.{}", 128 + (i >> 16) % 4, (i >> 8) & 255, i & 255);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("app-{i}"), "namespace": format!("ns-{}", i % 1000),
            "uid": format!("uid-{i}"), "resourceVersion": i.to_string(),
            "labels": {"app": format!("app-{}", i % 50), "pod-template-hash": "5d8f7c9b6"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(600)},
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}},
                {"manager": "kubelet", "operation": "Update", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIPs": {}}}}
            ]
        },
        "spec": {
            "nodeName": format!("node-{}", i % 500),
            "containers": [{"name": "app", "image": "registry.example/app:1.2.3",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
            "serviceAccountName": "default", "restartPolicy": "Always"
        },
        "status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.50.11",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0,
                "image": "registry.example/app:1.2.3", "imageID": "sha256:abc", "containerID": "cri-o://abc",
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]
        }
    })
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = arg("--pods", if full { 50_000 } else { 500 });
    println!("kube store, {n} pods");

    let raw: Vec<String> = (0..n).map(|i| pod(i).to_string()).collect();
    let t = Instant::now();
    let decoded: Vec<_> = raw
        .iter()
        .map(|o| decode(Kind::Pod, o).expect("decodes"))
        .collect();
    let per = t.elapsed() / n as u32;
    println!("  decode (prune + typed):            {per:>10.2?} per pod");

    let before = pod(0).to_string().len();
    let nodeplane::snapshot::AnyObject::Pod(kept) = &decoded[0] else {
        unreachable!("decoded as a pod")
    };
    let after = serde_json::to_string(&**kept).unwrap().len();
    println!("  pod JSON size:                      {before} bytes watched, {after} bytes kept");

    let mut store = Store::default();
    let t = Instant::now();
    store.apply(Update::Init(Kind::Pod));
    for o in decoded {
        store.apply(Update::InitApply(o));
    }
    store.apply(Update::InitDone(Kind::Pod));
    let snap = store.snapshot();
    println!(
        "  initial list + first snapshot:     {:>10.2?}",
        t.elapsed()
    );
    assert_eq!(snap.count(Kind::Pod), n);

    let rounds = 20;
    let t = Instant::now();
    for r in 0..rounds {
        let mut changed = pod(r);
        changed["metadata"]["labels"]["app"] = json!("changed");
        store.apply(Update::Apply(
            decode(Kind::Pod, &changed.to_string()).unwrap(),
        ));
        std::hint::black_box(store.snapshot());
    }
    println!(
        "  one change + snapshot:             {:>10.2?} per change",
        t.elapsed() / rounds as u32
    );
}
