//! The error-per-op chart of a compare, as data: one point per op in execution order (its
//! worst tensor's judged error and the tolerance it was judged against), split into forward
//! and backward, with the culprit marked. The workbook draws it as a native chart
//! (`xlsx.rs`); the numbers are computed here so that every writer draws the same points.
//!
//! Big runs are downsampled so that the chart stays fast to open: every failing op and the
//! culprit are kept, the passing ops are cut into buckets of consecutive ops and each
//! bucket keeps its worst op (a spike is never averaged away). Where most ops fail, the
//! failing ones are bucketed too: the chart never holds many more than [`MAX_POINTS`].

use crate::compare::{op_groups, CompareRun, Row, UnitSummary, Verdict};
use crate::dump::Direction;
use crate::schema::summary::Finding;

/// At most about this many points on the chart (more only when more ops fail).
pub(crate) const MAX_POINTS: usize = 4000;

/// A logarithmic axis cannot show 0: an error of exactly 0 (bitwise-equal data) is drawn
/// at this floor.
pub(crate) const FLOOR: f64 = 1e-10;

/// One op on the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Position of the op in execution order over the whole run, from 1 (units one after
    /// another, in step/rank order).
    pub x: u64,
    /// `step/rank`.
    pub place: String,
    /// The op key.
    pub op: String,
    /// Forward or backward.
    pub direction: Direction,
    /// The judged error of the op's worst tensor (the one furthest past its tolerance);
    /// may be non-finite.
    pub err: f64,
    /// The tolerance that tensor was judged against.
    pub tolerance: f64,
    /// The op's worst verdict.
    pub verdict: Verdict,
}

/// The chart's points and what to label.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plot {
    /// The points, in execution order.
    pub points: Vec<Point>,
    /// The index into `points` of the culprit (the op the headline names,
    /// [`crate::verdict::culprit`]).
    pub culprit: Option<usize>,
    /// Ops in the run (before downsampling).
    pub ops: usize,
    /// Whether every failing op is on the chart (false only when so many fail that they
    /// were bucketed too).
    pub all_failing: bool,
    /// Where a non-finite error is drawn: ten times the largest finite error or tolerance
    /// on the chart.
    pub top: f64,
}

impl Plot {
    /// Whether some ops were left out.
    pub(crate) fn downsampled(&self) -> bool {
        self.points.len() < self.ops
    }

    /// Where `err` is drawn: non-finite errors at the top of the chart (ten times the
    /// largest finite value on it), zero at [`FLOOR`].
    pub(crate) fn drawn(&self, err: f64) -> f64 {
        if err.is_finite() {
            err.max(FLOOR)
        } else {
            self.top
        }
    }
}

/// Ten times the largest finite error or tolerance of `points`.
fn top(points: &[Point]) -> f64 {
    let top = points
        .iter()
        .flat_map(|p| [p.err, p.tolerance])
        .filter(|v| v.is_finite())
        .fold(FLOOR, f64::max);
    top * 10.0
}

/// How far past its tolerance an error is (NaN and an error over a zero tolerance: as far
/// as can be).
fn severity(err: f64, tolerance: f64) -> f64 {
    if err.is_nan() {
        f64::INFINITY
    } else if tolerance > 0.0 {
        err / tolerance
    } else if err > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// The chart's points gathered unit by unit, in one pass over the rows that other readers
/// share ([`of`] is the pass on its own), downsampled as they come (see [`Downsampler`]):
/// memory is bounded by the cap, not by the run's number of ops.
pub(crate) struct Gather<'f> {
    culprit: Option<&'f Finding>,
    found_culprit: bool,
    x: u64,
    sampler: Downsampler,
}

