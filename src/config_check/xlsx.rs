//! `config_check.xlsx`: `summary` first (category, verdict, counts, notes), then one sheet
//! per category with the bench and cmp values side by side in a stable order; errors red,
//! warnings yellow, frozen header, autofilter.

use super::{Category, CheckReport, Item, Status};
use crate::atomic;
use crate::error::{ProbeError, Result};
use crate::report::xlsx as style;
use rust_xlsxwriter::{Color, Format, Workbook, Worksheet, XlsxError};
use std::path::Path;

type X<T> = std::result::Result<T, XlsxError>;

struct Formats {
    header: Format,
    plain: Format,
    warn: Format,
    err: Format,
    expected: Format,
}

fn formats() -> Formats {
    Formats {
        header: style::header_format(),
        plain: Format::new(),
        warn: style::warn_format(),
        err: style::err_format(),
        expected: Format::new().set_background_color(Color::RGB(0xDDEBF7)),
    }
}

fn fmt_for(s: Status, f: &Formats) -> &Format {
    match s {
        Status::Error => &f.err,
        Status::Warning => &f.warn,
        Status::Expected => &f.expected,
        _ => &f.plain,
    }
}

fn fmt_verdict<'a>(v: &str, f: &'a Formats) -> &'a Format {
    match v {
        "error" => &f.err,
        "warning" => &f.warn,
        _ => &f.plain,
    }
}

fn header(ws: &mut Worksheet, cols: &[(&str, f64)], f: &Formats) -> X<()> {
    style::write_header(ws, cols, &f.header)
}

fn opt_str(ws: &mut Worksheet, r: u32, c: u16, v: &Option<String>, f: &Format) -> X<()> {
    match v {
        Some(s) => ws.write_string_with_format(r, c, s, f)?,
        None => ws.write_blank(r, c, f)?,
    };
    Ok(())
}

fn num(ws: &mut Worksheet, r: u32, c: u16, v: Option<f64>, f: &Format) -> X<()> {
    match v {
        None => ws.write_blank(r, c, f)?,
        Some(v) if v.is_finite() => ws.write_number_with_format(r, c, v, f)?,
        Some(v) => ws.write_string_with_format(r, c, format!("{v}"), f)?,
    };
    Ok(())
}

const SUMMARY_COLS: &[(&str, f64)] = &[
    ("category", 18.0),
    ("verdict", 10.0),
    ("pass_check", 11.0),
    ("filename (msprobe)", 16.0),
    ("pass", 8.0),
    ("expected", 9.0),
    ("ignored", 9.0),
    ("warning", 9.0),
    ("error", 8.0),
    ("notes", 80.0),
];

const ITEM_COLS: &[(&str, f64)] = &[
    ("item", 44.0),
    ("rank", 6.0),
    ("bench", 50.0),
    ("cmp", 50.0),
    ("status", 10.0),
    ("detail", 50.0),
];

const RECORD_COLS: &[(&str, f64)] = &[
    ("step", 6.0),
    ("rank", 6.0),
    ("name", 40.0),
    ("bench", 40.0),
    ("cmp", 40.0),
    ("status", 10.0),
    ("detail", 40.0),
    ("bench max", 12.0),
    ("cmp max", 12.0),
    ("bench min", 12.0),
    ("cmp min", 12.0),
    ("bench mean", 12.0),
    ("cmp mean", 12.0),
    ("bench norm", 12.0),
    ("cmp norm", 12.0),
    ("max relative diff", 12.0),
];

/// Data rows per item sheet: Excel's limit less the header.
const ROWS_PER_SHEET: usize = style::MAX_ROWS;

fn summary(ws: &mut Worksheet, r: &CheckReport, f: &Formats) -> X<()> {
    ws.set_name("summary")?;
    header(ws, SUMMARY_COLS, f)?;
    let mut row = 1u32;
    for c in &r.categories {
        let vf = fmt_verdict(&c.verdict, f);
        ws.write_string(row, 0, c.name.name())?;
        ws.write_string_with_format(row, 1, &c.verdict, vf)?;
        if let Some(p) = c.pass_check {
            ws.write_boolean_with_format(row, 2, p, vf)?;
        }
        ws.write_string(row, 3, c.name.msprobe_name())?;
        for (i, n) in [
            c.counts.pass,
            c.counts.expected,
            c.counts.ignored,
            c.counts.warning,
            c.counts.error,
        ]
        .into_iter()
        .enumerate()
        {
            ws.write_number(row, 4 + i as u16, n as f64)?;
        }
        ws.write_string(row, 9, c.notes.join("; "))?;
        row += 1;
    }
    ws.autofilter(0, 0, row - 1, SUMMARY_COLS.len() as u16 - 1)?;
    row += 1;
    let lines = [
        ("verdict", r.verdict.clone()),
        (
            "exit code",
            format!("{} (fail-on {:?})", r.exit_code, r.fail_on).to_lowercase(),
        ),
        (
            "bench",
            format!(
                "{} ({:?}, {})",
                r.bench.path, r.bench.format, r.bench.device
            ),
        ),
        (
            "cmp",
            format!("{} ({:?}, {})", r.cmp.path, r.cmp.format, r.cmp.device),
        ),
        ("cross platform", r.cross_platform.to_string()),
    ];
    for (k, v) in lines {
        ws.write_string_with_format(row, 0, k, &f.header)?;
        ws.write_string(row, 1, v)?;
        row += 1;
    }
    if let Some(rk) = &r.ranks {
        for (k, v) in super::ranks::render::headline_lines(rk) {
            ws.write_string_with_format(row, 0, k, &f.header)?;
            ws.write_string(row, 1, v)?;
            row += 1;
        }
    }
    Ok(())
}

