//! Reports of a compare or a scan: the JSON summary (the CI contract, `schemas/`), the
//! parquet table, the xlsx workbook, the self-contained html page and the terminal summary. Rendering only: every number
//! comes from a [`Document`] (a finished run with its summary); the tabular formats render
//! the column tables of `columns`.
//!
//! Every file format implements [`ReportWriter`]; adding one means one new file here and
//! one line in [`writers`]. A new kind of run implements [`Document`] (see `documents`).
//! Files are written atomically (see [`crate::atomic`]).

pub(crate) mod columns;
pub(crate) mod documents;
pub(crate) mod html;
mod json;
pub mod junit;
pub mod markdown;
pub(crate) mod monitor;
mod parquet;
pub(crate) mod plot;
pub(crate) mod shards;
mod terminal;
pub(crate) mod xlsx;

use crate::compare::Verdict;
use crate::error::Result;
use crate::schema::summary::{Finding, Found, Summary, WorstOp};
use crate::vocab::FindingKind;
use columns::{Column, Line};
use std::path::Path;

pub use documents::{CompareDocument, ScanDocument};
pub use monitor::MonitorDocument;

pub use html::{HtmlReport, Point};
pub use json::JsonSummary;
pub use junit::JunitReport;
pub use markdown::MarkdownSummary;
pub use parquet::{CopyPlan, ParquetTable, TablePart};
pub use terminal::{scan_terminal_summary, terminal_summary};
pub use xlsx::{XlsxRows, XlsxWorkbook};

/// A finished run, as every report format sees it.
pub trait Document: Sync {
    /// The stem of the report files (`compare`, `scan`).
    fn stem(&self) -> &'static str;
    /// The content of `summary.json`.
    fn summary_json(&self) -> std::result::Result<String, String>;
    /// What the workbook's summary sheet shows (an error when parked rows cannot be read
    /// back).
    fn overview(&self) -> Result<Overview>;
    /// The full table (one line per tensor).
    fn table(&self) -> Table<'_>;
    /// The workbook's sheets after the summary.
    fn sheets(&self) -> Vec<Table<'_>>;
    /// Calls `f` with the compared tensors in execution order, as the html report plots
    /// them (none: the page has no error plot); stops at the first error. Called more than
    /// once: the plot is downsampled in two passes rather than holding a million rows.
    fn points(&self, f: &mut dyn FnMut(Point<'_>) -> Result<()>) -> Result<()> {
        let _ = f;
        Ok(())
    }
    /// Row groups of existing tables that make [`Document::table`] when copied (a merge's
    /// shards'), for the parquet writer; None: encode the lines.
    fn parquet_copy(&self) -> Option<&CopyPlan> {
        None
    }
    /// A monitor's metrics over the steps, as the html report draws them (none: no chart).
    fn curves(&self) -> &[crate::monitor::Curve] {
        &[]
    }
    /// The JUnit test cases of the run (one per step/rank pair), for `--format junit`;
    /// None: one case for the whole run, from its summary.
    fn cases(&self) -> Option<Vec<junit::Case>> {
        None
    }
}

/// The lines of a table, handed one at a time to the function it is called with, in order
/// (rows may be read back from a file unit by unit, so a line lives only for its call);
/// stops at the first error. Callable more than once.
pub(crate) type Lines<'a> = Box<dyn Fn(&mut dyn FnMut(Line<'_>) -> Result<()>) -> Result<()> + 'a>;

/// The summary of a run for people: verdict, headline, facts, findings, worst ops.
#[derive(Debug, Clone)]
pub struct Overview {
    /// The worst verdict.
    pub verdict: Verdict,
    /// The headline.
    pub headline: String,
    /// Key facts (paths, counts, exit code), in order.
    pub facts: Vec<(String, String)>,
    /// Findings with a title each, in order.
    pub findings: Vec<Listed>,
    /// The worst ops (may be empty).
    pub worst_ops: Vec<WorstOp>,
    /// One line per op in execution order, as msprobe's per-API summary (may be empty).
    pub ops: Vec<OpLine>,
    /// Ops left out of `ops` past its cap.
    pub ops_left_out: usize,
    /// The error-per-op chart (a compare's; None for a scan).
    pub plot: Option<plot::Plot>,
}

