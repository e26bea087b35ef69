//! Sharding: one compare split over many processes (a Slurm job array, a Kubernetes Indexed
//! Job, one process per node), combined afterwards without re-reading a tensor.
//!
//! Why it works: a unit's result depends on nothing outside its step/rank pair but the
//! precision floor its rank's previous step left, and every run-wide verdict (cross-rank
//! origin, headline, counts) is computed from unit results only. So a shard takes whole
//! ranks (every step of them, in order, so the floor chain stays inside the shard), compares
//! them, and saves what it found; `probe merge` puts the units back in plan order and runs
//! the same summary and reports as an unsharded compare: the same `summary.json`.
//!
//! A shard result is a folder: `shard.json` (public, `schemas/probe-compare-shard.v1.schema.json`:
//! which run, which part, which units), `units.msgpack` (the unit summaries, MessagePack:
//! exact floats, NaN included; read back only by the same probe version), `rows.msgpack`
//! (the units' rows, one MessagePack table per unit at the places `units.msgpack` gives:
//! `probe merge` reads them one unit at a time, where they lie) and `compare.parquet` (the
//! shard's rows: the interchange for DuckDB, Spark, polars).

use super::plan::Unit;
use super::shard_files::{check_file, read_exactly, regular_file, sha256_of};
use super::tables::{self, Parked, Span, Tables};
use super::{CompareRun, UnitSummary};
use crate::atomic;
use crate::error::{ProbeError, Result};
use crate::schema::summary::{label_key, IncompleteUnit};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Which part of the step/rank pairs a process compares. Written as on the command line
/// (`"1/4"`, `"all"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Shard {
    /// Part `index` (0-based) of `count`: the ranks are split into `count` contiguous,
    /// balanced blocks in rank order (ranks 0–7 and 8–15 for 2 of 16 ranks).
    Part {
        /// 0-based part number.
        index: u32,
        /// How many parts.
        count: u32,
    },
    /// Every pair this process finds (one process per node over node-local disks: each
    /// node's dump holds its own ranks).
    All,
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "all" {
            return Ok(Shard::All);
        }
        let bad = || format!("{s:?}: write i/N (0 ≤ i < N, e.g. 0/4) or all");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard::Part { index, count })
    }
}

impl From<Shard> for String {
    fn from(s: Shard) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for Shard {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shard::Part { index, count } => write!(f, "{index}/{count}"),
            Shard::All => f.write_str("all"),
        }
    }
}

impl Shard {
    /// The plan indices of the units this shard compares, in plan order.
    pub(crate) fn take(&self, units: &[Unit]) -> Vec<usize> {
        let Shard::Part { index, count } = *self else {
            return (0..units.len()).collect();
        };
        let mut ranks: Vec<&str> = units.iter().map(|u| u.rank.as_str()).collect();
        ranks.sort_by(|a, b| label_key(a).cmp(&label_key(b)));
        ranks.dedup();
        let n = ranks.len() as u64;
        let part_of: HashMap<&str, u64> = ranks
            .iter()
            .enumerate()
            .map(|(k, r)| (*r, k as u64 * u64::from(count) / n.max(1)))
            .collect();
        (0..units.len())
            .filter(|&i| part_of.get(units[i].rank.as_str()) == Some(&u64::from(index)))
            .collect()
    }
}

/// What the plan of a run says besides its units: the same in every shard of one run over
/// a shared file system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// The benchmark path as given.
    pub bench: PathBuf,
    /// The comparison path as given.
    pub cmp: PathBuf,
    /// Every planned step/rank pair (`step0/rank3`), in plan order.
    pub units: Vec<String>,
    /// Warnings of the plan (unpaired folders, pairing by position).
    pub warnings: Vec<String>,
    /// Pairs present on one side only.
    pub unpaired: Vec<IncompleteUnit>,
    /// What the verdicts were calibrated against (`--reference`, a calibration file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<crate::compare::envelope::Source>,
    /// SHA-256 of what the plan read: both dumps' manifests and every planned step/rank
    /// folder's files (names, sizes, first and last bytes: `plan_digest`): shards of
    /// `I/N` splits of one run agree on it; a dump rewritten between them does not.
    #[serde(default)]
    pub dumps_sha256: String,
    /// The job's ranks this compare selects, by the dumps' world size (`rank0` …), when
    /// their manifests say it: a merge of `--shard all` results lists those no result holds
    /// as incomplete (a node's result not given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub job_ranks: Vec<String>,
}

