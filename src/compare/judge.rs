//! Judge: every verdict rule on one page.
//!
//! - **Which tolerance**: the less precise float of the two dtypes, loosened further by the
//!   *precision floor*: the least precise float dtype met so far in the rank's execution
//!   order (tensors computed after a bf16 op carry bf16 rounding whatever their own dtype),
//!   earlier steps' backward phases included (their updates carry it into the weights).
//!   Per-op overrides come from the tolerance table ([`super::tolerance`]).
//! - **Full tensors** are judged by their relative L2 error (‖c − b‖ − atol·√n) / ‖b‖
//!   (robust to the reordering of float sums that any two devices do; forgiving `atol` per
//!   element, as allclose does, keeps tensors that are zero up to rounding from exploding),
//!   and warned on by their largest elementwise error scaled by the largest |b| (so a
//!   handful of wild elements cannot hide) when it exceeds `atol`.
//! - **Statistics** are judged by their differences relative to the tensor's scale
//!   (`crate::metrics::StatDiff::scaled_err`); NaN/Inf counts must agree.
//! - **Checksums**: equal is a pass; different is an error unless statistics say the values
//!   are within tolerance (then a warning).
//! - A shape mismatch or NaN/Inf at different positions is an error.
//! - **Calibrated**: where a reference run (`--reference`) or a calibration file measured a
//!   tensor, it is judged against `k` times that reference error instead, at least the
//!   dtype's floor ([`calibrated`], `compare::envelope`).

use super::align::{records, Alignment, TensorMatch, TensorRef, Unmatched};
use super::carry::{Carry, NoiseWrite};
use super::envelope::{self, Bound, Envelope};
use super::judged::{Judged, Pair, NO_REASON};
use super::measure::{CompareKind, Measurement};
pub use super::row::{Equality, Judgement, Row};
use super::tolerance::{loosest, Calibrated, Tol, Tolerances};
use super::Sides;
use crate::dtype::DType;
use crate::dump::{Direction, Ops, RankDump, Role, Stats, Tensor};
pub use crate::vocab::Verdict;
use rayon::prelude::*;

/// An error measure against thresholds: the verdict and the reason a person reads.
fn grade(err: f64, max_abs_scaled: f64, tol: &Tol, what: &str, dtype: &str) -> (Verdict, String) {
    if err.is_nan() {
        return (Verdict::Error, format!("{what} is NaN"));
    }
    if err > tol.error {
        let r = format!("{what} {err:.3e} > {:.1e} ({dtype})", tol.error);
        return (Verdict::Error, r);
    }
    if err > tol.warning {
        let r = format!("{what} {err:.3e} > warning {:.1e} ({dtype})", tol.warning);
        return (Verdict::Warning, r);
    }
    if max_abs_scaled > tol.max_abs {
        let r = format!(
            "max abs error {max_abs_scaled:.3e} of the largest |value| > {:.1e} ({dtype})",
            tol.max_abs
        );
        return (Verdict::Warning, r);
    }
    (Verdict::Pass, String::new())
}

/// The precision floor: the least precise float dtype of either side met so far in the
/// rank's execution order (forward first, then backward, which reuses the forward's
/// activations), starting from the floor an earlier step of the same rank left: its
/// weights and optimizer state were updated from gradients of that precision.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct PrecisionFloor {
    /// The floor in force.
    floor: Option<DType>,
    /// The floor this unit's own tensors set (None: only the carried floor so far).
    own: Option<DType>,
}

impl PrecisionFloor {
    /// The floor after `m`, which is also the floor `m` is judged under, and whether it
    /// comes from an earlier step only.
    fn after(&mut self, t: Sides<Tensor>) -> (Option<DType>, bool) {
        let (b, c) = (t.bench, t.cmp);
        for d in [b.dtype().known(), c.dtype().known()]
            .into_iter()
            .flatten()
            .filter(|d| d.is_float())
        {
            self.floor = Some(self.floor.map_or(d, |f| loosest(f, d)));
            self.own = Some(self.own.map_or(d, |f| loosest(f, d)));
        }
        // The floor is the looser of the carried one and this unit's own: when it differs
        // from the own, it came from an earlier step.
        (self.floor, self.floor.is_some() && self.floor != self.own)
    }
}

