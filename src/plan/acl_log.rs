//! ACL logging in the plan (namespaces annotated `k8s.ovn.org/acl-logging`, see
//! [`crate::api::acl_logging`]).
//!
//! A logged verdict (an EgressFirewall rule's allow or deny, a NetworkPolicy's) does not
//! `accept`/`drop` in place but goes to a chain of its own, `acl-<id>`:
//!
//! ```text
//! update @acl-rate-<ns> { meta protocol limit rate over R/second burst R packets } drop
//! log prefix "acl:<id>" group G drop
//! ```
//!
//! The namespace's rate set (part `acl/<namespace>`) holds one token bucket per IP family,
//! shared by every logged verdict of the namespace: beyond `R` a second the verdict is given
//! without the log, so a flood costs the log reader at most `R` lines a second per namespace.
//! The prefix carries only the id, a hash of what the verdict is (namespace, object, rule,
//! verdict, severity); the agent maps it back with the [`Book`] of the plan. Names are
//! tenant text and never reach the kernel's log.
//!
//! Without the annotation nothing here is planned: the verdicts stay `accept`/`drop` and the
//! table is what it was. A namespace's chains and rate set are in that namespace's parts, so
//! changing its annotation changes only them.

use crate::api::acl_logging::{self, AclLogging, Severity};
use crate::config::acl_log::AclLogSettings;
use crate::nft::ir::*;
use crate::nft::names::object_name;
use crate::snapshot::Snapshot;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What every logged packet's prefix starts with; the id follows in 16 hex digits.
pub const PREFIX: &str = "acl:";

wire_named_enum! {
    /// Allowed or denied.
    pub enum Action {
        Allow = "allow",
        Deny = "deny",
    }
}

impl Action {
    fn verdict(self) -> Verdict {
        match self {
            Action::Allow => Verdict::Accept,
            Action::Deny => Verdict::Drop,
        }
    }
}

/// One logged verdict: what a log line says about the packet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub namespace: String,
    /// `EgressFirewall`, `NetworkPolicy`.
    pub kind: &'static str,
    pub object: String,
    /// The rule in the object (`rule 2: Deny 0.0.0.0/0`, `ingress[0]`, `egress: isolated,
    /// no rule allows`).
    pub rule: String,
    pub action: Action,
    pub severity: Severity,
}

impl Entry {
    /// A verdict of `logging`'s namespace if it logs `action`.
    pub fn logged(
        logging: &AclLogging,
        namespace: &str,
        kind: &'static str,
        object: &str,
        rule: String,
        action: Action,
    ) -> Option<Entry> {
        let severity = match action {
            Action::Allow => logging.allow,
            Action::Deny => logging.deny,
        }?;
        Some(Entry {
            namespace: namespace.to_string(),
            kind,
            object: object.to_string(),
            rule,
            action,
            severity,
        })
    }

