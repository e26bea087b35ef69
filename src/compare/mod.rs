//! The compare pipeline, one stage per module, each handing the next an immutable value:
//!
//! ```text
//! plan     two dump roots            -> Plan { units: [Unit] }         (one step/rank pair each)
//! align    Sides<RankDump>           -> Alignment { matches, unmatched }  (Aligner trait)
//! measure  TensorMatch               -> Measured  (metrics / statistics differences, parallel)
//! judge    [Measured]                -> [Row]     (verdict, reason, tolerance, precision)
//! analyze  [Row]                     -> Findings  (first divergent op, outside source, NaN)
//!          every unit                -> UnitSummary + parked UnitTable
//!          all units                 -> CompareRun { units: [UnitSummary], tables }
//! ```
//! The run-wide verdict ([`crate::verdict`]) and the reports ([`crate::report`]) read a
//! [`CompareRun`] only; a unit's result is self-contained, so units can be compared apart
//! (sharded) and their results combined. Its rows are parked ([`tables`]) so that a run's
//! memory does not grow with its number of units.

pub mod align;
pub mod analyze;
pub mod coverage;
pub mod cross_rank;
pub mod judge;
pub mod judged;
pub mod loss_scale;
pub mod mapping;
pub mod measure;
pub mod micro_batch;
pub mod op_rows;
pub mod plan;
pub mod shard;
pub mod structural;
pub mod tables;
pub mod tolerance;

use crate::dtype::DType;
use crate::dump::{self, Selection};
use crate::error::{ProbeError, Result};
use crate::progress::{Count, Progress};
use crate::schema::summary::{Counts, Findings, IncompleteUnit, WorstOp};
use crate::tensor::ShardCache;
pub use crate::vocab::{MatchedBy, Side, Sides, Verdict};
pub use align::{
    Aligner, Alignment, NameAligner, OpInfo, Region, TensorMatch, TensorRef, Unmatched, Why,
};
pub use judge::{Judgement, Row};
pub use judged::Judged;
pub use mapping::{MapRule, Mapping, MappingError};
pub use measure::{CompareKind, Measured, Measurement, TensorSide};
pub use plan::{Plan, Unit};
use serde::{Deserialize, Serialize};
pub use shard::{Frame, Outcome, RunPart, Shard};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
pub use structural::StructuralAligner;
pub use tables::{Parked, Parking, RowMemory, Tables, UnitRows, UnitTable};
pub use tolerance::Tolerances;

/// What a unit found, without its rows: small, held for every unit of a run; all the
/// run-wide verdict reads (its rows are in the run's [`Tables`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitSummary {
    /// Step label (`step0`), as on the comparison side.
    pub step: String,
    /// Rank label (`rank0`, `proc123`), as on the comparison side.
    pub rank: String,
    /// The two rank folders.
    pub dirs: Sides<PathBuf>,
    /// Op records of the comparison side.
    pub ops: usize,
    /// Stretches whose code paths differ, compared at their boundary tensors.
    pub regions: Vec<Region>,
    /// What the localiser found.
    pub findings: Findings,
    /// Non-fatal problems met while reading this unit.
    pub warnings: Vec<String>,
    /// Set when a side of this unit is incomplete (a crashed run).
    pub incomplete: Option<IncompleteUnit>,
    /// How much of each side found a counterpart (`--max-unmatched`).
    pub coverage: Sides<coverage::SideCoverage>,
    /// What this unit leaves to the rank's next step.
    pub carry: Carry,
    /// The comparison side's collectives (cross-rank analysis).
    pub collectives: cross_rank::Collectives,
    /// Tensor counts of this unit (`pairs` 1, `ops` as above).
    pub counts: Counts,
    /// The unit's worst ops, worst first, at most [`WORST_OPS`]: the run's worst ops are
    /// the worst of these.
    pub worst: Vec<WorstCandidate>,
    /// Ops with compared tensors, and how many of them fail: the error chart's size, known
    /// before its one pass over the rows.
    pub chart: ChartCounts,
    /// The comparison run's gradients over the benchmark's, when a power of two
    /// (`loss_scale`): its gradients were compared divided by it.
    #[serde(default)]
    pub loss_scale: Option<loss_scale::LossScale>,
    /// Which run's loss scaler skipped this step (`bench`, `cmp`, `both`), if any.
    #[serde(default)]
    pub scaler_skipped: Option<String>,
    /// Forward passes a step on each side, when the runs differ in micro-batching.
    #[serde(default)]
    pub micro_batches: Option<micro_batch::MicroBatches>,
    /// The size of the data the runs' first forward pass reads, when it differs and is not
    /// micro-batching.
    #[serde(default)]
    pub input_sizes: Option<micro_batch::InputSizes>,
    /// Whether each side ran compiled code while it was captured (its manifest says so).
    #[serde(default)]
    pub compiled: Sides<bool>,
}

