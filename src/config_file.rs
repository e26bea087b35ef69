//! Small configuration files (tolerances, config-check rules): read with a size cap, so
//! that `--config /dev/zero` or a mistyped path to a dump is a one-line error instead of
//! reading until memory runs out, and parser messages made safe to print on one line.

use crate::error::{ProbeError, Result};
use std::io::Read;
use std::path::Path;

/// The largest configuration file read.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a configuration file of at most `MAX_CONFIG_BYTES`.
pub fn read(path: &Path) -> Result<String> {
    let bad = |msg: String| ProbeError::BadConfig {
        path: path.to_path_buf(),
        msg,
    };
    let f = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ProbeError::io(path, e))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(bad(format!(
            "larger than {} bytes: not a configuration file",
            MAX_CONFIG_BYTES
        )));
    }
    String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))
}

/// `msg` (a path, an op key, a parser message: data from an input) with control characters
/// (newlines, escapes, NUL, the C1 range ...) and the invisible characters that reorder or
/// break the text around them written as escapes (`\n`, `\r`, `\t`, `\x1b`, `\u{9b}`,
/// `\u{202e}`), so a hostile file cannot break the one-line error, drive the terminal, or
/// make a line read other than it is (a right-to-left override shows `gpj.exe` as
/// `exe.jpg`).
pub fn printable(msg: &str) -> String {
    escaped(msg, false)
}

/// `text` (lines for the terminal) with every control character but the newline escaped as
/// [`printable`] does: the last step before stdout or stderr.
pub fn printable_lines(text: &str) -> String {
    escaped(text, true)
}

/// Bidirectional formatting characters (embeddings and overrides U+202A–U+202E, isolates
/// U+2066–U+2069, the marks U+200E, U+200F and U+061C) and the line and paragraph
/// separators U+2028, U+2029: not control characters to Rust, but they reorder or break a
/// line on the terminal.
fn invisible(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}' | '\u{2028}' | '\u{2029}')
}

fn escaped(text: &str, keep_newlines: bool) -> String {
    let special = |c: char| (c.is_control() || invisible(c)) && !(keep_newlines && c == '\n');
    if !text.chars().any(special) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' if keep_newlines => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() || invisible(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("a\nb\x1b[31m\r\x07"), "a\\nb\\x1b[31m\\r\\x07");
        assert_eq!(printable("\u{9b}2J"), "\\u{9b}2J");
        assert_eq!(printable_lines("a\x1b[2J\nb\r\n"), "a\\x1b[2J\nb\\r\n");
        assert_eq!(printable("plain – text"), "plain – text");
        assert_eq!(
            printable("a\u{202e}gpj.exe\u{2066}\u{200f}\u{61c}\u{2028}"),
            "a\\u{202e}gpj.exe\\u{2066}\\u{200f}\\u{61c}\\u{2028}"
        );
        assert_eq!(printable_lines("x\u{202a}\n"), "x\\u{202a}\n");
    }
}
