//! What foreign commits changed in the table ([`Changes`], per object [`Edits`]) and the report
//! the monitor hands on ([`Drift`]), with its one-line description.

use super::wire::{
    DELCHAIN, DELFLOWTABLE, DELOBJ, DELRULE, DELSET, DELSETELEM, DELTABLE, DESTROYCHAIN,
    DESTROYFLOWTABLE, DESTROYOBJ, DESTROYRULE, DESTROYSET, DESTROYSETELEM, DESTROYTABLE, NEWCHAIN,
    NEWFLOWTABLE, NEWOBJ, NEWRULE, NEWSET, NEWSETELEM, NEWTABLE,
};
use crate::nft::ir::Family;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

/// Additions and removals to one object of the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Edits {
    /// The object itself was created.
    pub created: bool,
    /// The object itself was deleted.
    pub deleted: bool,
    /// Rules (of a chain) or elements (of a set) added.
    pub added: u32,
    /// Rules or elements removed.
    pub removed: u32,
}

/// What foreign commits changed in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub table_created: bool,
    pub table_deleted: bool,
    pub chains: BTreeMap<String, Edits>,
    pub sets: BTreeMap<String, Edits>,
    /// Stateful objects and flowtables (the agent has none).
    pub others: BTreeMap<String, Edits>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }

    fn merge(&mut self, other: &Changes) {
        self.table_created |= other.table_created;
        self.table_deleted |= other.table_deleted;
        for (mine, theirs) in [
            (&mut self.chains, &other.chains),
            (&mut self.sets, &other.sets),
            (&mut self.others, &other.others),
        ] {
            for (name, e) in theirs {
                let m = mine.entry(name.clone()).or_default();
                m.created |= e.created;
                m.deleted |= e.deleted;
                m.added += e.added;
                m.removed += e.removed;
            }
        }
    }
}

/// "Our table may no longer hold what the agent applied."
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// When the reader saw the commit (the earliest, for merged reports).
    pub at: Instant,
    pub changes: Changes,
    /// Who committed, as the kernel names them: `nft (pid 1234)`.
    pub by: BTreeSet<String>,
    /// Notifications were lost (receive buffer overrun): anything may have changed.
    pub events_lost: bool,
    /// Someone committed while the monitor was out of the group for one of the agent's own
    /// large commits ([`Quiet`](super::Quiet)): what changed is unknown.
    pub unseen: bool,
}

impl Drift {
    /// One report for a burst: the earliest time, every change and sender.
    pub fn merge(&mut self, other: Drift) {
        self.at = self.at.min(other.at);
        self.changes.merge(&other.changes);
        self.by.extend(other.by);
        self.events_lost |= other.events_lost;
        self.unseen |= other.unseen;
    }

    /// The largest kind of object touched, for a metric label: `table`, `chain`, `set`,
    /// `other` or `unknown` (events lost).
    pub fn object(&self) -> &'static str {
        let c = &self.changes;
        if c.table_created || c.table_deleted {
            "table"
        } else if !c.chains.is_empty() {
            "chain"
        } else if !c.sets.is_empty() {
            "set"
        } else if !c.others.is_empty() {
            "other"
        } else {
            "unknown"
        }
    }
}

