//! The library's import graph, at two levels, must keep its shape:
//! - no import circle among the top-level modules of `src/` (`admin`, `reconcile`, `status`
//!   ...): data and control flow one way (sources -> snapshot -> planner -> backends; the
//!   control loop -> observers; `app` wires everything);
//! - no import circle among its files (`plan/services/names.rs` -> `pools.rs` -> `names.rs`
//!   is two concerns tangled into one);
//! - the layer rules ([`LAYER_RULES`]): a lower layer never reaches a higher one, directly or
//!   through other modules (the planner is pure and never depends on the controllers; the
//!   nftables engine knows tables, not features).
//!
//! Reads every file of the library and resolves the paths it uses (`crate::x::y`, `use
//! crate::{x, y::z}`, `super::` chains, `self::`, a child module's name) to the file that
//! defines the module they lead to (the longest module prefix of the path; a name a module
//! re-exports with `pub use` is followed to where it comes from). Test code (`#[cfg(test)]`
//! modules, inline or in files of their own) is left out: a test may use any module.
//! Comments and string literals are ignored. An inline module (`mod m { .. }`) counts as part
//! of its file. The checks are themselves tested on planted graphs (`a_planted_*`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// node -> (node it uses -> what makes the edge: files, or the paths used). The nodes are
/// top-level modules or files.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// `(from, to, why)`: the top-level module `from` must not reach `to`, directly or through
/// other modules.
const LAYER_RULES: &[(&str, &str, &str)] = &[
    (
        "plan",
        "controller",
        "the planner is pure: it never depends on the controllers",
    ),
    (
        "nft",
        "plan",
        "the nftables engine knows tables, not features",
    ),
    (
        "snapshot",
        "plan",
        "the snapshot is the planner's input, not its user",
    ),
    (
        "plan",
        "reconcile",
        "the planner never depends on the loop that calls it",
    ),
    (
        "nft",
        "reconcile",
        "the backends never depend on the loop that drives them",
    ),
    (
        "net",
        "reconcile",
        "the backends never depend on the loop that drives them",
    ),
];

/// Edges the layer rules skip until the work that removes them lands (none today: the
/// Feature::Output work moved the controllers' settings types into `config`).
const KNOWN_LAYER_BREACHES: &[(&str, &str)] = &[];

#[test]
fn no_import_cycle_among_top_level_modules() {
    let library = Library::read(&src_dir());
    let graph = library.top_level_graph();
    let text = describe(&graph);
    assert!(graph.contains_key("reconcile"), "no module found:\n{text}");
    if let Err(msg) = check_acyclic(&graph) {
        panic!("{msg}\nthe whole graph:\n{text}");
    }
    eprintln!("{text}");
}

#[test]
fn no_import_cycle_among_files() {
    let library = Library::read(&src_dir());
    let graph = library.file_graph();
    assert!(
        graph.contains_key("plan/services/names.rs"),
        "no file found:\n{}",
        describe(&graph)
    );
    if let Err(msg) = check_acyclic(&graph) {
        panic!("{msg}");
    }
}

