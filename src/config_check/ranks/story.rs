//! What a folder comparison says first: the headline (which ranks differ, from what, in
//! what) and the rank × category matrix.

use super::super::{Category, Item, Status};
use super::inputs::Member;
use super::merge::Merge;
use super::peers::PeerFinding;
use super::{ranks_text, MatrixRow, SideSummary};
use std::collections::BTreeMap;

/// Headline lines at most (the rest are counted).
const MAX_LINES: usize = 10;
/// Items named per line at most.
const MAX_ITEMS: usize = 3;
/// Characters of a value shown.
const MAX_VALUE: usize = 40;

fn cut(v: Option<&str>) -> String {
    match v {
        None => "<unset>".into(),
        Some(s) if s.chars().count() > MAX_VALUE => {
            format!("{}…", s.chars().take(MAX_VALUE - 1).collect::<String>())
        }
        Some(s) => s.to_string(),
    }
}

fn rank_words(ranks: &[u64]) -> String {
    format!(
        "rank{} {}",
        if ranks.len() == 1 { "" } else { "s" },
        ranks_text(ranks)
    )
}

/// `env NCCL_ALGO = Ring (others: Tree)`.
fn peer_part(f: &PeerFinding) -> String {
    format!(
        "{} {} = {} (others: {})",
        f.category.name(),
        f.item,
        cut(f.value.as_deref()),
        cut(f.majority.as_deref())
    )
}

/// `env FOO <unset> vs 1`, or the detail for tensors (their values are digests).
fn pair_part(i: &Item) -> String {
    match (i.category, i.step) {
        (Category::Dataset | Category::Weights, Some(s)) => {
            format!("{} {} (step {s}): {}", i.category.name(), i.item, i.detail)
        }
        _ => format!(
            "{} {} {} vs {}",
            i.category.name(),
            i.item,
            cut(i.bench.as_deref()),
            cut(i.cmp.as_deref())
        ),
    }
}

fn join_parts(mut parts: Vec<String>) -> String {
    let more = parts.len().saturating_sub(MAX_ITEMS);
    parts.truncate(MAX_ITEMS);
    let mut s = parts.join("; ");
    if more > 0 {
        s.push_str(&format!("; and {more} more"));
    }
    s
}

