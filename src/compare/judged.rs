//! What the judge leaves of a unit ([`Judged`]): every compared pair as a few numbers beside
//! the two sides' compact op records; a pair's [`Row`] is made only when it is read.
//!
//! Why: a row copies what it shows out of the records (the op key, both names, shapes,
//! dtypes and statistics): about half a kilobyte with its allocations. A unit of a million
//! pairs held as rows took half a gigabyte on top of the records they were copied from
//! (issue 14's budget for a whole compare of such a unit is 512 MB). Held as pairs it takes
//! 64 bytes a pair beyond the records, and every reader (the unit's counts, the
//! localiser, the reports) visits its rows a chunk of whole ops at a time
//! ([`Judged::visit`]), made from the records and dropped after the visit.

use super::align::{MatchedBy, OpInfo, Side};
use super::judge::{Judgement, Row, Verdict};
use super::layout;
use super::measure::{CompareKind, Measured, Measurement};
use super::op_rows::{Draw, Head, OneSidedOp, OpRows, UPSTREAM};
use super::Sides;
use crate::dtype::DType;
use crate::dump::args::{self, ArgDiff};
use crate::dump::{Op, Ops, Role, Tensor};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::op_key::KeyRef;
use foldhash::{HashMap, HashSet};
use std::borrow::Cow;
use std::ops::Range;

/// Rows made at a time for a visit (more when an op's rows would be cut).
const CHUNK: usize = 4096;

/// One judged pair (64 bytes): where its two tensors are, how it was paired, measured and
/// judged. Indices are `u32`: an op store indexes its ops and tensors so.
#[derive(Debug, Clone)]
pub(super) struct Pair {
    /// The two tensors: (op, tensor within the op) on each side.
    pub bench: (u32, u32),
    pub cmp: (u32, u32),
    /// The comparison-side op the row is reported under.
    pub at: u32,
    /// Index into the reasons, or [`NO_REASON`] (a pass has none).
    pub reason: u32,
    pub err: f64,
    pub raw_err: f64,
    pub tolerance: f64,
    pub metrics: Option<Box<Metrics>>,
    pub by: MatchedBy,
    pub external: bool,
    pub kind: CompareKind,
    pub checksum_equal: Option<bool>,
    pub verdict: Verdict,
    pub precision: Option<DType>,
}

/// What a unit's summary counts of a pair ([`Judged::brief`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Brief {
    /// Its verdict.
    pub verdict: Verdict,
    /// Its judged error.
    pub err: f64,
    /// How it was compared.
    pub kind: CompareKind,
    /// How it was paired.
    pub matched_by: MatchedBy,
    /// The sequence number of the op it is reported under.
    pub seq: u64,
    /// Judged against a reference run's envelope.
    pub calibrated: bool,
}

/// A pair's reason index when it has none.
pub(super) const NO_REASON: u32 = u32::MAX;

/// A unit's judged pairs, in the comparison run's execution order, over both sides' op
/// records.
#[derive(Debug, Clone)]
pub struct Judged {
    ops: Sides<Ops>,
    pairs: Vec<Pair>,
    /// The reasons of the pairs that have one (most pass, and have none).
    reasons: Vec<Box<str>>,
    /// How many differing pairs were computed from leftover bytes both runs read, and the
    /// op where that starts (`judge::from_leftovers`): not compared.
    leftovers: Option<(usize, String)>,
    /// Under a reference run (`--reference`), each pair's reference error (NaN: judged by
    /// the tolerances); empty without one. Apart from the pairs, which stay 64 bytes.
    references: Vec<f64>,
}

impl Judged {
    /// The pairs over the records they index, with the reasons they index.
    pub(super) fn new(
        ops: Sides<Ops>,
        pairs: Vec<Pair>,
        reasons: Vec<Box<str>>,
        leftovers: Option<(usize, String)>,
        references: Vec<f64>,
    ) -> Judged {
        Judged {
            ops,
            pairs,
            reasons,
            leftovers,
            references,
        }
    }

