//! Topology-aware routing as kube-proxy's `topology.go` does it: the EndpointSlice controller
//! hints endpoints for nodes (`hints.forNodes`, for `trafficDistribution: PreferSameNode`)
//! and zones (`hints.forZones`, for `PreferSameZone`/`PreferClose` and the `topology-mode:
//! Auto` annotation), and cluster traffic goes only to the endpoints hinted for this node
//! when every ready endpoint has a node hint and one is for this node; else only to those
//! hinted for this node's zone when every ready endpoint has a zone hint and one is for this
//! zone; else to every endpoint. Like kube-proxy, the hints decide, not the Service's own
//! fields (the controller writes hints only for a Service that asks for them).

/// The node label naming its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// One ready endpoint's hint of one kind (node or zone) as far as this node goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// No hint of this kind.
    None,
    /// Hinted for this node (or this node's zone).
    Here,
    /// Hinted for other nodes (zones) only.
    Elsewhere,
}

impl Hint {
    /// The hint of one kind given the names it lists and this node's (zone's) name.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>, here: Option<&str>) -> Hint {
        let mut any = false;
        for name in names {
            if Some(name) == here {
                return Hint::Here;
            }
            any = true;
        }
        if any { Hint::Elsewhere } else { Hint::None }
    }
}

/// One ready endpoint's node and zone hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    pub node: Hint,
    pub zone: Hint,
}

/// Which endpoints cluster traffic may use (kube-proxy's `topologyModeFromHints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every endpoint.
    All,
    /// The endpoints hinted for this node.
    SameNode,
    /// The endpoints hinted for this node's zone.
    SameZone,
}

impl Mode {
    /// Whether an endpoint with these hints is used in this mode.
    pub fn admits(self, hints: Hints) -> bool {
        match self {
            Mode::All => true,
            Mode::SameNode => hints.node == Hint::Here,
            Mode::SameZone => hints.zone == Hint::Here,
        }
    }
}

/// kube-proxy's choice: node hints when every ready endpoint has one and one is for this
/// node, else zone hints on the same condition, else none (e.g. while the controller is
/// still writing them, or with no ready endpoint).
pub fn mode(ready: impl IntoIterator<Item = Hints>) -> Mode {
    let (mut all_node, mut node_here, mut all_zone, mut zone_here) = (true, false, true, false);
    let mut any = false;
    for h in ready {
        any = true;
        match h.node {
            Hint::None => all_node = false,
            Hint::Here => node_here = true,
            Hint::Elsewhere => {}
        }
        match h.zone {
            Hint::None => all_zone = false,
            Hint::Here => zone_here = true,
            Hint::Elsewhere => {}
        }
    }
    if !any {
        Mode::All
    } else if all_node && node_here {
        Mode::SameNode
    } else if all_zone && zone_here {
        Mode::SameZone
    } else {
        Mode::All
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Hint::*;

    fn h(node: Hint, zone: Hint) -> Hints {
        Hints { node, zone }
    }

    #[test]
    fn node_hints_then_zone_hints_each_only_when_complete_and_one_is_here() {
        assert_eq!(
            mode([h(Here, Here), h(Elsewhere, Elsewhere)]),
            Mode::SameNode
        );
        assert_eq!(mode([h(Here, Here), h(None, Elsewhere)]), Mode::SameZone);
        assert_eq!(
            mode([h(Elsewhere, Here), h(Elsewhere, Here)]),
            Mode::SameZone
        );
        assert_eq!(mode([h(Here, Here), h(None, None)]), Mode::All);
        assert_eq!(mode([h(None, Elsewhere), h(None, Elsewhere)]), Mode::All);
        assert_eq!(mode([]), Mode::All, "no ready endpoint");
    }

    #[test]
    fn a_hint_is_here_when_it_names_this_node_or_zone() {
        assert_eq!(Hint::of(["a", "b"], Some("b")), Here);
        assert_eq!(Hint::of(["a"], Some("b")), Elsewhere);
        assert_eq!(
            Hint::of(["a"], Option::None),
            Elsewhere,
            "node without a zone"
        );
        assert_eq!(Hint::of([], Some("b")), None);
    }
}
