//! The platform the cluster runs on, which decides whether egress IPs go through the cloud
//! (`controller::egress_ip::cloud`): `--platform`, or with `auto` the Nodes' `spec.providerID` prefix.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Node;

/// Where egress IPs live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// The node's own L2 segment: the assigner writes `status.items` at once.
    BareMetal,
    Aws,
    Azure,
    Gcp,
    OpenStack,
}

impl Platform {
    /// A cloud attaches each egress IP to the VM's NIC (CloudPrivateIPConfig) before the
    /// node may use it.
    pub fn is_cloud(self) -> bool {
        self != Platform::BareMetal
    }

    /// The platform a `spec.providerID` names (`aws://`, `azure://`, `gce://`,
    /// `openstack://`); anything else is bare metal.
    pub fn from_provider_id(id: &str) -> Platform {
        const PREFIXES: [(&str, Platform); 4] = [
            ("aws://", Platform::Aws),
            ("azure://", Platform::Azure),
            ("gce://", Platform::Gcp),
            ("openstack://", Platform::OpenStack),
        ];
        PREFIXES
            .iter()
            .find(|(prefix, _)| id.starts_with(prefix))
            .map_or(Platform::BareMetal, |(_, p)| *p)
    }

    /// The platform of a set of Nodes: the first cloud any `providerID` names (in name
    /// order, as the snapshot gives them), else bare metal. One cloud node is enough: a
    /// cluster does not mix clouds, and treating a cloud as bare metal would SNAT to IPs the
    /// fabric does not route.
    pub fn detect<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Platform {
        nodes
            .into_iter()
            .filter_map(|n| n.spec.as_ref()?.provider_id.as_deref())
            .map(Platform::from_provider_id)
            .find(|p| p.is_cloud())
            .unwrap_or(Platform::BareMetal)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Platform::BareMetal => "baremetal",
            Platform::Aws => "aws",
            Platform::Azure => "azure",
            Platform::Gcp => "gcp",
            Platform::OpenStack => "openstack",
        })
    }
}

/// `--platform`: fixed, or detected from the Nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlatformChoice {
    #[default]
    Auto,
    Fixed(Platform),
}

impl PlatformChoice {
    pub fn resolve<'a>(self, nodes: impl IntoIterator<Item = &'a Node>) -> Platform {
        match self {
            PlatformChoice::Auto => Platform::detect(nodes),
            PlatformChoice::Fixed(p) => p,
        }
    }
}

impl FromStr for PlatformChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => PlatformChoice::Auto,
            "baremetal" => PlatformChoice::Fixed(Platform::BareMetal),
            "aws" => PlatformChoice::Fixed(Platform::Aws),
            "azure" => PlatformChoice::Fixed(Platform::Azure),
            "gcp" => PlatformChoice::Fixed(Platform::Gcp),
            "openstack" => PlatformChoice::Fixed(Platform::OpenStack),
            other => {
                return Err(format!(
                    "{other:?} is not one of auto, baremetal, aws, azure, gcp, openstack"
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(provider_id: Option<&str>) -> Node {
        Node {
            spec: Some(NodeSpec {
                provider_id: provider_id.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn provider_id_prefixes_name_the_cloud() {
        for (id, p) in [
            ("aws:///us-east-1a/i-0abc", Platform::Aws),
            ("azure:///subscriptions/x/vm-1", Platform::Azure),
            ("gce://project/zone/vm-1", Platform::Gcp),
            ("openstack:///4f1c", Platform::OpenStack),
            ("kind://docker/kind/kind-worker", Platform::BareMetal),
            ("", Platform::BareMetal),
        ] {
            assert_eq!(Platform::from_provider_id(id), p, "{id}");
        }
    }

    #[test]
    fn detection_takes_any_cloud_node_and_the_flag_overrides_it() {
        let nodes = [node(None), node(Some("aws:///us-east-1a/i-0abc"))];
        assert_eq!(Platform::detect(&nodes), Platform::Aws);
        assert_eq!(Platform::detect(&nodes[..1]), Platform::BareMetal);
        assert_eq!(Platform::detect([]), Platform::BareMetal);
        let fixed: PlatformChoice = "baremetal".parse().unwrap();
        assert_eq!(fixed.resolve(&nodes), Platform::BareMetal);
        assert_eq!(PlatformChoice::Auto.resolve(&nodes), Platform::Aws);
        assert_eq!(
            "ec2".parse::<PlatformChoice>().unwrap_err(),
            r#""ec2" is not one of auto, baremetal, aws, azure, gcp, openstack"#
        );
    }
}