/// Why two sets of statistics disagree on NaN/Inf, if they do: counts where both sides
/// recorded them (probe dumps), else which side has non-finite statistics (msprobe).
fn nonfinite_mismatch(b: Option<&Stats>, c: Option<&Stats>) -> Option<String> {
    let (b, c) = (b?, c?);
    let counted = |s: &Stats| s.nan().zip(s.inf()).map(|(n, i)| n + i);
    if let (Some(nb), Some(nc)) = (counted(b), counted(c)) {
        return (nb != nc).then(|| format!("NaN/Inf count {nb} in bench, {nc} in cmp"));
    }
    let (fb, fc) = (
        b.nonfinite().unwrap_or(0) > 0,
        c.nonfinite().unwrap_or(0) > 0,
    );
    match (fb, fc) {
        (false, true) => Some("NaN/Inf in the cmp statistics, not in bench".into()),
        (true, false) => Some("NaN/Inf in the bench statistics, not in cmp".into()),
        _ => None,
    }
}

/// Judges one pair, read from its two records (`op` and `name` are the comparison
/// side's), under the precision floor `precision` (`carried`: set by an earlier step of
/// the rank, not by this one's ops): against the tolerances, or, where a reference run or
/// a calibration file measured the tensor (a reference's `envelope`, else the tolerance
/// rule's calibration), against its envelope ([`calibrated`]).
pub(crate) fn judge(
    op: &str,
    t: Sides<Tensor>,
    m: &Measurement,
    precision: Option<DType>,
    carried: bool,
    tols: &Tolerances,
    envelope: Option<&Envelope>,
) -> Judgement {
    let (db, dc, dname) = judged_dtypes(t, precision, carried);
    let (tol, rule) = tols.lookup(op, || t.cmp.name(), db, dc);
    let j = by_tolerance(t, m, precision, &tol, &dname);
    let what = match m.kind {
        CompareKind::Tensor => "relative L2 error",
        CompareKind::Statistics => "statistics error",
        _ => return j,
    };
    let err = envelope::measure(m.kind, j.err, j.raw_err);
    // A reference run's envelope, else a calibration file's rule.
    let bound = match envelope {
        Some(e) => e.bound(&t.bench.name()).map(|bound| Calibrated {
            bound,
            nondeterministic: false,
        }),
        None => rule,
    };
    match bound {
        // A shape mismatch, NaN/Inf where the other has none: errors whatever the drift.
        Some(b) if err.is_finite() => {
            let d = [t.bench.dtype().known(), t.cmp.dtype().known(), precision]
                .into_iter()
                .flatten()
                .filter(|d| d.is_float())
                .reduce(loosest);
            let j = calibrated(Judgement { err, ..j }, b.bound, what, d);
            if b.nondeterministic && j.verdict != Verdict::Pass {
                let reason = format!(
                    "{}; a nondeterministic op (its outputs differ from run to run: the \
                     calibration's reference error is that noise)",
                    j.reason
                );
                return Judgement { reason, ..j };
            }
            j
        }
        _ => j,
    }
}

