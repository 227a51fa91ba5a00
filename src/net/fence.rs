//! Fencing as a network backend: while the EgressIP fence is set, every egress address is
//! refused like one no interface can take, so the backend removes it and `EgressIp::settle`
//! takes its SNAT out like for any other refusal (fail closed: two owners never).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{NetBackend, NetChanges, NetDesired, NetError, Refusal};

/// Whether this node withholds the egress IPs it would host: set by the EgressIP fence
/// (`controller::egress_ip::fence`) when the node is cut off from the assigner and the API
/// server, read by every sync. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Fence(Arc<AtomicBool>);

/// The reason a fenced node's egress IPs carry in status and Events.
pub const FENCED: &str = "withheld: this node is cut off from the EgressIP assigner and the \
                          API server (fenced), so the IP may already be hosted elsewhere";

impl Fence {
    /// Sets the flag; true if that changed it.
    pub fn set(&self, on: bool) -> bool {
        self.0.swap(on, Ordering::SeqCst) != on
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// `inner`, with every egress address refused while `fence` is set. Every other
/// `NetBackend` method delegates (a default left in place would answer for `inner`).
pub struct Fenced<B> {
    pub inner: B,
    pub fence: Fence,
}

impl<B: NetBackend> NetBackend for Fenced<B> {
    fn plan(&mut self, desired: &NetDesired) -> Result<NetChanges, NetError> {
        if !self.fence.is_set() {
            return self.inner.plan(desired);
        }
        let kept = NetDesired {
            addresses: Default::default(),
            ..desired.clone()
        };
        let mut changes = self.inner.plan(&kept)?;
        changes.refused.extend(self.standing_refusals(desired));
        Ok(changes)
    }

    fn conflicts(&self) -> Vec<super::AddressConflict> {
        self.inner.conflicts()
    }

    fn standing_refusals(&self, desired: &NetDesired) -> Vec<Refusal> {
        if !self.fence.is_set() {
            return self.inner.standing_refusals(desired);
        }
        (desired.addresses.iter())
            .map(|a| Refusal {
                addr: a.addr,
                reason: FENCED.into(),
            })
            .collect()
    }

    fn apply(&mut self, changes: &NetChanges) -> Result<(), NetError> {
        self.inner.apply(changes)
    }

    fn cleanup(&mut self) -> Result<NetChanges, NetError> {
        self.inner.cleanup()
    }

    fn read_facts(&mut self, desired: &NetDesired) -> super::NodeFacts {
        self.inner.read_facts(desired)
    }

    fn bridge_ports(
        &mut self,
        pods: &[Vec<std::net::IpAddr>],
    ) -> Result<super::bridge_ports::BridgePorts, NetError> {
        self.inner.bridge_ports(pods)
    }
}
