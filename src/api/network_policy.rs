//! NetworkPolicy (networking.k8s.io/v1, the k8s-openapi type) validated into the form the
//! `netpol` planner uses: selectors compiled, CIDRs parsed, `policyTypes` defaulted and ports
//! checked, or the first problem with its field path. The API server validates the same
//! things; manifests are not validated by anyone else, so the agent does it for both sources.

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::selector::Selector;
use super::validate::{Ctx, Invalid, Protocol, ValidationError, parse_cidr};

/// A validated NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPolicy {
    pub namespace: String,
    pub name: String,
    /// `spec.podSelector`: the pods of `namespace` the policy isolates.
    pub pods: Selector,
    /// The allow rules when the policy isolates ingress (`policyTypes` has `Ingress`).
    pub ingress: Option<Vec<PolicyRule>>,
    /// The allow rules when the policy isolates egress.
    pub egress: Option<Vec<PolicyRule>>,
}

/// One `ingress[]` / `egress[]` rule: traffic from/to any of `peers` on any of `ports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// `None`: every peer (the field is absent or empty).
    pub peers: Option<Vec<Peer>>,
    /// `None`: every port and protocol (the field is absent or empty).
    pub ports: Option<Vec<PolicyPort>>,
}

/// Ordered and hashable so that equal peer lists can share one set (`plan::netpol::peers`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// Pods matching `pods` in the namespaces `namespaces` designates.
    Pods {
        namespaces: NamespaceScope,
        pods: Selector,
    },
    /// `ipBlock`: `cidr` minus every `except` (each strictly inside `cidr`).
    Block { cidr: IpNet, except: Vec<IpNet> },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NamespaceScope {
    /// No `namespaceSelector`: the policy's own namespace.
    Own,
    /// Namespaces whose labels match (empty selector: every namespace).
    Matching(Selector),
}

/// One `ports[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPort {
    pub protocol: Protocol,
    pub port: PortSpec,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSpec {
    /// No `port`: every port of the protocol.
    All,
    /// `port` (and `endPort`): an inclusive range, a single port when both ends are equal.
    Range(u16, u16),
    /// A container port name, resolved per pod.
    Named(String),
}

/// Validates a NetworkPolicy (see the module documentation).
pub fn validate(policy: &NetworkPolicy) -> Result<ValidatedPolicy, ValidationError> {
    let ctx = Ctx::namespaced("NetworkPolicy", &policy.metadata);
    let name = match policy.metadata.name.as_deref() {
        None | Some("") => return Err(ctx.err("metadata.name", Invalid::Missing)),
        Some(n) => n.to_string(),
    };
    let namespace = match policy.metadata.namespace.as_deref() {
        None | Some("") => return Err(ctx.err("metadata.namespace", Invalid::Missing)),
        Some(ns) => ns.to_string(),
    };
    let spec = policy.spec.clone().unwrap_or_default();
    let pods = ctx.selector("spec.podSelector", &spec.pod_selector.unwrap_or_default())?;
    let has_egress_rules = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    // API defaulting: Ingress always; Egress when the policy has egress rules.
    let (mut isolates_ingress, mut isolates_egress) = (true, has_egress_rules);
    if let Some(types) = spec.policy_types.as_ref().filter(|t| !t.is_empty()) {
        (isolates_ingress, isolates_egress) = (false, false);
        for (i, t) in types.iter().enumerate() {
            match t.as_str() {
                "Ingress" => isolates_ingress = true,
                "Egress" => isolates_egress = true,
                other => {
                    return Err(ctx.err(
                        format!("spec.policyTypes[{i}]"),
                        Invalid::PolicyType(other.to_string()),
                    ));
                }
            }
        }
    }
    let rules = |field: &str, rules: Option<Vec<RawRule>>| {
        rules
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, r)| validate_rule(&ctx, &format!("{field}[{i}]"), r))
            .collect::<Result<Vec<_>, _>>()
    };
    // Rules are checked even for a direction the policy does not isolate: the API server
    // rejects them too.
    let ingress = rules(
        "spec.ingress",
        spec.ingress.map(|r| r.into_iter().map(in_rule).collect()),
    )?;
    let egress = rules(
        "spec.egress",
        spec.egress.map(|r| r.into_iter().map(out_rule).collect()),
    )?;
    Ok(ValidatedPolicy {
        namespace,
        name,
        pods,
        ingress: isolates_ingress.then_some(ingress),
        egress: isolates_egress.then_some(egress),
    })
}

/// An ingress or egress rule as one shape: peers, ports and the name of the peers field.
struct RawRule {
    peers: Option<Vec<NetworkPolicyPeer>>,
    ports: Option<Vec<NetworkPolicyPort>>,
    peers_field: &'static str,
}

