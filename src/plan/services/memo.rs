//! The services planner's incremental bookkeeping: what changed between two snapshots, and
//! how [`Memo`] takes a service's new plan in and drops its old one (claims on frontends,
//! refused node addresses, health-check ports, no-local-endpoint counts, and the counted
//! shared parts: pool chains, address shards, hairpin elements), so that a plan costs the
//! size of the change.

use super::claims::{Claim, Rank, externals_on, note, settle_claims};
use super::skeleton::{shard_part, shard_part_key};
use super::{Entry, Memo, names, part_key};
use crate::nft::ir::*;
use crate::plan::ObjectStatus;
use crate::snapshot::{self, Kind, ObjectKey, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

impl Memo {
    /// Takes this snapshot's node addresses; the services that asked for an address that
    /// became or stopped being a node's (refused, or claiming it) are re-planned.
    pub(super) fn update_node_ips(
        &mut self,
        node_ips: BTreeMap<IpAddr, String>,
        changed: &mut BTreeSet<ObjectKey>,
    ) {
        if *self.node_ips == node_ips {
            return;
        }
        let (old, new) = (&*self.node_ips, &node_ips);
        let flipped = old
            .iter()
            .filter(|(ip, n)| new.get(ip) != Some(n))
            .chain(new.iter().filter(|(ip, n)| old.get(ip) != Some(n)))
            .map(|(ip, _)| *ip);
        for ip in flipped {
            let users = self.node_refused.get(&ip).into_iter().flatten();
            changed.extend(users.cloned());
            let cluster = self.claims.get(&Claim::Cluster(ip)).into_iter();
            let external = externals_on(&self.claims, ip).map(|(_, r)| r);
            for ranks in cluster.chain(external) {
                changed.extend(ranks.iter().map(|r| r.key.clone()));
            }
        }
        self.node_ips = Arc::new(node_ips);
    }

    /// Drops what the old plan of `key` held: its health-check port, pool users, claims
    /// (their owners before noted in `before`) and refused node addresses.
    pub(super) fn forget(
        &mut self,
        key: &ObjectKey,
        old: &Entry,
        before: &mut BTreeMap<Claim, Option<Rank>>,
    ) {
        if let Some((port, _)) = old.health {
            self.health.remove(&port);
        }
        for n in &old.no_local {
            bump(&mut self.no_local, *n, -1);
        }
        self.release(old);
        for (c, _) in &old.claims {
            note(&self.claims, before, c);
            if let Some(ranks) = self.claims.get_mut(c) {
                if let Ok(i) = ranks.binary_search(&old.rank) {
                    ranks.remove(i);
                }
                if ranks.is_empty() {
                    self.claims.remove(c);
                }
            }
        }
        for ip in &old.node_refused {
            if let Some(keys) = self.node_refused.get_mut(ip) {
                keys.remove(key);
                if keys.is_empty() {
                    self.node_refused.remove(ip);
                }
            }
        }
    }

    /// Records the new plan of `key`: its claims (their owners before noted in `before`),
    /// refused node addresses, health-check port and pool users.
    pub(super) fn remember(
        &mut self,
        key: &ObjectKey,
        e: Entry,
        before: &mut BTreeMap<Claim, Option<Rank>>,
    ) {
        for (c, _) in &e.claims {
            note(&self.claims, before, c);
            let ranks = self.claims.entry(c.clone()).or_default();
            if let Err(i) = ranks.binary_search(&e.rank) {
                ranks.insert(i, e.rank.clone());
            }
        }
        for ip in &e.node_refused {
            self.node_refused
                .entry(*ip)
                .or_default()
                .insert(key.clone());
        }
        if let Some(h) = e.health {
            self.health.insert(h.0, (key.to_string(), h.1));
        }
        for n in &e.no_local {
            bump(&mut self.no_local, *n, 1);
        }
        self.acquire(&e);
        self.entries.insert(part_key(key), Arc::new(e));
    }

    /// Settles `key`'s claims against the current owners: its part (or none) and error.
    pub(super) fn settle(&mut self, key: &ObjectKey) {
        let pk = part_key(key);
        let Some(e) = self.entries.get(&pk) else {
            return;
        };
        let (part, error) = settle_claims(&self.claims, e);
        let same = error == e.error
            && match (&part, &e.part) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
        if !same {
            let mut e = (**e).clone();
            e.part = part;
            e.error = error;
            self.entries.insert(pk.clone(), Arc::new(e));
        }
        let e = &self.entries[&pk];
        match &e.part {
            Some(part) => self.parts.insert(pk.clone(), part.clone()),
            None => self.parts.remove(&pk),
        };
        match &e.error {
            Some(err) => self.errors.insert(
                pk.clone(),
                ObjectStatus {
                    kind: Kind::Service,
                    key: key.clone(),
                    result: Err(err.clone()),
                    event: None,
                },
            ),
            None => self.errors.remove(&pk),
        };
    }

    /// Counts `e`'s use of the shared pool chains and hairpin elements.
    fn acquire(&mut self, e: &Entry) {
        for pool in &e.pools {
            if bump(&mut self.pools, *pool, 1) == 1 {
                let mut part = Part::default();
                part.add_chain(pool.chain());
                self.parts
                    .insert(format!("svc-pool/{}", pool.chain_name()), Arc::new(part));
            }
        }
        for shard in &e.shards {
            if bump(&mut self.shards, *shard, 1) == 1 {
                self.parts
                    .insert(shard_part_key(shard), Arc::new(shard_part(shard)));
            }
        }
        for ip in &e.hairpin {
            if bump(&mut self.hairpin, *ip, 1) == 1 {
                let mut part = Part::default();
                let key = vec![Value::ip(*ip).into(), Value::ip(*ip).into()];
                part.add_element(names::hairpin(IpFamily::of(*ip)), key);
                self.parts
                    .insert(format!("svc-hairpin/{ip}"), Arc::new(part));
            }
        }
    }

    /// Undoes [`Memo::acquire`]: what no service uses any more leaves the table.
    fn release(&mut self, e: &Entry) {
        for pool in &e.pools {
            if bump(&mut self.pools, *pool, -1) == 0 {
                self.parts
                    .remove(&format!("svc-pool/{}", pool.chain_name()));
            }
        }
        for shard in &e.shards {
            if bump(&mut self.shards, *shard, -1) == 0 {
                self.parts.remove(&shard_part_key(shard));
            }
        }
        for ip in &e.hairpin {
            if bump(&mut self.hairpin, *ip, -1) == 0 {
                self.parts.remove(&format!("svc-hairpin/{ip}"));
            }
        }
    }
}

/// Adds `by` to the count of `key` (dropping it at zero) and returns the new count.
fn bump<K: Ord + Clone>(counts: &mut imbl::OrdMap<K, usize>, key: K, by: isize) -> usize {
    let n = counts
        .get(&key)
        .copied()
        .unwrap_or(0)
        .saturating_add_signed(by);
    if n == 0 {
        counts.remove(&key);
    } else {
        counts.insert(key, n);
    }
    n
}

/// Services whose Service, EndpointSlices or Endpoints differ between two snapshots: the
/// cost is the size of the change (see `snapshot::changes`).
pub(super) fn changed_services(prev: &Snapshot, cur: &Snapshot) -> BTreeSet<ObjectKey> {
    let mut out = BTreeSet::new();
    if prev.ptr_eq(cur) {
        return out;
    }
    out.extend(snapshot::changes(prev.services(), cur.services()).map(|c| c.0.clone()));
    out.extend(snapshot::changes(prev.endpoints(), cur.endpoints()).map(|c| c.0.clone()));
    for (k, old, new) in snapshot::changes(prev.endpoint_slices(), cur.endpoint_slices()) {
        for slice in old.into_iter().chain(new) {
            if let Some(svc) = snapshot::labels(&slice.metadata).get(snapshot::SERVICE_NAME_LABEL) {
                out.insert(ObjectKey::new(k.namespace.clone(), svc.clone()));
            }
        }
    }
    out
}
