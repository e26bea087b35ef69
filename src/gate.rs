//! The CI gate: when a command fails, and the exit codes it says so with (README.md,
//! "Exit codes"). The one place that knows these numbers.

use crate::vocab::Verdict;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Within tolerance (compare), no difference at the gate's level (config-check).
pub const EXIT_PASS: u8 = 0;
/// A divergence (or difference) at or above `--fail-on`.
pub(crate) const EXIT_FAIL: u8 = 1;
/// A usage or input error; one line on stderr names the file, op or tensor.
pub const EXIT_INPUT: u8 = 2;
/// Nothing could be compared.
pub(crate) const EXIT_NOTHING_COMPARABLE: u8 = 3;
/// Compared, but incomplete: some step/rank pairs or records are missing on one side (a
/// crashed or full-disk run), or more than `--max-unmatched` of a side's tensors have no
/// counterpart (a capture that stopped early), and nothing failed the gate in what could
/// be compared (a divergence still exits [`EXIT_FAIL`]).
pub(crate) const EXIT_INCOMPLETE: u8 = 4;

/// The default of `probe compare --max-unmatched`: more than 5 % of a side's tensors
/// without a counterpart makes a comparison incomplete.
pub const DEFAULT_MAX_UNMATCHED: f64 = 0.05;

/// Reads a fraction given as `0.05` or `5%`, between 0 and 1 inclusive (`--max-unmatched`).
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(p) => (p.trim(), 100.0),
        None => (t, 1.0),
    };
    let v = num
        .parse::<f64>()
        .map_err(|_| format!("{s:?}: expected a fraction such as 0.05 or 5%"))?
        / scale;
    check_fraction(v).map_err(|e| format!("{s:?}: {e}"))
}

/// A fraction is a number from 0 to 1 inclusive.
pub(crate) fn check_fraction(v: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0 and 1 (0% and 100%)".into())
    }
}

/// When the gate fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailOn {
    /// On any error (the default).
    Error,
    /// On any warning or error.
    Warning,
    /// Never: report only.
    Never,
}

impl FailOn {
    /// Whether a verdict fails the gate.
    pub(crate) fn fails(self, verdict: Verdict) -> bool {
        match self {
            FailOn::Error => verdict == Verdict::Error,
            FailOn::Warning => verdict >= Verdict::Warning,
            FailOn::Never => false,
        }
    }

    /// The exit code for a verdict.
    pub(crate) fn exit_code(self, verdict: Verdict) -> u8 {
        if self.fails(verdict) {
            EXIT_FAIL
        } else {
            EXIT_PASS
        }
    }
}

impl FromStr for FailOn {
    type Err = String;
    fn from_str(s: &str) -> Result<FailOn, String> {
        match s {
            "error" => Ok(FailOn::Error),
            "warning" => Ok(FailOn::Warning),
            "never" => Ok(FailOn::Never),
            _ => Err(format!("{s:?}: expected error, warning or never")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_read_as_numbers_or_percentages_within_0_and_1() {
        assert_eq!(parse_fraction("0.05"), Ok(0.05));
        assert_eq!(parse_fraction("5%"), Ok(0.05));
        assert_eq!(parse_fraction(" 100 % "), Ok(1.0));
        assert_eq!(parse_fraction("0"), Ok(0.0));
        for bad in ["1.5", "-0.1", "150%", "NaN", "inf", "five", "%", ""] {
            assert!(parse_fraction(bad).is_err(), "{bad}");
        }
    }
}
