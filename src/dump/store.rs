//! A rank's op log held compactly ([`Ops`]): what a compare keeps of every op and tensor
//! record while it aligns, measures, judges and reports a step/rank pair.
//!
//! Why: one step/rank pair of a large job holds a million tensor records per side. Held as
//! one struct per op and per tensor, each with allocations of its own (key, name, shape,
//! the op's tensor list), they took about 400 bytes a tensor: 0.8 GB for the two sides of
//! such a pair, more than a whole compare may use (issue 14: 512 MB). Here every op (48
//! bytes) and every tensor (64 bytes) is a fixed-size slot in one vector; op keys, checksums
//! and shapes live in shared arenas; module paths, dtypes and tensor slots are interned, so
//! a tensor named after its op (`Functional.gelu.0.forward` + `.input.0`, as both dump
//! formats name them) holds an index for its name; what few records have (a data location,
//! a checksum, both dataflow ids, a name of its own) is in side tables. About 110 bytes a
//! tensor with its share of its op.
//!
//! Readers fill an [`OpsBuilder`] op by op ([`OpIn`], [`TensorIn`]: borrowed parts, so a
//! parsed line is copied once, into the arenas); everything after reads through borrowed
//! views ([`Op`], [`Tensor`]) whose accessors mirror the fields of the owned records
//! ([`OpRec`], [`TensorRec`]), which remain the form a test or a tool builds ops in.

use super::{Collective, Direction, OpKind, OpRec, Role, Stats, TensorRec};
use crate::dtype::{AnyDType, DType};
use crate::op_key::{KeyParts, KeyRef};
use crate::tensor::Data;
use std::borrow::Cow;
use std::num::NonZeroU8;
use std::ops::Range;
use std::sync::Arc;

// OpSlot::bits: the op key's parts (KeyParts::pack) in bits 0-3, then:
const KIND_SHIFT: u16 = 4; // 2 bits: api, module, parameters_grad
const BACKWARD: u16 = 1 << 6;
const HAS_STACK: u16 = 1 << 7;
const RECOMPUTE: u16 = 1 << 8;
const HAS_COLLECTIVE: u16 = 1 << 9;
const HAS_ARGS: u16 = 1 << 10;

// TensorSlot::bits: the role in bits 0-1, then:
const HAS_ID: u8 = 1 << 2;
const HAS_SRC: u8 = 1 << 3;
/// The name is the op key, a dot and an interned slot (else a name of its own).
const SLOT_NAME: u8 = 1 << 4;
/// A checksum or data location in `extras`.
const HAS_EXTRA: u8 = 1 << 5;
/// Read from memory nothing had written ([`Tensor::unwritten`]).
const UNWRITTEN: u8 = 1 << 6;

/// One op (48 bytes): its key's text in the arena, what few ops have in side tables.
#[derive(Debug, Clone)]
struct OpSlot {
    seq: u64,
    stack: u64,
    /// The key's call counter (KeyParts).
    call: u64,
    /// The key: `text[key..key + key_len]`.
    key: u32,
    key_len: u16,
    /// The key's base length (KeyParts; at most its length).
    base_len: u16,
    /// Index of its first tensor (its last is the next op's first, minus one).
    first: u32,
    /// Index into `modules`, or [`NONE`].
    module: u32,
    bits: u16,
}

/// One tensor (64 bytes), statistics unpacked so the small fields share their padding.
/// What few tensors have lives in side tables: a checksum or data location (`extras`), a
/// dataflow `src` beside an `id`, NaN/Inf counts past `u32`, a name of its own.
#[derive(Debug, Clone)]
struct TensorSlot {
    /// [`Stats`]' values; `present` is its presence mask (0: no statistics).
    values: [f64; 4],
    /// The dataflow id: `id` when HAS_ID, else `src` when HAS_SRC (with both, `src` is in
    /// `both_src`).
    flow: u64,
    /// NaN and Inf counts; [`BIG`] in either: both are in `big_counts`.
    counts: [u32; 2],
    /// With SLOT_NAME an index into `slots`, else into `own_names`.
    name: u32,
    /// The shape: `dims[dims..dims + ndim]`.
    dims: u32,
    /// Below [`KNOWN`]'s length a known dtype, else `other_dtypes[dtype - KNOWN.len()]`.
    dtype: u8,
    ndim: u8,
    present: u8,
    bits: u8,
}

/// "None" of an index into a side table.
const NONE: u32 = u32::MAX;

/// A count too large for a slot's `u32`: the counts are in `big_counts`.
const BIG: u32 = u32::MAX;

/// What few tensors have: a checksum (a span of `text`) or where its values are.
#[derive(Debug, Clone, Default)]
struct Extra {
    checksum: Option<(u32, u32)>,
    data: Option<Data>,
}

fn role_bits(r: Role) -> u8 {
    match r {
        Role::Input => 0,
        Role::Output => 1,
        Role::Parameter => 2,
    }
}

fn kind_bits(k: OpKind) -> u16 {
    match k {
        OpKind::Api => 0,
        OpKind::Module => 1,
        OpKind::ParametersGrad => 2,
    }
}

