//! The kinds of run the reports render: a compare ([`CompareDocument`]) and a scan
//! ([`ScanDocument`]), each a [`Document`]: its summary, its overview for people and its
//! tables.

use super::columns::{self, Line, COLUMNS, SCAN, UNMATCHED};
use super::plot;
use super::{compare_findings, CopyPlan, Document, Listed, OpLine, Overview, Point, Table};
use crate::compare::{op_groups, CompareRun, Row, UnitSummary, Verdict};
use crate::error::Result as ProbeResult;
use crate::metrics::Metrics;
use crate::scan::{ScanRun, ScanSummary};
use crate::schema::summary::{Finding, Summary};
use crate::verdict;
use crate::vocab::FindingKind;
use std::sync::Mutex;

/// A compare and its summary.
pub struct CompareDocument<'a> {
    /// The compare.
    pub run: &'a CompareRun,
    /// Its summary (outputs filled in).
    pub summary: &'a Summary,
    /// The overview, made once for every writer that asks (a pass over every row).
    overview: Mutex<Option<Overview>>,
    /// Where the parquet table's row groups already are (a merge's shards), if anywhere.
    copy: Option<CopyPlan>,
}

impl<'a> CompareDocument<'a> {
    /// The document of `run` with its summary.
    pub fn new(run: &'a CompareRun, summary: &'a Summary) -> CompareDocument<'a> {
        CompareDocument {
            run,
            summary,
            overview: Mutex::new(None),
            copy: None,
        }
    }

    /// The same document, whose parquet table is copied from the row groups of `plan`.
    pub(crate) fn with_parquet_copy(self, plan: Option<CopyPlan>) -> CompareDocument<'a> {
        CompareDocument { copy: plan, ..self }
    }

    fn make_overview(&self) -> ProbeResult<Overview> {
        let s = self.summary;
        let c = &s.counts;
        let facts = [
            ("exit code", s.exit_code.to_string()),
            ("benchmark (-b)", s.bench.clone()),
            ("comparison (-c)", s.cmp.clone()),
            ("step/rank pairs", c.pairs.to_string()),
            ("ops (comparison side)", c.ops.to_string()),
            ("tensors compared", c.tensors.to_string()),
            (
                "pass / warning / error",
                format!("{} / {} / {}", c.pass, c.warning, c.error),
            ),
            (
                "only in bench / only in cmp",
                format!(
                    "{} / {} ({:.1}% / {:.1}% of each side's tensors; at most {:.1}% allowed)",
                    c.unmatched_bench,
                    c.unmatched_cmp,
                    100.0 * s.unmatched_fraction.bench,
                    100.0 * s.unmatched_fraction.cmp,
                    100.0 * s.max_unmatched
                ),
            ),
        ];
        let found = compare_findings(s, true);
        // One pass over the rows for the per-op table and the chart, whose culprit is the
        // op the headline names.
        let mut ops = OpLines::new(OP_LINES);
        let mut chart = plot::Gather::new(self.run, verdict::culprit(s), plot::MAX_POINTS);
        self.run.tables.visit_rows(|i, rows| {
            let u = &self.run.units[i];
            ops.unit(u, rows);
            chart.unit(u, rows);
            Ok(())
        })?;
        let plot = chart.finish();
        Ok(Overview {
            verdict: s.verdict.severity(),
            headline: s.headline.clone(),
            facts: facts.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            findings: found,
            plot: Some(plot),
            worst_ops: s.worst_ops.clone(),
            ops: ops.out,
            ops_left_out: ops.left_out,
        })
    }
}

/// A scan and its summary.
pub struct ScanDocument<'a> {
    /// The scan.
    pub run: &'a ScanRun,
    /// Its summary (outputs filled in).
    pub summary: &'a ScanSummary,
}

/// At most this many ops in the per-op table of the workbook's summary sheet.
const OP_LINES: usize = 5000;

