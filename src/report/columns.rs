//! The one column table of the tabular reports (parquet, xlsx): every column's name, header,
//! type and value, in order. A writer renders these cells; it computes nothing.
//!
//! A line of a table is a matched tensor, a tensor found on one side only, or a scanned
//! tensor ([`Line`]); unmatched lines leave the metric columns empty and say `unmatched`.
//! [`COLUMNS`] and [`UNMATCHED`] are the compare's tables, [`SCAN`] the scan's.

use crate::compare::{CompareRun, Row, UnitSummary, Unmatched};
use crate::dump::Stats;
use crate::error::Result;
use crate::scan::{ScanRow, ScanUnit};
use std::borrow::Cow;

/// One line of the table.
#[derive(Clone, Copy)]
pub enum Line<'a> {
    /// A tensor present on both sides.
    Tensor(&'a UnitSummary, &'a Row),
    /// A tensor present on one side only.
    Unmatched(&'a UnitSummary, &'a Unmatched),
    /// A tensor of a scanned run.
    Scan(&'a ScanUnit, &'a ScanRow),
    /// A series or an event of a monitor (their own columns: `report/monitor.rs`).
    Monitor(super::monitor::MonitorLine<'a>),
}

/// A cell's value.
pub enum Cell<'a> {
    /// Text (never null).
    Text(Cow<'a, str>),
    /// Text or nothing.
    OptText(Option<Cow<'a, str>>),
    /// A count or index.
    Count(u64),
    /// A number or nothing (not applicable). May be non-finite.
    Number(Option<f64>),
    /// A flag or nothing.
    Flag(Option<bool>),
}

/// The type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Always text.
    Text,
    /// Text or null.
    OptText,
    /// Unsigned integer.
    Count,
    /// Float or null.
    Number,
    /// Boolean or null.
    Flag,
}

/// A column of the table.
pub struct Column {
    /// Name in parquet (snake_case, stable: the interchange for DuckDB/polars).
    pub name: &'static str,
    /// Header in the workbook (msprobe's names where it has one).
    pub header: &'static str,
    /// Width in the workbook, in characters.
    pub width: f64,
    /// Type.
    pub kind: Kind,
    /// Also a column of the workbook (the flags are for queries, not for reading).
    pub workbook: bool,
    /// The value of a line.
    pub value: for<'a> fn(&Line<'a>) -> Cell<'a>,
}

impl<'a> Line<'a> {
    /// The step label of the line's unit.
    pub(crate) fn step(&self) -> &'a str {
        match *self {
            Line::Tensor(u, _) | Line::Unmatched(u, _) => &u.step,
            Line::Scan(u, _) => &u.step,
            Line::Monitor(_) => "",
        }
    }
    fn rank(&self) -> &'a str {
        match *self {
            Line::Tensor(u, _) | Line::Unmatched(u, _) => &u.rank,
            Line::Scan(u, _) => &u.rank,
            Line::Monitor(_) => "",
        }
    }
    /// The part of its table a line belongs to: its unit (by address, valid while the table
    /// is visited) and its kind (matched, unmatched, scanned). The parquet table starts row
    /// groups only where parts start, which lets `probe merge` copy the shards' row groups.
    pub(crate) fn part(&self) -> (usize, u8) {
        match *self {
            Line::Tensor(u, _) => (std::ptr::from_ref(u) as usize, 0),
            Line::Unmatched(u, _) => (std::ptr::from_ref(u) as usize, 1),
            Line::Scan(u, _) => (std::ptr::from_ref(u) as usize, 2),
            Line::Monitor(_) => (0, 3),
        }
    }
    fn row(&self) -> Option<&'a Row> {
        match *self {
            Line::Tensor(_, r) => Some(r),
            Line::Unmatched(..) | Line::Scan(..) | Line::Monitor(_) => None,
        }
    }
    fn scanned(&self) -> Option<&'a ScanRow> {
        match *self {
            Line::Scan(_, r) => Some(r),
            _ => None,
        }
    }
}

fn shape(s: &[usize]) -> Cow<'static, str> {
    Cow::Owned(format!("{s:?}"))
}

fn text(s: &str) -> Cell<'_> {
    Cell::Text(Cow::Borrowed(s))
}

fn opt(s: Option<&str>) -> Cell<'_> {
    Cell::OptText(s.map(Cow::Borrowed))
}

