//! `agent explain --live --trace`: the kernel's own account of real packets like the one
//! asked about. For a bounded time the agent adds a trace table (`nft::trace`) that sets
//! the trace bit of matching packets, collects what the kernel reports for each, and maps
//! every reported rule of its tables back to the object and rule that planned it: the rule
//! handle gives the rule's place in its chain, the applied table gives the rule, and the
//! evaluator's walk of the same packet (from the traced headers) gives the set element that
//! matched. Each packet's kernel verdict is set beside the evaluator's prediction.

use super::Tables;
use super::event::{Action, Event, Path, Verdict};
use super::offline::{Live, explain_tables};
use super::output::{Decision, TraceReport, TracedPacket, show_packet};
use super::packet::Packet;
use super::provenance::{Index, Origin};
use super::request::{ExplainError, Request, TraceLimits};
use crate::nft::ir::{Family, Field, Match, MatchOp, Table, Value};
use crate::nft::trace::{KernelVerdict, Session, TRACE_TABLE, TraceEvent, TraceKind, trace_table};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Request(#[from] ExplainError),
    #[error("trace: {0}")]
    Kernel(#[from] crate::nft::NftError),
}

/// The trace rule's matches: the request's addresses and protocol, and its ports and input
/// interface where given (not `--oif`: it is unknown at the first hook).
pub fn matches(req: &Request) -> Result<Vec<Match>, ExplainError> {
    let packet = req.query()?.packet;
    let eq = |f: Field, v: Value| Match {
        key: vec![f],
        op: MatchOp::Eq(vec![v]),
    };
    let (s, d) = match packet.src {
        IpAddr::V4(_) => (Field::Ip4Saddr, Field::Ip4Daddr),
        IpAddr::V6(_) => (Field::Ip6Saddr, Field::Ip6Daddr),
    };
    let mut m = vec![
        eq(s, Value::ip(packet.src)),
        eq(d, Value::ip(packet.dst)),
        eq(Field::L4Proto, Value::Proto(packet.proto)),
    ];
    m.extend(req.sport.map(|p| eq(Field::ThSport, Value::Port(p))));
    m.extend(req.dport.map(|p| eq(Field::ThDport, Value::Port(p))));
    m.extend(
        req.iif
            .clone()
            .map(|i| eq(Field::IifName, Value::IfName(i))),
    );
    Ok(m)
}

/// Traces packets like `req`'s within `limits`, then explains each. Blocks for up to
/// `limits.seconds`.
pub fn trace(live: &Live, req: &Request, limits: TraceLimits) -> Result<TraceReport, TraceError> {
    let m = matches(req)?;
    let families: Vec<Family> = std::iter::once(Family::Inet)
        .chain(live.bridge.map(|_| Family::Bridge))
        .collect();
    let tables: Vec<Table> = families.iter().map(|f| trace_table(*f, &m)).collect();
    let matched =
        crate::nft::render::rule_text(&tables[0].chains.values().next().expect("a chain").rules[0]);
    let mut session = Session::start(tables)?;
    let deadline = Instant::now() + Duration::from_secs(limits.seconds);
    let events = session.collect(deadline, limits.packets);
    let lost = session.lost;
    drop(session);
    let mut handles = BTreeMap::new();
    for f in families {
        handles.insert(
            f.nfproto(),
            crate::nft::nftnl::rule_handles(f, crate::nft::TABLE_NAME)?,
        );
    }
    let ctx = Context {
        live,
        req,
        tables: Tables::new(live.inet, live.bridge),
        index: Index::new(std::iter::once(live.inet).chain(live.bridge))
            .with_egress_ips(live.egress_ips.iter().cloned()),
        handles,
    };
    let packets = by_packet(events)
        .into_iter()
        .map(|(id, evs)| ctx.packet(id, &evs))
        .collect();
    Ok(TraceReport {
        seconds: limits.seconds,
        packets_asked: limits.packets,
        matched,
        lost,
        packets,
    })
}

/// Events grouped by trace id, in the order the packets came.
fn by_packet(events: Vec<TraceEvent>) -> Vec<(u32, Vec<TraceEvent>)> {
    let mut out: Vec<(u32, Vec<TraceEvent>)> = Vec::new();
    for ev in events {
        match out.iter_mut().find(|(id, _)| *id == ev.id) {
            Some((_, evs)) => evs.push(ev),
            None => out.push((ev.id, vec![ev])),
        }
    }
    out
}

struct Context<'a> {
    live: &'a Live<'a>,
    req: &'a Request,
    tables: Tables,
    index: Index,
    /// Rule handles by family (`NFPROTO_*`), chain, in chain order.
    handles: BTreeMap<u8, BTreeMap<String, Vec<u64>>>,
}

