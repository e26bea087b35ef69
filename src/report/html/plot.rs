//! The plot's data in two passes over the points (they may be a million): the first sizes
//! the axes and gathers the phases, module runs and modules, the second keeps what is drawn:
//! every out-of-tolerance point up to [`MAX_FAILING`] and every marked point on its own, the
//! others bucketed per pixel column and direction keeping the largest error, so a spike is
//! never averaged away.

use super::{num, Point, MAX_FAILING, MAX_MODULES, MAX_RUNS};
use crate::compare::Verdict;
use crate::error::Result;
use crate::op_key::Direction;
use crate::report::Overview;
use crate::schema::summary::Finding;
use std::collections::BTreeMap;
use std::fmt::Write as _;

// The plot's geometry, in SVG user units (pixels at 100 %).
pub(super) const WIDTH: f64 = 1200.0;
pub(super) const HEIGHT: f64 = 456.0;
pub(super) const LEFT: f64 = 72.0;
pub(super) const RIGHT: f64 = 24.0;
pub(super) const TOP: f64 = 72.0;
pub(super) const BOTTOM: f64 = 64.0;
/// Pixel columns of the plot area: the buckets per direction.
pub(super) const COLUMNS: usize = (WIDTH - LEFT - RIGHT) as usize;

/// A finding to mark on the plot: its title and the op it names.
pub(super) struct Mark<'a> {
    pub(super) title: &'a str,
    pub(super) finding: &'a Finding,
}

/// The findings that name the culprit: the first divergent op per phase, where the
/// divergence enters, the first NaN/Inf producer.
pub(super) fn marks(ov: &Overview) -> Vec<Mark<'_>> {
    ov.findings
        .iter()
        .filter(|l| l.names_culprit())
        .map(|l| Mark {
            title: &l.title,
            finding: &l.finding,
        })
        .collect()
}

impl Mark<'_> {
    /// Whether `p` is a tensor of the op this mark names.
    fn names_op(&self, p: &Point) -> bool {
        let f = self.finding;
        p.seq == f.seq && p.step == f.step && p.rank == f.rank && p.op == f.op
    }
}

/// Per module path: its tensors, how many are out of tolerance, the worst error and where.
#[derive(Debug, Clone, Default)]
pub(super) struct Agg {
    pub(super) tensors: usize,
    pub(super) errors: usize,
    pub(super) worst: Option<(f64, String)>,
}

/// Sort key of an error: NaN is the worst.
fn badness(e: f64) -> f64 {
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

impl Agg {
    fn add(&mut self, err: f64, failing: bool, op: &str) {
        self.tensors += 1;
        self.errors += usize::from(failing);
        if self
            .worst
            .as_ref()
            .is_none_or(|(w, _)| badness(err) > badness(*w))
        {
            self.worst = Some((err, op.to_string()));
        }
    }
    pub(super) fn merge(&mut self, o: &Agg) {
        self.tensors += o.tensors;
        self.errors += o.errors;
        if let Some((e, op)) = &o.worst {
            if self
                .worst
                .as_ref()
                .is_none_or(|(w, _)| badness(*e) > badness(*w))
            {
                self.worst = Some((*e, op.clone()));
            }
        }
    }
}

/// A drawn point: where it lies, what it is (its tooltip), which series run it belongs to.
#[derive(Clone)]
pub(super) struct Drawn {
    pub(super) index: usize,
    pub(super) run: usize,
    pub(super) direction: Direction,
    pub(super) verdict: Verdict,
    pub(super) err: f64,
    pub(super) tooltip: String,
}

impl Drawn {
    fn of(index: usize, run: usize, p: &Point) -> Drawn {
        Drawn {
            index,
            run,
            direction: p.direction,
            verdict: p.verdict,
            err: p.err,
            tooltip: tooltip(p),
        }
    }
}

/// The points of a document, handed one at a time to a function (see `Document::points`).
type Points<'a> = dyn Fn(&mut dyn FnMut(Point<'_>) -> Result<()>) -> Result<()> + 'a;

