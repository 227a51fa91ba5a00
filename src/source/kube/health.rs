//! How the Kubernetes source is doing, for `/readyz`: degraded until every kind has synced,
//! while the API server does not answer, and while a synced kind has heard nothing from the
//! API server (no event, bookmark or end of watch) for longer than a healthy watch stays quiet
//! (a silently stalled connection). The agent keeps running (and the kernel keeps its rules)
//! either way; readiness only tells the operator that the view may be stale.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// When each kind last heard from the API server.
    heard: BTreeMap<Kind, Instant>,
    /// A kind silent for longer is stale (None: never).
    stale_after: Option<Duration>,
}

impl SourceHealth {
    pub fn set_unsynced(&self, kinds: Vec<Kind>) {
        self.lock().unsynced = Some(kinds);
    }

    /// `kind`'s list or watch brought something (an event, a bookmark, a page, the end of a
    /// watch): the connection is alive.
    pub fn heard_from(&self, kind: Kind) {
        self.lock().heard.insert(kind, Instant::now());
    }

    pub fn set_stale_after(&self, after: Duration) {
        self.lock().stale_after = Some(after);
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

    /// Ok when synced, fresh and reachable, else every reason.
    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), String> {
        let s = self.lock();
        let Some(unsynced) = &s.unsynced else {
            return Err("Kubernetes source not started".into());
        };
        let mut reasons = Vec::new();
        if !unsynced.is_empty() {
            let names: Vec<&str> = unsynced.iter().map(|k| k.as_str()).collect();
            reasons.push(format!(
                "waiting for the first list of {}",
                names.join(", ")
            ));
        }
        if let Some(after) = s.stale_after {
            let stale: Vec<String> = Kind::ALL
                .iter()
                .filter(|k| !unsynced.contains(k))
                .filter_map(|k| {
                    let silent = now.saturating_duration_since(*s.heard.get(k)?);
                    (silent > after).then(|| format!("{k} {}s", silent.as_secs()))
                })
                .collect();
            if !stale.is_empty() {
                reasons.push(format!(
                    "watch stalled, no data from the API server for {} (expected within {}s; reconnecting)",
                    stale.join(", "),
                    after.as_secs()
                ));
            }
        }
        if let Some(e) = &s.api_error {
            reasons.push(format!("API server unreachable: {e}"));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_kind_is_stale_until_it_hears_again() {
        let h = SourceHealth::default();
        assert!(h.check().is_err());
        h.set_unsynced(vec![]);
        h.set_stale_after(Duration::from_secs(27));
        for kind in Kind::ALL {
            h.heard_from(*kind);
        }
        let now = Instant::now();
        assert_eq!(h.check_at(now), Ok(()));
        h.lock()
            .heard
            .insert(Kind::Pod, now - Duration::from_secs(40));
        let e = h.check_at(now).unwrap_err();
        assert!(
            e.contains("no data from the API server for Pod 40s") && !e.contains("Node"),
            "{e}"
        );
        h.set_api_error(Some("GET /version: no answer within 5s".into()));
        let e = h.check_at(now).unwrap_err();
        assert!(e.contains("Pod 40s") && e.contains("/version"), "{e}");
        h.set_api_error(None);
        h.heard_from(Kind::Pod);
        assert_eq!(h.check(), Ok(()));
    }
}
