//! Reports of a compare: the JSON summary (the CI contract, `schemas/`), the parquet table,
//! the xlsx workbook and the terminal summary.
//!
//! Every file format implements [`ReportWriter`]; adding one means one new file here and
//! one line in [`writers`]. Files are written atomically (see [`crate::atomic`]).

mod json;
mod parquet;
pub(crate) mod xlsx;

use crate::compare::CompareResult;
use crate::error::Result;
use crate::localize::{ByDirection, Finding, Findings};
use crate::tolerance::Verdict;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

pub use json::JsonSummary;
pub use parquet::ParquetTable;
pub use xlsx::XlsxWorkbook;

/// A report format.
pub trait ReportWriter: Sync {
    /// The format's name on the command line (`--format`).
    fn format(&self) -> &'static str;
    /// The file written into the output folder.
    fn file_name(&self) -> &'static str;
    /// Writes the report to `path` (atomically).
    fn write(&self, result: &CompareResult, summary: &Summary, path: &Path) -> Result<()>;
}

/// All report formats, in the order they are written.
pub fn writers() -> Vec<Box<dyn ReportWriter>> {
    vec![
        Box::new(JsonSummary),
        Box::new(ParquetTable),
        Box::new(XlsxWorkbook),
    ]
}

/// The numeric columns of a tensor row, shared by the tabular reports so they cannot drift
/// apart: (parquet column, xlsx header). msprobe's metric columns first, then probe's.
pub const NUMBER_COLUMNS: [(&str, &str); 27] = [
    ("cosine", "Cosine"),
    ("euclidean", "EucDist"),
    ("max_abs_err", "MaxAbsErr"),
    ("max_rel_err", "MaxRelativeErr"),
    ("one_thousandth_ratio", "One Thousandth Err Ratio"),
    ("five_thousandths_ratio", "Five Thousandths Err Ratio"),
    ("mean_abs_err", "MeanAbsErr"),
    ("rel_l2", "RelL2Err"),
    ("max_abs_scaled", "MaxAbsErr / max|bench|"),
    ("err", "Error (smallest passing tolerance)"),
    ("tolerance", "Tolerance"),
    ("bench_max", "Bench Max"),
    ("bench_min", "Bench Min"),
    ("bench_mean", "Bench Mean"),
    ("bench_norm", "Bench L2norm"),
    ("cmp_max", "Cmp Max"),
    ("cmp_min", "Cmp Min"),
    ("cmp_mean", "Cmp Mean"),
    ("cmp_norm", "Cmp L2norm"),
    ("max_diff", "Max diff"),
    ("min_diff", "Min diff"),
    ("mean_diff", "Mean diff"),
    ("norm_diff", "L2norm diff"),
    ("max_rel_diff_pct", "MaxRelativeErr(%)"),
    ("min_rel_diff_pct", "MinRelativeErr(%)"),
    ("mean_rel_diff_pct", "MeanRelativeErr(%)"),
    ("norm_rel_diff_pct", "NormRelativeErr(%)"),
];

/// The values of [`NUMBER_COLUMNS`] for one row (None: not applicable).
pub fn number_values(r: &crate::compare::Row) -> [Option<f64>; 27] {
    let m = r.metrics;
    let sd = r.stat_diff();
    let st = |s: &Option<crate::dump::Stats>| match s {
        Some(s) => [s.max, s.min, s.mean, s.norm],
        None => [None; 4],
    };
    let [bmax, bmin, bmean, bnorm] = st(&r.stats_b);
    let [cmax, cmin, cmean, cnorm] = st(&r.stats_c);
    [
        m.and_then(|m| m.cosine),
        m.map(|m| m.euclid),
        m.map(|m| m.max_abs),
        m.map(|m| m.max_rel),
        m.map(|m| m.one_thousandth),
        m.map(|m| m.five_thousandths),
        m.map(|m| m.mean_abs),
        m.map(|m| m.rel_l2),
        m.map(|m| m.max_abs_scaled),
        Some(r.err),
        Some(r.tol_error),
        bmax,
        bmin,
        bmean,
        bnorm,
        cmax,
        cmin,
        cmean,
        cnorm,
        sd.and_then(|d| d.max_diff),
        sd.and_then(|d| d.min_diff),
        sd.and_then(|d| d.mean_diff),
        sd.and_then(|d| d.norm_diff),
        sd.and_then(|d| d.max_rel_pct),
        sd.and_then(|d| d.min_rel_pct),
        sd.and_then(|d| d.mean_rel_pct),
        sd.and_then(|d| d.norm_rel_pct),
    ]
}

