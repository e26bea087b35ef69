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

/// `msg` with control characters (newlines, escapes, NUL ...) written as `\u{..}`, so a
/// hostile file cannot break the one-line error or drive the terminal.
pub(crate) fn printable(msg: &str) -> String {
    msg.chars()
        .map(|c| {
            if c.is_control() {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("a\nb\x1b[31m"), "a\\u{a}b\\u{1b}[31m");
        assert_eq!(printable("plain – text"), "plain – text");
    }
}
