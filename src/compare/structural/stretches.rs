//! Which stretches become regions, before any is compared: the gaps of modules called
//! inside a gap's module join it (nesting), and whether paired calls enclose a stretch on
//! both sides (`Bounds`, which allows the module fallback). Pure index arithmetic over the
//! gaps and the op pairs, apart from the comparison of a region itself (`regions`).

use super::view::GroupKey;
use super::widen;
use crate::compare::Sides;

/// The stretches to make regions of: each gap with calls left on both sides takes in the
/// gaps of the modules called inside its module, on each side between the paired calls
/// around it (`paired`: the paired ops of each side, sorted). The activation module an
/// MoE's experts call once per expert on one side and once on the other: its calls belong
/// to the experts' region, and alone they pair nothing. Outermost first; what a gap takes
/// in is not a stretch of its own. In the gaps' order, op lists widened and in execution
/// order.
pub(super) fn nest<'g>(
    gaps: &'g [(GroupKey, Vec<u32>, Vec<u32>)],
    paired: &Sides<Vec<u32>>,
) -> Vec<(&'g GroupKey, Vec<usize>, Vec<usize>)> {
    // The open interval between the paired ops before and after a stretch.
    let span = |ops: &[u32], paired: &[u32]| {
        let (lo, hi) = (*ops.iter().min()?, *ops.iter().max()?);
        let before = paired.partition_point(|&p| p < lo).checked_sub(1);
        let after = paired.get(paired.partition_point(|&p| p <= hi)).copied();
        Some((before.map(|i| paired[i]), after))
    };
    let within = |ops: &[u32], s: Option<(Option<u32>, Option<u32>)>| match s {
        Some((lo, hi)) => ops
            .iter()
            .all(|&o| lo.is_none_or(|lo| lo < o) && hi.is_none_or(|hi| o < hi)),
        None => ops.is_empty(),
    };
    // By key: the modules called inside `m` are the keys from "m." up to "m/".
    let mut by_key: Vec<usize> = (0..gaps.len()).collect();
    by_key.sort_by(|&x, &y| gaps[x].0.cmp(&gaps[y].0));
    let mut outermost = by_key.clone();
    outermost.sort_by_key(|&i| gaps[i].0 .1.matches('.').count());
    let mut into: Vec<Option<usize>> = vec![None; gaps.len()];
    for &i in &outermost {
        let ((phase, module), b, c) = &gaps[i];
        if into[i].is_some() || b.is_empty() || c.is_empty() || module.is_empty() {
            continue;
        }
        let (sb, sc) = (span(b, &paired.bench), span(c, &paired.cmp));
        let (from, to) = (
            (*phase, format!("{module}.")),
            (*phase, format!("{module}/")),
        );
        let lo = by_key.partition_point(|&x| gaps[x].0 < from);
        let hi = by_key.partition_point(|&x| gaps[x].0 < to);
        for &j in &by_key[lo..hi] {
            if into[j].is_none() && within(&gaps[j].1, sb) && within(&gaps[j].2, sc) {
                into[j] = Some(i);
            }
        }
    }
    let mut out: Vec<(&GroupKey, Vec<usize>, Vec<usize>)> = Vec::new();
    let mut at: Vec<usize> = vec![usize::MAX; gaps.len()];
    for (i, (key, b, c)) in gaps.iter().enumerate() {
        if into[i].is_none() {
            at[i] = out.len();
            out.push((key, widen(b), widen(c)));
        }
    }
    let mut grown = vec![false; out.len()];
    for (j, parent) in into.iter().enumerate() {
        if let Some(p) = *parent {
            let k = at[p];
            out[k].1.extend(gaps[j].1.iter().map(|&o| o as usize));
            out[k].2.extend(gaps[j].2.iter().map(|&o| o as usize));
            grown[k] = true;
        }
    }
    for (k, (_, b, c)) in out.iter_mut().enumerate() {
        if grown[k] {
            b.sort_unstable();
            c.sort_unstable();
        }
    }
    out
}

/// Whether a stretch lies between two paired ops (one before it, one after it, on both
/// sides), from the op pairs sorted by comparison index.
pub(super) struct Bounds {
    /// (cmp, bench) pairs sorted by cmp.
    pairs: Vec<(usize, usize)>,
    /// Smallest bench index among pairs[..=i].
    prefix_min: Vec<usize>,
    /// Largest bench index among pairs[i..].
    suffix_max: Vec<usize>,
}

impl Bounds {
    pub(super) fn new(op_pair: &[Option<u32>]) -> Bounds {
        let pairs: Vec<(usize, usize)> = op_pair
            .iter()
            .enumerate()
            .filter_map(|(c, b)| Some((c, (*b)? as usize)))
            .collect();
        let mut prefix_min = Vec::with_capacity(pairs.len());
        let mut m = usize::MAX;
        for &(_, b) in &pairs {
            m = m.min(b);
            prefix_min.push(m);
        }
        let mut suffix_max = vec![0; pairs.len()];
        let mut x = 0;
        for (i, &(_, b)) in pairs.iter().enumerate().rev() {
            x = x.max(b);
            suffix_max[i] = x;
        }
        Bounds {
            pairs,
            prefix_min,
            suffix_max,
        }
    }

    pub(super) fn encloses(&self, b: &[usize], c: &[usize]) -> bool {
        let (Some(bmin), Some(bmax)) = (b.iter().min(), b.iter().max()) else {
            return false;
        };
        let (Some(cmin), Some(cmax)) = (c.iter().min(), c.iter().max()) else {
            return false;
        };
        let lo = self.pairs.partition_point(|&(x, _)| x < *cmin);
        let hi = self.pairs.partition_point(|&(x, _)| x <= *cmax);
        let before = lo > 0 && self.prefix_min[lo - 1] < *bmin;
        let after = hi < self.pairs.len() && self.suffix_max[hi] > *bmax;
        before && after
    }
}
