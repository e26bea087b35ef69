//! `<stem>.xlsx`: the workbook people open in Excel or WPS.
//!
//! `summary` first (verdict, headline, facts, findings with evidence and stack, the worst
//! ops), then the document's sheets (for a compare: `tensors` in execution order with
//! msprobe's familiar columns plus probe's verdict, reason and tolerance, then `unmatched`),
//! errors red, warnings yellow, frozen header, autofilter. Sheets are split past Excel's row
//! limit. Written in constant-memory mode.
//!
//! A compare's summary sheet also has a native chart (Excel, WPS and LibreOffice draw it):
//! the error of each op along execution order on a log scale, forward and backward apart,
//! the tolerance line and the culprit labelled. A chart draws cell ranges, so its points
//! are written to a last sheet, `plot` (an ordinary sheet: a few thousand rows at most,
//! see [`super::plot`]).

use super::columns::{Cell, Column, Line};
use super::plot::{self, Plot};
use super::{Document, Overview, ReportWriter, Table};
use crate::atomic;
use crate::compare::Verdict;
use crate::dump::Direction;
use crate::error::{ProbeError, Result};
use crate::schema::summary::Finding;
use crate::verdict::thousands;
use rust_xlsxwriter::{
    Chart, ChartAxisCrossing, ChartDataLabel, ChartDataLabelPosition, ChartEmptyCells, ChartFormat,
    ChartLegendPosition, ChartLine, ChartLineDashType, ChartMarker, ChartMarkerType,
    ChartSolidFill, ChartType, Color, ConditionalFormatFormula, DocProperties, ExcelDateTime,
    Format, FormatBorder, FormatUnderline, Url, Workbook, Worksheet, XlsxError,
};
use std::path::Path;

/// `<stem>.xlsx`.
#[derive(Debug, Clone, Copy, Default)]
pub struct XlsxWorkbook {
    /// How many lines of a long table the workbook holds (`--xlsx-rows`).
    pub rows: XlsxRows,
}

/// How many lines of a table with flagged lines (the compare's `tensors`) the workbook
/// holds. Why: writing a cell costs about as much as comparing a statistics tensor, so a
/// 100,000-tensor workbook took longer than the compare itself; people read the failing
/// rows (the first of them: after a divergence every later op fails, as a consequence), and
/// the parquet table has every row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XlsxRows {
    /// Every line.
    All,
    /// The first `n` lines, then flagged lines with `CONTEXT` lines either side while fewer
    /// than `n + max(n, FLAGGED_MIN)` lines are shown: at most about that many lines,
    /// whatever the run's size.
    First(usize),
}

/// Flagged lines past the first `n` are shown up to `max(n, FLAGGED_MIN)` more lines.
pub(crate) const FLAGGED_MIN: usize = 1000;

/// Lines kept before and after a flagged line past the first `n`.
pub(crate) const CONTEXT: usize = 2;

/// The default of `--xlsx-rows`.
pub(crate) const DEFAULT_ROWS: usize = 20_000;

impl Default for XlsxRows {
    fn default() -> Self {
        XlsxRows::First(DEFAULT_ROWS)
    }
}

impl std::str::FromStr for XlsxRows {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "all" {
            return Ok(XlsxRows::All);
        }
        s.parse()
            .map(XlsxRows::First)
            .map_err(|_| format!("{s:?}: a number of rows, or all"))
    }
}

/// Which lines of a table the workbook shows: one bit a line, built as the lines come
/// (every line, or with `First(n)` the first `n` and each flagged line with [`CONTEXT`]
/// lines either side), with the count of shown lines before every 64 (a shown line's
/// position among the sheets' rows). A few bits a line: a run of millions of rows keeps it.
#[derive(Debug, Default)]
struct Kept {
    bits: Vec<u64>,
    /// Shown lines before word `k` of `bits`.
    before: Vec<usize>,
    len: usize,
    shown: usize,
    /// Show the first `first` lines (`usize::MAX`: all).
    first: usize,
    /// Add flagged lines while fewer than this many are shown.
    limit: usize,
    /// The last flagged line shown so far.
    last_flag: Option<usize>,
    /// Flagged lines, and how many of them are shown.
    flagged: usize,
    flagged_shown: usize,
}

