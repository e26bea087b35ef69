//! Two monitor runs, step by step: where they part.
//!
//! Every series (rank, module, metric) of the benchmark is paired with the comparison's by
//! name, over the steps both have. Its difference at a step is relative (`|a - b| /
//! max(|a|, |b|, atol)`, atol a thousandth of the series' typical size on its first steps,
//! so that a value passing through zero is not a huge relative change); a value on one
//! side only, or non-finite on one side only, is an infinite difference.
//!
//! The envelope is calibrated on the first steps: two runs that will part later agree
//! there up to their own drift (another thread count, another device's rounding), and each
//! series may differ by up to `k` times its largest difference there (default 4), at least
//! a floor (1e-5, the float32 norms' resolution with room). A lower precision's drift keeps
//! growing after those steps, so the envelope follows it: at each step it is also at least
//! `k` times the largest difference of the steps before (a slow drift stays inside, a jump
//! does not; a divergence that builds up by less than `k` times a step is not named). Measured on a 4-layer
//! transformer, the drift of another thread count stays at 1e-7 over 300 AdamW steps: a
//! fault changes a norm by orders of magnitude more. `--envelope` gives one envelope for
//! every series instead (then every step is judged).
//!
//! The first step where any series leaves its envelope is where the runs part; among the
//! series that leave it at that step, the one earliest in the step's data flow
//! ([`super::flow`]) is named: a faulty module's output parts before its consumers', the
//! loss and every gradient after it.

use super::read::{files, read_rank};
use super::read::{present, RankSeries};
use super::{curve, flow, module_label, module_order, producer, Curve};
use crate::error::{ProbeError, Result};
use crate::vocab::Sides;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// How two monitor runs are judged.
#[derive(Debug, Clone, Copy)]
pub struct TrendOptions {
    /// One envelope for every series (relative difference), instead of calibrating.
    pub envelope: Option<f64>,
    /// Calibrate on this many first steps (None: a tenth of the steps, 3 to 20).
    pub calibration_steps: Option<usize>,
    /// A series parts beyond `k` times its largest difference on the calibration steps.
    pub k: f64,
}

/// The default `k`.
pub const DEFAULT_K: f64 = 4.0;

/// The least envelope a calibrated series gets: float32 norms of equal runs differ by a
/// few 1e-7 (their last bits, a reduction's order); this leaves a margin of ten and more.
pub const FLOOR: f64 = 1e-5;

/// The calibration window when none is given: a tenth of the steps, 3 to 20.
fn default_window(steps: usize) -> usize {
    (steps / 10).clamp(3, 20)
}

/// One series of the two runs, judged.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesResult {
    /// The rank.
    pub rank: u32,
    /// The module (`""`: the model).
    pub module: String,
    /// The metric.
    pub metric: String,
    /// The envelope its differences were judged against: where it parts, the one of that
    /// step (the envelope follows the drift: at least `k` times the largest difference of
    /// the steps before); else the calibrated one.
    pub envelope: f64,
    /// Its largest difference on the calibration steps (None: an envelope was given).
    pub calibrated: Option<f64>,
    /// The first step where it left the envelope.
    pub parts_at: Option<i64>,
    /// The benchmark's value there.
    pub bench: Option<f64>,
    /// The comparison's value there.
    pub cmp: Option<f64>,
    /// The difference there.
    pub difference: Option<f64>,
    /// Its largest difference over the judged steps, divided by the envelope.
    pub worst_ratio: f64,
    /// Where it comes in the data flow of the step it parts at (not written).
    #[serde(skip)]
    pub flow: (u8, i64),
}

/// Where the runs part: the series named and the step before it.
#[derive(Debug, Clone, Serialize)]
pub struct Parting {
    /// The first step beyond the envelope.
    pub step: i64,
    /// The step before it both runs have (None: it is their first).
    pub previous_step: Option<i64>,
    /// The series that parts first in that step's data flow.
    pub series: SeriesResult,
    /// The module that returned just before it in that step (its producer, for a forward
    /// output), when there is one.
    pub producer: Option<String>,
    /// How many series part at that step.
    pub parting_series: usize,
}