/// A finding as a report lists it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its title (`first divergent op (forward)`).
    pub title: String,
    /// What it says of its op: a compare's kinds, and a scan's first NaN/Inf producers
    /// (None: a scan's other findings, which name no culprit).
    pub kind: Option<FindingKind>,
    /// The op and the evidence.
    pub finding: Finding,
}

impl Listed {
    /// Whether it names the culprit (the op a report marks): never a consequence of an
    /// earlier step's divergence (`Finding::consequence_of`).
    pub fn names_culprit(&self) -> bool {
        self.kind.is_some_and(FindingKind::names_culprit) && !self.consequence()
    }

    /// Whether it is a consequence of an earlier step's divergence.
    pub fn consequence(&self) -> bool {
        self.finding.consequence_of.is_some()
    }
}

/// A compare's findings as reports list them: in causal order (step, execution order,
/// rank), so that a later step's consequence never comes before an earlier step's cause;
/// at the same op by kind ([`FindingKind`]'s order), then phase. The first op called with
/// other arguments only where it adds to the rest ([`Summary::other_args_hint`]); the
/// earliest failing ops only with `earliest`.
pub(crate) fn compare_findings(s: &Summary, earliest: bool) -> Vec<Listed> {
    let hint = s.other_args_hint().is_some();
    let mut found: Vec<&Found> = s
        .findings
        .iter()
        .filter(|f| match f.kind {
            FindingKind::OtherArgs => hint,
            FindingKind::EarliestFailing => earliest,
            _ => true,
        })
        .collect();
    found.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    found
        .into_iter()
        .map(|f| Listed {
            title: f.title(),
            kind: Some(f.kind),
            finding: f.finding.clone(),
        })
        .collect()
}

/// An op's line in the per-op table: its worst numbers and where its tensors are.
#[derive(Debug, Clone)]
pub struct OpLine {
    /// `step/rank`.
    pub place: String,
    /// The op key.
    pub op: String,
    /// The op's worst verdict.
    pub verdict: Verdict,
    /// The lowest cosine among its tensors.
    pub cosine: Option<f64>,
    /// The largest absolute error among its tensors.
    pub max_abs: Option<f64>,
    /// Its tensors' positions among the lines of the `tensors` table (0-based, end
    /// exclusive); the workbook links the op to the first of them it shows.
    pub lines: std::ops::Range<usize>,
}

/// Lines of a table with the columns to show.
pub struct Table<'a> {
    /// Sheet name (or the table's name).
    pub name: &'static str,
    /// Columns, in order.
    pub columns: Vec<&'static Column>,
    /// Name of the column whose value colours a row in the workbook (`error`, `warning`).
    pub colour_by: &'static str,
    /// The lines.
    pub lines: Lines<'a>,
    /// Which lines matter most (warnings, errors): a workbook past `--xlsx-rows` keeps
    /// these and a few lines around them; None keeps every line.
    pub flagged: Option<fn(&Line) -> bool>,
}

/// A report format.
pub trait ReportWriter: Sync {
    /// The format's name on the command line (`--format`).
    fn format(&self) -> &'static str;
    /// The file written into the output folder, for documents named `stem`.
    fn file_name(&self, stem: &str) -> String;
    /// Writes the report to `path` (atomically).
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()>;
}

/// All report formats, in the order they are written; `xlsx_rows` bounds the workbook's
/// long tables (`--xlsx-rows`).
pub fn writers(xlsx_rows: XlsxRows) -> Vec<Box<dyn ReportWriter>> {
    vec![
        Box::new(JsonSummary),
        Box::new(ParquetTable),
        Box::new(XlsxWorkbook { rows: xlsx_rows }),
        Box::new(HtmlReport),
        Box::new(JunitReport),
        Box::new(MarkdownSummary),
    ]
}

/// The terminal's escaping, written once in `config_file` (which the lower layers use too):
/// re-exported here, where the reports look for it.
pub use crate::config_file::{printable, printable_lines};
