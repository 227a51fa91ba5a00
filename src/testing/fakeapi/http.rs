//! HTTP side of the fake API server (hyper 1, HTTP/1.1): list, watch (history replay,
//! bookmarks, `410 Gone`), status server-side apply, event creation, Lease create/replace
//! (`lease`); every write recorded.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::shared::{Body, Shared, full, status};
use super::store::{Recorded, Resource, WatchEvent, fields_match, labels_match};

/// Interval between watch bookmarks.
const BOOKMARK_EVERY: Duration = Duration::from_millis(500);

fn not_found(what: &str) -> Response<Body> {
    full(
        StatusCode::NOT_FOUND,
        status(404, "NotFound", format!("{what} not found")),
    )
}

/// What a request path names.
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        other => (None, other.to_vec()),
    };
    let resource = Resource::by_path(group, version, rest.first()?)?;
    Some(Target {
        resource,
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
    })
}

fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| crate::text::form_decode(v).unwrap_or_else(|_| v.to_string()))
    })
}

pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if path == "/version" {
        return Ok(full(
            StatusCode::OK,
            json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0-fake"}),
        ));
    }
    let method = req.method().clone();
    if method != Method::GET {
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        return Ok(write(&shared, method, path, query, content_type, body));
    }
    let Some(t) = parse_path(&path) else {
        return Ok(not_found(&path));
    };
    if t.name.is_some() {
        let key = (t.namespace.unwrap_or_default(), t.name.unwrap_or_default());
        let obj = shared
            .state()
            .objects
            .get(&t.resource)
            .and_then(|m| m.get(&key))
            .cloned();
        return Ok(match obj {
            Some(o) => full(StatusCode::OK, o),
            None => not_found(&format!("{} {}/{}", t.resource.kind, key.0, key.1)),
        });
    }
    if param(&query, "watch").as_deref() == Some("true")
        || param(&query, "watch").as_deref() == Some("1")
    {
        return Ok(watch(shared, t, &query));
    }
    Ok(list(&shared, t, &query).await)
}

