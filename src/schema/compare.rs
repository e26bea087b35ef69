//! Plain records of a compare that `summary.json`, the reports and the shard files hold:
//! where a tensor's op is, a stretch compared at its boundary, a loss scale, micro-batching,
//! input sizes, an argument that differs. Data only: the compare stages that find them
//! (`compare::align`, `compare::loss_scale`, `compare::micro_batch`, `dump::args`) build
//! them, and every reader downstream takes them from here, never from the stages.

use crate::op_key::{Direction, OpKey};
use crate::vocab::{MatchedBy, Sides};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The op a tensor belongs to, as reports and the localiser need it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpInfo {
    /// Position of the op in its side's execution order (the comparison side's for matches).
    pub index: usize,
    /// The op's sequence number in its dump.
    pub seq: u64,
    /// The op key.
    pub key: OpKey,
    /// Forward or backward.
    pub direction: Direction,
    /// Id of the op's call stack.
    pub stack: Option<u64>,
    /// The module path the call happened in, when the dump says (the html report's module
    /// bands and tree; kept when rows are parked or merged from shards).
    #[serde(default)]
    pub module: Option<Arc<str>>,
}

impl OpInfo {
    /// The dotted path of the module the op ran in, for a person (a finding's `module`): a
    /// module record's own path, else the one the dump recorded (msprobe's parent is a
    /// module record's key: its path); None when the dump does not say or the op ran at
    /// the top level.
    pub(crate) fn module_path(&self) -> Option<String> {
        let own = crate::op_key::module_path(self.key.as_str());
        let path = own.or_else(|| {
            let m = self.module.as_deref()?;
            Some(crate::op_key::module_path(m).unwrap_or(m))
        })?;
        (!path.is_empty()).then(|| path.to_string())
    }
}

/// A stretch of op calls inside one module call whose two sides differ, compared at its
/// boundary tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// The module path the calls happened in (`""`: top level or unknown).
    pub module: String,
    /// Forward or backward.
    pub direction: Direction,
    /// `mapped` (a rule says the runs are equivalent) or `module` (fallback).
    pub by: MatchedBy,
    /// The mapping rule, when mapped.
    pub rule: Option<String>,
    /// The calls of each side, in order (op keys): API calls, or module records where the
    /// dump holds module records only.
    pub calls: Sides<Vec<String>>,
    /// The comparison-side op its rows are reported under.
    pub at: OpInfo,
    /// Boundary tensor pairs compared.
    pub boundary: usize,
}

/// A loss scale found in a step/rank pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The comparison run's gradients over the benchmark's: a power of two (1024, 2^-16).
    pub ratio: f64,
    /// The op of the first gradient both runs recorded, where it was measured.
    pub at: String,
}

impl LossScale {
    /// `1024x (2^10)`, `1/65536x (2^-16)`.
    pub(crate) fn brief(&self) -> String {
        let k = self.ratio.log2().round();
        if self.ratio < 1.0 {
            format!("1/{}x (2^{k})", 1.0 / self.ratio)
        } else {
            format!("{}x (2^{k})", self.ratio)
        }
    }
}

/// Forward passes a step on each side, where they differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicroBatches {
    /// The benchmark's forward passes a step.
    pub bench: usize,
    /// The comparison run's.
    pub cmp: usize,
    /// The API they were counted by (`Functional.linear`).
    pub at: String,
}

impl MicroBatches {
    /// `the cmp run takes its step in 2 micro-batches, the bench run in one (2x the
    /// Functional.linear calls, on inputs 2x smaller)`.
    pub(crate) fn brief(&self) -> String {
        let (k, side, other) = if self.cmp > self.bench {
            (self.cmp, "cmp", "bench")
        } else {
            (self.bench, "bench", "cmp")
        };
        format!(
            "the {side} run takes its step in {k} micro-batches, the {other} run in one ({k}x \
             the {} calls, on inputs {k}x smaller)",
            self.at
        )
    }
}

/// Input sizes of the two runs' first call of an API, when their whole first forward pass
/// reads other sizes and the runs do not take the same batch in other numbers of passes:
/// a batch size, a sequence length or data of another shape. Every call then pairs with a
/// call on other data, and what fails says nothing of the kernels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSizes {
    /// Elements of the benchmark's first input of that call.
    pub bench: usize,
    /// The comparison run's.
    pub cmp: usize,
    /// The API (`Functional.conv2d`).
    pub at: String,
}

impl InputSizes {
    /// `the runs' inputs differ in size from their first forward pass on (Functional.conv2d
    /// reads 49152 elements in the bench run, 24576 in the cmp run)`.
    pub(crate) fn brief(&self) -> String {
        format!(
            "the runs' inputs differ in size from their first forward pass on ({} reads {} \
             elements in the bench run, {} in the cmp run)",
            self.at, self.bench, self.cmp
        )
    }
}

/// One argument recorded on both sides with different values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgDiff {
    /// Its slot, as tensors are named: `input.1`, `input.eps`.
    pub name: String,
    /// The benchmark's value, as JSON.
    pub bench: String,
    /// The comparison run's value, as JSON.
    pub cmp: String,
}

impl ArgDiff {
    /// `input.1 = 1.0 vs 0.05`, as a headline says it.
    pub(crate) fn brief(&self) -> String {
        format!("{} = {} vs {}", self.name, self.bench, self.cmp)
    }
}

/// Where a compare wrote `recapture.json`, and what it selects.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecaptureNote {
    /// The file (in the output folder).
    pub path: String,
    /// Step label of the ops.
    pub step: String,
    /// Rank label of the ops.
    pub rank: String,
    /// The ops it selects (the first divergent ones).
    pub ops: Vec<String>,
    /// What the dumps lack.
    pub reason: String,
}
