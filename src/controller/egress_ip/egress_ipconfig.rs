//! `cloud.network.openshift.io/egress-ipconfig`: what the cloud lets a node host, written on
//! the Node by the cloud controller. A JSON list with one entry per NIC:
//! `[{"interface":"eni-0a1b","ifaddr":{"ipv4":"10.0.128.0/18"},"capacity":{"ipv4":14,"ipv6":15}}]`
//! (`capacity.ip` is a shared, family-agnostic capacity, as on Azure and GCP). Like
//! OVN-Kubernetes, the assigner reads the first entry: egress IPs go on the node's primary
//! NIC.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Deserialize;

pub const ANNOTATION: &str = "cloud.network.openshift.io/egress-ipconfig";

/// How many egress IPs the node's NIC can take; `None` = no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    pub ipv4: Option<u32>,
    pub ipv6: Option<u32>,
    /// Shared by both families.
    pub ip: Option<u32>,
}

impl Capacity {
    /// Room for one more IP like `ip` on a node hosting `v4` IPv4 and `v6` IPv6 IPs.
    pub fn has_room(&self, v4: usize, v6: usize, ip: IpAddr) -> bool {
        let under = |limit: Option<u32>, n: usize| limit.is_none_or(|l| n < l as usize);
        let family = match ip {
            IpAddr::V4(_) => under(self.ipv4, v4),
            IpAddr::V6(_) => under(self.ipv6, v6),
        };
        family && under(self.ip, v4 + v6)
    }
}

/// The node's cloud NIC: its subnets and capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudNic {
    pub interface: String,
    pub subnets: Vec<IpNet>,
    pub capacity: Capacity,
}

impl CloudNic {
    /// One of the NIC's subnets can hold `ip`.
    pub fn fits(&self, ip: IpAddr) -> bool {
        self.subnets.iter().any(|net| subnet_fits(net, ip))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    interface: String,
    #[serde(default)]
    ifaddr: IfAddr,
    #[serde(default)]
    capacity: RawCapacity,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct IfAddr {
    ipv4: Option<String>,
    ipv6: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCapacity {
    ipv4: Option<u32>,
    ipv6: Option<u32>,
    ip: Option<u32>,
}

/// `net` contains `ip` and `ip` is not its network or (IPv4) broadcast address (the node
/// side refuses those too; /31, /32, /127 and /128 have no such addresses).
pub fn subnet_fits(net: &IpNet, ip: IpAddr) -> bool {
    if !net.contains(&ip) {
        return false;
    }
    let max = match net {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    };
    if net.prefix_len() + 1 >= max {
        return true;
    }
    let broadcast = matches!(net, IpNet::V4(_)) && ip == net.broadcast();
    ip != net.network() && !broadcast
}

/// Parses the annotation's value. Errors name the field (`[0].ifaddr.ipv4`, ...).
pub fn parse(value: &str) -> Result<CloudNic, String> {
    let entries: Vec<Entry> =
        serde_json::from_str(value).map_err(|e| format!("not a JSON list of NICs: {e}"))?;
    let Some(first) = entries.into_iter().next() else {
        return Err("the list is empty".into());
    };
    let mut subnets = Vec::new();
    if let Some(v4) = &first.ifaddr.ipv4 {
        let net: Ipv4Net = v4
            .parse()
            .map_err(|_| format!("[0].ifaddr.ipv4: {v4:?} is not an IPv4 CIDR"))?;
        subnets.push(IpNet::V4(net.trunc()));
    }
    if let Some(v6) = &first.ifaddr.ipv6 {
        let net: Ipv6Net = v6
            .parse()
            .map_err(|_| format!("[0].ifaddr.ipv6: {v6:?} is not an IPv6 CIDR"))?;
        subnets.push(IpNet::V6(net.trunc()));
    }
    if subnets.is_empty() {
        return Err("[0].ifaddr: neither ipv4 nor ipv6 is set".into());
    }
    let c = first.capacity;
    // A family the NIC has a subnet for needs a capacity, its own or the shared one: an
    // unknown capacity is not an unlimited one.
    for (family, own, subnet) in [
        ("ipv4", c.ipv4, first.ifaddr.ipv4.is_some()),
        ("ipv6", c.ipv6, first.ifaddr.ipv6.is_some()),
    ] {
        if subnet && own.is_none() && c.ip.is_none() {
            return Err(format!(
                "[0].capacity: neither {family} nor ip is set for the {family} subnet"
            ));
        }
    }
    Ok(CloudNic {
        interface: first.interface,
        subnets,
        capacity: Capacity {
            ipv4: c.ipv4,
            ipv6: c.ipv6,
            ip: c.ip,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::egress_ip::ip;

    #[test]
    fn parses_aws_and_azure_forms() {
        let aws = parse(
            r#"[{"interface":"eni-0a1b","ifaddr":{"ipv4":"10.0.128.0/18","ipv6":"fd00:1::/64"},
                "capacity":{"ipv4":2,"ipv6":1}}]"#,
        )
        .unwrap();
        assert_eq!(aws.interface, "eni-0a1b");
        assert!(aws.fits(ip("10.0.130.5")) && !aws.fits(ip("10.0.192.5")));
        assert!(aws.fits(ip("fd00:1::5")));
        let c = aws.capacity;
        assert!(c.has_room(1, 0, ip("10.0.130.5")) && !c.has_room(2, 0, ip("10.0.130.5")));
        assert!(c.has_room(2, 0, ip("fd00:1::5")) && !c.has_room(0, 1, ip("fd00:1::5")));

        // Azure: a shared capacity; host bits in ifaddr are dropped.
        let azure =
            parse(r#"[{"interface":"nic0","ifaddr":{"ipv4":"10.0.0.4/24"},"capacity":{"ip":3}}]"#)
                .unwrap();
        assert_eq!(azure.subnets, vec!["10.0.0.0/24".parse::<IpNet>().unwrap()]);
        assert!(azure.capacity.has_room(2, 0, ip("10.0.0.9")));
        assert!(!azure.capacity.has_room(2, 1, ip("10.0.0.9")));
    }

    #[test]
    fn malformed_values_name_the_field() {
        for (value, error) in [
            ("{}", "not a JSON list of NICs"),
            ("[]", "the list is empty"),
            (
                r#"[{"interface":"e","ifaddr":{"ipv4":"10.0.0.0/33"},"capacity":{"ipv4":1}}]"#,
                r#"[0].ifaddr.ipv4: "10.0.0.0/33" is not an IPv4 CIDR"#,
            ),
            (
                r#"[{"interface":"e","ifaddr":{"ipv6":"10.0.0.0/24"},"capacity":{"ipv6":1}}]"#,
                r#"[0].ifaddr.ipv6: "10.0.0.0/24" is not an IPv6 CIDR"#,
            ),
            (
                r#"[{"interface":"e","capacity":{"ip":1}}]"#,
                "[0].ifaddr: neither ipv4 nor ipv6 is set",
            ),
            (
                r#"[{"interface":"e","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ipv6":1}}]"#,
                "[0].capacity: neither ipv4 nor ip is set for the ipv4 subnet",
            ),
            (
                r#"[{"interface":"e","ifaddr":{"ipv4":"10.0.0.0/24"},"capacity":{"ipv4":-1}}]"#,
                "not a JSON list of NICs: invalid value: integer `-1`",
            ),
        ] {
            let e = parse(value).unwrap_err();
            assert!(e.starts_with(error), "{value}: {e}");
        }
    }
}
