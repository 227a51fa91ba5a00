//! `agent explain` from manifests: plan as `--dry-run` does (no privileges, no kernel),
//! then evaluate the planned tables.

use super::output::{Report, report};
use super::packet::{NodeFacts, Packet, PacketError, parse_ct_state, parse_proto};
use super::provenance::Index;
use super::{Query, Tables, Topology, explain_paths};
use crate::config::Config;
use crate::observe::ReconcileError;
use crate::plan::Desired;
use crate::reconcile;
use crate::snapshot::{self, Snapshot};
use std::net::IpAddr;

/// The packet and node facts as the command line gives them.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub proto: String,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    pub ct_state: Option<String>,
    pub bridged: bool,
    pub br_netfilter: bool,
    /// Addresses of this node besides its Node object's (for `fib daddr type local`).
    pub local_addrs: Vec<IpAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}")]
    Packet(#[from] PacketError),
    #[error("--{0} is required")]
    Missing(&'static str),
    #[error("--br-netfilter needs --bridged")]
    BrNetfilterWithoutBridge,
    #[error(transparent)]
    Plan(#[from] ReconcileError),
}

impl Request {
    /// The query this request asks, checked.
    pub fn query(&self) -> Result<Query, ExplainError> {
        let src = self.src.ok_or(ExplainError::Missing("src"))?;
        let dst = self.dst.ok_or(ExplainError::Missing("dst"))?;
        let proto = parse_proto(&self.proto)?;
        let mut packet = Packet::new(src, dst, proto, self.sport, self.dport)?;
        packet.iif = self.iif.clone();
        packet.oif = self.oif.clone();
        if let Some(s) = &self.ct_state {
            packet.ct_state = parse_ct_state(s)?;
        }
        let topology = match (self.bridged, self.br_netfilter) {
            (false, true) => return Err(ExplainError::BrNetfilterWithoutBridge),
            (false, false) => Topology::Routed,
            (true, br_netfilter) => Topology::Bridged { br_netfilter },
        };
        Ok(Query { packet, topology })
    }
}

/// The node's own addresses (its Node object's, and the extra ones given).
pub fn node_facts(snapshot: &Snapshot, node: &str, extra: &[IpAddr]) -> NodeFacts {
    let mut facts = NodeFacts::default();
    if let Some(n) = snapshot.nodes().get(node) {
        facts.local.extend(snapshot::node_ips(n));
    }
    facts.local.extend(extra.iter().copied());
    facts
}

/// Explains `query` against planned tables.
pub fn explain_desired(
    node: &str,
    snapshot: &Snapshot,
    desired: &Desired,
    req: &Request,
) -> Result<Report, ExplainError> {
    let query = req.query()?;
    let facts = node_facts(snapshot, node, &req.local_addrs);
    let tables = Tables::new(&desired.ruleset, desired.bridge.as_ref());
    let eips = snapshot.egress_ips().values().map(|e| {
        (
            e.metadata.name.clone().unwrap_or_default(),
            e.spec.egress_ips.clone(),
        )
    });
    let index =
        Index::new(std::iter::once(&desired.ruleset).chain(&desired.bridge)).with_egress_ips(eips);
    let paths = explain_paths(&tables, &facts, &query);
    Ok(report(node, &query.packet, paths, &index))
}

/// `agent explain --manifests DIR --node-name N ...`: plans as `--dry-run` does, then
/// explains.
pub fn offline(config: &Config, req: &Request) -> Result<Report, ExplainError> {
    req.query()?;
    let (snapshot, desired, _) = reconcile::planned(config)?;
    explain_desired(&config.node_name, &snapshot, &desired, req)
}