/// The dtypes probe decodes, by the index a tensor slot stores.
static KNOWN: [AnyDType; 10] = [
    AnyDType::Known(DType::F64),
    AnyDType::Known(DType::F32),
    AnyDType::Known(DType::F16),
    AnyDType::Known(DType::BF16),
    AnyDType::Known(DType::I64),
    AnyDType::Known(DType::I32),
    AnyDType::Known(DType::I16),
    AnyDType::Known(DType::I8),
    AnyDType::Known(DType::U8),
    AnyDType::Known(DType::Bool),
];

fn known_index(d: DType) -> u8 {
    match d {
        DType::F64 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::I64 => 4,
        DType::I32 => 5,
        DType::I16 => 6,
        DType::I8 => 7,
        DType::U8 => 8,
        DType::Bool => 9,
    }
}

/// The op records of one rank, in execution order, held compactly (see the module docs).
/// Immutable once built: [`Ops::retained`] and [`Ops::truncated`] make new ones.
#[derive(Debug, Clone, Default)]
pub struct Ops {
    ops: Vec<OpSlot>,
    tensors: Vec<TensorSlot>,
    /// Op keys, names of their own and checksums.
    text: String,
    /// Every shape, one after the other.
    dims: Vec<usize>,
    /// Module paths, each once: every op of a module shares it.
    modules: Vec<Arc<str>>,
    /// Tensor slots (`input.0`, `output.1`), each once.
    slots: Vec<Box<str>>,
    /// Names that are not their op's key and a slot: spans of `text`.
    own_names: Vec<(u32, u32)>,
    /// Dtypes probe does not decode, each once.
    other_dtypes: Vec<AnyDType>,
    /// (tensor, checksum and data location), by tensor.
    extras: Vec<(u32, Extra)>,
    /// (tensor, src) of tensors with both an `id` and a `src`, by tensor.
    both_src: Vec<(u32, u64)>,
    /// (tensor, [nan, inf]) of tensors whose counts do not fit `u32`, by tensor.
    big_counts: Vec<(u32, [u64; 2])>,
    /// (op, collective) of collective calls, by op.
    collectives: Vec<(u32, Collective)>,
    /// (op, span of `text`) of ops with recorded non-tensor arguments (canonical JSON,
    /// `super::args`), by op.
    args: Vec<(u32, (u32, u32))>,
}

/// The entry of `key` in a side table sorted by it.
fn side<K: Ord + Copy, T>(table: &[(K, T)], key: K) -> Option<&T> {
    let k = table.partition_point(|e| e.0 < key);
    table.get(k).filter(|e| e.0 == key).map(|e| &e.1)
}

/// An op as a reader hands it to [`OpsBuilder::push`], borrowed from what it parsed.
#[derive(Debug, Clone)]
pub struct OpIn<'x> {
    /// Execution order within the rank.
    pub seq: u64,
    /// The op key as written.
    pub key: &'x str,
    /// API, module or parameter-gradient record.
    pub kind: OpKind,
    /// Forward or backward.
    pub direction: Direction,
    /// The module path the call happened in, when known.
    pub module: Option<&'x str>,
    /// Id of the call stack.
    pub stack: Option<u64>,
    /// A recomputation (activation checkpointing).
    pub recompute: bool,
    /// The collective call it is, when it is one.
    pub collective: Option<Collective>,
    /// Its non-tensor arguments, canonical ([`super::args::canonical`]).
    pub args: Option<&'x str>,
}

/// A tensor of an op as a reader hands it to [`OpsBuilder::push`].
#[derive(Debug, Clone)]
pub struct TensorIn<'x> {
    /// Flattened name: op key + slot.
    pub name: &'x str,
    /// Input, output or parameter.
    pub role: Role,
    /// The dtype as written (parsed as [`AnyDType::parse`] does).
    pub dtype: &'x str,
    /// Dimensions.
    pub shape: &'x [usize],
    /// Statistics recorded at capture time.
    pub stats: Option<Stats>,
    /// A checksum of the raw bytes.
    pub checksum: Option<&'x str>,
    /// Dataflow id of an output.
    pub id: Option<u64>,
    /// Dataflow id of the captured output an input came from.
    pub src: Option<u64>,
    /// Where the values are, if dumped.
    pub data: Option<Data>,
    /// Read from memory nothing had written: leftover bytes.
    pub unwritten: bool,
}

/// Fills an [`Ops`] op by op.
#[derive(Debug, Default)]
pub struct OpsBuilder {
    ops: Ops,
    modules: foldhash::HashMap<Arc<str>, u32>,
    slots: foldhash::HashMap<Box<str>, u32>,
    dtypes: foldhash::HashMap<Box<str>, u8>,
}

/// A position in a u32-indexed table, or the error naming what overflowed.
fn index(n: usize, what: &str) -> Result<u32, String> {
    u32::try_from(n)
        .ok()
        .filter(|&i| i != NONE)
        .ok_or_else(|| format!("more than {} {what} in one op log", NONE - 1))
}