/// The headline: the sides' gaps first, then every group of ranks that differs (from its
/// peers, or from the other side's same ranks), worst first.
pub(crate) fn headline(
    b: &SideSummary,
    c: &SideSummary,
    common: &[u64],
    items: &[Item],
    findings: &[PeerFinding],
) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for (side, s) in [("bench", b), ("cmp", c)] {
        if !s.missing.is_empty() {
            lines.push(format!(
                "{side}: {} missing ({} packs of world size {}): not compared",
                rank_words(&s.missing),
                s.packs,
                s.world_size
                    .map_or("unknown".to_string(), |w| w.to_string())
            ));
        }
    }
    if b.ranks != c.ranks {
        lines.push(format!(
            "bench has ranks {} ({} packs), cmp has ranks {} ({} packs): ranks {} compared",
            b.ranks,
            b.packs,
            c.ranks,
            c.packs,
            ranks_text(common)
        ));
    }
    // (worst status, peers before pairs, order) → line
    let mut stories: Vec<(Status, u8, usize, String)> = vec![];
    let mut groups: BTreeMap<(&str, Vec<u64>), Vec<&PeerFinding>> = BTreeMap::new();
    for f in findings.iter().filter(|f| f.status >= Status::Warning) {
        groups.entry((f.side, f.ranks.clone())).or_default().push(f);
    }
    for ((side, ranks), fs) in groups {
        let worst = fs.iter().map(|f| f.status).max().unwrap_or(Status::Warning);
        let first = fs[0];
        let who = rank_words(&ranks);
        let line = if first.strict {
            let others = first.of.saturating_sub(ranks.len());
            format!(
                "{who} of {side} differ{} from the other {others} rank{}: {}",
                if ranks.len() == 1 { "s" } else { "" },
                if others == 1 { "" } else { "s" },
                join_parts(fs.iter().map(|f| peer_part(f)).collect())
            )
        } else {
            format!(
                "{who} of {side} disagree with the rest of {side} (no majority): {}",
                join_parts(fs.iter().map(|f| peer_part(f)).collect())
            )
        };
        stories.push((
            worst,
            if side == "cmp" { 0 } else { 1 },
            stories.len(),
            line,
        ));
    }
    let mut by_ranks: BTreeMap<Vec<u64>, Vec<&Item>> = BTreeMap::new();
    for i in items.iter().filter(|i| i.status >= Status::Warning) {
        let rs = i.ranks.clone().unwrap_or_default();
        by_ranks.entry(rs).or_default().push(i);
    }
    for (ranks, mut its) in by_ranks {
        its.sort_by_key(|i| std::cmp::Reverse(i.status));
        let worst = its[0].status;
        let who = if ranks.len() == common.len() && common.len() > 1 {
            format!("all {} ranks", ranks.len())
        } else {
            rank_words(&ranks)
        };
        let line = format!(
            "{who}, bench vs cmp: {}",
            join_parts(its.iter().map(|i| pair_part(i)).collect())
        );
        stories.push((worst, 2, stories.len(), line));
    }
    stories.sort_by(|x, y| {
        (std::cmp::Reverse(x.0), x.1, x.2).cmp(&(std::cmp::Reverse(y.0), y.1, y.2))
    });
    let n = stories.len();
    lines.extend(stories.into_iter().map(|s| s.3));
    if n == 0 {
        lines.push(format!(
            "{} rank{} compared: no difference between the jobs, nor between the ranks of a job",
            common.len(),
            if common.len() == 1 { "" } else { "s" }
        ));
    }
    if lines.len() > MAX_LINES {
        let more = lines.len() - (MAX_LINES - 1);
        lines.truncate(MAX_LINES - 1);
        lines.push(format!("… and {more} more (see config_check.json: ranks)"));
    }
    lines
}

fn rank_of_verdict(v: &str) -> u8 {
    match v {
        "error" => 4,
        "warning" => 3,
        "pass" => 2,
        "skipped" => 1,
        _ => 0,
    }
}

/// One row per rank: the pair's verdict per category, raised by the rank's differences
/// from its peers.
pub(crate) fn matrix(
    merge: &Merge,
    by_rank: &BTreeMap<u64, (Option<&Member>, Option<&Member>)>,
    findings: &[PeerFinding],
) -> Vec<MatrixRow> {
    let mut peer: BTreeMap<u64, Vec<(&'static str, Category, Status)>> = BTreeMap::new();
    for f in findings {
        for r in &f.ranks {
            peer.entry(*r)
                .or_default()
                .push((f.side, f.category, f.status));
        }
    }
    let mut out = vec![];
    for (rank, (b, c)) in by_rank {
        let pair = merge.cells.get(rank);
        let mut cells = BTreeMap::new();
        let mut marks: Vec<String> = vec![];
        for (k, cat) in Category::ALL.iter().enumerate() {
            let mut v = pair
                .and_then(|p| p.get(k).cloned())
                .unwrap_or_else(|| "-".into());
            for (side, pc, st) in peer.get(rank).map(|v| v.as_slice()).unwrap_or(&[]) {
                if pc != cat {
                    continue;
                }
                let mark = format!("{side}: {}", cat.name());
                if !marks.contains(&mark) {
                    marks.push(mark);
                }
                let w = match st {
                    Status::Error => "error",
                    Status::Warning => "warning",
                    _ => "pass",
                };
                if rank_of_verdict(w) > rank_of_verdict(&v) {
                    v = w.into();
                }
            }
            cells.insert(cat.name(), v);
        }
        out.push(MatrixRow {
            rank: *rank,
            bench: b.is_some(),
            cmp: c.is_some(),
            cells,
            peers: marks,
        });
    }
    out
}
