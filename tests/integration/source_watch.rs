//! The manifest directory watcher: prompt, debounced, and deaf to its own reads.

use std::fs;
use std::time::{Duration, Instant};

use nodeplane::source::manifests::load_dir;
use nodeplane::source::watch::watch_dir;
use tokio::sync::mpsc::Receiver;
use tokio::time::timeout;

const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";

async fn expect_change(rx: &mut Receiver<()>, within: Duration) -> Duration {
    let start = Instant::now();
    timeout(within, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no change notification within {within:?}"))
        .expect("watcher stopped");
    start.elapsed()
}

async fn expect_quiet(rx: &mut Receiver<()>, for_: Duration) {
    if let Ok(got) = timeout(for_, rx.recv()).await {
        panic!("unexpected notification: {got:?}");
    }
}

#[tokio::test]
async fn file_write_notifies_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = watch_dir(dir.path()).unwrap();
    fs::write(dir.path().join("ns.yaml"), NS).unwrap();
    let took = expect_change(&mut rx, Duration::from_secs(1)).await;
    assert!(
        took >= Duration::from_millis(150),
        "not debounced: {took:?}"
    );
}

#[tokio::test]
async fn nested_directories_are_watched() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("a/b")).unwrap();
    let mut rx = watch_dir(dir.path()).unwrap();
    fs::write(dir.path().join("a/b/ns.yaml"), NS).unwrap();
    expect_change(&mut rx, Duration::from_secs(1)).await;
    // A directory created after the watch started is watched too.
    fs::create_dir(dir.path().join("new")).unwrap();
    expect_change(&mut rx, Duration::from_secs(1)).await;
    fs::write(dir.path().join("new/ns.yaml"), NS).unwrap();
    expect_change(&mut rx, Duration::from_secs(1)).await;
    fs::remove_file(dir.path().join("a/b/ns.yaml")).unwrap();
    expect_change(&mut rx, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_burst_of_writes_is_one_notification() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = watch_dir(dir.path()).unwrap();
    for i in 0..10 {
        fs::write(dir.path().join(format!("ns{i}.yaml")), NS).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    expect_change(&mut rx, Duration::from_secs(1)).await;
    expect_quiet(&mut rx, Duration::from_millis(600)).await;
}

#[tokio::test]
async fn reading_the_directory_does_not_notify() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("ns.yaml"), NS).unwrap();
    let mut rx = watch_dir(dir.path()).unwrap();
    let report = load_dir(dir.path()).unwrap();
    assert_eq!(report.snapshot.len(), 1);
    expect_quiet(&mut rx, Duration::from_millis(600)).await;
}

#[test]
fn watching_a_missing_directory_fails() {
    let dir = tempfile::tempdir().unwrap();
    let err = watch_dir(&dir.path().join("missing")).unwrap_err();
    assert!(err.to_string().starts_with("cannot watch "), "{err}");
}
