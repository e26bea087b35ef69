//! Pass 2, the anchors of a group: the calls of the two sides that pair without a search.
//! A call's signature (API and shapes) says which calls may pair; the n-th call of an API
//! with the same signature on both sides, and the n-th call of a signature, are
//! candidates; the longest chain of candidates in the same order on both sides (a longest
//! increasing subsequence, `O(n log n)`) is kept. Separate from the gaps (`gap.rs`): this
//! pass is linear and, on identical code paths, the only one that runs; the quadratic one
//! only ever sees what it leaves between two anchors.

use super::view::SideView;

use foldhash::{HashMap, HashMapExt};

/// The anchors of one group (`b`, `c`: its calls on each side): pairs of positions into
/// `b` and `c`, increasing on both sides. `scratch` holds 0 for every API id (as many as
/// there are API names) and is left so.
pub(super) fn anchors(
    b: &[u32],
    c: &[u32],
    bv: &SideView,
    cv: &SideView,
    scratch: &mut [u32],
) -> Vec<(u32, u32)> {
    let cand = by_api(b, c, bv, cv, scratch);
    let cand = by_signature(cand, b, c, bv, cv);
    let bpos: Vec<u32> = cand.iter().map(|&(i, _)| i).collect();
    lis(&bpos).into_iter().map(|k| cand[k as usize]).collect()
}

/// The candidates by API: the n-th call of an API in this group on both sides, same
/// signature; (position in `b`, position in `c`), `c` ascending. The group's APIs are
/// numbered densely (`scratch[api]` is the number + 1 while the group is aligned), the
/// benchmark's calls are then listed per API in call order (one flat table), so the n-th
/// call of an API is an index, not a lookup of (name, n) in a map of every call.
fn by_api(
    b: &[u32],
    c: &[u32],
    bv: &SideView,
    cv: &SideView,
    scratch: &mut [u32],
) -> Vec<(u32, u32)> {
    let mut seen_apis: Vec<u32> = Vec::new();
    let mut id_of = |api: u32| -> u32 {
        let e = &mut scratch[api as usize];
        if *e == 0 {
            seen_apis.push(api);
            *e = seen_apis.len() as u32;
        }
        *e - 1
    };
    let bid: Vec<u32> = b.iter().map(|&op| id_of(bv.api[op as usize])).collect();
    let cid: Vec<u32> = c.iter().map(|&op| id_of(cv.api[op as usize])).collect();
    let n_apis = seen_apis.len();
    for &api in &seen_apis {
        scratch[api as usize] = 0;
    }
    drop(seen_apis);
    // start[a]..start[a + 1]: where the positions in `b` of API a's calls are in `calls`.
    let mut start = vec![0u32; n_apis + 1];
    for &a in &bid {
        start[a as usize + 1] += 1;
    }
    for a in 0..n_apis {
        start[a + 1] += start[a];
    }
    let mut calls = vec![0u32; b.len()];
    let mut fill = start.clone();
    for (i, &a) in bid.iter().enumerate() {
        calls[fill[a as usize] as usize] = i as u32;
        fill[a as usize] += 1;
    }
    drop(bid);
    // Reused: how many calls of each API the comparison side has made so far.
    let seen = &mut fill;
    seen.fill(0);
    let mut cand: Vec<(u32, u32)> = Vec::new(); // (b pos, c pos), c ascending
    for (j, (&op, &a)) in c.iter().zip(&cid).enumerate() {
        let a = a as usize;
        let at = start[a] + seen[a];
        seen[a] += 1;
        if at < start[a + 1] {
            let i = calls[at as usize];
            if bv.sig[b[i as usize] as usize] == cv.sig[op as usize] {
                cand.push((i, j as u32));
            }
        }
    }
    cand
}