/// Two monitor runs compared.
#[derive(Debug, Clone)]
pub struct TrendRun {
    /// The benchmark folder.
    pub bench: PathBuf,
    /// The comparison folder.
    pub cmp: PathBuf,
    /// The ranks compared.
    pub ranks: Vec<u32>,
    /// Steps both runs have (the most over ranks).
    pub steps: usize,
    /// Calibration steps (0: an envelope was given).
    pub window: usize,
    /// Every series, parting ones first (by step, then data flow), then the rest.
    pub series: Vec<SeriesResult>,
    /// Where the runs part.
    pub parting: Option<Parting>,
    /// What the html report draws.
    pub curves: Vec<Curve>,
    /// Ranks in one run only.
    pub unpaired: usize,
    /// Series (module, metric) of the compared ranks that one run lacks: not compared.
    pub one_side: OneSide,
    /// What was left out or doubtful.
    pub warnings: Vec<String>,
}

/// How many series of the ranks compared are in one run only (a module or a metric the
/// other lacks), so not compared.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct OneSide {
    /// In the benchmark only.
    pub bench: usize,
    /// In the comparison only.
    pub cmp: usize,
}

/// The relative difference of two stored values (see the module doc).
pub(crate) fn difference(a: f64, b: f64, atol: f64) -> f64 {
    match (present(a), present(b)) {
        (None, None) => 0.0,
        (None, Some(_)) | (Some(_), None) => f64::INFINITY,
        (Some(a), Some(b)) => {
            if a == b || (a.is_nan() && b.is_nan()) {
                0.0
            } else if !a.is_finite() || !b.is_finite() {
                f64::INFINITY
            } else {
                (a - b).abs() / a.abs().max(b.abs()).max(atol)
            }
        }
    }
}

/// A thousandth of the typical size of a series on its first `n` steps (the median of the
/// larger magnitude of the two runs).
fn atol(a: &[f64], b: &[f64], n: usize) -> f64 {
    let mut m: Vec<f64> = a
        .iter()
        .zip(b)
        .take(n)
        .filter_map(|(&x, &y)| Some(present(x)?.abs().max(present(y)?.abs())))
        .filter(|v| v.is_finite())
        .collect();
    if m.is_empty() {
        return 0.0;
    }
    m.sort_by(f64::total_cmp);
    m[m.len() / 2] * 1e-3
}

/// One rank's pair of files, on the steps, modules and metrics both have.
struct RankPair<'a> {
    sides: Sides<&'a RankSeries>,
    /// Step indices into each side, for the steps both have.
    steps: Vec<(usize, usize)>,
    /// For each benchmark module, the comparison's index of the same name.
    modules: Vec<Option<usize>>,
    /// For each benchmark metric, the comparison's index of the same name.
    metrics: Vec<Option<usize>>,
}

impl<'a> RankPair<'a> {
    fn new(bench: &'a RankSeries, cmp: &'a RankSeries) -> RankPair<'a> {
        let steps = bench
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| cmp.steps.binary_search(s).ok().map(|j| (i, j)))
            .collect();
        let index: std::collections::HashMap<&str, usize> = cmp
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.as_str(), i))
            .collect();
        RankPair {
            sides: Sides { bench, cmp },
            steps,
            modules: bench
                .modules
                .iter()
                .map(|m| index.get(m.as_str()).copied())
                .collect(),
            metrics: bench.metrics.iter().map(|m| cmp.metric(m)).collect(),
        }
    }

    /// A series of both sides on the shared steps, by the benchmark's metric and module
    /// indices (None: the comparison lacks one of them).
    fn values_at(&self, metric: usize, module: usize) -> Option<(Vec<f64>, Vec<f64>)> {
        let (b, c) = (self.sides.bench, self.sides.cmp);
        let bs = b.series(metric, module);
        let cs = c.series(self.metrics[metric]?, self.modules[module]?);
        Some((
            self.steps.iter().map(|&(i, _)| bs[i]).collect(),
            self.steps.iter().map(|&(_, j)| cs[j]).collect(),
        ))
    }

    /// The series of each side the other lacks (modules times metrics, less the pairs),
    /// and a note naming a few of the modules and metrics they are of.
    fn one_side(&self) -> (OneSide, Option<String>) {
        let (b, c) = (self.sides.bench, self.sides.cmp);
        let modules = self.modules.iter().flatten().count();
        let metrics = self.metrics.iter().flatten().count();
        let shared = modules * metrics;
        let counts = OneSide {
            bench: b.modules.len() * b.metrics.len() - shared,
            cmp: c.modules.len() * c.metrics.len() - shared,
        };
        if counts.bench + counts.cmp == 0 {
            return (counts, None);
        }
        // The names one side has and the other lacks, a few of each.
        let only = |names: &[String], other: &dyn Fn(&str) -> bool| -> String {
            let missing: Vec<&String> = names.iter().filter(|n| !other(n)).collect();
            let shown: Vec<String> = missing.iter().take(3).map(|n| format!("{n:?}")).collect();
            let more = missing.len().saturating_sub(3);
            match (shown.is_empty(), more) {
                (true, _) => "none".into(),
                (false, 0) => shown.join(", "),
                (false, more) => format!("{} and {more} more", shown.join(", ")),
            }
        };
        let side = |r: &RankSeries, o: &RankSeries| {
            format!(
                "modules {}; metrics {}",
                only(&r.modules, &|n| o.module(n).is_some()),
                only(&r.metrics, &|n| o.metric(n).is_some())
            )
        };
        let note = format!(
            "rank {}: {} series in the benchmark only ({}), {} in the comparison only ({}): not compared",
            b.rank,
            counts.bench,
            side(b, c),
            counts.cmp,
            side(c, b)
        );
        (counts, Some(note))
    }

    /// A series of both sides on the shared steps, by name.
    fn values(&self, metric: &str, module: &str) -> Option<(Vec<f64>, Vec<f64>)> {
        let b = self.sides.bench;
        self.values_at(b.metric(metric)?, b.module(module)?)
    }
}

