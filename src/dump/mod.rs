//! Dumps: the data model both formats are read into, and discovery of the
//! `step<S>/rank<R>` folders under whatever path the user gave.
//!
//! A dump is read one rank at a time ([`load_rank`]); op records are small and held in
//! memory, tensor data never is (see [`crate::tensor`]).

pub(crate) mod args;
mod holding;
mod layout;
pub mod msprobe;
mod probe_format;
mod select;
mod store;
pub(crate) mod training;

use crate::dtype::AnyDType;
use crate::error::{ProbeError, Result};
pub use crate::op_key::{Direction, OpKey, OpKind, Role};
use crate::schema::summary::label_key;
use crate::tensor::Data;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use holding::{find_rank, holdings, Holding};
pub use layout::{Layout, LayoutRef};
pub use probe_format::{parse_op_log, parse_op_record, read_manifest, OpLog};
pub use select::{Numbers, Selection};
pub use store::{Op, OpIn, Ops, OpsBuilder, Tensor, TensorIn};

/// What a dump holds per tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Statistics per tensor.
    Statistics,
    /// Full tensors.
    Tensor,
    /// Checksums (with statistics where present).
    Checksum,
}

impl Mode {
    /// Parses a manifest's `mode` (msprobe's `md5` counts as checksum).
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
///
/// Packed: every tensor record, and both sides of every row, carry one, and six
/// `Option`s took 96 bytes where the values and a presence mask take 56 (`Option<Stats>`
/// too, the mask's set high bit being the niche). On disk (rows files, shard results) it is
/// the record of six optional numbers it always was ([`StatsFields`]).
#[derive(Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "StatsFields", into = "StatsFields")]
pub struct Stats {
    /// max, min, mean, norm.
    values: [f64; 4],
    /// NaN count, Inf count.
    counts: [u64; 2],
    /// Bit i set: field i recorded (values first, then counts); the high bit always set.
    present: std::num::NonZeroU8,
}

/// [`Stats`] as six optional fields: how they are written and read.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StatsFields {
    /// Largest element (bool: any).
    pub max: Option<f64>,
    /// Smallest element (bool: all).
    pub min: Option<f64>,
    /// Mean.
    pub mean: Option<f64>,
    /// L2 norm.
    pub norm: Option<f64>,
    /// NaN count, when recorded.
    pub nan: Option<u64>,
    /// Infinity count, when recorded.
    pub inf: Option<u64>,
}

impl From<StatsFields> for Stats {
    fn from(r: StatsFields) -> Stats {
        let mut present = 0x80u8;
        let mut values = [0.0; 4];
        for (i, v) in [r.max, r.min, r.mean, r.norm].into_iter().enumerate() {
            if let Some(v) = v {
                values[i] = v;
                present |= 1 << i;
            }
        }
        let mut counts = [0; 2];
        for (i, c) in [r.nan, r.inf].into_iter().enumerate() {
            if let Some(c) = c {
                counts[i] = c;
                present |= 1 << (4 + i);
            }
        }
        Stats {
            values,
            counts,
            present: std::num::NonZeroU8::new(present).unwrap_or(std::num::NonZeroU8::MIN),
        }
    }
}

impl From<Stats> for StatsFields {
    fn from(s: Stats) -> StatsFields {
        StatsFields {
            max: s.max(),
            min: s.min(),
            mean: s.mean(),
            norm: s.norm(),
            nan: s.nan(),
            inf: s.inf(),
        }
    }
}

impl Default for Stats {
    /// Nothing recorded.
    fn default() -> Stats {
        StatsFields::default().into()
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        StatsFields::from(*self).fmt(f)
    }
}

impl Stats {
    /// The statistics of the tensor divided by `s` (a loss scale: a power of two, so the
    /// division is exact): max, min, mean and norm; NaN/Inf counts unchanged.
    pub(crate) fn divided(self, s: f64) -> Stats {
        let mut out = self;
        for v in &mut out.values {
            *v /= s;
        }
        out
    }

    fn value(&self, i: usize) -> Option<f64> {
        (self.present.get() & (1 << i) != 0).then_some(self.values[i])
    }