/// A metric of full tensors.
fn metric(l: &Line, f: fn(&crate::metrics::Metrics) -> Option<f64>) -> Cell<'static> {
    Cell::Number(
        l.row()
            .and_then(|r| r.tensor.metrics.as_deref())
            .and_then(f),
    )
}

/// A statistics difference.
fn diff(l: &Line, f: fn(&crate::metrics::StatDiff) -> Option<f64>) -> Cell<'static> {
    Cell::Number(
        l.row()
            .and_then(|r| r.tensor.stat_diff())
            .and_then(|d| f(&d)),
    )
}

/// A recorded statistic of one side.
fn stat(l: &Line, bench: bool, f: fn(&Stats) -> Option<f64>) -> Cell<'static> {
    let s = l.row().and_then(|r| {
        let side = if bench {
            &r.tensor.sides.bench
        } else {
            &r.tensor.sides.cmp
        };
        side.stats.as_ref()
    });
    Cell::Number(s.and_then(f))
}

/// Dtype or shape of one side (an unmatched tensor fills its own side only).
fn side_text<'a>(l: &Line<'a>, bench: bool, shape_col: bool) -> Cell<'a> {
    match l {
        Line::Tensor(_, r) => {
            let s = if bench {
                &r.tensor.sides.bench
            } else {
                &r.tensor.sides.cmp
            };
            if shape_col {
                Cell::OptText(Some(shape(&s.shape)))
            } else {
                opt(Some(s.dtype.name()))
            }
        }
        Line::Scan(..) | Line::Monitor(_) => Cell::OptText(None),
        Line::Unmatched(_, u) => {
            if (u.side == crate::compare::Side::Bench) != bench {
                Cell::OptText(None)
            } else if shape_col {
                Cell::OptText(Some(shape(&u.shape)))
            } else {
                opt(Some(u.dtype.name()))
            }
        }
    }
}

/// The op of a tensor line (None: a monitor's line, which has none).
fn op_info<'a>(l: &Line<'a>) -> Option<&'a crate::compare::OpInfo> {
    match *l {
        Line::Tensor(_, r) => Some(&r.tensor.op),
        Line::Unmatched(_, u) => Some(&u.op),
        Line::Scan(_, r) => Some(&r.op),
        Line::Monitor(_) => None,
    }
}

fn step<'a>(l: &Line<'a>) -> Cell<'a> {
    text(l.step())
}

fn rank<'a>(l: &Line<'a>) -> Cell<'a> {
    text(l.rank())
}

fn seq<'a>(l: &Line<'a>) -> Cell<'a> {
    Cell::Count(op_info(l).map_or(0, |o| o.seq))
}

fn op<'a>(l: &Line<'a>) -> Cell<'a> {
    text(op_info(l).map_or("", |o| o.key.as_str()))
}

fn direction<'a>(l: &Line<'a>) -> Cell<'a> {
    text(op_info(l).map_or("", |o| o.direction.name()))
}

fn role<'a>(l: &Line<'a>) -> Cell<'a> {
    match *l {
        Line::Tensor(_, r) => text(r.tensor.role.name()),
        Line::Unmatched(_, u) => text(u.role.name()),
        Line::Scan(_, r) => text(r.role.name()),
        Line::Monitor(_) => text(""),
    }
}

fn tensor<'a>(l: &Line<'a>) -> Cell<'a> {
    match *l {
        Line::Tensor(_, r) => text(&r.tensor.name),
        Line::Unmatched(_, u) => text(&u.name),
        Line::Scan(_, r) => text(&r.name),
        Line::Monitor(_) => text(""),
    }
}

macro_rules! col {
    ($name:literal, $header:literal, $width:expr, $kind:ident, $f:expr) => {
        Column {
            name: $name,
            header: $header,
            width: $width,
            kind: Kind::$kind,
            workbook: true,
            value: $f,
        }
    };
    (parquet only: $name:literal, $header:literal, $kind:ident, $f:expr) => {
        Column {
            name: $name,
            header: $header,
            width: 9.0,
            kind: Kind::$kind,
            workbook: false,
            value: $f,
        }
    };
}
pub(crate) use col;

