//! Per-rule counters in metrics: packets and bytes per EgressFirewall rule, per EgressQoS
//! rule and per NetworkPolicy (allowed / denied, by direction), read from the kernel's own
//! counters.
//!
//! A bounded periodic reader ([`reader`], every `--rule-counters-seconds`) reads them with
//! one rule dump per table (`inet` and `bridge nodeplane`) plus one element dump per
//! EgressFirewall map, on a blocking thread, and publishes the sums; `/metrics` encodes the
//! last published sums and never touches the kernel. So the kernel's cost is one read per
//! interval whatever the number of scrapers, a scrape of the network-facing metrics port
//! cannot make the agent dump its table, and neither stalls the control loop (which only
//! hands over the `Arc` of the table it applied).
//!
//! Which rule a counter belongs to comes from the applied table's parts ([`index`]); the
//! series of an object that is gone disappear with the next read.

pub mod index;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::ConstCounter;

use crate::nft::TABLE_NAME;
use crate::nft::engine::NftError;
use crate::nft::ir::{Family, Table};
use crate::nft::nftnl::{Counted, read_counters};
use crate::task::{OnExit, Task, task};
pub use index::{Direction, GuardReason, Index, PolicyVerdict, Series};

/// The last published counts, encoded at each scrape.
#[derive(Debug, Default)]
pub struct RuleCounters {
    latest: Mutex<Arc<BTreeMap<Series, Counted>>>,
}

impl RuleCounters {
    /// Replaces the exported series with `tally` (a series not in it disappears).
    pub fn publish(&self, tally: BTreeMap<Series, Counted>) {
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(tally);
    }

    fn latest(&self) -> Arc<BTreeMap<Series, Counted>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The two metrics of one kind of series, `<stem>_packets` and `<stem>_bytes` (names without
/// `nodeplane_` and `_total`): their helps and which series they have.
struct CountMetrics {
    stem: &'static str,
    packets_help: &'static str,
    bytes_help: &'static str,
    kind: fn(&Series) -> bool,
}

/// Reads one of the two counts of a series (each is a metric of its own).
type Count = fn(&Counted) -> u64;

const METRICS: [CountMetrics; 4] = [
    CountMetrics {
        stem: "egress_firewall_rule",
        packets_help: "Packets an EgressFirewall rule decided (accepted or dropped): the packets \
                       that open a connection, as established traffic is not judged again",
        bytes_help: "Bytes of the packets an EgressFirewall rule decided",
        kind: |s| matches!(s, Series::Firewall { .. }),
    },
    CountMetrics {
        stem: "egress_qos_rule",
        packets_help: "Packets an EgressQoS rule marked with its DSCP value",
        bytes_help: "Bytes of the packets an EgressQoS rule marked",
        kind: |s| matches!(s, Series::Qos { .. }),
    },
    CountMetrics {
        stem: "network_policy",
        packets_help: "Packets a NetworkPolicy allowed (one of its rules accepted them) or denied \
                       (a pod it selects was isolated in that direction and no policy selecting \
                       the pod allowed them; counted under each such policy), by direction: the \
                       packets that open a connection",
        bytes_help: "Bytes of the packets a NetworkPolicy allowed or denied, by direction",
        kind: |s| matches!(s, Series::Policy { .. }),
    },
    CountMetrics {
        stem: "network_policy_guard_drop",
        packets_help: "Packets a NetworkPolicy guard dropped before any policy judged them, \
                       node-wide, by reason: source_not_bound (a source address not bound to the \
                       bridge port it came from), unlisted_address (an isolated pod on an \
                       address it does not list), flow_set_full (a new flow its bridge port's \
                       flow set has no room for)",
        bytes_help: "Bytes of the packets a NetworkPolicy guard dropped, by reason",
        kind: |s| matches!(s, Series::Guard(_)),
    },
];

impl Collector for RuleCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let latest = self.latest();
        for metrics in &METRICS {
            let series: Vec<_> = latest.iter().filter(|(s, _)| (metrics.kind)(s)).collect();
            if series.is_empty() {
                continue;
            }
            let counts: [(&str, &str, Count); 2] = [
                ("packets", metrics.packets_help, |c| c.packets),
                ("bytes", metrics.bytes_help, |c| c.bytes),
            ];
            for (unit, help, value) in counts {
                let name = format!("{}_{unit}", metrics.stem);
                let mut family =
                    encoder.encode_descriptor(&name, help, None, ConstCounter::<u64>::TYPE)?;
                for (s, counted) in &series {
                    let counter = ConstCounter::new(value(counted));
                    counter.encode(family.encode_family(&labels(s).as_slice())?)?;
                }
            }
        }
        Ok(())
    }
}

