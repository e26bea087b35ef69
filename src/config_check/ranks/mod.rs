//! `probe config-check BENCH CMP` where a side is a folder of per-rank packs (or a glob):
//! bench rank i against cmp rank i, and within each side every rank against its peers
//! (docs/config-check.md, "Folders of packs").
//!
//! Data flow: [`inputs::read_side`] finds each side's packs and their ranks and checks they
//! make one job → the ranks are read a chunk at a time (in parallel within a chunk), each
//! pair compared by [`super::check::compare`] and merged ([`merge`]: one item per distinct
//! difference, with its ranks), each pack reduced to its peer view ([`peers`]) → the peers'
//! findings, the categories, the matrix and the headline ([`story`]). Memory is the merged
//! items, the peers' value groups (rank ids) and one chunk of packs; time is linear in ranks.

pub mod inputs;
mod merge;
pub mod peers;
pub(crate) mod render;
mod story;

use super::{pack, CategorySummary, CheckOptions, CheckReport, Counts};
use crate::error::{ProbeError, Result};
use crate::gate::EXIT_INCOMPLETE;
use crate::progress::{Count, Progress};
use crate::vocab::Verdict;
use inputs::{ranges, Member, Side};
use peers::{PeerFinding, PeerView, Peers};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) use inputs::is_set;

/// Ranks read at once (in parallel): bounds the packs held in memory.
const CHUNK: usize = 64;

/// One side as the report describes it.
#[derive(Debug, Clone, Serialize)]
pub struct SideSummary {
    /// The folder, glob or pack as given.
    pub path: String,
    /// Packs read.
    pub packs: usize,
    /// Their ranks, as ranges (`0-7`).
    pub ranks: String,
    /// The job's number of ranks, where the packs say.
    pub world_size: Option<u64>,
    /// What names the job (`TORCHELASTIC_RUN_ID=…`), where the packs say.
    pub job: Option<String>,
    /// Ranks below the world size without a pack: not compared (exit 4 when nothing else
    /// fails).
    pub missing: Vec<u64>,
    /// Files of the folder that are not packs (`*.zip`), not read.
    pub not_packs: Vec<String>,
}

impl SideSummary {
    fn of(s: &Side) -> SideSummary {
        let ranks: Vec<u64> = s.members.iter().map(|m| m.rank).collect();
        SideSummary {
            path: s.arg.display().to_string(),
            packs: s.members.len(),
            ranks: ranges(&ranks),
            world_size: s.world_size,
            job: s.job.clone(),
            missing: s.missing.clone(),
            not_packs: s.not_packs.clone(),
        }
    }
}

/// One rank's row of the rank × category matrix.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixRow {
    /// The rank.
    pub rank: u64,
    /// Whether bench has a pack of it.
    pub bench: bool,
    /// Whether cmp has a pack of it.
    pub cmp: bool,
    /// Category → the worst of its pair's verdict and its differences from its peers:
    /// `pass`, `warning`, `error`, `skipped` (a side lacks the category), or `-` (a side lacks
    /// the rank: peers only).
    pub cells: BTreeMap<&'static str, String>,
    /// `cmp: env` for each category where the rank differs from its side's peers.
    pub peers: Vec<String>,
}

/// What a comparison of folders adds to the report (`config_check.json`'s `ranks`).
#[derive(Debug, Clone, Serialize)]
pub struct RanksReport {
    /// The bench job.
    pub bench: SideSummary,
    /// The cmp job.
    pub cmp: SideSummary,
    /// Ranks on both sides, compared pair by pair.
    pub compared: String,
    /// The first-order story, most important first: which ranks differ, from what, in what.
    pub headline: Vec<String>,
    /// Each side's ranks that differ from their peers, per item.
    pub consistency: Vec<PeerFinding>,
    /// One row per rank (of either side).
    pub matrix: Vec<MatrixRow>,
}

/// What one rank gives: its pair's report, its packs' peer views.
type RankOut = (u64, Option<CheckReport>, Option<PeerView>, Option<PeerView>);