/// What became of one planned unit.
#[derive(Debug)]
pub enum Outcome {
    /// Compared: what it found, and its rows.
    Compared(Box<UnitSummary>, Parked),
    /// Not compared: a side holds no op records (a crashed run).
    Skipped {
        /// The warning it gave.
        warning: String,
        /// The pair, as listed in `incomplete_units`.
        incomplete: IncompleteUnit,
    },
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Compared(u, _) => format!("{}/{}", u.step, u.rank),
            Outcome::Skipped { incomplete: i, .. } => format!("{}/{}", i.step, i.rank),
        }
    }
}

/// The units a process compared, with the frame of their run.
#[derive(Debug)]
pub struct RunPart {
    /// The plan's frame.
    pub frame: Frame,
    /// (plan index, outcome), in plan order.
    pub outcomes: Vec<(usize, Outcome)>,
}

impl RunPart {
    /// The run these units make, warnings and incomplete pairs in the order an unsharded
    /// compare gives them: the plan's, then each unit's in unit order.
    pub(crate) fn assemble(self) -> CompareRun {
        let mut warnings = self.frame.warnings;
        let mut incomplete = self.frame.unpaired;
        let mut units = Vec::new();
        let mut tables = Vec::new();
        // (a warning every unit gives, as the levels the runs were captured at, is said once)
        let mut said: HashSet<String> = warnings.iter().cloned().collect();
        for (_, outcome) in self.outcomes {
            match outcome {
                Outcome::Compared(u, t) => {
                    for w in &u.warnings {
                        if said.insert(w.clone()) {
                            warnings.push(w.clone());
                        }
                    }
                    units.push(*u);
                    tables.push(t);
                }
                Outcome::Skipped {
                    warning,
                    incomplete: i,
                } => {
                    warnings.push(warning);
                    incomplete.push(i);
                }
            }
        }
        CompareRun {
            bench: self.frame.bench,
            cmp: self.frame.cmp,
            calibration: self.frame.calibration,
            units,
            tables: Tables::from(tables),
            warnings,
            incomplete,
        }
    }
}

/// What makes two shards parts of one run: same probe, same inputs, same options. Written
/// by the caller (`app`), compared field by field at merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunIdentity {
    /// The probe version that wrote the shard (unit results are read back by the same).
    pub probe: String,
    /// Options that change results, by name (`level`, `align`, `tolerances` (SHA-256 of the
    /// file or `default`), `mappings`, `fail_on`, `max_unmatched`, `selection`).
    pub options: BTreeMap<String, String>,
}

/// SHA-256 of a file's bytes, hex: how an options file enters a [`RunIdentity`].
pub(crate) fn file_digest(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| ProbeError::io(path, e))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

/// `shard.json`: the public part of a shard result.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    shard: Shard,
    run: RunIdentity,
    frame: Frame,
    /// The units of this shard: (plan index, `step/rank`, compared).
    units: Vec<HeaderUnit>,
    /// The file holding the unit summaries, and its SHA-256.
    results: String,
    results_sha256: String,
    /// The file holding the units' rows, and its SHA-256.
    rows: String,
    rows_sha256: String,
    /// The sizes of the files, checked before any is read.
    #[serde(default)]
    results_bytes: u64,
    #[serde(default)]
    rows_bytes: u64,
    /// The shard's parquet table, its SHA-256 and size: merge copies its row groups only
    /// once the whole file matched.
    #[serde(default)]
    table: String,
    #[serde(default)]
    table_sha256: String,
    #[serde(default)]
    table_bytes: u64,
}

/// The largest `shard.json` read (it lists every planned pair: a million pairs are ~60 MB).
pub const MAX_HEADER_BYTES: u64 = 256 << 20;
/// The largest `units.msgpack` read (held in memory: the unit summaries, a few KB a pair).
pub const MAX_RESULTS_BYTES: u64 = 4 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HeaderUnit {
    index: usize,
    unit: String,
    compared: bool,
}

