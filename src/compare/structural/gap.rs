//! Pass 3, the gaps: between two anchors of a group, the calls left are aligned by a
//! longest common subsequence over signatures. Quadratic, so apart from the linear
//! anchors and only ever run inside one gap of one module call; a gap too large for it is
//! paired greedily in order. What it leaves on both sides is a stretch for the regions.

use super::view::SideView;
use foldhash::{HashMap, HashMapExt};

/// Largest gap (calls × calls) aligned by the quadratic longest common subsequence.
const MAX_DP_CELLS: usize = 1 << 20;

/// Pairs of positions (into `b`, `c`) of a maximum-weight common subsequence of equal
/// signatures; a pair with the same match key weighs more, so ties go to the same call.
fn lcs(b: &[u32], c: &[u32], bv: &SideView, cv: &SideView) -> Vec<(usize, usize)> {
    let (n, m) = (b.len(), c.len());
    if n == 0 || m == 0 {
        return vec![];
    }
    let w = |i: usize, j: usize| -> u32 {
        let (x, y) = (b[i] as usize, c[j] as usize);
        if bv.sig[x] != cv.sig[y] {
            0
        } else if bv.match_key(x) == cv.match_key(y) {
            3
        } else {
            2
        }
    };
    if n.saturating_mul(m) > MAX_DP_CELLS {
        // Greedy in order: each comparison call takes the next bench call with its
        // signature. Linear; exact when the gap holds only insertions on one side.
        let mut next: HashMap<u64, std::collections::VecDeque<usize>> = HashMap::new();
        for (i, &op) in b.iter().enumerate() {
            next.entry(bv.sig[op as usize]).or_default().push_back(i);
        }
        let mut last = 0usize;
        let mut out = Vec::new();
        for (j, &op) in c.iter().enumerate() {
            if let Some(q) = next.get_mut(&cv.sig[op as usize]) {
                while q.front().is_some_and(|&i| i < last) {
                    q.pop_front();
                }
                if let Some(i) = q.pop_front() {
                    out.push((i, j));
                    last = i + 1;
                }
            }
        }
        return out;
    }
    let width = m + 1;
    let mut t = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            let diag = match w(i, j) {
                0 => 0,
                x => x + t[(i + 1) * width + j + 1],
            };
            t[i * width + j] = diag.max(t[(i + 1) * width + j]).max(t[i * width + j + 1]);
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < n && j < m {
        let here = t[i * width + j];
        let x = w(i, j);
        if x > 0 && here == x + t[(i + 1) * width + j + 1] {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if here == t[(i + 1) * width + j] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Aligns the gap `gb`, `gc` (calls left on each side between two anchors): its pairs go
/// to `pairs`, the stretches between them where calls are left (on both sides: a region;
/// on one: an insertion) to `gaps`.
pub(super) fn fill(
    gb: &[u32],
    gc: &[u32],
    bv: &SideView,
    cv: &SideView,
    pairs: &mut Vec<(u32, u32)>,
    gaps: &mut Vec<(Vec<u32>, Vec<u32>)>,
) {
    if gb.is_empty() && gc.is_empty() {
        return;
    }
    let (mut si, mut sj) = (0usize, 0usize);
    let inner = lcs(gb, gc, bv, cv);
    for &(i, j) in inner.iter().chain(std::iter::once(&(gb.len(), gc.len()))) {
        if si < i || sj < j {
            gaps.push((gb[si..i].to_vec(), gc[sj..j].to_vec()));
        }
        if i < gb.len() {
            pairs.push((gb[i], gc[j]));
        }
        si = i + 1;
        sj = j + 1;
    }
}
