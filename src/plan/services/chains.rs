//! One Service -> its own chains (the layout for services with session affinity or
//! loadBalancerSourceRanges, which per-endpoint state needs): per port and family an entry
//! chain for cluster traffic, one for external traffic, load-balancing chains over all and
//! over node-local endpoints, one DNAT chain per endpoint, and the elements it adds to the
//! shared dispatch maps. Every other service is map elements only ([`super::maps`]).

use super::maps::{frontend_key as key_of, nodeport_key};
use super::model::{Backend, Model, Port, PortBackends};
use super::names;
use crate::nft::ir::*;
use crate::plan::base::sets as base_sets;
use std::net::IpAddr;

/// Builds the service's part. `key` is `namespace/name`.
pub fn service_part(key: &str, model: &Model, ports: &[PortBackends]) -> Part {
    let mut part = Part::default();
    for pb in ports {
        port_objects(&mut part, key, model, pb);
    }
    part
}

fn goto(c: &str) -> Stmt {
    Stmt::Verdict(Verdict::Goto(c.to_string()))
}

fn jump(c: &str) -> Stmt {
    Stmt::Verdict(Verdict::Jump(c.to_string()))
}

fn frontend_key(ip: IpAddr, p: &Port) -> ElemKey {
    key_of(ip, p.proto, p.port)
}

fn port_objects(part: &mut Part, key: &str, m: &Model, pb: &PortBackends) {
    let (p, fam) = (pb.port, pb.family);
    let n = names::PortNames::new(key, p, fam);
    let lb_all = (!pb.all.is_empty()).then(|| {
        balancer(part, &n, &n.all, m, &pb.all, fam, p);
        n.all.clone()
    });
    let lb_local = ((m.internal_local || m.external_local) && !pb.local.is_empty()).then(|| {
        balancer(part, &n, &n.local, m, &pb.local, fam, p);
        n.local.clone()
    });
    let cluster_target = if m.internal_local {
        lb_local.as_deref()
    } else {
        lb_all.as_deref()
    };
    let any_endpoint = lb_all.is_some();
    cluster_frontends(part, &n, key, m, pb, cluster_target, any_endpoint);
    let (local, all) = (lb_local.as_deref(), lb_all.as_deref());
    external_frontends(part, &n, m, pb, cluster_target, local, all);
}

/// Cluster traffic: the clusterIPs of the port's family, dispatched to the cluster chain
/// (masquerade from outside the cluster, then `cluster_target`, the balancer of the
/// traffic policy), or dropped when the policy has no endpoint and others do.
fn cluster_frontends(
    part: &mut Part,
    n: &names::PortNames,
    key: &str,
    m: &Model,
    pb: &PortBackends,
    cluster_target: Option<&str>,
    any_endpoint: bool,
) {
    let (p, fam) = (pb.port, pb.family);
    let cluster_verdict = match cluster_target {
        Some(lb) => {
            let mut c = Chain::regular(&n.cluster);
            // Traffic from outside the cluster (the node itself, other hosts) to a
            // ClusterIP is masqueraded so replies come back through this node.
            c.push(Rule::new(vec![
                Stmt::not_in_set(vec![Field::saddr(fam)], cluster_cidrs(fam)),
                jump(names::MARK_MASQ),
            ]));
            c.push(Rule::new(vec![goto(lb)]).with_comment(format!("{key}:{}", port_label(p))));
            part.add_chain(c);
            Some(Verdict::Goto(n.cluster.clone()))
        }
        // iTP=Local without a local endpoint: dropped, as kube-proxy does.
        None if m.internal_local && any_endpoint => Some(Verdict::Drop),
        // No endpoint at all: not dispatched; the filter check rejects it.
        None => None,
    };
    for ip in m.cluster_ips.iter().filter(|ip| IpFamily::of(**ip) == fam) {
        part.add_element(
            &names::cluster_ips(*ip),
            vec![KeyPart::Value(Value::ip(*ip))],
        );
        if let Some(v) = &cluster_verdict {
            let dispatch = names::dispatch(*ip);
            part.add_mapping(
                &dispatch,
                frontend_key(*ip, p),
                ElemData::Verdict(v.clone()),
            );
        }
    }
}

