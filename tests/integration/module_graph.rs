//! The top-level modules of `src/` (`admin`, `reconcile`, `status` ...) must not import each
//! other in a cycle: data and control flow one way (sources -> snapshot -> planner ->
//! backends; the control loop -> observers; `app` wires everything).
//!
//! Reads every file of the library, finds the paths that leave its top-level module
//! (`crate::x::..`, `use crate::{x, y::z}`, `super::` chains that climb out of it) and fails on
//! a cycle, naming it and the files that make each edge. Test code (`#[cfg(test)]` modules,
//! inline or in files of their own) is left out: a test may use any module. Comments and
//! string literals are ignored. An inline module (`mod m { .. }`) counts as part of its file,
//! which can only make a `super::` path climb further than it does, never less.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// top-level module -> (module it uses -> files where it does).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[test]
fn no_import_cycle_among_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = library_graph(&src);
    let text = describe(&graph);
    assert!(graph.contains_key("reconcile"), "no module found:\n{text}");
    if let Some(cycle) = find_cycle(&graph) {
        let mut msg = format!("import cycle: {}\n", cycle.join(" -> "));
        for pair in cycle.windows(2) {
            let files = &graph[&pair[0]][&pair[1]];
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            msg.push_str(&format!(
                "  {} -> {}: {}\n",
                pair[0],
                pair[1],
                files.join(", ")
            ));
        }
        panic!("{msg}\nthe whole graph:\n{text}");
    }
    eprintln!("{text}");
}

/// The module graph of the library rooted at `src/lib.rs` (`src/main.rs` is another crate).
fn library_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    // Files that are test modules: `#[cfg(test)] mod x;`, with or without `#[path]`.
    let mut test_files = BTreeSet::new();
    // Files reached through `#[path]` belong to the module that declares them.
    let mut owner: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for decl in module_decls(&text) {
            let dir = module_dir(src, file);
            let target = match &decl.path {
                Some(p) => file.parent().unwrap().join(p),
                None => {
                    let plain = dir.join(format!("{}.rs", decl.name));
                    if plain.exists() {
                        plain
                    } else {
                        dir.join(&decl.name).join("mod.rs")
                    }
                }
            };
            if decl.test {
                test_files.insert(target.clone());
            }
            if decl.path.is_some() {
                owner.insert(target, file.clone());
            }
        }
    }
    let mut graph = Graph::new();
    for file in &files {
        let rel = file.strip_prefix(src).unwrap();
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") || test_files.contains(file) {
            continue;
        }
        let mut home = file.clone();
        while let Some(o) = owner.get(&home) {
            home = o.clone();
        }
        let module = module_path(src, &home);
        let top = module[0].clone();
        let code = without_test_blocks(&strip(&std::fs::read_to_string(file).unwrap()));
        for used in used_top_modules(&code, &module) {
            if used != top {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(used)
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
        graph.entry(top).or_default();
    }
    graph
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` -> `[a, b]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Where the child modules of `file` live: `src/a/b.rs` and `src/a/b/mod.rs` -> `src/a/b/`.
fn module_dir(src: &Path, file: &Path) -> PathBuf {
    let name = file.file_name().unwrap().to_string_lossy();
    if name == "mod.rs" || file.parent() == Some(src) && name == "lib.rs" {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    }
}

/// A `mod name;` item (an out-of-line module).
struct ModDecl {
    name: String,
    path: Option<String>,
    test: bool,
}

/// The `mod name;` items of a file, with their `#[path]` and whether they are `#[cfg(test)]`.
fn module_decls(code: &str) -> Vec<ModDecl> {
    let mut out = Vec::new();
    let mut attrs: Vec<String> = Vec::new();
    for line in code.lines() {
        let line = line.trim();
        if line.starts_with("//") {
            continue;
        }
        if line.starts_with("#[") {
            attrs.push(line.to_string());
            continue;
        }
        let item = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if let Some(name) = item.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            let path = attrs.iter().find_map(|a| {
                let rest = a.strip_prefix("#[path")?.trim_start().strip_prefix('=')?;
                Some(
                    rest.trim()
                        .trim_end_matches(']')
                        .trim_matches('"')
                        .to_string(),
                )
            });
            out.push(ModDecl {
                name: name.trim().to_string(),
                path,
                test: attrs.iter().any(|a| a == "#[cfg(test)]"),
            });
        }
        if !line.is_empty() {
            attrs.clear();
        }
    }
    out
}