/// What a rank's step leaves to the comparison of its next step (units of a rank are
/// compared in step order, in one process: `compare_part`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Carry {
    /// The step it comes from (empty: none, a rank's first step).
    pub step: String,
    /// The precision floor its steps so far left (judge.rs).
    pub floor: Option<DType>,
    /// The outputs of that step that differed only by rounding noise they amplified
    /// (judge.rs, `NoiseWrite`): an input of the next step with their statistics is their
    /// value, carried over.
    pub noise: Vec<judge::NoiseWrite>,
}

impl Carry {
    /// The noise write whose value `t` is: both runs' statistics equal to its, bit for bit.
    pub fn noise_write(&self, t: &Measured) -> Option<&judge::NoiseWrite> {
        let s = &t.sides;
        let bits = Sides::new(
            s.bench.stats.as_ref()?.fingerprint()?,
            s.cmp.stats.as_ref()?.fingerprint()?,
        );
        self.noise.iter().find(|w| w.stats == bits)
    }
}

/// How many ops a unit's rows hold (consecutive rows of one op) and how many of them have
/// an out-of-tolerance tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChartCounts {
    /// Ops.
    pub ops: usize,
    /// Of which failing.
    pub failing: usize,
}

/// Consecutive rows of one op (an op's tensors are adjacent in a unit's rows): the ops the
/// chart and the per-op table show.
pub fn op_groups(rows: &[Row]) -> impl Iterator<Item = &[Row]> {
    rows.chunk_by(|a, b| a.tensor.op.index == b.tensor.op.index)
}

/// How many worst ops a unit keeps, and the summary lists.
pub const WORST_OPS: usize = 20;

/// An op among the worst: its line in `worst_ops`, and its judged error as measured (the
/// line's `err` is null when infinite; ordering needs the value).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorstCandidate {
    /// The line.
    pub op: WorstOp,
    /// The judged error of the op's worst tensor.
    pub err: f64,
}

impl WorstCandidate {
    /// Worst first: verdict, then error (NaN above everything, `total_cmp`).
    pub fn order(a: &WorstCandidate, b: &WorstCandidate) -> std::cmp::Ordering {
        b.op.verdict
            .cmp(&a.op.verdict)
            .then(b.err.total_cmp(&a.err))
    }
}

impl UnitSummary {
    /// About how many bytes its table takes in memory (what `--row-memory` counts).
    pub fn weight(&self) -> usize {
        tables::weight(self.counts.tensors + self.counts.one_sided())
    }
}

/// What one pass over a unit's judged pairs gathers for its summary: its counts, its worst
/// ops and the chart's size. Rows are made only for the ops that enter the worst list.
struct Tally<'u> {
    unit: &'u Unit,
    counts: Counts,
    /// The worst ops so far, at most [`WORST_OPS`], worst first (ties in op order).
    worst: Vec<WorstCandidate>,
    chart: ChartCounts,
}

