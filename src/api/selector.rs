//! Label selectors with Kubernetes semantics.
//!
//! A `metav1.LabelSelector` is compiled once into a [`Selector`] (validated, sorted, deduplicated)
//! so that planners match labels without re-checking operators. Semantics follow
//! `k8s.io/apimachinery/pkg/labels`: `matchLabels` and `matchExpressions` are ANDed, an empty
//! selector matches everything, and `NotIn` matches objects that do not carry the key at all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use thiserror::Error;

/// A label selector that failed to compile. `field` is relative to the selector
/// (e.g. `matchExpressions[2].values`); callers prefix it with the selector's own path.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {reason}")]
pub struct SelectorError {
    pub field: String,
    pub reason: SelectorReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorReason {
    #[error("unknown operator {0:?} (want In, NotIn, Exists or DoesNotExist)")]
    UnknownOperator(String),
    #[error("operator {0} requires at least one value")]
    MissingValues(Operator),
    #[error("operator {0} takes no values, got {1}")]
    UnexpectedValues(Operator, usize),
    #[error("invalid label key {key:?}: {why}")]
    InvalidKey { key: String, why: &'static str },
    #[error("invalid label value {value:?}: {why}")]
    InvalidValue { value: String, why: &'static str },
}

wire_named_enum! {
    pub enum Operator {
        In = "In",
        NotIn = "NotIn",
        Exists = "Exists",
        DoesNotExist = "DoesNotExist",
    }
}

impl Operator {
    pub fn parse(s: &str) -> Option<Operator> {
        // Case-sensitive, as the API server is.
        Operator::ALL.iter().copied().find(|o| o.as_str() == s)
    }
}

/// One compiled requirement. `values` is empty for `Exists` / `DoesNotExist`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: BTreeSet<String>,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A validated label selector. Requirements are sorted so that equal selectors compare equal
/// and render identically, whatever the order they were written in.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The empty selector: matches every object.
    pub fn everything() -> Selector {
        Selector::default()
    }

    pub fn parse(selector: &LabelSelector) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            let field = || format!("matchLabels[{key}]");
            check_key(key).map_err(|reason| SelectorError {
                field: field(),
                reason,
            })?;
            check_value(value).map_err(|reason| SelectorError {
                field: field(),
                reason,
            })?;
            requirements.push(Requirement {
                key: key.clone(),
                operator: Operator::In,
                values: BTreeSet::from([value.clone()]),
            });
        }
        for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = |leaf: &str| format!("matchExpressions[{index}].{leaf}");
            check_key(&expr.key).map_err(|reason| SelectorError {
                field: field("key"),
                reason,
            })?;
            let operator = Operator::parse(&expr.operator).ok_or_else(|| SelectorError {
                field: field("operator"),
                reason: SelectorReason::UnknownOperator(expr.operator.clone()),
            })?;
            let values = expr.values.as_deref().unwrap_or_default();
            match operator {
                Operator::In | Operator::NotIn if values.is_empty() => {
                    return Err(SelectorError {
                        field: field("values"),
                        reason: SelectorReason::MissingValues(operator),
                    });
                }
                Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                    return Err(SelectorError {
                        field: field("values"),
                        reason: SelectorReason::UnexpectedValues(operator, values.len()),
                    });
                }
                _ => {}
            }
            for (i, value) in values.iter().enumerate() {
                check_value(value).map_err(|reason| SelectorError {
                    field: field(&format!("values[{i}]")),
                    reason,
                })?;
            }
            requirements.push(Requirement {
                key: expr.key.clone(),
                operator,
                values: values.iter().cloned().collect(),
            });
        }
        requirements.sort();
        requirements.dedup();
        Ok(Selector { requirements })
    }

    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Matches against an object's labels; an object without labels has an empty label set.
    pub fn matches_meta(&self, meta: &ObjectMeta) -> bool {
        match &meta.labels {
            Some(labels) => self.matches(labels),
            None => self.matches(&BTreeMap::new()),
        }
    }
}

