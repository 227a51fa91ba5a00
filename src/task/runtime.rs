//! The supervisor of every [`Task`]: one tokio task per supervised task, which starts runs,
//! reads how they ended (returned, failed, panicked) and acts on the task's [`OnExit`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{Context, Health, OnExit, Task};

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// What the tasks still running get once the shutdown deadline has passed.
const LAST_GRACE: Duration = Duration::from_millis(50);

/// Owns the running tasks; [`Runtime::shutdown`] stops them.
pub struct Runtime {
    health: Arc<dyn Health>,
    tasks: Vec<Supervised>,
}

struct Supervised {
    name: String,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

/// How a shutdown went.
#[derive(Debug)]
pub struct Stopped {
    pub total: usize,
    /// Tasks that ended by themselves before the deadline.
    pub in_time: usize,
    /// Tasks dropped at the deadline, by name.
    pub dropped: Vec<String>,
    pub took: Duration,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped {} of {} tasks in {} ms",
            self.in_time,
            self.total,
            self.took.as_millis()
        )?;
        if !self.dropped.is_empty() {
            write!(f, " (dropped at the deadline: {})", self.dropped.join(", "))?;
        }
        Ok(())
    }
}

impl Runtime {
    pub fn new(health: Arc<dyn Health>) -> Runtime {
        Runtime {
            health,
            tasks: Vec::new(),
        }
    }

    /// Starts `task` on the current tokio runtime.
    pub fn add(&mut self, task: impl Task) {
        self.add_boxed(Box::new(task));
    }

