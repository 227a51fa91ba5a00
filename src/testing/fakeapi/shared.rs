//! What every handler of the fake API server shares: the server state behind one lock, the
//! watch-event channel, and the JSON response helpers.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast, watch};

use super::store::{State, WatchEvent};

pub type Body = BoxBody<Bytes, Infallible>;

pub struct Shared {
    pub state: Mutex<State>,
    pub events: broadcast::Sender<WatchEvent>,
    /// Kinds whose list requests wait (to prove nothing is applied before every list).
    pub held: Mutex<BTreeSet<&'static str>>,
    pub released: Notify,
    /// Bumped to end every open watch stream (the API server closing watches).
    pub watch_generation: watch::Sender<u64>,
    /// Which connections are silently stalled.
    pub stalls: super::stall::Stalls,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            events: broadcast::channel(4096).0,
            held: Mutex::new(BTreeSet::new()),
            released: Notify::new(),
            watch_generation: watch::channel(0).0,
            stalls: super::stall::Stalls::default(),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn publish(&self, ev: WatchEvent) {
        let _ = self.events.send(ev);
    }
}

pub fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

pub fn status(code: u16, reason: &str, message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
}
