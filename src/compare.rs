//! The compare engine: pair ranks, match tensors by name, compute metrics in parallel and
//! judge every tensor.
//!
//! Rows come out in the comparison run's execution order; tensors present on one side only
//! are kept as [`Unmatched`] (never dropped, never a pass).

use crate::dtype::DType;
use crate::dump::{self, Data, Direction, DumpSet, RankDump, RankLoc, Role, Stats, TensorRec};
use crate::error::{ProbeError, Result};
use crate::metrics::{self, Metrics, StatDiff};
use crate::tensor::ShardCache;
use crate::tolerance::{self, Tolerances, Verdict};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How a row was compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompareKind {
    /// Full tensors: every metric.
    Tensor,
    /// Checksums, with statistics where present.
    Checksum,
    /// Recorded statistics only.
    Statistics,
    /// Nothing usable on one side (no data, no statistics).
    None,
}

impl CompareKind {
    pub fn name(self) -> &'static str {
        match self {
            CompareKind::Tensor => "tensor",
            CompareKind::Checksum => "checksum",
            CompareKind::Statistics => "statistics",
            CompareKind::None => "none",
        }
    }
}

/// One matched tensor.
#[derive(Debug, Clone)]
pub struct Row {
    pub pair: usize,
    /// Position of the op in the comparison run's execution order (within its pair).
    pub op_index: usize,
    pub seq: u64,
    pub op: String,
    pub direction: Direction,
    pub role: Role,
    pub name: String,
    pub dtype_b: String,
    pub dtype_c: String,
    pub shape_b: Vec<usize>,
    pub shape_c: Vec<usize>,
    pub stats_b: Option<Stats>,
    pub stats_c: Option<Stats>,
    pub kind: CompareKind,
    pub metrics: Option<Metrics>,
    pub checksum_equal: Option<bool>,
    pub verdict: Verdict,
    pub reason: String,
    /// The error tolerance applied (relative L2, or scaled statistics error).
    pub tol_error: f64,
    /// The judged error measure.
    pub err: f64,
    /// The same measure without the absolute floor (scale-free): what the localiser compares
    /// between an op's inputs and outputs, since an op may rescale its data.
    pub raw_err: f64,
    /// An input that no captured op produced (weight, data, random tensor), when known.
    pub external: bool,
    pub stack: Option<u64>,
    /// The least precise float dtype met so far in this pair's execution order (both sides).
    /// Tensors computed after a bf16 op carry bf16 rounding whatever their own dtype, so
    /// they are judged with that dtype's tolerance.
    pub precision: Option<DType>,
    data: Option<(Data, Data)>,
}

impl Row {
    /// Whether the comparison side holds NaN/Inf that the benchmark does not.
    pub fn new_nonfinite(&self) -> bool {
        if let Some(m) = &self.metrics {
            return m.nonfinite_c > 0 && m.nonfinite_mismatch > 0;
        }
        let nf = |s: &Option<Stats>| s.as_ref().and_then(|s| s.nonfinite()).unwrap_or(0);
        nf(&self.stats_c) > 0 && nf(&self.stats_b) == 0
    }

    /// Whether the comparison side holds any NaN/Inf.
    pub fn cmp_nonfinite(&self) -> bool {
        if let Some(m) = &self.metrics {
            return m.nonfinite_c > 0;
        }
        self.stats_c
            .as_ref()
            .and_then(|s| s.nonfinite())
            .unwrap_or(0)
            > 0
    }

    /// Differences of the recorded statistics (msprobe's statistics columns), when both sides
    /// have them. Derived on demand: they do not depend on the tolerance.
    pub fn stat_diff(&self) -> Option<StatDiff> {
        match (&self.stats_b, &self.stats_c) {
            (Some(b), Some(c)) => {
                Some(metrics::stat_diff(b, c, self.shape_c.iter().product(), 0.0))
            }
            _ => None,
        }
    }

