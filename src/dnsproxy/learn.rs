//! The learned-set writer: the addresses of an answer's matching names go into their learned
//! sets with the record's TTL (between the floor and the cap) in one netlink batch, and the
//! proxy releases the answer only once the kernel acknowledged it.
//!
//! On the kernels we run (6.x), adding an element that exists (without `NLM_F_EXCL`) sets its
//! timeout *and* its expiry to the new value, shorter ones included (checked with `nft add
//! element` on 6.18: 10 s -> 100 s -> 5 s each took effect). So the writer remembers each
//! element's expiry and only writes when the answer extends it: a short TTL never cuts an
//! address learned from a longer one, and a burst of identical answers costs one write.
//!
//! Bounded: an answer teaches at most `per_name` addresses (its first ones); a set keeps at
//! most `per_name` addresses per queried name and a namespace at most `per_namespace` in
//! all its sets; beyond, the least recently answered are deleted from the kernel in the same
//! batch (counted). TTLs are capped, and a TTL with the top bit set counts as 0 (RFC 2181 §8).

use super::answer::Answer;
use crate::nft::engine::NftBackend;
use crate::nft::ir::{DataType, ElemValue, IpFamily, SetFlags, SetKind, Value};
use crate::nft::transaction::{Op, Transaction};
use crate::plan::firewall::learning::Learning;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An expiry is "extended" when it moves by at least this much (saves writes in bursts).
const SLACK: Duration = Duration::from_secs(1);
/// An element this close to its expiry may be gone from the kernel already: evicting it
/// only forgets it (a delete of a missing element would fail the whole batch).
const EXPIRY_MARGIN: Duration = Duration::from_secs(2);

/// How much is learned, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub floor_secs: u32,
    pub max_ttl_secs: u32,
    pub per_name: usize,
    pub per_namespace: usize,
}

impl Bounds {
    pub fn new(settings: &crate::config::DnsProxySettings) -> Bounds {
        Bounds {
            floor_secs: settings.min_ttl_secs.max(1),
            max_ttl_secs: settings.max_ttl_secs.max(settings.min_ttl_secs).max(1),
            per_name: settings.max_per_name.max(1),
            per_namespace: settings.max_per_namespace.max(1),
        }
    }

    /// The element timeout for a record's TTL.
    pub fn timeout(&self, ttl: u32) -> u32 {
        // RFC 2181 §8: a TTL with the most significant bit set is treated as zero.
        let ttl = if ttl & 0x8000_0000 != 0 { 0 } else { ttl };
        ttl.clamp(self.floor_secs, self.max_ttl_secs)
    }
}

/// A learned element: (set, address).
type Key = (Arc<str>, IpAddr);

struct Entry {
    expiry: Instant,
    /// Recency: higher = answered more recently.
    seq: u64,
    namespace: Arc<str>,
    /// The queried name that last taught it.
    name: Arc<str>,
    /// Whether the kernel has it (acknowledged), so evicting it takes a delete.
    in_kernel: bool,
}

pub struct Learner<B> {
    backend: B,
    table: String,
    bounds: Bounds,
    entries: HashMap<Key, Entry>,
    seq: u64,
    /// Per namespace, its entries by recency.
    by_namespace: HashMap<Arc<str>, BTreeMap<u64, Key>>,
    /// Per (set, queried name), its entries by recency.
    by_name: HashMap<(Arc<str>, Arc<str>), BTreeMap<u64, Key>>,
    /// The entries' expiries, soonest first: whether a keep-alive pass has anything to do.
    expiries: Expiries,
}

/// A multiset of instants (how many entries expire at each).
#[derive(Default)]
struct Expiries(BTreeMap<Instant, usize>);

impl Expiries {
    fn add(&mut self, at: Instant) {
        *self.0.entry(at).or_default() += 1;
    }

    fn remove(&mut self, at: Instant) {
        if let Some(n) = self.0.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&at);
            }
        }
    }

    /// The soonest expiry after `now`.
    fn next_after(&self, now: Instant) -> Option<Instant> {
        self.0
            .range((std::ops::Bound::Excluded(now), std::ops::Bound::Unbounded))
            .next()
            .map(|(at, _)| *at)
    }
}

/// What one batch changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Learned {
    /// Elements written (new or extended).
    pub written: usize,
    /// Elements deleted to stay within the caps.
    pub evicted: usize,
}

