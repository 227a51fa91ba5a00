//! The interfaces an assigner's probe may arrive on at this node (fencing, [`super::fence`]):
//! the node's *uplinks*, the interfaces holding one of the node's own addresses (its Node
//! InternalIPs and ExternalIPs, the addresses the probes are sent and signed to), and the
//! loopback for the node's own addresses only (the assigner probing its own node).
//!
//! **Why these and not the route back to the source.** A probe is addressed to one of these
//! addresses and comes from the node network, so it arrives on the interface that holds the
//! address in every common layout (one NIC, a bond, a VLAN, OVS `br-ex` or a Linux bridge
//! holding the node address). A strict reverse-path check (arrival interface = the route to
//! the sender) would also refuse pods, but refuses real probes on multi-homed nodes with
//! asymmetric routes, and needs a route lookup per sender. A pod's packets arrive on its
//! own interface: a veth (routed pods), the pods' bridge (bridged pods, with or without
//! `br_netfilter`), the agent's `np-eip` tunnel, an OVN management port: none holds a node
//! address, so what a pod sends never counts, whatever address it forges.
//!
//! **Not covered.** A bridge that holds the node address *and* has pod ports (pods bridged
//! straight onto the node's network, the uplink NIC enslaved to the same bridge): the pods'
//! packets arrive on that bridge like the uplink's. Such pods sit on the segment, where a
//! captured probe is the segment's threat (signatures and replay counters, see
//! [`super::probe_auth`]). Node addresses held on the loopback or a dummy with unnumbered
//! uplinks (L3 designs) make every probe arrive on an interface without a node address:
//! refused, so fencing is never armed there (a warning says so).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::host_cidrs::LinkFacts;
use crate::net::KernelAddress;

/// The uplinks and the loopback of this node, as last read from the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uplinks {
    uplinks: BTreeSet<u32>,
    loopback: Option<u32>,
}

impl Uplinks {
    /// The links holding one of `own` (the node's addresses), the agent's own links (the
    /// tunnel) aside, and the loopback.
    pub fn of(links: &[LinkFacts], addresses: &[KernelAddress], own: &[IpAddr]) -> Uplinks {
        let is = |index: u32, f: fn(&LinkFacts) -> bool| {
            links.iter().find(|l| l.index == index).is_some_and(f)
        };
        Uplinks {
            uplinks: addresses
                .iter()
                .filter(|a| own.contains(&a.addr))
                .map(|a| a.ifindex)
                .filter(|i| is(*i, |l| !l.loopback && !l.agent_owned))
                .collect(),
            loopback: links.iter().find(|l| l.loopback).map(|l| l.index),
        }
    }

    /// Whether a probe from `from` that arrived on `ifindex` may be the assigner's: on an
    /// uplink, or on the loopback from one of `own` (sent by this node itself; nothing from
    /// outside the node arrives on the loopback).
    pub fn admit(&self, ifindex: u32, from: IpAddr, own: &[IpAddr]) -> bool {
        self.uplinks.contains(&ifindex) || (Some(ifindex) == self.loopback && own.contains(&from))
    }

    /// Every interface [`Uplinks::admit`] may say yes for: what the listener's socket
    /// filter passes.
    pub fn interfaces(&self) -> Vec<u32> {
        self.uplinks.iter().copied().chain(self.loopback).collect()
    }

    /// No uplink known: no probe can count.
    pub fn none(&self) -> bool {
        self.uplinks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::egress_ip::ip;

    fn link(index: u32, loopback: bool, agent_owned: bool) -> LinkFacts {
        LinkFacts {
            index,
            up: true,
            loopback,
            agent_owned,
        }
    }

    fn addr(ifindex: u32, s: &str) -> KernelAddress {
        KernelAddress {
            ifindex,
            addr: s.parse().unwrap(),
            prefix_len: 24,
            proto: 0,
        }
    }

    #[test]
    fn uplinks_are_the_links_holding_the_nodes_addresses_and_pods_never_are() {
        // lo; eth0 with the InternalIP; a bond with the ExternalIP (v6); a pod's veth; the
        // pods' bridge with their gateway; the agent's tunnel, given a node address by
        // mistake.
        let links = [
            link(1, true, false),
            link(2, false, false),
            link(3, false, false),
            link(10, false, false),
            link(11, false, false),
            link(12, false, true),
        ];
        let addresses = [
            addr(1, "127.0.0.1"),
            addr(2, "192.168.50.11"),
            addr(3, "fd00::11"),
            addr(11, "10.128.0.1"),
            addr(12, "192.168.50.11"),
        ];
        let own = [ip("192.168.50.11"), ip("fd00::11")];
        let u = Uplinks::of(&links, &addresses, &own);
        assert_eq!(u.interfaces(), vec![2, 3, 1]);
        let leader = ip("192.168.50.13");
        assert!(u.admit(2, leader, &own));
        assert!(u.admit(3, ip("fd00::13"), &own));
        for pod_side in [10, 11, 12] {
            assert!(!u.admit(pod_side, leader, &own), "ifindex {pod_side}");
        }
        // The loopback: this node's own probes only.
        assert!(u.admit(1, own[0], &own));
        assert!(!u.admit(1, leader, &own));
        // Without the Node's addresses (no Node object yet), nothing is an uplink.
        let none = Uplinks::of(&links, &addresses, &[]);
        assert!(none.none());
        assert!(!none.admit(2, leader, &[]));
        assert_eq!(none.interfaces(), vec![1]);
    }
}
