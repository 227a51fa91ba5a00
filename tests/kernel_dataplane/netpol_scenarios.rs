//! The upstream e2e suite's NetworkPolicy scenarios on the cluster of `netpol`, as rows:
//! the policies of a step and the truth tables they must give (on top of what no policy can
//! block: a pod to itself, a node to its own pods). Steps run in order (the last ones edit
//! and delete what an earlier one applied). Every topology runs the same rows, and their
//! `--dry-run` rulesets must load with `nft -f`.

use super::netpol::{in_ns, node_of, policy};
use nodeplane::testing::lab::Probe;

/// One truth table of a step.
pub struct Check {
    pub label: &'static str,
    /// 4 or 6.
    pub family: u8,
    pub probe: Probe,
    pub allowed: fn(&str, &str) -> bool,
}

/// The policies in force and the tables they give.
pub struct Step {
    pub policies: Vec<String>,
    pub checks: Vec<Check>,
}

const TCP80: Probe = Probe::Tcp(80);
const DENY_INGRESS: &str = "  podSelector: {}\n  policyTypes: [Ingress]\n";
const TO_A: &str = "  podSelector: {matchLabels: {pod: a}}\n  ingress:\n";

fn check(label: &'static str, family: u8, probe: Probe, allowed: fn(&str, &str) -> bool) -> Check {
    Check {
        label,
        family,
        probe,
        allowed,
    }
}

fn step(policies: Vec<String>, checks: Vec<Check>) -> Step {
    Step { policies, checks }
}

/// Default deny ingress in x plus `spec` as policy x/allow.
fn deny_x_and(spec: &str) -> Vec<String> {
    vec![
        policy("x", "deny", DENY_INGRESS),
        policy("x", "allow", spec),
    ]
}

