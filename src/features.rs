//! Feature switches (`--features`, `--disable-features`): which of the agent's features run on
//! this node. A feature that is off has nothing of its own on the node: no chains, sets or
//! maps, no addresses, routes or tunnel, no listeners, no annotations, no watches of its kinds
//! (so the agent can run beside kube-proxy, or beside a CNI that enforces NetworkPolicy).

use std::collections::BTreeSet;
use std::fmt;

use crate::snapshot::Kind;

wire_named_enum! {
    /// One switchable feature, by its user-facing name.
    pub enum Switch {
        EgressFirewall = "egress-firewall",
        EgressQos = "egress-qos",
        /// EgressIP with its assignment and CloudPrivateIPConfig flow.
        EgressIp = "egress-ip",
        /// Service / Endpoints / EndpointSlice load balancing, with kube-proxy's health servers.
        Services = "services",
        NetworkPolicy = "network-policy",
    }
}

impl Switch {
    /// The kinds only this feature reads (Namespaces, Pods and Nodes are everyone's).
    pub fn kinds(self) -> &'static [Kind] {
        match self {
            Switch::EgressFirewall => &[Kind::EgressFirewall],
            Switch::EgressQos => &[Kind::EgressQoS],
            Switch::EgressIp => &[Kind::EgressIP, Kind::CloudPrivateIPConfig],
            Switch::Services => &[Kind::Service, Kind::Endpoints, Kind::EndpointSlice],
            Switch::NetworkPolicy => &[Kind::NetworkPolicy],
        }
    }

    fn parse(name: &str) -> Option<Switch> {
        Switch::ALL.iter().copied().find(|f| f.as_str() == name)
    }
}

/// The features that run on this node (default: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features(BTreeSet<Switch>);

impl Default for Features {
    fn default() -> Self {
        Features(Switch::ALL.iter().copied().collect())
    }
}

impl Features {
    /// `enable` (names or `all`; empty: all) minus `disable`. Names are checked: a typo is an
    /// error naming the valid ones, never a silently disabled feature.
    pub fn select(enable: &[String], disable: &[String]) -> Result<Features, String> {
        let parse = |list: &[String]| -> Result<BTreeSet<Switch>, String> {
            let mut out = BTreeSet::new();
            for name in list.iter().flat_map(|v| v.split(',')).map(str::trim) {
                match name {
                    "" => {}
                    "all" => out.extend(Switch::ALL),
                    _ => {
                        out.insert(Switch::parse(name).ok_or_else(|| {
                            let valid: Vec<&str> = Switch::ALL.iter().map(|f| f.as_str()).collect();
                            format!(
                                "unknown feature {:?} (valid: all, {})",
                                crate::text::one_line(name),
                                valid.join(", ")
                            )
                        })?);
                    }
                }
            }
            Ok(out)
        };
        let mut on = parse(enable)?;
        if on.is_empty() {
            on.extend(Switch::ALL);
        }
        for f in parse(disable)? {
            on.remove(&f);
        }
        Ok(Features(on))
    }

    pub fn only(features: &[Switch]) -> Features {
        Features(features.iter().copied().collect())
    }

    pub fn on(&self, feature: Switch) -> bool {
        self.0.contains(&feature)
    }

    pub fn iter(&self) -> impl Iterator<Item = Switch> + '_ {
        self.0.iter().copied()
    }

    /// The kinds the enabled features read, in [`Kind::ALL`] order.
    pub fn kinds(&self) -> Vec<Kind> {
        let off: BTreeSet<Kind> = Switch::ALL
            .iter()
            .copied()
            .filter(|f| !self.on(*f))
            .flat_map(|f| f.kinds().iter().copied())
            .collect();
        Kind::ALL
            .iter()
            .copied()
            .filter(|k| !off.contains(k))
            .collect()
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Switch::as_str).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn default_is_all_and_lists_and_disables_combine() {
        assert_eq!(Features::select(&[], &[]).unwrap(), Features::default());
        assert_eq!(
            Features::select(&s(&["all"]), &[]).unwrap(),
            Features::default()
        );
        let f = Features::select(&s(&["egress-firewall,egress-qos"]), &[]).unwrap();
        assert_eq!(f.to_string(), "egress-firewall,egress-qos");
        let f = Features::select(&[], &s(&["services", "network-policy"])).unwrap();
        assert!(!f.on(Switch::Services) && !f.on(Switch::NetworkPolicy));
        assert!(f.on(Switch::EgressIp));
        assert!(!f.kinds().contains(&Kind::EndpointSlice));
        assert!(!f.kinds().contains(&Kind::NetworkPolicy));
        assert!(f.kinds().contains(&Kind::Pod) && f.kinds().contains(&Kind::EgressIP));
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_the_valid_ones() {
        let e = Features::select(&s(&["services,egressfirewall"]), &[]).unwrap_err();
        assert!(
            e.contains("\"egressfirewall\"") && e.contains("egress-firewall"),
            "{e}"
        );
        assert!(Features::select(&[], &s(&["nope"])).is_err());
    }
}