/// External traffic: NodePort, externalIPs, LoadBalancer IPs of the port's family, to the
/// external chain (over `local` or `all` endpoints, `cluster_target` for traffic from the
/// cluster), behind the source ranges' filter for LoadBalancer IPs; rejected without an
/// endpoint.
fn external_frontends(
    part: &mut Part,
    n: &names::PortNames,
    m: &Model,
    pb: &PortBackends,
    cluster_target: Option<&str>,
    local: Option<&str>,
    all: Option<&str>,
) {
    let (p, fam) = (pb.port, pb.family);
    let externals: Vec<IpAddr> = m
        .external_ips
        .iter()
        .chain(&m.lb_ips)
        .copied()
        .filter(|ip| IpFamily::of(*ip) == fam)
        .collect();
    let node_port = p.node_port;
    if externals.is_empty() && node_port.is_none() {
        return;
    }
    let Some(all) = all else {
        reject_externals(part, fam, p, &externals);
        return;
    };
    external_chain(part, n, m, fam, cluster_target, local, all);
    let ext = Verdict::Goto(n.external.clone());
    for ip in m.external_ips.iter().filter(|ip| IpFamily::of(**ip) == fam) {
        part.add_mapping(
            &names::dispatch(*ip),
            frontend_key(*ip, p),
            ElemData::Verdict(ext.clone()),
        );
    }
    let lb_target = lb_source_filter(part, n, m, fam, &ext);
    for ip in m.lb_ips.iter().filter(|ip| IpFamily::of(**ip) == fam) {
        if !m.external_ips.contains(ip) {
            part.add_mapping(
                &names::dispatch(*ip),
                frontend_key(*ip, p),
                ElemData::Verdict(lb_target.clone()),
            );
        }
    }
    if let Some(np) = node_port {
        part.add_mapping(
            names::NODEPORTS,
            nodeport_key(fam, p.proto, np),
            ElemData::Verdict(ext),
        );
    }
}

/// No endpoint: the external frontends and the NodePort are rejected by the filter check.
fn reject_externals(part: &mut Part, fam: IpFamily, p: &Port, externals: &[IpAddr]) {
    let noep = names::no_endpoints(fam);
    for ip in externals {
        part.add_mapping(
            noep,
            frontend_key(*ip, p),
            ElemData::Verdict(Verdict::Goto(names::REJECT.into())),
        );
    }
    if let Some(np) = p.node_port {
        part.add_mapping(
            names::NOEP_NODEPORTS,
            nodeport_key(fam, p.proto, np),
            ElemData::Verdict(Verdict::Goto(names::REJECT.into())),
        );
    }
}

/// The external chain: with externalTrafficPolicy Local, pods and the node follow the
/// internal policy and others reach only local endpoints; else masquerade and go to `all`.
fn external_chain(
    part: &mut Part,
    n: &names::PortNames,
    m: &Model,
    fam: IpFamily,
    cluster_target: Option<&str>,
    lb_local: Option<&str>,
    all: &str,
) {
    let mut x = Chain::regular(&n.external);
    if m.external_local {
        // Pods and the node itself follow the internal policy (every endpoint, or this
        // node's with iTP=Local); others reach only this node's, with their source kept.
        let internal = match cluster_target {
            Some(lb) => goto(lb),
            None => Stmt::Verdict(Verdict::Drop),
        };
        x.push(Rule::new(vec![
            Stmt::in_set(vec![Field::saddr(fam)], cluster_cidrs(fam)),
            internal.clone(),
        ]));
        let host = Stmt::matches(Field::FibSaddrType, Value::AddrType(AddrType::Local));
        x.push(Rule::new(vec![host.clone(), jump(names::MARK_MASQ)]));
        x.push(Rule::new(vec![host, internal]));
        match lb_local {
            Some(local) => x.push(Rule::new(vec![goto(local)])),
            None => x.push(Rule::new(vec![Stmt::Verdict(Verdict::Drop)])),
        };
    } else {
        x.push(Rule::new(vec![jump(names::MARK_MASQ)]));
        x.push(Rule::new(vec![goto(all)]));
    }
    part.add_chain(x);
}

