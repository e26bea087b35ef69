//! Analyze: name the first divergent operator of a unit (see docs/compare.md, "How the
//! culprit is found").
//!
//! The first row that fails is usually downstream of the real cause. An op is *locally
//! divergent* when its outputs break tolerance while everything it consumed agrees:
//! - all of its inputs (tensors it consumed, weights included) are within tolerance, and
//! - an output is an error, or its inputs are equal (bitwise, or every statistic in
//!   statistics mode: [`super::judge::Equality`]) and an output is past the warning
//!   threshold (with equal inputs even a small difference is far beyond rounding), and
//! - its output error is more than `local_gain` times its largest input error (otherwise it
//!   only carries or mildly amplifies inherited error).
//!
//! A backward op also consumes what its forward call saved: the inputs and outputs of the
//! matching forward op count as its inputs.
//!
//! The first divergent op is the earliest locally divergent op, per phase, that is
//! followed by an error. Phases: forward; backward, which also holds the forward-direction
//! ops that run after the first backward op (the optimizer update consumes gradients).
//! Failing inputs of the earliest failing op mean the divergence enters from outside the
//! captured ops (weights, data, random draws): reported as such. The first NaN/Inf producer
//! is the earliest op with finite inputs and new non-finite outputs.

use super::align::Side;
use super::judge::Equality;
use super::measure::CompareKind;
use super::tolerance::loosest;
use super::{Carry, Row, Tolerances, Verdict};
use crate::dump::args::ArgDiff;
use crate::dump::{Direction, Role};
use crate::op_key::{KeyRef, Randomness};
use crate::schema::summary::{Carried, Finding, Findings, OneSided};
use foldhash::HashMap;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Where the findings of a unit are.
struct Place<'a> {
    step: &'a str,
    rank: &'a str,
    stacks: &'a BTreeMap<u64, Vec<String>>,
}

fn is_input(r: &Row) -> bool {
    let t = &r.tensor;
    t.role == Role::Input || (t.role == Role::Parameter && t.op.direction == Direction::Forward)
}

fn is_output(r: &Row) -> bool {
    !is_input(r)
}

/// Whether a tensor holds integers or booleans: indices, counts, masks.
fn discrete(r: &Row) -> bool {
    r.tensor
        .sides
        .cmp
        .dtype
        .known()
        .is_some_and(|d| !d.is_float())
}

/// Whether a tensor holds floating-point values.
fn floating(r: &Row) -> bool {
    r.tensor
        .sides
        .cmp
        .dtype
        .known()
        .is_some_and(|d| d.is_float())
}

fn fails(r: &Row) -> bool {
    r.judgement.verdict == Verdict::Error
}

/// One line of evidence for a row.
pub fn evidence_line(r: &Row) -> String {
    let (t, j) = (&r.tensor, &r.judgement);
    let side = if is_input(r) { "in " } else { "out" };
    let mut s = format!("{side} {} [{}]", t.name, j.verdict.name());
    if let Some(m) = &t.metrics {
        let cos = m
            .cosine
            .map(|c| format!("{c:.7}"))
            .unwrap_or_else(|| "n/a".into());
        s += &format!(
            " cos={cos} rel_l2={:.3e} max_abs={:.3e}",
            m.rel_l2, m.max_abs
        );
    } else if t.stat_diff().is_some() {
        s += &format!(" stat_err={:.3e}", j.err);
    }
    // "identical" only where the data was seen to be equal: a pass within atol, or equal
    // statistics, is not.
    match r.equality() {
        Some(Equality::Bitwise) => s += " (identical)",
        Some(Equality::Statistics) => s += " (statistics equal)",
        None => {}
    }
    if !j.reason.is_empty() {
        s += &format!(": {}", j.reason);
    }
    s
}

/// An input of the op read from memory nothing had written on either side (not compared),
/// other than a target the op only writes.
fn leftover<'a>(rows: &[&'a Row]) -> Option<&'a Row> {
    rows.iter().copied().find(|r| {
        let key = &r.tensor.op.key;
        is_input(r)
            && r.tensor.kind == CompareKind::Unwritten
            && !key.slot(&r.tensor.name).is_some_and(|s| key.only_writes(s))
    })
}

