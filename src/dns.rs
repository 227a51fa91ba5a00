//! Resolver cache for EgressFirewall `dnsName` rules.
//!
//! The planner never resolves anything: it reads a [`DnsAnswers`] value. This module keeps
//! that value fresh. Each name is resolved once (A and AAAA) however many namespaces use it,
//! re-resolved when the shortest TTL of its answer expires (TTL 0 -> 5 s, capped at 30 min),
//! and on failure keeps its last good addresses and retries with exponential backoff
//! (1 s .. 60 s). Names are lowercase (validation lowercases them).
//!
//! [`DnsCache`] is the clock-explicit core (tested with a fake [`Lookup`]); [`DnsService`]
//! runs it as a tokio task for the run loop, and [`resolve_once`] serves `--once`. Both
//! answer what the features ask ([`Answerer`]) before each plan: [`DnsService`] and
//! [`ResolveOnce`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

use crate::plan::{Answerer, Answers, Asks, DnsAnswers};
use crate::timing::Backoff;

/// Refresh interval for an answer with TTL 0.
pub const TTL_ZERO_REFRESH: Duration = Duration::from_secs(5);
/// Longest refresh interval, whatever the TTL.
pub const TTL_CAP: Duration = Duration::from_secs(30 * 60);
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// How long an empty answer (no A/AAAA records) is trusted.
pub const NEGATIVE_REFRESH: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("resolver config {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("{0}")]
    Runtime(String),
}

/// One resolution of a name: its A and AAAA addresses and the shortest TTL among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub addrs: Vec<IpAddr>,
    /// `None` when there were no records (the name exists without addresses, or not at all).
    pub ttl: Option<Duration>,
}

pub type LookupFuture<'a> = Pin<Box<dyn Future<Output = Result<Answer, String>> + Send + 'a>>;

/// Resolves one name (A and AAAA). Errors are transient failures (timeouts, SERVFAIL).
pub trait Lookup: Send + Sync {
    fn lookup<'a>(&'a self, name: &'a str) -> LookupFuture<'a>;
}

/// The refresh interval for an answer's shortest TTL.
pub fn refresh_after(ttl: Option<Duration>) -> Duration {
    match ttl {
        None => NEGATIVE_REFRESH,
        Some(t) if t.is_zero() => TTL_ZERO_REFRESH,
        Some(t) => t.min(TTL_CAP),
    }
}

/// The retry delay after `failures` consecutive failures (1 s, 2 s, 4 s .. 60 s).
pub fn backoff(failures: u32) -> Duration {
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX).delay_after(failures)
}

#[derive(Debug, Clone)]
struct Entry {
    /// Last good addresses; `None` until the first resolution attempt finished.
    addrs: Option<Vec<IpAddr>>,
    due: Instant,
    failures: u32,
}

/// The names in use and their last good answers.
pub struct DnsCache {
    lookup: Arc<dyn Lookup>,
    entries: BTreeMap<String, Entry>,
}

impl DnsCache {
    pub fn new(lookup: Arc<dyn Lookup>) -> DnsCache {
        DnsCache {
            lookup,
            entries: BTreeMap::new(),
        }
    }

    /// Sets the names in use: new ones are due now, unused ones are forgotten.
    pub fn set_names(&mut self, names: &BTreeSet<String>, now: Instant) {
        self.entries.retain(|n, _| names.contains(n));
        for name in names {
            self.entries.entry(name.clone()).or_insert(Entry {
                addrs: None,
                due: now,
                failures: 0,
            });
        }
    }

