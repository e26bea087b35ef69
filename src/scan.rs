//! `probe scan`: find where NaN/Inf comes from in one run, with no benchmark.
//!
//! Often the only run a user has is the failing one. Per step/rank, in execution order:
//! - the **first producer** of NaN/+Inf per phase (forward; backward with the optimizer):
//!   the earliest op whose inputs are all finite and one of whose outputs is not. NaN/Inf in
//!   an input that no earlier op produced *enters from outside* the captured ops.
//! - `-inf` alone (max finite, min `-inf`, no NaN) is what attention masks hold: noted as
//!   `-inf only`, never an error, so that every transformer dump does not fail the gate.
//!   Unless the op made it from finite inputs by what it computes (a log of 0, a division by
//!   0, a cast that overflows): then it is NaN/Inf produced there, and named (an entropy
//!   `p * log(p)` names the `log`, not the `mul` whose `0 * -inf` is NaN).
//! - **overflow risk**: a finite float tensor whose largest |value| is within `margin` of its
//!   dtype's largest finite value (fp16 65504, bf16/fp32 3.4e38), or a cast to fp16/bf16
//!   whose input does not fit the output dtype.
//! - **underflow**: an op whose float inputs are not all zero but whose float outputs are
//!   all zero (fp16 gradients vanishing), for ops that do not zero by design.
//! - **loss-scaler skipped steps**, where the scaler's ops were captured: a `found_inf` of
//!   `_amp_foreach_non_finite_check_and_unscale_` / `_amp_update_scale_` that is set. The
//!   NaN/Inf of such a step's backward phase (its gradients, and what reads them) is what the
//!   scaler is there for (float16 gradients overflowing under the loss scale, the step
//!   skipped and the scale lowered): a warning, counted apart. NaN/Inf in its forward is an
//!   error still.
//!
//! Statistics are enough (every probe and msprobe dump records them); the verdict rules are
//! all here, the reports reuse [`crate::report`].

use crate::dtype::DType;
use crate::dump::training::{holds_gradients, scaler_skipped};
use crate::dump::{self, Direction, Op, RankDump, RankLoc, Role, Selection, Stats, Tensor};
use crate::error::{ProbeError, Result};
use crate::gate::{FailOn, EXIT_NOTHING_COMPARABLE};
use crate::progress::{Count, Progress};
use crate::schema::compare::OpInfo;
pub use crate::schema::scan::{ScanCounts, ScanFindings, ScanSummary, UnitScan};
use crate::schema::summary::{ByDirection, Finding};
use crate::vocab::Verdict;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the scan says about one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    /// Finite, nothing to say.
    Finite,
    /// Only `-inf` besides finite values, outside the gradients: masking (or a negative
    /// overflow).
    NegInfOnly,
    /// All zero although the op's inputs are not.
    Underflow,
    /// Finite, but within the margin of its dtype's range.
    OverflowRisk,
    /// Holds NaN or +Inf (or non-finite statistics of unknown sign).
    NonFinite,
    /// Holds NaN or +Inf computed from leftover bytes (memory nothing had written): what
    /// an uninitialised buffer gives, and by design a pipeline stage's shape inference.
    Leftover,
    /// Holds NaN or +Inf in the backward phase (gradients, and what reads them: clipping) of a
    /// step the loss scaler skipped.
    ScalerSkipped,
}

impl Flag {
    /// The name used in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Flag::Finite => "",
            Flag::NegInfOnly => "-inf only",
            Flag::Underflow => "underflow",
            Flag::OverflowRisk => "overflow risk",
            Flag::NonFinite => "nan/inf",
            Flag::Leftover => "nan/inf from leftover bytes",
            Flag::ScalerSkipped => "nan/inf in a step the loss scaler skipped",
        }
    }
}

/// One scanned tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanRow {
    /// Its op.
    pub op: OpInfo,
    /// Its name.
    pub name: String,
    /// Input, output or parameter.
    pub role: Role,
    /// Its dtype.
    pub dtype: crate::dtype::AnyDType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Recorded statistics.
    pub stats: Option<Stats>,
    /// The scan's word on it.
    pub flag: Flag,
    /// Why, for a person (empty when finite).
    pub reason: String,
}