/// Which side of a pair read unwritten memory, for a person.
fn unwritten_sides(r: &Row) -> &'static str {
    let s = &r.tensor.sides;
    match (s.bench.unwritten, s.cmp.unwritten) {
        (true, true) => "on both sides",
        (true, false) => "on the bench side",
        _ => "on the cmp side",
    }
}

fn finding(at: &Place, rows: &[&Row], focus: &Row, explanation: String) -> Finding {
    let t = &focus.tensor;
    let stack =
        t.op.stack
            .and_then(|id| at.stacks.get(&id).cloned())
            .unwrap_or_default();
    Finding {
        op: t.op.key.to_string(),
        step: at.step.to_string(),
        rank: at.rank.to_string(),
        seq: t.op.seq,
        direction: t.op.direction,
        tensor: t.name.clone(),
        reason: focus.judgement.reason.clone(),
        explanation,
        evidence: rows.iter().map(|r| evidence_line(r)).collect(),
        stack,
        leftover: leftover(rows).map(|r| r.tensor.name.clone()),
        args: Vec::new(),
        one_sided_source: None,
        carried: None,
    }
}

fn worst<'a>(rows: impl Iterator<Item = &'a &'a Row>) -> Option<&'a Row> {
    rows.copied().max_by(|a, b| {
        let (x, y) = (&a.judgement, &b.judgement);
        x.verdict
            .cmp(&y.verdict)
            .then(x.err.total_cmp(&y.err))
            .then(b.tensor.op.seq.cmp(&a.tensor.op.seq))
    })
}

/// The benchmark side's scale of a tensor: max(|max|, |min|, norm/√n) from its statistics,
/// else ‖b‖/√n from the metrics of full tensors.
fn bench_scale(r: &Row) -> Option<f64> {
    let t = &r.tensor;
    let root_n = (t.sides.bench.numel().max(1) as f64).sqrt();
    if let Some(s) = &t.sides.bench.stats {
        let v = [
            s.max().map(f64::abs),
            s.min().map(f64::abs),
            s.norm().map(|n| n / root_n),
        ]
        .into_iter()
        .flatten()
        .filter(|v| v.is_finite())
        .reduce(f64::max);
        if v.is_some() {
            return v;
        }
    }
    t.metrics.as_ref().map(|m| m.norm_b / root_n)
}

/// The largest absolute difference of a pair that was measured: max|c − b| of full
/// tensors, else the largest difference of max, min, mean and norm/√n.
fn abs_diff(r: &Row) -> Option<f64> {
    let t = &r.tensor;
    if let Some(m) = &t.metrics {
        return Some(m.max_abs);
    }
    let d = t.stat_diff()?;
    let root_n = (t.sides.bench.numel().max(1) as f64).sqrt();
    [
        d.max_diff,
        d.min_diff,
        d.mean_diff,
        d.norm_diff.map(|x| x / root_n),
    ]
    .into_iter()
    .flatten()
    .map(f64::abs)
    .reduce(f64::max)
}

/// Whether an output is rounding noise of the op's inputs: the benchmark's own value is no
/// larger than the rounding its precision leaves of a sum over the inputs
/// (k·ε_bench·s_in, with s_in the largest input scale and k the input elements per output
/// element), and the difference no larger than that at the judged precision. Such a
/// tensor is mathematically zero — the bias gradient of a convolution followed by a
/// normalisation — and its relative error (1e-4 against 3e-8 is "5e3") says nothing about
/// the op: it is never the output that names a culprit.
fn rounding_noise(out: &Row, inputs: &[&&Row]) -> bool {
    let t = &out.tensor;
    let float = |d: &crate::dtype::AnyDType| d.known().filter(|d| d.is_float());
    let Some(bench) = float(&t.sides.bench.dtype) else {
        return false;
    };
    let judged = [float(&t.sides.cmp.dtype), out.judgement.precision]
        .into_iter()
        .flatten()
        .fold(bench, loosest);
    let (Some(eb), Some(ej)) = (bench.epsilon(), judged.epsilon()) else {
        return false;
    };
    let s_in = inputs
        .iter()
        .filter_map(|r| bench_scale(r))
        .fold(0.0f64, f64::max);
    let n_in = inputs
        .iter()
        .map(|r| r.tensor.sides.bench.numel())
        .max()
        .unwrap_or(0);
    let k = (n_in as f64 / t.sides.bench.numel().max(1) as f64).max(1.0);
    let (Some(scale), Some(diff)) = (bench_scale(out), abs_diff(out)) else {
        return false;
    };
    s_in > 0.0 && scale <= k * eb * s_in && diff <= k * ej * s_in
}

