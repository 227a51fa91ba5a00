//! PURE planning: `plan(&Snapshot, &Config) -> Desired`. No I/O, no clock, no locks, so the
//! same inputs always give the same ruleset, byte for byte. Every feature has the same shape
//! ([`Feature`]) and one line in the registry below; each adds its parts to the base
//! skeleton and reports per-object status.

pub mod acl_log;
pub mod asks;
pub mod base;
pub mod egress_ip;
pub mod feature;
pub mod firewall;
pub mod in_force;
pub mod kept;
pub mod netpol;
pub mod qos;
pub mod services;

use crate::config::Config;
use crate::net::NetDesired;
use crate::nft::ir::{Family, Table};
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
pub use asks::{Answerer, Answers, Asks, DnsAnswers, NoAnswers};
pub use feature::{
    AppliedReport, BackendReport, ExtraTables, Feature, Inputs, Keep, Output, Planned, Remember,
};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The registry: every feature, in planning order, with the field of [`Memory`] that holds
/// what it carries from one plan to the next. Adding a feature is one line here.
macro_rules! features {
    ($($(#[$doc:meta])* $field:ident: $feature:ty,)*) => {
        /// What every feature carries from one plan to the next, kept by the reconciler and
        /// updated only after a successful apply (see [`Feature::Memory`]). When an object
        /// turns invalid its feature plans from the last valid copy here, so a typo never
        /// makes a namespace fall open; and unchanged inputs give back the same `Arc<Part>`,
        /// which the diff skips, so planning is O(change).
        #[derive(Debug, Clone, Default)]
        pub struct Memory {
            $($(#[$doc])* pub $field: <$feature as Feature>::Memory,)*
        }

        /// What every feature keeps across restarts ([`Remember`]: the last valid objects,
        /// which `state` saves and reads back).
        #[derive(Debug, Clone, Default)]
        pub struct Kept {
            $(pub $field: <<$feature as Feature>::Memory as Remember>::Kept,)*
        }

        impl Kept {
            /// What `memory` keeps (cheap: the maps hold `Arc`s).
            pub fn of(memory: &Memory) -> Kept {
                Kept {
                    $($field: memory.$field.kept(),)*
                }
            }

            /// A planner memory that plans an invalid object from the kept versions.
            pub fn into_memory(self) -> Memory {
                Memory {
                    $($field: Remember::restore(self.$field),)*
                }
            }

            /// True when `memory` keeps the same objects (O(objects) pointer comparisons
            /// when nothing changed).
            pub fn same_as(&self, memory: &Memory) -> bool {
                true $(&& memory.$field.keeps(&self.$field))*
            }

            /// Writes every feature's fields of the state file, in registry order.
            pub fn save<M: serde::ser::SerializeMap>(&self, file: &mut M) -> Result<(), M::Error> {
                $(Keep::save(&self.$field, file)?;)*
                Ok(())
            }

            /// Decodes the state file's field `name` into the feature that writes it (see
            /// [`Keep::decode_field`]); false when no feature does.
            pub fn decode_field<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                name: &str,
                map: &mut A,
                problems: &mut Vec<(String, String)>,
            ) -> Result<bool, A::Error> {
                $(if Keep::decode_field(&mut self.$field, name, map, problems)? {
                    return Ok(true);
                })*
                Ok(false)
            }

            /// Reads every feature's fields back (see [`Keep::load`]).
            pub fn load(file: &mut kept::KeptFile<'_>) -> Result<Kept, String> {
                Ok(Kept {
                    $($field: Keep::load(file)?,)*
                })
            }

            /// The number of objects kept.
            pub fn len(&self) -> usize {
                0 $(+ self.$field.len())*
            }

            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
        }

        /// Every feature's [`Output`] of one plan, carried unread by the reconciler and the
        /// loop to the observers.
        #[derive(Debug, Clone, Default)]
        pub struct Outputs {
            $(pub $field: <$feature as Feature>::Output,)*
        }

        impl Outputs {
            /// Runs every feature's [`Output::after_commit`]; returns the errors, by feature.
            pub fn after_commit(&mut self) -> Vec<(&'static str, String)> {
                let mut errors = Vec::new();
                $(if let Err(e) = self.$field.after_commit() {
                    errors.push((<$feature as Feature>::NAME, e));
                })*
                errors
            }

            /// Every feature's [`Output::warnings`], by topic.
            pub fn warnings(&self) -> Vec<(&'static str, &[String])> {
                let mut warnings = Vec::new();
                $(warnings.extend(self.$field.warnings());)*
                warnings
            }
        }

        /// Whether a feature lets map `name` be filled in chunks on a cold start
        /// ([`Feature::is_bulk_map`]).
        pub fn is_bulk_map(name: &str) -> bool {
            false $(|| <$feature as Feature>::is_bulk_map(name))*
        }

        /// Every table beside the main one a feature may plan ([`Feature::TABLES`]), in
        /// registry order.
        pub fn extra_tables() -> Vec<(Family, &'static str)> {
            let mut tables = Vec::new();
            $(tables.extend_from_slice(<$feature as Feature>::TABLES);)*
            tables
        }

        /// The names of the registered features, in planning order.
        pub const FEATURES: &[&str] = &[$(<$feature as Feature>::NAME),*];

        fn plan_features(
            inputs: &Inputs,
            memory: &Memory,
            out: &mut Planned,
            outputs: &mut Outputs,
        ) -> Memory {
            // Struct fields are evaluated in the order written: registry order.
            // A feature switched off plans nothing and remembers nothing.
            let on = |switch| inputs.config.features.on(switch);
            Memory {
                $($field: if on(<$feature as Feature>::SWITCH) {
                    <$feature as Feature>::plan(inputs, &memory.$field, out, &mut outputs.$field)
                } else {
                    Default::default()
                },)*
            }
        }

        fn settle_features(
            inputs: &Inputs,
            memory: &Memory,
            report: &BackendReport,
            out: &mut Planned,
            outputs: &mut Outputs,
        ) {
            $(if inputs.config.features.on(<$feature as Feature>::SWITCH) {
                let output = &mut outputs.$field;
                <$feature as Feature>::settle(inputs, &memory.$field, report, out, output);
            })*
        }

        fn report_applied_of_features(
            inputs: &Inputs,
            report: &AppliedReport,
            statuses: &mut [ObjectStatus],
        ) {
            $(if inputs.config.features.on(<$feature as Feature>::SWITCH) {
                <$feature as Feature>::report_applied(inputs, report, statuses);
            })*
        }

        fn dns_names_of_features(inputs: &Inputs, memory: &Memory) -> BTreeSet<String> {
            let mut names = BTreeSet::new();
            $(if inputs.config.features.on(<$feature as Feature>::SWITCH) {
                names.extend(<$feature as Feature>::dns_names(inputs, &memory.$field));
            })*
            names
        }
    };
}

// Statuses are reported in this order. The order does not change the ruleset: each feature
// hooks into base chains with rules of its own at fixed priorities.
features! {
    firewall: firewall::Firewall,
    qos: qos::Qos,
    egress_ip: egress_ip::EgressIp,
    services: services::Services,
    netpol: netpol::NetworkPolicies,
}

/// Everything the node should hold: the nftables table, and the addresses, routes and policy
/// rules (in `net`), plus what the planner has to say about each object it read.
#[derive(Debug, Clone)]
pub struct Desired {
    pub ruleset: Table,
    /// The tables beside the main one (NetworkPolicy's bridge table while it needs one).
    pub extra_tables: ExtraTables,
    /// Addresses, routes and policy rules.
    pub net: NetDesired,
    /// One entry per object a feature planner looked at.
    pub statuses: Vec<ObjectStatus>,
    /// What to remember for the next plan once this one is applied.
    pub memory: Memory,
    /// What the features hand to the world besides the tables.
    pub outputs: Outputs,
}

/// The planner's verdict on one object: accepted, or rejected with a precise reason (the
/// object's previously applied rules then stay in force).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    pub kind: Kind,
    pub key: ObjectKey,
    pub result: Result<(), String>,
    /// What this node reports on the object as a Warning Event, for kinds whose status the
    /// agent does not write (EgressIP: see `egress_ip`): `None` when there is nothing to
    /// report or it is another node's to report.
    pub event: Option<NodeEvent>,
}

/// A Warning Event a node reports on an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// OVN-Kubernetes' reason where it has one for the case
    /// ([`crate::api::egress_ip::event_reason`]).
    pub reason: &'static str,
    pub note: String,
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
/// rules (resolved outside the planner, see [`asks`]).
pub fn plan_with_dns(
    snapshot: &Snapshot,
    config: &Config,
    memory: &Memory,
    dns: &DnsAnswers,
) -> Desired {
    let inputs = Inputs {
        snapshot,
        config,
        dns,
    };
    let mut out = Planned {
        ruleset: base::skeleton(config, &all_node_ips(snapshot)),
        extra_tables: ExtraTables::default(),
        net: NetDesired::default(),
        statuses: Vec::new(),
    };
    // Each feature reads its own memory and returns the next one: nothing is cloned (a deep
    // copy of 1000 namespaces' memory was a third of re-planning one changed rule).
    let mut outputs = Outputs::default();
    let memory = plan_features(&inputs, memory, &mut out, &mut outputs);
    Desired {
        ruleset: out.ruleset,
        extra_tables: out.extra_tables,
        net: out.net,
        statuses: out.statuses,
        memory,
        outputs,
    }
}

/// Plans the node's desired state with the answers to what the features asked ([`asks`]).
pub fn plan_answered(
    snapshot: &Snapshot,
    config: &Config,
    memory: &Memory,
    answers: &Answers,
) -> Desired {
    plan_with_dns(snapshot, config, memory, &answers.dns)
}

/// The second planning step: hands what the backends cannot do (`report`) to the features
/// that asked for it, which amend their share of `desired` and their statuses.
pub fn settle(
    snapshot: &Snapshot,
    config: &Config,
    answers: &Answers,
    desired: &mut Desired,
    report: &BackendReport,
) {
    let inputs = Inputs {
        snapshot,
        config,
        dns: &answers.dns,
    };
    let mut out = Planned {
        ruleset: std::mem::take(&mut desired.ruleset),
        extra_tables: std::mem::take(&mut desired.extra_tables),
        net: std::mem::take(&mut desired.net),
        statuses: std::mem::take(&mut desired.statuses),
    };
    settle_features(
        &inputs,
        &desired.memory,
        report,
        &mut out,
        &mut desired.outputs,
    );
    desired.ruleset = out.ruleset;
    desired.extra_tables = out.extra_tables;
    desired.net = out.net;
    desired.statuses = out.statuses;
}

/// The third step, after the apply: hands what the network backend found (`report`) to the
/// features, which amend their statuses.
pub fn report_applied(
    snapshot: &Snapshot,
    config: &Config,
    report: &AppliedReport,
    statuses: &mut [ObjectStatus],
) {
    let dns = DnsAnswers::default();
    let inputs = Inputs {
        snapshot,
        config,
        dns: &dns,
    };
    report_applied_of_features(&inputs, report, statuses);
}

/// What the next plan of `snapshot` needs answered (remembered objects included): what the
/// resolver must keep fresh.
pub fn asks(snapshot: &Snapshot, config: &Config, memory: &Memory) -> Asks {
    let dns = DnsAnswers::default();
    let inputs = Inputs {
        snapshot,
        config,
        dns: &dns,
    };
    Asks {
        dns_names: dns_names_of_features(&inputs, memory),
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

/// Asserts that `tx` changes something, and only set elements (what a change of pods or
/// endpoints costs when no rule depends on it).
#[cfg(test)]
pub(crate) fn assert_element_updates_only(tx: &crate::nft::Transaction) {
    use crate::nft::Op;
    assert!(!tx.is_empty());
    for op in &tx.ops {
        assert!(
            matches!(op, Op::AddElements(_) | Op::DeleteElements(_)),
            "not an element update: {op:?}"
        );
    }
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
