//! Pass 4, the regions: a stretch where both sides still have calls left between two
//! pairs is where the code paths differ. A mapping rule that declares the two runs
//! equivalent makes it `mapped`, else (only between two points both sides agree on) it is
//! a `module` region; either is compared at its boundary tensors (`boundary`). A stretch of
//! module records only falls back to the record of an enclosing module call that pairs.
//! What no region takes is left over (`reasons`).

use super::builder::Builder;
use super::stretches::{nest, Bounds};
use super::view::{GroupKey, SideView};
use crate::compare::align::{MatchedBy, OpInfo, Region, Side, TensorRef, Why};
use crate::compare::Sides;
use crate::dump::{Direction, Op, OpKind};

/// The module path a module record is of (`Module.a.b.Class.forward.0`: `a.b`).
fn record_path(op: Op<'_>) -> Option<&str> {
    crate::op_key::module_path(op.key().text())
}

impl Builder<'_> {
    /// Makes regions of the stretches left on both sides, or marks them left over.
    pub(super) fn regions_of(&mut self, gaps: &[(GroupKey, Vec<u32>, Vec<u32>)]) {
        let bounds = Bounds::new(&self.op_pair);
        let mut paired = Sides::new(Vec::new(), Vec::new());
        for (c, b) in self.op_pair.iter().enumerate() {
            if let Some(b) = *b {
                paired.bench.push(b);
                paired.cmp.push(c as u32);
            }
        }
        paired.bench.sort_unstable();
        for (key, b, c) in nest(gaps, &paired) {
            if b.is_empty() || c.is_empty() {
                continue;
            }
            let bounded = bounds.encloses(&b, &c);
            if !self.region(&key.1, &b, &c, bounded) && !self.inside_record(&key.1, &b, &c) {
                self.leftover(&b, &c);
            }
        }
    }

    /// Compares a stretch where both sides have calls left: a region. Returns whether
    /// any boundary pair was found.
    fn region(&mut self, module: &str, b: &[usize], c: &[usize], bounded: bool) -> bool {
        let bids: Vec<u32> = b.iter().map(|&o| self.bv.api[o]).collect();
        let cids: Vec<u32> = c.iter().map(|&o| self.cv.api[o]).collect();
        if bids == cids {
            // The same calls with other shapes: a shape mismatch, not another code path.
            return false;
        }
        let names =
            |ids: &[u32]| -> Vec<&str> { ids.iter().map(|&a| self.apis[a as usize]).collect() };
        let (bapis, capis) = (names(&bids), names(&cids));
        let rule = self
            .mapping
            .rule_for(&bapis, &capis)
            .map(|r| r.name.clone());
        if rule.is_none() && !bounded {
            // Module fallback only between two points both sides agree on: calls that
            // share nothing with anything paired are not guessed at.
            return false;
        }
        let by = if rule.is_some() {
            MatchedBy::Mapped
        } else {
            MatchedBy::Module
        };
        let (bin, bout) = self.boundary(Side::Bench, b);
        let (cin, cout) = self.boundary(Side::Cmp, c);
        let inputs = self.pair_lists(
            &bin,
            &cin,
            |cr| self.input_target(cr),
            |br| self.tensor(Side::Bench, br).src(),
            true,
        );
        let outputs = self.pair_lists(
            &bout,
            &cout,
            |cr| self.output_target(cr),
            |br| self.tensor(Side::Bench, br).id(),
            false,
        );
        if outputs.is_empty() {
            return false;
        }
        let at = *c.last().unwrap_or(&0);
        let direction = self.cv.ops().get(at).direction();
        for p in inputs.iter() {
            self.push(p.bench, p.cmp, by, at, 0);
        }
        for p in outputs.iter() {
            self.push(p.bench, p.cmp, by, at, 1);
        }
        let boundary: Vec<Sides<TensorRef>> = inputs.iter().chain(&outputs).copied().collect();
        let id = self.regions.len();
        self.regions.push(Region {
            module: module.to_string(),
            direction,
            by,
            rule,
            calls: self.calls(b, c),
            at: OpInfo::of(self.cv.ops().get(at)),
            boundary: boundary.len(),
        });
        if direction == Direction::Forward {
            for &o in b {
                self.in_region.bench.insert(o, id);
            }
            for &o in c {
                self.in_region.cmp.insert(o, id);
            }
            let mirrored = self.mirrored(b, c, &inputs, &outputs);
            self.boundaries.push(mirrored);
        } else {
            self.boundaries.push(Vec::new());
        }
        self.mark(Side::Bench, b, Why::Inside);
        self.mark(Side::Cmp, c, Why::Inside);
        true
    }

    /// A stretch of module records only (a dump without API calls: `level="module"`,
    /// msprobe's L0) that no region could be made of, inside a call of an ancestor module
    /// whose own records pair: the module's calls differ in number or shape inside it (an
    /// MoE's experts call their activation module once per expert, or once), and the
    /// ancestor's records compare what goes in and out. A region of that module, reported
    /// under its record; returns whether it was made.
    fn inside_record(&mut self, module: &str, b: &[usize], c: &[usize]) -> bool {
        let modules_only = |v: &SideView, ops: &[usize]| {
            ops.iter().all(|&o| v.ops().get(o).kind() == OpKind::Module)
        };
        if !modules_only(&self.bv, b) || !modules_only(&self.cv, c) {
            return false;
        }
        let (Some(&bl), Some(&cl)) = (b.last(), c.last()) else {
            return false;
        };
        let direction = self.cv.ops().get(cl).direction();
        // The record of `path` that ends the call the stretch lies in: the next one after
        // it, before any record of a module outside `path` (the call has ended then).
        let next = |v: &SideView, after: usize, path: &str| -> Option<usize> {
            for op in v.ops().iter().skip(after + 1) {
                if op.kind() != OpKind::Module || op.direction() != direction {
                    continue;
                }
                let p = record_path(op)?;
                if p == path {
                    return Some(op.index());
                }
                let inside =
                    p.len() > path.len() && p.starts_with(path) && p.as_bytes()[path.len()] == b'.';
                if !inside {
                    return None;
                }
            }
            None
        };
        let mut q = module;
        while let Some((up, _)) = q.rsplit_once('.') {
            q = up;
            let (Some(bq), Some(cq)) = (next(&self.bv, bl, q), next(&self.cv, cl, q)) else {
                continue;
            };
            if self.op_pair[cq] != Some(bq as u32) {
                return false;
            }
            let at = self.cv.ops().get(cq);
            self.regions.push(Region {
                module: q.to_string(),
                direction,
                by: MatchedBy::Module,
                rule: None,
                calls: self.calls(b, c),
                at: OpInfo::of(at),
                boundary: at.tensor_count(),
            });
            self.boundaries.push(Vec::new());
            self.mark(Side::Bench, b, Why::Inside);
            self.mark(Side::Cmp, c, Why::Inside);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use crate::compare::align::{MatchedBy, Side, TensorMatch, Why};
    use crate::compare::structural::fixtures::{align, op, pairs, unary, N};
    use crate::dump::{OpKey, OpRec, Role};

    /// q, k, v from a split, then attention, then a projection; `fused` uses SDPA.
    fn attention(fused: bool) -> Vec<OpRec> {
        use Role::{Input as I, Output as O};
        const S: &[usize] = &[2, 4, 4];
        const T: &[usize] = &[2, 4, 4];
        let mut v = vec![op(
            "Tensor.unbind.0.forward",
            "attn",
            &[
                (I, &[3, 2, 4, 4], None, None),
                (O, S, Some(1), None),
                (O, S, Some(2), None),
                (O, S, Some(3), None),
            ],
        )];
        if fused {
            v.push(op(
                "Functional.scaled_dot_product_attention.0.forward",
                "attn",
                &[
                    (I, S, None, Some(1)),
                    (I, S, None, Some(2)),
                    (I, S, None, Some(3)),
                    (O, S, Some(9), None),
                ],
            ));
        } else {
            // k is transposed first: the composition reads q, k, v in another order.
            v.push(op(
                "Tensor.transpose.0.forward",
                "attn",
                &[(I, S, None, Some(2)), (O, T, Some(4), None)],
            ));
            v.push(op(
                "Torch.matmul.0.forward",
                "attn",
                &[
                    (I, S, None, Some(1)),
                    (I, T, None, Some(4)),
                    (O, &[2, 4, 4], Some(5), None),
                ],
            ));
            v.push(op(
                "Functional.softmax.0.forward",
                "attn",
                &[
                    (I, &[2, 4, 4], None, Some(5)),
                    (O, &[2, 4, 4], Some(6), None),
                ],
            ));
            v.push(op(
                "Torch.matmul.1.forward",
                "attn",
                &[
                    (I, &[2, 4, 4], None, Some(6)),
                    (I, S, None, Some(3)),
                    (O, S, Some(9), None),
                ],
            ));
        }
        v.push(op(
            "Functional.linear.0.forward",
            "attn",
            &[(I, S, None, Some(9)), (O, S, Some(10), None)],
        ));
        v
    }

    #[test]
    fn a_fused_kernel_is_compared_at_its_boundary_through_dataflow() {
        let a = align(attention(false), attention(true), true);
        assert_eq!(a.regions.len(), 1);
        let r = &a.regions[0];
        assert_eq!(
            (r.by, r.rule.as_deref()),
            (MatchedBy::Mapped, Some("attention"))
        );
        let p = pairs(&a);
        // q, k and v pair by the value they hold, not by position (k comes first on the
        // bench, through the transpose).
        for (b, c) in [
            (
                "Torch.matmul.0.forward.input.0",
                "Functional.scaled_dot_product_attention.0.forward.input.0",
            ),
            (
                "Tensor.transpose.0.forward.input.0",
                "Functional.scaled_dot_product_attention.0.forward.input.1",
            ),
            (
                "Torch.matmul.1.forward.input.1",
                "Functional.scaled_dot_product_attention.0.forward.input.2",
            ),
            (
                "Torch.matmul.1.forward.output.0",
                "Functional.scaled_dot_product_attention.0.forward.output.0",
            ),
        ] {
            assert!(
                p.contains(&(b.into(), c.into(), "mapped")),
                "{b} <-> {c} in {p:?}"
            );
        }
        // Rows of the region are reported under the fused call, inputs first.
        let sdpa = 1;
        let region_rows: Vec<&TensorMatch> = a
            .matches
            .iter()
            .filter(|m| m.by == MatchedBy::Mapped)
            .collect();
        assert!(region_rows.iter().all(|m| m.at == sdpa));
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.why == Why::Inside && u.side == Side::Bench));
    }

    #[test]
    fn unknown_code_paths_between_agreed_points_fall_back_to_the_module() {
        let b = attention(false);
        let mut c = attention(true);
        // No rule knows this kernel.
        c[1].key = OpKey::parse("NPU.npu_my_attention.0.forward");
        for t in &mut c[1].tensors {
            t.name = t
                .name
                .replace(
                    "Functional.scaled_dot_product_attention",
                    "NPU.npu_my_attention",
                )
                .into();
        }
        let a = align(b, c, true);
        assert_eq!(a.regions.len(), 1);
        assert_eq!(a.regions[0].by, MatchedBy::Module);
        assert_eq!(a.regions[0].module, "attn");
        assert_eq!(
            a.matches
                .iter()
                .filter(|m| m.by == MatchedBy::Module)
                .count(),
            4
        );
    }

    #[test]
    fn nothing_in_common_is_not_guessed_at() {
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Functional.gelu.0.forward", "", N),
        ];
        let c = vec![
            unary("Other.relu.0.forward", "", N),
            unary("Other.gelu.0.forward", "", N),
        ];
        let a = align(b, c, false);
        assert!(a.matches.is_empty());
        assert_eq!(a.unmatched.len(), 8);
    }

    #[test]
    fn module_records_called_another_number_of_times_inside_a_paired_record_are_inside_it() {
        // Module records only (level "module"): the bench's experts call their activation
        // module twice (once per expert, on its share of the rows), the comparison's once
        // on all of them. The experts' own records pair: the activation's calls are inside
        // them. If the experts' records do not pair, nothing vouches for them.
        const X: &[usize] = &[6, 4];
        let (i, o) = (Role::Input, Role::Output);
        let rec = |key: &str, m: &str, x: &'static [usize], y: &'static [usize]| {
            op(key, m, &[(i, x, None, None), (o, y, None, None)])
        };
        let side = |acts: &[&'static [usize]], out: &'static [usize]| -> Vec<OpRec> {
            let mut ops = vec![rec("Module.moe.gate.Linear.forward.0", "moe.gate", X, X)];
            for (n, &a) in acts.iter().enumerate() {
                let key = format!("Module.moe.experts.act.SiLU.forward.{n}");
                ops.push(rec(&key, "moe.experts.act", a, a));
            }
            ops.push(rec(
                "Module.moe.experts.Experts.forward.0",
                "moe.experts",
                X,
                out,
            ));
            ops.push(rec("Module.moe.MoE.forward.0", "moe", X, X));
            ops
        };
        let a = align(side(&[&[2, 4], &[4, 4]], X), side(&[X], X), true);
        let left: Vec<&str> = a
            .unmatched
            .iter()
            .filter(|u| u.why != Why::Inside)
            .map(|u| u.name.as_str())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(a.regions.len(), 1);
        assert_eq!(a.regions[0].module, "moe.experts");
        assert_eq!(
            a.regions[0].at.key.as_str(),
            "Module.moe.experts.Experts.forward.0"
        );
        // Without the experts' records (none captured), nothing vouches for them.
        let bare = |ops: Vec<OpRec>| -> Vec<OpRec> {
            ops.into_iter()
                .filter(|o| {
                    !o.key.as_str().starts_with("Module.moe.experts.Experts")
                        && !o.key.as_str().starts_with("Module.moe.MoE")
                })
                .collect()
        };
        let a = align(
            bare(side(&[&[2, 4], &[4, 4]], X)),
            bare(side(&[X], X)),
            true,
        );
        assert!(a.regions.is_empty());
        assert!(
            a.unmatched
                .iter()
                .any(|u| u.name.contains(".act.SiLU.") && u.why != Why::Inside),
            "{:?}",
            a.unmatched
        );
    }
}