impl Kept {
    fn new(rows: XlsxRows) -> Kept {
        let (first, limit) = match rows {
            XlsxRows::All => (usize::MAX, usize::MAX),
            XlsxRows::First(n) => (n, n.saturating_add(n.max(FLAGGED_MIN))),
        };
        Kept {
            first,
            limit,
            ..Kept::default()
        }
    }

    fn get(&self, i: usize) -> bool {
        i < self.len && self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize) {
        if !self.get(i) {
            self.bits[i / 64] |= 1 << (i % 64);
            self.shown += 1;
            for b in &mut self.before[i / 64 + 1..] {
                *b += 1;
            }
        }
    }

    /// The next line, flagged or not.
    fn push(&mut self, flagged: bool) {
        let i = self.len;
        if i.is_multiple_of(64) {
            self.bits.push(0);
            self.before.push(self.shown);
        }
        self.len += 1;
        self.flagged += usize::from(flagged);
        if flagged && (i < self.first || self.shown < self.limit) {
            // The lines before it (at most CONTEXT, all in the last two words).
            for j in i.saturating_sub(CONTEXT)..i {
                self.set(j);
            }
            self.last_flag = Some(i);
        }
        if i < self.first || self.last_flag.is_some_and(|f| i <= f + CONTEXT) {
            self.set(i);
        }
        // (A flagged line shown as the context after the last one added counts too.)
        self.flagged_shown += usize::from(flagged && self.get(i));
    }

    /// The 0-based position among the shown lines of line `i`, if it is shown.
    fn position(&self, i: usize) -> Option<usize> {
        if !self.get(i) {
            return None;
        }
        let word = self.bits[i / 64] & ((1u64 << (i % 64)) - 1);
        Some(self.before[i / 64] + word.count_ones() as usize)
    }
}

/// The lines of a table the workbook shows, with a sentence for the summary sheet when
/// some are left out.
struct Shown {
    keep: Kept,
    note: Option<String>,
}

impl Shown {
    fn of(table: Table, rows: XlsxRows) -> Result<Option<Shown>> {
        let Some(is_flagged) = table.flagged else {
            return Ok(None);
        };
        let mut keep = Kept::new(rows);
        (table.lines)(&mut |l| {
            keep.push(is_flagged(&l));
            Ok(())
        })?;
        let note = (keep.shown < keep.len).then(|| {
            let n = match rows {
                XlsxRows::First(n) => n,
                XlsxRows::All => keep.len,
            };
            let failing = match keep.flagged - keep.flagged_shown {
                0 => "every warning and error".to_string(),
                left => format!(
                    "the first {} warnings and errors ({} more are only in compare.parquet)",
                    thousands(keep.flagged_shown),
                    thousands(left)
                ),
            };
            format!(
                "{} of {} rows: the first {}, then {failing} with {CONTEXT} rows either side; \
                 compare.parquet has every row (--xlsx-rows all puts them all here)",
                thousands(keep.shown),
                thousands(keep.len),
                thousands(n)
            )
        });
        Ok(Some(Shown { keep, note }))
    }

    /// The sheet and 1-based row of the first shown line in `lines`.
    fn first_row(&self, lines: &std::ops::Range<usize>) -> Option<(String, u32)> {
        let p = lines.clone().find_map(|i| self.keep.position(i))?;
        Some((
            part_name("tensors", p / MAX_ROWS),
            (p % MAX_ROWS) as u32 + 1,
        ))
    }
}

/// Data rows per sheet: Excel's 1,048,576 rows less the header.
pub(crate) const MAX_ROWS: usize = 1_048_575;

struct Formats {
    header: Format,
    plain: Format,
    warn: Format,
    err: Format,
    bold: Format,
    wrap: Format,
    link: Format,
}

/// The house style shared by every probe workbook (compare and config-check).
pub(crate) fn header_format() -> Format {
    Format::new()
        .set_bold()
        .set_background_color(Color::RGB(0xD9E1F2))
        .set_border_bottom(FormatBorder::Thin)
        .set_text_wrap()
}

/// Fill of warning rows.
pub(crate) fn warn_format() -> Format {
    Format::new().set_background_color(Color::RGB(0xFFEB9C))
}

