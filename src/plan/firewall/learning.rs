//! What the DNS proxy learns, derived from the firewalls in force: for each local pod of a
//! namespace with `dnsName` rules, the names to watch for in the answers it receives and the
//! learned sets their addresses go to. These pods are also the ones whose DNS is steered to
//! the proxy (to the trusted resolvers only); every other pod's DNS never touches the agent.

use super::{FirewallMemory, Names};
use crate::api::egress_firewall::Destination;
use crate::api::validate::dns_name_matches;
use crate::nft::ir::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// One `dnsName` of a namespace: its pattern (exact name or `*.suffix`) and learned sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The namespace whose rule this is (its learned addresses count against its cap).
    pub namespace: Arc<str>,
    pub pattern: String,
    pub set_v4: String,
    pub set_v6: String,
}

impl Target {
    pub fn set(&self, family: IpFamily) -> &str {
        match family {
            IpFamily::V4 => &self.set_v4,
            IpFamily::V6 => &self.set_v6,
        }
    }
}

/// Local pod address -> the targets of its namespace (shared by the namespace's pods), and
/// the resolvers whose answers teach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learning {
    by_pod: BTreeMap<IpAddr, Arc<Vec<Target>>>,
    resolvers: BTreeSet<IpAddr>,
    /// The endpoints of the ClusterIP resolvers (service DNAT picked one before the proxy
    /// sees a query), and their addresses.
    backends: BTreeSet<SocketAddr>,
    backend_ips: BTreeSet<IpAddr>,
}

impl Learning {
    /// The targets whose pattern matches `name`, for answers `pod` receives.
    pub fn matching<'a>(&'a self, pod: IpAddr, name: &'a str) -> impl Iterator<Item = &'a Target> {
        self.by_pod
            .get(&pod)
            .into_iter()
            .flat_map(|t| t.iter())
            .filter(move |t| dns_name_matches(&t.pattern, name))
    }

    /// The namespace of a steered pod.
    pub fn namespace(&self, pod: IpAddr) -> Option<&Arc<str>> {
        self.by_pod.get(&pod)?.first().map(|t| &t.namespace)
    }

    /// The trusted resolvers: the only servers pod DNS is steered to and learned from.
    pub fn resolvers(&self) -> &BTreeSet<IpAddr> {
        &self.resolvers
    }

    /// Whether the proxy may ask `server` (a query's destination after service DNAT) and
    /// learn from its answers: a trusted resolver or an endpoint of one.
    pub fn is_trusted(&self, server: IpAddr) -> bool {
        self.resolvers.contains(&server) || self.backend_ips.contains(&server)
    }

    /// Where a steered query may arrive with the proxy's mark but without its socket (bridged
    /// pods with br_netfilter): each trusted resolver's port 53 and each endpoint of one.
    pub fn listen_at(&self) -> BTreeSet<SocketAddr> {
        let resolvers = self.resolvers.iter().map(|r| SocketAddr::new(*r, 53));
        resolvers.chain(self.backends.iter().copied()).collect()
    }

    /// Every target of `pod`'s namespace.
    pub fn targets(&self, pod: IpAddr) -> &[Target] {
        self.by_pod.get(&pod).map_or(&[], |t| t.as_slice())
    }

    /// The pods whose DNS is steered to the proxy.
    pub fn pods(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.by_pod.keys().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }
}

/// The learning view of the firewalls as last planned.
pub fn learning(memory: &FirewallMemory) -> Learning {
    let mut by_pod = BTreeMap::new();
    for built in memory.built.values() {
        let fw = &built.inputs.firewall;
        let names = Names::new(&fw.namespace);
        let namespace: Arc<str> = fw.namespace.as_str().into();
        let mut targets: Vec<Target> = Vec::new();
        for rule in &fw.rules {
            if let Destination::Dns(pattern) = &rule.dest
                && !targets.iter().any(|t| &t.pattern == pattern)
            {
                targets.push(Target {
                    namespace: namespace.clone(),
                    pattern: pattern.clone(),
                    set_v4: names.learned_set(pattern, IpFamily::V4),
                    set_v6: names.learned_set(pattern, IpFamily::V6),
                });
            }
        }
        if targets.is_empty() {
            continue;
        }
        let targets = Arc::new(targets);
        for pod in &built.inputs.pods {
            by_pod.insert(*pod, targets.clone());
        }
    }
    let trusted = &memory.resolvers;
    Learning {
        by_pod,
        resolvers: trusted.resolvers.clone(),
        backends: trusted.backends.clone(),
        backend_ips: trusted.backends.iter().map(SocketAddr::ip).collect(),
    }
}
