//! The evaluator: walks the planned tables (the IR that goes to the kernel) as the kernel
//! would for one packet. Base chains of each hook in priority order; a rule's statements
//! in order (a failed match ends the rule); jump / goto / return with the kernel's stack;
//! vmaps and sets by lookup; NAT rewrites the packet for the hooks after; marks set and
//! tested. `numgen` is not drawn: [`Walker`] takes the bucket from `forced` and records it,
//! and `explain` enumerates every bucket (see `super::explain_paths`).

use super::event::{Action, Choice, ElementHit, Event};
use super::lookup::{find, key_matches, numeric, show_key, show_value};
use super::packet::{Loaded, NodeFacts, Packet};
use crate::nft::ir::{
    Chain, ChainType, ElemData, Field, Hook, MapRef, Match, MatchOp, Nat, NatAddr, NatKind, Policy,
    Reject, Rule, Set, Stmt, Table, Value, Verdict, ct_state, priority,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The kernel's jump stack depth (NFT_JUMP_STACK_SIZE).
const MAX_DEPTH: usize = 16;

/// How one base chain ended for the packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accept,
    Drop,
    Reject,
}

/// How one rule ended.
enum Flow {
    Next,
    Verdict(Verdict),
    Reject,
}

/// One walk's state: the packet as NAT and marks leave it, the elements it added to
/// dynamic sets, the decisions so far.
pub struct Walker<'a> {
    pub facts: &'a NodeFacts,
    pub packet: Packet,
    pub events: Vec<Event>,
    pub choices: Vec<Choice>,
    /// Buckets to take for the `numgen`s met, in order (0 beyond its end).
    forced: Vec<u32>,
    /// Elements added by `update @set` during this walk.
    added: BTreeMap<String, BTreeSet<Vec<Value>>>,
    /// Dynamic sets already reported as unknown on this walk (reported once each).
    unknown_reported: BTreeSet<String>,
    /// A `tproxy` took the packet: it goes to a local socket.
    pub tproxied: bool,
    at: Place,
}

/// Where the walk is, for the events it records.
#[derive(Default, Clone)]
struct Place {
    table: &'static str,
    hook: &'static str,
    base: String,
    chain: String,
    rule: Option<usize>,
    comment: Option<String>,
    rule_text: Option<String>,
}

pub fn hook_name(hook: Hook) -> &'static str {
    hook.keyword()
}

/// The base chains of `table` at `hook`, in the order the kernel runs them. NAT chains
/// run inside the NAT core's own hook (priority -100 at prerouting and output, 100 at input
/// and postrouting), in their priority order there.
pub fn base_chains(table: &Table, hook: Hook) -> Vec<&Chain> {
    let mut chains: Vec<&Chain> = table
        .chains
        .values()
        .filter(|c| c.base.is_some_and(|b| b.hook == hook))
        .collect();
    chains.sort_by_key(|c| {
        let b = c.base.expect("base chains only");
        let core = match (b.kind, hook) {
            (ChainType::Nat, Hook::Prerouting | Hook::Output) => priority::DSTNAT,
            (ChainType::Nat, _) => priority::SRCNAT,
            _ => b.priority,
        };
        (core, b.priority, c.name.clone())
    });
    chains
}

impl<'a> Walker<'a> {
    pub fn new(facts: &'a NodeFacts, packet: Packet, forced: Vec<u32>) -> Self {
        Walker {
            facts,
            packet,
            events: Vec::new(),
            choices: Vec::new(),
            forced,
            added: BTreeMap::new(),
            unknown_reported: BTreeSet::new(),
            tproxied: false,
            at: Place::default(),
        }
    }

    /// Runs every base chain of `table` at `hook`; the first drop or reject ends the hook.
    pub fn run_hook(&mut self, table: &Table, hook: Hook) -> Outcome {
        self.run_hook_where(table, hook, |_| true)
    }

