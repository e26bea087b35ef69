//! The backward calls of forward regions. A region's backward is compared at the
//! gradients of the forward region's boundary tensors rather than aligned on its own: its
//! calls differ as the forward ones do, and the gradient of a boundary tensor is in the
//! backward record of the call that read or wrote it. Separate from `regions` because it
//! runs later (between the forward and the backward groups' alignment) over twins, not
//! over gaps.

use super::boundary::same_value;
use super::builder::Builder;
use super::view::SideView;
use crate::compare::align::{OpInfo, Region, Side, TensorRef, Why};
use crate::compare::Sides;
use crate::dump::{Direction, Role};
use crate::op_key;
use foldhash::HashMap;
use std::collections::BTreeMap;

impl Builder<'_> {
    /// The boundary pairs of a forward region (its calls `b`, `c`; its paired `inputs` and
    /// `outputs`) whose gradients its backward compares. A boundary input read by several
    /// calls of the region has its gradient summed over them: no single backward record
    /// holds it, so it is not mirrored.
    pub(super) fn mirrored(
        &self,
        b: &[usize],
        c: &[usize],
        inputs: &[Sides<TensorRef>],
        outputs: &[Sides<TensorRef>],
    ) -> Vec<Sides<TensorRef>> {
        let once = |s: Side, ops: &[usize], r: TensorRef| -> bool {
            let v = self.side(s);
            let t = v.ops().get(r.op()).tensor(r.tensor());
            let Some(src) = t.src() else {
                // No link (a parameter, data from outside): its other reads are the
                // region's src-less inputs recorded as the same value (the 3-D weights
                // of an MoE's experts, indexed once per expert).
                return !ops.iter().any(|&o| {
                    o != r.op()
                        && v.ops().get(o).tensors().any(|x| {
                            x.role() != Role::Output && x.src().is_none() && same_value(t, x)
                        })
                });
            };
            let inside = v
                .flow
                .readers(src)
                .map_or(0, |rs| rs.filter(|x| ops.contains(&x.op())).count());
            inside <= 1
        };
        inputs
            .iter()
            .filter(|p| once(Side::Bench, b, p.bench) && once(Side::Cmp, c, p.cmp))
            .chain(outputs)
            .copied()
            .collect()
    }

    /// The backward calls of forward regions: compared at the gradients of the region's
    /// boundary tensors (a forward input's gradient is its backward call's output in the
    /// same slot, a forward output's gradient its backward call's input). `groups`: the
    /// backward calls by group; a region's calls may lie in several (a module called inside
    /// it). The calls taken are marked `Inside`; the rest are aligned like forward calls.
    pub(super) fn mirror(&mut self, groups: &[Sides<Vec<u32>>]) {
        if self.in_region.bench.is_empty() && self.in_region.cmp.is_empty() {
            // No forward region (identical code paths): no twin lookup per backward call.
            return;
        }
        for (r, mut ops) in self.members(groups) {
            ops.bench.sort_unstable();
            ops.cmp.sort_unstable();
            let twin_of = |v: &SideView, list: &[usize]| -> HashMap<usize, usize> {
                list.iter()
                    .filter_map(|&o| v.twin(o).map(|f| (f, o)))
                    .collect()
            };
            let (bt, ct) = (twin_of(&self.bv, &ops.bench), twin_of(&self.cv, &ops.cmp));
            let at = ops.cmp.iter().copied().max();
            let mut pairs = Vec::new();
            for p in &self.boundaries[r] {
                let (Some(&bb), Some(&cb)) = (bt.get(&p.bench.op()), ct.get(&p.cmp.op())) else {
                    continue;
                };
                if let (Some(x), Some(y)) = (
                    gradient(&self.bv, p.bench, bb),
                    gradient(&self.cv, p.cmp, cb),
                ) {
                    let bo = self.bv.ops().get(bb).tensor(x);
                    let co = self.cv.ops().get(cb).tensor(y);
                    if bo.shape() == co.shape() {
                        let late = u8::from(co.role() == Role::Output);
                        pairs.push((TensorRef::new(bb, x), TensorRef::new(cb, y), late));
                    }
                }
            }
            let Some(at) = at else {
                continue;
            };
            if pairs.is_empty() || ops.bench.is_empty() {
                continue;
            }
            let by = self.regions[r].by;
            for (b, c, late) in &pairs {
                self.push(*b, *c, by, at, *late);
            }
            let fwd = &self.regions[r];
            let region = Region {
                module: fwd.module.clone(),
                direction: Direction::Backward,
                by,
                rule: fwd.rule.clone(),
                calls: self.calls(&ops.bench, &ops.cmp),
                at: OpInfo::of(self.cv.ops().get(at)),
                boundary: pairs.len(),
            };
            self.regions.push(region);
            self.boundaries.push(Vec::new());
            self.mark(Side::Bench, &ops.bench, Why::Inside);
            self.mark(Side::Cmp, &ops.cmp, Why::Inside);
        }
    }

    /// Backward ops whose forward twin lies in a region: by region, in execution order.
    fn members(&self, groups: &[Sides<Vec<u32>>]) -> BTreeMap<usize, Sides<Vec<usize>>> {
        let mut members: BTreeMap<usize, Sides<Vec<usize>>> = BTreeMap::new();
        for g in groups {
            for (s, ops) in [(Side::Bench, &g.bench), (Side::Cmp, &g.cmp)] {
                for &o in ops {
                    let o = o as usize;
                    let v = self.side(s);
                    let reg = v.twin(o).and_then(|f| match s {
                        Side::Bench => self.in_region.bench.get(&f),
                        Side::Cmp => self.in_region.cmp.get(&f),
                    });
                    match (reg, s) {
                        (Some(&r), Side::Bench) => members.entry(r).or_default().bench.push(o),
                        (Some(&r), Side::Cmp) => members.entry(r).or_default().cmp.push(o),
                        (None, _) => {}
                    }
                }
            }
        }
        members
    }
}