pub fn upstream() -> Vec<Step> {
    let egress = policy(
        "y",
        "egress",
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{to: [{namespaceSelector: {matchLabels: {ns: x}}, podSelector: {matchLabels: {pod: b}}}]}]\n",
    );
    let edited = egress.replace("pod: b}", "pod: c}");
    vec![
        step(vec![], vec![check("no policy", 4, TCP80, |_, _| true)]),
        step(
            vec![policy("x", "deny", DENY_INGRESS)],
            vec![
                check("default deny ingress in x", 4, TCP80, |_, to| {
                    !in_ns(to, "x")
                }),
                check("default deny ingress in x, IPv6", 6, TCP80, |_, to| {
                    !in_ns(to, "x")
                }),
            ],
        ),
        step(
            deny_x_and(&format!(
                "{TO_A}  - from: [{{podSelector: {{matchLabels: {{pod: b}}}}}}]\n"
            )),
            vec![check(
                "podSelector: own namespace only",
                4,
                TCP80,
                |from, to| !in_ns(to, "x") || (to == "x/a" && from == "x/b"),
            )],
        ),
        step(
            deny_x_and(&format!(
                "{TO_A}  - from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}}}]\n"
            )),
            vec![check("namespaceSelector", 4, TCP80, |from, to| {
                !in_ns(to, "x") || (to == "x/a" && in_ns(from, "y"))
            })],
        ),
        step(
            deny_x_and(&format!(
                "{TO_A}  - from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}, podSelector: {{matchLabels: {{pod: b}}}}}}]\n"
            )),
            vec![check(
                "namespaceSelector AND podSelector",
                4,
                TCP80,
                |from, to| !in_ns(to, "x") || (to == "x/a" && from == "y/b"),
            )],
        ),
        step(
            deny_x_and(&format!(
                "{TO_A}  - from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}}}, {{podSelector: {{matchLabels: {{pod: b}}}}}}]\n"
            )),
            vec![check(
                "namespaceSelector OR podSelector",
                4,
                TCP80,
                |from, to| !in_ns(to, "x") || (to == "x/a" && (in_ns(from, "y") || from == "x/b")),
            )],
        ),
        step(
            deny_x_and(&format!(
                "{TO_A}  - from: [{{ipBlock: {{cidr: 10.128.0.0/16, except: [10.128.1.0/24]}}}}]\n"
            )),
            vec![check("ipBlock with except", 4, TCP80, |from, to| {
                !in_ns(to, "x") || (to == "x/a" && node_of(from) == Some(0) && from != "node-1")
            })],
        ),
        // Rules without peers: every source, of both families.
        step(
            deny_x_and(&format!("{TO_A}  - {{}}\n")),
            vec![
                check("allow all to x/a", 4, TCP80, |_, to| {
                    !in_ns(to, "x") || to == "x/a"
                }),
                check("allow all to x/a, IPv6", 6, TCP80, |_, to| {
                    !in_ns(to, "x") || to == "x/a"
                }),
            ],
        ),
        step(
            deny_x_and(&format!("{TO_A}  - ports: [{{port: 81}}]\n")),
            vec![
                check(
                    "port 81 from everyone to x/a",
                    4,
                    Probe::Tcp(81),
                    |_, to| !in_ns(to, "x") || to == "x/a",
                ),
                check("port 81 from everyone, IPv6", 6, Probe::Tcp(81), |_, to| {
                    !in_ns(to, "x") || to == "x/a"
                }),
                check("port 80 not", 4, TCP80, |_, to| !in_ns(to, "x")),
            ],
        ),
        // Named port `web`: 80 on x/a, 81 elsewhere, resolved on each selected pod.
        step(
            deny_x_and("  podSelector: {}\n  ingress: [{ports: [{port: web}]}]\n"),
            vec![
                check("named port, port 80", 4, TCP80, |_, to| {
                    !in_ns(to, "x") || to == "x/a"
                }),
                check("named port, port 81", 4, Probe::Tcp(81), |_, to| {
                    to != "x/a"
                }),
            ],
        ),
        step(
            deny_x_and("  podSelector: {}\n  ingress: [{ports: [{port: 81, endPort: 90}]}]\n"),
            vec![
                check("endPort: 80 outside", 4, TCP80, |_, to| !in_ns(to, "x")),
                check("endPort: 81 inside", 4, Probe::Tcp(81), |_, _| true),
            ],
        ),
        step(
            deny_x_and("  podSelector: {}\n  ingress: [{ports: [{protocol: UDP, port: 53}]}]\n"),
            vec![
                check("UDP allowed", 4, Probe::Udp(53), |_, _| true),
                check("UDP allowed, IPv6", 6, Probe::Udp(53), |_, _| true),
                check("TCP not", 4, TCP80, |_, to| !in_ns(to, "x")),
            ],
        ),
        // IPv6, and the union of two policies selecting x/a.
        step(
            vec![
                policy("x", "deny", DENY_INGRESS),
                policy(
                    "x",
                    "from-b",
                    &format!("{TO_A}  - from: [{{podSelector: {{matchLabels: {{pod: b}}}}}}]\n"),
                ),
                policy(
                    "x",
                    "from-y",
                    &format!(
                        "{TO_A}  - from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}}}]\n"
                    ),
                ),
            ],
            vec![
                check("union of two policies", 4, TCP80, union),
                check("union of two policies, IPv6", 6, TCP80, union),
            ],
        ),
        // Egress: y may only reach x/b (replies of connections into y still flow).
        step(
            vec![egress],
            vec![
                check(
                    "default deny egress in y but to x/b",
                    4,
                    TCP80,
                    |from, to| !in_ns(from, "y") || to == "x/b",
                ),
                check("egress, IPv6", 6, TCP80, |from, to| {
                    !in_ns(from, "y") || to == "x/b"
                }),
            ],
        ),
        // Egress to everyone, on one port only (a rule without peers).
        step(
            vec![policy(
                "y",
                "egress",
                "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: 81}]}]\n",
            )],
            vec![
                check("egress port 81 only", 4, Probe::Tcp(81), |_, _| true),
                check("egress port 81 only, IPv6", 6, Probe::Tcp(81), |_, _| true),
                check("egress port 80 denied", 4, TCP80, |from, _| {
                    !in_ns(from, "y")
                }),
            ],
        ),
        // Egress named port `web`, resolved on the peer (destination) pod.
        step(
            vec![policy(
                "y",
                "egress",
                "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{ports: [{port: web}]}]\n",
            )],
            vec![
                check("egress named port, port 80", 4, TCP80, |from, to| {
                    !in_ns(from, "y") || to == "x/a"
                }),
                check(
                    "egress named port, port 81",
                    4,
                    Probe::Tcp(81),
                    |from, to| !in_ns(from, "y") || to != "x/a",
                ),
            ],
        ),
        // Edit (egress now to x/c instead of x/b), then delete.
        step(
            vec![edited],
            vec![check("edited egress policy", 4, TCP80, |from, to| {
                !in_ns(from, "y") || to == "x/c"
            })],
        ),
        step(vec![], vec![check("policy deleted", 4, TCP80, |_, _| true)]),
    ]
}

fn union(from: &str, to: &str) -> bool {
    !in_ns(to, "x") || (to == "x/a" && (from == "x/b" || in_ns(from, "y")))
}
