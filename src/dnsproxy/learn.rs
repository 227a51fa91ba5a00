//! The learned-set writer: the addresses of an answer's matching names go into their learned
//! sets with the record's TTL (at least the floor) in one netlink batch, and the proxy
//! releases the answer only once the kernel acknowledged it.
//!
//! On the kernels we run (6.x), adding an element that exists (without `NLM_F_EXCL`) sets its
//! timeout *and* its expiry to the new value, shorter ones included (checked with `nft add
//! element` on 6.18: 10 s -> 100 s -> 5 s each took effect). So the writer remembers each
//! element's expiry and only writes when the answer extends it: a short TTL never cuts an
//! address learned from a longer one, and a burst of identical answers costs one write.

use super::answer::Answer;
use crate::nft::diff::{Op, Transaction};
use crate::nft::engine::NftBackend;
use crate::nft::ir::{DataType, ElemValue, IpFamily, SetFlags, SetKind, Value};
use crate::plan::firewall::learning::Learning;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Expiries remembered at most; beyond, writes still happen, only unconditionally.
const MAX_REMEMBERED: usize = 1 << 20;
/// An expiry is "extended" when it moves by at least this much (saves writes in bursts).
const SLACK: Duration = Duration::from_secs(1);

pub struct Learner<B> {
    backend: B,
    table: String,
    floor_secs: u32,
    expiries: HashMap<(String, IpAddr), Instant>,
}

/// What one answer changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Learned {
    /// Elements written (new or extended).
    pub written: usize,
}

impl<B: NftBackend> Learner<B> {
    pub fn new(backend: B, table: &str, floor_secs: u32) -> Learner<B> {
        Learner {
            backend,
            table: table.to_string(),
            floor_secs: floor_secs.max(1),
            expiries: HashMap::new(),
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
        let mut sets: BTreeMap<&str, crate::nft::ir::Set> = BTreeMap::new();
        let mut remember: HashMap<(String, IpAddr), Instant> = HashMap::new();
        for &(pod, answer) in answers {
            for target in learning.matching(pod, &answer.name) {
                for &(addr, ttl) in &answer.addresses {
                    let secs = ttl.max(self.floor_secs);
                    let expiry = now + Duration::from_secs(u64::from(secs));
                    let set_name = target.set(IpFamily::of(addr));
                    let key = (set_name.to_string(), addr);
                    let known = self.expiries.get(&key).into_iter();
                    if known
                        .chain(remember.get(&key))
                        .any(|have| *have + SLACK >= expiry)
                    {
                        continue;
                    }
                    let set = sets
                        .entry(set_name)
                        .or_insert_with(|| learned_set(set_name, IpFamily::of(addr)));
                    set.elements.insert(
                        vec![Value::ip(addr).into()],
                        ElemValue {
                            timeout: Some(secs),
                            ..Default::default()
                        },
                    );
                    remember.insert(key, expiry);
                }
            }
        }
        if sets.is_empty() {
            return Ok(Learned::default());
        }
        let written = remember.len();
        let tx = Transaction {
            table: self.table.clone(),
            family: crate::nft::Family::Inet,
            ops: sets.into_values().map(Op::AddElements).collect(),
        };
        self.backend.apply(&tx)?;
        self.forget_expired(now);
        for (key, expiry) in remember {
            if self.expiries.len() < MAX_REMEMBERED {
                self.expiries.insert(key, expiry);
            }
        }
        Ok(Learned { written })
    }

    /// Extends the learned elements that would expire within `horizon` while conntrack
    /// still has a flow to them from a pod of a namespace that learns them (`flows`: original
    /// source and destination of every entry), by `horizon` plus the floor. So an address a
    /// pod keeps using stays allowed for its new connections after its TTL.
    pub fn keep_alive(
        &mut self,
        learning: &Learning,
        flows: &std::collections::BTreeSet<(IpAddr, IpAddr)>,
        horizon: Duration,
        now: Instant,
    ) -> anyhow::Result<Learned> {
        let secs = u32::try_from(horizon.as_secs())
            .unwrap_or(u32::MAX)
            .saturating_add(self.floor_secs);
        let expiry = now + Duration::from_secs(u64::from(secs));
        let mut sets: BTreeMap<String, crate::nft::ir::Set> = BTreeMap::new();
        let mut remember = Vec::new();
        for &(pod, dst) in flows {
            let family = IpFamily::of(dst);
            for target in learning.targets(pod) {
                let key = (target.set(family).to_string(), dst);
                let Some(have) = self.expiries.get(&key) else {
                    continue;
                };
                if *have > now + horizon || remember.iter().any(|(k, _)| *k == key) {
                    continue;
                }
                let set = sets
                    .entry(key.0.clone())
                    .or_insert_with(|| learned_set(&key.0, family));
                set.elements.insert(
                    vec![Value::ip(dst).into()],
                    ElemValue {
                        timeout: Some(secs),
                        ..Default::default()
                    },
                );
                remember.push((key, expiry));
            }
        }
        if sets.is_empty() {
            return Ok(Learned::default());
        }
        let tx = Transaction {
            table: self.table.clone(),
            family: crate::nft::Family::Inet,
            ops: sets.into_values().map(Op::AddElements).collect(),
        };
        self.backend.apply(&tx)?;
        let written = remember.len();
        self.expiries.extend(remember);
        Ok(Learned { written })
    }

    /// Whether any learned element is remembered (a keep-alive pass has something to do).
    pub fn remembers_any(&self) -> bool {
        !self.expiries.is_empty()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn forget_expired(&mut self, now: Instant) {
        if self.expiries.len() >= MAX_REMEMBERED / 2 {
            self.expiries.retain(|_, e| *e > now);
        }
    }
}

/// The declaration the element encoding needs (the planner declares the real set).
fn learned_set(name: &str, family: IpFamily) -> crate::nft::ir::Set {
    let key = match family {
        IpFamily::V4 => DataType::Ipv4Addr,
        IpFamily::V6 => DataType::Ipv6Addr,
    };
    crate::nft::ir::Set::new(name, vec![key], SetKind::Set).with_flags(SetFlags {
        timeout: true,
        dynamic: true,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::nft::engine::FakeBackend;
    use crate::plan::firewall::{Names, learning};
    use crate::plan::{Memory, plan_with_dns};
    use crate::snapshot::Snapshot;
    use crate::testing::objects;

    const POD: &str = "10.128.0.5";

    /// A planned table in a fake kernel, and the learning view of the same plan.
    fn planned(rules: &str) -> (FakeBackend, Learning) {
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

    fn answer(name: &str, addrs: &[(&str, u32)]) -> Answer {
        Answer {
            name: name.into(),
            addresses: addrs
                .iter()
                .map(|(a, t)| (a.parse().unwrap(), *t))
                .collect(),
            truncated: false,
        }
    }

    fn elements(l: &Learner<FakeBackend>, set: &str) -> Vec<(String, Option<u32>)> {
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
        let mut l = Learner::new(backend, "nodeplane", 5);
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
        let mut l = Learner::new(backend, "nodeplane", 5);
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
    fn queued_answers_are_one_batch_and_the_longer_ttl_wins() {
        let (backend, learning) = planned("[{type: Allow, to: {dnsName: '*.example.com'}}]");
        let set = Names::new("web").learned_set("*.example.com", IpFamily::V4);
        let mut l = Learner::new(backend, "nodeplane", 5);
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
        let mut l = Learner::new(backend, "nodeplane", 5);
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
