//! User strings in text output: the one sanitiser for everything the agent prints that may
//! carry a name, label, DNS name or a message quoting one (the `#` lines of `--dry-run` and
//! `/ruleset`, log lines, status messages and Events).
//!
//! A namespace name is any string in manifests mode, so `x\nadd table ip PWNED4\n#` in a
//! `# <Kind> <ns>/<name>: ...` line would otherwise become an nft command when the output is
//! piped to `nft -f -`, and a forged line in the log. [`one_line`] keeps text on one line:
//! every character that can end or disguise a line ([`breaks_line`]: control characters, the
//! Unicode line and paragraph separators, bidirectional overrides) is escaped visibly
//! (`\n`, `\r`, `\t`, `\0`, `\u{2028}`), and the result is bounded to [`LINE_MAX`] bytes.
//! Escaping is for reading, not reversible: a backslash is left as it is, so a message that
//! already quotes a value with `{:?}` is not escaped twice.
//!
//! nft comments (`comment "..."`, `log prefix "..."`) have their own, stricter form in
//! [`crate::nft::render::sanitize_text`] (replaced by `_`, 127 bytes, stored in the kernel),
//! built on the same [`breaks_line`].

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;

/// Longest line [`one_line`] returns, in bytes (a status line quoting a 253-byte DNS name
/// and a namespace name fits many times over).
pub const LINE_MAX: usize = 4096;

