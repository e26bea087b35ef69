//! A folder comparison in each report: the terminal's sides and headline, the page's
//! headline, matrix and consistency tables, the workbook's `ranks` and `consistency` sheets.
//! Every value from a pack is escaped for its medium (html: `esc`; terminal: control
//! characters written escaped; xlsx cells hold text as is).

use super::super::Category;
use super::{ranks_text, MatrixRow, RanksReport, SideSummary};
use crate::report::html::esc;
use crate::report::printable;
use rust_xlsxwriter::{Format, Worksheet, XlsxError};
use std::fmt::Write as _;

type X<T> = std::result::Result<T, XlsxError>;

/// `rank 3` or `ranks 0-7`.
pub(crate) fn of_ranks(rs: &[u64]) -> String {
    format!(
        "rank{} {}",
        if rs.len() == 1 { "" } else { "s" },
        ranks_text(rs)
    )
}

fn side_line(side: &str, s: &SideSummary) -> String {
    let mut l = format!(
        "{side}: {} pack{} (ranks {}), world size {}",
        s.packs,
        if s.packs == 1 { "" } else { "s" },
        s.ranks,
        s.world_size
            .map_or("not recorded".to_string(), |w| w.to_string())
    );
    if let Some(j) = &s.job {
        let _ = write!(l, ", job {j}");
    }
    if !s.missing.is_empty() {
        let _ = write!(l, "; MISSING {}", of_ranks(&s.missing));
    }
    if !s.not_packs.is_empty() {
        let _ = write!(l, "; {} file(s) not .zip, not read", s.not_packs.len());
    }
    l
}

/// The sides and the headline, under the verdict line.
pub(crate) fn terminal(s: &mut String, r: &RanksReport) {
    for (side, x) in [("bench", &r.bench), ("cmp", &r.cmp)] {
        let _ = writeln!(s, "  {}", printable(&side_line(side, x)));
    }
    let _ = writeln!(s, "\nheadline:");
    for l in &r.headline {
        let _ = writeln!(s, "  {}", printable(l));
    }
}

/// The headline, the matrix (ranks that pass everything on one row) and the consistency
/// findings, for `config_check.html`.
pub(crate) fn html(out: &mut String, r: &RanksReport) {
    out.push_str("<h2>Ranks</h2>\n");
    for (side, x) in [("bench", &r.bench), ("cmp", &r.cmp)] {
        let _ = writeln!(out, "<p class=\"muted\">{}</p>", esc(&side_line(side, x)));
    }
    out.push_str("<div class=\"headline\" id=\"ranks-headline\">");
    for l in &r.headline {
        let _ = write!(out, "{}<br>", esc(l));
    }
    out.push_str("</div>\n<table id=\"matrix\"><tr><th>rank</th><th>bench</th><th>cmp</th>");
    for c in Category::ALL {
        let _ = write!(out, "<th>{}</th>", c.name());
    }
    out.push_str("<th>differs from its peers in</th></tr>\n");
    let clean = |m: &MatrixRow| {
        m.bench
            && m.cmp
            && m.peers.is_empty()
            && m.cells.values().all(|v| v == "pass" || v == "skipped")
    };
    let passing: Vec<u64> = r
        .matrix
        .iter()
        .filter(|m| clean(m))
        .map(|m| m.rank)
        .collect();
    for m in r.matrix.iter().filter(|m| !clean(m)) {
        let yes = |b: bool| if b { "yes" } else { "<b>missing</b>" };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td>",
            m.rank,
            yes(m.bench),
            yes(m.cmp)
        );
        for c in Category::ALL {
            let v = m.cells.get(c.name()).map_or("-", String::as_str);
            let _ = write!(
                out,
                "<td><span class=\"badge b-{0}\">{0}</span></td>",
                esc(v)
            );
        }
        let _ = writeln!(out, "<td>{}</td></tr>", esc(&m.peers.join(", ")));
    }
    if !passing.is_empty() {
        let _ = writeln!(
            out,
            "<tr><td colspan=\"{}\">{}: every category passes</td></tr>",
            Category::ALL.len() + 4,
            esc(&of_ranks(&passing))
        );
    }
    out.push_str("</table>\n");
    if !r.consistency.is_empty() {
        out.push_str("<h2>Ranks that differ from their peers</h2>\n<table id=\"consistency\"><tr><th>status</th><th>side</th><th>category</th><th>item</th><th>ranks</th><th>value</th><th>the others</th><th>why</th></tr>\n");
        for f in &r.consistency {
            let v = |x: &Option<String>| {
                x.as_deref().map_or("&lt;unset&gt;".to_string(), |s| {
                    format!("<code>{}</code>", esc(s))
                })
            };
            let _ = writeln!(
                out,
                "<tr><td><span class=\"badge b-{0}\">{0}</span></td><td>{1}</td><td>{2}</td><td><code>{3}</code></td><td>{4}</td><td>{5}</td><td>{6} ({7} of {8})</td><td>{9}</td></tr>",
                f.status.name(),
                f.side,
                f.category.name(),
                esc(&f.item),
                esc(&ranks_text(&f.ranks)),
                v(&f.value),
                v(&f.majority),
                f.majority_count,
                f.of,
                esc(&f.detail)
            );
        }
        out.push_str("</table>\n");
    }
}

