//! Contested frontends: the frontends a Service asks for, which Service owns a ClusterIP,
//! an externalIP/LB IP port or a NodePort that several ask for (the older one, except that
//! an address that is a ClusterIP is nobody's externalIP), and a service's part without the
//! frontends it lost, with the message that says why.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Entry, maps, model, names};
use crate::api::Service;
use crate::nft::ir::*;
use crate::snapshot::ObjectKey;

/// A frontend, as far as deciding which service owns it goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Claim {
    /// A ClusterIP: the whole address, every port, and it beats any externalIP or LB IP.
    Cluster(IpAddr),
    /// An externalIP or LoadBalancer IP on one protocol and port.
    External(IpAddr, u8, u16),
    /// A NodePort (both families).
    NodePort(u8, u16),
}

/// Who wins a contested frontend: the older Service (`creationTimestamp`; objects without
/// one after all that have one), then namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Rank {
    undated: bool,
    created: Option<Time>,
    pub(super) key: ObjectKey,
}

impl Rank {
    pub(super) fn of(key: &ObjectKey, svc: &Service) -> Rank {
        let created = svc.metadata.creation_timestamp.clone();
        Rank {
            undated: created.is_none(),
            created,
            key: key.clone(),
        }
    }
}

/// The service owning `c`: the oldest asking, except that no externalIP or LB IP is
/// anyone's while the address is a ClusterIP.
pub(super) fn winner<'a>(
    claims: &'a imbl::OrdMap<Claim, Vec<Rank>>,
    c: &Claim,
) -> Option<&'a Rank> {
    if let Claim::External(ip, ..) = c
        && claims.contains_key(&Claim::Cluster(*ip))
    {
        return None;
    }
    claims.get(c).and_then(|r| r.first())
}

/// The externalIP/LB IP claims on `ip`.
pub(super) fn externals_on(
    claims: &imbl::OrdMap<Claim, Vec<Rank>>,
    ip: IpAddr,
) -> impl Iterator<Item = (&Claim, &Vec<Rank>)> {
    claims.range(Claim::External(ip, 0, 0)..=Claim::External(ip, u8::MAX, u16::MAX))
}

/// Records the owner of `c` (and, for a ClusterIP, of the externalIPs on its address) before
/// the first change to it.
pub(super) fn note(
    claims: &imbl::OrdMap<Claim, Vec<Rank>>,
    before: &mut BTreeMap<Claim, Option<Rank>>,
    c: &Claim,
) {
    if before.contains_key(c) {
        return;
    }
    before.insert(c.clone(), winner(claims, c).cloned());
    if let Claim::Cluster(ip) = c {
        for (x, _) in externals_on(claims, *ip) {
            before
                .entry(x.clone())
                .or_insert_with(|| winner(claims, x).cloned());
        }
    }
}

/// `e`'s part without the frontends it does not own, and its error: its own refusals, then
/// one line per frontend lost (with the field it came from and the owner).
pub(super) fn settle_claims(
    claims: &imbl::OrdMap<Claim, Vec<Rank>>,
    e: &Entry,
) -> (Option<Arc<Part>>, Option<String>) {
    let mut messages = e.refused.clone();
    let mut lost = Vec::new();
    for (c, field) in &e.claims {
        let owner = winner(claims, c);
        if owner == Some(&e.rank) {
            continue;
        }
        lost.push(c);
        let cluster_owner = |ip: &IpAddr| {
            let r = winner(claims, &Claim::Cluster(*ip)).map(|r| &r.key);
            r.map_or_else(String::new, ToString::to_string)
        };
        let by = owner.map_or_else(String::new, |r| r.key.to_string());
        let msg = match c {
            Claim::Cluster(ip) => {
                format!("{field}: {ip} is already the ClusterIP of Service {by}, created earlier")
            }
            Claim::External(ip, ..) if owner.is_none() => {
                format!(
                    "{field}: {ip} is the ClusterIP of Service {}",
                    cluster_owner(ip)
                )
            }
            Claim::External(ip, proto, port) => format!(
                "{field}: {ip} port {port}/{} is already used by Service {by}, created earlier",
                proto_name(*proto)
            ),
            Claim::NodePort(proto, port) => format!(
                "{field}: {port}/{} is already used by Service {by}, created earlier",
                proto_name(*proto)
            ),
        };
        if !messages.contains(&msg) {
            messages.push(msg);
        }
    }
    let error = (!messages.is_empty()).then(|| messages.join("; "));
    if lost.is_empty() {
        return (e.want.clone(), error);
    }
    let part = e.want.as_ref().map(|want| {
        let mut part = (**want).clone();
        for (set, elements) in part.elements.iter_mut() {
            elements.retain(|k, _| !lost.iter().any(|c| covers(c, set, k)));
        }
        Arc::new(part)
    });
    (part, error)
}

/// Whether the element `key` of the shared set `set` belongs to the frontend `c`.
pub(super) fn covers(c: &Claim, set: &str, key: &ElemKey) -> bool {
    if let Some((frontend_set, frontend)) = maps::frontend_of(set, key) {
        return covers(c, &frontend_set, &frontend);
    }
    let addr_set = |ip: IpAddr| {
        set == names::dispatch(ip)
            || set == names::no_endpoints(IpFamily::of(ip))
            || set == names::cluster_ips(ip)
    };
    match c {
        Claim::Cluster(ip) => addr_set(*ip) && key.first() == Some(&Value::ip(*ip).into()),
        Claim::External(ip, proto, port) => {
            addr_set(*ip) && *key == maps::frontend_key(*ip, *proto, *port)
        }
        Claim::NodePort(proto, port) => {
            (set == names::NODEPORTS || set == names::NOEP_NODEPORTS)
                && key.get(1..)
                    == Some(&[Value::Proto(*proto).into(), Value::Port(*port).into()][..])
        }
    }
}

pub(super) fn proto_name(p: u8) -> &'static str {
    match p {
        proto::TCP => "TCP",
        proto::UDP => "UDP",
        proto::SCTP => "SCTP",
        _ => "?",
    }
}

/// The frontends a service asks for (ClusterIPs, external and LB address ports, NodePorts),
/// each with the field that names it, once each.
pub(super) fn claims_of(model: &model::Model) -> Vec<(Claim, String)> {
    let mut claims = Vec::new();
    let field = |ip: &IpAddr| model.fields.get(ip).cloned().unwrap_or_default();
    for ip in &model.cluster_ips {
        claims.push((Claim::Cluster(*ip), field(ip)));
    }
    for ip in model.external_ips.iter().chain(&model.lb_ips) {
        for p in &model.ports {
            claims.push((Claim::External(*ip, p.proto, p.port), field(ip)));
        }
    }
    for (i, p) in model.ports.iter().enumerate() {
        if let Some(np) = p.node_port {
            let c = Claim::NodePort(p.proto, np);
            claims.push((c, format!("spec.ports[{i}].nodePort")));
        }
    }
    claims.sort();
    claims.dedup_by(|a, b| a.0 == b.0);
    claims
}
