//! `summary.json` of a compare (`schemas/probe-compare-summary.v2.schema.json`): the
//! machine-readable verdict CI gates on, and the findings of the localiser it contains.

use super::compare::{ArgDiff, InputSizes, LossScale, MicroBatches, Region};
pub use super::sources::{Carried, OneSided, Outside, OutsideKind};
use crate::gate::FailOn;
use crate::op_key::Direction;
use crate::vocab::{FindingKind, Sides, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The verdict of a whole compare: the worst tensor verdict, or `incomplete` when what was
/// compared does not cover the runs (docs/compare.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunVerdict {
    /// Every compared tensor within tolerance, and the comparison complete.
    Pass,
    /// Warnings or unmatched tensors, nothing out of tolerance, the comparison complete.
    Warning,
    /// Some tensor out of tolerance (whether or not the comparison is complete).
    Error,
    /// Nothing out of tolerance in what was compared, but the comparison is incomplete:
    /// step/rank pairs not compared in full, or more than `--max-unmatched` of a side's
    /// tensors without a counterpart.
    Incomplete,
}

impl RunVerdict {
    /// How a report colours it: an incomplete comparison is a warning, not a pass.
    pub(crate) fn severity(self) -> Verdict {
        match self {
            RunVerdict::Pass => Verdict::Pass,
            RunVerdict::Warning | RunVerdict::Incomplete => Verdict::Warning,
            RunVerdict::Error => Verdict::Error,
        }
    }
}

/// A named op with the evidence for naming it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// The op key.
    pub op: String,
    /// Its step.
    pub step: String,
    /// Its rank.
    pub rank: String,
    /// Its sequence number.
    pub seq: u64,
    /// Forward or backward.
    pub direction: Direction,
    /// The tensor the finding is about (the worst output, or the failing input).
    pub tensor: String,
    /// The tensor's verdict reason.
    pub reason: String,
    /// Why this op is named, for a person.
    pub explanation: String,
    /// One line per input and output tensor of the op, with its metrics.
    pub evidence: Vec<String>,
    /// The op's call stack, outermost frame first.
    pub stack: Vec<String>,
    /// An input of the op read from memory nothing had written (leftover bytes, which the
    /// agent records as `unwritten`): the likely cause, where the op is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leftover: Option<String>,
    /// The op's non-tensor arguments that differ between the runs (the same API called on
    /// both sides): the likely cause, where the op is named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgDiff>,
    /// How the op's tensors lay in memory differently on the two sides, one sentence each
    /// (`cmp input.0 is a non-contiguous view (stride [1, 4]) where bench is contiguous`):
    /// evidence of a kernel reading memory other than as the other run's did. Empty where
    /// the dumps do not record layouts (docs/compare.md, "Layout evidence").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layout: Vec<String>,
    /// Where a divergence enters from outside the paired ops: the op only one run calls
    /// whose output is the differing input (code the port adds, or leaves out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_sided_source: Option<OneSided>,
    /// Where a divergence enters with a value the rank's previous step wrote: the captured
    /// op whose output it is, where it differed only by rounding noise the op amplified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<Carried>,
    /// The dotted path of the module the op ran in (`model.layers.1.mlp.down_proj`; a
    /// module record's own): what a person looks for in the model, where an op key
    /// (`Functional.linear.13`) names only a call. None when the dump does not say, or the
    /// op ran at the top level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The earlier step of the same rank that diverged first (`step0`), when there is one:
    /// this step started from what that step's diverged update left (weights, optimizer
    /// state), so the finding is a consequence of that divergence, not a first divergent
    /// op of its own. None in the rank's first diverged step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consequence_of: Option<String>,
    /// A random op's recorded switch that says it drew (`input.dropout_p = 0.1 on both
    /// sides`), where the finding is a different random draw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<String>,
    /// Where a divergence enters from outside the captured ops: what the differing input
    /// is, as far as the dump tells (a parameter, a parameter's gradient, data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside: Option<Outside>,
}

/// Sort key of a `step12` / `rank3` / `proc456` label: its number, then the name (so that
/// `step2` comes before `step10`).
pub(crate) fn label_key(s: &str) -> (u64, &str) {
    let digits: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    (digits.parse().unwrap_or(u64::MAX), s)
}

