//! Names of the services objects. Per-object names are derived from the object (service,
//! port, family, endpoint) alone, so they are stable across plans: an endpoint change
//! touches only the chains whose content changes.

use super::model::{Backend, Port};
use crate::nft::ir::{IpFamily, Value, proto};
use crate::nft::names::object_name;
use std::net::IpAddr;

/// How a packet names its service: by destination address (ClusterIP, externalIP, LB IP)
/// or, for NodePorts, by protocol and port alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Frontend {
    Addr,
    NodePort,
}

/// Jumped to from `nat-prerouting` and `nat-output`: the dispatch lookups.
pub const DISPATCH: &str = "svc-dispatch";
/// Sets the masquerade mark bit.
pub const MARK_MASQ: &str = "svc-mark-masq";
/// Jumped to from `nat-postrouting`: masquerades marked packets.
pub const MASQ: &str = "svc-masq";
/// Rejects (TCP reset, ICMP port unreachable).
pub const REJECT: &str = "svc-reject";
/// Filter-hook check of new connections that were not DNATed.
pub const CHECK: &str = "svc-check";
/// `meta nfproto . meta l4proto . th dport` -> external chain, for local destinations.
pub const NODEPORTS: &str = "svc-nodeports";
/// Same key, for NodePorts of services without endpoints (-> reject).
pub const NOEP_NODEPORTS: &str = "svc-noep-nodeports";
/// The masquerade mark bit (kube-proxy's).
pub const MASQ_BIT: u32 = 0x4000;

/// Address frontends' dispatch elements and ClusterIPs are spread over this many maps and
/// sets per family by the destination's last four bits ([`AddrShard`]). The kernel dumps a
/// hash set by walking it from the start for every reply message, so reading back one set
/// of n elements costs O(n^2): at 50,000 services the whole dispatch map and ClusterIP set
/// were the two largest walks of a restart. The packet path pays one more lookup per new
/// connection (`ip daddr & 0.0.0.15 vmap @svc-dispatch-shards-v4`), whatever the count.
pub const ADDR_SHARDS: u8 = 16;

/// One address shard of a family: the destinations whose last four bits are `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrShard {
    pub family: IpFamily,
    pub shard: u8,
}

impl AddrShard {
    /// The shard of a destination address (what `ip daddr & 0.0.0.15` selects in the
    /// kernel: the address's last four bits).
    pub fn of(ip: IpAddr) -> AddrShard {
        let last = match ip {
            IpAddr::V4(a) => a.octets()[3],
            IpAddr::V6(a) => a.octets()[15],
        };
        AddrShard {
            family: IpFamily::of(ip),
            shard: last & 0x0f,
        }
    }

    /// `svc-dispatch-v4-3`: `ip daddr . meta l4proto . th dport` -> pool or service chain
    /// (or drop), for the shard's destinations.
    pub fn dispatch_map(&self) -> String {
        format!("svc-dispatch-{}-{}", fam_suffix(self.family), self.shard)
    }

    /// `svc-cluster-ips-v4-3`: the shard's allocated ClusterIPs. A connection to one that
    /// was not DNATed (wrong port or protocol, no endpoints) is rejected; the rest of the
    /// service CIDR is dropped.
    pub fn cluster_ips_set(&self) -> String {
        format!("svc-cluster-ips-{}-{}", fam_suffix(self.family), self.shard)
    }

    /// `svc-dispatch-v4-s3`: looks the packet up in [`AddrShard::dispatch_map`], then
    /// goes on to the NodePort lookups.
    pub fn dispatch_chain(&self) -> String {
        format!("svc-dispatch-{}-s{}", fam_suffix(self.family), self.shard)
    }

    /// `svc-check-v4-s3`: rejects connections to the shard's ClusterIPs.
    pub fn check_chain(&self) -> String {
        format!("svc-check-{}-s{}", fam_suffix(self.family), self.shard)
    }