/// Judges one series.
fn judge(
    pair: &RankPair<'_>,
    module: usize,
    metric: usize,
    window: usize,
    opts: &TrendOptions,
) -> Option<SeriesResult> {
    let b = pair.sides.bench;
    let name = &b.modules[module];
    let (x, y) = pair.values_at(metric, module)?;
    let metric = b.metrics[metric].as_str();
    let tol = atol(&x, &y, window.max(20));
    let d: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&a, &c)| difference(a, c, tol))
        .collect();
    let calibrated =
        (opts.envelope.is_none()).then(|| d[..window].iter().copied().fold(0.0, f64::max));
    let envelope = opts
        .envelope
        .unwrap_or_else(|| (opts.k * calibrated.unwrap_or(0.0)).max(FLOOR));
    // The envelope follows the drift: at each step it is at least k times the largest
    // difference of the steps before (a drift that grows step by step, as a lower
    // precision's does, stays inside; a jump of more than k times does not).
    let mut seen = calibrated.unwrap_or(0.0);
    let mut first = None;
    let mut worst_ratio = 0.0f64;
    let mut parted_beyond = None;
    for (t, &dt) in d.iter().enumerate().skip(window) {
        let bound = if opts.envelope.is_some() {
            envelope
        } else {
            envelope.max(opts.k * seen)
        };
        if dt > bound && first.is_none() {
            first = Some(t);
            parted_beyond = Some(bound);
        }
        worst_ratio = worst_ratio.max(dt / bound);
        seen = seen.max(dt);
    }
    let step_of = |t: usize| b.steps[pair.steps[t].0];
    Some(SeriesResult {
        rank: b.rank,
        module: name.clone(),
        metric: metric.to_string(),
        envelope: parted_beyond.unwrap_or(envelope),
        calibrated,
        parts_at: first.map(step_of),
        bench: first.and_then(|t| present(x[t])),
        cmp: first.and_then(|t| present(y[t])),
        difference: first.map(|t| d[t]),
        worst_ratio,
        flow: first.map_or((u8::MAX, 0), |t| {
            flow(metric, module_order(b, module, pair.steps[t].0))
        }),
    })
}

/// What one rank pair gave: its judged series and what it says of itself.
struct PairOutcome {
    rank: u32,
    /// Steps both files have.
    steps: usize,
    /// Its calibration steps.
    window: usize,
    series: Vec<SeriesResult>,
    one_side: OneSide,
    notes: Vec<String>,
}

/// The calibration steps of a pair sharing `steps` steps.
fn window_for(opts: &TrendOptions, steps: usize) -> usize {
    match (opts.envelope, opts.calibration_steps) {
        (Some(_), _) => 0,
        (None, Some(w)) => w,
        (None, None) => default_window(steps),
    }
}

/// Reads one rank's two files.
fn read_pair(rank: u32, paths: Sides<&Path>) -> Result<Sides<RankSeries>> {
    let (bench, cmp) = rayon::join(
        || read_rank(paths.bench, rank),
        || read_rank(paths.cmp, rank),
    );
    Ok(Sides {
        bench: bench?,
        cmp: cmp?,
    })
}

