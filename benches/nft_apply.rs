//! Netlink backend vs `nft -f`: applying a large table from empty, and one element on top.
//!
//! `cargo bench --bench nft_apply` (root: every run uses a fresh network namespace).
//! Options after `--`: `--runs N` (default 5), `--chains N`, `--elements N`, and
//! `--dump-text PATH` (write the `nft -f` text and exit, to profile nft by hand).
//! The table is the one the kernel test `large_table_applies_and_lists_back` uses: N regular
//! chains with two rules each, and a verdict map `ipv4_addr . inet_proto . inet_service :
//! goto chain` with M elements.

use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::render::{render_full, render_transaction};
use nodeplane::nft::*;
use nodeplane::testing::lab::{self, Lab, Ns};
use nodeplane::testing::large;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

struct Args {
    runs: usize,
    chains: u32,
    elements: u32,
    dump_text: Option<String>,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then a small smoke run proves the bench works without costing CI minutes.
    let full = argv.iter().any(|a| a == "--bench");
    let mut a = Args {
        runs: if full { 5 } else { 1 },
        chains: if full { 10_000 } else { 200 },
        elements: if full { 100_000 } else { 2_000 },
        dump_text: None,
    };
    for w in argv.windows(2) {
        let n = || {
            w[1].parse()
                .unwrap_or_else(|_| panic!("{} needs a number", w[0]))
        };
        match w[0].as_str() {
            "--runs" => a.runs = n() as usize,
            "--chains" => a.chains = n(),
            "--elements" => a.elements = n(),
            "--dump-text" => a.dump_text = Some(w[1].clone()),
            _ => {}
        }
    }
    a
}

/// `nft -f -` run from a thread that joined the netns (the child inherits it), so no
/// `ip netns exec` overhead is measured.
fn nft_stdin(text: &str) {
    lab::run_cmd(&["nft", "-f", "-"], Some(text)).unwrap_or_else(|e| panic!("{e}"));
}

/// Times of one run, in the order of the printed columns.
#[derive(Default, Clone, Copy)]
struct Run {
    ours_full: Duration,
    ours_full_cpu: Duration,
    nft_full_cpu: Duration,
    ours_encode: Duration,
    nft_full: Duration,
    ours_one: Duration,
    ours_diff: Duration,
    ours_one_apply: Duration,
    nft_one: Duration,
}

/// `table` plus one `services` element for 198.51.100.`host`.
fn one_more(table: &Table, host: u8) -> Table {
    let mut next = table.clone();
    next.sets.get_mut("services").unwrap().insert_mapping(
        vec![
            Value::Ipv4(Ipv4Addr::new(198, 51, 100, host)).into(),
            Value::Proto(proto::TCP).into(),
            Value::Port(443).into(),
        ],
        ElemData::Verdict(Verdict::Goto("svc-1".into())),
    );
    next
}

/// One run in two fresh namespaces, deleted at the end (a namespace holding a 100k-element
/// table left behind would slow the next runs down).
fn run_once(i: usize, table: &Table, next: &Table) -> Run {
    let mut lab = Lab::new();
    let mut r = Run::default();
    let ours: Ns = lab.add_host(&format!("ours{i}"));
    let theirs: Ns = lab.add_host(&format!("nft{i}"));
    ours.enter(|| {
        // Everything the agent does for a full sync: transaction, encoding, kernel.
        let mut engine = Engine::new(NftnlBackend::new());
        let desired = table.clone();
        let (start, cpu) = (Instant::now(), cpu_time().0);
        engine.sync(desired).expect("netlink apply");
        r.ours_full = start.elapsed();
        r.ours_full_cpu = cpu_time().0 - cpu;

        let tx = Transaction::full(table);
        let start = Instant::now();
        let encoded = engine.backend().encode(&tx).expect("encode");
        r.ours_encode = start.elapsed();
        drop(encoded);

        // The steady-state path: diff against the known state, then a one-op batch.
        let desired = next.clone();
        let start = Instant::now();
        let tx = engine.plan(&desired);
        r.ours_diff = start.elapsed();
        drop(tx);
        let start = Instant::now();
        let stats = engine.sync(desired).expect("one element");
        r.ours_one = start.elapsed();
        assert_eq!(stats.ops, 1);
        // The netlink part alone: one more element, transaction computed beforehand.
        let tx = diff(next, &one_more(next, 2));
        let start = Instant::now();
        engine.backend_mut().apply(&tx).expect("apply one element");
        r.ours_one_apply = start.elapsed();
    });
    let text = render_full(table);
    theirs.enter(|| {
        let (start, cpu) = (Instant::now(), cpu_time().1);
        nft_stdin(&text);
        r.nft_full = start.elapsed();
        r.nft_full_cpu = cpu_time().1 - cpu;

        let text = render_transaction(&diff(table, next));
        let start = Instant::now();
        nft_stdin(&text);
        r.nft_one = start.elapsed();
    });
    r
}

