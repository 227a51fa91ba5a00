//! The one shape of a feature planner.
//!
//! A feature turns the snapshot into its share of the node's desired state: table parts (and
//! the few top-level objects that hook it into the base skeleton), network desires and one
//! status per object it read. It carries a memory from one plan to the next (the last valid
//! version of each object, the validation cache of [`super::in_force::Validated`], and
//! whatever makes its planning O(change)). What the backends report back (an address no
//! interface can take) goes to the feature that asked for it in a second, explicit step
//! ([`Feature::settle`]), so nobody outside the planner edits a plan.
//!
//! Adding a feature is one module implementing [`Feature`] and one line in the registry
//! (`features!` in `plan/mod.rs`).

use super::ObjectStatus;
use crate::config::Config;
use crate::dns::DnsAnswers;
use crate::net::{NetDesired, Refusal};
use crate::nft::ir::Table;
use crate::snapshot::Snapshot;
use std::collections::BTreeSet;
use std::fmt::Debug;

/// What every feature plans from.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub snapshot: &'a Snapshot,
    pub config: &'a Config,
    /// Answers for EgressFirewall `dnsName` rules, resolved outside the planner.
    pub dns: &'a DnsAnswers,
}

/// What the features plan into, in registry order.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The base skeleton plus every feature's parts and hooks.
    pub ruleset: Table,
    /// `table bridge nodeplane` (NetworkPolicy for bridged pods), `None`: no such table.
    pub bridge: Option<Table>,
    /// Addresses, routes, policy rules and the tunnel.
    pub net: NetDesired,
    /// One entry per object a feature looked at.
    pub statuses: Vec<ObjectStatus>,
}

/// What the backends report about a plan before it is applied.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendReport<'a> {
    /// Addresses the network backend cannot place on any interface.
    pub refused: &'a [Refusal],
    /// The node's bridge ports and what is behind each, read because a plan asked
    /// (`NetDesired::bridge_pods`); the read's error as text.
    pub bridge_ports: Option<&'a Result<crate::net::bridge_ports::BridgePorts, String>>,
}

/// A feature planner. Pure: no I/O, clock or locks, so the same inputs give the same bytes.
pub trait Feature {
    /// The feature's name: the prefix of its table parts.
    const NAME: &'static str;

    /// The switch that turns it on and off (`--features`).
    const SWITCH: crate::features::Switch;

    /// What the feature carries from one plan to the next (kept by the reconciler after each
    /// successful apply).
    type Memory: Clone + Debug + Default + Send + Sync;

    /// What the feature hands to the world besides its table (see [`Output`]).
    type Output: Output;

    /// Plans the feature into `out` and its `output`; returns the memory for the next plan.
    fn plan(
        inputs: &Inputs,
        memory: &Self::Memory,
        out: &mut Planned,
        output: &mut Self::Output,
    ) -> Self::Memory;

    /// Second step: amends the feature's own share of `out` (and its statuses) after the
    /// backends reported what they cannot do. `memory` is what [`Feature::plan`] returned.
    fn settle(
        _inputs: &Inputs,
        _memory: &Self::Memory,
        _report: &BackendReport,
        _out: &mut Planned,
        _output: &mut Self::Output,
    ) {
    }

    /// Maps of this feature whose elements may reach the kernel after a new table's first
    /// commit (`Transaction::create_chunked`): only maps where a missing element filters
    /// nothing (a service not load-balanced yet).
    fn is_bulk_map(_name: &str) -> bool {
        false
    }

    /// DNS names the next plan needs answers for (resolved outside the planner).
    fn dns_names(_inputs: &Inputs, _memory: &Self::Memory) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// What a feature hands to the world besides its table: the services' stale UDP flows and
/// health-check ports, the firewall's DNS learning. The reconciler and the loop carry every
/// feature's output in [`super::Outputs`] without reading it; the run mode's observers (and
/// [`Output::after_commit`]) do.
pub trait Output: Clone + Debug + Default + Send + Sync + 'static {
    /// Kernel side effects due once the plan's rules are committed (and before addresses
    /// change), with real backends only; the output may record what they did for the
    /// observers. An error is logged; the sync still succeeds.
    fn after_commit(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// What the feature could not do in this plan, under a `/readyz` warning topic, one line
    /// each (logged too); `None` for features that never warn. An empty list clears the
    /// topic's warning.
    fn warnings(&self) -> Option<(&'static str, &[String])> {
        None
    }
}

/// For features with nothing beside their table.
impl Output for () {}