/// Fill of error rows.
pub(crate) fn err_format() -> Format {
    Format::new().set_background_color(Color::RGB(0xFFC7CE))
}

/// Header row with column widths, frozen.
pub(crate) fn write_header(ws: &mut Worksheet, cols: &[(&str, f64)], f: &Format) -> X<()> {
    for (i, (name, width)) in cols.iter().enumerate() {
        ws.write_string_with_format(0, i as u16, *name, f)?;
        ws.set_column_width(i as u16, *width)?;
    }
    ws.set_freeze_panes(1, 0)?;
    Ok(())
}

fn formats() -> Formats {
    Formats {
        header: header_format(),
        plain: Format::new(),
        warn: warn_format(),
        err: err_format(),
        bold: Format::new().set_bold(),
        wrap: Format::new().set_text_wrap(),
        link: Format::new()
            .set_font_color(Color::RGB(0x0563C1))
            .set_underline(FormatUnderline::Single),
    }
}

pub(crate) type X<T> = std::result::Result<T, XlsxError>;

/// Writes a number; non-finite values as text (Excel has no NaN), None as nothing.
fn num(ws: &mut Worksheet, r: u32, c: u16, v: Option<f64>) -> X<()> {
    match v {
        None => {}
        Some(v) if v.is_finite() => {
            ws.write_number(r, c, v)?;
        }
        Some(v) => {
            let s = if v.is_nan() {
                "nan"
            } else if v > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            ws.write_string(r, c, s)?;
        }
    }
    Ok(())
}

/// Writes one cell.
fn cell(ws: &mut Worksheet, r: u32, c: u16, v: Cell) -> X<()> {
    match v {
        Cell::Text(s) => {
            if !s.is_empty() {
                ws.write_string(r, c, s.as_ref())?;
            }
        }
        Cell::OptText(s) => {
            if let Some(s) = s {
                ws.write_string(r, c, s.as_ref())?;
            }
        }
        Cell::Count(v) => {
            ws.write_number(r, c, v as f64)?;
        }
        Cell::Number(v) => num(ws, r, c, v)?,
        Cell::Flag(v) => {
            if let Some(b) = v {
                ws.write_boolean(r, c, b)?;
            }
        }
    }
    Ok(())
}

/// One row of a sheet. Cells carry no format of their own (per-cell formats cost a hash
/// lookup each); rows are coloured by conditional formats on the Verdict column.
fn table_row(ws: &mut Worksheet, i: u32, cols: &[&Column], line: &Line) -> X<()> {
    for (k, c) in cols.iter().enumerate() {
        cell(ws, i, k as u16, (c.value)(line))?;
    }
    Ok(())
}