const FORMAT: &str = "probe-compare-shard";
const VERSION: u32 = 1;
/// The shard result's public file.
pub(crate) const HEADER_FILE: &str = "shard.json";
const RESULTS_FILE: &str = "units.msgpack";
const ROWS_FILE: &str = "rows.msgpack";

/// A unit as `units.msgpack` holds it: its summary and where its rows are in
/// `rows.msgpack`, or why it was not compared.
#[derive(Debug, Serialize, Deserialize)]
enum Stored {
    Compared {
        unit: Box<UnitSummary>,
        rows: (Span, Span),
    },
    Skipped {
        warning: String,
        incomplete: IncompleteUnit,
    },
}

/// A shard result read back.
#[derive(Debug)]
pub struct ShardResult {
    /// The folder it was read from.
    pub dir: PathBuf,
    /// Its parquet table, checked against its checksum; None when it is missing.
    pub table: Option<PathBuf>,
    /// Which part.
    pub shard: Shard,
    /// Which run.
    pub run: RunIdentity,
    /// Its units and frame.
    pub part: RunPart,
}

/// A shard result staged but for its `shard.json`, which names the parquet table's
/// checksum once it is written ([`Pending::seal`]).
#[derive(Debug)]
pub(crate) struct Pending(Header);

impl Pending {
    /// Writes `shard.json` naming every file with its checksum and size, the parquet
    /// table `table` included; returns the set's file names, `shard.json` last.
    pub(crate) fn seal(self, staging: &atomic::Staging, table: &str) -> Result<Vec<String>> {
        let mut header = self.0;
        let path = staging.path(table);
        header.table_bytes = regular_file(&path, u64::MAX)?;
        header.table_sha256 = sha256_of(&path, header.table_bytes)?;
        header.table = table.into();
        let text = serde_json::to_string_pretty(&header).map_err(|e| ProbeError::Output {
            path: staging.path(HEADER_FILE),
            msg: e.to_string(),
        })?;
        atomic::write_bytes(&staging.path(HEADER_FILE), (text + "\n").as_bytes())?;
        Ok(vec![
            table.into(),
            ROWS_FILE.into(),
            RESULTS_FILE.into(),
            HEADER_FILE.into(),
        ])
    }
}

/// Writes `part`'s units and rows as a shard result into the staging folder
/// (`rows.msgpack`, `units.msgpack`); `shard.json` follows with the parquet table
/// ([`Pending::seal`]).
pub(crate) fn stage(
    staging: &atomic::Staging,
    shard: Shard,
    run: &RunIdentity,
    part: &RunPart,
) -> Result<Pending> {
    let parked = part.outcomes.iter().filter_map(|(_, o)| match o {
        Outcome::Compared(_, t) => Some(t),
        Outcome::Skipped { .. } => None,
    });
    let (mut places, rows_sha256) = tables::write_file(parked, &staging.path(ROWS_FILE))?;
    places.reverse();
    let stored: Vec<(usize, Stored)> = part
        .outcomes
        .iter()
        .map(|(i, o)| {
            let s = match o {
                Outcome::Compared(u, _) => Stored::Compared {
                    unit: u.clone(),
                    rows: places.pop().unwrap_or_default(),
                },
                Outcome::Skipped {
                    warning,
                    incomplete,
                } => Stored::Skipped {
                    warning: warning.clone(),
                    incomplete: incomplete.clone(),
                },
            };
            (*i, s)
        })
        .collect();
    let results = rmp_serde::to_vec_named(&stored).map_err(|e| ProbeError::Output {
        path: staging.path(RESULTS_FILE),
        msg: e.to_string(),
    })?;
    atomic::write_bytes(&staging.path(RESULTS_FILE), &results)?;
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        shard,
        run: run.clone(),
        frame: part.frame.clone(),
        units: part
            .outcomes
            .iter()
            .map(|(i, o)| HeaderUnit {
                index: *i,
                unit: o.label(),
                compared: matches!(o, Outcome::Compared(..)),
            })
            .collect(),
        results: RESULTS_FILE.into(),
        results_sha256: format!("{:x}", Sha256::digest(&results)),
        rows: ROWS_FILE.into(),
        rows_sha256,
        results_bytes: results.len() as u64,
        rows_bytes: regular_file(&staging.path(ROWS_FILE), u64::MAX)?,
        table: String::new(),
        table_sha256: String::new(),
        table_bytes: 0,
    };
    Ok(Pending(header))
}

