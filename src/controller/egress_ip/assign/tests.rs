//! The assignment rules, and their invariants as a property test.

use super::*;
use crate::controller::egress_ip::ip;
use proptest::prelude::*;

fn node(name: &str, addr: &str, cidrs: &[&str]) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        assignable: true,
        ready: true,
        deleting: false,
        healthy: true,
        addresses: vec![ip(addr)],
        host_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        subnets_known: true,
        cloud: None,
    }
}

/// `created` 0: no creationTimestamp.
fn eip(name: &str, created: i128, ips: &[&str], current: &[(&str, &str)]) -> EgressIpInfo {
    EgressIpInfo {
        name: name.into(),
        created: (created != 0).then_some(created),
        ips: ips.iter().map(|i| ip(i)).collect(),
        current: current
            .iter()
            .map(|(i, n)| (ip(i), n.to_string()))
            .collect(),
        avoid: BTreeMap::new(),
    }
}

fn items(a: &Assignment) -> Vec<(String, String)> {
    a.items
        .iter()
        .map(|(i, n)| (i.to_string(), n.clone()))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn three() -> Vec<NodeInfo> {
    vec![
        node("w1", "192.168.1.11", &["192.168.1.11/24", "fd00::11/64"]),
        node("w2", "192.168.1.12", &["192.168.1.12/24", "fd00::12/64"]),
        node("w3", "192.168.2.13", &["192.168.2.13/24"]),
    ]
}

#[test]
fn spreads_by_count_and_never_puts_two_ips_of_one_egress_ip_on_one_node() {
    let eips = [
        eip("a", 1, &["192.168.1.100", "192.168.1.101"], &[]),
        eip("b", 2, &["192.168.1.102", "fd00::100"], &[]),
    ];
    let out = assign(&eips, &three());
    assert_eq!(
        items(&out["a"]),
        pairs(&[("192.168.1.100", "w1"), ("192.168.1.101", "w2")])
    );
    // w1 and w2 have one each: ties by name.
    assert_eq!(
        items(&out["b"]),
        pairs(&[("192.168.1.102", "w1"), ("fd00::100", "w2")])
    );
    assert!(out["a"].problems.is_empty() && out["b"].problems.is_empty());

    // A third IP in the 192.168.1.0/24 subnet: only two nodes fit.
    let eips = [eip(
        "a",
        0,
        &["192.168.1.100", "192.168.1.101", "192.168.1.102"],
        &[],
    )];
    let out = assign(&eips, &three());
    assert_eq!(out["a"].items.len(), 2);
    assert_eq!(
        out["a"].problems[0].to_string(),
        "spec.egressIPs[2]: 192.168.1.102 is not assigned: each of the 2 candidate node(s) \
         whose subnet contains it already hosts another IP of this EgressIP"
    );
}

#[test]
fn refusals_name_their_reason() {
    let eips = [
        eip("old", 1, &["192.168.1.50"], &[]),
        // Created later, asks for the same IP, and currently has it in status.
        eip(
            "young",
            3,
            &[
                "192.168.1.50",
                "192.168.1.12",
                "10.9.9.9",
                "192.168.1.0",
                "192.168.1.255",
            ],
            &[("192.168.1.50", "w2")],
        ),
    ];
    let out = assign(&eips, &three());
    assert_eq!(items(&out["old"]), pairs(&[("192.168.1.50", "w1")]));
    let young: Vec<String> = out["young"]
        .problems
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(
        young,
        [
            "spec.egressIPs[0]: 192.168.1.50 is not assigned: EgressIP old, created earlier, asks for the same IP",
            "spec.egressIPs[1]: 192.168.1.12 is not assigned: it is an address of node w2",
            "spec.egressIPs[2]: 10.9.9.9 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
            "spec.egressIPs[3]: 192.168.1.0 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
            "spec.egressIPs[4]: 192.168.1.255 is not assigned: no candidate node has a subnet containing it (k8s.ovn.org/host-cidrs)",
        ]
    );
    assert!(out["young"].items.is_empty());
    // No creation time sorts last; then by name.
    let eips = [
        eip("a", 0, &["192.168.1.50"], &[]),
        eip("z", 1, &["192.168.1.50"], &[]),
    ];
    let out = assign(&eips, &three());
    assert_eq!(out["z"].items.len(), 1);
    assert_eq!(out["a"].problems[0].reason.code(), "Conflict");
    // No candidate at all.
    let mut nodes = three();
    nodes.iter_mut().for_each(|n| n.assignable = false);
    let out = assign(&[eip("a", 0, &["192.168.1.50"], &[])], &nodes);
    assert_eq!(out["a"].problems[0].reason, Reason::NoCandidate);
}

#[test]
fn event_reasons_are_ovn_kubernetes_ones() {
    let node = |n: &str| Reason::NodeAddress { node: n.into() };
    let older = |n: &str| Reason::Conflict { with: n.into() };
    let cases = [
        (Reason::NoCandidate, false, "NoMatchingNodeFound"),
        (Reason::NoFittingSubnet, false, "NoMatchingNodeFound"),
        (Reason::NoFreeNode { fitting: 1 }, true, "UnassignedRequest"),
        (
            Reason::NoCloudRoom { nodes: vec![] },
            false,
            "NoMatchingNodeFound",
        ),
        (node("w1"), false, "EgressIPConflict"),
        (older("a"), true, "UnsupportedRequest"),
    ];
    for (reason, partly, want) in cases {
        assert_eq!(reason.event_reason(partly), want, "{reason:?}");
    }
}

#[test]
fn sticky_while_the_node_stays_a_candidate_and_moves_when_it_does_not() {
    let current = [("192.168.1.100", "w2")];
    let eips = [eip("a", 0, &["192.168.1.100"], &current)];
    // w1 has fewer IPs, but the IP stays on w2.
    let out = assign(&eips, &three());
    assert_eq!(items(&out["a"]), pairs(&[("192.168.1.100", "w2")]));
    // A node joining moves nothing.
    let mut nodes = three();
    nodes.push(node("w0", "192.168.1.10", &["192.168.1.10/24"]));
    assert_eq!(
        items(&assign(&eips, &nodes)["a"]),
        pairs(&[("192.168.1.100", "w2")])
    );
    // w2 stops being a candidate, for each reason: the IP moves to w1.
    for edit in [
        (|n: &mut NodeInfo| n.ready = false) as fn(&mut NodeInfo),
        |n| n.assignable = false,
        |n| n.deleting = true,
        |n| n.healthy = false,
        |n| n.host_cidrs = vec!["192.168.9.0/24".parse().unwrap()],
    ] {
        let mut nodes = three();
        edit(&mut nodes[1]);
        let out = assign(&eips, &nodes);
        assert_eq!(items(&out["a"]), pairs(&[("192.168.1.100", "w1")]));
    }
    // Subnets not published (yet): the IP stays, but nothing new goes there.
    let mut nodes = three();
    nodes[1].host_cidrs.clear();
    nodes[1].subnets_known = false;
    assert_eq!(
        items(&assign(&eips, &nodes)["a"]),
        pairs(&[("192.168.1.100", "w2")])
    );
    let fresh = [eip("b", 0, &["192.168.1.101", "192.168.1.102"], &[])];
    let out = assign(&fresh, &nodes);
    assert_eq!(items(&out["b"]), pairs(&[("192.168.1.101", "w1")]));
    assert_eq!(
        out["b"].problems[0].reason,
        Reason::NoFreeNode { fitting: 1 }
    );
    // A status naming two IPs of one EgressIP on one node keeps the first only.
    let eips = [eip(
        "a",
        0,
        &["192.168.1.100", "192.168.1.101"],
        &[("192.168.1.100", "w2"), ("192.168.1.101", "w2")],
    )];
    let out = assign(&eips, &three());
    assert_eq!(
        items(&out["a"]),
        pairs(&[("192.168.1.100", "w2"), ("192.168.1.101", "w1")])
    );
}

#[test]
fn candidacy_reports_the_first_failing_check() {
    let mut n = node("w1", "192.168.1.11", &[]);
    assert_eq!(n.candidacy(), Ok(()));
    n.healthy = false;
    assert_eq!(n.candidacy(), Err(NotCandidate::Unhealthy));
    n.ready = false;
    assert_eq!(n.candidacy(), Err(NotCandidate::NotReady));
    n.deleting = true;
    assert_eq!(n.candidacy(), Err(NotCandidate::Deleting));
    n.assignable = false;
    assert_eq!(n.candidacy(), Err(NotCandidate::NotAssignable));
    let net: IpNet = "10.0.0.0/31".parse().unwrap();
    assert!(subnet_fits(&net, ip("10.0.0.0")) && subnet_fits(&net, ip("10.0.0.1")));
    let net: IpNet = "fd00::/64".parse().unwrap();
    assert!(!subnet_fits(&net, ip("fd00::")) && subnet_fits(&net, ip("fd00::ffff")));
}

prop_compose! {
    fn arb_node()(
        i in 0u8..6,
        flags in proptest::collection::vec(any::<bool>(), 4),
        subnets in proptest::collection::btree_set(0u8..3, 0..3),
        // 0: bare metal; 1: malformed egress-ipconfig; else a NIC in 10.0.<nic>.0/24.
        cloud in 0u8..4,
        nic in 0u8..3,
        capacity in (proptest::option::of(0u32..3), proptest::option::of(0u32..3)),
    ) -> NodeInfo {
        NodeInfo {
            name: format!("n{i}"),
            assignable: flags[0] || flags[1],
            ready: flags[1] || flags[2],
            deleting: false,
            healthy: true,
            addresses: vec![IpAddr::from([10, 0, 9, i])],
            host_cidrs: subnets
                .iter()
                .map(|s| IpNet::new(IpAddr::from([10, 0, *s, 10 + i]), 24).unwrap())
                .collect(),
            subnets_known: flags[3] || !subnets.is_empty(),
            cloud: match cloud {
                0 => None,
                1 => Some(Err("malformed".into())),
                _ => Some(Ok(CloudNic {
                    interface: "eth0".into(),
                    subnets: vec![IpNet::new(IpAddr::from([10, 0, nic, 0]), 24).unwrap()],
                    capacity: egress_ipconfig::Capacity {
                        ipv4: capacity.0.or(Some(2)),
                        ipv6: None,
                        ip: capacity.1,
                    },
                })),
            },
        }
    }
}

prop_compose! {
    fn arb_eip()(
        name in 0u8..5,
        created in proptest::option::of(0u8..3),
        ips in proptest::collection::btree_set((0u8..4, 0u8..6), 1..4),
        current in proptest::collection::vec((0u8..4, 0u8..6, 0u8..6), 0..4),
        avoid in proptest::collection::vec((0u8..4, 0u8..6, 0u8..6), 0..2),
    ) -> EgressIpInfo {
        let addr = |(s, h): (u8, u8)| if s == 3 {
            IpAddr::from([10, 0, 9, h]) // some are node addresses
        } else {
            IpAddr::from([10, 0, s, 100 + h])
        };
        let ips: Vec<IpAddr> = ips.into_iter().map(addr).collect();
        let current = current
            .into_iter()
            .map(|(s, h, n)| (addr((s, h)), format!("n{n}")))
            .filter(|(ip, _)| ips.contains(ip))
            .collect();
        let mut avoided: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        for (s, h, n) in avoid {
            avoided.entry(addr((s, h))).or_default().insert(format!("n{n}"));
        }
        EgressIpInfo {
            name: format!("e{name}"),
            created: created.map(i128::from),
            ips,
            current,
            avoid: avoided,
        }
    }
}

proptest! {
    #[test]
    fn invariants(
        nodes in proptest::collection::vec(arb_node(), 0..6),
        eips in proptest::collection::vec(arb_eip(), 0..5),
    ) {
        let mut eips = eips;
        eips.sort_by(|a, b| a.name.cmp(&b.name));
        eips.dedup_by(|a, b| a.name == b.name);
        let mut nodes = nodes;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        let out = assign(&eips, &nodes);
        // Deterministic, also whatever the input order.
        let mut rev_e = eips.clone();
        rev_e.reverse();
        let mut rev_n = nodes.clone();
        rev_n.reverse();
        prop_assert_eq!(&out, &assign(&rev_e, &rev_n));
        let node_addrs: BTreeSet<IpAddr> = nodes
            .iter()
            .flat_map(|n| n.addresses.iter().copied().chain(n.host_cidrs.iter().map(IpNet::addr)))
            .collect();
        let mut hosted: BTreeSet<IpAddr> = BTreeSet::new();
        // Per node: IPv4 and IPv6 IPs placed on it.
        let mut load: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
        for e in &eips {
            let a = &out[&e.name];
            // Every IP is either assigned or has a problem, exactly once.
            prop_assert_eq!(a.items.len() + a.problems.len(), e.ips.len());
            let mut on: BTreeSet<&str> = BTreeSet::new();
            for (ip, node) in &a.items {
                // No two IPs of one EgressIP on one node.
                prop_assert!(on.insert(node.as_str()), "{} twice on {}", e.name, node);
                let n = nodes.iter().find(|n| &n.name == node).unwrap();
                prop_assert!(n.candidacy().is_ok());
                // Inside the node's host-cidrs (or kept on a node whose are unknown).
                prop_assert!(
                    n.fits(*ip) || (!n.subnets_known && e.current.get(ip) == Some(node))
                );
                // Never a node's address; never two EgressIPs on one IP.
                prop_assert!(!node_addrs.contains(ip));
                prop_assert!(hosted.insert(*ip));
                // Never on a node the cloud failed it on.
                prop_assert!(!e.avoid.get(ip).is_some_and(|a| a.contains(node)));
                // On a cloud: inside the NIC's subnets, or kept where the annotation is bad.
                match &n.cloud {
                    Some(Ok(nic)) => prop_assert!(nic.fits(*ip), "{} outside {:?}", ip, nic),
                    Some(Err(_)) => prop_assert_eq!(e.current.get(ip), Some(node)),
                    None => {}
                }
                let l = load.entry(node.as_str()).or_default();
                if ip.is_ipv4() { l.0 += 1 } else { l.1 += 1 }
            }
            // Sticky: a current assignment to a fitting candidate, not refused, stays
            // unless it is the second IP of this EgressIP on that node.
            for (ip, node) in &e.current {
                let kept = nodes.iter().any(|n| {
                    &n.name == node
                        && n.cloud.is_none()
                        && !e.avoid.get(ip).is_some_and(|a| a.contains(node))
                        && n.candidacy().is_ok()
                        && (n.fits(*ip) || !n.subnets_known)
                });
                let refused = a.problems.iter().any(|p| p.ip == *ip);
                let first_on_node = e.ips.iter().take_while(|i| *i != ip).all(|i| {
                    e.current.get(i) != Some(node)
                        || a.items.iter().all(|(x, n)| x != i || n != node)
                });
                if kept && !refused && first_on_node {
                    prop_assert!(a.items.contains(&(*ip, node.clone())), "{} left {}", ip, node);
                }
            }
        }
        // Never more IPs on a node than its cloud capacity.
        for n in &nodes {
            if let Some(Ok(nic)) = &n.cloud {
                let (v4, v6) = load.get(n.name.as_str()).copied().unwrap_or_default();
                let c = nic.capacity;
                prop_assert!(c.ipv4.is_none_or(|l| v4 <= l), "{}: {} IPv4 > {:?}", n.name, v4, c);
                prop_assert!(c.ip.is_none_or(|l| v4 + v6 <= l), "{}: {} IPs > {:?}", n.name, v4 + v6, c);
            }
        }
    }
}

#[test]
fn cloud_capacity_and_subnets_bound_placement_with_reasons() {
    let nic = |net: &str, v4: u32| {
        Some(Ok(CloudNic {
            interface: "eth0".into(),
            subnets: vec![net.parse().unwrap()],
            capacity: egress_ipconfig::Capacity {
                ipv4: Some(v4),
                ipv6: None,
                ip: None,
            },
        }))
    };
    let mut nodes = three();
    nodes[0].cloud = nic("192.168.1.0/24", 1);
    nodes[1].cloud = Some(Err("is missing".into()));
    nodes[2].cloud = nic("192.168.2.0/24", 1);
    let eips = [
        eip("a", 1, &["192.168.1.100"], &[]),
        // Currently on w2, whose annotation is missing: it keeps it.
        eip("b", 2, &["192.168.1.101"], &[("192.168.1.101", "w2")]),
        eip("c", 3, &["192.168.1.102"], &[]),
    ];
    let out = assign(&eips, &nodes);
    assert_eq!(items(&out["a"]), pairs(&[("192.168.1.100", "w1")]));
    assert_eq!(items(&out["b"]), pairs(&[("192.168.1.101", "w2")]));
    assert_eq!(out["c"].problems[0].reason.code(), "NoCloudRoom");
    assert_eq!(
        out["c"].problems[0].to_string(),
        "spec.egressIPs[0]: 192.168.1.102 is not assigned: no candidate node can host it in \
         the cloud: node w1: at capacity (ipv4 1); node w2: annotation \
         cloud.network.openshift.io/egress-ipconfig: is missing"
    );
    // An IP outside the NIC's subnet; a node the cloud failed the IP on is avoided.
    nodes[0].cloud = nic("192.168.1.0/26", 4);
    nodes[1].cloud = nic("192.168.1.0/24", 4);
    let mut e = eip("a", 1, &["192.168.1.100"], &[("192.168.1.100", "w2")]);
    e.avoid
        .insert(ip("192.168.1.100"), BTreeSet::from(["w2".to_string()]));
    let out = assign(&[e], &nodes);
    assert_eq!(
        out["a"].problems[0].to_string(),
        "spec.egressIPs[0]: 192.168.1.100 is not assigned: no candidate node can host it in \
         the cloud: node w1: not in its cloud subnets (192.168.1.0/26); node w2: the cloud \
         failed to attach it there, retrying later"
    );
}
