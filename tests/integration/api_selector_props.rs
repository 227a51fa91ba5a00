//! Label selector laws, checked over random label sets.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use nodeplane::api::{LabelSelector, Selector};
use proptest::prelude::*;

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["app", "tier", "env", "k8s.ovn.org/egress-assignable"])
        .prop_map(String::from)
}

fn value() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["", "a", "b", "web"]).prop_map(String::from)
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key(), value(), 0..4)
}

fn expr(key: &str, op: &str, values: &[String]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.to_string(),
            operator: op.to_string(),
            values: (!values.is_empty()).then(|| values.to_vec()),
        }]),
    }
}

fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::parse(selector).unwrap().matches(labels)
}

proptest! {
    #[test]
    fn not_in_is_the_complement_of_in(l in labels(), k in key(), vals in prop::collection::vec(value(), 1..3)) {
        prop_assert_eq!(matches(&expr(&k, "NotIn", &vals), &l), !matches(&expr(&k, "In", &vals), &l));
    }

    #[test]
    fn does_not_exist_is_the_complement_of_exists(l in labels(), k in key()) {
        prop_assert_eq!(matches(&expr(&k, "DoesNotExist", &[]), &l), !matches(&expr(&k, "Exists", &[]), &l));
        prop_assert_eq!(matches(&expr(&k, "Exists", &[]), &l), l.contains_key(&k));
    }

    #[test]
    fn match_labels_is_in_with_one_value(l in labels(), k in key(), v in value()) {
        let by_label = LabelSelector { match_labels: Some(BTreeMap::from([(k.clone(), v.clone())])), match_expressions: None };
        prop_assert_eq!(matches(&by_label, &l), matches(&expr(&k, "In", &[v]), &l));
    }

    #[test]
    fn requirements_are_anded_in_any_order(
        l in labels(),
        reqs in prop::collection::vec((key(), prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]), value()), 0..4),
    ) {
        let exprs: Vec<LabelSelectorRequirement> = reqs
            .iter()
            .map(|(k, op, v)| LabelSelectorRequirement {
                key: k.clone(),
                operator: op.to_string(),
                values: matches!(*op, "In" | "NotIn").then(|| vec![v.clone()]),
            })
            .collect();
        let forward = LabelSelector { match_labels: None, match_expressions: Some(exprs.clone()) };
        let backward = LabelSelector { match_labels: None, match_expressions: Some(exprs.iter().rev().cloned().collect()) };
        let (f, b) = (Selector::parse(&forward).unwrap(), Selector::parse(&backward).unwrap());
        prop_assert_eq!(&f, &b);
        prop_assert_eq!(f.to_string(), b.to_string());
        let each = exprs.iter().all(|e| {
            matches(&LabelSelector { match_labels: None, match_expressions: Some(vec![e.clone()]) }, &l)
        });
        prop_assert_eq!(f.matches(&l), each);
    }

    #[test]
    fn empty_selector_matches_everything(l in labels()) {
        prop_assert!(matches(&LabelSelector::default(), &l));
    }
}