/// How much an output that sums many elements of an input amplifies their relative error
/// by cancelling: the size of the terms it adds up (k input elements per output element,
/// each of the input's root mean square) over the output's own scale; 1 when nothing
/// cancels. A bias gradient is the sum of the output gradient over the batch, whose terms
/// cancel to a small fraction of their size: in a bfloat16 run against a float32 one its
/// relative error is the gradient's, times that ratio, and no fault of the op.
fn cancellation(out: &Row, inputs: &[&&Row]) -> f64 {
    let n_out = out.tensor.sides.bench.numel().max(1) as f64;
    let terms = inputs
        .iter()
        .filter_map(|r| {
            let b = &r.tensor.sides.bench;
            let n = b.numel() as f64;
            let rms = b.stats.as_ref()?.norm()? / n.sqrt();
            (n > n_out).then(|| n / n_out * rms)
        })
        .fold(0.0f64, f64::max);
    match bench_scale(out) {
        Some(scale) if scale > 0.0 && terms > scale => terms / scale,
        _ => 1.0,
    }
}

/// Why a random op whose inputs agree and whose outputs differ is no culprit.
fn random_explanation(r: Randomness, consumed: &str) -> String {
    let check = "check config-check's random category (seeds, generator states) and \
                 deterministic algorithms (torch.use_deterministic_algorithms), or compare \
                 with the random op off";
    match r {
        Randomness::WhenDropoutActive => format!(
            "what it consumed agrees on both sides ({consumed}), yet its outputs differ. It draws random \
             numbers when its dropout is active (dropout_p > 0, keep_prob < 1; the dump does \
             not record which): then this is a different random draw, not a faulty kernel — \
             {check}; with dropout off, the error is local to this op"
        ),
        _ => format!(
            "what it consumed agrees on both sides ({consumed}), yet its outputs differ: it draws random \
             numbers, so this is a different random draw (another seed or generator state), \
             not a faulty kernel — {check}"
        ),
    }
}

/// What the localiser knows of an op before it reads its rows.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    /// The op's sequence number.
    pub seq: u64,
    /// Forward or backward.
    pub direction: Direction,
    /// Some tensor of it is out of tolerance.
    pub fails: bool,
    /// Some tensor of it is not within tolerance (a warning or an error).
    pub flagged: bool,
    /// Some tensor of it holds NaN/Inf on the comparison side.
    pub nonfinite: bool,
}

/// A unit's rows op by op (an op's rows are consecutive), as the localiser reads them: the
/// heads of all, the rows of those it looks into. Rows may be made when read, so the
/// localiser reads only the ops that can matter (flagged or holding NaN/Inf, and the
/// forward calls of those it examines).
pub trait OpRows {
    /// How many ops.
    fn ops(&self) -> usize;
    /// Op `k`'s key.
    fn key(&self, k: usize) -> KeyRef<'_>;
    /// Op `k`'s head.
    fn head(&self, k: usize) -> Head;
    /// Op `k`'s rows, in slot order.
    fn rows(&self, k: usize) -> Cow<'_, [Row]>;
    /// The non-tensor arguments op `k` was called with differently on the two sides (one
    /// call of the same API on each; none otherwise); with `divergent`, also those one side
    /// left out (`args::diff_at_divergence`).
    fn arg_diffs(&self, _k: usize, _divergent: bool) -> Vec<ArgDiff> {
        Vec::new()
    }
    /// The op only one side calls whose output is input `name` (the comparison side's
    /// name) of op `k` on that side, with its stack id (comparison side only); None when
    /// the producers on both sides have counterparts, or none was captured.
    fn one_sided_source(&self, _k: usize, _name: &str) -> Option<(Side, String, Option<u64>)> {
        None
    }
}