/// The label set of a series: namespace, object name, then rule index (EgressFirewall,
/// EgressQoS) or direction and verdict (NetworkPolicy); a guard's drops only the reason.
fn labels(series: &Series) -> Vec<(&'static str, String)> {
    match series {
        Series::Guard(reason) => vec![("reason", reason.label().to_string())],
        Series::Firewall { namespace, rule } | Series::Qos { namespace, rule } => vec![
            ("namespace", namespace.to_string()),
            // Both objects must be named `default`: nothing else is ever applied.
            ("name", "default".to_string()),
            ("rule", rule.to_string()),
        ],
        Series::Policy {
            namespace,
            name,
            direction,
            verdict,
        } => vec![
            ("namespace", namespace.to_string()),
            ("name", name.to_string()),
            (
                "direction",
                match direction {
                    Direction::Ingress => "ingress",
                    Direction::Egress => "egress",
                }
                .to_string(),
            ),
            (
                "verdict",
                match verdict {
                    PolicyVerdict::Allow => "allow",
                    PolicyVerdict::Deny => "deny",
                }
                .to_string(),
            ),
        ],
    }
}

/// Reads the counters of the applied table (`index`, built from it) from the kernel: the
/// inet table's rules and EgressFirewall maps, the bridge table's rules (NetworkPolicy for
/// pods bridged without br_netfilter), each one dump.
pub fn read(index: &Index) -> Result<BTreeMap<Series, Counted>, NftError> {
    let sets = index.counting_sets();
    let inet = read_counters(Family::Inet, TABLE_NAME, &sets)?;
    let bridge = read_counters(Family::Bridge, TABLE_NAME, &[])?;
    let tables: Vec<_> = inet.into_iter().chain(bridge).collect();
    Ok(index.tally(&tables))
}

/// The reader: every `every`, the counters of the table the agent last applied (`applied`
/// hands out its `Arc`; the index is rebuilt only when it changed), published to `counters`.
pub fn reader(
    applied: impl Fn() -> Option<Arc<Table>> + Send + Sync + 'static,
    counters: Arc<RuleCounters>,
    every: Duration,
) -> impl Task {
    let applied = Arc::new(applied);
    task("rule-counters", OnExit::Restart, move |mut ctx| {
        let (applied, counters) = (applied.clone(), counters.clone());
        async move {
            ctx.until_stopped(async move {
                let mut indexed: Option<(Arc<Table>, Arc<Index>)> = None;
                loop {
                    tokio::time::sleep(every).await;
                    let Some(table) = applied() else { continue };
                    let index = match &indexed {
                        Some((t, index)) if Arc::ptr_eq(t, &table) => index.clone(),
                        _ => {
                            let t = table.clone();
                            let built = tokio::task::spawn_blocking(move || Index::of(&t));
                            let index = Arc::new(built.await.map_err(|e| e.to_string())?);
                            indexed = Some((table, index.clone()));
                            index
                        }
                    };
                    let read = tokio::task::spawn_blocking(move || read(&index));
                    match read.await.map_err(|e| e.to_string())? {
                        Ok(tally) => counters.publish(tally),
                        // Kept: the last values stand until a read succeeds.
                        Err(e) => tracing::debug!("rule counters: cannot read them: {e}"),
                    }
                }
            })
            .await
        }
    })
}

#[cfg(test)]
mod tests;
