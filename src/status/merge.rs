//! Per-node status messages merged into one status, the way OVN-Kubernetes zones do it: each
//! node agent owns exactly one `<node>: <verdict>` entry of `status.messages` (a list-type=set
//! under its own server-side-apply field manager), and `status.status` is derived from all
//! entries by a rule every node computes identically, so agents agree instead of fighting.
//! The texts are OVN-Kubernetes' own: `status.status` is `<Kind> Rules applied` or, when any
//! node's entry is a failure, `<Kind> Rules not correctly applied` (the reasons are in the
//! entries), as its cluster manager writes it.
//!
//! EgressQoS carries OVN-Kubernetes' `status.conditions` too (its CRD has no `messages`): each
//! node owns the condition `Ready-In-Zone-<node>` (every node its own zone, as OVN-Kubernetes'
//! interconnect zones), `True`/`SetupSucceeded` or `False`/`SetupFailed` with the same verdict
//! as message, the way its zone controllers write them, so that its cluster manager and tools
//! read nodeplane's verdicts.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// What this node wants the object's status to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPatch {
    /// The aggregate `status.status`.
    pub status: String,
    /// This node's own entry (the only one it applies).
    pub message: String,
    /// This node's own condition (EgressQoS).
    pub condition: Option<ZoneCondition>,
}

/// OVN-Kubernetes' condition type prefix; the zone is the node.
pub const ZONE_CONDITION_PREFIX: &str = "Ready-In-Zone-";
pub const REASON_SETUP_SUCCEEDED: &str = "SetupSucceeded";
pub const REASON_SETUP_FAILED: &str = "SetupFailed";
/// The API's bound on a condition message, in bytes.
const CONDITION_MESSAGE_MAX: usize = 32768;

/// This node's `status.conditions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneCondition {
    pub type_: String,
    /// `True` or `False`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// RFC 3339, seconds: kept from the current condition while its status stays.
    pub last_transition_time: String,
}

impl ZoneCondition {
    /// This node's condition for `verdict` (`applied`: no failure), as of `now` unless the
    /// object's current one has the same status (then its transition time stays).
    pub fn new(
        node: &str,
        verdict: &str,
        applied: bool,
        current: &[Condition],
        now: &str,
    ) -> ZoneCondition {
        let type_ = format!("{ZONE_CONDITION_PREFIX}{node}");
        let status = if applied { "True" } else { "False" };
        let since = (current.iter())
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| rfc3339(&c.last_transition_time.0))
            .unwrap_or_else(|| now.to_string());
        ZoneCondition {
            type_,
            status,
            reason: if applied {
                REASON_SETUP_SUCCEEDED
            } else {
                REASON_SETUP_FAILED
            },
            message: crate::text::one_line_within(verdict, CONDITION_MESSAGE_MAX).into_owned(),
            last_transition_time: since,
        }
    }

    /// Whether `c` says the same (the transition time aside).
    pub fn is(&self, c: &Condition) -> bool {
        c.type_ == self.type_
            && c.status == self.status
            && c.reason == self.reason
            && c.message == self.message
    }

    /// Whether the object's conditions hold exactly this one of ours.
    fn held_by(&self, current: &[Condition]) -> bool {
        let ours: Vec<&Condition> = current.iter().filter(|c| c.type_ == self.type_).collect();
        matches!(ours[..], [c] if self.is(c))
    }
}

/// The entries every node's verdict is aggregated from: `status.messages`, plus
/// `<node>: <message>` for each other node's zone condition whose node has no entry there.
/// OVN-Kubernetes' EgressQoS CRD has no `messages` (its API server prunes them); the
/// conditions survive, so every node still aggregates every node's verdict alike.
pub fn entries_with_zone_conditions(
    messages: &[String],
    conditions: &[Condition],
    node: &str,
) -> Vec<String> {
    let mut all = messages.to_vec();
    for c in conditions {
        let Some(zone) = c.type_.strip_prefix(ZONE_CONDITION_PREFIX) else {
            continue;
        };
        let prefix = format!("{zone}: ");
        if zone != node && !messages.iter().any(|m| m.starts_with(&prefix)) {
            all.push(node_message(zone, &c.message));
        }
    }
    all
}

/// Metav1 time: RFC 3339 in UTC, whole seconds.
pub fn rfc3339(t: &k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
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
        condition: None,
    })
}

