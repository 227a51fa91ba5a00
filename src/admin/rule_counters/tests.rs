use super::index::{firewall_rule, qos_rule};
use super::*;
use crate::admin::Metrics;
use crate::config::Config;
use crate::nft::nftnl::{ElemCount, RuleCount, TableCounters};
use crate::plan::plan;
use crate::snapshot::{Snapshot, SnapshotBuilder};
use crate::testing::objects;

const NODE: &str = "worker-1";

const FIREWALL: &str = "[\
    {type: Allow, to: {cidrSelector: 203.0.113.0/24}, ports: [{protocol: TCP, port: 443}]}, \
    {type: Allow, to: {dnsName: api.example.com}}, \
    {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";

/// `shop/db` is selected by two policies for ingress (`db` and `lockdown`, which allows
/// nothing): its isolation drop is shared by both.
fn cluster() -> SnapshotBuilder {
    let pod = |name: &str, app: &str, ip: &str| {
        objects::pod("shop", name)
            .on(NODE)
            .labels(&[("app", app)])
            .ips(&[ip])
            .object()
    };
    let db = "  podSelector: {matchLabels: {app: db}}\n  ingress:\n  \
              - from: [{podSelector: {matchLabels: {app: web}}}]\n";
    let lockdown = "  podSelector: {matchLabels: {app: db}}\n  policyTypes: [Ingress]\n";
    Snapshot::builder()
        .with(objects::namespace("shop", &[]).object())
        .with(pod("db", "db", "10.128.0.2"))
        .with(pod("web", "web", "10.128.0.3"))
        .with(objects::egress_firewall("shop", FIREWALL).object())
        .with(objects::egress_qos("shop", "[{dscp: 46}, {dscp: 8, dstCIDR: 0.0.0.0/0}]").object())
        .with(objects::network_policy("shop", "db", db).object())
        .with(objects::network_policy("shop", "lockdown", lockdown).object())
}

fn applied(b: SnapshotBuilder) -> Table {
    plan(&b.build(), &Config::for_node(NODE)).ruleset
}

/// The one chain whose rules satisfy `pick`.
fn chain_where(table: &Table, pick: impl Fn(&crate::nft::ir::Chain) -> bool) -> String {
    let found: Vec<_> = table.all_chains().filter(|c| pick(c)).collect();
    assert_eq!(found.len(), 1, "{:?}", found);
    found[0].name.clone()
}

fn rule(chain: &str, comment: Option<&str>, packets: u64) -> RuleCount {
    RuleCount {
        chain: chain.into(),
        comment: comment.map(Into::into),
        counted: Counted {
            packets,
            bytes: packets * 100,
        },
    }
}

/// What the kernel would list for `table`: chosen counts on the rules and elements of each
/// feature, and rules the table does not know (another object's, a base chain's).
fn kernel(table: &Table) -> TableCounters {
    let commented = |text: &str| {
        chain_where(table, |c| {
            c.rules.iter().any(|r| r.comment.as_deref() == Some(text))
        })
    };
    let dns = commented("rule 1: Allow dnsName api.example.com");
    let qos = commented("EgressQoS shop rule 0");
    let db_in = commented("NetworkPolicy shop/db ingress[0]");
    let set = chain_where(table, |c| c.rules.len() == 3 && c.name.starts_with("np-in"));
    let deny_map = (table.part("fw/shop").unwrap().sets.values())
        .find(|s| {
            s.elements
                .values()
                .any(|e| e.comment.as_deref() == Some("rule 2: Deny 0.0.0.0/0"))
        })
        .unwrap()
        .name
        .clone();
    let elem = |comment: &str, packets: u64| ElemCount {
        comment: Some(comment.into()),
        counted: Counted {
            packets,
            bytes: packets * 100,
        },
    };
    TableCounters {
        rules: vec![
            rule(&dns, Some("rule 1: Allow dnsName api.example.com"), 4),
            rule(&dns, Some("rule 1: Allow dnsName api.example.com"), 1),
            rule(&qos, Some("EgressQoS shop rule 0"), 7),
            rule(&db_in, Some("NetworkPolicy shop/db ingress[0]"), 2),
            rule(&set, None, 5),
            rule("filter-forward", Some("pod-traffic-probe"), 1000),
            rule("fw-gone", Some("rule 9: Deny 0.0.0.0/0"), 1000),
        ],
        elements: [(deny_map, vec![elem("rule 2: Deny 0.0.0.0/0", 3)])].into(),
    }
}

fn exposition(counters: &RuleCounters) -> String {
    let m = Metrics::new();
    m.rule_counters.publish((*counters.latest()).clone());
    m.encode()
}