    /// The key of the shard's element in the selector maps (`0.0.0.3`, `::3`).
    pub fn selector(&self) -> Value {
        match self.family {
            IpFamily::V4 => Value::Ipv4(std::net::Ipv4Addr::from(u32::from(self.shard))),
            IpFamily::V6 => Value::Ipv6(std::net::Ipv6Addr::from(u128::from(self.shard))),
        }
    }

    /// The shard whose dispatch map or ClusterIP set `name` names.
    pub fn of_set(name: &str) -> Option<AddrShard> {
        let rest = name
            .strip_prefix("svc-dispatch-")
            .or_else(|| name.strip_prefix("svc-cluster-ips-"))?;
        let (fam, shard) = rest.split_once('-')?;
        let family = match fam {
            "v4" => IpFamily::V4,
            "v6" => IpFamily::V6,
            _ => return None,
        };
        let shard = shard.parse::<u8>().ok().filter(|s| *s < ADDR_SHARDS)?;
        let s = AddrShard { family, shard };
        // Only the canonical spelling ("-03" is not shard 3's).
        (s.dispatch_map() == name || s.cluster_ips_set() == name).then_some(s)
    }
}

/// The frontends' dispatch map of a destination address (see [`AddrShard::dispatch_map`]).
pub fn dispatch(ip: IpAddr) -> String {
    AddrShard::of(ip).dispatch_map()
}

/// The ClusterIP set a ClusterIP belongs in (see [`AddrShard::cluster_ips_set`]).
pub fn cluster_ips(ip: IpAddr) -> String {
    AddrShard::of(ip).cluster_ips_set()
}

/// `ip daddr & 0.0.0.15` -> `goto` the shard's dispatch chain.
pub fn dispatch_shards(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-dispatch-shards-v4",
        IpFamily::V6 => "svc-dispatch-shards-v6",
    }
}

/// `ip daddr & 0.0.0.15` -> `jump` the shard's check chain.
pub fn check_shards(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-check-shards-v4",
        IpFamily::V6 => "svc-check-shards-v6",
    }
}

/// After the address lookups in `svc-dispatch`: the NodePort lookups (not on loopback).
pub const DISPATCH_NODEPORTS: &str = "svc-dispatch-nodeports";

/// Same key: external addresses of services without endpoints (-> reject).
pub fn no_endpoints(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-noep-v4",
        IpFamily::V6 => "svc-noep-v6",
    }
}

/// Address frontends' backends are spread over this many maps per family and policy, by a
/// hash of the frontend ([`shard`]). The kernel dumps a hash set's elements by walking its
/// table from the start for every reply message, so reading one map of n elements back
/// costs O(n^2); at 50,000 services x 5 endpoints one map took 8.6-12 s to read, sixteen
/// 1.0-1.3 s (load ~7). Free per packet: the dispatch verdict already names the pool chain,
/// and each shard has its own.
pub const BACKEND_SHARDS: u8 = 16;

/// The backends-map shard of an address frontend: FNV-1a of its address, protocol and
/// port. Stable across versions and runs (the shard is part of the kernel's state).
pub fn shard(ip: IpAddr, proto: u8, port: u16) -> u8 {
    let mut h: u32 = 0x811c_9dc5;
    let addr: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    for b in addr
        .iter()
        .chain([proto].iter())
        .chain(port.to_be_bytes().iter())
    {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % u32::from(BACKEND_SHARDS)) as u8
}

/// A data map `frontend . numgen bucket -> endpoint address . port` the pools DNAT from;
/// `local` ones hold only this node's endpoints (externalTrafficPolicy Local). Address
/// frontends have [`BACKEND_SHARDS`] of them per family and policy; NodePorts one (`shard`
/// is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendsMap {
    pub family: IpFamily,
    pub frontend: Frontend,
    pub local: bool,
    pub shard: u8,
}

