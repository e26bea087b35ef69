//! Reader for probe's own dump format v1 (docs/format.md, schemas/probe-dump-*.v1).
//!
//! The op log is JSON Lines written as ops complete, so a crashed run leaves a last line
//! that may be cut short: that one line is skipped with a warning, any other bad line is
//! an error naming the file and line.

use super::{
    args, Collective, Direction, LayoutRef, Mode, OpIn, OpKey, OpKind, OpRec, Ops, OpsBuilder,
    RankDump, RankLoc, Role, Stats, StatsFields, TensorIn, TensorRec,
};
use crate::dtype::AnyDType;
use crate::error::{one_line, ProbeError, Result};
use crate::schema::dump::{ManifestRecord, OpRecord, StackRecord, TensorRecord};
use crate::tensor::Data;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// What compare needs from `manifest.json`.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// What the dump holds per tensor.
    pub mode: Mode,
    /// Written in overflow mode: only ops that produced NaN/Inf are recorded.
    pub overflow: bool,
    /// Compiled code ran while the run was captured: its operators are not in the dump.
    pub compiled: bool,
    /// The job's number of ranks, when the manifest says it.
    pub world_size: Option<usize>,
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
        compiled: raw.compiled == Some(true),
        world_size: match raw.world_size {
            None => None,
            Some(n) => Some(
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad(format!("world_size {n} is not a number of ranks")))?,
            ),
        },
    })
}

fn stats_of(raw: &TensorRecord) -> Option<Stats> {
    raw.stats.map(|s| {
        Stats::from(StatsFields {
            max: s.max.0,
            min: s.min.0,
            mean: s.mean.0,
            norm: s.norm.0,
            nan: s.nan,
            inf: s.inf,
        })
    })
}

/// A tensor record's fields that need checking, checked: its role and where its values are.
fn check_tensor(
    raw: &TensorRecord,
    dir: &Path,
) -> std::result::Result<(Role, Option<Data>), String> {
    let role = Role::parse(&raw.role)
        .ok_or_else(|| format!("tensor {}: unknown role {:?}", raw.name, raw.role))?;
    if super::checked_numel(&raw.shape).is_none() {
        return Err(format!(
            "tensor {}: shape {:?} has more elements than can be addressed",
            raw.name, raw.shape
        ));
    }
    layout_of(raw).map_err(|e| format!("tensor {}: {e}", raw.name))?;
    let data = match &raw.file {
        None => None,
        Some(f) => {
            // Shards live next to the op log; refuse anything that could escape the folder.
            if f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.') {
                return Err(format!("tensor {}: bad shard file name {f:?}", raw.name));
            }
            Some(Data::Safetensors {
                shard: dir.join(f),
                key: raw.name.clone(),
            })
        }
    };
    Ok((role, data))
}

/// A tensor record's layout fields (docs/format.md, "Layout"), checked.
fn layout_of(raw: &TensorRecord) -> std::result::Result<Option<LayoutRef<'_>>, String> {
    super::layout::of_record(
        &raw.shape,
        raw.stride.as_deref(),
        raw.offset,
        raw.storage,
        raw.format.as_ref().map(|f| &*f.0),
    )
}

/// An op record's fields that need checking, checked (its tensors' too).
struct Checked {
    kind: OpKind,
    direction: Direction,
    collective: Option<Collective>,
    tensors: Vec<(Role, Option<Data>)>,
}

fn check_op(raw: &OpRecord, dir: &Path) -> std::result::Result<Checked, String> {
    let kind = OpKind::parse(&raw.kind)
        .ok_or_else(|| format!("op {}: unknown kind {:?}", raw.op, raw.kind))?;
    let direction = Direction::parse(&raw.direction)
        .ok_or_else(|| format!("op {}: unknown direction {:?}", raw.op, raw.direction))?;
    let collective = match (&raw.group, raw.coll_seq) {
        (None, None) => None,
        (Some(group), Some(seq)) => Some(Collective {
            group: group.clone(),
            seq,
        }),
        (Some(_), None) => return Err(format!("op {}: group without coll_seq", raw.op)),
        (None, Some(_)) => return Err(format!("op {}: coll_seq without group", raw.op)),
    };
    let tensors = raw
        .tensors
        .iter()
        .map(|t| check_tensor(t, dir))
        .collect::<std::result::Result<_, _>>()?;
    Ok(Checked {
        kind,
        direction,
        collective,
        tensors,
    })
}

