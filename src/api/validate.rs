//! The validation error type and the value parsers shared by the CRD validators.
//!
//! Every CRD validator turns a raw object into a parsed form (`ValidatedFirewall`, ...) or the
//! first problem found, reported as `Kind namespace/name: field.path: reason` so that the same
//! message can go to a log line, a CLI and the object's `status`.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use thiserror::Error;

use super::selector::{Selector, SelectorError, SelectorReason};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{kind} {object}: {field}: {reason}")]
pub struct ValidationError {
    pub kind: &'static str,
    /// `namespace/name` for namespaced kinds, `name` for cluster-scoped ones.
    pub object: String,
    /// Path of the offending field, e.g. `spec.egress[3].to.cidrSelector`.
    pub field: String,
    pub reason: Invalid,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Invalid {
    #[error("must be set")]
    Missing,
    #[error("must not be empty")]
    Empty,
    #[error("must be \"default\" (one object per namespace), got {0:?}")]
    NotDefault(String),
    #[error("has {count} rules, at most {max} are allowed")]
    TooManyRules { count: usize, max: usize },
    #[error("must be \"Allow\" or \"Deny\", got {0:?}")]
    RuleType(String),
    #[error("exactly one of cidrSelector, dnsName, nodeSelector must be set, found {0}")]
    Destination(String),
    #[error("invalid CIDR {0:?}")]
    Cidr(String),
    #[error("invalid CIDR {0:?}: missing /prefix-length")]
    CidrWithoutPrefix(String),
    #[error("invalid protocol {0:?} (want TCP, UDP or SCTP)")]
    Protocol(String),
    #[error("port {0} out of range 1-65535")]
    Port(i32),
    #[error("invalid DNS name {name:?}: {why}")]
    DnsName { name: String, why: &'static str },
    #[error("{0:?} is an IP address, not a DNS name (use cidrSelector)")]
    DnsNameIsIp(String),
    #[error("dscp {0} out of range 0-63")]
    Dscp(i32),
    #[error("invalid IP address {0:?}")]
    IpAddr(String),
    #[error("{0} is not a unicast address")]
    NotUnicast(IpAddr),
    #[error("{0} is an IPv4-mapped IPv6 address, which no packet carries (write {1})")]
    Ipv4Mapped(IpAddr, std::net::Ipv4Addr),
    #[error("{0} is an IPv4-mapped IPv6 CIDR, which no packet matches (write {1})")]
    Ipv4MappedCidr(IpNet, IpNet),
    #[error("duplicate of {0}")]
    Duplicate(String),
    #[error(
        "{0:?} is not an IP address in CloudPrivateIPConfig form (IPv6 fully expanded, '.' for ':')"
    )]
    CloudPrivateIpName(String),
    #[error(transparent)]
    Selector(SelectorReason),
    #[error("invalid policy type {0:?} (want Ingress or Egress)")]
    PolicyType(String),
    #[error("ipBlock cannot be combined with podSelector or namespaceSelector")]
    IpBlockWithSelector,
    #[error("must specify podSelector, namespaceSelector or ipBlock")]
    EmptyPeer,
    #[error("{0} must be strictly inside the cidr {1}")]
    ExceptOutsideCidr(IpNet, IpNet),
    #[error("endPort needs a numeric port")]
    EndPortWithoutPort,
    #[error("endPort {0} is below port {1}")]
    EndPortBelowPort(i32, i32),
    #[error("invalid port name {0:?} (1-15 of a-z, 0-9 and '-', with a letter)")]
    PortName(String),
}

/// Names the object being validated and builds errors for it.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    kind: &'static str,
    object: String,
}

impl Ctx {
    pub(crate) fn namespaced(kind: &'static str, meta: &ObjectMeta) -> Ctx {
        let ns = meta.namespace.as_deref().unwrap_or("<no namespace>");
        let name = meta.name.as_deref().unwrap_or("<no name>");
        Ctx {
            kind,
            object: format!("{ns}/{name}"),
        }
    }

    pub(crate) fn cluster(kind: &'static str, meta: &ObjectMeta) -> Ctx {
        let name = meta.name.as_deref().unwrap_or("<no name>");
        Ctx {
            kind,
            object: name.to_string(),
        }
    }