/// A shard's `shard.json` (read by [`read`] through this; the entry point of the fuzz
/// target and the mutation test): the units it lists, or why it does not read.
pub fn parse_header(bytes: &[u8]) -> std::result::Result<usize, String> {
    let h = header_of(bytes)?;
    Ok(h.units.len())
}

/// `shard.json` parsed and checked for what merge relies on: its format and version, plain
/// file names, every checksum there.
fn header_of(bytes: &[u8]) -> std::result::Result<Header, String> {
    let header: Header = serde_json::from_slice(bytes)
        .map_err(|e| crate::error::one_line(format!("{HEADER_FILE}: {e}")))?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(crate::error::one_line(format!(
            "{HEADER_FILE} is {} version {}, not {FORMAT} version {VERSION}",
            crate::config_file::printable(&header.format),
            header.version
        )));
    }
    for name in [&header.results, &header.rows, &header.table] {
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return Err(format!(
                "file name {:?} is not a plain name",
                crate::config_file::printable(name)
            ));
        }
    }
    let sums = [
        ("results_sha256", &header.results_sha256),
        ("rows_sha256", &header.rows_sha256),
        ("table_sha256", &header.table_sha256),
        ("frame.dumps_sha256", &header.frame.dumps_sha256),
    ];
    for (what, sum) in sums {
        if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "{HEADER_FILE} has no {what} (written by an older probe?)"
            ));
        }
    }
    Ok(header)
}

/// The units of a shard's `units.msgpack` (read by [`read`] through this; the entry point
/// of the mutation test): how many there are, or why they do not read.
pub fn parse_units(bytes: &[u8]) -> std::result::Result<usize, String> {
    let stored: Vec<(usize, Stored)> =
        rmp_serde::from_slice(bytes).map_err(|e| crate::error::one_line(e.to_string()))?;
    Ok(stored.len())
}

/// Reads the shard result in `dir` (the folder `probe compare --shard` wrote): every file
/// checked (a regular file of the size and SHA-256 `shard.json` gives) before it is used.
/// The parquet table may be missing (then the merge encodes the rows again), never
/// different.
pub fn read(dir: &Path) -> Result<ShardResult> {
    let bad = |msg: String| ProbeError::BadShardResult {
        path: dir.to_path_buf(),
        msg,
    };
    let header_path = dir.join(HEADER_FILE);
    let len = match std::fs::metadata(&header_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad(format!(
                "no {HEADER_FILE} (not the output folder of `probe compare --shard`)"
            )))
        }
        _ => regular_file(&header_path, MAX_HEADER_BYTES)?,
    };
    let text = read_exactly(&header_path, len)?;
    let header = header_of(&text).map_err(bad)?;
    let here = env!("CARGO_PKG_VERSION");
    if header.run.probe != here {
        return Err(bad(format!(
            "written by probe {}; this is probe {here}: merge with the version that compared",
            crate::config_file::printable(&header.run.probe)
        )));
    }
    let results_path = check_file(
        dir,
        &header.results,
        (header.results_bytes, &header.results_sha256),
        MAX_RESULTS_BYTES,
    )?;
    let results = read_exactly(&results_path, header.results_bytes)?;
    if format!("{:x}", Sha256::digest(&results)) != header.results_sha256 {
        return Err(bad(format!(
            "{} does not match the checksum in {HEADER_FILE} (changed while read)",
            header.results
        )));
    }
    let stored: Vec<(usize, Stored)> = rmp_serde::from_slice(&results)
        .map_err(|e| bad(crate::error::one_line(format!("{}: {e}", header.results))))?;
    drop(results);
    let rows_path = check_file(
        dir,
        &header.rows,
        (header.rows_bytes, &header.rows_sha256),
        u64::MAX,
    )?;
    let table = match std::fs::symlink_metadata(dir.join(&header.table)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        _ => Some(check_file(
            dir,
            &header.table,
            (header.table_bytes, &header.table_sha256),
            u64::MAX,
        )?),
    };
    let places: Vec<(Span, Span)> = stored
        .iter()
        .filter_map(|(_, s)| match s {
            Stored::Compared { rows, .. } => Some(*rows),
            Stored::Skipped { .. } => None,
        })
        .collect();
    let mut parked = Tables::in_file(&rows_path, &places).into_iter();
    let outcomes: Vec<(usize, Outcome)> = stored
        .into_iter()
        .map(|(i, s)| {
            let o = match s {
                Stored::Compared { unit, .. } => match parked.next() {
                    Some(t) => Outcome::Compared(unit, t),
                    None => unreachable!("one place per compared unit"),
                },
                Stored::Skipped {
                    warning,
                    incomplete,
                } => Outcome::Skipped {
                    warning,
                    incomplete,
                },
            };
            (i, o)
        })
        .collect();
    let listed: Vec<(usize, String)> = header
        .units
        .iter()
        .map(|u| (u.index, u.unit.clone()))
        .collect();
    let held: Vec<(usize, String)> = outcomes.iter().map(|(i, o)| (*i, o.label())).collect();
    if listed != held {
        return Err(bad(format!(
            "{HEADER_FILE} lists other units than {} holds",
            header.results
        )));
    }
    Ok(ShardResult {
        dir: dir.to_path_buf(),
        table,
        shard: header.shard,
        run: header.run,
        part: RunPart {
            frame: header.frame,
            outcomes,
        },
    })
}