/// Characters that can end a line or disguise one: control characters (C0, DEL, C1 with
/// NEL), U+2028/U+2029, and the bidirectional marks, embeddings, overrides and isolates that
/// reorder what a terminal shows.
pub fn breaks_line(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` on one line: [`breaks_line`] characters escaped visibly, at most [`LINE_MAX`] bytes
/// (a cut line ends in `...(N more bytes)`). Borrows when there is nothing to do.
pub fn one_line(s: &str) -> Cow<'_, str> {
    one_line_within(s, LINE_MAX)
}

/// `s` quoted as a Rust string literal (quotes and backslashes escaped) and on one line: a
/// name printed beside others (columns of `agent explain`) can then pass for no other
/// column, line or name.
pub fn quote(s: &str) -> String {
    one_line(&format!("{s:?}")).into_owned()
}

/// Decodes one `application/x-www-form-urlencoded` value (`%XX` escapes, `+` for a space);
/// an error for a truncated or bad escape or bytes that are not UTF-8.
pub fn form_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3).ok_or("truncated %-escape")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad %-escape")?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8".to_string())
}

/// [`one_line`] in at most `max` bytes (at least 64): for fields with a limit of their own,
/// such as the 1 KiB note of a Kubernetes Event.
pub fn one_line_within(s: &str, max: usize) -> Cow<'_, str> {
    let max = max.max(64);
    if s.len() <= max && !s.chars().any(breaks_line) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len().min(max) + 16);
    for (i, c) in s.char_indices() {
        let before = out.len();
        push_escaped(&mut out, c);
        if out.len() > max - 40 {
            out.truncate(before);
            let _ = write!(out, "...({} more bytes)", s.len() - i);
            break;
        }
    }
    Cow::Owned(out)
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\0' => out.push_str("\\0"),
        c if breaks_line(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// The log's writer: each `tracing` event arrives as one write of its whole formatted line
/// (ending in `\n`), in which every other [`breaks_line`] character is escaped, so no field
/// or message, whatever it quotes, can start a line of its own. With `ansi` (stderr is a
/// terminal), colour sequences (`ESC [ digits/; m`) pass; any other escape is escaped.
pub struct LogWriter<W> {
    inner: W,
    ansi: bool,
}

impl<W: io::Write> LogWriter<W> {
    pub fn new(inner: W, ansi: bool) -> Self {
        LogWriter { inner, ansi }
    }
}

/// The length of the SGR colour sequence (`ESC [ [0-9;]* m`) at the start of `s`, if any.
fn sgr_len(s: &str) -> Option<usize> {
    let rest = s.strip_prefix("\u{1b}[")?;
    let params = rest.find(|c: char| !(c.is_ascii_digit() || c == ';'))?;
    (rest[params..].starts_with('m')).then_some(2 + params + 1)
}

/// One formatted log event as [`LogWriter`] writes it.
pub fn log_line(event: &str, ansi: bool) -> Cow<'_, str> {
    let (body, end) = match event.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (event, ""),
    };
    if !body.chars().any(breaks_line) {
        return Cow::Borrowed(event);
    }
    let mut out = String::with_capacity(event.len() + 16);
    let mut rest = body;
    while let Some(c) = rest.chars().next() {
        if let Some(n) = ansi.then(|| sgr_len(rest)).flatten() {
            out.push_str(&rest[..n]);
            rest = &rest[n..];
            continue;
        }
        push_escaped(&mut out, c);
        rest = &rest[c.len_utf8()..];
    }
    out.push_str(end);
    Cow::Owned(out)
}

impl<W: io::Write> io::Write for LogWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => self.inner.write_all(log_line(s, self.ansi).as_bytes())?,
            Err(_) => {
                let s = String::from_utf8_lossy(buf);
                self.inner.write_all(log_line(&s, self.ansi).as_bytes())?
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        let s = "EgressFirewall shop/default: EgressFirewall Rules applied ;#\"{}' é 🦀";
        assert!(matches!(one_line(s), Cow::Borrowed(t) if t == s));
    }

    #[test]
    fn line_breaks_are_escaped_visibly() {
        assert_eq!(
            one_line("x\nadd table ip PWNED4\n#"),
            "x\\nadd table ip PWNED4\\n#"
        );
        assert_eq!(one_line("a\r\nb\tc\0d"), "a\\r\\nb\\tc\\0d");
    }

    #[test]
    fn other_control_characters_are_escaped_as_code_points() {
        assert_eq!(
            one_line("a\u{1b}[2Kb\u{7f}\u{85}"),
            "a\\u{1b}[2Kb\\u{7f}\\u{85}"
        );
        assert_eq!(one_line("\u{0b}\u{0c}"), "\\u{b}\\u{c}");
    }

    #[test]
    fn unicode_separators_and_bidi_controls_are_escaped() {
        assert_eq!(one_line("a\u{2028}b\u{2029}c"), "a\\u{2028}b\\u{2029}c");
        assert_eq!(
            one_line("evil\u{202e}txt.exe\u{2066}\u{200f}"),
            "evil\\u{202e}txt.exe\\u{2066}\\u{200f}"
        );
    }

    #[test]
    fn backslashes_and_quotes_are_kept() {
        assert_eq!(one_line(r#"say "\n" \\"#), r#"say "\n" \\"#);
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_with_the_rest_counted() {
        let long = "é".repeat(LINE_MAX);
        let cut = one_line(&long);
        assert!(cut.len() <= LINE_MAX, "{}", cut.len());
        let kept = cut.find("...(").unwrap();
        assert!(cut[..kept].chars().all(|c| c == 'é'));
        assert_eq!(
            cut[kept..],
            format!("...({} more bytes)", long.len() - kept)
        );
        // Escapes are never split.
        let newlines = "\n".repeat(LINE_MAX);
        let cut = one_line(&newlines);
        assert!(cut.len() <= LINE_MAX);
        assert!(cut.split("...(").next().unwrap().ends_with("\\n"));
    }

    #[test]
    fn a_smaller_bound_for_fields_with_their_own_limit() {
        let long = "a".repeat(5000);
        let cut = one_line_within(&long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with(" more bytes)"), "{cut}");
        assert_eq!(one_line_within("short\n", 1024), "short\\n");
    }

    #[test]
    fn nft_comments_share_the_classifier_and_replace_with_underscores() {
        use crate::nft::render::sanitize_text;
        assert_eq!(
            sanitize_text("a\"b\\c;d#e\nf\rg\0h\u{2028}i\u{202e}j é"),
            "a_b_c_d_e_f_g_h_i_j é"
        );
    }

    #[test]
    fn log_lines_keep_their_end_and_nothing_else() {
        let event = "INFO EgressFirewall x\nERROR forged: y\u{2028}z\n";
        assert_eq!(
            log_line(event, false),
            "INFO EgressFirewall x\\nERROR forged: y\\u{2028}z\n"
        );
        assert!(matches!(log_line("INFO plain\n", false), Cow::Borrowed(_)));
    }

    #[test]
    fn log_colours_pass_only_on_a_terminal() {
        let event = "\u{1b}[32mINFO\u{1b}[0m name \u{1b}]0;title\u{7}\n";
        assert_eq!(
            log_line(event, true),
            "\u{1b}[32mINFO\u{1b}[0m name \\u{1b}]0;title\\u{7}\n"
        );
        assert_eq!(
            log_line(event, false),
            "\\u{1b}[32mINFO\\u{1b}[0m name \\u{1b}]0;title\\u{7}\n"
        );
    }

    #[test]
    fn the_log_writer_escapes_each_event() {
        use std::io::Write;
        let mut w = LogWriter::new(Vec::new(), false);
        w.write_all(b"WARN skipped: a\nINFO forged\n").unwrap();
        w.write_all(b"INFO next\n").unwrap();
        assert_eq!(
            String::from_utf8(w.inner).unwrap(),
            "WARN skipped: a\\nINFO forged\nINFO next\n"
        );
    }
}