impl TryFrom<&LabelSelector> for Selector {
    type Error = SelectorError;
    fn try_from(selector: &LabelSelector) -> Result<Selector, SelectorError> {
        Selector::parse(selector)
    }
}

/// kubectl's string form (`app=web,tier in (a,b),!legacy`); the empty selector is `<everything>`.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("<everything>");
        }
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let joined = || r.values.iter().cloned().collect::<Vec<_>>().join(",");
            match r.operator {
                Operator::In if r.values.len() == 1 => write!(f, "{}={}", r.key, joined())?,
                Operator::In => write!(f, "{} in ({})", r.key, joined())?,
                Operator::NotIn => write!(f, "{} notin ({})", r.key, joined())?,
                Operator::Exists => write!(f, "{}", r.key)?,
                Operator::DoesNotExist => write!(f, "!{}", r.key)?,
            }
        }
        Ok(())
    }
}

/// One-shot evaluation of an uncompiled selector.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    Ok(Selector::parse(selector)?.matches(labels))
}

const NAME_CHARS: &str =
    "must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric";

/// Label keys are `[prefix/]name`: prefix a DNS-1123 subdomain, name a qualified name.
fn check_key(key: &str) -> Result<(), SelectorReason> {
    let bad = |why| SelectorReason::InvalidKey {
        key: key.to_string(),
        why,
    };
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Err(bad(
            "prefix must be a lowercase DNS subdomain of at most 253 characters",
        ));
    }
    if name.is_empty() {
        return Err(bad("name part must not be empty"));
    }
    if !is_qualified_name_part(name) {
        return Err(bad(NAME_CHARS));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), SelectorReason> {
    if value.is_empty() || is_qualified_name_part(value) {
        Ok(())
    } else {
        Err(SelectorReason::InvalidValue {
            value: value.to_string(),
            why: NAME_CHARS,
        })
    }
}

fn is_qualified_name_part(s: &str) -> bool {
    is_label(s, |c| {
        c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')
    })
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            is_label(label, |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
            })
        })
}