impl<'u> Tally<'u> {
    /// Nothing counted yet, for a unit of `ops` op records (comparison side).
    fn new(unit: &'u Unit, ops: usize) -> Tally<'u> {
        Tally {
            unit,
            counts: Counts {
                pairs: 1,
                ops,
                ..Counts::default()
            },
            worst: Vec::new(),
            chart: ChartCounts::default(),
        }
    }

    fn judged(&mut self, j: &Judged) {
        const KINDS: [CompareKind; 5] = [
            CompareKind::Tensor,
            CompareKind::Checksum,
            CompareKind::Statistics,
            CompareKind::Unwritten,
            CompareKind::None,
        ];
        const BY: [MatchedBy; 4] = [
            MatchedBy::Exact,
            MatchedBy::Aligned,
            MatchedBy::Mapped,
            MatchedBy::Module,
        ];
        let (mut kinds, mut by) = ([0usize; 5], [0usize; 4]);
        let c = &mut self.counts;
        c.tensors += j.len();
        for i in 0..j.len() {
            let b = j.brief(i);
            match b.verdict {
                Verdict::Pass => c.pass += 1,
                Verdict::Warning => c.warning += 1,
                Verdict::Error => c.error += 1,
            }
            kinds[KINDS.iter().position(|&k| k == b.kind).unwrap_or(4)] += 1;
            by[BY.iter().position(|&m| m == b.matched_by).unwrap_or(0)] += 1;
        }
        for (k, n) in KINDS.iter().zip(kinds).filter(|(_, n)| *n > 0) {
            *c.compared_by.entry(k.name().to_string()).or_default() += n;
        }
        for (m, n) in BY.iter().zip(by).filter(|(_, n)| *n > 0) {
            *c.matched_by.entry(m.name().to_string()).or_default() += n;
        }
        for g in j.groups() {
            self.chart.ops += 1;
            let failing = g.clone().any(|i| j.brief(i).verdict == Verdict::Error);
            self.chart.failing += usize::from(failing);
            self.worst_of(j, g);
        }
    }

    /// Keeps the op of the pairs `g` among the worst if it is one.
    fn worst_of(&mut self, j: &Judged, g: std::ops::Range<usize>) {
        // The op's worst pair (the first of equals), if it does not pass.
        let mut best: Option<(usize, judged::Brief)> = None;
        for i in g {
            let b = j.brief(i);
            if b.verdict == Verdict::Pass {
                continue;
            }
            let better = best.is_none_or(|(_, cur)| {
                b.verdict.cmp(&cur.verdict).then(b.err.total_cmp(&cur.err))
                    == std::cmp::Ordering::Greater
            });
            if better {
                best = Some((i, b));
            }
        }
        let Some((i, b)) = best else { return };
        // Worst first: verdict, then error (NaN above everything), then op order.
        let order = |(v, e, s): (Verdict, f64, u64), w: &WorstCandidate| {
            w.op.verdict
                .cmp(&v)
                .then(w.err.total_cmp(&e))
                .then(s.cmp(&w.op.seq))
        };
        let key = (b.verdict, b.err, b.seq);
        if self.worst.len() == WORST_OPS
            && self
                .worst
                .last()
                .is_some_and(|w| order(key, w) != std::cmp::Ordering::Less)
        {
            return;
        }
        let r = j.row(i);
        let candidate = WorstCandidate {
            op: WorstOp {
                step: self.unit.step.clone(),
                rank: self.unit.rank.clone(),
                seq: r.tensor.op.seq,
                op: r.tensor.op.key.to_string(),
                verdict: r.judgement.verdict,
                err: r.judgement.err.is_finite().then_some(r.judgement.err),
                tensor: r.tensor.name,
                reason: r.judgement.reason,
            },
            err: r.judgement.err,
        };
        let at = self
            .worst
            .partition_point(|w| order(key, w) == std::cmp::Ordering::Greater);
        self.worst.insert(at, candidate);
        self.worst.truncate(WORST_OPS);
    }

    fn unmatched(&mut self, unmatched: &[Unmatched]) {
        let c = &mut self.counts;
        for x in unmatched {
            match (x.why, x.side) {
                (Why::Recompute, _) => c.recompute += 1,
                (Why::Inside, _) => c.inside += 1,
                (Why::Unhooked, _) => c.unhooked += 1,
                (Why::LossScaler | Why::SkippedUpdate, _) => c.loss_scaler += 1,
                (_, Side::Bench) => c.unmatched_bench += 1,
                (_, Side::Cmp) => c.unmatched_cmp += 1,
            }
        }
    }
}

/// A whole compare: every unit, in step/rank order, and their rows.
#[derive(Debug)]
pub struct CompareRun {
    /// The benchmark path as given.
    pub bench: PathBuf,
    /// The comparison path as given.
    pub cmp: PathBuf,
    /// One summary per compared step/rank pair.
    pub units: Vec<UnitSummary>,
    /// Their rows: `tables.get(i)` is unit `i`'s.
    pub tables: Tables,
    /// Non-fatal problems: unpaired ranks, truncated logs, missing tensor files.
    pub warnings: Vec<String>,
    /// Step/rank pairs not compared at all: present on one side only, or without op
    /// records on a side (compared units that are incomplete say so in their result).
    pub incomplete: Vec<IncompleteUnit>,
}

/// Which op records a compare reads (msprobe's `-l`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// API calls only.
    Api,
    /// Module calls and parameter gradients only.
    Module,
    /// Everything (the default).
    #[default]
    Mix,
}