/// Every column of the tensors table, in order.
pub(crate) const COLUMNS: &[Column] = &[
    col!("step", "Step", 8.0, Text, step),
    col!("rank", "Rank", 8.0, Text, rank),
    col!("seq", "Seq", 7.0, Count, seq),
    col!("op", "Op", 36.0, Text, op),
    col!("direction", "Direction", 10.0, Text, direction),
    col!("role", "Role", 9.0, Text, role),
    col!("tensor", "Tensor", 48.0, Text, tensor),
    col!("bench_tensor", "Bench Tensor", 48.0, OptText, |l| opt(l
        .row()
        .and_then(|r| r.tensor.bench_name.as_deref()))),
    col!("matched_by", "Matched By", 10.0, OptText, |l| opt(l
        .row()
        .map(|r| r.tensor.matched_by.name()))),
    col!("dtype_bench", "Bench Dtype", 12.0, OptText, |l| side_text(
        l, true, false
    )),
    col!("dtype_cmp", "Cmp Dtype", 12.0, OptText, |l| side_text(
        l, false, false
    )),
    col!("shape_bench", "Bench Shape", 16.0, OptText, |l| side_text(
        l, true, true
    )),
    col!("shape_cmp", "Cmp Shape", 16.0, OptText, |l| side_text(
        l, false, true
    )),
    col!("compared_by", "Compared By", 11.0, Text, |l| text(
        l.row().map_or("none", |r| r.tensor.kind.name())
    )),
    col!("verdict", "Verdict", 9.0, Text, |l| text(
        l.row().map_or("unmatched", |r| r.judgement.verdict.name())
    )),
    col!("reason", "Reason", 44.0, Text, |l| match *l {
        Line::Tensor(_, r) => text(&r.judgement.reason),
        Line::Unmatched(_, u) => text(unmatched_reason(u)),
        Line::Scan(_, r) => text(&r.reason),
        Line::Monitor(_) => text(""),
    }),
    // msprobe's metric columns first, then probe's.
    col!("cosine", "Cosine", 11.0, Number, |l| metric(l, |m| m
        .cosine)),
    col!("euclidean", "EucDist", 11.0, Number, |l| metric(l, |m| {
        Some(m.euclid)
    })),
    col!("max_abs_err", "MaxAbsErr", 11.0, Number, |l| metric(
        l,
        |m| Some(m.max_abs)
    )),
    col!("max_rel_err", "MaxRelativeErr", 11.0, Number, |l| metric(
        l,
        |m| Some(m.max_rel)
    )),
    col!(
        "one_thousandth_ratio",
        "One Thousandth Err Ratio",
        11.0,
        Number,
        |l| metric(l, |m| Some(m.one_thousandth))
    ),
    col!(
        "five_thousandths_ratio",
        "Five Thousandths Err Ratio",
        11.0,
        Number,
        |l| metric(l, |m| Some(m.five_thousandths))
    ),
    col!("mean_abs_err", "MeanAbsErr", 11.0, Number, |l| metric(
        l,
        |m| Some(m.mean_abs)
    )),
    col!("rel_l2", "RelL2Err", 11.0, Number, |l| metric(l, |m| Some(
        m.rel_l2
    ))),
    col!(
        "max_abs_scaled",
        "MaxAbsErr / max|bench|",
        11.0,
        Number,
        |l| metric(l, |m| Some(m.max_abs_scaled))
    ),
    col!(
        "err",
        "Error (smallest passing tolerance)",
        11.0,
        Number,
        |l| Cell::Number(l.row().map(|r| r.judgement.err))
    ),
    col!("tolerance", "Tolerance", 11.0, Number, |l| Cell::Number(
        l.row().map(|r| r.judgement.tolerance)
    )),
    col!(
        "reference_err",
        "Reference Error (--reference)",
        11.0,
        Number,
        |l| Cell::Number(l.row().and_then(|r| r.judgement.reference))
    ),
    col!("bench_max", "Bench Max", 11.0, Number, |l| stat(
        l,
        true,
        |s| s.max()
    )),
    col!("bench_min", "Bench Min", 11.0, Number, |l| stat(
        l,
        true,
        |s| s.min()
    )),
    col!("bench_mean", "Bench Mean", 11.0, Number, |l| stat(
        l,
        true,
        |s| s.mean()
    )),
    col!("bench_norm", "Bench L2norm", 11.0, Number, |l| stat(
        l,
        true,
        |s| s.norm()
    )),
    col!("cmp_max", "Cmp Max", 11.0, Number, |l| stat(
        l,
        false,
        |s| s.max()
    )),
    col!("cmp_min", "Cmp Min", 11.0, Number, |l| stat(
        l,
        false,
        |s| s.min()
    )),
    col!("cmp_mean", "Cmp Mean", 11.0, Number, |l| stat(
        l,
        false,
        |s| s.mean()
    )),
    col!("cmp_norm", "Cmp L2norm", 11.0, Number, |l| stat(
        l,
        false,
        |s| s.norm()
    )),
    col!("max_diff", "Max diff", 11.0, Number, |l| diff(l, |d| d
        .max_diff)),
    col!("min_diff", "Min diff", 11.0, Number, |l| diff(l, |d| d
        .min_diff)),
    col!("mean_diff", "Mean diff", 11.0, Number, |l| diff(l, |d| d
        .mean_diff)),
    col!("norm_diff", "L2norm diff", 11.0, Number, |l| diff(l, |d| d
        .norm_diff)),
    col!("max_rel_diff_pct", "MaxRelativeErr(%)", 11.0, Number, |l| {
        diff(l, |d| d.max_rel_pct)
    }),
    col!("min_rel_diff_pct", "MinRelativeErr(%)", 11.0, Number, |l| {
        diff(l, |d| d.min_rel_pct)
    }),
    col!(
        "mean_rel_diff_pct",
        "MeanRelativeErr(%)",
        11.0,
        Number,
        |l| diff(l, |d| d.mean_rel_pct)
    ),
    col!(
        "norm_rel_diff_pct",
        "NormRelativeErr(%)",
        11.0,
        Number,
        |l| diff(l, |d| d.norm_rel_pct)
    ),
    col!(parquet only: "nan_inf_agree", "NaN/Inf Agree", Flag, |l| Cell::Flag(
        l.row()
            .and_then(|r| r.tensor.metrics.as_ref())
            .map(|m| m.nan_inf_agree())
    )),
    col!("checksum_equal", "Checksum Equal", 9.0, Flag, |l| {
        Cell::Flag(l.row().and_then(|r| r.tensor.checksum_equal))
    }),
    col!("external_input", "External Input", 9.0, Flag, |l| {
        Cell::Flag(l.row().map(|r| r.tensor.external))
    }),
];

