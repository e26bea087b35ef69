//! Judge: every verdict rule on one page.
//!
//! - **Which tolerance**: the less precise float of the two dtypes, loosened further by the
//!   *precision floor*: the least precise float dtype met so far in the unit's execution
//!   order (tensors computed after a bf16 op carry bf16 rounding whatever their own dtype).
//!   Per-op overrides come from the tolerance table ([`super::tolerance`]).
//! - **Full tensors** are judged by their relative L2 error (‖c − b‖ − atol·√n) / ‖b‖
//!   (robust to the reordering of float sums that any two devices do; forgiving `atol` per
//!   element, as allclose does, keeps tensors that are zero up to rounding from exploding),
//!   and warned on by their largest elementwise error scaled by the largest |b| (so a
//!   handful of wild elements cannot hide) when it exceeds `atol`.
//! - **Statistics** are judged by their differences relative to the tensor's scale
//!   ([`crate::metrics::StatDiff::scaled_err`]); NaN/Inf counts must agree.
//! - **Checksums**: equal is a pass; different is an error unless statistics say the values
//!   are within tolerance (then a warning).
//! - A shape mismatch or NaN/Inf at different positions is an error.

use super::measure::{nonfinite, CompareKind, Measured};
use super::tolerance::{loosest, Tol, Tolerances};
use crate::dtype::DType;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// A tensor's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Within tolerance.
    Pass,
    /// Past the warning threshold only.
    Warning,
    /// Out of tolerance.
    Error,
}

impl Verdict {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warning => "warning",
            Verdict::Error => "error",
        }
    }
}

/// The judge's word on one tensor pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Pass, warning or error.
    pub verdict: Verdict,
    /// Why, for a person (empty for a pass).
    pub reason: String,
    /// The judged error measure (relative L2, or scaled statistics error): the smallest
    /// error tolerance that would pass this tensor.
    pub err: f64,
    /// The same measure without the absolute floor (scale-free): what the localiser compares
    /// between an op's inputs and outputs, since an op may rescale its data.
    pub raw_err: f64,
    /// The error tolerance applied.
    pub tolerance: f64,
    /// The precision floor in force (see the module docs).
    pub precision: Option<DType>,
}

/// A judged tensor pair: one row of every report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// What was measured.
    pub tensor: Measured,
    /// What the judge made of it.
    pub judgement: Judgement,
}

impl Row {
    /// Bitwise (or statistically) identical on both sides.
    pub fn identical(&self) -> bool {
        self.judgement.raw_err == 0.0 && self.judgement.verdict == Verdict::Pass
    }
}

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

/// The precision floor of each row: the least precise float dtype of either side met so
/// far in execution order (forward first, then backward, which reuses the forward's
/// activations).
fn precision_floors(rows: &[Measured]) -> Vec<Option<DType>> {
    let mut floor: Option<DType> = None;
    rows.iter()
        .map(|m| {
            let (b, c) = m.sides.pair();
            for d in [b.dtype.known(), c.dtype.known()]
                .into_iter()
                .flatten()
                .filter(|d| d.is_float())
            {
                floor = Some(floor.map_or(d, |f| loosest(f, d)));
            }
            floor
        })
        .collect()
}

/// Judges one measured pair under the precision floor `precision`.
pub fn judge(m: &Measured, precision: Option<DType>, tols: &Tolerances) -> Judgement {
    let (sb, sc) = m.sides.pair();
    let (mut db, mut dc) = (sb.dtype.known(), sc.dtype.known());
    let own = db.zip(dc).map(|(x, y)| loosest(x, y));
    let mut dname = own.map_or_else(|| sc.dtype.name().to_string(), |d| d.name().to_string());
    if let (Some(o), Some(p)) = (own, precision) {
        if o.is_float() && loosest(o, p) != o {
            db = db.map(|d| loosest(d, p));
            dc = dc.map(|d| loosest(d, p));
            dname = format!("{o}, after {p} ops");
        }
    }
    let tol = tols.lookup(m.op.key.as_str(), &m.name, db, dc);
    let verdict = |verdict: Verdict, reason: String, err: f64, raw_err: f64| Judgement {
        verdict,
        reason,
        err,
        raw_err,
        tolerance: tol.error,
        precision,
    };
    let inf = f64::INFINITY;
    if !m.same_shape() {
        let r = format!("shape {:?} vs {:?}", sb.shape, sc.shape);
        return verdict(Verdict::Error, r, inf, inf);
    }
    match m.kind {
        CompareKind::Tensor => {
            let Some(x) = m.metrics else {
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
            let (v, r) = grade(rel, outlier, &tol, "relative L2 error", &dname);
            let raw = if x.euclid == 0.0 { 0.0 } else { x.rel_l2 };
            verdict(v, r, rel, raw)
        }
        CompareKind::Checksum | CompareKind::Statistics => {
            let equal = m.checksum_equal == Some(true);
            let (Some(sd), Some(bstats)) = (&m.stat_diff, &sb.stats) else {
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
            let (nb, nc) = (nonfinite(&sb.stats), nonfinite(&sc.stats));
            if nb != nc {
                let r = format!("NaN/Inf count {nb} in bench, {nc} in cmp");
                return verdict(Verdict::Error, r, inf, inf);
            }
            let numel = sc.numel();
            let err = sd.scaled_err(bstats, numel, tol.atol);
            let (mut v, mut r) = grade(err, 0.0, &tol, "statistics error", &dname);
            if m.checksum_equal == Some(false) && v == Verdict::Pass {
                v = Verdict::Warning;
                r = "checksums differ; statistics within tolerance".into();
            }
            verdict(v, r, err, sd.scaled_err(bstats, numel, 0.0))
        }
        CompareKind::None => {
            let r = format!("nothing to compare (dtype {} / {})", sb.dtype, sc.dtype);
            verdict(Verdict::Warning, r, 0.0, 0.0)
        }
    }
}

/// Judges a unit's measured pairs (in execution order), keeping their order.
pub fn judge_all(measured: Vec<Measured>, tols: &Tolerances) -> Vec<Row> {
    let floors = precision_floors(&measured);
    measured
        .into_par_iter()
        .zip(floors)
        .map(|(tensor, p)| {
            let judgement = judge(&tensor, p, tols);
            Row { tensor, judgement }
        })
        .collect()
}
