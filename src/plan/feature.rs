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

use super::DnsAnswers;
use super::ObjectStatus;
use crate::config::Config;
use crate::net::{NetDesired, Refusal};
use crate::nft::ir::{Family, Table};
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
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
    /// The tables beside the main one (see [`ExtraTables`]).
    pub extra_tables: ExtraTables,
    /// Addresses, routes, policy rules and the tunnel.
    pub net: NetDesired,
    /// One entry per object a feature looked at.
    pub statuses: Vec<ObjectStatus>,
}

/// The tables a feature plans beside the main one (NetworkPolicy's bridge-family table), by
/// family and name. The reconciler keeps an engine per table and deletes a table a feature
/// declares ([`Feature::TABLES`]) while no plan holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtraTables(BTreeMap<(Family, String), Table>);

impl ExtraTables {
    /// Adds `table` (replacing one of the same family and name).
    pub fn insert(&mut self, table: Table) {
        self.0.insert((table.family, table.name.clone()), table);
    }

    pub fn get(&self, family: Family, name: &str) -> Option<&Table> {
        self.0.get(&(family, name.to_string()))
    }

    pub fn get_mut(&mut self, family: Family, name: &str) -> Option<&mut Table> {
        self.0.get_mut(&(family, name.to_string()))
    }

    /// Takes the table of `family` and `name` out.
    pub fn remove(&mut self, family: Family, name: &str) -> Option<Table> {
        self.0.remove(&(family, name.to_string()))
    }

    /// The tables, by family and name.
    pub fn iter(&self) -> impl Iterator<Item = &Table> {
        self.0.values()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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

impl<'a> BackendReport<'a> {
    /// The network backend's refusals and what it read of the node for the plan.
    pub fn new(refused: &'a [Refusal], facts: &'a crate::net::NodeFacts) -> Self {
        BackendReport {
            refused,
            bridge_ports: facts.bridge_ports.as_ref(),
        }
    }
}

/// What the network backend found when the plan was applied, for the features to report.
#[derive(Debug, Clone, Copy)]
pub struct AppliedReport<'a> {
    /// Addresses someone else holds on the node or network.
    pub conflicts: &'a [crate::net::AddressConflict],
}

/// A feature planner. Pure: no I/O, clock or locks, so the same inputs give the same bytes.
pub trait Feature {
    /// The feature's name: the prefix of its table parts.
    const NAME: &'static str;

    /// The switch that turns it on and off (`--features`).
    const SWITCH: crate::features::Switch;

    /// What the feature carries from one plan to the next (kept by the reconciler after each
    /// successful apply), and what of it is kept across restarts ([`Remember`]).
    type Memory: Remember + Clone + Debug + Default + Send + Sync;

    /// What the feature hands to the world besides its table (see [`Output`]).
    type Output: Output;

    /// The tables beside the main one the feature may plan into [`Planned::extra_tables`]:
    /// the reconciler deletes one the kernel holds while no plan holds it (a leftover
    /// too, or the feature switched off).
    const TABLES: &'static [(Family, &'static str)] = &[];

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

    /// Third step, after the apply: amends the feature's statuses with what the network
    /// backend found (an address another host holds).
    fn report_applied(_inputs: &Inputs, _report: &AppliedReport, _statuses: &mut [ObjectStatus]) {}

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

/// What a feature's memory keeps across restarts: the objects in force, whose last valid
/// versions `state` saves and reads back (all features' together: [`super::Kept`]).
pub trait Remember: Sized {
    /// `()` for a memory that keeps nothing.
    type Kept: Keep;

    /// What is kept (cheap: `Arc`s).
    fn kept(&self) -> Self::Kept;

    /// A memory that plans from `kept` (an invalid object from its last valid version).
    fn restore(kept: Self::Kept) -> Self;

    /// Whether this memory keeps the same objects as `kept` (pointer comparisons when
    /// nothing changed).
    fn keeps(&self, kept: &Self::Kept) -> bool;
}

/// What a feature keeps across restarts ([`Remember::Kept`]), and how it reads and writes
/// itself in the state file (see [`super::kept`]).
pub trait Keep: Clone + Debug + Default + Send + Sync {
    /// The number of objects kept.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes what is kept as the feature's fields of the state file's JSON object.
    fn save<M: serde::ser::SerializeMap>(&self, file: &mut M) -> Result<(), M::Error>;

    /// Reads what is kept back from the state file's fields: each object validated again,
    /// one that cannot be trusted left out and reported in `file`. Err (the reason) when a
    /// field of the feature is not what it writes: the whole file is then ignored.
    fn load(file: &mut super::kept::KeptFile<'_>) -> Result<Self, String>;

    /// The fast path of [`Keep::load`], for a file as the agent writes it: when `name` is a
    /// field of this feature, decodes its value from `map` in one typed pass into `self`
    /// (objects validated again as by `load`, what is left out pushed to `problems` as
    /// (which item, why)) and returns true; false for another feature's field.
    fn decode_field<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        problems: &mut Vec<(String, String)>,
    ) -> Result<bool, A::Error>;
}

/// For features that keep nothing.
impl Keep for () {
    fn len(&self) -> usize {
        0
    }

    fn save<M: serde::ser::SerializeMap>(&self, _file: &mut M) -> Result<(), M::Error> {
        Ok(())
    }

    fn load(_file: &mut super::kept::KeptFile<'_>) -> Result<(), String> {
        Ok(())
    }

    fn decode_field<'de, A: serde::de::MapAccess<'de>>(
        &mut self,
        _name: &str,
        _map: &mut A,
        _problems: &mut Vec<(String, String)>,
    ) -> Result<bool, A::Error> {
        Ok(false)
    }
}
