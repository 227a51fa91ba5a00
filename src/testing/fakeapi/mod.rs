//! A faithful in-process fake of the Kubernetes API server for the kube-mode tests: list with
//! resourceVersion, pages (`limit`/`continue`), label/field selectors, watch streams that replay history from a
//! resourceVersion with bookmarks and `timeoutSeconds`, `410 Gone` after compaction,
//! connection drops (stop and restart on the same address), silent stalls (connections that
//! stay open and acknowledged by TCP but carry nothing, as behind a black-holing path or a
//! hung server: [`stall_open`](FakeApi::stall_open), [`stall_new`](FakeApi::stall_new)), and a
//! record of every write (status server-side apply, optionally without a status subresource;
//! JSON merge patches of objects; Events), and `coordination.k8s.io/v1` Leases with
//! resourceVersion preconditions (`lease`: `409` on a stale replace or a taken name). It
//! serves the ten kinds the agent watches and Leases; others are `404`.
//!
//! ```text
//! let listener = node.enter(|| TcpListener::bind("127.0.0.1:0")).unwrap();
//! let api = FakeApi::start(listener);
//! api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}}));
//! let kubeconfig = api.kubeconfig(dir.path());
//! ```
mod http;
mod lease;
mod shared;
mod stall;
mod store;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::task::JoinSet;

pub use store::{Recorded, Resource};

pub struct FakeApi {
    shared: Arc<shared::Shared>,
    runtime: tokio::runtime::Runtime,
    server: Mutex<Option<tokio::task::JoinHandle<()>>>,
    addr: SocketAddr,
}

impl FakeApi {
    /// Serves on `listener` (bind it inside the netns the agent runs in).
    pub fn start(listener: TcpListener) -> FakeApi {
        let runtime = crate::testing::runtime::multi_thread(1);
        let addr = listener.local_addr().expect("local addr");
        let api = FakeApi {
            shared: Arc::new(shared::Shared::new()),
            runtime,
            server: Mutex::new(None),
            addr,
        };
        api.serve(listener);
        api
    }