/// Combines shard results into the run they are parts of, refusing shards of different
/// runs, overlapping shards and incomplete sets of parts.
pub(crate) fn combine(shards: Vec<ShardResult>) -> Result<CompareRun> {
    let Some(first) = shards.first() else {
        return Err(ProbeError::Usage(
            "probe merge needs at least one shard".into(),
        ));
    };
    for s in &shards[1..] {
        if let Some(why) = differs(&first.run, &first.part.frame, &s.run, &s.part.frame) {
            return Err(ProbeError::ShardMismatch(format!(
                "{} and {} are of different runs ({why})",
                first.dir.display(),
                s.dir.display()
            )));
        }
    }
    check_parts(&shards)?;
    check_plans(&shards)?;
    // A unit in two shards would be counted twice.
    let mut seen: HashMap<String, &Path> = HashMap::new();
    for s in &shards {
        for (_, o) in &s.part.outcomes {
            if let Some(other) = seen.insert(o.label(), &s.dir) {
                return Err(ProbeError::ShardMismatch(format!(
                    "{} is in both {} and {} (overlapping shards)",
                    o.label(),
                    other.display(),
                    s.dir.display()
                )));
            }
        }
    }
    let same_plan = shards.iter().all(|s| s.part.frame == first.part.frame);
    let node_local = shards.iter().all(|s| s.shard == Shard::All);
    let mut frame = first.part.frame.clone();
    if !same_plan {
        // Node-local dumps: each shard planned what its node holds.
        frame.units.clear();
        frame.warnings.clear();
        frame.unpaired.clear();
        for s in &shards {
            let f = &s.part.frame;
            for w in &f.warnings {
                if !frame.warnings.contains(w) {
                    frame.warnings.push(w.clone());
                }
            }
            frame.unpaired.extend(f.unpaired.iter().cloned());
        }
    }
    let mut outcomes: Vec<(usize, Outcome)> =
        shards.into_iter().flat_map(|s| s.part.outcomes).collect();
    if same_plan {
        outcomes.sort_by_key(|(i, _)| *i);
    } else {
        let key = |o: &Outcome| {
            let label = o.label();
            let (step, rank) = label.split_once('/').unwrap_or((label.as_str(), ""));
            let ((s, sn), (r, rn)) = (label_key(step), label_key(rank));
            (s, sn.to_string(), r, rn.to_string())
        };
        outcomes.sort_by_cached_key(|(_, o)| key(o));
        frame.units = outcomes.iter().map(|(_, o)| o.label()).collect();
    }
    if node_local {
        let missing = missing_ranks(&frame, &outcomes);
        if !missing.is_empty() {
            let ranks: std::collections::BTreeSet<&str> =
                missing.iter().map(|m| m.rank.as_str()).collect();
            let ranks: Vec<&str> = ranks.into_iter().collect();
            frame.warnings.push(format!(
                "no shard result holds {} of the job's {} ranks ({}{}): the --shard all \
                 result of a node was not given to the merge?",
                ranks.len(),
                frame.job_ranks.len(),
                ranks[..ranks.len().min(8)].join(", "),
                if ranks.len() > 8 { ", …" } else { "" }
            ));
            frame.unpaired.extend(missing);
        }
    }
    Ok(RunPart { frame, outcomes }.assemble())
}