/// A judgement against a reference's envelope (`compare::envelope`): a pass within `k` ×
/// the reference's error on the tensor, at least the floor of the dtype judged `d`, an error
/// beyond it, a warning half way; the reason gives the ratio to the reference's error.
fn calibrated(j: Judgement, b: Bound, what: &str, d: Option<DType>) -> Judgement {
    let (error, warning) = (b.error(d), b.warning(d));
    let err = j.err;
    let ratio = if b.reference > 0.0 {
        format!(
            "{:.1}x the reference's {:.1e}",
            err / b.reference,
            b.reference
        )
    } else {
        "the reference's is 0".to_string()
    };
    let dname = d.map_or("", |d| d.name());
    let envelope = format!(
        "{}x the reference, at least {:.1e} ({dname})",
        b.k,
        envelope::floor(d)
    );
    let (verdict, reason) = if err > error {
        let r = format!("{what} {err:.3e}, {ratio} > {error:.1e} = {envelope}");
        (Verdict::Error, r)
    } else if err > warning {
        let r = format!("{what} {err:.3e}, {ratio} > warning {warning:.1e}");
        (Verdict::Warning, r)
    } else {
        (Verdict::Pass, String::new())
    };
    Judgement {
        verdict,
        reason,
        tolerance: error,
        reference: Some(b.reference),
        ..j
    }
}

/// The dtypes a pair is judged at (each side's, loosened by the precision floor where the
/// pair is float), and how the reason names them.
fn judged_dtypes(
    t: Sides<Tensor>,
    precision: Option<DType>,
    carried: bool,
) -> (Option<DType>, Option<DType>, String) {
    let (sb, sc) = (t.bench, t.cmp);
    let (mut db, mut dc) = (sb.dtype().known(), sc.dtype().known());
    let own = db.zip(dc).map(|(x, y)| loosest(x, y));
    let mut dname = own.map_or_else(|| sc.dtype().name().to_string(), |d| d.name().to_string());
    if let (Some(o), Some(p)) = (own, precision) {
        if o.is_float() && loosest(o, p) != o {
            db = db.map(|d| loosest(d, p));
            dc = dc.map(|d| loosest(d, p));
            dname = if carried {
                format!("{o}, after {p} updates in an earlier step")
            } else {
                format!("{o}, after {p} ops")
            };
        }
    }
    (db, dc, dname)
}