/// What the localiser keeps of an op's head (16 bytes: a unit can have a million ops).
#[derive(Debug, Clone, Copy)]
struct Brief {
    seq: u64,
    direction: Direction,
    /// Its key says backward: it may have a forward twin.
    twin: bool,
    fails: bool,
    flagged: bool,
    nonfinite: bool,
}

/// Localises one unit. Its ops must be in execution order (as the judge hands them on).
pub fn localize(
    unit: &dyn OpRows,
    stacks: &BTreeMap<u64, Vec<String>>,
    step: &str,
    rank: &str,
    tols: &Tolerances,
    carried: &Carry,
) -> Findings {
    let at = Place { step, rank, stacks };
    let briefs: Vec<Brief> = (0..unit.ops())
        .map(|k| {
            let h = unit.head(k);
            Brief {
                seq: h.seq,
                direction: h.direction,
                twin: unit.key(k).direction() == Direction::Backward,
                fails: h.fails,
                flagged: h.flagged,
                nonfinite: h.nonfinite,
            }
        })
        .collect();
    // Forward ops by key, for backward ops to find their forward twin: only when some key
    // may have one (a forward-only unit of a million ops needs no map of a million keys).
    let by_key: HashMap<&str, usize> = if briefs.iter().any(|b| b.twin) {
        (0..briefs.len())
            .filter(|&k| briefs[k].direction == Direction::Forward)
            .map(|k| (unit.key(k).text(), k))
            .collect()
    } else {
        HashMap::default()
    };
    let mut f = Findings::default();
    let first_backward = briefs
        .iter()
        .filter(|h| h.direction == Direction::Backward)
        .map(|h| h.seq)
        .min();
    let phase = |h: &Brief| match first_backward {
        Some(s) if h.seq > s => Direction::Backward,
        _ => h.direction,
    };
    let forward_fails = briefs
        .iter()
        .any(|h| phase(h) == Direction::Forward && h.fails);
    for dir in [Direction::Forward, Direction::Backward] {
        // Gradients of a diverged forward differ from the loss on: not an outside source.
        let inherited = dir == Direction::Backward && forward_fails;
        // Ops (u32: a store's op count fits) of this phase.
        let dir_ops: Vec<u32> = (0..briefs.len())
            .filter(|&k| phase(&briefs[k]) == dir)
            .map(|k| k as u32)
            .collect();
        let Some(last_error) = dir_ops.iter().rposition(|&k| briefs[k as usize].fails) else {
            continue;
        };
        // Earliest failing op, and whether the failure enters through its inputs.
        if let Some(&k) = dir_ops.iter().find(|&&k| briefs[k as usize].fails) {
            let rows = unit.rows(k as usize);
            let g: Vec<&Row> = rows.iter().collect();
            if let Some(focus) = worst(g.iter().filter(|r| fails(r))) {
                *f.earliest_failing.slot(dir) = Some(finding(
                    &at,
                    &g,
                    focus,
                    "the first op with a tensor out of tolerance".into(),
                ));
            }
            let bad_in: Vec<&&Row> = g.iter().filter(|r| is_input(r) && fails(r)).collect();
            if let Some(inp) = worst(bad_in.into_iter()).filter(|_| !inherited) {
                let what = match (inp.tensor.role, inp.tensor.external) {
                    (Role::Parameter, _) => "a parameter",
                    (_, true) => "a tensor no captured op produced (weight, data batch or random draw)",
                    _ => "a tensor that differs before any captured op fails (produced or changed outside the captured ops)",
                };
                // Earlier ops of the phase that only warned: the difference may have grown
                // there, below the error tolerance (a small one that atol forgave, say).
                let warned: Vec<u32> = dir_ops
                    .iter()
                    .take_while(|&&j| j != k)
                    .filter(|&&j| briefs[j as usize].flagged)
                    .copied()
                    .collect();
                let earlier = match warned.first() {
                    Some(&j) if !inp.tensor.external => {
                        let (n, verb) = match warned.len() {
                            1 => ("one".to_string(), "warns"),
                            n => (n.to_string(), "warn"),
                        };
                        format!(
                            "no earlier captured op fails, though {n} {verb} from {} on: the \
                             difference may have grown there, below the error tolerance",
                            unit.key(j as usize).text()
                        )
                    }
                    _ => "no earlier captured op fails".to_string(),
                };
                let source = unit.one_sided_source(k as usize, &inp.tensor.name);
                // The value a captured op of the previous step wrote, where it differed only
                // by noise it amplified (judge.rs, `NoiseWrite`): no op is at fault.
                let noise = match source {
                    None => carried.noise_write(&inp.tensor),
                    Some(_) => None,
                };
                let expl = match (&source, noise) {
                    (Some((side, op, _)), _) => {
                        let (calls, other, why) = match side {
                            Side::Cmp => (
                                "the comparison run",
                                "the benchmark",
                                "code the port adds, or a call it makes another way",
                            ),
                            Side::Bench => (
                                "the benchmark",
                                "the comparison run",
                                "a step the port leaves out, or makes another way",
                            ),
                        };
                        format!(
                            "the divergence enters through an op only {calls} calls: {} is \
                             the output of {op} there, which {other} does not call ({why}); \
                             {earlier}. Check that call before suspecting this op",
                            inp.tensor.name
                        )
                    }
                    (None, Some(w)) => format!(
                        "the divergence enters with {}, the value {} wrote in {} (the same \
                         statistics in both runs), where it differed only by rounding noise \
                         that op amplified (a normalised update of a near-zero gradient, as \
                         Adam's): a warning there, not an op's error. No captured op is at \
                         fault; {earlier}",
                        inp.tensor.name, w.op, carried.step
                    ),
                    (None, None) => format!(
                        "the divergence enters from outside the captured ops: {} is {what}; \
                         {earlier}. Check the config-check categories (weights, dataset, \
                         random seeds) before suspecting this op",
                        inp.tensor.name
                    ),
                };
                let mut found = finding(&at, &g, inp, expl);
                found.one_sided_source = source.map(|(side, op, stack)| OneSided {
                    side: side.name().into(),
                    op,
                    at: stack
                        .and_then(|id| at.stacks.get(&id))
                        .and_then(|frames| frames.last().cloned()),
                });
                found.carried = noise.map(|w| Carried {
                    step: carried.step.clone(),
                    op: w.op.clone(),
                    tensor: w.tensor.clone(),
                });
                *f.external_source.slot(dir) = Some(found);
            }
        }
        // First locally divergent op followed by an error.
        let mut found = false;
        let noted = |expl: String| {
            if inherited {
                format!("{expl} (note: the forward diverged first)")
            } else {
                expl
            }
        };
        for (i, &k) in dir_ops.iter().enumerate() {
            if i > last_error {
                break;
            }
            // Every tensor within tolerance: its worst output is no divergence.
            if !briefs[k as usize].flagged {
                continue;
            }
            let rows = unit.rows(k as usize);
            let g: Vec<&Row> = rows.iter().collect();
            let inputs: Vec<&&Row> = g.iter().filter(|r| is_input(r)).collect();
            // Outputs that are rounding noise of the inputs cannot show a local error.
            let outputs: Vec<&&Row> = g
                .iter()
                .filter(|r| is_output(r) && !rounding_noise(r, &inputs))
                .collect();
            if outputs.is_empty() || inputs.iter().any(|r| fails(r)) {
                continue;
            }
            // A backward op also consumes what its forward call saved.
            let twin = g[0]
                .tensor
                .op
                .key
                .forward_twin()
                .and_then(|k| by_key.get(k.as_str()))
                .map(|&t| unit.rows(t));
            let saved: Vec<&Row> = twin.iter().flat_map(|t| t.iter()).collect();
            // The weakest equality among everything it consumed (None: some differ).
            let equal = inputs
                .iter()
                .copied()
                .chain(saved.iter())
                .map(|r| r.equality())
                .try_fold(Equality::Bitwise, |acc, e| e.map(|e| acc.min(e)));
            let identical = equal.is_some();
            let threshold = if identical {
                Verdict::Warning
            } else {
                Verdict::Error
            };
            if saved.iter().any(|r| fails(r)) {
                continue;
            }
            let max_in = inputs
                .iter()
                .copied()
                .chain(saved.iter())
                .map(|r| r.judgement.raw_err)
                .fold(0.0f64, f64::max);
            // An output grown past its inputs' error by more than the local gain, once a
            // sum's cancellation is allowed for.
            // (The cancellation is at least 1: it is worked out only past the plain test.)
            let bound = tols.local_gain * max_in;
            let local = |r: &&&Row| {
                let err = r.judgement.raw_err;
                r.judgement.verdict >= threshold
                    && (identical || err > bound && err / cancellation(r, &inputs) > bound)
            };
            // A decision (indices, a mask) taken from floating-point values that agree
            // within tolerance, not exactly, and called the same way: a near tie went the
            // other way. Not the culprit, unless a floating-point output is one by itself;
            // look on (what follows took other paths).
            let near_tie = !identical
                && inputs.iter().any(|r| floating(r))
                && !outputs.iter().any(|r| floating(r) && local(r));
            if near_tie && unit.arg_diffs(k as usize, true).is_empty() {
                let decided: Vec<&Row> = outputs
                    .iter()
                    .map(|r| **r)
                    .filter(|r| fails(r) && discrete(r))
                    .collect();
                if let Some(out) = worst(decided.iter()) {
                    let slot = f.near_tie.slot(dir);
                    if slot.is_none() {
                        let expl = format!(
                            "its floating-point inputs agree within tolerance, not exactly, \
                             and its output {} ({}) differs: a decision taken from values \
                             at a boundary (a maximum among nearly equal scores, a top-k, a \
                             threshold) went the other way: the inputs' rounding rather \
                             than a faulty kernel; what follows takes other paths (an MoE \
                             router's tokens go to other experts). Compare in a precision \
                             where the two runs agree more closely, or fix the decision \
                             (route the comparison run by the benchmark's choices) to \
                             compare what comes after it",
                            out.tensor.name, out.tensor.sides.cmp.dtype
                        );
                        *slot = Some(finding(&at, &g, out, expl));
                    }
                    continue;
                }
            }
            let Some(out) = worst(outputs.iter().copied().filter(local)) else {
                continue;
            };
            // After a near tie, a decision's consequences: what it consumed agrees by its
            // statistics only, which a permutation leaves unchanged (tokens routed to other
            // experts: the same count of ones in the routing mask, other rows), and only
            // discrete outputs differ (per-expert counts). Not a culprit; look on.
            if f.near_tie.slot(dir).is_some()
                && equal == Some(Equality::Statistics)
                && outputs.iter().all(|r| !fails(r) || discrete(r))
            {
                continue;
            }
            let out_err = out.judgement.raw_err;
            let consumed = if saved.is_empty() {
                format!("{} inputs", inputs.len())
            } else {
                format!(
                    "{} inputs and the {} tensors of its forward call",
                    inputs.len(),
                    saved.len()
                )
            };
            // Called differently on the two sides: the call is the cause, not its kernel.
            let diffs = unit.arg_diffs(k as usize, true);
            if !diffs.is_empty() {
                let agree = if identical {
                    format!("all {consumed} agree")
                } else {
                    format!(
                        "all {consumed} are within tolerance (largest relative error {max_in:.3e})"
                    )
                };
                let list: Vec<String> = diffs.iter().map(ArgDiff::brief).collect();
                let one_sided = diffs.iter().all(|d| {
                    d.bench == crate::dump::args::NOT_PASSED
                        || d.cmp == crate::dump::args::NOT_PASSED
                });
                let expl = if one_sided {
                    format!(
                        "{agree}, yet output {} has error {:.3e}, and one run passed an \
                         argument the other did not ({}; benchmark vs comparison): unless it \
                         is the value the other run's default gives, the call differs; check \
                         it before suspecting the kernel",
                        out.tensor.name,
                        out.judgement.err,
                        list.join(", ")
                    )
                } else {
                    format!(
                        "{agree}, yet output {} has error {:.3e} and the op was called with \
                         different non-tensor arguments ({}; benchmark vs comparison): the \
                         call differs, set by code the dump does not capture (a \
                         hyperparameter, a config value, a number read from a tensor); check \
                         where those come from before suspecting the kernel",
                        out.tensor.name,
                        out.judgement.err,
                        list.join(", ")
                    )
                };
                let mut at_op = finding(&at, &g, out, noted(expl));
                at_op.args = diffs;
                *f.first_divergent.slot(dir) = Some(at_op);
                found = true;
                break;
            }
            let randomness = g[0].tensor.op.key.randomness();
            if randomness != Randomness::None {
                // Agreeing inputs, differing outputs, and the op draws random numbers: a
                // different draw, not a faulty kernel. Not the culprit; look on.
                let slot = f.random_draw.slot(dir);
                if slot.is_none() {
                    *slot = Some(finding(
                        &at,
                        &g,
                        out,
                        random_explanation(randomness, &consumed),
                    ));
                }
                continue;
            }
            // Nothing it consumed is on record (a parameters_grad record): nothing shows
            // that the difference starts here rather than in what computed it.
            if inputs.is_empty() && saved.is_empty() && !tols.blame_without_inputs {
                continue;
            }
            // An input no run wrote is never "within tolerance": it was not compared.
            let expl = if let Some(u) = leftover(&g) {
                format!(
                    "input {} read memory nothing had written {} (leftover bytes, not \
                     compared); the rest of its {consumed} are within tolerance (largest \
                     relative error {max_in:.3e}), yet output {} has relative error \
                     {out_err:.3e}: leftover bytes read as values (an uninitialised buffer) \
                     are the likely cause",
                    u.tensor.name,
                    unwritten_sides(u),
                    out.tensor.name
                )
            } else if inputs.is_empty() && saved.is_empty() {
                format!(
                    "its output {} is out of tolerance and it has no recorded inputs \
                     (named because blame_without_inputs is set)",
                    out.tensor.name
                )
            } else {
                // A collective's output is computed from every rank's input, of which this
                // rank sees its own: the cross-rank verdict says which rank it came from.
                let local = if g[0].tensor.op.key.base().starts_with("Distributed.") {
                    "the error is local to this op, or came with another rank's input to it \
                     (the cross-rank verdict says which)"
                } else {
                    "the error is local to this op"
                };
                if identical {
                    let how = if equal == Some(Equality::Bitwise) {
                        "are identical on both sides"
                    } else {
                        "have equal statistics on both sides"
                    };
                    format!(
                        "all {consumed} {how}, yet output {} differs (error {:.3e}): {local}",
                        out.tensor.name, out.judgement.err
                    )
                } else if max_in > 0.0 && out_err.is_finite() {
                    format!(
                        "all {consumed} are within tolerance (largest relative error \
                         {max_in:.3e}), yet output {} has relative error {out_err:.3e}, \
                         {:.0}x larger: {local}",
                        out.tensor.name,
                        out_err / max_in
                    )
                } else {
                    format!(
                        "all {consumed} are within tolerance (largest relative error \
                         {max_in:.3e}), yet output {} has relative error {out_err:.3e}: {local}",
                        out.tensor.name
                    )
                }
            };
            *f.first_divergent.slot(dir) = Some(finding(&at, &g, out, noted(expl)));
            found = true;
            break;
        }
        if !found
            && !inherited
            && f.external_source.slot(dir).is_none()
            && f.random_draw.slot(dir).is_none()
            && f.near_tie.slot(dir).is_none()
        {
            f.drift.push(dir);
        }
    }
    // First NaN/Inf producer, in execution order over both directions.
    for (k, h) in briefs.iter().enumerate() {
        // No NaN/Inf on the comparison side: no new NaN/Inf output.
        if !h.nonfinite {
            continue;
        }
        let rows = unit.rows(k);
        let g: Vec<&Row> = rows.iter().collect();
        let inputs_finite = g
            .iter()
            .filter(|r| is_input(r))
            .all(|r| !r.tensor.cmp_nonfinite());
        if !inputs_finite {
            continue;
        }
        if let Some(out) = g.iter().find(|r| is_output(r) && r.tensor.new_nonfinite()) {
            let expl = match leftover(&g) {
                Some(u) => format!(
                    "first op whose output {} holds NaN/Inf that the benchmark does not; its \
                     input {} read memory nothing had written {} (leftover bytes, not \
                     compared) and its other inputs are finite: leftover bytes read as values \
                     (an uninitialised buffer) are the likely cause",
                    out.tensor.name,
                    u.tensor.name,
                    unwritten_sides(u)
                ),
                None => format!(
                    "first op whose inputs are all finite but whose output {} holds NaN/Inf \
                     that the benchmark does not",
                    out.tensor.name
                ),
            };
            f.first_nonfinite = Some(finding(&at, &g, out, expl));
            break;
        }
    }
    f.other_args = other_args(unit, &at);
    if !briefs.iter().any(|b| b.fails) {
        f.first_warning = first_warning(unit, &briefs, &at);
    }
    f
}

