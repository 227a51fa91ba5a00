//! Resource limits on manifest input: file size, nesting depth and alias expansion.
//!
//! The YAML parser (libyaml, through serde_norway) needs time that grows with the square of
//! the flow nesting depth (`[[[[...` or `{a: {a: ...`: a 100 KB file took 11 s in a debug
//! build, a 5 MB one minutes), and serde_norway expands aliases into the value it builds, so
//! a few kilobytes of `*alias` references become gigabytes ("billion laughs"). So every YAML
//! document is first walked by a second, streaming parser (granit-parser, pure Rust, the one
//! serde-saphyr uses) that stops at the first node nested deeper than
//! [`Limits::max_depth`] and adds up what the aliases stand for, stopping once that exceeds
//! [`Limits::max_alias_expansion`]. Only a document within both limits is handed to
//! serde_norway. File size ([`Limits::max_bytes`]) is checked before a file is read.
//!
//! When the streaming parser finds a syntax error before either limit, the document's real
//! nesting is unknown; it is handed to serde_norway (for its usual error message, or because
//! the two parsers disagree on an edge of the YAML grammar) only when it holds at most
//! `max_depth` flow-collection openers (`[` or `{`, counted anywhere, even in strings), the
//! only nesting that is expensive for libyaml. Otherwise it is rejected with the streaming
//! parser's message. JSON files are parsed by serde_json, which is linear in the input and
//! refuses nesting deeper than 128 by itself.

use std::collections::HashMap;
use std::fmt;

use granit_parser::{Event, Parser};

/// Default [`Limits::max_bytes`]: 8 MiB, eight times the largest ConfigMap.
pub const DEFAULT_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Default [`Limits::max_depth`]. The kinds the agent reads nest about 12 deep; CRD schemas
/// that `kubectl get -o yaml` dumps may come along deeper. serde_norway itself refuses more
/// than 128.
pub const DEFAULT_MAX_DEPTH: usize = 100;
/// Default [`Limits::max_alias_expansion`]: 1 MiB.
pub const DEFAULT_MAX_ALIAS_EXPANSION: u64 = 1024 * 1024;

/// Limits applied to every manifest file (`--manifest-max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file read, in bytes.
    pub max_bytes: u64,
    /// Deepest nesting of sequences and mappings in a YAML document (the document's top-level
    /// mapping is depth 1).
    pub max_depth: usize,
    /// How much content the aliases of one YAML document may stand for, in bytes: each
    /// `*alias` counts the scalar bytes (plus one per node) of the node its anchor names,
    /// aliases inside it expanded. Roughly what the aliases would add written out in full.
    pub max_alias_expansion: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_alias_expansion: DEFAULT_MAX_ALIAS_EXPANSION,
        }
    }
}

/// Which limit a file or document exceeded; the message names the option that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// The file is larger than `max`.
    Bytes { size: u64, max: u64 },
    /// A node at `line` (1-based, in the file) is nested deeper than `max`.
    Depth { line: usize, max: usize },
    /// The aliases up to `line` stand for more than `max` bytes.
    AliasExpansion { line: usize, max: u64 },
    /// A syntax error the streaming parser found in a document too heavily nested in flow
    /// collections to hand to libyaml.
    Syntax { message: String },
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::Bytes { size, max } => write!(
                f,
                "file of {size} bytes is larger than {max} bytes (--manifest-max-bytes)"
            ),
            Breach::Depth { line, max } => write!(
                f,
                "nested deeper than {max} levels at line {line} (--manifest-max-depth)"
            ),
            Breach::AliasExpansion { line, max } => write!(
                f,
                "aliases expand to more than {max} bytes at line {line} \
                 (--manifest-max-alias-expansion)"
            ),
            Breach::Syntax { message } => write!(
                f,
                "invalid YAML: {message} (not handed to the YAML parser: too many flow \
                 collections to check against --manifest-max-depth)"
            ),
        }
    }
}