/// Judges one pair against its tolerance `tol` (`dname`: its dtypes as the reason names
/// them; see [`judge`]).
fn by_tolerance(
    t: Sides<Tensor>,
    m: &Measurement,
    precision: Option<DType>,
    tol: &Tol,
    dname: &str,
) -> Judgement {
    let (sb, sc) = (t.bench, t.cmp);
    let verdict = |verdict: Verdict, reason: String, err: f64, raw_err: f64| Judgement {
        verdict,
        reason,
        err,
        raw_err,
        tolerance: tol.error,
        precision,
        reference: None,
    };
    let inf = f64::INFINITY;
    if sb.shape() != sc.shape() {
        let r = format!("shape {:?} vs {:?}", sb.shape(), sc.shape());
        return verdict(Verdict::Error, r, inf, inf);
    }
    match m.kind {
        CompareKind::Tensor => {
            let Some(x) = m.metrics.as_deref() else {
                return verdict(Verdict::Pass, String::new(), 0.0, 0.0);
            };
            if x.nonfinite_mismatch > 0 {
                let r = format!(
                    "NaN/Inf at different positions ({} in bench, {} in cmp)",
                    x.nonfinite_b, x.nonfinite_c
                );
                return verdict(Verdict::Error, r, inf, inf);
            }
            // Up to atol per element (RMS) of difference is forgiven, as in allclose.
            let slack = tol.atol * (x.n.max(1) as f64).sqrt();
            let rel = if x.euclid <= slack {
                0.0
            } else if x.norm_b == 0.0 {
                inf
            } else {
                (x.euclid - slack) / x.norm_b
            };
            // Outliers within atol are rounding, not outliers.
            let outlier = if x.max_abs > tol.atol {
                x.max_abs_scaled
            } else {
                0.0
            };
            let (v, r) = grade(rel, outlier, tol, "relative L2 error", dname);
            let raw = if x.euclid == 0.0 { 0.0 } else { x.rel_l2 };
            verdict(v, r, rel, raw)
        }
        CompareKind::Checksum | CompareKind::Statistics => {
            let equal = m.checksum_equal == Some(true);
            let (Some(bstats), Some(cstats)) = (sb.stats(), sc.stats()) else {
                // Checksums without statistics.
                return if equal {
                    verdict(Verdict::Pass, String::new(), 0.0, 0.0)
                } else {
                    verdict(Verdict::Error, "checksums differ".into(), inf, inf)
                };
            };
            if equal {
                return verdict(Verdict::Pass, String::new(), 0.0, 0.0);
            }
            if let Some(r) = nonfinite_mismatch(Some(&bstats), Some(&cstats)) {
                return verdict(Verdict::Error, r, inf, inf);
            }
            let numel = sc.numel();
            let sd = crate::metrics::stat_diff(&bstats, &cstats);
            let err = sd.scaled_err(&bstats, numel, tol.atol);
            let (mut v, mut r) = grade(err, 0.0, tol, "statistics error", dname);
            if m.checksum_equal == Some(false) && v == Verdict::Pass {
                v = Verdict::Warning;
                r = "checksums differ; statistics within tolerance".into();
            }
            verdict(v, r, err, sd.scaled_err(&bstats, numel, 0.0))
        }
        // Leftover bytes on both sides: nothing either run computed, so nothing differs
        // (FSDP's gather buffers before the gather). On one side only, one run read bytes
        // it had not written where the other read values: worth a look, not a divergence.
        CompareKind::Unwritten => match (sb.unwritten(), sc.unwritten()) {
            (b, c) if sc.overwritten() => {
                let side = match (b, c) {
                    (true, true) => "both sides",
                    (true, false) => "the bench side",
                    _ => "the cmp side",
                };
                let r = format!(
                    "the op only writes it: what it held before (leftover bytes on {side}) is \
                     not compared"
                );
                verdict(Verdict::Pass, r, 0.0, 0.0)
            }
            (true, true) => {
                let r = "unwritten memory on both sides (leftover bytes): not compared";
                verdict(Verdict::Pass, r.into(), 0.0, 0.0)
            }
            (b, _) => {
                let (side, other) = if b {
                    ("bench", "cmp")
                } else {
                    ("cmp", "bench")
                };
                let r = format!(
                    "unwritten memory on the {side} side (leftover bytes), values on the \
                     {other} side: not compared"
                );
                verdict(Verdict::Warning, r, 0.0, 0.0)
            }
        },
        CompareKind::None => {
            let r = format!("nothing to compare (dtype {} / {})", sb.dtype(), sc.dtype());
            verdict(Verdict::Warning, r, 0.0, 0.0)
        }
    }
}

/// Pairs judged at a time: the judgements of one block are made in parallel and kept as
/// compact pairs before the next block is judged, so a million-pair unit never holds its
/// judgements and precision floors (72 bytes a pair) beside its pairs.
const JUDGE_BLOCK: usize = 1 << 14;

/// Measures a block of a unit's pairs (in order): the measure stage, handed to the judge so
/// that a unit's measurements are never all held at once.
pub(crate) type Measure<'m> =
    dyn Fn(&Sides<RankDump>, &[TensorMatch]) -> crate::error::Result<Vec<Measurement>> + Sync + 'm;