/// Where the gradient of the forward tensor `fwd` is in its backward call `bop`: a forward
/// input's is the backward call's output in the same slot, a forward output's its input.
fn gradient(v: &SideView, fwd: TensorRef, bop: usize) -> Option<usize> {
    let slot = v.ops().get(fwd.op()).tensor(fwd.tensor()).slot_name()?;
    let want = op_key::gradient_slot(slot)?;
    v.ops()
        .get(bop)
        .tensors()
        .position(|t| t.slot_name() == Some(want.as_str()))
}

#[cfg(test)]
mod tests {
    use crate::compare::align::Why;
    use crate::compare::structural::fixtures::{align, op, pairs, unary};
    use crate::dump::{OpRec, Role, StatsFields};

    const X: &[usize] = &[3, 4];
    const Y: &[usize] = &[6, 4];
    const W: &[usize] = &[2, 4, 4];
    const E: &[usize] = &[4, 4];
    const EX: &str = "moe.experts";
    const ACT: &str = "moe.experts.act";

    /// Gives the record's first tensor the experts' 3-D weight's statistics (the same on
    /// both sides: each side reads the one weight).
    fn weight(mut r: OpRec) -> OpRec {
        let fields = StatsFields {
            max: Some(1.0),
            min: Some(-1.0),
            mean: Some(0.5),
            norm: Some(3.0),
            nan: Some(0),
            inf: Some(0),
        };
        r.tensors[0].stats = Some(fields.into());
        r
    }

    /// The bench's experts: the 3-D weight indexed once per expert, then that expert's
    /// linear and its call of the activation module; their outputs concatenated; then the
    /// backward of it all.
    fn per_expert() -> Vec<OpRec> {
        let (i, o, ex, act) = (Role::Input, Role::Output, EX, ACT);
        vec![
            op(
                "Functional.relu.0.forward",
                "moe",
                &[(i, X, None, None), (o, X, Some(1), None)],
            ),
            weight(op(
                "Tensor.__getitem__.0.forward",
                ex,
                &[(i, W, None, None), (o, E, Some(10), None)],
            )),
            op(
                "Functional.linear.0.forward",
                ex,
                &[
                    (i, X, None, Some(1)),
                    (i, E, None, Some(10)),
                    (o, X, Some(11), None),
                ],
            ),
            op(
                "Functional.silu.0.forward",
                act,
                &[(i, X, None, Some(11)), (o, X, Some(12), None)],
            ),
            weight(op(
                "Tensor.__getitem__.1.forward",
                ex,
                &[(i, W, None, None), (o, E, Some(13), None)],
            )),
            op(
                "Functional.linear.1.forward",
                ex,
                &[
                    (i, X, None, Some(1)),
                    (i, E, None, Some(13)),
                    (o, X, Some(14), None),
                ],
            ),
            op(
                "Functional.silu.1.forward",
                act,
                &[(i, X, None, Some(14)), (o, X, Some(15), None)],
            ),
            op(
                "Torch.cat.0.forward",
                ex,
                &[
                    (i, X, None, Some(12)),
                    (i, X, None, Some(15)),
                    (o, Y, Some(16), None),
                ],
            ),
            op(
                "Functional.relu.1.forward",
                "moe",
                &[(i, Y, None, Some(16)), (o, Y, Some(17), None)],
            ),
            unary("Functional.relu.1.backward", "moe", Y),
            op(
                "Torch.cat.0.backward",
                ex,
                &[(i, Y, None, None), (o, X, None, None), (o, X, None, None)],
            ),
            unary("Functional.silu.1.backward", act, X),
            op(
                "Functional.linear.1.backward",
                ex,
                &[(i, X, None, None), (o, X, None, None), (o, E, None, None)],
            ),
            op(
                "Tensor.__getitem__.1.backward",
                ex,
                &[(i, E, None, None), (o, W, None, None)],
            ),
            unary("Functional.silu.0.backward", act, X),
            op(
                "Functional.linear.0.backward",
                ex,
                &[(i, X, None, None), (o, X, None, None), (o, E, None, None)],
            ),
            op(
                "Tensor.__getitem__.0.backward",
                ex,
                &[(i, E, None, None), (o, W, None, None)],
            ),
            unary("Functional.relu.0.backward", "moe", X),
        ]
    }

