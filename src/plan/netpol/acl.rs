//! ACL logging of NetworkPolicy verdicts (see `plan::acl_log`): in a namespace annotated
//! `k8s.ovn.org/acl-logging`, a policy rule's `accept` becomes `goto` its logged chain
//! (`allow`), and a policy set's final drop is preceded by `jump` to the namespace's logged
//! deny chain of that direction (`deny`, "isolated, no rule allows"), which logs within the
//! rate and drops. The deny chains are part `np-acl/<namespace>`, the rate set part
//! `acl/<namespace>` (the same as the EgressFirewall's).

use crate::api::acl_logging::AclLogging;
use crate::api::network_policy::ValidatedPolicy;
use crate::config::acl_log::AclLogSettings;
use crate::nft::ir::{Part, Parts, Verdict};
use crate::plan::acl_log::{self, Action, Book, Entry};
use crate::snapshot::Snapshot;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A namespace's logging and the agent's settings.
pub type Acl = (AclLogging, AclLogSettings);

/// Logged verdicts by id.
pub type Logged = Vec<(u64, Arc<Entry>)>;

const KIND: &str = "NetworkPolicy";

/// The namespaces' logging, looked up once per namespace and carried from plan to plan until
/// a namespace changes (`Lookup::carried`): a plan that re-plans one policy reads one
/// namespace's annotation, not every policy's.
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    seen: imbl::OrdMap<String, Option<AclLogging>>,
    /// What was wrong with a namespace's annotation, for the namespaces with a problem.
    problems: imbl::OrdMap<String, BTreeSet<String>>,
}

impl Lookup {
    /// Last plan's lookups for the next plan: kept, or none when a namespace changed.
    pub fn carried(&self, namespaces_changed: bool) -> Lookup {
        if namespaces_changed {
            Lookup::default()
        } else {
            self.clone()
        }
    }

    pub fn get(&mut self, snapshot: &Snapshot, ns: &str, settings: AclLogSettings) -> Option<Acl> {
        if !self.seen.contains_key(ns) {
            let mut problems = BTreeSet::new();
            let l = acl_log::namespace_logging(snapshot, ns, &mut problems);
            self.seen.insert(ns.to_string(), l);
            if !problems.is_empty() {
                self.problems.insert(ns.to_string(), problems);
            }
        }
        self.seen.get(ns).copied().flatten().map(|l| (l, settings))
    }

    /// The problems of the annotations of the namespaces `in_use` holds (those with a policy
    /// in force: each was looked up when its policies were planned).
    pub fn problems(&self, in_use: impl Fn(&str) -> bool) -> BTreeSet<String> {
        let with_policies = self.problems.iter().filter(|(ns, _)| in_use(ns));
        with_policies.flat_map(|(_, p)| p.iter().cloned()).collect()
    }
}

/// The verdict of rule `i` of `policy` that allows: `accept`, or `goto` its logged chain
/// (added to `part`, its entry to `logged`).
pub fn allow_verdict(
    acl: Option<&Acl>,
    policy: &ValidatedPolicy,
    direction: &str,
    i: usize,
    part: &mut Part,
    logged: &mut Logged,
) -> Verdict {
    let Some((logging, settings)) = acl else {
        return Verdict::Accept;
    };
    let rule = format!("{direction}[{i}]");
    let (ns, name) = (&policy.namespace, &policy.name);
    let Some(entry) = Entry::logged(logging, ns, KIND, name, rule, Action::Allow) else {
        return Verdict::Accept;
    };
    let id = entry.id();
    if !logged.iter().any(|(have, _)| *have == id) {
        part.add_chain(acl_log::chain(&entry, settings));
        logged.push((id, Arc::new(entry)));
    }
    Verdict::Goto(acl_log::chain_name(id))
}

/// The deny entry of `namespace` for `direction`, if it logs denies.
fn deny_entry(acl: &Acl, namespace: &str, direction: &str) -> Option<Entry> {
    let rule = format!("{direction}: isolated, no rule allows");
    Entry::logged(&acl.0, namespace, KIND, "", rule, Action::Deny)
}

/// The logged deny chain of `namespace` for `direction`, when `acl` logs denies.
pub fn deny_chain(acl: Option<&Acl>, namespace: &str, direction: &str) -> Option<Arc<str>> {
    let e = deny_entry(acl?, namespace, direction)?;
    Some(Arc::from(acl_log::chain_name(e.id())))
}

/// The book of the plan and the namespaces' ACL parts in `parts` (those of namespaces no
/// longer logged removed); returns the book and the logged namespaces.
/// `policies`: each logging policy's namespace, logged allow verdicts and whether it logs
/// denies; `problems`: what was wrong with the annotations (`Lookup::problems`).
pub fn finish<'p>(
    policies: impl Iterator<Item = (&'p str, &'p Logged, bool)>,
    before: &BTreeSet<String>,
    lookup: &mut Lookup,
    problems: BTreeSet<String>,
    snapshot: &Snapshot,
    settings: AclLogSettings,
    parts: &mut Parts,
) -> (Book, BTreeSet<String>) {
    let mut book = Book::default();
    let mut namespaces = BTreeSet::new();
    for (namespace, logged, denies) in policies {
        if logged.is_empty() && !denies {
            continue;
        }
        namespaces.insert(namespace.to_string());
        book.entries
            .extend(logged.iter().map(|(id, e)| (*id, e.clone())));
    }
    for ns in before.difference(&namespaces) {
        parts.remove(&acl_log::rate_part_key(ns));
        parts.remove(&format!("np-acl/{ns}"));
    }
    for ns in &namespaces {
        let mut deny = Part::default();
        if let Some(acl) = lookup.get(snapshot, ns, settings) {
            for d in ["ingress", "egress"] {
                if let Some(e) = deny_entry(&acl, ns, d) {
                    deny.add_chain(acl_log::log_only_chain(&e, &acl.1));
                    book.entries.insert(e.id(), Arc::new(e));
                }
            }
        }
        parts.insert(acl_log::rate_part_key(ns), Arc::new(acl_log::rate_part(ns)));
        parts.insert(format!("np-acl/{ns}"), Arc::new(deny));
    }
    book.problems = problems;
    (book, namespaces)
}
