//! `config_check.json` and the terminal summary.

use super::{CheckReport, Status};
use crate::atomic;
use crate::error::Result;
use std::fmt::Write as _;
use std::path::Path;

/// Writes the report as JSON (schemas/probe-config-check.v1.schema.json), atomically.
pub(crate) fn write_json(report: &CheckReport, path: &Path) -> Result<()> {
    atomic::write_with(path, |w| {
        serde_json::to_writer_pretty(&mut *w, report).map_err(|e| e.to_string())?;
        std::io::Write::write_all(w, b"\n").map_err(|e| e.to_string())
    })
}

fn show(v: &Option<String>) -> String {
    match v {
        None => "<unset>".into(),
        Some(s) => {
            let s = s.replace('\n', " ");
            if s.chars().count() > 60 {
                format!("{}…", s.chars().take(59).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// Lines of differences shown on the terminal (the files have all of them).
pub(crate) const MAX_LINES: usize = 20;

/// The readable summary printed on stdout.
pub fn terminal_summary(r: &CheckReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "probe config-check: {}{}",
        r.verdict.to_uppercase(),
        if r.cross_platform {
            format!(
                " ({} vs {}: platform differences reported as expected)",
                r.bench.family.to_uppercase(),
                r.cmp.family.to_uppercase()
            )
        } else {
            String::new()
        }
    );
    for (side, p) in [("bench", &r.bench), ("cmp", &r.cmp)] {
        let fmt = match (p.format, p.version) {
            (super::pack::PackKind::Probe, Some(v)) => format!("probe pack v{v}"),
            (super::pack::PackKind::Probe, None) => "probe pack".into(),
            (super::pack::PackKind::Msprobe, _) => "msprobe pack".into(),
        };
        let _ = writeln!(s, "  {side:<6} {}  [{fmt}, {}]", p.path, p.device);
    }
    if let Some(rk) = &r.ranks {
        super::ranks::render::terminal(&mut s, rk);
    }
    let _ = writeln!(
        s,
        "\n  {:<16} {:<8} {:>6} {:>9} {:>8} {:>8} {:>6}",
        "category", "verdict", "pass", "expected", "ignored", "warning", "error"
    );
    for c in &r.categories {
        let _ = writeln!(
            s,
            "  {:<16} {:<8} {:>6} {:>9} {:>8} {:>8} {:>6}",
            c.name.name(),
            c.verdict,
            c.counts.pass,
            c.counts.expected,
            c.counts.ignored,
            c.counts.warning,
            c.counts.error
        );
    }
    let mut diffs: Vec<_> = r
        .items
        .iter()
        .filter(|i| matches!(i.status, Status::Error | Status::Warning))
        .collect();
    diffs.sort_by_key(|i| std::cmp::Reverse(i.status));
    if !diffs.is_empty() {
        let _ = writeln!(s, "\ndifferences:");
        for i in diffs.iter().take(MAX_LINES) {
            let at = match (i.step, i.rank, &i.ranks) {
                (Some(st), _, Some(rs)) => {
                    format!(" (step {st}, {})", super::ranks::render::of_ranks(rs))
                }
                (None, _, Some(rs)) => format!(" ({})", super::ranks::render::of_ranks(rs)),
                (Some(st), Some(rk), None) => format!(" (step {st}, rank {rk})"),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  {:<8} {:<15} {}{at}: bench={} cmp={} — {}",
                i.status.name(),
                i.category.name(),
                i.item,
                show(&i.bench),
                show(&i.cmp),
                i.detail
            );
        }
        if diffs.len() > MAX_LINES {
            let _ = writeln!(
                s,
                "  … and {} more (see config_check.xlsx / config_check.json)",
                diffs.len() - MAX_LINES
            );
        }
    }
    let notes: Vec<String> = r
        .categories
        .iter()
        .flat_map(|c| {
            c.notes
                .iter()
                .map(move |n| format!("{}: {n}", c.name.name()))
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(s, "\nnotes:");
        for n in notes {
            let _ = writeln!(s, "  {n}");
        }
    }
    if !r.outputs.is_empty() {
        let files: Vec<&String> = r.outputs.values().collect();
        let _ = writeln!(
            s,
            "\nwrote {}",
            files
                .iter()
                .map(|f| f.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s
}
