//! The proxy's metrics, registered with the agent's (`admin::metrics`): answers seen,
//! addresses learned, how long answers were held, errors by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// `reason` (its own type: `admin` registers these metrics, so this module must not import it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    answers: Counter,
    learned: Counter,
    evicted: Counter,
    hold: Histogram,
    errors: Family<ReasonLabel, Counter>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        ProxyMetrics {
            answers: Counter::default(),
            learned: Counter::default(),
            evicted: Counter::default(),
            // 50 µs .. ~1.6 s.
            hold: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            errors: Family::default(),
        }
    }
}

impl ProxyMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "dns_proxy_answers",
            "DNS answers the transparent proxy parsed (pods of namespaces with dnsName rules)",
            self.answers.clone(),
        );
        registry.register(
            "dns_proxy_learned_addresses",
            "Learned-set elements written (new or extended) from DNS answers",
            self.learned.clone(),
        );
        registry.register(
            "dns_proxy_evicted_addresses",
            "Learned addresses deleted before their TTL to keep a name or namespace within its cap",
            self.evicted.clone(),
        );
        registry.register(
            "dns_proxy_hold_seconds",
            "Time an answer with watched names was held until the kernel acknowledged its addresses",
            self.hold.clone(),
        );
        registry.register(
            "dns_proxy_errors",
            "Proxy errors by reason (upstream_timeout, upstream, reply, receive, malformed, overload, untrusted, mismatch, random, learn, learner_busy, learner_gone, tcp, conntrack)",
            self.errors.clone(),
        );
    }

    pub fn answer(&self) {
        self.answers.inc();
    }
    pub fn learned(&self, n: usize) {
        self.learned.inc_by(n as u64);
    }
    pub fn evicted(&self, n: usize) {
        self.evicted.inc_by(n as u64);
    }
    pub fn held(&self, d: Duration) {
        self.hold.observe(d.as_secs_f64());
    }
    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}
