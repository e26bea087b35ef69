//! Layout evidence at the ops the findings name (docs/compare.md, "Layout evidence"): where
//! both dumps record how tensors lay in memory and an op a finding names holds tensors that
//! lay otherwise in the two runs (a non-contiguous view where the other run's is
//! contiguous, a storage shared on one side only), the finding says so beside the values
//! (`Finding::layout`, and its explanation): a kernel reading a view as if it were
//! contiguous leaves no other trace.

use super::context::Context;

/// Adds the layout differences of each finding's op to it. Runs after the rules that name
/// ops: it names none, it only adds evidence.
pub(super) fn rule(cx: &mut Context) {
    let unit = cx.unit;
    let seqs: Vec<u64> = cx.briefs.iter().map(|b| b.seq).collect();
    let mut said: Vec<(usize, Vec<String>)> = Vec::new();
    for found in cx.found_mut() {
        let f = &mut found.finding;
        // The op holding it: the last one starting at or before it (a group of several
        // calls starts at its first).
        let Some(k) = seqs.partition_point(|&s| s <= f.seq).checked_sub(1) else {
            continue;
        };
        let diffs = match said.iter().find(|(at, _)| *at == k) {
            Some((_, d)) => d.clone(),
            None => {
                let d = unit.layout_diffs(k);
                said.push((k, d.clone()));
                d
            }
        };
        if diffs.is_empty() {
            continue;
        }
        f.explanation = format!(
            "{}. Layout differs at this op: {}",
            f.explanation.trim_end_matches('.'),
            diffs.join("; ")
        );
        f.layout = diffs;
    }
}
