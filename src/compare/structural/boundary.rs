//! A region's boundary tensors and how the two sides' are paired. A region is compared
//! where its calls meet the rest of the run: the inputs it reads from outside and the
//! outputs read after it. Paired first through the dataflow links of what was already
//! paired, then by the value the records say they hold, then by role, shape and order:
//! the rules that decide what a region's rows compare, apart from the decision whether a
//! stretch is a region at all (`regions`).

use super::builder::Builder;
use crate::compare::align::{Side, TensorRef};
use crate::compare::Sides;
use crate::dump::{Direction, Role, Tensor};
use foldhash::HashSet;

/// Whether two tensor records hold the same value by what they say: dtype, shape, and
/// equal statistics or checksum (NaN statistics never equal). Without either, no.
pub(super) fn same_value(a: Tensor, b: Tensor) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    match (a.checksum(), b.checksum()) {
        (Some(x), Some(y)) => x == y,
        _ => a.stats().is_some_and(|x| b.stats() == Some(x)),
    }
}

/// Whether two tensors hold the same kind of value: floating point (of any width: autocast
/// changes it), integers (of any width: an index is int32 on one device, int64 on another)
/// or booleans. Unknown dtypes are taken to agree.
fn same_kind(a: Tensor, b: Tensor) -> bool {
    let kind = |t: Tensor| {
        t.dtype()
            .known()
            .map(|d| (d.is_float(), d == crate::dtype::DType::Bool))
    };
    match (kind(a), kind(b)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

impl Builder<'_> {
    /// Boundary tensors of a region on one side: inputs read from outside it, outputs
    /// read after it (with dataflow); else the first call's inputs and the last's outputs.
    pub(super) fn boundary(&self, s: Side, ops: &[usize]) -> (Vec<TensorRef>, Vec<TensorRef>) {
        let v = self.side(s);
        let all = v.ops();
        let inside: HashSet<usize> = ops.iter().copied().collect();
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        let forward = ops
            .first()
            .is_some_and(|&o| all.get(o).direction() == Direction::Forward);
        if v.dump.has_dataflow && forward {
            for &o in ops {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    let r = TensorRef::new(o, ti);
                    match t.role() {
                        Role::Input | Role::Parameter => {
                            let from_inside = t
                                .src()
                                .and_then(|s| v.flow.producer(s))
                                .is_some_and(|p| inside.contains(&p.op()));
                            if !from_inside {
                                ins.push(r);
                            }
                        }
                        Role::Output => {
                            let read = t.id().and_then(|id| v.flow.readers(id));
                            let read_outside = read
                                .clone()
                                .is_some_and(|mut rs| rs.any(|x| !inside.contains(&x.op())));
                            let last = Some(&o) == ops.last();
                            if read_outside || (read.is_none() && last) {
                                outs.push(r);
                            }
                        }
                    }
                }
            }
        } else {
            if let Some(&o) = ops.first() {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    if t.role() != Role::Output {
                        ins.push(TensorRef::new(o, ti));
                    }
                }
            }
            if let Some(&o) = ops.last() {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    if t.role() == Role::Output {
                        outs.push(TensorRef::new(o, ti));
                    }
                }
            }
        }
        (ins, outs)
    }

    /// Pairs two boundary lists: first where the dataflow links say both hold the same
    /// value (`target` gives the bench dataflow id a comparison tensor corresponds to,
    /// `own` a bench tensor's id; with `placed_only`, a tensor with a target is paired
    /// there or not at all), then where the records do ([`same_value`]), then by role,
    /// shape, kind of dtype and order.
    pub(super) fn pair_lists(
        &self,
        b: &[TensorRef],
        c: &[TensorRef],
        target: impl Fn(TensorRef) -> Option<u64>,
        own: impl Fn(TensorRef) -> Option<u64>,
        placed_only: bool,
    ) -> Vec<Sides<TensorRef>> {
        let mut used = vec![false; b.len()];
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for &cr in c {
            let Some(w) = target(cr) else {
                rest.push(cr);
                continue;
            };
            match (0..b.len()).find(|&i| !used[i] && own(b[i]) == Some(w)) {
                Some(i) => {
                    used[i] = true;
                    out.push(Sides::new(b[i], cr));
                }
                // An input the dataflow places comes from a paired op, compared there: the
                // router's choices, which the other side reads in a call not captured, are
                // no index tensor of the same shape.
                None if placed_only => {}
                None => rest.push(cr),
            }
        }
        // Then what holds the same value by its record (a weight read on both sides, which
        // no captured op produced: each expert's, in another order on each side), then by
        // role, shape and order.
        let mut left = Vec::new();
        for cr in rest {
            let ct = self.tensor(Side::Cmp, cr);
            let hit = (0..b.len()).find(|&i| {
                let bt = self.tensor(Side::Bench, b[i]);
                !used[i] && bt.role() == ct.role() && same_value(bt, ct)
            });
            match hit {
                Some(i) => {
                    used[i] = true;
                    out.push(Sides::new(b[i], cr));
                }
                None => left.push(cr),
            }
        }
        for cr in left {
            let ct = self.tensor(Side::Cmp, cr);
            let hit = (0..b.len()).find(|&i| {
                let bt = self.tensor(Side::Bench, b[i]);
                !used[i] && bt.role() == ct.role() && bt.shape() == ct.shape() && same_kind(bt, ct)
            });
            if let Some(i) = hit {
                used[i] = true;
                out.push(Sides::new(b[i], cr));
            }
        }
        out
    }

    /// The bench dataflow id of the value a comparison input reads: the id of the bench
    /// partner of the comparison output it was produced as.
    pub(super) fn input_target(&self, cr: TensorRef) -> Option<u64> {
        let src = self.tensor(Side::Cmp, cr).src()?;
        let cp = self.cv.flow.producer(src)?;
        let partner = self.partner[self.flat(Side::Cmp, cp)]?;
        self.tensor(Side::Bench, partner).id()
    }

    /// The bench dataflow id a comparison output corresponds to: the value the bench
    /// partner of the op reading it reads in the same slot.
    pub(super) fn output_target(&self, cr: TensorRef) -> Option<u64> {
        let id = self.tensor(Side::Cmp, cr).id()?;
        let reader = self.cv.flow.readers(id)?.next()?;
        let bop = self.op_pair[reader.op()]? as usize;
        let slot = self.tensor(Side::Cmp, reader).slot_name()?;
        self.bv
            .ops()
            .get(bop)
            .tensors()
            .find(|t| t.slot_name() == Some(slot))?
            .src()
    }
}