    fn serve(&self, listener: TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = self.shared.clone();
        let task = self.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            // Connections live in this set: aborting the accept task drops them all.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                let stream = shared.stalls.wrap(stream);
                connections.spawn(async move {
                    let service = service_fn(move |req| http::handle(shared.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *self.server.lock().unwrap() = Some(task);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes a kubeconfig pointing at this server into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: agent\ncurrent-context: fake\nusers:\n- name: agent\n  user:\n    token: fake-token\n",
            self.addr
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Creates or replaces an object (watchers see ADDED or MODIFIED).
    pub fn put(&self, obj: Value) {
        let ev = self.shared.state().put(obj);
        self.shared.publish(ev);
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let ev = self.shared.state().delete(kind, namespace, name);
        self.shared
            .publish(ev.unwrap_or_else(|| panic!("no {kind} {namespace}/{name}")));
    }

    pub fn object(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let r = Resource::by_kind(kind);
        let key = (namespace.to_string(), name.to_string());
        self.shared.state().objects.get(&r)?.get(&key).cloned()
    }

    /// A handle on the objects for helper threads (`crate::testing::cloud_controller`).
    pub fn objects_handle(&self) -> Objects {
        Objects {
            shared: self.shared.clone(),
        }
    }

    /// Every object of `kind`, by name.
    pub fn objects(&self, kind: &str) -> Vec<Value> {
        self.objects_handle().list(kind)
    }

    /// List requests for `kind` wait until [`release_lists`](Self::release_lists).
    pub fn hold_lists(&self, kind: &'static str) {
        self.shared.held.lock().unwrap().insert(kind);
    }

    pub fn release_lists(&self, kind: &str) {
        self.shared.held.lock().unwrap().remove(kind);
        self.shared.released.notify_waiters();
    }

    /// Completed list requests for `kind`.
    pub fn lists(&self, kind: &str) -> usize {
        self.shared.state().lists.get(kind).copied().unwrap_or(0)
    }

    /// Forgets the event history and closes every watch: resuming watches get `410 Gone`.
    pub fn compact(&self) {
        self.shared.state().compact();
        self.drop_watches();
    }

    /// Ends every open watch stream (clients resume from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.shared.watch_generation.send_modify(|g| *g += 1);
    }

    /// Every connection open now goes silent for good: it stays open (no FIN, no RST, TCP
    /// still acknowledges what the agent sends) but the server reads and writes nothing more,
    /// mid-watch or idle in the agent's pool. Watches resume only on new connections.
    pub fn stall_open(&self) {
        self.shared.stalls.stall_open();
    }

    /// While `on`, new connections are accepted and then stalled like
    /// [`stall_open`](Self::stall_open) (they stay stalled after `stall_new(false)`).
    pub fn stall_new(&self, on: bool) {
        self.shared.stalls.stall_new(on);
    }

    /// Closes the listener and every connection, as a dying API server would.
    pub fn stop(&self) {
        if let Some(task) = self.server.lock().unwrap().take() {
            task.abort();
            let _ = self.runtime.block_on(task);
        }
        self.drop_watches();
    }

    /// Serves again (same objects and history) on `listener`, normally bound to
    /// [`addr`](Self::addr).
    pub fn restart(&self, listener: TcpListener) {
        assert_eq!(
            listener.local_addr().unwrap(),
            self.addr,
            "restart on the same address"
        );
        self.serve(listener);
    }

    /// Lease writes refused with `409 Conflict` / `409 AlreadyExists` so far.
    pub fn lease_conflicts(&self) -> usize {
        self.shared.state().lease_conflicts
    }

    /// Serves `kind` without a status subresource, as OVN-Kubernetes' EgressIP CRD.
    pub fn without_status_subresource(&self, kind: &'static str) {
        self.shared.state().no_status_subresource.insert(kind);
    }

    /// Every write request received so far (PATCH, POST, ...).
    pub fn writes(&self) -> Vec<Recorded> {
        self.shared.state().writes.clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(task) = self.server.lock().unwrap().take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{Read, Write};

    /// `GET path` over a fresh connection; the JSON body.
    fn get(addr: SocketAddr, path: &str) -> Value {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    #[test]
    fn lists_come_in_pages_of_limit_at_the_first_pages_resource_version() {
        let api = FakeApi::start(TcpListener::bind("127.0.0.1:0").unwrap());
        for i in 0..5 {
            api.put(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": format!("ns{i}")}}));
        }
        let mut names = Vec::new();
        let mut path = "/api/v1/namespaces?limit=2".to_string();
        let mut rvs = Vec::new();
        loop {
            let page = get(api.addr(), &path);
            let items = page["items"].as_array().unwrap();
            assert!(items.len() <= 2, "{page}");
            names.extend(items.iter().map(|o| o["metadata"]["name"].clone()));
            rvs.push(page["metadata"]["resourceVersion"].clone());
            let token = page["metadata"]["continue"].as_str().unwrap().to_string();
            if token.is_empty() {
                break;
            }
            // A change between pages: the rest of the list keeps the first page's version.
            api.put(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "zz-late"}}));
            path = format!("/api/v1/namespaces?limit=2&continue={token}");
        }
        // Pages of 2 over the 5, and the late one (it sorts after the cursor; a watch from the
        // first page's version replays it anyway).
        assert_eq!(rvs.len(), 3, "{names:?}");
        assert!(rvs.iter().all(|rv| *rv == rvs[0]), "{rvs:?}");
        assert_eq!(
            names[..5],
            ["ns0", "ns1", "ns2", "ns3", "ns4"].map(|n| json!(n))
        );
        assert_eq!(api.lists("Namespace"), 1, "one list completed");
    }
}

/// The fake's objects, shared with a helper thread.
#[derive(Clone)]
pub struct Objects {
    shared: Arc<shared::Shared>,
}

impl Objects {
    /// Every object of `kind`, by name.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        let r = Resource::by_kind(kind);
        let state = self.shared.state();
        state
            .objects
            .get(&r)
            .map_or_else(Vec::new, |m| m.values().cloned().collect())
    }

    /// Changes a cluster-scoped object in place, atomically: `change` sees the current
    /// object and returns whether to write it (watchers see MODIFIED).
    pub fn update(&self, kind: &str, name: &str, change: impl FnOnce(&mut Value) -> bool) {
        let r = Resource::by_kind(kind);
        let mut state = self.shared.state();
        let key = (String::new(), name.to_string());
        let Some(mut obj) = state.objects.get(&r).and_then(|m| m.get(&key)).cloned() else {
            return;
        };
        if !change(&mut obj) {
            return;
        }
        let ev = state.put(obj);
        drop(state);
        self.shared.publish(ev);
    }
}
