//! The question `agent explain` asks: the packet and the facts the command line gives,
//! checked into a [`Query`]; and the same as a URL query string, for `--live` (the admin
//! endpoint `/explain` answers it).

use super::packet::{Packet, PacketError, parse_ct_state, parse_proto};
use super::{Query, Topology};
use std::net::IpAddr;

/// The packet and node facts as the command line gives them.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub proto: String,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    pub ct_state: Option<String>,
    pub bridged: bool,
    pub br_netfilter: bool,
    /// Addresses of this node besides its Node object's (for `fib daddr type local`).
    pub local_addrs: Vec<IpAddr>,
    /// `--trace`: also trace real packets like this one in the kernel (live only).
    pub trace: Option<TraceLimits>,
}

/// How long a trace listens and how many packets it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceLimits {
    pub seconds: u64,
    pub packets: usize,
}

impl TraceLimits {
    /// The admin server ends a connection after 60 s: a trace ends well before.
    pub const MAX_SECONDS: u64 = 30;
    /// Enough to see a retransmission or a few backends; bounded so that a broad match on
    /// a busy node stays a few hundred events.
    pub const MAX_PACKETS: usize = 20;

    pub fn new(seconds: u64, packets: usize) -> Result<TraceLimits, ExplainError> {
        if !(1..=Self::MAX_SECONDS).contains(&seconds) {
            return Err(ExplainError::Param(
                "trace".into(),
                format!("{seconds} s: expected 1 to {}", Self::MAX_SECONDS),
            ));
        }
        if !(1..=Self::MAX_PACKETS).contains(&packets) {
            return Err(ExplainError::Param(
                "trace-packets".into(),
                format!("{packets}: expected 1 to {}", Self::MAX_PACKETS),
            ));
        }
        Ok(TraceLimits { seconds, packets })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    Packet(#[from] PacketError),
    #[error("--{0} is required")]
    Missing(&'static str),
    #[error("--br-netfilter needs --bridged")]
    BrNetfilterWithoutBridge,
    #[error("--bridged: this node has no table bridge nodeplane")]
    NoBridgeTable,
    #[error("query parameter {0:?}: {1}")]
    Param(String, String),
}

impl Request {
    /// The query this request asks, checked.
    pub fn query(&self) -> Result<Query, ExplainError> {
        let src = self.src.ok_or(ExplainError::Missing("src"))?;
        let dst = self.dst.ok_or(ExplainError::Missing("dst"))?;
        let proto = parse_proto(&self.proto)?;
        let mut packet = Packet::new(src, dst, proto, self.sport, self.dport)?;
        packet.iif = self.iif.clone();
        packet.oif = self.oif.clone();
        if let Some(s) = &self.ct_state {
            packet.ct_state = parse_ct_state(s)?;
        }
        let topology = match (self.bridged, self.br_netfilter) {
            (false, true) => return Err(ExplainError::BrNetfilterWithoutBridge),
            (false, false) => Topology::Routed,
            (true, br_netfilter) => Topology::Bridged { br_netfilter },
        };
        Ok(Query { packet, topology })
    }
}

/// `application/x-www-form-urlencoded` escaping of one value.
fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Request {
    /// The request as a query string (`src=...&dst=...`).
    pub fn to_query_string(&self) -> String {
        let mut pairs: Vec<(&str, String)> = vec![("proto", self.proto.clone())];
        let mut opt = |k, v: Option<String>| pairs.extend(v.map(|v| (k, v)));
        opt("src", self.src.map(|a| a.to_string()));
        opt("dst", self.dst.map(|a| a.to_string()));
        opt("sport", self.sport.map(|p| p.to_string()));
        opt("dport", self.dport.map(|p| p.to_string()));
        opt("iif", self.iif.clone());
        opt("oif", self.oif.clone());
        opt("ct-state", self.ct_state.clone());
        opt("bridged", self.bridged.then(|| "1".into()));
        opt("br-netfilter", self.br_netfilter.then(|| "1".into()));
        opt("trace", self.trace.map(|t| t.seconds.to_string()));
        opt("trace-packets", self.trace.map(|t| t.packets.to_string()));
        pairs.extend(
            self.local_addrs
                .iter()
                .map(|a| ("local-addr", a.to_string())),
        );
        let pairs: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", escape(v)))
            .collect();
        pairs.join("&")
    }

    /// Parses [`Request::to_query_string`]'s form; an unknown or bad parameter is an error
    /// naming it.
    pub fn from_query_string(q: &str) -> Result<Request, ExplainError> {
        let mut req = Request {
            proto: "tcp".into(),
            ..Default::default()
        };
        let mut trace = (None, None);
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |e: String| ExplainError::Param(k.to_string(), e);
            let v = crate::text::form_decode(v).map_err(bad)?;
            let ip = |v: &str| v.parse::<IpAddr>().map_err(|e| bad(e.to_string()));
            let port = |v: &str| v.parse::<u16>().map_err(|e| bad(e.to_string()));
            match k {
                "src" => req.src = Some(ip(&v)?),
                "dst" => req.dst = Some(ip(&v)?),
                "proto" => req.proto = v,
                "sport" => req.sport = Some(port(&v)?),
                "dport" => req.dport = Some(port(&v)?),
                "iif" => req.iif = Some(v),
                "oif" => req.oif = Some(v),
                "ct-state" => req.ct_state = Some(v),
                "bridged" => req.bridged = v == "1",
                "br-netfilter" => req.br_netfilter = v == "1",
                "local-addr" => req.local_addrs.push(ip(&v)?),
                "trace" => trace.0 = Some(v.parse::<u64>().map_err(|e| bad(e.to_string()))?),
                "trace-packets" => {
                    trace.1 = Some(v.parse::<usize>().map_err(|e| bad(e.to_string()))?)
                }
                _ => return Err(bad("unknown parameter".into())),
            }
        }
        req.trace = match trace {
            (Some(seconds), packets) => Some(TraceLimits::new(seconds, packets.unwrap_or(1))?),
            (None, Some(_)) => {
                return Err(ExplainError::Param(
                    "trace-packets".into(),
                    "needs trace".into(),
                ));
            }
            (None, None) => None,
        };
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_the_query_string() {
        let req = Request {
            src: Some("10.128.0.11".parse().unwrap()),
            dst: Some("fd00::1".parse().unwrap()),
            proto: "udp".into(),
            dport: Some(53),
            iif: Some("we&ird=\"if\"".into()),
            bridged: true,
            local_addrs: vec!["192.168.1.1".parse().unwrap()],
            trace: Some(TraceLimits::new(5, 3).unwrap()),
            ..Default::default()
        };
        let back = Request::from_query_string(&req.to_query_string()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{req:?}"));
        let err = Request::from_query_string("dport=70000")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"dport\""), "{err}");
        assert!(Request::from_query_string("x=1").is_err());
    }

    #[test]
    fn a_trace_is_bounded_in_time_and_packets() {
        let req = Request::from_query_string("src=10.0.0.1&dst=10.0.0.2&trace=5").unwrap();
        assert_eq!(
            req.trace,
            Some(TraceLimits {
                seconds: 5,
                packets: 1
            })
        );
        for (q, param) in [
            ("trace=0", "\"trace\""),
            ("trace=31", "\"trace\""),
            ("trace=5&trace-packets=21", "\"trace-packets\""),
            ("trace-packets=2", "\"trace-packets\""),
        ] {
            let err = Request::from_query_string(q).unwrap_err().to_string();
            assert!(err.contains(param), "{q}: {err}");
        }
    }
}
