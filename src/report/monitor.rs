//! The reports of a monitor compare (`trend`) or scan: its summary, one table (the series
//! judged, or the events found; parquet, xlsx) and the html page with each metric drawn
//! over the steps and the step named marked.

use super::columns::{col, Cell, Column, Kind, Line};
use super::{Document, Overview, Table};
use crate::error::Result as ProbeResult;
use crate::monitor::events::{Event, EventRun};
use crate::monitor::summary::MonitorSummary;
use crate::monitor::trend::{SeriesResult, TrendRun};
use crate::monitor::{module_label, Curve};
use crate::vocab::Verdict;
use std::borrow::Cow;

/// A line of a monitor's table.
#[derive(Clone, Copy)]
pub enum MonitorLine<'a> {
    /// A series of two runs, judged.
    Series(&'a SeriesResult),
    /// An event of one run.
    Event(&'a Event),
}

/// A finished monitor compare or scan with its summary.
pub enum MonitorDocument<'a> {
    /// Two runs.
    Trend(&'a TrendRun, &'a MonitorSummary),
    /// One run.
    Scan(&'a EventRun, &'a MonitorSummary),
}

fn series<'a>(l: &Line<'a>) -> Option<&'a SeriesResult> {
    match *l {
        Line::Monitor(MonitorLine::Series(s)) => Some(s),
        _ => None,
    }
}

fn event<'a>(l: &Line<'a>) -> Option<&'a Event> {
    match *l {
        Line::Monitor(MonitorLine::Event(e)) => Some(e),
        _ => None,
    }
}

fn text(s: &str) -> Cell<'_> {
    Cell::Text(Cow::Borrowed(s))
}

/// A step as a number cell (steps are whole numbers far below 2^53).
fn step_cell(s: Option<i64>) -> Cell<'static> {
    Cell::Number(s.map(|s| s as f64))
}

/// The trend's table: every series of the two runs, the parting ones first.
pub(crate) const SERIES: &[Column] = &[
    col!("rank", "Rank", 7.0, Count, |l| Cell::Count(
        series(l).map_or(0, |s| u64::from(s.rank))
    )),
    col!("module", "Module", 36.0, Text, |l| text(
        series(l).map_or("", |s| module_label(&s.module))
    )),
    col!("metric", "Metric", 18.0, Text, |l| text(
        series(l).map_or("", |s| &s.metric)
    )),
    col!("verdict", "Verdict", 9.0, Text, |l| text(series(l).map_or(
        "",
        |s| if s.parts_at.is_some() {
            "error"
        } else {
            "pass"
        }
    ))),
    col!("parts_at", "Parts at step", 12.0, Number, |l| step_cell(
        series(l).and_then(|s| s.parts_at)
    )),
    col!("bench", "Bench", 13.0, Number, |l| Cell::Number(
        series(l).and_then(|s| s.bench)
    )),
    col!("cmp", "Cmp", 13.0, Number, |l| Cell::Number(
        series(l).and_then(|s| s.cmp)
    )),
    col!("difference", "Difference", 12.0, Number, |l| Cell::Number(
        series(l).and_then(|s| s.difference)
    )),
    col!("envelope", "Envelope", 12.0, Number, |l| Cell::Number(
        series(l).map(|s| s.envelope)
    )),
    col!("calibrated", "Calibrated", 12.0, Number, |l| Cell::Number(
        series(l).and_then(|s| s.calibrated)
    )),
    col!("worst_ratio", "Worst / envelope", 12.0, Number, |l| {
        Cell::Number(series(l).map(|s| s.worst_ratio))
    }),
];