/// The downsampled plot and what the page says about the run's modules.
pub(super) struct Plot {
    /// Tensors in the run.
    pub(super) n: usize,
    /// Points drawn, in execution order.
    pub(super) drawn: Vec<Drawn>,
    /// Of the drawn points, the ones standing for a bucket.
    pub(super) bucketed_into: usize,
    /// Points represented by a bucket rather than drawn.
    pub(super) bucketed: usize,
    /// Out-of-tolerance points in all.
    pub(super) failing: usize,
    /// The lowest tolerance per pixel column.
    pub(super) tolerance: Vec<Option<f64>>,
    /// Decades of the y axis: the bottom line holds zeros, the top one NaN/inf when
    /// `nonfinite`.
    pub(super) lo: i32,
    pub(super) hi: i32,
    pub(super) nonfinite: bool,
    /// Where each module run starts (index) and its path.
    pub(super) runs: Vec<(usize, String)>,
    pub(super) runs_complete: bool,
    /// Where a step/rank or its backward pass starts: index and label.
    pub(super) phases: Vec<(usize, String)>,
    /// The index each mark points at.
    pub(super) marked: Vec<Option<usize>>,
    pub(super) modules: BTreeMap<String, Agg>,
    pub(super) modules_left_out: usize,
}

impl Plot {
    /// Two passes over the points: the first sizes the axes and gathers the modules, the
    /// second keeps the points to draw. None when there is nothing to plot.
    pub(super) fn build(points: &Points, marks: &[Mark]) -> Result<Option<Plot>> {
        let s = Survey::of(points, marks)?;
        if s.n == 0 {
            return Ok(None);
        }
        let (mut min_pos, mut max_fin) = (s.min_pos, s.max_fin);
        if !min_pos.is_finite() {
            (min_pos, max_fin) = (1e-8, 1.0);
        }
        // One decade below the smallest positive error holds the zeros (identical tensors).
        let lo = (min_pos.log10().floor() as i32 - 1).max(-20);
        // One decade above the largest finite error holds NaN/inf, when there is any.
        let hi = (max_fin.log10().ceil() as i32).max(lo + 1).min(lo + 40) + i32::from(s.nonfinite);
        let k = sample(points, s.n, &s.marked)?;
        Ok(Some(Plot {
            n: s.n,
            drawn: k.drawn,
            bucketed_into: k.bucketed_into,
            bucketed: k.bucketed,
            failing: s.failing,
            tolerance: k.tolerance,
            lo,
            hi,
            nonfinite: s.nonfinite,
            runs: s.runs,
            runs_complete: s.runs_complete,
            phases: s.phases,
            marked: s.marked,
            modules: s.modules,
            modules_left_out: s.modules_left_out,
        }))
    }

    pub(super) fn x(&self, i: usize) -> f64 {
        LEFT + (i as f64 + 0.5) * (WIDTH - LEFT - RIGHT) / self.n as f64
    }

    /// The y of an error on the log axis; zero on the bottom line (a decade below the
    /// smallest positive error), NaN/inf on the top line (a decade above the largest).
    pub(super) fn y(&self, v: f64) -> f64 {
        let (lo, hi) = (f64::from(self.lo), f64::from(self.hi));
        let d = if v.is_nan() || v == f64::INFINITY {
            hi
        } else if v <= 0.0 {
            lo
        } else {
            v.log10().clamp(lo, hi)
        };
        TOP + (hi - d) / (hi - lo) * (HEIGHT - TOP - BOTTOM)
    }
}

/// What the first pass over the points gathers: the range of the errors, the phases and
/// module runs along execution order, the modules, where the marks point.
struct Survey {
    n: usize,
    /// The smallest positive and the largest finite error or tolerance.
    min_pos: f64,
    max_fin: f64,
    failing: usize,
    nonfinite: bool,
    runs: Vec<(usize, String)>,
    runs_complete: bool,
    phases: Vec<(usize, String)>,
    marked: Vec<Option<usize>>,
    modules: BTreeMap<String, Agg>,
    modules_left_out: usize,
}

