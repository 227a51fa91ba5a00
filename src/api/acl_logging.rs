//! The namespace annotation `k8s.ovn.org/acl-logging`, as OVN-Kubernetes defines it:
//! `{"deny": "alert", "allow": "notice"}` logs the namespace's EgressFirewall and
//! NetworkPolicy verdicts, each kind of verdict at the syslog severity given (`alert`,
//! `warning`, `notice`, `info`, `debug`); a verdict without a severity (the key absent or
//! empty) is not logged. Other keys are ignored, as OVN-Kubernetes' JSON decoding does.
//!
//! Bad input never turns logging on with a guess: invalid JSON logs nothing for the
//! namespace, an invalid severity leaves that verdict unlogged; each problem is one message
//! naming the namespace and the field.

use crate::api::Namespace;
use serde_json::Value;

pub const ANNOTATION: &str = "k8s.ovn.org/acl-logging";

wire_named_enum! {
    /// A syslog severity OVN-Kubernetes accepts for ACL logging.
    pub enum Severity {
        Alert = "alert",
        Warning = "warning",
        Notice = "notice",
        Info = "info",
        Debug = "debug",
    }
}

impl Severity {
    pub fn parse(s: &str) -> Option<Severity> {
        Severity::ALL.iter().copied().find(|v| v.as_str() == s)
    }
}

/// Which verdicts of a namespace are logged, and at which severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct AclLogging {
    pub deny: Option<Severity>,
    pub allow: Option<Severity>,
}

impl AclLogging {
    pub fn is_off(&self) -> bool {
        self.deny.is_none() && self.allow.is_none()
    }
}

/// The namespace's logging (`None`: nothing to log) and the problems with its annotation.
pub fn of_namespace(ns: &Namespace) -> (Option<AclLogging>, Vec<String>) {
    let name = ns.metadata.name.as_deref().unwrap_or_default();
    let annotations = ns.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(ANNOTATION)) {
        None => (None, Vec::new()),
        Some(value) => {
            let (logging, problems) = parse(name, value);
            ((!logging.is_off()).then_some(logging), problems)
        }
    }
}

/// Parses the annotation's value for namespace `namespace`.
pub fn parse(namespace: &str, value: &str) -> (AclLogging, Vec<String>) {
    let at = |field: &str| format!("Namespace {namespace:?}: annotation {ANNOTATION}{field}");
    let object = match serde_json::from_str::<Value>(value) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return (
                AclLogging::default(),
                vec![format!("{}: not a JSON object", at(""))],
            );
        }
        Err(e) => {
            return (
                AclLogging::default(),
                vec![format!("{}: invalid JSON: {e}", at(""))],
            );
        }
    };
    let mut problems = Vec::new();
    let mut severity = |field: &str| match object.get(field) {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Severity::parse(s).or_else(|| {
            problems.push(format!(
                "{}: invalid severity {s:?} (one of alert, warning, notice, info, debug)",
                at(&format!(".{field}"))
            ));
            None
        }),
        Some(other) => {
            problems.push(format!(
                "{}: must be a string, not {other}",
                at(&format!(".{field}"))
            ));
            None
        }
    };
    let logging = AclLogging {
        deny: severity("deny"),
        allow: severity("allow"),
    };
    (logging, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &str) -> AclLogging {
        let (logging, problems) = parse("ns", value);
        assert!(problems.is_empty(), "{problems:?}");
        logging
    }

    #[test]
    fn severities_as_ovn_kubernetes_defines_them() {
        let l = ok(r#"{"deny": "alert", "allow": "notice"}"#);
        assert_eq!(l.deny, Some(Severity::Alert));
        assert_eq!(l.allow, Some(Severity::Notice));
        for s in ["alert", "warning", "notice", "info", "debug"] {
            let l = ok(&format!(r#"{{"deny": "{s}"}}"#));
            assert_eq!(l.deny.map(Severity::as_str), Some(s));
            assert_eq!(l.allow, None);
        }
        assert!(ok(r#"{"allow": ""}"#).is_off(), "empty: not logged");
        assert!(ok("{}").is_off());
        assert_eq!(
            ok(r#"{"deny": "info", "extra": 1}"#).deny,
            Some(Severity::Info)
        );
    }

    #[test]
    fn invalid_input_names_namespace_and_field_and_keeps_the_valid_part() {
        let (l, p) = parse("shop", r#"{"deny": "loud", "allow": "info"}"#);
        assert_eq!(l.deny, None);
        assert_eq!(l.allow, Some(Severity::Info));
        assert_eq!(p.len(), 1);
        assert!(p[0].contains(r#"Namespace "shop""#) && p[0].contains("acl-logging.deny"));
        assert!(p[0].contains(r#""loud""#), "{}", p[0]);
        let (l, p) = parse("shop", r#"{"deny": 3}"#);
        assert!(
            l.is_off() && p[0].contains(".deny: must be a string"),
            "{p:?}"
        );
        let (l, p) = parse("shop", "{deny: alert");
        assert!(l.is_off() && p[0].contains("invalid JSON"), "{p:?}");
        let (l, p) = parse("x\ny", r#"["deny"]"#);
        assert!(
            l.is_off() && p[0].contains(r#""x\ny""#),
            "escaped name: {p:?}"
        );
    }
}