#[test]
fn the_layer_rules_hold() {
    let library = Library::read(&src_dir());
    let graph = library.top_level_graph();
    if let Err(msg) = check_layers(&graph, LAYER_RULES, KNOWN_LAYER_BREACHES) {
        panic!("{msg}\nthe whole graph:\n{}", describe(&graph));
    }
    // The known breaches are real edges (delete one from the list once its edge is gone).
    for (from, to) in KNOWN_LAYER_BREACHES {
        assert!(
            graph.get(*from).is_some_and(|uses| uses.contains_key(*to)),
            "{from} -> {to} is gone: remove it from KNOWN_LAYER_BREACHES"
        );
    }
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Fails with every circle (one per edge taken out to find the next), naming each edge and
/// what makes it.
fn check_acyclic(graph: &Graph) -> Result<(), String> {
    let mut rest = graph.clone();
    let mut msg = String::new();
    while let Some(cycle) = find_cycle(&rest) {
        msg.push_str(&format!("import cycle: {}\n", cycle.join(" -> ")));
        msg.push_str(&describe_edges(graph, &cycle));
        rest.get_mut(&cycle[0]).unwrap().remove(&cycle[1]);
    }
    if msg.is_empty() { Ok(()) } else { Err(msg) }
}

/// Fails with every rule `from` must not reach `to` that the graph breaks (the path and the
/// files of each edge), not counting the edges in `known`.
fn check_layers(
    graph: &Graph,
    rules: &[(&str, &str, &str)],
    known: &[(&str, &str)],
) -> Result<(), String> {
    let mut msg = String::new();
    for (from, to, why) in rules {
        if let Some(path) = find_path(graph, from, to, known) {
            msg.push_str(&format!(
                "layer rule broken: {from} reaches {to} ({why}): {}\n",
                path.join(" -> ")
            ));
            msg.push_str(&describe_edges(graph, &path));
        }
    }
    if msg.is_empty() { Ok(()) } else { Err(msg) }
}

/// Each edge of `path` with what makes it, one line each.
fn describe_edges(graph: &Graph, path: &[String]) -> String {
    path.windows(2)
        .map(|pair| {
            let by: Vec<&str> = graph[&pair[0]][&pair[1]]
                .iter()
                .map(String::as_str)
                .collect();
            format!("  {} -> {}: {}\n", pair[0], pair[1], by.join(", "))
        })
        .collect()
}

/// The shortest path `from -> .. -> to`, skipping the edges in `skip`.
fn find_path(graph: &Graph, from: &str, to: &str, skip: &[(&str, &str)]) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            let next = next.as_str();
            if skip.contains(&(node, next)) || next == from || came_from.contains_key(next) {
                continue;
            }
            came_from.insert(next, node);
            if next == to {
                let mut path = vec![to.to_string()];
                let mut at = to;
                while let Some(prev) = came_from.get(at) {
                    path.push(prev.to_string());
                    at = prev;
                }
                path.reverse();
                return Some(path);
            }
            queue.push_back(next);
        }
    }
    None
}

