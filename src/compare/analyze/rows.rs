//! What the rules read off an op's rows: which rows it consumed and produced, the worst,
//! the evidence lines, leftover bytes, and the numbers that tell rounding noise from a
//! local error (the scale of a sum over the inputs, cancellation). Shared by every rule.

use super::context::Place;
use crate::compare::judge::{Equality, Row, Verdict};
use crate::compare::measure::CompareKind;
use crate::compare::tolerance::loosest;
use crate::schema::summary::Finding;

/// Whether a row is something the op consumed: an input, or a parameter of a forward call.
pub(super) fn is_input(r: &Row) -> bool {
    r.consumed()
}

/// Whether a row is something the op produced.
pub(super) fn is_output(r: &Row) -> bool {
    !is_input(r)
}

/// Whether a tensor holds integers or booleans: indices, counts, masks.
pub(super) fn discrete(r: &Row) -> bool {
    r.tensor
        .sides
        .cmp
        .dtype
        .known()
        .is_some_and(|d| !d.is_float())
}

/// Whether a tensor holds floating-point values.
pub(super) fn floating(r: &Row) -> bool {
    r.tensor
        .sides
        .cmp
        .dtype
        .known()
        .is_some_and(|d| d.is_float())
}

/// Whether a row is out of tolerance.
pub(super) fn fails(r: &Row) -> bool {
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
pub(super) fn leftover<'a>(rows: &[&'a Row]) -> Option<&'a Row> {
    rows.iter().copied().find(|r| {
        let key = &r.tensor.op.key;
        is_input(r)
            && r.tensor.kind == CompareKind::Unwritten
            && !key.slot(&r.tensor.name).is_some_and(|s| key.only_writes(s))
    })
}

/// Which side of a pair read unwritten memory, for a person.
pub(super) fn unwritten_sides(r: &Row) -> &'static str {
    let s = &r.tensor.sides;
    match (s.bench.unwritten, s.cmp.unwritten) {
        (true, true) => "on both sides",
        (true, false) => "on the bench side",
        _ => "on the cmp side",
    }
}

/// The finding that names the op of `rows` for its tensor `focus`, with every row as evidence.
pub(super) fn finding(at: &Place, rows: &[&Row], focus: &Row, explanation: String) -> Finding {
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
        outside: None,
        draw: None,
        module: t.op.module_path(),
        consequence_of: None,
        layout: Vec::new(),
    }
}

/// The worst of some rows: by verdict, then error; the earliest of equals.
pub(super) fn worst<'a>(rows: impl Iterator<Item = &'a &'a Row>) -> Option<&'a Row> {
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
pub(super) fn bench_scale(r: &Row) -> Option<f64> {
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
pub(super) fn abs_diff(r: &Row) -> Option<f64> {
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
///
/// Only floating-point inputs are summed and rounded: integer and boolean inputs (class
/// indices, positions, masks; [`discrete`]) enter neither s_in nor k. A loss's int64
/// target (max 511) would otherwise make the bound exceed the loss itself.
pub(super) fn rounding_noise(out: &Row, inputs: &[&&Row]) -> bool {
    let inputs: Vec<&&Row> = inputs.iter().copied().filter(|r| !discrete(r)).collect();
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
/// relative error is the gradient's, times that ratio, and no fault of the op. Integer and
/// boolean inputs ([`discrete`]: indices, masks) are no terms of a sum: left out.
pub(super) fn cancellation(out: &Row, inputs: &[&&Row]) -> f64 {
    let n_out = out.tensor.sides.bench.numel().max(1) as f64;
    let terms = inputs
        .iter()
        .filter(|r| !discrete(r))
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

/// What an op consumed, as the localiser weighs it.
pub(super) struct Consumed<'r> {
    /// Its inputs.
    pub inputs: Vec<&'r &'r Row>,
    /// Its outputs, less those that are rounding noise of the inputs (they cannot show a
    /// local error).
    pub outputs: Vec<&'r &'r Row>,
    /// The tensors of its forward call, for a backward op.
    pub saved: Vec<&'r Row>,
    /// The weakest equality among everything it consumed (None: some differ).
    pub equal: Option<Equality>,
    /// The largest raw error among everything it consumed.
    pub max_in: f64,
}

impl Consumed<'_> {
    /// How a person counts what it consumed: `3 inputs and the 4 tensors of its forward call`.
    pub(crate) fn said(&self) -> String {
        if self.saved.is_empty() {
            format!("{} inputs", self.inputs.len())
        } else {
            format!(
                "{} inputs and the {} tensors of its forward call",
                self.inputs.len(),
                self.saved.len()
            )
        }
    }
}
