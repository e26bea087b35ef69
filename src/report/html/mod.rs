//! `compare.html` / `scan.html`: one self-contained page (no network, no script or style
//! from elsewhere) that answers "where did the error enter, and how did it grow?" at a
//! glance: the headline, the error of every tensor along execution order on a log scale
//! (forward and backward apart, the tolerance, module bands, the culprit marked), the
//! culprit's evidence and stack, a module tree with each module's worst error, and the
//! findings.
//!
//! The plot stays small for a million rows: every out-of-tolerance point (up to
//! [`MAX_FAILING`]) and every marked point is drawn on its own; the others are bucketed per
//! pixel column and direction, keeping the largest error of each bucket, so a spike is never
//! averaged away. The page says how many points were bucketed. Everything from a dump (op
//! names, tensor names, stacks) is escaped: dumps are untrusted input.
//!
//! The page is deterministic: the same run gives the same bytes (no clock, no hash order).
//!
//! Here: the writer, what a point is and the page's order; `page` the frame and escaping
//! (shared with config_check/html), `plot` the two passes that downsample the points,
//! `svg` the drawing, `sections` the culprit, findings, module tree and tables.

use super::{Document, ReportWriter};
use crate::atomic;
use crate::compare::Verdict;
use crate::error::Result;
use crate::op_key::Direction;
use std::fmt::Write as _;
use std::path::Path;

mod curves;
mod page;
mod plot;
mod sections;
mod svg;

pub(crate) use page::{close_page, esc, num, open_page};
use plot::{marks, Plot};
use sections::{culprit, facts, findings, worst_ops};

/// `compare.html` (or `scan.html`).
pub struct HtmlReport;

impl ReportWriter for HtmlReport {
    fn format(&self) -> &'static str {
        "html"
    }
    fn file_name(&self, stem: &str) -> String {
        format!("{stem}.html")
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        let page = render(doc)?;
        atomic::write_bytes(path, page.as_bytes())
    }
}

/// One compared tensor as the plot sees it.
#[derive(Debug, Clone, Copy)]
pub struct Point<'a> {
    /// Step label.
    pub step: &'a str,
    /// Rank label.
    pub rank: &'a str,
    /// The op's sequence number.
    pub seq: u64,
    /// The op key.
    pub op: &'a str,
    /// The tensor's name.
    pub tensor: &'a str,
    /// Forward or backward.
    pub direction: Direction,
    /// The module path of the call, when the dump says.
    pub module: Option<&'a str>,
    /// The tensor's verdict.
    pub verdict: Verdict,
    /// The judged error (the smallest tolerance that would pass it).
    pub err: f64,
    /// The tolerance applied.
    pub tolerance: f64,
    /// Cosine similarity, when measured.
    pub cosine: Option<f64>,
    /// Largest relative error, when measured.
    pub max_rel: Option<f64>,
}

/// Out-of-tolerance points drawn one by one at most; past this they are bucketed too.
pub(crate) const MAX_FAILING: usize = 3000;
/// Distinct module paths in the module tree at most (the rest are counted, not shown).
const MAX_MODULES: usize = 2000;
/// Module runs along execution order remembered for the bands at most.
const MAX_RUNS: usize = 20_000;

fn verdict_class(v: Verdict) -> &'static str {
    v.name()
}

/// The whole page of a document.
pub(crate) fn render(doc: &dyn Document) -> Result<String> {
    let ov = doc.overview()?;
    let mut out = String::new();
    open_page(
        &mut out,
        &format!("probe {}: {}", doc.stem(), ov.verdict.name()),
    );
    let v = verdict_class(ov.verdict);
    let _ = write!(
        out,
        "<h1>probe {} <span class=\"badge b-{v}\">{}</span></h1>\n\
<div class=\"headline {v}\" id=\"headline\">{}</div>\n",
        esc(doc.stem()),
        esc(ov.verdict.name()),
        esc(&ov.headline)
    );
    let marks = marks(&ov);
    let plot = Plot::build(&|f| doc.points(f), &marks)?;
    if let Some(p) = &plot {
        out.push_str("<h2>Error along execution order</h2>\n");
        p.svg(&mut out, &marks);
    }
    curves::curves(&mut out, doc.curves());
    culprit(&mut out, &ov);
    if let Some(p) = &plot {
        p.module_tree(&mut out);
    }
    findings(&mut out, &ov);
    worst_ops(&mut out, &ov);
    facts(&mut out, &ov);
    close_page(&mut out);
    Ok(out)
}
