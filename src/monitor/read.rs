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

    /// What a file cut inside a step (a run killed while writing it) is told as: its
    /// completed steps are read.
    pub fn cut_short_note(&self) -> Option<String> {
        self.cut_short.then(|| {
            format!(
                "{}: ends inside a step (a run killed while writing it): its completed steps are read",
                self.path.display()
            )
        })
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
    let mut buffers = Buffers::default();
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
        buffers.see(path, at, &message, body)?;
        at = end;
    }
    Ok((at, false))
}

/// What the buffers of the stream's batches must be, known from its schema: arrow-ipc
/// trusts the buffers a message lists (it slices each where the message says, and views a
/// value buffer as a slice of its type), and panics on one past the body or of a length that
/// is not a whole number of values (one changed byte of a monitor file did it). So every
/// batch's buffers are checked here, before arrow sees the message; what they hold is then
/// checked by arrow's own validation of each array (on by default).
#[derive(Default)]
struct Buffers {
    /// The first schema seen: each buffer of a record batch, in order, as the byte width
    /// its length must be a multiple of (1: any length).
    batch: Option<Vec<usize>>,
    /// The same for each dictionary's batches, by dictionary id.
    dictionaries: HashMap<i64, Vec<usize>>,
}

/// The buffers a column of type `t` takes in a batch (validity first), as in [`Buffers`];
/// None for a type a monitor file does not hold (nested ones: their buffers depend on
/// their children's).
fn buffer_widths(t: &DataType) -> Option<Vec<usize>> {
    match t {
        DataType::Null => Some(Vec::new()),
        DataType::Boolean => Some(vec![1, 1]),
        DataType::Utf8 | DataType::Binary => Some(vec![1, 4, 1]),
        DataType::LargeUtf8 | DataType::LargeBinary => Some(vec![1, 8, 1]),
        DataType::Dictionary(key, _) => Some(vec![1, key.primitive_width()?]),
        t => Some(vec![1, t.primitive_width()?]),
    }
}

impl Buffers {
    /// Reads the schema message, and checks a batch message's buffers against it.
    fn see(
        &mut self,
        path: &Path,
        at: usize,
        message: &arrow_ipc::Message,
        body: usize,
    ) -> Result<()> {
        if let Some(fb) = message.header_as_schema() {
            if self.batch.is_none() {
                self.schema(path, fb)?;
            }
            return Ok(());
        }
        let (batch, widths) = if let Some(b) = message.header_as_record_batch() {
            (b, self.batch.as_ref())
        } else if let Some(d) = message.header_as_dictionary_batch() {
            let Some(b) = d.data() else { return Ok(()) };
            let widths = self.dictionaries.get(&d.id()).ok_or_else(|| {
                bad(
                    path,
                    format!("byte {at}: dictionary {} is not in the schema", d.id()),
                )
            })?;
            (b, Some(widths))
        } else {
            return Ok(());
        };
        let widths =
            widths.ok_or_else(|| bad(path, format!("byte {at}: a batch before the schema")))?;
        for (i, b) in batch.buffers().iter().flatten().enumerate() {
            let (offset, len) = (b.offset(), b.length());
            let inside = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(o, l)| o.checked_add(l).map(|end| (end, l)))
                .filter(|&(end, _)| end <= body);
            let Some((_, len)) = inside else {
                return Err(bad(
                    path,
                    format!("byte {at}: buffer {i} (offset {offset}, length {len}) is not inside the message's {body}-byte body"),
                ));
            };
            let width = widths.get(i).copied().unwrap_or(1);
            if len % width != 0 {
                return Err(bad(
                    path,
                    format!("byte {at}: buffer {i} is {len} bytes, not a whole number of {width}-byte values"),
                ));
            }
        }
        Ok(())
    }

    /// The buffers of the schema's columns; a column of a type a monitor does not hold is
    /// refused.
    fn schema(&mut self, path: &Path, fb: arrow_ipc::Schema) -> Result<()> {
        let schema =
            arrow_ipc::convert::try_fb_to_schema(fb).map_err(|e| bad(path, e.to_string()))?;
        let ids = fb
            .fields()
            .into_iter()
            .flatten()
            .map(|f| f.dictionary().map(|d| d.id()));
        let mut batch = Vec::new();
        for (field, id) in schema.fields().iter().zip(ids) {
            let t = field.data_type();
            let refuse = || {
                bad(path, format!("column {:?}: {t} is not a type a monitor file holds (numbers, text, a dictionary of text)", field.name()))
            };
            batch.extend(buffer_widths(t).ok_or_else(refuse)?);
            if let (DataType::Dictionary(_, values), Some(id)) = (t, id) {
                let widths = match values.as_ref() {
                    DataType::Dictionary(..) => None,
                    v => buffer_widths(v),
                };
                self.dictionaries.insert(id, widths.ok_or_else(refuse)?);
            }
        }
        self.batch = Some(batch);
        Ok(())
    }
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