impl ScanRow {
    /// Whether the op consumed this tensor (an input, or a parameter of a forward call).
    pub(crate) fn consumed(&self) -> bool {
        self.role == Role::Input
            || (self.role == Role::Parameter && self.op.direction == Direction::Forward)
    }
}

/// One scanned step/rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanUnit {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// The rank folder.
    pub dir: PathBuf,
    /// Op records.
    pub ops: usize,
    /// Every tensor, in execution order.
    pub rows: Vec<ScanRow>,
    /// What was found.
    pub findings: ScanFindings,
    /// Non-fatal problems met while reading.
    pub warnings: Vec<String>,
}

/// A whole scan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanRun {
    /// The dump as given.
    pub dump: PathBuf,
    /// Every step/rank, in order.
    pub units: Vec<ScanUnit>,
    /// An overflow-mode dump: only ops that produced NaN/Inf were recorded.
    pub overflow: bool,
    /// Non-fatal problems.
    pub warnings: Vec<String>,
}

/// Options of a scan.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// A finite |value| above `dtype max / margin` is an overflow risk.
    pub margin: f64,
    /// The steps and ranks to scan (`--steps`, `--ranks`).
    pub selection: Selection,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            margin: 16.0,
            selection: Selection::default(),
        }
    }
}

/// The largest finite value of a float dtype.
fn dtype_max(d: DType) -> Option<f64> {
    match d {
        DType::F16 => Some(65504.0),
        DType::BF16 => Some(3.389_531_389_251_535_5e38),
        DType::F32 => Some(f32::MAX as f64),
        DType::F64 => Some(f64::MAX),
        _ => None,
    }
}

/// Non-finite content of a tensor from its statistics.
fn nonfinite_kind(s: &Stats) -> Flag {
    if s.nonfinite().unwrap_or(0) == 0 {
        return Flag::Finite;
    }
    let has_nan = s.nan().map_or_else(
        || [s.max(), s.min()].iter().flatten().any(|v| v.is_nan()),
        |n| n > 0,
    );
    let neg_inf_only =
        !has_nan && s.max().is_some_and(f64::is_finite) && s.min() == Some(f64::NEG_INFINITY);
    if neg_inf_only {
        Flag::NegInfOnly
    } else {
        Flag::NonFinite
    }
}

fn max_abs(s: &Stats) -> Option<f64> {
    let m = [s.max(), s.min()]
        .iter()
        .flatten()
        .map(|v| v.abs())
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    m.filter(|v| v.is_finite())
}

fn all_zero(s: &Stats) -> bool {
    s.max() == Some(0.0) && s.min() == Some(0.0)
}

fn is_input(t: Tensor, op: Op) -> bool {
    t.role() == Role::Input || (t.role() == Role::Parameter && op.direction() == Direction::Forward)
}

fn is_float(t: Tensor) -> bool {
    t.dtype().known().is_some_and(DType::is_float)
}

/// Ops that zero their output by design (not an underflow).
fn zeroes_by_design(op: Op) -> bool {
    let k = op.key().base().to_ascii_lowercase();
    [
        "zero",
        "fill",
        "mask",
        "dropout",
        "relu",
        "threshold",
        "clamp",
        "where",
        "mul",
        "empty",
    ]
    .iter()
    .any(|w| k.contains(w))
}

/// The reason of a tensor read from memory nothing had written: its statistics (NaN/Inf
/// counts too) are not taken.
const UNWRITTEN: &str = "unwritten memory (leftover bytes), not scanned";

/// The reason of the value before a call of a target the op only writes.
const OVERWRITTEN: &str = "leftover bytes the op only overwrites, not scanned";