impl Level {
    /// The name `-l` takes.
    pub fn name(self) -> &'static str {
        match self {
            Level::Api => "api",
            Level::Module => "module",
            Level::Mix => "mix",
        }
    }

    /// Whether records of `kind` are compared at this level.
    pub fn keeps(self, kind: dump::OpKind) -> bool {
        match self {
            Level::Mix => true,
            Level::Api => kind == dump::OpKind::Api,
            Level::Module => kind != dump::OpKind::Api,
        }
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Level, String> {
        match s {
            "api" | "L1" => Ok(Level::Api),
            "module" | "L0" => Ok(Level::Module),
            "mix" | "all" => Ok(Level::Mix),
            _ => Err(format!("{s:?}: expected api, module or mix")),
        }
    }
}

/// How the calls of the two sides are paired (`--align`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlignRule {
    /// Within module calls, by signature, with mapped and module regions (the default).
    #[default]
    Structural,
    /// By flattened name, as msprobe does (right only when both runs call the same ops).
    Name,
}

impl std::str::FromStr for AlignRule {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<AlignRule, String> {
        match s {
            "structural" => Ok(AlignRule::Structural),
            "name" => Ok(AlignRule::Name),
            _ => Err(format!("{s:?}: expected structural or name")),
        }
    }
}

impl AlignRule {
    /// The aligner of this rule.
    pub fn aligner(self, mapping: mapping::Mapping) -> Box<dyn Aligner> {
        match self {
            AlignRule::Structural => Box::new(StructuralAligner::new(mapping)),
            AlignRule::Name => Box::new(NameAligner),
        }
    }
}

/// Options of one compare.
pub struct Options {
    /// Thresholds per dtype and op pattern.
    pub tolerances: Tolerances,
    /// Which op records to compare.
    pub level: Level,
    /// How tensors of the two sides are paired (the structural aligner holds the mapping
    /// table: built-in, then `--mapping` files).
    pub aligner: Box<dyn Aligner>,
    /// The steps and ranks to compare (`--steps`, `--ranks`).
    pub selection: Selection,
    /// How many rows stay in memory until the reports (`--row-memory`).
    pub row_memory: RowMemory,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tolerances: Tolerances::default(),
            level: Level::Mix,
            aligner: Box::new(StructuralAligner::default()),
            selection: Selection::default(),
            row_memory: RowMemory::default(),
        }
    }
}

