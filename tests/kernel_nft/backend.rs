//! Kernel tests of the netlink backend. Each test builds its own network namespaces with
//! the kit's lab (`nodeplane::testing::lab`) and runs the backend inside one on a thread that joined it
//! with `setns`. They need root and fail (never skip) without it.
//!
//! The reference is always nft itself: the batch we encode must equal the one
//! `nft --debug=mnl -c` shows for the text `render.rs` prints, and after applying, the
//! kernel listings of "our" namespace and of an `nft -f` namespace must be equal.

mod bridge;
mod fixtures;
mod parts;
mod readback;
mod rich_chains;
mod wire;

use fixtures::{rich_table, rich_table_changed, v4};
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::render::{render_full, render_transaction};
use nodeplane::nft::*;
use nodeplane::testing::lab::{Lab, Ns};
use nodeplane::testing::large::large_table;
use nodeplane::testing::listing;

const T: &str = TABLE_NAME;

fn nft_apply(ns: &Ns, text: &str) {
    ns.exec_stdin(&["nft", "-f", "-"], text)
        .unwrap_or_else(|e| panic!("nft -f in {}: {e}\n--- input ---\n{text}", ns.name()));
}

/// Both kernel views (JSON listing and raw bytecode/elements) of `a` equal those of `b`.
#[track_caller]
fn assert_same_kernel_state(a: &Ns, b: &Ns) {
    let (ja, jb) = (listing::json(a, T), listing::json(b, T));
    if ja != jb {
        let (pa, pb) = (
            serde_json::to_string_pretty(&ja).unwrap(),
            serde_json::to_string_pretty(&jb).unwrap(),
        );
        panic!(
            "JSON listings differ\n{}",
            listing::first_difference(&pa, &pb)
        );
    }
    let (ba, bb) = (listing::bytecode(a, T), listing::bytecode(b, T));
    assert!(
        ba == bb,
        "bytecode listings differ\n{}",
        listing::first_difference(&ba, &bb)
    );
}

/// Our batch for `tx` equals, message for message, what nft sends for `text`.
#[track_caller]
fn assert_same_batch(ns: &Ns, tx: &Transaction, text: &str) {
    let dump = ns
        .exec_stdin(&["nft", "--debug=mnl", "-c", "-f", "-"], text)
        .unwrap_or_else(|e| panic!("nft -c: {e}"));
    let theirs = wire::decode(&wire::from_mnl_dump(&dump));
    let ours = wire::decode(&NftnlBackend::new().encode(tx).expect("encode").bytes());
    assert!(
        !theirs.is_empty(),
        "no batch found in nft's --debug=mnl output"
    );
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            a == b,
            "message {i} differs\n--- netlink backend\n{a}--- nft\n{b}"
        );
    }
    assert_eq!(ours.len(), theirs.len(), "number of messages");
}

#[test]
fn encoding_equals_nft_message_for_message() {
    let mut lab = Lab::new();
    let ns = lab.add_host("wire");
    let table = rich_table();
    assert_same_batch(&ns, &Transaction::full(&table), &render_full(&table));
    // Large sets are split into several element messages exactly where nft splits them.
    let big = large_table(50, 3000);
    assert_same_batch(&ns, &Transaction::full(&big), &render_full(&big));
}

#[test]
fn full_sync_of_parts_encodes_like_the_flat_table() {
    // Parts' elements go out with their set's creation, split where nft splits the flat
    // list: with the flat element order kept, the batch is nft's for the flattened text.
    let mut lab = Lab::new();
    let ns = lab.add_host("pwire");
    for (flat, n) in [(rich_table(), 3), (large_table(50, 3000), 7)] {
        let parted = parts::chunked(flat.clone(), n);
        assert!(
            parted.part_count() >= n - 1,
            "{} parts",
            parted.part_count()
        );
        assert_same_batch(&ns, &Transaction::full(&parted), &render_full(&flat));
    }
}

/// The rich table dealt into parts: keys of every set interleave across parts; one interval
/// set is filled only by a part; chains and sets (with elements) owned by parts.
fn dealt_rich_table() -> Table {
    parts::dealt(
        rich_table(),
        "cidrs6",
        &["svc-a", "svc-b"],
        &["affinity", "timed"],
    )
}

#[test]
fn full_sync_of_parts_lists_like_nft_of_the_flat_table() {
    let mut lab = Lab::new();
    let ours = lab.add_host("parts");
    let flat = lab.add_host("pflat");
    let text = lab.add_host("ptext");
    let table = dealt_rich_table();
    let tx = Transaction::create(&table);
    let with_parts = tx
        .ops
        .iter()
        .filter(|op| matches!(op, Op::AddSetWithParts { .. }))
        .count();
    assert!(with_parts > 10, "{with_parts} sets filled by parts");
    ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let stats = engine
            .sync(table.clone())
            .expect("full sync of a table with parts");
        assert_eq!(stats.ops, tx.op_count());
    });
    nft_apply(&flat, &render_full(&table));
    assert_same_kernel_state(&ours, &flat);
    let (_, _, _, elems) = listing::counts(&listing::json(&ours, T));
    assert!(elems.contains(&("services".into(), 5)), "{elems:?}");
    assert!(elems.contains(&("cidrs6".into(), 2)), "{elems:?}");
    // The transaction rendered as text (what --dry-run and error messages show) too.
    nft_apply(&text, &render_transaction(&tx));
    assert_same_kernel_state(&ours, &text);
}