    /// Resolves every due name (concurrently); true if any name's addresses changed.
    pub async fn refresh_due(&mut self, now: Instant) -> bool {
        let due: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.due <= now)
            .map(|(n, _)| n.clone())
            .collect();
        let lookup = Arc::clone(&self.lookup);
        let results =
            futures::future::join_all(due.iter().map(|name| lookup.lookup(name.as_str()))).await;
        let mut changed = false;
        for (name, result) in due.iter().zip(results) {
            let entry = self.entries.get_mut(name).expect("due names are entries");
            match result {
                Ok(answer) => {
                    let mut addrs = answer.addrs;
                    addrs.sort();
                    addrs.dedup();
                    entry.failures = 0;
                    entry.due = now + refresh_after(answer.ttl);
                    if entry.addrs.as_ref() != Some(&addrs) {
                        info!(name = %name, addrs = ?addrs, "dnsName resolved");
                        changed = true;
                    }
                    entry.addrs = Some(addrs);
                }
                Err(e) => {
                    entry.failures += 1;
                    let wait = backoff(entry.failures);
                    entry.due = now + wait;
                    warn!(
                        "resolving {name} failed ({e}); keeping the last answer, retry in {}s",
                        wait.as_secs()
                    );
                    if entry.addrs.is_none() {
                        // Attempted: the planner may stop waiting for it.
                        entry.addrs = Some(Vec::new());
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    /// When the next name is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.due).min()
    }

    pub fn answers(&self) -> DnsAnswers {
        let mut out = DnsAnswers::default();
        for (name, e) in &self.entries {
            if let Some(addrs) = &e.addrs {
                out.insert(name, addrs.clone());
            }
        }
        out
    }
}

/// hickory-resolver with a resolv.conf file.
pub struct HickoryLookup {
    resolver: hickory_resolver::TokioResolver,
}

impl HickoryLookup {
    /// Reads `path` (resolv.conf syntax). Call inside a tokio runtime.
    pub fn from_resolv_conf(path: &Path) -> Result<HickoryLookup, DnsError> {
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let err = |reason: String| DnsError::Config {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let (config, options) = hickory_resolver::system_conf::parse_resolv_conf(text)
            .map_err(|e| err(e.to_string()))?;
        let mut builder = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioRuntimeProvider::default(),
        );
        *builder.options_mut() = options;
        // We schedule refreshes by TTL ourselves; the resolver's own cache must not serve a
        // stale answer past that point.
        builder.options_mut().cache_size = 0;
        let resolver = builder.build().map_err(|e| err(e.to_string()))?;
        Ok(HickoryLookup { resolver })
    }

    async fn resolve(&self, name: &str) -> Result<Answer, String> {
        use hickory_resolver::proto::rr::RecordType;
        // A trailing dot: the name is absolute, no search-domain expansion.
        let fqdn = format!("{name}.");
        let mut addrs = Vec::new();
        let mut ttl: Option<u32> = None;
        for rtype in [RecordType::A, RecordType::AAAA] {
            match self.resolver.lookup(fqdn.as_str(), rtype).await {
                Ok(lookup) => {
                    for record in lookup.answers() {
                        if let Some(ip) = record.data.ip_addr() {
                            addrs.push(ip);
                            ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                        }
                    }
                }
                Err(e) if e.is_no_records_found() => {}
                Err(e) => return Err(format!("{rtype} lookup: {e}")),
            }
        }
        debug!(name, ?addrs, ?ttl, "resolved");
        Ok(Answer {
            addrs,
            ttl: ttl.map(|t| Duration::from_secs(u64::from(t))),
        })
    }
}

impl Lookup for HickoryLookup {
    fn lookup<'a>(&'a self, name: &'a str) -> LookupFuture<'a> {
        Box::pin(self.resolve(name))
    }
}

/// A resolver that could not be set up: every lookup fails with the reason (so dnsName
/// rules match nothing while every other rule still works).
pub struct Unavailable(pub String);

impl Lookup for Unavailable {
    fn lookup<'a>(&'a self, _name: &'a str) -> LookupFuture<'a> {
        let e = self.0.clone();
        Box::pin(async move { Err(e) })
    }
}

/// Resolves `names` once (for `--once` and `--dry-run`), on a private runtime thread.
pub fn resolve_once(resolv_conf: &Path, names: &BTreeSet<String>) -> Result<DnsAnswers, DnsError> {
    if names.is_empty() {
        return Ok(DnsAnswers::default());
    }
    let path = resolv_conf.to_path_buf();
    let names = names.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DnsError::Runtime(e.to_string()))?;
        rt.block_on(async {
            let mut cache = DnsCache::new(Arc::new(HickoryLookup::from_resolv_conf(&path)?));
            cache.set_names(&names, Instant::now());
            cache.refresh_due(Instant::now()).await;
            Ok(cache.answers())
        })
    })
    .join()
    .map_err(|_| DnsError::Runtime("resolver thread panicked".into()))?
}

