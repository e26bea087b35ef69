//! `probe config-check --format`: which files a check writes, and the two CI formats of a
//! check (docs/ci.md): `config_check.junit.xml` (one test case per category, failing where
//! the gate fails, with its differences) and `config_check.md` (a PR-sized summary).

use super::{html, output, xlsx, CheckReport, Status};
use crate::error::{ProbeError, Result};
use crate::report::junit::{Case, Failed, Outcome, Suite};
use crate::report::markdown::md_escape;
use std::fmt::Write as _;
use std::path::Path;

/// Every format a check writes, by name and file, in the order they are written (the JSON
/// that names the others last).
const FILES: [(&str, &str); 5] = [
    ("xlsx", "config_check.xlsx"),
    ("html", "config_check.html"),
    ("junit", "config_check.junit.xml"),
    ("markdown", "config_check.md"),
    ("json", "config_check.json"),
];

/// The formats written when `--format` is not given.
pub const DEFAULT_FORMATS: [&str; 3] = ["json", "xlsx", "html"];

/// The files of the chosen formats, in writing order; an unknown name is a usage error.
pub(crate) fn files(formats: &[String]) -> Result<Vec<(&'static str, &'static str)>> {
    if let Some(f) = formats.iter().find(|f| !FILES.iter().any(|(n, _)| n == f)) {
        let known: Vec<&str> = FILES.iter().map(|(n, _)| *n).collect();
        return Err(ProbeError::Usage(format!(
            "unknown report format {:?} ({})",
            crate::config_file::printable(f),
            known.join(", ")
        )));
    }
    Ok(FILES
        .into_iter()
        .filter(|(n, _)| formats.iter().any(|f| f == n))
        .collect())
}

/// Writes the report in `format` to `path` (atomically).
pub(crate) fn write(format: &str, report: &CheckReport, path: &Path) -> Result<()> {
    match format {
        "xlsx" => xlsx::write(report, path),
        "html" => html::write(report, path),
        "junit" => crate::atomic::write_bytes(path, junit(report).as_bytes()),
        "markdown" => crate::atomic::write_bytes(path, markdown(report).as_bytes()),
        _ => output::write_json(report, path),
    }
}

/// At most this many differences in a category's failure, and in the Markdown.
const SHOWN: usize = 30;
const MD_SHOWN: usize = 15;

/// A difference on one line: status, item, where, both values, why.
fn line(i: &super::Item) -> String {
    let at = match (i.step, i.rank) {
        (Some(s), Some(r)) => format!(" (step {s}, rank {r})"),
        _ => String::new(),
    };
    let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "<unset>".into());
    format!(
        "{} {}{at}: bench={} cmp={} - {}",
        i.status.name(),
        i.item,
        v(&i.bench),
        v(&i.cmp),
        i.detail
    )
}

/// The differences worth a look (errors, then warnings).
fn differences(r: &CheckReport) -> Vec<&super::Item> {
    let mut d: Vec<&super::Item> = r
        .items
        .iter()
        .filter(|i| matches!(i.status, Status::Error | Status::Warning))
        .collect();
    d.sort_by_key(|i| std::cmp::Reverse(i.status));
    d
}

/// `config_check.junit.xml`: one case per category.
pub(crate) fn junit(r: &CheckReport) -> String {
    let diffs = differences(r);
    let cases = r
        .categories
        .iter()
        .map(|c| {
            let mine: Vec<&&super::Item> = diffs.iter().filter(|i| i.category == c.name).collect();
            let counts = format!(
                "{} pass, {} expected, {} ignored, {} warning, {} error",
                c.counts.pass,
                c.counts.expected,
                c.counts.ignored,
                c.counts.warning,
                c.counts.error
            );
            let outcome = match c.pass_check {
                None => Outcome::Skipped(c.notes.join("; ")),
                Some(true) => Outcome::Pass,
                Some(false) => {
                    let mut text = format!("{counts}\n");
                    for i in mine.iter().take(SHOWN) {
                        let _ = writeln!(text, "{}", line(i));
                    }
                    if mine.len() > SHOWN {
                        let _ = writeln!(text, "... {} more", mine.len() - SHOWN);
                    }
                    let message = match mine.first() {
                        Some(i) => format!("{}: {}", c.name.name(), line(i)),
                        None => format!("{}: {counts}", c.name.name()),
                    };
                    Outcome::Failure(Failed {
                        kind: c.verdict.clone(),
                        message,
                        text,
                    })
                }
            };
            Case {
                name: c.name.name().into(),
                classname: "probe.config_check".into(),
                outcome,
                out: counts,
            }
        })
        .collect();
    let headline = format!(
        "config-check {}: {} error, {} warning differences",
        r.verdict, r.counts.error, r.counts.warning
    );
    Suite {
        name: "probe config-check".into(),
        properties: vec![
            ("verdict".into(), r.verdict.clone()),
            ("exit_code".into(), r.exit_code.to_string()),
            ("benchmark".into(), r.bench.path.clone()),
            ("comparison".into(), r.cmp.path.clone()),
            ("cross_platform".into(), r.cross_platform.to_string()),
        ],
        cases,
        out: headline.clone(),
    }
    .gated(r.exit_code, &headline, "probe.config_check")
    .render()
}

/// `config_check.md`: verdict, the categories, the first differences, the links.
pub(crate) fn markdown(r: &CheckReport) -> String {
    let mark = if r.exit_code == 0 { "passed" } else { "failed" };
    let mut md = format!(
        "### probe config-check: {mark} ({}, exit {})\n\n",
        md_escape(&r.verdict),
        r.exit_code
    );
    let _ = writeln!(
        md,
        "benchmark {} ({}) · comparison {} ({})\n",
        md_escape(&r.bench.path),
        md_escape(&r.bench.device),
        md_escape(&r.cmp.path),
        md_escape(&r.cmp.device)
    );
    md += "| category | verdict | pass | expected | ignored | warning | error |\n";
    md += "|---|---|---|---|---|---|---|\n";
    for c in &r.categories {
        let n = &c.counts;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.name.name(),
            md_escape(&c.verdict),
            n.pass,
            n.expected,
            n.ignored,
            n.warning,
            n.error
        );
    }
    let diffs = differences(r);
    if !diffs.is_empty() {
        let _ = writeln!(
            md,
            "\nDifferences ({} of {}):\n",
            diffs.len().min(MD_SHOWN),
            diffs.len()
        );
        for i in diffs.iter().take(MD_SHOWN) {
            let _ = writeln!(md, "- {}: {}", i.category.name(), md_escape(&line(i)));
        }
    }
    let links: Vec<String> = r
        .outputs
        .iter()
        .filter(|(k, _)| k.as_str() != "markdown")
        .filter_map(|(_, p)| Path::new(p).file_name())
        .map(|n| {
            let n = n.to_string_lossy();
            format!("[{}]({n})", md_escape(&n))
        })
        .collect();
    if !links.is_empty() {
        let _ = writeln!(md, "\nReports: {}", links.join(" · "));
    }
    md
}
