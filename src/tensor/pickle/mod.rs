//! The restricted pickle machine behind [`super::pt`]: it runs the opcodes of a
//! `torch.save` pickle without importing or calling anything.
//!
//! Two policies. [`Policy::OneTensor`] (msprobe's one-tensor `.pt` files) knows only the
//! handful of globals a saved tensor needs and refuses any other. [`Policy::Checkpoint`]
//! (a state dict, a Megatron `model_optim_rng.pt`, a DCP `.metadata`) also accepts the
//! classes such files hold beside their tensors (`argparse.Namespace`, numpy arrays of RNG
//! states, torch dtypes, DCP's dataclasses, Megatron enums) as *opaque* objects: their
//! constructor is never called, their arguments and state are kept as data. A global that
//! only code execution needs (`os.system`, `builtins.eval`, `torch.load`, ...) is an error
//! under both policies, and so is a tensor kind probe cannot locate (quantized, sparse).

mod budget;
mod tree;

use budget::{cost, Budget, Held};
pub use tree::{parse_tree, Node};

use crate::dtype::DType;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What the machine accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// One saved tensor (msprobe's `.pt` files): only the globals a tensor needs.
    OneTensor,
    /// A checkpoint: tensors in nested containers, with opaque objects beside them.
    Checkpoint,
}

/// Largest number of opcodes run, and deepest stack, before giving up (one tensor; a
/// checkpoint's pickle runs a few dozen opcodes a tensor, DCP's metadata more a chunk).
const MAX_OPS: usize = 1 << 20;
const MAX_OPS_CHECKPOINT: usize = 1 << 27;
const MAX_STACK: usize = 1 << 16;
/// Deepest nesting of containers turned into a [`Node`] (a state dict nests a few levels).
const MAX_DEPTH: usize = 64;
/// Most dimensions a tensor may have (PyTorch's own limit is far below).
const MAX_DIMS: usize = 64;
/// Longest storage key (torch.save writes "0", "1", ...).
const MAX_KEY: usize = 64;

/// Element type of a storage class (`None` for `UntypedStorage`: bytes of unknown type).
fn storage_dtype(module: &str, name: &str) -> Option<Option<DType>> {
    if name == "UntypedStorage" && (module == "torch.storage" || module == "torch") {
        return Some(None);
    }
    if module != "torch" {
        return None;
    }
    Some(Some(match name {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        _ => return None,
    }))
}

#[derive(Debug, Clone, PartialEq)]
enum Global {
    RebuildTensorV2,
    RebuildParameter,
    RebuildFromTypeV2,
    OrderedDict,
    /// `torch.Tensor` / `torch.nn.parameter.Parameter` as the type argument of
    /// `_rebuild_from_type_v2`.
    TensorType,
    Storage(Option<DType>),
    /// A class or function a checkpoint holds beside its tensors ([`Policy::Checkpoint`]):
    /// never called; a call of it is an opaque [`Node::Object`]. Its dotted name.
    Opaque(String),
}

/// The modules whose globals a checkpoint may name as opaque objects.
const OPAQUE_MODULES: &[&str] = &[
    "torch",
    "collections",
    "argparse",
    "numpy",
    "_codecs",
    "megatron",
    "mindspeed",
    "transformers",
    "enum",
    "datetime",
    "pathlib",
];

/// Harmless builtins a checkpoint may hold (containers and numbers).
const OPAQUE_BUILTINS: &[&str] = &["set", "frozenset", "slice", "complex", "bytearray", "range"];

/// Whether a checkpoint may name `module.name` as an opaque object: a module of
/// [`OPAQUE_MODULES`] (or `io.BytesIO`, TransformerEngine's extra state), no name that
/// only running code needs (loading, importing, evaluating), no tensor kind that would
/// go unread.
fn opaque_allowed(module: &str, name: &str) -> std::result::Result<(), String> {
    let root = module.split('.').next().unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    let code = [
        "load", "exec", "eval", "system", "import", "compile", "open", "spawn", "popen",
    ]
    .iter()
    .any(|w| lower.contains(w))
        || module.contains("hub")
        || module.starts_with("torch.ops")
        || module.starts_with("torch._ops");
    let known = OPAQUE_MODULES.contains(&root)
        || (module == "io" && name == "BytesIO")
        || (module == "builtins" && OPAQUE_BUILTINS.contains(&name));
    if !known || code {
        return Err(format!(
            "pickle refers to {module}.{name}, which a checkpoint does not need; not loaded"
        ));
    }
    if name.starts_with("_rebuild") {
        return Err(format!(
            "a tensor rebuilt by {module}.{name} (quantized, sparse or a subclass): not supported"
        ));
    }
    Ok(())
}

