//! The cold apply of a large policy set and the edit of one policy in it.
//!
//! The cluster: `namespaces` namespaces `ns-<i>` (labels `env=prod|dev`; `ns-0` is
//! `purpose=monitoring`, `ns-1` `purpose=ingress`, `ns-2` `purpose=dns`), `pods` pods on this
//! node spread over them (labels `app=app-<k mod 5>`, `role=frontend|backend|db|cache`), and
//! ten policies per namespace, the shapes clusters commonly have: default deny both ways,
//! allow from the own namespace, from the monitoring namespace, frontend -> backend -> db
//! within the namespace, from the ingress controller, egress to DNS, prod frontends from any
//! prod namespace, backends to the outside (an ipBlock with an except) and egress to every pod.
//! So most peer selectors recur in every namespace (the ones naming other namespaces or an
//! ipBlock), the rest are per namespace.

use nodeplane::api::NetworkPolicy;
use nodeplane::config::Config;
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::{Engine, Family, TABLE_NAME};
use nodeplane::plan::{Memory, plan_with};
use nodeplane::snapshot::Snapshot;
use nodeplane::testing::lab::Lab;
use nodeplane::testing::objects;
use nodeplane::testing::stats::ms;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::{NODE, percentile};

const ROLES: [&str; 4] = ["frontend", "backend", "db", "cache"];

/// The policies of a namespace, by name; `port` varies policy `p-3` (the edited one).
fn policies(port: usize) -> Vec<(String, String)> {
    let specs = [
        "  podSelector: {}\n  policyTypes: [Ingress, Egress]\n".to_string(),
        "  podSelector: {}\n  ingress: [{from: [{podSelector: {}}]}]\n".to_string(),
        "  podSelector: {}\n  ingress:\n  - from: [{namespaceSelector: {matchLabels: {purpose: monitoring}}}]\n    ports: [{port: 9090}]\n".to_string(),
        format!("  podSelector: {{matchLabels: {{role: backend}}}}\n  ingress:\n  - from: [{{podSelector: {{matchLabels: {{role: frontend}}}}}}]\n    ports: [{{port: {port}}}]\n"),
        "  podSelector: {matchLabels: {role: db}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {role: backend}}}]\n    ports: [{port: 5432}]\n".to_string(),
        "  podSelector: {matchLabels: {role: frontend}}\n  ingress:\n  - from: [{namespaceSelector: {matchLabels: {purpose: ingress}}, podSelector: {matchLabels: {app: app-0}}}]\n    ports: [{port: 80}, {port: 443}]\n".to_string(),
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n  - to: [{namespaceSelector: {matchLabels: {purpose: dns}}, podSelector: {matchLabels: {app: app-1}}}]\n    ports: [{protocol: UDP, port: 53}, {port: 53}]\n".to_string(),
        "  podSelector: {matchLabels: {role: frontend}}\n  ingress:\n  - from: [{namespaceSelector: {matchLabels: {env: prod}}, podSelector: {matchLabels: {role: frontend}}}]\n".to_string(),
        "  podSelector: {matchLabels: {role: backend}}\n  policyTypes: [Egress]\n  egress:\n  - to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}}]\n    ports: [{port: 443}]\n".to_string(),
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{to: [{namespaceSelector: {}, podSelector: {}}]}]\n".to_string(),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(j, spec)| (format!("p-{j}"), spec))
        .collect()
}

fn policy(ns: &str, name: &str, spec: &str) -> NetworkPolicy {
    objects::network_policy(ns, name, spec).object()
}

/// Pod `k`'s address: pods of one namespace are not adjacent (`k` runs over namespaces
/// first), so peer sets do not collapse into a few prefixes.
fn pod_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 1)) + k as u32)
}

