//! What the agent needs from its host, checked once at start by reading (never writing):
//! its capabilities and the sysctls that must hold. The agent changes no host setting; a
//! missing capability is an error, a sysctl that defeats a feature a warning, both in the
//! log and in `/readyz` (README "Capabilities").

use std::collections::BTreeMap;

/// A capability the agent uses, and for what.
pub struct Capability {
    pub name: &'static str,
    /// Bit in the kernel's capability sets (`linux/capability.h`).
    bit: u32,
    pub why: &'static str,
}

pub const NET_BIND_SERVICE: Capability = Capability {
    name: "CAP_NET_BIND_SERVICE",
    bit: 10,
    why: "the DNS proxy answers pods from the resolver's address and port 53 (binding a \
          port below 1024, which IP_TRANSPARENT does not exempt)",
};
pub const NET_ADMIN: Capability = Capability {
    name: "CAP_NET_ADMIN",
    bit: 12,
    why: "nftables, rtnetlink and conntrack over netlink, transparent sockets",
};
pub const NET_RAW: Capability = Capability {
    name: "CAP_NET_RAW",
    bit: 13,
    why: "gratuitous ARP / neighbour advertisements of egress IPs and the EgressIP node probes",
};

/// Every capability the agent uses: exactly what `deploy/daemonset.yaml` adds and the
/// systemd unit keeps (a deploy test holds the three equal).
pub const ALL: [&Capability; 3] = [&NET_ADMIN, &NET_RAW, &NET_BIND_SERVICE];

/// Where the kernel reports the calling process's capabilities.
const STATUS: &str = "/proc/self/status";

/// The effective capability set (`CapEff` of `/proc/self/status`).
pub fn effective_capabilities() -> Result<u64, String> {
    let text = std::fs::read_to_string(STATUS).map_err(|e| format!("{STATUS}: {e}"))?;
    parse_cap_eff(&text).ok_or_else(|| format!("{STATUS}: no CapEff line"))
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// The capabilities of `needed` that `effective` lacks, one message each.
pub fn missing(effective: u64, needed: &[&Capability]) -> Vec<String> {
    needed
        .iter()
        .filter(|c| effective & (1 << c.bit) == 0)
        .map(|c| format!("missing capability {}: needed for {}", c.name, c.why))
        .collect()
}

/// A sysctl the agent's features rely on, and the value they need.
struct Sysctl {
    key: &'static str,
    want: &'static str,
    why: &'static str,
}

const SYSCTLS: &[Sysctl] = &[
    Sysctl {
        key: "net.ipv4.conf.all.forwarding",
        want: "1",
        why: "IPv4 pod traffic is not routed: services, EgressIP steering and pod egress fail",
    },
    Sysctl {
        key: "net.ipv6.conf.all.forwarding",
        want: "1",
        why: "IPv6 pod traffic is not routed (ignore on an IPv4-only node)",
    },
];

/// Reads each sysctl of [`SYSCTLS`] (a key the kernel lacks, e.g. IPv6 disabled, is
/// skipped); returns `(key, what is wrong)` per value that differs.
pub fn sysctl_warnings() -> Vec<(&'static str, String)> {
    let read = |key: &str| {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        std::fs::read_to_string(path).ok()
    };
    let values: BTreeMap<&str, String> = SYSCTLS
        .iter()
        .filter_map(|s| Some((s.key, read(s.key)?.trim().to_string())))
        .collect();
    sysctl_problems(&values)
}

fn sysctl_problems(values: &BTreeMap<&str, String>) -> Vec<(&'static str, String)> {
    SYSCTLS
        .iter()
        .filter_map(|s| {
            let have = values.get(s.key)?;
            (have != s.want).then(|| (s.key, format!("is {have}, not {}: {}", s.want, s.why)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_with_their_use() {
        let status = "Name:\tagent\nCapInh:\t0000000000000000\nCapEff:\t0000000000003000\n";
        let eff = parse_cap_eff(status).unwrap();
        assert!(missing(eff, &[&NET_ADMIN, &NET_RAW]).is_empty());
        let gaps = missing(eff, &[&NET_ADMIN, &NET_BIND_SERVICE]);
        assert_eq!(gaps.len(), 1);
        assert!(
            gaps[0]
                .starts_with("missing capability CAP_NET_BIND_SERVICE: needed for the DNS proxy")
        );
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn sysctls_off_are_warned_and_absent_ones_skipped() {
        let mut values = BTreeMap::new();
        values.insert("net.ipv4.conf.all.forwarding", "0".to_string());
        let w = sysctl_problems(&values);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "net.ipv4.conf.all.forwarding");
        assert!(
            w[0].1
                .starts_with("is 0, not 1: IPv4 pod traffic is not routed")
        );
        values.insert("net.ipv4.conf.all.forwarding", "1".to_string());
        values.insert("net.ipv6.conf.all.forwarding", "1".to_string());
        assert!(sysctl_problems(&values).is_empty());
    }
}