impl Limits {
    /// Checks one YAML document (`text`, whose first line is line `first_line + 1` of its
    /// file) against the depth and alias limits, in time linear in `text` up to the breach.
    pub fn check_yaml(&self, text: &str, first_line: usize) -> Result<(), Breach> {
        // The scanner reads ahead of the events, so it must stop at the limit itself:
        // opening collection number `max_depth + 1` is its RecursionLimitExceeded.
        let options = granit_parser::options! {
            emit_comments: false,
            flow_nesting_limit: self.max_depth,
            block_nesting_limit: self.max_depth,
        };
        let mut parser = Parser::new_from_str_with_options(text, options);
        let mut depth = 0usize;
        // Running total of what the document stands for with aliases expanded, the size of
        // each closed anchored node, and the open anchored collections (id, total at start).
        let mut expanded = 0u64;
        let mut alias_total = 0u64;
        let mut anchored: HashMap<usize, u64> = HashMap::new();
        let mut open: Vec<Option<(usize, u64)>> = Vec::new();
        for next in &mut parser {
            let (event, span) = match next {
                Ok(e) => e,
                Err(e) => return self.after_syntax_error(text, first_line, &e),
            };
            let line = first_line + span.start.line();
            match event {
                Event::SequenceStart(_, anchor, _) | Event::MappingStart(_, anchor, _) => {
                    depth += 1;
                    if depth > self.max_depth {
                        return Err(Breach::Depth {
                            line,
                            max: self.max_depth,
                        });
                    }
                    open.push((anchor != 0).then_some((anchor, expanded)));
                    expanded += 1;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    depth = depth.saturating_sub(1);
                    if let Some(Some((id, start))) = open.pop() {
                        anchored.insert(id, expanded - start);
                    }
                }
                Event::Scalar(value, _, anchor, _) => {
                    let size = value.len() as u64 + 1;
                    expanded += size;
                    if anchor != 0 {
                        anchored.insert(anchor, size);
                    }
                }
                Event::Alias(id) => {
                    // An alias of a node still open (a cycle) counts one; serde_norway
                    // refuses those itself.
                    let size = anchored.get(&id).copied().unwrap_or(1);
                    expanded = expanded.saturating_add(size);
                    alias_total = alias_total.saturating_add(size);
                    if alias_total > self.max_alias_expansion {
                        return Err(Breach::AliasExpansion {
                            line,
                            max: self.max_alias_expansion,
                        });
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn after_syntax_error(
        &self,
        text: &str,
        first_line: usize,
        error: &granit_parser::ScanError,
    ) -> Result<(), Breach> {
        let mark = error.marker();
        if *error.kind() == granit_parser::ErrorKind::RecursionLimitExceeded {
            return Err(Breach::Depth {
                line: first_line + mark.line(),
                max: self.max_depth,
            });
        }
        let openers = text.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
        if openers <= self.max_depth {
            return Ok(());
        }
        Err(Breach::Syntax {
            message: format!(
                "{} at line {} column {}",
                error.info(),
                first_line + mark.line(),
                mark.col() + 1
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_depth: usize, max_alias_expansion: u64) -> Limits {
        Limits {
            max_depth,
            max_alias_expansion,
            ..Limits::default()
        }
    }

    #[test]
    fn depth_counts_block_and_flow_nesting() {
        // The top-level mapping is depth 1; `{c: d}` is depth 4.
        let l = limits(4, 1000);
        assert_eq!(l.check_yaml("a:\n  b: [1, {c: d}]\n", 0), Ok(()));
        assert_eq!(
            l.check_yaml("x: 1\na:\n  b: [1, {c: [d]}]\n", 10),
            Err(Breach::Depth { line: 13, max: 4 })
        );
        assert_eq!(
            l.check_yaml("- - - - - x\n", 0),
            Err(Breach::Depth { line: 1, max: 4 })
        );
    }

    #[test]
    fn aliases_count_what_they_stand_for() {
        let l = limits(10, 100);
        // 9 scalars of 3 bytes + 1 each, plus the sequence: 37 per alias.
        let doc = |n: usize| {
            format!(
                "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\nb: [{}]\n",
                vec!["*a"; n].join(", ")
            )
        };
        assert_eq!(l.check_yaml(&doc(2), 0), Ok(()));
        assert_eq!(
            l.check_yaml(&doc(3), 0),
            Err(Breach::AliasExpansion { line: 2, max: 100 })
        );
        // Nested aliases multiply: b stands for 3 a's.
        let nested = "a: &a [lol, lol]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n";
        assert_eq!(limits(10, 100).check_yaml(nested, 0), Ok(()));
        assert!(limits(10, 40).check_yaml(nested, 0).is_err());
    }

    #[test]
    fn a_syntax_error_passes_unless_flow_heavy() {
        let l = limits(4, 100);
        assert_eq!(l.check_yaml("a: [b\nc: d\n", 0), Ok(()));
        let bomb = format!("a: {}\n", "[".repeat(3)) + "b: : : [[x";
        let err = l.check_yaml(&bomb, 0).unwrap_err();
        assert!(
            matches!(err, Breach::Syntax { .. } | Breach::Depth { .. }),
            "{err}"
        );
    }
}