/// Compares one unit from its two op logs (already read): align, measure, judge, analyze.
/// Returns what it found (small, held for the whole run) and its rows (parked until the
/// reports). `carried` is what the rank's previous step left (`UnitSummary::carry`; the
/// default for a first step).
pub fn compare_unit(
    unit: &Unit,
    dumps: Sides<dump::RankDump>,
    opts: &Options,
    caches: &Sides<ShardCache>,
    progress: &Progress,
    carried: &Carry,
) -> Result<(UnitSummary, UnitTable)> {
    let mut dumps = dumps;
    let mut warnings = std::mem::take(&mut dumps.bench.warnings);
    warnings.append(&mut dumps.cmp.warnings);
    let level = match opts.level {
        Level::Mix => match common_level(&dumps) {
            Some((level, said)) => {
                warnings.push(said);
                level
            }
            None => Level::Mix,
        },
        chosen => chosen,
    };
    if level != Level::Mix {
        for d in [&mut dumps.bench, &mut dumps.cmp] {
            d.ops = std::mem::take(&mut d.ops).retained(|op| level.keeps(op.kind()));
        }
    }
    let incomplete = cut_to_shorter(unit, &mut dumps);
    let ops = dumps.cmp.ops.len();
    let calls = cross_rank::calls_of(&dumps.cmp.ops);
    let stacks = std::mem::take(&mut dumps.cmp.stacks);
    crate::memory::trace("reading");
    // A step a run's loss scaler skipped: its gradients overflowed under the loss scale.
    let (sb, sc) = (
        loss_scale::scaler_skipped(&dumps.bench.ops),
        loss_scale::scaler_skipped(&dumps.cmp.ops),
    );
    let skipped = (sb || sc).then(|| side_name(sb, sc).to_string());
    if let Some(side) = &skipped {
        let who = if side == "both" {
            "both runs' loss scalers".to_string()
        } else {
            format!("the {side} run's loss scaler")
        };
        warnings.push(format!(
            "{}/{}: {who} skipped this step (found_inf set: gradients overflowed under the \
             loss scale); NaN/Inf in its backward is the scaler's, and it updated no weights",
            unit.step, unit.rank
        ));
    }
    // The runs take the step's batch in different numbers of forward passes.
    let batching = micro_batch::detect(&dumps);
    warnings.extend(batching.as_ref().map(|b| {
        let (what, why) = match b {
            micro_batch::Batching::Micro(m) => (
                m.brief(),
                "gradient accumulation differs, so the runs' calls pair only in part; compare \
                 runs with the same micro-batch size",
            ),
            micro_batch::Batching::Sizes(i) => (
                i.brief(),
                "their batch size, sequence length or data differ, so every call reads other \
                 data; compare runs of the same configuration (config-check: hyperparameters, \
                 data)",
            ),
        };
        format!("{}/{}: {what}: {why}", unit.step, unit.rank)
    }));
    let (micro, input_sizes) = match batching {
        Some(micro_batch::Batching::Micro(m)) => (Some(m), None),
        Some(micro_batch::Batching::Sizes(i)) => (None, Some(i)),
        None => (None, None),
    };
    let alignment = opts.aligner.align(dumps);
    // One run's scaler skipped the step: the other's update has no counterpart.
    let alignment = match (sb, sc) {
        (true, false) => loss_scale::skipped_update(alignment, Side::Bench),
        (false, true) => loss_scale::skipped_update(alignment, Side::Cmp),
        _ => alignment,
    };
    // One run's gradients a power of two times the other's: compared divided by it.
    let scale = loss_scale::detect(&alignment);
    let alignment = match &scale {
        Some(s) => {
            warnings.push(format!(
                "{}/{}: the cmp run's gradients are {} the bench's from {} on: a loss scale \
                 (AMP's GradScaler, a static loss_scale); their statistics are compared \
                 divided by it, their data and checksums not compared",
                unit.step,
                unit.rank,
                s.brief(),
                s.at
            ));
            loss_scale::unscaled(loss_scale::scaler_arithmetic(alignment, s), s)
        }
        None => alignment,
    };
    crate::memory::trace("aligning");
    let regions = alignment.regions.clone();
    let coverage = coverage::of(&alignment);
    let name = format!("{}/{} tensors", unit.step, unit.rank);
    let total = alignment.matches.len();
    let bar = progress.stage(&name, total as u64, Count::Items);
    // The bar moves about a hundred times.
    let (done, every) = (AtomicUsize::new(0), (total / 100).max(1));
    let tick = || {
        let k = done.fetch_add(1, Ordering::Relaxed) + 1;
        if k.is_multiple_of(every) || k == total {
            bar.set(k as u64);
        }
    };
    let measure = |dumps: &Sides<dump::RankDump>, block: &[TensorMatch]| {
        measure::measure_pairs(dumps, block, caches, &tick)
    };
    let (judged, unmatched, carry) =
        judge::judge_all(alignment, &measure, &opts.tolerances, carried.floor)?;
    drop(bar);
    // What both runs computed from leftover bytes was not compared (judge::from_leftovers).
    let incomplete = match (incomplete, judged.leftovers()) {
        (i, None) => i,
        (i, Some((n, at))) => {
            let what = format!(
                "{n} tensors computed from leftover bytes both runs read, from {at} on, not \
                 compared"
            );
            Some(match i {
                None => IncompleteUnit {
                    step: unit.step.clone(),
                    rank: unit.rank.clone(),
                    side: "both".into(),
                    compared: true,
                    reason: what,
                },
                Some(i) => IncompleteUnit {
                    side: "both".into(),
                    reason: format!("{}; {what}", i.reason),
                    ..i
                },
            })
        }
    };
    let findings = analyze::localize(
        &judged.by_op(),
        &stacks,
        &unit.step,
        &unit.rank,
        &opts.tolerances,
        carried,
    );
    crate::memory::trace("judging and localising");
    let mut tally = Tally::new(unit, ops);
    tally.judged(&judged);
    tally.unmatched(&unmatched);
    let rows = UnitRows::Judged(Box::new(judged));
    let collectives = cross_rank::judge_calls(calls, &rows)?;
    crate::memory::trace("counting");
    let table = UnitTable { rows, unmatched };
    let summary = UnitSummary {
        step: unit.step.clone(),
        rank: unit.rank.clone(),
        dirs: unit.locs.as_ref().map(|l| l.dir.clone()),
        ops,
        regions,
        findings,
        warnings,
        incomplete,
        coverage,
        carry: Carry {
            step: unit.step.clone(),
            ..carry
        },
        collectives,
        counts: tally.counts,
        worst: tally.worst,
        chart: tally.chart,
        loss_scale: scale,
        scaler_skipped: skipped,
        micro_batches: micro,
        input_sizes,
        compiled: unit.compiled,
    };
    Ok((summary, table))
}