/// The scan's flag and reason for one tensor of `op`.
fn flag_of(t: Tensor, op: Op, inputs_nonzero: bool, margin: f64) -> (Flag, String) {
    if t.unwritten() {
        let reason = if t.overwritten() {
            OVERWRITTEN
        } else {
            UNWRITTEN
        };
        return (Flag::Finite, reason.into());
    }
    if t.overwritten() {
        // The value before a call that only writes it (an initialiser after `empty`:
        // `uniform_`, `normal_`, `fill_`, `copy_`'s target): not something the op reads, so
        // its bytes (leftovers a dump did not mark unwritten) are no NaN entering.
        return (Flag::Finite, OVERWRITTEN.into());
    }
    let Some(s) = &t.stats() else {
        return (Flag::Finite, String::new());
    };
    match nonfinite_kind(s) {
        Flag::NonFinite => {
            let what = match (s.nan(), s.inf()) {
                (Some(n), Some(i)) => format!("{n} NaN, {i} Inf"),
                _ => "non-finite statistics".into(),
            };
            return (Flag::NonFinite, what);
        }
        // A mask's -inf lives in the forward; its gradient is finite. -inf in a gradient
        // is an overflow (float16 under a loss scale, as a rule).
        Flag::NegInfOnly if holds_gradients(op) => {
            return (
                Flag::NonFinite,
                "-inf in a gradient (an overflow, not a mask)".into(),
            );
        }
        Flag::NegInfOnly => return (Flag::NegInfOnly, "-inf only (a mask?)".into()),
        _ => {}
    }
    let d = t.dtype().known();
    if let (Some(m), Some(lim)) = (max_abs(s), d.and_then(dtype_max)) {
        if m > lim / margin {
            let r = format!(
                "max |x| {m:.4e} within {margin}x of the {} limit {lim:.4e}",
                t.dtype()
            );
            return (Flag::OverflowRisk, r);
        }
    }
    let output = !is_input(t, op);
    if output && is_float(t) && inputs_nonzero && all_zero(s) && !zeroes_by_design(op) {
        return (Flag::Underflow, "all zero from non-zero inputs".into());
    }
    (Flag::Finite, String::new())
}

/// A cast to a narrower float dtype whose input does not fit it: its (finite) input is an
/// overflow that the output may not show (saturation on some devices).
fn cast_overflow(op: Op) -> Option<String> {
    let out = op.tensors().find(|&t| !is_input(t, op))?;
    let lim = out.dtype().known().and_then(dtype_max)?;
    let worst = op
        .tensors()
        .filter(|&t| is_input(t, op) && is_float(t))
        .filter_map(|t| t.stats().as_ref().and_then(max_abs))
        .fold(0.0f64, f64::max);
    (worst > lim).then(|| {
        format!(
            "input max |x| {worst:.4e} does not fit {} (limit {lim:.4e})",
            out.dtype()
        )
    })
}

/// Why `op`'s `-inf`-only output was produced here rather than passed on as a mask: an op
/// that makes `-inf` out of finite inputs by what it computes (a log of 0, a division by
/// 0, a cast that overflows). Mask-making ops (`masked_fill`, `full`, `where`, `fill_`,
/// `triu` of a mask: their `-inf` is a constant argument or an input's) are none of these,
/// nor is an op one of whose inputs already holds NaN/Inf or is not known.
fn makes_neg_inf(op: Op) -> Option<String> {
    let inputs: Vec<Tensor> = op.tensors().filter(|&t| is_input(t, op)).collect();
    let finite = |t: &Tensor| {
        !is_float(*t)
            || (!t.unwritten()
                && t.stats()
                    .as_ref()
                    .is_some_and(|s| nonfinite_kind(s) == Flag::Finite))
    };
    if !inputs.iter().all(finite) {
        return None;
    }
    let floats: Vec<&Tensor> = inputs.iter().filter(|t| is_float(**t)).collect();
    // The range of the `i`-th float input holds `at` (statistics only see the range).
    let reaches = |i: usize, at: f64| {
        floats.get(i).is_some_and(|t| {
            t.stats().as_ref().is_some_and(|s| {
                s.min().is_some_and(|m| m <= at) && s.max().is_some_and(|m| m >= at)
            })
        })
    };
    let key = op.key();
    let name = key.leaf();
    // In place (`log_`), not a dunder (`__truediv__`).
    let name = match name.strip_suffix('_') {
        Some(n) if !name.starts_with("__") => n,
        _ => name,
    };
    let name = name.strip_prefix("special_").unwrap_or(name);
    match name {
        "log" | "log2" | "log10" if reaches(0, 0.0) => Some(format!(
            "-inf made from finite inputs: {name} of 0 (no clamp or eps), not a mask"
        )),
        "log1p" if reaches(0, -1.0) => {
            Some("-inf made from finite inputs: log1p of -1, not a mask".into())
        }
        "div" | "divide" | "true_divide" | "__truediv__" | "__itruediv__" | "__div__"
            if reaches(1, 0.0) =>
        {
            Some("-inf made from finite inputs: a division by 0, not a mask".into())
        }
        "__rtruediv__" | "__rdiv__" | "reciprocal" if reaches(0, 0.0) => {
            Some("-inf made from finite inputs: a division by 0, not a mask".into())
        }
        _ => cast_overflow(op).map(|r| format!("-inf made from finite inputs by a cast: {r}")),
    }
}

