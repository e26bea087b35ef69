//! Differences of recorded statistics (max, min, mean, norm) when no tensor bytes were
//! dumped, and the scaled error the verdict reads from them.

use crate::dump::Stats;
use serde::{Deserialize, Serialize};

/// Differences of recorded statistics (statistics-only dumps).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StatDiff {
    /// Comparison max − benchmark max (None when a side lacks it).
    pub max_diff: Option<f64>,
    /// Comparison min − benchmark min.
    pub min_diff: Option<f64>,
    /// Comparison mean − benchmark mean.
    pub mean_diff: Option<f64>,
    /// Comparison L2 norm − benchmark L2 norm.
    pub norm_diff: Option<f64>,
    /// msprobe's relative differences, in percent: |diff / b| · 100.
    pub max_rel_pct: Option<f64>,
    /// |Δmin / b.min| · 100.
    pub min_rel_pct: Option<f64>,
    /// |Δmean / b.mean| · 100.
    pub mean_rel_pct: Option<f64>,
    /// |Δnorm / b.norm| · 100.
    pub norm_rel_pct: Option<f64>,
}

/// Statistics differences, msprobe's way (comparison − benchmark, and relative to the
/// benchmark in percent).
pub fn stat_diff(b: &Stats, c: &Stats) -> StatDiff {
    let diff = |x: Option<f64>, y: Option<f64>| match (x, y) {
        // Equal values, equal infinities and NaN on both sides are no difference.
        (Some(x), Some(y)) if x == y || (x.is_nan() && y.is_nan()) => Some(0.0),
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    let pct = |d: Option<f64>, x: Option<f64>| match (d, x) {
        (Some(0.0), Some(_)) => Some(0.0),
        (Some(d), Some(x)) => Some((d / x).abs() * 100.0),
        _ => None,
    };
    let (b_mean, b_norm) = (b.comparable_mean(), b.comparable_norm());
    let (dmax, dmin, dmean, dnorm) = (
        diff(b.max(), c.max()),
        diff(b.min(), c.min()),
        diff(b_mean, c.comparable_mean()),
        diff(b_norm, c.comparable_norm()),
    );
    StatDiff {
        max_diff: dmax,
        min_diff: dmin,
        mean_diff: dmean,
        norm_diff: dnorm,
        max_rel_pct: pct(dmax, b.max()),
        min_rel_pct: pct(dmin, b.min()),
        mean_rel_pct: pct(dmean, b_mean),
        norm_rel_pct: pct(dnorm, b_norm),
    }
}

impl StatDiff {
    /// The largest statistic difference relative to the tensor's scale (probe's verdict
    /// measure): Δmax, Δmin and Δmean against max(|max|, |min|, norm/√n) of the benchmark
    /// `b`, Δnorm against its norm. The first `atol` of each difference (`atol·√n` of Δnorm)
    /// is forgiven, as in allclose (see [`crate::compare::tolerance::Tol::atol`]), so tensors
    /// that are zero up to rounding compare as equal.
    pub(crate) fn scaled_err(&self, b: &Stats, numel: usize, atol: f64) -> f64 {
        let root_n = (numel.max(1) as f64).sqrt();
        let norm = b.comparable_norm();
        let rms = norm.map(|n| n / root_n);
        let scale = [b.max().map(f64::abs), b.min().map(f64::abs), rms]
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let rel = |d: Option<f64>, s: f64, slack: f64| match d {
            None => 0.0,
            Some(d) if d.abs() <= slack => 0.0,
            Some(d) if s == 0.0 || !d.is_finite() => f64::INFINITY,
            Some(d) => (d.abs() - slack) / s,
        };
        rel(self.max_diff, scale, atol)
            .max(rel(self.min_diff, scale, atol))
            .max(rel(self.mean_diff, scale, atol))
            .max(rel(
                self.norm_diff,
                norm.map(f64::abs).unwrap_or(0.0),
                atol * root_n,
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A norm (or mean) of inf with finite max and min is a float32 accumulator that
    /// overflowed on finite values (msprobe's norm, PyTorch's float32 reductions): it is not
    /// compared, and does not make the tensor non-finite, with or without NaN/Inf counts.
    #[test]
    fn an_overflowed_norm_is_not_a_difference() {
        use crate::dump::StatsFields;
        let stats = |max: f64, mean: f64, norm: f64, counts: Option<u64>| -> Stats {
            StatsFields {
                max: Some(max),
                min: Some(1e20),
                mean: Some(mean),
                norm: Some(norm),
                nan: counts,
                inf: counts,
            }
            .into()
        };
        let b = stats(1.2e20, 1.1e20, 8.8e20, Some(0));
        for counts in [Some(0), None] {
            let c = stats(1.2e20, f64::INFINITY, f64::INFINITY, counts);
            assert_eq!(c.nonfinite().unwrap_or(0), 0);
            let d = stat_diff(&b, &c);
            assert_eq!((d.mean_diff, d.norm_diff), (None, None));
            assert_eq!(d.scaled_err(&b, 64, 0.0), 0.0);
            let d = stat_diff(&c, &b);
            assert_eq!((d.mean_diff, d.norm_diff), (None, None));
            assert_eq!(d.scaled_err(&c, 64, 0.0), 0.0);
            // The extremes are still compared.
            let far = stats(2.4e20, f64::INFINITY, f64::INFINITY, counts);
            assert!(stat_diff(&b, &far).scaled_err(&b, 64, 0.0) > 0.4);
        }
        // An infinite element reaches max: that norm is a real infinity.
        let inf = stats(f64::INFINITY, f64::INFINITY, f64::INFINITY, None);
        assert_eq!(inf.nonfinite(), Some(1));
        assert_eq!(stat_diff(&b, &inf).norm_diff, Some(f64::INFINITY));
    }
}