impl Survey {
    /// The first pass: sizes the axes and gathers the modules.
    fn of(points: &Points, marks: &[Mark]) -> Result<Survey> {
        let mut n = 0usize;
        let (mut min_pos, mut max_fin) = (f64::INFINITY, 0.0f64);
        let mut runs: Vec<(usize, String)> = Vec::new();
        let mut runs_complete = true;
        let mut phases: Vec<(usize, String)> = Vec::new();
        let mut modules: BTreeMap<String, Agg> = BTreeMap::new();
        let mut modules_left_out = 0usize;
        let mut marked: Vec<Option<usize>> = vec![None; marks.len()];
        // The step/rank of the previous point and its direction.
        let mut last_unit: Option<(String, String)> = None;
        let mut last_dir: Option<Direction> = None;
        let mut seen_backward = false;
        let mut failing = 0usize;
        let mut nonfinite = false;
        points(&mut |p| {
            let i = n;
            n += 1;
            nonfinite |= !p.err.is_finite();
            for v in [p.err, p.tolerance] {
                if v.is_finite() && v > 0.0 {
                    min_pos = min_pos.min(v);
                    max_fin = max_fin.max(v);
                }
            }
            let fails = p.verdict == Verdict::Error;
            failing += usize::from(fails);
            // A rule where a step/rank starts and where its backward pass starts (collectives
            // recorded as forward calls inside the backward pass do not start a phase).
            let unit_changed = last_unit
                .as_ref()
                .is_none_or(|(s, r)| (s.as_str(), r.as_str()) != (p.step, p.rank));
            let backward_starts = !unit_changed
                && p.direction == Direction::Backward
                && last_dir == Some(Direction::Forward)
                && !seen_backward;
            if unit_changed || backward_starts {
                let label = if unit_changed {
                    seen_backward = p.direction == Direction::Backward;
                    format!("{}/{} {}", p.step, p.rank, p.direction.name())
                } else {
                    seen_backward = true;
                    p.direction.name().to_string()
                };
                if phases.len() < MAX_RUNS {
                    phases.push((i, label));
                }
            }
            if unit_changed {
                last_unit = Some((p.step.to_string(), p.rank.to_string()));
            }
            last_dir = Some(p.direction);
            let module = p.module.unwrap_or("");
            if runs.last().is_none_or(|(_, m)| m != module) {
                if runs.len() < MAX_RUNS {
                    runs.push((i, module.to_string()));
                } else {
                    runs_complete = false;
                }
            }
            let key = p.module.unwrap_or("(no module)");
            let room = modules.len() < MAX_MODULES;
            match modules.get_mut(key) {
                Some(a) => a.add(p.err, fails, p.op),
                None if room => {
                    let mut a = Agg::default();
                    a.add(p.err, fails, p.op);
                    modules.insert(key.to_string(), a);
                }
                None => modules_left_out += 1,
            }
            for (m, slot) in marks.iter().zip(marked.iter_mut()) {
                // The op's first tensor, or better the tensor the finding names.
                if m.names_op(&p) && (slot.is_none() || p.tensor == m.finding.tensor) {
                    *slot = Some(i);
                }
            }
            Ok(())
        })?;
        Ok(Survey {
            n,
            min_pos,
            max_fin,
            failing,
            nonfinite,
            runs,
            runs_complete,
            phases,
            marked,
            modules,
            modules_left_out,
        })
    }
}

/// What the second pass keeps: the points to draw and the tolerance per pixel column.
struct Sample {
    drawn: Vec<Drawn>,
    bucketed_into: usize,
    bucketed: usize,
    tolerance: Vec<Option<f64>>,
}

/// The second pass over the `n` points: every failing (up to the cap) and marked point, and
/// per pixel column and direction the point of largest error among the rest.
fn sample(points: &Points, n: usize, marked: &[Option<usize>]) -> Result<Sample> {
    let col_of = |i: usize| ((i as u128 * COLUMNS as u128) / n as u128) as usize;
    let mut tolerance: Vec<Option<f64>> = vec![None; COLUMNS];
    let mut singles: Vec<Drawn> = Vec::new();
    let mut buckets: BTreeMap<(usize, u8), (Drawn, usize)> = BTreeMap::new();
    let mut run = 0usize;
    let mut last: Option<(String, String, Direction)> = None;
    let mut kept_failing = 0usize;
    let mut i = 0usize;
    points(&mut |p| {
        let here = i;
        i += 1;
        if here >= n {
            return Ok(());
        }
        let same = last
            .as_ref()
            .is_some_and(|(s, r, d)| (s.as_str(), r.as_str(), *d) == (p.step, p.rank, p.direction));
        if !same {
            if last.is_some() {
                run += 1;
            }
            last = Some((p.step.to_string(), p.rank.to_string(), p.direction));
        }
        let c = col_of(here).min(COLUMNS - 1);
        if p.tolerance.is_finite() && p.tolerance > 0.0 {
            let t = &mut tolerance[c];
            *t = Some(t.map_or(p.tolerance, |x| x.min(p.tolerance)));
        }
        let is_marked = marked.contains(&Some(here));
        let fails = p.verdict == Verdict::Error;
        if is_marked || (fails && kept_failing < MAX_FAILING) || n <= COLUMNS {
            kept_failing += usize::from(fails && !is_marked);
            singles.push(Drawn::of(here, run, &p));
            return Ok(());
        }
        let key = (c, p.direction as u8);
        match buckets.get_mut(&key) {
            Some((b, count)) => {
                *count += 1;
                if badness(p.err) > badness(b.err) {
                    *b = Drawn::of(here, run, &p);
                }
            }
            None => {
                buckets.insert(key, (Drawn::of(here, run, &p), 1));
            }
        }
        Ok(())
    })?;
    let bucketed: usize = buckets.values().map(|(_, c)| c).sum();
    let bucketed_into = buckets.len();
    let mut drawn = singles;
    drawn.extend(buckets.into_values().map(|(d, _)| d));
    drawn.sort_by_key(|d| d.index);
    Ok(Sample {
        drawn,
        bucketed_into,
        bucketed,
        tolerance,
    })
}

