//! Reader for probe's own dump format v1 (docs/format.md, schemas/probe-dump-*.v1).
//!
//! The op log is JSON Lines written as ops complete, so a crashed run leaves a last line
//! that may be cut short: that one line is skipped with a warning, any other bad line is
//! an error naming the file and line.

use super::{Data, Direction, Mode, OpKind, OpRec, RankDump, RankLoc, Role, Stats, TensorRec};
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

#[derive(Deserialize)]
struct RawManifest {
    format: String,
    version: u64,
    mode: String,
}

/// What compare needs from `manifest.json`.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub mode: Mode,
}

pub fn read_manifest(path: &Path) -> Result<Manifest> {
    let bad = |msg: String| ProbeError::BadManifest {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| ProbeError::io(path, e))?;
    let raw: RawManifest = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if raw.format != "probe-dump" {
        return Err(bad(format!(
            "format is {:?}, expected \"probe-dump\"",
            raw.format
        )));
    }
    if raw.version != 1 {
        return Err(bad(format!(
            "format version {} is not supported (this probe reads version 1)",
            raw.version
        )));
    }
    let mode = Mode::parse(&raw.mode).ok_or_else(|| bad(format!("unknown mode {:?}", raw.mode)))?;
    Ok(Manifest { mode })
}

#[derive(Deserialize)]
struct RawOp {
    seq: u64,
    op: String,
    kind: String,
    direction: String,
    #[serde(default)]
    module: Option<String>,
    #[serde(default)]
    stack: Option<u64>,
    #[serde(default)]
    recompute: bool,
    tensors: Vec<RawTensor>,
}

#[derive(Deserialize)]
struct RawTensor {
    name: String,
    role: String,
    dtype: String,
    shape: Vec<usize>,
    stats: Option<RawStats>,
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    src: Option<u64>,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    checksum: Option<String>,
}

#[derive(Deserialize)]
struct RawStats {
    #[serde(default)]
    max: Stat,
    #[serde(default)]
    min: Stat,
    #[serde(default)]
    mean: Stat,
    #[serde(default)]
    norm: Stat,
    #[serde(default)]
    nan: Option<u64>,
    #[serde(default)]
    inf: Option<u64>,
}

#[derive(Deserialize)]
struct RawStack {
    id: u64,
    frames: Vec<String>,
}

/// A statistic as written: a number, null, or a string standing for a non-finite value.
/// Deserialised without building a `serde_json::Value` (100,000s of them per dump).
#[derive(Default)]
struct Stat(Option<f64>);

