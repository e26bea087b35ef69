//! Structural alignment: pair the op calls of two runs whose code paths differ.
//!
//! Global call counters (`Functional.linear.7`) shift as soon as one side calls an API
//! once more or once less anywhere before: pairing by name then compares the wrong calls.
//! Here calls are paired within their module call instead, in four passes:
//!
//! 1. **Groups.** Each side's calls are grouped by (phase, module path): forward,
//!    recomputed forward and backward apart, and within them the module the call was made
//!    in (when both sides know it). A call inserted in one module cannot shift another's.
//! 2. **Anchors.** In a group, the n-th call of an API on both sides with the same
//!    signature (API, input and output shapes) is a candidate, and so is the n-th call of
//!    a signature on both sides (one call more of an API on one side shifts the first
//!    count of its later calls, a call of other shapes the second); the longest chain of
//!    candidates in the same order on both sides is kept (a longest increasing subsequence,
//!    `O(n log n)`). On identical code paths every call is an anchor and nothing else runs.
//! 3. **Gaps.** Between two anchors, the calls left are aligned by a longest common
//!    subsequence over signatures (quadratic, but only inside one gap of one module call;
//!    a gap too large for it is paired greedily in order). Same API with other shapes is
//!    never a pair.
//! 4. **Regions.** What is still left on both sides between two pairs is a region: the two
//!    code paths differ there. It is compared at its boundary tensors: the inputs it reads
//!    from outside and the outputs read after it, paired through the dataflow links of
//!    what was already paired (by shape and order without links). A mapping rule that
//!    declares the two runs equivalent (a fused kernel and its composition) marks the rows
//!    `mapped`, else `module`. The backward calls of a forward region are compared at the
//!    gradients of its boundary tensors.
//!
//! What is left after that is unmatched, with the reason: other shapes for the same API,
//! a recomputation only one side does, or nothing on the other side.
//!
//! One file per pass, and one for what they share:
//!
//! - `view`: one side as the passes see it (API ids, signatures, match keys, the calls
//!   grouped by phase and module, backward → forward twins): pass 1.
//! - `dataflow`: who produced and who read each dataflow id, for the boundaries.
//! - `anchors`: signatures, the candidates and their longest increasing subsequence: pass 2.
//! - `gap`: the longest common subsequence inside a gap between anchors: pass 3.
//! - `builder`: the alignment under construction (taken tensors, tensor and op pairs) and
//!   the pairing of two paired ops' tensors by slot or by the mapping's names.
//! - `stretches`: which gaps make one region (modules called inside one) and whether paired
//!   calls enclose it.
//! - `regions`: pass 4, the mapped and module regions, and the module record fallback.
//! - `boundary`: a region's boundary tensors and how the two sides' pair.
//! - `mirror`: the backward calls of forward regions, at the gradients of their boundaries.
//! - `reasons`: why what is left is unmatched, and the finished alignment.
//!
//! This file holds the aligner itself and the order of the passes: forward and recompute
//! groups, their regions, the backward mirrored from them, the rest of the backward groups
//! and their regions, the mapping's named tensor pairs.

mod anchors;
mod boundary;
mod builder;
mod dataflow;
#[cfg(test)]
mod fixtures;
mod gap;
mod mirror;
mod reasons;
mod regions;
mod stretches;
mod view;

use super::align::{Aligner, Alignment, Region, Side, TensorMatch, Unmatched, Why};
use super::mapping::Mapping;
use super::Sides;
use crate::dump::RankDump;
use builder::Builder;
use std::collections::BTreeMap;
use view::{has_modules, GroupKey, Phase, SideView};

/// The structural aligner (the default), with the mapping table it consults.
#[derive(Debug, Clone)]
pub struct StructuralAligner {
    /// Equivalences and renames between the sides.
    pub mapping: Mapping,
}

impl Default for StructuralAligner {
    /// With the built-in mapping table.
    fn default() -> Self {
        StructuralAligner::new(Mapping::builtin())
    }
}

impl StructuralAligner {
    /// An aligner consulting `mapping`.
    pub fn new(mapping: Mapping) -> Self {
        StructuralAligner { mapping }
    }
}

/// A side's groups: each (phase, module path)'s calls, in execution order.
type Groups = BTreeMap<GroupKey, Vec<u32>>;

/// The stretches left in each group, with their group.
type Gaps = Vec<(GroupKey, Vec<u32>, Vec<u32>)>;

impl Aligner for StructuralAligner {
    fn align(&self, dumps: Sides<RankDump>) -> Alignment {
        let (regions, matches, unmatched) = self.passes(&dumps);
        Alignment {
            dumps,
            matches,
            unmatched,
            regions,
        }
    }
}