impl BackendsMap {
    /// `svc-backends-v4-3`, `svc-local-backends-v6-15`, `svc-np-backends-v4`.
    pub fn name(&self) -> String {
        let np = match self.frontend {
            Frontend::Addr => "",
            Frontend::NodePort => "np-",
        };
        let local = if self.local { "local-" } else { "" };
        let fam = fam_suffix(self.family);
        match self.frontend {
            Frontend::Addr => format!("svc-{local}backends-{fam}-{}", self.shard),
            Frontend::NodePort => format!("svc-{np}{local}backends-{fam}"),
        }
    }

    /// The map a name names (the inverse of [`BackendsMap::name`]).
    pub fn parse(name: &str) -> Option<BackendsMap> {
        let rest = name.strip_prefix("svc-")?;
        let (frontend, rest) = match rest.strip_prefix("np-") {
            Some(r) => (Frontend::NodePort, r),
            None => (Frontend::Addr, rest),
        };
        let (local, rest) = match rest.strip_prefix("local-") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let rest = rest.strip_prefix("backends-")?;
        let (fam, shard) = match frontend {
            Frontend::NodePort => (rest, None),
            Frontend::Addr => {
                let (fam, shard) = rest.split_once('-')?;
                (fam, Some(shard))
            }
        };
        let family = match fam {
            "v4" => IpFamily::V4,
            "v6" => IpFamily::V6,
            _ => return None,
        };
        let shard = match shard {
            None => 0,
            Some(s) => s.parse::<u8>().ok().filter(|s| *s < BACKEND_SHARDS)?,
        };
        let map = BackendsMap {
            family,
            frontend,
            local,
            shard,
        };
        // Only the canonical spelling ("-03" is not shard 3's map).
        (map.name() == name).then_some(map)
    }
}

/// The maps a new table may receive after its first commit (see
/// `Transaction::create_chunked`): the dispatch and backends maps hold the bulk of a large
/// cluster's elements, and one still missing only means its service is not load-balanced
/// yet (the connection meets `svc-check`); nothing that filters traffic lives in them.
pub fn is_bulk_map(name: &str) -> bool {
    AddrShard::of_set(name).is_some_and(|s| s.dispatch_map() == name)
        || BackendsMap::parse(name).is_some()
}

/// `ip saddr . ip daddr` of this node's endpoints: a connection DNATed back to the endpoint
/// that opened it (hairpin) is masqueraded.
pub fn hairpin(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-hairpin-v4",
        IpFamily::V6 => "svc-hairpin-v6",
    }
}

pub fn fam_suffix(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "v4",
        IpFamily::V6 => "v6",
    }
}

fn proto_name(p: u8) -> &'static str {
    match p {
        proto::TCP => "tcp",
        proto::UDP => "udp",
        _ => "sctp",
    }
}

/// The chains of one service port in one family.
pub struct PortNames {
    /// `namespace/name/port/proto/family`: what every name here is derived from.
    id: String,
    /// Entry for cluster traffic (ClusterIPs).
    pub cluster: String,
    /// Entry for external traffic (NodePort, externalIPs, LB IPs).
    pub external: String,
    /// loadBalancerSourceRanges filter in front of `external` for LB IPs.
    pub source_filter: String,
    /// Load balancing over all endpoints.
    pub all: String,
    /// Load balancing over this node's endpoints.
    pub local: String,
}

impl PortNames {
    pub fn new(service: &str, p: &Port, f: IpFamily) -> PortNames {
        let port = if p.name.is_empty() {
            p.port.to_string()
        } else {
            p.name.clone()
        };
        let id = format!("{service}/{port}/{}/{}", proto_name(p.proto), fam_suffix(f));
        PortNames {
            cluster: object_name("svc", &id),
            external: object_name("svx", &id),
            source_filter: object_name("svf", &id),
            all: object_name("sva", &id),
            local: object_name("svl", &id),
            id,
        }
    }

    /// The DNAT chain of one endpoint.
    pub fn endpoint(&self, b: &Backend) -> String {
        object_name("sep", &format!("{}/{}/{}", self.id, b.ip, b.port))
    }