/// The elements one batch adds (with their timeout) and deletes.
#[derive(Default)]
struct Batch {
    add: BTreeMap<Key, u32>,
    delete: BTreeSet<Key>,
    evicted: usize,
}

impl<B: NftBackend> Learner<B> {
    pub fn new(backend: B, table: &str, bounds: Bounds) -> Learner<B> {
        Learner {
            backend,
            table: table.to_string(),
            bounds,
            entries: HashMap::new(),
            seq: 0,
            by_namespace: HashMap::new(),
            by_name: HashMap::new(),
            expiries: Expiries::default(),
        }
    }

    /// Writes the addresses `answer` gives for names `pod`'s namespace watches; returns once
    /// the kernel acknowledged (or refused) the batch.
    pub fn learn(
        &mut self,
        learning: &Learning,
        pod: IpAddr,
        answer: &Answer,
        now: Instant,
    ) -> anyhow::Result<Learned> {
        self.learn_all(learning, &[(pod, answer)], now)
    }

    /// [`Learner::learn`] for several answers in one batch (what queued up meanwhile). An
    /// address answered twice gets the longer of the two timeouts.
    pub fn learn_all(
        &mut self,
        learning: &Learning,
        answers: &[(IpAddr, &Answer)],
        now: Instant,
    ) -> anyhow::Result<Learned> {
        let mut batch = Batch::default();
        for &(pod, answer) in answers {
            let name: Arc<str> = answer.name.as_str().into();
            for target in learning.matching(pod, &answer.name) {
                for &(addr, ttl) in answer.addresses.iter().take(self.bounds.per_name) {
                    let secs = self.bounds.timeout(ttl);
                    let set: Arc<str> = target.set(IpFamily::of(addr)).into();
                    self.note(&mut batch, (set, addr), &target.namespace, &name, secs, now);
                }
            }
        }
        self.commit(batch)
    }

    /// Records that `key` was just answered with timeout `secs`; adds it to `batch` when that
    /// extends it, then enforces the caps of its name and namespace.
    fn note(
        &mut self,
        batch: &mut Batch,
        key: Key,
        namespace: &Arc<str>,
        name: &Arc<str>,
        secs: u32,
        now: Instant,
    ) {
        let expiry = now + Duration::from_secs(u64::from(secs));
        self.seq += 1;
        let seq = self.seq;
        let extends = match self.entries.get(&key) {
            Some(e) => e.expiry + SLACK < expiry,
            None => true,
        };
        let (expiry, in_kernel) = match self.entries.remove(&key) {
            Some(old) => {
                self.unindex(&key, &old);
                (old.expiry.max(expiry), old.in_kernel)
            }
            None => (expiry, false),
        };
        self.expiries.add(expiry);
        self.entries.insert(
            key.clone(),
            Entry {
                expiry,
                seq,
                namespace: namespace.clone(),
                name: name.clone(),
                in_kernel,
            },
        );
        self.by_namespace
            .entry(namespace.clone())
            .or_default()
            .insert(seq, key.clone());
        self.by_name
            .entry((key.0.clone(), name.clone()))
            .or_default()
            .insert(seq, key.clone());
        if extends {
            let have = batch.add.entry(key.clone()).or_insert(secs);
            *have = (*have).max(secs);
            batch.delete.remove(&key);
        }
        let name_key = (key.0.clone(), name.clone());
        while self.by_name.get(&name_key).map_or(0, BTreeMap::len) > self.bounds.per_name {
            self.evict_oldest(batch, |l| l.by_name.get_mut(&name_key), now);
        }
        while self.by_namespace.get(namespace).map_or(0, BTreeMap::len) > self.bounds.per_namespace
        {
            self.evict_oldest(batch, |l| l.by_namespace.get_mut(namespace), now);
        }
    }

    /// Evicts the first entry of the order `pick` selects.
    fn evict_oldest(
        &mut self,
        batch: &mut Batch,
        pick: impl FnOnce(&mut Self) -> Option<&mut BTreeMap<u64, Key>>,
        now: Instant,
    ) {
        let Some((_, key)) = pick(self).and_then(|o| o.pop_first()) else {
            return;
        };
        let Some(entry) = self.entries.remove(&key) else {
            return;
        };
        self.unindex(&key, &entry);
        batch.add.remove(&key);
        if entry.in_kernel && entry.expiry > now + EXPIRY_MARGIN {
            batch.delete.insert(key);
            batch.evicted += 1;
        }
    }