/// The causal order of findings over units: earlier step first (a later step inherits an
/// earlier step's divergence: its weights were updated from it), then execution order
/// within the step, then rank. Ranks run the same program, so the same sequence number is
/// about the same moment on each.
pub(crate) type CausalKey<'a> = ((u64, &'a str), u64, (u64, &'a str));

impl Finding {
    /// The op for a person: its key and, for an API call, the module it ran in
    /// (`Functional.linear.13.forward in `model.layers.1.mlp.down_proj``); a module
    /// record's key names its module already.
    pub(crate) fn named(&self) -> String {
        match &self.module {
            Some(m) if crate::op_key::module_path(&self.op).is_none() => {
                format!("{} in `{m}`", self.op)
            }
            _ => self.op.clone(),
        }
    }

    /// Where it is, for a headline: `(forward step0/rank1, tensor <name>)`.
    pub(crate) fn place(&self) -> String {
        format!(
            "({} {}/{}, tensor {})",
            self.direction.name(),
            self.step,
            self.rank,
            self.tensor
        )
    }

    /// A NaN/Inf producer for a headline: its op, how it got its values (from finite
    /// inputs, or from leftover bytes) and [`Finding::place`].
    pub(crate) fn nonfinite_producer(&self) -> String {
        let from = match &self.leftover {
            Some(t) => format!("from leftover bytes in {t}"),
            None => "from finite inputs".into(),
        };
        format!("{} {from} {}", self.named(), self.place())
    }

    /// What a headline adds about the cause it found at the op: leftover bytes read, or
    /// arguments that differ (at most three named), and a layout that differs (the first
    /// difference). Empty when none.
    pub(crate) fn cause(&self) -> String {
        if let Some(t) = &self.leftover {
            return format!(": it read leftover bytes in {t}");
        }
        let mut said = Vec::new();
        if !self.args.is_empty() {
            said.push(format!(
                "it was called with different arguments ({})",
                self.args_brief()
            ));
        }
        if let Some(first) = self.layout.first() {
            let more = match self.layout.len() {
                1 => String::new(),
                n => format!(" (and {} more layout differences)", n - 1),
            };
            said.push(format!("{first}{more}"));
        }
        if said.is_empty() {
            return String::new();
        }
        format!(": {}", said.join("; "))
    }

    /// The arguments that differ, as a headline lists them (at most three named).
    pub(crate) fn args_brief(&self) -> String {
        let named: Vec<String> = self.args.iter().take(3).map(ArgDiff::brief).collect();
        let more = match self.args.len() {
            n if n > 3 => format!(" and {} more", n - 3),
            _ => String::new(),
        };
        format!("{}{more}", named.join(", "))
    }

    /// Where this finding sits in the causal order ([`CausalKey`]).
    pub(crate) fn causal_key(&self) -> CausalKey<'_> {
        (label_key(&self.step), self.seq, label_key(&self.rank))
    }
}

/// A finding of a kind, in the phase it was found in (None for a kind with one in all:
/// `FindingKind::phased`).
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// What it says of its op.
    pub kind: FindingKind,
    /// Forward or backward phase (the backward phase holds the optimizer's update).
    pub phase: Option<Direction>,
    /// The op and the evidence.
    pub finding: Finding,
}

impl Found {
    /// A finding of a kind found in a phase.
    pub fn new(kind: FindingKind, phase: Option<Direction>, finding: Finding) -> Found {
        Found {
            kind,
            phase: phase.filter(|_| kind.phased()),
            finding,
        }
    }

    /// How reports title it: `first divergent op (forward)`; where a divergence enters
    /// with the previous step's value, it says so; in a step after an earlier one diverged,
    /// as a consequence of that step's divergence (`consequence of step0's divergence,
    /// first op whose error grows (forward)`), never as a first divergent op.
    pub fn title(&self) -> String {
        let what = match (self.kind, &self.finding.consequence_of) {
            (k, Some(step)) => format!(
                "consequence of {step}'s divergence, {}",
                k.consequence_title()
            ),
            (FindingKind::ExternalSource, None) if self.finding.carried.is_some() => {
                "divergence enters with the previous step's value".to_string()
            }
            (k, None) => k.title().to_string(),
        };
        match self.phase {
            Some(d) => format!("{what} ({})", d.name()),
            None => what,
        }
    }

    /// Whether it names the culprit of a divergence (`FindingKind::names_culprit`), which
    /// a consequence of an earlier step's divergence never does.
    pub fn names_culprit(&self) -> bool {
        self.kind.names_culprit() && self.finding.consequence_of.is_none()
    }

    /// Where it sits among findings: the causal order ([`Finding::causal_key`]), then its
    /// kind's listing order, then its phase.
    pub(crate) fn order_key(&self) -> (CausalKey<'_>, FindingKind, Option<Direction>) {
        (self.finding.causal_key(), self.kind, self.phase)
    }
}