fn resolve_global(module: &str, name: &str, policy: Policy) -> std::result::Result<Global, String> {
    if let Some(dt) = storage_dtype(module, name) {
        return Ok(Global::Storage(dt));
    }
    Ok(match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") if policy == Policy::Checkpoint => {
            Global::RebuildParameter
        }
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch", "Tensor") | ("torch.nn.parameter", "Parameter") => Global::TensorType,
        _ if policy == Policy::Checkpoint => {
            opaque_allowed(module, name)?;
            Global::Opaque(format!("{module}.{name}"))
        }
        _ => {
            return Err(format!(
                "pickle refers to {module}.{name}, which a saved tensor does not need; not loaded"
            ))
        }
    })
}

/// A storage named by a persistent id.
#[derive(Debug, Clone, PartialEq)]
struct StorageRef {
    dtype: Option<DType>,
    key: String,
    /// Elements (bytes for an untyped storage).
    numel: u64,
}

/// A tensor rebuilt from the pickle, not yet checked against the archive.
#[derive(Debug, Clone, PartialEq)]
pub struct PickledTensor {
    /// Element type of the storage; None for an untyped storage.
    pub dtype: Option<DType>,
    /// Name of the storage's entry under `<archive>/data/`.
    pub storage_key: String,
    /// Storage length in elements (bytes when `dtype` is `None`).
    pub storage_numel: u64,
    /// Offset of the tensor's first element in its storage, in elements.
    pub storage_offset: u64,
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Stride of each dimension, in elements.
    pub stride: Vec<i64>,
}

#[derive(Debug, Clone)]
enum V {
    Mark,
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes,
    Tuple(Vec<Val>),
    List(Rc<RefCell<Vec<Val>>>),
    Dict(Rc<RefCell<Vec<(Val, Val)>>>),
    Global(Global),
    Storage(StorageRef),
    Tensor(Box<PickledTensor>),
    /// An opaque class called (REDUCE, NEWOBJ) with these arguments; BUILD's state.
    Object(Rc<Obj>),
}

/// An opaque object: never constructed, its class name, arguments and state kept.
#[derive(Debug)]
struct Obj {
    class: String,
    args: Val,
    state: RefCell<Option<Val>>,
}

type Val = Rc<V>;

impl Drop for V {
    /// A pickle nests values as deep as it likes (a million TUPLE1 opcodes nest a million
    /// tuples): they are taken apart here with a work list, as recursive drops would
    /// overflow the thread's stack.
    fn drop(&mut self) {
        let mut work = Vec::new();
        take_children(self, &mut work);
        while let Some(v) = work.pop() {
            // A value still shared elsewhere is taken apart when its last holder is.
            if let Ok(mut v) = Rc::try_unwrap(v) {
                take_children(&mut v, &mut work);
            }
        }
    }
}

/// Moves the values `v` holds (if `v` is their only holder) into `work`.
fn take_children(v: &mut V, work: &mut Vec<Val>) {
    match v {
        V::Tuple(items) => work.append(items),
        V::List(l) => {
            if let Some(cell) = Rc::get_mut(l) {
                work.append(cell.get_mut());
            }
        }
        V::Dict(d) => {
            if let Some(cell) = Rc::get_mut(d) {
                for (k, x) in cell.get_mut().drain(..) {
                    work.push(k);
                    work.push(x);
                }
            }
        }
        V::Object(o) => {
            if let Some(o) = Rc::get_mut(o) {
                work.push(std::mem::replace(&mut o.args, Rc::new(V::None)));
                work.extend(o.state.get_mut().take());
            }
        }
        _ => {}
    }
}