/// Measures (with `measure`) and judges a unit's pairs in execution order, a block at a
/// time (each block in parallel), starting from the precision floor `carried` that the
/// rank's earlier steps left. Returns the judged pairs over the two op logs (rows are made
/// from them when read), the unmatched tensors, and the floor to carry into the rank's
/// next step: the floor at the end of this unit when it has a backward phase (its update
/// used gradients of that precision), else `carried` (a forward-only step changes no
/// weight). The first measurement error (in pair order) stops it.
pub(crate) fn judge_all(
    a: Alignment,
    measure: &Measure,
    tols: &Tolerances,
    carried: Option<DType>,
    envelope: Option<&Envelope>,
) -> crate::error::Result<(Judged, Vec<Unmatched>, Carry)> {
    let Alignment {
        dumps,
        matches,
        unmatched,
        ..
    } = a;
    let trained = matches
        .iter()
        .any(|m| dumps.cmp.ops.get(m.refs.cmp.op()).direction() == Direction::Backward);
    let mut floor = PrecisionFloor {
        floor: carried,
        own: None,
    };
    let mut pairs: Vec<Pair> = Vec::with_capacity(matches.len());
    let mut reasons: Vec<Box<str>> = Vec::new();
    // Kept apart from the pairs, only where verdicts may be calibrated.
    let calibrated = envelope.is_some() || tols.has_calibration();
    let mut references: Vec<f64> = Vec::new();
    for block in matches.chunks(JUDGE_BLOCK) {
        let xs = measure(&dumps, block)?;
        let floors: Vec<(Option<DType>, bool)> = block
            .iter()
            .map(|m| floor.after(records(&dumps, m)))
            .collect();
        let judgements: Vec<Judgement> = block
            .par_iter()
            .zip(&xs)
            .zip(floors)
            .map(|((m, x), (p, from_earlier))| {
                let op = dumps.cmp.ops.get(m.refs.cmp.op()).key().text();
                judge(op, records(&dumps, m), x, p, from_earlier, tols, envelope)
            })
            .collect();
        for ((m, x), j) in block.iter().zip(xs).zip(judgements) {
            let reason = if j.reason.is_empty() {
                NO_REASON
            } else {
                reasons.push(j.reason.into_boxed_str());
                // One reason per pair at most: fewer than an op store's u32 tensors.
                (reasons.len() - 1) as u32
            };
            // Positions in op stores, which hold at most u32::MAX ops and tensors.
            let at = |r: TensorRef| (r.op() as u32, r.tensor() as u32);
            pairs.push(Pair {
                bench: at(m.refs.bench),
                cmp: at(m.refs.cmp),
                at: m.at,
                reason,
                err: j.err,
                raw_err: j.raw_err,
                tolerance: j.tolerance,
                metrics: x.metrics,
                by: m.by,
                external: m.external,
                kind: x.kind,
                checksum_equal: x.checksum_equal,
                verdict: j.verdict,
                precision: j.precision,
            });
            if calibrated {
                references.push(j.reference.unwrap_or(f64::NAN));
            }
        }
    }
    drop(matches);
    let carry_out = if trained { floor.floor } else { carried };
    let ops = Sides::new(dumps.bench.ops, dumps.cmp.ops);
    let amplified = amplified_noise(&mut pairs, &mut reasons, &ops);
    let noise = amplified
        .into_iter()
        .filter_map(|i| noise_write(&ops, &pairs[i]))
        .take(MAX_NOISE_WRITES)
        .collect();
    let leftovers = from_leftovers(&mut pairs, &mut reasons, &ops);
    // (The step is the caller's to name.)
    let carry = Carry {
        step: String::new(),
        floor: carry_out,
        noise,
        diverged: None,
    };
    Ok((
        Judged::new(ops, pairs, reasons, leftovers, references),
        unmatched,
        carry,
    ))
}

/// The most [`NoiseWrite`]s a unit hands to its rank's next step (a bound on what a unit
/// holds, not a number real runs reach: one per bias that normalisation cancels).
const MAX_NOISE_WRITES: usize = 4096;

/// The noise write of pair `p` (its op, its output, both runs' statistics bit for bit).
fn noise_write(ops: &Sides<Ops>, p: &Pair) -> Option<NoiseWrite> {
    let t = Judged::tensors(ops, p);
    Some(NoiseWrite {
        op: ops.cmp.get(p.at as usize).key().text().to_string(),
        tensor: t.cmp.name().into_owned(),
        stats: Sides::new(
            t.bench.stats()?.fingerprint()?,
            t.cmp.stats()?.fingerprint()?,
        ),
    })
}

