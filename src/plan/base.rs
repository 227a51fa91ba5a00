//! The table skeleton every feature hooks into: base chains at fixed hooks and priorities,
//! and the shared address sets (cluster, service and node addresses) that features use to
//! tell cluster-internal traffic from traffic leaving the cluster.

use crate::config::Config;
use crate::nft::ir::*;
use ipnet::IpNet;
use std::net::IpAddr;

/// Base chains. Features add `jump` rules to them in a fixed order (see README "Table layout").
pub mod chains {
    /// Service DNAT for traffic arriving at the node (dstnat, -100).
    pub const NAT_PREROUTING: &str = "nat-prerouting";
    /// Service DNAT for locally generated traffic (dstnat, -100).
    pub const NAT_OUTPUT: &str = "nat-output";
    /// EgressIP SNAT and service masquerade (srcnat, 100).
    pub const NAT_POSTROUTING: &str = "nat-postrouting";
    /// EgressQoS DSCP marking (mangle, -150).
    pub const MANGLE_POSTROUTING: &str = "mangle-postrouting";
    /// EgressFirewall for pod traffic routed through the node (filter, 0): runs after
    /// prerouting DNAT, so service traffic is judged by its real destination.
    pub const FILTER_FORWARD: &str = "filter-forward";
}

/// The comment of the first rules of [`chains::FILTER_FORWARD`]: `counter`s of packets from
/// the cluster CIDRs. The agent reads them to tell whether pod traffic crosses this node's
/// netfilter hooks at all (it does not where the CNI keeps it elsewhere, e.g. in OVS), in
/// which case nothing the agent programs applies to pods (see `controller::pod_traffic`).
pub const POD_TRAFFIC_PROBE: &str = "pod-traffic-probe";

/// Shared address sets (interval sets, one per family).
pub mod sets {
    pub const CLUSTER_V4: &str = "cluster-cidrs-v4";
    pub const CLUSTER_V6: &str = "cluster-cidrs-v6";
    pub const SERVICE_V4: &str = "service-cidrs-v4";
    pub const SERVICE_V6: &str = "service-cidrs-v6";
    pub const NODE_IPS_V4: &str = "node-ips-v4";
    pub const NODE_IPS_V6: &str = "node-ips-v6";
}

fn base(kind: ChainType, hook: Hook, priority: i32) -> BaseChain {
    BaseChain {
        kind,
        hook,
        priority,
        policy: Policy::Accept,
    }
}

/// The skeleton: base chains (empty, policy accept) and the shared sets.
pub fn skeleton(config: &Config, node_ips: &[IpAddr]) -> Table {
    let mut t = Table::new(TABLE_NAME);
    let base_chains = [
        (
            chains::NAT_PREROUTING,
            base(ChainType::Nat, Hook::Prerouting, priority::DSTNAT),
        ),
        (
            chains::NAT_OUTPUT,
            base(ChainType::Nat, Hook::Output, priority::DSTNAT),
        ),
        (
            chains::NAT_POSTROUTING,
            base(ChainType::Nat, Hook::Postrouting, priority::SRCNAT),
        ),
        (
            chains::MANGLE_POSTROUTING,
            base(ChainType::Filter, Hook::Postrouting, priority::MANGLE),
        ),
        (
            chains::FILTER_FORWARD,
            base(ChainType::Filter, Hook::Forward, priority::FILTER),
        ),
    ];
    for (name, b) in base_chains {
        t.add_chain(Chain::base(name, b));
    }
    let forward = t
        .chains
        .get_mut(chains::FILTER_FORWARD)
        .expect("just added");
    for (saddr, cluster) in [
        (Field::Ip4Saddr, sets::CLUSTER_V4),
        (Field::Ip6Saddr, sets::CLUSTER_V6),
    ] {
        forward.push(
            Rule::new(vec![Stmt::in_set(vec![saddr], cluster), Stmt::Counter])
                .with_comment(POD_TRAFFIC_PROBE),
        );
    }
    add_cidr_sets(
        &mut t,
        sets::CLUSTER_V4,
        sets::CLUSTER_V6,
        &config.cluster_cidrs,
    );
    add_cidr_sets(
        &mut t,
        sets::SERVICE_V4,
        sets::SERVICE_V6,
        &config.service_cidrs,
    );
    add_address_sets(&mut t, node_ips);
    t
}

fn add_cidr_sets(t: &mut Table, v4: &str, v6: &str, cidrs: &[IpNet]) {
    let interval = SetFlags {
        interval: true,
        ..Default::default()
    };
    let mut s4 = Set::new(v4, vec![DataType::Ipv4Addr], SetKind::Set).with_flags(interval);
    let mut s6 = Set::new(v6, vec![DataType::Ipv6Addr], SetKind::Set).with_flags(interval);
    // Interval sets reject overlapping elements: keep only the outermost prefixes.
    for net in IpNet::aggregate(&cidrs.to_vec()) {
        let target = if net.addr().is_ipv4() {
            &mut s4
        } else {
            &mut s6
        };
        target.insert(vec![KeyPart::Prefix(net)]);
    }
    t.add_set(s4);
    t.add_set(s6);
}

fn add_address_sets(t: &mut Table, ips: &[IpAddr]) {
    let mut s4 = Set::new(sets::NODE_IPS_V4, vec![DataType::Ipv4Addr], SetKind::Set);
    let mut s6 = Set::new(sets::NODE_IPS_V6, vec![DataType::Ipv6Addr], SetKind::Set);
    for ip in ips {
        let target = if ip.is_ipv4() { &mut s4 } else { &mut s6 };
        target.insert(vec![KeyPart::Value(Value::ip(*ip))]);
    }
    t.add_set(s4);
    t.add_set(s6);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_has_base_chains_and_sets() {
        let mut c = Config::for_node("n");
        c.cluster_cidrs.push("10.128.0.0/16".parse().unwrap()); // inside the /14
        c.cluster_cidrs.push("fd01::/48".parse().unwrap());
        let t = skeleton(&c, &["192.168.1.1".parse().unwrap()]);
        assert_eq!(t.chains.len(), 5);
        assert!(t.chains.values().all(|c| c.base.is_some()));
        assert_eq!(
            t.sets[sets::CLUSTER_V4].elements.len(),
            1,
            "nested CIDR merged"
        );
        assert_eq!(t.sets[sets::CLUSTER_V6].elements.len(), 1);
        assert_eq!(t.sets[sets::NODE_IPS_V4].elements.len(), 1);
    }
}
