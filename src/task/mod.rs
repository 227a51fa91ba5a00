//! Everything that runs beside the control loop is a [`Task`]: the listeners, the sources'
//! watches, the status writer, the DNS resolver and proxy, the EgressIP assigner, elector,
//! fence and host-cidrs publisher. One [`Runtime`] owns them: it logs every exit and panic by
//! name, restarts or fails readiness as the task's [`OnExit`] says, and stops them all in
//! reverse order of start within a deadline on SIGTERM.
//!
//! A task is a shell around a pure core (the fence's watchdog, the assigner's `assign`, the
//! prober's hysteresis): [`Task::start`] builds one run's future from the task's settings and
//! the [`Context`]; a restart calls it again.

mod runtime;

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

pub use runtime::{Runtime, Stopped};

/// One run of a task: `Ok` when it ended by itself, `Err` with the reason it could not go on.
pub type Run = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What the runtime does when a task ends while the agent is not stopping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnExit {
    /// Start it again after a backoff (1 s, doubling up to 30 s); `/readyz` is degraded from
    /// its exit until it has run for a backoff period again.
    Restart,
    /// It must run as long as the agent (the admin server, a listener that cannot be
    /// replaced): `/readyz` and `/healthz` fail, so the kubelet or systemd restarts the agent.
    Vital,
    /// Ending is its normal course; an error or a panic degrades `/readyz`.
    Finish,
}

/// Something that runs beside the control loop, supervised by the [`Runtime`].
pub trait Task: Send + 'static {
    /// Its name in logs, `/readyz` and metrics (`dns-proxy-udp-v4`, `egress-ip-fence`).
    fn name(&self) -> &str;

    fn on_exit(&self) -> OnExit {
        OnExit::Restart
    }

    /// One run. It should end soon after [`Context::stopping`]; one that does not is
    /// dropped at the shutdown deadline (cancelled at its next `.await`).
    fn start(&mut self, ctx: Context) -> Run;
}

/// What a running task gets from the runtime: the shutdown signal and its readiness line.
#[derive(Clone)]
pub struct Context {
    stop: watch::Receiver<bool>,
    name: String,
    health: std::sync::Arc<dyn Health>,
}

impl Context {
    /// Resolves once the runtime stops this task (at once if it already has).
    pub async fn stopping(&mut self) {
        let _ = self.stop.wait_for(|stop| *stop).await;
    }

    pub fn is_stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Runs `work` until it ends or the task is stopped (then `Ok`): for a loop that holds
    /// nothing that needs a goodbye.
    pub async fn until_stopped<F>(&mut self, work: F) -> Result<(), String>
    where
        F: Future<Output = Result<(), String>>,
    {
        tokio::select! {
            r = work => r,
            _ = self.stopping() => Ok(()),
        }
    }

    /// The task cannot do its work for now (a port taken, no descriptors): a `/readyz`
    /// error line under its name until [`Context::recovered`].
    pub fn degraded(&self, why: &str) {
        self.health.task_down(&self.name, why, false);
    }

    pub fn recovered(&self) {
        self.health.task_up(&self.name);
    }
}

/// Where the runtime reports tasks that are down (the admin server's `/readyz`, `/healthz`).
pub trait Health: Send + Sync + 'static {
    /// `name` is down for `why`; `vital`: the agent cannot go on without it.
    fn task_down(&self, name: &str, why: &str, vital: bool);
    fn task_up(&self, name: &str);
}

/// A task from a name, an exit policy and a closure that builds one run.
pub struct FnTask<F> {
    name: String,
    on_exit: OnExit,
    start: F,
}

/// `task("name", OnExit::Restart, move |ctx| async move { ... })`.
pub fn task<F, Fut>(name: impl Into<String>, on_exit: OnExit, start: F) -> FnTask<F>
where
    F: FnMut(Context) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    FnTask {
        name: name.into(),
        on_exit,
        start,
    }
}

impl<F, Fut> Task for FnTask<F>
where
    F: FnMut(Context) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn on_exit(&self) -> OnExit {
        self.on_exit
    }

    fn start(&mut self, ctx: Context) -> Run {
        Box::pin((self.start)(ctx))
    }
}

/// A task of one run of `work`, for work built from things that cannot be had twice (a
/// channel's receiver): stopped by dropping it at its next `.await`, and never restarted
/// (a second start fails at once).
pub fn once<F>(name: impl Into<String>, on_exit: OnExit, work: F) -> impl Task
where
    F: Future<Output = Result<(), String>> + Send + 'static,
{
    let mut work = Some(work);
    task(name, on_exit, move |mut ctx| {
        let work = work.take();
        async move {
            match work {
                Some(work) => ctx.until_stopped(work).await,
                None => Err("runs once: cannot be restarted".into()),
            }
        }
    })
}

/// A task that holds `value` until it is stopped, then drops it: for a resource whose
/// threads end when it is dropped (the nftables monitor), so that the runtime stops it in
/// order with the rest.
pub fn hold<T: Send + 'static>(name: impl Into<String>, value: T) -> impl Task {
    once(name, OnExit::Finish, async move {
        let _value = value;
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// Health for a runtime whose tasks nobody reports on (`--once`, tests): the runtime's log
/// lines are all there is.
pub struct LogsOnly;

impl Health for LogsOnly {
    fn task_down(&self, _: &str, _: &str, _: bool) {}
    fn task_up(&self, _: &str) {}
}
