//! One monitor run alone: the steps where it goes bad.
//!
//! - **nonfinite**: the first step where a metric is NaN/Inf or counts NaN/Inf elements
//!   (an output, a gradient, the loss); within the step, the first in the data flow names
//!   the module that produced it (its consumers, the loss and the gradients follow).
//! - **loss_spike**, **grad_norm_spike**: the model's loss (gradient norm) far above its
//!   trailing window: a robust score `(x - median) / max(1.4826·MAD, 1e-3·|median|)` over
//!   the previous [`WINDOW`] steps (at least [`MIN_HISTORY`]) above [`SPIKE_SCORE`] (the
//!   flight recorder's loss-spike trigger has the same threshold, margin and window), and
//!   the value above the median by [`LOSS_MARGIN`] (loss) or [`GRAD_MARGIN`] (gradient
//!   norm), so that a flat curve's tiny wobble is no spike.
//! - **loss_scale_collapse**: the loss scaler's scale below 1, or 1024 times below the
//!   largest it reached: the scaler keeps skipping steps on overflowing gradients.
//! - **dead**: a module's output (or gradient) norm that was positive and stays exactly 0
//!   for [`DEAD_STEPS`] steps.
//! - **exploding**: a module's output, gradient or parameter norm above [`EXPLODE_FACTOR`]
//!   times its trailing median.
//!
//! Each kind is reported once per rank, module and metric: its first step.

use super::read::{files, read_rank};
use super::read::{present, RankSeries};
use super::{curve, flow, module_label, module_order, producer, Curve};
use crate::error::Result;
use crate::vocab::Verdict;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The trailing window of the robust scores, in steps.
pub const WINDOW: usize = 50;
/// Steps of history a score needs.
pub const MIN_HISTORY: usize = 10;
/// A robust score above this is a spike.
pub const SPIKE_SCORE: f64 = 10.0;
/// A loss spike is also 25 % above the median.
pub const LOSS_MARGIN: f64 = 0.25;
/// A gradient-norm spike is also twice the median.
pub const GRAD_MARGIN: f64 = 1.0;
/// Steps of exact zeros that make a module dead.
pub const DEAD_STEPS: usize = 10;
/// A norm this many times its trailing median is exploding.
pub const EXPLODE_FACTOR: f64 = 100.0;

/// What went bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// NaN/Inf.
    Nonfinite,
    /// The loss scale collapsed.
    LossScaleCollapse,
    /// The loss far above its trailing window.
    LossSpike,
    /// The gradient norm far above its trailing window.
    GradNormSpike,
    /// A norm far above its trailing median.
    Exploding,
    /// A module's norm stuck at zero.
    Dead,
}

impl EventKind {
    /// The verdict an event of this kind makes: a run that produced NaN/Inf or whose
    /// scaler gave up has failed; the rest are for a person to look at.
    pub fn verdict(self) -> Verdict {
        match self {
            EventKind::Nonfinite | EventKind::LossScaleCollapse => Verdict::Error,
            _ => Verdict::Warning,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Nonfinite => "nonfinite",
            EventKind::LossScaleCollapse => "loss_scale_collapse",
            EventKind::LossSpike => "loss_spike",
            EventKind::GradNormSpike => "grad_norm_spike",
            EventKind::Exploding => "exploding",
            EventKind::Dead => "dead",
        }
    }
}

/// One event of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// What went bad.
    pub kind: EventKind,
    /// The step.
    pub step: i64,
    /// The step before it in the file (None: it is the first).
    pub previous_step: Option<i64>,
    /// The rank.
    pub rank: u32,
    /// The module (`""`: the model).
    pub module: String,
    /// The metric.
    pub metric: String,
    /// Its value there (None: null).
    pub value: Option<f64>,
    /// What it was judged against (the trailing median, the largest scale), where any.
    pub baseline: Option<f64>,
    /// The robust score of a spike.
    pub score: Option<f64>,
    /// The module that returned just before it in that step (its producer).
    pub producer: Option<String>,
    /// Where it comes in its step's data flow (not written).
    #[serde(skip)]
    pub flow: (u8, i64),
}

/// One monitor run scanned.
#[derive(Debug, Clone)]
pub struct EventRun {
    /// The folder.
    pub root: PathBuf,
    /// The ranks.
    pub ranks: Vec<u32>,
    /// The most steps of a rank.
    pub steps: usize,
    /// Every event, first first (step, data flow, rank).
    pub events: Vec<Event>,
    /// What the html report draws.
    pub curves: Vec<Curve>,
    /// What was doubtful.
    pub warnings: Vec<String>,
}

