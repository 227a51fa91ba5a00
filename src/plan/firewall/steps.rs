//! Ordered rules with learned addresses -> the steps of a namespace chain.
//!
//! A `dnsName` rule's addresses are partly static (the agent's own resolution, painted like a
//! CIDR) and partly learned at run time from the DNS answers pods receive (a timeout set the
//! proxy fills, which no plan sees). Painting cannot place addresses it does not know, so the
//! rule list is cut in front of every rule with a learned set: the chain consults the painted
//! maps of the rules before it, then its learned set, then the painted maps of the rules from
//! it on. A packet reaching a learned set matched no earlier rule (every earlier rule is in an
//! earlier painted map or learned set), so first-match order holds whatever the sets hold (the
//! property test checks it against a naive evaluator).

use super::compile::{self, Compiled, Rule};

/// One step of a namespace chain, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The painted maps of a run of rules (segment rule indices are the input's).
    Painted(Compiled),
    /// The learned set of rule `index` (with that rule's ports).
    Learned(usize),
}

/// Cuts `rules` in front of every rule with `learned[i]` and compiles each run over `0..=max`.
/// The first run is always present (possibly empty, so a chain always has its first maps);
/// later empty runs are left out.
pub fn steps(rules: &[Rule], learned: &[bool], max: u128) -> Vec<Step> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in learned
        .iter()
        .enumerate()
        .take(rules.len())
        .filter(|(_, l)| **l)
    {
        push_run(&mut out, &rules[start..i], start, max);
        out.push(Step::Learned(i));
        start = i;
    }
    push_run(&mut out, &rules[start..], start, max);
    out
}

fn push_run(out: &mut Vec<Step>, rules: &[Rule], offset: usize, max: u128) {
    let run = painted(rules, offset, max);
    if out.is_empty() || run.element_count() > 0 {
        out.push(Step::Painted(run));
    }
}

/// Compiles `rules` (the input's rules `offset..`) with the input's rule indices.
fn painted(rules: &[Rule], offset: usize, max: u128) -> Compiled {
    let mut c = compile::compile(rules, max);
    for s in c
        .other
        .iter_mut()
        .chain(c.ports.values_mut().flat_map(|v| v.iter_mut()))
    {
        s.rule += offset;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::proto::TCP;
    use crate::plan::firewall::compile::PortKey;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn pk(port: u16) -> PortKey {
        PortKey { proto: TCP, port }
    }

    /// The chain's evaluation: steps in order, the first that decides wins.
    fn eval(
        steps: &[Step],
        rules: &[Rule],
        sets: &[BTreeSet<u128>],
        addr: u128,
        port: Option<PortKey>,
    ) -> Option<usize> {
        steps.iter().find_map(|s| match s {
            Step::Painted(c) => c.lookup(addr, port),
            Step::Learned(i) => (sets[*i].contains(&addr)
                && (rules[*i].ports.is_empty()
                    || port.is_some_and(|p| rules[*i].ports.contains(&p))))
            .then_some(*i),
        })
    }

    /// The definition: the first rule whose static ranges or learned set hold the address.
    fn naive(
        rules: &[Rule],
        sets: &[BTreeSet<u128>],
        addr: u128,
        port: Option<PortKey>,
    ) -> Option<usize> {
        rules.iter().enumerate().position(|(i, r)| {
            (r.ranges.iter().any(|&(a, b)| a <= addr && addr <= b) || sets[i].contains(&addr))
                && (r.ports.is_empty() || port.is_some_and(|p| r.ports.contains(&p)))
        })
    }

    #[test]
    fn cuts_in_front_of_each_learned_rule() {
        let r = |a: u128, b: u128| Rule {
            ranges: vec![(a, b)],
            ports: vec![],
        };
        let rules = [r(1, 1), r(2, 2), r(0, 255)];
        let s = steps(&rules, &[false, true, false], 255);
        assert!(
            matches!(&s[..], [Step::Painted(a), Step::Learned(1), Step::Painted(b)]
            if a.lookup(1, None) == Some(0) && a.lookup(2, None).is_none()
            && b.lookup(2, None) == Some(1) && b.lookup(9, None) == Some(2))
        );
        // A learned rule first: the (empty) first run is still there.
        let s = steps(&rules, &[true, false, false], 255);
        assert!(
            matches!(&s[..], [Step::Painted(a), Step::Learned(0), Step::Painted(_)]
            if a.element_count() == 0)
        );
        // No learned rule: one run, as before learned sets existed.
        assert_eq!(steps(&rules, &[false; 3], 255).len(), 1);
    }

    fn arb_case() -> impl Strategy<Value = (Vec<Rule>, Vec<bool>, Vec<BTreeSet<u128>>)> {
        let range = (0u128..=63, 0u128..=20).prop_map(|(a, len)| (a, (a + len).min(63)));
        let rule = (
            prop::collection::vec(range, 0..3),
            prop_oneof![2 => Just(vec![]), 1 => Just(vec![pk(443)]), 1 => Just(vec![pk(80), pk(443)])],
            any::<bool>(),
            prop::collection::btree_set(0u128..=63, 0..6),
        );
        prop::collection::vec(rule, 0..12).prop_map(|rs| {
            let mut rules = Vec::new();
            let mut learned = Vec::new();
            let mut sets = Vec::new();
            for (ranges, ports, l, set) in rs {
                rules.push(Rule { ranges, ports });
                learned.push(l);
                sets.push(if l { set } else { BTreeSet::new() });
            }
            (rules, learned, sets)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever the learned sets hold, the chain's steps give the first matching rule.
        #[test]
        fn steps_equal_first_match((rules, learned, sets) in arb_case()) {
            let s = steps(&rules, &learned, 63);
            for addr in 0..=63u128 {
                for port in [None, Some(pk(80)), Some(pk(443)), Some(pk(22))] {
                    prop_assert_eq!(eval(&s, &rules, &sets, addr, port), naive(&rules, &sets, addr, port));
                }
            }
        }
    }
}
