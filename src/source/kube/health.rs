//! How the Kubernetes source is doing, for `/readyz`: degraded until every kind has synced and
//! while the API server does not answer. The agent keeps running (and the kernel keeps its
//! rules) either way; readiness only tells the operator that the view may be stale.

use std::sync::{Arc, Mutex};

use crate::snapshot::Kind;

#[derive(Debug, Clone, Default)]
pub struct SourceHealth {
    inner: Arc<Mutex<State>>,
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
        self.lock().api_error = error;
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
