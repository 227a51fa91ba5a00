use super::*;
use crate::api::{EgressFirewall, EgressIP, EgressQoS, NetworkPolicy};
use crate::config::Config;
use crate::plan::{Desired, plan, plan_with};
use crate::snapshot::Snapshot;
use crate::testing::objects;
use std::os::unix::fs::PermissionsExt;

const NODE: &str = "worker-1";

fn fw(ns: &str, cidr: &str) -> EgressFirewall {
    let rules = format!("[{{type: Deny, to: {{cidrSelector: '{cidr}'}}}}]");
    objects::egress_firewall(ns, &rules).object()
}

fn qos(ns: &str, dscp: u32) -> EgressQoS {
    objects::egress_qos(ns, &format!("[{{dscp: {dscp}}}]")).object()
}

fn eip(name: &str, ip: &str) -> EgressIP {
    let eip = objects::egress_ip(name, &[ip], &[("team", "a")]);
    eip.hosted(&[(ip, NODE)]).object()
}

fn snapshot(fw_cidr: &str) -> Snapshot {
    snapshot_of(fw_cidr, 46, "192.168.50.200")
}

fn snapshot_of(fw_cidr: &str, dscp: u32, egress_ip: &str) -> Snapshot {
    Snapshot::builder()
        .with(objects::namespace("alpha", &[("team", "a")]).object())
        .with(
            objects::pod("alpha", "p")
                .on(NODE)
                .ips(&["10.128.0.5"])
                .object(),
        )
        .with(fw("alpha", fw_cidr))
        .with(fw("beta", "198.51.100.0/24"))
        .with(qos("alpha", dscp))
        .with(eip("e1", egress_ip))
        .build()
}

fn planned(fw_cidr: &str) -> Desired {
    plan(&snapshot(fw_cidr), &Config::for_node(NODE))
}

fn store(dir: &Path) -> StateStore {
    StateStore::new(dir, NODE)
}

fn reasons(loaded: &Loaded) -> Vec<String> {
    loaded.problems.iter().map(|p| p.to_string()).collect()
}

fn write_file(dir: &Path, value: serde_json::Value) -> PathBuf {
    let path = dir.join(FILE_NAME);
    std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
    path
}

fn file_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(FILE_NAME)).unwrap()).unwrap()
}

#[test]
fn round_trip_keeps_every_kind_and_plans_invalid_objects_of_each_kind_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = planned("203.0.113.0/24");
    assert!(
        store(dir.path()).save(&first.memory),
        "written when the store is dropped"
    );

    let header = file_json(dir.path());
    assert_eq!(header["format"], FORMAT);
    assert_eq!(header["node"], NODE);
    assert_eq!(header["egressFirewalls"].as_array().unwrap().len(), 2);
    assert_eq!(header["egressFirewalls"][0]["kind"], "EgressFirewall");

    let loaded = store(dir.path()).load();
    assert!(loaded.found && loaded.problems.is_empty(), "{loaded:?}");
    let lv = &loaded.last_valid;
    assert_eq!(lv.len(), 4);
    assert_eq!(*lv.firewall["alpha"].object, fw("alpha", "203.0.113.0/24"));
    assert_eq!(
        lv.firewall["alpha"].valid,
        first.memory.firewall.validated.in_force["alpha"].valid
    );
    assert_eq!(
        lv.qos["alpha"].valid,
        first.memory.qos.in_force["alpha"].valid
    );
    assert_eq!(
        lv.egress_ip["e1"].valid,
        first.memory.egress_ip.in_force["e1"].valid
    );
    assert!(lv.same_as(&first.memory), "equal objects compare equal");

    // Every kind turns invalid. A fresh agent seeded from the file plans each one as the
    // agent that remembered it in memory: the same ruleset and addresses.
    let broken = snapshot_of("203.0.113.300/24", 99, "192.168.50.300");
    let cfg = Config::for_node(NODE);
    let from_file = plan_with(&broken, &cfg, &loaded.last_valid.into_memory());
    let from_memory = plan_with(&broken, &cfg, &first.memory);
    assert_eq!(from_file.ruleset, from_memory.ruleset);
    assert_eq!(from_file.net, from_memory.net);
    assert_eq!(from_file.ruleset, first.ruleset, "the last valid rules");
    assert_eq!(from_file.net, first.net);
    let errors = from_file.statuses.iter().filter(|s| s.result.is_err());
    assert_eq!(errors.count(), 3, "{:?}", from_file.statuses);
    // Without the file each would have nothing: no firewall, no marks, no egress IP.
    let fresh = plan(&broken, &cfg);
    assert!(first.ruleset.part("fw/alpha").is_some());
    assert!(fresh.ruleset.part("fw/alpha").is_none());
    for set in ["qos-pods-v4", "eip-snat-v4"] {
        assert!(
            !first.ruleset.flatten().sets[set].elements.is_empty(),
            "{set}"
        );
        assert!(
            fresh.ruleset.flatten().sets[set].elements.is_empty(),
            "{set}"
        );
    }
    assert!(fresh.net.addresses.is_empty() && !first.net.addresses.is_empty());
}