#[test]
fn a_table_created_in_chunks_lists_like_nft_of_the_flat_table() {
    let mut lab = Lab::new();
    let ours = lab.add_host("chunks");
    let flat = lab.add_host("cflat");
    // Every set filled by parts may be deferred here (interval sets are kept whole by
    // `create_chunked`); chunks of 3 elements make many transactions.
    let table = dealt_rich_table();
    let txs = Transaction::create_chunked(&table, 3, &|_: &str| true);
    assert!(txs.len() > 3, "{} transactions", txs.len());
    ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new()).with_chunks(3, |_: &str| true);
        let stats = engine.sync(table.clone()).expect("chunked creation");
        assert_eq!(
            stats.ops,
            txs.iter().map(Transaction::op_count).sum::<usize>()
        );
        // A restart reads back exactly the table: nothing to write.
        let again = Engine::new(NftnlBackend::new())
            .sync(table.clone())
            .unwrap();
        assert_eq!(again.ops, 0);
    });
    nft_apply(&flat, &render_full(&table));
    assert_same_kernel_state(&ours, &flat);
}

#[test]
fn round_trip_full_and_diff_match_nft() {
    let mut lab = Lab::new();
    let ours = lab.add_host("netlink");
    let theirs = lab.add_host("nft");
    let rich = rich_table();
    let changed = rich_table_changed();
    ours.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let stats = engine.sync(rich.clone()).expect("apply rich table");
        // A first sync creates the table (no delete: the kernel had none).
        assert_eq!(stats.ops, Transaction::create(&rich).op_count());
        nft_apply(&theirs, &render_full(&rich));
        assert_same_kernel_state(&ours, &theirs);

        let (chains, sets, rules, elems) = listing::counts(&listing::json(&ours, T));
        assert_eq!(chains, rich.chains.len());
        assert_eq!(sets, rich.sets.len());
        let want_rules: usize = rich.chains.values().map(|c| c.rules.len()).sum();
        assert_eq!(rules, want_rules);
        assert!(elems.contains(&("services".into(), 5)), "{elems:?}");

        let tx = diff(&rich, &changed);
        assert!(tx.ops.iter().any(|o| matches!(o, Op::DeleteChain(_))));
        assert!(tx.ops.iter().any(|o| matches!(o, Op::DeleteSet(_))));
        assert!(tx.ops.iter().any(|o| matches!(o, Op::DeleteElements(_))));
        let stats = engine.sync(changed.clone()).expect("apply diff");
        assert_eq!(stats.ops, tx.op_count());
        nft_apply(&theirs, &render_transaction(&tx));
        assert_same_kernel_state(&ours, &theirs);
    });
}

#[test]
fn second_sync_is_empty_and_changes_nothing() {
    let mut lab = Lab::new();
    let ns = lab.add_host("idem");
    ns.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let first = engine.sync(rich_table()).expect("first sync");
        assert!(first.ops > 0 && first.messages > 0);
        let (json, code) = (listing::json(&ns, T), listing::bytecode(&ns, T));
        let second = engine.sync(rich_table()).expect("second sync");
        assert_eq!(
            second,
            ApplyStats {
                ops: 0,
                messages: 0
            }
        );
        assert_eq!(listing::json(&ns, T), json);
        assert_eq!(listing::bytecode(&ns, T), code);
    });
}

#[test]
fn other_tables_are_never_touched() {
    let mut lab = Lab::new();
    let ns = lab.add_host("owner");
    nft_apply(
        &ns,
        "table ip filter {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\
         \t\tip saddr 192.0.2.1 counter drop\n\t}\n}\n\
         table inet other {\n\tset blocked {\n\t\ttype ipv4_addr\n\t\telements = { 192.0.2.7 }\n\t}\n\
         \tchain c {\n\t\tip daddr @blocked drop\n\t\ttcp dport 22 accept comment \"ssh\"\n\t}\n}\n",
    );
    let snapshot = || {
        (
            ns.nft(&["list", "table", "ip", "filter"]).unwrap(),
            ns.nft(&["list", "table", "inet", "other"]).unwrap(),
        )
    };
    let before = snapshot();
    ns.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        engine.sync(rich_table()).expect("apply");
        assert_eq!(snapshot(), before);
        engine.invalidate();
        engine.sync(rich_table()).expect("re-apply (full replace)");
        engine.sync(rich_table_changed()).expect("diff");
        assert_eq!(snapshot(), before);
        engine.delete_table(Family::Inet, T).expect("delete table");
        // Deleting an absent table is not an error either.
        engine
            .delete_table(Family::Inet, T)
            .expect("delete absent table");
    });
    assert_eq!(snapshot(), before);
    let gone = ns.nft(&["list", "table", "inet", T]);
    assert!(gone.is_err(), "table inet {T} still exists");
}

