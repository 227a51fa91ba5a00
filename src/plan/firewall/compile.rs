//! The interval compiler: ordered first-match rules -> disjoint address intervals, so that a
//! packet finds its verdict with two map lookups whatever the number of rules.
//!
//! Addresses are numbers in `0..=max` (an IPv4 address widened to `u128`, or an IPv6 one).
//! Each rule covers a set of address intervals and either every protocol (no ports) or a list
//! of `(protocol, port)` pairs. The result has two parts:
//!
//! - `other`: for a packet whose `(protocol, port)` no rule lists, the first port-less rule
//!   covering the destination, as disjoint segments (uncovered = no rule matches);
//! - `ports[p]`: for each listed `p`, only the segments where the first rule matching `p`
//!   differs from `other` there, i.e. where a rule listing `p` comes first.
//!
//! A packet `(addr, p)` is decided by `ports[p]` at `addr` if present, else by `other` at
//! `addr`; that equals the first rule in order that matches it (the property test checks it
//! against a naive evaluator). Cost: O(n log n) in the number of intervals for `other`, and
//! per `p` in the intervals of the rules listing `p` (plus their overlaps with `other`).

use std::collections::BTreeMap;

/// A listed `(IP protocol number, destination port)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub proto: u8,
    pub port: u16,
}

/// One rule as the compiler sees it: where it applies, to which ports. `ranges` are
/// inclusive `(start, end)` pairs and may overlap; empty `ports` = every packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub ranges: Vec<(u128, u128)>,
    pub ports: Vec<PortKey>,
}

/// Inclusive `start..=end`, decided by rule `rule` (index into the input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Segment {
    pub start: u128,
    pub end: u128,
    pub rule: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Compiled {
    /// Sorted, disjoint.
    pub other: Vec<Segment>,
    /// Per listed port: sorted, disjoint segments where it overrides `other`.
    pub ports: BTreeMap<PortKey, Vec<Segment>>,
}

impl Compiled {
    /// The rule deciding a packet to `addr` (with `port` if it is TCP/UDP/SCTP).
    pub fn lookup(&self, addr: u128, port: Option<PortKey>) -> Option<usize> {
        port.and_then(|p| find(self.ports.get(&p)?, addr))
            .or_else(|| find(&self.other, addr))
    }

    /// Number of map elements the result needs.
    pub fn element_count(&self) -> usize {
        self.other.len() + self.ports.values().map(Vec::len).sum::<usize>()
    }
}

fn find(segments: &[Segment], addr: u128) -> Option<usize> {
    let i = segments.partition_point(|s| s.end < addr);
    segments.get(i).filter(|s| s.start <= addr).map(|s| s.rule)
}

/// Compiles `rules` (in order, first match wins) over the address space `0..=max`.
pub fn compile(rules: &[Rule], max: u128) -> Compiled {
    let other = paint(
        rules.iter().enumerate().filter(|(_, r)| r.ports.is_empty()),
        max,
    );
    let mut by_port: BTreeMap<PortKey, Vec<(usize, &Rule)>> = BTreeMap::new();
    for (i, r) in rules.iter().enumerate() {
        for p in &r.ports {
            by_port.entry(*p).or_default().push((i, r));
        }
    }
    let ports = by_port
        .into_iter()
        .map(|(p, listed)| (p, overrides(&paint(listed.into_iter(), max), &other)))
        .filter(|(_, segs)| !segs.is_empty())
        .collect();
    Compiled { other, ports }
}

/// First-match painting: each rule, in order, takes the parts of its ranges that no earlier
/// rule took. Returns sorted, disjoint segments, adjacent ones of the same rule merged.
fn paint<'a>(rules: impl Iterator<Item = (usize, &'a Rule)>, max: u128) -> Vec<Segment> {
    // Free (not yet taken) intervals: start -> end, disjoint.
    let mut free: BTreeMap<u128, u128> = BTreeMap::from([(0, max)]);
    let mut taken = Vec::new();
    for (index, rule) in rules {
        for &(a, b) in &rule.ranges {
            let (a, b) = (a.min(max), b.min(max));
            if a > b {
                continue;
            }
            // The free interval containing `a` (if any) and every one starting in a..=b.
            let first = free.range(..=a).next_back().map(|(s, _)| *s);
            let starts: Vec<u128> = first
                .into_iter()
                .chain(free.range(a..=b).map(|(s, _)| *s))
                .collect();
            for s in starts {
                let Some(&e) = free.get(&s) else { continue };
                if e < a || s > b {
                    continue;
                }
                free.remove(&s);
                if s < a {
                    free.insert(s, a - 1);
                }
                if e > b {
                    free.insert(b + 1, e);
                }
                taken.push(Segment {
                    start: s.max(a),
                    end: e.min(b),
                    rule: index,
                });
            }
        }
    }
    taken.sort();
    merge(taken)
}

/// Merges sorted, disjoint segments that touch and share a rule.
fn merge(sorted: Vec<Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(sorted.len());
    for s in sorted {
        match out.last_mut() {
            Some(last) if last.rule == s.rule && last.end.checked_add(1) == Some(s.start) => {
                last.end = s.end;
            }
            _ => out.push(s),
        }
    }
    out
}

