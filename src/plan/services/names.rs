//! Names of the services objects. Per-object names are derived from the object (service,
//! port, family, endpoint) alone, so they are stable across plans: an endpoint change
//! touches only the chains whose content changes.

use super::model::{Backend, Port};
use crate::nft::ir::{IpFamily, proto};
use crate::nft::names::object_name;

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

/// `ip daddr . meta l4proto . th dport` -> entry chain (or drop).
pub fn dispatch(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-dispatch-v4",
        IpFamily::V6 => "svc-dispatch-v6",
    }
}

/// Same key: external addresses of services without endpoints (-> reject).
pub fn no_endpoints(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-noep-v4",
        IpFamily::V6 => "svc-noep-v6",
    }
}

/// Allocated ClusterIPs: a connection to one that was not DNATed (wrong port or
/// protocol, no endpoints) is rejected; the rest of the service CIDR is dropped.
pub fn cluster_ips(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "svc-cluster-ips-v4",
        IpFamily::V6 => "svc-cluster-ips-v6",
    }
}

/// Data maps `frontend . numgen bucket -> endpoint address . port` the pools DNAT from;
/// `local` ones hold only this node's endpoints (externalTrafficPolicy Local).
pub fn backends(f: IpFamily, frontend: Frontend, local: bool) -> &'static str {
    match (f, frontend, local) {
        (IpFamily::V4, Frontend::Addr, false) => "svc-backends-v4",
        (IpFamily::V4, Frontend::Addr, true) => "svc-local-backends-v4",
        (IpFamily::V4, Frontend::NodePort, false) => "svc-np-backends-v4",
        (IpFamily::V4, Frontend::NodePort, true) => "svc-np-local-backends-v4",
        (IpFamily::V6, Frontend::Addr, false) => "svc-backends-v6",
        (IpFamily::V6, Frontend::Addr, true) => "svc-local-backends-v6",
        (IpFamily::V6, Frontend::NodePort, false) => "svc-np-backends-v6",
        (IpFamily::V6, Frontend::NodePort, true) => "svc-np-local-backends-v6",
    }
}

/// The maps a new table may receive after its first commit (see
/// `Transaction::create_chunked`): the dispatch and backends maps hold the bulk of a large
/// cluster's elements, and one still missing only means its service is not load-balanced
/// yet (the connection meets `svc-check`); nothing that filters traffic lives in them.
pub fn is_bulk_map(name: &str) -> bool {
    [IpFamily::V4, IpFamily::V6].into_iter().any(|f| {
        name == dispatch(f)
            || [Frontend::Addr, Frontend::NodePort]
                .into_iter()
                .any(|fe| name == backends(f, fe, false) || name == backends(f, fe, true))
    })
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