/// [`desired`] for a kind with zone conditions: the patch also carries `condition`, and is due
/// when the object's condition is stale even if status and messages are not.
pub fn desired_with_condition(
    patch: Option<StatusPatch>,
    kind: &str,
    node: &str,
    verdict: &str,
    current_messages: &[String],
    condition: ZoneCondition,
    current_conditions: &[Condition],
) -> Option<StatusPatch> {
    let held = condition.held_by(current_conditions);
    let mut patch = match patch {
        Some(p) => p,
        None if held => return None,
        None => {
            let mut all: Vec<String> = current_messages.to_vec();
            all.retain(|m| !m.starts_with(&format!("{node}: ")));
            let ours = node_message(node, verdict);
            all.push(ours.clone());
            StatusPatch {
                status: aggregate(kind, &all),
                message: ours,
                condition: None,
            }
        }
    };
    patch.condition = Some(condition);
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EF: &str = "EgressFirewall";
    const QOS: &str = "EgressQoS";

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

    fn condition(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                at.parse().unwrap(),
            ),
            observed_generation: None,
        }
    }

    /// EgressQoS: this node's `Ready-In-Zone-<node>` condition as OVN-Kubernetes writes it,
    /// written when missing or stale even with status and messages up to date, its
    /// transition time kept while its status stays.
    #[test]
    fn egress_qos_conditions_are_ovn_kubernetes_zone_conditions() {
        let ok = verdict(QOS, None);
        let bad = verdict(QOS, Some("spec.egress[0].dstCIDR: invalid CIDR"));
        let now = "2026-01-01T00:00:10Z";
        let messages = vec![node_message("w1", &ok)];
        let status = Some("EgressQoS Rules applied");
        // Status and messages up to date, no condition yet: a patch with the condition.
        let z = ZoneCondition::new("w1", &ok, true, &[], now);
        assert_eq!(z.type_, "Ready-In-Zone-w1");
        assert_eq!((z.status, z.reason), ("True", "SetupSucceeded"));
        assert_eq!(z.message, "EgressQoS Rules applied");
        assert_eq!(z.last_transition_time, now);
        let none = desired(QOS, "w1", &ok, status, &messages);
        assert_eq!(none, None);
        let p = desired_with_condition(none, QOS, "w1", &ok, &messages, z.clone(), &[]).unwrap();
        assert_eq!(p.status, "EgressQoS Rules applied");
        assert_eq!(p.message, "w1: EgressQoS Rules applied");
        assert_eq!(p.condition.as_ref(), Some(&z));
        // Held already (another node's condition beside it): nothing to write, and the
        // transition time of the held one stays.
        let held = [
            condition(
                "Ready-In-Zone-w1",
                "True",
                "SetupSucceeded",
                &ok,
                "2025-12-31T23:00:00Z",
            ),
            condition(
                "Ready-In-Zone-w2",
                "False",
                "SetupFailed",
                &bad,
                "2025-12-31T23:00:00Z",
            ),
        ];
        let z = ZoneCondition::new("w1", &ok, true, &held, now);
        assert_eq!(z.last_transition_time, "2025-12-31T23:00:00Z");
        assert_eq!(
            desired_with_condition(None, QOS, "w1", &ok, &messages, z, &held),
            None
        );
        // A failure: False/SetupFailed with OVN-Kubernetes' error text, a new transition time.
        let z = ZoneCondition::new("w1", &bad, false, &held, now);
        assert_eq!((z.status, z.reason), ("False", "SetupFailed"));
        assert!(
            z.message
                .starts_with("EgressQoS Rules not correctly applied: ")
        );
        assert_eq!(z.last_transition_time, now);
        let wanted = desired(QOS, "w1", &bad, status, &messages);
        let p = desired_with_condition(wanted, QOS, "w1", &bad, &messages, z, &held).unwrap();
        assert_eq!(p.status, "EgressQoS Rules not correctly applied");
    }

    /// With OVN-Kubernetes' CRD the API server prunes `status.messages`: the other nodes'
    /// verdicts come from their conditions, so a node that applied everything still says
    /// "not correctly applied" while another node failed.
    #[test]
    fn pruned_messages_aggregate_from_the_zone_conditions() {
        let ok = verdict(QOS, None);
        let bad = verdict(QOS, Some("boom"));
        let at = "2025-12-31T23:00:00Z";
        let conditions = [
            condition("Ready-In-Zone-w1", "True", "SetupSucceeded", &ok, at),
            condition("Ready-In-Zone-w2", "False", "SetupFailed", &bad, at),
        ];
        let entries = entries_with_zone_conditions(&[], &conditions, "w1");
        assert_eq!(entries, vec![node_message("w2", &bad)]);
        let p = desired(QOS, "w1", &ok, Some(ok.as_str()), &entries).unwrap();
        assert_eq!(p.status, "EgressQoS Rules not correctly applied");
        // With messages kept (nodeplane's CRD) they are the entries; a condition adds none.
        let messages = vec![node_message("w2", &ok)];
        assert_eq!(
            entries_with_zone_conditions(&messages, &conditions, "w1"),
            messages
        );
    }
}