/// What the localiser found in one unit (step/rank pair), or over a whole compare: typed
/// findings, at most one of each kind and phase, in listing order (kind, then phase), and
/// the phases whose errors no op is locally responsible for (accumulated drift; a unit's
/// only). `summary.json` writes them under one key per kind, as schema v2 always has
/// (`FindingsWire`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "FindingsWire", into = "FindingsWire")]
pub struct Findings {
    found: Vec<Found>,
    drift: Vec<Direction>,
}

impl Findings {
    /// Findings in any order (the first of a kind and phase is kept), and the drifting phases.
    pub fn new(mut found: Vec<Found>, drift: Vec<Direction>) -> Findings {
        found.sort_by_key(|f| (f.kind, f.phase));
        found.dedup_by_key(|f| (f.kind, f.phase));
        Findings { found, drift }
    }

    /// Every finding, in listing order.
    pub fn iter(&self) -> impl Iterator<Item = &Found> {
        self.found.iter()
    }

    /// The finding of a kind in a phase (None for a kind with one in all).
    pub fn get(&self, kind: FindingKind, phase: Option<Direction>) -> Option<&Finding> {
        let phase = phase.filter(|_| kind.phased());
        self.found
            .iter()
            .find(|f| f.kind == kind && f.phase == phase)
            .map(|f| &f.finding)
    }

    /// The findings of a kind, forward first.
    pub fn of(&self, kind: FindingKind) -> impl Iterator<Item = &Found> {
        self.found.iter().filter(move |f| f.kind == kind)
    }

    /// The first finding of a kind, forward first.
    pub(crate) fn first(&self, kind: FindingKind) -> Option<&Finding> {
        self.of(kind).next().map(|f| &f.finding)
    }

    /// The phases with errors and no locally divergent op (a unit's only).
    pub fn drift(&self) -> &[Direction] {
        &self.drift
    }

    /// These findings less those `drop` says (drift kept).
    pub(crate) fn without(self, drop: impl Fn(&Found) -> bool) -> Findings {
        let found = self.found.into_iter().filter(|f| !drop(f)).collect();
        Findings::new(found, self.drift)
    }

    /// The earliest finding of each kind and phase over many (units' findings, run-wide):
    /// in causal order (`Finding::causal_key`: step, then execution order, then rank).
    pub fn earliest<'a>(all: impl Iterator<Item = &'a Findings>) -> Findings {
        let mut found: Vec<Found> = Vec::new();
        for f in all.flat_map(Findings::iter) {
            match found
                .iter_mut()
                .find(|o| o.kind == f.kind && o.phase == f.phase)
            {
                Some(o) if f.finding.causal_key() < o.finding.causal_key() => *o = f.clone(),
                Some(_) => {}
                None => found.push(f.clone()),
            }
        }
        Findings::new(found, Vec::new())
    }
}

/// Per-phase findings of a kind, as `summary.json` holds them (a scan's too).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct ByDirection {
    /// In the forward phase.
    pub forward: Option<Finding>,
    /// In the backward phase (optimizer included).
    pub backward: Option<Finding>,
}

impl ByDirection {
    /// The slot of a direction.
    pub(crate) fn slot(&mut self, d: Direction) -> &mut Option<Finding> {
        match d {
            Direction::Forward => &mut self.forward,
            Direction::Backward => &mut self.backward,
        }
    }
}

/// Findings as `summary.json` holds them (schema v2): one key per kind; a unit's with its
/// `drift`, the run's ([`RunFindings`]) without.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
struct FindingsWire {
    first_divergent: ByDirection,
    earliest_failing: ByDirection,
    external_source: ByDirection,
    first_nonfinite: Option<Finding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drift: Option<Vec<Direction>>,
    #[serde(default)]
    random_draw: ByDirection,
    #[serde(default)]
    near_tie: ByDirection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    other_args: Option<Finding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_warning: Option<Finding>,
}

impl FindingsWire {
    /// Where a finding of a kind and phase goes (a phased kind's without a phase: forward).
    fn slot(&mut self, kind: FindingKind, phase: Option<Direction>) -> &mut Option<Finding> {
        let by = match kind {
            FindingKind::FirstNonfinite => return &mut self.first_nonfinite,
            FindingKind::OtherArgs => return &mut self.other_args,
            FindingKind::FirstWarning => return &mut self.first_warning,
            FindingKind::FirstDivergent => &mut self.first_divergent,
            FindingKind::EarliestFailing => &mut self.earliest_failing,
            FindingKind::ExternalSource => &mut self.external_source,
            FindingKind::RandomDraw => &mut self.random_draw,
            FindingKind::NearTie => &mut self.near_tie,
        };
        by.slot(phase.unwrap_or(Direction::Forward))
    }
}

