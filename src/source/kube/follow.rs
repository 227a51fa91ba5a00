//! Following one kind: list (paginated), then watch from the list's resourceVersion, re-watch
//! from the last resourceVersion seen (event or bookmark) whenever a watch ends, relist only on
//! `410 Gone`. Our own loop rather than kube-runtime's `watcher` because readiness needs to
//! know when a kind last heard from the API server, bookmarks and clean ends of a watch
//! included, and `watcher` swallows both.
//!
//! A silent partition (packets dropped, or a server or middlebox that keeps the connection
//! open and sends nothing) never ends a watch by itself. Three things bound it:
//! - every watch asks the server to end it after `timeoutSeconds` ([`Liveness::watch`],
//!   jittered down by up to a fifth so that thousands of nodes do not re-watch in step); a
//!   healthy quiet watch therefore ends cleanly at least that often;
//! - a watch (or its start) that brings nothing for [`Liveness::idle`] (the timeout plus a
//!   margin) is dropped and re-watched on a new connection;
//! - the client's read timeout and TCP keepalive ([`super::client`]) cover lists and writes.
//!
//! A re-watch resumes from the last resourceVersion and is served from the API server's watch
//! cache: no list, no etcd read. Each kind costs one watch request per timeout.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::core::Status;
use tokio::sync::mpsc;

use super::decode::{decode, decode_dynamic};
use super::kinds::watch_config;
use super::{Msg, SourceHealth};
use crate::snapshot::Kind;
use crate::source::kube::store::Update;
use crate::timing::Backoff;

/// The timings that decide how fast a dead API connection is noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Server-side watch timeout (`timeoutSeconds`): the longest a healthy watch stays quiet.
    pub watch: Duration,
}

/// Slack for a watch to end after its `timeoutSeconds` (the server rounds and writes the end
/// of the response after the deadline) before it is taken for dead.
const IDLE_MARGIN: Duration = Duration::from_secs(5);
/// Slack before a kind counts as stale for `/readyz`: smaller than `IDLE_MARGIN`, so readiness
/// says "no data" before the connection is dropped, as it is then true.
const STALE_MARGIN: Duration = Duration::from_secs(2);

impl Liveness {
    pub fn new(watch: Duration) -> Liveness {
        Liveness {
            watch: watch.max(Duration::from_secs(1)),
        }
    }

    /// A watch (or the start of one, or a response) silent this long is dead.
    pub fn idle(&self) -> Duration {
        self.watch + IDLE_MARGIN
    }

    /// A synced kind that heard nothing for this long makes `/readyz` fail.
    pub fn stale(&self) -> Duration {
        self.watch + STALE_MARGIN
    }

    /// `timeoutSeconds` of one watch request: the configured timeout minus up to a fifth.
    fn jittered(&self) -> u32 {
        let secs = self.watch.as_secs().max(1);
        let spread = secs / 5;
        let r = RandomState::new().hash_one(std::time::SystemTime::now());
        u32::try_from(secs - r % (spread + 1)).unwrap_or(u32::MAX)
    }
}

/// Why a list or watch of a kind did not go on.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("list failed: {0}")]
    List(kube::Error),
    #[error("watch failed: {0}")]
    Watch(kube::Error),
    #[error("watch error from the API server: {}", .0.message)]
    Status(Box<Status>),
    #[error("resourceVersion too old (410 Gone), relisting")]
    Gone,
    #[error("no data for {}s (stalled connection?), reconnecting", .0.as_secs())]
    Stalled(Duration),
}

impl Failure {
    /// The kind's API is not served (CRD not installed).
    pub fn is_not_served(&self) -> bool {
        matches!(self, Failure::List(kube::Error::Api(s)) if s.code == 404)
    }
}

/// 250 ms doubling to 8 s between retries of one watch: a dead API server is not hammered,
/// and a recovered one is noticed by the probe, which cuts the wait short.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);

/// Follows `kind` until the store goes away.
pub async fn follow(
    api: Api<DynamicObject>,
    kind: Kind,
    liveness: Liveness,
    tx: mpsc::UnboundedSender<Msg>,
    health: SourceHealth,
) {
    let config = watch_config(kind);
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    let mut recovered = health.recoveries();
    let mut version: Option<String> = None;
    loop {
        let failure = match version.take() {
            None => match list(&api, kind, &config, liveness, &tx).await {
                Ok(Some(rv)) => {
                    health.heard_from(kind);
                    backoff.reset();
                    version = Some(rv);
                    continue;
                }
                Ok(None) => return,
                Err(f) => f,
            },
            Some(rv) => {
                let (rv, ended) = watch(&api, kind, &config, liveness, rv, &tx, &health).await;
                version = rv;
                match ended {
                    Ended::Closed => {
                        backoff.reset();
                        continue;
                    }
                    Ended::Stopped => return,
                    Ended::Failed(f) => f,
                }
            }
        };
        if failure.is_not_served() {
            // An answer about this kind: there is nothing to watch, and that is fresh news.
            health.heard_from(kind);
        }
        let gone = matches!(failure, Failure::Gone);
        if tx.send(Msg::Error(kind, failure)).is_err() {
            return;
        }
        if gone {
            // Relist at once, as the API server asked.
            continue;
        }
        // Back off, but retry as soon as the API server is known to answer again.
        let delay = backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = recovered.changed() => backoff.reset(),
        }
    }
}

