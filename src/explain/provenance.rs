//! From a decision back to the object that planned it. Structured, not guessed from names:
//! the planners put each object's chains, sets and map elements in a table part keyed by
//! the object (`fw/<ns>`, `np/<ns>/<name>`, `svc/<ns>/<name>`, `qos/<ns>`, `eip`, ...), so
//! the part that holds a decision's element or chain names its object. The rule's index and
//! text come from the comment the planner wrote on the rule or element (`rule 2: Allow
//! ...`, `NetworkPolicy ns/name ingress[0]`, `EgressQoS ns rule 1`).

use super::event::{Action, Event, Path};
use super::lookup::show_key;
use crate::nft::ir::Table;
use serde::Serialize;
use std::collections::HashMap;

/// The object behind a decision and what it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// `EgressFirewall`, `NetworkPolicy`, `Service`, `EgressQoS`, `EgressIP`, or `nodeplane`
    /// for the agent's own scaffolding (dispatch, anti-spoofing, masquerade marks).
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The rule in the object: `rule 2`, `ingress[0]`.
    pub rule: Option<String>,
    /// The rule's text as planned (the comment the planner wrote).
    pub text: Option<String>,
    /// One sentence for what the decision means when the rule alone does not say it.
    pub why: Option<String>,
}

/// Which part of the planned tables holds each chain, set and element.
#[derive(Debug, Default)]
pub struct Index {
    chains: HashMap<String, String>,
    sets: HashMap<String, String>,
    elements: HashMap<(String, String), String>,
    /// EgressIP name by address, for SNAT decisions.
    egress_ips: HashMap<String, String>,
}

impl Index {
    /// Indexes the parts of the planned (not flattened) tables.
    pub fn new<'a>(tables: impl IntoIterator<Item = &'a Table>) -> Index {
        let mut index = Index::default();
        for table in tables {
            for key in table.part_keys() {
                let Some(part) = table.part(key) else {
                    continue;
                };
                for chain in part.chains.keys() {
                    index.chains.insert(chain.clone(), key.to_string());
                }
                for set in part.sets.keys() {
                    index.sets.insert(set.clone(), key.to_string());
                }
                for (set, elements) in &part.elements {
                    for k in elements.keys() {
                        index
                            .elements
                            .insert((set.clone(), show_key(k)), key.to_string());
                    }
                }
            }
        }
        index
    }

    /// Names the EgressIP objects by their addresses (`egressIPs` of each).
    pub fn with_egress_ips(
        mut self,
        eips: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Self {
        for (name, ips) in eips {
            for ip in ips {
                self.egress_ips.insert(ip, name.clone());
            }
        }
        self
    }

    fn part_of(&self, event: &Event) -> Option<&str> {
        let element = event.element.as_ref().and_then(|e| {
            let key = (e.set.clone(), e.key.clone());
            self.elements.get(&key).or_else(|| self.sets.get(&e.set))
        });
        element
            .or_else(|| self.chains.get(&event.chain))
            .map(String::as_str)
    }

    /// The object and rule behind `event` of `path`.
    pub fn origin(&self, event: &Event, path: &Path) -> Origin {
        let part = self.part_of(event);
        let mut origin = object_of(part.unwrap_or(""), &event.chain);
        let comment = event
            .element
            .as_ref()
            .and_then(|e| e.comment.clone())
            .or_else(|| event.comment.clone());
        if let Some(c) = &comment {
            (origin.rule, origin.text) = rule_of(c);
        }
        origin.why = self.why(event, path, part, &origin);
        origin
    }

    fn why(&self, event: &Event, path: &Path, part: Option<&str>, o: &Origin) -> Option<String> {
        match &event.action {
            Action::Drop if part.is_some_and(|p| p.starts_with("np-set/")) => {
                Some(self.isolation(event, path))
            }
            Action::Goto { to } | Action::Jump { to }
                if o.kind == "EgressFirewall" && o.rule.is_none() =>
            {
                self.chains
                    .get(to)
                    .map(|_| "the source pod's namespace has an EgressFirewall".to_string())
            }
            Action::Snat { to } => {
                let ip = to.split(':').next().unwrap_or(to);
                self.egress_ips
                    .get(ip)
                    .map(|n| format!("EgressIP {}", crate::text::quote(n)))
            }
            Action::Masquerade => Some("source becomes the output interface's address".into()),
            _ => None,
        }
    }

    /// "isolated by a/b, a/c: no rule allows": the policies whose chains the isolation chain
    /// jumped to before its drop.
    fn isolation(&self, event: &Event, path: &Path) -> String {
        let mut policies: Vec<String> = path
            .events
            .iter()
            .filter(|e| e.chain == event.chain)
            .filter_map(|e| match &e.action {
                Action::Jump { to } => self.chains.get(to),
                _ => None,
            })
            .map(|p| {
                let o = object_of(p, "");
                let ns = o.namespace.as_deref().unwrap_or("");
                let name = o.name.as_deref().unwrap_or("");
                crate::text::quote(&format!("{ns}/{name}"))
            })
            .collect();
        policies.dedup();
        let dir = if event.chain.starts_with("np-in") {
            "ingress"
        } else {
            "egress"
        };
        format!(
            "{dir} isolated by NetworkPolicy {}: no rule allows",
            policies.join(", ")
        )
    }
}