impl From<Findings> for FindingsWire {
    fn from(f: Findings) -> FindingsWire {
        let mut w = FindingsWire {
            drift: Some(f.drift),
            ..FindingsWire::default()
        };
        for x in f.found {
            *w.slot(x.kind, x.phase) = Some(x.finding);
        }
        w
    }
}

impl From<FindingsWire> for Findings {
    fn from(mut w: FindingsWire) -> Findings {
        let mut found = Vec::new();
        for kind in FindingKind::ALL {
            let phases: &[Option<Direction>] = if kind.phased() {
                &[Some(Direction::Forward), Some(Direction::Backward)]
            } else {
                &[None]
            };
            for &phase in phases {
                if let Some(f) = w.slot(kind, phase).take() {
                    found.push(Found::new(kind, phase, f));
                }
            }
        }
        Findings::new(found, w.drift.take().unwrap_or_default())
    }
}

/// The findings over a whole compare: the earliest of each kind and phase over every pair
/// ([`Findings::earliest`]; no drift), written in `summary.json` beside the counts, one
/// key per kind, as schema v2 always has (`FindingsWire` without `drift`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "FindingsWire", into = "FindingsWire")]
pub struct RunFindings(pub Findings);

impl std::ops::Deref for RunFindings {
    type Target = Findings;
    fn deref(&self) -> &Findings {
        &self.0
    }
}

impl From<RunFindings> for FindingsWire {
    fn from(f: RunFindings) -> FindingsWire {
        FindingsWire {
            drift: None,
            ..FindingsWire::from(f.0)
        }
    }
}

impl From<FindingsWire> for RunFindings {
    fn from(w: FindingsWire) -> RunFindings {
        RunFindings(Findings::from(w))
    }
}

/// Tensor counts over the whole compare.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Counts {
    /// Step/rank pairs compared.
    pub pairs: usize,
    /// Op records on the comparison side.
    pub ops: usize,
    /// Tensors present on both sides.
    pub tensors: usize,
    /// Tensors within tolerance.
    pub pass: usize,
    /// Tensors past the warning threshold.
    pub warning: usize,
    /// Tensors out of tolerance.
    pub error: usize,
    /// Tensors in the benchmark only.
    pub unmatched_bench: usize,
    /// Tensors in the comparison only.
    pub unmatched_cmp: usize,
    /// Tensors by how they were compared (tensor, statistics, checksum, none).
    pub compared_by: BTreeMap<String, usize>,
    /// Tensors by how they were paired (exact, aligned, mapped, module).
    #[serde(default)]
    pub matched_by: BTreeMap<String, usize>,
    /// Tensors of recomputed calls (activation checkpointing) only one side made: neither
    /// compared nor missing.
    #[serde(default)]
    pub recompute: usize,
    /// Tensors inside regions compared at their boundary (mapped or module): neither
    /// compared nor missing.
    #[serde(default)]
    pub inside: usize,
    /// Tensors of views and casts of APIs the other run records no call of (its dumper
    /// does not hook them): neither compared nor missing.
    #[serde(default)]
    pub unhooked: usize,
    /// Tensors one-sided because of a loss scaler: its arithmetic in a run that scales its
    /// loss while the other does not, and the update of a step one run's scaler skipped
    /// (the other's optimizer calls): neither compared nor missing.
    #[serde(default)]
    pub loss_scaler: usize,
    /// Tensors judged against a reference run's envelope (`--reference`): the others of
    /// those measured fell back to the tolerances (the reference lacks them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calibrated: usize,
}

/// Whether a count is 0 (left out of the JSON).
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Counts {
    /// Adds another part's counts (a unit's to the run's).
    pub(crate) fn add(&mut self, o: &Counts) {
        self.pairs += o.pairs;
        self.ops += o.ops;
        self.tensors += o.tensors;
        self.pass += o.pass;
        self.warning += o.warning;
        self.error += o.error;
        self.unmatched_bench += o.unmatched_bench;
        self.unmatched_cmp += o.unmatched_cmp;
        self.recompute += o.recompute;
        self.inside += o.inside;
        self.unhooked += o.unhooked;
        self.loss_scaler += o.loss_scaler;
        self.calibrated += o.calibrated;
        for (into, from) in [
            (&mut self.compared_by, &o.compared_by),
            (&mut self.matched_by, &o.matched_by),
        ] {
            for (k, n) in from {
                *into.entry(k.clone()).or_default() += n;
            }
        }
    }

    /// Tensors found on one side only, whatever the reason (missing, recomputed, inside a
    /// region, unhooked, a loss scaler's).
    pub(crate) fn one_sided(&self) -> usize {
        self.unmatched_bench
            + self.unmatched_cmp
            + self.recompute
            + self.inside
            + self.unhooked
            + self.loss_scaler
    }
}