/// Reads and judges one rank pair.
fn judge_rank(rank: u32, paths: Sides<&Path>, opts: &TrendOptions) -> Result<PairOutcome> {
    let files = read_pair(rank, paths)?;
    let pair = RankPair::new(&files.bench, &files.cmp);
    let mut notes: Vec<String> = [&files.bench, &files.cmp]
        .iter()
        .filter_map(|r| r.cut_short_note())
        .collect();
    let (one_side, note) = pair.one_side();
    notes.extend(note);
    let steps = pair.steps.len();
    let window = window_for(opts, steps);
    let mut series = Vec::new();
    if steps <= window {
        notes.push(format!(
            "rank {rank}: {steps} shared steps, within the calibration steps: not judged"
        ));
    } else {
        let b = pair.sides.bench;
        for m in 0..b.modules.len() {
            for k in 0..b.metrics.len() {
                series.extend(judge(&pair, m, k, window, opts));
            }
        }
    }
    Ok(PairOutcome {
        rank,
        steps,
        window,
        series,
        one_side,
        notes,
    })
}

/// The ranks of both folders paired by rank number; the unpaired said.
fn pair_ranks(
    files: Sides<Vec<(u32, PathBuf)>>,
    warnings: &mut Vec<String>,
) -> Vec<(u32, Sides<PathBuf>)> {
    let mut pairs = Vec::new();
    for (rank, b) in &files.bench {
        match files.cmp.iter().find(|(r, _)| r == rank) {
            Some((_, c)) => pairs.push((
                *rank,
                Sides {
                    bench: b.clone(),
                    cmp: c.clone(),
                },
            )),
            None => warnings.push(format!("rank {rank}: in the benchmark only")),
        }
    }
    for (rank, _) in &files.cmp {
        if !files.bench.iter().any(|(r, _)| r == rank) {
            warnings.push(format!("rank {rank}: in the comparison only"));
        }
    }
    pairs
}

/// Compares two monitor folders, rank pair by rank pair (in parallel; a pair's files are
/// read, judged and dropped, so memory holds the pairs being judged, not the job).
pub fn compare(roots: Sides<&Path>, opts: &TrendOptions) -> Result<TrendRun> {
    use rayon::prelude::*;
    let files = Sides {
        bench: files(roots.bench)?,
        cmp: files(roots.cmp)?,
    };
    let mut warnings = Vec::new();
    let ranks = files.bench.len() + files.cmp.len();
    let pairs = pair_ranks(files, &mut warnings);
    let unpaired = ranks - 2 * pairs.len();
    let outcomes = pairs
        .par_iter()
        .map(|(rank, p)| judge_rank(*rank, p.as_ref().map(PathBuf::as_path), opts))
        .collect::<Result<Vec<_>>>()?;
    let shared: Vec<&PairOutcome> = outcomes.iter().filter(|o| o.steps > 0).collect();
    let steps = shared.iter().map(|o| o.steps).max().unwrap_or(0);
    if shared.is_empty() {
        return Err(ProbeError::NothingComparable(
            "the two monitor runs share no rank and step".into(),
        ));
    }
    if shared.iter().all(|o| o.steps <= o.window) {
        let window = window_for(opts, steps);
        return Err(ProbeError::NothingComparable(format!(
            "the runs share {steps} steps: too few to calibrate an envelope on the first {window} and judge the rest (give --envelope, or monitor more steps)"
        )));
    }
    let window = shared
        .iter()
        .filter(|o| o.steps > o.window)
        .map(|o| o.window)
        .max()
        .unwrap_or(0);
    let judged_ranks = shared.iter().map(|o| o.rank).collect();
    let mut series = Vec::new();
    let mut one_side = OneSide::default();
    for o in outcomes {
        warnings.extend(o.notes);
        series.extend(o.series);
        one_side.bench += o.one_side.bench;
        one_side.cmp += o.one_side.cmp;
    }
    // Ranks and steps in common but no (module, metric): nothing was compared, which is
    // not a pass.
    if series.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "the two monitor runs share no series (no module with a metric of the same name in both): {} series in the benchmark only, {} in the comparison only",
            one_side.bench, one_side.cmp
        )));
    }
    note_early_differences(&series, window, &mut warnings);
    // At one place in the flow (a container sits where the last module inside it does),
    // the innermost module is the more precise answer.
    series.sort_by_key(|s| {
        (
            s.parts_at.is_none(),
            s.parts_at,
            s.flow,
            s.rank,
            std::cmp::Reverse(super::depth(&s.module)),
        )
    });
    // The rank drawn (the one that parts, else the first) is read once more.
    let first = series.first().filter(|s| s.parts_at.is_some());
    let drawn = first.map_or(pairs[0].0, |s| s.rank);
    let (parting, curves) = match pairs.iter().find(|(r, _)| *r == drawn) {
        Some((rank, p)) => {
            let files = read_pair(*rank, p.as_ref().map(PathBuf::as_path))?;
            let pair = RankPair::new(&files.bench, &files.cmp);
            let parting = first.and_then(|s| parting(s, &series, &pair));
            let curves = curves(&pair, parting.as_ref());
            (parting, curves)
        }
        None => (None, Vec::new()),
    };
    Ok(TrendRun {
        bench: roots.bench.to_path_buf(),
        cmp: roots.cmp.to_path_buf(),
        ranks: judged_ranks,
        steps,
        window,
        series,
        parting,
        curves,
        unpaired,
        one_side,
        warnings,
    })
}