fn read_rank(
    rank: u64,
    b: Option<&Member>,
    c: Option<&Member>,
    opts: &CheckOptions,
) -> Result<RankOut> {
    let bp = b.map(|m| pack::load(&m.path)).transpose()?;
    let cp = c.map(|m| pack::load(&m.path)).transpose()?;
    let pair = match (&bp, &cp) {
        (Some(x), Some(y)) => Some(super::check::compare(x, y, opts)),
        _ => None,
    };
    let bv = bp.as_ref().map(|p| peers::view(p, &opts.rules));
    let cv = cp.as_ref().map(|p| peers::view(p, &opts.rules));
    Ok((rank, pair, bv, cv))
}

/// Compares two sides of which at least one is a folder or glob of packs.
pub fn run(
    bench: &Path,
    cmp: &Path,
    opts: &CheckOptions,
    progress: &Progress,
) -> Result<CheckReport> {
    let b = inputs::read_side(bench)?;
    let c = inputs::read_side(cmp)?;
    let mut by_rank: BTreeMap<u64, (Option<&Member>, Option<&Member>)> = BTreeMap::new();
    for m in &b.members {
        by_rank.entry(m.rank).or_default().0 = Some(m);
    }
    for m in &c.members {
        by_rank.entry(m.rank).or_default().1 = Some(m);
    }
    let common: Vec<u64> = by_rank
        .iter()
        .filter(|(_, (x, y))| x.is_some() && y.is_some())
        .map(|(r, _)| *r)
        .collect();
    if common.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "no rank in both: bench {} has ranks {}, cmp {} has ranks {}",
            bench.display(),
            SideSummary::of(&b).ranks,
            cmp.display(),
            SideSummary::of(&c).ranks
        )));
    }
    let stage = progress.stage("config-check ranks", by_rank.len() as u64, Count::Items);
    let mut merge = merge::Merge::default();
    let (mut pb, mut pc) = (Peers::new("bench"), Peers::new("cmp"));
    let list: Vec<(u64, Option<&Member>, Option<&Member>)> =
        by_rank.iter().map(|(r, (x, y))| (*r, *x, *y)).collect();
    for chunk in list.chunks(CHUNK) {
        use rayon::prelude::*;
        let outs: Vec<RankOut> = chunk
            .par_iter()
            .map(|(r, x, y)| read_rank(*r, *x, *y, opts))
            .collect::<Result<Vec<_>>>()?;
        for (rank, pair, bv, cv) in outs {
            if let Some(p) = pair {
                merge.add(rank, p);
            }
            if let Some(v) = bv {
                pb.add(rank, v);
            }
            if let Some(v) = cv {
                pc.add(rank, v);
            }
        }
        stage.inc(chunk.len() as u64);
    }
    let (fb, vb) = pb.findings(&opts.rules);
    let (fc, vc) = pc.findings(&opts.rules);
    let mut findings = fc;
    findings.extend(fb);
    let (items, item_counts) = merge.items();
    let categories = categories(&merge, item_counts, &findings, [&vb, &vc], opts);
    let mut counts = Counts::default();
    for c in &categories {
        counts.pass += c.counts.pass;
        counts.expected += c.counts.expected;
        counts.ignored += c.counts.ignored;
        counts.warning += c.counts.warning;
        counts.error += c.counts.error;
    }
    let verdict = worst(&counts);
    let mut exit_code = opts.fail_on.exit_code(verdict);
    if exit_code == 0 && (!b.missing.is_empty() || !c.missing.is_empty()) {
        exit_code = EXIT_INCOMPLETE;
    }
    let (mut bi, mut ci, cross) = merge
        .first
        .clone()
        .ok_or_else(|| ProbeError::NothingComparable("no rank pair could be compared".into()))?;
    bi.path = b.arg.display().to_string();
    ci.path = c.arg.display().to_string();
    let (bs, cs) = (SideSummary::of(&b), SideSummary::of(&c));
    let matrix = story::matrix(&merge, &by_rank, &findings);
    let headline = story::headline(&bs, &cs, &common, &items, &findings);
    Ok(CheckReport {
        schema: super::SCHEMA,
        probe_version: env!("CARGO_PKG_VERSION"),
        bench: bi,
        cmp: ci,
        cross_platform: cross,
        fail_on: opts.fail_on,
        verdict: verdict.name().into(),
        exit_code,
        counts,
        categories,
        items,
        outputs: BTreeMap::new(),
        ranks: Some(RanksReport {
            bench: bs,
            cmp: cs,
            compared: ranges(&common),
            headline,
            consistency: findings,
            matrix,
        }),
    })
}

