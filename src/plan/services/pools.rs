//! Shared load-balancing chains ("pools"): one chain per (family, frontend kind, traffic
//! policy, backend count), used by every service with that shape. A pool chain DNATs from
//! a data map keyed by the packet's frontend and `numgen random mod N`, so a service's
//! backends are map elements, never rules: an endpoint change is an element update, and
//! nf_tables has no chain graph to re-validate.

use super::names::{self, BackendsMap, Frontend};
use crate::nft::ir::*;
use crate::plan::base::sets as base_sets;

/// What a pool does before load balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PoolKind {
    /// ClusterIPs: sources outside the cluster CIDRs are masqueraded; `n` backends.
    Cluster { n: u32 },
    /// External traffic with externalTrafficPolicy Cluster: masqueraded; `n` backends.
    External { n: u32 },
    /// externalTrafficPolicy Local: pods and the node itself reach all `n` backends, other
    /// sources only the `local` ones with their address kept (dropped when there are none).
    ExternalLocal { n: u32, local: u32 },
    /// externalTrafficPolicy and internalTrafficPolicy Local: everyone reaches only the
    /// `local` backends (pods and the node follow the internal policy, as in kube-proxy); the
    /// node itself is masqueraded; dropped when there are none.
    BothLocal { local: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pool {
    pub family: IpFamily,
    pub frontend: Frontend,
    pub kind: PoolKind,
    /// The backends-map shard it reads (address frontends; 0 for NodePorts).
    pub shard: u8,
}

impl Pool {
    /// The chain name, e.g. `svc-v4-c3-s7` (shard 7), `svc-v6-npxl10-2`.
    pub fn chain_name(&self) -> String {
        let fam = names::fam_suffix(self.family);
        let (np, shard) = match self.frontend {
            Frontend::Addr => ("", format!("-s{}", self.shard)),
            Frontend::NodePort => ("np", String::new()),
        };
        match self.kind {
            PoolKind::Cluster { n } => format!("svc-{fam}-{np}c{n}{shard}"),
            PoolKind::External { n } => format!("svc-{fam}-{np}x{n}{shard}"),
            PoolKind::ExternalLocal { n, local } => {
                format!("svc-{fam}-{np}xl{n}-{local}{shard}")
            }
            PoolKind::BothLocal { local } => format!("svc-{fam}-{np}il{local}{shard}"),
        }
    }

    /// The backends maps the chain reads.
    pub fn maps(&self) -> Vec<BackendsMap> {
        let (all, local) = match self.kind {
            PoolKind::Cluster { .. } | PoolKind::External { .. } => (true, false),
            PoolKind::ExternalLocal { local, .. } => (true, local > 0),
            PoolKind::BothLocal { local } => (false, local > 0),
        };
        [(all, false), (local, true)]
            .into_iter()
            .filter(|(read, _)| *read)
            .map(|(_, local)| self.map(local))
            .collect()
    }

    fn map(&self, local: bool) -> BackendsMap {
        BackendsMap {
            family: self.family,
            frontend: self.frontend,
            local,
            shard: self.shard,
        }
    }

    /// The pool's chain.
    pub fn chain(&self) -> Chain {
        let mut c = Chain::regular(self.chain_name());
        let saddr = match self.family {
            IpFamily::V4 => Field::Ip4Saddr,
            IpFamily::V6 => Field::Ip6Saddr,
        };
        let cluster_cidrs = match self.family {
            IpFamily::V4 => base_sets::CLUSTER_V4,
            IpFamily::V6 => base_sets::CLUSTER_V6,
        };
        let mark_masq = Stmt::Verdict(Verdict::Jump(names::MARK_MASQ.into()));
        let all = self.dnat(false);
        match self.kind {
            PoolKind::Cluster { n } => {
                // Traffic from outside the cluster (the node itself, other hosts) to a
                // ClusterIP is masqueraded so replies come back through this node.
                c.push(Rule::new(vec![
                    Stmt::not_in_set(vec![saddr], cluster_cidrs),
                    mark_masq,
                ]));
                c.push(Rule::new(vec![all(n)]));
            }
            PoolKind::External { n } => {
                c.push(Rule::new(vec![mark_masq]));
                c.push(Rule::new(vec![all(n)]));
            }
            PoolKind::ExternalLocal { n, local } => {
                c.push(Rule::new(vec![
                    Stmt::in_set(vec![saddr], cluster_cidrs),
                    all(n),
                ]));
                let host = Stmt::matches(Field::FibSaddrType, Value::AddrType(AddrType::Local));
                c.push(Rule::new(vec![host.clone(), mark_masq]));
                c.push(Rule::new(vec![host, all(n)]));
                c.push(Rule::new(vec![self.local_or_drop(local)]));
            }
            PoolKind::BothLocal { local } => {
                let host = Stmt::matches(Field::FibSaddrType, Value::AddrType(AddrType::Local));
                c.push(Rule::new(vec![host, mark_masq]));
                c.push(Rule::new(vec![self.local_or_drop(local)]));
            }
        }
        c
    }

    /// DNAT to one of `local` node-local backends; drop when there is none.
    fn local_or_drop(&self, local: u32) -> Stmt {
        match local {
            0 => Stmt::Verdict(Verdict::Drop),
            n => self.dnat(true)(n),
        }
    }

    /// `dnat ip to <frontend> . numgen random mod N map @<backends map>`.
    fn dnat(&self, local: bool) -> impl Fn(u32) -> Stmt + '_ {
        move |n| {
            let mut key = frontend_fields(self.family, self.frontend);
            key.push(Field::NumgenRandom(n));
            Stmt::Nat(Nat {
                kind: NatKind::Dnat,
                family: self.family,
                addr: NatAddr::Map {
                    key,
                    map: self.map(local).name(),
                },
            })
        }
    }
}