    /// Bitwise (or statistically) identical on both sides.
    pub fn identical(&self) -> bool {
        self.raw_err == 0.0 && self.verdict == Verdict::Pass
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Bench,
    Cmp,
}

/// A tensor found on one side only.
#[derive(Debug, Clone)]
pub struct Unmatched {
    pub pair: usize,
    pub side: Side,
    pub seq: u64,
    pub op: String,
    pub name: String,
    pub role: Role,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// One compared (step, rank) pair.
#[derive(Debug, Clone)]
pub struct Pair {
    pub step: String,
    pub rank: String,
    pub bench_dir: PathBuf,
    pub cmp_dir: PathBuf,
    /// Stacks of the comparison side, by id.
    pub stacks: BTreeMap<u64, Vec<String>>,
    pub ops: usize,
}

#[derive(Debug, Default)]
pub struct CompareResult {
    pub pairs: Vec<Pair>,
    pub rows: Vec<Row>,
    pub unmatched: Vec<Unmatched>,
    pub warnings: Vec<String>,
}

/// Pairs ranks of the two sides: by (step, rank) name, or the only rank of each side.
///
/// msprobe names a folder `proc<PID>` when it knows no rank, and the PID differs between
/// runs: within a step, folders left unpaired by name are paired by sorted position when
/// either side uses `proc` names (msprobe's own rule).
pub fn pair_ranks(b: &DumpSet, c: &DumpSet) -> (Vec<(RankLoc, RankLoc)>, Vec<String>) {
    if b.ranks.len() == 1 && c.ranks.len() == 1 {
        return (vec![(b.ranks[0].clone(), c.ranks[0].clone())], vec![]);
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
    for i in b_unpaired {
        let l = &b.ranks[i];
        warnings.push(format!(
            "{}/{} is in the benchmark only; not compared",
            l.step, l.rank
        ));
    }
    for (j, l) in c.ranks.iter().enumerate() {
        if !c_used[j] {
            warnings.push(format!(
                "{}/{} is in the comparison only; not compared",
                l.step, l.rank
            ));
        }
    }
    pairs.sort_unstable();
    let pairs = pairs
        .into_iter()
        .map(|(i, j)| (b.ranks[i].clone(), c.ranks[j].clone()))
        .collect();
    (pairs, warnings)
}

fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a == b
}

/// Builds the rows and unmatched lists of one pair (no metrics yet). Consumes both dumps:
/// names, shapes and statistics move into the rows instead of being copied.
fn match_pair(pi: usize, mut bd: RankDump, mut cd: RankDump, out: &mut CompareResult) {
    let bkeys = dump::match_keys(&bd.ops);
    let ckeys = dump::match_keys(&cd.ops);
    // Bench tensors in slots; a match takes its tensor out, what is left is unmatched.
    let n: usize = bd.ops.iter().map(|o| o.tensors.len()).sum();
    let mut slots: Vec<Option<(usize, TensorRec)>> = Vec::with_capacity(n);
    let mut index: HashMap<String, usize> = HashMap::with_capacity(n);
    for (oi, op) in bd.ops.iter_mut().enumerate() {
        for t in std::mem::take(&mut op.tensors) {
            index.insert(dump::match_name(op, &bkeys[oi], &t), slots.len());
            slots.push(Some((oi, t)));
        }
    }
    out.rows
        .reserve(cd.ops.iter().map(|o| o.tensors.len()).sum::<usize>());
    let has_dataflow = cd.has_dataflow;
    for (oi, op) in cd.ops.iter_mut().enumerate() {
        for t in std::mem::take(&mut op.tensors) {
            let name = dump::match_name(op, &ckeys[oi], &t);
            let Some(bt) = index
                .get(&name)
                .and_then(|&k| slots[k].take())
                .map(|(_, t)| t)
            else {
                out.unmatched.push(Unmatched {
                    pair: pi,
                    side: Side::Cmp,
                    seq: op.seq,
                    op: op.key.clone(),
                    name: t.name,
                    role: t.role,
                    dtype: t.dtype_name,
                    shape: t.shape,
                });
                continue;
            };
            let external = match t.role {
                Role::Parameter => op.direction == Direction::Forward,
                Role::Input => {
                    has_dataflow && t.src.is_none() && op.direction == Direction::Forward
                }
                Role::Output => false,
            };
            let shapes_ok = same_shape(&bt.shape, &t.shape);
            let has_data = |x: &Data| !matches!(x, Data::None);
            let kind = if shapes_ok && has_data(&bt.data) && has_data(&t.data) {
                CompareKind::Tensor
            } else if bt.checksum.is_some() && t.checksum.is_some() {
                CompareKind::Checksum
            } else if bt.stats.is_some() && t.stats.is_some() {
                CompareKind::Statistics
            } else {
                CompareKind::None
            };
            let checksum_equal = match (&bt.checksum, &t.checksum) {
                (Some(x), Some(y)) => Some(x == y),
                _ => None,
            };
            out.rows.push(Row {
                pair: pi,
                op_index: oi,
                seq: op.seq,
                op: op.key.clone(),
                direction: op.direction,
                role: t.role,
                name: t.name,
                dtype_b: bt.dtype_name,
                dtype_c: t.dtype_name,
                shape_b: bt.shape,
                shape_c: t.shape,
                stats_b: bt.stats,
                stats_c: t.stats,
                kind,
                metrics: None,
                checksum_equal,
                verdict: Verdict::Pass,
                reason: String::new(),
                tol_error: 0.0,
                err: 0.0,
                raw_err: 0.0,
                external,
                stack: op.stack,
                precision: None,
                data: (kind == CompareKind::Tensor).then_some((bt.data, t.data)),
            });
        }
    }
    for (oi, t) in slots.into_iter().flatten() {
        let op = &bd.ops[oi];
        out.unmatched.push(Unmatched {
            pair: pi,
            side: Side::Bench,
            seq: op.seq,
            op: op.key.clone(),
            name: t.name,
            role: t.role,
            dtype: t.dtype_name,
            shape: t.shape,
        });
    }
}

struct Caches {
    bench: ShardCache,
    cmp: ShardCache,
}

fn compute_metrics(row: &Row, caches: &Caches) -> Result<Option<Metrics>> {
    let Some((bd, cd)) = &row.data else {
        return Ok(None);
    };
    let bt = caches
        .bench
        .open(bd, &row.name, &row.dtype_b, &row.shape_b)?;
    let ct = caches.cmp.open(cd, &row.name, &row.dtype_c, &row.shape_c)?;
    let (Some(bt), Some(ct)) = (bt, ct) else {
        return Ok(None);
    };
    Ok(Some(metrics::compare_tensors(&bt, &ct)?))
}

/// Puts the verdict on a row whose metrics are known.
fn judge_row(row: &mut Row, tols: &Tolerances) {
    let (mut db, mut dc) = (DType::parse(&row.dtype_b), DType::parse(&row.dtype_c));
    let own = match (db, dc) {
        (Some(x), Some(y)) => Some(tolerance::loosest(x, y)),
        _ => None,
    };
    let mut dname = own.map_or_else(|| row.dtype_c.clone(), |d| d.name().to_string());
    if let (Some(o), Some(p)) = (own, row.precision) {
        if o.is_float() && tolerance::loosest(o, p) != o {
            db = db.map(|d| tolerance::loosest(d, p));
            dc = dc.map(|d| tolerance::loosest(d, p));
            dname = format!("{o}, after {p} ops");
        }
    }
    let tol = tols.lookup(&row.op, &row.name, db, dc);
    row.tol_error = tol.error;
    let set = |row: &mut Row, v: Verdict, reason: String, err: f64| {
        row.verdict = v;
        row.reason = reason;
        row.err = err;
        row.raw_err = err;
    };
    if !same_shape(&row.shape_b, &row.shape_c) {
        let r = format!("shape {:?} vs {:?}", row.shape_b, row.shape_c);
        set(row, Verdict::Error, r, f64::INFINITY);
        return;
    }
    let numel: usize = row.shape_c.iter().product();
    let stat_diff = match (&row.stats_b, &row.stats_c) {
        (Some(sb), Some(sc)) => Some(metrics::stat_diff(sb, sc, numel, tol.atol)),
        _ => None,
    };
    match row.kind {
        CompareKind::Tensor => {
            let Some(m) = row.metrics else { return };
            if m.nonfinite_mismatch > 0 {
                let r = format!(
                    "NaN/Inf at different positions ({} in bench, {} in cmp)",
                    m.nonfinite_b, m.nonfinite_c
                );
                set(row, Verdict::Error, r, f64::INFINITY);
                return;
            }
            // Up to atol per element (RMS) of difference is forgiven, as in allclose.
            let slack = tol.atol * (m.n.max(1) as f64).sqrt();
            let rel = if m.euclid <= slack {
                0.0
            } else if m.norm_b == 0.0 {
                f64::INFINITY
            } else {
                (m.euclid - slack) / m.norm_b
            };
            // Outliers within atol are rounding, not outliers.
            let outlier = if m.max_abs > tol.atol {
                m.max_abs_scaled
            } else {
                0.0
            };
            let j = tolerance::judge(rel, Some(outlier), &tol, "relative L2 error", &dname);
            row.verdict = j.verdict;
            row.reason = j.reason;
            row.err = j.err;
            row.raw_err = if m.euclid == 0.0 { 0.0 } else { m.rel_l2 };
        }
        CompareKind::Checksum | CompareKind::Statistics => {
            let equal = row.checksum_equal == Some(true);
            let Some(sd) = stat_diff else {
                // Checksums without statistics.
                if equal {
                    set(row, Verdict::Pass, String::new(), 0.0);
                } else {
                    set(
                        row,
                        Verdict::Error,
                        "checksums differ".into(),
                        f64::INFINITY,
                    );
                }
                return;
            };
            if equal {
                set(row, Verdict::Pass, String::new(), 0.0);
                return;
            }
            let nf = |s: &Option<Stats>| s.as_ref().and_then(|s| s.nonfinite()).unwrap_or(0);
            let (nb, nc) = (nf(&row.stats_b), nf(&row.stats_c));
            if nb != nc {
                let r = format!("NaN/Inf count {nb} in bench, {nc} in cmp");
                set(row, Verdict::Error, r, f64::INFINITY);
                return;
            }
            let j = tolerance::judge(sd.scaled_err, None, &tol, "statistics error", &dname);
            let mut verdict = j.verdict;
            let mut reason = j.reason;
            if row.checksum_equal == Some(false) && verdict == Verdict::Pass {
                verdict = Verdict::Warning;
                reason = "checksums differ; statistics within tolerance".into();
            }
            set(row, verdict, reason, j.err);
            if let Some(raw) = row.stat_diff() {
                row.raw_err = raw.scaled_err;
            }
        }
        CompareKind::None => {
            set(
                row,
                Verdict::Warning,
                format!(
                    "nothing to compare (dtype {} / {})",
                    row.dtype_b, row.dtype_c
                ),
                0.0,
            );
        }
    }
}

/// Fills [`Row::precision`]: the loosest float dtype seen so far in each pair, in execution
/// order (forward first, then backward, which reuses the forward's activations).
fn set_precision(rows: &mut [Row]) {
    let mut floor: HashMap<usize, DType> = HashMap::new();
    for row in rows.iter_mut() {
        for d in [DType::parse(&row.dtype_b), DType::parse(&row.dtype_c)]
            .into_iter()
            .flatten()
            .filter(|d| d.is_float())
        {
            let f = floor.entry(row.pair).or_insert(d);
            *f = tolerance::loosest(*f, d);
        }
        row.precision = floor.get(&row.pair).copied();
    }
}

/// Options of one compare run.
pub struct Options {
    pub tolerances: Tolerances,
    /// Print progress on stderr (only when it is a terminal).
    pub progress: bool,
}

/// Runs the whole compare: discovery, matching, metrics, verdicts.
pub fn run(
    bench: &std::path::Path,
    cmp: &std::path::Path,
    opts: &Options,
) -> Result<CompareResult> {
    let bset = dump::discover(bench)?;
    let cset = dump::discover(cmp)?;
    let (pairs, mut warnings) = pair_ranks(&bset, &cset);
    if pairs.is_empty() {
        return Err(ProbeError::NothingComparable(format!(
            "no step/rank of {} matches one of {}",
            bench.display(),
            cmp.display()
        )));
    }
    let mut out = CompareResult::default();
    for (pi, (bl, cl)) in pairs.iter().enumerate() {
        // The two sides are independent: read them at the same time.
        let (bd, cd) = rayon::join(|| dump::load_rank(bl), || dump::load_rank(cl));
        let (bd, mut cd) = (bd?, cd?);
        warnings.extend(bd.warnings.iter().cloned());
        warnings.extend(cd.warnings.iter().cloned());
        if bd.ops.is_empty() {
            return Err(ProbeError::EmptyDump(bl.dir.clone()));
        }
        if cd.ops.is_empty() {
            return Err(ProbeError::EmptyDump(cl.dir.clone()));
        }
        out.pairs.push(Pair {
            step: cl.step.clone(),
            rank: cl.rank.clone(),
            bench_dir: bl.dir.clone(),
            cmp_dir: cl.dir.clone(),
            stacks: std::mem::take(&mut cd.stacks),
            ops: cd.ops.len(),
        });
        match_pair(pi, bd, cd, &mut out);
    }
    set_precision(&mut out.rows);
    let caches = Caches {
        bench: ShardCache::default(),
        cmp: ShardCache::default(),
    };
    let total = out.rows.len();
    let done = AtomicUsize::new(0);
    let show = opts.progress && std::io::stderr().is_terminal() && total > 0;
    let step = (total / 100).max(1);
    let errors: Vec<Option<ProbeError>> = out
        .rows
        .par_iter_mut()
        .map(|row| {
            let r = compute_metrics(row, &caches);
            let k = done.fetch_add(1, Ordering::Relaxed) + 1;
            if show && (k.is_multiple_of(step) || k == total) {
                eprint!("\rprobe: compared {k}/{total} tensors");
            }
            match r {
                Ok(m) => {
                    row.metrics = m;
                    judge_row(row, &opts.tolerances);
                    None
                }
                Err(e) => Some(e),
            }
        })
        .collect();
    if show {
        eprintln!();
    }
    if let Some(e) = errors.into_iter().flatten().next() {
        return Err(e);
    }
    for r in &mut out.rows {
        r.data = None;
    }
    out.warnings = warnings;
    Ok(out)
}
