//! The drift monitor's quiet window (`src/nft/monitor/quiet.rs`): the agent's large commits go
//! out while the monitor is out of `NFNLGRP_NFTABLES`, and a commit by someone else inside
//! that window is still a drift (by generation), which a read-back repairs.

use nodeplane::nft::monitor::{DEFAULT_RCVBUF, QUIET_MIN_OPS};
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::{Engine, TABLE_NAME};
use nodeplane::testing::lab::{Monitored, Ns, eventually};
use nodeplane::testing::large;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
/// The foreign rule as `nft list` prints it (base chains say `policy accept`).
const RULE: &str = "\t\taccept\n";
/// Elements of a table applied in one quiet window.
const LARGE: u32 = 5000;

fn table(elements: u32) -> nodeplane::nft::Table {
    large::large_table(20, elements)
}

fn listing(ns: &Ns) -> String {
    ns.nft(&["list", "table", "inet", TABLE_NAME])
        .expect("our table")
}

#[track_caller]
fn wait_count(counter: &AtomicU64, n: u64, what: &str) {
    eventually(WAIT, || match counter.load(Relaxed) {
        v if v >= n => Ok(()),
        v => Err(format!("{what}: {v}, want {n}")),
    });
}

#[test]
fn the_agents_large_commits_go_unheard_and_raise_no_drift() {
    let m = Monitored::start("quiet", DEFAULT_RCVBUF);
    let stats = m.monitor.stats();
    let backend = NftnlBackend::new().with_quiet(Some(m.monitor.quiet().expect("quiet")));
    let mut engine = Engine::new(backend);
    let applied =
        m.ns.enter(|| engine.sync(table(LARGE)).expect("cold apply"));
    assert!(applied.ops >= QUIET_MIN_OPS, "{applied:?}");
    // The window closed with the generation one ahead (this kernel bumps it once per
    // commit), and none of the commit's notifications was read.
    wait_count(&stats.quiet_windows, 1, "quiet windows closed");
    assert_eq!(stats.own_commits.load(Relaxed), 0);
    assert_eq!(stats.quiet_unseen.load(Relaxed), 0);
    // A small update is heard as the agent's own, as before.
    m.ns.enter(|| engine.sync(table(LARGE + 1)).expect("small update"));
    wait_count(&stats.own_commits, 1, "own commits heard");
    // And a second large one is quiet again.
    m.ns.enter(|| engine.sync(table(2 * LARGE)).expect("large update"));
    wait_count(&stats.quiet_windows, 2, "quiet windows closed");
    // Someone else's commit afterwards is reported as usual, and nothing before it was.
    m.ns.nft(&[&format!("add rule inet {TABLE_NAME} svc-3 accept")])
        .unwrap();
    let d = m.rx.recv_timeout(WAIT).expect("a drift report");
    assert!(!d.unseen, "{d}");
    assert!(d.to_string().starts_with("chain svc-3 1 rule added"), "{d}");
    assert!(m.rx.try_recv().is_err());
    assert_eq!(stats.own_commits.load(Relaxed), 1);
    m.monitor.stop();
}

#[test]
fn a_foreign_commit_inside_the_quiet_window_is_a_drift_and_is_repaired() {
    let m = Monitored::start("quiet", DEFAULT_RCVBUF);
    let stats = m.monitor.stats();
    let mut quiet = m.monitor.quiet().expect("quiet");
    // The window is driven here, around an engine of its own, so that the foreign commit
    // lands inside it deterministically: before the agent's commit, and after it (before the
    // re-join: its notifications are never heard).
    let mut engine = Engine::new(NftnlBackend::new());
    m.ns.enter(|| engine.sync(table(LARGE)).expect("cold apply"));
    let expected = listing(&m.ns);
    for (round, foreign_first) in [(1, true), (2, false)] {
        let foreign = || {
            m.ns.nft(&[&format!("add rule inet {TABLE_NAME} svc-{round} accept")])
                .expect("foreign commit")
        };
        let desired = table(LARGE + round);
        let done = quiet.during(
            || {
                if foreign_first {
                    foreign();
                }
                let r = m.ns.enter(|| engine.sync(desired.clone()));
                if !foreign_first {
                    foreign();
                }
                r
            },
            |r| r.is_ok(),
        );
        done.expect("the agent's commit");
        let d =
            m.rx.recv_timeout(WAIT)
                .expect("a drift for the unheard commit");
        assert!(d.unseen, "round {round}: {d}");
        assert!(d.to_string().contains("not listening"), "{d}");
        assert_eq!(stats.quiet_unseen.load(Relaxed), u64::from(round));
        // What the run loop does on a drift: forget, read back, repair.
        assert!(listing(&m.ns).contains(RULE), "the foreign rule is there");
        engine.invalidate();
        let read_backs = engine.read_backs();
        m.ns.enter(|| engine.sync(desired).expect("repair"));
        assert_eq!(engine.read_backs(), read_backs + 1);
        let now = listing(&m.ns);
        assert!(!now.contains(RULE), "not repaired:\n{now}");
        // The repair went out heard (no quiet handle here): the agent's own, no drift.
        m.ns.enter(|| engine.sync(table(LARGE)).expect("back"));
        assert_eq!(listing(&m.ns), expected);
    }
    // Only the two unheard commits were reported.
    wait_count(&stats.own_commits, 4, "own commits heard");
    assert!(m.rx.try_recv().is_err());
    m.monitor.stop();
}
