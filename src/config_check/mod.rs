//! `probe config-check` and `probe config-pack`: compare two environments' fingerprints.
//!
//! Data flow: `pack::load` reads either kind of pack (probe's, msprobe's
//! `config_check_pack.zip`) safely ([`archive`]) into one model → `check` compares it
//! category by category under [`rules`] → [`output`] writes `config_check.json` and the
//! terminal summary, beside `config_check.xlsx` and `config_check.html` (`html`). [`make`] builds a pack without Python.
//! Format and rules: docs/config-check.md.

/// Reading a pack zip safely, in memory.
pub mod archive;
/// Comparing two loaded packs category by category.
pub(crate) mod check;
/// `--format`: the files written; JUnit XML and Markdown for CI.
pub mod ci;
/// `config_check.html`: the differences by category, one self-contained page.
pub(crate) mod html;
/// `probe config-pack`: building a pack without Python.
pub mod make;
/// `config_check.json` and the terminal summary.
pub mod output;
/// Both kinds of config pack, read into one model.
pub mod pack;
/// The random category: seed calls, draws, generator states and when they count.
mod random;
/// Folders of per-rank packs: rank i against rank i, and each job's ranks against their peers.
pub mod ranks;
/// Ignore lists, equivalences and severities, built in or from `--config`.
pub mod rules;
/// Secrets never leave the machine: redaction by name and by value.
pub mod secrets;
mod xlsx;

use crate::error::Result;
use crate::gate::FailOn;
use crate::progress::{Count, Progress};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The categories, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Environment variables.
    Env,
    /// Installed Python distributions and platform versions (Python, OS, CPU, accelerator).
    Packages,
    /// Determinism and precision flags (cuDNN, TF32/HF32, autocast, ...).
    Determinism,
    /// Seed calls, random draws per call site and generator state hashes.
    Random,
    /// Fingerprints of the model inputs of the captured steps.
    Dataset,
    /// Fingerprints of the model weights.
    Weights,
    /// argv, the user's args, optimizer, scheduler, scaler and dataloader settings.
    Hyperparameters,
}

impl Category {
    /// Every category, in report order.
    pub(crate) const ALL: [Category; 7] = [
        Category::Env,
        Category::Packages,
        Category::Determinism,
        Category::Random,
        Category::Dataset,
        Category::Weights,
        Category::Hyperparameters,
    ];

    /// The name used in reports, rules files and `config_check.json`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Category::Env => "env",
            Category::Packages => "packages",
            Category::Determinism => "determinism",
            Category::Random => "random",
            Category::Dataset => "dataset",
            Category::Weights => "weights",
            Category::Hyperparameters => "hyperparameters",
        }
    }

    /// The name msprobe's config_check and its tutorial use (`pip` for packages).
    pub(crate) fn msprobe_name(self) -> &'static str {
        match self {
            Category::Packages => "pip",
            c => c.name(),
        }
    }

    /// Parses a category name as `Category::name` gives it (`pip` for packages too).
    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|c| c.name() == s || (s == "pip" && *c == Category::Packages))
    }
}

/// The verdict on one item, from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// No difference (numbers and statistics within tolerance).
    Pass,
    /// A difference that is normal between these two sides (NPU vs GPU).
    Expected,
    /// A difference the rules say to ignore (volatile env vars, the user's ignore list).
    Ignored,
    /// A difference worth a look; fails only with `--fail-on warning`.
    Warning,
    /// A difference that can change numerics; fails the check by default.
    Error,
}

impl Status {
    /// The lowercase name, as in `config_check.json`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Expected => "expected",
            Status::Ignored => "ignored",
            Status::Warning => "warning",
            Status::Error => "error",
        }
    }
}

/// Statistics of a tensor fingerprint, for the side-by-side columns.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct StatsPair {
    /// Benchmark max, min, mean and norm (None where not recorded).
    pub bench: [Option<f64>; 4],
    /// Comparison max, min, mean and norm.
    pub cmp: [Option<f64>; 4],
    /// Largest relative difference between the two sides' statistics.
    pub max_rel_diff: Option<f64>,
}

/// One compared item.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// The category the item belongs to.
    pub category: Category,
    /// The item's name; `A ↔ B` when paired through an equivalence.
    pub item: String,
    /// Training step (dataset and weights items only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Rank the item was recorded on, where the category has ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Value in the benchmark pack (None: absent).
    pub bench: Option<String>,
    /// Value in the comparison pack (None: absent).
    pub cmp: Option<String>,
    /// The verdict on this item.
    pub status: Status,
    /// Why the item got its status (empty when there is nothing to say).
    pub detail: String,
    /// Both sides' statistics (dataset and weights items).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<StatsPair>,
    /// Folders of packs: the ranks whose pair (bench rank i, cmp rank i) gave this same item
    /// (name, values, verdict, detail); `rank` is the first of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<u64>>,
}

/// Number of items per [`Status`].
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Counts {
    /// Items that passed.
    pub pass: usize,
    /// Items with an expected (platform) difference.
    pub expected: usize,
    /// Items whose difference the rules ignore.
    pub ignored: usize,
    /// Items with a warning.
    pub warning: usize,
    /// Items with an error.
    pub error: usize,
}

impl Counts {
    /// Counts one item of status `s`.
    pub(crate) fn add(&mut self, s: Status) {
        match s {
            Status::Pass => self.pass += 1,
            Status::Expected => self.expected += 1,
            Status::Ignored => self.ignored += 1,
            Status::Warning => self.warning += 1,
            Status::Error => self.error += 1,
        }
    }
}

