//! Which object and rule each counting rule and set element of the applied table belongs
//! to, found from the planned table's parts (`fw/<namespace>`, `qos/<namespace>`,
//! `np/<namespace>/<name>`, `np-set/<in|eg>/<chain>`), never from the kernel's names; and
//! the kernel's counts summed per series ([`Index::tally`]).

use crate::nft::ir::{Stmt, Table, Verdict};
use crate::nft::nftnl::{Counted, TableCounters};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// NetworkPolicy direction, as the `direction` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

/// What a NetworkPolicy did with the packets: `allow` (one of its rules accepted them) or
/// `deny` (dropped by the isolation of a pod it selects, no policy of that pod allowing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyVerdict {
    Allow,
    Deny,
}

/// Why a NetworkPolicy guard dropped a packet before any policy judged it (the counted drops
/// of `plan::netpol::binding` and `plan::netpol::bridge`, found by their comments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GuardReason {
    /// A source address not bound to the bridge port it came from (a spoofing pod).
    SourceNotBound,
    /// An isolated pod sending or receiving on an address it does not list (link-local,
    /// SLAAC).
    UnlistedAddress,
    /// A new flow that its bridge port's flow set has no room for.
    FlowSetFull,
}

impl GuardReason {
    pub const ALL: [GuardReason; 3] = [
        GuardReason::SourceNotBound,
        GuardReason::UnlistedAddress,
        GuardReason::FlowSetFull,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            GuardReason::SourceNotBound => "source_not_bound",
            GuardReason::UnlistedAddress => "unlisted_address",
            GuardReason::FlowSetFull => "flow_set_full",
        }
    }

    /// The guard whose drop rule carries `comment`.
    fn of(comment: &str) -> Option<GuardReason> {
        use crate::plan::netpol::{binding, bridge};
        match comment {
            binding::SPOOF_COMMENT => Some(GuardReason::SourceNotBound),
            binding::UNLISTED_COMMENT => Some(GuardReason::UnlistedAddress),
            bridge::FULL_COMMENT => Some(GuardReason::FlowSetFull),
            _ => None,
        }
    }
}

/// One exported series (a packets and a bytes metric each).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Series {
    /// An EgressFirewall rule (the object is always named `default`).
    Firewall { namespace: Arc<str>, rule: u32 },
    /// An EgressQoS rule (named `default` too).
    Qos { namespace: Arc<str>, rule: u32 },
    Policy {
        namespace: Arc<str>,
        name: Arc<str>,
        direction: Direction,
        verdict: PolicyVerdict,
    },
    /// A NetworkPolicy guard's drops, node-wide.
    Guard(GuardReason),
}

/// Whose counters a chain holds.
#[derive(Debug, Clone)]
enum ChainOwner {
    /// `dnsName` rules, each commented `rule N: ...`.
    Firewall(Arc<str>),
    /// Rules commented `EgressQoS <namespace> rule N`.
    Qos(Arc<str>),
    /// A policy's chain for one direction: its `accept` rules count what it allowed.
    Policy(Arc<str>, Arc<str>, Direction),
    /// A policy set's chain: its `drop` counts what the policies of a pod denied.
    PolicySet(Direction, Vec<(Arc<str>, Arc<str>)>),
}

/// The object a part belongs to.
enum PartOwner {
    Firewall(Arc<str>),
    Qos(Arc<str>),
    Policy(Arc<str>, Arc<str>),
}
use PartOwner::{Firewall, Policy, Qos};

/// The owners of the counting chains and sets of one applied table.
#[derive(Debug, Default)]
pub struct Index {
    chains: HashMap<String, ChainOwner>,
    /// EgressFirewall maps (declared with `counter`) -> namespace.
    sets: HashMap<String, Arc<str>>,
    /// Every series the table has, at zero: a rule that never matched reads 0, not absent.
    series: Vec<Series>,
}

impl Index {
    pub fn of(table: &Table) -> Index {
        let mut index = Index::default();
        let mut policy_sets = Vec::new();
        for key in table.part_keys() {
            let Some(part) = table.part(key) else {
                continue;
            };
            let mut words = key.splitn(3, '/');
            let owner = match (words.next(), words.next(), words.next()) {
                (Some("fw"), Some(ns), None) => Firewall(ns.into()),
                (Some("qos"), Some(ns), None) => Qos(ns.into()),
                (Some("np"), Some(ns), Some(name)) => Policy(ns.into(), name.into()),
                (Some("np-set"), Some(dir), Some(_)) => {
                    policy_sets.extend(direction_of(dir).map(|d| (d, part.clone())));
                    continue;
                }
                _ => continue,
            };
            index.add_part(owner, part);
        }
        // While NetworkPolicy is in force the guards' series exist (reading 0, not absent);
        // their drops are in the bridge table's chains and the ports' chains, which the
        // applied (inet) table does not show, so they are found by comment at each read.
        if !policy_sets.is_empty() {
            index.series.extend(GuardReason::ALL.map(Series::Guard));
        }
        for (direction, part) in policy_sets {
            index.add_policy_sets(direction, &part);
        }
        index.series.sort();
        index.series.dedup();
        index
    }

    /// The sets whose elements count (to read from the kernel).
    pub fn counting_sets(&self) -> Vec<&str> {
        let mut sets: Vec<&str> = self.sets.keys().map(String::as_str).collect();
        sets.sort_unstable();
        sets
    }