/// The library rooted at `src/lib.rs` (`src/main.rs` is another crate), test files left out.
struct Library {
    /// Module path -> the file that defines it (`["plan", "services"]` ->
    /// `plan/services/mod.rs`).
    modules: BTreeMap<Vec<String>, String>,
    /// File -> its module path.
    module_of: BTreeMap<String, Vec<String>>,
    /// File -> the module paths its code uses, each resolved from the crate root.
    uses: BTreeMap<String, BTreeSet<Vec<String>>>,
    /// File -> the names it re-exports (`pub use`) -> where they come from.
    reexports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Library {
    fn read(src: &Path) -> Library {
        let mut files = Vec::new();
        walk(src, &mut files);
        let sources = files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).unwrap();
                (f.strip_prefix(src).unwrap().to_path_buf(), text)
            })
            .collect();
        Library::from_sources(&sources)
    }

    /// `sources`: file path relative to `src/` -> its text.
    fn from_sources(sources: &BTreeMap<PathBuf, String>) -> Library {
        // Files that are test modules: `#[cfg(test)] mod x;`, with or without `#[path]`.
        let mut test_files = BTreeSet::new();
        // Files reached through `#[path]` belong to the module that declares them.
        let mut owner: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        for (file, text) in sources {
            for decl in module_decls(text) {
                let target = match &decl.path {
                    Some(p) => file.parent().unwrap().join(p),
                    None => {
                        let dir = module_dir(file);
                        let plain = dir.join(format!("{}.rs", decl.name));
                        if sources.contains_key(&plain) {
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
        let mut library = Library {
            modules: BTreeMap::new(),
            module_of: BTreeMap::new(),
            uses: BTreeMap::new(),
            reexports: BTreeMap::new(),
        };
        for (file, text) in sources {
            let is_root = file == Path::new("lib.rs") || file == Path::new("main.rs");
            if is_root || test_files.contains(file) {
                continue;
            }
            let mut home = file.clone();
            while let Some(o) = owner.get(&home) {
                home = o.clone();
            }
            let module = module_path(&home);
            let name = file.display().to_string();
            let code = without_test_blocks(&strip(text));
            let children: BTreeSet<String> = module_decls(text)
                .into_iter()
                .filter(|d| !d.test)
                .map(|d| d.name)
                .collect();
            let resolve = |path: &[String]| resolve(path, &module, &children);
            let uses = used_paths(&code, &children)
                .iter()
                .filter_map(|p| resolve(p))
                .collect();
            let reexports = pub_uses(&code)
                .iter()
                .filter_map(|p| Some((p.last()?.clone(), resolve(p)?)))
                .collect();
            if home == *file {
                library.modules.insert(module.clone(), name.clone());
            }
            library.module_of.insert(name.clone(), module);
            library.uses.insert(name.clone(), uses);
            library.reexports.insert(name, reexports);
        }
        library
    }

    /// The file a path leads to: the longest module prefix, following re-exports.
    fn target(&self, path: &[String]) -> Option<&str> {
        let mut path = path.to_vec();
        // A re-export chain is short; the bound only guards against a loop.
        for _ in 0..8 {
            let len = (1..=path.len())
                .rev()
                .find(|n| self.modules.contains_key(&path[..*n]))?;
            let file = &self.modules[&path[..len]];
            let next = path
                .get(len)
                .and_then(|name| self.reexports[file].get(name));
            match next {
                Some(origin) if origin[..] != path[..len + 1] => {
                    let mut followed = origin.clone();
                    followed.extend_from_slice(&path[len + 1..]);
                    path = followed;
                }
                _ => return Some(file),
            }
        }
        None
    }

    /// `a` and `b` are the same module or one is inside the other. A module's own file
    /// declares and wires its children and they use what it defines (its shared types), so
    /// edges between them are no circle of concerns; circles among siblings and cousins are.
    fn nested(&self, a: &str, b: &str) -> bool {
        let (a, b) = (&self.module_of[a], &self.module_of[b]);
        a.starts_with(b) || b.starts_with(a)
    }

    /// File -> file it uses (neither inside the other) -> the paths that make the edge.
    fn file_graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (file, uses) in &self.uses {
            let edges = graph.entry(file.clone()).or_default();
            for path in uses {
                match self.target(path) {
                    Some(to) if !self.nested(file, to) => {
                        edges
                            .entry(to.to_string())
                            .or_default()
                            .insert(path.join("::"));
                    }
                    _ => {}
                }
            }
        }
        graph
    }

    /// Top-level module -> module it uses -> the files where it does.
    fn top_level_graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (file, uses) in &self.uses {
            let top = self.module_of[file][0].clone();
            for path in uses {
                if path[0] != top {
                    graph
                        .entry(top.clone())
                        .or_default()
                        .entry(path[0].clone())
                        .or_default()
                        .insert(file.clone());
                }
            }
            graph.entry(top).or_default();
        }
        graph
    }
}

/// `path` as used in module `module` (with child modules `children`) -> the same path from the
/// crate root; `None` for a path that does not start in this crate (`std::..`, a local name).
fn resolve(path: &[String], module: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut out = match first.as_str() {
        "crate" => rest.to_vec(),
        "self" => [module, rest].concat(),
        "super" => {
            let climbs = path.iter().take_while(|s| *s == "super").count();
            if climbs > module.len() {
                return None;
            }
            [&module[..module.len() - climbs], &path[climbs..]].concat()
        }
        child if children.contains(child) => [module, path].concat(),
        _ => return None,
    };
    if out.last().is_some_and(|s| s == "self") {
        out.pop();
    }
    (!out.is_empty()).then_some(out)
}

/// Every path in `code` that starts with `crate`, `super`, `self` or a child module's name,
/// as its segments (a `use` group is expanded into one path per leaf).
fn used_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_ident = code.is_char_boundary(i)
            && is_ident(bytes[i])
            && !(i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b'$'))
            && !code[..i].trim_end().ends_with("::")
            // `pub(in crate::x)` is a visibility, not a use.
            && !code[..i].trim_end().ends_with("(in");
        if !starts_ident {
            i += 1;
            continue;
        }
        let word = ident_at(code, i);
        let is_root = matches!(word, "crate" | "super" | "self") || children.contains(word);
        if is_root && code[i + word.len()..].trim_start().starts_with("::") {
            let (paths, end) = path_tree(code, i);
            out.extend(paths.into_iter().filter(|p| p.len() > 1));
            i = end.max(i + 1);
        } else {
            i += word.len().max(1);
        }
    }
    out
}

