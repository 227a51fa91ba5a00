//! One Service -> map elements only (the layout for every service without session
//! affinity or loadBalancerSourceRanges): each frontend gets a dispatch element that
//! `goto`s a shared [`Pool`] chain, and one backends-map element per numgen bucket. An
//! endpoint change rewrites elements of this service; no chain is touched unless the
//! number of backends changes, and then only the dispatch elements' target does.

use super::model::{Backend, Model, PortBackends};
use super::names::{self, BackendsMap, Frontend};
use super::pools::{Pool, PoolKind};
use crate::nft::ir::*;
use std::collections::BTreeSet;
use std::net::IpAddr;

/// A service's share of the table and the shared objects it needs.
#[derive(Debug, Default)]
pub struct Planned {
    pub part: Part,
    /// Pool chains the dispatch elements go to.
    pub pools: BTreeSet<Pool>,
    /// This node's endpoint addresses (hairpin masquerade).
    pub hairpin: BTreeSet<IpAddr>,
}

pub fn service_part(model: &Model, ports: &[PortBackends]) -> Planned {
    let mut out = Planned::default();
    for pb in ports {
        port_elements(&mut out, model, pb);
    }
    out.part.shrink_to_fit();
    out
}

fn port_elements(out: &mut Planned, m: &Model, pb: &PortBackends) {
    let (p, fam) = (pb.port, pb.family);
    out.hairpin
        .extend(pb.all.iter().filter(|b| b.local).map(|b| b.ip));

    // Cluster traffic: clusterIPs.
    let cluster = if m.internal_local { &pb.local } else { &pb.all };
    for ip in m.cluster_ips.iter().filter(|ip| IpFamily::of(**ip) == fam) {
        out.part.add_element(
            &names::cluster_ips(*ip),
            vec![KeyPart::Value(Value::ip(*ip))],
        );
        let key = frontend_key(*ip, p.proto, p.port);
        if !cluster.is_empty() {
            let pool = PoolKind::Cluster {
                n: cluster.len() as u32,
            };
            balance(out, (*ip, p.proto, p.port), pool, cluster, &[]);
        } else if m.internal_local && !pb.all.is_empty() {
            // iTP=Local without a local endpoint: dropped, as kube-proxy does.
            out.part
                .add_mapping(&names::dispatch(*ip), key, ElemData::Verdict(Verdict::Drop));
        }
        // No endpoint at all: not dispatched; the filter check rejects it.
    }

    // External traffic: externalIPs, LoadBalancer IPs, NodePort.
    let mut externals: Vec<IpAddr> = m.external_ips.clone();
    externals.extend(m.lb_ips.iter().filter(|ip| !m.external_ips.contains(ip)));
    externals.retain(|ip| IpFamily::of(*ip) == fam);
    if pb.all.is_empty() {
        // No endpoint: the filter check rejects these.
        let reject = ElemData::Verdict(Verdict::Goto(names::REJECT.into()));
        for ip in &externals {
            out.part.add_mapping(
                names::no_endpoints(fam),
                frontend_key(*ip, p.proto, p.port),
                reject.clone(),
            );
        }
        if let Some(np) = p.node_port {
            let key = nodeport_key(fam, p.proto, np);
            out.part.add_mapping(names::NOEP_NODEPORTS, key, reject);
        }
        return;
    }
    let n = pb.all.len() as u32;
    let local = pb.local.len() as u32;
    // The backends the pool reads: all and node-local ones.
    let (pool, all, local): (PoolKind, &[Backend], &[Backend]) =
        match (m.external_local, m.internal_local) {
            (true, true) => (PoolKind::BothLocal { local }, &[], &pb.local),
            (true, false) => (PoolKind::ExternalLocal { n, local }, &pb.all, &pb.local),
            (false, _) => (PoolKind::External { n }, &pb.all, &[]),
        };
    for ip in &externals {
        balance(out, (*ip, p.proto, p.port), pool, all, local);
    }
    if let Some(np) = p.node_port {
        let backends_key = vec![Value::Proto(p.proto).into(), Value::Port(np).into()];
        let pool = Pool {
            family: fam,
            frontend: Frontend::NodePort,
            kind: pool,
            shard: 0,
        };
        out.part.add_mapping(
            names::NODEPORTS,
            nodeport_key(fam, p.proto, np),
            ElemData::Verdict(Verdict::Goto(pool.chain_name())),
        );
        buckets(out, pool, &backends_key, all, false);
        buckets(out, pool, &backends_key, local, true);
        out.pools.insert(pool);
    }
}

/// The dispatch element of an address frontend and its backends-map elements (in the
/// frontend's shard).
fn balance(
    out: &mut Planned,
    (ip, proto, port): (IpAddr, u8, u16),
    kind: PoolKind,
    all: &[Backend],
    local: &[Backend],
) {
    let key = &frontend_key(ip, proto, port);
    let pool = Pool {
        family: IpFamily::of(ip),
        frontend: Frontend::Addr,
        kind,
        shard: names::shard(ip, proto, port),
    };
    out.part.add_mapping(
        &names::dispatch(ip),
        key.clone(),
        ElemData::Verdict(Verdict::Goto(pool.chain_name())),
    );
    buckets(out, pool, key, all, false);
    buckets(out, pool, key, local, true);
    out.pools.insert(pool);
}

/// `frontend . i : backend[i]` for every bucket i, in the pool's map.
fn buckets(out: &mut Planned, pool: Pool, key: &ElemKey, backends: &[Backend], local: bool) {
    if backends.is_empty() {
        return;
    }
    let map = BackendsMap {
        family: pool.family,
        frontend: pool.frontend,
        local,
        shard: pool.shard,
    }
    .name();
    let map = map.as_str();
    for (i, b) in backends.iter().enumerate() {
        // Exactly sized: 100,000 of these keys are held at 10,000 services.
        let mut k = Vec::with_capacity(key.len() + 1);
        k.extend_from_slice(key);
        k.push(Value::Integer(i as u32).into());
        out.part.add_mapping(
            map,
            k,
            ElemData::Values(vec![Value::ip(b.ip), Value::Port(b.port)]),
        );
    }
}

pub fn frontend_key(ip: IpAddr, proto: u8, port: u16) -> ElemKey {
    vec![
        Value::ip(ip).into(),
        Value::Proto(proto).into(),
        Value::Port(port).into(),
    ]
}

pub fn nodeport_key(fam: IpFamily, proto: u8, port: u16) -> ElemKey {
    vec![
        Value::NfProto(fam).into(),
        Value::Proto(proto).into(),
        Value::Port(port).into(),
    ]
}

/// For an element of a backends map: its frontend's dispatch map and key.
pub fn frontend_of(set: &str, key: &ElemKey) -> Option<(String, ElemKey)> {
    let BackendsMap {
        family: fam,
        frontend,
        ..
    } = BackendsMap::parse(set)?;
    match frontend {
        Frontend::Addr => {
            let addr = match key.first()? {
                KeyPart::Value(Value::Ipv4(a)) if fam == IpFamily::V4 => IpAddr::V4(*a),
                KeyPart::Value(Value::Ipv6(a)) if fam == IpFamily::V6 => IpAddr::V6(*a),
                _ => return None,
            };
            Some((names::dispatch(addr), key.get(..3)?.to_vec()))
        }
        Frontend::NodePort => {
            let mut k = vec![Value::NfProto(fam).into()];
            k.extend_from_slice(key.get(..2)?);
            Some((names::NODEPORTS.into(), k))
        }
    }
}