impl OpsBuilder {
    /// A builder with room reserved for an op log of about `bytes` bytes (reserved memory
    /// that is never written costs nothing; growing by doubling copies and touches it all).
    pub fn for_log_bytes(bytes: u64) -> OpsBuilder {
        let b = usize::try_from(bytes).unwrap_or(usize::MAX);
        let mut o = Ops::default();
        // What an op log line holds at least, about: an op in ~250 bytes, a tensor in
        // ~150, its shape and key in fewer.
        let _ = o.ops.try_reserve_exact(b / 250);
        let _ = o.tensors.try_reserve_exact(b / 150);
        let _ = o.text.try_reserve_exact(b / 8);
        let _ = o.dims.try_reserve_exact(b / 75);
        OpsBuilder {
            ops: o,
            ..OpsBuilder::default()
        }
    }

    /// What was pushed so far.
    pub fn ops(&self) -> &Ops {
        &self.ops
    }

    /// Ops pushed so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether none was pushed.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn text(&mut self, s: &str) -> Result<(u32, u32), String> {
        let at = index(self.ops.text.len(), "bytes of names")?;
        let len = index(s.len(), "bytes in a name")?;
        index(self.ops.text.len() + s.len(), "bytes of names")?;
        self.ops.text.push_str(s);
        Ok((at, len))
    }

    fn module(&mut self, path: &str) -> Result<u32, String> {
        if let Some(&i) = self.modules.get(path) {
            return Ok(i);
        }
        let i = index(self.ops.modules.len(), "module paths")?;
        let p: Arc<str> = path.into();
        self.ops.modules.push(p.clone());
        self.modules.insert(p, i);
        Ok(i)
    }

    fn slot(&mut self, slot: &str) -> Result<u32, String> {
        if let Some(&i) = self.slots.get(slot) {
            return Ok(i);
        }
        let i = index(self.ops.slots.len(), "tensor slots")?;
        self.ops.slots.push(slot.into());
        self.slots.insert(slot.into(), i);
        Ok(i)
    }

    fn dtype(&mut self, name: &str) -> Result<u8, String> {
        if let Some(d) = DType::parse(name) {
            return Ok(known_index(d));
        }
        if let Some(&i) = self.dtypes.get(name) {
            return Ok(i);
        }
        let i = u8::try_from(KNOWN.len() + self.ops.other_dtypes.len()).map_err(|_| {
            format!(
                "more than {} distinct dtypes probe does not decode in one op log",
                usize::from(u8::MAX) + 1 - KNOWN.len()
            )
        })?;
        self.ops.other_dtypes.push(AnyDType::parse(name));
        self.dtypes.insert(name.into(), i);
        Ok(i)
    }

    /// Appends one op and its tensors, or nothing (an error names what does not fit).
    pub fn push<'x>(
        &mut self,
        op: OpIn<'x>,
        tensors: impl IntoIterator<Item = TensorIn<'x>>,
    ) -> Result<(), String> {
        let mark = self.mark();
        let r = self.push_unchecked(op, tensors);
        if r.is_err() {
            self.undo(mark);
        }
        r
    }

    fn mark(&self) -> [usize; 10] {
        let o = &self.ops;
        [
            o.ops.len(),
            o.tensors.len(),
            o.text.len(),
            o.dims.len(),
            o.own_names.len(),
            o.extras.len(),
            o.both_src.len(),
            o.big_counts.len(),
            o.collectives.len(),
            o.args.len(),
        ]
    }

    fn undo(&mut self, m: [usize; 10]) {
        let o = &mut self.ops;
        o.ops.truncate(m[0]);
        o.tensors.truncate(m[1]);
        o.text.truncate(m[2]);
        o.dims.truncate(m[3]);
        o.own_names.truncate(m[4]);
        o.extras.truncate(m[5]);
        o.both_src.truncate(m[6]);
        o.big_counts.truncate(m[7]);
        o.collectives.truncate(m[8]);
        o.args.truncate(m[9]);
    }

    fn push_unchecked<'x>(
        &mut self,
        op: OpIn<'x>,
        tensors: impl IntoIterator<Item = TensorIn<'x>>,
    ) -> Result<(), String> {
        let at = index(self.ops.ops.len(), "ops")?;
        let first = index(self.ops.tensors.len(), "tensors")?;
        let key_len = u16::try_from(op.key.len()).map_err(|_| {
            format!(
                "op key of {} bytes (longer than {} bytes: not an op key)",
                op.key.len(),
                u16::MAX
            )
        })?;
        let (key, _) = self.text(op.key)?;
        let (key_bits, call, base_len) = KeyParts::of(op.key).pack();
        let module = match op.module {
            Some(m) => self.module(m)?,
            None => NONE,
        };
        let mut bits = key_bits | kind_bits(op.kind) << KIND_SHIFT;
        if op.direction == Direction::Backward {
            bits |= BACKWARD;
        }
        if op.stack.is_some() {
            bits |= HAS_STACK;
        }
        if op.recompute {
            bits |= RECOMPUTE;
        }
        if let Some(c) = op.collective {
            bits |= HAS_COLLECTIVE;
            self.ops.collectives.push((at, c));
        }
        if let Some(a) = op.args {
            bits |= HAS_ARGS;
            let span = self.text(a)?;
            self.ops.args.push((at, span));
        }
        self.ops.ops.push(OpSlot {
            seq: op.seq,
            stack: op.stack.unwrap_or(0),
            call,
            key,
            key_len,
            // At most the key's length, which fits.
            base_len: base_len.min(u32::from(key_len)) as u16,
            first,
            module,
            bits,
        });
        for t in tensors {
            self.tensor(op.key, t)?;
        }
        Ok(())
    }

    fn tensor(&mut self, key: &str, t: TensorIn) -> Result<(), String> {
        let at = index(self.ops.tensors.len(), "tensors")?;
        let mut bits = role_bits(t.role);
        if t.unwritten {
            bits |= UNWRITTEN;
        }
        let name = match t.name.strip_prefix(key).and_then(|s| s.strip_prefix('.')) {
            Some(slot) => {
                bits |= SLOT_NAME;
                self.slot(slot)?
            }
            None => {
                let i = index(self.ops.own_names.len(), "tensor names")?;
                let span = self.text(t.name)?;
                self.ops.own_names.push(span);
                i
            }
        };
        let ndim = u8::try_from(t.shape.len())
            .map_err(|_| format!("tensor {}: {} dimensions", t.name, t.shape.len()))?;
        let dims = index(self.ops.dims.len(), "dimensions")?;
        index(self.ops.dims.len() + t.shape.len(), "dimensions")?;
        self.ops.dims.extend_from_slice(t.shape);
        let checksum = match t.checksum {
            Some(c) => Some(self.text(c)?),
            None => None,
        };
        if checksum.is_some() || t.data.is_some() {
            bits |= HAS_EXTRA;
            self.ops.extras.push((
                at,
                Extra {
                    checksum,
                    data: t.data,
                },
            ));
        }
        let dtype = self.dtype(t.dtype)?;
        let flow = match (t.id, t.src) {
            (Some(id), src) => {
                bits |= HAS_ID;
                if let Some(src) = src {
                    bits |= HAS_SRC;
                    self.ops.both_src.push((at, src));
                }
                id
            }
            (None, Some(src)) => {
                bits |= HAS_SRC;
                src
            }
            (None, None) => 0,
        };
        let (values, counts, present) = match t.stats {
            Some(st) => {
                let small = st
                    .counts
                    .map(|c| u32::try_from(c).ok().filter(|&c| c != BIG));
                let counts = match small {
                    [Some(n), Some(i)] => [n, i],
                    _ => {
                        self.ops.big_counts.push((at, st.counts));
                        [BIG, BIG]
                    }
                };
                (st.values, counts, st.present.get())
            }
            None => ([0.0; 4], [0; 2], 0),
        };
        self.ops.tensors.push(TensorSlot {
            values,
            flow,
            counts,
            name,
            dims,
            dtype,
            ndim,
            present,
            bits,
        });
        Ok(())
    }

    /// Appends an owned record.
    pub fn push_rec(&mut self, op: &OpRec) -> Result<(), String> {
        let tensors = op.tensors.iter().map(|t| TensorIn {
            name: &t.name,
            role: t.role,
            dtype: dtype_text(&t.dtype),
            shape: &t.shape,
            stats: t.stats,
            checksum: t.checksum.as_deref(),
            id: t.id,
            src: t.src,
            data: t.data.as_deref().cloned(),
            unwritten: t.unwritten,
        });
        self.push(
            OpIn {
                seq: op.seq,
                key: op.key.as_str(),
                kind: op.kind,
                direction: op.direction,
                module: op.module.as_deref(),
                stack: op.stack,
                recompute: op.recompute,
                collective: op.collective.as_deref().cloned(),
                args: op.args.as_deref(),
            },
            tensors,
        )
    }

    /// Every tensor's data location, with what a salvage needs to judge it (its name,
    /// dtype and element count), for a reader to repoint or drop before it finishes.
    pub(crate) fn each_data(
        &mut self,
        mut f: impl FnMut(&str, &AnyDType, usize, &mut Option<Data>),
    ) {
        for e in 0..self.ops.extras.len() {
            let at = self.ops.extras[e].0 as usize;
            if self.ops.extras[e].1.data.is_none() {
                continue;
            }
            let t = self.ops.tensor_at(at);
            let (name, dtype, numel) = (t.name().into_owned(), t.dtype().clone(), t.numel());
            f(&name, &dtype, numel, &mut self.ops.extras[e].1.data);
        }
    }

    /// The finished store.
    pub fn finish(self) -> Ops {
        self.ops
    }
}

