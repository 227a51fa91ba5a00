//! Fair admission for everything that serves tenants: a total of slots, of which one holder
//! (a source address at the HTTP listeners, a namespace at the DNS proxy, whatever addresses
//! its pods use) holds at most its share, so that one cannot take every slot and starve the
//! others.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type InUse<K> = Arc<Mutex<HashMap<K, usize>>>;

#[derive(Clone)]
pub struct Shares<K> {
    limit: usize,
    in_use: InUse<K>,
}

/// A slot of one holder; released when dropped.
pub struct Share<K: Hash + Eq> {
    key: K,
    in_use: InUse<K>,
}

impl<K: Hash + Eq + Clone> Shares<K> {
    pub fn new(limit: usize) -> Shares<K> {
        Shares {
            limit: limit.max(1),
            in_use: Arc::default(),
        }
    }

    /// A slot for `key`, or `None` when it already holds its share.
    pub fn try_acquire(&self, key: K) -> Option<Share<K>> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        let n = in_use.entry(key.clone()).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Share {
            key,
            in_use: self.in_use.clone(),
        })
    }
}

/// One listener's or transport's admission (connections, UDP queries): at most `total` in
/// flight, of which one holder (`K`: a namespace, a source address) holds at most
/// `per_holder`.
#[derive(Clone)]
pub struct Gate<K: Hash + Eq = Arc<str>> {
    slots: Arc<Semaphore>,
    shares: Shares<K>,
}

/// What an admitted query or connection holds until it ends.
pub struct Ticket<K: Hash + Eq = Arc<str>> {
    _share: Share<K>,
    _slot: OwnedSemaphorePermit,
}

impl<K: Hash + Eq + Clone> Gate<K> {
    pub fn new(total: usize, per_holder: usize) -> Gate<K> {
        Gate {
            slots: Arc::new(Semaphore::new(total)),
            shares: Shares::new(per_holder),
        }
    }

    /// A ticket for `tenant`, or `None` (overload) when it holds its share or every slot is
    /// taken.
    pub fn admit(&self, tenant: K) -> Option<Ticket<K>> {
        let share = self.shares.try_acquire(tenant)?;
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        Some(Ticket {
            _share: share,
            _slot: slot,
        })
    }
}

impl<K: Hash + Eq> Drop for Share<K> {
    fn drop(&mut self) {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = in_use.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                // Holders come and go: keep only those with slots in use.
                in_use.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_namespace_gets_its_share_and_gets_it_back() {
        let fair = Shares::new(2);
        let (a, b): (Arc<str>, Arc<str>) = ("alpha".into(), "beta".into());
        let a1 = fair.try_acquire(a.clone()).unwrap();
        let a2 = fair.try_acquire(a.clone()).unwrap();
        assert!(
            fair.try_acquire(a.clone()).is_none(),
            "alpha holds its share"
        );
        assert!(
            fair.try_acquire(b.clone()).is_some(),
            "beta is not starved by alpha"
        );
        drop(a1);
        assert!(fair.try_acquire(a).is_some(), "a slot came back");
        drop(a2);
        assert!(
            fair.in_use.lock().unwrap().get(&b).is_none(),
            "idle namespaces are forgotten"
        );
    }
}