impl V {
    fn kind(&self) -> &'static str {
        match self {
            V::Mark => "mark",
            V::None => "None",
            V::Bool(_) => "bool",
            V::Int(_) => "int",
            V::Float(_) => "float",
            V::Str(_) => "str",
            V::Bytes => "bytes",
            V::Tuple(_) => "tuple",
            V::List(_) => "list",
            V::Dict(_) => "dict",
            V::Global(_) => "class or function",
            V::Storage(_) => "storage",
            V::Tensor(_) => "tensor",
            V::Object(_) => "object",
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("pickle ends early (needs {n} bytes at byte {})", self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn le<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn line(&mut self) -> std::result::Result<&'a str, String> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or("pickle ends inside a text argument")?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| "text argument is not UTF-8")?;
        self.pos += n + 1;
        Ok(s)
    }
    fn string(&mut self, n: usize) -> std::result::Result<String, String> {
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
}

fn as_int(v: &V, what: &str) -> std::result::Result<i64, String> {
    match v {
        V::Int(i) => Ok(*i),
        V::Bool(b) => Ok(*b as i64),
        o => Err(format!("{what} is a {}, expected an int", o.kind())),
    }
}

fn int_tuple(v: &V, what: &str) -> std::result::Result<Vec<i64>, String> {
    let n = match v {
        V::Tuple(items) => items.len(),
        V::List(items) => items.borrow().len(),
        _ => 0,
    };
    if n > MAX_DIMS {
        return Err(format!("{what} has {n} dimensions, more than {MAX_DIMS}"));
    }
    match v {
        V::Tuple(items) => items.iter().map(|x| as_int(x, what)).collect(),
        V::List(items) => items.borrow().iter().map(|x| as_int(x, what)).collect(),
        o => Err(format!("{what} is a {}, expected a tuple", o.kind())),
    }
}

fn persistent_load(pid: &V) -> std::result::Result<V, String> {
    let V::Tuple(items) = pid else {
        return Err(format!(
            "persistent id is a {}, expected a tuple",
            pid.kind()
        ));
    };
    match items.first().map(|v| &**v) {
        Some(V::Str(s)) if s == "storage" => {}
        _ => return Err("persistent id is not a ('storage', ...) record".into()),
    }
    if items.len() != 5 {
        return Err(format!(
            "storage record has {} fields, expected 5",
            items.len()
        ));
    }
    let dtype = match &*items[1] {
        V::Global(Global::Storage(dt)) => *dt,
        o => {
            return Err(format!(
                "storage type is a {}, expected a storage class",
                o.kind()
            ))
        }
    };
    let key = match &*items[2] {
        V::Str(s) => s,
        o => return Err(format!("storage key is a {}, expected a str", o.kind())),
    };
    if key.len() > MAX_KEY {
        return Err(format!("storage key of {} bytes is too long", key.len()));
    }
    // A key is a file name inside the archive: refuse anything that could name another entry.
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("storage key {key:?} is not a plain name"));
    }
    let key = key.clone();
    let numel = as_int(&items[4], "storage size")?;
    let numel = u64::try_from(numel).map_err(|_| format!("storage size {numel} is negative"))?;
    Ok(V::Storage(StorageRef { dtype, key, numel }))
}

fn rebuild_tensor_v2(args: &[Val]) -> std::result::Result<V, String> {
    if !(4..=7).contains(&args.len()) {
        return Err(format!(
            "_rebuild_tensor_v2 called with {} arguments",
            args.len()
        ));
    }
    let V::Storage(st) = &*args[0] else {
        return Err(format!(
            "_rebuild_tensor_v2: first argument is a {}, expected a storage",
            args[0].kind()
        ));
    };
    let offset = as_int(&args[1], "storage offset")?;
    let offset =
        u64::try_from(offset).map_err(|_| format!("storage offset {offset} is negative"))?;
    let shape = int_tuple(&args[2], "size")?
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let stride = int_tuple(&args[3], "stride")?;
    if stride.len() != shape.len() {
        return Err(format!(
            "size has {} dimensions, stride {}",
            shape.len(),
            stride.len()
        ));
    }
    Ok(V::Tensor(Box::new(PickledTensor {
        dtype: st.dtype,
        storage_key: st.key.clone(),
        storage_numel: st.numel,
        storage_offset: offset,
        shape,
        stride,
    })))
}

fn call(f: &Global, args_val: &Val) -> std::result::Result<V, String> {
    if let Global::Opaque(class) = f {
        return Ok(V::Object(Rc::new(Obj {
            class: class.clone(),
            args: args_val.clone(),
            state: RefCell::new(None),
        })));
    }
    let V::Tuple(args) = &**args_val else {
        return Err(format!(
            "call arguments are a {}, expected a tuple",
            args_val.kind()
        ));
    };
    match f {
        Global::RebuildTensorV2 => rebuild_tensor_v2(args),
        Global::OrderedDict if args.is_empty() => Ok(V::Dict(Rc::default())),
        Global::RebuildParameter if !args.is_empty() => match &*args[0] {
            V::Tensor(t) => Ok(V::Tensor(t.clone())),
            o => Err(format!("_rebuild_parameter of a {}", o.kind())),
        },
        Global::RebuildFromTypeV2 if args.len() >= 3 => {
            // (func, new_type, args, state): only a plain tensor or parameter type.
            match (&*args[0], &*args[1]) {
                (
                    V::Global(inner @ (Global::RebuildTensorV2 | Global::RebuildParameter)),
                    V::Global(Global::TensorType),
                ) => call(inner, &args[2]),
                _ => Err("_rebuild_from_type_v2 of an unknown type".into()),
            }
        }
        g => Err(format!(
            "{g:?} cannot be called with {} arguments",
            args.len()
        )),
    }
}

