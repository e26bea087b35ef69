//! Reader for probe's own dump format v1 (docs/format.md, schemas/probe-dump-*.v1).
//!
//! The op log is JSON Lines written as ops complete, so a crashed run leaves a last line
//! that may be cut short: that one line is skipped with a warning, any other bad line is
//! an error naming the file and line.

use super::{Direction, Mode, OpKey, OpKind, OpRec, RankDump, RankLoc, Role, Stats, TensorRec};
use crate::dtype::AnyDType;
use crate::error::{one_line, ProbeError, Result};
use crate::schema::dump::{ManifestRecord, OpRecord, StackRecord, TensorRecord};
use crate::tensor::Data;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// What compare needs from `manifest.json`.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// What the dump holds per tensor.
    pub mode: Mode,
    /// Written in overflow mode: only ops that produced NaN/Inf are recorded.
    pub overflow: bool,
}

/// Reads and checks `manifest.json`.
pub fn read_manifest(path: &Path) -> Result<Manifest> {
    let bad = |msg: String| ProbeError::BadManifest {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| ProbeError::io(path, e))?;
    let text = crate::json::accept_nonfinite_str(&text);
    let raw: ManifestRecord = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
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
    Ok(Manifest {
        mode,
        overflow: raw.overflow.is_some(),
    })
}

fn convert_tensor(raw: TensorRecord, dir: &Path) -> std::result::Result<TensorRec, String> {
    let role = Role::parse(&raw.role)
        .ok_or_else(|| format!("tensor {}: unknown role {:?}", raw.name, raw.role))?;
    if super::checked_numel(&raw.shape).is_none() {
        return Err(format!(
            "tensor {}: shape {:?} has more elements than can be addressed",
            raw.name, raw.shape
        ));
    }
    let stats = raw.stats.map(|s| Stats {
        max: s.max.0,
        min: s.min.0,
        mean: s.mean.0,
        norm: s.norm.0,
        nan: s.nan,
        inf: s.inf,
    });
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
        dtype: AnyDType::parse(&raw.dtype),
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

fn convert_op(raw: OpRecord, dir: &Path) -> std::result::Result<OpRec, String> {
    let kind = OpKind::parse(&raw.kind)
        .ok_or_else(|| format!("op {}: unknown kind {:?}", raw.op, raw.kind))?;
    let direction = Direction::parse(&raw.direction)
        .ok_or_else(|| format!("op {}: unknown direction {:?}", raw.op, raw.direction))?;
    let tensors = raw
        .tensors
        .into_iter()
        .map(|t| convert_tensor(t, dir))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(OpRec {
        seq: raw.seq,
        key: OpKey::from_string(raw.op),
        kind,
        direction,
        module: raw.module,
        stack: raw.stack,
        recompute: raw.recompute,
        tensors,
    })
}

/// Reads JSON Lines from `reader` (the file at `path`, named in errors), calling
/// `each(line_no, text)` for every complete line, and returns a warning if the last line
/// was cut short (no trailing newline and not JSON).
fn read_jsonl<R, F>(mut reader: R, path: &Path, mut each: F) -> Result<Option<String>>
where
    R: BufRead,
    F: FnMut(usize, &str) -> std::result::Result<(), String>,
{
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

fn open_jsonl(path: &Path) -> Result<BufReader<std::fs::File>> {
    let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    Ok(BufReader::with_capacity(1 << 20, file))
}

/// Parses one line of `ops.jsonl` (Python's bare `NaN`/`Infinity` accepted) into an op
/// record; `dir` is the rank folder its shard file names are resolved against. The error
/// is one line, without the file and line number.
pub fn parse_op_record(text: &str, dir: &Path) -> std::result::Result<OpRec, String> {
    let text = crate::json::accept_nonfinite_str(text);
    let raw: OpRecord = serde_json::from_str(&text).map_err(|e| one_line(e.to_string()))?;
    convert_op(raw, dir).map_err(one_line)
}

/// The op records of one `ops.jsonl`, checked.
#[derive(Debug, Clone)]
pub struct OpLog {
    /// Op records in file order (`seq` strictly increasing).
    pub ops: Vec<OpRec>,
    /// Some tensor carries a dataflow id.
    pub has_dataflow: bool,
    /// Set when a cut-short last line was skipped.
    pub warning: Option<String>,
}

/// Reads an op log from `reader`: every line through [`parse_op_record`], `seq` strictly
/// increasing, tensor names unique. `path` names the file in errors ([`ProbeError::BadRecord`]
/// with its line number); `dir` is the rank folder. [`load`] reads `ops.jsonl` through this.
pub fn parse_op_log(reader: impl BufRead, path: &Path, dir: &Path) -> Result<OpLog> {
    let mut ops: Vec<OpRec> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    let mut has_dataflow = false;
    let warning = read_jsonl(reader, path, |_, text| {
        let op = parse_op_record(text, dir)?;
        if let Some(prev) = ops.last() {
            if op.seq <= prev.seq {
                return Err(one_line(format!(
                    "op {}: seq {} does not increase (previous {})",
                    op.key, op.seq, prev.seq
                )));
            }
        }
        for t in &op.tensors {
            if !names.insert(t.name.clone()) {
                return Err(one_line(format!("duplicate tensor name {}", t.name)));
            }
            has_dataflow |= t.id.is_some();
        }
        ops.push(op);
        Ok(())
    })?;
    Ok(OpLog {
        ops,
        has_dataflow,
        warning,
    })
}

/// Reads one rank folder of a probe dump: `ops.jsonl`, and `stacks.jsonl` when present.
pub fn load(loc: &RankLoc) -> Result<RankDump> {
    let ops_path = loc.dir.join("ops.jsonl");
    let log = parse_op_log(open_jsonl(&ops_path)?, &ops_path, &loc.dir)?;
    let mut warnings: Vec<String> = log.warning.into_iter().collect();
    let mut stacks = BTreeMap::new();
    let stacks_path = loc.dir.join("stacks.jsonl");
    if stacks_path.is_file() {
        let warn = read_jsonl(open_jsonl(&stacks_path)?, &stacks_path, |_, text| {
            let s: StackRecord = serde_json::from_str(text).map_err(|e| e.to_string())?;
            stacks.insert(s.id, s.frames);
            Ok(())
        })?;
        warnings.extend(warn);
    }
    Ok(RankDump {
        loc: loc.clone(),
        ops: log.ops,
        stacks,
        has_dataflow: log.has_dataflow,
        warnings,
    })
}