/// The object a part key names. Namespaces and names cannot hold `/` (DNS labels and
/// subdomains), so the first `/` after the prefix splits them.
fn object_of(part: &str, chain: &str) -> Origin {
    let (prefix, rest) = part.split_once('/').unwrap_or((part, ""));
    let (ns, name) = rest.split_once('/').unwrap_or((rest, ""));
    let some = |s: &str| Some(s.to_string());
    let (kind, namespace, name) = match prefix {
        "fw" => ("EgressFirewall", some(rest), some("default")),
        "qos" => ("EgressQoS", some(rest), some("default")),
        "svc" => ("Service", some(ns), some(name)),
        "np" => ("NetworkPolicy", some(ns), some(name)),
        "np-set" | "np-peers" | "np-ports" | "np-self" => ("NetworkPolicy", None, None),
        "eip" => ("EgressIP", None, None),
        "svc-nodeport-addrs" => ("Service", None, None),
        _ => (kind_of_chain(chain), None, None),
    };
    Origin {
        kind,
        namespace,
        name,
        rule: None,
        text: None,
        why: None,
    }
}

/// The feature a top-level chain serves, from the agent's own fixed chain names.
fn kind_of_chain(chain: &str) -> &'static str {
    let features = [
        ("fw-", "EgressFirewall"),
        ("np-", "NetworkPolicy"),
        ("svc-", "Service"),
        ("sep-", "Service"),
        ("sva-", "Service"),
        ("nat-", "Service"),
        ("eip-", "EgressIP"),
        ("qos-", "EgressQoS"),
        ("mangle-", "EgressQoS"),
    ];
    features
        .iter()
        .find(|(p, _)| chain.starts_with(p))
        .map_or("nodeplane", |(_, k)| k)
}

/// The rule index and text of a planner's comment.
fn rule_of(comment: &str) -> (Option<String>, Option<String>) {
    if let Some((n, text)) = comment
        .strip_prefix("rule ")
        .and_then(|r| r.split_once(": "))
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return (Some(format!("rule {n}")), Some(text.to_string()));
    }
    if comment.starts_with("NetworkPolicy ") && comment.ends_with(']') {
        let last = comment.rsplit(' ').next().unwrap_or_default();
        return (Some(last.to_string()), Some(comment.to_string()));
    }
    if let Some((_, n)) = comment.rsplit_once(" rule ")
        && comment.starts_with("EgressQoS ")
        && n.chars().all(|c| c.is_ascii_digit())
    {
        return (Some(format!("rule {n}")), Some(comment.to_string()));
    }
    (None, Some(comment.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_comments_give_rule_index_and_text() {
        let (r, t) = rule_of("rule 2: Allow 192.168.50.53/32 ports TCP/53");
        assert_eq!(r.as_deref(), Some("rule 2"));
        assert_eq!(t.as_deref(), Some("Allow 192.168.50.53/32 ports TCP/53"));
        let (r, _) = rule_of("NetworkPolicy backend/api-from-web ingress[0]");
        assert_eq!(r.as_deref(), Some("ingress[0]"));
        let (r, _) = rule_of("EgressQoS frontend rule 1");
        assert_eq!(r.as_deref(), Some("rule 1"));
        assert_eq!(rule_of("pod-traffic-probe").0, None);
    }

    #[test]
    fn part_keys_name_their_objects() {
        let o = object_of("svc/backend/api", "svc-x");
        assert_eq!(
            (o.kind, o.namespace.as_deref(), o.name.as_deref()),
            ("Service", Some("backend"), Some("api"))
        );
        let o = object_of("fw/backend", "");
        assert_eq!(
            (o.kind, o.name.as_deref()),
            ("EgressFirewall", Some("default"))
        );
        assert_eq!(object_of("", "filter-forward").kind, "nodeplane");
    }
}