/// A tensor the op consumed that was read from memory nothing had written.
fn leftover<'a>(rows: &[&'a ScanRow]) -> Option<&'a ScanRow> {
    rows.iter()
        .copied()
        .find(|r| r.consumed() && r.reason == UNWRITTEN)
}

fn finding(
    unit: &RankLoc,
    stacks: &BTreeMap<u64, Vec<String>>,
    rows: &[&ScanRow],
    focus: &ScanRow,
    explanation: String,
) -> Finding {
    let evidence = rows
        .iter()
        .map(|r| {
            let side = if r.consumed() { "in " } else { "out" };
            if r.reason == UNWRITTEN {
                return format!("{side} {}: {UNWRITTEN}", r.name);
            }
            let st = r.stats.as_ref().map_or_else(String::new, |s| {
                let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4e}"));
                format!(
                    " max={} min={} mean={} norm={}",
                    f(s.max()),
                    f(s.min()),
                    f(s.mean()),
                    f(s.norm())
                )
            });
            let flag = if r.flag == Flag::Finite {
                String::new()
            } else {
                format!(" [{}]", r.flag.name())
            };
            format!("{side} {}{flag}{st}", r.name)
        })
        .collect();
    Finding {
        op: focus.op.key.to_string(),
        step: unit.step.clone(),
        rank: unit.rank.clone(),
        seq: focus.op.seq,
        direction: focus.op.direction,
        tensor: focus.name.clone(),
        reason: focus.reason.clone(),
        explanation,
        evidence,
        stack: focus
            .op
            .stack
            .and_then(|id| stacks.get(&id).cloned())
            .unwrap_or_default(),
        leftover: leftover(rows).map(|r| r.name.clone()),
        args: Vec::new(),
        one_sided_source: None,
        carried: None,
        outside: None,
        draw: None,
        module: focus.op.module_path(),
        consequence_of: None,
        layout: Vec::new(),
    }
}

/// How many overflow / underflow findings a unit keeps.
const KEEP: usize = 20;

/// Scans one step/rank.
pub(crate) fn scan_unit(dump: RankDump, opts: &ScanOptions) -> ScanUnit {
    let RankDump {
        loc,
        ops,
        stacks,
        warnings,
        ..
    } = dump;
    let first_backward = ops
        .iter()
        .find(|o| o.direction() == Direction::Backward)
        .map(|o| o.seq());
    let mut scan = Scanning {
        opts,
        loc: &loc,
        stacks: &stacks,
        first_backward,
        rows: Vec::with_capacity(ops.tensor_count()),
        findings: ScanFindings {
            loss_scaler_skipped: scaler_skipped(&ops),
            ..ScanFindings::default()
        },
        forward_rows: std::collections::HashMap::new(),
        from_leftover: std::collections::HashMap::new(),
        calls: std::collections::HashMap::new(),
    };
    for op in ops.iter() {
        let (from_twin, origin) = scan.trace_leftovers(op);
        let start = scan.rows.len();
        scan.flag_tensors(op, from_twin.is_some(), origin.as_ref());
        scan.find(op, start, origin.as_ref());
    }
    let Scanning { rows, findings, .. } = scan;
    ScanUnit {
        step: loc.step.clone(),
        rank: loc.rank.clone(),
        dir: loc.dir.clone(),
        ops: ops.len(),
        rows,
        findings,
        warnings,
    }
}

