//! What the features need from outside the snapshot before they can plan, and the answers
//! they plan from: the addresses of the EgressFirewall `dnsName` rules' names. The planner
//! asks nobody: the features say what they need ([`Asks`], gathered by `plan::asks` from the
//! snapshot and their memory), whoever runs the planner has it answered ([`Answerer`]: the
//! resolver task in run mode, one resolution for `--once`, nothing for fake backends), and
//! the features read the [`Answers`] through their `Inputs`. The reconciler and its loop hold
//! an `Answerer` without knowing what it answers.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// What the next plan needs answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asks {
    /// The DNS names of `dnsName` rules in force (remembered objects included): what the
    /// resolver must keep fresh.
    pub dns_names: BTreeSet<String>,
}

impl Asks {
    /// What `--dry-run` says it leaves unanswered (one line), if anything.
    pub fn unanswered_in_dry_run(&self) -> Option<String> {
        if self.dns_names.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.dns_names.iter().map(String::as_str).collect();
        Some(format!(
            "dnsName rules are resolved when applied, not in --dry-run: {}",
            names.join(", ")
        ))
    }
}

/// The answers a plan reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    pub dns: DnsAnswers,
}

/// Whoever has the features' [`Asks`] answered before each plan (it may wait a little for an
/// answer a first plan should not go out without).
pub trait Answerer: Send {
    fn answer(&mut self, asks: &Asks) -> Answers;
}

/// Answers nothing: plans without DNS answers (fake backends, tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAnswers;

impl Answerer for NoAnswers {
    fn answer(&mut self, _asks: &Asks) -> Answers {
        Answers::default()
    }
}

/// The current addresses of every DNS name in use: a planner input value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsAnswers {
    names: BTreeMap<String, Vec<IpAddr>>,
}

impl DnsAnswers {
    /// The addresses of `name` (case-insensitive), sorted; empty if unknown.
    pub fn get(&self, name: &str) -> &[IpAddr] {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.names.get(&name).map(Vec::as_slice).unwrap_or_default()
    }

    /// True once a resolution of `name` was attempted (its answer may be empty).
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(&name.to_ascii_lowercase())
    }

    pub fn insert(&mut self, name: &str, mut addrs: Vec<IpAddr>) {
        addrs.sort();
        addrs.dedup();
        self.names.insert(name.to_ascii_lowercase(), addrs);
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}
