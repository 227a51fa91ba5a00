//! `agent explain`: which object and which rule decide a packet on this node.
//!
//! Not a second model of the policy semantics: the evaluator ([`eval`]) walks the planned
//! nftables IR, the same tables `--dry-run` prints and the kernel receives, hook by hook
//! the way the packet meets them ([`walk`]). Every decision is recorded as an [`Event`]
//! (table, hook, chain, rule, element, action); [`provenance`] maps it back to the object
//! that planned it (from the table's parts, which the planners key by object) and
//! [`output`] prints it for people or as JSON. What cannot be known offline (elements the
//! kernel learns at run time, interfaces not given) is reported as such, never guessed.
//!
//! Files: `packet` (the packet, node facts, what a rule loads), `lookup` (set and key
//! matching), `eval` (chains, rules, statements), `event` (what is recorded), this file
//! (hooks in order, one path per `numgen` bucket), `provenance`, `output`, `request` (the question, also as a
//! query string for `--live`), `live` (`--live`: asks the admin endpoint), `offline` (planned tables, and any tables, as the admin
//! endpoint's `/explain` does), `trace` (`--live --trace`: the kernel's trace of real packets, mapped
//! back to objects through the same provenance).

pub mod eval;
pub mod event;
pub mod live;
pub mod lookup;
pub mod offline;
pub mod output;
pub mod packet;
pub mod provenance;
pub mod request;
pub mod trace;

use eval::{Outcome, Walker};
pub use event::{Action, Event, Path, Verdict};
use packet::{NodeFacts, Packet};

use crate::nft::ir::{Hook, Table};

/// Where br_netfilter hands bridged IP traffic to the inet hooks, in the bridge's own
/// priorities (`NF_BR_PRI_BRNF`: prerouting at 0, forward at -1).
const BRNF_PREROUTING: i32 = 0;
const BRNF_FORWARD: i32 = -1;

/// A table's base chains of a hook whose priority the function accepts (`None`: skipped).
type HookStep<'t> = (Option<&'t Table>, Hook, &'t dyn Fn(i32) -> bool);

/// Most paths explained (one per combination of `numgen` buckets met).
pub const MAX_PATHS: usize = 64;

/// The tables a packet meets, flattened (parts merged: what the kernel holds).
#[derive(Debug, Clone)]
pub struct Tables {
    pub inet: Table,
    pub bridge: Option<Table>,
}

impl Tables {
    pub fn new(inet: &Table, bridge: Option<&Table>) -> Tables {
        Tables {
            inet: inet.flatten(),
            bridge: bridge.map(Table::flatten),
        }
    }
}

/// How the packet reaches the node's hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// Routed (pods behind /32 routes, traffic from outside, host traffic).
    #[default]
    Routed,
    /// Between two pods on one Linux bridge: the bridge table's forward hook, and with
    /// `br_netfilter` the inet hooks after it.
    Bridged { br_netfilter: bool },
}

/// What to explain.
#[derive(Debug, Clone)]
pub struct Query {
    pub packet: Packet,
    pub topology: Topology,
}

/// Every path of the packet: one per combination of `numgen` buckets (each Service backend
/// a random choice could pick), at most [`MAX_PATHS`].
pub fn explain_paths(tables: &Tables, facts: &NodeFacts, query: &Query) -> Vec<Path> {
    let mut paths = Vec::new();
    let mut forced = Vec::new();
    loop {
        let path = walk(tables, facts, query, forced);
        let next = next_choice(&path);
        paths.push(path);
        match next {
            Some(f) if paths.len() < MAX_PATHS => forced = f,
            _ => return paths,
        }
    }
}

/// The buckets of the next path (an odometer over the choices met), `None` after the last.
fn next_choice(path: &Path) -> Option<Vec<u32>> {
    let c = &path.choices;
    (0..c.len())
        .rev()
        .find(|&j| c[j].picked + 1 < c[j].of)
        .map(|j| {
            let mut forced: Vec<u32> = c[..j].iter().map(|c| c.picked).collect();
            forced.push(c[j].picked + 1);
            forced
        })
}