impl<'f> Gather<'f> {
    /// Nothing gathered yet; `culprit` is the op to mark, `cap` about the most points. The
    /// units' summaries say how many ops and failing ops there are, which sizes the buckets
    /// before the first point.
    pub fn new(run: &CompareRun, culprit: Option<&'f Finding>, cap: usize) -> Gather<'f> {
        let ops = run.units.iter().map(|u| u.chart.ops).sum();
        let failing = run.units.iter().map(|u| u.chart.failing).sum();
        Gather {
            culprit,
            found_culprit: false,
            x: 0,
            sampler: Downsampler::new(ops, failing, culprit.is_some(), cap),
        }
    }

    /// Adds the ops of the next unit.
    pub(crate) fn unit(&mut self, u: &UnitSummary, rows: &[Row]) {
        for op in op_groups(rows) {
            let Some(first) = op.first() else { continue };
            // The op's worst tensor: the one furthest past its tolerance (the first of equals).
            let worst = op
                .iter()
                .map(|r| &r.judgement)
                .fold(&first.judgement, |w, j| {
                    if severity(j.err, j.tolerance) > severity(w.err, w.tolerance) {
                        j
                    } else {
                        w
                    }
                });
            let t = &first.tensor;
            self.x += 1;
            let is_culprit = !self.found_culprit
                && self
                    .culprit
                    .is_some_and(|f| f.step == u.step && f.rank == u.rank && f.seq == t.op.seq);
            self.found_culprit |= is_culprit;
            let point = Point {
                x: self.x,
                place: format!("{}/{}", u.step, u.rank),
                op: t.op.key.to_string(),
                direction: t.op.direction,
                err: worst.err,
                tolerance: worst.tolerance,
                verdict: op
                    .iter()
                    .map(|r| r.judgement.verdict)
                    .fold(first.judgement.verdict, Verdict::max),
            };
            self.sampler.push(point, is_culprit);
        }
    }

    /// The chart.
    pub(crate) fn finish(self) -> Plot {
        let ops = self.sampler.ops;
        let (points, culprit, all_failing) = self.sampler.finish();
        Plot {
            top: top(&points),
            all_failing,
            points,
            culprit,
            ops,
        }
    }
}

/// Downsamples points as they come, given how many there will be: keeps every failing
/// point and the culprit; cuts the other points into buckets of consecutive points so that
/// about `cap` points remain, and keeps the worst of each. When the failing points alone
/// would fill more than three quarters of `cap` (a divergence spreads to every later op),
/// they are bucketed too: only the culprit is always kept.
pub(crate) struct Downsampler {
    ops: usize,
    keep_failing: bool,
    /// Points per bucket; 1 keeps every point.
    bucket: usize,
    out: Vec<Point>,
    best: Option<Point>,
    in_bucket: usize,
    culprit_x: Option<u64>,
}

impl Downsampler {
    /// For `ops` points of which `failing` fail, and a culprit among them when `culprit`.
    pub fn new(ops: usize, failing: usize, culprit: bool, cap: usize) -> Downsampler {
        let (keep_failing, bucket) = if ops <= cap {
            (true, 1)
        } else {
            let keep_failing = failing <= cap / 4 * 3;
            // The culprit is one of the failing points when those are kept.
            let kept =
                if keep_failing { failing } else { 0 } + usize::from(culprit && !keep_failing);
            let others = ops.saturating_sub(kept);
            let room = cap.saturating_sub(kept).max(1);
            (keep_failing, others.div_ceil(room).max(1))
        };
        Downsampler {
            ops,
            keep_failing,
            bucket,
            out: Vec::new(),
            best: None,
            in_bucket: 0,
            culprit_x: None,
        }
    }

    /// The next point in execution order.
    pub(crate) fn push(&mut self, p: Point, is_culprit: bool) {
        if is_culprit {
            self.culprit_x = Some(p.x);
        }
        if is_culprit || self.bucket == 1 || (self.keep_failing && p.verdict == Verdict::Error) {
            self.out.push(p);
            return;
        }
        let worse = match &self.best {
            Some(b) => severity(p.err, p.tolerance) > severity(b.err, b.tolerance),
            None => true,
        };
        if worse {
            self.best = Some(p);
        }
        self.in_bucket += 1;
        if self.in_bucket == self.bucket {
            self.out.extend(self.best.take());
            self.in_bucket = 0;
        }
    }