    /// The base chains of `hook` whose priority `keep` accepts (br_netfilter runs the inet
    /// hooks in the middle of the bridge's: see `walk_hooks`).
    pub fn run_hook_where(
        &mut self,
        table: &Table,
        hook: Hook,
        keep: impl Fn(i32) -> bool,
    ) -> Outcome {
        let mut nat_done = false;
        let chains = base_chains(table, hook).into_iter();
        for chain in chains.filter(|c| c.base.is_some_and(|b| keep(b.priority))) {
            let base = chain.base.expect("base chains only");
            // NAT chains see only a connection's first packet, and only until one of them
            // sets up the translation of this hook (the kernel's `nf_nat_inet_fn`).
            let nat = base.kind == ChainType::Nat;
            if nat && (nat_done || self.packet.ct_state != ct_state::NEW) {
                continue;
            }
            let before = self.events.len();
            self.at = Place {
                table: table.family.keyword(),
                hook: hook_name(hook),
                base: chain.name.clone(),
                ..Place::default()
            };
            let outcome = self.run_base(table, chain, base.policy);
            nat_done |= nat && self.events[before..].iter().any(|e| e.action.is_nat());
            if outcome != Outcome::Accept {
                return outcome;
            }
        }
        Outcome::Accept
    }

    /// One base chain with the kernel's jump stack.
    fn run_base<'t>(&mut self, table: &'t Table, base: &'t Chain, policy: Policy) -> Outcome {
        let mut stack: Vec<(&'t Chain, usize)> = Vec::new();
        let (mut chain, mut next) = (base, 0usize);
        loop {
            let Some(rule) = chain.rules.get(next) else {
                match stack.pop() {
                    Some((c, i)) => (chain, next) = (c, i),
                    None => return self.policy(policy),
                }
                continue;
            };
            self.at.chain = chain.name.clone();
            self.at.rule = Some(next);
            self.at.comment = rule.comment.clone();
            self.at.rule_text = Some(crate::nft::render::rule_text(rule));
            let (to, jump) = match self.run_rule(table, rule) {
                Flow::Next | Flow::Verdict(Verdict::Continue) => {
                    next += 1;
                    continue;
                }
                Flow::Reject => return Outcome::Reject,
                Flow::Verdict(Verdict::Accept) => return Outcome::Accept,
                Flow::Verdict(Verdict::Drop) => return Outcome::Drop,
                Flow::Verdict(Verdict::Return) => {
                    match stack.pop() {
                        Some((c, i)) => (chain, next) = (c, i),
                        None => return self.policy(policy),
                    }
                    continue;
                }
                Flow::Verdict(Verdict::Jump(to)) => (to, true),
                Flow::Verdict(Verdict::Goto(to)) => (to, false),
            };
            let Some(target) = table.chains.get(&to) else {
                return self.broken(format!("chain {to:?} does not exist"));
            };
            if jump {
                if stack.len() >= MAX_DEPTH {
                    return self.broken("jump stack overflow".into());
                }
                stack.push((chain, next + 1));
            }
            (chain, next) = (target, 0);
        }
    }

    fn policy(&mut self, policy: Policy) -> Outcome {
        if policy == Policy::Drop {
            self.at.rule = None;
            self.at.comment = Some("policy drop".into());
            self.at.rule_text = None;
            self.record(None, Action::Drop);
            return Outcome::Drop;
        }
        Outcome::Accept
    }

    /// A table the kernel would not have loaded; reported, and the packet taken as dropped.
    fn broken(&mut self, why: String) -> Outcome {
        let assumed = "dropped".to_string();
        self.record(None, Action::Unknown { what: why, assumed });
        Outcome::Drop
    }

    pub fn record(&mut self, element: Option<ElementHit>, action: Action) {
        let at = &self.at;
        self.events.push(Event {
            table: at.table,
            hook: at.hook,
            base: at.base.clone(),
            chain: at.chain.clone(),
            rule: at.rule,
            comment: at.comment.clone(),
            rule_text: at.rule_text.clone(),
            element,
            action,
        });
    }

    fn run_rule(&mut self, table: &Table, rule: &Rule) -> Flow {
        for stmt in &rule.stmts {
            match self.run_stmt(table, stmt) {
                Flow::Next => {}
                Flow::Verdict(Verdict::Continue) => return Flow::Next,
                other => return other,
            }
        }
        Flow::Next
    }

