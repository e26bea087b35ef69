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

use super::{Document, Listed, Overview, ReportWriter};
use crate::atomic;
use crate::compare::Verdict;
use crate::error::Result;
use crate::op_key::Direction;
use crate::schema::summary::Finding;
use crate::vocab::FindingKind;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

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
pub const MAX_FAILING: usize = 3000;
/// Distinct module paths in the module tree at most (the rest are counted, not shown).
const MAX_MODULES: usize = 2000;
/// Module runs along execution order remembered for the bands at most.
const MAX_RUNS: usize = 20_000;

// The plot's geometry, in SVG user units (pixels at 100 %).
const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 456.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 72.0;
const BOTTOM: f64 = 64.0;
/// Pixel columns of the plot area: the buckets per direction.
const COLUMNS: usize = (WIDTH - LEFT - RIGHT) as usize;

const FORWARD: &str = "#1f6fb4";
const BACKWARD: &str = "#e8700c";
const FAIL: &str = "#c8102e";

/// Escapes text for html element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number for people: short scientific notation, `inf`/`NaN` spelled out.
pub(crate) fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == 0.0 {
        "0".into()
    } else if (1e-3..1e4).contains(&v.abs()) {
        format!("{}", (v * 1e4).round() / 1e4)
    } else {
        format!("{v:.2e}")
    }
}

