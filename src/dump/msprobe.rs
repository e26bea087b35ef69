//! Reader for msprobe dumps (`dump.json`, `stack.json`, `construct.json`,
//! `dump_tensor_data/*.pt|*.npy`), read as msprobe writes them (docs/msprobe.md).
//!
//! Every op entry of `dump.json` becomes an op record in file order (its `seq` is its
//! position); every tensor leaf becomes a tensor record named the way msprobe's compare
//! names it (`<op>.input.0`, `<op>.input.<kwarg>`, `<op>.output.0.1`,
//! `<op>.parameters.weight`). Non-tensor leaves (ints, floats, `None`, ...) are skipped.
//! msprobe records no dataflow, so `has_dataflow` is false.

use super::{
    ModulePaths, OpKey, OpKind, OpRec, Ops, OpsBuilder, RankDump, RankLoc, Role, Stats,
    StatsFields, TensorRec,
};
use crate::dtype::AnyDType;
use crate::error::{one_line, ProbeError, Result};
use crate::schema::dump::parse_stat;
use crate::tensor::Data;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// A JSON value whose objects keep their order (dump.json's op order is execution order).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum J {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number (bare `NaN`/`Infinity` tokens are not JSON: see docs/msprobe.md).
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<J>),
    /// An object, keys in file order.
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, key: &str) -> Option<&J> {
        match self {
            J::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            J::Str(s) => Some(s),
            _ => None,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            J::Null => "null",
            J::Bool(_) => "a bool",
            J::Num(_) => "a number",
            J::Str(_) => "a string",
            J::Arr(_) => "a list",
            J::Obj(_) => "an object",
        }
    }
}

struct JVisitor;