/// Replaces pair `p`'s reason (or gives it one).
fn set_reason(p: &mut Pair, reasons: &mut Vec<Box<str>>, reason: String) {
    let reason = reason.into_boxed_str();
    match reasons.get_mut(p.reason as usize) {
        Some(r) => *r = reason,
        None => {
            reasons.push(reason);
            p.reason = (reasons.len() - 1) as u32;
        }
    }
}

/// Outputs computed from leftover bytes that both runs read (memory nothing had written,
/// recorded as `unwritten` on both sides) differ because the leftovers do, not because of
/// either run's code: PyTorch's pipeline stages run a forward on `torch.empty` inputs to
/// learn their output shapes, and two runs of one job then "diverge" there. Walking the
/// unit in execution order, a differing output of an op that consumed such bytes is a
/// warning that says so, and what is computed from it (through the dataflow's `src` links,
/// and in the backward calls of the forward calls that consumed it) is not compared any
/// further: a pass, counted as `unwritten`. Outputs that agree stay as they are and end the
/// chain, and so does an op that also read a differing input of its own: the difference
/// came through that input. (Leftovers on one side only stay the op's finding: one run
/// read a buffer the other had filled.) Returns how many pairs it took out and the op where that starts:
/// the unit is then incomplete, since memory that code the agent does not see (a C++
/// extension's kernel) wrote can look unwritten, and what differs there must not pass.
fn from_leftovers(
    pairs: &mut [Pair],
    reasons: &mut Vec<Box<str>>,
    ops: &Sides<Ops>,
) -> Option<(usize, String)> {
    let both = |p: &Pair| {
        let t = Judged::tensors(ops, p);
        t.bench.unwritten() && t.cmp.unwritten()
    };
    if !pairs.iter().any(both) {
        return None; // (most units: one pass over the pairs, nothing to trace)
    }
    let mut taken = 0usize;
    let mut first: Option<String> = None;
    // The values computed from them that differ (comparison-side dataflow ids), and the
    // forward calls that consumed them: their backward calls' gradients are computed from
    // them too.
    let mut tainted: foldhash::HashSet<u64> = foldhash::HashSet::default();
    let mut calls: foldhash::HashSet<String> = foldhash::HashSet::default();
    let not_compared = |p: &mut Pair, reasons: &mut Vec<Box<str>>, reason: String| {
        p.verdict = Verdict::Pass;
        p.kind = CompareKind::Unwritten;
        set_reason(p, reasons, reason);
    };
    let mut start = 0;
    while start < pairs.len() {
        let at = pairs[start].at;
        let end = start + pairs[start..].iter().take_while(|p| p.at == at).count();
        let key = ops.cmp.get(at as usize).key();
        let twin = (!calls.is_empty() && key.direction() == Direction::Backward)
            .then(|| key.forward_twin())
            .flatten();
        if let Some(twin) = twin.filter(|k| calls.contains(k)) {
            for p in pairs[start..end].iter_mut() {
                if p.verdict != Verdict::Pass {
                    let r = format!(
                        "gradient through {twin}, computed from leftover bytes both runs \
                         read: not compared"
                    );
                    not_compared(p, reasons, r);
                    taken += 1;
                }
            }
            start = end;
            continue;
        }
        // Its inputs computed from them, where they differ: not compared either.
        for p in &mut pairs[start..end] {
            let t = Judged::tensors(ops, p).cmp;
            let from = t.src().filter(|s| tainted.contains(s));
            if let (Some(src), Role::Input, false) = (from, t.role(), p.verdict == Verdict::Pass) {
                let r = format!(
                    "computed from leftover bytes both runs read (dataflow id {src}): not \
                     compared"
                );
                not_compared(p, reasons, r);
                taken += 1;
            }
        }
        // What it consumed of them: read directly, or computed from them.
        let fed = pairs[start..end].iter().find_map(|p| {
            let t = Judged::tensors(ops, p);
            if t.cmp.role() == Role::Output {
                return None;
            }
            if t.bench.unwritten() && t.cmp.unwritten() && !t.cmp.overwritten() {
                return Some((t.cmp.name().into_owned(), true));
            }
            let src = t.cmp.src().filter(|s| tainted.contains(s))?;
            Some((format!("{} (dataflow id {src})", t.cmp.name()), false))
        });
        let Some((name, direct)) = fed else {
            start = end;
            continue;
        };
        // An input it also read that differs on its own (neither leftovers nor computed
        // from them) explains its outputs: the divergence flows through here, whatever
        // the leftovers did. An MoE layer gathers its experts' outputs into `torch.empty`
        // by index (`out[order] = y`): a fault upstream must stay a divergence there.
        // (What is computed from leftovers is a pass by now; leftovers on one side warn.)
        let other_differs = pairs[start..end].iter().any(|p| {
            p.verdict != Verdict::Pass
                && p.kind != CompareKind::Unwritten
                && Judged::tensors(ops, p).cmp.role() != Role::Output
        });
        if other_differs {
            start = end;
            continue;
        }
        if key.direction() == Direction::Forward {
            calls.insert(key.text().to_string());
        }
        for p in &mut pairs[start..end] {
            let t = Judged::tensors(ops, p).cmp;
            if t.role() != Role::Output || p.verdict == Verdict::Pass {
                continue;
            }
            if let Some(id) = t.id() {
                tainted.insert(id);
            }
            taken += 1;
            if direct {
                first.get_or_insert_with(|| key.text().to_string());
                p.verdict = Verdict::Warning;
                let was = reasons.get(p.reason as usize).map_or("", |r| &**r);
                let r = format!(
                    "{was}; computed from leftover bytes both runs read in {name}: the \
                     difference is theirs, not this op's"
                );
                set_reason(p, reasons, r);
            } else {
                let r = format!(
                    "computed from leftover bytes both runs read, through {name}: not compared"
                );
                not_compared(p, reasons, r);
            }
        }
        start = end;
    }
    (taken > 0).then(|| (taken, first.unwrap_or_default()))
}

