//! A monitor's metrics over the steps: one small line chart per curve, each run a line,
//! the step the headline names marked. Drawn on a linear scale between the finite values'
//! extremes; a NaN/Inf value is a cross on the chart's top edge (it has no place on the
//! scale, and it is what the reader looks for).

use super::page::{esc, num};
use crate::monitor::Curve;
use std::fmt::Write as _;

const W: f64 = 600.0;
const H: f64 = 200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 26.0;
const COLOURS: [&str; 2] = ["#1f5fbf", "#e07b00"];

/// Draws every curve.
pub(super) fn curves(out: &mut String, curves: &[Curve]) {
    if curves.is_empty() {
        return;
    }
    out.push_str("<h2>Metrics over the steps</h2>\n<div class=\"curves\">\n");
    for c in curves {
        chart(out, c);
    }
    out.push_str("</div>\n");
}

fn chart(out: &mut String, c: &Curve) {
    let finite = || {
        c.lines
            .iter()
            .flat_map(|(_, v)| v.iter().flatten())
            .copied()
            .filter(|v| v.is_finite())
    };
    let (lo, hi) = finite().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    let (lo, hi) = if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo - 0.5 * lo.abs().max(1.0), hi + 0.5 * hi.abs().max(1.0))
    } else {
        (lo, hi)
    };
    let (x0, x1) = (
        c.steps.first().copied().unwrap_or(0) as f64,
        c.steps.last().copied().unwrap_or(1) as f64,
    );
    let span = (x1 - x0).max(1.0);
    let px = |s: i64| LEFT + (s as f64 - x0) / span * (W - LEFT - RIGHT);
    let py = |v: f64| TOP + (hi - v) / (hi - lo) * (H - TOP - BOTTOM);
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\"><title>{t}</title>\
<text class=\"lbl\" x=\"{LEFT}\" y=\"14\">{t}</text>\
<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#9aa3b2\"/>\
<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#9aa3b2\"/>\
<text x=\"4\" y=\"{ty}\">{hi}</text><text x=\"4\" y=\"{b}\">{lo}</text>\
<text x=\"{LEFT}\" y=\"{sy}\">step {x0}</text><text x=\"{rx}\" y=\"{sy}\" text-anchor=\"end\">{x1}</text>",
        t = esc(&c.title),
        b = H - BOTTOM,
        r = W - RIGHT,
        ty = TOP + 4.0,
        hi = num(hi),
        lo = num(lo),
        sy = H - 8.0,
        rx = W - RIGHT,
    );
    if let Some(m) = c.mark {
        let x = px(m);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{b}\" stroke=\"#c8102e\" stroke-dasharray=\"4 3\"/>\
<text x=\"{x:.1}\" y=\"{ty}\" fill=\"#c8102e\">step {m}</text>",
            b = H - BOTTOM,
            ty = TOP - 2.0,
        );
    }
    for (k, (label, values)) in c.lines.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut path = String::new();
        let mut pen_up = true;
        let mut crosses = String::new();
        for (s, v) in c.steps.iter().zip(values) {
            match v {
                Some(v) if v.is_finite() => {
                    let _ = write!(
                        path,
                        "{}{:.1},{:.1} ",
                        if pen_up { "M" } else { "L" },
                        px(*s),
                        py(*v)
                    );
                    pen_up = false;
                }
                Some(_) => {
                    let _ = write!(
                        crosses,
                        "<text x=\"{:.1}\" y=\"{TOP}\" fill=\"{colour}\" text-anchor=\"middle\">×</text>",
                        px(*s)
                    );
                    pen_up = true;
                }
                None => pen_up = true,
            }
        }
        let _ = write!(
            out,
            "<path d=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.4\"/>{crosses}\
<text x=\"{lx:.1}\" y=\"14\" fill=\"{colour}\">{}</text>",
            path.trim_end(),
            esc(label),
            lx = W - RIGHT - 150.0 + 75.0 * k as f64,
        );
    }
    out.push_str("</svg>\n");
}