fn worst(c: &Counts) -> Verdict {
    if c.error > 0 {
        Verdict::Error
    } else if c.warning > 0 {
        Verdict::Warning
    } else {
        Verdict::Pass
    }
}

/// `(ranks 0-7)`, or `(all ranks)` when a note holds for every compared rank.
fn where_(ranks: &[u64], all: usize) -> String {
    if ranks.len() == all {
        "(all ranks)".into()
    } else {
        format!(
            "(rank{} {})",
            if ranks.len() == 1 { "" } else { "s" },
            ranks_text(ranks)
        )
    }
}

/// Ranges of ranks, cut after 200 characters.
pub(crate) fn ranks_text(ranks: &[u64]) -> String {
    let r = ranges(ranks);
    if r.len() > 200 {
        let cut: String = r.chars().take(199).collect();
        format!("{cut}…")
    } else {
        r
    }
}

/// The categories over every pair and both sides' peers: counts of the merged items and the
/// peer findings, notes with their ranks.
fn categories(
    merge: &merge::Merge,
    item_counts: BTreeMap<super::Category, Counts>,
    findings: &[PeerFinding],
    varies: [&BTreeMap<super::Category, Vec<String>>; 2],
    opts: &CheckOptions,
) -> Vec<CategorySummary> {
    let pairs = merge.cells.len();
    let mut out = vec![];
    for cat in super::Category::ALL {
        let mut counts = item_counts.get(&cat).cloned().unwrap_or_default();
        let mut notes = vec![];
        let part = merge.parts.get(&cat);
        let compared = part.map_or(0, |p| p.compared.len());
        if let Some(p) = part {
            if !p.skipped.is_empty() && !p.compared.is_empty() {
                notes.push(format!(
                    "skipped {}: a side lacks it",
                    where_(&p.skipped, pairs)
                ));
            }
            for (n, rs) in &p.notes {
                notes.push(format!("{n} {}", where_(rs, pairs)));
            }
        }
        let mine: Vec<&PeerFinding> = findings.iter().filter(|f| f.category == cat).collect();
        for f in &mine {
            counts.add(f.status);
        }
        for side in ["cmp", "bench"] {
            let of_side: Vec<&&PeerFinding> = mine.iter().filter(|f| f.side == side).collect();
            if !of_side.is_empty() {
                let mut rs: Vec<u64> = of_side
                    .iter()
                    .flat_map(|f| f.ranks.iter().copied())
                    .collect();
                rs.sort_unstable();
                rs.dedup();
                notes.push(format!(
                    "{side}: {} differ{} from {} peers in {} item{} (see ranks.consistency)",
                    render::of_ranks(&rs),
                    if rs.len() == 1 { "s" } else { "" },
                    if rs.len() == 1 { "its" } else { "their" },
                    of_side.len(),
                    if of_side.len() == 1 { "" } else { "s" }
                ));
            }
        }
        for (side, v) in ["bench", "cmp"].iter().zip(varies) {
            if let Some(list) = v.get(&cat) {
                notes.push(format!(
                    "{side}: {} item{} vary by rank with no majority (e.g. {}): compared bench rank i with cmp rank i only",
                    list.len(),
                    if list.len() == 1 { "" } else { "s" },
                    list[0]
                ));
            }
        }
        if cat == super::Category::Dataset && compared > 0 {
            notes.push("per rank by design (each rank reads its shard): compared bench rank i with cmp rank i, not across peers".into());
        }
        let verdict = (compared > 0 || !mine.is_empty()).then(|| worst(&counts));
        out.push(CategorySummary {
            name: cat,
            verdict: verdict.map_or("skipped", Verdict::name).to_string(),
            pass_check: verdict.map(|v| !opts.fail_on.fails(v)),
            counts,
            notes,
        });
    }
    out
}