/// Whether an input agrees only because its values sit at rounding-noise level: the
/// absolute difference is within atol (judged error 0) while the scale-free one is past
/// the error tolerance.
fn noise_level(p: &Pair, role: Role) -> bool {
    role != Role::Output && p.verdict == Verdict::Pass && p.err == 0.0 && p.raw_err > p.tolerance
}

/// Ops that normalise what they are given, so that an input element near zero moves the
/// output by a whole unit whichever way its rounding tips it: Adam's update
/// `p.addcdiv_(m, sqrt(v) + eps, value=-lr)` divides a gradient's moment by its own root
/// (a near-zero gradient element's update is ±lr, its sign the rounding's), and `sign` is
/// that normalisation bare (Lion's update).
const NORMALISING: [&str; 6] = [
    "addcdiv",
    "addcdiv_",
    "_foreach_addcdiv",
    "_foreach_addcdiv_",
    "sign",
    "sign_",
];

/// What explains an op's failing outputs as amplified rounding rather than its own error.
enum Amplifier {
    /// An input agreeing only within atol, its scale-free error: outputs no further off
    /// than that are explained.
    NoiseLevel(String, f64),
    /// A normalising op ([`NORMALISING`]) with an input that differs: every output is
    /// explained, since statistics (and even elementwise errors) cannot bound how many
    /// elements near zero the difference tips.
    Normalising(String, f64),
}

impl Amplifier {
    /// Whether it explains an output whose scale-free error is `raw`.
    fn explains(&self, raw: f64) -> bool {
        match self {
            Amplifier::NoiseLevel(_, noise) => raw <= *noise,
            Amplifier::Normalising(..) => true,
        }
    }

