//! The parquet tables of a sharded compare's shards, copied into the merged run's table
//! (`probe merge`): which parts (a unit's matched or unmatched lines) each shard's table
//! holds, and the plan that copies their row groups in the run's order. Here, beside the
//! writer, because the compare pipeline hands on results and never writes a report.

use super::{CopyPlan, ParquetTable, ReportWriter, TablePart};
use crate::compare::shard::{Outcome, ShardResult};
use crate::compare::{CompareRun, UnitSummary};
use std::path::PathBuf;

/// Each shard's parquet table (`compare.parquet`) with the parts it holds, in its order,
/// and their line counts: what `probe merge` needs to copy the shards' row groups
/// ([`CopyPlan`]). A shard's table lists its compared pairs' matched
/// tensors, then their unmatched ones, as every compare's table does.
pub(crate) fn table_parts(shards: &[ShardResult]) -> Vec<(PathBuf, Vec<(TablePart, usize)>)> {
    let file = ParquetTable.file_name("compare");
    shards
        .iter()
        .map(|s| {
            let units: Vec<&UnitSummary> = s
                .part
                .outcomes
                .iter()
                .filter_map(|(_, o)| match o {
                    Outcome::Compared(u, _) => Some(&**u),
                    Outcome::Skipped { .. } => None,
                })
                .collect();
            (s.dir.join(&file), parts_of(&units))
        })
        .collect()
}

/// The plan that copies the shards' parquet row groups (`parts`: [`table_parts`]) into the
/// table of the run they make, or why they cannot be copied.
pub(crate) fn copy_plan(
    parts: &[(PathBuf, Vec<(TablePart, usize)>)],
    run: &CompareRun,
) -> std::result::Result<CopyPlan, String> {
    let units: Vec<&UnitSummary> = run.units.iter().collect();
    let order: Vec<TablePart> = parts_of(&units).into_iter().map(|(p, _)| p).collect();
    let columns: Vec<_> = super::columns::COLUMNS.iter().collect();
    CopyPlan::new(&columns, parts, &order)
}

/// The parts of the table of a run of `units`, in order, with their line counts (those
/// without lines left out: they have no row group).
fn parts_of(units: &[&UnitSummary]) -> Vec<(TablePart, usize)> {
    let part = |u: &UnitSummary, unmatched: bool| TablePart {
        step: u.step.clone(),
        rank: u.rank.clone(),
        unmatched,
    };
    let matched = units.iter().map(|u| (part(u, false), u.counts.tensors));
    let unmatched = units.iter().map(|u| (part(u, true), u.counts.one_sided()));
    matched.chain(unmatched).filter(|(_, n)| *n > 0).collect()
}