    /// The reference run's error that pair `i` was judged against, if any.
    fn reference(&self, i: usize) -> Option<f64> {
        self.references.get(i).copied().filter(|r| !r.is_nan())
    }

    /// How many differing pairs were computed from leftover bytes both runs read, and the
    /// op where that starts: what this unit could not compare.
    pub(crate) fn leftovers(&self) -> Option<&(usize, String)> {
        self.leftovers.as_ref()
    }

    /// How many pairs (rows).
    pub(crate) fn len(&self) -> usize {
        self.pairs.len()
    }

    /// The two tensors of pair `p`.
    pub(super) fn tensors<'a>(ops: &'a Sides<Ops>, p: &Pair) -> Sides<Tensor<'a>> {
        let t = |o: &'a Ops, (op, t): (u32, u32)| o.get(op as usize).tensor(t as usize);
        Sides::new(t(&ops.bench, p.bench), t(&ops.cmp, p.cmp))
    }

    /// Each measured pair's benchmark tensor and error as a reference calibrates it (full
    /// tensors or statistics; what a reference run's envelope is made of).
    pub(crate) fn errors(&self) -> impl Iterator<Item = (Tensor<'_>, f64)> + '_ {
        self.pairs
            .iter()
            .filter(|p| matches!(p.kind, CompareKind::Tensor | CompareKind::Statistics))
            .map(|p| {
                let err = super::envelope::measure(p.kind, p.err, p.raw_err);
                (Judged::tensors(&self.ops, p).bench, err)
            })
    }

    /// The row of pair `i`.
    pub(crate) fn row(&self, i: usize) -> Row {
        let p = &self.pairs[i];
        let op = OpInfo::of(self.ops.cmp.get(p.at as usize));
        let x = Measurement {
            kind: p.kind,
            metrics: p.metrics.clone(),
            checksum_equal: p.checksum_equal,
        };
        let tensors = Judged::tensors(&self.ops, p);
        Row {
            tensor: Measured::new(p.by, p.external, op, tensors, x),
            judgement: Judgement {
                verdict: p.verdict,
                reason: self
                    .reasons
                    .get(p.reason as usize)
                    .map_or_else(String::new, |r| r.to_string()),
                err: p.err,
                raw_err: p.raw_err,
                tolerance: p.tolerance,
                precision: p.precision,
                reference: self.reference(i),
            },
        }
    }

    /// What a unit's summary counts of pair `i`, without making its row.
    pub(crate) fn brief(&self, i: usize) -> Brief {
        let p = &self.pairs[i];
        Brief {
            verdict: p.verdict,
            err: p.err,
            kind: p.kind,
            matched_by: p.by,
            seq: self.ops.cmp.get(p.at as usize).seq(),
            calibrated: self.reference(i).is_some(),
        }
    }

    /// The rows of `range`.
    pub(crate) fn rows(&self, range: Range<usize>) -> Vec<Row> {
        range.map(|i| self.row(i)).collect()
    }

    /// The end of the op group that `i` starts or is in: consecutive pairs reported under
    /// the same op.
    fn group_end(&self, mut i: usize) -> usize {
        let at = self.pairs[i].at;
        while i < self.pairs.len() && self.pairs[i].at == at {
            i += 1;
        }
        i
    }

    /// Where each op's rows are, in order (an op's rows are consecutive).
    pub(crate) fn groups(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut s = 0;
        std::iter::from_fn(move || {
            (s < self.pairs.len()).then(|| {
                let e = self.group_end(s);
                let g = s..e;
                s = e;
                g
            })
        })
    }

    /// Calls `f` with the rows in order, a chunk of whole ops at a time; stops at the
    /// first error.
    pub(crate) fn visit(&self, f: &mut dyn FnMut(&[Row]) -> Result<()>) -> Result<()> {
        let mut s = 0;
        while s < self.pairs.len() {
            let mut e = (s + CHUNK).min(self.pairs.len());
            if e < self.pairs.len() {
                e = self.group_end(e - 1);
            }
            f(&self.rows(s..e))?;
            s = e;
        }
        Ok(())
    }

    /// About how many bytes it holds: the records of both sides and the pairs.
    pub(crate) fn weight(&self) -> usize {
        let boxed = self
            .pairs
            .iter()
            .map(|p| {
                p.metrics
                    .as_ref()
                    .map_or(0, |_| std::mem::size_of::<Metrics>())
            })
            .sum::<usize>()
            + self.reasons.iter().map(|r| r.len() + 16).sum::<usize>();
        self.ops.bench.weight()
            + self.ops.cmp.weight()
            + self.pairs.capacity() * std::mem::size_of::<Pair>()
            + boxed
    }
}