async fn list(shared: &Shared, t: Target, query: &str) -> Response<Body> {
    wait_until_released(shared, t.resource.kind).await;
    let labels = param(query, "labelSelector").unwrap_or_default();
    let fields = param(query, "fieldSelector").unwrap_or_default();
    let limit = param(query, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (first_rv, after) = page_start(query);
    let mut state = shared.state();
    let rv = first_rv.unwrap_or_else(|| state.rv.max(1).to_string());
    // The items are written straight into the page's text (no copy of each object, no
    // intermediate document): at 10,000 objects the fake server must not be what a cold
    // start of the agent waits for.
    let mut page = Page::new(limit);
    let objects = state.objects.get(&t.resource).into_iter().flat_map(|m| {
        let start = match &after {
            Some(k) => std::ops::Bound::Excluded(k.clone()),
            None => std::ops::Bound::Unbounded,
        };
        m.range((start, std::ops::Bound::Unbounded))
    });
    for (key, o) in objects {
        let wanted = t.namespace.as_ref().is_none_or(|want| want == &key.0)
            && labels_match(&labels, o)
            && fields_match(&fields, o);
        if wanted && !page.push(key, o) {
            break;
        }
    }
    let token = page.continue_token(&rv);
    if token.is_empty() {
        *state.lists.entry(t.resource.kind).or_default() += 1;
    }
    drop(state);
    let head = json!({"apiVersion": t.resource.api_version(), "kind": format!("{}List", t.resource.kind),
        "metadata": {"resourceVersion": rv, "continue": token}});
    let mut body = head.to_string();
    body.pop();
    body.push_str(",\"items\":");
    body.push_str(&page.items);
    body.push_str("]}");
    json_response(Full::new(Bytes::from(body)).boxed())
}

/// Waits while lists of `kind` are held back (`FakeApi::hold_lists`).
async fn wait_until_released(shared: &Shared, kind: &str) {
    loop {
        let notified = shared.released.notified();
        if !shared.held.lock().unwrap().contains(kind) {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
    }
}

/// Where a list page starts. Pages as the API server cuts them: at most `limit` items, then
/// a `continue` token (here `<resourceVersion of the first page>:<namespace>/<name of the
/// last item>`). Every page answers the first page's resourceVersion, so a watch from it
/// replays whatever changed while the pages were read. `(None, None)`: the first page.
fn page_start(query: &str) -> (Option<String>, Option<(String, String)>) {
    let token = param(query, "continue").filter(|c| !c.is_empty());
    match token.as_deref().and_then(|c| c.split_once(':')) {
        Some((rv, key)) => {
            let (ns, name) = key.split_once('/').unwrap_or(("", key));
            (
                Some(rv.to_string()),
                Some((ns.to_string(), name.to_string())),
            )
        }
        None => (None, None),
    }
}

/// One list page's items as JSON text (without the closing bracket), cut at `limit`.
struct Page {
    items: String,
    count: usize,
    limit: Option<usize>,
    last: Option<(String, String)>,
    more: bool,
}

impl Page {
    fn new(limit: Option<usize>) -> Page {
        Page {
            items: String::from("["),
            count: 0,
            limit,
            last: None,
            more: false,
        }
    }

    /// Adds `object`; false when the page is full (the list goes on in the next page).
    fn push(&mut self, key: &(String, String), object: &Value) -> bool {
        if self.limit.is_some_and(|l| self.count == l) {
            self.more = true;
            return false;
        }
        if self.count > 0 {
            self.items.push(',');
        }
        self.items.push_str(&object.to_string());
        self.count += 1;
        self.last = Some(key.clone());
        true
    }

    /// The `continue` token of the next page; empty on the last page.
    fn continue_token(&self, rv: &str) -> String {
        match (self.more, &self.last) {
            (true, Some((ns, name))) => format!("{rv}:{ns}/{name}"),
            _ => String::new(),
        }
    }
}

fn json_response(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(body)
        .expect("response")
}

fn watch_line(ev_type: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": ev_type, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// What one watch request asks for.
struct WatchRequest {
    from: u64,
    bookmarks: bool,
    /// As the API server: the watch ends (cleanly) after timeoutSeconds.
    ends: Option<Duration>,
    resource: Resource,
}

fn watch(shared: Arc<Shared>, t: Target, query: &str) -> Response<Body> {
    let req = WatchRequest {
        from: param(query, "resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        bookmarks: param(query, "allowWatchBookmarks").as_deref() == Some("true"),
        ends: param(query, "timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_secs),
        resource: t.resource,
    };
    let matches = watch_filter(t, query);
    // Subscribe before reading the history so that nothing falls in between.
    let live = shared.events.subscribe();
    let generation = shared.watch_generation.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let backlog = {
        let state = shared.state();
        (req.from == 0 || req.from >= state.compacted_below).then(|| {
            (state.history.iter())
                .filter(|e| e.rv > req.from && matches(e))
                .cloned()
                .collect()
        })
    };
    tokio::spawn(async move {
        let Some(backlog) = backlog else {
            let from = req.from;
            let s = status(410, "Expired", format!("too old resource version: {from}"));
            let _ = tx.send(watch_line("ERROR", &s)).await;
            return;
        };
        let stream = WatchStream {
            shared,
            tx,
            live,
            generation,
        };
        stream.run(req, backlog, matches).await;
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    json_response(StreamBody::new(stream).boxed())
}

/// The events of `t` (namespace, label and field selectors of `query`) a watch sends.
fn watch_filter(t: Target, query: &str) -> impl Fn(&WatchEvent) -> bool + Send + 'static {
    let labels = param(query, "labelSelector").unwrap_or_default();
    let fields = param(query, "fieldSelector").unwrap_or_default();
    let (resource, namespace) = (t.resource, t.namespace);
    move |ev: &WatchEvent| {
        ev.resource == resource
            && labels_match(&labels, &ev.object)
            && fields_match(&fields, &ev.object)
            && namespace
                .as_ref()
                .is_none_or(|n| ev.object["metadata"]["namespace"].as_str() == Some(n))
    }
}

/// One watch's sender: the backlog, then live events and bookmarks until the client goes,
/// the events lag, the watches are cut (`watch_generation`) or the timeout ends it.
struct WatchStream {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Bytes>,
    live: broadcast::Receiver<WatchEvent>,
    generation: tokio::sync::watch::Receiver<u64>,
}

impl WatchStream {
    async fn run(
        mut self,
        req: WatchRequest,
        backlog: Vec<WatchEvent>,
        matches: impl Fn(&WatchEvent) -> bool,
    ) {
        let mut last = req.from;
        for ev in backlog {
            last = ev.rv;
            if self.tx.send(watch_line(ev.kind, &ev.object)).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        let end = tokio::time::sleep(req.ends.unwrap_or(Duration::from_secs(86_400)));
        tokio::pin!(end);
        loop {
            tokio::select! {
                ev = self.live.recv() => match ev {
                    Ok(ev) if ev.rv > last && matches(&ev) => {
                        last = ev.rv;
                        if self.tx.send(watch_line(ev.kind, &ev.object)).await.is_err() { return; }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if req.bookmarks => {
                    if self.tx.send(self.bookmark(req.resource)).await.is_err() { return; }
                }
                _ = self.generation.changed() => return,
                _ = &mut end, if req.ends.is_some() => return,
            }
        }
    }

    fn bookmark(&self, resource: Resource) -> Bytes {
        let rv = self.shared.state().rv;
        let bm = json!({"kind": resource.kind, "apiVersion": resource.api_version(),
            "metadata": {"resourceVersion": rv.to_string()}});
        watch_line("BOOKMARK", &bm)
    }
}

fn write(
    shared: &Shared,
    method: Method,
    path: String,
    query: String,
    content_type: String,
    body: Value,
) -> Response<Body> {
    let recorded = Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type,
        body: body.clone(),
    };
    shared.state().writes.push(recorded.clone());
    if path.ends_with("/events") && method == Method::POST {
        return full(StatusCode::CREATED, body);
    }
    let Some(t) = parse_path(&path) else {
        return not_found(&path);
    };
    let no_subresource = shared
        .state()
        .no_status_subresource
        .contains(t.resource.kind);
    if method == Method::PATCH && t.subresource.as_deref() == Some("status") && no_subresource {
        return not_found(&path);
    }
    if method == Method::PATCH && t.subresource.is_none() && t.name.is_some() {
        return patch_object(shared, t, &recorded.content_type, &body, no_subresource);
    }
    if method == Method::PATCH && t.subresource.as_deref() == Some("status") {
        let key = (t.namespace.unwrap_or_default(), t.name.unwrap_or_default());
        let manager = param(&query, "fieldManager").unwrap_or_default();
        let applied =
            shared
                .state()
                .apply_status(t.resource, &key, &manager, body["status"].clone());
        return match applied {
            Some(ev) => {
                let obj = ev.object.clone();
                shared.publish(ev);
                full(StatusCode::OK, obj)
            }
            None => not_found(&format!("{} {}/{}", t.resource.kind, key.0, key.1)),
        };
    }
    if t.resource.kind != "Lease" && t.subresource.is_none() {
        // Creation (POST on the collection) and deletion, as the CloudPrivateIPConfig flow
        // uses them.
        if method == Method::POST && t.name.is_none() {
            return create(shared, t.resource, body);
        }
        if method == Method::DELETE && t.name.is_some() {
            let (ns, name) = (t.namespace.unwrap_or_default(), t.name.unwrap_or_default());
            let ev = shared.state().request_delete(t.resource.kind, &ns, &name);
            return match ev {
                Some(ev) => {
                    let obj = ev.object.clone();
                    shared.publish(ev);
                    full(StatusCode::OK, obj)
                }
                None => not_found(&format!("{} {ns}/{name}", t.resource.kind)),
            };
        }
    }
    if t.resource.kind == "Lease" && t.subresource.is_none() {
        return super::lease::write(shared, method, t.namespace, t.name, body);
    }
    full(
        StatusCode::METHOD_NOT_ALLOWED,
        status(405, "MethodNotAllowed", format!("{method} {path}")),
    )
}

/// POST: a new object (`409` when the name is taken), without its status.
fn create(shared: &Shared, resource: super::store::Resource, mut body: Value) -> Response<Body> {
    let key = super::store::key_of(resource, &body);
    let mut state = shared.state();
    if state
        .objects
        .get(&resource)
        .is_some_and(|m| m.contains_key(&key))
    {
        return full(
            StatusCode::CONFLICT,
            status(
                409,
                "AlreadyExists",
                format!("{} {} exists", resource.kind, key.1),
            ),
        );
    }
    if let Some(o) = body.as_object_mut() {
        o.remove("status");
    }
    // A new uid per creation: a deleted then recreated object is another object.
    body["metadata"]["uid"] = json!(format!("uid-{}-{}-{}", resource.kind, key.1, state.rv + 1));
    let ev = state.put(body);
    drop(state);
    let obj = ev.object.clone();
    shared.publish(ev);
    full(StatusCode::CREATED, obj)
}

/// PATCH on an object: a JSON merge patch (what the agent sends for its Node's annotation), or
/// a server-side apply of `status` alone, honoured only when the kind has no status
/// subresource (with one, the API server ignores status written with the object).
fn patch_object(
    shared: &Shared,
    t: Target,
    content_type: &str,
    body: &Value,
    no_subresource: bool,
) -> Response<Body> {
    let key = (t.namespace.unwrap_or_default(), t.name.unwrap_or_default());
    let mut state = shared.state();
    let Some(mut obj) = state
        .objects
        .get(&t.resource)
        .and_then(|m| m.get(&key))
        .cloned()
    else {
        return not_found(&format!("{} {}/{}", t.resource.kind, key.0, key.1));
    };
    if content_type.starts_with("application/merge-patch+json") {
        super::store::merge_patch(&mut obj, body);
    } else if content_type.starts_with("application/apply-patch") {
        if no_subresource {
            obj["status"] = body["status"].clone();
        }
    } else {
        return full(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            status(415, "UnsupportedMediaType", content_type.to_string()),
        );
    }
    let ev = state.put(obj);
    drop(state);
    let obj = ev.object.clone();
    shared.publish(ev);
    full(StatusCode::OK, obj)
}