/// The style shared by every probe page (inline: the page must open offline).
pub(crate) const STYLE: &str = "\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d2330;margin:0;background:#f6f7f9}
main{max-width:1240px;margin:0 auto;padding:18px 20px 40px}
h1{font-size:20px;margin:0 0 6px}h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;color:#fff;font-weight:600;font-size:12px;vertical-align:2px;text-transform:uppercase}
.b-pass{background:#2e7d32}.b-warning{background:#b26a00}.b-error{background:#c8102e}.b-skipped,.b-expected,.b-ignored{background:#6b7280}
.headline{font-size:15px;background:#fff;border-left:4px solid #8892a6;padding:8px 12px;margin:8px 0}
.headline.error{border-color:#c8102e}.headline.warning{border-color:#b26a00}.headline.pass{border-color:#2e7d32}
table{border-collapse:collapse;background:#fff;font-size:13px}td,th{border:1px solid #e1e4ea;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#fff;border:1px solid #e1e4ea;padding:8px;overflow-x:auto;margin:4px 0}
.card{background:#fff;border:1px solid #e1e4ea;padding:10px 14px;margin:8px 0}
.culprit{border-left:4px solid #c8102e}
details{margin:2px 0}details details{margin-left:18px}summary{cursor:pointer}
.muted{color:#6b7280}.error{color:#c8102e}.warning{color:#b26a00}
svg{background:#fff;border:1px solid #e1e4ea;max-width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#394150}svg .lbl{font-weight:600;fill:#1d2330}
";

/// The page's head and opening `main`.
pub(crate) fn open_page(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n",
        esc(title)
    );
}

/// Closes the page; the inline script marks the document ready (`data-ready` on `<html>`,
/// the number of plotted points) so that a headless browser check can tell it ran.
pub(crate) fn close_page(out: &mut String) {
    out.push_str(
        "</main>\n<script>\n(function(){var n=document.querySelectorAll('#plot .pt').length;\
document.documentElement.setAttribute('data-ready',String(n));})();\n</script>\n</body>\n</html>\n",
    );
}

fn verdict_class(v: Verdict) -> &'static str {
    v.name()
}

/// The whole page of a document.
pub fn render(doc: &dyn Document) -> Result<String> {
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

/// A finding to mark on the plot: its title and the op it names.
struct Mark<'a> {
    title: &'a str,
    finding: &'a Finding,
}

/// The findings that name the culprit: the first divergent op per phase, where the
/// divergence enters, the first NaN/Inf producer.
fn marks(ov: &Overview) -> Vec<Mark<'_>> {
    ov.findings
        .iter()
        .filter(|l| l.names_culprit())
        .map(|l| Mark {
            title: &l.title,
            finding: &l.finding,
        })
        .collect()
}

impl Mark<'_> {
    /// Whether `p` is a tensor of the op this mark names.
    fn names_op(&self, p: &Point) -> bool {
        let f = self.finding;
        p.seq == f.seq && p.step == f.step && p.rank == f.rank && p.op == f.op
    }
}

/// Per module path: its tensors, how many are out of tolerance, the worst error and where.
#[derive(Debug, Clone, Default)]
struct Agg {
    tensors: usize,
    errors: usize,
    worst: Option<(f64, String)>,
}

/// Sort key of an error: NaN is the worst.
fn badness(e: f64) -> f64 {
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

impl Agg {
    fn add(&mut self, err: f64, failing: bool, op: &str) {
        self.tensors += 1;
        self.errors += usize::from(failing);
        if self
            .worst
            .as_ref()
            .is_none_or(|(w, _)| badness(err) > badness(*w))
        {
            self.worst = Some((err, op.to_string()));
        }
    }
    fn merge(&mut self, o: &Agg) {
        self.tensors += o.tensors;
        self.errors += o.errors;
        if let Some((e, op)) = &o.worst {
            if self
                .worst
                .as_ref()
                .is_none_or(|(w, _)| badness(*e) > badness(*w))
            {
                self.worst = Some((*e, op.clone()));
            }
        }
    }
}

/// A drawn point: where it lies, what it is (its tooltip), which series run it belongs to.
#[derive(Clone)]
struct Drawn {
    index: usize,
    run: usize,
    direction: Direction,
    verdict: Verdict,
    err: f64,
    tooltip: String,
}

impl Drawn {
    fn of(index: usize, run: usize, p: &Point) -> Drawn {
        Drawn {
            index,
            run,
            direction: p.direction,
            verdict: p.verdict,
            err: p.err,
            tooltip: tooltip(p),
        }
    }
}

/// The points of a document, handed one at a time to a function (see `Document::points`).
type Points<'a> = dyn Fn(&mut dyn FnMut(Point<'_>) -> Result<()>) -> Result<()> + 'a;

/// The downsampled plot and what the page says about the run's modules.
struct Plot {
    /// Tensors in the run.
    n: usize,
    /// Points drawn, in execution order.
    drawn: Vec<Drawn>,
    /// Of the drawn points, the ones standing for a bucket.
    bucketed_into: usize,
    /// Points represented by a bucket rather than drawn.
    bucketed: usize,
    /// Out-of-tolerance points in all.
    failing: usize,
    /// The lowest tolerance per pixel column.
    tolerance: Vec<Option<f64>>,
    /// Decades of the y axis: the bottom line holds zeros, the top one NaN/inf when
    /// `nonfinite`.
    lo: i32,
    hi: i32,
    nonfinite: bool,
    /// Where each module run starts (index) and its path.
    runs: Vec<(usize, String)>,
    runs_complete: bool,
    /// Where a step/rank or its backward pass starts: index and label.
    phases: Vec<(usize, String)>,
    /// The index each mark points at.
    marked: Vec<Option<usize>>,
    modules: BTreeMap<String, Agg>,
    modules_left_out: usize,
}

impl Plot {
    /// Two passes over the points: the first sizes the axes and gathers the modules, the
    /// second keeps the points to draw. None when there is nothing to plot.
    fn build(points: &Points, marks: &[Mark]) -> Result<Option<Plot>> {
        let mut n = 0usize;
        let (mut min_pos, mut max_fin) = (f64::INFINITY, 0.0f64);
        let mut runs: Vec<(usize, String)> = Vec::new();
        let mut runs_complete = true;
        let mut phases: Vec<(usize, String)> = Vec::new();
        let mut modules: BTreeMap<String, Agg> = BTreeMap::new();
        let mut modules_left_out = 0usize;
        let mut marked: Vec<Option<usize>> = vec![None; marks.len()];
        // The step/rank of the previous point and its direction.
        let mut last_unit: Option<(String, String)> = None;
        let mut last_dir: Option<Direction> = None;
        let mut seen_backward = false;
        let mut failing = 0usize;
        let mut nonfinite = false;
        points(&mut |p| {
            let i = n;
            n += 1;
            nonfinite |= !p.err.is_finite();
            for v in [p.err, p.tolerance] {
                if v.is_finite() && v > 0.0 {
                    min_pos = min_pos.min(v);
                    max_fin = max_fin.max(v);
                }
            }
            let fails = p.verdict == Verdict::Error;
            failing += usize::from(fails);
            // A rule where a step/rank starts and where its backward pass starts (collectives
            // recorded as forward calls inside the backward pass do not start a phase).
            let unit_changed = last_unit
                .as_ref()
                .is_none_or(|(s, r)| (s.as_str(), r.as_str()) != (p.step, p.rank));
            let backward_starts = !unit_changed
                && p.direction == Direction::Backward
                && last_dir == Some(Direction::Forward)
                && !seen_backward;
            if unit_changed || backward_starts {
                let label = if unit_changed {
                    seen_backward = p.direction == Direction::Backward;
                    format!("{}/{} {}", p.step, p.rank, p.direction.name())
                } else {
                    seen_backward = true;
                    p.direction.name().to_string()
                };
                if phases.len() < MAX_RUNS {
                    phases.push((i, label));
                }
            }
            if unit_changed {
                last_unit = Some((p.step.to_string(), p.rank.to_string()));
            }
            last_dir = Some(p.direction);
            let module = p.module.unwrap_or("");
            if runs.last().is_none_or(|(_, m)| m != module) {
                if runs.len() < MAX_RUNS {
                    runs.push((i, module.to_string()));
                } else {
                    runs_complete = false;
                }
            }
            let key = p.module.unwrap_or("(no module)");
            let room = modules.len() < MAX_MODULES;
            match modules.get_mut(key) {
                Some(a) => a.add(p.err, fails, p.op),
                None if room => {
                    let mut a = Agg::default();
                    a.add(p.err, fails, p.op);
                    modules.insert(key.to_string(), a);
                }
                None => modules_left_out += 1,
            }
            for (m, slot) in marks.iter().zip(marked.iter_mut()) {
                // The op's first tensor, or better the tensor the finding names.
                if m.names_op(&p) && (slot.is_none() || p.tensor == m.finding.tensor) {
                    *slot = Some(i);
                }
            }
            Ok(())
        })?;
        if n == 0 {
            return Ok(None);
        }
        if !min_pos.is_finite() {
            (min_pos, max_fin) = (1e-8, 1.0);
        }
        // One decade below the smallest positive error holds the zeros (identical tensors).
        let lo = (min_pos.log10().floor() as i32 - 1).max(-20);
        // One decade above the largest finite error holds NaN/inf, when there is any.
        let hi = (max_fin.log10().ceil() as i32).max(lo + 1).min(lo + 40) + i32::from(nonfinite);

        // Second pass: every failing (up to the cap) and marked point, and per pixel column
        // and direction the point of largest error among the rest.
        let col_of = |i: usize| ((i as u128 * COLUMNS as u128) / n as u128) as usize;
        let mut tolerance: Vec<Option<f64>> = vec![None; COLUMNS];
        let mut singles: Vec<Drawn> = Vec::new();
        let mut buckets: BTreeMap<(usize, u8), (Drawn, usize)> = BTreeMap::new();
        let mut run = 0usize;
        let mut last: Option<(String, String, Direction)> = None;
        let mut kept_failing = 0usize;
        let mut i = 0usize;
        points(&mut |p| {
            let here = i;
            i += 1;
            if here >= n {
                return Ok(());
            }
            let same = last.as_ref().is_some_and(|(s, r, d)| {
                (s.as_str(), r.as_str(), *d) == (p.step, p.rank, p.direction)
            });
            if !same {
                if last.is_some() {
                    run += 1;
                }
                last = Some((p.step.to_string(), p.rank.to_string(), p.direction));
            }
            let c = col_of(here).min(COLUMNS - 1);
            if p.tolerance.is_finite() && p.tolerance > 0.0 {
                let t = &mut tolerance[c];
                *t = Some(t.map_or(p.tolerance, |x| x.min(p.tolerance)));
            }
            let is_marked = marked.contains(&Some(here));
            let fails = p.verdict == Verdict::Error;
            if is_marked || (fails && kept_failing < MAX_FAILING) || n <= COLUMNS {
                kept_failing += usize::from(fails && !is_marked);
                singles.push(Drawn::of(here, run, &p));
                return Ok(());
            }
            let key = (c, p.direction as u8);
            match buckets.get_mut(&key) {
                Some((b, count)) => {
                    *count += 1;
                    if badness(p.err) > badness(b.err) {
                        *b = Drawn::of(here, run, &p);
                    }
                }
                None => {
                    buckets.insert(key, (Drawn::of(here, run, &p), 1));
                }
            }
            Ok(())
        })?;
        let bucketed: usize = buckets.values().map(|(_, c)| c).sum();
        let bucketed_into = buckets.len();
        let mut drawn = singles;
        drawn.extend(buckets.into_values().map(|(d, _)| d));
        drawn.sort_by_key(|d| d.index);
        Ok(Some(Plot {
            n,
            drawn,
            bucketed_into,
            bucketed,
            failing,
            tolerance,
            lo,
            hi,
            nonfinite,
            runs,
            runs_complete,
            phases,
            marked,
            modules,
            modules_left_out,
        }))
    }

    fn x(&self, i: usize) -> f64 {
        LEFT + (i as f64 + 0.5) * (WIDTH - LEFT - RIGHT) / self.n as f64
    }

    /// The y of an error on the log axis; zero on the bottom line (a decade below the
    /// smallest positive error), NaN/inf on the top line (a decade above the largest).
    fn y(&self, v: f64) -> f64 {
        let (lo, hi) = (f64::from(self.lo), f64::from(self.hi));
        let d = if v.is_nan() || v == f64::INFINITY {
            hi
        } else if v <= 0.0 {
            lo
        } else {
            v.log10().clamp(lo, hi)
        };
        TOP + (hi - d) / (hi - lo) * (HEIGHT - TOP - BOTTOM)
    }

    fn svg(&self, out: &mut String, marks: &[Mark]) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (TOP, HEIGHT - BOTTOM);
        let _ = writeln!(
            out,
            "<svg id=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"error per tensor along execution order, log scale\">"
        );
        // Module bands, alternating, labelled where wide enough.
        let colw = (x1 - x0) / self.n as f64;
        let mut shade = false;
        for (k, (start, module)) in self.runs.iter().enumerate() {
            let end = self.runs.get(k + 1).map_or(self.n, |r| r.0);
            let (a, b) = (x0 + *start as f64 * colw, x0 + end as f64 * colw);
            if module.is_empty() || b - a < 2.0 {
                continue;
            }
            shade = !shade;
            let fill = if shade { "#eef2f8" } else { "#f8f9fb" };
            let _ = writeln!(
                out,
                "<rect class=\"band\" x=\"{a:.1}\" y=\"{y0}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\"><title>module {}</title></rect>",
                b - a,
                y1 - y0,
                esc(module)
            );
            // Above the plot: the path if it fits, else its last part (`blocks.3` → `3`).
            let fits = |t: &str| t.chars().count() as f64 * 6.5 + 6.0 <= b - a;
            let last = module.rsplit('.').next().unwrap_or(module);
            let label = [module.as_str(), last].into_iter().find(|t| fits(t));
            if let Some(label) = label {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"mod\">{}</text>",
                    (a + b) / 2.0,
                    y0 - 8.0,
                    esc(label)
                );
            }
        }
        // Decade grid and labels.
        let step = if self.hi - self.lo > 12 { 2 } else { 1 };
        for d in self.lo..=self.hi {
            let y = self.y(10f64.powi(d));
            let _ = writeln!(
                out,
                "<line x1=\"{x0}\" x2=\"{x1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#d9dde5\" stroke-width=\"1\"/>"
            );
            if d == self.lo || (d == self.hi && self.nonfinite) {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                    x0 - 6.0,
                    y + 4.0,
                    if d == self.lo { "0" } else { "NaN/inf" }
                );
            } else if (d - self.lo) % step == 0 {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">1e{d}</text>",
                    x0 - 6.0,
                    y + 4.0
                );
            }
        }
        // Phase boundaries (direction, step/rank) as vertical rules with labels below.
        let mut last_rule = f64::NEG_INFINITY;
        for (k, (start, label)) in self.phases.iter().enumerate() {
            let x = x0 + *start as f64 * colw;
            let end = self.phases.get(k + 1).map_or(self.n, |p| p.0);
            let w = (end - start) as f64 * colw;
            // At most one rule per two pixels: a run alternating phases stays readable.
            if k > 0 && x - last_rule >= 2.0 {
                last_rule = x;
                let _ = writeln!(
                    out,
                    "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{y0}\" y2=\"{:.1}\" stroke=\"#8892a6\" stroke-width=\"1\"/>",
                    y1 + 18.0
                );
            }
            if w >= 60.0 || self.phases.len() == 1 {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" class=\"lbl\">{}</text>",
                    x + 4.0,
                    y1 + 14.0,
                    esc(&shorten(label, (w / 6.5) as usize))
                );
            }
        }
        // The tolerance, as a step line over pixel columns (a column without a tensor keeps
        // the tolerance before it).
        let mut d = String::new();
        let mut prev: Option<f64> = None;
        for (c, t) in self.tolerance.iter().enumerate() {
            let Some(t) = *t else { continue };
            let xa = x0 + c as f64;
            match prev {
                Some(p) if p == t => {}
                Some(_) => {
                    let _ = write!(d, "H{xa:.1}V{:.1}", self.y(t));
                }
                None => {
                    let _ = write!(d, "M{x0:.1} {:.1}", self.y(t));
                }
            }
            prev = Some(t);
        }
        if prev.is_some() {
            let _ = write!(d, "H{x1:.1}");
        }
        if !d.is_empty() {
            let _ = writeln!(
                out,
                "<path class=\"tol\" d=\"{d}\" fill=\"none\" stroke=\"#4b5563\" stroke-width=\"1.2\" stroke-dasharray=\"5 3\"><title>tolerance</title></path>"
            );
        }
        // One line per direction, broken where the phase changes; through the nonzero
        // errors only (identical tensors, often weights, would turn it into a comb).
        for dir in [Direction::Forward, Direction::Backward] {
            let mut d = String::new();
            let mut last_run = None;
            let on_line = |p: &&Drawn| p.direction == dir && p.err != 0.0;
            for p in self.drawn.iter().filter(on_line) {
                let cmd = if last_run == Some(p.run) { 'L' } else { 'M' };
                let _ = write!(d, "{cmd}{:.1} {:.1}", self.x(p.index), self.y(p.err));
                last_run = Some(p.run);
            }
            if !d.is_empty() {
                let _ = writeln!(
                    out,
                    "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1\" stroke-opacity=\"0.4\"/>",
                    colour(dir)
                );
            }
        }
        // The points, each with its tooltip.
        for p in &self.drawn {
            let fails = p.verdict == Verdict::Error;
            let (r, stroke) = if fails {
                (3.6, format!(" stroke=\"{FAIL}\" stroke-width=\"1.6\""))
            } else {
                (2.4, String::new())
            };
            let _ = writeln!(
                out,
                "<circle class=\"pt {}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r}\" fill=\"{}\"{stroke}><title>{}</title></circle>",
                p.direction.name(),
                self.x(p.index),
                self.y(p.err),
                colour(p.direction),
                esc(&p.tooltip)
            );
        }
        // The culprit(s): a rule, a ring and a label each.
        for (k, (m, at)) in marks.iter().zip(&self.marked).enumerate() {
            let Some(i) = *at else { continue };
            let Some(p) = self.drawn.iter().find(|d| d.index == i) else {
                continue;
            };
            let (x, y) = (self.x(i), self.y(p.err));
            let ly = 16.0 + 14.0 * (k % 3) as f64; // three rows above the plot
            let anchor = if x > (x0 + x1) / 2.0 { "end" } else { "start" };
            let tx = if anchor == "end" { x + 4.0 } else { x - 4.0 };
            let _ = writeln!(
                out,
                "<g class=\"culprit\" data-op=\"{}\"><line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{y1}\" stroke=\"#111\" stroke-width=\"1\" stroke-dasharray=\"2 2\"/>\
<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"7.5\" fill=\"none\" stroke=\"#111\" stroke-width=\"2\"/>\
<text x=\"{tx:.1}\" y=\"{ly:.1}\" text-anchor=\"{anchor}\" class=\"lbl\">▼ {}: {}</text></g>",
                esc(&m.finding.op),
                ly + 4.0,
                esc(m.title),
                esc(&m.finding.op)
            );
        }
        // Axes, their titles and the legend.
        let _ = writeln!(
            out,
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#8892a6\"/>",
            x1 - x0,
            y1 - y0
        );
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">compared tensors in execution order ({} in all; shaded bands: modules)</text>",
            (x0 + x1) / 2.0,
            HEIGHT - 12.0,
            self.n
        );
        let _ = writeln!(
            out,
            "<text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">error (relative L2, log scale)</text>",
            (y0 + y1) / 2.0
        );
        let lx = x1 - 430.0;
        let ly = HEIGHT - 30.0;
        let _ = writeln!(
            out,
            "<g class=\"legend\"><circle cx=\"{lx}\" cy=\"{ly}\" r=\"4\" fill=\"{FORWARD}\"/><text x=\"{:.0}\" y=\"{:.0}\">forward</text>\
<circle cx=\"{:.0}\" cy=\"{ly}\" r=\"4\" fill=\"{BACKWARD}\"/><text x=\"{:.0}\" y=\"{:.0}\">backward</text>\
<circle cx=\"{:.0}\" cy=\"{ly}\" r=\"4\" fill=\"#fff\" stroke=\"{FAIL}\" stroke-width=\"1.6\"/><text x=\"{:.0}\" y=\"{:.0}\">out of tolerance</text>\
<line x1=\"{:.0}\" x2=\"{:.0}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"#4b5563\" stroke-dasharray=\"5 3\"/><text x=\"{:.0}\" y=\"{:.0}\">tolerance</text>\
<circle cx=\"{:.0}\" cy=\"{ly}\" r=\"6\" fill=\"none\" stroke=\"#111\" stroke-width=\"2\"/><text x=\"{:.0}\" y=\"{:.0}\">culprit</text></g>",
            lx + 8.0,
            ly + 4.0,
            lx + 80.0,
            lx + 88.0,
            ly + 4.0,
            lx + 170.0,
            lx + 178.0,
            ly + 4.0,
            lx + 290.0,
            lx + 312.0,
            lx + 318.0,
            ly + 4.0,
            lx + 386.0,
            lx + 396.0,
            ly + 4.0,
        );
        out.push_str("</svg>\n");
        let _ = write!(
            out,
            "<p class=\"muted\" id=\"plot-note\">{} tensors, {} out of tolerance; {} points drawn. ",
            self.n,
            self.failing,
            self.drawn.len()
        );
        if self.bucketed > 0 {
            let _ = write!(
                out,
                "{} tensors were bucketed into {} points (per pixel column and direction, the largest error is kept); \
out-of-tolerance tensors are drawn one by one (up to {MAX_FAILING}) and the culprit always. ",
                self.bucketed, self.bucketed_into
            );
        } else {
            out.push_str("Every tensor is drawn. ");
        }
        out.push_str(
            "Identical tensors (error 0) sit on the bottom line, NaN/inf errors on the top line. Hover a point for its op, tensor and metrics.",
        );
        if !self.runs_complete {
            let _ = write!(
                out,
                " Module bands shown for the first {MAX_RUNS} module runs."
            );
        }
        out.push_str("</p>\n");
    }

    /// The module tree: nested `<details>`, each module with its worst error; modules with
    /// out-of-tolerance tensors open.
    fn module_tree(&self, out: &mut String) {
        let mut root = Node::default();
        for (path, agg) in &self.modules {
            let mut node = &mut root;
            node.agg.merge(agg);
            for seg in path.split('.') {
                node = node.children.entry(seg.to_string()).or_default();
                node.agg.merge(agg);
            }
        }
        out.push_str("<h2>Modules</h2>\n<div class=\"card\" id=\"modules\">\n");
        for (name, child) in &root.children {
            child.render(out, name.clone());
        }
        if self.modules_left_out > 0 {
            let _ = writeln!(
                out,
                "<p class=\"muted\">{} tensors in modules past the first {MAX_MODULES} are not in the tree.</p>",
                self.modules_left_out
            );
        }
        out.push_str("</div>\n");
    }
}