/// The packet fields that identify a frontend.
pub fn frontend_fields(family: IpFamily, frontend: Frontend) -> Vec<Field> {
    let daddr = match family {
        IpFamily::V4 => Field::Ip4Daddr,
        IpFamily::V6 => Field::Ip6Daddr,
    };
    match frontend {
        Frontend::Addr => vec![daddr, Field::L4Proto, Field::ThDport],
        Frontend::NodePort => vec![Field::L4Proto, Field::ThDport],
    }
}

/// The declaration of a backends map: frontend . bucket -> endpoint address . port.
pub fn backends_map(map: BackendsMap) -> Set {
    let daddr = match map.family {
        IpFamily::V4 => Field::Ip4Daddr,
        IpFamily::V6 => Field::Ip6Daddr,
    };
    let mut key = frontend_fields(map.family, map.frontend);
    // The declared modulus is a placeholder: pools use their own N.
    key.push(Field::NumgenRandom(1));
    Set::typeof_map(map.name(), key, vec![daddr, Field::ThDport])
}

/// The NodePorts' backends maps (one per family and policy, always declared: NodePorts are
/// few, so their maps stay small).
pub fn nodeport_maps() -> impl Iterator<Item = Set> {
    [IpFamily::V4, IpFamily::V6].into_iter().flat_map(|family| {
        [false, true].into_iter().map(move |local| {
            backends_map(BackendsMap {
                family,
                frontend: Frontend::NodePort,
                local,
                shard: 0,
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_say_family_frontend_policy_and_counts() {
        let p = |frontend, kind| Pool {
            family: IpFamily::V4,
            frontend,
            kind,
            shard: 7,
        };
        assert_eq!(
            p(Frontend::Addr, PoolKind::Cluster { n: 3 }).chain_name(),
            "svc-v4-c3-s7"
        );
        assert_eq!(
            p(Frontend::NodePort, PoolKind::External { n: 2 }).chain_name(),
            "svc-v4-npx2"
        );
        assert_eq!(
            p(Frontend::Addr, PoolKind::ExternalLocal { n: 10, local: 0 }).chain_name(),
            "svc-v4-xl10-0-s7"
        );
        assert_eq!(
            p(Frontend::NodePort, PoolKind::BothLocal { local: 2 }).chain_name(),
            "svc-v4-npil2"
        );
    }

    #[test]
    fn both_policies_local_send_pods_and_the_node_to_local_backends_only() {
        let pool = |local| Pool {
            family: IpFamily::V4,
            frontend: Frontend::Addr,
            kind: PoolKind::BothLocal { local },
            shard: 3,
        };
        let text = |p: Pool| {
            let mut t = Table::new("t");
            t.add_chain(p.chain());
            crate::nft::render::render_full(&t)
        };
        let two = text(pool(2));
        assert!(
            two.contains("fib saddr type local jump svc-mark-masq"),
            "{two}"
        );
        assert!(
            two.contains("numgen random mod 2 map @svc-local-backends-v4-3"),
            "{two}"
        );
        assert!(!two.contains("@svc-backends-v4"), "{two}");
        assert_eq!(pool(2).maps().len(), 1);
        assert!(pool(0).maps().is_empty());
        let none = pool(0).chain().rules;
        assert_eq!(
            none.last().unwrap().stmts,
            vec![Stmt::Verdict(Verdict::Drop)]
        );
    }

    #[test]
    fn external_local_without_local_backends_drops_outside_sources() {
        let pool = Pool {
            family: IpFamily::V6,
            frontend: Frontend::NodePort,
            kind: PoolKind::ExternalLocal { n: 2, local: 0 },
            shard: 0,
        };
        let rules = pool.chain().rules;
        assert_eq!(
            rules.last().unwrap().stmts,
            vec![Stmt::Verdict(Verdict::Drop)]
        );
        let text = crate::nft::render::render_full(&{
            let mut t = Table::new("t");
            t.add_chain(pool.chain());
            t
        });
        assert!(
            text.contains(
                "dnat ip6 to meta l4proto . th dport . numgen random mod 2 map @svc-np-backends-v6"
            ),
            "{text}"
        );
    }
}
