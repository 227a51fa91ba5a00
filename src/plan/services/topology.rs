//! Topology-aware routing as kube-proxy does it: a Service that asks for it (annotation
//! `service.kubernetes.io/topology-mode: Auto`, the older `topology-aware-hints`, or
//! `spec.trafficDistribution: PreferClose`) sends cluster traffic only to the endpoints the
//! EndpointSlice controller hinted for this node's zone, and falls back to every endpoint
//! unless every ready endpoint has a hint and at least one is for this zone.

use crate::api::Service;

const TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
const TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// The node label naming its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Whether the Service asks for zone hints to be used. The newer annotation wins over the
/// older one; `Auto` (or `auto`) enables, as in kube-proxy; `PreferSameZone` is the newer
/// name of `PreferClose`.
pub fn requested(svc: &Service) -> bool {
    let annotations = svc.metadata.annotations.as_ref();
    let mode =
        annotations.and_then(|a| a.get(TOPOLOGY_MODE).or_else(|| a.get(TOPOLOGY_AWARE_HINTS)));
    let distribution = svc
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref());
    matches!(mode.map(String::as_str), Some("Auto" | "auto"))
        || matches!(distribution, Some("PreferClose" | "PreferSameZone"))
}

/// One ready endpoint's hint as far as this node goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// No `hints.forZones`.
    None,
    /// Hinted for this node's zone.
    Here,
    /// Hinted for other zones only.
    Elsewhere,
}

/// kube-proxy's condition for using the hints: every ready endpoint has one and at least
/// one is for this zone (otherwise, e.g. while the controller is still writing them, every
/// endpoint is used).
pub fn use_hints(ready: impl IntoIterator<Item = Hint>) -> bool {
    let mut here = false;
    for hint in ready {
        match hint {
            Hint::None => return false,
            Hint::Here => here = true,
            Hint::Elsewhere => {}
        }
    }
    here
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::objects;
    use Hint::*;

    #[test]
    fn hints_are_used_only_when_complete_and_one_is_for_this_zone() {
        assert!(use_hints([Here, Elsewhere]));
        assert!(
            !use_hints([Here, None]),
            "one ready endpoint without a hint"
        );
        assert!(!use_hints([Elsewhere, Elsewhere]), "none for this zone");
        assert!(!use_hints([]), "no ready endpoint");
    }

    #[test]
    fn services_ask_by_annotation_or_traffic_distribution() {
        let svc = |extra: &str| {
            let s = objects::service("a", "172.30.0.1", "{port: 80}");
            s.spec(extra).object()
        };
        let annotated = |pairs: &[(&str, &str)]| {
            let mut s = svc("");
            s.metadata.annotations = Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            s
        };
        assert!(!requested(&svc("")));
        assert!(requested(&svc("trafficDistribution: PreferClose")));
        assert!(requested(&annotated(&[(TOPOLOGY_MODE, "Auto")])));
        assert!(requested(&annotated(&[(TOPOLOGY_AWARE_HINTS, "auto")])));
        assert!(!requested(&annotated(&[(TOPOLOGY_MODE, "Disabled")])));
        // The newer annotation wins.
        let both = [(TOPOLOGY_MODE, "Disabled"), (TOPOLOGY_AWARE_HINTS, "Auto")];
        assert!(!requested(&annotated(&both)));
    }
}