/// A dtype as text that [`AnyDType::parse`] reads back as the same dtype.
fn dtype_text(d: &AnyDType) -> &str {
    match d {
        AnyDType::Known(k) => k.name(),
        AnyDType::Other(s) => s,
    }
}

impl Ops {
    /// A store of owned records (tests, tools): an error names what does not fit.
    pub fn from_records<'r>(records: impl IntoIterator<Item = &'r OpRec>) -> Result<Ops, String> {
        let mut b = OpsBuilder::default();
        for op in records {
            b.push_rec(op)?;
        }
        Ok(b.finish())
    }

    /// How many ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// How many tensors, over every op.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Op `i`. Panics past the end, as indexing does.
    pub fn get(&self, i: usize) -> Op<'_> {
        assert!(i < self.ops.len(), "op {i} of {}", self.ops.len());
        Op { ops: self, i }
    }

    /// The tensor at `flat` among all tensors of the store ([`Tensor::flat`]). Panics past
    /// the end, as indexing does.
    fn tensor_at(&self, flat: usize) -> Tensor<'_> {
        assert!(flat < self.tensors.len(), "tensor {flat}");
        // The last op starting at or before it (ops without tensors start where the next
        // one does, so the last is the one holding it).
        let op = self.ops.partition_point(|o| o.first as usize <= flat) - 1;
        Tensor {
            ops: self,
            op: op as u32,
            i: flat as u32,
        }
    }

    /// The last op.
    pub fn last(&self) -> Option<Op<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// Every op, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Op<'_>> + ExactSizeIterator + Clone {
        (0..self.ops.len()).map(move |i| Op { ops: self, i })
    }

    /// About how many bytes it holds (what the row budget counts; room reserved and never
    /// written is not counted: it costs no memory).
    pub fn weight(&self) -> usize {
        use std::mem::size_of;
        self.ops.len() * size_of::<OpSlot>()
            + self.tensors.len() * size_of::<TensorSlot>()
            + self.text.len()
            + self.dims.len() * size_of::<usize>()
            + self.modules.iter().map(|m| m.len() + 32).sum::<usize>()
            + self.slots.iter().map(|m| m.len() + 32).sum::<usize>()
            + self.own_names.len() * size_of::<(u32, u32)>()
            + self.extras.len() * (size_of::<(u32, Extra)>() + 64)
            + self.both_src.len() * size_of::<(u32, u64)>()
            + self.args.len() * size_of::<(u32, (u32, u32))>()
            + self.big_counts.len() * size_of::<(u32, [u64; 2])>()
            + self
                .collectives
                .iter()
                .map(|c| 40 + 4 * c.1.group.len())
                .sum::<usize>()
    }

    /// The positions of op `i`'s tensors among all tensors.
    fn range(&self, i: usize) -> Range<usize> {
        let start = self.ops[i].first as usize;
        let end = self
            .ops
            .get(i + 1)
            .map_or(self.tensors.len(), |o| o.first as usize);
        start..end
    }

    /// The ops `keep` keeps, in order (a new store; the others' tensors go with them).
    pub fn retained(self, keep: impl Fn(Op) -> bool) -> Ops {
        if self.iter().all(&keep) {
            return self;
        }
        let mut b = OpsBuilder::default();
        for op in self.iter().filter(|&o| keep(o)) {
            let names: Vec<Cow<str>> = op.tensors().map(Tensor::name).collect();
            let tensors = op
                .tensors()
                .zip(&names)
                .map(|(t, name)| TensorIn { name, ..t.parts() });
            // A part of what fitted once fits again.
            let _ = b.push(op.parts(), tensors);
        }
        b.finish()
    }

    /// The same ops and tensors, in the same places, each tensor's record as `f` makes it
    /// from its op and its own (a new store: what compare reads through a transformation).
    pub fn with_tensors(self, f: impl for<'a> Fn(Op<'a>, TensorIn<'a>) -> TensorIn<'a>) -> Ops {
        let mut b = OpsBuilder::default();
        for op in self.iter() {
            let names: Vec<Cow<str>> = op.tensors().map(Tensor::name).collect();
            let tensors = op
                .tensors()
                .zip(&names)
                .map(|(t, name)| f(op, TensorIn { name, ..t.parts() }));
            // What fitted once fits again (`f` only makes records smaller).
            let _ = b.push(op.parts(), tensors);
        }
        b.finish()
    }

    /// The first `n` ops (all when there are fewer).
    pub fn truncated(mut self, n: usize) -> Ops {
        if n < self.ops.len() {
            let tensors = self.ops[n].first as usize;
            self.ops.truncate(n);
            self.tensors.truncate(tensors);
        }
        self
    }
}