/// Appends a checked record to `ops`.
fn push_op(ops: &mut OpsBuilder, raw: &OpRecord, c: Checked) -> std::result::Result<(), String> {
    let args = raw.args.as_ref().and_then(args::canonical);
    let tensors = raw
        .tensors
        .iter()
        .zip(c.tensors)
        .map(|(t, (role, data))| TensorIn {
            name: &t.name,
            role,
            dtype: &t.dtype,
            shape: &t.shape,
            stats: stats_of(t),
            checksum: t.checksum.as_deref(),
            id: t.id,
            src: t.src,
            data,
            unwritten: t.unwritten,
            // Checked by check_tensor.
            layout: layout_of(t).ok().flatten(),
        });
    ops.push(
        OpIn {
            seq: raw.seq,
            key: &raw.op,
            kind: c.kind,
            direction: c.direction,
            module: raw.module.as_deref(),
            stack: raw.stack,
            recompute: raw.recompute,
            collective: c.collective,
            args: args.as_deref(),
        },
        tensors,
    )
}

/// The longest op-log (or stacks) line read: a longer one is a bad record naming its file
/// and line, not an attempt to hold it in memory.
pub(crate) const MAX_LINE: usize = 64 << 20;

/// Reads JSON Lines from `reader` (the file at `path`, named in errors), calling
/// `each(line_no, text)` for every complete line, and returns a warning if the last line
/// was cut short (no trailing newline and not JSON).
fn read_jsonl<R, F>(reader: R, path: &Path, each: F) -> Result<Option<String>>
where
    R: BufRead,
    F: FnMut(usize, &str) -> std::result::Result<(), String>,
{
    read_jsonl_capped(reader, path, MAX_LINE, each)
}

/// [`read_jsonl`] with a line cap of `cap` bytes (newline excluded).
fn read_jsonl_capped<R, F>(
    mut reader: R,
    path: &Path,
    cap: usize,
    mut each: F,
) -> Result<Option<String>>
where
    R: BufRead,
    F: FnMut(usize, &str) -> std::result::Result<(), String>,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut no = 0usize;
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(|e| ProbeError::io(path, e))?;
        if n == 0 {
            return Ok(None);
        }
        no += 1;
        let complete = buf.last() == Some(&b'\n');
        let len = buf.len() - usize::from(complete);
        if len > cap {
            let size = if cap.is_multiple_of(1 << 20) {
                format!("{} MiB", cap >> 20)
            } else {
                format!("{cap} bytes")
            };
            return Err(ProbeError::BadRecord {
                path: path.to_path_buf(),
                line: no,
                msg: format!("line longer than {size}: not a record probe reads"),
            });
        }
        let cut = |msg: String| {
            format!(
                "{}:{no}: last line is incomplete (crashed run?); ignored: {msg}",
                path.display()
            )
        };
        let text = match std::str::from_utf8(&buf[..len]) {
            Ok(t) => t.trim(),
            Err(e) if !complete => return Ok(Some(cut(e.to_string()))),
            Err(e) => {
                return Err(ProbeError::BadRecord {
                    path: path.to_path_buf(),
                    line: no,
                    msg: format!("not UTF-8: {e}"),
                })
            }
        };
        if text.is_empty() {
            continue;
        }
        if let Err(msg) = each(no, text) {
            if !complete {
                return Ok(Some(cut(msg)));
            }
            return Err(ProbeError::BadRecord {
                path: path.to_path_buf(),
                line: no,
                msg,
            });
        }
    }
}

/// What is on disk for a shard the op log names.
enum ShardState {
    /// The finished shard: its header locates every tensor.
    Complete,
    /// Only `<shard>.stream.tmp`, left by a crash: the data section starts at `start`
    /// (`None`: no readable provisional header) and the file holds `len` bytes.
    Stream {
        tmp: std::path::PathBuf,
        start: Option<u64>,
        len: u64,
    },
    /// Neither (the writer never got to it, or gave it up on a full disk).
    Missing,
}