fn cluster(namespaces: usize, pods: usize, policies_per_ns: usize) -> Snapshot {
    let mut b = Snapshot::builder();
    for i in 0..namespaces {
        let env = if i % 2 == 0 { "prod" } else { "dev" };
        let mut labels = vec![("env", env)];
        match i {
            0 => labels.push(("purpose", "monitoring")),
            1 => labels.push(("purpose", "ingress")),
            2 => labels.push(("purpose", "dns")),
            _ => {}
        }
        let ns = format!("ns-{i}");
        b.insert(objects::namespace(&ns, &labels).object());
        for (name, spec) in policies(8080).into_iter().take(policies_per_ns) {
            b.insert(policy(&ns, &name, &spec));
        }
    }
    for k in 0..pods {
        let ns = format!("ns-{}", k % namespaces);
        let app = format!("app-{}", (k / namespaces) % 5);
        b.insert(
            objects::pod(&ns, &format!("pod-{k}"))
                .on(NODE)
                .labels(&[("app", &app), ("role", ROLES[(k / namespaces) % 4])])
                .ips(&[pod_ip(k)])
                .object(),
        );
    }
    b.build()
}

/// Cold plan and apply of both tables (inet, then bridge: what the agent's first sync
/// writes), then `edits` edits of one policy (a port of `ns-<k>/p-3`), each planned, diffed
/// and applied to both tables.
pub fn run(namespaces: usize, pods: usize, edits: usize) {
    let per_ns = 10;
    let mut lab = Lab::new();
    let host = lab.add_host("scale");
    let cfg = Config::for_node(NODE);
    host.enter(|| {
        let mut inet = Engine::new(NftnlBackend::new());
        let mut bridge = Engine::new(NftnlBackend::new());
        let mut snap = cluster(namespaces, pods, per_ns);
        let t = Instant::now();
        let mut d = plan_with(&snap, &cfg, &Memory::default());
        let plan = t.elapsed();
        let t = Instant::now();
        let mut ops = inet.sync(d.ruleset).expect("cold apply (inet)").ops;
        ops += bridge
            .sync(d.extra_tables.remove(Family::Bridge, TABLE_NAME).expect("a bridge table"))
            .expect("cold apply (bridge)")
            .ops;
        let apply = t.elapsed();
        println!(
            "{} policies x {pods} pods / {namespaces} namespaces: cold plan {:.1} ms + apply {:.1} ms = {:.1} ms, {ops} nft operations (both tables)",
            namespaces * per_ns,
            ms(plan),
            ms(apply),
            ms(plan + apply),
        );
        let mut memory = d.memory;
        let mut samples: Vec<(Duration, Duration, usize)> = Vec::new();
        for e in 0..edits {
            let ns = format!("ns-{}", (e * 7) % namespaces);
            let (name, spec) = policies(9000 + e).swap_remove(3);
            let mut b = snap.to_builder();
            b.insert(policy(&ns, &name, &spec));
            snap = b.build();
            let t = Instant::now();
            let mut d = plan_with(&snap, &cfg, &memory);
            let plan = t.elapsed();
            let t = Instant::now();
            let mut ops = inet.sync(d.ruleset).expect("apply an edit (inet)").ops;
            ops += bridge
                .sync(d.extra_tables.remove(Family::Bridge, TABLE_NAME).expect("a bridge table"))
                .expect("apply an edit (bridge)")
                .ops;
            samples.push((plan, t.elapsed(), ops));
            memory = d.memory;
        }
        if samples.is_empty() {
            return;
        }
        let mut total: Vec<Duration> = samples.iter().map(|s| s.0 + s.1).collect();
        let mut plan: Vec<Duration> = samples.iter().map(|s| s.0).collect();
        let most_ops = samples.iter().map(|s| s.2).max().unwrap_or(0);
        println!(
            "  one policy edit (median of {}): {:.2} ms (plan {:.2} ms), p99 {:.2} ms, <= {most_ops} nft operations",
            samples.len(),
            ms(percentile(&mut total, 0.5)),
            ms(percentile(&mut plan, 0.5)),
            ms(percentile(&mut total, 0.99)),
        );
    });
}