fn item_sheet(
    ws: &mut Worksheet,
    name: &str,
    cat: Category,
    items: &[&Item],
    f: &Formats,
) -> X<()> {
    ws.set_name(name)?;
    let records = matches!(cat, Category::Dataset | Category::Weights);
    let cols = if records { RECORD_COLS } else { ITEM_COLS };
    header(ws, cols, f)?;
    for (i, it) in items.iter().enumerate() {
        let r = i as u32 + 1;
        let sf = fmt_for(it.status, f);
        if records {
            num(ws, r, 0, it.step.map(|x| x as f64), &f.plain)?;
            match &it.ranks {
                Some(rs) => ws
                    .write_string(r, 1, super::ranks::ranks_text(rs))
                    .map(|_| ())?,
                None => num(ws, r, 1, it.rank.map(|x| x as f64), &f.plain)?,
            }
            ws.write_string(r, 2, &it.item)?;
            opt_str(ws, r, 3, &it.bench, &f.plain)?;
            opt_str(ws, r, 4, &it.cmp, &f.plain)?;
            ws.write_string_with_format(r, 5, it.status.name(), sf)?;
            ws.write_string(r, 6, &it.detail)?;
            if let Some(p) = &it.stats {
                for k in 0..4 {
                    num(ws, r, 7 + 2 * k as u16, p.bench[k], &f.plain)?;
                    num(ws, r, 8 + 2 * k as u16, p.cmp[k], &f.plain)?;
                }
                num(ws, r, 15, p.max_rel_diff, sf)?;
            }
        } else if let Some(rs) = &it.ranks {
            ws.write_string(r, 0, &it.item)?;
            ws.write_string(r, 1, super::ranks::ranks_text(rs))?;
            opt_str(ws, r, 2, &it.bench, &f.plain)?;
            opt_str(ws, r, 3, &it.cmp, &f.plain)?;
            ws.write_string_with_format(r, 4, it.status.name(), sf)?;
            ws.write_string(r, 5, &it.detail)?;
        } else {
            ws.write_string(r, 0, &it.item)?;
            num(ws, r, 1, it.rank.map(|x| x as f64), &f.plain)?;
            opt_str(ws, r, 2, &it.bench, &f.plain)?;
            opt_str(ws, r, 3, &it.cmp, &f.plain)?;
            ws.write_string_with_format(r, 4, it.status.name(), sf)?;
            ws.write_string(r, 5, &it.detail)?;
        }
    }
    ws.autofilter(0, 0, items.len().max(1) as u32, cols.len() as u16 - 1)?;
    Ok(())
}

fn build(r: &CheckReport, rows_per_sheet: usize) -> X<Workbook> {
    let f = formats();
    let mut wb = style::workbook()?;
    summary(wb.add_worksheet(), r, &f)?;
    if let Some(rk) = &r.ranks {
        let st = super::ranks::render::Styles {
            header: &f.header,
            warn: &f.warn,
            err: &f.err,
            plain: &f.plain,
        };
        super::ranks::render::matrix_sheet(wb.add_worksheet(), rk, &st)?;
        super::ranks::render::consistency_sheet(wb.add_worksheet(), rk, &st)?;
    }
    for cat in Category::ALL {
        let items: Vec<&Item> = r.items.iter().filter(|i| i.category == cat).collect();
        // Past Excel's row limit a category continues on `env_2`, `env_3`, ...
        let parts: Vec<&[&Item]> = if items.is_empty() {
            vec![&items[..]]
        } else {
            items.chunks(rows_per_sheet).collect()
        };
        for (k, part) in parts.into_iter().enumerate() {
            let name = style::part_name(cat.name(), k);
            item_sheet(wb.add_worksheet(), &name, cat, part, &f)?;
        }
    }
    Ok(wb)
}

/// Writes the workbook atomically.
pub(crate) fn write(r: &CheckReport, path: &Path) -> Result<()> {
    let mut wb = build(r, ROWS_PER_SHEET).map_err(|e| ProbeError::Output {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    atomic::write_with(path, |w| wb.save_to_writer(w).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_category_past_the_row_limit_continues_on_more_sheets() {
        let td = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/config_check");
        let (a, b) = (td.join("base.zip"), td.join("env.zip"));
        let opts = super::super::CheckOptions {
            rules: super::super::rules::Rules::default(),
            fail_on: crate::gate::FailOn::Error,
        };
        let report = super::super::run(&a, &b, &opts).unwrap();
        let env_items = report
            .items
            .iter()
            .filter(|i| i.category == Category::Env)
            .count();
        assert!(env_items >= 7, "{env_items}");
        let mut wb = build(&report, 3).unwrap();
        let names: Vec<String> = wb.worksheets().iter().map(|w| w.name()).collect();
        let env_sheets = names.iter().filter(|n| n.starts_with("env")).count();
        assert_eq!(env_sheets, env_items.div_ceil(3), "{names:?}");
        assert!(names.contains(&"env_2".to_string()), "{names:?}");
    }
}