impl Context<'_> {
    fn packet(&self, id: u32, events: &[TraceEvent]) -> TracedPacket {
        let seen = events
            .iter()
            .find_map(|e| headers(e.network.as_deref()?, e.transport.as_deref()));
        let met = |family| {
            let ours = |e: &&TraceEvent| e.table == crate::nft::TABLE_NAME;
            events.iter().filter(ours).any(|e| e.family == family)
        };
        // Bridged: the bridge table saw it; with br_netfilter the inet table did too.
        let (bridged, inet) = (met(NFPROTO_BRIDGE), met(NFPROTO_INET));
        let topology = bridged.then_some(inet);
        let iif = events.iter().find_map(|e| e.iif).and_then(if_name);
        let oif = events.iter().find_map(|e| e.oif).and_then(if_name);
        let paths = match &seen {
            Some(p) => self.predict(p, topology, iif, oif),
            None => Vec::new(),
        };
        let predicted = most_alike(paths, events);
        let mut steps = Vec::new();
        let mut hook = BTreeMap::new();
        for ev in events.iter().filter(|e| e.table != TRACE_TABLE) {
            // A base chain that runs out of rules reports its end, then its policy: the
            // policy says it.
            let base_end = chain_end(ev) && self.is_base(ev);
            if !base_end {
                steps.push(self.step(ev, &mut hook, predicted.as_ref()));
            }
        }
        let dropped = steps.iter().any(|d| d.event.action == Action::Drop);
        let verdict = predicted.as_ref().map(|p| p.verdict);
        // Where each says the packet ended: the same rule of the same table, or not.
        let kernel_end = steps.iter().rev().find(|d| d.event.action == Action::Drop);
        let kernel_end = kernel_end.map(|d| (d.event.table, d.event.chain.as_str(), d.event.rule));
        let predicted_end = predicted.as_ref().and_then(|p| {
            let ends = |e: &&Event| matches!(e.action, Action::Drop | Action::Reject { .. });
            let e = p.events.iter().rev().find(ends)?;
            Some((e.table, e.chain.as_str(), e.rule))
        });
        TracedPacket {
            id: format!("{id:#010x}"),
            packet: seen
                .as_ref()
                .map(show_packet)
                .unwrap_or_else(|| "(no headers reported)".into()),
            dropped,
            predicted: verdict,
            agrees: verdict
                .is_some_and(|v| matches!(v, Verdict::Dropped | Verdict::Rejected) == dropped)
                && kernel_end == predicted_end,
            steps,
        }
    }

    /// The applied table an event comes from; `None` for other tables of the node.
    fn our_table(&self, ev: &TraceEvent) -> Option<&Table> {
        if ev.table != crate::nft::TABLE_NAME {
            return None;
        }
        match ev.family {
            NFPROTO_INET => Some(&self.tables.inet),
            NFPROTO_BRIDGE => self.tables.bridge.as_ref(),
            _ => None,
        }
    }

    fn is_base(&self, ev: &TraceEvent) -> bool {
        let chain = self.our_table(ev).and_then(|t| t.chains.get(&ev.chain));
        chain.is_some_and(|c| c.base.is_some())
    }

    /// The evaluator's walks of the traced packet as it entered, on the interfaces and
    /// topology the trace saw (`Some(br_netfilter)` for a bridged packet) where the
    /// question did not give them.
    fn predict(
        &self,
        seen: &Packet,
        bridged: Option<bool>,
        iif: Option<String>,
        oif: Option<String>,
    ) -> Vec<Path> {
        let mut req = self.req.clone();
        (req.src, req.dst, req.sport, req.dport) =
            (Some(seen.src), Some(seen.dst), seen.sport, seen.dport);
        req.proto = seen.proto.to_string();
        req.trace = None;
        req.iif = req.iif.or(iif);
        req.oif = req.oif.or(oif);
        if let Some(br_netfilter) = bridged {
            (req.bridged, req.br_netfilter) = (true, br_netfilter);
        }
        if seen.proto == crate::nft::ir::proto::TCP {
            let syn = seen.tcp_flags & crate::nft::ir::tcp_flags::SYN != 0;
            let ack = seen.tcp_flags & crate::nft::ir::tcp_flags::ACK != 0;
            req.ct_state = Some(if syn && !ack { "new" } else { "established" }.into());
        }
        match explain_tables(self.live, &req) {
            Ok(report) => report.paths.into_iter().map(|p| p.path).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn step(
        &self,
        ev: &TraceEvent,
        hook: &mut BTreeMap<u8, (&'static str, String)>,
        predicted: Option<&Path>,
    ) -> Decision {
        let family = family_name(ev.family);
        let table = self.our_table(ev);
        let action = action_of(ev);
        let Some(table) = table else {
            let event = Event {
                table: family,
                hook: "-",
                base: String::new(),
                chain: format!("{} {}", ev.table, ev.chain),
                rule: None,
                comment: None,
                rule_text: ev.handle.map(|h| format!("handle {h}")),
                element: None,
                action,
            };
            let origin = Origin {
                kind: "other table",
                namespace: None,
                name: None,
                rule: None,
                text: None,
                why: Some(format!("table {family} {}: not nodeplane's", ev.table)),
            };
            return Decision { event, origin };
        };
        let chain = table.chains.get(&ev.chain);
        if let Some(base) = chain.and_then(|c| c.base) {
            hook.insert(ev.family, (base.hook.keyword(), ev.chain.clone()));
        }
        let (hook_name, base) = hook
            .get(&ev.family)
            .cloned()
            .unwrap_or(("-", String::new()));
        let position = match (ev.kind, ev.handle) {
            (TraceKind::Rule, Some(h)) => self
                .handles
                .get(&ev.family)
                .and_then(|c| c.get(&ev.chain))
                .and_then(|hs| hs.iter().position(|x| *x == h)),
            _ => None,
        };
        let rule = position.and_then(|i| chain?.rules.get(i));
        let mut event = Event {
            table: family,
            hook: hook_name,
            base,
            chain: ev.chain.clone(),
            rule: position,
            comment: rule.and_then(|r| r.comment.clone()),
            rule_text: rule.map(crate::nft::render::rule_text),
            element: None,
            action,
        };
        let unpredicted;
        let path = match predicted {
            Some(p) => p,
            None => {
                unpredicted = no_path();
                &unpredicted
            }
        };
        // The element a map lookup matched is not in the trace; the evaluator's walk of the
        // same packet through the same rule knows it.
        let same_rule =
            |e: &&Event| e.table == event.table && e.chain == event.chain && e.rule == event.rule;
        if position.is_some()
            && let Some(same) = path.events.iter().find(same_rule)
        {
            event.element = same.element.clone();
        }
        let origin = self.index.origin(&event, path);
        Decision { event, origin }
    }
}

/// The walk (one per `numgen` bucket) that meets most of the rules the kernel reported.
fn most_alike(paths: Vec<Path>, events: &[TraceEvent]) -> Option<Path> {
    let chains: Vec<&str> = events.iter().map(|e| e.chain.as_str()).collect();
    paths
        .into_iter()
        .enumerate()
        .max_by_key(|(i, p)| {
            let shared = p
                .events
                .iter()
                .filter(|e| chains.contains(&e.chain.as_str()));
            // The first of equals: `max_by_key` keeps the last.
            (shared.count(), std::cmp::Reverse(*i))
        })
        .map(|(_, p)| p)
}

/// An interface's name by index, in this network namespace (gone: `None`).
fn if_name(index: u32) -> Option<String> {
    let name = nix::net::if_::if_indextoname(index).ok()?;
    name.into_string().ok()
}

/// A walk with no events, for a packet the evaluator could not follow.
fn no_path() -> Path {
    let any = IpAddr::from([0, 0, 0, 0]);
    Path {
        choices: Vec::new(),
        hooks: Vec::new(),
        events: Vec::new(),
        verdict: Verdict::Forwarded,
        packet: Packet::new(any, any, 0, None, None).expect("a protocol without ports"),
    }
}

/// `NFPROTO_*` of the trace events' families.
const NFPROTO_INET: u8 = 1;
const NFPROTO_BRIDGE: u8 = 7;

fn family_name(nfproto: u8) -> &'static str {
    match nfproto {
        NFPROTO_INET => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        NFPROTO_BRIDGE => "bridge",
        10 => "ip6",
        _ => "?",
    }
}

/// A chain ran out of rules: a `Return` event, or (kernel 6.x) a `Rule` event without a
/// rule handle whose verdict is `continue`.
fn chain_end(ev: &TraceEvent) -> bool {
    ev.kind == TraceKind::Return || (ev.kind == TraceKind::Rule && ev.handle.is_none())
}

fn action_of(ev: &TraceEvent) -> Action {
    match (ev.kind, &ev.verdict, ev.policy) {
        (TraceKind::Policy, _, Some(0)) => Action::Drop,
        (TraceKind::Policy, _, Some(_)) => Action::Accept,
        _ if chain_end(ev) => Action::Return,
        (_, Some(v), _) => verdict_action(v),
        (_, None, _) => Action::Continue,
    }
}

fn verdict_action(v: &KernelVerdict) -> Action {
    let to = || v.chain.clone().unwrap_or_default();
    match v.code {
        0 => Action::Drop,
        1 => Action::Accept,
        -3 => Action::Jump { to: to() },
        -4 => Action::Goto { to: to() },
        -5 => Action::Return,
        _ => Action::Continue,
    }
}

/// The packet a trace event's headers show (IPv4 or IPv6, ports of TCP, UDP and SCTP).
fn headers(network: &[u8], transport: Option<&[u8]>) -> Option<Packet> {
    let (src, dst, proto): (IpAddr, IpAddr, u8) = match network.first()? >> 4 {
        4 => {
            let a: [u8; 4] = network.get(12..16)?.try_into().ok()?;
            let b: [u8; 4] = network.get(16..20)?.try_into().ok()?;
            (a.into(), b.into(), *network.get(9)?)
        }
        6 => {
            let a: [u8; 16] = network.get(8..24)?.try_into().ok()?;
            let b: [u8; 16] = network.get(24..40)?.try_into().ok()?;
            (a.into(), b.into(), *network.get(6)?)
        }
        _ => return None,
    };
    let th = transport.unwrap_or_default();
    let port = |i: usize| Some(u16::from_be_bytes(th.get(i..i + 2)?.try_into().ok()?));
    let ports = super::packet::has_ports(proto);
    let (sport, dport) = if ports {
        (port(0), port(2))
    } else {
        (None, None)
    };
    let mut p = Packet::new(src, dst, proto, sport, dport).ok()?;
    if proto == crate::nft::ir::proto::TCP {
        p.tcp_flags = th.get(13).copied().unwrap_or_default();
    }
    Some(p)
}
