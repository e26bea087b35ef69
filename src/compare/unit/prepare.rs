//! The first pass of a unit: what the two dumps hold that changes how they are compared,
//! found before they are aligned. The records of a kind only one side captured are left out
//! (the level both share), a side cut short by a crash bounds the other, and the step's
//! facts are read: which run's loss scaler skipped it, whether the runs take the step's
//! batch in other numbers of forward passes or read data of other sizes. Takes the dumps
//! as read and hands on the dumps to align, with what it noted.

use super::notes::Note;
use crate::compare::cross_rank;
use crate::compare::loss_scale;
use crate::compare::micro_batch::{self, Batching};
use crate::compare::plan::Unit;
use crate::compare::{side_name, Level};
use crate::dump::{self, Collective};
use crate::schema::summary::IncompleteUnit;
use crate::vocab::Sides;
use std::collections::BTreeMap;

/// The dumps of a unit, ready to align, and what the pass found.
pub(super) struct Prepared {
    /// The records to align.
    pub dumps: Sides<dump::RankDump>,
    /// In order: the readers' warnings, the level, a skipped step, batching.
    pub notes: Vec<Note>,
    /// A side cut short by a crash, if any.
    pub incomplete: Option<IncompleteUnit>,
    /// Op records of the comparison side that are compared.
    pub ops: usize,
    /// The comparison side's collectives (cross-rank analysis).
    pub calls: Vec<(u64, String, Collective)>,
    /// The comparison side's call stacks by id (the localiser's findings).
    pub stacks: BTreeMap<u64, Vec<String>>,
    /// Whether each run's loss scaler skipped the step.
    pub skipped: Sides<bool>,
    /// How the runs take the step's data, where it differs.
    pub batching: Option<Batching>,
}

/// Prepares unit `unit`'s dumps for alignment at `level` (`-l`; mix: the level both share).
pub(super) fn prepare(unit: &Unit, dumps: Sides<dump::RankDump>, level: Level) -> Prepared {
    let mut dumps = dumps;
    let mut notes: Vec<Note> = std::mem::take(&mut dumps.bench.warnings)
        .into_iter()
        .chain(std::mem::take(&mut dumps.cmp.warnings))
        .map(Note::Read)
        .collect();
    let level = match level {
        Level::Mix => match common_level(&dumps) {
            Some((level, said)) => {
                notes.push(Note::Level(said));
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
    // A step a run's loss scaler skipped: its gradients overflowed under the loss scale.
    let skipped = Sides::new(
        loss_scale::scaler_skipped(&dumps.bench.ops),
        loss_scale::scaler_skipped(&dumps.cmp.ops),
    );
    if skipped.bench || skipped.cmp {
        notes.push(Note::ScalerSkipped(side_name(skipped.bench, skipped.cmp)));
    }
    // The runs take the step's batch in different numbers of forward passes.
    let batching = micro_batch::detect(&dumps);
    notes.extend(batching.as_ref().map(Note::of_batching));
    Prepared {
        dumps,
        notes,
        incomplete,
        ops,
        calls,
        stacks,
        skipped,
        batching,
    }
}

/// The level both sides were captured at, when one side has a kind of record the other
/// lacks altogether (one run captured at `level="mix"`, the other at `"api"` or msprobe's
/// L1): the records of that kind have nothing to pair with, and they summarise calls that
/// are compared anyway, so they are left out (as `-l` does), with the warning that says so.
/// Two sides with no kind in common keep everything, with a warning that says why nothing
/// pairs. None when both sides hold the same kinds, or one side holds nothing.
pub(super) fn common_level(dumps: &Sides<dump::RankDump>) -> Option<(Level, String)> {
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

/// A unit with an incomplete side (a crashed run) is compared up to that side's last
/// record: the complete side's ops after the op with the same key are left out (they were
/// never reached, not unmatched). Returns what is incomplete, if anything.
pub(super) fn cut_to_shorter(
    unit: &Unit,
    dumps: &mut Sides<dump::RankDump>,
) -> Option<IncompleteUnit> {
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