/// In a merge of node-local results (`--shard all`), each step's pairs of the job's ranks
/// (by the manifests' world size, as selected) that no shard holds, compared or not: a
/// node's result not given. Said per pair as an incomplete one.
fn missing_ranks(frame: &Frame, outcomes: &[(usize, Outcome)]) -> Vec<IncompleteUnit> {
    let held: HashSet<String> = outcomes
        .iter()
        .map(|(_, o)| o.label())
        .chain(
            frame
                .unpaired
                .iter()
                .map(|i| format!("{}/{}", i.step, i.rank)),
        )
        .collect();
    let mut steps: Vec<String> = held
        .iter()
        .filter_map(|l| Some(l.split_once('/')?.0.to_string()))
        .collect();
    steps.sort_by(|a, b| label_key(a).cmp(&label_key(b)));
    steps.dedup();
    let mut out = Vec::new();
    for step in &steps {
        for rank in &frame.job_ranks {
            if !held.contains(&format!("{step}/{rank}")) {
                out.push(IncompleteUnit {
                    step: step.clone(),
                    rank: rank.clone(),
                    side: "both".into(),
                    compared: false,
                    reason: "in no shard result given to the merge (a node's --shard all \
                             result missing?)"
                        .into(),
                });
            }
        }
    }
    out
}

/// Parts of one `I/N` split planned the same run: the same pairs, of the same dump files.
/// A shard of a run with other ranks, or of a dump rewritten in between, is another run's.
fn check_plans(shards: &[ShardResult]) -> Result<()> {
    let mut parts = shards
        .iter()
        .filter(|s| matches!(s.shard, Shard::Part { .. }));
    let Some(first) = parts.next() else {
        return Ok(());
    };
    for s in parts {
        let (a, b) = (&first.part.frame, &s.part.frame);
        let why = if a.units != b.units {
            format!(
                "their plans differ: {} and {} step/rank pairs{}",
                a.units.len(),
                b.units.len(),
                a.units
                    .iter()
                    .zip(&b.units)
                    .find(|(x, y)| x != y)
                    .map(|(x, y)| format!(", {x} vs {y}"))
                    .unwrap_or_default()
            )
        } else if a.dumps_sha256 != b.dumps_sha256 {
            "the dumps' files differ (names, sizes or times): rewritten between the shards?"
                .to_string()
        } else if a != b {
            "their plans differ (warnings, unpaired folders, world size)".to_string()
        } else {
            continue;
        };
        return Err(ProbeError::ShardMismatch(format!(
            "{} and {} are of different runs ({why})",
            first.dir.display(),
            s.dir.display()
        )));
    }
    Ok(())
}

/// Why two shards are not of one run, if they are not.
fn differs(a: &RunIdentity, fa: &Frame, b: &RunIdentity, fb: &Frame) -> Option<String> {
    if fa.bench != fb.bench {
        return Some(format!(
            "benchmark {} vs {}",
            fa.bench.display(),
            fb.bench.display()
        ));
    }
    if fa.cmp != fb.cmp {
        return Some(format!(
            "comparison {} vs {}",
            fa.cmp.display(),
            fb.cmp.display()
        ));
    }
    if fa.calibration != fb.calibration {
        let show = |r: &Option<crate::compare::envelope::Source>| {
            r.as_ref()
                .map_or("(none)".to_string(), |r| r.path().display().to_string())
        };
        return Some(format!(
            "calibration {} vs {}",
            show(&fa.calibration),
            show(&fb.calibration)
        ));
    }
    if a.probe != b.probe {
        return Some(format!("probe {} vs {}", a.probe, b.probe));
    }
    let keys: std::collections::BTreeSet<&String> =
        a.options.keys().chain(b.options.keys()).collect();
    keys.into_iter().find_map(|k| {
        let (x, y) = (a.options.get(k), b.options.get(k));
        (x != y).then(|| {
            let show = |v: Option<&String>| v.map_or("(none)".to_string(), |s| s.clone());
            format!("{k} {} vs {}", show(x), show(y))
        })
    })
}