/// The parts of `listed` (first rule listing the port) that come before `other`'s rule at the
/// same addresses (or where `other` has none): there the port's verdict differs.
fn overrides(listed: &[Segment], other: &[Segment]) -> Vec<Segment> {
    let mut out = Vec::new();
    for seg in listed {
        let mut cursor = seg.start;
        let mut i = other.partition_point(|o| o.end < seg.start);
        loop {
            // Gap before the next `other` segment (or to the end): no port-less rule there.
            let next = other.get(i).filter(|o| o.start <= seg.end);
            let gap_end = next.map_or(seg.end, |o| o.start.saturating_sub(1));
            if next.is_none_or(|o| o.start > cursor) && cursor <= gap_end {
                out.push(Segment {
                    start: cursor,
                    end: gap_end,
                    rule: seg.rule,
                });
            }
            let Some(o) = next else { break };
            let (s, e) = (o.start.max(cursor), o.end.min(seg.end));
            if seg.rule < o.rule && s <= e {
                out.push(Segment {
                    start: s,
                    end: e,
                    rule: seg.rule,
                });
            }
            if o.end >= seg.end {
                break;
            }
            cursor = o.end + 1;
            i += 1;
        }
    }
    merge(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::ir::proto::{TCP, UDP};
    use proptest::prelude::*;

    fn rule(ranges: &[(u128, u128)], ports: &[(u8, u16)]) -> Rule {
        Rule {
            ranges: ranges.to_vec(),
            ports: ports
                .iter()
                .map(|&(proto, port)| PortKey { proto, port })
                .collect(),
        }
    }

    /// The definition: the first rule in order that matches the packet.
    fn naive(rules: &[Rule], addr: u128, port: Option<PortKey>) -> Option<usize> {
        rules.iter().position(|r| {
            r.ranges.iter().any(|&(a, b)| a <= addr && addr <= b)
                && (r.ports.is_empty() || port.is_some_and(|p| r.ports.contains(&p)))
        })
    }

    #[test]
    fn allow_one_host_then_deny_all() {
        let rules = [rule(&[(5, 5)], &[]), rule(&[(0, 255)], &[])];
        let c = compile(&rules, 255);
        assert_eq!(
            c.other,
            vec![
                Segment {
                    start: 0,
                    end: 4,
                    rule: 1
                },
                Segment {
                    start: 5,
                    end: 5,
                    rule: 0
                },
                Segment {
                    start: 6,
                    end: 255,
                    rule: 1
                },
            ]
        );
        assert!(c.ports.is_empty());
    }

    #[test]
    fn port_rule_only_emits_where_it_comes_first() {
        // Allow tcp/443 to 10..=19, Deny all, Allow tcp/80 anywhere (shadowed: never emitted).
        let rules = [
            rule(&[(10, 19)], &[(TCP, 443)]),
            rule(&[(0, 255)], &[]),
            rule(&[(0, 255)], &[(TCP, 80)]),
        ];
        let c = compile(&rules, 255);
        assert_eq!(c.other.len(), 1);
        assert_eq!(
            c.ports[&PortKey {
                proto: TCP,
                port: 443
            }],
            vec![Segment {
                start: 10,
                end: 19,
                rule: 0
            }]
        );
        assert!(!c.ports.contains_key(&PortKey {
            proto: TCP,
            port: 80
        }));
        assert_eq!(c.element_count(), 2);
    }

    #[test]
    fn full_ipv6_space_does_not_overflow() {
        let rules = [rule(&[(0, u128::MAX)], &[(UDP, 53)]), rule(&[(7, 7)], &[])];
        let c = compile(&rules, u128::MAX);
        for (addr, want) in [(0, Some(0)), (7, Some(0)), (u128::MAX, Some(0))] {
            let p = Some(PortKey {
                proto: UDP,
                port: 53,
            });
            assert_eq!(c.lookup(addr, p), want);
            assert_eq!(naive(&rules, addr, p), want);
        }
        assert_eq!(c.lookup(7, None), Some(1));
        assert_eq!(c.lookup(u128::MAX, None), None);
    }

    fn arb_rule() -> impl Strategy<Value = Rule> {
        let range = (0u128..=255, 0u128..=40).prop_map(|(a, len)| (a, (a + len).min(255)));
        let port = prop_oneof![Just((TCP, 80)), Just((TCP, 443)), Just((UDP, 53))];
        (
            prop::collection::vec(range, 1..4),
            prop_oneof![
                2 => Just(Vec::new()),
                1 => prop::collection::vec(port, 1..3),
            ],
        )
            .prop_map(|(ranges, ports)| rule(&ranges, &ports))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Every packet of a small address space gets the verdict of the first matching rule.
        #[test]
        fn compiled_equals_first_match(rules in prop::collection::vec(arb_rule(), 0..25)) {
            let c = compile(&rules, 255);
            let ports = [None, Some((TCP, 80)), Some((TCP, 443)), Some((UDP, 53)), Some((TCP, 22))];
            for addr in 0..=255u128 {
                for p in ports {
                    let p = p.map(|(proto, port)| PortKey { proto, port });
                    prop_assert_eq!(c.lookup(addr, p), naive(&rules, addr, p), "addr {} port {:?}", addr, p);
                }
            }
            // Disjoint and sorted, as an interval map requires.
            for segs in std::iter::once(&c.other).chain(c.ports.values()) {
                for w in segs.windows(2) {
                    prop_assert!(w[0].end < w[1].start);
                }
            }
        }
    }
}
