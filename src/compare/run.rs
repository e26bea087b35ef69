//! A whole compare: plan the units, read each unit's two sides, compare it (each rank's steps
//! in order, so that what a step leaves reaches the rank's next), park its rows; the whole
//! run, or one shard's part of it.

use super::plan;
use super::shard::{Frame, Outcome, RunPart, Shard};
use super::tables::Parking;
use super::unit::{compare_unit, Reference};
use super::{envelope, side_name, Carry, CompareRun, Options};
use crate::dump;
use crate::error::{ProbeError, Result};
use crate::progress::{Count, Progress};
use crate::schema::summary::IncompleteUnit;
use crate::tensor::ShardCache;
use crate::vocab::{Side, Sides};
use std::collections::HashMap;
use std::path::Path;

/// Compares every step/rank pair of the two dumps: the whole run.
pub fn run(bench: &Path, cmp: &Path, opts: &Options, progress: &Progress) -> Result<CompareRun> {
    Ok(run_part(bench, cmp, opts, Shard::All, progress)?.assemble())
}

/// Compares the step/rank pairs of `shard` (each rank's steps in order: the precision floor
/// carries from step to step) and returns them with the plan's frame, for
/// `RunPart::assemble` here or for `probe merge` after the other shards.
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
    let (references, reference_warnings) = references(bench, opts)?;
    // (a world size past a million ranks is not believed: no list of it is made)
    let world = plan.world_size.filter(|&w| w <= 1 << 20).unwrap_or(0) as u64;
    let job_ranks = (0..world)
        .filter(|&r| opts.selection.ranks.as_ref().is_none_or(|n| n.contains(r)))
        .map(|r| format!("rank{r}"))
        .collect();
    let frame = Frame {
        dumps_sha256: super::shard_files::plan_digest(bench, cmp, &plan.units),
        job_ranks,
        bench: bench.to_path_buf(),
        cmp: cmp.to_path_buf(),
        units: plan
            .units
            .iter()
            .map(|u| format!("{}/{}", u.step, u.rank))
            .collect(),
        warnings: plan
            .warnings
            .into_iter()
            .chain(reference_warnings)
            .collect(),
        unpaired,
        calibration: match &opts.reference {
            Some(r) => Some(envelope::Source::Reference {
                path: r.root.clone(),
                k: r.k,
            }),
            None => opts.tolerances.calibration(),
        },
    };
    let caches = Sides::<ShardCache>::default();
    let ref_caches = Sides::<ShardCache>::default();
    let mut parking = Parking::new(opts.row_memory.clone());
    let mut outcomes = Vec::new();
    let mut carries: HashMap<String, Carry> = HashMap::new();
    let chosen = shard.take(&plan.units);
    let stage = progress.stage("compare", chosen.len() as u64, Count::Items);
    let last = chosen.last().copied();
    for index in chosen {
        let unit = &plan.units[index];
        stage.note(format!("{}/{}: reading", unit.step, unit.rank));
        // The sides are independent: read them at the same time.
        let reference = references.get(&unit.locs.bench.dir);
        let ((b, c), r) = rayon::join(
            || {
                rayon::join(
                    || dump::load_rank(&unit.locs.bench),
                    || dump::load_rank(&unit.locs.cmp),
                )
            },
            || reference.map(dump::load_rank).transpose(),
        );
        let dumps = Sides::new(b?, c?);
        let reference = r?.map(|dump| Reference {
            dump,
            caches: &ref_caches,
        });
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
        let (summary, table) =
            compare_unit(unit, dumps, opts, &caches, progress, &carried, reference)?;
        stage.inc(1);
        carries.insert(unit.rank.clone(), summary.carry.clone());
        let table = parking.park(table, Some(index) == last)?;
        outcomes.push((index, Outcome::Compared(Box::new(summary), table)));
    }
    parking.finish()?;
    Ok(RunPart { frame, outcomes })
}

/// The reference run's step/rank folders by the benchmark folder each is paired with
/// (`--reference`), and what the pairing warns of: the reference's folders are paired with
/// the benchmark's as the comparison's are. A benchmark folder without one is judged by the
/// tolerances, said per unit; a reference that pairs with none is an error.
fn references(
    bench: &Path,
    opts: &Options,
) -> Result<(HashMap<std::path::PathBuf, dump::RankLoc>, Vec<String>)> {
    let Some(r) = &opts.reference else {
        return Ok(Default::default());
    };
    let plan = plan::plan(bench, &r.root, &opts.selection)?;
    // A reference is the same step of the same rank under other precision: a pairing by
    // position (another step, another rank) is none.
    let same = |u: &plan::Unit| {
        u.locs.bench.step == u.locs.cmp.step && u.locs.bench.rank == u.locs.cmp.rank
    };
    let (units, other): (Vec<plan::Unit>, Vec<plan::Unit>) = plan.units.into_iter().partition(same);
    if units.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "the reference {} has no step/rank of {}",
            r.root.display(),
            bench.display()
        )));
    }
    let mut warnings: Vec<String> = Vec::new();
    let lacking = plan
        .unpaired
        .iter()
        .filter(|(side, _)| *side == Side::Bench)
        .map(|(_, l)| l)
        .chain(other.iter().map(|u| &u.locs.bench));
    for l in lacking {
        warnings.push(format!(
            "{}/{}: the reference has no counterpart; judged by the dtype tolerances",
            l.step, l.rank
        ));
    }
    let by_bench = units
        .into_iter()
        .map(|u| (u.locs.bench.dir, u.locs.cmp))
        .collect();
    Ok((by_bench, warnings))
}