    fn unindex(&mut self, key: &Key, e: &Entry) {
        self.expiries.remove(e.expiry);
        if let Some(o) = self.by_namespace.get_mut(&e.namespace) {
            o.remove(&e.seq);
            if o.is_empty() {
                self.by_namespace.remove(&e.namespace);
            }
        }
        let name_key = (key.0.clone(), e.name.clone());
        if let Some(o) = self.by_name.get_mut(&name_key) {
            o.remove(&e.seq);
            if o.is_empty() {
                self.by_name.remove(&name_key);
            }
        }
    }

    /// Sends the batch; on success marks what it added as in the kernel. On failure the
    /// book is cleared (the kernel's view is unknown): the next answers write again, and
    /// what the kernel holds meanwhile expires with its (capped) TTL.
    fn commit(&mut self, batch: Batch) -> anyhow::Result<Learned> {
        if batch.add.is_empty() && batch.delete.is_empty() {
            return Ok(Learned::default());
        }
        let mut adds: BTreeMap<Arc<str>, crate::nft::ir::Set> = BTreeMap::new();
        for ((set, addr), secs) in &batch.add {
            adds.entry(set.clone())
                .or_insert_with(|| learned_set(set, IpFamily::of(*addr)))
                .elements
                .insert(
                    vec![Value::ip(*addr).into()],
                    ElemValue {
                        timeout: Some(*secs),
                        ..Default::default()
                    },
                );
        }
        let mut deletes: BTreeMap<Arc<str>, crate::nft::ir::Set> = BTreeMap::new();
        for (set, addr) in &batch.delete {
            deletes
                .entry(set.clone())
                .or_insert_with(|| learned_set(set, IpFamily::of(*addr)))
                .insert(vec![Value::ip(*addr).into()]);
        }
        let tx = Transaction {
            table: self.table.clone(),
            family: crate::nft::Family::Inet,
            ops: deletes
                .into_values()
                .map(Op::DeleteElements)
                .chain(adds.into_values().map(Op::AddElements))
                .collect(),
        };
        if let Err(e) = self.backend.apply(&tx) {
            self.forget_all();
            return Err(e.into());
        }
        for key in batch.add.keys() {
            if let Some(e) = self.entries.get_mut(key) {
                e.in_kernel = true;
            }
        }
        Ok(Learned {
            written: batch.add.len(),
            evicted: batch.evicted,
        })
    }

    fn forget_all(&mut self) {
        self.expiries = Expiries::default();
        self.entries.clear();
        self.by_namespace.clear();
        self.by_name.clear();
    }

    /// Extends the learned elements that would expire within `horizon` while conntrack
    /// still has a flow to them from a pod of a namespace that learns them (`flows`: original
    /// source and destination of the entries from steered pods), by `horizon` plus the floor.
    /// So an address a pod keeps using stays allowed for its new connections after its TTL.
    pub fn keep_alive(
        &mut self,
        learning: &Learning,
        flows: &BTreeSet<(IpAddr, IpAddr)>,
        horizon: Duration,
        now: Instant,
    ) -> anyhow::Result<Learned> {
        let secs = u32::try_from(horizon.as_secs())
            .unwrap_or(u32::MAX)
            .saturating_add(self.bounds.floor_secs);
        let expiry = now + Duration::from_secs(u64::from(secs));
        let mut batch = Batch::default();
        for &(pod, dst) in flows {
            let family = IpFamily::of(dst);
            for target in learning.targets(pod) {
                let key: Key = (target.set(family).into(), dst);
                let Some(entry) = self.entries.get_mut(&key) else {
                    continue;
                };
                if !entry.in_kernel || entry.expiry > now + horizon {
                    continue;
                }
                self.expiries.remove(entry.expiry);
                self.expiries.add(expiry);
                entry.expiry = expiry;
                batch.add.insert(key, secs);
            }
        }
        self.commit(batch)
    }

    /// Forgets what has expired (the kernel dropped it already); O(entries), so called from
    /// the periodic pass, not per answer.
    pub fn forget_expired(&mut self, now: Instant) {
        let expired: Vec<(Key, Entry)> = self.entries.extract_if(|_, e| e.expiry <= now).collect();
        for (key, e) in &expired {
            self.unindex(key, e);
        }
    }