#[cfg(test)]
mod tests {
    use crate::compare::structural::fixtures::{align, op, pairs};
    use crate::dtype::AnyDType;
    use crate::dump::{OpRec, Role, Stats, StatsFields};

    const X: &[usize] = &[4, 2];
    const V: &[usize] = &[4];
    const W: &[usize] = &[2, 2];

    /// Statistics of a weight (`v` tells two apart).
    fn stats(v: f64) -> Stats {
        StatsFields {
            max: Some(v),
            min: Some(-v),
            mean: Some(v / 4.0),
            norm: Some(2.0 * v),
            nan: Some(0),
            inf: Some(0),
        }
        .into()
    }

    /// `r` with statistics `st` and dtype `dtype` on tensor `slot`.
    fn with(mut r: OpRec, slot: usize, st: Stats, dtype: &str) -> OpRec {
        r.tensors[slot].stats = Some(st);
        r.tensors[slot].dtype = AnyDType::parse(dtype);
        r
    }

    /// `r` with dtype `dtype` on tensors `slots`.
    fn int(mut r: OpRec, slots: &[usize], dtype: &str) -> OpRec {
        for &s in slots {
            r.tensors[s].dtype = AnyDType::parse(dtype);
        }
        r
    }

    /// What both sides run first: the router's scores and its choices (`max`'s indices).
    fn head() -> Vec<OpRec> {
        let (i, o, m) = (Role::Input, Role::Output, "moe");
        vec![
            op(
                "Functional.relu.0.forward",
                m,
                &[(i, X, None, None), (o, X, Some(1), None)],
            ),
            int(
                op(
                    "Tensor.max.0.forward",
                    m,
                    &[
                        (i, X, None, Some(1)),
                        (o, V, Some(2), None),
                        (o, V, Some(3), None),
                    ],
                ),
                &[2],
                "int64",
            ),
        ]
    }