/// Adds to the candidates by API (`cand`) the n-th call of a signature on both sides: one
/// call more of an API on one side (a cast, the compiled model whose calls a dump lacks)
/// shifts the count of that API's later calls, and a shifted pair of two calls with the
/// same shapes (the updates of two parameters of one size) would be a candidate. Counted
/// by signature those calls keep their pairs; the longest chain then takes the candidates
/// that agree with the surrounding calls. (Counted by API, a call whose shapes differ on
/// one side keeps the later calls of its signature paired: both counts are needed.)
fn by_signature(
    cand: Vec<(u32, u32)>,
    b: &[u32],
    c: &[u32],
    bv: &SideView,
    cv: &SideView,
) -> Vec<(u32, u32)> {
    let mut by_sig: HashMap<u64, (Vec<u32>, usize)> = HashMap::new();
    for (i, &op) in b.iter().enumerate() {
        by_sig
            .entry(bv.sig[op as usize])
            .or_default()
            .0
            .push(i as u32);
    }
    let mut both: Vec<(u32, u32)> = Vec::with_capacity(cand.len() + c.len());
    let mut api_cand = cand.into_iter().peekable();
    for (j, &op) in c.iter().enumerate() {
        let j = j as u32;
        // (For one comparison call, its candidates by decreasing bench position: the
        // longest strictly increasing chain then takes at most one of them.)
        let by_api = api_cand.next_if(|&(_, cj)| cj == j);
        let by_count = by_sig.get_mut(&cv.sig[op as usize]).and_then(|(pos, n)| {
            let i = pos.get(*n).copied();
            *n += 1;
            i
        });
        match (by_api, by_count) {
            (Some(a), Some(i)) if a.0 != i => {
                both.push((a.0.max(i), j));
                both.push((a.0.min(i), j));
            }
            (Some(a), _) => both.push(a),
            (None, Some(i)) => both.push((i, j)),
            (None, None) => {}
        }
    }
    both
}

/// No index (u32 index lists).
const NO: u32 = u32::MAX;

