//! A per-pod share of the proxy's in-flight slots: one pod flooding queries (or holding
//! connections) cannot take every slot and starve its neighbours' lookups.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct PerPod {
    limit: usize,
    in_use: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A slot of one pod; released when dropped.
pub struct Share {
    pod: IpAddr,
    in_use: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerPod {
    pub fn new(limit: usize) -> PerPod {
        PerPod {
            limit: limit.max(1),
            in_use: Arc::default(),
        }
    }

    /// A slot for `pod`, or `None` when it already holds its share.
    pub fn try_acquire(&self, pod: IpAddr) -> Option<Share> {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        let n = in_use.entry(pod).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(Share {
            pod,
            in_use: self.in_use.clone(),
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = in_use.get_mut(&self.pod) {
            *n -= 1;
            if *n == 0 {
                // Pods come and go: keep only those with slots in use.
                in_use.remove(&self.pod);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pod_gets_its_share_and_gets_it_back() {
        let fair = PerPod::new(2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = fair.try_acquire(a).unwrap();
        let _a2 = fair.try_acquire(a).unwrap();
        assert!(fair.try_acquire(a).is_none(), "a holds its share");
        assert!(fair.try_acquire(b).is_some(), "b is not starved by a");
        drop(a1);
        assert!(fair.try_acquire(a).is_some(), "a slot came back");
        drop(_a2);
        assert!(
            fair.in_use.lock().unwrap().get(&b).is_none(),
            "idle pods are forgotten"
        );
    }
}