/// 1 to 63 bytes that `allowed` accepts, the first and last alphanumeric: the shape both a
/// qualified name part and a DNS-1123 label have.
fn is_label(s: &str, allowed: impl Fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| allowed(*c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn sel(match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        }
    }

    #[test]
    fn matching_table() {
        let web = labels(&[("app", "web"), ("tier", "front")]);
        let db = labels(&[("app", "db")]);
        let none = labels(&[]);
        #[rustfmt::skip]
        let cases: Vec<(&str, LabelSelector, [bool; 3])> = vec![
            // name, selector, matches [web, db, none]
            ("empty", sel(&[], vec![]), [true, true, true]),
            ("matchLabels", sel(&[("app", "web")], vec![]), [true, false, false]),
            ("matchLabels AND", sel(&[("app", "web"), ("tier", "back")], vec![]), [false, false, false]),
            ("In", sel(&[], vec![expr("app", "In", Some(&["web", "db"]))]), [true, true, false]),
            ("NotIn, absent key matches", sel(&[], vec![expr("app", "NotIn", Some(&["web"]))]), [false, true, true]),
            ("Exists", sel(&[], vec![expr("tier", "Exists", None)]), [true, false, false]),
            ("Exists, empty values list", sel(&[], vec![expr("app", "Exists", Some(&[]))]), [true, true, false]),
            ("DoesNotExist", sel(&[], vec![expr("tier", "DoesNotExist", None)]), [false, true, true]),
            ("labels AND expressions", sel(&[("app", "web")], vec![expr("tier", "In", Some(&["back"]))]), [false, false, false]),
            ("two expressions", sel(&[], vec![expr("app", "Exists", None), expr("tier", "DoesNotExist", None)]), [false, true, false]),
        ];
        for (name, selector, want) in cases {
            let compiled = Selector::parse(&selector).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = [
                compiled.matches(&web),
                compiled.matches(&db),
                compiled.matches(&none),
            ];
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn error_table() {
        #[rustfmt::skip]
        let cases: Vec<(LabelSelector, &str)> = vec![
            (sel(&[], vec![expr("app", "Equals", Some(&["x"]))]),
             r#"matchExpressions[0].operator: unknown operator "Equals" (want In, NotIn, Exists or DoesNotExist)"#),
            (sel(&[], vec![expr("app", "in", Some(&["x"]))]),
             r#"matchExpressions[0].operator: unknown operator "in" (want In, NotIn, Exists or DoesNotExist)"#),
            (sel(&[], vec![expr("a", "Exists", None), expr("app", "In", None)]),
             "matchExpressions[1].values: operator In requires at least one value"),
            (sel(&[], vec![expr("app", "NotIn", Some(&[]))]),
             "matchExpressions[0].values: operator NotIn requires at least one value"),
            (sel(&[], vec![expr("app", "Exists", Some(&["x", "y"]))]),
             "matchExpressions[0].values: operator Exists takes no values, got 2"),
            (sel(&[], vec![expr("app", "DoesNotExist", Some(&["x"]))]),
             "matchExpressions[0].values: operator DoesNotExist takes no values, got 1"),
            (sel(&[], vec![expr("", "Exists", None)]),
             r#"matchExpressions[0].key: invalid label key "": name part must not be empty"#),
            (sel(&[], vec![expr("Example.COM/app", "Exists", None)]),
             r#"matchExpressions[0].key: invalid label key "Example.COM/app": prefix must be a lowercase DNS subdomain of at most 253 characters"#),
            (sel(&[], vec![expr("app", "In", Some(&["ok", "not ok"]))]),
             r#"matchExpressions[0].values[1]: invalid label value "not ok": must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric"#),
            (sel(&[("-app", "x")], vec![]),
             r#"matchLabels[-app]: invalid label key "-app": must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric"#),
            (sel(&[("app", "x_")], vec![]),
             r#"matchLabels[app]: invalid label value "x_": must be at most 63 characters of [A-Za-z0-9-_.], starting and ending with an alphanumeric"#),
        ];
        for (selector, want) in cases {
            let err = Selector::parse(&selector).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn valid_keys_and_values() {
        let long = "a".repeat(63);
        let too_long = "a".repeat(64);
        for key in [
            "app",
            "k8s.ovn.org/egress-assignable",
            "kubernetes.io/metadata.name",
            "A_b.c-D",
            &long,
        ] {
            assert!(check_key(key).is_ok(), "{key}");
        }
        for key in ["/app", "a/", "a/b/c", &too_long, "app!"] {
            assert!(check_key(key).is_err(), "{key}");
        }
        for value in ["", "web", "v1.2_3-x", &long] {
            assert!(check_value(value).is_ok(), "{value}");
        }
        assert!(check_value(&too_long).is_err());
    }

    #[test]
    fn canonical_form_and_display() {
        let a = Selector::parse(&sel(
            &[("app", "web")],
            vec![
                expr("tier", "NotIn", Some(&["b", "a"])),
                expr("legacy", "DoesNotExist", None),
            ],
        ))
        .unwrap();
        let b = Selector::parse(&sel(
            &[],
            vec![
                expr("legacy", "DoesNotExist", None),
                expr("tier", "NotIn", Some(&["a", "b", "a"])),
                expr("app", "In", Some(&["web"])),
            ],
        ))
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "app=web,!legacy,tier notin (a,b)");
        assert_eq!(Selector::everything().to_string(), "<everything>");
        assert!(
            Selector::parse(&LabelSelector::default())
                .unwrap()
                .is_everything()
        );
    }

    #[test]
    fn matches_meta_without_labels() {
        let s = Selector::parse(&sel(&[], vec![expr("app", "NotIn", Some(&["x"]))])).unwrap();
        assert!(s.matches_meta(&ObjectMeta::default()));
        assert!(selector_matches(&sel(&[("a", "b")], vec![]), &labels(&[("a", "b")])).unwrap());
    }
}
