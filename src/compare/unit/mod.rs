//! One unit (a step/rank pair) compared from its two op logs: a list of passes, each in its
//! own file, each handing the next an immutable value.
//!
//! ```text
//! reference bench + REF      -> Envelope   under --reference: the reference's error per
//!                                           benchmark tensor (these same passes, bench/REF)
//! prepare   Sides<RankDump>  -> Prepared   level both share, a crashed side's cut, the
//!                                           scaler's skipped step, micro-batching (notes)
//! align     Prepared.dumps   -> Alignment  the aligner of the options (structural, name)
//! adjust    Alignment        -> Adjusted   a skipped update, a loss scale (compared divided)
//! judging   Alignment        -> Judged     measure and judge, a block at a time; leftovers
//! analyze   Judged (by op)   -> Findings   the localiser's rules (`compare::analyze`)
//! tally     Judged, unmatched-> counts, worst ops, chart size
//! ```
//! The passes note what changes how the comparison reads as typed [`notes::Note`]s, worded
//! in one place into the unit's warnings. A new pass goes into this list, in its own file.

mod adjust;
mod judging;
pub(crate) mod notes;
mod prepare;
mod reference;
mod tally;

use super::plan::Unit;
use super::tables::{UnitRows, UnitTable};
use super::{analyze, coverage, cross_rank, micro_batch, Carry, Options, UnitSummary};
use crate::dump;
use crate::error::Result;
use crate::progress::Progress;
use crate::tensor::ShardCache;
use crate::vocab::Sides;
use notes::Note;

/// A unit's reference run (`--reference`): its op log, read, and where its tensors' shards
/// are opened (with the benchmark's, again).
pub struct Reference<'a> {
    pub dump: dump::RankDump,
    pub caches: &'a Sides<ShardCache>,
}

/// Compares one unit from its two op logs (already read): prepare, align, adjust, judge,
/// analyze, tally. Returns what it found (small, held for the whole run) and its rows
/// (parked until the reports). `carried` is what the rank's previous step left
/// (`UnitSummary::carry`; the default for a first step).
pub fn compare_unit(
    unit: &Unit,
    dumps: Sides<dump::RankDump>,
    opts: &Options,
    caches: &Sides<ShardCache>,
    progress: &Progress,
    carried: &Carry,
    reference: Option<Reference>,
) -> Result<(UnitSummary, UnitTable)> {
    let (envelope, said) = match reference {
        Some(r) => {
            let sides = Sides::new(dumps.bench.clone(), r.dump);
            let (e, said) = reference::envelope(unit, sides, opts, r.caches, progress, carried)?;
            (Some(e), said)
        }
        None => (None, Vec::new()),
    };
    let prepared = prepare::prepare(unit, dumps, opts.level);
    crate::memory::trace("reading");
    let alignment = opts.aligner.align(prepared.dumps);
    let adjusted = adjust::adjust(alignment, prepared.skipped);
    crate::memory::trace("aligning");
    let regions = adjusted.alignment.regions.clone();
    let coverage = coverage::of(&adjusted.alignment);
    let (judged, unmatched, carry) = judging::judge(
        unit,
        adjusted.alignment,
        opts,
        caches,
        progress,
        carried,
        envelope.as_ref(),
    )?;
    let incomplete = judging::incomplete(unit, prepared.incomplete, &judged);
    let findings = analyze::localize(
        &judged.by_op(),
        &prepared.stacks,
        &unit.step,
        &unit.rank,
        &opts.tolerances,
        carried,
    );
    crate::memory::trace("judging and localising");
    let mut tally = tally::Tally::new(unit, prepared.ops);
    tally.judged(&judged);
    tally.unmatched(&unmatched);
    let rows = UnitRows::Judged(Box::new(judged));
    let collectives = cross_rank::judge_calls(prepared.calls, &rows)?;
    crate::memory::trace("counting");
    let notes = prepared
        .notes
        .into_iter()
        .chain(adjusted.scale.clone().map(Note::LossScale))
        .chain(said);
    let (micro_batches, input_sizes) = match prepared.batching {
        Some(micro_batch::Batching::Micro(m)) => (Some(m), None),
        Some(micro_batch::Batching::Sizes(i)) => (None, Some(i)),
        None => (None, None),
    };
    let skipped = prepared.skipped;
    let summary = UnitSummary {
        step: unit.step.clone(),
        rank: unit.rank.clone(),
        dirs: unit.locs.as_ref().map(|l| l.dir.clone()),
        ops: prepared.ops,
        regions,
        findings,
        warnings: notes.map(|n| n.said(&unit.step, &unit.rank)).collect(),
        incomplete,
        coverage,
        carry: Carry {
            step: unit.step.clone(),
            // The earliest step of the rank that diverged stays the one later steps follow.
            diverged: carried
                .diverged
                .clone()
                .or_else(|| (tally.counts.error > 0).then(|| unit.step.clone())),
            ..carry
        },
        collectives,
        counts: tally.counts,
        worst: tally.worst,
        chart: tally.chart,
        loss_scale: adjusted.scale,
        scaler_skipped: (skipped.bench || skipped.cmp)
            .then(|| super::side_name(skipped.bench, skipped.cmp).to_string()),
        micro_batches,
        input_sizes,
        compiled: unit.compiled,
    };
    Ok((summary, UnitTable { rows, unmatched }))
}