/// A module in the tree.
#[derive(Default)]
struct Node {
    agg: Agg,
    children: BTreeMap<String, Node>,
}

impl Node {
    /// Renders the node whose full path is `path`.
    fn render(&self, out: &mut String, path: String) {
        let a = &self.agg;
        let class = if a.errors > 0 { "error" } else { "" };
        let worst = match &a.worst {
            Some((e, op)) => format!("worst error {} ({})", num(*e), esc(op)),
            None => String::new(),
        };
        let line = format!(
            "<span class=\"{class}\"><code>{}</code></span> <span class=\"muted\">{worst} · {} tensors, {} out of tolerance</span>",
            esc(&path),
            a.tensors,
            a.errors
        );
        if self.children.is_empty() {
            let _ = writeln!(out, "<div class=\"leaf\">{line}</div>");
            return;
        }
        let open = if a.errors > 0 { " open" } else { "" };
        let _ = writeln!(out, "<details{open}><summary>{line}</summary>");
        for (n, c) in &self.children {
            c.render(out, format!("{path}.{n}"));
        }
        out.push_str("</details>\n");
    }
}

fn colour(d: Direction) -> &'static str {
    match d {
        Direction::Forward => FORWARD,
        Direction::Backward => BACKWARD,
    }
}

/// At most `chars` characters of `s`, an ellipsis marking a cut.
fn shorten(s: &str, chars: usize) -> String {
    if s.chars().count() <= chars {
        return s.to_string();
    }
    let keep = chars.saturating_sub(1);
    let mut t: String = s.chars().take(keep).collect();
    t.push('…');
    t
}

