//! Service, EndpointSlice and Endpoints -> the validated facts the chains are built from:
//! frontends (addresses and ports), policies, and the usable backends of each port.

use super::topology::{self, Hint, Hints};
use crate::api::service::ServiceSpec;
use crate::api::{EndpointSlice, Endpoints, Service};
use crate::nft::ir::{IpFamily, proto};
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_SECS: u32 = 10800;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// `spec.ports[].name` ("" when unnamed): what endpoint ports are matched by.
    pub name: String,
    pub proto: u8,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// One usable backend of a port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    pub ip: IpAddr,
    pub port: u16,
    pub local: bool,
}

/// Per (port, family): the backends of all endpoints and of this node's endpoints.
pub struct PortBackends<'a> {
    pub port: &'a Port,
    pub family: IpFamily,
    pub all: Vec<Backend>,
    pub local: Vec<Backend>,
}

/// A proxied Service, parsed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, except `ipMode: Proxy`.
    pub lb_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`, plus the LB IPs themselves when a range holds this
    /// node's address (see [`node_may_use_lb_ips`]).
    pub lb_source_ranges: Vec<IpNet>,
    pub ports: Vec<Port>,
    /// Affinity timeout when `sessionAffinity: ClientIP`.
    pub affinity: Option<u32>,
    pub internal_local: bool,
    pub external_local: bool,
    pub health_check_node_port: Option<u16>,
    /// The field path of every frontend address kept (`spec.clusterIP`, `spec.externalIPs[1]`,
    /// `status.loadBalancer.ingress[0].ip`): what a lost conflict is reported by.
    pub fields: BTreeMap<IpAddr, String>,
    /// Addresses left out, each `field: ip reason`; the rest of the service applies. Also
    /// ClusterIPs outside `--service-cidr`, which are applied but reported.
    pub refused: Vec<String>,
    /// The refused addresses that are a node's: re-planned when that node's addresses change.
    pub node_refused: Vec<IpAddr>,
}

/// What decides whether a frontend address is usable, besides its own value.
pub struct AddressRules<'a> {
    /// Every Node's InternalIP/ExternalIP, with the node's name.
    pub node_ips: &'a BTreeMap<IpAddr, String>,
    /// This node's primary addresses (see [`crate::snapshot::node_primary_ips`]).
    pub node_primary: &'a [IpAddr],
    pub service_cidrs: &'a [IpNet],
    pub external_allowed: &'a [IpNet],
    pub external_rejected: &'a [IpNet],
    pub cluster_cidrs: &'a [IpNet],
    pub lb_allowed: &'a [IpNet],
    pub lb_rejected: &'a [IpNet],
}

/// Why an address can never be a Service frontend, whoever asks: traffic to it is the node's
/// own (loopback, a node address) or is not unicast traffic to one host, and a frontend there
/// would take over or reset connections that have nothing to do with the service (a
/// `clusterIP: 127.0.0.1` resets every loopback TCP connection to its other ports).
pub fn unusable(ip: IpAddr, node_ips: &BTreeMap<IpAddr, String>) -> Option<String> {
    let class = match ip {
        IpAddr::V4(a) if a.is_loopback() => "a loopback address",
        IpAddr::V4(a) if a.is_link_local() => "a link-local address",
        IpAddr::V4(a) if a.is_multicast() => "a multicast address",
        IpAddr::V4(a) if a.is_unspecified() => "the unspecified address",
        IpAddr::V4(a) if a.is_broadcast() => "the broadcast address",
        IpAddr::V6(a) if a.is_loopback() => "a loopback address",
        IpAddr::V6(a) if a.is_unicast_link_local() => "a link-local address",
        IpAddr::V6(a) if a.is_multicast() => "a multicast address",
        IpAddr::V6(a) if a.is_unspecified() => "the unspecified address",
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => {
            let v4 = a.to_ipv4_mapped().expect("checked");
            return Some(format!(
                "is an IPv4-mapped IPv6 address, which no packet carries (write {v4})"
            ));
        }
        _ => {
            return node_ips
                .get(&ip)
                .map(|node| format!("is an address of node {node}"));
        }
    };
    Some(format!("is {class}"))
}

impl AddressRules<'_> {
    /// Why a LoadBalancer ingress IP is not honoured: Service status is written by controllers
    /// that may be wrong or compromised, and an ingress IP takes the address over for every
    /// client of the node, the node itself included. A pod's address (the cluster CIDRs) or a
    /// service CIDR address is never an LB IP; the operator's lists narrow the rest.
    fn lb_refusal(&self, ip: IpAddr) -> Option<String> {
        let within = |flag: &str, nets: &[IpNet]| {
            let net = nets.iter().find(|n| n.contains(&ip))?;
            Some(format!("is in {flag} {net}"))
        };
        within("--cluster-cidr", self.cluster_cidrs)
            .or_else(|| within("--service-cidr", self.service_cidrs))
            .or_else(|| within("--load-balancer-ip-rejected-cidrs", self.lb_rejected))
            .or_else(|| {
                let allowed = self.lb_allowed;
                (!allowed.is_empty() && !allowed.iter().any(|n| n.contains(&ip))).then(|| {
                    format!(
                        "is not in --load-balancer-ip-allowed-cidrs {}",
                        list(allowed)
                    )
                })
            })
    }
}

impl Model {
    pub fn has_external(&self) -> bool {
        !self.external_ips.is_empty()
            || !self.lb_ips.is_empty()
            || self.ports.iter().any(|p| p.node_port.is_some())
    }

    /// The families the service has a frontend in.
    pub fn families(&self) -> Vec<IpFamily> {
        let mut fams: Vec<IpFamily> = self
            .cluster_ips
            .iter()
            .chain(&self.external_ips)
            .chain(&self.lb_ips)
            .map(|ip| IpFamily::of(*ip))
            .collect();
        fams.sort();
        fams.dedup();
        fams
    }
}

/// `Ok(None)` for services that are not proxied (headless, ExternalName, labelled for another
/// proxy: in manifests mode too, where no watch selector leaves them out); `Err` names the
/// offending field. An unusable address (see [`unusable`], an externalIP outside the policy,
/// an unparsable one) is left out and named in [`Model::refused`]; the rest applies.
pub fn parse(svc: &Service, rules: &AddressRules) -> Result<Option<Model>, String> {
    let Some(spec) = &svc.spec else {
        return Ok(None);
    };
    if svc.for_another_proxy() {
        return Ok(None);
    }
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(None);
    }
    let raw_ips = cluster_ip_fields(spec);
    if raw_ips.iter().any(|(_, ip)| *ip == "None" || ip.is_empty()) {
        return Ok(None);
    }
    let mut addrs = Addresses {
        rules,
        fields: BTreeMap::new(),
        refused: Vec::new(),
        node_refused: Vec::new(),
    };
    let cluster_ips = addrs.take(raw_ips, Frontend::Cluster);
    let external_ips = addrs.take(
        spec.external_ips
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, ip)| (format!("spec.externalIPs[{i}]"), ip.as_str())),
        Frontend::External,
    );
    let lb_ips = addrs.take(lb_ingress_fields(svc), Frontend::LoadBalancer);
    let mut lb_source_ranges = parse_source_ranges(spec)?;
    let from_node = node_may_use_lb_ips(&lb_source_ranges, &lb_ips, rules.node_primary);
    lb_source_ranges.extend(from_node);
    let ports = parse_ports(spec)?;
    let affinity = parse_affinity(spec)?;
    let local = |v: &Option<String>| v.as_deref() == Some("Local");
    let external_local = local(&spec.external_traffic_policy);
    Ok(Some(Model {
        cluster_ips,
        external_ips,
        lb_ips,
        lb_source_ranges,
        ports,
        affinity,
        internal_local: local(&spec.internal_traffic_policy),
        external_local,
        health_check_node_port: spec
            .health_check_node_port
            .filter(|p| *p != 0 && external_local)
            .map(port_number)
            .transpose()
            .map_err(|e| format!("spec.healthCheckNodePort: {e}"))?,
        fields: addrs.fields,
        refused: addrs.refused,
        node_refused: addrs.node_refused,
    }))
}

/// The cluster IPs with their fields: `spec.clusterIPs`, else `spec.clusterIP`.
fn cluster_ip_fields(spec: &ServiceSpec) -> Vec<(String, &str)> {
    match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect(),
        _ => spec
            .cluster_ip
            .as_deref()
            .map(|ip| ("spec.clusterIP".to_string(), ip))
            .into_iter()
            .collect(),
    }
}

/// The LoadBalancer ingress IPs with their fields, but those with `ipMode: Proxy` (the load
/// balancer does not send their traffic to the IP: kube-proxy leaves them out too).
fn lb_ingress_fields(svc: &Service) -> impl Iterator<Item = (String, &str)> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    ingress
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, i)| i.ip_mode.as_deref() != Some("Proxy"))
        .filter_map(|(n, i)| {
            let ip = i.ip.as_deref()?;
            Some((format!("status.loadBalancer.ingress[{n}].ip"), ip))
        })
}

/// `spec.loadBalancerSourceRanges`, truncated to their prefixes; an error names the field.
fn parse_source_ranges(spec: &ServiceSpec) -> Result<Vec<IpNet>, String> {
    let ranges = spec.load_balancer_source_ranges.iter().flatten();
    ranges
        .enumerate()
        .map(|(i, r)| {
            let net: IpNet = r.trim().parse().map_err(|e| {
                format!("spec.loadBalancerSourceRanges[{i}]: invalid CIDR {r:?}: {e}")
            })?;
            Ok(net.trunc())
        })
        .collect()
}

/// `spec.ports`: protocol, port and NodePort of each, errors naming the field.
fn parse_ports(spec: &ServiceSpec) -> Result<Vec<Port>, String> {
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let field = format!("spec.ports[{i}]");
        ports.push(Port {
            name: p.name.clone().unwrap_or_default(),
            proto: protocol(p.protocol.as_deref()).map_err(|e| format!("{field}.protocol: {e}"))?,
            port: port_number(p.port).map_err(|e| format!("{field}.port: {e}"))?,
            node_port: p
                .node_port
                .filter(|n| *n != 0)
                .map(port_number)
                .transpose()
                .map_err(|e| format!("{field}.nodePort: {e}"))?,
        });
    }
    Ok(ports)
}

/// The session affinity timeout (ClientIP), or `None`.
fn parse_affinity(spec: &ServiceSpec) -> Result<Option<u32>, String> {
    Ok(match spec.session_affinity.as_deref() {
        Some("ClientIP") => {
            let secs = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            Some(match secs {
                None => DEFAULT_AFFINITY_SECS,
                Some(s) if (1..=86400).contains(&s) => s as u32,
                Some(s) => {
                    return Err(format!(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds: {s} is not in 1..=86400"
                    ));
                }
            })
        }
        None | Some("None") => None,
        Some(other) => return Err(format!("spec.sessionAffinity: unknown value {other:?}")),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frontend {
    Cluster,
    External,
    LoadBalancer,
}

/// Collects a service's frontend addresses, refusing the unusable ones.
struct Addresses<'a> {
    rules: &'a AddressRules<'a>,
    fields: BTreeMap<IpAddr, String>,
    refused: Vec<String>,
    node_refused: Vec<IpAddr>,
}

impl Addresses<'_> {
    /// The usable, distinct addresses of one field (an address named twice, or already a
    /// frontend of the service through another field, counts once).
    fn take<'s>(
        &mut self,
        raw: impl IntoIterator<Item = (String, &'s str)>,
        kind: Frontend,
    ) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for (field, r) in raw {
            let ip: IpAddr = match r.trim().parse() {
                Ok(ip) => ip,
                Err(e) => {
                    self.refused.push(format!("{field}: invalid IP {r:?}: {e}"));
                    continue;
                }
            };
            if let Some(first) = self.fields.get(&ip) {
                if kind == Frontend::External && first.starts_with("spec.clusterIP") {
                    self.refused
                        .push(format!("{field}: {ip} is the Service's own ClusterIP"));
                }
                continue;
            }
            if let Some(why) = unusable(ip, self.rules.node_ips) {
                if self.rules.node_ips.contains_key(&ip) {
                    self.node_refused.push(ip);
                }
                self.refused.push(format!("{field}: {ip} {why}"));
                continue;
            }
            match kind {
                Frontend::Cluster => {
                    let cidrs = self.rules.service_cidrs;
                    if !cidrs.is_empty() && !cidrs.iter().any(|n| n.contains(&ip)) {
                        self.refused.push(format!(
                            "{field}: {ip} is outside --service-cidr {} (applied; check \
                             --service-cidr)",
                            list(cidrs)
                        ));
                    }
                }
                Frontend::External => {
                    if let Some(net) = self
                        .rules
                        .external_rejected
                        .iter()
                        .find(|n| n.contains(&ip))
                    {
                        self.refused.push(format!(
                            "{field}: {ip} is in --external-ip-rejected-cidrs {net}"
                        ));
                        continue;
                    }
                    let allowed = self.rules.external_allowed;
                    if !allowed.iter().any(|n| n.contains(&ip)) {
                        self.refused.push(format!(
                            "{field}: {ip} is not in --external-ip-allowed-cidrs {}",
                            if allowed.is_empty() {
                                "(none)".to_string()
                            } else {
                                list(allowed)
                            }
                        ));
                        continue;
                    }
                }
                Frontend::LoadBalancer => {
                    if let Some(why) = self.rules.lb_refusal(ip) {
                        self.refused.push(format!("{field}: {ip} {why}"));
                        continue;
                    }
                }
            }
            self.fields.insert(ip, field);
            out.push(ip);
        }
        out
    }
}

/// kube-proxy's rule for VIP-style load balancers: the LB IP is often a local address of the
/// node, so a connection from the node to it loops back with the LB IP as its source instead
/// of coming through the load balancer. When a source range holds this node's primary
/// address of a family, the LB IPs of that family are allowed sources too.
fn node_may_use_lb_ips(ranges: &[IpNet], lb_ips: &[IpAddr], node: &[IpAddr]) -> Vec<IpNet> {
    let allowed = |ip: &IpAddr| {
        node.iter()
            .filter(|n| n.is_ipv4() == ip.is_ipv4())
            .any(|n| ranges.iter().any(|r| r.contains(n)))
    };
    lb_ips
        .iter()
        .filter(|ip| allowed(ip))
        .map(|ip| IpNet::from(*ip))
        .filter(|net| !ranges.contains(net))
        .collect()
}

fn list(nets: &[IpNet]) -> String {
    let v: Vec<String> = nets.iter().map(ToString::to_string).collect();
    v.join(",")
}

/// An endpoint port (slice or Endpoints subset) that serves the service port: same name
/// (both unnamed counts) and protocol.
fn names_port(port: &Port, name: Option<&str>, proto: Option<&str>) -> bool {
    name.unwrap_or_default() == port.name && protocol(proto).ok() == Some(port.proto)
}

fn protocol(p: Option<&str>) -> Result<u8, String> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(proto::TCP),
        "UDP" => Ok(proto::UDP),
        "SCTP" => Ok(proto::SCTP),
        other => Err(format!("unsupported protocol {other:?} (TCP, UDP or SCTP)")),
    }
}

fn port_number(p: i32) -> Result<u16, String> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{p} is not a port number (1..=65535)"))
}

/// The endpoint objects of one service: its EndpointSlices, or its Endpoints when it has
/// no slice.
pub enum Sources<'a> {
    Slices(&'a [Arc<EndpointSlice>]),
    Endpoints(Option<&'a Endpoints>),
}

/// A candidate backend before the ready/serving-terminating choice.
struct Candidate {
    backend: Backend,
    ready: bool,
    serving_terminating: bool,
    hints: Hints,
}

/// The backends of one port in one family, as [`backends`] chooses them.
pub struct Chosen {
    /// Ready backends; if none, serving-terminating ones.
    pub all: Vec<Backend>,
    /// The same choice among this node's backends alone.
    pub local: Vec<Backend>,
    /// This node's *ready* backend addresses: what the health-check port counts. A node whose
    /// local backends are all terminating still forwards to them (`local`) but fails the
    /// check, so load balancers drain it (kube-proxy counts the same way).
    pub local_ready: Vec<IpAddr>,
}

/// The backends of `port` in `fam`: ready ones; if none, serving-terminating ones (chosen
/// separately for the whole set and for the node-local subset, as kube-proxy does). The
/// ready ones of the whole set are narrowed to those hinted for this `node` or its `zone`
/// as [`topology::mode`] says. Of an endpoint's `addresses`, only the first is a backend:
/// the API says the others are the same endpoint, and kube-proxy reads `addresses[0]`.
pub fn backends(
    sources: &Sources,
    port: &Port,
    fam: IpFamily,
    node: &str,
    zone: Option<&str>,
) -> Chosen {
    let cands = match sources {
        Sources::Slices(slices) => slice_candidates(slices, port, fam, node, zone),
        Sources::Endpoints(eps) => endpoints_candidates(*eps, port, fam, node),
    };
    let mode = topology::mode(cands.iter().filter(|c| c.ready).map(|c| c.hints));
    let choose = |only_local: bool| {
        let pool = || cands.iter().filter(move |c| !only_local || c.backend.local);
        // Hints narrow cluster-wide choices only; the serving-terminating fallback ignores
        // them, as kube-proxy's does.
        let hinted = |c: &&Candidate| only_local || mode.admits(c.hints);
        let mut out: Vec<Backend> = pool()
            .filter(|c| c.ready)
            .filter(hinted)
            .map(|c| c.backend.clone())
            .collect();
        if out.is_empty() {
            out = pool()
                .filter(|c| c.serving_terminating)
                .map(|c| c.backend.clone())
                .collect();
        }
        out.sort();
        out.dedup();
        out
    };
    let local_ready = cands
        .iter()
        .filter(|c| c.ready && c.backend.local)
        .map(|c| c.backend.ip)
        .collect();
    Chosen {
        all: choose(false),
        local: choose(true),
        local_ready,
    }
}

/// The candidates of `port` in `fam` from EndpointSlices, with their conditions and hints.
fn slice_candidates(
    slices: &[Arc<EndpointSlice>],
    port: &Port,
    fam: IpFamily,
    node: &str,
    zone: Option<&str>,
) -> Vec<Candidate> {
    let mut cands = Vec::new();
    for s in slices.iter() {
        let want = match fam {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        };
        if s.address_type != want {
            continue;
        }
        let Some(target) = s
            .ports
            .iter()
            .flatten()
            .find(|p| names_port(port, p.name.as_deref(), p.protocol.as_deref()))
            .and_then(|p| p.port)
            .and_then(|p| port_number(p).ok())
        else {
            continue;
        };
        for e in &s.endpoints {
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let local = e.node_name.as_deref() == Some(node);
            let hints = e.hints.as_ref();
            let hints = Hints {
                node: Hint::of(
                    hints
                        .iter()
                        .flat_map(|h| &h.for_nodes)
                        .map(|n| n.name.as_str()),
                    Some(node),
                ),
                zone: Hint::of(
                    hints
                        .iter()
                        .flat_map(|h| &h.for_zones)
                        .map(|z| z.name.as_str()),
                    zone,
                ),
            };
            if let Some(Ok(ip)) = e.addresses.first().map(|a| a.parse::<IpAddr>())
                && IpFamily::of(ip) == fam
            {
                cands.push(Candidate {
                    backend: Backend {
                        ip,
                        port: target,
                        local,
                    },
                    ready,
                    serving_terminating: serving && terminating,
                    hints,
                });
            }
        }
    }
    cands
}

/// The candidates of `port` in `fam` from an Endpoints object (the fallback without
/// slices): all ready, no hints.
fn endpoints_candidates(
    eps: Option<&Endpoints>,
    port: &Port,
    fam: IpFamily,
    node: &str,
) -> Vec<Candidate> {
    let mut cands = Vec::new();
    for subset in eps.iter().flat_map(|e| e.subsets.iter().flatten()) {
        let Some(target) = subset
            .ports
            .iter()
            .flatten()
            .find(|p| names_port(port, p.name.as_deref(), p.protocol.as_deref()))
            .and_then(|p| port_number(p.port).ok())
        else {
            continue;
        };
        for a in subset.addresses.iter().flatten() {
            if let Ok(ip) = a.ip.parse::<IpAddr>()
                && IpFamily::of(ip) == fam
            {
                cands.push(Candidate {
                    backend: Backend {
                        ip,
                        port: target,
                        local: a.node_name.as_deref() == Some(node),
                    },
                    ready: true,
                    serving_terminating: false,
                    hints: Hints {
                        node: Hint::None,
                        zone: Hint::None,
                    },
                });
            }
        }
    }
    cands
}