    pub(crate) fn err(&self, field: impl Into<String>, reason: Invalid) -> ValidationError {
        ValidationError {
            kind: self.kind,
            object: self.object.clone(),
            field: field.into(),
            reason,
        }
    }

    /// Validates `spec.egress`: at most `max` rules, each checked by `rule` with its field
    /// path; the first invalid rule rejects the whole list.
    fn egress_rules<R, V>(
        &self,
        egress: &[R],
        max: usize,
        rule: impl Fn(&Ctx, &str, &R) -> Result<V, ValidationError>,
    ) -> Result<Vec<V>, ValidationError> {
        if egress.len() > max {
            return Err(self.err(
                "spec.egress",
                Invalid::TooManyRules {
                    count: egress.len(),
                    max,
                },
            ));
        }
        egress
            .iter()
            .enumerate()
            .map(|(i, r)| rule(self, &format!("spec.egress[{i}]"), r))
            .collect()
    }

    /// Compiles a selector found at `field`, prefixing selector errors with that path.
    pub(crate) fn selector(
        &self,
        field: &str,
        selector: &LabelSelector,
    ) -> Result<Selector, ValidationError> {
        Selector::parse(selector).map_err(|SelectorError { field: sub, reason }| {
            self.err(format!("{field}.{sub}"), Invalid::Selector(reason))
        })
    }

    /// The namespace and the `default` name that EgressFirewall and EgressQoS require.
    fn default_named_namespace(&self, meta: &ObjectMeta) -> Result<String, ValidationError> {
        match meta.name.as_deref() {
            None => return Err(self.err("metadata.name", Invalid::Missing)),
            Some("default") => {}
            Some(other) => {
                return Err(self.err("metadata.name", Invalid::NotDefault(other.to_string())));
            }
        }
        match meta.namespace.as_deref() {
            None | Some("") => Err(self.err("metadata.namespace", Invalid::Missing)),
            Some(ns) => Ok(ns.to_string()),
        }
    }
}

/// An EgressFirewall or EgressQoS that passed validation: its namespace and its rules, which
/// keep their order (first match wins).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NamespaceRules<R> {
    pub namespace: String,
    pub rules: Vec<R>,
}

impl<R> NamespaceRules<R> {
    /// Validates an EgressFirewall or EgressQoS: named `default`, in a namespace, at most
    /// `max` rules in `spec.egress`, each checked by `rule`; any invalid rule rejects the
    /// whole object (never half-apply it).
    pub(crate) fn validate<S>(
        kind: &'static str,
        meta: &ObjectMeta,
        egress: &[S],
        max: usize,
        rule: impl Fn(&Ctx, &str, &S) -> Result<R, ValidationError>,
    ) -> Result<NamespaceRules<R>, ValidationError> {
        let ctx = Ctx::namespaced(kind, meta);
        let namespace = ctx.default_named_namespace(meta)?;
        let rules = ctx.egress_rules(egress, max, rule)?;
        Ok(NamespaceRules { namespace, rules })
    }
}

wire_named_enum! {
    pub enum Protocol {
        Tcp = "TCP",
        Udp = "UDP",
        Sctp = "SCTP",
    }
}

impl Protocol {
    /// The IP protocol number (IANA): what `meta l4proto` matches.
    pub fn ip_number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Case-insensitive, as OVN-Kubernetes accepts `tcp` as well as `TCP`.
    pub fn parse(s: &str) -> Option<Protocol> {
        Protocol::ALL
            .iter()
            .copied()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
    }
}

/// A validated `{protocol, port}` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortMatch {
    pub protocol: Protocol,
    pub port: u16,
}

impl fmt::Display for PortMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.protocol, self.port)
    }
}