/// The workbook's `unmatched` sheet: a narrower view of the unmatched lines.
pub(crate) const UNMATCHED: &[Column] = &[
    col!("step", "Step", 8.0, Text, step),
    col!("rank", "Rank", 8.0, Text, rank),
    col!("only_in", "Only In", 9.0, Text, |l| match l {
        Line::Unmatched(_, u) => text(u.side.name()),
        _ => text(""),
    }),
    col!("seq", "Seq", 7.0, Count, seq),
    col!("op", "Op", 36.0, Text, op),
    col!("tensor", "Tensor", 48.0, Text, tensor),
    col!("role", "Role", 9.0, Text, role),
    col!("dtype", "Dtype", 12.0, Text, dtype),
    col!("shape", "Shape", 16.0, Text, one_shape),
    col!("why", "Why", 40.0, Text, |l| match l {
        Line::Unmatched(_, u) => text(unmatched_reason(u)),
        _ => text(""),
    }),
];

/// Why a tensor is on one side only, for a person.
fn unmatched_reason(u: &Unmatched) -> &'static str {
    use crate::compare::{Side, Why};
    match (u.side, u.why) {
        (Side::Bench, Why::Unmatched) => "only in bench",
        (Side::Cmp, Why::Unmatched) => "only in cmp",
        (Side::Bench, Why::ShapeMismatch) => {
            "only in bench: cmp calls this API here with other shapes (code paths differ)"
        }
        (Side::Cmp, Why::ShapeMismatch) => {
            "only in cmp: bench calls this API here with other shapes (code paths differ)"
        }
        (Side::Bench, Why::Recompute) => {
            "only in bench: a recomputation (activation checkpointing)"
        }
        (Side::Cmp, Why::Recompute) => "only in cmp: a recomputation (activation checkpointing)",
        (_, Why::Inside) => {
            "inside a region compared at its boundary tensors (matched_by mapped/module)"
        }
        (Side::Bench, Why::Unhooked) => {
            "only in bench: a view or cast of an API the cmp run records no call of (not hooked by its dumper)"
        }
        (Side::Cmp, Why::Unhooked) => {
            "only in cmp: a view or cast of an API the bench run records no call of (not hooked by its dumper)"
        }
        (Side::Bench, Why::LossScaler) => {
            "only in bench: its loss scaler's arithmetic (the cmp run scales no loss)"
        }
        (Side::Cmp, Why::LossScaler) => {
            "only in cmp: its loss scaler's arithmetic (the bench run scales no loss)"
        }
        (Side::Bench, Why::SkippedUpdate) => {
            "only in bench: the update of a step the cmp run's loss scaler skipped"
        }
        (Side::Cmp, Why::SkippedUpdate) => {
            "only in cmp: the update of a step the bench run's loss scaler skipped"
        }
    }
}