    /// Max, min, mean and norm bit for bit, when all four are recorded and finite: what
    /// tells a run's tensor from another of the same run with other values, for matching a
    /// value a step wrote with the one its next step reads.
    pub(crate) fn fingerprint(&self) -> Option<[u64; 4]> {
        let mut out = [0; 4];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.value(i).filter(|v| v.is_finite())?.to_bits();
        }
        Some(out)
    }

    fn count(&self, i: usize) -> Option<u64> {
        (self.present.get() & (1 << (4 + i)) != 0).then_some(self.counts[i])
    }

    /// Largest element (bool: any).
    pub fn max(&self) -> Option<f64> {
        self.value(0)
    }

    /// Smallest element (bool: all).
    pub fn min(&self) -> Option<f64> {
        self.value(1)
    }

    /// Mean.
    pub fn mean(&self) -> Option<f64> {
        self.value(2)
    }

    /// L2 norm.
    pub fn norm(&self) -> Option<f64> {
        self.value(3)
    }

    /// NaN count, when recorded.
    pub(crate) fn nan(&self) -> Option<u64> {
        self.count(0)
    }

    /// Infinity count, when recorded.
    pub(crate) fn inf(&self) -> Option<u64> {
        self.count(1)
    }

    /// Non-finite element count when known: the recorded counts, or a non-finite statistic
    /// other than an overflowed mean or norm ([`Stats::comparable_norm`]).
    pub(crate) fn nonfinite(&self) -> Option<u64> {
        match (self.nan(), self.inf()) {
            (Some(a), Some(b)) => Some(a + b),
            _ => {
                let any = [
                    self.max(),
                    self.min(),
                    self.comparable_mean(),
                    self.comparable_norm(),
                ]
                .iter()
                .flatten()
                .any(|v| !v.is_finite());
                any.then_some(1)
            }
        }
    }

    /// The mean, unless it is not finite while the elements are: a float32 sum that
    /// overflowed on finite values (past 3.4e38), which says nothing of the tensor.
    pub(crate) fn comparable_mean(&self) -> Option<f64> {
        self.comparable(self.mean())
    }

    /// The norm, unless it is not finite while the elements are: a float32 sum of squares
    /// that overflowed on finite values (|x| past ~1.8e19), as msprobe's norm and PyTorch's
    /// float32 reductions on an accelerator give it. Such a norm is not compared.
    pub(crate) fn comparable_norm(&self) -> Option<f64> {
        self.comparable(self.norm())
    }

    /// `v` (a mean or norm) unless it is not finite while max and min are recorded and
    /// finite. NaN and ±Inf elements both reach max and min (PyTorch's max of a tensor
    /// holding NaN is NaN), so such a tensor holds neither: `v` only overflowed.
    fn comparable(&self, v: Option<f64>) -> Option<f64> {
        let finite_extremes = || matches!((self.max(), self.min()), (Some(a), Some(b)) if a.is_finite() && b.is_finite());
        v.filter(|v| v.is_finite() || !finite_extremes())
    }
}

/// One tensor of an op record, as either format describes it: the owned form a test or a
/// tool builds records in ([`Ops`] holds them compactly; `Tensor::to_rec` gives one back).
#[derive(Debug, Clone)]
pub struct TensorRec {
    /// Flattened name: op key + slot.
    pub name: Box<str>,
    /// Input, output or parameter.
    pub role: Role,
    /// The element type, parsed once.
    pub dtype: AnyDType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Statistics recorded at capture time.
    pub stats: Option<Stats>,
    /// A checksum of the raw bytes (`crc32:<hex>`, `md5:<hex>`).
    pub checksum: Option<Box<str>>,
    /// Dataflow id of an output.
    pub id: Option<u64>,
    /// Dataflow id of the captured output an input came from.
    pub src: Option<u64>,
    /// Where the values are, if dumped (boxed: statistics and checksum dumps have none,
    /// and a million records would each carry the room).
    pub data: Option<Box<Data>>,
    /// Read from memory nothing had written since it was allocated: leftover bytes.
    pub unwritten: bool,
    /// How it lay in memory, where the dump says (docs/format.md, "Layout").
    pub layout: Option<Layout>,
}