/// A point's hover text.
fn tooltip(p: &Point) -> String {
    let mut s = format!(
        "{} ({}/{}, seq {})\n{}\n{}: error {} (tolerance {})",
        p.op,
        p.step,
        p.rank,
        p.seq,
        p.tensor,
        p.verdict.name(),
        num(p.err),
        num(p.tolerance)
    );
    if let Some(c) = p.cosine {
        let _ = write!(s, ", cosine {}", num(c));
    }
    if let Some(r) = p.max_rel {
        let _ = write!(s, ", max rel {}", num(r));
    }
    if let Some(m) = p.module {
        let _ = write!(s, "\nmodule {m}");
    }
    s
}

/// One finding: what, where, why; evidence and stack when given.
fn finding_body(out: &mut String, f: &Finding, open: bool) {
    let _ = writeln!(
        out,
        "<div><code>{}</code> <span class=\"muted\">({} {}/{}, seq {})</span></div>\n\
<div>tensor <code>{}</code>: {}</div>\n<div>{}</div>",
        esc(&f.op),
        f.direction.name(),
        esc(&f.step),
        esc(&f.rank),
        f.seq,
        esc(&f.tensor),
        esc(&f.reason),
        esc(&f.explanation)
    );
    let o = if open { " open" } else { "" };
    if !f.evidence.is_empty() {
        let _ = writeln!(
            out,
            "<details{o}><summary>evidence</summary><pre>{}</pre></details>",
            esc(&f.evidence.join("\n"))
        );
    }
    if !f.stack.is_empty() {
        let _ = writeln!(
            out,
            "<details{o}><summary>stack</summary><pre>{}</pre></details>",
            esc(&f.stack.join("\n"))
        );
    }
}

