//! PURE planning: `plan(&Snapshot, &Config) -> Desired`. No I/O, no clock, no locks, so the
//! same inputs always give the same ruleset, byte for byte. One file per feature; each adds
//! its chains and sets to the base skeleton and reports per-object status.

pub mod base;
pub mod egress_ip;
pub mod firewall;
pub mod in_force;
pub mod qos;
pub mod services;

use crate::config::Config;
use crate::dns::DnsAnswers;
use crate::net::NetDesired;
use crate::nft::ir::Table;
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
use std::net::IpAddr;

/// Everything the node should hold: the nftables table, and the addresses, routes and policy
/// rules (in `net`), plus what the planner has to say about each object it read.
#[derive(Debug, Clone)]
pub struct Desired {
    pub ruleset: Table,
    /// Addresses, routes and policy rules.
    pub net: NetDesired,
    /// One entry per custom resource a feature planner looked at.
    pub statuses: Vec<ObjectStatus>,
    /// What to remember for the next plan once this one is applied.
    pub memory: Memory,
    /// UDP service backends that went away: their conntrack entries are to be deleted.
    pub stale_udp: Vec<(IpAddr, u16)>,
}

/// The last valid form of each custom resource, carried from one plan to the next by the
/// reconciler (updated only after a successful apply). When an object turns invalid, its
/// feature plans from this copy instead, so a typo never makes a namespace fall open; the
/// copy is still planned against the current pods, nodes and DNS answers.
///
/// It also carries what makes planning O(change): validation results (`in_force::Checks`,
/// kept with the object they came from) and each object's table part with the inputs it was
/// built from; unchanged inputs give back the same `Arc<Part>`, which the diff skips.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    pub qos: qos::QosMemory,
    pub firewall: firewall::FirewallMemory,
    /// The last plan of every Service (re-used while its inputs are pointer-equal).
    pub services: services::Memo,
    /// Per EgressIP name.
    pub egress_ip: egress_ip::EgressIpMemory,
}

/// The planner's verdict on one object: accepted, or rejected with a precise reason (the
/// object's previously applied rules then stay in force).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    pub kind: Kind,
    pub key: ObjectKey,
    pub result: Result<(), String>,
}

/// Plans the node's desired state from the cluster snapshot, with no memory of earlier plans.
pub fn plan(snapshot: &Snapshot, config: &Config) -> Desired {
    plan_with(snapshot, config, &Memory::default())
}

/// Plans the node's desired state; `memory` holds the last valid objects (see [`Memory`]).
pub fn plan_with(snapshot: &Snapshot, config: &Config, memory: &Memory) -> Desired {
    plan_with_dns(snapshot, config, memory, &DnsAnswers::default())
}

/// Plans the node's desired state with the current answers for EgressFirewall `dnsName`
/// rules (resolved outside the planner, see `crate::dns`).
pub fn plan_with_dns(
    snapshot: &Snapshot,
    config: &Config,
    memory: &Memory,
    dns: &DnsAnswers,
) -> Desired {
    let mut ruleset = base::skeleton(config, &all_node_ips(snapshot));
    // Each planner reads its own memory and returns the next one: nothing is cloned (a
    // deep copy of 1000 namespaces' memory was a third of re-planning one changed rule).
    // Services first: their nat-postrouting masquerade jump precedes other SNAT.
    let svc = services::plan(snapshot, config, &memory.services, &mut ruleset);
    let fw = firewall::plan(snapshot, config, dns, &memory.firewall, &mut ruleset);
    let qos = qos::plan(snapshot, config, &memory.qos, &mut ruleset);
    let mut net = NetDesired::default();
    let eip = egress_ip::plan(snapshot, config, &memory.egress_ip, &mut ruleset, &mut net);
    Desired {
        ruleset,
        net,
        statuses: fw
            .statuses
            .into_iter()
            .chain(qos.statuses)
            .chain(eip.statuses)
            .chain(svc.statuses)
            .collect(),
        memory: Memory {
            qos: qos::QosMemory {
                in_force: qos.memory,
                checks: qos.checks,
            },
            firewall: fw.memory,
            services: svc.memo,
            egress_ip: eip.memory,
        },
        stale_udp: svc.stale_udp,
    }
}

/// Every Node's InternalIP/ExternalIP, sorted and unique.
fn all_node_ips(snapshot: &Snapshot) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = snapshot
        .nodes()
        .values()
        .flat_map(|n| snapshot::node_ips(n))
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::render::render_full;

    #[test]
    fn plan_is_deterministic_and_holds_node_addresses() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-1"},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "192.168.50.11"},
                {"type": "ExternalIP", "address": "2001:db8::11"},
                {"type": "Hostname", "address": "worker-1"}
            ]}
        }))
        .unwrap();
        let snap = Snapshot::builder().with(node).build();
        let cfg = Config::for_node("worker-1");
        let a = plan(&snap, &cfg);
        assert_eq!(
            render_full(&a.ruleset),
            render_full(&plan(&snap, &cfg).ruleset)
        );
        let text = render_full(&a.ruleset);
        assert!(
            text.contains("192.168.50.11") && text.contains("2001:db8::11"),
            "{text}"
        );
        assert!(!text.contains("worker-1"));
    }
}
