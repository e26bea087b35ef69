//! `ckpt_compare.json` (schema `schemas/probe-ckpt-compare.v1.schema.json`) and the
//! terminal summary of `probe ckpt-compare`.

use super::layout::{Dims, Logical};
use super::measure::Measured;
use super::source::{Checkpoint, Layout, Stored};
use super::CkptRequest;
use crate::dtype::DType;
use crate::error::Result;
use crate::report::printable;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The summary's file name.
pub const SUMMARY: &str = "ckpt_compare.json";

/// A stored tensor as the report names it: `file: name` (with the rank folder for a
/// Megatron side).
pub(crate) fn stored_name(ck: &Checkpoint, t: &Stored) -> String {
    let path = ck.path_of(t);
    let file = path
        .strip_prefix(&ck.root)
        .unwrap_or(path)
        .display()
        .to_string();
    let file = if file.is_empty() {
        path.display().to_string()
    } else {
        file
    };
    format!("{file}: {}", t.name)
}

/// Where a differing part of a parameter lies.
#[derive(Debug, Clone, Serialize)]
pub struct ShardRef {
    /// bench or cmp.
    pub side: &'static str,
    /// TP rank (Megatron side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp: Option<usize>,
    /// PP rank (Megatron side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pp: Option<usize>,
    /// `file: stored tensor name`.
    pub tensor: String,
    /// Rows of the stored tensor (`a..b`).
    pub rows: String,
    /// What kind of part: a piece of the merge, or a replica that differs from rank 0's.
    pub part: &'static str,
}

/// One parameter pair's result.
#[derive(Debug, Clone, Serialize)]
pub struct ParamResult {
    /// The logical name.
    pub name: String,
    /// The logical shape.
    pub shape: Vec<usize>,
    /// Each side's dtype.
    pub dtype: [String; 2],
    /// Bit-identical.
    pub exact: bool,
    /// Cosine similarity (None for one element).
    pub cosine: Option<f64>,
    /// ‖cmp − bench‖ / ‖bench‖.
    pub rel_l2: f64,
    /// max |cmp − bench|.
    pub max_abs: f64,
    /// pass or differs.
    pub status: &'static str,
    /// The parts that differ, on either side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardRef>,
    /// What the merge left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The default tolerance on the relative L2 error: none for one dtype, else the coarser
/// dtype's rounding.
fn default_tolerance(a: DType, b: DType) -> f64 {
    let eps = |d: DType| match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        _ => 0.0,
    };
    if a == b {
        0.0
    } else {
        eps(a).max(eps(b))
    }
}

impl ParamResult {
    /// The result of a pair from its measurement.
    pub(crate) fn new(
        sides: &[Checkpoint; 2],
        p: [&Logical; 2],
        m: Measured,
        tol: Option<f64>,
    ) -> ParamResult {
        let tol = tol.unwrap_or_else(|| default_tolerance(p[0].dtype, p[1].dtype));
        let mut shards = Vec::new();
        for s in 0..2 {
            let ck = &sides[s];
            let megatron = matches!(ck.layout, Layout::Megatron { .. });
            let refs = m.differing_pieces[s]
                .iter()
                .map(|&i| {
                    (
                        p[s].pieces[i].src,
                        p[s].pieces[i].src_row,
                        p[s].pieces[i].rows,
                        "piece",
                    )
                })
                .chain(m.bad_replicas[s].iter().map(|&i| {
                    let t = &ck.tensors[p[s].replicas[i]];
                    (
                        p[s].replicas[i],
                        0,
                        t.rows_cols().0,
                        "replica differs from rank 0's",
                    )
                }));
            for (src, r0, n, part) in refs {
                // A flat side's one piece is the parameter itself: named only when sharded.
                if !megatron && p[s].pieces.len() == 1 && part == "piece" {
                    continue;
                }
                let t = &ck.tensors[src];
                shards.push(ShardRef {
                    side: ["bench", "cmp"][s],
                    tp: t.rank.map(|r| r.tp),
                    pp: t.rank.map(|r| r.pp),
                    tensor: stored_name(ck, t),
                    rows: format!("{r0}..{}", r0 + n),
                    part,
                });
            }
        }
        let within = m.metrics.rel_l2 <= tol && m.metrics.nonfinite_mismatch == 0;
        let ok = (m.exact || within) && m.bad_replicas.iter().all(|r| r.is_empty());
        ParamResult {
            name: p[0].name.clone(),
            shape: p[0].shape.clone(),
            dtype: [p[0].dtype.name().to_string(), p[1].dtype.name().to_string()],
            exact: m.exact,
            cosine: m.metrics.cosine,
            rel_l2: m.metrics.rel_l2,
            max_abs: m.metrics.max_abs,
            status: if ok { "pass" } else { "differs" },
            shards,
            note: p[0].note.clone().or_else(|| p[1].note.clone()),
        }
    }
}

/// One side as the report describes it.
#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    /// The path given.
    pub path: String,
    /// Its layout.
    pub layout: Layout,
    /// Files read.
    pub files: usize,
    /// Stored tensors.
    pub tensors: usize,
    /// Entries left out as not parameters.
    pub non_parameters: usize,
}

/// Counts of the summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Pairs compared.
    pub compared: usize,
    /// Bit-identical pairs.
    pub exact: usize,
    /// Pairs within the tolerance, not exact.
    pub within_tolerance: usize,
    /// Pairs that differ.
    pub differ: usize,
    /// Parameters only on the bench side.
    pub only_bench: usize,
    /// Parameters only on the cmp side.
    pub only_cmp: usize,
    /// Parameters left out by the mapping's ignore patterns.
    pub ignored: usize,
}