/// One step/rank pair in the summary.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PairSummary {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// The benchmark's rank folder.
    pub bench: String,
    /// The comparison's rank folder.
    pub cmp: String,
    /// Tensors compared.
    pub tensors: usize,
    /// Of which out of tolerance.
    pub errors: usize,
    /// Of which past the warning threshold.
    pub warnings: usize,
    /// Tensors on one side only.
    pub unmatched: usize,
    /// Per side, the share of its tensors in this pair without a counterpart.
    pub unmatched_fraction: Sides<f64>,
    /// What the localiser found.
    pub findings: Findings,
    /// Stretches whose code paths differ, compared at their boundary tensors.
    #[serde(default)]
    pub regions: Vec<Region>,
    /// The comparison run's gradients over the benchmark's when a power of two (a loss
    /// scale): its gradients were compared divided by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScale>,
    /// Which run's loss scaler skipped this step (`bench`, `cmp`, `both`): its gradients
    /// overflowed under the loss scale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaler_skipped: Option<String>,
    /// Forward passes a step on each side, when the runs differ in micro-batching (gradient
    /// accumulation): their calls pair only in part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batches: Option<MicroBatches>,
    /// The elements each run's first call of an API reads, when the runs' whole first
    /// forward pass reads data of other sizes (not micro-batching): every call then reads
    /// other data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_sizes: Option<InputSizes>,
}

/// One of the worst ops of the compare.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorstOp {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// Sequence number.
    pub seq: u64,
    /// Op key.
    pub op: String,
    /// The op's worst verdict.
    pub verdict: Verdict,
    /// The largest judged error among the op's tensors (null when infinite).
    pub err: Option<f64>,
    /// The tensor with that error.
    pub tensor: String,
    /// Its verdict reason.
    pub reason: String,
}

/// A step/rank pair that was not compared in full: present on one side only, empty on one
/// side, or cut short by a crash (docs/compare.md, "What is guaranteed after a crash").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IncompleteUnit {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// The side that lacks something: `bench`, `cmp` or `both`.
    pub side: String,
    /// Whether what both sides hold was compared (false: nothing of this pair was).
    pub compared: bool,
    /// What is missing, in a few words.
    pub reason: String,
}

/// The content of `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Always `probe-compare-summary`.
    pub format: String,
    /// Schema version: 2 (1 had no `incomplete` verdict and no unmatched fractions).
    pub version: u32,
    /// The verdict of the compare.
    pub verdict: RunVerdict,
    /// The level at which the gate fails.
    pub fail_on: FailOn,
    /// The largest share of a side's tensors (in the whole compare, or in one step/rank
    /// pair) that may lack a counterpart before the comparison is incomplete.
    pub max_unmatched: f64,
    /// Per side, the share of its compared pairs' tensors without a counterpart.
    pub unmatched_fraction: Sides<f64>,
    /// The exit status of `probe compare`.
    pub exit_code: u8,
    /// One line that tells the story.
    pub headline: String,
    /// The benchmark path as given.
    pub bench: String,
    /// The comparison path as given.
    pub cmp: String,
    /// Tensor counts.
    pub counts: Counts,
    /// The earliest findings over all pairs, one key per kind (`first_divergent`,
    /// `earliest_failing`, `external_source`, `first_nonfinite`, `random_draw`, `near_tie`,
    /// `other_args`, `first_warning`): [`RunFindings`].
    #[serde(flatten)]
    pub findings: RunFindings,
    /// Every pair with its findings.
    pub pairs: Vec<PairSummary>,
    /// The ops with the worst verdicts and errors.
    pub worst_ops: Vec<WorstOp>,
    /// Non-fatal problems.
    pub warnings: Vec<String>,
    /// True when some step/rank pairs were not compared in full (`incomplete_units`).
    #[serde(default)]
    pub partial: bool,
    /// The pairs not compared in full, in step/rank order.
    #[serde(default)]
    pub incomplete_units: Vec<IncompleteUnit>,
    /// Report files written, by format.
    pub outputs: BTreeMap<String, String>,
    /// Distributed runs: the rank where the divergence began, on the timeline of
    /// collectives (docs/compare.md, "Distributed runs"); absent when no divergence crossed
    /// ranks through a recorded collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Distributed runs: the ranks that inherited the divergence, and through which
    /// collective.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub propagation: Vec<Propagation>,
    /// What the verdicts were calibrated against (`--reference`, or a calibration file
    /// given as `--config`; docs/compare.md, "Drift or defect"); absent without either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationUse>,
    /// `recapture.json`, when the first divergent op was dumped without its tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recapture: Option<super::compare::RecaptureNote>,
}