const MATRIX_COLS: &[(&str, f64)] = &[
    ("rank", 8.0),
    ("bench", 8.0),
    ("cmp", 8.0),
    ("env", 10.0),
    ("packages", 10.0),
    ("determinism", 12.0),
    ("random", 10.0),
    ("dataset", 10.0),
    ("weights", 10.0),
    ("hyperparameters", 15.0),
    ("differs from its peers in", 40.0),
];

const CONSISTENCY_COLS: &[(&str, f64)] = &[
    ("side", 8.0),
    ("category", 15.0),
    ("item", 40.0),
    ("ranks", 20.0),
    ("value", 40.0),
    ("the others", 40.0),
    ("held by", 9.0),
    ("of", 6.0),
    ("status", 10.0),
    ("detail", 60.0),
];

/// The status formats the workbook uses: (header, warning, error).
pub(crate) struct Styles<'a> {
    pub header: &'a Format,
    pub warn: &'a Format,
    pub err: &'a Format,
    pub plain: &'a Format,
}

impl Styles<'_> {
    fn of(&self, v: &str) -> &Format {
        match v {
            "error" => self.err,
            "warning" => self.warn,
            _ => self.plain,
        }
    }
}

/// The `ranks` sheet: the rank × category matrix, one row per rank.
pub(crate) fn matrix_sheet(ws: &mut Worksheet, r: &RanksReport, f: &Styles) -> X<()> {
    ws.set_name("ranks")?;
    crate::report::xlsx::write_header(ws, MATRIX_COLS, f.header)?;
    for (i, m) in r.matrix.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_number(row, 0, m.rank as f64)?;
        ws.write_boolean(row, 1, m.bench)?;
        ws.write_boolean(row, 2, m.cmp)?;
        for (k, c) in Category::ALL.iter().enumerate() {
            let v = m.cells.get(c.name()).map_or("-", String::as_str);
            ws.write_string_with_format(row, 3 + k as u16, v, f.of(v))?;
        }
        ws.write_string(row, 10, m.peers.join(", "))?;
    }
    ws.autofilter(
        0,
        0,
        r.matrix.len().max(1) as u32,
        MATRIX_COLS.len() as u16 - 1,
    )?;
    Ok(())
}

/// The `consistency` sheet: each side's ranks that differ from their peers.
pub(crate) fn consistency_sheet(ws: &mut Worksheet, r: &RanksReport, f: &Styles) -> X<()> {
    ws.set_name("consistency")?;
    crate::report::xlsx::write_header(ws, CONSISTENCY_COLS, f.header)?;
    for (i, x) in r.consistency.iter().enumerate() {
        let row = i as u32 + 1;
        ws.write_string(row, 0, x.side)?;
        ws.write_string(row, 1, x.category.name())?;
        ws.write_string(row, 2, &x.item)?;
        ws.write_string(row, 3, ranks_text(&x.ranks))?;
        ws.write_string(row, 4, x.value.as_deref().unwrap_or("<unset>"))?;
        ws.write_string(row, 5, x.majority.as_deref().unwrap_or("<unset>"))?;
        ws.write_number(row, 6, x.majority_count as f64)?;
        ws.write_number(row, 7, x.of as f64)?;
        ws.write_string_with_format(row, 8, x.status.name(), f.of(x.status.name()))?;
        ws.write_string(row, 9, &x.detail)?;
    }
    ws.autofilter(
        0,
        0,
        r.consistency.len().max(1) as u32,
        CONSISTENCY_COLS.len() as u16 - 1,
    )?;
    Ok(())
}

/// The headline lines, for the summary sheet.
pub(crate) fn headline_lines(r: &RanksReport) -> Vec<(String, String)> {
    let mut out = vec![
        ("bench ranks".to_string(), side_line("bench", &r.bench)),
        ("cmp ranks".to_string(), side_line("cmp", &r.cmp)),
    ];
    for (i, l) in r.headline.iter().enumerate() {
        out.push((if i == 0 { "headline" } else { "" }.to_string(), l.clone()));
    }
    out
}
