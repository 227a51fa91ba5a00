//! NETLINK_NETFILTER sockets kept open between uses, per network namespace.
//!
//! Closing such a socket is not free. The kernel's release notifier for nf_tables
//! (`nft_rcv_nl_event`, which deletes the tables a closing socket owns) takes the nf_tables
//! commit mutex and waits there for the pending transaction clean-up, an RCU grace period.
//! Every commit in the namespace waits meanwhile. Measured on 6.18 with `perf` (sched_switch
//! stacks): the DNS proxy's keep-alive pass closed its conntrack socket every 2.5 s, and the
//! learner's commit then sat in `nf_tables_valid_genid` for 10-30 ms, holding a pod's answer.
//! So the periodic readers (conntrack dumps, rule counters, table reads) take a socket from
//! here and give it back after a complete exchange; a socket left mid-dump is closed instead.
//! Only sockets of the process's own network namespace are kept (see [`current_netns`]).

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// At most this many idle sockets are kept (the table read uses a few threads at once).
const MAX_KEPT: usize = 8;

/// Idle sockets with the network namespace they were opened in.
pub(crate) struct Kept<T> {
    idle: Mutex<Vec<(u64, T)>>,
}

impl<T> Kept<T> {
    pub(crate) const fn new() -> Kept<T> {
        Kept {
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle socket of the calling thread's network namespace, if one is kept.
    pub(crate) fn take(&self) -> Option<T> {
        let netns = current_netns()?;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let at = idle.iter().position(|(ns, _)| *ns == netns)?;
        Some(idle.swap_remove(at).1)
    }

    /// Keeps `socket`, opened in the calling thread's network namespace, for the next
    /// [`Kept::take`]; with no room (or no way to name the namespace) it is closed.
    pub(crate) fn give_back(&self, socket: T) {
        let Some(netns) = current_netns() else {
            return;
        };
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_KEPT {
            idle.push((netns, socket));
        }
    }
}

/// The calling thread's network namespace (its inode) when it is the process's own (its
/// main thread's): only those sockets are kept. A socket answers for the namespace it was
/// opened in, and a kept one would keep that namespace alive: a thread that entered another
/// namespace (the lab's tests read many from one process, then delete them) closes its own.
fn current_netns() -> Option<u64> {
    let inode = |path: &str| std::fs::metadata(path).ok().map(|m| m.ino());
    let thread = inode("/proc/thread-self/ns/net")?;
    (inode("/proc/self/ns/net")? == thread).then_some(thread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_comes_back_only_in_its_namespace_and_the_pool_is_bounded() {
        let kept: Kept<u32> = Kept::new();
        assert_eq!(kept.take(), None);
        for i in 0..MAX_KEPT as u32 + 3 {
            kept.give_back(i);
        }
        let idle = kept.idle.lock().unwrap().len();
        assert_eq!(idle, MAX_KEPT, "the rest are closed");
        assert!(kept.take().is_some());
        // A socket of another namespace is never handed out here.
        kept.idle.lock().unwrap().clear();
        kept.idle.lock().unwrap().push((u64::MAX, 7));
        assert_eq!(kept.take(), None);
    }
}