/// How a compare used a reference run or a calibration file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CalibrationUse {
    /// `reference` (a reference run) or `file` (a calibration file).
    pub by: String,
    /// The reference run or the file, as given.
    pub path: String,
    /// A tensor passes within `k` times the reference's error on it (at least the dtype's
    /// floor).
    pub k: f64,
    /// Tensors judged against the reference's envelope.
    pub calibrated: usize,
    /// Tensors measured that the reference lacks (or no rule of the file matches): judged
    /// by the tolerances.
    pub fallback: usize,
}

impl Summary {
    /// [`Summary::other_args`] where it adds to the other findings: not when one of them
    /// names the same call (a first divergent op called differently says so itself).
    pub(crate) fn other_args_hint(&self) -> Option<&Finding> {
        let o = self.findings.get(FindingKind::OtherArgs, None)?;
        let same = |f: &Found| {
            let f = &f.finding;
            f.op == o.op && f.step == o.step && f.rank == o.rank
        };
        let told = |f: &&Found| f.kind.story_rank().is_some();
        (!self.findings.iter().filter(told).any(same)).then_some(o)
    }
}

impl CalibrationUse {
    /// How a compare of counts `c` used calibration `by` (`reference` or `file`) at `path`
    /// with `k`: the tensors measured (full tensors or statistics) that it calibrated, and
    /// the others.
    pub(crate) fn of(by: &str, path: &std::path::Path, k: f64, c: &Counts) -> CalibrationUse {
        let measured = ["tensor", "statistics"]
            .iter()
            .filter_map(|k| c.compared_by.get(*k))
            .sum::<usize>();
        CalibrationUse {
            by: by.into(),
            path: path.display().to_string(),
            k,
            calibrated: c.calibrated,
            fallback: measured.saturating_sub(c.calibrated),
        }
    }

    /// The warning a calibration file gives when its rules match fewer than half the
    /// tensors measured: it was made from another model or capture, and the rest were
    /// judged by the tolerances. (A reference run that lacks tensors says so per unit.)
    pub(crate) fn warning(&self) -> Option<String> {
        (self.by == "file" && self.fallback > self.calibrated).then(|| {
            format!(
                "the calibration file {} matches {} of the {} tensors measured (one made \
                 from another model, configuration or capture?): the other {} were judged \
                 by the dtype tolerances",
                self.path,
                self.calibrated,
                self.calibrated + self.fallback,
                self.fallback
            )
        })
    }
}

/// One collective call as the cross-rank analysis names it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Via {
    /// The collective's op key.
    pub op: String,
    /// The global ranks of its process group.
    pub group: Vec<u32>,
    /// Its sequence number within the group and step.
    pub coll_seq: u64,
}

/// Where a distributed divergence began.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Origin {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// `op`: a rank's own op diverged first; `collective`: a collective whose inputs agree
    /// on every rank of its group returned a different output (faulty communication).
    pub kind: String,
    /// The op key (for `collective`, the collective's).
    pub op: String,
    /// Its sequence number on that rank.
    pub seq: u64,
    /// Collectives on that rank before the op (ops of the same epoch run concurrently
    /// across ranks).
    pub epoch: u64,
    /// Forward or backward.
    pub direction: Direction,
    /// The tensor the finding is about.
    pub tensor: String,
    /// For `collective`: the collective call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<Via>,
}

/// A rank that inherited a divergence through a collective.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Propagation {
    /// Step label.
    pub step: String,
    /// Rank label.
    pub rank: String,
    /// The collective whose output is the rank's first divergence while its local inputs
    /// agree.
    pub via: Via,
    /// The ranks of the group whose input to the same collective differed (empty: the
    /// collective itself returned a different output).
    pub from_ranks: Vec<u32>,
}