/// A judged unit op by op, as the localiser reads it.
pub(crate) struct ByOp<'a> {
    judged: &'a Judged,
    /// Where each op's pairs start (`u32`: a unit of a million ops holds one each).
    starts: Vec<u32>,
}

impl ByOp<'_> {
    fn group(&self, k: usize) -> Range<usize> {
        let end = self
            .starts
            .get(k + 1)
            .map_or(self.judged.pairs.len(), |&e| e as usize);
        self.starts[k] as usize..end
    }

    /// Op `k`'s one call on each side (benchmark, comparison), of the same API; None for a
    /// region or a mapped fused kernel (several calls, or other APIs).
    fn one_call(&self, k: usize) -> Option<(Op<'_>, Op<'_>)> {
        let j = self.judged;
        let pairs = &j.pairs[self.group(k)];
        let (at, bench) = (pairs[0].at, pairs[0].bench.0);
        if pairs.iter().any(|p| p.cmp.0 != at || p.bench.0 != bench) {
            return None;
        }
        let (b, c) = (j.ops.bench.get(bench as usize), j.ops.cmp.get(at as usize));
        (b.key().base_text() == c.key().base_text()).then_some((b, c))
    }
}

impl Judged {
    /// The unit op by op.
    pub(crate) fn by_op(&self) -> ByOp<'_> {
        ByOp {
            judged: self,
            // Pair positions, fewer than an op store's u32 tensors.
            starts: self.groups().map(|g| g.start as u32).collect(),
        }
    }

    /// Whether the comparison side of pair `p` holds NaN/Inf (as
    /// [`Measured::cmp_nonfinite`] says of its row).
    fn cmp_nonfinite(&self, p: &Pair) -> bool {
        match &p.metrics {
            Some(m) => m.nonfinite_c > 0,
            None => super::measure::nonfinite(&Judged::tensors(&self.ops, p).cmp.stats()) > 0,
        }
    }
}

