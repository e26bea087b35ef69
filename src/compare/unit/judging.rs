//! The judging pass of a unit: measures its pairs a block at a time (in parallel, with a
//! progress bar that moves about a hundred times) and judges them against the tolerances
//! and the precision floor the rank's previous step left; then says what both runs computed
//! from leftover bytes, which was not compared.

use crate::compare::align::{Alignment, TensorMatch, Unmatched};
use crate::compare::envelope::Envelope;
use crate::compare::judge;
use crate::compare::judged::Judged;
use crate::compare::measure;
use crate::compare::plan::Unit;
use crate::compare::{Carry, Options};
use crate::dump;
use crate::error::Result;
use crate::progress::{Count, Progress};
use crate::schema::summary::IncompleteUnit;
use crate::tensor::ShardCache;
use crate::vocab::Sides;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The unit's judged pairs, its unmatched tensors and what it leaves to the rank's next step.
pub(super) fn judge(
    unit: &Unit,
    alignment: Alignment,
    opts: &Options,
    caches: &Sides<ShardCache>,
    progress: &Progress,
    carried: &Carry,
    envelope: Option<&Envelope>,
) -> Result<(Judged, Vec<Unmatched>, Carry)> {
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
    judge::judge_all(
        alignment,
        &measure,
        &opts.tolerances,
        carried.floor,
        envelope,
    )
}

/// What is incomplete about the unit (`cut`: a side cut short by a crash), with what both
/// runs computed from leftover bytes (`judge::from_leftovers`), which was not compared.
pub(super) fn incomplete(
    unit: &Unit,
    cut: Option<IncompleteUnit>,
    judged: &Judged,
) -> Option<IncompleteUnit> {
    let Some((n, at)) = judged.leftovers() else {
        return cut;
    };
    let what = format!(
        "{n} tensors computed from leftover bytes both runs read, from {at} on, not \
         compared"
    );
    Some(match cut {
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
