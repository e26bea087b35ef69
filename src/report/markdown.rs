//! `summary.md`: the run for a pull request, in a few dozen lines of GitHub-flavoured
//! Markdown (a job appends it to `$GITHUB_STEP_SUMMARY` or posts it as a comment):
//! verdict, headline, the culprit with its module and stack line, the counts, the worst ops
//! (at most [`WORST_OPS`]) and relative links to the other reports (docs/ci.md).
//!
//! Every input-derived string is escaped ([`md_escape`]): a pipe cannot split a table
//! cell, a backtick, `*` or `<` cannot start code, emphasis or HTML, and control
//! characters are written as `\u{..}`.

use super::junit::Head;
use super::{Document, ReportWriter};
use crate::atomic;
use crate::error::Result;
use std::fmt::Write as _;
use std::path::Path;

/// At most this many rows in the worst ops table.
pub const WORST_OPS: usize = 10;
/// At most this many evidence lines of the culprit.
const EVIDENCE: usize = 6;
/// At most this many facts (counts).
const FACTS: usize = 12;
/// At most this many characters of one escaped string (a cell, the headline).
const LONGEST: usize = 600;

/// `s` as Markdown text that renders as itself: ASCII punctuation that Markdown or GFM
/// reads as syntax backslash-escaped, line breaks as spaces (a table row is one line),
/// control characters as `\u{..}`; cut at [`LONGEST`] characters.
pub fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        if i == LONGEST {
            out.push('…');
            break;
        }
        match c {
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '(' | ')' | '#' | '+' | '!' | '|'
            | '<' | '>' | '~' | '&' | '$' | '@' | ':' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The file name of a report path (`out/compare.html` → `compare.html`): links are
/// relative to `summary.md`, which is written beside the reports.
fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

/// A link to a report, relative, its target percent-encoded where a name needs it.
fn link(path: &str) -> String {
    let name = file_name(path);
    let target: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect();
    format!("[{}]({target})", md_escape(&name))
}

/// The Markdown summary of a document.
pub(crate) fn render(doc: &dyn Document, head: &Head) -> Result<String> {
    let o = doc.overview()?;
    let mut md = String::new();
    let mark = match head.exit_code {
        0 => "passed",
        1 => "failed",
        _ => "could not judge",
    };
    let _ = writeln!(
        md,
        "### probe {}: {} ({}, exit {})\n",
        doc.stem(),
        mark,
        md_escape(&head.verdict),
        head.exit_code
    );
    let _ = writeln!(md, "> {}\n", md_escape(&head.headline));
    if let Some(l) = o.findings.iter().find(|l| l.names_culprit()) {
        let f = &l.finding;
        let _ = writeln!(
            md,
            "**{}**: {} ({}/{}, seq {})",
            md_escape(&l.title),
            md_escape(&f.op),
            md_escape(&f.step),
            md_escape(&f.rank),
            f.seq
        );
        if let Some(m) = &f.module {
            let _ = writeln!(md, "- module: {}", md_escape(m));
        }
        if let Some(top) = f.stack.last() {
            let _ = writeln!(md, "- at: {}", md_escape(top));
        }
        if !f.explanation.is_empty() {
            let _ = writeln!(md, "- why: {}", md_escape(&f.explanation));
        }
        for e in f.evidence.iter().take(EVIDENCE) {
            let _ = writeln!(md, "  - {}", md_escape(e));
        }
        md.push('\n');
    }
    if !o.facts.is_empty() {
        md += "| | |\n|---|---|\n";
        for (k, v) in o.facts.iter().take(FACTS) {
            let _ = writeln!(md, "| {} | {} |", md_escape(k), md_escape(v));
        }
        md.push('\n');
    }
    if !o.worst_ops.is_empty() {
        let shown = o.worst_ops.len().min(WORST_OPS);
        let _ = writeln!(md, "Worst ops ({shown} of {}):\n", o.worst_ops.len());
        md += "| step/rank | op | verdict | error | tensor |\n|---|---|---|---|---|\n";
        for w in o.worst_ops.iter().take(WORST_OPS) {
            let err = w.err.map_or("inf".into(), |e| format!("{e:.3e}"));
            let _ = writeln!(
                md,
                "| {}/{} | {} | {} | {err} | {} |",
                md_escape(&w.step),
                md_escape(&w.rank),
                md_escape(&w.op),
                w.verdict.name(),
                md_escape(&w.tensor)
            );
        }
        md.push('\n');
    }
    let links: Vec<String> = head
        .outputs
        .iter()
        .filter(|(k, _)| k.as_str() != "markdown")
        .map(|(_, p)| link(p))
        .collect();
    if !links.is_empty() {
        let _ = writeln!(md, "Reports: {}", links.join(" · "));
    }
    Ok(md)
}

/// `summary.md`.
pub struct MarkdownSummary;

impl ReportWriter for MarkdownSummary {
    fn format(&self) -> &'static str {
        "markdown"
    }
    fn file_name(&self, _stem: &str) -> String {
        "summary.md".into()
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        let head = Head::of(doc, path)?;
        let md = render(doc, &head)?;
        atomic::write_bytes(path, md.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_neutralises_markdown_and_control_characters() {
        assert_eq!(
            md_escape("a|b `c` *d* <e>\n\u{1b}[1m"),
            "a\\|b \\`c\\` \\*d\\* \\<e\\> \\u{1b}\\[1m"
        );
        assert_eq!(
            link("out/my report.html"),
            "[my report.html](my%20report.html)"
        );
    }
}
