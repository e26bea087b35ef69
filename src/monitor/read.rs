//! Reading monitor files: `probe.Monitor`'s `rank<R>.arrows` (docs/monitor.md), an Arrow
//! IPC stream of one record batch per step and one row per (step, module).
//!
//! A monitor is written while training runs, so a file may end inside the step being
//! written when the run was killed: the reader walks the stream's message frames first
//! and keeps the whole messages before a frame cut short (said as `cut_short`), so every
//! completed step counts and a broken tail is never read as data. A message that is whole
//! but does not decode is corruption, and an error naming the file.

use crate::error::{ProbeError, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The bits a missing value (null) is stored as among the values: a NaN payload no
/// arithmetic produces, so that a real NaN (a metric that went NaN) stays apart from
/// "not measured" without a second array.
const NULL_BITS: u64 = 0x7ff8_0000_dead_0001;

/// Whether a stored value is a null (not measured).
pub(crate) fn is_null(v: f64) -> bool {
    v.to_bits() == NULL_BITS
}

/// A stored value as an option (None: not measured).
pub(crate) fn present(v: f64) -> Option<f64> {
    (!is_null(v)).then_some(v)
}

/// The columns every monitor file has that are not metrics.
const STEP: &str = "step";
const MODULE: &str = "module";
const ORDER: &str = "order";

/// One rank's monitor, read: every metric of every module at every step, dense.
#[derive(Debug, Clone)]
pub struct RankSeries {
    /// The rank (the file's metadata, else its name).
    pub rank: u32,
    /// The file.
    pub path: PathBuf,
    /// The steps, increasing.
    pub steps: Vec<i64>,
    /// The modules, in the order of their first row (the root `""` first in probe's files).
    pub modules: Vec<String>,
    /// The metric columns, in the file's order.
    pub metrics: Vec<String>,
    /// `[metric][module][step]`, nulls as [`NULL_BITS`].
    values: Vec<f64>,
    /// `[module][step]`: the data-flow position; -1 for null.
    order: Vec<i32>,
    /// Whether the file ended inside a message (a run killed while writing a step).
    pub cut_short: bool,
}

impl RankSeries {
    /// One metric of one module over the steps (nulls as [`NULL_BITS`]; see [`present`]).
    pub fn series(&self, metric: usize, module: usize) -> &[f64] {
        let n = self.steps.len();
        let at = (metric * self.modules.len() + module) * n;
        &self.values[at..at + n]
    }

    /// A module's position in a step's data flow (None: not called in that step).
    pub fn order(&self, module: usize, step: usize) -> Option<i32> {
        let o = self.order[module * self.steps.len() + step];
        (o >= 0).then_some(o)
    }

    /// The index of a metric by name.
    pub fn metric(&self, name: &str) -> Option<usize> {
        self.metrics.iter().position(|m| m == name)
    }

    /// The index of a module by name.
    pub fn module(&self, name: &str) -> Option<usize> {
        self.modules.iter().position(|m| m == name)
    }
}

/// The rank of a file named `rank<R>.arrows`.
fn rank_of_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("rank")?
        .strip_suffix(".arrows")?
        .parse()
        .ok()
}

/// The monitor files of `root` by rank: `root` itself when it is a `.arrows` file, else its
/// `rank<R>.arrows` files. Empty when there are none (not a monitor).
pub fn discover(root: &Path) -> Result<Vec<(u32, PathBuf)>> {
    if root.is_file() {
        let is_arrows = root.extension().is_some_and(|e| e == "arrows");
        return Ok(if is_arrows {
            vec![(rank_of_name(root).unwrap_or(0), root.to_path_buf())]
        } else {
            Vec::new()
        });
    }
    let entries = std::fs::read_dir(root).map_err(|e| ProbeError::io(root, e))?;
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter_map(|p| rank_of_name(&p).map(|r| (r, p)))
        .collect();
    found.sort();
    Ok(found)
}

/// Whether `root` holds monitor files rather than a dump.
pub fn is_monitor(root: &Path) -> bool {
    discover(root).is_ok_and(|f| !f.is_empty())
}