/// The scan's table: every event of the run, first first.
pub(crate) const EVENTS: &[Column] = &[
    col!("kind", "Kind", 18.0, Text, |l| text(
        event(l).map_or("", |e| e.kind.name())
    )),
    col!("verdict", "Verdict", 9.0, Text, |l| text(
        event(l).map_or("", |e| e.kind.verdict().name())
    )),
    col!("step", "Step", 8.0, Number, |l| step_cell(
        event(l).map(|e| e.step)
    )),
    col!("rank", "Rank", 7.0, Count, |l| Cell::Count(
        event(l).map_or(0, |e| u64::from(e.rank))
    )),
    col!("module", "Module", 36.0, Text, |l| text(
        event(l).map_or("", |e| module_label(&e.module))
    )),
    col!("metric", "Metric", 18.0, Text, |l| text(
        event(l).map_or("", |e| &e.metric)
    )),
    col!("value", "Value", 13.0, Number, |l| Cell::Number(
        event(l).and_then(|e| e.value)
    )),
    col!("baseline", "Baseline", 13.0, Number, |l| Cell::Number(
        event(l).and_then(|e| e.baseline)
    )),
    col!("score", "Score", 9.0, Number, |l| Cell::Number(
        event(l).and_then(|e| e.score)
    )),
    col!("producer", "Fed by", 30.0, OptText, |l| Cell::OptText(
        event(l)
            .and_then(|e| e.producer.as_deref())
            .map(|p| Cow::Borrowed(module_label(p)))
    )),
];

impl MonitorDocument<'_> {
    fn summary(&self) -> &MonitorSummary {
        match self {
            MonitorDocument::Trend(_, s) | MonitorDocument::Scan(_, s) => s,
        }
    }
}

impl Document for MonitorDocument<'_> {
    fn stem(&self) -> &'static str {
        "monitor"
    }

    fn summary_json(&self) -> Result<String, String> {
        serde_json::to_string_pretty(self.summary()).map_err(|e| e.to_string())
    }

    fn overview(&self) -> ProbeResult<Overview> {
        let s = self.summary();
        let mut facts: Vec<(String, String)> = Vec::new();
        let mut fact = |k: &str, v: String| facts.push((k.to_string(), v));
        for (k, v) in [
            ("benchmark", &s.bench),
            ("comparison", &s.cmp),
            ("run", &s.run),
        ] {
            if let Some(v) = v {
                fact(k, v.clone());
            }
        }
        fact("ranks", s.ranks.len().to_string());
        fact("steps", s.steps.to_string());
        if let Some(c) = &s.calibration {
            fact(
                "envelopes",
                match c.envelope {
                    Some(e) => format!("{e:e} for every series (given)"),
                    None => format!(
                        "{} times the difference on the first {} steps (then of all the steps before), at least {:e}",
                        c.k, c.steps, c.floor
                    ),
                },
            );
        }
        if let Some(n) = s.series {
            fact("series", n.to_string());
        }
        if let Some(n) = s.events_total {
            fact("events", n.to_string());
        }
        if let Some(r) = &s.recapture {
            fact("recapture", r.clone());
        }
        fact("exit code", s.exit_code.to_string());
        for w in &s.warnings {
            fact("warning", w.clone());
        }
        Ok(Overview {
            verdict: s.verdict,
            headline: s.headline.clone(),
            facts,
            findings: Vec::new(),
            worst_ops: Vec::new(),
            ops: Vec::new(),
            ops_left_out: 0,
            plot: None,
        })
    }

    fn table(&self) -> Table<'_> {
        match *self {
            MonitorDocument::Trend(t, _) => Table {
                name: "series",
                columns: SERIES.iter().collect(),
                colour_by: "verdict",
                lines: Box::new(move |f| {
                    t.series
                        .iter()
                        .try_for_each(|s| f(Line::Monitor(MonitorLine::Series(s))))
                }),
                flagged: Some(|l| series(l).is_some_and(|s| s.parts_at.is_some())),
            },
            MonitorDocument::Scan(r, _) => Table {
                name: "events",
                columns: EVENTS.iter().collect(),
                colour_by: "verdict",
                lines: Box::new(move |f| {
                    r.events
                        .iter()
                        .try_for_each(|e| f(Line::Monitor(MonitorLine::Event(e))))
                }),
                flagged: Some(|l| event(l).is_some_and(|e| e.kind.verdict() != Verdict::Pass)),
            },
        }
    }

    fn sheets(&self) -> Vec<Table<'_>> {
        vec![self.table()]
    }

    fn curves(&self) -> &[Curve] {
        match self {
            MonitorDocument::Trend(t, _) => &t.curves,
            MonitorDocument::Scan(r, _) => &r.curves,
        }
    }
}
