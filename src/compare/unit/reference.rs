//! The reference pass (`--reference REF`): the benchmark compared with the reference run as
//! with the comparison run (prepared, aligned, adjusted for loss scaling, measured), and
//! the reference's error on each benchmark tensor kept as the unit's envelope
//! (`compare::envelope`), which the judging pass then judges the comparison run against.

use super::notes::Note;
use super::{adjust, judging, prepare};
use crate::compare::coverage;
use crate::compare::envelope::{Envelope, Measured};
use crate::compare::plan::Unit;
use crate::compare::{Carry, Options};
use crate::dump::{self, Role};
use crate::error::Result;
use crate::progress::Progress;
use crate::tensor::ShardCache;
use crate::vocab::Sides;

/// The share of the benchmark's tensors the reference may lack before the unit says so: as
/// many as `--max-unmatched` allows by default.
const MAY_LACK: f64 = crate::gate::DEFAULT_MAX_UNMATCHED;

/// The envelope of `unit` from the benchmark and the reference run (`dumps.cmp`), with
/// `k` of the options' reference, starting from the precision floor `carried` left; and
/// what a person should know of the reference: what its reader said (a truncated log, a
/// crashed run), that it lacks more of the benchmark's tensors than [`MAY_LACK`] (a
/// reference of another model pairs with little of it), or that it equals the benchmark
/// (no drift to judge by).
pub(super) fn envelope(
    unit: &Unit,
    dumps: Sides<dump::RankDump>,
    opts: &Options,
    caches: &Sides<ShardCache>,
    progress: &Progress,
    carried: &Carry,
) -> Result<(Envelope, Vec<Note>)> {
    let k = opts.reference.as_ref().map_or(1.0, |r| r.k);
    let mut dumps = dumps;
    // The benchmark's own words are the unit's already; the reference's are said here.
    dumps.bench.warnings.clear();
    let mut notes: Vec<Note> = std::mem::take(&mut dumps.cmp.warnings)
        .into_iter()
        .chain(dumps.cmp.incomplete.iter().cloned())
        .map(Note::ReferenceRead)
        .collect();
    let prepared = prepare::prepare(unit, dumps, opts.level);
    let alignment = opts.aligner.align(prepared.dumps);
    let adjusted = adjust::adjust(alignment, prepared.skipped);
    let bench = coverage::of(&adjusted.alignment).bench;
    if bench.unmatched as f64 > MAY_LACK * bench.tensors as f64 {
        notes.push(Note::ReferenceLacks(bench.unmatched, bench.tensors));
    }
    let (judged, _, _) = judging::judge(
        unit,
        adjusted.alignment,
        opts,
        caches,
        progress,
        carried,
        None,
    )?;
    let envelope = Envelope::of(
        judged.errors().map(|(t, err)| {
            let op = t.op();
            Measured {
                name: t.name(),
                api: op.key().base_text(),
                direction: op.direction(),
                output: t.role() == Role::Output,
                err,
            }
        }),
        k,
    );
    if envelope.shows_no_drift() {
        notes.push(Note::ReferenceEqual);
    }
    Ok((envelope, notes))
}
