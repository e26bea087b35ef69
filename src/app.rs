//! The commands behind the CLI, one library call each: validate the arguments and the
//! output paths first, then do the long work, then write every output. `main.rs` only
//! parses arguments, calls one of these and maps the outcome to an exit code.

use crate::compare::shard::{self, RunIdentity};
use crate::compare::{self, Level, Shard, Tolerances};
use crate::dump::Selection;
use crate::error::{ProbeError, Result};
use crate::gate::{self, FailOn};
use crate::monitor::{self, summary::MonitorSummary};
use crate::progress::{Count, Progress};
use crate::report::MonitorDocument;
use crate::report::{
    self, CompareDocument, CopyPlan, Document, ReportWriter, ScanDocument, XlsxRows,
};
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
    /// A reference run the verdicts are calibrated against (`--reference`).
    pub reference: Option<compare::envelope::Reference>,
    /// When the gate fails.
    pub fail_on: FailOn,
    /// Report formats to write (`json`, `parquet`, `xlsx`, `html`).
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
    /// The steps and ranks to compare.
    pub selection: Selection,
    /// Compare only this part and write a shard result for `probe merge` (instead of the
    /// reports).
    pub shard: Option<Shard>,
    /// How many tensor rows the workbook holds.
    pub xlsx_rows: XlsxRows,
    /// Megabytes of rows held in memory before the rest waits in a temporary file in `out`
    /// (`--row-memory`).
    pub row_memory_mb: u64,
}

/// What `probe compare --shard` wrote.
#[derive(Debug, Clone)]
pub struct ShardReport {
    /// Which part.
    pub shard: Shard,
    /// Step/rank pairs compared (or skipped as empty) by this shard.
    pub units: usize,
    /// Step/rank pairs the plan holds in all.
    pub planned: usize,
    /// The shard result's folder.
    pub out: PathBuf,
    /// Warnings of the shard's units.
    pub warnings: Vec<String>,
}

/// What `probe merge` was asked to do.
#[derive(Debug, Clone)]
pub struct MergeRequest {
    /// The shard results' folders.
    pub shards: Vec<PathBuf>,
    /// Output folder for the reports.
    pub out: PathBuf,
    /// When the gate fails.
    pub fail_on: FailOn,
    /// As `CompareRequest::max_unmatched`.
    pub max_unmatched: f64,
    /// Report formats to write.
    pub formats: Vec<String>,
    /// How many tensor rows the workbook holds.
    pub xlsx_rows: XlsxRows,
    /// Megabytes of the shards' rows read into memory once (the rest are read from the
    /// shards by each report that needs them).
    pub row_memory_mb: u64,
}

