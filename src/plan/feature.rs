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
use std::net::IpAddr;

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
    /// UDP service backends that went away: their conntrack entries are to be deleted.
    pub stale_udp: Vec<(IpAddr, u16)>,
    /// UDP service frontends that just got their first endpoint: the entries of flows
    /// that met no endpoint there (never DNATed) are to be deleted.
    pub new_udp_frontends: Vec<crate::conntrack::UdpFrontend>,
    /// The health-check ports to serve (see [`HealthChecks`]).
    pub health_checks: HealthChecks,
}

/// healthCheckNodePort -> (service, ready local endpoints) of `externalTrafficPolicy: Local`
/// services. A persistent map: handing it on is O(1).
pub type HealthChecks = imbl::OrdMap<u16, (String, usize)>;

/// What the backends report about a plan before it is applied.
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendReport<'a> {
    /// Addresses the network backend cannot place on any interface.
    pub refused: &'a [Refusal],
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

    /// Plans the feature into `out` and returns the memory for the next plan.
    fn plan(inputs: &Inputs, memory: &Self::Memory, out: &mut Planned) -> Self::Memory;

    /// Second step: amends the feature's own share of `out` (and its statuses) after the
    /// backends reported what they cannot do. `memory` is what [`Feature::plan`] returned.
    fn settle(
        _inputs: &Inputs,
        _memory: &Self::Memory,
        _report: &BackendReport,
        _out: &mut Planned,
    ) {
    }

    /// DNS names the next plan needs answers for (resolved outside the planner).
    fn dns_names(_inputs: &Inputs, _memory: &Self::Memory) -> BTreeSet<String> {
        BTreeSet::new()
    }
}