/// The index in `modules` of each row's module (utf8, or a dictionary of utf8: its values
/// looked up once per batch, not once per row), new names interned.
fn module_indices(
    path: &Path,
    col: &ArrayRef,
    modules: &mut Vec<String>,
    index: &mut HashMap<String, u32>,
) -> Result<Vec<u32>> {
    let mut intern = |name: Option<&str>, row: usize| -> Result<u32> {
        let name = name.ok_or_else(|| bad(path, format!("row {row}: no module name")))?;
        if let Some(&m) = index.get(name) {
            return Ok(m);
        }
        let m = u32::try_from(modules.len()).map_err(|_| bad(path, "too many modules"))?;
        index.insert(name.to_string(), m);
        modules.push(name.to_string());
        Ok(m)
    };
    let text_rows = |a: &ArrayRef,
                     intern: &mut dyn FnMut(Option<&str>, usize) -> Result<u32>|
     -> Result<Vec<u32>> {
        match a.data_type() {
            DataType::Utf8 => a
                .as_string::<i32>()
                .iter()
                .enumerate()
                .map(|(r, s)| intern(s, r))
                .collect(),
            DataType::LargeUtf8 => a
                .as_string::<i64>()
                .iter()
                .enumerate()
                .map(|(r, s)| intern(s, r))
                .collect(),
            t => Err(bad(path, format!("column module: {t} is not text"))),
        }
    };
    match col.as_any_dictionary_opt() {
        Some(d) => {
            let values = text_rows(d.values(), &mut intern)?;
            let keys = d.normalized_keys();
            (0..col.len())
                .map(|r| match keys.get(r).and_then(|&k| values.get(k)) {
                    Some(&m) if !col.is_null(r) => Ok(m),
                    _ => Err(bad(path, format!("row {r}: no module name"))),
                })
                .collect()
        }
        None => text_rows(col, &mut intern),
    }
}

/// Where the file's rows go: each row's step, module and data-flow position, read in a
/// first pass over the step, module and order columns only (the metrics are read in a
/// second pass straight into their dense place: the file's values are never held twice).
#[derive(Default)]
struct Rows {
    step: Vec<i64>,
    module: Vec<u32>,
    order: Vec<i32>,
}

impl Rows {
    /// Appends one batch's rows, modules interned in `modules`.
    fn push(
        &mut self,
        path: &Path,
        batch: &RecordBatch,
        modules: &mut Vec<String>,
        index: &mut HashMap<String, u32>,
    ) -> Result<()> {
        let schema = batch.schema();
        let col = |name: &str| {
            schema
                .index_of(name)
                .map(|i| batch.column(i).clone())
                .map_err(|_| bad(path, format!("no {name} column")))
        };
        let steps =
            numbers(&col(STEP)?).ok_or_else(|| bad(path, "column step: not a number column"))?;
        for (r, &step) in steps.iter().enumerate() {
            if !step.is_finite() || step.fract() != 0.0 {
                return Err(bad(
                    path,
                    format!("row {r}: step {step} is not a whole number"),
                ));
            }
            self.step.push(step as i64);
        }
        self.module
            .extend(module_indices(path, &col(MODULE)?, modules, index)?);
        match schema.index_of(ORDER) {
            Ok(i) => {
                let order = numbers(batch.column(i))
                    .ok_or_else(|| bad(path, "column order: not numbers"))?;
                self.order.extend(order.iter().map(|&o| {
                    if is_null(o) || !(0.0..=f64::from(i32::MAX)).contains(&o) {
                        -1
                    } else {
                        o as i32
                    }
                }));
            }
            Err(_) => self.order.extend(std::iter::repeat_n(-1, batch.num_rows())),
        }
        Ok(())
    }
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
    parse_rank(path, &map, rank)
}