/// `--row-memory MB` in bytes.
fn megabytes(mb: u64) -> usize {
    usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// The chosen report writers, in their standard order; an unknown name is a usage error.
fn chosen_writers(formats: &[String], xlsx_rows: XlsxRows) -> Result<Vec<Box<dyn ReportWriter>>> {
    let known: Vec<&str> = report::writers(xlsx_rows)
        .iter()
        .map(|w| w.format())
        .collect();
    for f in formats {
        if !known.contains(&f.as_str()) {
            return Err(ProbeError::Usage(format!(
                "unknown report format {f:?} ({})",
                known.join(", ")
            )));
        }
    }
    Ok(report::writers(xlsx_rows)
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
fn write_reports(
    writers: &[Box<dyn ReportWriter>],
    doc: &dyn Document,
    out: &Path,
    progress: &Progress,
) -> Result<()> {
    write_reports_with(writers, doc, &[], out, progress)
}

/// [`write_reports`] with other files of the same set (`extras`: name and bytes), which
/// move into place with the reports or not at all.
fn write_reports_with(
    writers: &[Box<dyn ReportWriter>],
    doc: &dyn Document,
    extras: &[(String, Vec<u8>)],
    out: &Path,
    progress: &Progress,
) -> Result<()> {
    let staging = atomic::Staging::new(out)?;
    for (name, bytes) in extras {
        atomic::write_bytes(&staging.path(name), bytes)?;
    }
    let mut names: Vec<String> = writers.iter().map(|w| w.file_name(doc.stem())).collect();
    let stage = progress.stage("reports", writers.len() as u64, Count::Items);
    stage.note(names.join(", "));
    let written: Vec<Result<()>> = writers
        .par_iter()
        .zip(&names)
        .map(|(w, name)| {
            let r = w.write(doc, &staging.path(name));
            stage.inc(1);
            r
        })
        .collect();
    drop(stage);
    written.into_iter().collect::<Result<Vec<()>>>()?;
    // summary.json (written first) moves into place last: it names the others.
    names.extend(extras.iter().map(|(n, _)| n.clone()));
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

/// The compare options of a request, validated, and the worker pool.
fn prepare(
    req: &CompareRequest,
) -> Result<(compare::Options, Option<rayon::ThreadPool>, Option<String>)> {
    let tolerances = match &req.config {
        Some(p) => Tolerances::from_file(p)?,
        None => Tolerances::default(),
    };
    let mapping = compare::Mapping::with_files(&req.mappings)?;
    check_max_unmatched(req.max_unmatched)?;
    let (pool, threads_note) = thread_pool(req.threads)?;
    let mut inputs: Vec<&std::path::Path> = vec![&req.bench, &req.cmp];
    if let Some(r) = &req.reference {
        if !(r.k.is_finite() && r.k >= 1.0) {
            return Err(ProbeError::Usage(format!(
                "--reference-k {} must be a number of at least 1",
                r.k
            )));
        }
        inputs.push(&r.root);
    }
    atomic::refuse_inside(&req.out, &inputs)?;
    let opts = compare::Options {
        tolerances,
        level: req.level,
        aligner: req.align.aligner(mapping),
        selection: req.selection.clone(),
        row_memory: compare::RowMemory {
            budget: usize::try_from(req.row_memory_mb.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            dir: Some(req.out.clone()),
        },
        reference: req.reference.clone(),
    };
    Ok((opts, pool, threads_note))
}

/// Runs `probe compare`: reads both dumps, compares, writes every chosen report. Returns
/// the summary, whose `exit_code` is the gate's answer. `progress` shows how far it got
/// (see [`crate::progress`]; [`Progress::hidden`] for none).
pub fn compare(req: &CompareRequest, progress: &Progress) -> Result<Summary> {
    let writers = chosen_writers(&req.formats, req.xlsx_rows)?;
    let baseline = crate::baseline::resolve(&req.bench)?;
    let req = &against(req, baseline.as_ref());
    let (opts, pool, threads_note) = prepare(req)?;
    atomic::prepare_output_dir(&req.out)?;
    within(pool, || {
        let run = compare::run(&req.bench, &req.cmp, &opts, progress)?;
        let gate = (req.fail_on, req.max_unmatched);
        report_run(
            &run,
            gate,
            threads_note,
            (&writers, None),
            (&req.out, true),
            baseline.as_ref(),
            progress,
        )
    })
}

/// The request with `-b` a baseline folder (docs/ci.md): the dump inside is the benchmark,
/// and its calibration file the tolerances unless `--config` names others.
fn against(req: &CompareRequest, baseline: Option<&crate::baseline::Baseline>) -> CompareRequest {
    let mut req = req.clone();
    if let Some(b) = baseline {
        req.bench = b.dump();
        req.config = req.config.or_else(|| b.calibration());
    }
    req
}

/// A compare's summary alone, nothing written (`probe replay` without `--from`): `out` is
/// only where rows past the memory budget wait, and must exist.
pub fn compare_summary(req: &CompareRequest, progress: &Progress) -> Result<Summary> {
    let req = &against(req, crate::baseline::resolve(&req.bench)?.as_ref());
    let (opts, pool, threads_note) = prepare(req)?;
    within(pool, || {
        let run = compare::run(&req.bench, &req.cmp, &opts, progress)?;
        let extras = verdict::Extras {
            note: threads_note,
            ..verdict::Extras::default()
        };
        Ok(verdict::summarize(
            &run,
            req.fail_on,
            req.max_unmatched,
            extras,
        ))
    })
}

/// `--max-unmatched` checked before any work.
fn check_max_unmatched(f: f64) -> Result<()> {
    gate::check_fraction(f)
        .map(|_| ())
        .map_err(|e| ProbeError::Usage(format!("--max-unmatched {f}: {e}")))
}

/// The summary of a finished run (gated by `--fail-on`, `--max-unmatched`) and every
/// chosen report of it: the last step of `probe compare` and of `probe merge`. With
/// `recapture` (a compare, whose dumps are at hand), `recapture.json` too when the first
/// divergent op was dumped without its tensors.
fn report_run(
    run: &compare::CompareRun,
    (fail_on, max_unmatched): (FailOn, f64),
    note: Option<String>,
    (writers, copy): (&[Box<dyn ReportWriter>], Option<CopyPlan>),
    (out, recapture): (&Path, bool),
    baseline: Option<&crate::baseline::Baseline>,
    progress: &Progress,
) -> Result<Summary> {
    let extras = verdict::Extras {
        note,
        outputs: output_paths(writers, "compare", out),
    };
    let mut summary = verdict::summarize(run, fail_on, max_unmatched, extras);
    if let Some(b) = baseline {
        summary.headline = format!("benchmark: {}; {}", b.said(), summary.headline);
    }
    let (files, summary) = if recapture {
        compare_recapture(summary, run, out)?
    } else {
        (Vec::new(), summary)
    };
    let doc = CompareDocument::new(run, &summary).with_parquet_copy(copy);
    write_reports_with(writers, &doc, &files, out, progress)?;
    crate::memory::trace("the reports");
    Ok(summary)
}

/// What makes shards of one run: every option that changes a unit's result. The gate's
/// options (`--fail-on`, `--max-unmatched`) are not among them: `probe merge` takes them.
fn run_identity(req: &CompareRequest) -> Result<RunIdentity> {
    let mut options = BTreeMap::new();
    options.insert("level".into(), format!("{:?}", req.level));
    options.insert("align".into(), format!("{:?}", req.align));
    let tolerances = match &req.config {
        Some(p) => shard::file_digest(p)?,
        None => "default".into(),
    };
    options.insert("tolerances".into(), tolerances);
    let mappings: Vec<String> = req
        .mappings
        .iter()
        .map(|p| shard::file_digest(p))
        .collect::<Result<_>>()?;
    options.insert("mappings".into(), mappings.join(","));
    options.insert("selection".into(), req.selection.to_string());
    if let Some(r) = &req.reference {
        options.insert("reference_k".into(), r.k.to_string());
    }
    Ok(RunIdentity {
        probe: env!("CARGO_PKG_VERSION").into(),
        options,
    })
}

/// Runs `probe compare --shard`: compares the shard's step/rank pairs and writes its shard
/// result (`shard.json`, `units.msgpack`) and its rows (`compare.parquet`), all or nothing.
pub fn compare_shard(
    req: &CompareRequest,
    shard: Shard,
    progress: &Progress,
) -> Result<ShardReport> {
    let (opts, pool, _) = prepare(req)?;
    let identity = run_identity(req)?;
    atomic::prepare_output_dir(&req.out)?;
    within(pool, || {
        let part = compare::run_part(&req.bench, &req.cmp, &opts, shard, progress)?;
        let planned = part.frame.units.len();
        let units = part.outcomes.len();
        let staging = atomic::Staging::new(&req.out)?;
        let pending = shard::stage(&staging, shard, &identity, &part)?;
        let run = part.assemble();
        let extras = verdict::Extras::default();
        let summary = verdict::summarize(&run, req.fail_on, req.max_unmatched, extras);
        let doc = CompareDocument::new(&run, &summary);
        let table = report::ParquetTable;
        let name = table.file_name(doc.stem());
        table.write(&doc, &staging.path(&name))?;
        let names = pending.seal(&staging, &name)?;
        staging.commit(&names)?;
        Ok(ShardReport {
            shard,
            units,
            planned,
            out: req.out.clone(),
            warnings: run.warnings,
        })
    })
}

/// What `probe merge` did: the run's summary, and why the parquet table was encoded again
/// rather than copied from the shards' tables, if it was (for stderr: `summary.json` stays
/// the unsharded compare's).
#[derive(Debug)]
pub struct Merged {
    /// The summary (`summary.json`).
    pub summary: Summary,
    /// Why the shards' parquet row groups were not copied, when they were not.
    pub encoded_again: Option<String>,
}

/// Runs `probe merge`: reads the shard results, checks they make one run, and writes the
/// reports an unsharded compare writes (the same `summary.json`), without reading a tensor.
pub fn merge(req: &MergeRequest, progress: &Progress) -> Result<Merged> {
    let writers = chosen_writers(&req.formats, req.xlsx_rows)?;
    check_max_unmatched(req.max_unmatched)?;
    if req.shards.is_empty() {
        return Err(ProbeError::Usage("give the shard folders to merge".into()));
    }
    let inputs: Vec<&Path> = req.shards.iter().map(PathBuf::as_path).collect();
    atomic::refuse_inside(&req.out, &inputs)?;
    atomic::prepare_output_dir(&req.out)?;
    let shards = req
        .shards
        .par_iter()
        .map(|d| shard::read(d))
        .collect::<Result<Vec<_>>>()?;
    let parts = crate::report::shards::table_parts(&shards);
    let run = shard::combine(shards)?;
    // The parquet table is the shards' row groups copied in order, when they are all there
    // and fall on the run's parts; else its lines are encoded again, as a compare does.
    let (copy, encoded_again) = if writers.iter().any(|w| w.format() == "parquet") {
        match crate::report::shards::copy_plan(&parts, &run) {
            Ok(plan) => (Some(plan), None),
            Err(why) => (None, Some(why)),
        }
    } else {
        (None, None)
    };
    // Rows that fit the budget are read from the shards once, not once per report, and not
    // at all when no report reads them.
    let reads_rows = writers.iter().any(|w| match w.format() {
        "json" => false,
        "parquet" => copy.is_none(),
        _ => true,
    });
    let run = if reads_rows {
        let weights: Vec<usize> = run.units.iter().map(|u| u.weight()).collect();
        let tables = run.tables.loaded(&weights, megabytes(req.row_memory_mb))?;
        compare::CompareRun { tables, ..run }
    } else {
        run
    };
    let gate = (req.fail_on, req.max_unmatched);
    let summary = report_run(
        &run,
        gate,
        None,
        (&writers, copy),
        (&req.out, false),
        None,
        progress,
    )?;
    Ok(Merged {
        summary,
        encoded_again,
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
pub fn scan(req: &ScanRequest, progress: &Progress) -> Result<ScanSummary> {
    let writers = chosen_writers(&req.formats, XlsxRows::All)?;
    if !req.options.margin.is_finite() || req.options.margin < 1.0 {
        return Err(ProbeError::Usage(
            "--overflow-margin must be a finite number of at least 1".into(),
        ));
    }
    atomic::refuse_inside(&req.out, &[&req.dump])?;
    atomic::prepare_output_dir(&req.out)?;
    let run = scan::run(&req.dump, &req.options, progress)?;
    let outputs = output_paths(&writers, "scan", &req.out);
    let summary = scan::summarize(&run, req.fail_on, outputs);
    let doc = ScanDocument {
        run: &run,
        summary: &summary,
    };
    write_reports(&writers, &doc, &req.out, progress)?;
    Ok(summary)
}

/// What `probe calibrate` was asked to do.
#[derive(Debug, Clone)]
pub struct CalibrateRequest {
    /// The benchmark dump.
    pub bench: PathBuf,
    /// The reference runs (or reruns), each compared with the benchmark.
    pub references: Vec<PathBuf>,
    /// Whether they are reruns of the benchmark's configuration on its device (the
    /// determinism map).
    pub reruns: bool,
    /// The calibration file to write.
    pub out: PathBuf,
    /// A tensor passes within `k` times its group's reference error.
    pub k: f64,
    /// The quantile of a group's errors taken as its reference error.
    pub quantile: f64,
    /// Worker threads (None: all cores).
    pub threads: Option<usize>,
    /// Which records to compare.
    pub level: Level,
    /// Mapping files (`--mapping`).
    pub mappings: Vec<PathBuf>,
    /// The steps and ranks to compare.
    pub selection: Selection,
}

/// What `probe calibrate` wrote.
#[derive(Debug, Clone)]
pub struct CalibrateReport {
    /// The calibration file.
    pub path: PathBuf,
    /// Its rules.
    pub rules: usize,
    /// The tensors observed, over every pair.
    pub tensors: usize,
    /// With reruns: the groups of nondeterministic ops and their largest run-to-run error.
    pub nondeterministic: Vec<(String, f64)>,
    /// Non-fatal problems of the pairs' compares.
    pub warnings: Vec<String>,
}

/// Runs `probe calibrate`: compares the benchmark with each reference run, and writes the
/// tolerances learnt from them (`compare::calibrate`) as a `--config` file, all or nothing.
pub fn calibrate(req: &CalibrateRequest, progress: &Progress) -> Result<CalibrateReport> {
    if !(req.k.is_finite() && req.k >= 1.0) {
        return Err(ProbeError::Usage(format!(
            "--k {} must be a number of at least 1",
            req.k
        )));
    }
    if !(req.quantile > 0.0 && req.quantile <= 1.0) {
        return Err(ProbeError::Usage(format!(
            "--quantile {} must be above 0 and at most 1",
            req.quantile
        )));
    }
    if req.references.is_empty() {
        return Err(ProbeError::Usage(
            "give at least one reference run (-r)".into(),
        ));
    }
    let dir = match req.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(ProbeError::Usage(format!(
            "{}: its folder does not exist",
            req.out.display()
        )));
    }
    if req.out.is_dir() {
        return Err(ProbeError::Usage(format!(
            "{} is a folder: give the calibration file's path",
            req.out.display()
        )));
    }
    let mapping = compare::Mapping::with_files(&req.mappings)?;
    let (pool, threads_note) = thread_pool(req.threads)?;
    let opts = compare::Options {
        level: req.level,
        aligner: compare::AlignRule::Structural.aligner(mapping),
        selection: req.selection.clone(),
        row_memory: compare::RowMemory {
            dir: Some(dir),
            ..compare::RowMemory::default()
        },
        ..compare::Options::default()
    };
    let mut obs = compare::calibrate::Observations::default();
    let mut warnings: Vec<String> = threads_note.into_iter().collect();
    within(pool, || -> Result<()> {
        for r in &req.references {
            let run = compare::run(&req.bench, r, &opts, progress)?;
            warnings.extend(run.warnings.iter().cloned());
            for u in &run.units {
                warnings.extend(u.warnings.iter().cloned());
            }
            obs.observe(&run, req.reruns)?;
        }
        Ok(())
    })?;
    let mut source = vec![format!("benchmark {}", req.bench.display())];
    let what = if req.reruns { "rerun" } else { "reference" };
    source.extend(
        req.references
            .iter()
            .map(|r| format!("{what} {}", r.display())),
    );
    let text = obs.toml(req.k, req.quantile, &source);
    atomic::write_bytes(&req.out, text.as_bytes())?;
    Ok(CalibrateReport {
        path: req.out.clone(),
        rules: obs.groups(),
        tensors: obs.tensors,
        nondeterministic: obs.nondeterministic(),
        warnings,
    })
}

/// What `probe compare` on two monitor folders was asked to do.
#[derive(Debug, Clone)]
pub struct TrendRequest {
    /// The benchmark monitor.
    pub bench: PathBuf,
    /// The comparison monitor.
    pub cmp: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// How the series are judged.
    pub options: monitor::trend::TrendOptions,
    /// When the gate fails.
    pub fail_on: FailOn,
    /// Report formats to write.
    pub formats: Vec<String>,
    /// Worker threads (None: all cores): rank pairs judged at once, each holding its two
    /// files' values.
    pub threads: Option<usize>,
}

/// The name of the recapture configuration in the output folder.
pub const RECAPTURE: &str = crate::recapture::FILE;

/// Files written with the reports: name and bytes.
type Extras = Vec<(String, Vec<u8>)>;

/// The recapture configuration of a target as file bytes, and its path in `out`.
fn recapture(
    target: Option<monitor::recapture::Target>,
    out: &Path,
) -> Result<(Extras, Option<String>)> {
    let Some(t) = target else {
        return Ok((Vec::new(), None));
    };
    let bytes = crate::recapture::bytes(&monitor::recapture::config(&t));
    let path = out.join(RECAPTURE).display().to_string();
    Ok((vec![(RECAPTURE.to_string(), bytes)], Some(path)))
}

/// Runs `probe compare` on two monitor folders: where the runs part, the reports and the
/// recapture configuration. Returns the summary, whose `exit_code` is the gate's answer.
pub fn trend(req: &TrendRequest, progress: &Progress) -> Result<MonitorSummary> {
    let writers = chosen_writers(&req.formats, XlsxRows::All)?;
    let o = &req.options;
    if o.envelope.is_some_and(|e| !(e.is_finite() && e > 0.0)) {
        return Err(ProbeError::Usage(
            "--envelope must be a positive number".into(),
        ));
    }
    if !(o.k.is_finite() && o.k >= 1.0) {
        return Err(ProbeError::Usage("--trend-k must be at least 1".into()));
    }
    if o.calibration_steps == Some(0) {
        return Err(ProbeError::Usage(
            "--calibration-steps must be at least 1".into(),
        ));
    }
    let (pool, note) = thread_pool(req.threads)?;
    atomic::refuse_inside(&req.out, &[&req.bench, &req.cmp])?;
    atomic::prepare_output_dir(&req.out)?;
    let stage = progress.stage("monitor ranks", 1, Count::Items);
    let sides = crate::vocab::Sides {
        bench: req.bench.as_path(),
        cmp: req.cmp.as_path(),
    };
    let mut run = within(pool, || monitor::trend::compare(sides, o))?;
    drop(stage);
    run.warnings.extend(note);
    let (extras, path) = recapture(monitor::summary::trend_target(&run), &req.out)?;
    let outputs = output_paths(&writers, "monitor", &req.out);
    let summary = monitor::summary::of_trend(&run, o, req.fail_on, path, outputs);
    let doc = MonitorDocument::Trend(&run, &summary);
    write_reports_with(&writers, &doc, &extras, &req.out, progress)?;
    Ok(summary)
}

/// Runs `probe scan` on a monitor folder: the run's first events, the reports and the
/// recapture configuration of the first.
pub fn monitor_scan(req: &ScanRequest, progress: &Progress) -> Result<MonitorSummary> {
    let writers = chosen_writers(&req.formats, XlsxRows::All)?;
    atomic::refuse_inside(&req.out, &[&req.dump])?;
    atomic::prepare_output_dir(&req.out)?;
    let stage = progress.stage("monitor ranks", 1, Count::Items);
    let events = monitor::events::scan(&req.dump)?;
    drop(stage);
    let (extras, path) = recapture(monitor::summary::scan_target(&events), &req.out)?;
    let outputs = output_paths(&writers, "monitor", &req.out);
    let summary = monitor::summary::of_scan(&events, req.fail_on, path, outputs);
    let doc = MonitorDocument::Scan(&events, &summary);
    write_reports_with(&writers, &doc, &extras, &req.out, progress)?;
    Ok(summary)
}

/// The ops a replay takes by default: a compare's first divergent op, forward, and the
/// backward one too when it is in the same step and rank (else the forward alone); their
/// step and rank labels. None when the compare names no divergent op.
pub fn divergent_ops(s: &Summary) -> Option<(String, String, Vec<String>)> {
    use crate::op_key::Direction;
    use crate::vocab::FindingKind;
    let first = |d| s.findings.get(FindingKind::FirstDivergent, Some(d));
    let (fwd, bwd) = (first(Direction::Forward), first(Direction::Backward));
    let head = fwd.or(bwd)?;
    let mut ops = vec![head.op.clone()];
    if let (Some(_), Some(b)) = (fwd, bwd) {
        if b.step == head.step && b.rank == head.rank && b.op != head.op {
            ops.push(b.op.clone());
        }
    }
    Some((head.step.clone(), head.rank.clone(), ops))
}

/// The number of a `step<N>` or `rank<N>` label (None for `proc<PID>` and the like).
pub fn label_number(label: &str, prefix: &str) -> Option<u64> {
    label.strip_prefix(prefix)?.parse().ok()
}

/// Of `ops` (of step and rank labels `at`), those either dump does not hold with their
/// tensors, with what it lacks, in order: what a replay cannot take from these dumps.
pub(crate) fn lacking(
    dumps: crate::vocab::Sides<&crate::dump::DumpSet>,
    (step, rank): (&str, &str),
    ops: &[String],
) -> Result<Vec<(String, crate::dump::Holding)>> {
    use crate::dump::{find_rank, holdings, Holding};
    let bench = holdings(find_rank(dumps.bench, step, rank), ops)?;
    let cmp = holdings(find_rank(dumps.cmp, step, rank), ops)?;
    let worse = |a: Holding, b: Holding| match (a, b) {
        (Holding::Absent, _) | (_, Holding::Absent) => Holding::Absent,
        (Holding::NoData, _) | (_, Holding::NoData) => Holding::NoData,
        _ => Holding::Tensors,
    };
    Ok(ops
        .iter()
        .zip(bench.into_iter().zip(cmp))
        .map(|(op, (b, c))| (op.clone(), worse(b, c)))
        .filter(|(_, h)| *h != Holding::Tensors)
        .collect())
}

/// The `recapture.json` of ops a dump lacks (step and rank labels `at`), and the note the
/// summary gives of it; None when a label has no number the capture could select.
pub(crate) fn recapture_of(
    (step, rank): (&str, &str),
    ops: Vec<String>,
    reason: String,
    out: &Path,
) -> Option<(Vec<u8>, crate::schema::compare::RecaptureNote)> {
    let target = crate::recapture::OpTarget {
        step: label_number(step, "step")?,
        rank: label_number(rank, "rank")?,
        ops,
        reason,
    };
    let bytes = crate::recapture::bytes(&crate::recapture::op_config(&target));
    let note = crate::schema::compare::RecaptureNote {
        path: out.join(RECAPTURE).display().to_string(),
        step: step.to_string(),
        rank: rank.to_string(),
        ops: target.ops,
        reason: target.reason,
    };
    Some((bytes, note))
}

/// A compare's `recapture.json` (and the summary that names it) when its first divergent
/// op was dumped without its tensors. The step/rank pair's counts say it without reading
/// the dumps again, unless it holds both kinds (then the op's records are looked up).
fn compare_recapture(
    summary: Summary,
    run: &compare::CompareRun,
    out: &Path,
) -> Result<(Extras, Summary)> {
    let none = |summary| Ok((Vec::new(), summary));
    let Some((step, rank, ops)) = divergent_ops(&summary) else {
        return none(summary);
    };
    let Some(unit) = run.units.iter().find(|u| u.step == step && u.rank == rank) else {
        return none(summary);
    };
    let by = &unit.counts.compared_by;
    let tensors = by.get("tensor").copied().unwrap_or(0);
    let others: Vec<&str> = by
        .iter()
        .filter(|(k, n)| k.as_str() != "tensor" && **n > 0)
        .map(|(k, _)| match k.as_str() {
            "checksum" => "checksums",
            "statistics" => "statistics",
            "unwritten" => "unwritten tensors",
            _ => "no values",
        })
        .collect();
    let missing: Vec<String> = if others.is_empty() {
        Vec::new()
    } else if tensors == 0 {
        ops
    } else {
        let sets = crate::vocab::Sides {
            bench: crate::dump::discover(&unit.dirs.bench)?,
            cmp: crate::dump::discover(&unit.dirs.cmp)?,
        };
        let sides = crate::vocab::Sides {
            bench: &sets.bench,
            cmp: &sets.cmp,
        };
        let found = lacking(sides, (&step, &rank), &ops)?;
        found.into_iter().map(|(op, _)| op).collect()
    };
    if missing.is_empty() {
        return none(summary);
    }
    let reason = format!(
        "the dumps hold {} of {}, not the tensors a replay needs",
        others.join(" and "),
        missing.join(" and ")
    );
    let Some((bytes, note)) = recapture_of((&step, &rank), missing, reason, out) else {
        return none(summary);
    };
    let summary = Summary {
        recapture: Some(note),
        ..summary
    };
    Ok((vec![(RECAPTURE.to_string(), bytes)], summary))
}
