//! `agent explain` on every example under examples/: each row is a packet, the verdict the
//! example's rules give it (what the kernel tests prove with real packets for the same kinds
//! of rules) and the decisions that must be named: object, rule and action, as printed.

use nodeplane::config::Config;
use nodeplane::explain::offline::{Request, explain_desired};
use nodeplane::explain::output::{Report, text};
use nodeplane::explain::{Verdict, overall};
use nodeplane::plan::{Memory, plan_with};
use nodeplane::source::manifests;
use std::path::Path;

struct Row {
    src: &'static str,
    dst: &'static str,
    proto: &'static str,
    dport: Option<u16>,
    /// Every path's verdict, in path order (one path unless a Service has several backends).
    verdicts: &'static [Verdict],
    /// Lines that must appear (substrings of the text output).
    shows: &'static [&'static str],
}

const fn row(
    src: &'static str,
    dst: &'static str,
    dport: u16,
    verdicts: &'static [Verdict],
    shows: &'static [&'static str],
) -> Row {
    Row {
        src,
        dst,
        proto: "tcp",
        dport: Some(dport),
        verdicts,
        shows,
    }
}

use Verdict::{Dropped, Forwarded, Rejected};

fn explain(dir: &str, node: &str, cidrs: &[&str], r: &Row) -> (Report, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(dir);
    let snapshot = manifests::load_dir(&path).expect("example loads").snapshot;
    let mut config = Config::for_node(node);
    if !cidrs.is_empty() {
        config.cluster_cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
    }
    let desired = plan_with(&snapshot, &config, &Memory::default());
    let req = Request {
        src: Some(r.src.parse().unwrap()),
        dst: Some(r.dst.parse().unwrap()),
        proto: r.proto.into(),
        dport: r.dport,
        ..Default::default()
    };
    let report = explain_desired(node, &snapshot, &desired, &req).expect("explains");
    let shown = text(&report);
    (report, shown)
}

fn check(dir: &str, node: &str, cidrs: &[&str], rows: &[Row]) {
    for r in rows {
        let (report, shown) = explain(dir, node, cidrs, r);
        let got: Vec<Verdict> = report.paths.iter().map(|p| p.path.verdict).collect();
        assert_eq!(got, r.verdicts, "{dir} {} -> {}:\n{shown}", r.src, r.dst);
        if let [one] = r.verdicts {
            assert_eq!(
                overall(
                    &report
                        .paths
                        .iter()
                        .map(|p| p.path.clone())
                        .collect::<Vec<_>>()
                ),
                Some(*one)
            );
        }
        for needle in r.shows {
            assert!(
                shown.contains(needle),
                "{dir} {} -> {}: no {needle:?} in\n{shown}",
                r.src,
                r.dst
            );
        }
    }
}

#[test]
fn the_example_cluster_on_worker_1() {
    let fw = "EgressFirewall \"backend\"/\"default\"";
    check(
        "cluster",
        "worker-1",
        &[],
        &[
            // backend/api to the payments CIDR: rule 0 allows, EgressIP SNATs.
            row(
                "10.128.0.11",
                "203.0.113.10",
                443,
                &[Forwarded],
                &[
                    "EgressFirewall \"backend\"/\"default\" rule 0 accept",
                    "\"Allow 203.0.113.0/24 ports TCP/443\"",
                    "snat to 192.168.50.100",
                    "EgressIP \"egress-payments\"",
                ],
            ),
            // Anything else: the dnsName rule is unknown offline, rule 4 denies.
            row(
                "10.128.0.11",
                "8.8.8.8",
                443,
                &[Dropped],
                &[
                    "rule 1 unknown offline",
                    "is filled at run time",
                    "EgressFirewall \"backend\"/\"default\" rule 4 drop",
                ],
            ),
            row(
                "10.128.0.11",
                "192.168.50.53",
                53,
                &[Forwarded],
                &["rule 2 accept"],
            ),
            // Pod-to-pod traffic is not the EgressFirewall's business; NetworkPolicy allows web.
            row(
                "10.128.0.10",
                "10.128.0.11",
                8443,
                &[Forwarded],
                &["NetworkPolicy \"backend\"/\"api-from-web\" ingress[0] accept"],
            ),
            // prometheus is not a web pod: api is isolated and no rule allows it.
            row(
                "10.128.0.12",
                "10.128.0.11",
                8443,
                &[Dropped],
                &["ingress isolated by NetworkPolicy \"backend/api-from-web\": no rule allows"],
            ),
            // The api Service: two backends, one path each; both allowed for web.
            row(
                "10.128.0.10",
                "172.30.45.67",
                443,
                &[Forwarded, Forwarded],
                &[
                    "Service \"backend\"/\"api\"",
                    "dnat to 10.128.0.11:8443",
                    "dnat to 10.128.2.11:8443",
                    "@saf-",
                ],
            ),
            // A ClusterIP port nobody serves is rejected; an unallocated service IP dropped.
            row(
                "10.128.0.10",
                "172.30.12.34",
                81,
                &[Rejected],
                &["reject (tcp reset)"],
            ),
            row(
                "10.128.0.10",
                "172.30.99.99",
                80,
                &[Dropped],
                &["svc-check"],
            ),
            // EgressQoS marks frontend traffic to 198.51.100.0/24 with DSCP 46.
            row(
                "10.128.0.10",
                "198.51.100.7",
                80,
                &[Forwarded],
                &["EgressQoS \"frontend\"/\"default\" rule 0", "dscp set 46"],
            ),
        ],
    );
    let _ = fw;
}

#[test]
fn the_services_example_on_worker_1() {
    check(
        "services",
        "worker-1",
        &[],
        &[
            // Three backends of demo/web, each a path.
            row(
                "10.128.0.5",
                "172.30.0.10",
                80,
                &[Forwarded, Forwarded, Forwarded],
                &[
                    "Service \"demo\"/\"web\"",
                    "dnat to 10.128.0.21:8080",
                    "dnat to 10.128.0.22:8080",
                    "dnat to 10.128.0.23:8080",
                ],
            ),
            // The LoadBalancer admits its source ranges only.
            row(
                "198.51.100.9",
                "203.0.113.20",
                80,
                &[Forwarded],
                &["dnat to 10.128.0.22:8080"],
            ),
            row("192.0.2.1", "203.0.113.20", 80, &[Dropped], &["Service"]),
            // A NodePort from outside: DNAT to a backend and masquerade.
            row(
                "192.0.2.1",
                "192.168.1.1",
                30080,
                &[Forwarded, Forwarded, Forwarded],
                &["masquerade"],
            ),
        ],
    );
}

#[test]
fn the_egress_ip_example_on_worker_1() {
    let cidrs = ["10.128.0.0/14", "fd01::/48"];
    check(
        "egress-ip",
        "worker-1",
        &cidrs,
        &[
            row(
                "10.128.0.11",
                "8.8.8.8",
                443,
                &[Forwarded],
                &["snat to 192.168.50.200", "EgressIP \"backend-api\""],
            ),
            row(
                "fd01::11",
                "2001:db8::1",
                443,
                &[Forwarded],
                &["snat to fd00:50::200"],
            ),
            // Pod-to-pod is never SNATed.
            row(
                "10.128.0.11",
                "10.128.2.11",
                443,
                &[Forwarded],
                &["EgressIP"],
            ),
        ],
    );
}
