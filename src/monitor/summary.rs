//! `summary.json` of a monitor compare or scan (`schemas/probe-monitor-summary.v1.schema.json`):
//! the verdict and exit code, the headline, where the runs part (or the run's events), and
//! the recapture configuration's path.

use super::events::{Event, EventRun};
use super::module_label;
use super::recapture::Target;
use super::trend::{OneSide, Parting, TrendRun, FLOOR};
use crate::gate::{FailOn, EXIT_INCOMPLETE};
use crate::vocab::Verdict;
use serde::Serialize;
use std::collections::BTreeMap;

/// At most this many events in `summary.json` (the table has them all).
pub const EVENTS_LISTED: usize = 100;

/// How a trend's envelopes were made.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Calibrated on this many first steps (0: one envelope was given).
    pub steps: usize,
    /// A series parts beyond `k` times its largest difference there.
    pub k: f64,
    /// The least calibrated envelope.
    pub floor: f64,
    /// The envelope given (`--envelope`).
    pub envelope: Option<f64>,
}

/// `summary.json` of a monitor compare (`kind: trend`) or scan (`kind: scan`).
#[derive(Debug, Clone, Serialize)]
pub struct MonitorSummary {
    /// Always `probe-monitor-summary`.
    pub format: &'static str,
    /// Schema version: 1.
    pub version: u32,
    /// `trend` (two runs) or `scan` (one).
    pub kind: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// The level at which the gate fails.
    pub fail_on: FailOn,
    /// The exit status.
    pub exit_code: u8,
    /// One line that tells the story.
    pub headline: String,
    /// The benchmark monitor (trend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bench: Option<String>,
    /// The comparison monitor (trend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmp: Option<String>,
    /// The monitor scanned (scan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The ranks read (trend: compared).
    pub ranks: Vec<u32>,
    /// The most steps of a rank (trend: shared by both runs).
    pub steps: usize,
    /// Trend: the series judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<usize>,
    /// Trend: the series of the ranks compared that one run lacks (not compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series_one_side: Option<OneSide>,
    /// Trend: how the envelopes were made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// Trend: where the runs part (null: nowhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parting: Option<Option<Parting>>,
    /// Scan: the first events, first first (at most [`EVENTS_LISTED`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Event>>,
    /// Scan: how many events in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_total: Option<usize>,
    /// The recapture configuration written (null: nothing to recapture).
    pub recapture: Option<String>,
    /// The report files by format.
    pub outputs: BTreeMap<String, String>,
    /// What was left out or doubtful.
    pub warnings: Vec<String>,
}

impl MonitorSummary {
    /// The verdict's name (`pass`, `warning`, `error`).
    pub fn verdict_name(&self) -> &'static str {
        self.verdict.name()
    }
}

/// A number as the headline writes it.
fn n(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.6e}"))
}

/// The headline of a parting.
fn parting_line(p: &Parting) -> String {
    let s = &p.series;
    let fed = p
        .producer
        .as_deref()
        .map(|m| format!(", fed by {}", module_label(m)))
        .unwrap_or_default();
    format!(
        "the runs part at step {} (rank {}): {} {} {} vs {} (difference {:.1e} > envelope {:.1e}{fed}); {} series part there",
        p.step,
        s.rank,
        module_label(&s.module),
        s.metric,
        n(s.bench),
        n(s.cmp),
        s.difference.unwrap_or(f64::NAN),
        s.envelope,
        p.parting_series
    )
}

/// What a trend recaptures.
pub fn trend_target(t: &TrendRun) -> Option<Target> {
    let p = t.parting.as_ref()?;
    Some(Target {
        step: p.step,
        previous_step: p.previous_step,
        rank: p.series.rank,
        module: p.series.module.clone(),
        producer: p.producer.clone(),
        reason: parting_line(p),
    })
}

/// The headline of an event.
fn event_line(e: &Event) -> String {
    let fed = e
        .producer
        .as_deref()
        .map(|m| format!(", fed by {}", module_label(m)))
        .unwrap_or_default();
    let against = match (e.baseline, e.score) {
        (Some(b), Some(z)) => format!(" (trailing median {b:.4e}, robust score {z:.1})"),
        (Some(b), None) => format!(" (against {b:.4e})"),
        _ => String::new(),
    };
    format!(
        "{} at step {} (rank {}): {} {} = {}{against}{fed}",
        e.kind.name(),
        e.step,
        e.rank,
        module_label(&e.module),
        e.metric,
        n(e.value)
    )
}

/// What a scan recaptures: its first event.
pub fn scan_target(r: &EventRun) -> Option<Target> {
    let e = r.events.first()?;
    Some(Target {
        step: e.step,
        previous_step: e.previous_step,
        rank: e.rank,
        module: e.module.clone(),
        producer: e.producer.clone(),
        reason: event_line(e),
    })
}

/// The summary of a trend.
pub fn of_trend(
    t: &TrendRun,
    opts: &super::trend::TrendOptions,
    fail_on: FailOn,
    recapture: Option<String>,
    outputs: BTreeMap<String, String>,
) -> MonitorSummary {
    let verdict = if t.parting.is_some() {
        Verdict::Error
    } else {
        Verdict::Pass
    };
    let headline = t.parting.as_ref().map_or_else(
        || {
            format!(
                "the runs do not part: {} steps, {} series within their envelopes",
                t.steps,
                t.series.len()
            )
        },
        parting_line,
    );
    let mut exit_code = fail_on.exit_code(verdict);
    if exit_code == 0 && t.unpaired > 0 {
        exit_code = EXIT_INCOMPLETE;
    }
    MonitorSummary {
        format: "probe-monitor-summary",
        version: 1,
        kind: "trend",
        verdict,
        fail_on,
        exit_code,
        headline,
        bench: Some(t.bench.display().to_string()),
        cmp: Some(t.cmp.display().to_string()),
        run: None,
        ranks: t.ranks.clone(),
        steps: t.steps,
        series: Some(t.series.len()),
        series_one_side: Some(t.one_side),
        calibration: Some(Calibration {
            steps: t.window,
            k: opts.k,
            floor: FLOOR,
            envelope: opts.envelope,
        }),
        parting: Some(t.parting.clone()),
        events: None,
        events_total: None,
        recapture,
        outputs,
        warnings: t.warnings.clone(),
    }
}

/// The summary of a scan.
pub fn of_scan(
    r: &EventRun,
    fail_on: FailOn,
    recapture: Option<String>,
    outputs: BTreeMap<String, String>,
) -> MonitorSummary {
    let verdict = r
        .events
        .iter()
        .map(|e| e.kind.verdict())
        .max()
        .unwrap_or(Verdict::Pass);
    let headline = r.events.first().map_or_else(
        || format!("no event in {} steps", r.steps),
        |e| format!("first event: {}", event_line(e)),
    );
    MonitorSummary {
        format: "probe-monitor-summary",
        version: 1,
        kind: "scan",
        verdict,
        fail_on,
        exit_code: fail_on.exit_code(verdict),
        headline,
        bench: None,
        cmp: None,
        run: Some(r.root.display().to_string()),
        ranks: r.ranks.clone(),
        steps: r.steps,
        series: None,
        series_one_side: None,
        calibration: None,
        parting: None,
        events: Some(r.events.iter().take(EVENTS_LISTED).cloned().collect()),
        events_total: Some(r.events.len()),
        recapture,
        outputs,
        warnings: r.warnings.clone(),
    }
}
