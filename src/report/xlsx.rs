//! `<stem>.xlsx`: the workbook people open in Excel or WPS.
//!
//! `summary` first (verdict, headline, facts, findings with evidence and stack, the worst
//! ops), then the document's sheets (for a compare: `tensors` in execution order with
//! msprobe's familiar columns plus probe's verdict, reason and tolerance, then `unmatched`),
//! errors red, warnings yellow, frozen header, autofilter. Sheets are split past Excel's row
//! limit. Written in constant-memory mode.

use super::columns::{Cell, Column, Line};
use super::{Document, Overview, ReportWriter, Table};
use crate::atomic;
use crate::compare::Verdict;
use crate::error::{ProbeError, Result};
use crate::schema::summary::Finding;
use rust_xlsxwriter::{
    Color, ConditionalFormatFormula, Format, FormatBorder, FormatUnderline, Url, Workbook,
    Worksheet, XlsxError,
};
use std::path::Path;

/// `<stem>.xlsx`.
pub struct XlsxWorkbook;

/// Data rows per sheet: Excel's 1,048,576 rows less the header.
pub const MAX_ROWS: usize = 1_048_575;

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

fn summary_sheet(ws: &mut Worksheet, s: &Overview, fs: &Formats) -> X<()> {
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
    row += 1;
    for (title, f) in &s.findings {
        finding_rows(ws, &mut row, title, f, fs)?;
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
            let (sheet, r) = &o.first_row;
            let target = format!("internal:'{sheet}'!A{}", r + 1);
            let url = Url::new(target).set_text(&o.op);
            ws.write_url_with_format(row, 1, &url, &fs.link)?;
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
fn sheets(wb: &mut Workbook, table: Table, fs: &Formats) -> X<()> {
    let cols: Vec<&Column> = table.columns.into_iter().filter(|c| c.workbook).collect();
    let colour = cols
        .iter()
        .position(|c| c.name == table.colour_by)
        .unwrap_or(0);
    let widths: Vec<(&str, f64)> = cols.iter().map(|c| (c.header, c.width)).collect();
    let mut lines = table.lines;
    let mut next = lines.next();
    let mut k = 0;
    loop {
        let ws = wb.add_worksheet_with_constant_memory()?;
        ws.set_name(part_name(table.name, k))?;
        write_header(ws, &widths, &fs.header)?;
        let mut n = 0usize;
        while n < MAX_ROWS {
            let Some(line) = next.take() else { break };
            n += 1;
            table_row(ws, n as u32, &cols, &line)?;
            next = lines.next();
        }
        verdict_colours(ws, n, cols.len() as u16, &letter(colour), fs)?;
        ws.autofilter(0, 0, n.max(1) as u32, cols.len() as u16 - 1)?;
        k += 1;
        if next.is_none() {
            return Ok(());
        }
    }
}

fn build(doc: &dyn Document) -> X<Workbook> {
    let fs = formats();
    let mut wb = Workbook::new();
    // Level 1 deflate: several times faster than the default on large sheets, files ~20 % larger.
    wb.set_zip_compression_level(1);
    summary_sheet(wb.add_worksheet(), &doc.overview(), &fs)?;
    for table in doc.sheets() {
        sheets(&mut wb, table, &fs)?;
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
        let err = |e: XlsxError| ProbeError::Output {
            path: path.to_path_buf(),
            msg: format!("xlsx: {e}"),
        };
        let mut wb = build(doc).map_err(err)?;
        atomic::write_with(path, |w| wb.save_to_writer(w).map_err(|e| e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
