//! A namespace's share of the proxy's in-flight slots: the pods of one tenant (however many,
//! and whatever source addresses they use) cannot take every slot and starve another
//! tenant's lookups.

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

/// One transport's admission (UDP queries, TCP connections): at most `total` in flight, of
/// which one namespace holds at most `per_namespace`.
#[derive(Clone)]
pub struct Gate {
    slots: Arc<Semaphore>,
    shares: Shares<Arc<str>>,
}

/// What an admitted query or connection holds until it ends.
pub struct Ticket {
    _share: Share<Arc<str>>,
    _slot: OwnedSemaphorePermit,
}

impl Gate {
    pub fn new(total: usize, per_namespace: usize) -> Gate {
        Gate {
            slots: Arc::new(Semaphore::new(total)),
            shares: Shares::new(per_namespace),
        }
    }

    /// A ticket for `tenant`, or `None` (overload) when its namespace holds its share or
    /// every slot is taken.
    pub fn admit(&self, tenant: Arc<str>) -> Option<Ticket> {
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
