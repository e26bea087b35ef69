//! Coverage: how much of each side of a unit found a counterpart, and where a side's
//! records end. The verdict reads it to refuse a comparison that covered too little
//! (`--max-unmatched`): a capture that stopped after two ops must not pass because the two
//! ops it has agree.

use super::align::{Alignment, Side};
use super::loss_scale::last_gradients;
use super::Sides;
use crate::dump::Direction;
use serde::{Deserialize, Serialize};

/// The coverage of one side of a unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideCoverage {
    /// Tensors of this side that were aligned (after `-l` and a crash's cut).
    pub tensors: usize,
    /// Of which without a counterpart on the other side (missing: not a one-sided
    /// recomputation, not inside a region compared at its boundary).
    pub unmatched: usize,
    /// Op records of this side.
    pub ops: usize,
    /// The key of this side's last op record.
    pub last_op: Option<String>,
    /// Unmatched tensors of this side in ops after its last op holding a matched tensor:
    /// the tail the other side never reached, if the other side stopped.
    pub tail_unmatched: usize,
    /// Unmatched tensors of this side in the forward calls after its last record of
    /// gradients (backward calls, DDP's gradient all-reduce): its optimizer's update, where
    /// the other side has none. None without gradient records.
    pub update_unmatched: Option<usize>,
    /// Tensors of this side in the forward calls after its last record of gradients,
    /// matched or not: how much update this side has (a multi-tensor optimizer's calls are
    /// hooked, a fused one's are not), which tells whether it lacks one. Taken only where
    /// the other side has calls after its gradients without a counterpart (otherwise
    /// nothing asks): None there and without gradient records, and then not written, so
    /// that units that never ask pack as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_tensors: Option<usize>,
}

impl SideCoverage {
    /// The share of this side's tensors without a counterpart (0 for a side without
    /// tensors).
    pub(crate) fn unmatched_fraction(&self) -> f64 {
        if self.tensors == 0 {
            0.0
        } else {
            self.unmatched as f64 / self.tensors as f64
        }
    }
}

/// The coverage of both sides of a unit, read from its alignment (before the judge takes
/// the records).
pub fn of(a: &Alignment) -> Sides<SideCoverage> {
    let mut last_matched: Sides<Option<usize>> = Sides::default();
    for m in &a.matches {
        let (b, c) = (m.refs.bench.op(), m.refs.cmp.op());
        last_matched.bench = last_matched.bench.max(Some(b));
        last_matched.cmp = last_matched.cmp.max(Some(c));
    }
    let side = |d: &crate::dump::RankDump, who: Side, last: Option<usize>| {
        // Recomputation and region interiors are accounted for, not missing.
        let unmatched = a
            .unmatched
            .iter()
            .filter(|u| u.side == who && u.why.missing());
        let grads = last_gradients(&d.ops);
        SideCoverage {
            update_unmatched: grads.map(|g| {
                unmatched
                    .clone()
                    .filter(|u| u.op.index > g && u.op.direction == Direction::Forward)
                    .count()
            }),
            update_tensors: grads.map(|g| {
                d.ops
                    .iter()
                    .skip(g + 1)
                    .filter(|op| op.direction() == Direction::Forward)
                    .map(|op| op.tensor_count())
                    .sum()
            }),
            tensors: d.ops.tensor_count(),
            unmatched: unmatched.clone().count(),
            ops: d.ops.len(),
            last_op: d.ops.last().map(|o| o.key().text().to_string()),
            tail_unmatched: unmatched
                .filter(|u| last.is_none_or(|l| u.op.index > l))
                .count(),
        }
    };
    let mut bench = side(&a.dumps.bench, Side::Bench, last_matched.bench);
    let mut cmp = side(&a.dumps.cmp, Side::Cmp, last_matched.cmp);
    // A side's update size is read only where the other side lacks counterparts after its
    // gradients (the verdict's "no optimizer update").
    if cmp.update_unmatched.unwrap_or(0) == 0 {
        bench.update_tensors = None;
    }
    if bench.update_unmatched.unwrap_or(0) == 0 {
        cmp.update_tensors = None;
    }
    Sides::new(bench, cmp)
}