fn pop_mark(stack: &mut Vec<Val>) -> std::result::Result<Vec<Val>, String> {
    let m = stack
        .iter()
        .rposition(|v| matches!(**v, V::Mark))
        .ok_or("no mark on the pickle stack")?;
    let items = stack.split_off(m + 1);
    stack.pop();
    Ok(items)
}

/// What one opcode does to the machine.
enum Step {
    /// Push this value.
    Push(V),
    /// Nothing to push: the opcode changed the stack or the memo, or only read.
    Next,
    /// STOP with the value the pickle built.
    Stop(Val),
}

fn pop(stack: &mut Vec<Val>) -> std::result::Result<Val, String> {
    stack.pop().ok_or("pickle stack underflow".to_string())
}

fn top(stack: &[Val]) -> std::result::Result<Val, String> {
    stack
        .last()
        .cloned()
        .ok_or("pickle stack is empty".to_string())
}

/// Runs the opcodes, each by its family: a literal read from the stream, a container
/// built or filled, or the machine's own (stack, memo, globals, calls).
fn run_pickle(
    bytes: &[u8],
    policy: Policy,
    budget: &mut Budget,
    held: &mut Held,
) -> std::result::Result<Val, String> {
    let mut r = Reader { b: bytes, pos: 0 };
    let mut stack: Vec<Val> = Vec::new();
    let mut memo: HashMap<u32, Val> = HashMap::new();
    let max_ops = match policy {
        Policy::OneTensor => MAX_OPS,
        Policy::Checkpoint => MAX_OPS_CHECKPOINT,
    };
    for _ in 0..max_ops {
        if stack.len() > MAX_STACK {
            return Err("pickle stack grows too deep".into());
        }
        let at = r.pos;
        let op = r.u8()?;
        let step = match literal(op, &mut r)? {
            Some(v) => Step::Push(v),
            None => match container(op, &mut stack)? {
                Some(step) => step,
                None => match objects(op, &mut r, &mut stack, policy)? {
                    Some(step) => step,
                    None => machine(op, at, &mut r, &mut stack, &mut memo)?,
                },
            },
        };
        match step {
            Step::Push(v) => {
                budget.charge(cost(&v))?;
                let v = Rc::new(v);
                if matches!(*v, V::List(_) | V::Dict(_) | V::Object(_)) {
                    held.0.push(v.clone());
                }
                stack.push(v);
            }
            // A value repeated (memo, DUP), or items moved into a container: a slot each.
            Step::Next => budget.charge(std::mem::size_of::<Val>())?,
            Step::Stop(t) => return Ok(t),
        }
    }
    Err("pickle runs too long".into())
}

/// The opcodes that push a value read from the stream (None, booleans, integers, floats,
/// strings, bytes); None for any other opcode, with nothing read.
fn literal(op: u8, r: &mut Reader) -> std::result::Result<Option<V>, String> {
    Ok(Some(match op {
        b'N' => V::None,
        0x88 => V::Bool(true),
        0x89 => V::Bool(false),
        b'J' => V::Int(i32::from_le_bytes(r.le()?) as i64),
        b'K' => V::Int(r.u8()? as i64),
        b'M' => V::Int(u16::from_le_bytes(r.le()?) as i64),
        0x8a => {
            let n = r.u8()? as usize;
            let b = r.take(n)?;
            if n > 8 {
                return Err(format!("integer of {n} bytes is too large"));
            }
            let mut a = if b.last().is_some_and(|x| x & 0x80 != 0) {
                [0xffu8; 8]
            } else {
                [0u8; 8]
            };
            a[..n].copy_from_slice(b);
            V::Int(i64::from_le_bytes(a))
        }
        b'I' => {
            let s = r.line()?;
            match s {
                "00" => V::Bool(false),
                "01" => V::Bool(true),
                _ => V::Int(s.parse().map_err(|_| format!("bad INT {s:?}"))?),
            }
        }
        b'G' => V::Float(f64::from_be_bytes(r.le()?)),
        b'X' => {
            let n = u32::from_le_bytes(r.le()?) as usize;
            V::Str(r.string(n)?)
        }
        0x8c => {
            let n = r.u8()? as usize;
            V::Str(r.string(n)?)
        }
        0x8d => {
            let n = u64::from_le_bytes(r.le()?);
            let n = usize::try_from(n).map_err(|_| "string too long")?;
            V::Str(r.string(n)?)
        }
        b'U' | b'C' => {
            let n = r.u8()? as usize;
            r.take(n)?;
            V::Bytes
        }
        b'T' | b'B' => {
            let n = u32::from_le_bytes(r.le()?) as usize;
            r.take(n)?;
            V::Bytes
        }
        _ => return Ok(None),
    }))
}

