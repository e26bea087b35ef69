//! Dumps: the data model both formats are read into, and discovery of the
//! `step<S>/rank<R>` folders under whatever path the user gave.
//!
//! A dump is read one rank at a time ([`load_rank`]); op records are small and held in
//! memory, tensor data never is (see [`crate::tensor`]).

pub mod msprobe;
pub mod npy;
mod probe_format;
pub mod pt;

use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use probe_format::read_manifest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Forward,
    Backward,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Input,
    Output,
    Parameter,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::Parameter => "parameter",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Api,
    Module,
    ParametersGrad,
}

/// What a dump holds per tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Statistics,
    Tensor,
    Checksum,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "statistics" => Some(Mode::Statistics),
            "tensor" => Some(Mode::Tensor),
            "checksum" | "md5" => Some(Mode::Checksum),
            _ => None,
        }
    }
}

/// Summary statistics recorded at capture time. Non-finite values are kept as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub max: Option<f64>,
    pub min: Option<f64>,
    pub mean: Option<f64>,
    pub norm: Option<f64>,
    pub nan: Option<u64>,
    pub inf: Option<u64>,
}

impl Stats {
    /// Non-finite element count when known: the recorded counts, or a non-finite statistic.
    pub fn nonfinite(&self) -> Option<u64> {
        match (self.nan, self.inf) {
            (Some(a), Some(b)) => Some(a + b),
            _ => {
                let any = [self.max, self.min, self.mean, self.norm]
                    .iter()
                    .flatten()
                    .any(|v| !v.is_finite());
                any.then_some(1)
            }
        }
    }
}

/// Where a tensor's values can be read.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    None,
    /// A key in a safetensors shard.
    Safetensors {
        shard: PathBuf,
        key: String,
    },
    /// A `torch.save` file holding one tensor (msprobe, PyTorch).
    Pt(PathBuf),
    /// A `.npy` file (msprobe, MindSpore).
    Npy(PathBuf),
}

#[derive(Debug, Clone)]
pub struct TensorRec {
    pub name: String,
    pub role: Role,
    /// The dtype as written in the dump (kept for reports when it is not one we decode).
    pub dtype_name: String,
    pub dtype: Option<DType>,
    pub shape: Vec<usize>,
    pub stats: Option<Stats>,
    pub checksum: Option<String>,
    pub id: Option<u64>,
    pub src: Option<u64>,
    pub data: Data,
}

impl TensorRec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

#[derive(Debug, Clone)]
pub struct OpRec {
    pub seq: u64,
    pub key: String,
    pub kind: OpKind,
    pub direction: Direction,
    pub module: Option<String>,
    pub stack: Option<u64>,
    pub recompute: bool,
    pub tensors: Vec<TensorRec>,
}

/// One `step<S>/rank<R>` of one side, fully read except tensor data.
#[derive(Debug, Clone)]
pub struct RankDump {
    pub loc: RankLoc,
    pub ops: Vec<OpRec>,
    pub stacks: BTreeMap<u64, Vec<String>>,
    /// True when producers recorded dataflow ids, so a missing `src` means "not produced
    /// by a captured op" for sure rather than "unknown".
    pub has_dataflow: bool,
    /// Non-fatal problems met while reading (a truncated last line, ...).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Probe,
    Msprobe,
}

/// Where one rank of one step lives.
#[derive(Debug, Clone)]
pub struct RankLoc {
    pub step: String,
    pub rank: String,
    pub dir: PathBuf,
    pub format: Format,
}

/// A side of the compare as found on disk.
#[derive(Debug, Clone)]
pub struct DumpSet {
    pub path: PathBuf,
    pub mode: Option<Mode>,
    pub ranks: Vec<RankLoc>,
}

fn rank_format(dir: &Path) -> Option<Format> {
    if dir.join("ops.jsonl").is_file() {
        Some(Format::Probe)
    } else if dir.join("dump.json").is_file() {
        Some(Format::Msprobe)
    } else {
        None
    }
}

/// Sort key for `step12`, `rank3`, `proc456`: the number, then the name.
fn label_key(name: &str) -> (u64, String) {
    let digits: String = name.chars().filter(|c| c.is_ascii_digit()).collect();
    (digits.parse().unwrap_or(u64::MAX), name.to_string())
}

fn subdirs(dir: &Path, prefixes: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| ProbeError::io(dir, e))?;
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| ProbeError::io(dir, e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        let is_match = prefixes.iter().any(|p| {
            name.strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()))
        });
        if is_match && ent.path().is_dir() {
            out.push((name, ent.path()));
        }
    }
    out.sort_by_key(|(n, _)| label_key(n));
    Ok(out)
}

fn dir_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn ranks_of_step(step: &str, dir: &Path) -> Result<Vec<RankLoc>> {
    let mut out = Vec::new();
    for (rank, rdir) in subdirs(dir, &["rank", "proc"])? {
        if let Some(format) = rank_format(&rdir) {
            out.push(RankLoc {
                step: step.to_string(),
                rank,
                dir: rdir,
                format,
            });
        }
    }
    // msprobe writes dump.json straight into stepN/ when it runs without rank folders.
    if out.is_empty() {
        if let Some(format) = rank_format(dir) {
            out.push(RankLoc {
                step: step.to_string(),
                rank: "rank0".into(),
                dir: dir.to_path_buf(),
                format,
            });
        }
    }
    Ok(out)
}