/// Parses a CIDR. Host bits are cleared (`10.0.0.1/24` means `10.0.0.0/24`), matching Go's
/// `net.ParseCIDR` as used by OVN-Kubernetes; a bare address without a prefix is rejected.
///
/// An IPv6 CIDR inside `::ffff:0:0/96` (IPv4-mapped) is rejected rather than applied: IPv4
/// traffic is matched as IPv4, so such a rule would silently never match.
pub fn parse_cidr(s: &str) -> Result<IpNet, Invalid> {
    match s.parse::<IpNet>() {
        Ok(IpNet::V6(net)) if net.prefix_len() >= 96 && net.addr().to_ipv4_mapped().is_some() => {
            let v4 = ipnet::Ipv4Net::new(
                net.addr().to_ipv4_mapped().expect("checked"),
                net.prefix_len() - 96,
            )
            .expect("prefix at most 32");
            Err(Invalid::Ipv4MappedCidr(
                IpNet::V6(net.trunc()),
                IpNet::V4(v4.trunc()),
            ))
        }
        Ok(net) => Ok(net.trunc()),
        Err(_) if s.parse::<IpAddr>().is_ok() => Err(Invalid::CidrWithoutPrefix(s.to_string())),
        Err(_) => Err(Invalid::Cidr(s.to_string())),
    }
}

/// Validates a DNS name (RFC 1123 labels, at most 253 characters) and returns it lowercased,
/// without a trailing dot, so that names compare case-insensitively. A wildcard name is
/// `*.` followed by a valid name (exactly one leading `*` label, as OVN-Kubernetes defines it):
/// it matches names with exactly one more label ([`dns_name_matches`]).
pub fn parse_dns_name(s: &str) -> Result<String, Invalid> {
    let bad = |why| Invalid::DnsName {
        name: s.to_string(),
        why,
    };
    if s.parse::<IpAddr>().is_ok() {
        return Err(Invalid::DnsNameIsIp(s.to_string()));
    }
    let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    if name.is_empty() {
        return Err(bad("empty name"));
    }
    if name.len() > 253 {
        return Err(bad("longer than 253 characters"));
    }
    if let Some(rest) = name.strip_prefix("*.") {
        // Validate the rest so that the error for `*.bad..name` is about the real problem.
        let rest = Some(rest)
            .filter(|r| !r.contains('*'))
            .and_then(|r| parse_dns_name(r).ok())
            .ok_or_else(|| bad("invalid name after the wildcard label"))?;
        return Ok(format!("*.{rest}"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(bad("empty label"));
        }
        if label.len() > 63 {
            return Err(bad("label longer than 63 characters"));
        }
        if label.contains('*') {
            return Err(bad("'*' is only allowed as the whole first label"));
        }
        if !label
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
        {
            return Err(bad("labels may contain only letters, digits and '-'"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(bad("labels must not start or end with '-'"));
        }
    }
    if !name.contains('.') && name.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad("all-numeric name"));
    }
    Ok(name)
}

/// Whether `name` (lowercase, no trailing dot) is matched by the validated `pattern`: equal to
/// an exact name, or exactly one label in front of a wildcard's suffix (`a.example.com`
/// matches `*.example.com`; `example.com` and `a.b.example.com` do not).
pub fn dns_name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        None => pattern == name,
        Some(suffix) => name
            .strip_suffix(suffix)
            .and_then(|head| head.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
    }
}