/// When the gate fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FailOn {
    Error,
    Warning,
    Never,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Counts {
    pub pairs: usize,
    pub ops: usize,
    pub tensors: usize,
    pub pass: usize,
    pub warning: usize,
    pub error: usize,
    pub unmatched_bench: usize,
    pub unmatched_cmp: usize,
    pub compared_by: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PairSummary {
    pub step: String,
    pub rank: String,
    pub bench: String,
    pub cmp: String,
    pub tensors: usize,
    pub errors: usize,
    pub warnings: usize,
    pub unmatched: usize,
    pub findings: Findings,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorstOp {
    pub step: String,
    pub rank: String,
    pub seq: u64,
    pub op: String,
    pub verdict: Verdict,
    /// The largest judged error among the op's tensors (null when infinite).
    pub err: Option<f64>,
    pub tensor: String,
    pub reason: String,
}

/// The content of `summary.json` (schemas/probe-compare-summary.v1.schema.json).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub format: &'static str,
    pub version: u32,
    pub verdict: Verdict,
    pub fail_on: FailOn,
    pub exit_code: u8,
    pub headline: String,
    pub bench: String,
    pub cmp: String,
    pub counts: Counts,
    pub first_divergent: ByDirection,
    pub earliest_failing: ByDirection,
    pub external_source: ByDirection,
    pub first_nonfinite: Option<Finding>,
    pub pairs: Vec<PairSummary>,
    pub worst_ops: Vec<WorstOp>,
    pub warnings: Vec<String>,
    pub outputs: BTreeMap<String, String>,
}

/// The first finding over pairs (pairs are in step, rank order).
fn first_of(findings: &[Findings], pick: impl Fn(&Findings) -> &ByDirection) -> ByDirection {
    let mut out = ByDirection::default();
    for f in findings {
        let b = pick(f);
        if out.forward.is_none() {
            out.forward = b.forward.clone();
        }
        if out.backward.is_none() {
            out.backward = b.backward.clone();
        }
    }
    out
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

impl Summary {
    pub fn build(
        res: &CompareResult,
        findings: &[Findings],
        bench: &Path,
        cmp: &Path,
        fail_on: FailOn,
    ) -> Summary {
        let mut c = Counts {
            pairs: res.pairs.len(),
            ops: res.pairs.iter().map(|p| p.ops).sum(),
            tensors: res.rows.len(),
            ..Counts::default()
        };
        for r in &res.rows {
            match r.verdict {
                Verdict::Pass => c.pass += 1,
                Verdict::Warning => c.warning += 1,
                Verdict::Error => c.error += 1,
            }
            *c.compared_by.entry(r.kind.name().to_string()).or_default() += 1;
        }
        for u in &res.unmatched {
            match u.side {
                crate::compare::Side::Bench => c.unmatched_bench += 1,
                crate::compare::Side::Cmp => c.unmatched_cmp += 1,
            }
        }
        let verdict = if c.error > 0 {
            Verdict::Error
        } else if c.warning > 0 || c.unmatched_bench + c.unmatched_cmp > 0 {
            Verdict::Warning
        } else {
            Verdict::Pass
        };
        let exit_code = if res.rows.is_empty() {
            3
        } else {
            match fail_on {
                FailOn::Error if verdict == Verdict::Error => 1,
                FailOn::Warning if verdict >= Verdict::Warning => 1,
                _ => 0,
            }
        };
        let first_divergent = first_of(findings, |f| &f.first_divergent);
        let earliest_failing = first_of(findings, |f| &f.earliest_failing);
        let external_source = first_of(findings, |f| &f.external_source);
        let first_nonfinite = findings.iter().find_map(|f| f.first_nonfinite.clone());
        let pairs: Vec<PairSummary> = res
            .pairs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let rows = res.rows.iter().filter(|r| r.pair == i);
                let (mut errors, mut warnings, mut tensors) = (0, 0, 0);
                for r in rows {
                    tensors += 1;
                    errors += (r.verdict == Verdict::Error) as usize;
                    warnings += (r.verdict == Verdict::Warning) as usize;
                }
                PairSummary {
                    step: p.step.clone(),
                    rank: p.rank.clone(),
                    bench: p.bench_dir.display().to_string(),
                    cmp: p.cmp_dir.display().to_string(),
                    tensors,
                    errors,
                    warnings,
                    unmatched: res.unmatched.iter().filter(|u| u.pair == i).count(),
                    findings: findings.get(i).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let headline = headline(verdict, &c, &pairs);
        Summary {
            format: "probe-compare-summary",
            version: 1,
            verdict,
            fail_on,
            exit_code,
            headline,
            bench: bench.display().to_string(),
            cmp: cmp.display().to_string(),
            counts: c,
            first_divergent,
            earliest_failing,
            external_source,
            first_nonfinite,
            pairs,
            worst_ops: worst_ops(res, 20),
            warnings: res.warnings.clone(),
            outputs: BTreeMap::new(),
        }
    }
}

fn headline(verdict: Verdict, c: &Counts, pairs: &[PairSummary]) -> String {
    if c.tensors == 0 {
        return "NOTHING COMPARABLE: no tensor is present on both sides".into();
    }
    match verdict {
        Verdict::Pass => format!("PASS: all {} tensors within tolerance", c.tensors),
        Verdict::Warning => format!(
            "WARNING: no tensor out of tolerance; {} warnings, {} unmatched tensors",
            c.warning,
            c.unmatched_bench + c.unmatched_cmp
        ),
        Verdict::Error => {
            // The earliest step/rank with an error tells the story; later steps inherit it
            // (a diverged update in step 0 is "different weights" in step 1).
            let Some(p) = pairs.iter().find(|p| p.errors > 0) else {
                return format!("DIVERGENCE: {} tensors out of tolerance", c.error);
            };
            let f = &p.findings;
            let mut cands: Vec<(bool, &Finding)> = [
                (true, &f.external_source.forward),
                (false, &f.first_divergent.forward),
                (false, &f.first_divergent.backward),
                (true, &f.external_source.backward),
            ]
            .into_iter()
            .filter_map(|(ext, x)| x.as_ref().map(|x| (ext, x)))
            .collect();
            cands.sort_by_key(|(_, x)| x.seq);
            match cands.first() {
                Some((true, e)) => format!(
                    "DIVERGENCE enters from outside the captured ops: {} (input of {}, {}/{})",
                    e.tensor, e.op, e.step, e.rank
                ),
                Some((false, x)) => format!(
                    "DIVERGENCE: first divergent op {} ({} {}/{}, tensor {})",
                    x.op,
                    x.direction.name(),
                    x.step,
                    x.rank,
                    x.tensor
                ),
                None => {
                    let first = f
                        .earliest_failing
                        .forward
                        .as_ref()
                        .or(f.earliest_failing.backward.as_ref());
                    format!(
                        "DIVERGENCE in {}/{}: no single op is locally divergent (accumulated drift); \
                         earliest failing op {}",
                        p.step,
                        p.rank,
                        first.map_or("?", |x| x.op.as_str())
                    )
                }
            }
        }
    }
}

/// The ops with the worst verdicts and errors, for people who start reading at the top.
fn worst_ops(res: &CompareResult, k: usize) -> Vec<WorstOp> {
    let mut best: BTreeMap<(usize, usize), &crate::compare::Row> = BTreeMap::new();
    for r in &res.rows {
        if r.verdict == Verdict::Pass {
            continue;
        }
        let e = best.entry((r.pair, r.op_index)).or_insert(r);
        if r.verdict.cmp(&e.verdict).then(r.err.total_cmp(&e.err)) == std::cmp::Ordering::Greater {
            *e = r;
        }
    }
    let mut v: Vec<&crate::compare::Row> = best.into_values().collect();
    v.sort_by(|a, b| {
        b.verdict
            .cmp(&a.verdict)
            .then(b.err.total_cmp(&a.err))
            .then((a.pair, a.seq).cmp(&(b.pair, b.seq)))
    });
    v.into_iter()
        .take(k)
        .map(|r| WorstOp {
            step: res.pairs[r.pair].step.clone(),
            rank: res.pairs[r.pair].rank.clone(),
            seq: r.seq,
            op: r.op.clone(),
            verdict: r.verdict,
            err: finite(r.err),
            tensor: r.name.clone(),
            reason: r.reason.clone(),
        })
        .collect()
}

/// The short human summary printed on stdout.
pub fn terminal_summary(s: &Summary) -> String {
    let mut out = String::new();
    let c = &s.counts;
    out += &format!("{}\n", s.headline);
    out += &format!(
        "  {} tensors in {} ops ({} step/rank pairs): {} pass, {} warning, {} error; unmatched: {} bench-only, {} cmp-only\n",
        c.tensors, c.ops, c.pairs, c.pass, c.warning, c.error, c.unmatched_bench, c.unmatched_cmp
    );
    let show = |out: &mut String, title: &str, f: &Finding| {
        *out += &format!(
            "{title}: {} ({}/{}, seq {})\n    {}\n",
            f.op, f.step, f.rank, f.seq, f.explanation
        );
        for e in f.evidence.iter().take(8) {
            *out += &format!("      {e}\n");
        }
        if let Some(top) = f.stack.last() {
            *out += &format!("    at {top}\n");
        }
    };
    if let Some(f) = &s.external_source.forward {
        show(&mut out, "  divergence enters from outside (forward)", f);
    }
    if let Some(f) = &s.first_divergent.forward {
        show(&mut out, "  first divergent op (forward)", f);
    }
    if let Some(f) = &s.first_divergent.backward {
        show(&mut out, "  first divergent op (backward)", f);
    }
    if let Some(f) = &s.first_nonfinite {
        show(&mut out, "  first NaN/Inf producer", f);
    }
    if s.verdict == Verdict::Error && s.first_divergent.forward.is_none() {
        if let Some(f) = &s.earliest_failing.forward {
            out += &format!("  earliest failing op (forward): {} ({})\n", f.op, f.reason);
        }
    }
    for w in s.warnings.iter().take(5) {
        out += &format!("  note: {w}\n");
    }
    for (k, v) in &s.outputs {
        out += &format!("  {k}: {v}\n");
    }
    out
}
