//! `summary.json` of a scan (`schemas/probe-scan-summary.v1.schema.json`).

use crate::gate::FailOn;
use crate::schema::summary::{ByDirection, Finding};
use crate::vocab::Verdict;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the scan found in one step/rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanFindings {
    /// The first op producing NaN/Inf from finite inputs, per phase.
    pub first_nonfinite: ByDirection,
    /// NaN/Inf in an input no earlier captured op produced, per phase.
    pub external_nonfinite: ByDirection,
    /// Ops with a tensor at overflow risk (the first 20).
    pub overflow_risk: Vec<Finding>,
    /// Ops whose outputs underflowed to zero (the first 20).
    pub underflow: Vec<Finding>,
    /// The step was skipped by the loss scaler (a `found_inf` was set).
    pub loss_scaler_skipped: bool,
    /// The first op whose NaN/Inf is computed from leftover bytes (memory nothing had
    /// written: an uninitialised buffer, or a pipeline stage's shape inference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leftover_nonfinite: Option<Finding>,
}

/// Tensor counts of a scan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanCounts {
    /// Step/rank folders scanned.
    pub units: usize,
    /// Op records.
    pub ops: usize,
    /// Tensors.
    pub tensors: usize,
    /// Tensors holding NaN or +Inf.
    pub nonfinite: usize,
    /// Tensors holding only -inf besides finite values (masks).
    pub neg_inf_only: usize,
    /// Finite tensors close to their dtype's limit.
    pub overflow_risk: usize,
    /// All-zero outputs of non-zero inputs.
    pub underflow: usize,
    /// Steps the loss scaler skipped.
    pub loss_scaler_skipped_steps: usize,
    /// Tensors holding NaN/Inf computed from leftover bytes.
    #[serde(default)]
    pub nonfinite_from_leftover: usize,
    /// Tensors of the backward phase (gradients, and what reads them) holding NaN/Inf in
    /// steps the loss scaler skipped (a warning).
    #[serde(default)]
    pub nonfinite_scaler_skipped: usize,
}

/// One step/rank in the scan summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitScan {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// The rank folder.
    pub dir: String,
    /// Tensors scanned.
    pub tensors: usize,
    /// Of which holding NaN/Inf.
    pub nonfinite: usize,
    /// What was found.
    pub findings: ScanFindings,
}

/// The content of a scan's `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanSummary {
    /// Always `probe-scan-summary`.
    pub format: String,
    /// Schema version: 1.
    pub version: u32,
    /// error: NaN/Inf found; warning: overflow risk or underflow; pass: clean.
    pub verdict: Verdict,
    /// The level at which the gate fails.
    pub fail_on: FailOn,
    /// The exit status of `probe scan`.
    pub exit_code: u8,
    /// One line that tells the story.
    pub headline: String,
    /// The dump as given.
    pub dump: String,
    /// Counts.
    pub counts: ScanCounts,
    /// The first NaN/Inf producer over all steps/ranks, per phase.
    pub first_nonfinite: ByDirection,
    /// NaN/Inf entering from outside the captured ops, per phase.
    pub external_nonfinite: ByDirection,
    /// The first NaN/Inf computed from leftover bytes, over all steps/ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leftover_nonfinite: Option<Finding>,
    /// Every step/rank with its findings.
    pub units: Vec<UnitScan>,
    /// Non-fatal problems.
    pub warnings: Vec<String>,
    /// Report files written, by format.
    pub outputs: BTreeMap<String, String>,
}