/// How many named objects a description lists before "and N more".
const DESCRIBED: usize = 4;

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.changes;
        let mut parts: Vec<String> = Vec::new();
        if c.table_deleted {
            let n = c.chains.len() + c.sets.len() + c.others.len();
            parts.push(match (c.table_created, n) {
                (true, _) => "table deleted and created again".into(),
                (false, 0) => "table deleted".into(),
                (false, n) => format!("table deleted ({n} chains and sets with it)"),
            });
        } else {
            if c.table_created {
                parts.push("table created".into());
            }
            // Another family's table first (its chains and sets follow it).
            let (tables, objects): (Vec<_>, Vec<_>) =
                c.others.iter().partition(|(n, _)| n.starts_with("table "));
            let all = tables
                .into_iter()
                .map(|(n, e)| describe("", n, e, ""))
                .chain(
                    c.chains
                        .iter()
                        .map(|(n, e)| describe("chain", n, e, "rule")),
                )
                .chain(c.sets.iter().map(|(n, e)| describe("set", n, e, "element")))
                .chain(
                    objects
                        .into_iter()
                        .map(|(n, e)| describe("object", n, e, "")),
                );
            let all: Vec<String> = all.collect();
            let more = all.len().saturating_sub(DESCRIBED);
            parts.extend(all.into_iter().take(DESCRIBED));
            if more > 0 {
                parts.push(format!("and {more} more objects"));
            }
        }
        if self.unseen {
            parts.push(
                "a commit by someone else while the monitor was not listening (the agent's own \
                 large commit), the table may have changed"
                    .into(),
            );
        }
        if self.events_lost {
            parts.push(
                "notifications lost (receive buffer overrun), the table may have changed".into(),
            );
        }
        write!(f, "{}", parts.join("; "))?;
        if !self.by.is_empty() {
            let by: Vec<&str> = self.by.iter().map(String::as_str).collect();
            write!(f, " (by {})", by.join(", "))?;
        }
        Ok(())
    }
}

fn describe(kind: &str, name: &str, e: &Edits, item: &str) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    let mut what = Vec::new();
    match (e.created, e.deleted) {
        (true, true) => what.push("deleted and created".to_string()),
        (true, false) => what.push("created".into()),
        (false, true) => what.push("deleted".into()),
        (false, false) => {}
    }
    if !e.deleted || e.created {
        if e.added > 0 {
            what.push(format!("{} {item}{} added", e.added, plural(e.added)));
        }
        if e.removed > 0 {
            what.push(format!("{} {item}{} deleted", e.removed, plural(e.removed)));
        }
    }
    let name = if kind.is_empty() {
        name.to_string()
    } else {
        format!("{kind} {name}")
    };
    format!("{name} {}", what.join(", "))
}

pub(super) fn record(c: &mut Changes, family: Family, msg: u8, name: Option<&[u8]>, items: u32) {
    let name = || {
        let n = String::from_utf8_lossy(name.unwrap_or_default());
        match family {
            Family::Inet => n.into_owned(),
            other => format!("{} {n}", other.keyword()),
        }
    };
    match msg {
        // Another family's table is named like its objects: `table bridge deleted`.
        NEWTABLE | DELTABLE | DESTROYTABLE if family != Family::Inet => {
            let e = c
                .others
                .entry(format!("table {}", family.keyword()))
                .or_default();
            e.created |= msg == NEWTABLE;
            e.deleted |= msg != NEWTABLE;
        }
        NEWTABLE => c.table_created = true,
        DELTABLE | DESTROYTABLE => c.table_deleted = true,
        NEWCHAIN => c.chains.entry(name()).or_default().created = true,
        DELCHAIN | DESTROYCHAIN => c.chains.entry(name()).or_default().deleted = true,
        NEWRULE => c.chains.entry(name()).or_default().added += 1,
        DELRULE | DESTROYRULE => c.chains.entry(name()).or_default().removed += 1,
        NEWSET => c.sets.entry(name()).or_default().created = true,
        DELSET | DESTROYSET => c.sets.entry(name()).or_default().deleted = true,
        NEWSETELEM => c.sets.entry(name()).or_default().added += items,
        DELSETELEM | DESTROYSETELEM => c.sets.entry(name()).or_default().removed += items,
        NEWOBJ | NEWFLOWTABLE => c.others.entry(name()).or_default().created = true,
        DELOBJ | DESTROYOBJ | DELFLOWTABLE | DESTROYFLOWTABLE => {
            c.others.entry(name()).or_default().deleted = true
        }
        _ => {}
    }
}