/// Lists `kind` page by page into the store; the list's resourceVersion, or `None` when the
/// store is gone.
async fn list(
    api: &Api<DynamicObject>,
    kind: Kind,
    config: &kube::runtime::watcher::Config,
    liveness: Liveness,
    tx: &mpsc::UnboundedSender<Msg>,
) -> Result<Option<String>, Failure> {
    if tx.send(Msg::Update(Update::Init(kind))).is_err() {
        return Ok(None);
    }
    let mut params = ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        limit: config.page_size,
        ..ListParams::default()
    };
    // The next page is asked for as soon as a page arrives, and fetched while this one is
    // decoded: the server's and the network's time overlap the agent's.
    let fetch = |params: ListParams| {
        let client = api.clone().into_client();
        let request = kube::core::Request::new(api.resource_url()).list(&params);
        Prefetch(tokio::spawn(async move {
            let mut request = request.map_err(|e| Failure::List(kube::Error::BuildRequest(e)))?;
            request.extensions_mut().insert("list");
            match tokio::time::timeout(liveness.idle(), client.request_text(request)).await {
                Err(_) => Err(Failure::Stalled(liveness.idle())),
                Ok(page) => page.map_err(Failure::List),
            }
        }))
    };
    let mut next = fetch(params.clone());
    loop {
        let text = (&mut next.0).await.map_err(|e| {
            Failure::Status(Box::new(Status::failure(
                &format!("list task: {e}"),
                "InternalError",
            )))
        })??;
        // Only split into the items' texts here; each item is decoded on its own.
        let page: Page =
            serde_json::from_str(&text).map_err(|e| Failure::List(kube::Error::SerdeError(e)))?;
        let token = page.metadata.continue_.filter(|c| !c.is_empty());
        if let Some(token) = &token {
            params.continue_token = Some(token.clone());
            next = fetch(params.clone());
        }
        for item in page.items {
            let msg = match decode(kind, item.get()) {
                Ok(o) => Msg::Update(Update::InitApply(o)),
                Err(r) => Msg::Rejected(r),
            };
            if tx.send(msg).is_err() {
                return Ok(None);
            }
        }
        match token {
            Some(_) => {}
            None => {
                let Some(rv) = page.metadata.resource_version.filter(|v| !v.is_empty()) else {
                    return Err(Failure::Status(Box::new(Status::failure(
                        "list without resourceVersion",
                        "NoResourceVersion",
                    ))));
                };
                if tx.send(Msg::Update(Update::InitDone(kind))).is_err() {
                    return Ok(None);
                }
                return Ok(Some(rv));
            }
        }
    }
}

/// One list page, its items still JSON text borrowed from the response.
#[derive(serde::Deserialize)]
struct Page<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Vec<&'a serde_json::value::RawValue>,
}

/// A page being fetched; dropped (the list failed or the store is gone), it is cancelled.
struct Prefetch<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How one watch ended.
enum Ended {
    /// The server ended it (its timeout): re-watch at once.
    Closed,
    /// The store is gone.
    Stopped,
    Failed(Failure),
}

/// One watch request from `rv`; returns the resourceVersion to resume from (`None`: relist)
/// and how it ended.
async fn watch(
    api: &Api<DynamicObject>,
    kind: Kind,
    config: &kube::runtime::watcher::Config,
    liveness: Liveness,
    mut rv: String,
    tx: &mpsc::UnboundedSender<Msg>,
    health: &SourceHealth,
) -> (Option<String>, Ended) {
    let params = WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: Some(liveness.jittered()),
        bookmarks: true,
        ..WatchParams::default()
    };
    let idle = liveness.idle();
    let stream = match tokio::time::timeout(idle, api.watch(&params, &rv)).await {
        Err(_) => return (Some(rv), Ended::Failed(Failure::Stalled(idle))),
        Ok(Err(kube::Error::Api(s))) if s.code == 410 => {
            return (None, Ended::Failed(Failure::Gone));
        }
        Ok(Err(e)) => return (Some(rv), Ended::Failed(Failure::Watch(e))),
        Ok(Ok(stream)) => stream,
    };
    health.heard_from(kind);
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return (Some(rv), Ended::Failed(Failure::Stalled(idle))),
            Ok(None) => {
                health.heard_from(kind);
                return (Some(rv), Ended::Closed);
            }
            Ok(Some(Err(e))) => return (Some(rv), Ended::Failed(Failure::Watch(e))),
            Ok(Some(Ok(event))) => event,
        };
        health.heard_from(kind);
        let msg = match event {
            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                advance(&mut rv, &obj);
                match decode_dynamic(kind, obj) {
                    Ok(o) => Msg::Update(Update::Apply(o)),
                    Err(r) => Msg::Rejected(r),
                }
            }
            WatchEvent::Deleted(obj) => {
                advance(&mut rv, &obj);
                Msg::Update(Update::Delete(kind, super::decode::key_of(kind, &obj)))
            }
            WatchEvent::Bookmark(b) => {
                if !b.metadata.resource_version.is_empty() {
                    rv = b.metadata.resource_version;
                }
                continue;
            }
            WatchEvent::Error(s) if s.code == 410 => return (None, Ended::Failed(Failure::Gone)),
            WatchEvent::Error(s) => return (Some(rv), Ended::Failed(Failure::Status(s))),
        };
        if tx.send(msg).is_err() {
            return (Some(rv), Ended::Stopped);
        }
    }
}

fn advance(rv: &mut String, obj: &DynamicObject) {
    if let Some(v) = obj
        .metadata
        .resource_version
        .as_ref()
        .filter(|v| !v.is_empty())
    {
        rv.clone_from(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timings_notice_a_dead_watch_within_thirty_seconds() {
        let l = Liveness::new(crate::config::DEFAULT_API_WATCH_TIMEOUT);
        assert!(l.idle() <= Duration::from_secs(30), "{l:?}");
        assert!(l.stale() < l.idle());
        for _ in 0..100 {
            let t = l.jittered();
            assert!((20..=25).contains(&t), "{t}");
        }
        assert_eq!(Liveness::new(Duration::ZERO).jittered(), 1);
    }
}
