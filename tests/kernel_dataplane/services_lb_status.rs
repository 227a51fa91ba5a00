//! `status.loadBalancer.ingress` is written by load-balancer controllers, which may be wrong
//! or compromised: an ingress address gets the same scrutiny as `spec.externalIPs`. One that
//! is a pod's address (inside `--cluster-cidr`) or inside `--service-cidr` is refused, and so
//! is one in `--load-balancer-ip-rejected-cidrs` or outside a non-empty
//! `--load-balancer-ip-allowed-cidrs`: traffic to it, from pods and from the node itself
//! (kubelet probes), still reaches the address's real owner.

use super::services::{NODE, TCP_PORTS, topo};
use nodeplane::testing::lab::SECOND;
use nodeplane::testing::objects::{endpoint_slice, ep, service_ips};

#[test]
fn a_load_balancer_status_cannot_take_a_pods_or_an_outside_address() {
    let t = topo();
    let (b1, victim) = (t.v4(&t.b1), t.v4(&t.b3));
    // ext2 (192.168.2.100) stands for an external API the node and its pods use.
    let _api = t.ext2.tcp_server("0.0.0.0:8080", "ext2");
    let thief = |name: &str, cluster_ip: &str, ingress: &str| {
        [
            service_ips(
                name,
                &[cluster_ip],
                "{name: http, port: 8080, protocol: TCP}",
            )
            .spec("type: LoadBalancer")
            .lb_ingress(&[ingress])
            .to_string(),
            endpoint_slice(name, name, "IPv4", TCP_PORTS, &[ep(&b1, NODE)]).to_string(),
        ]
        .join("---\n")
    };
    let docs = [
        thief("steal-pod", "172.30.0.30", &victim),
        thief("steal-api", "172.30.0.31", "192.168.2.100"),
        thief("steal-vip", "172.30.0.32", "172.30.0.99"),
        thief("honest", "172.30.0.33", "203.0.113.70"),
    ];
    t.agent.write("services.yaml", &docs.join("---\n"));
    let rejected = ["--load-balancer-ip-rejected-cidrs", "192.168.2.0/24"];
    // The refusals, by field path, in the status lines that --dry-run prints.
    let out = t.agent.dry_run(&rejected).expect("agent --dry-run");
    for (svc, why) in [
        (
            "steal-pod",
            format!("ingress[0].ip: {victim} is in --cluster-cidr"),
        ),
        (
            "steal-api",
            "is in --load-balancer-ip-rejected-cidrs 192.168.2.0/24".into(),
        ),
        (
            "steal-vip",
            "ingress[0].ip: 172.30.0.99 is in --service-cidr".into(),
        ),
    ] {
        assert!(
            out.lines().any(|l| l.contains(svc) && l.contains(&why)),
            "{svc}: no refusal containing {why:?}:\n{out}"
        );
    }
    t.agent.once(&rejected);
    // The pod's own server answers, from a pod and from the node.
    for from in [&t.c1.ns, &t.node] {
        let r = from.tcp_connect(format!("{victim}:8080"), SECOND);
        assert_eq!(
            r.expect_reply().server,
            "b3",
            "the victim pod's address was taken"
        );
        let r = from.tcp_connect("192.168.2.100:8080", SECOND);
        assert_eq!(
            r.expect_reply().server,
            "ext2",
            "the external API's address was taken"
        );
    }
    // An honest LB IP still works (from the outside, through the node).
    let r = t
        .ext
        .tcp_connect("203.0.113.70:8080", SECOND)
        .expect_reply();
    assert_eq!(r.server, "b1", "{b1} expected behind the honest LB IP");
}