impl OpRows for ByOp<'_> {
    fn ops(&self) -> usize {
        self.starts.len()
    }

    fn key(&self, k: usize) -> KeyRef<'_> {
        let at = self.judged.pairs[self.starts[k] as usize].at;
        self.judged.ops.cmp.get(at as usize).key()
    }

    fn head(&self, k: usize) -> Head {
        let j = self.judged;
        let pairs = &j.pairs[self.group(k)];
        let op = j.ops.cmp.get(pairs[0].at as usize);
        Head {
            seq: op.seq(),
            direction: op.direction(),
            fails: pairs.iter().any(|p| p.verdict == Verdict::Error),
            flagged: pairs.iter().any(|p| p.verdict != Verdict::Pass),
            nonfinite: pairs.iter().any(|p| j.cmp_nonfinite(p)),
        }
    }

    fn rows(&self, k: usize) -> Cow<'_, [Row]> {
        Cow::Owned(self.judged.rows(self.group(k)))
    }

    fn arg_diffs(&self, k: usize, divergent: bool) -> Vec<ArgDiff> {
        let Some((b, c)) = self.one_call(k) else {
            return Vec::new();
        };
        match (b.args(), c.args()) {
            (x, y) if x == y => Vec::new(),
            (x, y) if divergent => args::diff_at_divergence(x, y),
            (Some(x), Some(y)) => args::diff(x, y),
            _ => Vec::new(),
        }
    }

    fn draw(&self, k: usize) -> Option<Draw> {
        let (b, c) = self.one_call(k)?;
        let api = c.key().base_text();
        let (x, y) = (
            args::draw_switch(api, b.args()?)?,
            args::draw_switch(api, c.args()?)?,
        );
        if x.0 != y.0 {
            return None;
        }
        let said = if x.1 == y.1 {
            format!("{} on both sides", x.1)
        } else {
            format!("{} in the benchmark, {} in the comparison run", x.1, y.1)
        };
        Some(if x.0 { Draw::Off(said) } else { Draw::On(said) })
    }

    fn layout_diffs(&self, k: usize) -> Vec<String> {
        let j = self.judged;
        let pairs = &j.pairs[self.group(k)];
        let tensors: Vec<_> = pairs.iter().map(|p| Judged::tensors(&j.ops, p)).collect();
        if tensors
            .iter()
            .all(|t| t.bench.layout().is_none() || t.cmp.layout().is_none())
        {
            return Vec::new();
        }
        // Slots name tensors where the op is one call on each side, else whole names.
        let one = self.one_call(k).is_some();
        let names: Vec<Cow<str>> = tensors
            .iter()
            .map(|t| match t.cmp.slot_name() {
                Some(s) if one => Cow::Borrowed(s),
                _ => t.cmp.name(),
            })
            .collect();
        let sides: Vec<layout::Sides> = tensors
            .iter()
            .zip(&names)
            .map(|(t, label)| layout::Sides {
                label,
                bench: (t.bench.shape(), t.bench.layout()),
                cmp: (t.cmp.shape(), t.cmp.layout()),
            })
            .collect();
        layout::differences(&sides)
    }

    fn one_sided_source(&self, k: usize, name: &str) -> Option<OneSidedOp> {
        let j = self.judged;
        let p = j.pairs[self.group(k)]
            .iter()
            .find(|p| Judged::tensors(&j.ops, p).cmp.name() == name)?;
        let t = Judged::tensors(&j.ops, p);
        let sides = [
            (Side::Cmp, t.cmp.src(), &j.ops.cmp),
            (Side::Bench, t.bench.src(), &j.ops.bench),
        ];
        sides.into_iter().find_map(|(side, src, ops)| {
            let src = src?;
            let paired_ops: HashSet<u32> = j
                .pairs
                .iter()
                .map(|q| match side {
                    Side::Cmp => q.cmp.0,
                    Side::Bench => q.bench.0,
                })
                .collect();
            let paired = |at: usize| paired_ops.contains(&(at as u32));
            // (Read once per unit and phase, where a divergence enters from outside.)
            let producers: HashMap<u64, usize> = ops
                .iter()
                .flat_map(|o| {
                    o.tensors()
                        .filter(|x| x.role() == Role::Output)
                        .filter_map(move |x| Some((x.id()?, o.index())))
                })
                .collect();
            let at = *producers.get(&src)?;
            if paired(at) {
                return None;
            }
            let op = ops.get(at);
            // What it was computed from: the unpaired ops of its side upstream of it,
            // breadth first through the dataflow's `src` links.
            let mut upstream = Vec::new();
            let mut seen = vec![at];
            let mut queue = std::collections::VecDeque::from([at]);
            while let Some(i) = queue.pop_front() {
                for x in ops.get(i).tensors().filter(|x| x.role() != Role::Output) {
                    let Some(&from) = x.src().and_then(|s| producers.get(&s)) else {
                        continue;
                    };
                    if upstream.len() < UPSTREAM && !seen.contains(&from) && !paired(from) {
                        seen.push(from);
                        upstream.push(ops.get(from).key().leaf().to_string());
                        queue.push_back(from);
                    }
                }
            }
            Some(OneSidedOp {
                side,
                op: op.key().text().to_string(),
                stack: (side == Side::Cmp).then(|| op.stack()).flatten(),
                upstream,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pair_stays_small() {
        // A unit of a million pairs holds a million of them (issue 14).
        assert_eq!(std::mem::size_of::<super::Pair>(), 64);
    }
}