    /// The dynamic set of clients recently sent to an endpoint (session affinity).
    pub fn affinity(&self, b: &Backend) -> String {
        object_name("saf", &format!("{}/{}/{}", self.id, b.ip, b.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_map_names_parse_back_and_nothing_else_does() {
        for family in [IpFamily::V4, IpFamily::V6] {
            for local in [false, true] {
                let np = BackendsMap {
                    family,
                    frontend: Frontend::NodePort,
                    local,
                    shard: 0,
                };
                assert_eq!(BackendsMap::parse(&np.name()), Some(np));
                for shard in 0..BACKEND_SHARDS {
                    let m = BackendsMap {
                        frontend: Frontend::Addr,
                        shard,
                        ..np
                    };
                    assert_eq!(BackendsMap::parse(&m.name()), Some(m), "{}", m.name());
                    assert!(is_bulk_map(&m.name()));
                }
            }
        }
        for other in [
            "svc-backends-v4",
            "svc-backends-v4-16",
            "svc-backends-v4-03",
            "svc-np-backends-v4-1",
            "svc-backends-v5-1",
            "svc-cluster-ips-v4",
            "svc-hairpin-v6",
        ] {
            assert_eq!(BackendsMap::parse(other), None, "{other}");
        }
        assert!(is_bulk_map("svc-dispatch-v6-15"));
        assert!(!is_bulk_map("svc-dispatch-v6"));
        assert!(!is_bulk_map("svc-dispatch-shards-v4"));
        assert!(!is_bulk_map("svc-cluster-ips-v4-3"));
    }

    #[test]
    fn address_shards_are_the_last_four_bits_and_their_names_parse_back() {
        let s = |ip: &str| AddrShard::of(ip.parse().unwrap());
        assert_eq!(s("172.30.0.10").shard, 10);
        assert_eq!(s("172.30.1.31").shard, 15);
        assert_eq!(s("fd00::a").shard, 10);
        assert_eq!(s("fd00::a").family, IpFamily::V6);
        // What the kernel selects with `ip daddr & 0.0.0.15`.
        for ip in ["172.30.7.77", "fd00::1:2f"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                s(&ip.to_string()).selector(),
                Value::ip(crate::nft::ir::low_nibble(ip))
            );
        }
        for family in [IpFamily::V4, IpFamily::V6] {
            for shard in 0..ADDR_SHARDS {
                let a = AddrShard { family, shard };
                assert_eq!(AddrShard::of_set(&a.dispatch_map()), Some(a));
                assert_eq!(AddrShard::of_set(&a.cluster_ips_set()), Some(a));
            }
        }
        for other in [
            "svc-dispatch-v4",
            "svc-dispatch-v4-16",
            "svc-dispatch-v4-03",
            "svc-dispatch-shards-v4",
            "svc-cluster-ips-v4",
            "svc-dispatch-v4-s3",
        ] {
            assert_eq!(AddrShard::of_set(other), None, "{other}");
        }
    }

    #[test]
    fn frontends_spread_evenly_over_the_shards_and_keep_their_shard() {
        let mut counts = [0u32; BACKEND_SHARDS as usize];
        for i in 0..16_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0xac1e_0000 + i));
            counts[shard(ip, proto::TCP, 80) as usize] += 1;
        }
        // 1,000 expected per shard.
        assert!(counts.iter().all(|n| (850..1150).contains(n)), "{counts:?}");
        // The shard is part of the kernel's state: a new version that moved frontends would
        // rewrite every backend at its first sync.
        let ip: IpAddr = "172.30.0.10".parse().unwrap();
        assert_eq!(shard(ip, proto::TCP, 443), 9);
        assert_eq!(shard(ip, proto::TCP, 80), 1);
        let v6: IpAddr = "fd00::a".parse().unwrap();
        assert!(shard(v6, proto::UDP, 53) < BACKEND_SHARDS);
    }
}