impl StructuralAligner {
    /// The passes over one unit (see the module doc): its regions, matches and unmatched
    /// tensors.
    fn passes(&self, dumps: &Sides<RankDump>) -> (Vec<Region>, Vec<TensorMatch>, Vec<Unmatched>) {
        let modules = has_modules(&dumps.bench) && has_modules(&dumps.cmp);
        let ((bv, bapis), (mut cv, capis)) = rayon::join(
            || SideView::new(&dumps.bench, None, modules),
            || SideView::new(&dumps.cmp, Some(&self.mapping), modules),
        );
        // One id per API over both sides.
        let mut apis = bapis;
        cv.renumber(capis, &mut apis);
        let mut scratch = vec![0u32; apis.names.len()];
        let mut bld = Builder::new(bv, cv, &self.mapping, apis.names);
        let keys: Vec<GroupKey> = {
            let mut k: Vec<GroupKey> = bld.bv.groups.keys().cloned().collect();
            k.extend(bld.cv.groups.keys().cloned());
            k.sort();
            k.dedup();
            k
        };
        // Each group's op lists are taken once, not copied.
        let mut groups = Sides::new(
            std::mem::take(&mut bld.bv.groups),
            std::mem::take(&mut bld.cv.groups),
        );
        // Forward and recompute groups first: backward regions mirror forward ones.
        let gaps = forward(&mut bld, &keys, &mut groups, &mut scratch);
        bld.regions_of(&gaps);
        let bwd_gaps = backward(&mut bld, &keys, &mut groups, &mut scratch);
        bld.regions_of(&bwd_gaps);
        bld.pair_named(&self.mapping);
        bld.finish()
    }
}

/// The op lists of group `key` on each side, taken out of `groups`.
fn take(groups: &mut Sides<Groups>, key: &GroupKey) -> Sides<Vec<u32>> {
    Sides::new(
        groups.bench.remove(key).unwrap_or_default(),
        groups.cmp.remove(key).unwrap_or_default(),
    )
}

/// Aligns the forward and recompute groups (a recomputation on one side only is left
/// over as such); returns their gaps.
fn forward(
    bld: &mut Builder,
    keys: &[GroupKey],
    groups: &mut Sides<Groups>,
    scratch: &mut [u32],
) -> Gaps {
    let mut gaps: Gaps = Vec::new();
    for key in keys.iter().filter(|k| k.0 != Phase::Backward) {
        let Sides { bench: b, cmp: c } = take(groups, key);
        if key.0 == Phase::Recompute && (b.is_empty() || c.is_empty()) {
            bld.mark(Side::Bench, &widen(&b), Why::Recompute);
            bld.mark(Side::Cmp, &widen(&c), Why::Recompute);
            continue;
        }
        let g = align_group(&b, &c, &bld.bv, &bld.cv, scratch);
        drop((b, c));
        for (x, y) in g.pairs {
            bld.pair_ops(x as usize, y as usize);
        }
        gaps.extend(g.gaps.into_iter().map(|(x, y)| (key.clone(), x, y)));
    }
    gaps
}

/// Aligns the backward groups: calls whose forward twin is inside a region go to that
/// region's backward; the rest is aligned like forward calls. Returns their gaps.
fn backward(
    bld: &mut Builder,
    keys: &[GroupKey],
    groups: &mut Sides<Groups>,
    scratch: &mut [u32],
) -> Gaps {
    let mut bwd_gaps = Vec::new();
    let bkeys: Vec<&GroupKey> = keys.iter().filter(|k| k.0 == Phase::Backward).collect();
    let bwd: Vec<Sides<Vec<u32>>> = bkeys.iter().map(|k| take(groups, k)).collect();
    bld.mirror(&bwd);
    for (key, ops) in bkeys.into_iter().zip(bwd) {
        let left = |ops: Vec<u32>, why: &[Why]| -> Vec<u32> {
            let keep = |o: &u32| why[*o as usize] != Why::Inside;
            ops.into_iter().filter(keep).collect()
        };
        let rest = Sides::new(left(ops.bench, &bld.why.bench), left(ops.cmp, &bld.why.cmp));
        let g = align_group(&rest.bench, &rest.cmp, &bld.bv, &bld.cv, scratch);
        for (x, y) in g.pairs {
            bld.pair_ops(x as usize, y as usize);
        }
        bwd_gaps.extend(g.gaps.into_iter().map(|(x, y)| (key.clone(), x, y)));
    }
    bwd_gaps
}

/// Op pairs of one group, and the stretches between them where both sides have calls
/// left (the regions) or one side has (insertions).
struct GroupAlignment {
    pairs: Vec<(u32, u32)>,
    gaps: Vec<(Vec<u32>, Vec<u32>)>,
}

/// Passes 2 and 3 over one group (`b`, `c`: its calls on each side): its anchors, then the
/// gaps between them. `scratch` holds 0 for every API id (as many as there are API names)
/// and is left so.
fn align_group(
    b: &[u32],
    c: &[u32],
    bv: &SideView,
    cv: &SideView,
    scratch: &mut [u32],
) -> GroupAlignment {
    let anchors = anchors::anchors(b, c, bv, cv, scratch);
    let mut pairs = Vec::with_capacity(c.len().min(b.len()));
    let mut gaps = Vec::new();
    let (mut pi, mut pj) = (0usize, 0usize);
    for &(i, j) in &anchors {
        let (i, j) = (i as usize, j as usize);
        gap::fill(&b[pi..i], &c[pj..j], bv, cv, &mut pairs, &mut gaps);
        pairs.push((b[i], c[j]));
        pi = i + 1;
        pj = j + 1;
    }
    gap::fill(&b[pi..], &c[pj..], bv, cv, &mut pairs, &mut gaps);
    GroupAlignment { pairs, gaps }
}

/// An op list as `usize` indices.
fn widen(ops: &[u32]) -> Vec<usize> {
    ops.iter().map(|&o| o as usize).collect()
}