/// The median and the median absolute deviation of finite values.
fn median_mad(v: &[f64]) -> Option<(f64, f64)> {
    let mut xs: Vec<f64> = v
        .iter()
        .filter_map(|&x| present(x))
        .filter(|x| x.is_finite())
        .collect();
    if xs.len() < MIN_HISTORY {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let med = xs[xs.len() / 2];
    let mut dev: Vec<f64> = xs.iter().map(|x| (x - med).abs()).collect();
    dev.sort_by(f64::total_cmp);
    Some((med, dev[dev.len() / 2]))
}

/// The first spike of a series: index, score, median.
fn first_spike(v: &[f64], margin: f64) -> Option<(usize, f64, f64)> {
    (MIN_HISTORY..v.len()).find_map(|t| {
        let x = present(v[t]).filter(|x| x.is_finite())?;
        let (med, mad) = median_mad(&v[t.saturating_sub(WINDOW)..t])?;
        let score = (x - med) / (1.4826 * mad).max(1e-3 * med.abs()).max(f64::MIN_POSITIVE);
        (score > SPIKE_SCORE && x > med + margin * med.abs()).then_some((t, score, med))
    })
}

/// The first step a norm explodes: index, median.
fn first_explosion(v: &[f64]) -> Option<(usize, f64)> {
    (MIN_HISTORY..v.len()).find_map(|t| {
        let x = present(v[t]).filter(|x| x.is_finite())?;
        let (med, _) = median_mad(&v[t.saturating_sub(WINDOW)..t])?;
        (med > 0.0 && x > EXPLODE_FACTOR * med).then_some((t, med))
    })
}

/// The first step of [`DEAD_STEPS`] exact zeros after a positive value.
fn first_death(v: &[f64]) -> Option<usize> {
    let alive = v
        .iter()
        .position(|&x| present(x).is_some_and(|x| x > 0.0))?;
    let mut run = 0;
    for (t, &x) in v.iter().enumerate().skip(alive + 1) {
        if present(x) == Some(0.0) {
            run += 1;
            if run == DEAD_STEPS {
                return Some(t + 1 - DEAD_STEPS);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// The first collapse of a loss scale: index, the largest scale before it.
fn first_collapse(v: &[f64]) -> Option<(usize, f64)> {
    let mut top = 0.0f64;
    for (t, &x) in v.iter().enumerate() {
        let Some(x) = present(x).filter(|x| x.is_finite()) else {
            continue;
        };
        if x < 1.0 || (top > 0.0 && x * 1024.0 <= top) {
            return Some((t, top));
        }
        top = top.max(x);
    }
    None
}

/// Whether a stored value says NaN/Inf: a non-finite value, or a positive count of them.
fn bad_value(metric: &str, x: f64) -> bool {
    present(x).is_some_and(|x| !x.is_finite() || (metric.ends_with("_nonfinite") && x > 0.0))
}

/// The events of one rank.
fn rank_events(r: &RankSeries) -> Vec<Event> {
    let mut out = Vec::new();
    let event = |kind, t: usize, m: usize, metric: &str, baseline, score| Event {
        kind,
        step: r.steps[t],
        previous_step: t.checked_sub(1).map(|p| r.steps[p]),
        rank: r.rank,
        module: r.modules[m].clone(),
        metric: metric.to_string(),
        value: r.metric(metric).and_then(|k| present(r.series(k, m)[t])),
        baseline,
        score,
        producer: producer(r, m, t),
        flow: flow(metric, module_order(r, m, t)),
    };
    for (k, metric) in r.metrics.iter().enumerate() {
        for m in 0..r.modules.len() {
            let v = r.series(k, m);
            if let Some(t) = v.iter().position(|&x| bad_value(metric, x)) {
                out.push(event(EventKind::Nonfinite, t, m, metric, None, None));
            }
            let root = r.modules[m].is_empty();
            let spike = match metric.as_str() {
                "loss" if root => Some((EventKind::LossSpike, LOSS_MARGIN)),
                "grad_norm" if root => Some((EventKind::GradNormSpike, GRAD_MARGIN)),
                _ => None,
            };
            if let Some((kind, margin)) = spike {
                if let Some((t, score, med)) = first_spike(v, margin) {
                    out.push(event(kind, t, m, metric, Some(med), Some(score)));
                }
            }
            if metric == "loss_scale" {
                if let Some((t, top)) = first_collapse(v) {
                    out.push(event(
                        EventKind::LossScaleCollapse,
                        t,
                        m,
                        metric,
                        Some(top),
                        None,
                    ));
                }
            }
            if !root && matches!(metric.as_str(), "output_norm" | "grad_norm") {
                if let Some(t) = first_death(v) {
                    out.push(event(EventKind::Dead, t, m, metric, None, None));
                }
            }
            if !root && matches!(metric.as_str(), "output_norm" | "grad_norm" | "param_norm") {
                if let Some((t, med)) = first_explosion(v) {
                    out.push(event(EventKind::Exploding, t, m, metric, Some(med), None));
                }
            }
        }
    }
    out
}

/// Scans a monitor folder, rank by rank (in parallel; a rank's file is read, scanned and
/// dropped).
pub fn scan(root: &Path) -> Result<EventRun> {
    use rayon::prelude::*;
    let files = files(root)?;
    let per_rank = files
        .par_iter()
        .map(|(rank, path)| {
            let r = read_rank(path, *rank)?;
            let cut = r.cut_short_note();
            Ok((r.rank, r.steps.len(), rank_events(&r), cut))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut events = Vec::new();
    let mut warnings = Vec::new();
    let mut ranks = Vec::new();
    let mut steps = 0;
    for (rank, n, e, cut) in per_rank {
        ranks.push(rank);
        steps = steps.max(n);
        events.extend(e);
        warnings.extend(cut);
    }
    events.sort_by_key(|e| {
        (
            e.step,
            e.flow,
            e.rank,
            std::cmp::Reverse(super::depth(&e.module)),
            e.kind,
        )
    });
    // The rank drawn (the first event's, else the first) is read once more.
    let drawn = events.first().map_or(files[0].0, |e| e.rank);
    let curves = match files.iter().find(|(r, _)| *r == drawn) {
        Some((rank, path)) => scan_curves(&read_rank(path, *rank)?, events.first()),
        None => Vec::new(),
    };
    Ok(EventRun {
        root: root.to_path_buf(),
        ranks,
        steps,
        events,
        curves,
        warnings,
    })
}

/// The model's loss, gradient norm, loss scale and learning rate, and the first event's
/// metric, on the rank drawn.
fn scan_curves(r: &RankSeries, first: Option<&Event>) -> Vec<Curve> {
    let mut wanted: Vec<(String, String)> = ["loss", "grad_norm", "loss_scale", "lr"]
        .iter()
        .map(|m| (String::new(), m.to_string()))
        .collect();
    if let Some(e) = first.filter(|e| !e.module.is_empty()) {
        wanted.push((e.module.clone(), e.metric.clone()));
    }
    wanted
        .into_iter()
        .filter_map(|(module, metric)| {
            let v = r.series(r.metric(&metric)?, r.module(&module)?);
            if v.iter().all(|&x| present(x).is_none()) {
                return None;
            }
            Some(curve(
                format!("rank {} {} {metric}", r.rank, module_label(&module)),
                &r.steps,
                vec![("run".into(), v.to_vec())],
                first.map(|e| e.step),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_scale_collapses_below_one_or_1024_times_below_its_top() {
        assert_eq!(
            first_collapse(&[65536.0, 32768.0, 65536.0, 64.0, 32.0]),
            Some((3, 65536.0))
        );
        assert_eq!(first_collapse(&[4.0, 2.0, 0.5]), Some((2, 4.0)));
        assert_eq!(first_collapse(&[65536.0, 32768.0, 16384.0, 65536.0]), None);
    }

    #[test]
    fn a_spike_needs_history_a_robust_score_and_a_margin() {
        let mut v: Vec<f64> = (0..40).map(|i| 2.0 + 0.01 * f64::from(i % 3)).collect();
        assert_eq!(first_spike(&v, LOSS_MARGIN), None);
        v[30] = 2.1; // a high score, but within 10 % of the median
        assert_eq!(first_spike(&v, LOSS_MARGIN), None);
        v[35] = 4.0;
        assert_eq!(first_spike(&v, LOSS_MARGIN).map(|s| s.0), Some(35));
        // Too little history: no score.
        assert_eq!(first_spike(&[2.0, 2.0, 9.0], LOSS_MARGIN), None);
    }

    #[test]
    fn a_module_is_dead_after_ten_zero_steps_following_life() {
        let mut v = vec![0.0; 5];
        v.extend([1.0; 5]);
        v.extend([0.0; 9]);
        assert_eq!(first_death(&v), None);
        v.push(0.0);
        assert_eq!(first_death(&v), Some(10));
    }
}