    /// When the soonest remembered element that has not expired by `now` expires: a
    /// keep-alive pass before that instant minus its horizon has nothing to extend.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.expiries.next_after(now)
    }

    /// Elements remembered (all namespaces).
    pub fn remembered(&self) -> usize {
        self.entries.len()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

/// The declaration the element encoding needs (the planner declares the real set).
fn learned_set(name: &str, family: IpFamily) -> crate::nft::ir::Set {
    crate::nft::ir::Set::new(name, vec![DataType::addr(family)], SetKind::Set).with_flags(
        SetFlags {
            timeout: true,
            dynamic: true,
            ..Default::default()
        },
    )
}

#[cfg(test)]
use tests as tests_support;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::nft::FakeBackend;
    use crate::plan::firewall::learning;
    use crate::plan::{Memory, plan_with_dns};
    use crate::snapshot::Snapshot;
    use crate::testing::objects;

    pub(super) use crate::plan::firewall::Names;
    pub(super) const POD: &str = "10.128.0.5";

    /// A planned table in a fake kernel, and the learning view of the same plan.
    pub(super) fn planned(rules: &str) -> (FakeBackend, Learning) {
        let snap = Snapshot::builder()
            .with(objects::egress_firewall("web", rules).object())
            .with(objects::pod("web", "a").on("worker-1").ips(&[POD]).object())
            .with(
                objects::pod("web", "b")
                    .on("worker-2")
                    .ips(&["10.128.2.5"])
                    .object(),
            )
            .build();
        let d = plan_with_dns(
            &snap,
            &Config::for_node("worker-1"),
            &Memory::default(),
            &Default::default(),
        );
        let backend = FakeBackend {
            table: Some(d.ruleset.flatten()),
            ..Default::default()
        };
        (backend, learning::learning(&d.memory.firewall))
    }

    pub(super) fn answer(name: &str, addrs: &[(&str, u32)]) -> Answer {
        Answer {
            name: name.into(),
            addresses: addrs
                .iter()
                .map(|(a, t)| (a.parse().unwrap(), *t))
                .collect(),
            truncated: false,
        }
    }

    fn bounds(floor_secs: u32) -> Bounds {
        Bounds {
            floor_secs,
            max_ttl_secs: 86_400,
            per_name: 50,
            per_namespace: 2000,
        }
    }

    pub(super) fn elements(l: &Learner<FakeBackend>, set: &str) -> Vec<(String, Option<u32>)> {
        let t = l.backend().table.as_ref().unwrap();
        t.sets[set]
            .elements
            .iter()
            .map(|(k, v)| (format!("{:?}", k[0]), v.timeout))
            .collect()
    }

    #[test]
    fn matching_names_are_written_with_their_ttl_floor_and_never_shortened() {
        let (backend, learning) = planned(
            "[{type: Allow, to: {dnsName: '*.example.com'}}, {type: Allow, to: {dnsName: api.example.com}}, \
              {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
        );
        let names = Names::new("web");
        let wild = names.learned_set("*.example.com", IpFamily::V4);
        let exact = names.learned_set("api.example.com", IpFamily::V4);
        let wild6 = names.learned_set("*.example.com", IpFamily::V6);
        let mut l = Learner::new(backend, "nodeplane", bounds(5));
        let now = Instant::now();
        let pod: IpAddr = POD.parse().unwrap();
        let a = answer(
            "api.example.com",
            &[("198.51.100.7", 2), ("2001:db8::7", 60)],
        );
        assert_eq!(
            l.learn(&learning, pod, &a, now).unwrap().written,
            4,
            "2 names x 2 addresses"
        );
        assert_eq!(
            elements(&l, &exact),
            [("Value(Ipv4(198.51.100.7))".into(), Some(5))],
            "TTL 2 -> floor 5"
        );
        assert_eq!(elements(&l, &wild).len(), 1, "the wildcard matches too");
        assert_eq!(elements(&l, &wild6)[0].1, Some(60));
        // The same answer again: nothing to extend, no batch.
        let batches = l.backend().applied.len();
        assert_eq!(l.learn(&learning, pod, &a, now).unwrap().written, 0);
        assert_eq!(l.backend().applied.len(), batches);
        // Later, a longer TTL extends; a shorter one never cuts.
        let later = now + Duration::from_secs(4);
        let longer = answer("api.example.com", &[("198.51.100.7", 30)]);
        assert_eq!(l.learn(&learning, pod, &longer, later).unwrap().written, 2);
        assert_eq!(elements(&l, &exact)[0].1, Some(30));
        let shorter = answer("api.example.com", &[("198.51.100.7", 10)]);
        assert_eq!(l.learn(&learning, pod, &shorter, later).unwrap().written, 0);
    }

    #[test]
    fn addresses_with_live_flows_are_extended_before_they_expire() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let set = Names::new("web").learned_set("*.example.com", IpFamily::V4);
        let mut l = Learner::new(backend, "nodeplane", bounds(5));
        let now = Instant::now();
        let pod: IpAddr = POD.parse().unwrap();
        let addr: IpAddr = "198.51.100.7".parse().unwrap();
        l.learn(
            &learning,
            pod,
            &answer("a.example.com", &[("198.51.100.7", 5)]),
            now,
        )
        .unwrap();
        let horizon = Duration::from_secs(5);
        let flows = |src: &str| [(src.parse().unwrap(), addr)].into_iter().collect();
        // Far from expiry: nothing to do yet.
        assert_eq!(
            l.keep_alive(&learning, &flows(POD), Duration::from_secs(1), now)
                .unwrap()
                .written,
            0
        );
        // About to expire, but the flow is another pod's (not of this namespace): left to expire.
        let later = now + Duration::from_secs(4);
        assert_eq!(
            l.keep_alive(&learning, &flows("10.128.2.5"), horizon, later)
                .unwrap()
                .written,
            0
        );
        // About to expire with a flow of the pod: extended by the horizon plus the floor.
        assert_eq!(
            l.keep_alive(&learning, &flows(POD), horizon, later)
                .unwrap()
                .written,
            1
        );
        assert_eq!(elements(&l, &set)[0].1, Some(10));
        assert_eq!(
            l.keep_alive(&learning, &flows(POD), horizon, later)
                .unwrap()
                .written,
            0,
            "once"
        );
    }

    #[test]
    fn the_soonest_expiry_follows_answers_extensions_and_evictions() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let mut bounds = bounds(5);
        bounds.per_name = 2;
        let mut l = Learner::new(backend, "nodeplane", bounds);
        let now = Instant::now();
        let pod: IpAddr = POD.parse().unwrap();
        let secs = |s: u64| now + Duration::from_secs(s);
        assert_eq!(l.next_expiry(now), None, "nothing learned");
        let a = answer(
            "a.example.com",
            &[("198.51.100.7", 30), ("198.51.100.8", 60)],
        );
        l.learn(&learning, pod, &a, now).unwrap();
        assert_eq!(l.next_expiry(now), Some(secs(30)));
        assert_eq!(l.next_expiry(secs(30)), Some(secs(60)), "the first expired");
        // A longer TTL for the soonest moves it.
        let longer = answer("a.example.com", &[("198.51.100.7", 90)]);
        l.learn(&learning, pod, &longer, now).unwrap();
        assert_eq!(l.next_expiry(now), Some(secs(60)));
        // Kept alive by a live flow: extended by the horizon plus the floor.
        let flows = [(pod, "198.51.100.8".parse().unwrap())]
            .into_iter()
            .collect();
        let late = secs(58);
        l.keep_alive(&learning, &flows, Duration::from_secs(5), late)
            .unwrap();
        assert_eq!(l.next_expiry(late), Some(late + Duration::from_secs(10)));
        // Evicted by the per-name cap (the least recently answered, .8): its expiry goes too.
        let third = answer("a.example.com", &[("198.51.100.9", 20)]);
        l.learn(&learning, pod, &third, now).unwrap();
        assert_eq!(l.remembered(), 2);
        assert_eq!(l.next_expiry(now), Some(secs(20)));
        assert_eq!(l.next_expiry(secs(20)), Some(secs(90)));
        l.forget_expired(secs(100));
        assert_eq!(l.next_expiry(now), None, "all expired and forgotten");
    }

    #[test]
    fn queued_answers_are_one_batch_and_the_longer_ttl_wins() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let set = Names::new("web").learned_set("*.example.com", IpFamily::V4);
        let mut l = Learner::new(backend, "nodeplane", bounds(5));
        let pod: IpAddr = POD.parse().unwrap();
        let long = answer("a.example.com", &[("198.51.100.7", 60)]);
        let short = answer("b.example.com", &[("198.51.100.7", 9), ("198.51.100.8", 9)]);
        let got = l
            .learn_all(&learning, &[(pod, &long), (pod, &short)], Instant::now())
            .unwrap();
        assert_eq!(got.written, 2);
        assert_eq!(l.backend().applied.len(), 1, "one batch");
        let timeouts: Vec<Option<u32>> = elements(&l, &set).into_iter().map(|e| e.1).collect();
        assert_eq!(timeouts, [Some(60), Some(9)]);
    }

    #[test]
    fn other_names_and_pods_learn_nothing() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let mut l = Learner::new(backend, "nodeplane", bounds(5));
        let now = Instant::now();
        let pod: IpAddr = POD.parse().unwrap();
        for (who, name) in [
            (pod, "a.b.example.com"),
            (pod, "example.com"),
            ("10.128.2.5".parse().unwrap(), "a.example.com"),
        ] {
            let a = answer(name, &[("198.51.100.7", 60)]);
            assert_eq!(
                l.learn(&learning, who, &a, now).unwrap().written,
                0,
                "{who} {name}"
            );
        }
        assert!(l.backend().applied.is_empty());
        assert_eq!(
            learning.pods().collect::<Vec<_>>(),
            [pod],
            "only local pods are steered"
        );
    }
}