    /// The bench: a mask of the choices (booleans, no link), one linear per expert (the
    /// weights without a link, told apart by their statistics), a position table of its
    /// own (integers from outside), a `where` that combines them.
    fn per_expert() -> Vec<OpRec> {
        let (i, o, m) = (Role::Input, Role::Output, "moe");
        let mut b = head();
        b.extend([
            int(
                op(
                    "Tensor.nonzero.0.forward",
                    m,
                    &[(i, V, None, None), (o, V, Some(4), None)],
                ),
                &[0],
                "bool",
            ),
            with(
                op(
                    "Functional.linear.0.forward",
                    m,
                    &[
                        (i, X, None, Some(1)),
                        (i, W, None, None),
                        (o, X, Some(5), None),
                    ],
                ),
                1,
                stats(1.0),
                "float32",
            ),
            with(
                op(
                    "Functional.linear.1.forward",
                    m,
                    &[
                        (i, X, None, Some(1)),
                        (i, W, None, None),
                        (o, X, Some(6), None),
                    ],
                ),
                1,
                stats(2.0),
                "float32",
            ),
            // (its own integers of that shape, from outside: a position table)
            int(
                op(
                    "Tensor.__getitem__.0.forward",
                    m,
                    &[
                        (i, X, None, Some(5)),
                        (i, V, None, None),
                        (o, X, Some(9), None),
                    ],
                ),
                &[1],
                "int64",
            ),
            op(
                "Torch.where.0.forward",
                m,
                &[
                    (i, X, None, Some(9)),
                    (i, X, None, Some(6)),
                    (o, X, Some(7), None),
                ],
            ),
            op(
                "Functional.relu.1.forward",
                m,
                &[(i, X, None, Some(7)), (o, X, Some(8), None)],
            ),
        ]);
        b
    }

    /// The comparison: both weights transposed (in the other order) and stacked into one
    /// `bmm`, its output indexed by the router's choices (linked) and an `arange`.
    fn stacked() -> Vec<OpRec> {
        let (i, o, m) = (Role::Input, Role::Output, "moe");
        let mut c = head();
        c.extend([
            with(
                op(
                    "Tensor.t.0.forward",
                    m,
                    &[(i, W, None, None), (o, W, Some(10), None)],
                ),
                0,
                stats(2.0),
                "float32",
            ),
            with(
                op(
                    "Tensor.t.1.forward",
                    m,
                    &[(i, W, None, None), (o, W, Some(11), None)],
                ),
                0,
                stats(1.0),
                "float32",
            ),
            op(
                "Torch.bmm.0.forward",
                m,
                &[
                    (i, X, None, Some(1)),
                    (i, W, None, Some(10)),
                    (i, W, None, Some(11)),
                    (o, X, Some(12), None),
                ],
            ),
            int(
                op(
                    "Tensor.__getitem__.0.forward",
                    m,
                    &[
                        (i, X, None, Some(12)),
                        (i, V, None, Some(3)),
                        (i, V, None, None),
                        (o, X, Some(13), None),
                    ],
                ),
                &[1, 2],
                "int64",
            ),
            op(
                "Functional.relu.1.forward",
                m,
                &[(i, X, None, Some(13)), (o, X, Some(14), None)],
            ),
        ]);
        c
    }

    #[test]
    fn a_region_pairs_weights_by_value_and_leaves_a_placed_index_to_its_producer() {
        // Two experts' weights of one shape: the bench reads expert a's first, the
        // comparison (stacking them) expert b's: they pair by their records, not by order.
        // The router's choices come from a paired op; the bench reads them in a call not
        // captured (its `idx == e` mask is a boolean input without a link), so the
        // comparison's read of them pairs with nothing, nor does its `arange` (integers)
        // with the bench's mask (booleans).
        let a = align(per_expert(), stacked(), true);
        let p = pairs(&a);
        let has = |b: &str, c: &str| p.iter().any(|(x, y, _)| x == b && y == c);
        assert!(
            has(
                "Functional.linear.0.forward.input.1",
                "Tensor.t.1.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Functional.linear.1.forward.input.1",
                "Tensor.t.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Torch.where.0.forward.output.0",
                "Tensor.__getitem__.0.forward.output.0"
            ),
            "{p:?}"
        );
        assert!(
            p.iter()
                .all(|(x, y, _)| y != "Tensor.__getitem__.0.forward.input.1"
                    && !x.starts_with("Tensor.nonzero.0.forward.input")),
            "{p:?}"
        );
    }
}
