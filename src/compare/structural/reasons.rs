//! Why what is left is unmatched, and the finished alignment. Every left-over op carries a
//! reason (inside a region, a shape mismatch, a recomputation one side does, a call the
//! other dumper does not hook, or plainly unmatched) that the reports show beside its
//! tensors; the reasons are set by every pass, read once here when the unmatched rows are
//! made.

use super::builder::Builder;
use super::view::SideView;
use crate::compare::align::{unmatched, Region, Side, TensorMatch, Unmatched, Why};
use foldhash::HashSet;

impl Builder<'_> {
    pub(super) fn mark(&mut self, side: Side, ops: &[usize], why: Why) {
        let w = match side {
            Side::Bench => &mut self.why.bench,
            Side::Cmp => &mut self.why.cmp,
        };
        for &op in ops {
            w[op] = why;
        }
    }

    /// A stretch left on both sides that no region could be made of: other shapes for the
    /// same API are a shape mismatch, the rest unmatched.
    pub(super) fn leftover(&mut self, b: &[usize], c: &[usize]) {
        let bapis: HashSet<u32> = b.iter().map(|&o| self.bv.api[o]).collect();
        let capis: HashSet<u32> = c.iter().map(|&o| self.cv.api[o]).collect();
        let shared: HashSet<u32> = bapis.intersection(&capis).copied().collect();
        let bw: Vec<usize> = b
            .iter()
            .copied()
            .filter(|&o| shared.contains(&self.bv.api[o]))
            .collect();
        let cw: Vec<usize> = c
            .iter()
            .copied()
            .filter(|&o| shared.contains(&self.cv.api[o]))
            .collect();
        self.mark(Side::Bench, &bw, Why::ShapeMismatch);
        self.mark(Side::Cmp, &cw, Why::ShapeMismatch);
    }

    /// Left-over views and casts of APIs the other side never calls: not hooked there.
    fn unhooked(&mut self) {
        let n = self.apis.len();
        let called = |v: &SideView| -> Vec<bool> {
            let mut c = vec![false; n];
            for &a in &v.api {
                c[a as usize] = true;
            }
            c
        };
        let (ba, ca) = (called(&self.bv), called(&self.cv));
        for (side, own, other) in [(Side::Bench, &self.bv, &ca), (Side::Cmp, &self.cv, &ba)] {
            let why = match side {
                Side::Bench => &mut self.why.bench,
                Side::Cmp => &mut self.why.cmp,
            };
            for (op, w) in why.iter_mut().enumerate() {
                let api = own.api[op] as usize;
                if *w == Why::Unmatched
                    && !other[api]
                    && self.mapping.is_passthrough(self.apis[api])
                {
                    *w = Why::Unhooked;
                }
            }
        }
    }

    pub(super) fn finish(mut self) -> (Vec<Region>, Vec<TensorMatch>, Vec<Unmatched>) {
        self.unhooked();
        let mut matches = self.matches;
        // Comparison execution order; a region's rows under its last call, inputs first.
        // The key is unique (a comparison tensor has one match): an unstable sort gives the
        // same order without a scratch copy.
        matches.sort_unstable_by_key(|(m, late)| (m.at, *late, m.refs.cmp));
        let matches: Vec<TensorMatch> = matches.into_iter().map(|(m, _)| m).collect();
        let mut only = Vec::new();
        for (side, v, taken, why) in [
            (Side::Cmp, &self.cv, &self.taken.cmp, &self.why.cmp),
            (Side::Bench, &self.bv, &self.taken.bench, &self.why.bench),
        ] {
            for op in v.ops().iter() {
                for t in op.tensors() {
                    if !taken[t.flat()] {
                        only.push(unmatched(side, t, why[op.index()]));
                    }
                }
            }
        }
        let mut regions = self.regions;
        regions.sort_by_key(|r| r.at.index);
        (regions, matches, only)
    }
}

#[cfg(test)]
mod tests {
    use crate::compare::align::{MatchedBy, Side, Why};
    use crate::compare::structural::fixtures::{align, unary, M, N};

    #[test]
    fn a_deleted_call_is_left_over_on_the_bench() {
        let b = vec![
            unary("Functional.gelu.0.forward", "m", N),
            unary("Tensor.float.0.forward", "m", N),
            unary("Functional.gelu.1.forward", "m", N),
        ];
        let c = vec![
            unary("Functional.gelu.0.forward", "m", N),
            unary("Functional.gelu.1.forward", "m", N),
        ];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 4);
        assert!(a.matches.iter().all(|m| m.by == MatchedBy::Exact));
        assert_eq!(a.unmatched.len(), 2);
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.side == Side::Bench && u.name.starts_with("Tensor.float.0.")));
    }

    #[test]
    fn same_api_with_other_shapes_is_a_shape_mismatch_not_a_pair() {
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.sum.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
        ];
        let c = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.sum.0.forward", "", M),
            unary("Functional.relu.1.forward", "", N),
        ];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 4);
        assert_eq!(a.unmatched.len(), 4);
        assert!(a.unmatched.iter().all(|u| u.why == Why::ShapeMismatch));
        assert!(a.regions.is_empty());
    }

    #[test]
    fn recomputation_on_one_side_is_reported_as_such() {
        let b = vec![unary("Functional.relu.0.forward", "blk", N)];
        let mut again = unary("Functional.relu.1.forward", "blk", N);
        again.recompute = true;
        let c = vec![unary("Functional.relu.0.forward", "blk", N), again];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 2);
        assert_eq!(a.unmatched.len(), 2);
        assert!(a.unmatched.iter().all(|u| u.why == Why::Recompute));
    }

    #[test]
    fn views_the_other_dumper_never_records_are_unhooked_not_missing() {
        // msprobe does not hook Tensor.reshape; a reshape the other side does call but
        // not here is a plain left-over.
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.reshape.0.forward", "", N),
            unary("Tensor.transpose.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
        ];
        let c = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
            unary("Tensor.transpose.0.forward", "", M),
        ];
        let a = align(b, c, false);
        let why = |name: &str| a.unmatched.iter().find(|u| u.name == name).map(|u| u.why);
        assert_eq!(
            why("Tensor.reshape.0.forward.output.0"),
            Some(Why::Unhooked)
        );
        assert_eq!(
            why("Tensor.transpose.0.forward.output.0"),
            Some(Why::Unmatched)
        );
        assert!(!Why::Unhooked.missing());
    }
}
