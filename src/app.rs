//! The commands behind the CLI, one library call each: validate the arguments and the
//! output paths first, then do the long work, then write every output. `main.rs` only
//! parses arguments, calls one of these and maps the outcome to an exit code.

use crate::compare::{self, Progress, Tolerances};
use crate::error::{ProbeError, Result};
use crate::gate::FailOn;
use crate::report::{self, ReportWriter};
use crate::schema::summary::Summary;
use crate::{atomic, verdict};
use rayon::prelude::*;
use std::path::PathBuf;

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
}

/// Runs `probe compare`: reads both dumps, compares, writes every chosen report. Returns
/// the summary, whose `exit_code` is the gate's answer.
pub fn compare(req: &CompareRequest, progress: &(dyn Fn(Progress) + Sync)) -> Result<Summary> {
    let tolerances = match &req.config {
        Some(p) => Tolerances::from_file(p)?,
        None => Tolerances::default(),
    };
    let chosen: Vec<Box<dyn ReportWriter>> = {
        for f in &req.formats {
            if !report::writers().iter().any(|w| w.format() == f) {
                return Err(ProbeError::Usage(format!(
                    "unknown report format {f:?} (json, parquet, xlsx)"
                )));
            }
        }
        report::writers()
            .into_iter()
            .filter(|w| req.formats.iter().any(|f| f == w.format()))
            .collect()
    };
    // A thread count asks for a pool of its own; otherwise rayon's global pool (all cores).
    let pool = match req.threads {
        Some(0) => return Err(ProbeError::Usage("--threads must be at least 1".into())),
        Some(n) => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| ProbeError::Usage(e.to_string()))?,
        ),
        None => None,
    };
    atomic::prepare_output_dir(&req.out)?;
    let opts = compare::Options {
        tolerances,
        ..compare::Options::default()
    };
    let work = || {
        let run = compare::run(&req.bench, &req.cmp, &opts, progress)?;
        let mut summary = verdict::summarize(&run, req.fail_on);
        for w in &chosen {
            let path = req.out.join(w.file_name()).display().to_string();
            summary.outputs.insert(w.format().to_string(), path);
        }
        // Formats are independent files: write them in parallel, report the first failure.
        let written: Vec<Result<()>> = chosen
            .par_iter()
            .map(|w| w.write(&run, &summary, &req.out.join(w.file_name())))
            .collect();
        written.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(summary)
    };
    match pool {
        Some(p) => p.install(work),
        None => work(),
    }
}
