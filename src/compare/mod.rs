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

pub(crate) mod align;
pub(crate) mod analyze;
pub mod calibrate;
pub(crate) mod carry;
pub(crate) mod collectives;
pub(crate) mod coverage;
pub(crate) mod cross_rank;
pub mod envelope;
pub mod judge;
pub(crate) mod judged;
pub(crate) mod layout;
pub(crate) mod loss_scale;
pub(crate) mod mapping;
pub(crate) mod measure;
pub(crate) mod micro_batch;
pub(crate) mod op_rows;
pub(crate) mod plan;
pub(crate) mod row;
mod run;
pub mod shard;
mod shard_files;
pub(crate) mod structural;
pub mod tables;
pub mod tolerance;
mod unit;

use crate::dump::{self, Selection};
use crate::schema::summary::{Counts, Findings, IncompleteUnit, WorstOp};
pub use crate::vocab::{MatchedBy, Side, Sides, Verdict};
pub use align::{
    Aligner, Alignment, NameAligner, OpInfo, Region, TensorMatch, TensorRef, Unmatched, Why,
};
pub use carry::Carry;
pub use judged::Judged;
pub use mapping::{MapRule, Mapping, MappingError};
pub use measure::{CompareKind, Measured, Measurement, TensorSide};
pub use plan::{Plan, Unit};
pub use row::{Judgement, Row};
pub use run::{run, run_part};
use serde::{Deserialize, Serialize};
pub use shard::{Frame, Outcome, RunPart, Shard};
use std::path::PathBuf;
pub use structural::StructuralAligner;
pub use tables::{Parked, Parking, RowMemory, Tables, UnitRows, UnitTable};
pub use tolerance::Tolerances;
pub use unit::compare_unit;

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
    pub collectives: collectives::Collectives,
    /// Tensor counts of this unit (`pairs` 1, `ops` as above).
    pub counts: Counts,
    /// The unit's worst ops, worst first, at most `WORST_OPS`: the run's worst ops are
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
pub(crate) fn op_groups(rows: &[Row]) -> impl Iterator<Item = &[Row]> {
    rows.chunk_by(|a, b| a.tensor.op.index == b.tensor.op.index)
}

/// How many worst ops a unit keeps, and the summary lists.
pub(crate) const WORST_OPS: usize = 20;

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
    pub(crate) fn order(a: &WorstCandidate, b: &WorstCandidate) -> std::cmp::Ordering {
        b.op.verdict
            .cmp(&a.op.verdict)
            .then(b.err.total_cmp(&a.err))
    }
}

impl UnitSummary {
    /// About how many bytes its table takes in memory (what `--row-memory` counts).
    pub(crate) fn weight(&self) -> usize {
        tables::weight(self.counts.tensors + self.counts.one_sided())
    }
}

/// A whole compare: every unit, in step/rank order, and their rows.
#[derive(Debug)]
pub struct CompareRun {
    /// The benchmark path as given.
    pub bench: PathBuf,
    /// The comparison path as given.
    pub cmp: PathBuf,
    /// What the verdicts were calibrated against (`--reference`, a calibration file).
    pub calibration: Option<envelope::Source>,
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Api => "api",
            Level::Module => "module",
            Level::Mix => "mix",
        }
    }

    /// Whether records of `kind` are compared at this level.
    pub(crate) fn keeps(self, kind: dump::OpKind) -> bool {
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
    pub(crate) fn aligner(self, mapping: mapping::Mapping) -> Box<dyn Aligner> {
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
    /// A reference run the verdicts are calibrated against (`--reference`).
    pub reference: Option<envelope::Reference>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tolerances: Tolerances::default(),
            level: Level::Mix,
            aligner: Box::new(StructuralAligner::default()),
            selection: Selection::default(),
            row_memory: RowMemory::default(),
            reference: None,
        }
    }
}

/// Which side of a unit is incomplete: `bench`, `cmp` or `both`.
pub(crate) fn side_name(bench: bool, cmp: bool) -> &'static str {
    match (bench, cmp) {
        (true, true) => "both",
        (true, false) => "bench",
        _ => "cmp",
    }
}
