//! The plot drawn as inline SVG: module bands, the decade grid, phase rules, the
//! tolerance, one line per direction, the points with their tooltips, the culprit marks,
//! the axes and legend, and the note saying what was bucketed.

use super::plot::{Drawn, Mark, Plot, BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH};
use super::{esc, MAX_FAILING, MAX_RUNS};
use crate::compare::Verdict;
use crate::op_key::Direction;
use std::fmt::Write as _;

const FORWARD: &str = "#1f6fb4";
const BACKWARD: &str = "#e8700c";
const FAIL: &str = "#c8102e";

impl Plot {
    pub(super) fn svg(&self, out: &mut String, marks: &[Mark]) {
        let _ = writeln!(
            out,
            "<svg id=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"error per tensor along execution order, log scale\">"
        );
        self.bands(out);
        self.grid(out);
        self.phases(out);
        self.tolerance(out);
        self.lines(out);
        self.points(out);
        self.culprits(out, marks);
        self.frame(out);
        out.push_str("</svg>\n");
        self.note(out);
    }

    /// Module bands, alternating, labelled where wide enough.
    fn bands(&self, out: &mut String) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (TOP, HEIGHT - BOTTOM);
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
    }

    /// The decade grid and its labels.
    fn grid(&self, out: &mut String) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
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
    }

    /// Phase boundaries (direction, step/rank) as vertical rules with labels below.
    fn phases(&self, out: &mut String) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (TOP, HEIGHT - BOTTOM);
        let colw = (x1 - x0) / self.n as f64;
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
    }

    /// The tolerance, as a step line over pixel columns (a column without a tensor keeps
    /// the tolerance before it).
    fn tolerance(&self, out: &mut String) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
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
    }

    /// One line per direction, broken where the phase changes; through the nonzero errors
    /// only (identical tensors, often weights, would turn it into a comb).
    fn lines(&self, out: &mut String) {
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
    }

    /// The points, each with its tooltip.
    fn points(&self, out: &mut String) {
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
    }

    /// The culprit(s): a rule, a ring and a label each.
    fn culprits(&self, out: &mut String, marks: &[Mark]) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let y1 = HEIGHT - BOTTOM;
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
    }

    /// The axes, their titles and the legend.
    fn frame(&self, out: &mut String) {
        let (x0, x1) = (LEFT, WIDTH - RIGHT);
        let (y0, y1) = (TOP, HEIGHT - BOTTOM);
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
    }

    /// What the plot shows and what was bucketed, below it.
    fn note(&self, out: &mut String) {
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