/// The level both sides were captured at, when one side has a kind of record the other
/// lacks altogether (one run captured at `level="mix"`, the other at `"api"` or msprobe's
/// L1): the records of that kind have nothing to pair with, and they summarise calls that
/// are compared anyway, so they are left out (as `-l` does), with the warning that says so.
/// Two sides with no kind in common keep everything, with a warning that says why nothing
/// pairs. None when both sides hold the same kinds, or one side holds nothing.
fn common_level(dumps: &Sides<dump::RankDump>) -> Option<(Level, String)> {
    let kinds = |d: &dump::RankDump| {
        let api = d.ops.iter().any(|op| op.kind() == dump::OpKind::Api);
        let module = d.ops.iter().any(|op| op.kind() != dump::OpKind::Api);
        (api, module)
    };
    let (b, c) = (kinds(&dumps.bench), kinds(&dumps.cmp));
    let (level, what, lacking) = match (b, c) {
        ((true, true), (true, false)) => (Level::Api, "module", "comparison"),
        ((true, false), (true, true)) => (Level::Api, "module", "benchmark"),
        ((true, true), (false, true)) => (Level::Module, "API", "comparison"),
        ((false, true), (true, true)) => (Level::Module, "API", "benchmark"),
        ((true, false), (false, true)) | ((false, true), (true, false)) => {
            let only = |(api, _): (bool, bool)| if api { "API" } else { "module" };
            return Some((
                Level::Mix,
                format!(
                    "the benchmark run has only {} records, the comparison run only {} \
                     records (captured at other levels): nothing can pair; capture both runs \
                     at the same level",
                    only(b),
                    only(c)
                ),
            ));
        }
        _ => return None,
    };
    let other = if lacking == "comparison" {
        "benchmark"
    } else {
        "comparison"
    };
    Some((
        level,
        format!(
            "the {lacking} run has no {what} records (captured at another level): the {other} \
             run's {what} records are left out, as `-l {}` does",
            level.name()
        ),
    ))
}

/// Which side of a unit is incomplete: `bench`, `cmp` or `both`.
fn side_name(bench: bool, cmp: bool) -> &'static str {
    match (bench, cmp) {
        (true, true) => "both",
        (true, false) => "bench",
        _ => "cmp",
    }
}

/// A unit with an incomplete side (a crashed run) is compared up to that side's last
/// record: the complete side's ops after the op with the same key are left out (they were
/// never reached, not unmatched). Returns what is incomplete, if anything.
fn cut_to_shorter(unit: &Unit, dumps: &mut Sides<dump::RankDump>) -> Option<IncompleteUnit> {
    let (b, c) = (&dumps.bench.incomplete, &dumps.cmp.incomplete);
    if b.is_empty() && c.is_empty() {
        return None;
    }
    let mut reason: Vec<String> = Vec::new();
    for (name, why) in [("bench", b), ("cmp", c)] {
        if !why.is_empty() {
            reason.push(format!("{name}: {}", why.join(", ")));
        }
    }
    let side = side_name(!b.is_empty(), !c.is_empty());
    if side != "both" {
        let (short, full, full_name) = if side == "bench" {
            (&dumps.bench, &mut dumps.cmp, "cmp")
        } else {
            (&dumps.cmp, &mut dumps.bench, "bench")
        };
        if let Some(last) = short.ops.last() {
            let last = last.key();
            let pos = full.ops.iter().position(|o| o.key() == last);
            if let Some(pos) = pos {
                let dropped = full.ops.len() - pos - 1;
                if dropped > 0 {
                    reason.push(format!(
                        "{dropped} {full_name} op(s) after {last} not compared"
                    ));
                    full.ops = std::mem::take(&mut full.ops).truncated(pos + 1);
                }
            }
        }
    }
    Some(IncompleteUnit {
        step: unit.step.clone(),
        rank: unit.rank.clone(),
        side: side.to_string(),
        compared: true,
        reason: reason.join("; "),
    })
}

