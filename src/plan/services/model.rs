//! Service, EndpointSlice and Endpoints -> the validated facts the chains are built from:
//! frontends (addresses and ports), policies, and the usable backends of each port.

use crate::api::{EndpointSlice, Endpoints, Service};
use crate::nft::ir::{IpFamily, proto};
use ipnet::IpNet;
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
    pub lb_source_ranges: Vec<IpNet>,
    pub ports: Vec<Port>,
    /// Affinity timeout when `sessionAffinity: ClientIP`.
    pub affinity: Option<u32>,
    pub internal_local: bool,
    pub external_local: bool,
    pub health_check_node_port: Option<u16>,
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

/// `Ok(None)` for services that are not proxied (headless, ExternalName); `Err` names the
/// offending field.
pub fn parse(svc: &Service) -> Result<Option<Model>, String> {
    let Some(spec) = &svc.spec else {
        return Ok(None);
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(None);
    }
    let raw_ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if raw_ips.iter().any(|ip| *ip == "None" || ip.is_empty()) {
        return Ok(None);
    }
    let cluster_ips = parse_ips("spec.clusterIPs", raw_ips.iter().copied())?;
    let external_ips = parse_ips(
        "spec.externalIPs",
        spec.external_ips.iter().flatten().map(String::as_str),
    )?;
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let lb_ips = parse_ips(
        "status.loadBalancer.ingress[].ip",
        ingress
            .into_iter()
            .flatten()
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.as_deref()),
    )?;
    let mut lb_source_ranges = Vec::new();
    for (i, r) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        let net: IpNet = r
            .trim()
            .parse()
            .map_err(|e| format!("spec.loadBalancerSourceRanges[{i}]: invalid CIDR {r:?}: {e}"))?;
        lb_source_ranges.push(net.trunc());
    }
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
    let affinity = match spec.session_affinity.as_deref() {
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
    };
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
    }))
}

fn parse_ips<'a>(field: &str, raw: impl Iterator<Item = &'a str>) -> Result<Vec<IpAddr>, String> {
    let mut out: Vec<IpAddr> = Vec::new();
    for (i, r) in raw.enumerate() {
        let ip: IpAddr = r
            .trim()
            .parse()
            .map_err(|e| format!("{field}[{i}]: invalid IP {r:?}: {e}"))?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
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
}

/// The backends of `port` in `fam`: ready ones; if none, serving-terminating ones (chosen
/// separately for the whole set and for the node-local subset, as kube-proxy does).
pub fn backends(
    sources: &Sources,
    port: &Port,
    fam: IpFamily,
    node: &str,
) -> (Vec<Backend>, Vec<Backend>) {
    let mut cands = Vec::new();
    match sources {
        Sources::Slices(slices) => {
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
                    for a in &e.addresses {
                        if let Ok(ip) = a.parse::<IpAddr>()
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
                            });
                        }
                    }
                }
            }
        }
        Sources::Endpoints(eps) => {
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
                        });
                    }
                }
            }
        }
    }
    let choose = |only_local: bool| {
        let pool = || cands.iter().filter(move |c| !only_local || c.backend.local);
        let mut out: Vec<Backend> = pool()
            .filter(|c| c.ready)
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
    (choose(false), choose(true))
}