/// A category's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct CategorySummary {
    /// The category.
    pub name: Category,
    /// `pass`, `warning`, `error`, or `skipped` when a side does not have the category.
    pub verdict: String,
    /// msprobe's `pass_check`: the category passes the gate (`--fail-on`); null when skipped.
    pub pass_check: Option<bool>,
    /// Its items per status.
    pub counts: Counts,
    /// What was not compared and why (one side missing, steps on one side only, ...).
    pub notes: Vec<String>,
}

/// One side's pack, as described in the report.
#[derive(Debug, Clone, Serialize)]
pub struct PackInfo {
    /// The pack file as given on the command line.
    pub path: String,
    /// `probe` or `msprobe`.
    pub format: pack::PackKind,
    /// Pack format version (None for msprobe packs).
    pub version: Option<u32>,
    /// What wrote the pack, if it says.
    pub producer: Option<String>,
    /// `cpu`, `cuda`, `npu` or `unknown`.
    pub device: String,
    /// `npu` or `gpu`: the platform side the pack is judged on.
    pub family: String,
}

impl PackInfo {
    fn of(p: &pack::Pack) -> PackInfo {
        PackInfo {
            path: p.path.display().to_string(),
            format: p.kind,
            version: p.version,
            producer: p.producer.clone(),
            device: p.device.clone(),
            family: p.family().to_string(),
        }
    }
}

/// Schema id written into `config_check.json`.
pub(crate) const SCHEMA: &str = "probe-config-check.v1";

/// The whole result (`config_check.json`, schemas/probe-config-check.v1.schema.json).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Always `SCHEMA`.
    pub schema: &'static str,
    /// Version of probe that wrote the report.
    pub probe_version: &'static str,
    /// The benchmark pack.
    pub bench: PackInfo,
    /// The comparison pack.
    pub cmp: PackInfo,
    /// One side NPU, the other not: platform differences are reported as expected.
    pub cross_platform: bool,
    /// The `--fail-on` level the exit code was computed with.
    pub fail_on: FailOn,
    /// `pass`, `warning` or `error`: the worst category verdict.
    pub verdict: String,
    /// 0, or 1 when an item reaches `fail_on`.
    pub exit_code: u8,
    /// Items per status over all categories.
    pub counts: Counts,
    /// Per-category outcome, in report order.
    pub categories: Vec<CategorySummary>,
    /// Every compared item.
    pub items: Vec<Item>,
    /// Files written (`json`, `xlsx`, `html`) → their paths.
    pub outputs: std::collections::BTreeMap<String, String>,
    /// Folders of packs: both jobs' ranks, the first-order story, each job's ranks against
    /// their peers and the rank × category matrix (None for two single packs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<ranks::RanksReport>,
}

/// Options of `probe config-check`.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Ignore lists, equivalences and severities to apply.
    pub rules: rules::Rules,
    /// Which verdict makes the exit code 1 (`error`, `warning` or `never`).
    pub fail_on: FailOn,
}

/// Reads both packs and compares them (either side may be a folder or glob of per-rank
/// packs: [`ranks`]).
pub fn run(bench: &Path, cmp: &Path, opts: &CheckOptions) -> Result<CheckReport> {
    if ranks::is_set(bench) || ranks::is_set(cmp) {
        return ranks::run(bench, cmp, opts, &Progress::hidden());
    }
    let b = pack::load(bench)?;
    let c = pack::load(cmp)?;
    Ok(check::compare(&b, &c, opts))
}

/// `probe config-check`: compare, write `config_check.json`, `config_check.xlsx` and
/// `config_check.html` into `out` (atomically, all or nothing), return the report (the
/// caller prints the terminal summary). `progress` shows the packs read and the reports
/// written (see [`crate::progress`]).
pub fn run_and_write(
    bench: &Path,
    cmp: &Path,
    out: &Path,
    opts: &CheckOptions,
    progress: &Progress,
) -> Result<CheckReport> {
    let formats = ci::DEFAULT_FORMATS.map(String::from);
    run_and_write_formats(bench, cmp, out, opts, &formats, progress)
}

/// [`run_and_write`] of the chosen `formats` (`--format`: json, xlsx, html, junit,
/// markdown).
pub fn run_and_write_formats(
    bench: &Path,
    cmp: &Path,
    out: &Path,
    opts: &CheckOptions,
    formats: &[String],
    progress: &Progress,
) -> Result<CheckReport> {
    let files = ci::files(formats)?;
    crate::atomic::prepare_output_dir(out)?;
    let stage = progress.stage("config-check", 4, Count::Items);
    let mut report = if ranks::is_set(bench) || ranks::is_set(cmp) {
        // Folders of per-rank packs (or globs): their own progress, a rank at a time.
        let r = ranks::run(bench, cmp, opts, progress)?;
        stage.inc(3);
        r
    } else {
        stage.note(format!("reading {}", bench.display()));
        let b = pack::load(bench)?;
        stage.inc(1);
        stage.note(format!("reading {}", cmp.display()));
        let c = pack::load(cmp)?;
        stage.inc(1);
        stage.note("comparing");
        let r = check::compare(&b, &c, opts);
        stage.inc(1);
        r
    };
    let names: Vec<String> = files.iter().map(|(_, n)| n.to_string()).collect();
    stage.note(format!("writing {}", names.join(", ")));
    for (format, name) in &files {
        let path: PathBuf = out.join(name);
        report
            .outputs
            .insert(format.to_string(), path.display().to_string());
    }
    // All or nothing: every file is staged, then moved into place together; the summary
    // readers look at (config_check.json, last of `files`) moves last.
    let staging = crate::atomic::Staging::new(out)?;
    for (format, name) in &files {
        ci::write(format, &report, &staging.path(name))?;
    }
    staging.commit(&names)?;
    stage.inc(1);
    Ok(report)
}