/// The opcodes that build or fill a container (mark, tuple, list, dict); None for any
/// other opcode, with the stack untouched.
fn container(op: u8, stack: &mut Vec<Val>) -> std::result::Result<Option<Step>, String> {
    Ok(Some(Step::Push(match op {
        b'(' => V::Mark,
        b')' => V::Tuple(vec![]),
        b't' => V::Tuple(pop_mark(stack)?),
        0x85..=0x87 => {
            let n = (op - 0x84) as usize;
            if stack.len() < n {
                return Err("pickle stack underflow".into());
            }
            let items = stack.split_off(stack.len() - n);
            if items.iter().any(|v| matches!(**v, V::Mark)) {
                return Err("a mark inside a tuple".into());
            }
            V::Tuple(items)
        }
        b']' => V::List(Rc::default()),
        b'l' => V::List(Rc::new(RefCell::new(pop_mark(stack)?))),
        b'a' | b'e' => {
            let items = if op == b'a' {
                vec![pop(stack)?]
            } else {
                pop_mark(stack)?
            };
            let l = top(stack)?;
            let V::List(l) = &*l else {
                return Err(format!("append to a {}", l.kind()));
            };
            l.borrow_mut().extend(items);
            return Ok(Some(Step::Next));
        }
        b'}' => V::Dict(Rc::default()),
        b'd' | b'u' | b's' => {
            let items = if op == b's' {
                let v = pop(stack)?;
                let k = pop(stack)?;
                vec![k, v]
            } else {
                pop_mark(stack)?
            };
            if items.len() % 2 != 0 {
                return Err("odd number of dict items".into());
            }
            let pairs: Vec<(Val, Val)> = items
                .chunks_exact(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect();
            if op == b'd' {
                V::Dict(Rc::new(RefCell::new(pairs)))
            } else {
                let d = top(stack)?;
                let V::Dict(d) = &*d else {
                    return Err(format!("set item on a {}", d.kind()));
                };
                d.borrow_mut().extend(pairs);
                return Ok(Some(Step::Next));
            }
        }
        _ => return Ok(None),
    })))
}

/// The machine's own opcodes: protocol and frames, STOP, the stack, the memo, globals,
/// calls, persistent ids, BUILD. Any other opcode (`at`: its byte) is refused.
fn machine(
    op: u8,
    at: usize,
    r: &mut Reader,
    stack: &mut Vec<Val>,
    memo: &mut HashMap<u32, Val>,
) -> std::result::Result<Step, String> {
    match op {
        0x80 => {
            let p = r.u8()?;
            if p > 5 {
                return Err(format!("pickle protocol {p} is not supported"));
            }
            Ok(Step::Next)
        }
        0x95 => {
            r.take(8)?; // FRAME: a length hint only
            Ok(Step::Next)
        }
        b'.' => Ok(Step::Stop(pop(stack)?)),
        b'0' => {
            pop(stack)?;
            Ok(Step::Next)
        }
        b'1' => {
            pop_mark(stack)?;
            Ok(Step::Next)
        }
        b'2' => {
            let t = top(stack)?;
            stack.push(t);
            Ok(Step::Next)
        }
        b'q' | b'r' | 0x94 => {
            let idx = match op {
                b'q' => r.u8()? as u32,
                b'r' => u32::from_le_bytes(r.le()?),
                _ => memo.len() as u32,
            };
            memo.insert(idx, top(stack)?);
            Ok(Step::Next)
        }
        b'h' | b'j' => {
            let idx = if op == b'h' {
                r.u8()? as u32
            } else {
                u32::from_le_bytes(r.le()?)
            };
            let v = memo
                .get(&idx)
                .cloned()
                .ok_or_else(|| format!("memo entry {idx} read before it is written"))?;
            stack.push(v);
            Ok(Step::Next)
        }
        other => Err(format!(
            "pickle opcode 0x{other:02x} at byte {at} is not supported"
        )),
    }
}

/// The opcodes that name, call or fill objects: globals, REDUCE, NEWOBJ(_EX), persistent
/// ids, BUILD, sets. None for any other opcode, with nothing read.
fn objects(
    op: u8,
    r: &mut Reader,
    stack: &mut Vec<Val>,
    policy: Policy,
) -> std::result::Result<Option<Step>, String> {
    let checkpoint = policy == Policy::Checkpoint;
    Ok(Some(Step::Push(match op {
        b'c' => {
            let module = r.line()?.to_string();
            let name = r.line()?;
            V::Global(resolve_global(&module, name, policy)?)
        }
        0x93 => {
            let name = pop(stack)?;
            let module = pop(stack)?;
            match (&*module, &*name) {
                (V::Str(m), V::Str(n)) => V::Global(resolve_global(m, n, policy)?),
                _ => return Err("STACK_GLOBAL without two strings".into()),
            }
        }
        b'R' => {
            let args = pop(stack)?;
            let f = pop(stack)?;
            let V::Global(g) = &*f else {
                return Err(format!("call of a {}", f.kind()));
            };
            call(g, &args)?
        }
        // NEWOBJ (cls, args) and NEWOBJ_EX (cls, args, kwargs): an opaque class only.
        0x81 | 0x92 if checkpoint => {
            if op == 0x92 {
                pop(stack)?;
            }
            let args = pop(stack)?;
            let cls = pop(stack)?;
            match &*cls {
                V::Global(g @ Global::Opaque(_)) => call(g, &args)?,
                o => return Err(format!("NEWOBJ of a {}", o.kind())),
            }
        }
        b'Q' => {
            let pid = pop(stack)?;
            persistent_load(&pid)?
        }
        b'b' => {
            build(stack, policy)?;
            return Ok(Some(Step::Next));
        }
        // EMPTY_SET, FROZENSET: kept as lists; ADDITEMS fills the set on the stack.
        0x8f if checkpoint => V::List(Rc::default()),
        0x91 if checkpoint => V::List(Rc::new(RefCell::new(pop_mark(stack)?))),
        0x90 if checkpoint => {
            let items = pop_mark(stack)?;
            let l = top(stack)?;
            let V::List(l) = &*l else {
                return Err(format!("ADDITEMS to a {}", l.kind()));
            };
            l.borrow_mut().extend(items);
            return Ok(Some(Step::Next));
        }
        _ => return Ok(None),
    })))
}

/// BUILD: one tensor's pickle sets only an empty state on an OrderedDict or a tensor; a
/// checkpoint's sets any state, kept on an opaque object and ignored on the others.
fn build(stack: &mut Vec<Val>, policy: Policy) -> std::result::Result<(), String> {
    let state = pop(stack)?;
    let obj = top(stack)?;
    if policy == Policy::Checkpoint {
        if let V::Object(o) = &*obj {
            *o.state.borrow_mut() = Some(state);
        }
        return Ok(());
    }
    let empty = match &*state {
        V::None => true,
        V::Dict(d) => d.borrow().is_empty(),
        V::Tuple(t) => t.is_empty(),
        _ => false,
    };
    if !(empty && matches!(*obj, V::Dict(_) | V::Tensor(_))) {
        return Err(format!("BUILD of a {} with state", obj.kind()));
    }
    Ok(())
}

/// Runs the restricted pickle machine over one tensor's `data.pkl` ([`Policy::OneTensor`])
/// and returns the tensor it builds.
pub fn parse_one(bytes: &[u8]) -> std::result::Result<PickledTensor, String> {
    // Declared first, dropped last: the containers are emptied once the value is read.
    let mut held = Held::default();
    let v = run_pickle(
        bytes,
        Policy::OneTensor,
        &mut Budget::for_input(bytes.len()),
        &mut held,
    )?;
    match &*v {
        V::Tensor(t) => Ok((**t).clone()),
        o => Err(format!(
            "the file holds a {}, not a single tensor (msprobe saves one tensor per file)",
            o.kind()
        )),
    }
}