/// One walk through the hooks the packet meets, with the given `numgen` buckets.
pub fn walk(tables: &Tables, facts: &NodeFacts, query: &Query, forced: Vec<u32>) -> Path {
    let mut w = Walker::new(facts, query.packet.clone(), forced);
    let mut hooks = Vec::new();
    let verdict = walk_hooks(tables, &mut w, query, &mut hooks);
    Path {
        choices: w.choices,
        hooks,
        events: w.events,
        verdict,
        packet: w.packet,
    }
}

fn walk_hooks(tables: &Tables, w: &mut Walker, query: &Query, hooks: &mut Vec<String>) -> Verdict {
    let mut run_where = |w: &mut Walker, table: &Table, hook: Hook, keep: &dyn Fn(i32) -> bool| {
        let name = format!("{} {}", table.family.keyword(), eval::hook_name(hook));
        if hooks.last() != Some(&name) {
            hooks.push(name);
        }
        match w.run_hook_where(table, hook, keep) {
            Outcome::Accept => None,
            Outcome::Drop => Some(Verdict::Dropped),
            Outcome::Reject => Some(Verdict::Rejected),
        }
    };
    let all = |_: i32| true;
    if let Topology::Bridged { br_netfilter } = query.topology {
        // The bridge's hooks run their chains by priority. br_netfilter hooks in at
        // `NF_BR_PRI_BRNF` (0): it runs the inet prerouting hook inside bridge prerouting
        // at 0, the inet forward hook inside bridge forward at -1, and inet postrouting
        // last; bridge chains above those priorities run after the inet hooks.
        let bridge = tables.bridge.as_ref();
        let before = |at: i32| move |p: i32| p < at;
        let after = |at: i32| move |p: i32| p >= at;
        let steps: [HookStep; 6] = [
            (bridge, Hook::Prerouting, &before(BRNF_PREROUTING)),
            (br_netfilter.then_some(&tables.inet), Hook::Prerouting, &all),
            (bridge, Hook::Prerouting, &after(BRNF_PREROUTING)),
            (bridge, Hook::Forward, &before(BRNF_FORWARD)),
            (br_netfilter.then_some(&tables.inet), Hook::Forward, &all),
            (bridge, Hook::Forward, &after(BRNF_FORWARD)),
        ];
        for (table, hook, keep) in steps {
            let has = |t: &&Table| {
                eval::base_chains(t, hook)
                    .iter()
                    .any(|c| c.base.is_some_and(|b| keep(b.priority)))
            };
            if let Some(table) = table.filter(has)
                && let Some(v) = run_where(w, table, hook, keep)
            {
                return v;
            }
        }
        if br_netfilter && let Some(v) = run_where(w, &tables.inet, Hook::Postrouting, &all) {
            return v;
        }
        return Verdict::Bridged;
    }
    let mut run = |w: &mut Walker, table: &Table, hook: Hook| run_where(w, table, hook, &all);
    let host = w.facts.is_local(query.packet.src);
    let first = if host { Hook::Output } else { Hook::Prerouting };
    if let Some(v) = run(w, &tables.inet, first) {
        return v;
    }
    // The route lookup after the first hook: to a local address (after DNAT), or handed
    // to a transparent proxy, is local delivery.
    let local = w.tproxied || w.facts.is_local(w.packet.dst);
    let rest: &[Hook] = match (host, local) {
        (false, false) => &[Hook::Forward, Hook::Postrouting],
        (false, true) => &[Hook::Input],
        (true, false) => &[Hook::Postrouting],
        (true, true) => &[Hook::Postrouting, Hook::Input],
    };
    for hook in rest {
        if let Some(v) = run(w, &tables.inet, *hook) {
            return v;
        }
    }
    if local {
        Verdict::DeliveredLocally
    } else {
        Verdict::Forwarded
    }
}

/// The verdict of every path when they agree; `None` when the `numgen` bucket decides.
pub fn overall(paths: &[Path]) -> Option<Verdict> {
    let first = paths.first()?.verdict;
    paths.iter().all(|p| p.verdict == first).then_some(first)
}

#[cfg(test)]
mod tests;
