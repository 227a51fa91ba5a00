//! `k8s.ovn.org/host-cidrs`: the subnets this node can host egress IPs in, published on its
//! own Node object in OVN-Kubernetes' format (a JSON list of `address/prefix` strings, sorted:
//! `["192.168.1.10/24","fd00::10/64"]`), so the assigner never guesses a node's subnets.
//!
//! Published: the global unicast addresses of links that are up (administratively and with
//! carrier) and not loopback, except the agent's own (its egress IPs, marked with
//! `IFA_PROTO`, and anything on the links it owns such as the tunnel) and addresses inside
//! the cluster or service CIDRs (pod network gateways). The agent reads the kernel every
//! [`POLL`] and merge-patches `metadata.annotations` only when the value differs from what
//! the Node in the snapshot says.

use std::net::IpAddr;
use std::time::Duration;

use futures::TryStreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use netlink_packet_route::link::{LinkFlags, LinkMessage};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::net::{KernelAddress, NODEPLANE_PROTO};
use crate::snapshot::Snapshot;

/// The annotation OVN-Kubernetes uses for the same data, and its parser.
pub use crate::snapshot::{HOST_CIDRS_ANNOTATION as ANNOTATION, parse_host_cidrs as parse};
/// How often the kernel's addresses are read.
pub const POLL: Duration = Duration::from_secs(10);

/// What the publisher needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFacts {
    pub index: u32,
    /// Administratively up and with carrier.
    pub up: bool,
    pub loopback: bool,
    /// Carries the agent's alias (the EgressIP tunnel).
    pub agent_owned: bool,
}

/// The node's egress-capable subnets (addresses with their prefix), sorted and deduplicated.
pub fn host_cidrs(
    links: &[LinkFacts],
    addresses: &[KernelAddress],
    excluded: &[IpNet],
) -> Vec<IpNet> {
    let usable_link = |index: u32| {
        links
            .iter()
            .find(|l| l.index == index)
            .is_some_and(|l| l.up && !l.loopback && !l.agent_owned)
    };
    let mut out: Vec<IpNet> = addresses
        .iter()
        .filter(|a| a.proto != NODEPLANE_PROTO && usable_link(a.ifindex))
        .filter(|a| global_unicast(a.addr))
        .filter(|a| !excluded.iter().any(|net| net.contains(&a.addr)))
        .filter_map(|a| IpNet::new(a.addr, a.prefix_len).ok())
        .collect();
    out.sort_by_key(|n| n.to_string());
    out.dedup();
    out
}

fn global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            !(a.is_loopback()
                || a.is_link_local()
                || a.is_multicast()
                || a.is_unspecified()
                || a.is_broadcast())
        }
        IpAddr::V6(a) => {
            !(a.is_loopback()
                || a.is_unicast_link_local()
                || a.is_multicast()
                || a.is_unspecified()
                || a.to_ipv4_mapped().is_some())
        }
    }
}

/// The annotation's value: a JSON list of strings, sorted (as OVN-Kubernetes writes it).
pub fn annotation_value(cidrs: &[IpNet]) -> String {
    let mut items: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
    items.sort();
    items.dedup();
    serde_json::to_string(&items).unwrap_or_else(|_| "[]".into())
}

fn link_facts(msg: &LinkMessage) -> LinkFacts {
    let flags = msg.header.flags;
    LinkFacts {
        index: msg.header.index,
        up: flags.contains(LinkFlags::Up) && flags.contains(LinkFlags::LowerUp),
        loopback: flags.contains(LinkFlags::Loopback),
        agent_owned: crate::net::links::parse_owned(msg).is_some(),
    }
}

/// Reads the links and addresses of the network namespace this runs in.
pub async fn read_kernel() -> Result<(Vec<LinkFacts>, Vec<KernelAddress>), String> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| format!("netlink: {e}"))?;
    let conn = tokio::spawn(conn);
    let result = async {
        let links: Vec<LinkFacts> = handle
            .link()
            .get()
            .execute()
            .map_ok(|m| link_facts(&m))
            .try_collect()
            .await
            .map_err(|e| format!("dump links: {e}"))?;
        let addresses: Vec<KernelAddress> = handle
            .address()
            .get()
            .execute()
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| format!("dump addresses: {e}"))?
            .iter()
            .filter_map(crate::net::addresses::parse)
            .collect();
        Ok((links, addresses))
    }
    .await;
    conn.abort();
    result
}