    /// Stable across plans (so its chain is too) and distinct for distinct entries (64
    /// bits of SHA-256 over an unambiguous encoding).
    pub fn id(&self) -> u64 {
        let mut h = Sha256::new();
        for field in [
            self.namespace.as_str(),
            self.kind,
            self.object.as_str(),
            self.rule.as_str(),
            self.action.as_str(),
            self.severity.as_str(),
        ] {
            h.update((field.len() as u64).to_be_bytes());
            h.update(field.as_bytes());
        }
        let digest = h.finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

/// The chain of logged verdict `id`.
pub fn chain_name(id: u64) -> String {
    format!("acl-{id:016x}")
}

/// The NFLOG prefix of logged verdict `id`.
pub fn prefix(id: u64) -> String {
    format!("{PREFIX}{id:016x}")
}

/// The id in a logged packet's prefix (`None`: not one of ours).
pub fn parse_prefix(prefix: &str) -> Option<u64> {
    let hex = prefix.strip_prefix(PREFIX)?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// The rate set of `namespace`'s logged verdicts.
pub fn rate_set(namespace: &str) -> String {
    object_name("acl-rate", namespace)
}

/// The part holding `namespace`'s rate set (the same from every feature that logs).
pub fn rate_part_key(namespace: &str) -> String {
    format!("acl/{namespace}")
}

/// `namespace`'s rate set: one bucket per IP family, made by the first logged packet.
pub fn rate_part(namespace: &str) -> Part {
    let mut part = Part::default();
    part.add_set(
        Set::new(rate_set(namespace), vec![DataType::EtherType], SetKind::Set)
            .with_flags(SetFlags {
                dynamic: true,
                ..Default::default()
            })
            .with_size(2),
    );
    part
}

/// The chain of a logged verdict: the log within the namespace's rate, then the verdict.
pub fn chain(entry: &Entry, settings: &AclLogSettings) -> Chain {
    let id = entry.id();
    let verdict = Stmt::Verdict(entry.action.verdict());
    let mut chain = Chain::regular(chain_name(id));
    chain.push(Rule::new(vec![
        Stmt::SetLimit {
            set: rate_set(&entry.namespace),
            key: vec![Field::EtherType],
            limit: Limit {
                per_second: settings.rate_limit,
                burst: settings.rate_limit,
            },
        },
        verdict.clone(),
    ]));
    chain.push(Rule::new(vec![
        Stmt::Log {
            prefix: prefix(id),
            group: Some(settings.group),
        },
        verdict,
    ]));
    chain
}

/// The chain of a logged verdict that its caller gives (a NetworkPolicy isolation drop,
/// `jump`ed to from the policy set just before its counted `drop`): the log within the
/// namespace's rate, then back, so the per-policy deny counters count logged namespaces too.
pub fn log_only_chain(entry: &Entry, settings: &AclLogSettings) -> Chain {
    let mut chain = chain(entry, settings);
    for rule in &mut chain.rules {
        if let Some(Stmt::Verdict(v)) = rule.stmts.last_mut() {
            *v = Verdict::Return;
        }
    }
    chain
}

/// A namespace's ACL logging from the snapshot (`None`: no namespace or nothing logged),
/// its annotation's problems into `problems`.
pub fn namespace_logging(
    snapshot: &Snapshot,
    namespace: &str,
    problems: &mut BTreeSet<String>,
) -> Option<AclLogging> {
    let (logging, found) = acl_logging::of_namespace(snapshot.namespace(namespace)?);
    problems.extend(found);
    logging
}

/// What the log reader maps prefixes back to, from one plan; and what was wrong with the
/// annotations it read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    pub entries: BTreeMap<u64, Arc<Entry>>,
    pub problems: BTreeSet<String>,
}

impl Book {
    pub fn merge(&mut self, other: &Book) {
        self.entries
            .extend(other.entries.iter().map(|(k, v)| (*k, v.clone())));
        self.problems.extend(other.problems.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rule: &str) -> Entry {
        Entry {
            namespace: "shop".into(),
            kind: "EgressFirewall",
            object: "default".into(),
            rule: rule.into(),
            action: Action::Deny,
            severity: Severity::Alert,
        }
    }

    #[test]
    fn ids_are_stable_distinct_and_round_trip_through_the_prefix() {
        let (a, b) = (entry("rule 0"), entry("rule 1"));
        assert_eq!(a.id(), entry("rule 0").id());
        assert_ne!(a.id(), b.id());
        assert_eq!(parse_prefix(&prefix(a.id())), Some(a.id()));
        assert_eq!(parse_prefix("acl:12"), None);
        assert_eq!(parse_prefix("other:0123456789abcdef"), None);
        // No tenant text in the prefix or the chain name.
        let evil = Entry {
            namespace: "x\"; flush ruleset".into(),
            ..entry("rule 0")
        };
        assert!(!prefix(evil.id()).contains("flush"));
        assert!(crate::nft::names::is_valid_identifier(&chain_name(
            evil.id()
        )));
    }

    #[test]
    fn the_chain_logs_within_the_namespace_rate_then_gives_the_verdict() {
        let settings = AclLogSettings {
            group: 7,
            rate_limit: 20,
        };
        let e = entry("rule 0");
        let text: Vec<String> = chain(&e, &settings)
            .rules
            .iter()
            .map(crate::nft::render::rule_text)
            .collect();
        let set = rate_set("shop");
        assert_eq!(
            text,
            [
                format!(
                    "update @{set} {{ meta protocol limit rate over 20/second burst 20 packets }} drop"
                ),
                format!("log prefix \"acl:{:016x}\" group 7 drop", e.id()),
            ]
        );
    }
}
