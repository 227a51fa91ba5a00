//! The kernel's view of a table, normalised so that two namespaces holding the same
//! ruleset compare equal: handles, timers and counter values are dropped.

use crate::nft::ir::Table;
use crate::nft::render::render_table;
use crate::testing::lab::Ns;
use serde_json::Value as Json;

/// `nft -j list table inet <table>` without handles, `expires` and counter values.
pub fn json(ns: &Ns, table: &str) -> Json {
    json_of(ns, "inet", table)
}

/// Whether `ns` holds a table named `table` (any family): e.g. `agent explain --trace`'s
/// `nodeplane-trace`, there only while a trace runs.
pub fn has_table(ns: &Ns, table: &str) -> bool {
    let tables = ns
        .nft(&["list", "tables"])
        .unwrap_or_else(|e| panic!("list tables in {}: {e}", ns.name()));
    tables
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some(table))
}

/// [`json`] of `table <family> <table>`.
pub fn json_of(ns: &Ns, family: &str, table: &str) -> Json {
    let out = ns
        .nft(&["-j", "list", "table", family, table])
        .unwrap_or_else(|e| panic!("list table in {}: {e}", ns.name()));
    let mut v: Json = serde_json::from_str(&out).expect("nft -j output is JSON");
    if let Some(items) = v.get_mut("nftables").and_then(Json::as_array_mut) {
        items.retain(|i| i.get("metainfo").is_none());
    }
    scrub(&mut v);
    v
}

/// Drops handles and `expires` and zeroes counter values, in place (what `json` does).
pub fn scrub(v: &mut Json) {
    match v {
        Json::Object(map) => {
            map.remove("handle");
            map.remove("expires");
            if let Some(Json::Object(c)) = map.get_mut("counter") {
                c.insert("packets".into(), 0.into());
                c.insert("bytes".into(), 0.into());
            }
            map.values_mut().for_each(scrub);
        }
        Json::Array(items) => items.iter_mut().for_each(scrub),
        _ => {}
    }
}

/// `nft --debug=netlink list table`: the kernel's bytecode of every rule and the raw
/// elements of every set, with handles and timers removed and elements sorted (hash sets
/// dump in per-set random hash order).
pub fn bytecode(ns: &Ns, table: &str) -> String {
    bytecode_of(ns, "inet", table)
}

/// [`bytecode`] of `table <family> <table>`.
pub fn bytecode_of(ns: &Ns, family: &str, table: &str) -> String {
    let out = ns
        .nft(&["--debug=netlink", "list", "table", family, table])
        .unwrap_or_else(|e| panic!("list table in {}: {e}", ns.name()));
    let mut blocks: Vec<String> = Vec::new();
    let mut elems: Vec<String> = Vec::new();
    let flush = |blocks: &mut Vec<String>, elems: &mut Vec<String>| {
        elems.sort();
        blocks.append(elems);
    };
    for line in out.lines() {
        // The human-readable listing follows the debug dump.
        if line.starts_with("table ") {
            break;
        }
        if line.trim_start().starts_with("element ") {
            elems.push(strip_timers(line));
            continue;
        }
        flush(&mut blocks, &mut elems);
        let words: Vec<&str> = line.split_whitespace().collect();
        // Rule headers: `inet <table> <chain> <handle> [<position>]`.
        if words.len() >= 3 && words[0] == "inet" && words[1] == table && !words[2].starts_with('@')
        {
            blocks.push(format!("inet {table} {}", words[2]));
        } else {
            blocks.push(line.to_string());
        }
    }
    flush(&mut blocks, &mut elems);
    blocks.join("\n")
}

fn strip_timers(line: &str) -> String {
    let mut words = line.split_whitespace().peekable();
    let mut out = Vec::new();
    while let Some(w) = words.next() {
        if w == "expiration" {
            words.next();
            continue;
        }
        out.push(w);
    }
    out.join(" ")
}

/// Counts of chains, sets, rules and elements per set in a JSON listing.
pub fn counts(v: &Json) -> (usize, usize, usize, Vec<(String, usize)>) {
    let items = v["nftables"].as_array().cloned().unwrap_or_default();
    let (mut chains, mut sets, mut rules) = (0, 0, 0);
    let mut elems = Vec::new();
    for i in &items {
        if i.get("chain").is_some() {
            chains += 1;
        } else if let Some(s) = i.get("set").or_else(|| i.get("map")) {
            sets += 1;
            let n = s.get("elem").and_then(Json::as_array).map_or(0, Vec::len);
            elems.push((s["name"].as_str().unwrap_or("").to_string(), n));
        } else if i.get("rule").is_some() {
            rules += 1;
        }
    }
    (chains, sets, rules, elems)
}

/// First line where two texts differ, with context, for assertion messages.
pub fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let i = la
        .iter()
        .zip(&lb)
        .position(|(x, y)| x != y)
        .unwrap_or(la.len().min(lb.len()));
    let ctx = |l: &[&str]| l[i.saturating_sub(3)..(i + 4).min(l.len())].join("\n");
    format!(
        "first difference at line {}:\n--- netlink backend\n{}\n--- nft -f\n{}",
        i + 1,
        ctx(&la),
        ctx(&lb)
    )
}

/// The elements of `table`'s set `set` as `nft` prints them, one per entry (for the
/// planners' unit tests).
pub fn set_elements(table: &Table, set: &str) -> Vec<String> {
    let mut one = table.sets[set].clone();
    one.name = "x".into();
    let mut t = Table::new("t");
    t.add_set(one);
    let text = render_table(&t);
    let lines = text.lines().map(str::trim).map(|l| l.trim_end_matches(','));
    lines
        .skip_while(|l| !l.starts_with("elements"))
        .skip(1)
        .take_while(|l| *l != "}")
        .map(str::to_string)
        .collect()
}