impl<'de> Deserialize<'de> for Stat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Stat, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Stat;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, null, \"nan\", \"inf\" or \"-inf\"")
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Stat, E> {
                Ok(Stat(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Stat, E> {
                Ok(Stat(Some(v as f64)))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Stat, E> {
                Ok(Stat(Some(v as f64)))
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<Stat, E> {
                Ok(Stat(Some(if v { 1.0 } else { 0.0 })))
            }
            fn visit_unit<E>(self) -> std::result::Result<Stat, E> {
                Ok(Stat(None))
            }
            fn visit_none<E>(self) -> std::result::Result<Stat, E> {
                Ok(Stat(None))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Stat, E> {
                stat_from_str(s).map(|v| Stat(Some(v))).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A statistic written as a string: the non-finite values JSON cannot hold, or a number.
fn stat_from_str(s: &str) -> std::result::Result<f64, String> {
    match s.to_ascii_lowercase().as_str() {
        "nan" | "-nan" => Ok(f64::NAN),
        "inf" | "+inf" | "infinity" => Ok(f64::INFINITY),
        "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
        other => other
            .parse::<f64>()
            .map_err(|_| format!("statistic {s:?} is not a number")),
    }
}

fn convert_tensor(raw: RawTensor, dir: &Path) -> std::result::Result<TensorRec, String> {
    let role = match raw.role.as_str() {
        "input" => Role::Input,
        "output" => Role::Output,
        "parameter" => Role::Parameter,
        r => return Err(format!("tensor {}: unknown role {r:?}", raw.name)),
    };
    let stats = match raw.stats {
        None => None,
        Some(s) => Some(Stats {
            max: s.max.0,
            min: s.min.0,
            mean: s.mean.0,
            norm: s.norm.0,
            nan: s.nan,
            inf: s.inf,
        }),
    };
    let data = match raw.file {
        None => Data::None,
        Some(f) => {
            // Shards live next to the op log; refuse anything that could escape the folder.
            if f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.') {
                return Err(format!("tensor {}: bad shard file name {f:?}", raw.name));
            }
            Data::Safetensors {
                shard: dir.join(f),
                key: raw.name.clone(),
            }
        }
    };
    Ok(TensorRec {
        dtype: DType::parse(&raw.dtype),
        dtype_name: raw.dtype,
        name: raw.name,
        role,
        shape: raw.shape,
        stats,
        checksum: raw.checksum,
        id: raw.id,
        src: raw.src,
        data,
    })
}

fn convert_op(raw: RawOp, dir: &Path) -> std::result::Result<OpRec, String> {
    let kind = match raw.kind.as_str() {
        "api" => OpKind::Api,
        "module" => OpKind::Module,
        "parameters_grad" => OpKind::ParametersGrad,
        k => return Err(format!("op {}: unknown kind {k:?}", raw.op)),
    };
    let direction = match raw.direction.as_str() {
        "forward" => Direction::Forward,
        "backward" => Direction::Backward,
        d => return Err(format!("op {}: unknown direction {d:?}", raw.op)),
    };
    let tensors = raw
        .tensors
        .into_iter()
        .map(|t| convert_tensor(t, dir))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(OpRec {
        seq: raw.seq,
        key: raw.op,
        kind,
        direction,
        module: raw.module,
        stack: raw.stack,
        recompute: raw.recompute,
        tensors,
    })
}

/// Reads a JSON Lines file, calling `each(line_no, text)` for every complete line, and
/// returns a warning if the last line was cut short (no trailing newline and not JSON).
fn read_jsonl<F>(path: &Path, mut each: F) -> Result<Option<String>>
where
    F: FnMut(usize, &str) -> std::result::Result<(), String>,
{
    let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = String::new();
    let mut no = 0usize;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| ProbeError::io(path, e))?;
        if n == 0 {
            return Ok(None);
        }
        no += 1;
        let complete = line.ends_with('\n');
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Err(msg) = each(no, text) {
            if !complete {
                return Ok(Some(format!(
                    "{}:{no}: last line is incomplete (crashed run?); ignored: {msg}",
                    path.display()
                )));
            }
            return Err(ProbeError::BadRecord {
                path: path.to_path_buf(),
                line: no,
                msg,
            });
        }
    }
}

pub fn load(loc: &RankLoc) -> Result<RankDump> {
    let ops_path = loc.dir.join("ops.jsonl");
    let mut ops: Vec<OpRec> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    let mut warnings = Vec::new();
    let mut has_dataflow = false;
    let warn = read_jsonl(&ops_path, |_, text| {
        let raw: RawOp = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let op = convert_op(raw, &loc.dir)?;
        if let Some(prev) = ops.last() {
            if op.seq <= prev.seq {
                return Err(format!(
                    "op {}: seq {} does not increase (previous {})",
                    op.key, op.seq, prev.seq
                ));
            }
        }
        for t in &op.tensors {
            if !names.insert(t.name.clone()) {
                return Err(format!("duplicate tensor name {}", t.name));
            }
            has_dataflow |= t.id.is_some();
        }
        ops.push(op);
        Ok(())
    })?;
    warnings.extend(warn);
    let mut stacks = BTreeMap::new();
    let stacks_path = loc.dir.join("stacks.jsonl");
    if stacks_path.is_file() {
        let warn = read_jsonl(&stacks_path, |_, text| {
            let s: RawStack = serde_json::from_str(text).map_err(|e| e.to_string())?;
            stacks.insert(s.id, s.frames);
            Ok(())
        })?;
        warnings.extend(warn);
    }
    Ok(RankDump {
        loc: loc.clone(),
        ops,
        stacks,
        has_dataflow,
        warnings,
    })
}