/// One step/rank being scanned op by op: its rows and findings so far, and what the ops so
/// far tell the next ones.
struct Scanning<'a> {
    opts: &'a ScanOptions,
    loc: &'a RankLoc,
    stacks: &'a BTreeMap<u64, Vec<String>>,
    /// The first backward call's sequence number.
    first_backward: Option<u64>,
    rows: Vec<ScanRow>,
    findings: ScanFindings,
    /// Where each forward call's rows are: a backward call also consumes what its forward
    /// call saved, so NaN there is inherited, not produced.
    forward_rows: std::collections::HashMap<&'a str, std::ops::Range<usize>>,
    /// Values computed from leftover bytes (dataflow ids), and the forward calls that
    /// computed from them (their backward calls do too), with the input that read them.
    from_leftover: std::collections::HashMap<u64, String>,
    calls: std::collections::HashMap<String, String>,
}

impl<'a> Scanning<'a> {
    /// The input that read leftover bytes `op` computes from, here or earlier: through its
    /// forward call (the first), else its inputs (the second); and records what it computes.
    fn trace_leftovers(&mut self, op: Op) -> (Option<String>, Option<String>) {
        let (from_leftover, calls) = (&mut self.from_leftover, &mut self.calls);
        let twin = (!calls.is_empty() && op.direction() == Direction::Backward)
            .then(|| op.key().forward_twin())
            .flatten();
        let from_twin = twin.and_then(|k| calls.get(&k).cloned());
        let origin = from_twin.clone().or_else(|| {
            op.tensors().filter(|&t| is_input(t, op)).find_map(|t| {
                if t.unwritten() && !t.overwritten() {
                    return Some(t.name().into_owned());
                }
                t.src().and_then(|s| from_leftover.get(&s).cloned())
            })
        });
        // An input holding NaN/Inf of its own (neither leftovers nor computed from them)
        // is where the op's NaN/Inf comes from, whatever leftovers it also read (an MoE
        // layer gathers its experts' outputs into `torch.empty` by index). Looked at only
        // where leftovers are read: most ops read none.
        let own_nonfinite = || {
            op.tensors().any(|t| {
                is_input(t, op)
                    && !t.unwritten()
                    && t.src().is_none_or(|s| !from_leftover.contains_key(&s))
                    && t.stats()
                        .as_ref()
                        .is_some_and(|s| nonfinite_kind(s) == Flag::NonFinite)
            })
        };
        let origin = origin.filter(|_| !own_nonfinite());
        if let Some(o) = &origin {
            for t in op.tensors().filter(|&t| !is_input(t, op)) {
                if let Some(id) = t.id() {
                    from_leftover.insert(id, o.clone());
                }
            }
            if op.direction() == Direction::Forward {
                calls.insert(op.key().text().to_string(), o.clone());
            }
        }
        (from_twin, origin)
    }