/// The culprit: the first finding naming a divergent op (or entry point), with its
/// evidence and stack open.
fn culprit(out: &mut String, ov: &Overview) {
    let locates = |l: &&Listed| l.kind.is_some_and(FindingKind::locates_divergence);
    let Some(Listed {
        title, finding: f, ..
    }) = ov
        .findings
        .iter()
        .find(locates)
        .or_else(|| ov.findings.first())
    else {
        return;
    };
    let _ = writeln!(
        out,
        "<h2>Culprit</h2>\n<div class=\"card culprit\" id=\"culprit\"><div><b>{}</b></div>",
        esc(title)
    );
    finding_body(out, f, true);
    out.push_str("</div>\n");
}

fn findings(out: &mut String, ov: &Overview) {
    if ov.findings.is_empty() {
        return;
    }
    out.push_str("<h2>Findings</h2>\n<div id=\"findings\">\n");
    for Listed {
        title, finding: f, ..
    } in &ov.findings
    {
        let _ = writeln!(
            out,
            "<details class=\"card\"><summary><b>{}</b>: <code>{}</code></summary>",
            esc(title),
            esc(&f.op)
        );
        finding_body(out, f, false);
        out.push_str("</details>\n");
    }
    out.push_str("</div>\n");
}

fn worst_ops(out: &mut String, ov: &Overview) {
    if ov.worst_ops.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Worst ops</h2>\n<table id=\"worst\"><tr><th>step/rank</th><th>seq</th><th>op</th><th>verdict</th><th>error</th><th>tensor</th><th>reason</th></tr>\n",
    );
    for w in &ov.worst_ops {
        let _ = writeln!(
            out,
            "<tr><td>{}/{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td class=\"{}\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td>{}</td></tr>",
            esc(&w.step),
            esc(&w.rank),
            w.seq,
            esc(&w.op),
            w.verdict.name(),
            w.verdict.name(),
            w.err.map_or("inf".into(), num),
            esc(&w.tensor),
            esc(&w.reason)
        );
    }
    out.push_str("</table>\n");
}