/// The first `cap` ops in execution order with their worst cosine, max abs error and
/// verdict, and the row of their first tensor in the `tensors` sheet(s); and how many ops
/// were left out past the cap. Gathered unit by unit.
struct OpLines {
    out: Vec<OpLine>,
    left_out: usize,
    /// Index among all tensor lines, as the tensors table holds them.
    line: usize,
    cap: usize,
}

impl OpLines {
    fn new(cap: usize) -> OpLines {
        OpLines {
            out: Vec::new(),
            left_out: 0,
            line: 0,
            cap,
        }
    }

    fn unit(&mut self, u: &UnitSummary, rows: &[Row]) {
        for op in op_groups(rows) {
            let lines = self.line..self.line + op.len();
            self.line += op.len();
            let Some(first) = op.first() else { continue };
            if self.out.len() >= self.cap {
                self.left_out += 1;
                continue;
            }
            // The op's lowest cosine and largest absolute error among its tensors.
            let metric = |get: fn(&Metrics) -> Option<f64>, pick: fn(f64, f64) -> f64| {
                op.iter()
                    .filter_map(|r| r.tensor.metrics.as_deref().and_then(get))
                    .reduce(pick)
            };
            self.out.push(OpLine {
                place: format!("{}/{}", u.step, u.rank),
                op: first.tensor.op.key.to_string(),
                verdict: op
                    .iter()
                    .map(|r| r.judgement.verdict)
                    .fold(first.judgement.verdict, Verdict::max),
                cosine: metric(|m| m.cosine, f64::min),
                max_abs: metric(|m| Some(m.max_abs), f64::max),
                lines,
            });
        }
    }
}

/// A summary as `summary.json` holds it.
fn pretty(summary: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string_pretty(summary).map_err(|e| e.to_string())
}

/// Listed findings of a scan (untyped but for its first NaN/Inf producers).
fn listed<'a>(
    list: impl IntoIterator<Item = (&'a str, Option<FindingKind>, &'a Option<Finding>)>,
) -> Vec<Listed> {
    list.into_iter()
        .filter_map(|(t, kind, f)| {
            f.as_ref().map(|f| Listed {
                title: t.to_string(),
                kind,
                finding: f.clone(),
            })
        })
        .collect()
}

impl Document for CompareDocument<'_> {
    fn stem(&self) -> &'static str {
        "compare"
    }

    fn summary_json(&self) -> Result<String, String> {
        pretty(self.summary)
    }

    fn overview(&self) -> ProbeResult<Overview> {
        // One writer makes it while the others wait; a failure is not kept (the next asks
        // again and meets it too).
        let mut cached = self.overview.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = cached.as_ref() {
            return Ok(o.clone());
        }
        let o = self.make_overview()?;
        *cached = Some(o.clone());
        Ok(o)
    }

    fn table(&self) -> Table<'_> {
        Table {
            name: "tensors",
            columns: COLUMNS.iter().collect(),
            colour_by: "verdict",
            lines: Box::new(|f| columns::lines(self.run, f)),
            flagged: None,
        }
    }

    fn parquet_copy(&self) -> Option<&CopyPlan> {
        self.copy.as_ref()
    }

    fn cases(&self) -> Option<Vec<super::junit::Case>> {
        Some(super::junit::compare_cases(self.summary))
    }

    fn sheets(&self) -> Vec<Table<'_>> {
        vec![
            Table {
                name: "tensors",
                columns: COLUMNS.iter().collect(),
                colour_by: "verdict",
                lines: Box::new(|f| columns::tensor_lines(self.run, f)),
                flagged: Some(
                    |l| matches!(l, Line::Tensor(_, r) if r.judgement.verdict != Verdict::Pass),
                ),
            },
            Table {
                name: "unmatched",
                columns: UNMATCHED.iter().collect(),
                colour_by: "only_in",
                lines: Box::new(|f| columns::unmatched_lines(self.run, f)),
                flagged: None,
            },
        ]
    }

    fn points(&self, f: &mut dyn FnMut(Point<'_>) -> ProbeResult<()>) -> ProbeResult<()> {
        self.run.tables.visit_rows(|i, rows| {
            let u = &self.run.units[i];
            rows.iter().try_for_each(|r| {
                let (t, j) = (&r.tensor, &r.judgement);
                f(Point {
                    step: &u.step,
                    rank: &u.rank,
                    seq: t.op.seq,
                    op: t.op.key.as_str(),
                    tensor: &t.name,
                    direction: t.op.direction,
                    module: t.op.module.as_deref(),
                    verdict: j.verdict,
                    err: j.err,
                    tolerance: j.tolerance,
                    cosine: t.metrics.as_ref().and_then(|m| m.cosine),
                    max_rel: t.metrics.as_ref().map(|m| m.max_rel),
                })
            })
        })
    }
}