impl<'de> Visitor<'de> for JVisitor {
    type Value = J;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> std::result::Result<J, E> {
        Ok(J::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<J, E> {
        Ok(J::Null)
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<J, E> {
        Ok(J::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<J, E> {
        Ok(J::Num(v as f64))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<J, E> {
        Ok(J::Num(v as f64))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<J, E> {
        Ok(J::Num(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<J, E> {
        Ok(J::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<J, E> {
        Ok(J::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<J, A::Error> {
        let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(J::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> std::result::Result<J, A::Error> {
        let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1024));
        while let Some((k, x)) = a.next_entry::<String, J>()? {
            v.push((k, x));
        }
        Ok(J::Obj(v))
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<J, D::Error> {
        d.deserialize_any(JVisitor)
    }
}

/// Parses JSON text keeping object order; Python's bare `NaN`/`Infinity` tokens are read
/// as the strings `"nan"`/`"inf"` (see [`crate::json`]). Public for tests and tools.
pub(crate) fn parse_json(text: &[u8]) -> std::result::Result<J, String> {
    serde_json::from_slice(&crate::json::accept_nonfinite(text)).map_err(|e| e.to_string())
}

/// What a tensor leaf is: anything with a dtype and a shape whose type names a tensor.
fn is_tensor_leaf(v: &J) -> bool {
    let Some(t) = v.get("type").and_then(J::as_str) else {
        return false;
    };
    (t.contains("Tensor") || t.contains("Parameter") || t.contains("ndarray"))
        && v.get("dtype").is_some()
        && v.get("shape").is_some()
}

fn stat(v: Option<&J>) -> std::result::Result<Option<f64>, String> {
    match v {
        None | Some(J::Null) => Ok(None),
        Some(J::Num(n)) => Ok(Some(*n)),
        Some(J::Bool(b)) => Ok(Some(if *b { 1.0 } else { 0.0 })),
        // Statistics msprobe could not compute (FP8, fake tensors) are strings too.
        Some(J::Str(s)) => Ok(parse_stat(s).ok()),
        Some(o) => Err(format!("statistic is {}, not a number", o.kind())),
    }
}

/// A `data_name` must be a plain file name inside `dump_tensor_data/`.
fn tensor_file(dir: &Path, name: &str) -> Option<Data> {
    if name.is_empty()
        || name == "-1"
        || name.contains('/')
        || name.contains('\\')
        || name.starts_with('.')
    {
        return None;
    }
    let p = dir.join("dump_tensor_data").join(name);
    if name.ends_with(".npy") {
        Some(Data::Npy(p))
    } else {
        Some(Data::Pt(p))
    }
}

struct Ctx<'a> {
    dir: &'a Path,
    /// Tensor files named by dump.json but absent.
    missing: usize,
    first_missing: Option<String>,
    /// `data_name`s outside `dump_tensor_data/` (`../x`, `/abs`, `/dev/zero`): not read.
    outside: usize,
    first_outside: Option<String>,
}

fn tensor_rec(
    ctx: &mut Ctx,
    v: &J,
    name: &str,
    role: Role,
) -> std::result::Result<TensorRec, String> {
    let dtype = match v.get("dtype") {
        Some(J::Str(s)) => AnyDType::parse(s),
        Some(o) => return Err(format!("tensor {name}: dtype is {}", o.kind())),
        None => AnyDType::default(),
    };
    let shape = match v.get("shape") {
        Some(J::Arr(a)) => a
            .iter()
            .map(|d| match d {
                J::Num(n) if *n >= 0.0 && n.fract() == 0.0 && *n < 9.0e15 => Ok(*n as usize),
                o => Err(format!("tensor {name}: shape holds {}", o.kind())),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?,
        Some(J::Null) | None => vec![],
        Some(o) => return Err(format!("tensor {name}: shape is {}", o.kind())),
    };
    if super::checked_numel(&shape).is_none() {
        return Err(format!(
            "tensor {name}: shape {shape:?} has more elements than can be addressed"
        ));
    }
    let s = |k: &str| stat(v.get(k)).map_err(|m| format!("tensor {name}: {k}: {m}"));
    let stats: Stats = StatsFields {
        max: s("Max")?,
        min: s("Min")?,
        mean: s("Mean")?,
        norm: s("Norm")?,
        nan: None,
        inf: None,
    }
    .into();
    let any_stat = [stats.max(), stats.min(), stats.mean(), stats.norm()]
        .iter()
        .any(Option::is_some);
    // msprobe's "md5" is an 8-hex-digit CRC-32 of the raw bytes: the same checksum probe
    // dumps write as "crc32:<hex>", so both formats compare equal.
    let checksum = match v.get("md5") {
        Some(J::Str(h)) if h.len() == 8 && h.chars().all(|c| c.is_ascii_hexdigit()) => {
            Some(format!("crc32:{}", h.to_ascii_lowercase()))
        }
        Some(J::Str(h)) if !h.is_empty() => Some(format!("md5:{}", h.to_ascii_lowercase())),
        _ => None,
    };
    let mut data = None;
    // A tensor of a dtype probe cannot decode (FP8, complex, ...) is compared by statistics.
    if let (Some(J::Str(f)), Some(_)) = (v.get("data_name"), dtype.known()) {
        let named = !f.is_empty() && f != "-1";
        let found = tensor_file(ctx.dir, f);
        if found.is_none() && named {
            ctx.outside += 1;
            ctx.first_outside
                .get_or_insert_with(|| format!("{name}: data_name {f:?}"));
        }
        if let Some(d) = found {
            let file = match &d {
                Data::Pt(p) | Data::Npy(p) => Some(p),
                _ => None,
            };
            // Missing: compared by statistics (with a warning). There but not a readable
            // regular file: an error, never a quiet fallback.
            match file.map(std::fs::metadata) {
                Some(Ok(m)) if m.is_file() => data = Some(Box::new(d)),
                Some(Ok(_)) => return Err(format!("tensor {name}: {f} is not a regular file")),
                Some(Err(e)) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("tensor {name}: {f}: {e}"))
                }
                _ => {
                    ctx.missing += 1;
                    ctx.first_missing.get_or_insert_with(|| f.clone());
                }
            }
        }
    }
    Ok(TensorRec {
        name: name.into(),
        role,
        dtype,
        shape,
        stats: any_stat.then_some(stats),
        checksum: checksum.map(String::into_boxed_str),
        id: None,
        src: None,
        data,
        unwritten: false,
        layout: None,
    })
}

/// Walks an argument tree, appending tensor leaves with msprobe's flattened names.
fn walk(
    ctx: &mut Ctx,
    v: &J,
    name: &mut String,
    role: Role,
    out: &mut Vec<TensorRec>,
) -> std::result::Result<(), String> {
    match v {
        J::Arr(items) => {
            for (i, x) in items.iter().enumerate() {
                let len = name.len();
                name.push('.');
                name.push_str(&i.to_string());
                walk(ctx, x, name, role, out)?;
                name.truncate(len);
            }
        }
        J::Obj(kv) => {
            if is_tensor_leaf(v) {
                out.push(tensor_rec(ctx, v, name, role)?);
            } else if v.get("type").is_none() {
                for (k, x) in kv {
                    let len = name.len();
                    name.push('.');
                    name.push_str(k);
                    walk(ctx, x, name, role, out)?;
                    name.truncate(len);
                }
            }
            // Any other typed leaf (int, float, bool, slice, dtype, ...) is not a tensor.
        }
        _ => {}
    }
    Ok(())
}

fn convert_op(ctx: &mut Ctx, key: &str, entry: &J) -> std::result::Result<OpRec, String> {
    let key = OpKey::parse(key);
    let (direction, kind) = (key.direction(), key.kind());
    let J::Obj(slots) = entry else {
        return Err(format!(
            "op {key}: entry is {}, expected an object",
            entry.kind()
        ));
    };
    let mut tensors = Vec::new();
    let mut recompute = false;
    let mut args = serde_json::Map::new();
    let mut name = String::with_capacity(key.as_str().len() + 32);
    for (slot, v) in slots {
        match (slot.as_str(), v) {
            ("input_args", J::Arr(items)) => {
                for (i, x) in items.iter().enumerate() {
                    if let Some(a) = arg_value(x) {
                        args.insert(format!("input.{i}"), a);
                    }
                }
            }
            ("input_kwargs", J::Obj(kv)) => {
                for (k, x) in kv {
                    if let Some(a) = arg_value(x) {
                        args.insert(format!("input.{k}"), a);
                    }
                }
            }
            _ => {}
        }
        let (suffix, role) = match slot.as_str() {
            "is_recompute" => {
                recompute = matches!(v, J::Bool(true));
                continue;
            }
            "input_args" | "input_kwargs" | "input" => ("input", Role::Input),
            "output" => ("output", Role::Output),
            "parameters" => ("parameters", Role::Parameter),
            other if kind == OpKind::ParametersGrad => (other, Role::Parameter),
            other => (other, Role::Input),
        };
        name.clear();
        name.push_str(key.as_str());
        name.push('.');
        name.push_str(suffix);
        walk(ctx, v, &mut name, role, &mut tensors)?;
    }
    // Pushes grew it to at least 4 records; most ops hold one or two.
    tensors.shrink_to_fit();
    Ok(OpRec {
        seq: 0,
        key,
        kind,
        direction,
        module: None,
        stack: None,
        recompute,
        tensors,
        collective: None,
        args: super::args::canonical(&args).map(Into::into),
    })
}

/// A non-tensor argument as probe records it (`super::args`): the `value` of a typed leaf
/// (`{"type": "float", "value": 1e-05}`), a list of such leaves as a list of values; None
/// for a tensor, `null`, a device (the migration itself) or anything else.
fn arg_value(v: &J) -> Option<serde_json::Value> {
    use serde_json::Value;
    /// A leaf's value, or a list of them (a slice or size): scalars only.
    fn value(x: &J, whole: bool) -> Option<Value> {
        match x {
            J::Bool(b) => Some(Value::Bool(*b)),
            J::Num(x) => Some(number(*x, whole)),
            J::Str(s) => Some(Value::String(s.clone())),
            J::Arr(items) => items
                .iter()
                .map(|x| match x {
                    J::Arr(_) => None,
                    x => value(x, true),
                })
                .collect::<Option<Vec<_>>>()
                .map(Value::Array),
            J::Null | J::Obj(_) => None,
        }
    }
    match v {
        J::Obj(_) => {
            let kind = v.get("type").and_then(J::as_str)?;
            if kind == "torch.device" || is_tensor_leaf(v) {
                return None;
            }
            value(v.get("value")?, kind != "float")
        }
        // A tuple of scalars: `[{"type": "int", "value": 2}, ...]`.
        J::Arr(items) if !items.is_empty() => items
            .iter()
            .map(|x| match x {
                J::Obj(_) => arg_value(x),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(Value::Array),
        _ => None,
    }
}

/// A number as JSON: whole numbers as integers where `whole` (an `int` leaf: this reader
/// holds every number as a float); NaN and infinities as the strings probe's agent writes.
fn number(x: f64, whole: bool) -> serde_json::Value {
    if !x.is_finite() {
        return serde_json::Value::String(
            if x.is_nan() {
                "nan"
            } else if x > 0.0 {
                "inf"
            } else {
                "-inf"
            }
            .into(),
        );
    }
    if whole && x.fract() == 0.0 && x.abs() < 9.0e15 {
        return serde_json::Value::from(x as i64);
    }
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// `stack.json`: `{"0": [[op, ...], [frame, ...]]}`, or the older `{op: [frame, ...]}`.
/// Stacks by id, and the stack id of each op.
pub(crate) type Stacks = (BTreeMap<u64, Vec<String>>, HashMap<String, u64>);

/// Parses the text of a `stack.json` (either layout): stacks by id, and the stack id of
/// each op. Public for tools and fuzzing; the error is one line.
pub fn parse_stacks(text: &[u8]) -> std::result::Result<Stacks, String> {
    stack_maps(text).map_err(one_line)
}

fn stack_maps(text: &[u8]) -> std::result::Result<Stacks, String> {
    let mut stacks = BTreeMap::new();
    let mut by_op = HashMap::new();
    let J::Obj(entries) = parse_json(text)? else {
        return Err("not a JSON object".into());
    };
    let strings = |v: &J| -> Vec<String> {
        match v {
            J::Arr(a) => a
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect(),
            J::Str(s) => vec![s.clone()],
            _ => vec![],
        }
    };
    for (i, (k, v)) in entries.iter().enumerate() {
        match v {
            J::Arr(a) if a.len() == 2 && matches!(a[0], J::Arr(_)) => {
                let id = k.parse::<u64>().unwrap_or(i as u64);
                for op in strings(&a[0]) {
                    by_op.insert(op, id);
                }
                stacks.insert(id, strings(&a[1]));
            }
            other => {
                let id = i as u64;
                by_op.insert(k.clone(), id);
                stacks.insert(id, strings(other));
            }
        }
    }
    Ok((stacks, by_op))
}

fn read_stacks(path: &Path) -> Result<Stacks> {
    if !path.is_file() {
        return Ok(Default::default());
    }
    let text = std::fs::read(path).map_err(|e| ProbeError::io(path, e))?;
    parse_stacks(&text).map_err(|msg| ProbeError::BadMsprobe {
        path: path.to_path_buf(),
        msg,
    })
}

/// `construct.json`: node → parent module (or null).
fn read_construct(path: &Path) -> Result<HashMap<String, Arc<str>>> {
    let mut out = HashMap::new();
    // Each parent held once, however many ops it has.
    let mut parents = ModulePaths::default();
    if !path.is_file() {
        return Ok(out);
    }
    let text = std::fs::read(path).map_err(|e| ProbeError::io(path, e))?;
    let j = parse_json(&text).map_err(|msg| ProbeError::BadMsprobe {
        path: path.to_path_buf(),
        msg,
    })?;
    if let J::Obj(kv) = j {
        for (k, v) in kv {
            if let J::Str(p) = v {
                out.insert(k, parents.get(&p));
            }
        }
    }
    Ok(out)
}

/// The op records of one `dump.json`, in file order.
#[derive(Debug, Clone)]
pub struct DumpJson {
    /// One record per op entry (`seq` is its position; stacks and modules from the
    /// context it was read with).
    pub ops: Ops,
    /// The `task` msprobe recorded (`statistics`, `tensor`, ...).
    pub task: Option<String>,
    /// Tensor files named but absent from `dump_tensor_data/`.
    pub missing: usize,
    /// The first of them.
    pub first_missing: Option<String>,
    /// Tensors whose `data_name` points outside `dump_tensor_data/` (not read).
    pub outside: usize,
    /// The first of them: its name and `data_name`.
    pub first_outside: Option<String>,
}

/// Parses the text of a `dump.json` whose rank folder is `dir` (tensor files are looked up
/// under `dir/dump_tensor_data/`). `load` reads `dump.json` through this; public for
/// tools and fuzzing. The error is one line, without the file name.
pub fn parse_dump(text: &[u8], dir: &Path) -> std::result::Result<DumpJson, String> {
    dump_ops(text, dir, &Context::default()).map_err(one_line)
}

/// What the files beside `dump.json` say of its ops: the stack id of each op
/// (`stack.json`) and the module call it was made in (`construct.json`).
#[derive(Debug, Default)]
struct Context {
    stack_of: HashMap<String, u64>,
    parents: HashMap<String, Arc<str>>,
}

/// How many bytes of `dump.json` an op entry takes at least, about (one tensor leaf with its
/// statistics, indented as msprobe writes it): the op list is reserved for the entries the
/// text can hold, so it is not copied as it grows (pages reserved and never written cost
/// nothing).
const TYPICAL_MIN_ENTRY: usize = 256;

/// The ops of a `dump.json`, converted one by one as the parser reaches them.
///
/// Why: the whole file parsed into a [`J`] tree first held every entry three times over
/// (the text, the tree, the records) — 988 MB against 450 MB for the same 312,000 tensors in
/// probe's own format. Now an entry's tree lives only until its op record is made, so an
/// msprobe dump is read in about the memory of its records and its text.
struct Reading<'a> {
    ctx: Ctx<'a>,
    context: &'a Context,
    ops: OpsBuilder,
    task: Option<String>,
    /// A `data` object was met (a later one replaces an earlier, as keys of JSON objects do).
    data: bool,
    /// Why reading stopped, when it was not the JSON itself (serde's own error then only
    /// carries the parser out).
    failed: Option<String>,
}

impl Reading<'_> {
    /// Stops the parser with `why` as the error.
    fn fail<E: serde::de::Error>(&mut self, why: String) -> E {
        let e = E::custom(&why);
        self.failed = Some(why);
        e
    }

    /// Stops the parser: `what` is `kind` where an object belongs.
    fn refuse<E: serde::de::Error>(&mut self, what: &str, kind: &str) -> E {
        self.fail(format!("{what} is {kind}, expected an object"))
    }
}

/// Visitor methods that refuse every JSON value but an object, naming its kind as
/// [`J::kind`] does (`"data" is a list, expected an object`).
macro_rules! refuse_others {
    ($what:literal) => {
        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "null"))
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "a bool"))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "a number"))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "a number"))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "a number"))
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> std::result::Result<(), E> {
            Err(self.0.refuse($what, "a string"))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> std::result::Result<(), A::Error> {
            Err(self.0.refuse($what, "a list"))
        }
    };
}

/// The top level: `task`, `data`, and keys skipped unread.
struct Top<'r, 'a>(&'r mut Reading<'a>);

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    refuse_others!("top level");
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<(), A::Error> {
        while let Some(key) = m.next_key::<String>()? {
            match key.as_str() {
                "data" => m.next_value_seed(DataMap(&mut *self.0))?,
                "task" => self.0.task = m.next_value::<J>()?.as_str().map(String::from),
                _ => {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// The `data` object: each entry converted as soon as it is parsed.
struct DataMap<'r, 'a>(&'r mut Reading<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for DataMap<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DataMap<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    refuse_others!("\"data\"");
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<(), A::Error> {
        let r = self.0;
        if r.data {
            r.ops = OpsBuilder::default();
        }
        r.data = true;
        r.ctx.missing = 0;
        r.ctx.first_missing = None;
        r.ctx.outside = 0;
        r.ctx.first_outside = None;
        while let Some(key) = m.next_key::<String>()? {
            let entry: J = m.next_value()?;
            let pushed = convert_op(&mut r.ctx, &key, &entry).and_then(|mut op| {
                op.seq = r.ops.len() as u64;
                op.stack = r.context.stack_of.get(key.as_str()).copied();
                op.module = r.context.parents.get(key.as_str()).cloned();
                r.ops.push_rec(&op)
            });
            if let Err(why) = pushed {
                return Err(r.fail(why));
            }
        }
        Ok(())
    }
}

fn dump_ops(text: &[u8], dir: &Path, context: &Context) -> std::result::Result<DumpJson, String> {
    let text = crate::json::accept_nonfinite(text);
    let mut r = Reading {
        ctx: Ctx {
            dir,
            missing: 0,
            first_missing: None,
            outside: 0,
            first_outside: None,
        },
        context,
        // Room for the entries the text can hold (a size no memory can hold reserves
        // nothing; the store then grows as it is read).
        ops: OpsBuilder::for_log_bytes((text.len() / TYPICAL_MIN_ENTRY * 250) as u64),
        task: None,
        data: false,
        failed: None,
    };
    let mut de = serde_json::Deserializer::from_slice(&text);
    let read = de.deserialize_any(Top(&mut r)).and_then(|()| de.end());
    if let Err(e) = read {
        return Err(r.failed.take().unwrap_or_else(|| e.to_string()));
    }
    if !r.data {
        return Err("no \"data\" object".into());
    }
    Ok(DumpJson {
        ops: r.ops.finish(),
        task: r.task,
        missing: r.ctx.missing,
        first_missing: r.ctx.first_missing,
        outside: r.ctx.outside,
        first_outside: r.ctx.first_outside,
    })
}

/// Reads one msprobe rank folder.
pub(crate) fn load(loc: &RankLoc) -> Result<RankDump> {
    let path = loc.dir.join("dump.json");
    let text = std::fs::read(&path).map_err(|e| ProbeError::io(&path, e))?;
    let (stacks, stack_of) = read_stacks(&loc.dir.join("stack.json"))?;
    let context = Context {
        stack_of,
        parents: read_construct(&loc.dir.join("construct.json"))?,
    };
    let dump = dump_ops(&text, &loc.dir, &context)
        .map_err(one_line)
        .map_err(|msg| ProbeError::BadMsprobe {
            path: path.clone(),
            msg,
        })?;
    drop(text);
    let ops = dump.ops;
    let mut warnings = Vec::new();
    if dump.missing > 0 && dump.task.as_deref() == Some("tensor") {
        warnings.push(format!(
            "{}: {} tensor file(s) named in dump.json are missing (first: {}); those tensors are compared by statistics",
            loc.dir.display(),
            dump.missing,
            dump.first_missing.unwrap_or_default()
        ));
    }
    if dump.outside > 0 {
        warnings.push(format!(
            "{}: {} tensor(s) name a data_name outside dump_tensor_data/, not read (first: {}); \
             those tensors are compared by statistics",
            loc.dir.display(),
            dump.outside,
            crate::config_file::printable(&dump.first_outside.unwrap_or_default())
        ));
    }
    Ok(RankDump {
        loc: loc.clone(),
        ops,
        stacks,
        has_dataflow: false,
        warnings,
        incomplete: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record of an entry read as `Functional.f.0.forward`, with no tensor files.
    fn convert(entry: &J) -> OpRec {
        let mut ctx = Ctx {
            dir: Path::new("/nonexistent"),
            missing: 0,
            first_missing: None,
            outside: 0,
            first_outside: None,
        };
        convert_op(&mut ctx, "Functional.f.0.forward", entry).unwrap()
    }

    #[test]
    fn names_follow_msprobe() {
        let j = parse_json(
            br#"{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1, "Min": 0, "Mean": 0.5, "Norm": 1, "md5": "1A2B3C4D"},
                 [{"type": "int", "value": 1}, {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [], "Max": "inf", "Min": null, "Mean": null, "Norm": null}], null],
                "input_kwargs": {"w": {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [3]}},
                "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}],
                "parameters": {"weight": {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}}}"#,
        )
        .unwrap();
        let op = convert(&j);
        let names: Vec<_> = op.tensors.iter().map(|t| &*t.name).collect();
        assert_eq!(
            names,
            [
                "Functional.f.0.forward.input.0",
                "Functional.f.0.forward.input.1.1",
                "Functional.f.0.forward.input.w",
                "Functional.f.0.forward.output.0",
                "Functional.f.0.forward.parameters.weight"
            ]
        );
        assert_eq!(op.tensors[0].checksum.as_deref(), Some("crc32:1a2b3c4d"));
        assert_eq!(op.tensors[1].stats.unwrap().max(), Some(f64::INFINITY));
        assert_eq!(op.tensors[3].role, Role::Output);
        assert_eq!(op.tensors[4].role, Role::Parameter);
        assert!(op.tensors[2].stats.is_none());
        // A list holding a tensor is not an argument; the rest hold none.
        assert_eq!(op.args, None);
    }

    #[test]
    fn non_tensor_leaves_are_arguments_named_by_slot() {
        let j = parse_json(
            br#"{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]},
                 [{"type": "int", "value": 4}, {"type": "int", "value": 8}], {"type": "float", "value": 2.0},
                 null, {"type": "slice", "value": [0, null, 1]}, {"type": "float", "value": NaN}],
                "input_kwargs": {"eps": {"type": "float", "value": 1e-05}, "inplace": {"type": "bool", "value": false},
                 "dtype": {"type": "torch.dtype", "value": "torch.bfloat16"},
                 "device": {"type": "torch.device", "value": "npu:0"}, "size": {"type": "torch.Size", "value": [2, 3]}},
                "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}]}"#,
        )
        .unwrap();
        let op = convert(&j);
        assert_eq!(
            op.args.as_deref(),
            Some(
                r#"{"input.1":[4,8],"input.2":2.0,"input.5":"nan","input.dtype":"torch.bfloat16","input.eps":0.00001,"input.inplace":false,"input.size":[2,3]}"#
            )
        );
    }

    #[test]
    fn a_recorded_dropout_switch_reads_as_probe_s() {
        // SDPA's dropout_p by keyword, F.dropout's training by position: the slots
        // args::draw_switch reads in probe's form.
        let sdpa = convert(
            &parse_json(
                br#"{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}],
                    "input_kwargs": {"dropout_p": {"type": "float", "value": 0.0}, "is_causal": {"type": "bool", "value": true}}}"#,
            )
            .unwrap(),
        );
        assert_eq!(
            crate::dump::args::draw_switch(
                "Functional.scaled_dot_product_attention",
                sdpa.args.as_deref().unwrap()
            ),
            Some((true, "input.dropout_p = 0.0".into()))
        );
        let dropout = convert(
            &parse_json(
                br#"{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]},
                    {"type": "float", "value": 0.1}, {"type": "bool", "value": false}]}"#,
            )
            .unwrap(),
        );
        assert_eq!(
            crate::dump::args::draw_switch("Functional.dropout", dropout.args.as_deref().unwrap()),
            Some((true, "input.2 = false".into()))
        );
    }

    #[test]
    fn dump_json_is_read_entry_by_entry_with_the_same_answers() {
        let dir = Path::new("/nonexistent");
        let leaf = r#"{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2]}"#;
        // Keys before, between and after `data`, nested values skipped unread, a later
        // `data` replacing an earlier one (as JSON object keys do), bare NaN accepted.
        let text = format!(
            r#"{{"data": {{"Torch.a.0.forward": {{"output": [{leaf}]}}}}, "level": {{"x": [1, {{"y": NaN}}]}},
                "task": "statistics", "data": {{"Torch.b.0.forward": {{"output": [{leaf}]}},
                "Torch.c.0.forward": {{"input_args": [{leaf}, {leaf}]}}}}, "framework": "pytorch"}}"#
        );
        let d = parse_dump(text.as_bytes(), dir).unwrap();
        let keys: Vec<_> = d
            .ops
            .iter()
            .map(|o| (o.key().text(), o.seq(), o.tensor_count()))
            .collect();
        assert_eq!(
            keys,
            [("Torch.b.0.forward", 0, 1), ("Torch.c.0.forward", 1, 2)]
        );
        assert_eq!(d.task.as_deref(), Some("statistics"));
        for (text, why) in [
            (
                r#"[{"data": {}}]"#,
                "top level is a list, expected an object",
            ),
            (r#""data""#, "top level is a string, expected an object"),
            (r#"{"data": [1]}"#, "\"data\" is a list, expected an object"),
            (r#"{"data": null}"#, "\"data\" is null, expected an object"),
            (r#"{"task": "tensor"}"#, "no \"data\" object"),
            (
                r#"{"data": {"Torch.a.0.forward": 3}}"#,
                "op Torch.a.0.forward: entry is a number, expected an object",
            ),
        ] {
            assert_eq!(parse_dump(text.as_bytes(), dir).unwrap_err(), why, "{text}");
        }
        for cut in [r#"{"data": {"Torch.a.0.forward": {}}"#, r#"{"data": {}} x"#] {
            let e = parse_dump(cut.as_bytes(), dir).unwrap_err();
            assert!(e.contains("line 1"), "a JSON error says where: {e}");
        }
    }
}