/// `ckpt_compare.json`.
#[derive(Debug, Clone, Serialize)]
pub struct CkptSummary {
    /// `probe-ckpt-compare.v1`.
    pub schema: &'static str,
    /// The probe that wrote it.
    pub probe_version: &'static str,
    /// pass or differs.
    pub verdict: &'static str,
    /// The exit code (0 pass, 1 differs).
    pub exit_code: u8,
    /// One line: the first parameter (model order) that differs, and where.
    pub headline: String,
    /// The two sides.
    pub bench: SideInfo,
    /// The comparison side.
    pub cmp: SideInfo,
    /// The model shape used to merge shards, and each value's source.
    pub model: Dims,
    /// Where each model value came from.
    pub model_from: BTreeMap<String, String>,
    /// The tolerance given (None: by dtype).
    pub tolerance: Option<f64>,
    /// Counts.
    pub counts: Counts,
    /// Every pair, in model order.
    pub params: Vec<ParamResult>,
    /// Names on one side only.
    pub only_bench: Vec<String>,
    /// Names on the comparison side only.
    pub only_cmp: Vec<String>,
}

fn side_info(ck: &Checkpoint) -> SideInfo {
    SideInfo {
        path: ck.root.display().to_string(),
        layout: ck.layout.clone(),
        files: ck.files.len(),
        tensors: ck.tensors.len(),
        non_parameters: ck.non_parameters,
    }
}

/// The summary of the results.
pub(crate) fn summarize(
    req: &CkptRequest,
    sides: &[Checkpoint; 2],
    model: Dims,
    model_from: BTreeMap<String, String>,
    params: Vec<ParamResult>,
    only: [Vec<String>; 2],
    ignored: usize,
) -> CkptSummary {
    let mut c = Counts {
        compared: params.len(),
        only_bench: only[0].len(),
        only_cmp: only[1].len(),
        ignored,
        ..Counts::default()
    };
    for p in &params {
        match (p.status, p.exact) {
            ("pass", true) => c.exact += 1,
            ("pass", false) => c.within_tolerance += 1,
            _ => c.differ += 1,
        }
    }
    let ok = c.differ == 0 && c.only_bench == 0 && c.only_cmp == 0;
    let headline = headline(&params, &only, &c);
    let [only_bench, only_cmp] = only;
    CkptSummary {
        schema: "probe-ckpt-compare.v1",
        probe_version: env!("CARGO_PKG_VERSION"),
        verdict: if ok { "pass" } else { "differs" },
        exit_code: super::exit_code(ok),
        headline,
        bench: side_info(&sides[0]),
        cmp: side_info(&sides[1]),
        model,
        model_from,
        tolerance: req.tolerance,
        counts: c,
        params,
        only_bench,
        only_cmp,
    }
}

fn headline(params: &[ParamResult], only: &[Vec<String>; 2], c: &Counts) -> String {
    if let Some(p) = params.iter().find(|p| p.status == "differs") {
        let mut s = format!(
            "first differing parameter: {} (cosine {}, relative L2 {:.3e}, max abs {:.3e})",
            p.name,
            p.cosine.map_or("n/a".to_string(), |x| format!("{x:.6}")),
            p.rel_l2,
            p.max_abs
        );
        if let Some(sh) = p.shards.first() {
            let rank = match (sh.tp, sh.pp) {
                (Some(t), Some(pp)) => format!("tp rank {t}, pp rank {pp}: "),
                _ => String::new(),
            };
            s += &format!("; {} shard {rank}{} rows {}", sh.side, sh.tensor, sh.rows);
            if sh.part != "piece" {
                s += &format!(" ({})", sh.part);
            }
            if p.shards.len() > 1 {
                s += &format!(" (and {} more)", p.shards.len() - 1);
            }
        }
        return s;
    }
    if let Some(n) = only[0].first().or(only[1].first()) {
        let side = if only[0].first() == Some(n) {
            "bench"
        } else {
            "cmp"
        };
        return format!(
            "{} parameters on one side only (bench {}, cmp {}); first: {n} (only in {side})",
            c.only_bench + c.only_cmp,
            c.only_bench,
            c.only_cmp
        );
    }
    format!(
        "{} parameters compared: {} bit-identical, {} within tolerance",
        c.compared, c.exact, c.within_tolerance
    )
}

/// Writes `ckpt_compare.json` into `out` (all or nothing).
pub(crate) fn write(out: &Path, s: &CkptSummary) -> Result<()> {
    let staging = crate::atomic::Staging::new(out)?;
    let path = staging.path(SUMMARY);
    crate::atomic::write_with(&path, |w| {
        serde_json::to_writer_pretty(&mut *w, s).map_err(|e| e.to_string())?;
        std::io::Write::write_all(w, b"\n").map_err(|e| e.to_string())
    })?;
    staging.commit(&[SUMMARY.to_string()])
}

/// The terminal summary: verdict and headline, counts, the first differing parameters.
pub fn terminal_summary(s: &CkptSummary, out: &Path) -> String {
    let c = &s.counts;
    let mut t = format!("{}: {}\n", s.verdict, printable(&s.headline));
    t += &format!(
        "compared {} parameters: {} exact, {} within tolerance, {} differ; {} only in bench, {} only in cmp, {} ignored\n",
        c.compared, c.exact, c.within_tolerance, c.differ, c.only_bench, c.only_cmp, c.ignored
    );
    for p in s.params.iter().filter(|p| p.status == "differs").take(10) {
        t += &format!(
            "  differs: {} cosine {} rel L2 {:.3e} max abs {:.3e}\n",
            printable(&p.name),
            p.cosine.map_or("n/a".to_string(), |x| format!("{x:.6}")),
            p.rel_l2,
            p.max_abs
        );
    }
    t += &format!(
        "json: {}\n",
        printable(&out.join(SUMMARY).display().to_string())
    );
    t
}