/// The annotation's value on `node` in the snapshot (`None`: no Node or no annotation).
fn published(snapshot: &Snapshot, node: &str) -> Option<String> {
    snapshot
        .node(node)?
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION)
        .cloned()
}

/// Keeps `k8s.ovn.org/host-cidrs` on this node's Node object equal to what the kernel holds.
/// Runs until the snapshot channel closes.
pub async fn publish(
    client: Client,
    node: String,
    excluded: Vec<IpNet>,
    mut snapshots: watch::Receiver<Option<Snapshot>>,
) {
    let api: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wanted: Option<String> = None;
    // The value last patched and the Node's resourceVersion seen then: no second patch
    // while the snapshot has not caught up with the first.
    let mut patched: Option<(String, Option<String>)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => match read_kernel().await {
                Ok((links, addresses)) => {
                    wanted = Some(annotation_value(&host_cidrs(&links, &addresses, &excluded)));
                }
                Err(e) => warn!("{ANNOTATION}: cannot read the interfaces: {e}"),
            },
            changed = snapshots.changed() => if changed.is_err() { return },
        }
        let Some(value) = wanted.clone() else {
            continue;
        };
        let (current, rv) = {
            let snap = snapshots.borrow();
            let Some(snap) = snap.as_ref() else { continue };
            let Some(n) = snap.node(&node) else { continue };
            (published(snap, &node), n.metadata.resource_version.clone())
        };
        if current.as_deref() == Some(value.as_str()) {
            patched = None;
            continue;
        }
        if patched.as_ref() == Some(&(value.clone(), rv.clone())) {
            continue;
        }
        let body = json!({"metadata": {"annotations": {ANNOTATION: value}}});
        match api
            .patch(&node, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {
                info!("Node {node}: {ANNOTATION} = {value}");
                patched = Some((value, rv));
            }
            Err(e) => {
                debug!("{e:?}");
                warn!("Node {node}: cannot set {ANNOTATION}, retrying: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ifindex: u32, a: &str, prefix_len: u8, proto: u8) -> KernelAddress {
        KernelAddress {
            ifindex,
            addr: a.parse().unwrap(),
            prefix_len,
            proto,
        }
    }

    #[test]
    fn only_global_unicast_addresses_of_usable_foreign_links() {
        let link = |index, up, loopback, agent_owned| LinkFacts {
            index,
            up,
            loopback,
            agent_owned,
        };
        let links = [
            link(1, true, true, false),   // lo
            link(2, true, false, false),  // eth0
            link(3, false, false, false), // down
            link(4, true, false, true),   // np-eip
            link(5, true, false, false),  // cni0
        ];
        let addresses = [
            addr(1, "127.0.0.1", 8, 0),
            addr(1, "::1", 128, 0),
            addr(2, "192.168.1.10", 24, 0),
            addr(2, "fd00::10", 64, 0),
            addr(2, "fe80::1", 64, 0),
            addr(2, "169.254.3.3", 16, 0),
            addr(2, "192.168.1.100", 24, NODEPLANE_PROTO), // an egress IP
            addr(2, "192.168.1.10", 24, 0),                // listed twice
            addr(3, "10.1.0.1", 24, 0),
            addr(4, "10.2.0.1", 24, 0),
            addr(5, "10.128.0.1", 24, 0),
            addr(9, "10.3.0.1", 24, 0), // link vanished
        ];
        let excluded = ["10.128.0.0/14".parse().unwrap()];
        let cidrs = host_cidrs(&links, &addresses, &excluded);
        assert_eq!(
            annotation_value(&cidrs),
            r#"["192.168.1.10/24","fd00::10/64"]"#
        );
        assert_eq!(parse(&annotation_value(&cidrs)).unwrap(), cidrs);
    }

    #[test]
    fn parse_refuses_what_is_not_a_list_of_cidrs() {
        assert_eq!(parse("[]").unwrap(), vec![]);
        assert!(parse("192.168.1.0/24").is_err());
        assert!(parse(r#"["192.168.1.10"]"#).is_err());
        assert!(
            parse(r#"["0.0.0.0/0"]"#)
                .unwrap_err()
                .contains("prefix length 0")
        );
    }
}