fn in_rule(r: NetworkPolicyIngressRule) -> RawRule {
    RawRule {
        peers: r.from,
        ports: r.ports,
        peers_field: "from",
    }
}

fn out_rule(r: NetworkPolicyEgressRule) -> RawRule {
    RawRule {
        peers: r.to,
        ports: r.ports,
        peers_field: "to",
    }
}

fn validate_rule(ctx: &Ctx, field: &str, rule: &RawRule) -> Result<PolicyRule, ValidationError> {
    let peers = match rule.peers.as_deref() {
        None | Some([]) => None,
        Some(list) => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| validate_peer(ctx, &format!("{field}.{}[{i}]", rule.peers_field), p))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let ports = match rule.ports.as_deref() {
        None | Some([]) => None,
        Some(list) => Some(
            list.iter()
                .enumerate()
                .map(|(i, p)| validate_port(ctx, &format!("{field}.ports[{i}]"), p))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(PolicyRule { peers, ports })
}

fn validate_peer(
    ctx: &Ctx,
    field: &str,
    peer: &NetworkPolicyPeer,
) -> Result<Peer, ValidationError> {
    if let Some(block) = &peer.ip_block {
        if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
            return Err(ctx.err(field, Invalid::IpBlockWithSelector));
        }
        let cidr =
            parse_cidr(&block.cidr).map_err(|e| ctx.err(format!("{field}.ipBlock.cidr"), e))?;
        let mut except = Vec::new();
        for (i, raw) in block.except.iter().flatten().enumerate() {
            let at = || format!("{field}.ipBlock.except[{i}]");
            let net = parse_cidr(raw).map_err(|e| ctx.err(at(), e))?;
            // Strictly inside: an except equal to the cidr leaves nothing, which the API
            // server rejects as well.
            if !cidr.contains(&net) || net.prefix_len() <= cidr.prefix_len() {
                return Err(ctx.err(at(), Invalid::ExceptOutsideCidr(net, cidr)));
            }
            except.push(net);
        }
        return Ok(Peer::Block { cidr, except });
    }
    let (pods, namespaces) = match (&peer.pod_selector, &peer.namespace_selector) {
        (None, None) => return Err(ctx.err(field, Invalid::EmptyPeer)),
        (pods, namespaces) => (pods, namespaces),
    };
    let pods = match pods {
        Some(s) => ctx.selector(&format!("{field}.podSelector"), s)?,
        None => Selector::everything(),
    };
    let namespaces = match namespaces {
        Some(s) => {
            NamespaceScope::Matching(ctx.selector(&format!("{field}.namespaceSelector"), s)?)
        }
        None => NamespaceScope::Own,
    };
    Ok(Peer::Pods { namespaces, pods })
}

fn validate_port(
    ctx: &Ctx,
    field: &str,
    port: &NetworkPolicyPort,
) -> Result<PolicyPort, ValidationError> {
    // Case-sensitive, as the API server is (unlike the OVN-Kubernetes CRDs).
    let protocol = match port.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(p) => Protocol::parse(p)
            .filter(|parsed| parsed.as_str() == p)
            .ok_or_else(|| {
                ctx.err(
                    format!("{field}.protocol"),
                    Invalid::Protocol(p.to_string()),
                )
            })?,
    };
    let number = |n: i32, at: &str| {
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ctx.err(format!("{field}.{at}"), Invalid::Port(n)))
    };
    let spec = match (&port.port, port.end_port) {
        (None, None) => PortSpec::All,
        (None, Some(_)) => {
            return Err(ctx.err(format!("{field}.endPort"), Invalid::EndPortWithoutPort));
        }
        (Some(IntOrString::String(name)), None) => {
            check_port_name(name).map_err(|e| ctx.err(format!("{field}.port"), e))?;
            PortSpec::Named(name.clone())
        }
        (Some(IntOrString::String(_)), Some(_)) => {
            return Err(ctx.err(format!("{field}.endPort"), Invalid::EndPortWithoutPort));
        }
        (Some(IntOrString::Int(p)), end) => {
            let start = number(*p, "port")?;
            let end = match end {
                None => start,
                Some(e) => {
                    let end = number(e, "endPort")?;
                    if end < start {
                        return Err(
                            ctx.err(format!("{field}.endPort"), Invalid::EndPortBelowPort(e, *p))
                        );
                    }
                    end
                }
            };
            PortSpec::Range(start, end)
        }
    };
    Ok(PolicyPort {
        protocol,
        port: spec,
    })
}

/// An IANA service name (`IsValidPortName`): 1-15 characters of `[a-z0-9-]`, at least one
/// letter, no leading, trailing or doubled `-`.
fn check_port_name(name: &str) -> Result<(), Invalid> {
    let bad = || Invalid::PortName(name.to_string());
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok { Ok(()) } else { Err(bad()) }
}

#[cfg(test)]
mod tests;