/// Compares every step/rank pair of the two dumps: the whole run.
pub fn run(bench: &Path, cmp: &Path, opts: &Options, progress: &Progress) -> Result<CompareRun> {
    Ok(run_part(bench, cmp, opts, Shard::All, progress)?.assemble())
}

/// Compares the step/rank pairs of `shard` (each rank's steps in order: the precision floor
/// carries from step to step) and returns them with the plan's frame, for
/// [`RunPart::assemble`] here or for `probe merge` after the other shards.
pub fn run_part(
    bench: &Path,
    cmp: &Path,
    opts: &Options,
    shard: Shard,
    progress: &Progress,
) -> Result<RunPart> {
    let plan = plan::plan(bench, cmp, &opts.selection)?;
    if plan.units.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "no step/rank of {} matches one of {}",
            bench.display(),
            cmp.display()
        )));
    }
    let unpaired = plan
        .unpaired
        .iter()
        .map(|(side, l)| IncompleteUnit {
            step: l.step.clone(),
            rank: l.rank.clone(),
            side: match side {
                Side::Bench => "cmp",
                Side::Cmp => "bench",
            }
            .to_string(),
            compared: false,
            reason: format!("in the {} only", side.name()),
        })
        .collect();
    let frame = Frame {
        bench: bench.to_path_buf(),
        cmp: cmp.to_path_buf(),
        units: plan
            .units
            .iter()
            .map(|u| format!("{}/{}", u.step, u.rank))
            .collect(),
        warnings: plan.warnings,
        unpaired,
    };
    let caches = Sides::<ShardCache>::default();
    let mut parking = Parking::new(opts.row_memory.clone());
    let mut outcomes = Vec::new();
    let mut carries: HashMap<String, Carry> = HashMap::new();
    let chosen = shard.take(&plan.units);
    let stage = progress.stage("compare", chosen.len() as u64, Count::Items);
    let last = chosen.last().copied();
    for index in chosen {
        let unit = &plan.units[index];
        stage.note(format!("{}/{}: reading", unit.step, unit.rank));
        // The two sides are independent: read them at the same time.
        let (b, c) = rayon::join(
            || dump::load_rank(&unit.locs.bench),
            || dump::load_rank(&unit.locs.cmp),
        );
        let dumps = Sides::new(b?, c?);
        // A side without a single record (a run killed before its first flush): the pair
        // is listed as incomplete and the other pairs are compared.
        let (be, ce) = (dumps.bench.ops.is_empty(), dumps.cmp.ops.is_empty());
        if be || ce {
            let side = side_name(be, ce);
            let dirs: Vec<String> = [(be, &unit.locs.bench), (ce, &unit.locs.cmp)]
                .iter()
                .filter(|(e, _)| *e)
                .map(|(_, l)| l.dir.display().to_string())
                .collect();
            let warning = format!(
                "{}: no op records (crashed run?); {}/{} not compared",
                dirs.join(", "),
                unit.step,
                unit.rank
            );
            let incomplete = IncompleteUnit {
                step: unit.step.clone(),
                rank: unit.rank.clone(),
                side: side.to_string(),
                compared: false,
                reason: format!("no op records in {side}"),
            };
            outcomes.push((
                index,
                Outcome::Skipped {
                    warning,
                    incomplete,
                },
            ));
            stage.inc(1);
            continue;
        }
        // What each rank's step leaves goes to its next step (units are in step order).
        let carried = carries.remove(&unit.rank).unwrap_or_default();
        stage.note(format!("{}/{}: aligning, measuring", unit.step, unit.rank));
        let (summary, table) = compare_unit(unit, dumps, opts, &caches, progress, &carried)?;
        stage.inc(1);
        carries.insert(unit.rank.clone(), summary.carry.clone());
        let table = parking.park(table, Some(index) == last)?;
        outcomes.push((index, Outcome::Compared(Box::new(summary), table)));
    }
    parking.finish()?;
    Ok(RunPart { frame, outcomes })
}