    /// The comparison's experts: one grouped matmul over the repeated input, the activation
    /// module called once; then the backward.
    fn grouped() -> Vec<OpRec> {
        let (i, o, ex, act) = (Role::Input, Role::Output, EX, ACT);
        vec![
            op(
                "Functional.relu.0.forward",
                "moe",
                &[(i, X, None, None), (o, X, Some(1), None)],
            ),
            weight(op(
                "Tensor.transpose.0.forward",
                ex,
                &[(i, W, None, None), (o, W, Some(10), None)],
            )),
            op(
                "Tensor.repeat.0.forward",
                ex,
                &[(i, X, None, Some(1)), (o, Y, Some(11), None)],
            ),
            op(
                "Functional.grouped_mm.0.forward",
                ex,
                &[
                    (i, Y, None, Some(11)),
                    (i, W, None, Some(10)),
                    (o, Y, Some(12), None),
                ],
            ),
            op(
                "Functional.silu.0.forward",
                act,
                &[(i, Y, None, Some(12)), (o, Y, Some(13), None)],
            ),
            op(
                "Functional.relu.1.forward",
                "moe",
                &[(i, Y, None, Some(13)), (o, Y, Some(14), None)],
            ),
            unary("Functional.relu.1.backward", "moe", Y),
            unary("Functional.silu.0.backward", act, Y),
            op(
                "Functional.grouped_mm.0.backward",
                ex,
                &[(i, Y, None, None), (o, Y, None, None), (o, W, None, None)],
            ),
            op(
                "Tensor.repeat.0.backward",
                ex,
                &[(i, Y, None, None), (o, X, None, None)],
            ),
            op(
                "Tensor.transpose.0.backward",
                ex,
                &[(i, W, None, None), (o, W, None, None)],
            ),
            unary("Functional.relu.0.backward", "moe", X),
        ]
    }

    #[test]
    fn a_module_called_inside_a_region_is_part_of_it_forward_and_backward() {
        // An MoE's experts: the bench indexes the 3-D weight once per expert and runs its
        // activation module once per expert; the comparison run runs one grouped matmul
        // and the activation once. The activation's calls belong to the experts' region
        // (nothing is left over), its backward is the region's too, and the weight, read
        // twice by the bench, has no single gradient there to compare.
        let a = align(per_expert(), grouped(), true);
        let left: Vec<&str> = a
            .unmatched
            .iter()
            .filter(|u| u.why != Why::Inside)
            .map(|u| u.name.as_str())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let p = pairs(&a);
        let has = |b: &str, c: &str| p.iter().any(|(x, y, _)| x == b && y == c);
        // Forward: what enters and what leaves the experts.
        assert!(
            has(
                "Functional.linear.0.forward.input.0",
                "Tensor.repeat.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Tensor.__getitem__.0.forward.input.0",
                "Tensor.transpose.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Torch.cat.0.forward.output.0",
                "Functional.silu.0.forward.output.0"
            ),
            "{p:?}"
        );
        // Backward: the gradient flowing in, across the activation module's backward.
        assert!(
            has(
                "Torch.cat.0.backward.input.0",
                "Functional.silu.0.backward.input.0"
            ),
            "{p:?}"
        );
        // Nothing stands for the weight's or the input's whole gradient on the bench.
        assert!(
            p.iter()
                .all(|(x, y, _)| !x.contains("__getitem__") || !y.contains("backward")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .all(|(_, y, _)| !y.starts_with("Tensor.repeat.0.backward")),
            "{p:?}"
        );
        assert_eq!(
            a.regions.len(),
            2,
            "{:?}",
            a.regions.iter().map(|r| &r.calls).collect::<Vec<_>>()
        );
        assert!(a.regions.iter().all(|r| r.module == EX));
    }
}