/// Where nothing fails: the first op, in execution order, whose output warns while every
/// input of it passes. Below the error tolerance the localiser names no culprit, but where
/// the warnings begin is where to look.
fn first_warning(unit: &dyn OpRows, briefs: &[Brief], at: &Place) -> Option<Finding> {
    (0..briefs.len())
        .filter(|&k| briefs[k].flagged)
        .find_map(|k| {
            let rows = unit.rows(k);
            let g: Vec<&Row> = rows.iter().collect();
            if g.iter()
                .any(|r| is_input(r) && r.judgement.verdict != Verdict::Pass)
            {
                return None;
            }
            let warned = g
                .iter()
                .filter(|r| is_output(r) && r.judgement.verdict == Verdict::Warning);
            let out = worst(warned)?;
            let expl = format!(
                "the first op whose output {} warns while its inputs pass: where the warnings \
                 begin (a difference below the error tolerance names no culprit; \
                 docs/compare.md, \"Known limits\")",
                out.tensor.name
            );
            Some(finding(at, &g, out, expl))
        })
}

/// The first op called with different non-tensor arguments, whatever its outputs, with how
/// many ops of the unit were. An argument only one run passed counts where a tensor of the
/// op is not within tolerance (elsewhere an explicit default would only be noise).
fn other_args(unit: &dyn OpRows, at: &Place) -> Option<Finding> {
    let mut differing = (0..unit.ops()).filter_map(|k| {
        let d = unit.arg_diffs(k, unit.head(k).flagged);
        (!d.is_empty()).then_some((k, d))
    });
    let (k, diffs) = differing.next()?;
    let n = 1 + differing.count();
    let rows = unit.rows(k);
    let g: Vec<&Row> = rows.iter().collect();
    let outputs = g.iter().filter(|r| is_output(r));
    let focus = worst(outputs).or_else(|| worst(g.iter()))?;
    let list: Vec<String> = diffs.iter().map(ArgDiff::brief).collect();
    let ops = if n == 1 {
        "the only op".to_string()
    } else {
        format!("the first of {n} ops")
    };
    let expl = format!(
        "{ops} of {}/{} called with different non-tensor arguments ({}; benchmark vs \
         comparison), set by code the dump does not capture; its output {} is {}",
        at.step,
        at.rank,
        list.join(", "),
        focus.tensor.name,
        focus.judgement.verdict.name()
    );
    let mut found = finding(at, &g, focus, expl);
    found.args = diffs;
    Some(found)
}