#[test]
fn a_missing_file_is_no_problem() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = store(&dir.path().join("not-yet")).load();
    assert!(!loaded.found && loaded.problems.is_empty() && loaded.last_valid.is_empty());
}

#[test]
fn corrupt_json_is_ignored_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    for (text, reason) in [
        (
            &b"{\"format\": \"nodeplane/last-valid/v1\", \"node\""[..],
            "not JSON",
        ),
        (b"\x00\xff", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
    ] {
        std::fs::write(&path, text).unwrap();
        let loaded = store(dir.path()).load();
        assert!(loaded.last_valid.is_empty());
        let r = reasons(&loaded);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].starts_with(&format!("{}: corrupt ({reason}", path.display())),
            "{r:?}"
        );
    }
    let mut v = serde_json::json!({"format": FORMAT, "node": NODE, "egressIPs": {"a": 1}});
    write_file(dir.path(), v.take());
    let r = reasons(&store(dir.path()).load());
    assert!(r[0].contains("corrupt (egressIPs is not a list)"), "{r:?}");
}

#[test]
fn a_file_of_another_node_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path()).save(&planned("203.0.113.0/24").memory);
    let loaded = StateStore::new(dir.path(), "worker-2").load();
    assert!(loaded.found && loaded.last_valid.is_empty());
    assert_eq!(
        reasons(&loaded),
        [format!(
            "{}: written for node \"worker-1\", this agent serves node \"worker-2\"; ignored",
            dir.path().join(FILE_NAME).display()
        )]
    );
}

#[test]
fn an_unknown_format_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let fw = serde_json::to_value(fw("alpha", "203.0.113.0/24")).unwrap();
    for (format, shown) in [
        (
            serde_json::json!("nodeplane/last-valid/v2"),
            "\"nodeplane/last-valid/v2\"",
        ),
        (serde_json::json!(1), "1"),
        (serde_json::Value::Null, "null"),
    ] {
        let path = write_file(
            dir.path(),
            serde_json::json!({"format": format, "node": NODE, "egressFirewalls": [fw]}),
        );
        let loaded = store(dir.path()).load();
        assert!(loaded.last_valid.is_empty());
        assert_eq!(
            reasons(&loaded),
            [format!(
                "{}: unknown format {shown} (this agent reads \"{FORMAT}\"); ignored",
                path.display()
            )]
        );
    }
    write_file(dir.path(), serde_json::json!({"node": NODE}));
    let r = reasons(&store(dir.path()).load());
    assert!(r[0].contains("unknown format (none)"), "{r:?}");
}