    /// The rows of `op`'s tensors, flagged. `through_twin`: its leftovers come through its
    /// forward call; `origin`: the input that read them.
    fn flag_tensors(&mut self, op: Op<'a>, through_twin: bool, origin: Option<&String>) {
        let info = OpInfo::of(op);
        let (opts, first_backward) = (self.opts, self.first_backward);
        let (rows, from_leftover) = (&mut self.rows, &self.from_leftover);
        let loss_scaler_skipped = self.findings.loss_scaler_skipped;
        let float_inputs: Vec<Tensor> = op
            .tensors()
            .filter(|&t| is_input(t, op) && is_float(t))
            .collect();
        let inputs_nonzero = !float_inputs.is_empty()
            && float_inputs
                .iter()
                .all(|t| t.stats().as_ref().is_some_and(|s| !all_zero(s)));
        let start = rows.len();
        for t in op.tensors() {
            let (mut flag, mut reason) = flag_of(t, op, inputs_nonzero, opts.margin);
            // `-inf` alone is a mask's, unless this op made it from finite inputs.
            if flag == Flag::NegInfOnly && !is_input(t, op) {
                if let Some(r) = makes_neg_inf(op) {
                    (flag, reason) = (Flag::NonFinite, r);
                }
            }
            if flag == Flag::Finite && !is_input(t, op) {
                if let Some(r) = cast_overflow(op) {
                    (flag, reason) = (Flag::OverflowRisk, r);
                }
            }
            // NaN/Inf computed from leftover bytes: this op's, or an input's from earlier.
            let derived = if is_input(t, op) && !through_twin {
                t.src().and_then(|s| from_leftover.get(&s))
            } else {
                origin
            };
            if let (Flag::NonFinite, Some(o)) = (flag, derived) {
                flag = Flag::Leftover;
                reason = format!("{reason}, computed from leftover bytes read as {o}");
            }
            // In a step the loss scaler skipped, what the backward phase holds comes from
            // the gradients it found overflowed (gradient clipping reads them too).
            let backward_phase =
                holds_gradients(op) || first_backward.is_some_and(|s| op.seq() > s);
            if flag == Flag::NonFinite && loss_scaler_skipped && backward_phase {
                flag = Flag::ScalerSkipped;
                reason = format!(
                    "{reason}, in the backward of a step the loss scaler skipped (gradients \
                     overflowed under the loss scale)"
                );
            }
            rows.push(ScanRow {
                op: info.clone(),
                name: t.name().into_owned(),
                role: t.role(),
                dtype: t.dtype().clone(),
                shape: t.shape().to_vec(),
                stats: t.stats(),
                flag,
                reason,
            });
        }
        if op.direction() == Direction::Forward {
            self.forward_rows.insert(op.key().text(), start..rows.len());
        }
    }

    /// The findings the rows of `op` (from `start` on) make: where NaN/Inf enters from
    /// outside or is first produced, NaN/Inf computed from leftover bytes, overflow risk,
    /// underflow.
    fn find(&mut self, op: Op, start: usize, origin: Option<&String>) {
        let (rows, findings, stacks) = (&self.rows, &mut self.findings, self.stacks);
        let (forward_rows, first_backward) = (&self.forward_rows, self.first_backward);
        let saved_nonfinite = op
            .key()
            .forward_twin()
            .and_then(|k| forward_rows.get(k.as_str()))
            .is_some_and(|r| rows[r.clone()].iter().any(|x| x.flag == Flag::NonFinite));
        let group: Vec<&ScanRow> = rows[start..].iter().collect();
        let phase = match first_backward {
            Some(s) if op.seq() > s => Direction::Backward,
            _ => op.direction(),
        };
        let bad = |consumed: bool| {
            group
                .iter()
                .find(|r| r.consumed() == consumed && r.flag == Flag::NonFinite)
        };
        let (bad_in, bad_out) = (bad(true), bad(false));
        let unit = self.loc;
        if saved_nonfinite {
            // Inherited through the forward call's saved tensors, not produced here.
        } else if let Some(inp) = bad_in {
            let produced_before = rows[..start].iter().any(|r| r.flag == Flag::NonFinite);
            let slot = findings.external_nonfinite.slot(phase);
            let first = findings.first_nonfinite.forward.is_none()
                && findings.first_nonfinite.backward.is_none();
            if slot.is_none() && !produced_before && first {
                let expl = format!(
                    "input {} holds NaN/Inf and no earlier captured op produced any: it enters \
                     from outside the captured ops (data, weights, or an uncaptured op)",
                    inp.name
                );
                *slot = Some(finding(unit, stacks, &group, inp, expl));
            }
        } else if let Some(out) = bad_out {
            let slot = findings.first_nonfinite.slot(phase);
            if slot.is_none() {
                let expl = format!(
                    "all inputs are finite, yet output {} holds {}: the first op producing \
                     NaN/Inf in this phase",
                    out.name, out.reason
                );
                *slot = Some(finding(unit, stacks, &group, out, expl));
            }
        }
        if findings.leftover_nonfinite.is_none() {
            let out = group
                .iter()
                .find(|r| !r.consumed() && r.flag == Flag::Leftover);
            if let (Some(out), Some(o)) = (out, origin) {
                let expl = format!(
                    "output {} holds NaN/Inf computed from leftover bytes: {o} read memory \
                     nothing had written. An uninitialised buffer, unless the result is \
                     thrown away (a pipeline stage's shape inference runs on torch.empty \
                     inputs by design)",
                    out.name
                );
                let mut f = finding(unit, stacks, &group, out, expl);
                f.leftover = Some(o.clone());
                findings.leftover_nonfinite = Some(f);
            }
        }
        if let Some(r) = group.iter().find(|r| r.flag == Flag::OverflowRisk) {
            if findings.overflow_risk.len() < KEEP {
                let expl = format!("{}: overflow risk", r.reason);
                findings
                    .overflow_risk
                    .push(finding(unit, stacks, &group, r, expl));
            }
        }
        if let Some(r) = group.iter().find(|r| r.flag == Flag::Underflow) {
            if findings.underflow.len() < KEEP {
                let expl = "non-zero float inputs, all-zero output: underflow".to_string();
                findings
                    .underflow
                    .push(finding(unit, stacks, &group, r, expl));
            }
        }
    }
}