/// A desired state the kernel refuses leaves the previous ruleset exactly in place, and
/// the error names the op (and the element) that failed.
#[test]
fn rejected_transaction_changes_nothing_and_names_the_op() {
    let mut lab = Lab::new();
    let ns = lab.add_host("atomic");
    ns.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        engine.sync(rich_table()).expect("apply good table");
        let (json, code) = (listing::json(&ns, T), listing::bytecode(&ns, T));

        // 1. A jump to a chain that does not exist, alongside many other changes.
        let mut bad = rich_table_changed();
        let fwd = bad.chains.get_mut("filter-forward").unwrap();
        fwd.push(Rule::new(vec![
            Stmt::matches(Field::Ip4Daddr, v4("203.0.113.9")),
            Stmt::Verdict(Verdict::Jump("no-such-chain".into())),
        ]));
        let err = engine.sync(bad).expect_err("kernel must refuse");
        let text = err.to_string();
        assert!(
            matches!(err, NftError::Rejected { .. }),
            "unexpected error kind: {text}"
        );
        assert!(
            text.contains(
                "add rule inet nodeplane filter-forward: ip daddr 203.0.113.9 jump no-such-chain"
            ) && text.contains("No such file or directory (errno 2)"),
            "{text}"
        );
        assert_eq!(listing::json(&ns, T), json);
        assert_eq!(listing::bytecode(&ns, T), code);

        // 2. dnat in a filter chain: the kernel refuses the expression in that hook.
        let mut bad = rich_table();
        let fwd = bad.chains.get_mut("filter-forward").unwrap();
        fwd.rules.insert(
            0,
            Rule::new(vec![
                Stmt::matches(Field::L4Proto, Value::Proto(proto::TCP)),
                Stmt::Nat(Nat {
                    kind: NatKind::Dnat,
                    family: IpFamily::V4,
                    addr: NatAddr::Fixed("10.0.0.1".parse().unwrap(), Some(80)),
                }),
            ]),
        );
        let text = engine.sync(bad).expect_err("kernel must refuse").to_string();
        assert!(
            text.contains("add rule inet nodeplane filter-forward: meta l4proto tcp dnat ip to 10.0.0.1:80")
                && text.contains("errno 95"),
            "{text}"
        );
        assert_eq!(listing::json(&ns, T), json);

        // 3. One bad element among good ones: the error names that element.
        let mut bad = rich_table();
        let svc = bad.sets.get_mut("services").unwrap();
        for i in 0..500u32 {
            let target = if i == 321 { "no-such-chain" } else { "svc-b" };
            svc.insert_mapping(
                vec![
                    Value::Ipv4(std::net::Ipv4Addr::from(0xcb00_7100 + i)).into(),
                    Value::Proto(proto::TCP).into(),
                    Value::Port(80).into(),
                ],
                ElemData::Verdict(Verdict::Goto(target.into())),
            );
        }
        let text = engine.sync(bad).expect_err("kernel must refuse").to_string();
        assert!(
            text.contains(
                "add element inet nodeplane services { 203.0.114.65 . tcp . 80 : goto no-such-chain }"
            ),
            "{text}"
        );
        assert_eq!(listing::json(&ns, T), json);
        assert_eq!(listing::bytecode(&ns, T), code);

        // The engine still knows the kernel state: a good sync after the failures works.
        engine.sync(rich_table_changed()).expect("good sync after rejections");
    });
}

#[test]
fn large_table_applies_and_lists_back() {
    let mut lab = Lab::new();
    let ns = lab.add_host("large");
    let table = large_table(10_000, 100_000);
    ns.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        let stats = engine.sync(table.clone()).expect("apply large table");
        assert_eq!(stats.ops, Transaction::create(&table).op_count());
        assert!(stats.messages > 10_000 + 20_000, "{stats:?}");
        let (chains, sets, rules, elems) = listing::counts(&listing::json(&ns, T));
        assert_eq!(chains, 10_001);
        assert_eq!(sets, 1);
        assert_eq!(rules, 20_001);
        assert_eq!(elems, vec![("services".to_string(), 100_000)]);

        // One element changed on top: a tiny batch.
        let mut next = table.clone();
        next.sets.get_mut("services").unwrap().insert_mapping(
            vec![
                v4("198.51.100.1").into(),
                Value::Proto(proto::TCP).into(),
                Value::Port(443).into(),
            ],
            ElemData::Verdict(Verdict::Goto("svc-7".into())),
        );
        let stats = engine.sync(next).expect("one element");
        assert_eq!(
            stats,
            ApplyStats {
                ops: 1,
                messages: 1
            }
        );
    });
}