/// A point's hover text.
fn tooltip(p: &Point) -> String {
    let mut s = format!(
        "{} ({}/{}, seq {})\n{}\n{}: error {} (tolerance {})",
        p.op,
        p.step,
        p.rank,
        p.seq,
        p.tensor,
        p.verdict.name(),
        num(p.err),
        num(p.tolerance)
    );
    if let Some(c) = p.cosine {
        let _ = write!(s, ", cosine {}", num(c));
    }
    if let Some(r) = p.max_rel {
        let _ = write!(s, ", max rel {}", num(r));
    }
    if let Some(m) = p.module {
        let _ = write!(s, "\nmodule {m}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Verdict;
    use crate::op_key::Direction;
    use crate::report::html::MAX_FAILING;

    fn point(i: usize, err: f64) -> Point<'static> {
        Point {
            step: "step0",
            rank: "rank0",
            seq: i as u64,
            op: "Functional.linear.0.forward",
            tensor: "Functional.linear.0.forward.output.0",
            direction: if i.is_multiple_of(2) {
                Direction::Forward
            } else {
                Direction::Backward
            },
            module: Some("blocks.0"),
            verdict: if err > 1e-3 {
                Verdict::Error
            } else {
                Verdict::Pass
            },
            err,
            tolerance: 1e-3,
            cosine: Some(1.0),
            max_rel: Some(err),
        }
    }

    #[test]
    fn a_million_points_stay_bounded() {
        let n = 1_000_000;
        // Every 100th tensor fails: 10k failing, past the cap.
        let err = |i: usize| if i.is_multiple_of(100) { 0.5 } else { 1e-6 };
        let plot = Plot::build(&|f| (0..n).try_for_each(|i| f(point(i, err(i)))), &[])
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.n, n);
        assert!(
            plot.drawn.len() <= MAX_FAILING + 2 * COLUMNS,
            "{}",
            plot.drawn.len()
        );
        assert_eq!(plot.bucketed + plot.drawn.len() - plot.bucketed_into, n);
        let mut page = String::new();
        plot.svg(&mut page, &[]);
        assert!(page.len() < 2_000_000, "{} bytes", page.len());
        let elements = page.matches('<').count() - page.matches("</").count();
        assert!(elements <= 20_000, "{elements} elements");
    }

    #[test]
    fn the_culprit_survives_bucketing_and_nan_gets_the_top_line() {
        let n = 200_000;
        let culprit = Finding {
            op: "Functional.linear.0.forward".into(),
            step: "step0".into(),
            rank: "rank0".into(),
            seq: 123_457,
            direction: Direction::Backward,
            tensor: "Functional.linear.0.forward.output.0".into(),
            reason: String::new(),
            explanation: String::new(),
            evidence: vec![],
            stack: vec![],
            leftover: None,
            args: Vec::new(),
            one_sided_source: None,
            carried: None,
            outside: None,
            draw: None,
            module: None,
            consequence_of: None,
            layout: Vec::new(),
        };
        let marks = [Mark {
            title: "first divergent op (backward)",
            finding: &culprit,
        }];
        // The culprit's error is small: bucketing alone would drop it.
        let err = |i: usize| match i {
            123_457 => 1e-5,
            7 => f64::NAN,
            _ => 1e-4,
        };
        let plot = Plot::build(&|f| (0..n).try_for_each(|i| f(point(i, err(i)))), &marks)
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.marked, vec![Some(123_457)]);
        assert!(plot.drawn.iter().any(|d| d.index == 123_457));
        assert!(plot.nonfinite);
        assert_eq!(plot.y(f64::NAN), TOP);
        assert!(plot.y(1e-4) > TOP);
        let mut page = String::new();
        plot.svg(&mut page, &marks);
        assert!(page.contains("first divergent op (backward): Functional.linear.0.forward"));
        assert!(page.contains(">NaN/inf</text>"));
    }

    #[test]
    fn small_runs_draw_every_point() {
        let plot = Plot::build(&|f| (0..50).try_for_each(|i| f(point(i, 1e-5))), &[])
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.drawn.len(), 50);
        assert_eq!(plot.bucketed, 0);
    }
}