/// Where a LoadBalancer IP goes: straight to the external chain, or with
/// loadBalancerSourceRanges through a source filter that drops other sources.
fn lb_source_filter(
    part: &mut Part,
    n: &names::PortNames,
    m: &Model,
    fam: IpFamily,
    ext: &Verdict,
) -> Verdict {
    let ranges: Vec<ElemKey> = m
        .lb_source_ranges
        .iter()
        .filter(|r| IpFamily::of(r.addr()) == fam)
        .map(|r| vec![KeyPart::Prefix(*r)])
        .collect();
    if m.lb_source_ranges.is_empty() {
        ext.clone()
    } else {
        // loadBalancerSourceRanges: other sources are dropped (for the LB IPs only).
        let mut f = Chain::regular(&n.source_filter);
        if !ranges.is_empty() {
            f.push(Rule::new(vec![
                Stmt::Match(Match {
                    key: vec![Field::saddr(fam)],
                    op: MatchOp::InAnon(ranges),
                }),
                goto(&n.external),
            ]));
        }
        f.push(Rule::new(vec![Stmt::Verdict(Verdict::Drop)]));
        part.add_chain(f);
        Verdict::Goto(n.source_filter.clone())
    }
}

fn cluster_cidrs(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => base_sets::CLUSTER_V4,
        IpFamily::V6 => base_sets::CLUSTER_V6,
    }
}

fn port_label(p: &Port) -> String {
    if p.name.is_empty() {
        p.port.to_string()
    } else {
        p.name.clone()
    }
}

/// A load-balancing chain over `backends`: session affinity first (a client seen within
/// the timeout goes back to its endpoint), then `numgen random mod N vmap`.
fn balancer(
    part: &mut Part,
    n: &names::PortNames,
    name: &str,
    m: &Model,
    backends: &[Backend],
    fam: IpFamily,
    p: &Port,
) {
    let mut c = Chain::regular(name);
    let mut arms = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        let ep = n.endpoint(b);
        if !part.chains.contains_key(&ep) {
            endpoint_chain(part, n, &ep, m, b, fam, p);
        }
        if m.affinity.is_some() {
            c.push(Rule::new(vec![
                Stmt::in_set(vec![Field::saddr(fam)], n.affinity(b)),
                goto(&ep),
            ]));
        }
        arms.push((
            vec![KeyPart::Value(Value::Integer(i as u32))],
            Verdict::Goto(ep),
        ));
    }
    c.push(Rule::new(vec![Stmt::Vmap {
        key: vec![Field::NumgenRandom(backends.len() as u32)],
        map: MapRef::Anon(arms),
    }]));
    part.add_chain(c);
}

/// DNAT to one endpoint: hairpin traffic (the endpoint reaching itself) is masqueraded,
/// and the client is remembered for session affinity.
fn endpoint_chain(
    part: &mut Part,
    n: &names::PortNames,
    name: &str,
    m: &Model,
    b: &Backend,
    fam: IpFamily,
    p: &Port,
) {
    let mut c = Chain::regular(name);
    c.push(Rule::new(vec![
        Stmt::matches(Field::saddr(fam), Value::ip(b.ip)),
        jump(names::MARK_MASQ),
    ]));
    if let Some(timeout) = m.affinity {
        let set = n.affinity(b);
        let key_type = DataType::addr(fam);
        part.add_set(
            Set::new(&set, vec![key_type], SetKind::Set)
                .with_flags(SetFlags {
                    timeout: true,
                    dynamic: true,
                    ..Default::default()
                })
                .with_timeout(timeout),
        );
        c.push(Rule::new(vec![Stmt::SetUpdate {
            set,
            key: vec![Field::saddr(fam)],
            timeout: None,
        }]));
    }
    c.push(Rule::new(vec![
        Stmt::matches(Field::L4Proto, Value::Proto(p.proto)),
        Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family: fam,
            addr: NatAddr::Fixed(b.ip, Some(b.port)),
        }),
    ]));
    part.add_chain(c);
}