/// Reads one monitor file's bytes (`path` names it in errors): [`read_rank`]'s reader, on
/// its own so that the fuzz target runs the shipped code on bytes.
pub fn parse_rank(path: &Path, map: &[u8], rank: u32) -> Result<RankSeries> {
    let (len, cut_short) = whole_messages(path, map)?;
    if len == 0 {
        return Err(bad(
            path,
            "no complete message (an empty or cut-short file)",
        ));
    }
    let bytes = &map[..len];
    let open = |projection: Option<Vec<usize>>| {
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), projection)
            .map_err(|e| bad(path, e.to_string()))
    };
    let schema = open(None)?.schema();
    let rank = metadata_rank(path, &schema)?.unwrap_or(rank);
    let metrics: Vec<(usize, String)> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| ![STEP, MODULE, ORDER].contains(&f.name().as_str()))
        .filter(|(_, f)| f.data_type().is_numeric())
        .map(|(i, f)| (i, f.name().clone()))
        .collect();
    let keys: Vec<usize> = [STEP, MODULE, ORDER]
        .iter()
        .filter_map(|n| schema.index_of(n).ok())
        .collect();
    let mut modules = Vec::new();
    let mut index = HashMap::new();
    let mut rows = Rows::default();
    for batch in open(Some(keys))? {
        let batch = batch.map_err(|e| bad(path, e.to_string()))?;
        rows.push(path, &batch, &mut modules, &mut index)?;
    }
    if rows.step.is_empty() {
        return Err(bad(path, "no steps"));
    }
    let layout = Layout::of(path, &rows, &modules)?;
    drop(rows);
    let (n, m) = (layout.steps.len(), modules.len());
    let mut values = vec![f64::from_bits(NULL_BITS); metrics.len() * m * n];
    if !metrics.is_empty() {
        let mut at = 0;
        for batch in open(Some(metrics.iter().map(|(i, _)| *i).collect()))? {
            let batch = batch.map_err(|e| bad(path, e.to_string()))?;
            let cells = layout
                .cells
                .get(at..at + batch.num_rows())
                .ok_or_else(|| bad(path, "rows changed between two reads"))?;
            for (k, ((_, name), col)) in metrics.iter().zip(batch.columns()).enumerate() {
                let v =
                    numbers(col).ok_or_else(|| bad(path, format!("column {name}: not numbers")))?;
                let block = &mut values[k * m * n..(k + 1) * m * n];
                for (&cell, v) in cells.iter().zip(v) {
                    block[cell] = v;
                }
            }
            at += batch.num_rows();
        }
    }
    Ok(RankSeries {
        rank,
        path: path.to_path_buf(),
        steps: layout.steps,
        modules,
        metrics: metrics.into_iter().map(|(_, n)| n).collect(),
        values,
        order: layout.order,
        cut_short,
    })
}

/// The dense layout of a file's rows: its steps, each row's cell (module, step) and each
/// cell's data-flow position; a (step, module) twice is refused.
struct Layout {
    steps: Vec<i64>,
    cells: Vec<usize>,
    order: Vec<i32>,
}

impl Layout {
    fn of(path: &Path, rows: &Rows, modules: &[String]) -> Result<Layout> {
        let mut steps = rows.step.clone();
        steps.sort_unstable();
        steps.dedup();
        let n = steps.len();
        // A monitor writes every module at every step; a file whose (module, step) grid is
        // far larger than its rows is not one, and would be allocated dense.
        let grid = modules.len().saturating_mul(n);
        if grid > rows.step.len().saturating_mul(4).saturating_add(1024) {
            return Err(bad(
                path,
                format!(
                    "{} modules x {n} steps for {} rows: not one row per module and step",
                    modules.len(),
                    rows.step.len()
                ),
            ));
        }
        let mut order = vec![-1i32; modules.len() * n];
        let mut seen = vec![false; modules.len() * n];
        let mut cells = Vec::with_capacity(rows.step.len());
        for (r, (&step, &module)) in rows.step.iter().zip(&rows.module).enumerate() {
            let s = steps.binary_search(&step).unwrap_or(0);
            let cell = module as usize * n + s;
            if std::mem::replace(&mut seen[cell], true) {
                return Err(bad(
                    path,
                    format!(
                        "step {step} has module {:?} twice",
                        modules[module as usize]
                    ),
                ));
            }
            order[cell] = rows.order[r];
            cells.push(cell);
        }
        Ok(Layout {
            steps,
            cells,
            order,
        })
    }
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
