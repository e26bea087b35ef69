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
//! ([`OpRec`], [`TensorRec`](crate::dump::TensorRec)), which remain the form a test or a
//! tool builds ops in.
//!
//! The store's layout is here (the slots, the side tables, [`Ops`] and its whole-store
//! operations); filling one is `builder`, reading one op or tensor is `views`.

use super::{Collective, OpKind, OpRec, Role};
use crate::dtype::{AnyDType, DType};
use crate::tensor::Data;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

mod builder;
mod views;

pub use builder::{OpIn, OpsBuilder, TensorIn};
pub use views::{Op, Tensor};

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
/// Its layout is recorded ([`Tensor::layout`]): the storage id in the slot, what is not
/// plain in `layouts`.
const HAS_LAYOUT: u8 = 1 << 7;

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
/// dataflow `src` beside an `id`, NaN/Inf counts past `u32`, a name of its own, a layout
/// that is not plain (`layouts`: strides, an offset, a device format).
#[derive(Debug, Clone)]
struct TensorSlot {
    /// [`Stats`](crate::dump::Stats)' values; `present` is its presence mask (0: no statistics).
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
    /// The layout's storage id, or [`NONE`] (in what was the slot's padding).
    storage: u32,
}

/// What few tensors' layouts have (a view's strides and offset, an NPU's format).
#[derive(Debug, Clone)]
struct LayoutExtra {
    /// The strides: `dims[stride..stride + ndim]`, or [`NONE`] (contiguous).
    stride: u32,
    offset: u64,
    /// A span of `text`.
    format: Option<(u32, u32)>,
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
/// Immutable once built: `Ops::retained` and `Ops::truncated` make new ones.
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
    /// (tensor, its layout's strides, offset and format) where one is not plain, by tensor.
    layouts: Vec<(u32, LayoutExtra)>,
}

/// The entry of `key` in a side table sorted by it.
fn side<K: Ord + Copy, T>(table: &[(K, T)], key: K) -> Option<&T> {
    let k = table.partition_point(|e| e.0 < key);
    table.get(k).filter(|e| e.0 == key).map(|e| &e.1)
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
    pub(crate) fn tensor_count(&self) -> usize {
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
    pub(crate) fn last(&self) -> Option<Op<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// Every op, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Op<'_>> + ExactSizeIterator + Clone {
        (0..self.ops.len()).map(move |i| Op { ops: self, i })
    }

    /// About how many bytes it holds (what the row budget counts; room reserved and never
    /// written is not counted: it costs no memory).
    pub(crate) fn weight(&self) -> usize {
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
            + self.layouts.len() * size_of::<(u32, LayoutExtra)>()
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
    pub(crate) fn retained(self, keep: impl Fn(Op) -> bool) -> Ops {
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
    pub(crate) fn with_tensors(
        self,
        f: impl for<'a> Fn(Op<'a>, TensorIn<'a>) -> TensorIn<'a>,
    ) -> Ops {
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
    pub(crate) fn truncated(mut self, n: usize) -> Ops {
        if n < self.ops.len() {
            let tensors = self.ops[n].first as usize;
            self.ops.truncate(n);
            self.tensors.truncate(tensors);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::{Stats, StatsFields, TensorRec};
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
            layout: None,
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
        // Layouts: a view's (strides, offset, format), a plain one (its storage only).
        a.layout = Some(crate::dump::Layout {
            stride: Some(vec![1, 2]),
            offset: 6,
            storage: Some(3),
            format: Some("29".into()),
        });
        c.layout = Some(crate::dump::Layout {
            storage: Some(3),
            ..crate::dump::Layout::default()
        });
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