/// One op of an [`Ops`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    ops: &'a Ops,
    i: usize,
}

impl<'a> Op<'a> {
    fn slot(self) -> &'a OpSlot {
        &self.ops.ops[self.i]
    }

    /// Its position in its store.
    pub fn index(self) -> usize {
        self.i
    }

    /// Execution order within the rank.
    pub fn seq(self) -> u64 {
        self.slot().seq
    }

    /// The op key.
    pub fn key(self) -> KeyRef<'a> {
        let s = self.slot();
        let raw = self
            .ops
            .text
            .get(s.key as usize..s.key as usize + usize::from(s.key_len))
            .unwrap_or("");
        KeyRef::from_parts(
            raw,
            KeyParts::unpack(s.bits & 15, s.call, u32::from(s.base_len)),
        )
    }

    /// API, module or parameter-gradient record.
    pub fn kind(self) -> OpKind {
        match (self.slot().bits >> KIND_SHIFT) & 3 {
            0 => OpKind::Api,
            1 => OpKind::Module,
            _ => OpKind::ParametersGrad,
        }
    }

    /// Forward or backward.
    pub fn direction(self) -> Direction {
        if self.slot().bits & BACKWARD != 0 {
            Direction::Backward
        } else {
            Direction::Forward
        }
    }

    /// The module path the call happened in, when known (shared by the module's ops).
    pub fn module(self) -> Option<&'a Arc<str>> {
        self.ops.modules.get(self.slot().module as usize)
    }

    /// Id of the call stack.
    pub fn stack(self) -> Option<u64> {
        let s = self.slot();
        (s.bits & HAS_STACK != 0).then_some(s.stack)
    }

    /// A recomputation (activation checkpointing).
    pub fn recompute(self) -> bool {
        self.slot().bits & RECOMPUTE != 0
    }

    /// The collective call it is, when its record says.
    pub fn collective(self) -> Option<&'a Collective> {
        if self.slot().bits & HAS_COLLECTIVE == 0 {
            return None;
        }
        side(&self.ops.collectives, self.i as u32)
    }

    /// Its non-tensor arguments as canonical JSON ([`super::args`]), when recorded.
    pub fn args(self) -> Option<&'a str> {
        if self.slot().bits & HAS_ARGS == 0 {
            return None;
        }
        let &(at, len) = side(&self.ops.args, self.i as u32)?;
        self.ops.text.get(at as usize..(at + len) as usize)
    }

    /// How many tensors it has.
    pub fn tensor_count(self) -> usize {
        self.ops.range(self.i).len()
    }

    /// Its `j`-th tensor. Panics past its tensors, as indexing does.
    pub fn tensor(self, j: usize) -> Tensor<'a> {
        let r = self.ops.range(self.i);
        assert!(j < r.len(), "tensor {j} of {}", r.len());
        Tensor {
            ops: self.ops,
            op: self.i as u32,
            i: (r.start + j) as u32,
        }
    }

    /// Its tensors, in slot order.
    pub fn tensors(
        self,
    ) -> impl DoubleEndedIterator<Item = Tensor<'a>> + ExactSizeIterator + Clone {
        let (ops, op) = (self.ops, self.i as u32);
        self.ops.range(self.i).map(move |i| Tensor {
            ops,
            op,
            i: i as u32,
        })
    }

    /// The position of its first tensor among all tensors of the store.
    pub fn first_tensor(self) -> usize {
        self.slot().first as usize
    }

    fn parts(self) -> OpIn<'a> {
        OpIn {
            seq: self.seq(),
            key: self.key().text(),
            kind: self.kind(),
            direction: self.direction(),
            module: self.module().map(|m| &**m),
            stack: self.stack(),
            recompute: self.recompute(),
            collective: self.collective().cloned(),
            args: self.args(),
        }
    }

    /// An owned copy of the record.
    pub fn to_rec(self) -> OpRec {
        OpRec {
            seq: self.seq(),
            key: self.key().to_owned(),
            kind: self.kind(),
            direction: self.direction(),
            module: self.module().cloned(),
            stack: self.stack(),
            recompute: self.recompute(),
            tensors: self.tensors().map(Tensor::to_rec).collect(),
            collective: self.collective().cloned().map(Box::new),
            args: self.args().map(Into::into),
        }
    }
}

