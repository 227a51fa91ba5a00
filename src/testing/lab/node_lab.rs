//! The one-node setup most dataplane kernel tests start from: a node netns with its uplink
//! host and the node's agent fed from a manifests directory.

use super::{Lab, ManifestAgent, Ns, Pod, Server};
use crate::testing::listing;

/// The Kubernetes node name of the node of a [`NodeLab`].
pub const NODE: &str = "node-1";

/// Node netns `node` forwarding for the pods a test adds ([`NodeLab::pod`]), its uplink host
/// `ext` ([`Lab::add_uplink_host`]) and the node's [`ManifestAgent`].
///
/// Hold it as the last field of a test's topology: what runs in its namespaces (servers,
/// agents) must stop before the lab deletes them.
pub struct NodeLab {
    pub node: Ns,
    pub ext: Ns,
    pub agent: ManifestAgent,
    /// The test's servers, stopped (dropped) before the namespaces go.
    pub servers: Vec<Server>,
    // Last: servers and agents must stop before the namespaces go.
    pub lab: Lab,
}

impl NodeLab {
    /// The node (Kubernetes node [`NODE`], agent flags `flags`) and its uplink host.
    pub fn new(flags: &[&str]) -> NodeLab {
        let mut lab = Lab::new();
        let node = lab.add_node("node");
        let ext = lab.add_uplink_host(&node, "ext");
        let agent = ManifestAgent::new(&node, NODE, flags);
        NodeLab {
            node,
            ext,
            agent,
            servers: Vec::new(),
            lab,
        }
    }

    /// `ext` owns `hosts` and the node routes `prefixes` to it ([`Lab::add_uplink_addrs`]).
    pub fn with_hosts(self, hosts: &[&str], prefixes: &[&str]) -> NodeLab {
        self.lab
            .add_uplink_addrs(&self.node, &self.ext, hosts, prefixes);
        self
    }

    /// A pod behind the node ([`Lab::add_pod`]).
    pub fn pod(&mut self, role: &str, addrs: &[&str]) -> Pod {
        self.lab.add_pod(&self.node, role, addrs)
    }

    /// What the agent's `--dry-run` prints for the manifests, and a fresh host `ref` that
    /// holds it (applied by `nft -f`): the ruleset the node must hold after a sync.
    pub fn dry_run_reference(&mut self) -> (String, Ns) {
        let printed = self.agent.dry_run(&[]).expect("dry-run");
        let reference = self.lab.add_reference(&printed);
        (printed, reference)
    }

    /// `--once` applies exactly what `--dry-run` printed (without a failure): the node's
    /// table equals the printed text applied in a fresh host netns, which it returns for
    /// further comparisons.
    #[track_caller]
    pub fn once_applies_the_dry_run(&mut self) -> Ns {
        let (printed, reference) = self.dry_run_reference();
        assert!(!printed.contains("not correctly applied"), "{printed}");
        self.agent.once(&[]);
        assert_eq!(
            listing::json(&self.node, "nodeplane"),
            listing::json(&reference, "nodeplane")
        );
        reference
    }
}
