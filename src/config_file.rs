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

/// `msg` with control characters (newlines, escapes, NUL, the C1 range ...) written as
/// escapes (`\n`, `\r`, `\t`, `\x1b`, `\u{9b}`), so a hostile file cannot break the
/// one-line error or drive the terminal.
pub(crate) fn printable(msg: &str) -> String {
    escaped(msg, false)
}

/// `text` (lines for the terminal) with every control character but the newline escaped as
/// [`printable`] does: the last step before stdout or stderr.
pub fn printable_lines(text: &str) -> String {
    escaped(text, true)
}

fn escaped(text: &str, keep_newlines: bool) -> String {
    if !text
        .chars()
        .any(|c| c.is_control() && !(keep_newlines && c == '\n'))
    {
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
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
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
    }
}