#[cfg(test)]
mod bound_tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn ttls_are_capped_and_the_top_bit_means_zero() {
        let b = Bounds {
            floor_secs: 5,
            max_ttl_secs: 86_400,
            per_name: 50,
            per_namespace: 2000,
        };
        assert_eq!(b.timeout(2), 5);
        assert_eq!(b.timeout(300), 300);
        assert_eq!(b.timeout(i32::MAX as u32), 86_400, "68 years -> one day");
        assert_eq!(b.timeout(0x8000_0001), 5, "top bit set: 0, then the floor");
    }

    #[test]
    fn a_name_and_a_namespace_keep_their_newest_addresses() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let set = Names::new("web").learned_set("*.example.com", IpFamily::V4);
        let bounds = Bounds {
            floor_secs: 5,
            max_ttl_secs: 86_400,
            per_name: 3,
            per_namespace: 5,
        };
        let mut l = Learner::new(backend, "nodeplane", bounds);
        let pod: IpAddr = POD.parse().unwrap();
        let now = Instant::now();
        // One answer of 10 addresses teaches its first 3.
        let many: Vec<(String, u32)> = (1..=10).map(|i| (format!("198.51.100.{i}"), 60)).collect();
        let many: Vec<(&str, u32)> = many.iter().map(|(a, t)| (a.as_str(), *t)).collect();
        let got = l
            .learn(&learning, pod, &answer("a.example.com", &many), now)
            .unwrap();
        assert_eq!(got.written, 3);
        assert_eq!(elements(&l, &set).len(), 3);
        // A new address of the same name evicts its least recently answered one.
        let got = l
            .learn(
                &learning,
                pod,
                &answer("a.example.com", &[("198.51.100.20", 60)]),
                now,
            )
            .unwrap();
        assert_eq!((got.written, got.evicted), (1, 1));
        let have: Vec<String> = elements(&l, &set).into_iter().map(|e| e.0).collect();
        assert!(
            !have.iter().any(|e| e.contains("198.51.100.1)")),
            "{have:?}"
        );
        // Other names fill the namespace up to 5; then its oldest go, whatever the name.
        for (i, name) in ["b", "c", "d"].into_iter().enumerate() {
            let addr = format!("198.51.101.{i}");
            let a = answer(&format!("{name}.example.com"), &[(addr.as_str(), 60)]);
            l.learn(&learning, pod, &a, now).unwrap();
        }
        assert_eq!(elements(&l, &set).len(), 5, "namespace cap");
        assert_eq!(l.remembered(), 5);
        let have: Vec<String> = elements(&l, &set).into_iter().map(|e| e.0).collect();
        assert!(
            have.iter().any(|e| e.contains("198.51.101.2")),
            "newest kept: {have:?}"
        );
        assert!(have.iter().any(|e| e.contains("198.51.100.20")), "{have:?}");
    }
}