#[test]
fn an_object_that_no_longer_validates_is_dropped_and_the_rest_kept() {
    let dir = tempfile::tempdir().unwrap();
    let good = fw("alpha", "203.0.113.0/24");
    let path = write_file(
        dir.path(),
        serde_json::json!({
            "format": FORMAT,
            "node": NODE,
            "egressFirewalls": [
                good,
                fw("beta", "203.0.113.300/24"),
                {"kind": "EgressFirewall", "spec": 5},
                fw("alpha", "198.51.100.0/24"),
            ],
            "egressQoSes": [qos("alpha", 64)],
            "egressIPs": [eip("e1", "192.168.50.200")],
        }),
    );
    let mut s = store(dir.path());
    let loaded = s.load();
    let lv = &loaded.last_valid;
    assert_eq!(lv.firewall.keys().collect::<Vec<_>>(), ["alpha"]);
    assert_eq!(
        *lv.firewall["alpha"].object, good,
        "the first of a namespace"
    );
    assert!(lv.qos.is_empty());
    assert_eq!(lv.egress_ip.len(), 1);
    let p = path.display();
    assert_eq!(
        reasons(&loaded),
        [
            format!(
                "{p}: egressFirewalls[1]: no longer valid: EgressFirewall beta/default: \
                 spec.egress[0].to.cidrSelector: invalid CIDR \"203.0.113.300/24\"; ignored"
            ),
            format!(
                "{p}: egressFirewalls[2]: cannot decode: invalid type: integer `5`, expected \
                 struct EgressFirewallSpec; ignored"
            ),
            format!("{p}: egressFirewalls[3]: a second object for alpha; ignored"),
            format!(
                "{p}: egressQoSes[0]: no longer valid: EgressQoS alpha/default: \
                 spec.egress[0].dscp: dscp 64 out of range 0-63; ignored"
            ),
        ]
    );
    // The same in a file that decodes as a whole (the one-pass path).
    write_file(
        dir.path(),
        serde_json::json!({
            "format": FORMAT,
            "node": NODE,
            "egressFirewalls": [fw("beta", "203.0.113.300/24"), good],
            "egressQoSes": [qos("alpha", 64)],
            "egressIPs": [],
        }),
    );
    let whole = store(dir.path()).load();
    assert_eq!(
        whole.last_valid.firewall.keys().collect::<Vec<_>>(),
        ["alpha"]
    );
    assert!(whole.last_valid.qos.is_empty());
    let r = reasons(&whole);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].contains("egressFirewalls[0]: no longer valid: EgressFirewall beta/default"));
    assert!(r[1].contains("egressQoSes[0]: no longer valid: EgressQoS alpha/default"));
    // A file with problems is rewritten at the next save, even with the same objects.
    let memory = lv.clone().into_memory();
    assert!(s.save(&memory));
    s.flush().unwrap();
    assert!(store(dir.path()).load().problems.is_empty());
    assert!(!s.save(&memory));
}

#[test]
fn the_write_is_atomic_and_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/nodeplane");
    let memory = planned("203.0.113.0/24").memory;
    let mut s = store(&dir);
    assert!(s.save(&memory));
    s.flush().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "a missing directory is created 0700");
    assert_eq!(mode(&dir.join(FILE_NAME)), 0o600);
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&dir), [FILE_NAME]);
    // A leftover temporary file of a crashed write is replaced, not left next to the file.
    std::fs::write(dir.join(TMP_NAME), "partial").unwrap();
    let other = planned("198.51.100.0/24").memory;
    assert!(s.save(&other));
    s.flush().unwrap();
    assert_eq!(names(&dir), [FILE_NAME]);
    let loaded = store(&dir).load();
    assert_eq!(
        *loaded.last_valid.firewall["alpha"].object,
        fw("alpha", "198.51.100.0/24")
    );
}

