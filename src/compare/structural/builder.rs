//! The alignment of one unit while it is built: which tensors are taken on each side,
//! the tensor pairs found so far and the op pairs, the regions and why each left-over op
//! is left over. Every pass adds to it; this file holds the state and the pairing of two
//! paired ops' tensors (by slot, or by the mapping's explicit names), which the passes
//! share.

use super::view::SideView;
use crate::compare::align::{MatchedBy, Region, Side, TensorMatch, TensorRef, Why};
use crate::compare::mapping::Mapping;
use crate::compare::Sides;
use crate::dump::{Direction, Role, Tensor};
use foldhash::{HashMap, HashMapExt};

/// Builds the alignment of one unit, pass by pass (see the module doc).
pub(super) struct Builder<'a> {
    pub(super) bv: SideView<'a>,
    pub(super) cv: SideView<'a>,
    pub(super) mapping: &'a Mapping,
    /// API names, both sides' ids index them.
    pub(super) apis: Vec<&'a str>,
    /// Taken tensors per side, by position among the side's tensors.
    pub(super) taken: Sides<Vec<bool>>,
    /// The bench partner of each comparison tensor (flat), once paired.
    pub(super) partner: Vec<Option<TensorRef>>,
    /// Why a left-over tensor's op is left over, when not simply unmatched.
    pub(super) why: Sides<Vec<Why>>,
    pub(super) matches: Vec<(TensorMatch, u8)>,
    /// Paired ops, comparison index → bench index.
    pub(super) op_pair: Vec<Option<u32>>,
    pub(super) regions: Vec<Region>,
    /// Forward ops inside a region, per side: op → region index.
    pub(super) in_region: Sides<HashMap<usize, usize>>,
    /// Boundary pairs of each forward region whose gradients a backward record holds.
    pub(super) boundaries: Vec<Vec<Sides<TensorRef>>>,
}

impl<'a> Builder<'a> {
    /// A builder over the two sides' views (`apis`: the API names their ids index), with
    /// nothing paired yet.
    pub(super) fn new(
        bv: SideView<'a>,
        cv: SideView<'a>,
        mapping: &'a Mapping,
        apis: Vec<&'a str>,
    ) -> Self {
        let (bn, cn) = (bv.dump.ops.tensor_count(), cv.dump.ops.tensor_count());
        let (bops, cops) = (bv.dump.ops.len(), cv.dump.ops.len());
        Builder {
            why: Sides::new(vec![Why::Unmatched; bops], vec![Why::Unmatched; cops]),
            bv,
            cv,
            mapping,
            apis,
            taken: Sides::new(vec![false; bn], vec![false; cn]),
            partner: vec![None; cn],
            // At most one match per comparison tensor: reserved once rather than grown
            // by doubling (memory never written stays untouched).
            matches: Vec::with_capacity(cn),
            op_pair: vec![None; cops],
            regions: Vec::new(),
            in_region: Sides::default(),
            boundaries: Vec::new(),
        }
    }