impl Document for ScanDocument<'_> {
    fn stem(&self) -> &'static str {
        "scan"
    }

    fn summary_json(&self) -> Result<String, String> {
        pretty(self.summary)
    }

    fn overview(&self) -> ProbeResult<Overview> {
        let s = self.summary;
        let c = &s.counts;
        let facts = [
            ("exit code", s.exit_code.to_string()),
            ("dump", s.dump.clone()),
            ("step/rank folders", c.units.to_string()),
            ("ops", c.ops.to_string()),
            ("tensors", c.tensors.to_string()),
            ("with NaN/Inf", c.nonfinite.to_string()),
            (
                "with NaN/Inf from leftover bytes",
                c.nonfinite_from_leftover.to_string(),
            ),
            ("-inf only (masks)", c.neg_inf_only.to_string()),
            (
                "overflow risk / underflow",
                format!("{} / {}", c.overflow_risk, c.underflow),
            ),
            (
                "step/rank folders skipped by the loss scaler",
                c.loss_scaler_skipped_steps.to_string(),
            ),
            (
                "gradients with NaN/Inf in those steps",
                c.nonfinite_scaler_skipped.to_string(),
            ),
        ];
        let nonfinite = Some(FindingKind::FirstNonfinite);
        let mut found = listed([
            (
                "NaN/Inf enters from outside (forward)",
                None,
                &s.external_nonfinite.forward,
            ),
            (
                "first NaN/Inf producer (forward)",
                nonfinite,
                &s.first_nonfinite.forward,
            ),
            (
                "first NaN/Inf producer (backward)",
                nonfinite,
                &s.first_nonfinite.backward,
            ),
            (
                "NaN/Inf enters from outside (backward)",
                None,
                &s.external_nonfinite.backward,
            ),
        ]);
        let mut add = |title: &str, f: &Finding| {
            found.push(Listed {
                title: title.into(),
                kind: None,
                finding: f.clone(),
            })
        };
        if let Some(f) = &s.leftover_nonfinite {
            add("NaN/Inf from leftover bytes", f);
        }
        for u in &s.units {
            for f in u.findings.overflow_risk.iter().take(3) {
                add("overflow risk", f);
            }
            for f in u.findings.underflow.iter().take(3) {
                add("underflow", f);
            }
        }
        Ok(Overview {
            verdict: s.verdict,
            headline: s.headline.clone(),
            facts: facts.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            findings: found,
            worst_ops: vec![],
            ops: vec![],
            ops_left_out: 0,
            plot: None,
        })
    }

    fn table(&self) -> Table<'_> {
        let run = self.run;
        Table {
            name: "tensors",
            columns: SCAN.iter().collect(),
            colour_by: "flag",
            lines: Box::new(move |f| {
                run.units
                    .iter()
                    .try_for_each(|u| u.rows.iter().try_for_each(|r| f(Line::Scan(u, r))))
            }),
            flagged: None,
        }
    }

    fn sheets(&self) -> Vec<Table<'_>> {
        vec![self.table()]
    }

    fn cases(&self) -> Option<Vec<super::junit::Case>> {
        Some(super::junit::scan_cases(self.summary))
    }
}
