//! Plan: find both sides' step/rank folders and pair them into units of work.
//!
//! A unit is one step/rank of the benchmark paired with one of the comparison run. Units
//! are independent: each is read, aligned, measured, judged and analysed on its own.

use super::{Side, Sides};
use crate::dump::{self, DumpSet, RankLoc, Selection};
use crate::error::Result;
use std::collections::HashMap;
use std::path::Path;

/// One step/rank pair to compare.
#[derive(Debug, Clone)]
pub struct Unit {
    /// Step label, as on the comparison side.
    pub step: String,
    /// Rank label, as on the comparison side.
    pub rank: String,
    /// Where each side's op log is.
    pub locs: Sides<RankLoc>,
    /// Whether each side's manifest says compiled code ran while it was captured.
    pub compiled: Sides<bool>,
}

/// The units of a compare, in step/rank order, with warnings about folders left unpaired.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Units to compare.
    pub units: Vec<Unit>,
    /// Step/rank folders present on one side only, and pairings by position.
    pub warnings: Vec<String>,
    /// The step/rank folders present on one side only, with that side.
    pub unpaired: Vec<(Side, RankLoc)>,
    /// The job's number of ranks as the manifests say (the larger of the two), if they do.
    pub world_size: Option<usize>,
}

/// Discovers both dumps and pairs their ranks.
/// Only the folders `selection` keeps take part (on both sides).
pub(crate) fn plan(bench: &Path, cmp: &Path, selection: &Selection) -> Result<Plan> {
    let b = selection.apply(dump::discover(bench)?)?;
    let c = selection.apply(dump::discover(cmp)?)?;
    let (pairs, mut warnings, unpaired) = pair_ranks(&b, &c);
    warnings.extend(other_world(&b, &c));
    for (set, side) in [(&b, "benchmark"), (&c, "comparison")] {
        if set.compiled {
            warnings.push(format!(
                "the {side} run ran compiled code that the agent could not capture \
                 (torch.compile graphs compiled before the agent existed or with symbolic \
                 shapes, TorchScript): the operators inside it are not in its dump, so the \
                 other run's calls there have no counterpart; create the Debugger before the \
                 model first runs compiled, or capture it without compiling, to compare them"
            ));
        }
    }
    let units = pairs
        .into_iter()
        .map(|(bl, cl)| Unit {
            step: cl.step.clone(),
            rank: cl.rank.clone(),
            locs: Sides::new(bl, cl),
            compiled: Sides::new(b.compiled, c.compiled),
        })
        .collect();
    Ok(Plan {
        units,
        warnings,
        unpaired,
        world_size: b.world_size.max(c.world_size),
    })
}

/// When the runs ran on other numbers of ranks, the warning that says a rank of each holds
/// another share of the job's data: in a data-parallel job of another world size rank N
/// reads other samples, so its tensors differ with nothing wrong (GPU and NPU clusters are
/// rarely the same size). The manifests' world sizes when both say one; else the highest
/// `rank<N>` folder of each at the first step both hold, which a job that dumped some of
/// its ranks, or lost a rank's folder, can mislead (said as such).
fn other_world(b: &DumpSet, c: &DumpSet) -> Option<String> {
    const WHY: &str = "in a data-parallel job of another world size a rank reads another \
                       share of the data, so its tensors differ with nothing wrong; compare \
                       runs of the same world size";
    if let (Some(wb), Some(wc)) = (b.world_size, c.world_size) {
        return (wb != wc).then(|| {
            format!(
                "the benchmark ran on {wb} rank{} and the comparison run on {wc}: {WHY}",
                if wb == 1 { "" } else { "s" }
            )
        });
    }
    let world = |set: &DumpSet, step: &str| {
        set.ranks
            .iter()
            .filter(|l| l.step == step)
            .filter_map(|l| l.rank.strip_prefix("rank")?.parse::<usize>().ok())
            .max()
            .map(|n| n + 1)
    };
    b.ranks.iter().find_map(|l| {
        let (wb, wc) = (world(b, &l.step)?, world(c, &l.step)?);
        (wb != wc).then(|| {
            format!(
                "{}: the benchmark has ranks 0-{} and the comparison run 0-{} (by their \
                 folders: a dump of some ranks only reads the same): {WHY}",
                l.step,
                wb - 1,
                wc - 1
            )
        })
    })
}

/// Step/rank folders of one side that no folder of the other pairs with.
pub(crate) type Unpaired = Vec<(Side, RankLoc)>;