/// `code` without comments, and with the contents of string and char literals blanked
/// (line structure kept).
fn strip(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && matches!(at(i + 2), '"' | '#')))
            && !(i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            // Raw string: r"..", r#".."#, r##".."##.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            out.push_str("\"\"");
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            out.push_str("\"\"");
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if at(i) == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            if at(i + 1) == '\\' {
                let mut j = i + 3;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if at(i + 2) == '\'' {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without the items that follow `#[cfg(test)]` (inline test modules, test-only
/// functions and imports).
fn without_test_blocks(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        rest = &rest[i + "#[cfg(test)]".len()..];
        // The item ends at the first `;` outside braces, or at the brace closing its body.
        let mut depth = 0usize;
        let mut end = rest.len();
        for (j, c) in rest.char_indices() {
            match c {
                '{' | '(' | '[' => depth += 1,
                ')' | ']' => depth = depth.saturating_sub(1),
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = j + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The top-level modules that the paths in `code` (of module `module`) lead to.
fn used_top_modules(code: &str, module: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !code.is_char_boundary(i) || i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'$') {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        if let Some(after) = rest.strip_prefix("crate::") {
            out.extend(first_segments(after));
            i += "crate::".len();
        } else if rest.starts_with("super::") {
            let mut after = rest;
            let mut climbs = 0;
            while let Some(a) = after.strip_prefix("super::") {
                climbs += 1;
                after = a.trim_start();
            }
            if climbs >= module.len() {
                // Out of the top-level module: `after` starts at the crate root.
                out.extend(first_segments(after));
            }
            i += rest.len() - after.len();
        } else {
            i += 1;
        }
    }
    out.remove("self");
    out
}

/// `x::y` -> x; `{x, y::z, w}` -> x, y, w.
fn first_segments(path: &str) -> Vec<String> {
    let path = path.trim_start();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = path.strip_prefix('{') else {
        return vec![ident(path)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
    };
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[start..j]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[start..j]));
                start = j + 1;
            }
            _ => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// A cycle as `[a, b, .., a]`, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

fn describe(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, uses)| {
            let uses: Vec<&str> = uses.keys().map(String::as_str).collect();
            format!("{m} -> {}\n", uses.join(", "))
        })
        .collect()
}

#[test]
fn the_parser_sees_through_groups_super_comments_strings_and_tests() {
    let code = r##"
use crate::{alpha, beta::{B, C}, self};
use crate::gamma::G; // crate::commented
/* crate::blocked */
const S: &str = "crate::quoted";
const R: &str = r#"crate::raw "# ;
const Q: char = '"';
fn f<'a>(x: &'a str) -> crate::delta::D { super::epsilon::e() }
#[cfg(test)]
mod tests {
    use crate::zeta;
}
#[cfg(test)]
use crate::eta;
"##;
    let code = without_test_blocks(&strip(code));
    let top = used_top_modules(&code, &["m".to_string()]);
    let expected = ["alpha", "beta", "delta", "epsilon", "gamma"];
    assert_eq!(top, expected.iter().map(|s| s.to_string()).collect());
    // From a submodule, `super::` stays inside; `super::super::` leaves.
    let nested = ["m".to_string(), "n".to_string()];
    assert!(used_top_modules("super::x::y()", &nested).is_empty());
    let up: Vec<String> = used_top_modules("super::super::x::y()", &nested)
        .into_iter()
        .collect();
    assert_eq!(up, ["x"]);
}

#[test]
fn a_cycle_is_found_and_named() {
    fn edge(graph: &mut Graph, a: &str, b: &str) {
        graph
            .entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert(format!("{a}.rs"));
    }
    let mut graph = Graph::new();
    edge(&mut graph, "app", "reconcile");
    edge(&mut graph, "reconcile", "observe");
    edge(&mut graph, "admin", "observe");
    assert_eq!(find_cycle(&graph), None);
    edge(&mut graph, "observe", "admin");
    edge(&mut graph, "admin", "reconcile");
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle, ["admin", "observe", "admin"]);
}