#[test]
fn nothing_is_written_when_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::for_node(NODE);
    let mut s = store(dir.path());
    let first = planned("203.0.113.0/24");
    assert!(s.save(&first.memory));
    s.flush().unwrap();
    // Deleted behind the agent's back: no write proves that save did not write.
    std::fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
    assert!(!s.save(&first.memory));
    // A re-plan of an equal snapshot (new objects, as from a fresh read of the manifests)
    // keeps the objects in force: nothing to write either.
    let again = plan_with(&snapshot("203.0.113.0/24"), &cfg, &first.memory);
    assert!(!s.save(&again.memory));
    // An invalid edit keeps the last valid object in force: nothing new to remember.
    let broken = plan_with(&snapshot("203.0.113.300/24"), &cfg, &again.memory);
    assert!(!s.save(&broken.memory));
    assert!(!dir.path().join(FILE_NAME).exists());
    // A valid change is written.
    let changed = plan_with(&snapshot("198.51.100.0/24"), &cfg, &broken.memory);
    assert!(s.save(&changed.memory));
    s.flush().unwrap();
    assert!(dir.path().join(FILE_NAME).exists());
    // So is a deleted object.
    let gone = plan_with(&Snapshot::default(), &cfg, &changed.memory);
    assert!(s.save(&gone.memory));
    s.flush().unwrap();
    assert!(store(dir.path()).load().last_valid.is_empty());
    // A loaded file that matches is not rewritten either.
    let mut s = store(dir.path());
    s.load();
    assert!(!s.save(&gone.memory));
}

#[test]
fn a_failed_write_is_an_error_and_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    // A directory below a regular file cannot be created, whatever the user's privileges.
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let mut s = store(&blocker.join("state"));
    let memory = planned("203.0.113.0/24").memory;
    assert!(s.save(&memory));
    let e = s.flush().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}: cannot write: ",
            blocker.join("state").join(FILE_NAME).display()
        )),
        "{e}"
    );
    assert!(s.save(&memory), "tried again");
    assert!(s.flush().is_err());
    assert!(s.flush().is_ok(), "one failed write is reported once");
    std::fs::remove_file(&blocker).unwrap();
    assert!(s.save(&memory), "tried again");
    s.flush().unwrap();
    assert!(
        blocker.join("state").join(FILE_NAME).exists(),
        "written once possible"
    );
    assert!(!s.save(&memory));
}

#[test]
fn a_new_reconciler_plans_an_invalid_object_from_the_saved_state() {
    use crate::net::{FakeNetBackend, NetConfig};
    use crate::nft::FakeBackend;
    use crate::reconcile::Reconciler;
    let dir = tempfile::tempdir().unwrap();
    let reconciler = |state: bool| {
        let net = FakeNetBackend::new(NetConfig::default())
            .with_link("eth0")
            .with_address("eth0", "192.168.50.11/24");
        let rec = Reconciler::new(Config::for_node(NODE), FakeBackend::default(), net);
        if state {
            rec.with_state(store(dir.path()))
        } else {
            rec
        }
    };
    let mut first = reconciler(true);
    first.sync(&snapshot("203.0.113.0/24")).unwrap();
    let applied = first.applied().unwrap().clone();
    drop(first); // the agent stops: it waits for the write it queued after the sync
    assert!(dir.path().join(FILE_NAME).exists(), "saved after the sync");

    // A restarted agent, the object now invalid: the same table, and the status says why.
    let mut second = reconciler(true);
    let report = second.sync(&snapshot("203.0.113.300/24")).unwrap();
    assert_eq!(second.applied().unwrap(), &applied);
    let alpha = report
        .statuses
        .iter()
        .find(|s| s.key.namespace == "alpha" && s.key.name == "default")
        .unwrap();
    assert!(alpha.result.as_ref().unwrap_err().contains("invalid CIDR"));
    // Without the state, alpha would fall open.
    let mut stateless = reconciler(false);
    stateless.sync(&snapshot("203.0.113.300/24")).unwrap();
    assert_ne!(stateless.applied().unwrap(), &applied);
}