    pub(super) fn side(&self, s: Side) -> &SideView<'a> {
        match s {
            Side::Bench => &self.bv,
            Side::Cmp => &self.cv,
        }
    }

    /// The position of `r` among its side's tensors.
    pub(super) fn flat(&self, s: Side, r: TensorRef) -> usize {
        self.side(s).ops().get(r.op()).first_tensor() + r.tensor()
    }

    fn is_taken(&self, s: Side, r: TensorRef) -> bool {
        match s {
            Side::Bench => self.taken.bench[self.flat(s, r)],
            Side::Cmp => self.taken.cmp[self.flat(s, r)],
        }
    }

    pub(super) fn push(&mut self, b: TensorRef, c: TensorRef, by: MatchedBy, at: usize, late: u8) {
        let bi = self.flat(Side::Bench, b);
        let ci = self.flat(Side::Cmp, c);
        if self.taken.bench[bi] || self.taken.cmp[ci] {
            return;
        }
        self.taken.bench[bi] = true;
        self.taken.cmp[ci] = true;
        self.partner[ci] = Some(b);
        let op = self.cv.dump.ops.get(c.op());
        let t = op.tensor(c.tensor());
        let external = match t.role() {
            Role::Parameter => op.direction() == Direction::Forward,
            Role::Input => {
                self.cv.dump.has_dataflow
                    && t.src().is_none()
                    && op.direction() == Direction::Forward
            }
            Role::Output => false,
        };
        self.matches.push((
            TensorMatch {
                refs: Sides::new(b, c),
                external,
                by,
                at: at as u32,
            },
            late,
        ));
    }

    /// Pairs the tensors of two paired ops by slot (`input.0`, `output.1`, `input.weight`:
    /// probe and msprobe name them alike); a slot on one side only stays unmatched.
    pub(super) fn pair_ops(&mut self, b: usize, c: usize) {
        self.op_pair[c] = Some(b as u32);
        let by = if self.bv.match_key(b) == self.cv.match_key(c) {
            MatchedBy::Exact
        } else {
            MatchedBy::Aligned
        };
        let (bop, cop) = (self.bv.dump.ops.get(b), self.cv.dump.ops.get(c));
        // A name outside the op's key (not the grammar) pairs by the whole name.
        let bslot = |i: usize| bop.tensor(i).slot_or_name();
        // Most ops have a few tensors: a scan beats building a map per op pair (a
        // million-op unit built a million maps).
        const SCAN: usize = 16;
        let n = bop.tensor_count();
        let slots: Option<HashMap<&str, usize>> =
            (n > SCAN).then(|| (0..n).map(|i| (bslot(i), i)).collect());
        for (j, t) in cop.tensors().enumerate() {
            let slot = t.slot_or_name();
            let found = match &slots {
                Some(map) => map.get(slot).copied(),
                // The last with that slot, as the map keeps.
                None => (0..n).rev().find(|&i| bslot(i) == slot),
            };
            if let Some(i) = found {
                let u = bop.tensor(i);
                if u.shape() == t.shape() && u.role() == t.role() {
                    let (bt, ct) = (TensorRef::new(b, i), TensorRef::new(c, j));
                    self.push(bt, ct, by, c, 0);
                }
            }
        }
    }

    /// The op keys of a region's calls on each side.
    pub(super) fn calls(&self, b: &[usize], c: &[usize]) -> Sides<Vec<String>> {
        let keys = |v: &SideView, ops: &[usize]| -> Vec<String> {
            ops.iter()
                .map(|&o| v.ops().get(o).key().text().to_string())
                .collect()
        };
        Sides::new(keys(&self.bv, b), keys(&self.cv, c))
    }

    pub(super) fn tensor(&self, s: Side, r: TensorRef) -> Tensor<'a> {
        self.side(s).ops().get(r.op()).tensor(r.tensor())
    }

    /// Explicit tensor pairs of the mapping (msprobe's data mapping), among what is left.
    pub(super) fn pair_named(&mut self, mapping: &Mapping) {
        if mapping.tensor_pairs.is_empty() {
            return;
        }
        let mut bench: HashMap<std::borrow::Cow<str>, TensorRef> = HashMap::new();
        for op in self.bv.ops().iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if !self.is_taken(Side::Bench, r) {
                    bench.insert(t.name(), r);
                }
            }
        }
        let wanted: HashMap<&str, &str> = mapping
            .tensor_pairs
            .iter()
            .map(|(c, b)| (c.as_str(), b.as_str()))
            .collect();
        let mut found = Vec::new();
        for op in self.cv.ops().iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if self.is_taken(Side::Cmp, r) {
                    continue;
                }
                if let Some(b) = wanted.get(t.name().as_ref()).and_then(|&n| bench.get(n)) {
                    found.push((*b, r));
                }
            }
        }
        for (b, c) in found {
            self.push(b, c, MatchedBy::Mapped, c.op(), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::compare::structural::fixtures::{align, op, pairs, M, N, T};
    use crate::dump::Role;

    #[test]
    fn tensors_of_a_paired_op_pair_by_slot_whatever_their_order_and_number() {
        // Small ops are searched by a scan, large ones (more than 16 tensors) through a map:
        // both pair input.i with input.i when the comparison side lists them in another order.
        for inputs in [3usize, 40] {
            let tensors: Vec<T> = (0..inputs)
                .map(|_| (Role::Input, N, None, None))
                .chain([(Role::Output, M, None, None)])
                .collect();
            let b = op("Torch.cat.0.forward", "m", &tensors);
            let mut c = op("Torch.cat.0.forward", "m", &tensors);
            c.tensors.reverse();
            let a = align(vec![b], vec![c], false);
            let p = pairs(&a);
            assert_eq!(p.len(), inputs + 1, "{inputs} inputs");
            assert!(p.iter().all(|(b, c, by)| b == c && *by == "exact"), "{p:?}");
            assert!(a.unmatched.is_empty());
        }
    }
}