    /// The packets and bytes of every series: the kernel's counters of each table (the inet
    /// table and the bridge table hold the same policy chains) summed per series.
    pub fn tally(&self, tables: &[TableCounters]) -> BTreeMap<Series, Counted> {
        let mut out: BTreeMap<Series, Counted> = self
            .series
            .iter()
            .map(|s| (s.clone(), Counted::default()))
            .collect();
        let mut add = |series: Series, c: Counted| {
            // Only series of the applied table: a kernel rule the plan no longer has is
            // about to go, and must not bring back its object's series.
            if let Some(total) = out.get_mut(&series) {
                total.add(c);
            }
        };
        for t in tables {
            for r in &t.rules {
                for series in self.rule_series(&r.chain, r.comment.as_deref()) {
                    add(series, r.counted);
                }
            }
            for (set, elements) in &t.elements {
                let Some(ns) = self.sets.get(set) else {
                    continue;
                };
                for e in elements {
                    if let Some(rule) = e.comment.as_deref().and_then(firewall_rule) {
                        add(firewall(ns, rule), e.counted);
                    }
                }
            }
        }
        out
    }

    /// The series a counting rule of `chain` adds to (several for a policy set's drop).
    fn rule_series(&self, chain: &str, comment: Option<&str>) -> Vec<Series> {
        match self.chains.get(chain) {
            // No object's chain: a guard's drop (in the base chains or a port's chain).
            None => comment
                .and_then(GuardReason::of)
                .map(Series::Guard)
                .into_iter()
                .collect(),
            Some(ChainOwner::Firewall(ns)) => comment
                .and_then(firewall_rule)
                .map(|rule| firewall(ns, rule))
                .into_iter()
                .collect(),
            Some(ChainOwner::Qos(ns)) => comment
                .and_then(qos_rule)
                .map(|rule| Series::Qos {
                    namespace: ns.clone(),
                    rule,
                })
                .into_iter()
                .collect(),
            Some(ChainOwner::Policy(ns, name, direction)) => {
                vec![policy(ns, name, *direction, PolicyVerdict::Allow)]
            }
            Some(ChainOwner::PolicySet(direction, policies)) => (policies.iter())
                .map(|(ns, name)| policy(ns, name, *direction, PolicyVerdict::Deny))
                .collect(),
        }
    }
}

impl Index {
    /// The chains and sets of one object's part, and its series.
    fn add_part(&mut self, owner: PartOwner, part: &crate::nft::ir::Part) {
        for (name, chain) in &part.chains {
            let comments = chain.rules.iter().filter_map(|r| r.comment.as_deref());
            let owner = match &owner {
                Firewall(ns) => {
                    let rules = comments.filter_map(firewall_rule);
                    self.series.extend(rules.map(|rule| firewall(ns, rule)));
                    ChainOwner::Firewall(ns.clone())
                }
                Qos(ns) => {
                    let rules = comments.filter_map(qos_rule);
                    self.series.extend(rules.map(|rule| Series::Qos {
                        namespace: ns.clone(),
                        rule,
                    }));
                    ChainOwner::Qos(ns.clone())
                }
                Policy(ns, name_) => {
                    let Some(direction) = name.rsplit('-').next().and_then(direction_of) else {
                        continue;
                    };
                    for verdict in [PolicyVerdict::Allow, PolicyVerdict::Deny] {
                        self.series.push(policy(ns, name_, direction, verdict));
                    }
                    ChainOwner::Policy(ns.clone(), name_.clone(), direction)
                }
            };
            self.chains.insert(name.clone(), owner);
        }
        let Firewall(ns) = &owner else {
            return;
        };
        // A map without elements has no counter to read: no dump for it.
        for set in (part.sets.values()).filter(|s| s.flags.counter && !s.elements.is_empty()) {
            let comments = set.elements.values().filter_map(|e| e.comment.as_deref());
            self.series.extend(
                comments
                    .filter_map(firewall_rule)
                    .map(|rule| firewall(ns, rule)),
            );
            self.sets.insert(set.name.clone(), ns.clone());
        }
    }

    /// A policy set's chain: `jump` to each of its policies' chains (indexed before), then
    /// a counted `drop`.
    fn add_policy_sets(&mut self, direction: Direction, part: &crate::nft::ir::Part) {
        for (name, chain) in &part.chains {
            let targets = chain.rules.iter().flat_map(|r| &r.stmts);
            let policies = targets
                .filter_map(|s| match s {
                    Stmt::Verdict(Verdict::Jump(to)) => match self.chains.get(to) {
                        Some(ChainOwner::Policy(ns, name, _)) => Some((ns.clone(), name.clone())),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            self.chains
                .insert(name.clone(), ChainOwner::PolicySet(direction, policies));
        }
    }
}

/// `in`/`eg` (policy-set part keys, policy chain suffixes).
fn direction_of(word: &str) -> Option<Direction> {
    match word {
        "in" => Some(Direction::Ingress),
        "eg" => Some(Direction::Egress),
        _ => None,
    }
}

fn firewall(ns: &Arc<str>, rule: u32) -> Series {
    Series::Firewall {
        namespace: ns.clone(),
        rule,
    }
}

fn policy(ns: &Arc<str>, name: &Arc<str>, direction: Direction, verdict: PolicyVerdict) -> Series {
    Series::Policy {
        namespace: ns.clone(),
        name: name.clone(),
        direction,
        verdict,
    }
}

/// `N` of an EgressFirewall comment `rule N: <action> <destination>...`.
pub fn firewall_rule(comment: &str) -> Option<u32> {
    comment
        .strip_prefix("rule ")?
        .split(':')
        .next()?
        .parse()
        .ok()
}

/// `N` of an EgressQoS comment `EgressQoS <namespace> rule N`.
pub fn qos_rule(comment: &str) -> Option<u32> {
    comment
        .strip_prefix("EgressQoS ")?
        .rsplit_once(" rule ")?
        .1
        .parse()
        .ok()
}