    pub fn add_boxed(&mut self, task: Box<dyn Task>) {
        let (stop, rx) = watch::channel(false);
        let name = task.name().to_string();
        let ctx = Context {
            stop: rx,
            name: name.clone(),
            health: self.health.clone(),
        };
        let handle = tokio::spawn(supervise(task, ctx));
        self.tasks.push(Supervised { name, stop, handle });
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stops the tasks one by one, the last started first (a listener before what feeds
    /// it), each given what is left of `deadline`; past it, the rest are signalled at once
    /// and dropped if they have not ended after a short grace.
    pub async fn shutdown(self, deadline: Duration) -> Stopped {
        let start = Instant::now();
        let until = start + deadline;
        let total = self.tasks.len();
        let mut in_time = 0;
        let mut late = Vec::new();
        for mut task in self.tasks.into_iter().rev() {
            let _ = task.stop.send(true);
            if Instant::now() < until
                && tokio::time::timeout_at(until, &mut task.handle)
                    .await
                    .is_ok()
            {
                in_time += 1;
            } else {
                late.push(task);
            }
        }
        let grace = Instant::now() + LAST_GRACE;
        let mut dropped = Vec::new();
        for mut task in late {
            if tokio::time::timeout_at(grace, &mut task.handle)
                .await
                .is_ok()
            {
                in_time += 1;
            } else {
                task.handle.abort();
                warn!("task {} did not stop in time: dropped", task.name);
                dropped.push(task.name);
            }
        }
        Stopped {
            total,
            in_time,
            dropped,
            took: start.elapsed(),
        }
    }
}

/// A run's tokio task, aborted when the supervisor is dropped (shutdown deadline), so that
/// no run outlives its supervisor.
struct OwnedRun(JoinHandle<Result<(), String>>);

impl Drop for OwnedRun {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn supervise(mut task: Box<dyn Task>, ctx: Context) {
    let name = ctx.name.clone();
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let mut run = OwnedRun(tokio::spawn(task.start(ctx.clone())));
        let outcome = (&mut run.0).await;
        if ctx.is_stopping() {
            return;
        }
        let why = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) if e.is_panic() => Some(format!("panicked: {}", panic_text(e.into_panic()))),
            Err(e) => Some(e.to_string()),
        };
        match (task.on_exit(), why) {
            (OnExit::Finish, None) => {
                info!("task {name} finished");
                return;
            }
            (OnExit::Finish, Some(why)) => {
                error!("task {name} failed: {why}");
                ctx.health.task_down(&name, &why, false);
                return;
            }
            (OnExit::Vital, why) => {
                let why = why.unwrap_or_else(|| "ended".into());
                error!("task {name} stopped: {why}; the agent cannot work without it");
                ctx.health.task_down(&name, &why, true);
                return;
            }
            (OnExit::Restart, why) => {
                if started.elapsed() > MAX_BACKOFF {
                    backoff = FIRST_BACKOFF;
                }
                let why = why.unwrap_or_else(|| "ended".into());
                error!("task {name} stopped: {why}; restarting in {backoff:?}");
                ctx.health.task_down(&name, &why, false);
                let mut stop = ctx.clone();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.stopping() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                ctx.health.task_up(&name);
            }
        }
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::task::task;

    /// Records what the runtime reports: name → (why, vital).
    #[derive(Default)]
    struct Recorded(Mutex<BTreeMap<String, (String, bool)>>);

    impl Health for Recorded {
        fn task_down(&self, name: &str, why: &str, vital: bool) {
            let mut down = self.0.lock().unwrap();
            down.insert(name.into(), (why.into(), vital));
        }
        fn task_up(&self, name: &str) {
            self.0.lock().unwrap().remove(name);
        }
    }

    impl Recorded {
        fn get(&self, name: &str) -> Option<(String, bool)> {
            self.0.lock().unwrap().get(name).cloned()
        }
    }

    async fn until(mut check: impl FnMut() -> bool) {
        for _ in 0..2500 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported_by_name_and_fails_readiness() {
        let health = Arc::new(Recorded::default());
        let mut rt = Runtime::new(health.clone());
        rt.add(task("explodes", OnExit::Finish, |_ctx| async {
            panic!("boom at the listener")
        }));
        rt.add(task("steady", OnExit::Finish, |mut ctx| async move {
            ctx.stopping().await;
            Ok(())
        }));
        until(|| health.get("explodes").is_some()).await;
        let (why, vital) = health.get("explodes").unwrap();
        assert!(why.contains("panicked: boom at the listener"), "{why}");
        assert!(!vital);
        assert_eq!(health.get("steady"), None);
        let stopped = rt.shutdown(Duration::from_secs(1)).await;
        assert_eq!((stopped.total, stopped.in_time), (2, 2), "{stopped}");
    }

    #[tokio::test]
    async fn a_vital_task_that_ends_fails_liveness() {
        let health = Arc::new(Recorded::default());
        let mut rt = Runtime::new(health.clone());
        rt.add(task("admin-server", OnExit::Vital, |_ctx| async {
            Err("accept: Too many open files".to_string())
        }));
        until(|| health.get("admin-server").is_some()).await;
        assert_eq!(
            health.get("admin-server"),
            Some(("accept: Too many open files".into(), true))
        );
    }

    #[tokio::test]
    async fn a_restarting_task_runs_again_after_a_backoff_and_is_ready_again() {
        let health = Arc::new(Recorded::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let mut rt = Runtime::new(health.clone());
        rt.add(task("flaky", OnExit::Restart, move |mut ctx| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if run == 0 {
                    return Err("first run fails".into());
                }
                ctx.stopping().await;
                Ok(())
            }
        }));
        until(|| health.get("flaky").is_some()).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::sleep(FIRST_BACKOFF).await;
        until(|| runs.load(Ordering::SeqCst) == 2).await;
        assert_eq!(health.get("flaky"), None, "ready again once restarted");
        let stopped = rt.shutdown(Duration::from_secs(1)).await;
        assert_eq!(stopped.in_time, 1, "{stopped}");
    }

    #[tokio::test]
    async fn shutdown_stops_every_task_in_reverse_order_within_the_deadline() {
        let health = Arc::new(Recorded::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut rt = Runtime::new(health);
        // One that ignores the signal, started first so stopped last: dropped at the deadline,
        // its run aborted.
        let dropped = Arc::new(AtomicUsize::new(0));
        struct CountsDrop(Arc<AtomicUsize>);
        impl Drop for CountsDrop {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let guard = dropped.clone();
        rt.add(task("deaf", OnExit::Restart, move |_ctx| {
            let guard = CountsDrop(guard.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok(())
            }
        }));
        for i in 0..10 {
            let order = order.clone();
            rt.add(task(format!("t{i}"), OnExit::Restart, move |mut ctx| {
                let order = order.clone();
                async move {
                    ctx.stopping().await;
                    order.lock().unwrap().push(i);
                    Ok(())
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let deadline = Duration::from_millis(300);
        let stopped = rt.shutdown(deadline).await;
        assert_eq!(stopped.total, 11);
        assert_eq!(stopped.in_time, 10, "{stopped}");
        assert_eq!(stopped.dropped, vec!["deaf".to_string()]);
        assert!(
            stopped.took < deadline + Duration::from_millis(200),
            "{stopped}"
        );
        assert_eq!(*order.lock().unwrap(), (0..10).rev().collect::<Vec<_>>());
        until(|| dropped.load(Ordering::SeqCst) == 1).await;
    }
}