#[test]
fn the_newest_queued_version_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store(dir.path());
    for cidr in ["203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/24"] {
        assert!(s.save(&planned(cidr).memory));
    }
    s.flush().unwrap();
    let loaded = store(dir.path()).load();
    assert_eq!(
        *loaded.last_valid.firewall["alpha"].object,
        fw("alpha", "192.0.2.0/24")
    );
}

#[test]
fn network_policies_round_trip_and_a_file_without_them_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let policy = |cidr: &str| -> NetworkPolicy {
        let spec = format!(
            "  podSelector: {{}}\n  ingress: [{{from: [{{ipBlock: {{cidr: '{cidr}'}}}}]}}]\n"
        );
        objects::network_policy("alpha", "from-block", &spec).object()
    };
    let with_policy = |cidr: &str| {
        let mut b = snapshot("203.0.113.0/24").to_builder();
        b.insert(policy(cidr));
        b.build()
    };
    let cfg = Config::for_node(NODE);
    let first = plan(&with_policy("192.0.2.0/24"), &cfg);
    assert!(store(dir.path()).save(&first.memory));
    assert_eq!(
        file_json(dir.path())["networkPolicies"][0]["kind"],
        "NetworkPolicy"
    );
    let loaded = store(dir.path()).load();
    assert!(loaded.problems.is_empty(), "{loaded:?}");
    assert_eq!(loaded.last_valid.netpol.len(), 1);
    // The policy turns invalid while the agent is down: the restarted agent keeps it.
    let broken = with_policy("192.0.2.0/33");
    let from_file = plan_with(&broken, &cfg, &loaded.last_valid.into_memory());
    assert_eq!(from_file.ruleset, first.ruleset);
    assert!(
        plan(&broken, &cfg)
            .ruleset
            .part("np/alpha/from-block")
            .is_none()
    );

    // Files without policies are written without the field, as older agents wrote them.
    let other = tempfile::tempdir().unwrap();
    assert!(store(other.path()).save(&planned("203.0.113.0/24").memory));
    assert!(file_json(other.path()).get("networkPolicies").is_none());
    assert!(store(other.path()).load().problems.is_empty());
}

/// State files written by the agent before each feature wrote its own fields (`agent --once
/// --manifests examples/cluster --node-name worker-1`, with and without NetworkPolicy).
/// Each with the number of NetworkPolicies it holds.
const FILES_OF_EARLIER_AGENTS: [(&str, &[u8], usize); 2] = [
    (
        "last-valid-v1.json",
        include_bytes!("../../tests/fixtures/state/last-valid-v1.json"),
        1,
    ),
    (
        "last-valid-v1-without-policies.json",
        include_bytes!("../../tests/fixtures/state/last-valid-v1-without-policies.json"),
        0,
    ),
];

#[test]
fn a_file_an_earlier_agent_wrote_loads_whole_and_is_written_again_byte_for_byte() {
    for (name, bytes, policies) in FILES_OF_EARLIER_AGENTS {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), bytes).unwrap();
        let loaded = store(dir.path()).load();
        assert!(loaded.problems.is_empty(), "{name}: {:?}", reasons(&loaded));
        let kinds = (
            loaded.last_valid.firewall.len(),
            loaded.last_valid.qos.len(),
        );
        assert_eq!(kinds, (1, 1), "{name}");
        assert_eq!(loaded.last_valid.egress_ip.len(), 1, "{name}");
        assert_eq!(loaded.last_valid.netpol.len(), policies, "{name}");
        // The fixtures were written by agent 0.1.0; the header says which agent wrote a file.
        let written = String::from_utf8(encode(&loaded.last_valid, NODE)).unwrap();
        let this_agent = format!("\"agentVersion\":\"{}\"", env!("CARGO_PKG_VERSION"));
        let written = written.replacen(&this_agent, "\"agentVersion\":\"0.1.0\"", 1);
        assert_eq!(written.as_bytes(), bytes, "{name}");
    }
}