impl TensorRec {}

/// The product of `shape`, `None` when it overflows `usize`.
pub(crate) fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Module paths each held once while a rank is read: every op of a module shares its path
/// ([`OpRec::module`]).
#[derive(Debug, Default)]
pub(crate) struct ModulePaths(foldhash::HashSet<Arc<str>>);

impl ModulePaths {
    /// The shared copy of `path`.
    pub fn get(&mut self, path: &str) -> Arc<str> {
        if let Some(known) = self.0.get(path) {
            return known.clone();
        }
        let new: Arc<str> = path.into();
        self.0.insert(new.clone());
        new
    }
}

/// One op call of a rank's op log, owned (see [`TensorRec`]).
#[derive(Debug, Clone)]
pub struct OpRec {
    /// Execution order within the rank.
    pub seq: u64,
    /// The op key, parsed once.
    pub key: OpKey,
    /// API, module or parameter-gradient record.
    pub kind: OpKind,
    /// Forward or backward.
    pub direction: Direction,
    /// The module path the call happened in, when known: shared by every op of the same
    /// module (a rank's op log names a few thousand modules over a million ops).
    pub module: Option<Arc<str>>,
    /// Id of the call stack.
    pub stack: Option<u64>,
    /// A recomputation (activation checkpointing).
    pub recompute: bool,
    /// The op's tensors, in slot order.
    pub tensors: Vec<TensorRec>,
    /// Set on a collective (`Distributed.*`) whose record names its group and sequence
    /// (boxed: most ops are not collectives, and a million-op log would carry the room).
    pub collective: Option<Box<Collective>>,
    /// Its non-tensor arguments as canonical JSON (`args`), when recorded.
    pub args: Option<Box<str>>,
}

impl OpRec {
    /// The record of a call of `key` (kind and direction as the key says) holding
    /// `tensors`, without module, stack or collective: how tests and tools start one.
    pub fn new(seq: u64, key: &str, tensors: Vec<TensorRec>) -> OpRec {
        let key = OpKey::parse(key);
        OpRec {
            seq,
            kind: key.kind(),
            direction: key.direction(),
            key,
            module: None,
            stack: None,
            recompute: false,
            tensors,
            collective: None,
            args: None,
        }
    }
}

/// Which collective call an op record is, the same on every rank of its group.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Collective {
    /// The global ranks of the process group, as recorded.
    pub group: Vec<u32>,
    /// The collective's sequence number within the group and step.
    pub seq: u64,
}

/// One `step<S>/rank<R>` of one side, fully read except tensor data.
#[derive(Debug, Clone)]
pub struct RankDump {
    /// Where it was read from.
    pub loc: RankLoc,
    /// Op records in execution order, held compactly.
    pub ops: Ops,
    /// Call stacks by id (outermost frame first).
    pub stacks: BTreeMap<u64, Vec<String>>,
    /// True when producers recorded dataflow ids, so a missing `src` means "not produced
    /// by a captured op" for sure rather than "unknown".
    pub has_dataflow: bool,
    /// Non-fatal problems met while reading (a truncated last line, ...).
    pub warnings: Vec<String>,
    /// Why this rank is incomplete (a crashed or full-disk run: its op log cut short,
    /// tensor data missing); empty for a complete one. Each entry is one short reason.
    pub incomplete: Vec<String>,
}

/// The dump format of a rank folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// probe's own (`ops.jsonl`, safetensors shards).
    Probe,
    /// msprobe's (`dump.json`, `.pt`/`.npy` files).
    Msprobe,
}

/// Where one rank of one step lives.
#[derive(Debug, Clone, PartialEq)]
pub struct RankLoc {
    /// Step label (`step0`).
    pub step: String,
    /// Rank label (`rank0`, `proc123`).
    pub rank: String,
    /// The folder.
    pub dir: PathBuf,
    /// Its format.
    pub format: Format,
}