/// Pairs ranks of the two sides: by (step, rank) name, or the only rank of each side.
///
/// msprobe names a folder `proc<PID>` when it knows no rank, and the PID differs between
/// runs: within a step, folders left unpaired by name are paired by sorted position when
/// either side uses `proc` names (msprobe's own rule).
pub(crate) fn pair_ranks(
    b: &DumpSet,
    c: &DumpSet,
) -> (Vec<(RankLoc, RankLoc)>, Vec<String>, Unpaired) {
    if b.ranks.len() == 1 && c.ranks.len() == 1 {
        let (bl, cl) = (&b.ranks[0], &c.ranks[0]);
        // Two `rank<N>` folders of different N hold different data (another batch, another
        // shard): every tensor may differ without anything being wrong. `proc<PID>` names
        // differ between runs anyway.
        let mut warnings = Vec::new();
        if bl.rank != cl.rank && bl.rank.starts_with("rank") && cl.rank.starts_with("rank") {
            warnings.push(format!(
                "comparing {} of the benchmark with {} of the comparison run: different ranks \
                 (their data and shards differ; compare the same rank of each run)",
                bl.rank, cl.rank
            ));
        }
        // (A step's weights have taken as many updates as its number.)
        if bl.step != cl.step {
            warnings.push(format!(
                "comparing {} of the benchmark with {} of the comparison run: different \
                 training steps (their weights have taken other numbers of updates, their \
                 batches differ; compare the same step of each run)",
                bl.step, cl.step
            ));
        }
        return (vec![(bl.clone(), cl.clone())], warnings, vec![]);
    }
    let key = |l: &RankLoc| (l.step.clone(), l.rank.clone());
    let cmap: HashMap<_, _> = c
        .ranks
        .iter()
        .enumerate()
        .map(|(i, l)| (key(l), i))
        .collect();
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut b_left: Vec<usize> = Vec::new();
    let mut c_used = vec![false; c.ranks.len()];
    for (i, l) in b.ranks.iter().enumerate() {
        match cmap.get(&key(l)) {
            Some(&j) => {
                pairs.push((i, j));
                c_used[j] = true;
            }
            None => b_left.push(i),
        }
    }
    let mut warnings = Vec::new();
    let is_proc = |l: &RankLoc| l.rank.starts_with("proc");
    let mut b_unpaired = Vec::new();
    let mut seen_steps: Vec<&str> = Vec::new();
    for &i in &b_left {
        let step = b.ranks[i].step.as_str();
        if seen_steps.contains(&step) {
            continue;
        }
        seen_steps.push(step);
        let bl: Vec<usize> = b_left
            .iter()
            .copied()
            .filter(|&k| b.ranks[k].step == step)
            .collect();
        let cl: Vec<usize> = (0..c.ranks.len())
            .filter(|&k| !c_used[k] && c.ranks[k].step == step)
            .collect();
        let by_position =
            bl.iter().any(|&k| is_proc(&b.ranks[k])) || cl.iter().any(|&k| is_proc(&c.ranks[k]));
        if !by_position {
            b_unpaired.extend(bl);
            continue;
        }
        if bl.len() != cl.len() {
            warnings.push(format!(
                "{step}: {} unnamed rank folder(s) in the benchmark, {} in the comparison; paired by position",
                bl.len(),
                cl.len()
            ));
        }
        for (k, &i) in bl.iter().enumerate() {
            match cl.get(k) {
                Some(&j) => {
                    pairs.push((i, j));
                    c_used[j] = true;
                }
                None => b_unpaired.push(i),
            }
        }
    }
    let mut unpaired = Vec::new();
    b_unpaired.sort_unstable();
    for i in b_unpaired {
        let l = &b.ranks[i];
        warnings.push(format!(
            "{}/{} is in the benchmark only; not compared",
            l.step, l.rank
        ));
        unpaired.push((Side::Bench, l.clone()));
    }
    for (j, l) in c.ranks.iter().enumerate() {
        if !c_used[j] {
            warnings.push(format!(
                "{}/{} is in the comparison only; not compared",
                l.step, l.rank
            ));
            unpaired.push((Side::Cmp, l.clone()));
        }
    }
    pairs.sort_unstable();
    let pairs = pairs
        .into_iter()
        .map(|(i, j)| (b.ranks[i].clone(), c.ranks[j].clone()))
        .collect();
    (pairs, warnings, unpaired)
}
