//! `agent explain` on planned tables ([`explain_desired`]: what `--dry-run` plans from
//! manifests, `main` asks `reconcile::planned` for them, so that this module depends on no
//! loop) and on any tables ([`explain_tables`]: the admin endpoint's `/explain` on the
//! table the agent applied).

use super::output::{Report, report};
use super::packet::NodeFacts;
use super::provenance::Index;
pub use super::request::{ExplainError, Request, TraceLimits};
use super::{Tables, Topology, explain_paths};
use crate::nft::ir::{Family, TABLE_NAME, Table};
use crate::plan::Desired;
use crate::snapshot::{self, Snapshot};
use std::net::IpAddr;

/// The node's own addresses (its Node object's, and the extra ones given).
pub fn node_facts(snapshot: &Snapshot, node: &str, extra: &[IpAddr]) -> NodeFacts {
    let mut facts = NodeFacts::default();
    if let Some(n) = snapshot.nodes().get(node) {
        facts.local.extend(snapshot::node_ips(n));
    }
    facts.local.extend(extra.iter().copied());
    facts
}

/// The EgressIP objects' names and addresses, for provenance.
pub fn egress_ips(snapshot: &Snapshot) -> Vec<(String, Vec<String>)> {
    let eips = snapshot.egress_ips().values();
    eips.map(|e| {
        let name = e.metadata.name.clone().unwrap_or_default();
        (name, e.spec.egress_ips.clone())
    })
    .collect()
}

/// What explaining needs besides the question: the tables and the node's facts.
pub struct Live<'a> {
    pub node: &'a str,
    pub inet: &'a Table,
    pub bridge: Option<&'a Table>,
    pub facts: &'a NodeFacts,
    pub egress_ips: &'a [(String, Vec<String>)],
}

/// Explains the request against the given tables (`--local-addr`s join the facts).
pub fn explain_tables(live: &Live, req: &Request) -> Result<Report, ExplainError> {
    let query = req.query()?;
    if matches!(query.topology, Topology::Bridged { .. }) && live.bridge.is_none() {
        return Err(ExplainError::NoBridgeTable);
    }
    let mut facts = live.facts.clone();
    facts.local.extend(req.local_addrs.iter().copied());
    let tables = Tables::new(live.inet, live.bridge);
    let index = Index::new(std::iter::once(live.inet).chain(live.bridge))
        .with_egress_ips(live.egress_ips.iter().cloned());
    let paths = explain_paths(&tables, &facts, &query);
    Ok(report(live.node, &query.packet, paths, &index))
}

/// Explains the request against planned tables.
pub fn explain_desired(
    node: &str,
    snapshot: &Snapshot,
    desired: &Desired,
    req: &Request,
) -> Result<Report, ExplainError> {
    let facts = node_facts(snapshot, node, &[]);
    let live = Live {
        node,
        inet: &desired.ruleset,
        bridge: (desired.extra_tables).get(Family::Bridge, TABLE_NAME),
        facts: &facts,
        egress_ips: &egress_ips(snapshot),
    };
    explain_tables(&live, req)
}