    /// The points kept, in execution order; the culprit's index among them; whether every
    /// failing point was kept.
    pub(crate) fn finish(self) -> (Vec<Point>, Option<usize>, bool) {
        let mut out = self.out;
        out.extend(self.best);
        // Kept points went out as they came; a bucket's worst went out at the bucket's end.
        out.sort_by_key(|p| p.x);
        let culprit = self
            .culprit_x
            .and_then(|x| out.iter().position(|p| p.x == x));
        (out, culprit, self.keep_failing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Downsamples `points` (in order), the one at index `culprit` marked.
    fn downsample(
        points: Vec<Point>,
        culprit: Option<usize>,
        cap: usize,
    ) -> (Vec<Point>, Option<usize>, bool) {
        let failing = points
            .iter()
            .filter(|p| p.verdict == Verdict::Error)
            .count();
        let mut d = Downsampler::new(points.len(), failing, culprit.is_some(), cap);
        for (i, p) in points.into_iter().enumerate() {
            d.push(p, Some(i) == culprit);
        }
        d.finish()
    }

    fn point(x: u64, err: f64, verdict: Verdict) -> Point {
        Point {
            x,
            place: "step0/rank0".into(),
            op: format!("Torch.add.{x}.forward"),
            direction: Direction::Forward,
            err,
            tolerance: 1e-3,
            verdict,
        }
    }

    #[test]
    fn downsampling_keeps_failing_points_the_culprit_and_each_buckets_worst() {
        let mut pts: Vec<Point> = (1..=1000)
            .map(|x| point(x, 1e-6 * (x % 7) as f64, Verdict::Pass))
            .collect();
        pts[499] = point(500, 5e-4, Verdict::Pass); // a passing spike
        pts[699] = point(700, 1.0, Verdict::Error);
        pts[899] = point(900, 1e-2, Verdict::Error);
        let (out, culprit, all) = downsample(pts.clone(), Some(699), 100);
        assert!(all);
        assert!(out.len() <= 101, "{}", out.len());
        assert!(out.windows(2).all(|w| w[0].x < w[1].x), "execution order");
        assert!(out.iter().any(|p| p.x == 500), "the spike survives");
        assert!(out.iter().any(|p| p.x == 900), "every failing point");
        assert_eq!(culprit.map(|i| out[i].x), Some(700));
        let (same, c, all) = downsample(pts.clone(), Some(3), 1000);
        assert_eq!(
            (same.len(), c, all),
            (1000, Some(3), true),
            "small runs are untouched"
        );
    }

    #[test]
    fn when_most_ops_fail_they_are_bucketed_too() {
        let pts: Vec<Point> = (1..=10_000)
            .map(|x| {
                let err = if x % 1000 == 0 { 1e3 } else { 1.0 };
                point(x, err, Verdict::Error)
            })
            .collect();
        let (out, culprit, all) = downsample(pts, Some(4321), 1000);
        assert!(!all);
        assert!(out.len() <= 1001, "{}", out.len());
        assert_eq!(culprit.map(|i| out[i].x), Some(4322));
        assert!(
            (1..=10).all(|k| out.iter().any(|p| p.x == k * 1000)),
            "spikes"
        );
    }

    #[test]
    fn zero_and_non_finite_errors_are_drawn_inside_the_axis() {
        let points = vec![
            point(1, 0.0, Verdict::Pass),
            point(2, 2.0, Verdict::Error),
            point(3, f64::NAN, Verdict::Error),
        ];
        let plot = Plot {
            top: top(&points),
            points,
            culprit: None,
            ops: 3,
            all_failing: true,
        };
        assert_eq!(plot.drawn(0.0), FLOOR);
        assert_eq!(plot.drawn(f64::NAN), 20.0);
        assert_eq!(plot.drawn(f64::INFINITY), 20.0);
        assert_eq!(plot.drawn(0.5), 0.5);
        assert!(!plot.downsampled());
    }
}