/// Scans every step/rank of a dump. A step/rank without op records (a run that crashed
/// before writing any) is skipped with a warning; when none has any, nothing was scanned.
pub fn run(dump: &Path, opts: &ScanOptions, progress: &Progress) -> Result<ScanRun> {
    let set = opts.selection.apply(dump::discover(dump)?)?;
    let mut units = Vec::with_capacity(set.ranks.len());
    let mut warnings = Vec::new();
    let stage = progress.stage("scan", set.ranks.len() as u64, Count::Items);
    for loc in &set.ranks {
        stage.note(loc.dir.display().to_string());
        let d = dump::load_rank(loc)?;
        stage.inc(1);
        warnings.extend(d.warnings.iter().cloned());
        if d.ops.is_empty() {
            warnings.push(format!(
                "{}: no op records (crashed run?); not scanned",
                loc.dir.display()
            ));
            continue;
        }
        units.push(scan_unit(d, opts));
    }
    if units.is_empty() && !set.ranks.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "{}: no step/rank holds op records",
            dump.display()
        )));
    }
    Ok(ScanRun {
        dump: dump.to_path_buf(),
        units,
        overflow: set.overflow,
        warnings,
    })
}

/// The run-wide verdict of a scan: counts, headline, exit code; `outputs` are the report
/// files the command writes, by format.
pub(crate) fn summarize(
    run: &ScanRun,
    fail_on: FailOn,
    outputs: BTreeMap<String, String>,
) -> ScanSummary {
    let mut c = ScanCounts {
        units: run.units.len(),
        ..ScanCounts::default()
    };
    for u in &run.units {
        c.ops += u.ops;
        c.tensors += u.rows.len();
        for r in &u.rows {
            match r.flag {
                Flag::NonFinite => c.nonfinite += 1,
                Flag::Leftover => c.nonfinite_from_leftover += 1,
                Flag::ScalerSkipped => c.nonfinite_scaler_skipped += 1,
                Flag::NegInfOnly => c.neg_inf_only += 1,
                Flag::OverflowRisk => c.overflow_risk += 1,
                Flag::Underflow => c.underflow += 1,
                Flag::Finite => {}
            }
        }
        c.loss_scaler_skipped_steps += u.findings.loss_scaler_skipped as usize;
    }
    let verdict = if c.nonfinite + c.nonfinite_from_leftover > 0 {
        Verdict::Error
    } else if c.overflow_risk + c.underflow + c.nonfinite_scaler_skipped > 0 {
        Verdict::Warning
    } else {
        Verdict::Pass
    };
    // An overflow-mode dump without records is the agent saying nothing overflowed.
    let exit_code = if c.tensors == 0 && !run.overflow {
        EXIT_NOTHING_COMPARABLE
    } else {
        fail_on.exit_code(verdict)
    };
    let first = |pick: fn(&ScanFindings) -> &ByDirection| {
        let mut out = ByDirection::default();
        for u in &run.units {
            let b = pick(&u.findings);
            out.forward = out.forward.take().or_else(|| b.forward.clone());
            out.backward = out.backward.take().or_else(|| b.backward.clone());
        }
        out
    };
    let first_nonfinite = first(|f| &f.first_nonfinite);
    let external_nonfinite = first(|f| &f.external_nonfinite);
    let leftover_nonfinite = run
        .units
        .iter()
        .find_map(|u| u.findings.leftover_nonfinite.clone());
    let headline = scan_headline(verdict, &c, run, leftover_nonfinite.as_ref());
    ScanSummary {
        format: "probe-scan-summary".into(),
        version: 1,
        verdict,
        fail_on,
        exit_code,
        headline,
        dump: run.dump.display().to_string(),
        counts: c,
        first_nonfinite,
        external_nonfinite,
        leftover_nonfinite,
        units: run
            .units
            .iter()
            .map(|u| UnitScan {
                step: u.step.clone(),
                rank: u.rank.clone(),
                dir: u.dir.display().to_string(),
                tensors: u.rows.len(),
                nonfinite: u.rows.iter().filter(|r| r.flag == Flag::NonFinite).count(),
                findings: u.findings.clone(),
            })
            .collect(),
        warnings: run.warnings.clone(),
        outputs,
    }
}