/// A side of the compare as found on disk.
#[derive(Debug, Clone)]
pub struct DumpSet {
    /// The path the user gave.
    pub path: PathBuf,
    /// The mode its manifest declares (probe dumps).
    pub mode: Option<Mode>,
    /// Every rank folder found, in step/rank order (none for an overflow-mode run in which
    /// nothing overflowed).
    pub ranks: Vec<RankLoc>,
    /// Written in overflow mode: only ops that produced NaN/Inf are recorded.
    pub overflow: bool,
    /// Its manifest says compiled code the agent could not instrument ran while it was
    /// captured (`torch.compile` graphs compiled before the agent, TorchScript): the
    /// operators inside it are not in its op logs.
    pub compiled: bool,
    /// The job's number of ranks, as its manifest says (probe dumps since the agent wrote
    /// it); None for msprobe dumps and older ones, whose rank folders are all there is to go
    /// by (a job may dump some of its ranks only).
    pub world_size: Option<usize>,
}

/// The format of a rank folder from the op log it holds; an op log that is there but
/// cannot be read (no permission, not a regular file) is an error, not "not a dump".
fn rank_format(dir: &Path) -> Result<Option<Format>> {
    for (name, format) in [("ops.jsonl", Format::Probe), ("dump.json", Format::Msprobe)] {
        let p = dir.join(name);
        match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => return Ok(Some(format)),
            Ok(_) => {
                return Err(ProbeError::Unsupported {
                    path: p,
                    msg: "not a regular file".into(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ProbeError::io(p, e)),
        }
    }
    Ok(None)
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
    out.sort_by(|(a, _), (b, _)| label_key(a).cmp(&label_key(b)));
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
        if let Some(format) = rank_format(&rdir)? {
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
        if let Some(format) = rank_format(dir)? {
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
    if let Some(format) = rank_format(path)? {
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
    // An overflow-mode run in which nothing overflowed writes its manifest and no step.
    let manifest_dir = if ranks.is_empty() {
        Some(path)
    } else {
        manifest_dir
    };
    let manifest = match manifest_dir.map(|d| d.join("manifest.json")) {
        Some(m) if m.is_file() => Some(read_manifest(&m)?),
        _ => None,
    };
    let overflow = manifest.as_ref().is_some_and(|m| m.overflow);
    let compiled = manifest.as_ref().is_some_and(|m| m.compiled);
    let world_size = manifest.as_ref().and_then(|m| m.world_size);
    if ranks.is_empty() && !overflow {
        return Err(ProbeError::NotADump(path.to_path_buf()));
    }
    Ok(DumpSet {
        path: path.to_path_buf(),
        mode: manifest.map(|m| m.mode),
        overflow,
        compiled,
        world_size,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of recorded and missing fields, NaN and infinities among them.
    fn all_fields() -> Vec<StatsFields> {
        let vals = [f64::NAN, f64::NEG_INFINITY, -0.0, 1.5e300];
        (0u32..64)
            .map(|mask| {
                let v = |i: usize| (mask & (1 << i) != 0).then_some(vals[i]);
                let c = |i: usize| (mask & (1 << (4 + i)) != 0).then_some(7 + i as u64);
                StatsFields {
                    max: v(0),
                    min: v(1),
                    mean: v(2),
                    norm: v(3),
                    nan: c(0),
                    inf: c(1),
                }
            })
            .collect()
    }

    #[test]
    fn packed_stats_keep_every_field_and_write_what_the_fields_write() {
        let bits = |f: &StatsFields| {
            let v = [f.max, f.min, f.mean, f.norm].map(|x| x.map(f64::to_bits));
            (v, f.nan, f.inf)
        };
        for f in all_fields() {
            let s = Stats::from(f);
            assert_eq!(bits(&StatsFields::from(s)), bits(&f), "{f:?}");
            // Rows files and shard results hold the six optional fields, as before packing.
            let packed = rmp_serde::to_vec(&Some(s)).unwrap();
            assert_eq!(packed, rmp_serde::to_vec(&Some(f)).unwrap(), "{f:?}");
            let back: Option<Stats> = rmp_serde::from_slice(&packed).unwrap();
            assert_eq!(bits(&StatsFields::from(back.unwrap())), bits(&f));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                serde_json::to_string(&f).unwrap()
            );
        }
        assert_eq!(std::mem::size_of::<Option<Stats>>(), 56);
    }
}
