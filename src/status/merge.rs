//! Per-node status messages merged into one status, the way OVN-Kubernetes zones do it: each
//! node agent owns exactly one `<node>: <verdict>` entry of `status.messages` (a list-type=set
//! under its own server-side-apply field manager), and `status.status` is derived from all
//! entries by a rule every node computes identically, so agents agree instead of fighting.
//! The texts are OVN-Kubernetes' own: `status.status` is `<Kind> Rules applied` or, when any
//! node's entry is a failure, `<Kind> Rules not correctly applied` (the reasons are in the
//! entries), as its cluster manager writes it.

/// What this node wants the object's status to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPatch {
    /// The aggregate `status.status`.
    pub status: String,
    /// This node's own entry (the only one it applies).
    pub message: String,
}

/// `EgressFirewall Rules applied` or `EgressFirewall Rules not correctly applied: <reason>`
/// (the same text for EgressQoS with its own kind name).
///
/// One line whatever the reason quotes ([`crate::text::one_line`]): `status.messages` entries
/// are read as lines by `kubectl` and by the aggregation of every node's entry.
pub fn verdict(kind: &str, failure: Option<&str>) -> String {
    match failure {
        None => format!("{kind} Rules applied"),
        Some(reason) => format!(
            "{kind} Rules not correctly applied: {}",
            crate::text::one_line(reason)
        ),
    }
}

pub fn node_message(node: &str, verdict: &str) -> String {
    format!("{node}: {verdict}")
}

/// The aggregate of every node's entry, as OVN-Kubernetes words it: `<Kind> Rules not
/// correctly applied` when any entry is not `<Kind> Rules applied`, else the latter.
pub fn aggregate(kind: &str, messages: &[String]) -> String {
    let applied = verdict(kind, None);
    let failed = messages
        .iter()
        .filter_map(|m| m.split_once(": ").map(|(_, v)| v))
        .any(|v| v != applied);
    if failed {
        format!("{kind} Rules not correctly applied")
    } else {
        applied
    }
}

/// The patch this node should apply given the object's current status, or None when the
/// object already says exactly that (steady state writes nothing).
pub fn desired(
    kind: &str,
    node: &str,
    verdict: &str,
    current_status: Option<&str>,
    current_messages: &[String],
) -> Option<StatusPatch> {
    let ours = node_message(node, verdict);
    let prefix = format!("{node}: ");
    let mut all: Vec<String> = current_messages
        .iter()
        .filter(|m| !m.starts_with(&prefix))
        .cloned()
        .collect();
    all.push(ours.clone());
    let status = aggregate(kind, &all);
    let ours_count = current_messages
        .iter()
        .filter(|m| m.starts_with(&prefix))
        .count();
    let up_to_date = ours_count == 1
        && current_messages.contains(&ours)
        && current_status == Some(status.as_str());
    (!up_to_date).then_some(StatusPatch {
        status,
        message: ours,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EF: &str = "EgressFirewall";

    #[test]
    fn a_verdict_is_one_line_whatever_its_reason_quotes() {
        assert_eq!(
            verdict(EF, Some("bad name x\nadd table ip PWNED4\u{2028}#")),
            "EgressFirewall Rules not correctly applied: bad name x\\nadd table ip PWNED4\\u{2028}#"
        );
    }

    #[test]
    fn first_failure_wins_and_steady_state_is_quiet() {
        let ok = verdict(EF, None);
        let bad = verdict(EF, Some("spec.egress[0].type: must be Allow or Deny"));
        let p = desired(EF, "w1", &ok, None, &[]).unwrap();
        assert_eq!(p.message, "w1: EgressFirewall Rules applied");
        assert_eq!(p.status, "EgressFirewall Rules applied");
        // Another node failed: the aggregate says so on every node alike.
        let others = vec![node_message("w2", &bad)];
        let p = desired(EF, "w1", &ok, Some("x"), &others).unwrap();
        // OVN-Kubernetes' text, verbatim: the reason is in the node's entry only.
        assert_eq!(p.status, "EgressFirewall Rules not correctly applied");
        let p3 = desired(EF, "w3", &ok, Some("x"), &others).unwrap();
        assert_eq!(p3.status, p.status);
        // Already there: nothing to write.
        let current = vec![node_message("w1", &ok), node_message("w2", &bad)];
        assert_eq!(desired(EF, "w1", &ok, Some(&p.status), &current), None);
        // Our old entry is replaced, not added to.
        let current = vec![node_message("w1", &bad)];
        let p = desired(EF, "w1", &ok, Some(&p.status), &current).unwrap();
        assert_eq!(p.status, ok);
    }
}