fn shard_state(shard: &Path) -> ShardState {
    if shard.is_file() {
        return ShardState::Complete;
    }
    let mut tmp = shard.as_os_str().to_owned();
    tmp.push(".stream.tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let Ok(mut f) = std::fs::File::open(&tmp) else {
        return ShardState::Missing;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut head = [0u8; 8];
    let start = match f.read_exact(&mut head) {
        Ok(()) => {
            let n = u64::from_le_bytes(head);
            (n > 0).then(|| n.saturating_add(8)).filter(|&s| s <= len)
        }
        Err(_) => None,
    };
    ShardState::Stream { tmp, start, len }
}

/// What became of the tensors of one shard that is not complete.
#[derive(Default)]
struct Salvage {
    stream: bool,
    recovered: usize,
    missing: Vec<String>,
}

/// Points tensors of shards a crash (or a full disk) left unfinished or absent at what is
/// readable: data inside a `.stream.tmp` by the records' `data_offsets`, checked against
/// the file's length; the rest lose their data and are compared by statistics. One warning
/// per such shard names its tensors without data.
fn salvage_shards(
    dir: &Path,
    ops: &mut OpsBuilder,
    offsets: &HashMap<String, [u64; 2]>,
    warnings: &mut Vec<String>,
    incomplete: &mut Vec<String>,
) {
    let mut states: HashMap<std::path::PathBuf, ShardState> = HashMap::new();
    let mut salvage: BTreeMap<String, Salvage> = BTreeMap::new();
    ops.each_data(|name, dtype, numel, data| {
        let Some(Data::Safetensors { shard, .. }) = data.as_ref() else {
            return;
        };
        let state = states
            .entry(shard.clone())
            .or_insert_with(|| shard_state(shard));
        let file = shard
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let found = match state {
            ShardState::Complete => return,
            ShardState::Stream { tmp, start, len } => {
                let size = dtype
                    .known()
                    .and_then(|d| numel.checked_mul(d.size()))
                    .and_then(|n| u64::try_from(n).ok());
                match (*start, offsets.get(name), size) {
                    (Some(start), Some(&[lo, hi]), Some(size))
                        if hi >= lo
                            && hi - lo == size
                            && start.checked_add(hi).is_some_and(|end| end <= *len) =>
                    {
                        Some(Data::Stream {
                            file: tmp.clone(),
                            offset: start + lo,
                        })
                    }
                    _ => None,
                }
            }
            ShardState::Missing => None,
        };
        let s = salvage.entry(file).or_default();
        s.stream = matches!(state, ShardState::Stream { .. });
        match found {
            Some(d) => {
                *data = Some(d);
                s.recovered += 1;
            }
            None => {
                *data = None;
                s.missing.push(name.to_string());
            }
        }
    });
    for (file, s) in salvage {
        let names = |v: &[String]| {
            const SHOWN: usize = 3;
            let mut out = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
            if v.len() > SHOWN {
                out += &format!(" and {} more", v.len() - SHOWN);
            }
            out
        };
        let path = dir.join(&file);
        let what = if s.stream {
            format!(
                "{}: shard left unfinished (only {file}.stream.tmp: crashed run?); {} tensor(s) read from it",
                path.display(),
                s.recovered
            )
        } else {
            format!(
                "{}: shard missing (crashed or full-disk run?)",
                path.display()
            )
        };
        if s.missing.is_empty() {
            warnings.push(what);
            incomplete.push(format!("{file} unfinished"));
        } else {
            warnings.push(format!(
                "{what}; {} tensor(s) without data, compared by statistics: {}",
                s.missing.len(),
                names(&s.missing)
            ));
            incomplete.push(format!(
                "{}: {} tensor(s) without data",
                file,
                s.missing.len()
            ));
        }
    }
}

fn open_jsonl(path: &Path) -> Result<BufReader<std::fs::File>> {
    let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    Ok(BufReader::with_capacity(1 << 20, file))
}

/// Parses one line (Python's bare `NaN`/`Infinity` accepted) into its record.
fn parse_line(text: &str) -> std::result::Result<OpRecord, String> {
    let text = crate::json::accept_nonfinite_str(text);
    serde_json::from_str(&text).map_err(|e| one_line(e.to_string()))
}

/// Parses one line of `ops.jsonl` (Python's bare `NaN`/`Infinity` accepted) into an op
/// record; `dir` is the rank folder its shard file names are resolved against. The error
/// is one line, without the file and line number.
pub fn parse_op_record(text: &str, dir: &Path) -> std::result::Result<OpRec, String> {
    let raw = parse_line(text)?;
    let c = check_op(&raw, dir).map_err(one_line)?;
    let tensors = raw
        .tensors
        .into_iter()
        .zip(c.tensors)
        .map(|(t, (role, data))| TensorRec {
            layout: layout_of(&t).ok().flatten().map(LayoutRef::to_owned),
            stats: stats_of(&t),
            dtype: AnyDType::parse(&t.dtype),
            name: t.name.into_boxed_str(),
            role,
            shape: t.shape,
            checksum: t.checksum.map(String::into_boxed_str),
            id: t.id,
            src: t.src,
            data: data.map(Box::new),
            unwritten: t.unwritten,
        })
        .collect();
    Ok(OpRec {
        seq: raw.seq,
        key: OpKey::from_string(raw.op),
        kind: c.kind,
        direction: c.direction,
        module: raw.module.map(|m| m.into()),
        stack: raw.stack,
        recompute: raw.recompute,
        tensors,
        collective: c.collective.map(Box::new),
        args: raw.args.as_ref().and_then(args::canonical).map(Into::into),
    })
}

/// The op records of one `ops.jsonl`, checked.
#[derive(Debug, Clone)]
pub struct OpLog {
    /// Op records in file order (`seq` strictly increasing).
    pub ops: Ops,
    /// Some tensor carries a dataflow id.
    pub has_dataflow: bool,
    /// Set when a cut-short last line was skipped.
    pub warning: Option<String>,
    /// Where each tensor's bytes sit in its shard's data section, as the writer declared
    /// (what a crashed run's unfinished `.stream.tmp` is read by).
    pub offsets: HashMap<String, [u64; 2]>,
}

/// Reads an op log from `reader`: every line as [`parse_op_record`] reads it, `seq` strictly
/// increasing, tensor names unique. `path` names the file in errors ([`ProbeError::BadRecord`]
/// with its line number); `dir` is the rank folder. `load` reads `ops.jsonl` through this.
pub fn parse_op_log(reader: impl BufRead, path: &Path, dir: &Path) -> Result<OpLog> {
    let log = parse_into(reader, path, dir, OpsBuilder::default())?;
    Ok(OpLog {
        ops: log.ops.finish(),
        has_dataflow: log.has_dataflow,
        warning: log.warning,
        offsets: log.offsets,
    })
}

/// An op log read into a builder (an [`OpLog`] before its store is finished: a crashed
/// run's shards are salvaged first).
struct Building {
    ops: OpsBuilder,
    has_dataflow: bool,
    warning: Option<String>,
    offsets: HashMap<String, [u64; 2]>,
}

/// Reads an op log into `ops` (see [`parse_op_log`]).
fn parse_into(
    reader: impl BufRead,
    path: &Path,
    dir: &Path,
    mut ops: OpsBuilder,
) -> Result<Building> {
    // Tensor names seen so far, by hash: copying every name into a set held a second copy
    // of each while a million-tensor log was read. A hash met twice is checked against
    // the names themselves, so a collision is never taken for a duplicate.
    let hasher = foldhash::fast::RandomState::default();
    let mut names: foldhash::HashSet<u64> = foldhash::HashSetExt::new();
    let mut has_dataflow = false;
    let mut offsets: HashMap<String, [u64; 2]> = HashMap::new();
    let mut last_seq: Option<u64> = None;
    let warning = read_jsonl(reader, path, |_, text| {
        let raw = parse_line(text)?;
        let checked = check_op(&raw, dir).map_err(one_line)?;
        if let Some(prev) = last_seq {
            if raw.seq <= prev {
                return Err(one_line(format!(
                    "op {}: seq {} does not increase (previous {prev})",
                    raw.op, raw.seq
                )));
            }
        }
        for (i, t) in raw.tensors.iter().enumerate() {
            if !names.insert(hasher.hash_one(&*t.name)) {
                let mut earlier = ops.ops().iter().flat_map(|o| o.tensors());
                if earlier.any(|e| e.name_is(&t.name))
                    || raw.tensors[..i].iter().any(|e| e.name == t.name)
                {
                    return Err(one_line(format!("duplicate tensor name {}", t.name)));
                }
            }
            has_dataflow |= t.id.is_some();
        }
        push_op(&mut ops, &raw, checked).map_err(one_line)?;
        last_seq = Some(raw.seq);
        for t in &raw.tensors {
            if let Some(o) = t.data_offsets {
                offsets.insert(t.name.clone(), o);
            }
        }
        Ok(())
    })?;
    Ok(Building {
        ops,
        has_dataflow,
        warning,
        offsets,
    })
}

/// Reads one rank folder of a probe dump: `ops.jsonl`, and `stacks.jsonl` when present.
/// Shards a crash left unfinished or absent are salvaged (see `salvage_shards`).
pub(crate) fn load(loc: &RankLoc) -> Result<RankDump> {
    let ops_path = loc.dir.join("ops.jsonl");
    let reader = open_jsonl(&ops_path)?;
    let bytes = reader.get_ref().metadata().map_or(0, |m| m.len());
    let Building {
        mut ops,
        has_dataflow,
        warning,
        offsets,
    } = parse_into(
        reader,
        &ops_path,
        &loc.dir,
        OpsBuilder::for_log_bytes(bytes),
    )?;
    let mut warnings = Vec::new();
    let mut incomplete = Vec::new();
    if let Some(w) = warning {
        warnings.push(w);
        incomplete.push("op log cut short".to_string());
    }
    salvage_shards(&loc.dir, &mut ops, &offsets, &mut warnings, &mut incomplete);
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
        ops: ops.finish(),
        stacks,
        has_dataflow,
        warnings,
        incomplete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &[u8], cap: usize) -> (Result<Option<String>>, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ops.jsonl");
        std::fs::write(&p, text).unwrap();
        let mut seen = Vec::new();
        let r = read_jsonl_capped(open_jsonl(&p).unwrap(), &p, cap, |_, t| {
            serde_json::from_str::<serde_json::Value>(t).map_err(|e| e.to_string())?;
            seen.push(t.to_string());
            Ok(())
        });
        (r, seen)
    }

    #[test]
    fn a_line_over_the_cap_is_a_bad_record_naming_file_and_line() {
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(100));
        let text = format!("{{\"a\":1}}\n{long}\n{{\"a\":2}}\n");
        let (r, seen) = read(text.as_bytes(), 64);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("ops.jsonl:2: bad op record"), "{e}");
        assert!(e.contains("longer than 64 bytes"), "{e}");
        assert_eq!(seen.len(), 1);
        // Under the cap (the newline excluded), the same line is read.
        let (r, seen) = read(text.as_bytes(), long.len());
        assert!(r.unwrap().is_none());
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn the_default_cap_is_64_mib() {
        assert_eq!(MAX_LINE, 64 << 20);
    }

    #[test]
    fn a_cut_last_line_is_one_warning_even_mid_character() {
        let mut text = b"{\"a\":1}\n{\"a\":\"\xc3\xa9".to_vec();
        text.pop(); // half of a two-byte character
        let (r, seen) = read(&text, MAX_LINE);
        assert!(r.unwrap().unwrap().contains("last line is incomplete"));
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn a_line_that_is_not_utf8_in_the_middle_is_a_bad_record() {
        let (r, _) = read(b"{\"a\":1}\n\xff\xfe\n{\"a\":2}\n", MAX_LINE);
        let e = r.unwrap_err().to_string();
        assert!(e.contains(":2: bad op record: not UTF-8"), "{e}");
    }
}