/// Finds every rank under a dump root, a `step<S>` folder or a single rank folder.
pub fn discover(path: &Path) -> Result<DumpSet> {
    if !path.exists() {
        return Err(ProbeError::NotFound(path.to_path_buf()));
    }
    if !path.is_dir() {
        return Err(ProbeError::NotADump(path.to_path_buf()));
    }
    let mut ranks = Vec::new();
    let manifest_dir;
    if let Some(format) = rank_format(path) {
        let parent = path.parent();
        let step = parent.map(dir_name).filter(|n| n.starts_with("step"));
        ranks.push(RankLoc {
            step: step.clone().unwrap_or_else(|| "step0".into()),
            rank: Some(dir_name(path))
                .filter(|n| n.starts_with("rank") || n.starts_with("proc"))
                .unwrap_or_else(|| "rank0".into()),
            dir: path.to_path_buf(),
            format,
        });
        manifest_dir = parent.and_then(|p| p.parent());
    } else {
        let steps = subdirs(path, &["step"])?;
        if steps.is_empty() {
            let name = dir_name(path);
            ranks = ranks_of_step(
                if name.starts_with("step") {
                    &name
                } else {
                    "step0"
                },
                path,
            )?;
            manifest_dir = path.parent();
        } else {
            for (step, sdir) in steps {
                ranks.extend(ranks_of_step(&step, &sdir)?);
            }
            manifest_dir = Some(path);
        }
    }
    if ranks.is_empty() {
        return Err(ProbeError::NotADump(path.to_path_buf()));
    }
    let mut mode = None;
    if let Some(d) = manifest_dir {
        let m = d.join("manifest.json");
        if m.is_file() {
            mode = Some(read_manifest(&m)?.mode);
        }
    }
    Ok(DumpSet {
        path: path.to_path_buf(),
        mode,
        ranks,
    })
}

/// Reads one rank's op log and stacks.
pub fn load_rank(loc: &RankLoc) -> Result<RankDump> {
    match loc.format {
        Format::Probe => probe_format::load(loc),
        Format::Msprobe => msprobe::load(loc),
    }
}

/// Match keys: backward calls renumbered by occurrence per op, so that recomputation
/// (activation checkpointing) or a different number of forward calls does not shift them.
///
/// Returns, per op, the key used for matching (forward keys are unchanged).
pub fn match_keys(ops: &[OpRec]) -> Vec<String> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    ops.iter()
        .map(|op| {
            if op.direction != Direction::Backward || op.kind == OpKind::ParametersGrad {
                return op.key.clone();
            }
            let parts: Vec<&str> = op.key.split('.').collect();
            let n = parts.len();
            // API: Type.api.CALL.backward; module: Module.path.Class.backward.CALL
            let (base, module_style) = if n >= 3
                && parts[n - 2] == "backward"
                && parts[n - 1].chars().all(|c| c.is_ascii_digit())
            {
                (parts[..n - 2].join("."), true)
            } else if n >= 3
                && parts[n - 1] == "backward"
                && parts[n - 2].chars().all(|c| c.is_ascii_digit())
            {
                (parts[..n - 2].join("."), false)
            } else {
                return op.key.clone();
            };
            let k = seen.entry(base.clone()).or_insert(0);
            let key = if module_style {
                format!("{base}.backward.{k}")
            } else {
                format!("{base}.{k}.backward")
            };
            *k += 1;
            key
        })
        .collect()
}

/// A tensor's name under its op's match key.
pub fn match_name(op: &OpRec, match_key: &str, t: &TensorRec) -> String {
    if match_key == op.key {
        return t.name.clone();
    }
    match t.name.strip_prefix(op.key.as_str()) {
        Some(rest) => format!("{match_key}{rest}"),
        None => t.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, dir: Direction) -> OpRec {
        OpRec {
            seq: 0,
            key: key.into(),
            kind: OpKind::Api,
            direction: dir,
            module: None,
            stack: None,
            recompute: false,
            tensors: vec![],
        }
    }

    #[test]
    fn backward_keys_renumbered_by_occurrence() {
        let ops = vec![
            op("Functional.gelu.3.forward", Direction::Forward),
            op("Functional.gelu.3.backward", Direction::Backward),
            op("Functional.gelu.1.backward", Direction::Backward),
            op("Module.fc.Linear.backward.4", Direction::Backward),
            op("Module.fc.Linear.backward.7", Direction::Backward),
        ];
        assert_eq!(
            match_keys(&ops),
            vec![
                "Functional.gelu.3.forward",
                "Functional.gelu.0.backward",
                "Functional.gelu.1.backward",
                "Module.fc.Linear.backward.0",
                "Module.fc.Linear.backward.1"
            ]
        );
    }
}