/// One tensor of an [`Ops`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    ops: &'a Ops,
    op: u32,
    i: u32,
}

impl<'a> Tensor<'a> {
    fn slot(self) -> &'a TensorSlot {
        &self.ops.tensors[self.i as usize]
    }

    /// The stored part of its name: its slot (with SLOT_NAME), else its whole name.
    fn stored(self) -> &'a str {
        let s = self.slot();
        if s.bits & SLOT_NAME != 0 {
            return self.ops.slots.get(s.name as usize).map_or("", |n| &**n);
        }
        let Some(&(at, len)) = self.ops.own_names.get(s.name as usize) else {
            return "";
        };
        self.ops
            .text
            .get(at as usize..(at + len) as usize)
            .unwrap_or("")
    }

    /// Its op.
    pub fn op(self) -> Op<'a> {
        Op {
            ops: self.ops,
            i: self.op as usize,
        }
    }

    /// Its position among all tensors of the store.
    pub fn flat(self) -> usize {
        self.i as usize
    }

    /// Flattened name: op key + slot.
    pub fn name(self) -> Cow<'a, str> {
        match self.slot() {
            s if s.bits & SLOT_NAME != 0 => {
                let key = self.op().key().text();
                let slot = self.stored();
                let mut n = String::with_capacity(key.len() + 1 + slot.len());
                n.push_str(key);
                n.push('.');
                n.push_str(slot);
                Cow::Owned(n)
            }
            _ => Cow::Borrowed(self.stored()),
        }
    }

    /// Whether its name is `name` (without building it).
    pub fn name_is(self, name: &str) -> bool {
        match self.slot().bits & SLOT_NAME {
            0 => self.stored() == name,
            _ => self.op().key().slot(name) == Some(self.stored()),
        }
    }

    /// Its slot (`input.0`, `output.1`): the name after its op key, when the name starts
    /// with the key.
    pub fn slot_name(self) -> Option<&'a str> {
        (self.slot().bits & SLOT_NAME != 0).then(|| self.stored())
    }

    /// Its slot when it has one, else its whole name (what pairs tensors of paired ops).
    pub fn slot_or_name(self) -> &'a str {
        self.stored()
    }

    /// Input, output or parameter.
    pub fn role(self) -> Role {
        match self.slot().bits & 3 {
            0 => Role::Input,
            1 => Role::Output,
            _ => Role::Parameter,
        }
    }

    /// The element type.
    pub fn dtype(self) -> &'a AnyDType {
        let d = self.slot().dtype as usize;
        KNOWN
            .get(d)
            .or_else(|| self.ops.other_dtypes.get(d - KNOWN.len()))
            .unwrap_or(&KNOWN[0])
    }

    /// Dimensions.
    pub fn shape(self) -> &'a [usize] {
        let s = self.slot();
        let at = s.dims as usize;
        self.ops.dims.get(at..at + s.ndim as usize).unwrap_or(&[])
    }

    /// Number of elements (saturating; readers refuse shapes whose count overflows).
    pub fn numel(self) -> usize {
        super::checked_numel(self.shape()).unwrap_or(usize::MAX)
    }

    /// Statistics recorded at capture time.
    pub fn stats(self) -> Option<Stats> {
        let s = self.slot();
        let present = NonZeroU8::new(s.present)?;
        let counts = if s.counts.contains(&BIG) {
            side(&self.ops.big_counts, self.i)
                .copied()
                .unwrap_or_default()
        } else {
            s.counts.map(u64::from)
        };
        Some(Stats {
            values: s.values,
            counts,
            present,
        })
    }

    fn extra(self) -> Option<&'a Extra> {
        if self.slot().bits & HAS_EXTRA == 0 {
            return None;
        }
        side(&self.ops.extras, self.i)
    }

    /// A checksum of the raw bytes.
    pub fn checksum(self) -> Option<&'a str> {
        let (at, len) = self.extra()?.checksum?;
        self.ops.text.get(at as usize..(at + len) as usize)
    }

    /// Dataflow id of an output.
    pub fn id(self) -> Option<u64> {
        let s = self.slot();
        (s.bits & HAS_ID != 0).then_some(s.flow)
    }

    /// Dataflow id of the captured output an input came from.
    pub fn src(self) -> Option<u64> {
        let s = self.slot();
        match (s.bits & HAS_ID != 0, s.bits & HAS_SRC != 0) {
            (_, false) => None,
            (false, true) => Some(s.flow),
            (true, true) => side(&self.ops.both_src, self.i).copied(),
        }
    }

    /// Where the values are, if dumped.
    pub fn data(self) -> Option<&'a Data> {
        self.extra()?.data.as_ref()
    }

    /// Whether it was read from memory nothing had written since it was allocated: its
    /// bytes are leftovers of earlier use, which no two runs share.
    pub fn unwritten(self) -> bool {
        self.slot().bits & UNWRITTEN != 0
    }

    /// Whether it is the value before the call of a target the op only writes
    /// ([`crate::op_key::WRITE_ONLY_APIS`]): not something the op computes from.
    pub fn overwritten(self) -> bool {
        self.slot_name()
            .is_some_and(|s| self.op().key().only_writes(s))
    }

    /// Its parts, for a builder; the name as stored (the caller gives the full name).
    fn parts(self) -> TensorIn<'a> {
        TensorIn {
            name: self.stored(),
            role: self.role(),
            dtype: dtype_text(self.dtype()),
            shape: self.shape(),
            stats: self.stats(),
            checksum: self.checksum(),
            id: self.id(),
            src: self.src(),
            data: self.data().cloned(),
            unwritten: self.unwritten(),
        }
    }

    /// An owned copy of the record.
    pub fn to_rec(self) -> TensorRec {
        TensorRec {
            name: self.name().into(),
            role: self.role(),
            dtype: self.dtype().clone(),
            shape: self.shape().to_vec(),
            stats: self.stats(),
            checksum: self.checksum().map(Into::into),
            id: self.id(),
            src: self.src(),
            data: self.data().cloned().map(Box::new),
            unwritten: self.unwritten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::StatsFields;
    use std::path::PathBuf;

    fn tensor(name: &str, role: Role) -> TensorRec {
        TensorRec {
            name: name.into(),
            role,
            dtype: AnyDType::parse("float32"),
            shape: vec![2, 3],
            stats: None,
            checksum: None,
            id: None,
            src: None,
            data: None,
            unwritten: false,
        }
    }

    /// Every field of a record, as text (records have no `PartialEq`: `Data` has none).
    fn show(o: &OpRec) -> String {
        format!("{o:?}")
    }

    fn records() -> Vec<OpRec> {
        let k = "Functional.gelu.3.forward";
        let mut a = tensor(&format!("{k}.input.0"), Role::Input);
        a.src = Some(7);
        a.stats = Some(Stats::from(StatsFields {
            max: Some(f64::INFINITY),
            min: Some(-0.0),
            mean: None,
            norm: Some(1.5),
            nan: Some(3),
            inf: Some(u64::from(u32::MAX)),
        }));
        let mut b = tensor(&format!("{k}.output.0"), Role::Output);
        b.id = Some(8);
        b.src = Some(u64::MAX);
        b.checksum = Some("crc32:deadbeef".into());
        b.dtype = AnyDType::parse("float8_e4m3");
        b.shape = vec![];
        b.stats = Some(Stats::from(StatsFields {
            nan: Some(5),
            inf: Some(1 << 40),
            ..StatsFields::default()
        }));
        // A name outside the key's grammar, data, no statistics, leftover bytes.
        let mut c = tensor("weight.of.something", Role::Parameter);
        c.unwritten = true;
        c.data = Some(Box::new(Data::Pt(PathBuf::from("/x/y.pt"))));
        c.id = Some(0);
        let mut first = OpRec::new(4, k, vec![a, b, c]);
        first.module = Some("blocks.0".into());
        first.stack = Some(0);
        first.recompute = true;
        let mut second = OpRec::new(9, "Distributed.all_reduce.0.forward", vec![]);
        second.collective = Some(Box::new(Collective {
            group: vec![0, 1, 2],
            seq: 3,
        }));
        second.module = Some("blocks.0".into());
        let third = OpRec::new(
            10,
            "weird key",
            vec![tensor("weird key.output.1", Role::Output)],
        );
        vec![first, second, third]
    }

    #[test]
    fn records_read_back_as_they_went_in() {
        let recs = records();
        let ops = Ops::from_records(&recs).unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops.tensor_count(), 4);
        for (o, r) in ops.iter().zip(&recs) {
            assert_eq!(show(&o.to_rec()), show(r));
        }
        // A key too long for one is refused, and nothing of it is kept.
        let mut b = OpsBuilder::default();
        let long = format!("Functional.{}.0.forward", "x".repeat(70_000));
        let e = b.push_rec(&OpRec::new(0, &long, vec![])).unwrap_err();
        assert!(e.contains("not an op key"), "{e}");
        assert!(b.is_empty());
        // Names are rebuilt from the slot where they start with the key.
        let t = ops.get(0).tensor(0);
        assert_eq!(t.slot_name(), Some("input.0"));
        assert!(t.name_is("Functional.gelu.3.forward.input.0"));
        assert!(!t.name_is("Functional.gelu.3.forward.input.1"));
        assert_eq!(ops.get(0).tensor(2).slot_name(), None);
        assert!(ops.get(0).tensor(2).name_is("weight.of.something"));
        // Both ops of one module share its path.
        assert!(Arc::ptr_eq(
            ops.get(0).module().unwrap(),
            ops.get(1).module().unwrap()
        ));
        assert_eq!(ops.get(1).tensor_count(), 0);
        assert_eq!(ops.get(0).key().call(), Some(3));
        assert_eq!(ops.get(2).key().call(), None);
    }

    #[test]
    fn retained_and_truncated_stores_hold_the_same_records() {
        let recs = records();
        let ops = Ops::from_records(&recs).unwrap();
        let kept = ops.clone().retained(|o| o.seq() != 9);
        let shown: Vec<String> = kept.iter().map(|o| show(&o.to_rec())).collect();
        assert_eq!(shown, [show(&recs[0]), show(&recs[2])]);
        let cut = ops.truncated(1);
        assert_eq!(cut.len(), 1);
        assert_eq!(cut.tensor_count(), 3);
        assert_eq!(show(&cut.get(0).to_rec()), show(&recs[0]));
    }

    #[test]
    fn a_push_that_does_not_fit_leaves_nothing_behind() {
        let mut b = OpsBuilder::default();
        b.push_rec(&records()[0]).unwrap();
        let mut bad = records()[0].clone();
        bad.tensors[1].shape = vec![1; 300];
        let e = b.push_rec(&bad).unwrap_err();
        assert!(e.contains("300 dimensions"), "{e}");
        let ops = b.finish();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops.tensor_count(), 3);
        assert_eq!(show(&ops.get(0).to_rec()), show(&records()[0]));
    }

    #[test]
    fn slots_stay_small() {
        // What a million-tensor unit holds per op and per tensor (issue 14).
        assert_eq!(std::mem::size_of::<OpSlot>(), 48);
        assert_eq!(std::mem::size_of::<TensorSlot>(), 64);
    }
}
