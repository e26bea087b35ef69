//! `probe config-check` and `probe config-pack`: compare two environments' fingerprints.
//!
//! Data flow: [`pack::load`] reads either kind of pack (probe's, msprobe's
//! `config_check_pack.zip`) safely ([`archive`]) into one model → [`check`] compares it
//! category by category under [`rules`] → [`output`] writes `config_check.json`, the
//! terminal summary and `config_check.xlsx`. [`make`] builds a pack without Python.
//! Format and rules: docs/config-check.md.

pub mod archive;
pub mod check;
pub mod make;
pub mod output;
pub mod pack;
pub mod rules;
mod xlsx;

use crate::error::Result;
use crate::report::FailOn;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The categories, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    Env,
    Packages,
    Determinism,
    Random,
    Dataset,
    Weights,
    Hyperparameters,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Env,
        Category::Packages,
        Category::Determinism,
        Category::Random,
        Category::Dataset,
        Category::Weights,
        Category::Hyperparameters,
    ];

    pub fn name(self) -> &'static str {
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
    Pass,
    /// A difference that is normal between these two sides (NPU vs GPU).
    Expected,
    /// A difference the rules say to ignore (volatile env vars, the user's ignore list).
    Ignored,
    Warning,
    Error,
}

impl Status {
    pub fn name(self) -> &'static str {
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
    pub bench: [Option<f64>; 4],
    pub cmp: [Option<f64>; 4],
    pub max_rel_diff: Option<f64>,
}

/// One compared item.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub category: Category,
    /// The item's name; `A ↔ B` when paired through an equivalence.
    pub item: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Value in the benchmark pack (None: absent).
    pub bench: Option<String>,
    /// Value in the comparison pack (None: absent).
    pub cmp: Option<String>,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<StatsPair>,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Counts {
    pub pass: usize,
    pub expected: usize,
    pub ignored: usize,
    pub warning: usize,
    pub error: usize,
}

impl Counts {
    pub fn add(&mut self, s: Status) {
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
    pub name: Category,
    /// `pass`, `warning`, `error`, or `skipped` when a side does not have the category.
    pub verdict: String,
    pub counts: Counts,
    pub notes: Vec<String>,
}

/// One side's pack, as described in the report.
#[derive(Debug, Clone, Serialize)]
pub struct PackInfo {
    pub path: String,
    pub format: pack::PackKind,
    pub version: Option<u32>,
    pub producer: Option<String>,
    pub device: String,
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

pub const SCHEMA: &str = "probe-config-check.v1";

/// The whole result (`config_check.json`, schemas/probe-config-check.v1.schema.json).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub schema: &'static str,
    pub probe_version: &'static str,
    pub bench: PackInfo,
    pub cmp: PackInfo,
    pub cross_platform: bool,
    pub fail_on: FailOn,
    /// `pass`, `warning` or `error`: the worst category verdict.
    pub verdict: String,
    pub exit_code: u8,
    pub counts: Counts,
    pub categories: Vec<CategorySummary>,
    pub items: Vec<Item>,
    pub outputs: std::collections::BTreeMap<String, String>,
}

/// Options of `probe config-check`.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub rules: rules::Rules,
    pub fail_on: FailOn,
}

/// Reads both packs and compares them.
pub fn run(bench: &Path, cmp: &Path, opts: &CheckOptions) -> Result<CheckReport> {
    let b = pack::load(bench)?;
    let c = pack::load(cmp)?;
    Ok(check::compare(&b, &c, opts))
}

/// `probe config-check`: compare, write `config_check.json` and `config_check.xlsx` into
/// `out` (atomically), return the report (the caller prints the terminal summary).
pub fn run_and_write(
    bench: &Path,
    cmp: &Path,
    out: &Path,
    opts: &CheckOptions,
) -> Result<CheckReport> {
    crate::atomic::prepare_output_dir(out)?;
    let mut report = run(bench, cmp, opts)?;
    let json_path: PathBuf = out.join("config_check.json");
    let xlsx_path: PathBuf = out.join("config_check.xlsx");
    report
        .outputs
        .insert("json".into(), json_path.display().to_string());
    report
        .outputs
        .insert("xlsx".into(), xlsx_path.display().to_string());
    xlsx::write(&report, &xlsx_path)?;
    output::write_json(&report, &json_path)?;
    Ok(report)
}
