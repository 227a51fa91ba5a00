//! Where NodePorts are served: kube-proxy's `--nodeport-addresses`. The NodePort lookups in
//! `svc-dispatch` and `svc-check` are limited to local destinations inside
//! `svc-nodeport-addrs-v4`/`-v6`: the node's primary addresses by default, else the given
//! CIDRs (a family with none listed gets every address of the family, as in kube-proxy).

use crate::config::NodePortAddresses;
use crate::nft::ir::*;
use ipnet::IpNet;
use std::net::IpAddr;

pub const ADDRS_V4: &str = "svc-nodeport-addrs-v4";
pub const ADDRS_V6: &str = "svc-nodeport-addrs-v6";

/// The part holding the address sets' elements (the sets themselves are static).
pub const PART: &str = "svc-nodeport-addrs";

/// Declares the two (interval) address sets.
pub fn add_sets(t: &mut Table) {
    let interval = SetFlags {
        interval: true,
        ..Default::default()
    };
    for (name, addr) in [
        (ADDRS_V4, DataType::Ipv4Addr),
        (ADDRS_V6, DataType::Ipv6Addr),
    ] {
        t.add_set(Set::new(name, vec![addr], SetKind::Set).with_flags(interval));
    }
}

/// One rule per family: a local destination in the family's address set is looked up in
/// the NodePort verdict map `map`.
pub fn lookups(map: &str) -> Vec<Rule> {
    let key = vec![Field::NfProto, Field::L4Proto, Field::ThDport];
    [(Field::Ip4Daddr, ADDRS_V4), (Field::Ip6Daddr, ADDRS_V6)]
        .into_iter()
        .map(|(daddr, set)| {
            Rule::new(vec![
                Stmt::in_set(vec![daddr], set),
                Stmt::matches(Field::FibDaddrType, Value::AddrType(AddrType::Local)),
                Stmt::vmap(key.clone(), map),
            ])
        })
        .collect()
}

/// The addresses NodePorts are served on, as set elements.
pub fn addresses_part(setting: &NodePortAddresses, node_primary: &[IpAddr]) -> Part {
    let nets: Vec<IpNet> = match setting {
        NodePortAddresses::Primary => node_primary.iter().map(|ip| IpNet::from(*ip)).collect(),
        NodePortAddresses::Cidrs(cidrs) => {
            let mut nets = cidrs.clone();
            for (v4, all) in [(true, "0.0.0.0/0"), (false, "::/0")] {
                if !cidrs.iter().any(|n| n.addr().is_ipv4() == v4) {
                    nets.push(all.parse().expect("valid"));
                }
            }
            nets
        }
    };
    let mut part = Part::default();
    // Interval sets reject overlapping elements: keep only the outermost prefixes.
    for net in IpNet::aggregate(&nets) {
        let set = if net.addr().is_ipv4() {
            ADDRS_V4
        } else {
            ADDRS_V6
        };
        part.add_element(set, vec![KeyPart::Prefix(net)]);
    }
    part
}