fn bad(path: &Path, msg: impl Into<String>) -> ProbeError {
    ProbeError::BadMonitor {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// The length of the stream's whole messages: the frames walked (continuation marker,
/// metadata length, the message's own body length) up to the end marker, the end of the
/// bytes, or the first frame the bytes end inside; and whether one did.
fn whole_messages(path: &Path, bytes: &[u8]) -> Result<(usize, bool)> {
    let word = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(first) = word(at) else {
            return Ok((at, true));
        };
        // A continuation marker and the length, or (the pre-1.0 format) the length alone.
        let (len_at, prefix) = if first == u32::MAX {
            (at + 4, 8)
        } else {
            (at, 4)
        };
        let Some(len) = word(len_at) else {
            return Ok((at, true));
        };
        if len == 0 {
            return Ok((at + prefix, false));
        }
        let meta = at + prefix..at + prefix + len as usize;
        let Some(meta_bytes) = bytes.get(meta.clone()) else {
            return Ok((at, true));
        };
        let message = arrow_ipc::root_as_message(meta_bytes)
            .map_err(|e| bad(path, format!("byte {at}: not an Arrow IPC message ({e})")))?;
        let body = usize::try_from(message.bodyLength())
            .map_err(|_| bad(path, format!("byte {at}: negative body length")))?;
        let end = meta.end.saturating_add(body);
        if end > bytes.len() {
            return Ok((at, true));
        }
        at = end;
    }
    Ok((at, false))
}

/// A numeric column as f64 values, nulls as [`NULL_BITS`]; None for another type.
fn numbers(col: &ArrayRef) -> Option<Vec<f64>> {
    fn of<T: arrow_array::ArrowPrimitiveType>(
        col: &ArrayRef,
        f: impl Fn(T::Native) -> f64,
    ) -> Vec<f64> {
        let a = col.as_primitive::<T>();
        (0..a.len())
            .map(|i| {
                if a.is_null(i) {
                    f64::from_bits(NULL_BITS)
                } else {
                    f(a.value(i))
                }
            })
            .collect()
    }
    Some(match col.data_type() {
        DataType::Float32 => of::<Float32Type>(col, f64::from),
        DataType::Float64 => of::<Float64Type>(col, |v| v),
        DataType::Int8 => of::<Int8Type>(col, f64::from),
        DataType::Int16 => of::<Int16Type>(col, f64::from),
        DataType::Int32 => of::<Int32Type>(col, f64::from),
        DataType::Int64 => of::<Int64Type>(col, |v| v as f64),
        DataType::UInt8 => of::<UInt8Type>(col, f64::from),
        DataType::UInt16 => of::<UInt16Type>(col, f64::from),
        DataType::UInt32 => of::<UInt32Type>(col, f64::from),
        DataType::UInt64 => of::<UInt64Type>(col, |v| v as f64),
        _ => return None,
    })
}

/// The module names of a batch, row by row (utf8, or a dictionary of utf8).
fn names(path: &Path, col: &ArrayRef) -> Result<Vec<String>> {
    let text = |a: &ArrayRef| -> Result<Vec<Option<String>>> {
        match a.data_type() {
            DataType::Utf8 => Ok(a
                .as_string::<i32>()
                .iter()
                .map(|s| s.map(String::from))
                .collect()),
            DataType::LargeUtf8 => Ok(a
                .as_string::<i64>()
                .iter()
                .map(|s| s.map(String::from))
                .collect()),
            t => Err(bad(path, format!("column module: {t} is not text"))),
        }
    };
    let rows: Vec<Option<String>> = match col.as_any_dictionary_opt() {
        Some(d) => {
            let values = text(d.values())?;
            let keys = d.normalized_keys();
            (0..col.len())
                .map(|i| {
                    if col.is_null(i) {
                        None
                    } else {
                        keys.get(i).and_then(|&k| values.get(k).cloned().flatten())
                    }
                })
                .collect()
        }
        None => text(col)?,
    };
    rows.into_iter()
        .enumerate()
        .map(|(i, n)| n.ok_or_else(|| bad(path, format!("row {i}: no module name"))))
        .collect()
}

/// One row of the file before the steps are known.
struct RowIn {
    step: i64,
    module: usize,
    order: i32,
    values: Vec<f64>,
}

/// The rows of one batch, modules interned in `modules`.
fn batch_rows(
    path: &Path,
    batch: &RecordBatch,
    metrics: &[(usize, String)],
    modules: &mut Vec<String>,
    index: &mut HashMap<String, usize>,
) -> Result<Vec<RowIn>> {
    let schema = batch.schema();
    let col = |name: &str| {
        schema
            .index_of(name)
            .map(|i| batch.column(i).clone())
            .map_err(|_| bad(path, format!("no {name} column")))
    };
    let steps =
        numbers(&col(STEP)?).ok_or_else(|| bad(path, "column step: not a number column"))?;
    let names = names(path, &col(MODULE)?)?;
    let order = match schema.index_of(ORDER) {
        Ok(i) => numbers(batch.column(i)).ok_or_else(|| bad(path, "column order: not numbers"))?,
        Err(_) => vec![f64::from_bits(NULL_BITS); batch.num_rows()],
    };
    let columns: Vec<Vec<f64>> = metrics
        .iter()
        .map(|(i, name)| {
            numbers(batch.column(*i))
                .ok_or_else(|| bad(path, format!("column {name}: not numbers")))
        })
        .collect::<Result<_>>()?;
    (0..batch.num_rows())
        .map(|r| {
            let step = steps[r];
            if !step.is_finite() || step.fract() != 0.0 {
                return Err(bad(
                    path,
                    format!("row {r}: step {step} is not a whole number"),
                ));
            }
            let name = &names[r];
            let module = match index.get(name) {
                Some(&m) => m,
                None => {
                    index.insert(name.clone(), modules.len());
                    modules.push(name.clone());
                    modules.len() - 1
                }
            };
            let o = order[r];
            Ok(RowIn {
                step: step as i64,
                module,
                order: if is_null(o) || !(0.0..=f64::from(i32::MAX)).contains(&o) {
                    -1
                } else {
                    o as i32
                },
                values: columns.iter().map(|c| c[r]).collect(),
            })
        })
        .collect()
}

/// The rank a file's `probe.monitor` metadata names, when it has one (a file of another
/// writer may not); refuses a newer format version.
fn metadata_rank(path: &Path, schema: &arrow_schema::Schema) -> Result<Option<u32>> {
    let Some(meta) = schema.metadata().get("probe.monitor") else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_str(meta)
        .map_err(|e| bad(path, format!("probe.monitor metadata: {e}")))?;
    if let Some(version) = v.get("version").and_then(serde_json::Value::as_u64) {
        if version > 1 {
            return Err(ProbeError::Unsupported {
                path: path.to_path_buf(),
                msg: format!("monitor format version {version} (this probe reads version 1)"),
            });
        }
    }
    Ok(v.get("rank")
        .and_then(serde_json::Value::as_u64)
        .and_then(|r| u32::try_from(r).ok()))
}

/// Reads one monitor file.
pub fn read_rank(path: &Path, rank: u32) -> Result<RankSeries> {
    let file = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    // SAFETY: the map is read only; a file truncated under us is the risk every reader of
    // a live run's file takes, and the frames are checked before they are decoded.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ProbeError::io(path, e))?;
    let (len, cut_short) = whole_messages(path, &map)?;
    if len == 0 {
        return Err(bad(
            path,
            "no complete message (an empty or cut-short file)",
        ));
    }
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(&map[..len]), None)
        .map_err(|e| bad(path, e.to_string()))?;
    let schema = reader.schema();
    let rank = metadata_rank(path, &schema)?.unwrap_or(rank);
    let metrics: Vec<(usize, String)> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| ![STEP, MODULE, ORDER].contains(&f.name().as_str()))
        .filter(|(_, f)| f.data_type().is_numeric())
        .map(|(i, f)| (i, f.name().clone()))
        .collect();
    let mut modules = Vec::new();
    let mut index = HashMap::new();
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(path, e.to_string()))?;
        rows.extend(batch_rows(
            path,
            &batch,
            &metrics,
            &mut modules,
            &mut index,
        )?);
    }
    if rows.is_empty() {
        return Err(bad(path, "no steps"));
    }
    dense(path, rank, rows, modules, metrics, cut_short)
}