    /// What a person reads after the output's own reason.
    fn said(&self) -> String {
        match self {
            Amplifier::NoiseLevel(name, raw) => format!(
                "input {name} agrees only within atol (values at rounding-noise level, \
                 scale-free error {raw:.3e}): amplified noise (e.g. Adam's normalised update \
                 of a zero gradient), not this op's error"
            ),
            Amplifier::Normalising(name, raw) => format!(
                "the op normalises its inputs (Adam's update divides a gradient's moment by \
                 its root; sign) and input {name} differs (scale-free error {raw:.3e}, within \
                 tolerance): each element near zero whose sign that difference tips moves the \
                 output by a whole step, so the output's difference is amplified rounding, \
                 which the comparison cannot tell from an error of this op"
            ),
        }
    }
}

/// An op fed by an input at noise level (a gradient that is mathematically zero) may turn
/// that noise into a visible difference: Adam normalises the update, so a zero gradient's
/// rounding noise becomes ±lr. Its failing outputs that are no further off (scale-free)
/// than that input are warnings, not errors: the op did what it should with what it was
/// given, and the inputs' agreement is too weak to pin anything on it. An output further
/// off than its noisiest input is the op's own error. A normalising op ([`NORMALISING`])
/// turns any difference of its inputs into whole steps of the elements near zero (a
/// bfloat16 port's gradients tip the signs of a zero-initialised bias's gradient): its
/// failing outputs are warnings too, unless its inputs are equal, when the difference is
/// its own.
/// Returns the pairs so turned into warnings.
fn amplified_noise(
    pairs: &mut [Pair],
    reasons: &mut Vec<Box<str>>,
    ops: &Sides<Ops>,
) -> Vec<usize> {
    let role = |p: &Pair| Judged::tensors(ops, p).cmp.role();
    let name = |p: &Pair| Judged::tensors(ops, p).cmp.name().into_owned();
    let mut turned = Vec::new();
    let mut start = 0;
    while start < pairs.len() {
        let op = pairs[start].at;
        let end = start + pairs[start..].iter().take_while(|p| p.at == op).count();
        let group = &pairs[start..end];
        let noisiest = |keep: &dyn Fn(&Pair) -> bool| {
            group
                .iter()
                .filter(|p| role(p) != Role::Output && keep(p))
                .max_by(|a, b| a.raw_err.total_cmp(&b.raw_err))
                .map(|p| (name(p), p.raw_err))
        };
        let normalising = NORMALISING.contains(&ops.cmp.get(op as usize).key().leaf());
        let amplifier = match noisiest(&|p| noise_level(p, role(p))) {
            Some((n, raw)) => Some(Amplifier::NoiseLevel(n, raw)),
            // (An input out of tolerance is a divergence that reaches the op, not noise.)
            None if normalising
                && !group
                    .iter()
                    .any(|p| p.verdict == Verdict::Error && role(p) != Role::Output) =>
            {
                noisiest(&differs).map(|(n, raw)| Amplifier::Normalising(n, raw))
            }
            None => None,
        };
        if let Some(amp) = amplifier {
            for (i, p) in pairs[start..end].iter_mut().enumerate() {
                if role(p) == Role::Output && p.verdict == Verdict::Error && amp.explains(p.raw_err)
                {
                    p.verdict = Verdict::Warning;
                    let was = reasons.get(p.reason as usize).map_or("", |r| &**r);
                    let reason = format!("{was}; {}", amp.said());
                    set_reason(p, reasons, reason);
                    turned.push(start + i);
                }
            }
        }
        start = end;
    }
    turned
}

/// Whether a pair's two sides differ at all (a difference within tolerance included).
fn differs(p: &Pair) -> bool {
    p.raw_err > 0.0 || p.checksum_equal == Some(false)
}