    /// One statement: `Flow::Next` goes on with the rule, `Flow::Verdict(Continue)` ends it
    /// without a verdict (a failed match, a vmap miss), anything else ends the rule with
    /// that verdict.
    fn run_stmt(&mut self, table: &Table, stmt: &Stmt) -> Flow {
        let stop = Flow::Verdict(Verdict::Continue);
        match stmt {
            Stmt::Match(m) => {
                if self.matches(table, m) {
                    Flow::Next
                } else {
                    stop
                }
            }
            Stmt::Counter => Flow::Next,
            Stmt::Log { prefix, .. } => {
                self.record(
                    None,
                    Action::Log {
                        prefix: prefix.clone(),
                    },
                );
                Flow::Next
            }
            Stmt::Vmap { key, map } => self.vmap(table, key, map),
            Stmt::Nat(nat) => self.nat(table, nat),
            Stmt::Masquerade { .. } => {
                self.record(None, Action::Masquerade);
                Flow::Verdict(Verdict::Accept)
            }
            Stmt::DscpSet { dscp, .. } => {
                self.record(None, Action::Dscp { value: *dscp });
                Flow::Next
            }
            Stmt::MarkSet(m) => self.set_mark(*m),
            Stmt::MarkOr(m) => self.set_mark(self.packet.mark | m),
            Stmt::MarkAnd(m) => self.set_mark(self.packet.mark & m),
            // Only reports what follows; it decides nothing.
            Stmt::Trace => Flow::Next,
            Stmt::Tproxy { port, .. } => {
                self.tproxied = true;
                self.record(None, Action::Tproxy { port: *port });
                Flow::Next
            }
            Stmt::SetUpdate { set, key, .. } => self.set_update(set, key),
            Stmt::SetLimit { set, .. } => {
                let what = format!("per-source rate in @{set} (state kept by the kernel)");
                let assumed = "under the rate: the rule does not match".to_string();
                self.record(None, Action::Unknown { what, assumed });
                stop
            }
            Stmt::Reject(r) => {
                let with = match r {
                    Reject::PortUnreachable => "icmp port-unreachable",
                    Reject::TcpReset => "tcp reset",
                    Reject::AdminProhibited => "icmpx admin-prohibited",
                };
                self.record(None, Action::Reject { with: with.into() });
                Flow::Reject
            }
            Stmt::Verdict(v) => self.verdict(None, v.clone()),
        }
    }

    fn verdict(&mut self, element: Option<ElementHit>, v: Verdict) -> Flow {
        let action = match &v {
            Verdict::Accept => Action::Accept,
            Verdict::Drop => Action::Drop,
            Verdict::Return => Action::Return,
            Verdict::Continue => return Flow::Next,
            Verdict::Jump(to) => Action::Jump { to: to.clone() },
            Verdict::Goto(to) => Action::Goto { to: to.clone() },
        };
        self.record(element, action);
        Flow::Verdict(v)
    }

    fn set_mark(&mut self, to: u32) -> Flow {
        let from = self.packet.mark;
        self.packet.mark = to;
        self.record(None, Action::Mark { from, to });
        Flow::Next
    }

    fn set_update(&mut self, set: &str, key: &[Field]) -> Flow {
        if let Some(values) = self.load_key(key) {
            self.added
                .entry(set.to_string())
                .or_default()
                .insert(values);
        }
        self.record(None, Action::SetAdd { set: set.into() });
        Flow::Next
    }

    /// The values of a (concatenated) key; `None` when a field is absent from the packet.
    fn load_key(&mut self, key: &[Field]) -> Option<Vec<Value>> {
        key.iter()
            .map(|f| match f {
                Field::NumgenRandom(n) => Some(Value::Integer(self.choose(*n))),
                f if !self.has_interface(*f) => None,
                f => match self.packet.load(*f, self.facts) {
                    Loaded::Value(v) => Some(v),
                    Loaded::Absent => None,
                },
            })
            .collect()
    }

    /// Whether the packet has the interface `f` names at this hook: none in (`meta
    /// iifname`) for what the node sends, none out (`meta oifname`) before routing; the
    /// kernel's meta expression then breaks the rule.
    fn has_interface(&self, f: Field) -> bool {
        match f {
            Field::IifName => !self.facts.is_local(self.packet.src) || self.at.table == "bridge",
            Field::OifName => !matches!(self.at.hook, "prerouting" | "input"),
            _ => true,
        }
    }

    /// The bucket of a `numgen random mod n`: the forced one, recorded.
    fn choose(&mut self, n: u32) -> u32 {
        let picked = self.forced.get(self.choices.len()).copied().unwrap_or(0);
        let picked = if picked < n { picked } else { 0 };
        let chain = self.at.chain.clone();
        self.choices.push(Choice {
            chain,
            picked,
            of: n,
        });
        picked
    }
}