/// The rows laid out dense by metric, module and step; a (step, module) twice is refused.
fn dense(
    path: &Path,
    rank: u32,
    rows: Vec<RowIn>,
    modules: Vec<String>,
    metrics: Vec<(usize, String)>,
    cut_short: bool,
) -> Result<RankSeries> {
    let mut steps: Vec<i64> = rows.iter().map(|r| r.step).collect();
    steps.sort_unstable();
    steps.dedup();
    let (n, m) = (steps.len(), modules.len());
    let mut values = vec![f64::from_bits(NULL_BITS); metrics.len() * m * n];
    let mut order = vec![-1i32; m * n];
    let mut seen = vec![false; m * n];
    for r in rows {
        let s = steps.binary_search(&r.step).unwrap_or(0);
        let cell = r.module * n + s;
        if std::mem::replace(&mut seen[cell], true) {
            return Err(bad(
                path,
                format!("step {} has module {:?} twice", r.step, modules[r.module]),
            ));
        }
        order[cell] = r.order;
        for (k, v) in r.values.into_iter().enumerate() {
            values[(k * m + r.module) * n + s] = v;
        }
    }
    Ok(RankSeries {
        rank,
        path: path.to_path_buf(),
        steps,
        modules,
        metrics: metrics.into_iter().map(|(_, n)| n).collect(),
        values,
        order,
        cut_short,
    })
}

/// A monitor folder's files by rank (each read on its own by [`read_rank`], so that a
/// thousand ranks are never in memory together); a folder with none is not a monitor.
pub fn files(root: &Path) -> Result<Vec<(u32, PathBuf)>> {
    if !root.exists() {
        return Err(ProbeError::NotFound(root.to_path_buf()));
    }
    let files = discover(root)?;
    if files.is_empty() {
        return Err(bad(
            root,
            "no rank<R>.arrows file (not a probe.Monitor folder)",
        ));
    }
    if let Some(w) = files.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(
            &w[1].1,
            format!("rank {} also in {}", w[1].0, w[0].1.display()),
        ));
    }
    Ok(files)
}
