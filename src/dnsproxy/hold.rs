//! Holding an answer: parse it, have its addresses written to the learned sets (by its own
//! task when the learner is free, see `writer`), wait for the kernel's acknowledgement, then
//! let it go. And the shares a query takes before it is forwarded.

use super::answer;
use super::learn::Learner;
use super::metrics::ProxyMetrics;
use super::writer::Writer;
use crate::listener::fair::{Gate, Share, Shares, Ticket};
use crate::nft::engine::NftBackend;
use crate::plan::firewall::learning::Learning;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// A namespace, an input interface (its index) and, when that interface is a bridge (whose
/// ports' pods all come in on it when `br_netfilter` is off), the source address: the key
/// of a per-interface sub-share.
pub type InterfaceKey = (Arc<str>, u32, Option<IpAddr>);

/// The handle the UDP and TCP paths share.
#[derive(Clone)]
pub struct Holder {
    writer: Arc<Writer>,
    learning: watch::Receiver<Arc<Learning>>,
    metrics: ProxyMetrics,
}

impl Holder {
    /// Starts the writer (and its keep-alive thread).
    pub fn start<B: NftBackend + Send + 'static>(
        learner: Learner<B>,
        learning: watch::Receiver<Arc<Learning>>,
        metrics: ProxyMetrics,
    ) -> Holder {
        Holder {
            writer: Writer::start(learner, learning.clone(), metrics.clone()),
            learning,
            metrics,
        }
    }

    /// Whose share a query of `pod` to `server` takes (its namespace; a pod the proxy does
    /// not know yet counts alone), or `None` when `server` is not a trusted resolver.
    fn tenant(&self, pod: IpAddr, server: IpAddr) -> Option<Arc<str>> {
        let learning = self.learning.borrow();
        if !learning.is_trusted(server) {
            return None;
        }
        Some(
            learning
                .namespace(pod)
                .cloned()
                .unwrap_or_else(|| pod.to_string().into()),
        )
    }

    /// A ticket through `gate` for a query of `pod` to `server`, or `None`, counted as an
    /// error: `untrusted` when `server` is not a trusted resolver (the steering is being
    /// updated: never learned from), `overload` when the namespace's share or every slot is
    /// taken.
    pub fn admit(&self, gate: &Gate, pod: IpAddr, server: IpAddr) -> Option<Ticket> {
        let Some(tenant) = self.tenant(pod, server) else {
            self.metrics.error("untrusted");
            return None;
        };
        let ticket = gate.admit(tenant);
        if ticket.is_none() {
            self.metrics.error("overload");
        }
        ticket
    }

    /// [`Holder::admit`] for a query that came in on interface `ifindex`, which also takes
    /// one of `per_interface` for (namespace, interface): a pod that forges its neighbour's
    /// source address sends on its own interface, so it takes at most that sub-share of the
    /// neighbour's namespace share, never all of it. On a bridge (`bridged`), which every pod
    /// behind it comes in on, the sub-share is per (namespace, bridge, source address):
    /// a pod flooding with its own address leaves its bridge neighbours theirs.
    pub fn admit_on(
        &self,
        gate: &Gate,
        per_interface: &Shares<InterfaceKey>,
        (ifindex, bridged): (u32, bool),
        pod: IpAddr,
        server: IpAddr,
    ) -> Option<(Ticket, Share<InterfaceKey>)> {
        let Some(tenant) = self.tenant(pod, server) else {
            self.metrics.error("untrusted");
            return None;
        };
        let admitted = per_interface
            .try_acquire((tenant.clone(), ifindex, bridged.then_some(pod)))
            .and_then(|share| Some((gate.admit(tenant)?, share)));
        if admitted.is_none() {
            self.metrics.error("overload");
        }
        admitted
    }

    /// Returns once what `bytes` (an answer to `pod` from `server`) teaches is in the
    /// kernel, or at once when it teaches nothing (other names, or not a trusted resolver).
    pub async fn hold(&self, pod: IpAddr, server: IpAddr, bytes: &[u8]) {
        let started = Instant::now();
        let Some(answer) = answer::parse(bytes) else {
            return;
        };
        self.metrics.answer();
        let watched = {
            let learning = self.learning.borrow();
            learning.is_trusted(server) && learning.matching(pod, &answer.name).next().is_some()
        };
        if !watched || answer.addresses.is_empty() {
            return;
        }
        if !self.writer.write(pod, answer).await {
            self.metrics.error("learner_busy");
            return;
        }
        self.metrics.held(started.elapsed());
    }

    pub fn metrics(&self) -> &ProxyMetrics {
        &self.metrics
    }
}