/// Dtype of a tensor known on one side (unmatched, scanned).
fn dtype<'a>(l: &Line<'a>) -> Cell<'a> {
    match *l {
        Line::Unmatched(_, u) => text(u.dtype.name()),
        Line::Scan(_, r) => text(r.dtype.name()),
        Line::Tensor(..) | Line::Monitor(_) => text(""),
    }
}

/// Shape of a tensor known on one side (unmatched, scanned).
fn one_shape<'a>(l: &Line<'a>) -> Cell<'a> {
    match *l {
        Line::Unmatched(_, u) => Cell::Text(shape(&u.shape)),
        Line::Scan(_, r) => Cell::Text(shape(&r.shape)),
        Line::Tensor(..) | Line::Monitor(_) => text(""),
    }
}

/// A recorded statistic of a scanned tensor.
fn scan_stat(l: &Line, f: fn(&Stats) -> Option<f64>) -> Cell<'static> {
    Cell::Number(l.scanned().and_then(|r| r.stats.as_ref()).and_then(f))
}

/// The scan's table: every tensor of the run with its flag.
pub(crate) const SCAN: &[Column] = &[
    col!("step", "Step", 8.0, Text, step),
    col!("rank", "Rank", 8.0, Text, rank),
    col!("seq", "Seq", 7.0, Count, seq),
    col!("op", "Op", 36.0, Text, op),
    col!("direction", "Direction", 10.0, Text, direction),
    col!("role", "Role", 9.0, Text, role),
    col!("tensor", "Tensor", 48.0, Text, tensor),
    col!("dtype", "Dtype", 12.0, Text, dtype),
    col!("shape", "Shape", 16.0, Text, one_shape),
    col!("flag", "Flag", 12.0, Text, |l| text(
        l.scanned().map_or("", |r| r.flag.name())
    )),
    col!("reason", "Reason", 44.0, Text, |l| text(
        l.scanned().map_or("", |r| &r.reason)
    )),
    col!("max", "Max", 11.0, Number, |l| scan_stat(l, |s| s.max())),
    col!("min", "Min", 11.0, Number, |l| scan_stat(l, |s| s.min())),
    col!("mean", "Mean", 11.0, Number, |l| scan_stat(l, |s| s.mean())),
    col!("norm", "L2norm", 11.0, Number, |l| scan_stat(l, |s| s
        .norm())),
    col!("nan", "NaN count", 9.0, Number, |l| scan_stat(l, |s| s
        .nan()
        .map(|n| n as f64))),
    col!("inf", "Inf count", 9.0, Number, |l| scan_stat(l, |s| s
        .inf()
        .map(|n| n as f64))),
];

/// Calls `f` with every line of a compare in report order: all matched tensors of every
/// unit, then all unmatched ones.
pub(crate) fn lines(run: &CompareRun, f: &mut dyn FnMut(Line<'_>) -> Result<()>) -> Result<()> {
    tensor_lines(run, f)?;
    unmatched_lines(run, f)
}

/// Calls `f` with the unmatched lines of a compare.
pub(crate) fn unmatched_lines(
    run: &CompareRun,
    f: &mut dyn FnMut(Line<'_>) -> Result<()>,
) -> Result<()> {
    run.tables.visit_unmatched(|i, unmatched| {
        let u = &run.units[i];
        unmatched.iter().try_for_each(|x| f(Line::Unmatched(u, x)))
    })
}

/// Calls `f` with the matched lines of a compare.
pub(crate) fn tensor_lines(
    run: &CompareRun,
    f: &mut dyn FnMut(Line<'_>) -> Result<()>,
) -> Result<()> {
    run.tables.visit_rows(|i, rows| {
        let u = &run.units[i];
        rows.iter().try_for_each(|r| f(Line::Tensor(u, r)))
    })
}
