//! Watches a manifest directory and signals, debounced, that it should be reloaded.
//!
//! Editors and `kubectl cp` write a file in several steps, and a ConfigMap volume update swaps a
//! whole directory; reloading on every raw event would re-plan several times for one change. So
//! events are coalesced: a notification is sent once the directory has been quiet for the
//! debounce interval, and at the latest four intervals after the first event of a burst, so a
//! directory that never goes quiet is still re-planned promptly.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind, Flag};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};
use thiserror::Error;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::timing::Debounce;

/// Short enough that a change is re-planned well within a second.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);

/// How often the watcher thread checks that someone still listens while nothing happens.
const IDLE_CHECK: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum WatchError {
    #[error("cannot watch {}: {source}", path.display())]
    Notify {
        path: PathBuf,
        source: notify::Error,
    },
    #[error("cannot start the watcher thread: {0}")]
    Thread(std::io::Error),
}

/// Watches `dir` recursively with [`DEFAULT_DEBOUNCE`]. See [`watch_dir_with`].
pub fn watch_dir(dir: &Path) -> Result<mpsc::Receiver<()>, WatchError> {
    watch_dir_with(dir, DEFAULT_DEBOUNCE)
}

/// Watches `dir` recursively; the receiver yields `()` after each burst of changes. At most one
/// notification is pending at a time (the channel holds one), since a reload looks at every
/// file anyway (and parses those that changed). Start watching before the initial load so that no change falls in between.
///
/// The watch runs on its own thread (no tokio runtime needed to call this) and stops when the
/// receiver is dropped.
pub fn watch_dir_with(dir: &Path, debounce: Duration) -> Result<mpsc::Receiver<()>, WatchError> {
    let (raw_tx, raw_rx) = std_mpsc::channel();
    let notify_err = |source| WatchError::Notify {
        path: dir.to_path_buf(),
        source,
    };
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
        // Fails only once the thread below is gone; nothing left to tell then.
        let _ = raw_tx.send(res);
    })
    .map_err(notify_err)?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .map_err(notify_err)?;

    let (tx, rx) = mpsc::channel(1);
    let path = dir.to_path_buf();
    thread::Builder::new()
        .name("manifest-watch".into())
        .spawn(move || debounce_loop(watcher, raw_rx, tx, debounce, &path))
        .map_err(WatchError::Thread)?;
    Ok(rx)
}

/// Owns the watcher so that it lives exactly as long as someone listens.
fn debounce_loop(
    _watcher: RecommendedWatcher,
    raw: std_mpsc::Receiver<notify::Result<Event>>,
    tx: mpsc::Sender<()>,
    debounce: Duration,
    path: &Path,
) {
    let bursts = Debounce {
        quiet: debounce,
        max: debounce * 4,
    };
    loop {
        // Wait for the first relevant event of a burst.
        match raw.recv_timeout(IDLE_CHECK) {
            Ok(res) if is_relevant(&res, path) => {}
            Ok(_) => continue,
            Err(std_mpsc::RecvTimeoutError::Timeout) if tx.is_closed() => return,
            Err(std_mpsc::RecvTimeoutError::Timeout) => continue,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let mut burst = bursts.start(Instant::now());
        while let Some(wait) = burst.deadline().checked_duration_since(Instant::now()) {
            match raw.recv_timeout(wait) {
                Ok(res) if is_relevant(&res, path) => burst.event(Instant::now()),
                Ok(_) => {}
                Err(std_mpsc::RecvTimeoutError::Timeout) => break,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        match tx.try_send(()) {
            // Full: a notification is already pending and covers this burst too.
            Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {
                debug!(path = %path.display(), "manifests changed")
            }
            Err(mpsc::error::TrySendError::Closed(())) => return,
        }
    }
}

/// Opening or reading a file is not a change, and the loader itself opens every file: without
/// this filter each reload would trigger the next one.
fn is_relevant(res: &notify::Result<Event>, path: &Path) -> bool {
    match res {
        Err(e) => {
            // Events may have been lost; a reload re-reads everything, so it is the safe answer.
            warn!(path = %path.display(), error = %e, "manifest watch error, reloading");
            true
        }
        Ok(event) if event.flag() == Some(Flag::Rescan) => true,
        Ok(event) => match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => false,
            _ => true,
        },
    }
}
