//! How the Kubernetes source is doing, for `/readyz`: degraded until every kind has synced and
//! while the API server does not answer. The agent keeps running (and the kernel keeps its
//! rules) either way; readiness only tells the operator that the view may be stale.

use std::sync::{Arc, Mutex};

use crate::snapshot::Kind;

#[derive(Debug, Clone)]
pub struct SourceHealth {
    inner: Arc<Mutex<State>>,
    /// Bumped whenever the API server answers again after failing: watches waiting in
    /// backoff retry at once instead of sleeping on.
    recovered: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for SourceHealth {
    fn default() -> Self {
        SourceHealth {
            inner: Arc::default(),
            recovered: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Kinds whose first list has not completed (None before the source started).
    unsynced: Option<Vec<Kind>>,
    /// Why the API server is not reachable, if it is not.
    api_error: Option<String>,
}

impl SourceHealth {
    pub fn set_unsynced(&self, kinds: Vec<Kind>) {
        self.lock().unsynced = Some(kinds);
    }

    pub fn set_api_error(&self, error: Option<String>) {
        let was_down = std::mem::replace(&mut self.lock().api_error, error.clone()).is_some();
        if was_down && error.is_none() {
            self.recovered.send_modify(|n| *n += 1);
        }
    }

    /// Changes when the API server recovers (see `set_api_error`).
    pub fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recovered.subscribe()
    }

    /// Ok when synced and reachable, else the reason.
    pub fn check(&self) -> Result<(), String> {
        let s = self.lock();
        match (&s.unsynced, &s.api_error) {
            (None, _) => Err("Kubernetes source not started".into()),
            (Some(k), _) if !k.is_empty() => {
                let names: Vec<&str> = k.iter().map(|k| k.as_str()).collect();
                Err(format!(
                    "waiting for the first list of {}",
                    names.join(", ")
                ))
            }
            (_, Some(e)) => Err(format!("API server unreachable: {e}")),
            _ => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}