/// Parts of a split (`i/N`) must all be there, once each, all of the same N.
fn check_parts(shards: &[ShardResult]) -> Result<()> {
    let mut count = None;
    let mut have: BTreeMap<u32, &Path> = BTreeMap::new();
    for s in shards {
        let Shard::Part { index, count: n } = s.shard else {
            continue;
        };
        if *count.get_or_insert(n) != n {
            return Err(ProbeError::ShardMismatch(format!(
                "{} is part {} of a {n}-way split, the others of a {}-way split",
                s.dir.display(),
                s.shard,
                count.unwrap_or(n)
            )));
        }
        if let Some(other) = have.insert(index, &s.dir) {
            return Err(ProbeError::ShardMismatch(format!(
                "{} and {} are both shard {} (overlapping shards)",
                other.display(),
                s.dir.display(),
                s.shard
            )));
        }
    }
    if let Some(n) = count {
        if let Some(missing) = (0..n).find(|i| !have.contains_key(i)) {
            return Err(ProbeError::ShardMismatch(format!(
                "shard {missing}/{n} is missing ({} of {n} given)",
                have.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Sides;
    use crate::dump::{Format, RankLoc};

    fn unit(step: &str, rank: &str) -> Unit {
        let loc = RankLoc {
            step: step.into(),
            rank: rank.into(),
            dir: PathBuf::from("x"),
            format: Format::Probe,
        };
        Unit {
            step: step.into(),
            rank: rank.into(),
            locs: Sides::new(loc.clone(), loc),
            compiled: Sides::default(),
        }
    }

    #[test]
    fn parses_parts() {
        assert_eq!("1/4".parse(), Ok(Shard::Part { index: 1, count: 4 }));
        assert_eq!("all".parse(), Ok(Shard::All));
        for bad in ["4/4", "1/0", "1", "a/2", "-1/2", "1/2/3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad:?}");
        }
        assert_eq!(Shard::Part { index: 2, count: 3 }.to_string(), "2/3");
    }

    #[test]
    fn parts_take_whole_ranks_in_contiguous_blocks_and_cover_every_unit_once() {
        // 2 steps x 10 ranks, listed step-major as the plan lists them.
        let units: Vec<Unit> = (0..2)
            .flat_map(|s| (0..10).map(move |r| unit(&format!("step{s}"), &format!("rank{r}"))))
            .collect();
        let mut owner = vec![None; units.len()];
        for index in 0..4 {
            let part = Shard::Part { index, count: 4 };
            let taken = part.take(&units);
            let ranks: std::collections::BTreeSet<u32> = taken
                .iter()
                .map(|&i| units[i].rank[4..].parse().unwrap())
                .collect();
            // Contiguous and balanced: 10 ranks over 4 parts is 2 or 3 each.
            let (lo, hi) = (*ranks.first().unwrap(), *ranks.last().unwrap());
            assert_eq!(ranks.len() as u32, hi - lo + 1);
            assert!((2..=3).contains(&ranks.len()), "{ranks:?}");
            // Every step of a rank goes to the same part (the precision floor chain).
            assert_eq!(taken.len(), 2 * ranks.len());
            for i in taken {
                assert!(owner[i].is_none());
                owner[i] = Some(index);
            }
        }
        assert!(owner.iter().all(Option::is_some));
        // More parts than ranks: the extra parts are empty, nothing is lost.
        let few = vec![unit("step0", "rank0"), unit("step0", "rank1")];
        let total: usize = (0..4)
            .map(|index| Shard::Part { index, count: 4 }.take(&few).len())
            .sum();
        assert_eq!(total, 2);
        assert_eq!(Shard::All.take(&few), vec![0, 1]);
    }
}