/// Indices (into `seq`) of a longest strictly increasing subsequence.
fn lis(seq: &[u32]) -> Vec<u32> {
    let mut tails: Vec<u32> = Vec::new(); // index into seq of the tail of each length
    let mut prev: Vec<u32> = vec![NO; seq.len()];
    for (i, &v) in seq.iter().enumerate() {
        let pos = tails.partition_point(|&t| seq[t as usize] < v);
        prev[i] = pos.checked_sub(1).map_or(NO, |p| tails[p]);
        if pos == tails.len() {
            tails.push(i as u32);
        } else {
            tails[pos] = i as u32;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut cur = tails.last().copied().unwrap_or(NO);
    while cur != NO {
        out.push(cur);
        cur = prev[cur as usize];
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::lis;
    use crate::compare::align::{MatchedBy, Side, Why};
    use crate::compare::structural::fixtures::{align, pairs, unary, M, N};
    use crate::dump::OpRec;

    #[test]
    fn identical_runs_pair_everything_exactly() {
        let ops = || {
            vec![
                unary("Functional.relu.0.forward", "a", N),
                unary("Tensor.to.0.forward", "a", N),
                unary("Functional.relu.1.forward", "b", N),
            ]
        };
        let a = align(ops(), ops(), false);
        assert_eq!(a.matches.len(), 6);
        assert!(a.matches.iter().all(|m| m.by == MatchedBy::Exact));
        assert!(a.unmatched.is_empty());
    }

    #[test]
    fn an_inserted_call_shifts_nothing_else() {
        // The comparison run casts once more in module `a`: the later casts keep their
        // partners (other counters), the extra one is left over, module `b` is untouched.
        let b = vec![
            unary("Tensor.to.0.forward", "a", N),
            unary("Functional.relu.0.forward", "a", N),
            unary("Tensor.to.1.forward", "a", M),
            unary("Tensor.to.2.forward", "b", N),
        ];
        let c = vec![
            unary("Tensor.to.0.forward", "a", N),
            unary("Tensor.to.1.forward", "a", N),
            unary("Functional.relu.0.forward", "a", N),
            unary("Tensor.to.2.forward", "a", M),
            unary("Tensor.to.3.forward", "b", N),
        ];
        let a = align(b, c, false);
        let p = pairs(&a);
        assert!(p.contains(&(
            "Tensor.to.1.forward.output.0".into(),
            "Tensor.to.2.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Tensor.to.2.forward.output.0".into(),
            "Tensor.to.3.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Functional.relu.0.forward.input.0".into(),
            "Functional.relu.0.forward.input.0".into(),
            "exact"
        )));
        let left: Vec<&str> = a.unmatched.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.side == Side::Cmp && u.why == Why::Unmatched));
        // Which of the two identical leading casts is "extra" is a tie; one of them is.
        assert!(left
            .iter()
            .all(|n| n.starts_with("Tensor.to.0.") || n.starts_with("Tensor.to.1.")));
    }

    #[test]
    fn an_extra_call_of_other_shapes_does_not_shift_the_later_calls_of_its_api() {
        // The optimizer's per-parameter updates (`add_` of each parameter's shape, two
        // parameters of shape [8] in a row), after one more `add_` of another shape on the
        // bench (a counter the model bumps, which a compiled comparison run does not show):
        // counted by API, `add_.2` of both sides would be a candidate (both [8], but the
        // second and the first [8] parameter). Each update pairs with its own.
        const S: &[usize] = &[];
        let updates = |first: usize| -> Vec<OpRec> {
            [N, M, M, N, M]
                .iter()
                .enumerate()
                .map(|(k, &shape)| unary(&format!("Tensor.add_.{}.forward", first + k), "", shape))
                .collect()
        };
        let mut b = vec![unary("Tensor.add_.0.forward", "", S)];
        b.extend(updates(1));
        let c = updates(0);
        let a = align(b, c, false);
        let p = pairs(&a);
        for k in 0..5 {
            assert!(
                p.contains(&(
                    format!("Tensor.add_.{}.forward.output.0", k + 1),
                    format!("Tensor.add_.{k}.forward.output.0"),
                    "aligned"
                )),
                "update {k}: {p:?}"
            );
        }
        assert_eq!(a.matches.len(), 10, "{p:?}");
        let left: Vec<&str> = a.unmatched.iter().map(|u| u.name.as_str()).collect();
        assert!(
            left.len() == 2 && left.iter().all(|n| n.starts_with("Tensor.add_.0.")),
            "{left:?}"
        );
    }

    #[test]
    fn renumbered_calls_in_repeated_layers_pair_by_layer() {
        // Four identical layers; the comparison run calls linear twice in layers.1 (an
        // extra projection), so every later layer's counters are one higher.
        let layer = |i: usize, extra: bool, base: usize| -> Vec<OpRec> {
            let m = format!("layers.{i}");
            let mut v = vec![unary(&format!("Functional.linear.{base}.forward"), &m, N)];
            if extra {
                v.push(unary(
                    &format!("Functional.linear.{}.forward", base + 1),
                    &m,
                    M,
                ));
            }
            v.push(unary(&format!("Functional.gelu.{i}.forward"), &m, N));
            v
        };
        let b: Vec<OpRec> = (0..4).flat_map(|i| layer(i, false, i)).collect();
        let c: Vec<OpRec> = (0..4)
            .flat_map(|i| layer(i, i == 1, if i <= 1 { i } else { i + 1 }))
            .collect();
        let a = align(b, c, false);
        let p = pairs(&a);
        assert!(p.contains(&(
            "Functional.linear.3.forward.output.0".into(),
            "Functional.linear.4.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Functional.linear.1.forward.output.0".into(),
            "Functional.linear.1.forward.output.0".into(),
            "exact"
        )));
        assert_eq!(a.unmatched.len(), 2, "{:?}", a.unmatched);
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.name.starts_with("Functional.linear.2.")));
        assert_eq!(a.matches.len(), 16);
    }

    #[test]
    fn lis_is_longest_and_increasing() {
        let seq = [3, 1, 4, 1, 5, 9, 2, 6];
        let idx = lis(&seq);
        let vals: Vec<u32> = idx.iter().map(|&i| seq[i as usize]).collect();
        assert_eq!(vals.len(), 4);
        assert!(vals.windows(2).all(|w| w[0] < w[1]));
    }
}