fn lines_of(text: &str, prefix: &str) -> Vec<String> {
    let mut lines: Vec<String> = (text.lines())
        .filter(|l| l.starts_with(prefix))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[test]
fn kernel_counts_become_series_per_rule_and_policy() {
    let table = applied(cluster());
    let index = Index::of(&table);
    let counters = RuleCounters::default();
    // The bridge table holds the same policy chains: its counts add up with the inet one's.
    let db_in = kernel(&table).rules[3].clone();
    let bridge = TableCounters {
        rules: vec![db_in],
        ..Default::default()
    };
    counters.publish(index.tally(&[kernel(&table), bridge]));
    let text = exposition(&counters);
    let firewall = "nodeplane_egress_firewall_rule_packets_total";
    assert_eq!(
        lines_of(&text, firewall),
        [
            format!("{firewall}{{namespace=\"shop\",name=\"default\",rule=\"0\"}} 0"),
            format!("{firewall}{{namespace=\"shop\",name=\"default\",rule=\"1\"}} 5"),
            format!("{firewall}{{namespace=\"shop\",name=\"default\",rule=\"2\"}} 3"),
        ],
        "{text}"
    );
    let bytes = "nodeplane_egress_firewall_rule_bytes_total";
    assert!(text.contains(&format!(
        "{bytes}{{namespace=\"shop\",name=\"default\",rule=\"1\"}} 500\n"
    )));
    let qos = "nodeplane_egress_qos_rule_packets_total";
    assert_eq!(
        lines_of(&text, qos),
        [
            format!("{qos}{{namespace=\"shop\",name=\"default\",rule=\"0\"}} 7"),
            format!("{qos}{{namespace=\"shop\",name=\"default\",rule=\"1\"}} 0"),
        ]
    );
    let np = "nodeplane_network_policy_packets_total";
    let series = |name: &str, verdict: &str, n: u64| {
        format!(
            "{np}{{namespace=\"shop\",name=\"{name}\",direction=\"ingress\",verdict=\"{verdict}\"}} {n}"
        )
    };
    assert_eq!(
        lines_of(&text, np),
        [
            // The drop of db's policy set counts for both policies selecting db.
            series("db", "allow", 4),
            series("db", "deny", 5),
            series("lockdown", "allow", 0),
            series("lockdown", "deny", 5),
        ],
        "{text}"
    );
}

#[test]
fn series_of_deleted_objects_disappear_with_the_next_read() {
    let counters = RuleCounters::default();
    let table = applied(cluster());
    counters.publish(Index::of(&table).tally(&[kernel(&table)]));
    assert!(exposition(&counters).contains("name=\"lockdown\""));
    let after = applied(
        Snapshot::builder()
            .with(objects::namespace("shop", &[]).object())
            .with(
                objects::pod("shop", "db")
                    .on(NODE)
                    .ips(&["10.128.0.2"])
                    .object(),
            ),
    );
    // The kernel still lists the old rules until the sync that removes them: ignored.
    counters.publish(Index::of(&after).tally(&[kernel(&table)]));
    let text = exposition(&counters);
    for gone in ["egress_firewall", "egress_qos", "network_policy"] {
        assert!(!text.contains(gone), "{gone} in\n{text}");
    }
}

#[test]
fn only_the_egress_firewall_maps_are_read_element_by_element() {
    let table = applied(cluster());
    let sets = Index::of(&table).counting_sets().join(" ");
    assert!(
        !sets.is_empty() && sets.split(' ').all(|s| s.starts_with("fw-")),
        "{sets}"
    );
}

#[test]
fn rule_numbers_come_from_the_comments() {
    assert_eq!(
        firewall_rule("rule 12: Deny 0.0.0.0/0 ports TCP/80"),
        Some(12)
    );
    assert_eq!(firewall_rule("rule x: Deny"), None);
    assert_eq!(firewall_rule("pod-traffic-probe"), None);
    assert_eq!(qos_rule("EgressQoS a-b rule 3"), Some(3));
    assert_eq!(qos_rule("EgressQoS rule 3 x"), None);
}

#[test]
fn guard_drops_are_counted_by_reason_node_wide() {
    use crate::plan::netpol::{binding, bridge};
    let table = applied(cluster());
    let index = Index::of(&table);
    // The guards' drops sit in base chains and in each bridge port's chain, in both tables.
    let kernel = TableCounters {
        rules: vec![
            rule("np-forward-ingress", Some(binding::SPOOF_COMMENT), 3),
            rule("np-fl-veth1", Some(bridge::FULL_COMMENT), 2),
            rule("np-fl-veth2", Some(bridge::FULL_COMMENT), 5),
        ],
        ..Default::default()
    };
    let counters = RuleCounters::default();
    counters.publish(index.tally(&[kernel]));
    let guard = "nodeplane_network_policy_guard_drop_packets_total";
    assert_eq!(
        lines_of(&exposition(&counters), guard),
        [
            format!("{guard}{{reason=\"flow_set_full\"}} 7"),
            format!("{guard}{{reason=\"source_not_bound\"}} 3"),
            format!("{guard}{{reason=\"unlisted_address\"}} 0"),
        ]
    );
    // Without NetworkPolicy there are no guards and no series.
    let none = applied(Snapshot::builder().with(objects::namespace("shop", &[]).object()));
    let counters = RuleCounters::default();
    counters.publish(Index::of(&none).tally(&[]));
    assert!(lines_of(&exposition(&counters), guard).is_empty());
}
