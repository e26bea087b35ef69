//! The CI gate: when a command fails, and the exit codes it says so with (README.md,
//! "Exit codes"). The one place that knows these numbers.

use crate::compare::Verdict;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Within tolerance (compare), no difference at the gate's level (config-check).
pub const EXIT_PASS: u8 = 0;
/// A divergence (or difference) at or above `--fail-on`.
pub const EXIT_FAIL: u8 = 1;
/// A usage or input error; one line on stderr names the file, op or tensor.
pub const EXIT_INPUT: u8 = 2;
/// Nothing could be compared.
pub const EXIT_NOTHING_COMPARABLE: u8 = 3;
/// Compared, but incomplete: some step/rank pairs or records are missing on one side (a
/// crashed or full-disk run), and nothing diverged in what could be compared (a
/// divergence still exits [`EXIT_FAIL`]).
pub const EXIT_INCOMPLETE: u8 = 4;

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
    pub fn fails(self, verdict: Verdict) -> bool {
        match self {
            FailOn::Error => verdict == Verdict::Error,
            FailOn::Warning => verdict >= Verdict::Warning,
            FailOn::Never => false,
        }
    }

    /// The exit code for a verdict.
    pub fn exit_code(self, verdict: Verdict) -> u8 {
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
