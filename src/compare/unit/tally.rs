//! The last pass of a unit: one pass over its judged pairs and unmatched tensors gathers
//! what its summary holds of them (counts by verdict, by how pairs were compared and found,
//! by why tensors are one-sided; the worst ops; the chart's size). Rows are made only for
//! the ops that enter the worst list.

use crate::compare::align::{Side, Unmatched, Why};
use crate::compare::judged::{self, Judged};
use crate::compare::measure::CompareKind;
use crate::compare::plan::Unit;
use crate::compare::{ChartCounts, WorstCandidate, WORST_OPS};
use crate::schema::summary::{Counts, WorstOp};
use crate::vocab::{MatchedBy, Verdict};

/// What one pass over a unit's judged pairs gathers for its summary: its counts, its worst
/// ops and the chart's size. Rows are made only for the ops that enter the worst list.
pub(super) struct Tally<'u> {
    unit: &'u Unit,
    /// The unit's tensor counts.
    pub counts: Counts,
    /// The worst ops so far, at most [`WORST_OPS`], worst first (ties in op order).
    pub worst: Vec<WorstCandidate>,
    /// The chart's size.
    pub chart: ChartCounts,
}

impl<'u> Tally<'u> {
    /// Nothing counted yet, for a unit of `ops` op records (comparison side).
    pub(super) fn new(unit: &'u Unit, ops: usize) -> Tally<'u> {
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

    pub(super) fn judged(&mut self, j: &Judged) {
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
            c.calibrated += usize::from(b.calibrated);
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

    pub(super) fn unmatched(&mut self, unmatched: &[Unmatched]) {
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