fn scan_headline(
    verdict: Verdict,
    c: &ScanCounts,
    run: &ScanRun,
    leftover: Option<&Finding>,
) -> String {
    if c.tensors == 0 {
        return if run.overflow {
            "CLEAN: nothing overflowed (this overflow-mode dump records only ops that produced NaN/Inf)".into()
        } else {
            "NOTHING SCANNED: no tensor in the dump".into()
        };
    }
    // The earliest step/rank with NaN/Inf tells the story.
    for u in &run.units {
        let f = &u.findings;
        let cands = [
            (false, &f.external_nonfinite.forward),
            (true, &f.first_nonfinite.forward),
            (true, &f.first_nonfinite.backward),
            (false, &f.external_nonfinite.backward),
        ];
        let best = cands
            .iter()
            .filter_map(|(p, x)| x.as_ref().map(|x| (*p, x)))
            .min_by_key(|(_, x)| x.seq);
        match best {
            Some((true, x)) => {
                return format!("NaN/Inf: first produced by {}", x.nonfinite_producer())
            }
            Some((false, x)) => {
                return format!(
                    "NaN/Inf enters from outside the captured ops: {} (input of {}, {}/{})",
                    x.tensor, x.op, x.step, x.rank
                )
            }
            None => {}
        }
    }
    if let (Verdict::Error, Some(x), 0) = (verdict, leftover, c.nonfinite) {
        return format!(
            "NaN/Inf only computed from leftover bytes: first by {}; an uninitialised buffer \
             unless its result is thrown away (a pipeline stage's shape inference)",
            x.nonfinite_producer()
        );
    }
    match verdict {
        Verdict::Error => format!("NaN/Inf in {} tensors", c.nonfinite),
        Verdict::Warning if c.nonfinite_scaler_skipped > 0 => format!(
            "NaN/Inf only in the gradients of {} step/rank folder(s) the loss scaler skipped ({} \
             tensors): they overflowed under the loss scale, which the scaler then lowered; expected now \
             and then, a problem if it repeats; {} at overflow risk, {} underflowed",
            c.loss_scaler_skipped_steps, c.nonfinite_scaler_skipped, c.overflow_risk, c.underflow
        ),
        Verdict::Warning => format!(
            "NO NaN/Inf in {} tensors; {} at overflow risk, {} underflowed",
            c.tensors, c.overflow_risk, c.underflow
        ),
        Verdict::Pass => format!("CLEAN: no NaN/Inf in {} tensors", c.tensors),
    }
}