/// The spreadsheet letter of column `k` (0-based).
fn letter(k: usize) -> String {
    let mut k = k + 1;
    let mut s = Vec::new();
    while k > 0 {
        let r = (k - 1) % 26;
        s.push(b'A' + r as u8);
        k = (k - 1) / 26;
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

fn finding_rows(
    ws: &mut Worksheet,
    row: &mut u32,
    title: &str,
    f: &Finding,
    fs: &Formats,
) -> X<()> {
    ws.write_string_with_format(*row, 0, title, &fs.bold)?;
    ws.write_string_with_format(*row, 1, &f.op, &fs.err)?;
    *row += 1;
    // The module an API call ran in (a module record's key names its own).
    let module = f
        .module
        .as_ref()
        .filter(|_| crate::op_key::module_path(&f.op).is_none());
    if let Some(m) = module {
        ws.write_string(*row, 0, "module")?;
        ws.write_string_with_format(*row, 1, m, &fs.wrap)?;
        *row += 1;
    }
    let kv = [
        ("step / rank", format!("{} / {}", f.step, f.rank)),
        ("seq", f.seq.to_string()),
        ("tensor", f.tensor.clone()),
        ("why", f.explanation.clone()),
        ("reason", f.reason.clone()),
    ];
    for (k, v) in kv {
        ws.write_string(*row, 0, k)?;
        ws.write_string_with_format(*row, 1, v, &fs.wrap)?;
        *row += 1;
    }
    for (i, e) in f.evidence.iter().enumerate() {
        ws.write_string(*row, 0, if i == 0 { "evidence" } else { "" })?;
        ws.write_string(*row, 1, e)?;
        *row += 1;
    }
    for (i, fr) in f.stack.iter().rev().take(12).enumerate() {
        ws.write_string(
            *row,
            0,
            if i == 0 {
                "stack (innermost first)"
            } else {
                ""
            },
        )?;
        ws.write_string(*row, 1, fr)?;
        *row += 1;
    }
    *row += 1;
    Ok(())
}

fn summary_sheet(ws: &mut Worksheet, s: &Overview, shown: Option<&Shown>, fs: &Formats) -> X<()> {
    ws.set_name("summary")?;
    // Printed or exported to PDF, the summary fits the page width.
    ws.set_landscape();
    ws.set_print_fit_to_pages(1, 0);
    ws.set_column_width(0, 26)?;
    ws.set_column_width(1, 110)?;
    let vf = match s.verdict {
        Verdict::Error => &fs.err,
        Verdict::Warning => &fs.warn,
        Verdict::Pass => &fs.plain,
    };
    let mut row = 0u32;
    ws.write_string_with_format(row, 0, "verdict", &fs.bold)?;
    ws.write_string_with_format(row, 1, &s.headline, vf)?;
    row += 1;
    for (k, v) in &s.facts {
        ws.write_string(row, 0, k)?;
        ws.write_string(row, 1, v)?;
        row += 1;
    }
    if let Some(note) = shown.and_then(|s| s.note.as_ref()) {
        ws.write_string(row, 0, "tensors sheet")?;
        ws.write_string(row, 1, note)?;
        row += 1;
    }
    row += 1;
    for l in &s.findings {
        finding_rows(ws, &mut row, &l.title, &l.finding, fs)?;
    }
    if !s.worst_ops.is_empty() {
        ws.write_string_with_format(row, 0, "worst ops", &fs.bold)?;
        row += 1;
        let cols = ["step/rank", "op", "verdict", "error", "tensor", "reason"];
        for (i, h) in cols.iter().enumerate() {
            ws.write_string_with_format(row, i as u16, *h, &fs.header)?;
        }
        for i in 2..6 {
            ws.set_column_width(i, if i == 4 { 48 } else { 14 })?;
        }
        ws.set_column_width(5, 44)?;
        row += 1;
        for w in &s.worst_ops {
            let f = if w.verdict == Verdict::Error {
                &fs.err
            } else {
                &fs.warn
            };
            ws.write_string_with_format(row, 0, format!("{}/{}", w.step, w.rank), f)?;
            ws.write_string_with_format(row, 1, &w.op, f)?;
            ws.write_string_with_format(row, 2, w.verdict.name(), f)?;
            num(ws, row, 3, Some(w.err.unwrap_or(f64::INFINITY)))?;
            ws.write_string_with_format(row, 4, &w.tensor, f)?;
            ws.write_string_with_format(row, 5, &w.reason, f)?;
            row += 1;
        }
    }
    if let Some(p) = s.plot.as_ref().filter(|p| !p.points.is_empty()) {
        row += 1;
        let title = format!("error per op (the chart's points: sheet {PLOT_SHEET})");
        ws.write_string_with_format(row, 0, title, &fs.bold)?;
        row += 1;
        ws.insert_chart(row, 0, &chart(p))?;
        row += CHART_ROWS;
    }
    if !s.ops.is_empty() {
        row += 1;
        let title = "per op (click an op for its tensors)";
        ws.write_string_with_format(row, 0, title, &fs.bold)?;
        row += 1;
        let cols = [
            "step/rank",
            "op",
            "verdict",
            "worst cosine",
            "max abs error",
        ];
        for (i, h) in cols.iter().enumerate() {
            ws.write_string_with_format(row, i as u16, *h, &fs.header)?;
        }
        row += 1;
        for o in &s.ops {
            let f = match o.verdict {
                Verdict::Error => &fs.err,
                Verdict::Warning => &fs.warn,
                Verdict::Pass => &fs.plain,
            };
            ws.write_string(row, 0, &o.place)?;
            match shown.and_then(|s| s.first_row(&o.lines)) {
                Some((sheet, r)) => {
                    let target = format!("internal:'{sheet}'!A{}", r + 1);
                    let url = Url::new(target).set_text(&o.op);
                    ws.write_url_with_format(row, 1, &url, &fs.link)?;
                }
                // Its tensors all pass and are past --xlsx-rows: in compare.parquet only.
                None => {
                    ws.write_string(row, 1, &o.op)?;
                }
            }
            ws.write_string_with_format(row, 2, o.verdict.name(), f)?;
            num(ws, row, 3, o.cosine)?;
            num(ws, row, 4, o.max_abs)?;
            row += 1;
        }
        if s.ops_left_out > 0 {
            let note = format!("... and {} more ops: see the tensors sheet", s.ops_left_out);
            ws.write_string(row, 1, note)?;
        }
    }
    Ok(())
}

/// The sheet the chart's points are written to.
const PLOT_SHEET: &str = "plot";

/// Rows of the summary sheet the chart covers (at the default row height), and its size
/// in pixels: as wide as the summary's first two columns.
const CHART_ROWS: u32 = 22;
const CHART_SIZE: (u32, u32) = (960, 420);

/// Columns of the plot sheet: what each point is, then the values the chart draws.
const PLOT_COLS: [(&str, f64); 11] = [
    ("x (execution order)", 10.0),
    ("step/rank", 12.0),
    ("op", 40.0),
    ("direction", 10.0),
    ("verdict", 9.0),
    ("error", 12.0),
    ("tolerance", 12.0),
    ("forward (drawn)", 12.0),
    ("backward (drawn)", 12.0),
    ("tolerance (drawn)", 12.0),
    ("culprit (drawn)", 12.0),
];
const COL_X: u16 = 0;
const COL_FORWARD: u16 = 7;
const COL_BACKWARD: u16 = 8;
const COL_TOLERANCE: u16 = 9;
const COL_CULPRIT: u16 = 10;

/// A custom data label is a literal unless it reads as a cell reference (`Sheet!A1`): an op
/// key with a `!` gets a look-alike instead, so the label always shows the text.
fn literal_label(s: &str) -> String {
    s.replace('!', "\u{01C3}")
}

/// The plot sheet: one row per point (see [`PLOT_COLS`]); a series has a value only on its
/// own rows (blank elsewhere, drawn as gaps).
fn plot_sheet(ws: &mut Worksheet, p: &Plot, fs: &Formats) -> X<()> {
    ws.set_name(PLOT_SHEET)?;
    write_header(ws, &PLOT_COLS, &fs.header)?;
    for (i, pt) in p.points.iter().enumerate() {
        let r = i as u32 + 1;
        ws.write_number(r, COL_X, pt.x as f64)?;
        ws.write_string(r, 1, &pt.place)?;
        ws.write_string(r, 2, &pt.op)?;
        ws.write_string(r, 3, pt.direction.name())?;
        ws.write_string(r, 4, pt.verdict.name())?;
        num(ws, r, 5, Some(pt.err))?;
        num(ws, r, 6, Some(pt.tolerance))?;
        let col = match pt.direction {
            Direction::Forward => COL_FORWARD,
            Direction::Backward => COL_BACKWARD,
        };
        ws.write_number(r, col, p.drawn(pt.err))?;
        ws.write_number(r, COL_TOLERANCE, p.drawn(pt.tolerance))?;
        if p.culprit == Some(i) {
            ws.write_number(r, COL_CULPRIT, p.drawn(pt.err))?;
        }
    }
    let shown = if p.downsampled() {
        let kept = if p.all_failing {
            "every failing op and the culprit, and the worst op (furthest past its tolerance) \
             of each run of consecutive passing ops"
        } else {
            "the culprit, and the worst op (furthest past its tolerance) of each run of \
             consecutive ops"
        };
        format!("{} of {} ops shown: {kept}", p.points.len(), p.ops)
    } else {
        format!("all {} ops shown", p.ops)
    };
    let notes = [
        shown,
        format!(
            "drawn on a log scale: an error of 0 at {:e}, a non-finite error at the top of \
             the chart",
            plot::FLOOR
        ),
    ];
    for (i, n) in notes.iter().enumerate() {
        ws.write_string(i as u32 + 1, PLOT_COLS.len() as u16 + 1, n)?;
    }
    Ok(())
}

/// A markers-only series of the plot sheet's column `col`.
fn point_series(chart: &mut Chart, name: &str, col: u16, last: u32, marker: ChartMarker) {
    chart
        .add_series()
        .set_name(name)
        .set_categories((PLOT_SHEET, 1, COL_X, last, COL_X))
        .set_values((PLOT_SHEET, 1, col, last, col))
        .set_marker(&marker)
        .set_format(ChartFormat::new().set_no_line());
}

fn marker(kind: ChartMarkerType, size: u8, rgb: u32) -> ChartMarker {
    let mut m = ChartMarker::new();
    m.set_type(kind).set_size(size).set_format(
        ChartFormat::new()
            .set_solid_fill(ChartSolidFill::new().set_color(Color::RGB(rgb)))
            .set_line(ChartLine::new().set_color(Color::RGB(rgb))),
    );
    m
}

/// The error-per-op chart over the plot sheet.
fn chart(p: &Plot) -> Chart {
    let last = p.points.len() as u32;
    let mut chart = Chart::new(ChartType::Scatter);
    chart.title().set_name("Error per op along execution order");
    let has = |d: Direction| p.points.iter().any(|pt| pt.direction == d);
    if has(Direction::Forward) {
        let m = marker(ChartMarkerType::Circle, 4, 0x4472C4);
        point_series(&mut chart, "forward", COL_FORWARD, last, m);
    }
    if has(Direction::Backward) {
        let m = marker(ChartMarkerType::Triangle, 4, 0xED7D31);
        point_series(&mut chart, "backward", COL_BACKWARD, last, m);
    }
    let mut none = ChartMarker::new();
    none.set_none();
    chart
        .add_series()
        .set_name("tolerance")
        .set_categories((PLOT_SHEET, 1, COL_X, last, COL_X))
        .set_values((PLOT_SHEET, 1, COL_TOLERANCE, last, COL_TOLERANCE))
        .set_marker(&none)
        .set_format(
            ChartFormat::new().set_line(
                ChartLine::new()
                    .set_color(Color::RGB(0xC00000))
                    .set_width(1.25)
                    .set_dash_type(ChartLineDashType::Dash),
            ),
        );
    if let Some(i) = p.culprit {
        let (r, pt) = (i as u32 + 1, &p.points[i]);
        let label = ChartDataLabel::new()
            .set_value(literal_label(&pt.op).as_str())
            .set_position(ChartDataLabelPosition::Right)
            .to_owned();
        chart
            .add_series()
            .set_name("culprit")
            .set_categories((PLOT_SHEET, r, COL_X, r, COL_X))
            .set_values((PLOT_SHEET, r, COL_CULPRIT, r, COL_CULPRIT))
            .set_marker(&marker(ChartMarkerType::Diamond, 10, 0xC00000))
            .set_format(ChartFormat::new().set_no_line())
            .set_custom_data_labels(&[label]);
    }
    chart
        .x_axis()
        .set_name("op, in execution order")
        .set_min(0)
        .set_max(p.points.last().map_or(1, |pt| pt.x) as f64);
    chart
        .y_axis()
        .set_name("error (log scale)")
        .set_log_base(10)
        .set_num_format("0E+00")
        .set_crossing(ChartAxisCrossing::Min);
    chart.legend().set_position(ChartLegendPosition::Bottom);
    chart.show_empty_cells_as(ChartEmptyCells::Gaps);
    chart.set_width(CHART_SIZE.0).set_height(CHART_SIZE.1);
    chart
}

/// Colours whole rows red (error) or yellow (warning) from the Verdict column `col`.
fn verdict_colours(ws: &mut Worksheet, rows: usize, cols: u16, col: &str, fs: &Formats) -> X<()> {
    if rows == 0 {
        return Ok(());
    }
    for (word, f) in [
        ("error", &fs.err),
        ("warning", &fs.warn),
        ("bench", &fs.warn),
        ("cmp", &fs.warn),
        ("nan/inf", &fs.err),
        ("nan/inf from leftover bytes", &fs.err),
        ("overflow risk", &fs.warn),
        ("underflow", &fs.warn),
    ] {
        let rule = ConditionalFormatFormula::new()
            .set_rule(format!("=${col}2=\"{word}\"").as_str())
            .set_format(f);
        ws.add_conditional_format(1, 0, rows as u32, cols - 1, &rule)?;
    }
    Ok(())
}

/// The sheet name of part `k` (0-based): `base`, then `base_2`, `base_3`, ...
pub(crate) fn part_name(base: &str, k: usize) -> String {
    if k == 0 {
        base.to_string()
    } else {
        format!("{base}_{}", k + 1)
    }
}

/// Writes a table into sheets named `name`, `name_2`, ... of at most [`MAX_ROWS`] rows
/// (the workbook's columns only); always at least one (maybe empty) sheet, so the
/// workbook's sheet list is the same for every run.
fn sheets(
    wb: &mut Workbook,
    table: Table,
    shown: Option<&Shown>,
    fs: &Formats,
    err: &dyn Fn(XlsxError) -> ProbeError,
) -> Result<()> {
    let cols: Vec<&Column> = table.columns.into_iter().filter(|c| c.workbook).collect();
    let colour = cols
        .iter()
        .position(|c| c.name == table.colour_by)
        .unwrap_or(0);
    let widths: Vec<(&str, f64)> = cols.iter().map(|c| (c.header, c.width)).collect();
    let open = |wb: &mut Workbook, k: usize| -> X<usize> {
        let ws = wb.add_worksheet_with_constant_memory()?;
        ws.set_name(part_name(table.name, k))?;
        write_header(ws, &widths, &fs.header)?;
        Ok(wb.worksheets_mut().len() - 1)
    };
    let close = |ws: &mut Worksheet, n: usize| -> X<()> {
        verdict_colours(ws, n, cols.len() as u16, &letter(colour), fs)?;
        ws.autofilter(0, 0, n.max(1) as u32, cols.len() as u16 - 1)?;
        Ok(())
    };
    // The sheet being written (its index in the workbook), its part number and its rows.
    let mut sheet = open(wb, 0).map_err(err)?;
    let (mut k, mut n) = (0usize, 0usize);
    let mut index = 0usize;
    (table.lines)(&mut |line| {
        let kept = shown.is_none_or(|s| s.keep.get(index));
        index += 1;
        if !kept {
            return Ok(());
        }
        if n == MAX_ROWS {
            close(wb.worksheet_from_index(sheet).map_err(err)?, n).map_err(err)?;
            k += 1;
            sheet = open(wb, k).map_err(err)?;
            n = 0;
        }
        n += 1;
        let ws = wb.worksheet_from_index(sheet).map_err(err)?;
        table_row(ws, n as u32, &cols, &line).map_err(err)
    })?;
    close(wb.worksheet_from_index(sheet).map_err(err)?, n).map_err(err)
}

/// A new workbook whose document properties (`docProps/core.xml`) say it was created and
/// modified on 1980-01-01T00:00:00Z, the date its zip entries carry: rust_xlsxwriter
/// stamps the wall clock there by default, and the same inputs must give the same bytes.
pub(crate) fn workbook() -> std::result::Result<Workbook, XlsxError> {
    let created = ExcelDateTime::from_ymd(1980, 1, 1)?;
    let mut wb = Workbook::new();
    wb.set_properties(&DocProperties::new().set_creation_datetime(&created));
    Ok(wb)
}

fn build(doc: &dyn Document, rows: XlsxRows, path: &Path) -> Result<Workbook> {
    let err = |e: XlsxError| ProbeError::Output {
        path: path.to_path_buf(),
        msg: format!("xlsx: {e}"),
    };
    let fs = formats();
    let mut wb = workbook().map_err(err)?;
    // Level 1 deflate: several times faster than the default on large sheets, files ~20 % larger.
    wb.set_zip_compression_level(1);
    let overview = doc.overview()?;
    // Which lines of each table are shown: one pass over the flags before any sheet (the
    // summary's links point into the tensors sheet).
    let shown: Vec<Option<Shown>> = doc
        .sheets()
        .into_iter()
        .map(|t| Shown::of(t, rows))
        .collect::<Result<_>>()?;
    let tensors = shown.first().and_then(Option::as_ref);
    summary_sheet(wb.add_worksheet(), &overview, tensors, &fs).map_err(err)?;
    for (table, shown) in doc.sheets().into_iter().zip(&shown) {
        sheets(&mut wb, table, shown.as_ref(), &fs, &err)?;
    }
    if let Some(p) = overview.plot.as_ref().filter(|p| !p.points.is_empty()) {
        plot_sheet(wb.add_worksheet(), p, &fs).map_err(err)?;
    }
    Ok(wb)
}

impl ReportWriter for XlsxWorkbook {
    fn format(&self) -> &'static str {
        "xlsx"
    }
    fn file_name(&self, stem: &str) -> String {
        format!("{stem}.xlsx")
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        let mut wb = build(doc, self.rows, path)?;
        atomic::write_with(path, |w| wb.save_to_writer(w).map_err(|e| e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which lines are written, given which are flagged.
    fn keep_lines(flagged: &[bool], rows: XlsxRows) -> Vec<bool> {
        let mut k = Kept::new(rows);
        flagged.iter().for_each(|&f| k.push(f));
        (0..flagged.len()).map(|i| k.get(i)).collect()
    }

    #[test]
    fn positions_count_the_shown_lines_before() {
        // 300 lines, the first 10 shown, then lines flagged here and there (some at word
        // boundaries, so context lines land in the previous word).
        let flags = [64usize, 127, 128, 200, 299];
        let flagged: Vec<bool> = (0..300).map(|i| flags.contains(&i)).collect();
        let mut k = Kept::new(XlsxRows::First(10));
        flagged.iter().for_each(|&f| k.push(f));
        let expect = keep_lines(&flagged, XlsxRows::First(10));
        let mut next = 0;
        for (i, &shown) in expect.iter().enumerate() {
            assert_eq!(k.position(i), shown.then_some(next), "line {i}");
            next += usize::from(shown);
        }
        assert_eq!(k.shown, next);
    }

    #[test]
    fn sheet_names_and_column_letters() {
        let names: Vec<String> = (0..3).map(|k| part_name("tensors", k)).collect();
        assert_eq!(names, ["tensors", "tensors_2", "tensors_3"]);
        assert_eq!(
            MAX_ROWS + 1,
            1 << 20,
            "Excel's limit includes the header row"
        );
        let l: Vec<String> = [0, 12, 25, 26, 27, 51, 52]
            .iter()
            .map(|&k| letter(k))
            .collect();
        assert_eq!(l, ["A", "M", "Z", "AA", "AB", "AZ", "BA"]);
    }

    #[test]
    fn the_row_window_keeps_the_first_rows_and_context_around_flags() {
        let f = |s: &str| s.chars().map(|c| c == 'x').collect::<Vec<bool>>();
        let shown = |s: &str, rows| -> String {
            keep_lines(&f(s), rows)
                .iter()
                .map(|&k| if k { '1' } else { '0' })
                .collect()
        };
        assert_eq!(shown("..........", XlsxRows::First(3)), "1110000000");
        assert_eq!(shown(".......x..", XlsxRows::First(2)), "1100011111");
        assert_eq!(shown("x........x", XlsxRows::First(0)), "1110000111");
        assert_eq!(shown("....x.....", XlsxRows::All), "1111111111");
        assert_eq!(shown("", XlsxRows::First(5)), "");
        // Flagged lines are added while fewer than n + max(n, FLAGGED_MIN) lines are shown
        // (the context after the last one completes); the rest are left out.
        let n = FLAGGED_MIN + 100;
        let flags: Vec<bool> = (0..4 * n).map(|i| i % 2 == 1).collect();
        let keep = keep_lines(&flags, XlsxRows::First(n));
        let shown = keep.iter().filter(|&&k| k).count();
        assert!((2 * n..=2 * n + 2 * CONTEXT).contains(&shown), "{shown}");
        assert!(keep[..2 * n].iter().all(|&k| k) && !keep[4 * n - 1]);
        assert_eq!("all".parse(), Ok(XlsxRows::All));
        assert_eq!("10".parse(), Ok(XlsxRows::First(10)));
        assert!("ten".parse::<XlsxRows>().is_err());
    }

    #[test]
    fn a_chart_label_never_reads_as_a_cell_reference() {
        let label = literal_label("Module.x!A1.forward");
        assert_eq!(label, "Module.x\u{01C3}A1.forward");
        assert_eq!(
            literal_label("Functional.gelu.1.forward"),
            "Functional.gelu.1.forward"
        );
    }
}