impl Walker<'_> {
    fn matches(&mut self, table: &Table, m: &Match) -> bool {
        let Some(values) = self.load_key(&m.key) else {
            return false;
        };
        match &m.op {
            MatchOp::Eq(want) => values == *want,
            MatchOp::Ne(want) => values != *want,
            MatchOp::InSet(name) => self.in_set(table, name, &values),
            MatchOp::NotInSet(name) => !self.in_set(table, name, &values),
            MatchOp::InAnon(keys) => keys.iter().any(|k| key_matches(k, &values)),
            MatchOp::AnyFlag(bits) => values
                .first()
                .and_then(numeric)
                .is_some_and(|v| v & u64::from(*bits) != 0),
            MatchOp::Masked { mask, value, eq } => {
                let got = values.first().and_then(numeric);
                let (mask, value) = (numeric(mask), numeric(value));
                match (got, mask, value) {
                    (Some(g), Some(m), Some(v)) => (g & m == v) == *eq,
                    _ => false,
                }
            }
        }
    }

    /// Set membership. A set the packet path fills (DNS answers, affinity, flows) holds
    /// what the kernel learned at run time: unknown offline, reported, taken as absent.
    fn in_set(&mut self, table: &Table, name: &str, values: &[Value]) -> bool {
        let Some(set) = table.sets.get(name) else {
            return false;
        };
        if find(&set.elements, values).is_some()
            || self.added.get(name).is_some_and(|a| a.contains(values))
        {
            return true;
        }
        if is_learned(set) && self.unknown_reported.insert(name.to_string()) {
            let shown: Vec<String> = values.iter().map(show_value).collect();
            let what =
                format!("@{name} is filled at run time (its elements are not known offline)");
            let assumed = format!("does not hold {}", shown.join(" . "));
            self.record(None, Action::Unknown { what, assumed });
        }
        false
    }

    fn vmap(&mut self, table: &Table, key: &[Field], map: &MapRef) -> Flow {
        let Some(values) = self.load_key(key) else {
            return Flow::Verdict(Verdict::Continue);
        };
        let hit = match map {
            MapRef::Named(name) => table.sets.get(name).and_then(|set| {
                let (k, v) = find(&set.elements, &values)?;
                let Some(ElemData::Verdict(verdict)) = &v.data else {
                    return None;
                };
                let comment = v.comment.as_deref().map(str::to_string);
                let element = ElementHit {
                    set: name.clone(),
                    key: show_key(k),
                    comment,
                };
                Some((element, verdict.clone()))
            }),
            MapRef::Anon(entries) => {
                entries
                    .iter()
                    .find(|(k, _)| key_matches(k, &values))
                    .map(|(k, v)| {
                        let set = "(anonymous)".to_string();
                        (
                            ElementHit {
                                set,
                                key: show_key(k),
                                comment: None,
                            },
                            v.clone(),
                        )
                    })
            }
        };
        match hit {
            Some((element, verdict)) => self.verdict(Some(element), verdict),
            None => Flow::Verdict(Verdict::Continue),
        }
    }

    fn nat(&mut self, table: &Table, nat: &Nat) -> Flow {
        let (addr, port) = match &nat.addr {
            NatAddr::Fixed(a, p) => (*a, *p),
            NatAddr::Map { key, map } => match self.nat_lookup(table, key, map) {
                Some(target) => target,
                None => return Flow::Verdict(Verdict::Continue),
            },
        };
        let to = match port {
            Some(p) if addr.is_ipv6() => format!("[{addr}]:{p}"),
            Some(p) => format!("{addr}:{p}"),
            None => addr.to_string(),
        };
        match nat.kind {
            NatKind::Dnat => {
                self.packet.dst = addr;
                if port.is_some() {
                    self.packet.dport = port;
                }
                self.record(None, Action::Dnat { to });
            }
            NatKind::Snat => {
                self.packet.src = addr;
                if port.is_some() {
                    self.packet.sport = port;
                }
                self.record(None, Action::Snat { to });
            }
        }
        Flow::Verdict(Verdict::Accept)
    }

    fn nat_lookup(
        &mut self,
        table: &Table,
        key: &[Field],
        map: &str,
    ) -> Option<(IpAddr, Option<u16>)> {
        let values = self.load_key(key)?;
        let (_, v) = find(&table.sets.get(map)?.elements, &values)?;
        let Some(ElemData::Values(data)) = &v.data else {
            return None;
        };
        let addr = match data.first()? {
            Value::Ipv4(a) => IpAddr::V4(*a),
            Value::Ipv6(a) => IpAddr::V6(*a),
            _ => return None,
        };
        let port = match data.get(1) {
            Some(Value::Port(p)) => Some(*p),
            _ => None,
        };
        Some((addr, port))
    }
}

/// A set whose elements the kernel adds at run time (never all planned).
pub fn is_learned(set: &Set) -> bool {
    set.flags.dynamic || set.flags.timeout
}
