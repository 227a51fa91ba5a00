//! IR pieces that the renderer's golden test, the kernel backend's fixtures and the diff
//! tests build alike.

use std::net::IpAddr;

use crate::nft::{DataType, ElemData, IpFamily, Set, SetFlags, SetKind, Value, Verdict};

/// An interval set or map whose elements carry counters (EgressFirewall's rule maps).
pub const COUNTED_INTERVAL: SetFlags = SetFlags {
    interval: true,
    timeout: false,
    dynamic: false,
    counter: true,
};

/// Map `name` from addresses to addresses of the same family holding `from` to `to` (the
/// shape of the EgressIP SNAT maps).
pub fn address_map(name: &str, from: &str, to: &str) -> Set {
    let [from, to]: [IpAddr; 2] = [from, to].map(|a| a.parse().expect("an IP address"));
    let addr = DataType::addr(IpFamily::of(from));
    let mut map = Set::new(name, vec![addr], SetKind::Map(vec![addr]));
    map.insert_mapping(
        vec![Value::ip(from).into()],
        ElemData::Values(vec![Value::ip(to)]),
    );
    map
}

/// Verdict map `name` keyed by IPv4 address, protocol and port (the shape of the services'
/// dispatch maps), holding `(address, protocol, port, verdict)` for each of `entries`.
pub fn service_vmap(name: &str, entries: &[(&str, u8, u16, Verdict)]) -> Set {
    let key = vec![
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
    ];
    let mut map = Set::new(name, key, SetKind::VerdictMap);
    for (addr, proto, port, verdict) in entries {
        let addr: IpAddr = addr.parse().expect("an IPv4 address");
        map.insert_mapping(
            vec![
                Value::ip(addr).into(),
                Value::Proto(*proto).into(),
                Value::Port(*port).into(),
            ],
            ElemData::Verdict(verdict.clone()),
        );
    }
    map
}