/// Says when the runs' loss differs much already on the calibration steps: the envelope
/// then allows that much, and a later parting smaller than it is not seen.
fn note_early_differences(series: &[SeriesResult], window: usize, warnings: &mut Vec<String>) {
    let early = series
        .iter()
        .filter(|s| s.module.is_empty() && s.metric == "loss")
        .filter_map(|s| Some((s.rank, s.calibrated?)))
        .filter(|&(_, c)| c > 1e-2)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((rank, c)) = early {
        warnings.push(format!(
            "rank {rank}: the losses differ by up to {c:.1e} (relative) on the first {window} steps already: the envelope allows that much; if the runs should agree there, compare the configurations (probe config-check)"
        ));
    } // A value on one side only (a module one run never calls) on the calibration steps
      // makes an infinite envelope: such a series is never judged, and that is said.
    let unjudged: Vec<&SeriesResult> = series
        .iter()
        .filter(|s| s.calibrated == Some(f64::INFINITY))
        .collect();
    if let Some(s) = unjudged.first() {
        warnings.push(format!(
            "{} series differ without measure on the first {window} steps (a value on one side only, or NaN/Inf on one side), e.g. rank {} {} {}: not judged",
            unjudged.len(),
            s.rank,
            module_label(&s.module),
            s.metric
        ));
    }
}

/// The series named where the runs part (the sort put it first), with its context from its
/// rank's pair.
fn parting(first: &SeriesResult, series: &[SeriesResult], pair: &RankPair<'_>) -> Option<Parting> {
    let step = first.parts_at?;
    let b = pair.sides.bench;
    let at = pair.steps.iter().position(|&(i, _)| b.steps[i] == step)?;
    let previous_step = at.checked_sub(1).map(|t| b.steps[pair.steps[t].0]);
    let producer = b
        .module(&first.module)
        .and_then(|m| producer(b, m, pair.steps[at].0));
    Some(Parting {
        step,
        previous_step,
        series: first.clone(),
        producer,
        parting_series: series.iter().filter(|s| s.parts_at == Some(step)).count(),
    })
}

/// The curves the html report draws: the model's loss, gradient norm, learning rate and
/// update norm, and every metric of the module named, on the rank that parts (else the
/// first rank): `pair`.
fn curves(pair: &RankPair<'_>, parting: Option<&Parting>) -> Vec<Curve> {
    let b = pair.sides.bench;
    let steps: Vec<i64> = pair.steps.iter().map(|&(i, _)| b.steps[i]).collect();
    let mark = parting.map(|p| p.step);
    let mut wanted: Vec<(String, String)> = ["loss", "grad_norm", "lr", "update_norm"]
        .iter()
        .map(|m| (String::new(), m.to_string()))
        .collect();
    if let Some(p) = parting.filter(|p| !p.series.module.is_empty()) {
        wanted.extend(
            b.metrics
                .iter()
                .map(|m| (p.series.module.clone(), m.clone())),
        );
    }
    wanted
        .into_iter()
        .filter_map(|(module, metric)| {
            let (x, y) = pair.values(&metric, &module)?;
            // A metric a module never has (the loss on a layer's row) draws nothing.
            if x.iter().chain(&y).all(|&v| present(v).is_none()) {
                return None;
            }
            Some(curve(
                format!("rank {} {} {metric}", b.rank, module_label(&module)),
                &steps,
                vec![("benchmark".into(), x), ("comparison".into(), y)],
                mark,
            ))
        })
        .collect()
}