fn facts(out: &mut String, ov: &Overview) {
    out.push_str("<h2>Run</h2>\n<table id=\"facts\">\n");
    for (k, v) in &ov.facts {
        let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(i: usize, err: f64) -> Point<'static> {
        Point {
            step: "step0",
            rank: "rank0",
            seq: i as u64,
            op: "Functional.linear.0.forward",
            tensor: "Functional.linear.0.forward.output.0",
            direction: if i.is_multiple_of(2) {
                Direction::Forward
            } else {
                Direction::Backward
            },
            module: Some("blocks.0"),
            verdict: if err > 1e-3 {
                Verdict::Error
            } else {
                Verdict::Pass
            },
            err,
            tolerance: 1e-3,
            cosine: Some(1.0),
            max_rel: Some(err),
        }
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn a_million_points_stay_bounded() {
        let n = 1_000_000;
        // Every 100th tensor fails: 10k failing, past the cap.
        let err = |i: usize| if i.is_multiple_of(100) { 0.5 } else { 1e-6 };
        let plot = Plot::build(&|f| (0..n).try_for_each(|i| f(point(i, err(i)))), &[])
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.n, n);
        assert!(
            plot.drawn.len() <= MAX_FAILING + 2 * COLUMNS,
            "{}",
            plot.drawn.len()
        );
        assert_eq!(plot.bucketed + plot.drawn.len() - plot.bucketed_into, n);
        let mut page = String::new();
        plot.svg(&mut page, &[]);
        assert!(page.len() < 2_000_000, "{} bytes", page.len());
        let elements = page.matches('<').count() - page.matches("</").count();
        assert!(elements <= 20_000, "{elements} elements");
    }

    #[test]
    fn the_culprit_survives_bucketing_and_nan_gets_the_top_line() {
        let n = 200_000;
        let culprit = Finding {
            op: "Functional.linear.0.forward".into(),
            step: "step0".into(),
            rank: "rank0".into(),
            seq: 123_457,
            direction: Direction::Backward,
            tensor: "Functional.linear.0.forward.output.0".into(),
            reason: String::new(),
            explanation: String::new(),
            evidence: vec![],
            stack: vec![],
            leftover: None,
            args: Vec::new(),
            one_sided_source: None,
            carried: None,
        };
        let marks = [Mark {
            title: "first divergent op (backward)",
            finding: &culprit,
        }];
        // The culprit's error is small: bucketing alone would drop it.
        let err = |i: usize| match i {
            123_457 => 1e-5,
            7 => f64::NAN,
            _ => 1e-4,
        };
        let plot = Plot::build(&|f| (0..n).try_for_each(|i| f(point(i, err(i)))), &marks)
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.marked, vec![Some(123_457)]);
        assert!(plot.drawn.iter().any(|d| d.index == 123_457));
        assert!(plot.nonfinite);
        assert_eq!(plot.y(f64::NAN), TOP);
        assert!(plot.y(1e-4) > TOP);
        let mut page = String::new();
        plot.svg(&mut page, &marks);
        assert!(page.contains("first divergent op (backward): Functional.linear.0.forward"));
        assert!(page.contains(">NaN/inf</text>"));
    }

    #[test]
    fn small_runs_draw_every_point() {
        let plot = Plot::build(&|f| (0..50).try_for_each(|i| f(point(i, 1e-5))), &[])
            .expect("readable")
            .expect("a plot");
        assert_eq!(plot.drawn.len(), 50);
        assert_eq!(plot.bucketed, 0);
    }
}