/// The paths of the `pub use` items of `code` (not `pub(crate)`/`pub(super)`: those do not
/// leave the crate's inner modules, but they still re-export; they are included too).
fn pub_uses(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let i = from + at + start.len();
            let (paths, end) = path_tree(code, i);
            out.extend(
                paths
                    .into_iter()
                    .filter(|p| p.last().is_some_and(|s| s != "*")),
            );
            from = end.max(i);
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn ident_at(code: &str, i: usize) -> &str {
    let len = code[i..].bytes().take_while(|b| is_ident(*b)).count();
    &code[i..i + len]
}

/// The path (tree) starting at `i`: `a::b::{c, d::{e, f}, g as h}` -> `[a, b, c]`, `[a, b, d,
/// e]`, `[a, b, d, f]`, `[a, b, g]`; a glob ends in `*`. Returns the paths and where they end.
fn path_tree(code: &str, mut i: usize) -> (Vec<Vec<String>>, usize) {
    let skip_ws = |i: usize| i + code[i..].len() - code[i..].trim_start().len();
    let mut prefix = Vec::new();
    loop {
        i = skip_ws(i);
        let rest = &code[i..];
        if rest.starts_with('{') {
            let mut out = Vec::new();
            i += 1;
            loop {
                let (paths, end) = path_tree(code, i);
                out.extend(paths.into_iter().map(|p| [prefix.clone(), p].concat()));
                i = skip_ws(end);
                match code[i..].chars().next() {
                    Some(',') => i += 1,
                    Some('}') => return (out, i + 1),
                    _ => return (out, i),
                }
            }
        }
        if rest.starts_with('*') {
            prefix.push("*".to_string());
            return (vec![prefix], i + 1);
        }
        let word = ident_at(code, i);
        if word.is_empty() {
            let paths = if prefix.is_empty() {
                vec![]
            } else {
                vec![prefix]
            };
            return (paths, i);
        }
        prefix.push(word.to_string());
        i = skip_ws(i + word.len());
        if code[i..].starts_with("::") {
            i += 2;
            continue;
        }
        if code[i..].starts_with("as")
            && !code[i + 2..].starts_with(|c: char| c == '_' || c.is_ascii_alphanumeric())
        {
            // `x as y`: the alias names the same thing.
            i = skip_ws(i + 2);
            i += ident_at(code, i).len();
        }
        return (vec![prefix], i);
    }
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

/// `a/b.rs` and `a/b/mod.rs` (relative to `src/`) -> `[a, b]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Where the child modules of `rel` live: `a/b.rs` and `a/b/mod.rs` -> `a/b/`; `lib.rs` -> ``.
fn module_dir(rel: &Path) -> PathBuf {
    let name = rel.file_name().unwrap().to_string_lossy();
    if name == "mod.rs" || rel == Path::new("lib.rs") {
        rel.parent().unwrap().to_path_buf()
    } else {
        rel.with_extension("")
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
pub(in crate::theta) struct T;
fn g() { kid::k(); self::own::o(); other::x::y(); }
#[cfg(test)]
mod tests {
    use crate::zeta;
}
#[cfg(test)]
use crate::eta;
"##;
    let code = without_test_blocks(&strip(code));
    let children = BTreeSet::from(["kid".to_string()]);
    let module = ["m".to_string(), "n".to_string()];
    let used: BTreeSet<String> = used_paths(&code, &children)
        .iter()
        .filter_map(|p| resolve(p, &module, &children))
        .map(|p| p.join("::"))
        .collect();
    let expected = [
        "alpha",
        "beta::B",
        "beta::C",
        "delta::D",
        "gamma::G",
        "m::epsilon::e",
        "m::n::kid::k",
        "m::n::own::o",
    ];
    assert_eq!(used, expected.iter().map(|s| s.to_string()).collect());
    // `super::` climbs one module per step; out of the crate is no path.
    let up = |p: &str| {
        let p: Vec<String> = p.split("::").map(String::from).collect();
        resolve(&p, &module, &children).map(|p| p.join("::"))
    };
    assert_eq!(up("super::super::x::y").as_deref(), Some("x::y"));
    assert_eq!(up("super::super::super::x"), None);
    let tree = path_tree("a::b::{c, d::{e, f as g}, *};", 0).0;
    let tree: Vec<String> = tree.iter().map(|p| p.join("::")).collect();
    assert_eq!(tree, ["a::b::c", "a::b::d::e", "a::b::d::f", "a::b::*"]);
}

/// A library from `(file, text)` pairs, paths relative to `src/`.
fn planted(files: &[(&str, &str)]) -> Library {
    let sources = files
        .iter()
        .map(|(f, t)| (PathBuf::from(f), t.to_string()))
        .collect();
    Library::from_sources(&sources)
}

#[test]
fn a_planted_file_circle_fails_the_check() {
    let mut files = vec![
        (
            "plan/mod.rs",
            "pub mod names;\npub mod pools;\npub use names::Frontend;\n",
        ),
        ("plan/names.rs", "pub enum Frontend { Addr }\n"),
        (
            "plan/pools.rs",
            "use super::names::Frontend;\nfn f(_: crate::plan::Frontend) {}\n",
        ),
    ];
    let graph = planted(&files).file_graph();
    assert_eq!(check_acyclic(&graph), Ok(()), "{}", describe(&graph));
    // The re-export is followed: pools uses names, not the facade.
    assert!(!graph["plan/pools.rs"].contains_key("plan/mod.rs"));
    files[1].1 = "use super::pools;\npub enum Frontend { Addr }\n";
    let graph = planted(&files).file_graph();
    let err = check_acyclic(&graph).expect_err("a circle");
    assert!(
        err.starts_with("import cycle: plan/names.rs -> plan/pools.rs -> plan/names.rs"),
        "{err}"
    );
    assert!(
        err.contains("plan/names.rs -> plan/pools.rs: plan::pools"),
        "{err}"
    );
    // A test module may use anything.
    files[1].1 =
        "pub enum Frontend { Addr }\n#[cfg(test)]\nmod tests { use super::super::pools; }\n";
    assert_eq!(check_acyclic(&planted(&files).file_graph()), Ok(()));
}

#[test]
fn a_planted_layer_breach_fails_the_check() {
    let rules = [("plan", "controller", "pure")];
    let mut files = vec![
        ("plan/mod.rs", "use crate::config::Config;\n"),
        ("config.rs", "pub struct Config;\n"),
        ("controller/mod.rs", "use crate::config::Config;\n"),
    ];
    let graph = planted(&files).top_level_graph();
    assert_eq!(check_layers(&graph, &rules, &[]), Ok(()));
    // Through another module.
    files[1].1 = "pub struct Config(crate::controller::Settings);\n";
    let graph = planted(&files).top_level_graph();
    let err = check_layers(&graph, &rules, &[]).expect_err("a breach");
    assert!(
        err.starts_with(
            "layer rule broken: plan reaches controller (pure): plan -> config -> controller"
        ),
        "{err}"
    );
    assert!(err.contains("config -> controller: config.rs"), "{err}");
    // A known breach is skipped, and only that edge.
    assert_eq!(
        check_layers(&graph, &rules, &[("config", "controller")]),
        Ok(())
    );
    files[0].1 = "use crate::controller::lease;\n";
    let graph = planted(&files).top_level_graph();
    let err = check_layers(&graph, &rules, &[("config", "controller")]).expect_err("direct");
    assert!(err.contains("plan -> controller: plan/mod.rs"), "{err}");
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