/// CPU time (user + system, the kernel's work inside `sendmsg` included) of the calling
/// thread, and of the waited-for children of this process. `/proc` counts in USER_HZ
/// (100 Hz) ticks, so these have 10 ms resolution; they do not grow when other processes
/// compete for the CPU, unlike wall time.
fn cpu_time() -> (Duration, Duration) {
    let ticks = |path: &str, first: usize| -> Duration {
        let stat = std::fs::read_to_string(path).expect("read /proc stat");
        // Fields after the `(comm)`: state is field 3, utime 14, stime 15, cutime 16,
        // cstime 17.
        let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(first - 3)
            .take(2)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        Duration::from_millis((f[0] + f[1]) * 10)
    };
    (
        ticks("/proc/thread-self/stat", 14),
        ticks("/proc/self/stat", 16),
    )
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn main() {
    // `cargo bench` also passes `--bench`; only our own flags matter.
    let a = args();
    let table = large::large_table(a.chains, a.elements);
    let next = one_more(&table, 1);
    let text = render_full(&table);
    if let Some(path) = a.dump_text {
        std::fs::write(&path, &text).expect("write text");
        return;
    }
    let text_len = text.len();
    let runs: Vec<Run> = (0..a.runs).map(|i| run_once(i, &table, &next)).collect();

    println!(
        "nft apply benchmark: {} chains ({} rules), {} map elements, {} runs, fresh netns each",
        a.chains,
        2 * a.chains + 1,
        a.elements,
        a.runs
    );
    println!("kernel {}, text for nft -f: {} bytes", kernel(), text_len);
    println!(
        "{:<44} {:>10} {:>10} {:>10}",
        "measurement (ms)", "min", "median", "max"
    );
    type Column = fn(&Run) -> Duration;
    let rows: [(&str, Column); 9] = [
        ("netlink backend: full sync (tx+encode+kernel)", |r| {
            r.ours_full
        }),
        ("  CPU time (user + kernel)", |r| r.ours_full_cpu),
        ("  encoding alone (lowering + batch)", |r| r.ours_encode),
        ("nft -f: full apply (render_full text)", |r| r.nft_full),
        ("  CPU time (user + kernel)", |r| r.nft_full_cpu),
        ("netlink backend: +1 element, Engine::sync", |r| r.ours_one),
        ("  Engine::plan (diff) alone", |r| r.ours_diff),
        ("  NftnlBackend::apply of the 1-op batch", |r| {
            r.ours_one_apply
        }),
        ("nft -f: +1 element (add element)", |r| r.nft_one),
    ];
    for (name, f) in rows {
        let (lo, med, hi) = stats(runs.iter().map(f).collect());
        println!("{name:<44} {:>10} {:>10} {:>10}", ms(lo), ms(med), ms(hi));
    }
    let med = |f: fn(&Run) -> Duration| stats(runs.iter().map(f).collect()).1.as_secs_f64();
    println!(
        "speedup (median): full apply {:.1}x (CPU time {:.1}x); one element: Engine::sync {:.1}x, netlink apply {:.1}x",
        med(|r| r.nft_full) / med(|r| r.ours_full),
        med(|r| r.nft_full_cpu) / med(|r| r.ours_full_cpu),
        med(|r| r.nft_one) / med(|r| r.ours_one),
        med(|r| r.nft_one) / med(|r| r.ours_one_apply)
    );
}

fn kernel() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}