/// `--once`: resolves the names asked for once, with the resolver config at the path; a
/// failure is logged and the plan goes out without answers.
pub struct ResolveOnce(pub std::path::PathBuf);

impl Answerer for ResolveOnce {
    fn answer(&mut self, asks: &Asks) -> Answers {
        match resolve_once(&self.0, &asks.dns_names) {
            Ok(dns) => Answers { dns },
            Err(e) => {
                warn!("dnsName rules get no addresses: {e}");
                Answers::default()
            }
        }
    }
}

/// The resolver task of the run loop: the loop says which names it needs ([`want`]) and
/// reads the current [`answers`]; `on_change` is called whenever an answer changes.
///
/// [`want`]: DnsService::want
/// [`answers`]: DnsService::answers
pub struct DnsService {
    names: tokio::sync::watch::Sender<BTreeSet<String>>,
    answers: Arc<Mutex<DnsAnswers>>,
}

impl DnsService {
    /// The service and its resolver task.
    pub fn new(
        lookup: Arc<dyn Lookup>,
        on_change: impl Fn() + Send + 'static,
    ) -> (DnsService, impl crate::task::Task) {
        let (tx, mut rx) = tokio::sync::watch::channel(BTreeSet::new());
        let answers = Arc::new(Mutex::new(DnsAnswers::default()));
        let shared = Arc::clone(&answers);
        let resolve = async move {
            let mut cache = DnsCache::new(lookup);
            loop {
                let names = rx.borrow_and_update().clone();
                cache.set_names(&names, Instant::now());
                let changed = cache.refresh_due(Instant::now()).await;
                let now = cache.answers();
                let differs = {
                    let mut current = shared.lock().expect("dns answers lock");
                    let differs = *current != now;
                    *current = now;
                    differs
                };
                if changed || differs {
                    on_change();
                }
                let next = cache.next_due().unwrap_or_else(|| Instant::now() + TTL_CAP);
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => {}
                    r = rx.changed() => if r.is_err() { return Ok(()) },
                }
            }
        };
        let task = crate::task::once("dns-resolver", crate::task::OnExit::Finish, resolve);
        (DnsService { names: tx, answers }, task)
    }

    /// Declares the names in use (no-op if unchanged).
    pub fn want(&self, names: BTreeSet<String>) {
        self.names.send_if_modified(|current| {
            if *current == names {
                false
            } else {
                *current = names;
                true
            }
        });
    }

    pub fn answers(&self) -> DnsAnswers {
        self.answers.lock().expect("dns answers lock").clone()
    }

    /// Declares `names` and blocks (not on a runtime thread) until each was attempted once or
    /// `timeout` passes, so a first plan does not go out without answers it can have.
    pub fn want_and_wait(&self, names: &BTreeSet<String>, timeout: Duration) -> DnsAnswers {
        self.want(names.clone());
        let deadline = Instant::now() + timeout;
        loop {
            let answers = self.answers();
            if names.iter().all(|n| answers.contains(n)) || Instant::now() >= deadline {
                return answers;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How long a plan waits for the first answer of a newly used name.
pub const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(3);

/// Run mode: the names asked for are the ones the resolver keeps fresh; a plan waits up to
/// [`FIRST_ANSWER_WAIT`] for a new name's first answer.
impl Answerer for DnsService {
    fn answer(&mut self, asks: &Asks) -> Answers {
        Answers {
            dns: self.want_and_wait(&asks.dns_names, FIRST_ANSWER_WAIT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers from a table the test edits; a missing name fails.
    #[derive(Default)]
    struct Fake {
        table: Mutex<BTreeMap<String, Answer>>,
        calls: Mutex<Vec<String>>,
    }

    impl Lookup for Fake {
        fn lookup<'a>(&'a self, name: &'a str) -> LookupFuture<'a> {
            self.calls.lock().unwrap().push(name.to_string());
            let r = self
                .table
                .lock()
                .unwrap()
                .get(name)
                .cloned()
                .ok_or_else(|| "SERVFAIL".to_string());
            Box::pin(async move { r })
        }
    }

    fn answer(ips: &[&str], ttl: u64) -> Answer {
        Answer {
            addrs: ips.iter().map(|s| s.parse().unwrap()).collect(),
            ttl: Some(Duration::from_secs(ttl)),
        }
    }

    fn block<T>(f: impl Future<Output = T>) -> T {
        futures::executor::block_on(f)
    }

    #[test]
    fn refreshes_at_ttl_keeps_last_answer_on_failure_and_backs_off() {
        let fake = Arc::new(Fake::default());
        fake.table
            .lock()
            .unwrap()
            .insert("a.example".into(), answer(&["192.0.2.1"], 10));
        let mut cache = DnsCache::new(fake.clone());
        let t0 = Instant::now();
        cache.set_names(&BTreeSet::from(["a.example".to_string()]), t0);
        assert!(block(cache.refresh_due(t0)));
        assert_eq!(
            cache.answers().get("A.Example."),
            &["192.0.2.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(cache.next_due(), Some(t0 + Duration::from_secs(10)));
        // Not due yet: no lookup.
        assert!(!block(cache.refresh_due(t0 + Duration::from_secs(9))));
        assert_eq!(fake.calls.lock().unwrap().len(), 1);
        // The server goes away: the answer stays, retries back off 1 s, 2 s, 4 s.
        fake.table.lock().unwrap().clear();
        let mut t = t0 + Duration::from_secs(10);
        for wait in [1, 2, 4] {
            assert!(!block(cache.refresh_due(t)));
            assert_eq!(cache.answers().get("a.example").len(), 1);
            assert_eq!(cache.next_due(), Some(t + Duration::from_secs(wait)));
            t += Duration::from_secs(wait);
        }
        // Back with a new answer and TTL 0: changed, next refresh in 5 s.
        fake.table
            .lock()
            .unwrap()
            .insert("a.example".into(), answer(&["192.0.2.2", "2001:db8::2"], 0));
        assert!(block(cache.refresh_due(t)));
        assert_eq!(cache.answers().get("a.example").len(), 2);
        assert_eq!(cache.next_due(), Some(t + TTL_ZERO_REFRESH));
    }

    #[test]
    fn intervals_and_name_set() {
        assert_eq!(
            refresh_after(Some(Duration::from_secs(86400))),
            TTL_CAP,
            "capped"
        );
        assert_eq!(refresh_after(Some(Duration::ZERO)), TTL_ZERO_REFRESH);
        assert_eq!(backoff(1), BACKOFF_MIN);
        assert_eq!(backoff(40), BACKOFF_MAX);
        let fake = Arc::new(Fake::default());
        let mut cache = DnsCache::new(fake.clone());
        let now = Instant::now();
        cache.set_names(&BTreeSet::from(["x.test".to_string()]), now);
        // A name that never resolved is reported as attempted, with no addresses.
        assert!(block(cache.refresh_due(now)));
        assert!(cache.answers().contains("x.test"));
        assert!(cache.answers().get("x.test").is_empty());
        cache.set_names(&BTreeSet::new(), now);
        assert!(cache.answers().is_empty());
        assert_eq!(cache.next_due(), None);
    }
}
