//! The commands behind the CLI, one library call each: validate the arguments and the
//! output paths first, then do the long work, then write every output. `main.rs` only
//! parses arguments, calls one of these and maps the outcome to an exit code.

use crate::compare::{self, Level, Progress, Tolerances};
use crate::error::{ProbeError, Result};
use crate::gate::{self, FailOn};
use crate::report::{self, CompareDocument, Document, ReportWriter, ScanDocument};
use crate::scan::{self, ScanOptions, ScanSummary};
use crate::schema::summary::Summary;
use crate::{atomic, verdict};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What `probe compare` was asked to do.
#[derive(Debug, Clone)]
pub struct CompareRequest {
    /// The benchmark dump.
    pub bench: PathBuf,
    /// The comparison dump.
    pub cmp: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// Tolerance overrides (TOML).
    pub config: Option<PathBuf>,
    /// When the gate fails.
    pub fail_on: FailOn,
    /// Report formats to write (`json`, `parquet`, `xlsx`).
    pub formats: Vec<String>,
    /// Worker threads (None: all cores).
    pub threads: Option<usize>,
    /// Which records to compare.
    pub level: Level,
    /// How calls are paired.
    pub align: compare::AlignRule,
    /// Mapping files (`--mapping`), in the order given: earlier ones take precedence, all
    /// of them over the built-in table.
    pub mappings: Vec<PathBuf>,
    /// The largest share of a side's tensors in a step/rank pair that may lack a
    /// counterpart before the comparison is incomplete (0 to 1).
    pub max_unmatched: f64,
}

/// The chosen report writers, in their standard order; an unknown name is a usage error.
fn chosen_writers(formats: &[String]) -> Result<Vec<Box<dyn ReportWriter>>> {
    for f in formats {
        if !report::writers().iter().any(|w| w.format() == f) {
            return Err(ProbeError::Usage(format!(
                "unknown report format {f:?} (json, parquet, xlsx)"
            )));
        }
    }
    Ok(report::writers()
        .into_iter()
        .filter(|w| formats.iter().any(|f| f == w.format()))
        .collect())
}

/// The files `writers` will write into `out` for documents named `stem`, by format.
fn output_paths(
    writers: &[Box<dyn ReportWriter>],
    stem: &str,
    out: &Path,
) -> BTreeMap<String, String> {
    writers
        .iter()
        .map(|w| {
            let path = out.join(w.file_name(stem)).display().to_string();
            (w.format().to_string(), path)
        })
        .collect()
}

/// Writes every report of `doc` into `out`, all or nothing: into a staging folder first
/// (formats are independent files, written in parallel), moved into place only when every
/// one was written; on a failure the folder keeps the previous set and gains nothing.
fn write_reports(writers: &[Box<dyn ReportWriter>], doc: &dyn Document, out: &Path) -> Result<()> {
    let staging = atomic::Staging::new(out)?;
    let names: Vec<String> = writers.iter().map(|w| w.file_name(doc.stem())).collect();
    let written: Vec<Result<()>> = writers
        .par_iter()
        .zip(&names)
        .map(|(w, name)| w.write(doc, &staging.path(name)))
        .collect();
    written.into_iter().collect::<Result<Vec<()>>>()?;
    // summary.json (written first) moves into place last: it names the others.
    let mut order = names;
    order.rotate_left(1);
    staging.commit(&order)
}

/// A pool of `threads` workers, or None for rayon's global pool (all cores). More than
/// four threads per core only cost memory and can stall the machine: the count is capped,
/// with a warning for the summary.
fn thread_pool(threads: Option<usize>) -> Result<(Option<rayon::ThreadPool>, Option<String>)> {
    let Some(asked) = threads else {
        return Ok((None, None));
    };
    if asked == 0 {
        return Err(ProbeError::Usage("--threads must be at least 1".into()));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = asked.min(4 * cores);
    let note = (n < asked).then(|| {
        format!("--threads {asked} capped at {n} (4 per core on this {cores}-core machine)")
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| ProbeError::Usage(e.to_string()))?;
    Ok((Some(pool), note))
}

/// Runs `work` in `pool`, or where it is called.
fn within<T: Send>(pool: Option<rayon::ThreadPool>, work: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(p) => p.install(work),
        None => work(),
    }
}

/// Runs `probe compare`: reads both dumps, compares, writes every chosen report. Returns
/// the summary, whose `exit_code` is the gate's answer.
pub fn compare(req: &CompareRequest, progress: &(dyn Fn(Progress) + Sync)) -> Result<Summary> {
    let tolerances = match &req.config {
        Some(p) => Tolerances::from_file(p)?,
        None => Tolerances::default(),
    };
    let mapping = compare::Mapping::with_files(&req.mappings)?;
    let writers = chosen_writers(&req.formats)?;
    gate::check_fraction(req.max_unmatched)
        .map_err(|e| ProbeError::Usage(format!("--max-unmatched {}: {e}", req.max_unmatched)))?;
    let (pool, threads_note) = thread_pool(req.threads)?;
    atomic::refuse_inside(&req.out, &[&req.bench, &req.cmp])?;
    atomic::prepare_output_dir(&req.out)?;
    let opts = compare::Options {
        tolerances,
        level: req.level,
        aligner: req.align.aligner(mapping),
    };
    within(pool, || {
        let run = compare::run(&req.bench, &req.cmp, &opts, progress)?;
        let mut summary = verdict::summarize(&run, req.fail_on, req.max_unmatched);
        summary.warnings.extend(threads_note);
        summary.outputs = output_paths(&writers, "compare", &req.out);
        let doc = CompareDocument {
            run: &run,
            summary: &summary,
        };
        write_reports(&writers, &doc, &req.out)?;
        Ok(summary)
    })
}

/// What `probe scan` was asked to do.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    /// The dump to scan.
    pub dump: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// When the gate fails.
    pub fail_on: FailOn,
    /// Report formats to write.
    pub formats: Vec<String>,
    /// Scan options.
    pub options: ScanOptions,
}

/// Runs `probe scan`: reads one dump, finds where NaN/Inf comes from, writes every chosen
/// report. Returns the summary, whose `exit_code` is the gate's answer.
pub fn scan(req: &ScanRequest) -> Result<ScanSummary> {
    let writers = chosen_writers(&req.formats)?;
    if req.options.margin.is_nan() || req.options.margin < 1.0 {
        return Err(ProbeError::Usage(
            "--overflow-margin must be at least 1".into(),
        ));
    }
    atomic::refuse_inside(&req.out, &[&req.dump])?;
    atomic::prepare_output_dir(&req.out)?;
    let run = scan::run(&req.dump, &req.options)?;
    let mut summary = scan::summarize(&run, req.fail_on);
    summary.outputs = output_paths(&writers, "scan", &req.out);
    let doc = ScanDocument {
        run: &run,
        summary: &summary,
    };
    write_reports(&writers, &doc, &req.out)?;
    Ok(summary)
}