/// Parses an egress IP: a unicast IPv4 or IPv6 address (not IPv4-mapped IPv6, which would be
/// added to an interface and SNAT to an address no IPv4 packet can carry).
pub fn parse_unicast_ip(s: &str) -> Result<IpAddr, Invalid> {
    let ip: IpAddr = s.parse().map_err(|_| Invalid::IpAddr(s.to_string()))?;
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = v6.to_ipv4_mapped()
    {
        return Err(Invalid::Ipv4Mapped(ip, v4));
    }
    if ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip == IpAddr::from([255, 255, 255, 255])
    {
        return Err(Invalid::NotUnicast(ip));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        for (input, want) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3/16", "10.1.0.0/16"),
            ("2001:db8::1/64", "2001:db8::/64"),
            ("0.0.0.0/0", "0.0.0.0/0"),
        ] {
            assert_eq!(parse_cidr(input).unwrap().to_string(), want);
        }
        for (input, want) in [
            ("10.0.0.0/33", r#"invalid CIDR "10.0.0.0/33""#),
            (
                "10.0.0.1",
                r#"invalid CIDR "10.0.0.1": missing /prefix-length"#,
            ),
        ] {
            assert_eq!(parse_cidr(input).unwrap_err().to_string(), want);
        }
        assert!(parse_cidr("").is_err());
        assert!(parse_cidr("example.com/24").is_err());
    }

    #[test]
    fn wildcards_match_exactly_one_more_label() {
        let m = dns_name_matches;
        assert!(m("*.example.com", "a.example.com"));
        assert!(!m("*.example.com", "example.com"));
        assert!(!m("*.example.com", "a.b.example.com"));
        assert!(!m("*.example.com", "aexample.com"));
        assert!(!m("*.example.com", ".example.com"));
        assert!(m("api.example.com", "api.example.com"));
        assert!(!m("api.example.com", "x.api.example.com"));
    }

    #[test]
    fn dns_names() {
        assert_eq!(
            parse_dns_name("WWW.Example.COM.").unwrap(),
            "www.example.com"
        );
        assert_eq!(parse_dns_name("a-b.c0").unwrap(), "a-b.c0");
        assert_eq!(parse_dns_name("localhost").unwrap(), "localhost");
        assert_eq!(parse_dns_name("*.Example.COM.").unwrap(), "*.example.com");
        #[rustfmt::skip]
        let bad = [
            ("", r#"invalid DNS name "": empty name"#),
            ("a..b", r#"invalid DNS name "a..b": empty label"#),
            ("-a.com", r#"invalid DNS name "-a.com": labels must not start or end with '-'"#),
            ("a_b.com", r#"invalid DNS name "a_b.com": labels may contain only letters, digits and '-'"#),
            ("a.*.com", r#"invalid DNS name "a.*.com": '*' is only allowed as the whole first label"#),
            ("**.example.com", r#"invalid DNS name "**.example.com": '*' is only allowed as the whole first label"#),
            ("*", r#"invalid DNS name "*": '*' is only allowed as the whole first label"#),
            ("*.*.example.com", r#"invalid DNS name "*.*.example.com": invalid name after the wildcard label"#),
            ("*.a..b", r#"invalid DNS name "*.a..b": invalid name after the wildcard label"#),
            ("1.2.3.4", r#""1.2.3.4" is an IP address, not a DNS name (use cidrSelector)"#),
            ("::1", r#""::1" is an IP address, not a DNS name (use cidrSelector)"#),
            ("12345", r#"invalid DNS name "12345": all-numeric name"#),
        ];
        for (input, want) in bad {
            assert_eq!(
                parse_dns_name(input).unwrap_err().to_string(),
                want,
                "{input}"
            );
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(
            matches!(parse_dns_name(&format!("*.{long_label}")), Err(Invalid::DnsName { why, .. }) if why.contains("wildcard"))
        );
        assert!(
            matches!(parse_dns_name(&long_label), Err(Invalid::DnsName { why, .. }) if why.contains("63"))
        );
        let long_name = vec!["abcdefghi"; 26].join(".");
        assert!(
            matches!(parse_dns_name(&long_name), Err(Invalid::DnsName { why, .. }) if why.contains("253"))
        );
    }

    #[test]
    fn unicast_ips() {
        for ip in ["192.168.50.100", "fd00::10"] {
            assert_eq!(parse_unicast_ip(ip).unwrap().to_string(), ip);
        }
        for (input, want) in [
            ("192.168.50", r#"invalid IP address "192.168.50""#),
            ("0.0.0.0", "0.0.0.0 is not a unicast address"),
        ] {
            assert_eq!(parse_unicast_ip(input).unwrap_err().to_string(), want);
        }
        assert!(parse_unicast_ip("127.0.0.1").is_err());
        assert!(parse_unicast_ip("224.0.0.1").is_err());
        assert!(parse_unicast_ip("ff02::1").is_err());
    }

    #[test]
    fn protocols() {
        assert_eq!(Protocol::parse("tcp"), Some(Protocol::Tcp));
        assert_eq!(Protocol::parse("Udp"), Some(Protocol::Udp));
        assert_eq!(Protocol::parse("SCTP"), Some(Protocol::Sctp));
        assert_eq!(Protocol::parse("icmp"), None);
        assert_eq!(
            PortMatch {
                protocol: Protocol::Tcp,
                port: 443
            }
            .to_string(),
            "TCP/443"
        );
    }
}
