//! Whose commit it was: the NETLINK_NETFILTER sockets of this process (`/proc/self/fd` and
//! `/proc/thread-self/net/netlink`), and a thread of ours as the fallback.

use std::collections::HashSet;
use std::io;

/// The netlink sockets of this process, to tell its own commits from others'.
#[derive(Default)]
pub(super) struct OwnSockets {
    /// NETLINK_NETFILTER port ids of this process as of the last scan.
    pub(super) portids: HashSet<u32>,
}

impl OwnSockets {
    pub(super) fn is_own(&mut self, portid: u32, pid: Option<u32>, comm: Option<&str>) -> bool {
        if self.portids.contains(&portid) {
            return true;
        }
        // Unknown: a socket opened since the last scan, or someone else's. A failed scan
        // keeps the previous one (a wrong "foreign" only costs a re-check).
        match own_netfilter_portids() {
            Ok(now) => self.portids = now,
            Err(e) => tracing::warn!("nftables monitor: cannot list own sockets: {e}"),
        }
        self.portids.contains(&portid) || is_own_thread(pid, comm)
    }
}

/// Port ids of the NETLINK_NETFILTER sockets this process holds, in the reading thread's
/// network namespace.
fn own_netfilter_portids() -> io::Result<HashSet<u32>> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed meanwhile
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse::<u64>().ok())
        {
            inodes.insert(inode);
        }
    }
    let table = std::fs::read_to_string("/proc/thread-self/net/netlink")?;
    Ok(netfilter_portids(&table, &inodes))
}

/// `/proc/net/netlink`: `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`; protocol 12 is
/// NETLINK_NETFILTER, Pid the port id.
pub(super) fn netfilter_portids(table: &str, inodes: &HashSet<u64>) -> HashSet<u32> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let proto: u32 = cols.get(1)?.parse().ok()?;
            let portid: u32 = cols.get(2)?.parse().ok()?;
            let inode: u64 = cols.last()?.parse().ok()?;
            (proto == libc::NETLINK_NETFILTER as u32 && inodes.contains(&inode)).then_some(portid)
        })
        .collect()
}

/// A thread of this process with the id and name the kernel reported. Only meaningful when
/// the agent shares the initial pid namespace (the kernel reports ids from there).
fn is_own_thread(pid: Option<u32>, comm: Option<&str>) -> bool {
    let (Some(pid), Some(comm)) = (pid, comm) else {
        return false;
    };
    std::fs::read_to_string(format!("/proc/self/task/{pid}/comm"))
        .is_ok_and(|c| c.trim_end_matches('\n') == comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_of_ours_with_its_name_is_ours_even_without_the_socket() {
        let tid = nix::unistd::gettid().as_raw() as u32;
        let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        assert!(is_own_thread(Some(tid), Some(comm.trim_end())));
        assert!(!is_own_thread(Some(tid), Some("nft")));
        assert!(!is_own_thread(None, Some("nft")));
    }

    #[test]
    fn proc_net_netlink_lines_map_inodes_to_port_ids() {
        let table = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
                     ffff8881 0   1234       00000000 0        0        0     2        0        111\n\
                     ffff8882 12  3164021135 00000040 0        0        0     2        0        222\n\
                     ffff8883 12  77         00000000 0        0        0     2        0        333\n";
        let ours: HashSet<u64> = [111, 222].into();
        assert_eq!(netfilter_portids(table, &ours), [3_164_021_135].into());
    }
}
