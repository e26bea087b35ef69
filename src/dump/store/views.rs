//! Reading an [`Ops`] one op or tensor at a time: [`Op`] and [`Tensor`] are borrowed
//! views whose accessors mirror the fields of the owned records (`OpRec`, `TensorRec`),
//! unpacking the slot bits and looking into the side tables on demand.

use super::{
    dtype_text, side, Extra, OpIn, OpSlot, Ops, TensorIn, TensorSlot, BACKWARD, BIG, HAS_ARGS,
    HAS_COLLECTIVE, HAS_EXTRA, HAS_ID, HAS_LAYOUT, HAS_SRC, HAS_STACK, KIND_SHIFT, KNOWN, NONE,
    RECOMPUTE, SLOT_NAME, UNWRITTEN,
};
use crate::dtype::AnyDType;
use crate::dump::{Collective, Direction, LayoutRef, OpKind, OpRec, Role, Stats, TensorRec};
use crate::op_key::{KeyParts, KeyRef};
use crate::tensor::Data;
use std::borrow::Cow;
use std::num::NonZeroU8;
use std::sync::Arc;

/// One op of an [`Ops`], borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    pub(super) ops: &'a Ops,
    pub(super) i: usize,
}

impl<'a> Op<'a> {
    fn slot(self) -> &'a OpSlot {
        &self.ops.ops[self.i]
    }

    /// Its position in its store.
    pub(crate) fn index(self) -> usize {
        self.i
    }

    /// Execution order within the rank.
    pub(crate) fn seq(self) -> u64 {
        self.slot().seq
    }

    /// The op key.
    pub(crate) fn key(self) -> KeyRef<'a> {
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
    pub(crate) fn direction(self) -> Direction {
        if self.slot().bits & BACKWARD != 0 {
            Direction::Backward
        } else {
            Direction::Forward
        }
    }

    /// The module path the call happened in, when known (shared by the module's ops).
    pub(crate) fn module(self) -> Option<&'a Arc<str>> {
        self.ops.modules.get(self.slot().module as usize)
    }

    /// Id of the call stack.
    pub(crate) fn stack(self) -> Option<u64> {
        let s = self.slot();
        (s.bits & HAS_STACK != 0).then_some(s.stack)
    }

    /// A recomputation (activation checkpointing).
    pub(crate) fn recompute(self) -> bool {
        self.slot().bits & RECOMPUTE != 0
    }

    /// The collective call it is, when its record says.
    pub(crate) fn collective(self) -> Option<&'a Collective> {
        if self.slot().bits & HAS_COLLECTIVE == 0 {
            return None;
        }
        side(&self.ops.collectives, self.i as u32)
    }

    /// Its non-tensor arguments as canonical JSON ([`crate::dump::args`]), when recorded.
    pub(crate) fn args(self) -> Option<&'a str> {
        if self.slot().bits & HAS_ARGS == 0 {
            return None;
        }
        let &(at, len) = side(&self.ops.args, self.i as u32)?;
        self.ops.text.get(at as usize..(at + len) as usize)
    }

    /// How many tensors it has.
    pub(crate) fn tensor_count(self) -> usize {
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
    pub(crate) fn first_tensor(self) -> usize {
        self.slot().first as usize
    }

    pub(super) fn parts(self) -> OpIn<'a> {
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
    pub(super) ops: &'a Ops,
    pub(super) op: u32,
    pub(super) i: u32,
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
    pub(crate) fn op(self) -> Op<'a> {
        Op {
            ops: self.ops,
            i: self.op as usize,
        }
    }

    /// Its position among all tensors of the store.
    pub(crate) fn flat(self) -> usize {
        self.i as usize
    }

    /// Flattened name: op key + slot.
    pub(crate) fn name(self) -> Cow<'a, str> {
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
    pub(crate) fn name_is(self, name: &str) -> bool {
        match self.slot().bits & SLOT_NAME {
            0 => self.stored() == name,
            _ => self.op().key().slot(name) == Some(self.stored()),
        }
    }

    /// Its slot (`input.0`, `output.1`): the name after its op key, when the name starts
    /// with the key.
    pub(crate) fn slot_name(self) -> Option<&'a str> {
        (self.slot().bits & SLOT_NAME != 0).then(|| self.stored())
    }

    /// Its slot when it has one, else its whole name (what pairs tensors of paired ops).
    pub(crate) fn slot_or_name(self) -> &'a str {
        self.stored()
    }

    /// Input, output or parameter.
    pub(crate) fn role(self) -> Role {
        match self.slot().bits & 3 {
            0 => Role::Input,
            1 => Role::Output,
            _ => Role::Parameter,
        }
    }

    /// The element type.
    pub(crate) fn dtype(self) -> &'a AnyDType {
        let d = self.slot().dtype as usize;
        KNOWN
            .get(d)
            .or_else(|| self.ops.other_dtypes.get(d - KNOWN.len()))
            .unwrap_or(&KNOWN[0])
    }

    /// Dimensions.
    pub(crate) fn shape(self) -> &'a [usize] {
        let s = self.slot();
        let at = s.dims as usize;
        self.ops.dims.get(at..at + s.ndim as usize).unwrap_or(&[])
    }

    /// Number of elements (saturating; readers refuse shapes whose count overflows).
    pub(crate) fn numel(self) -> usize {
        crate::dump::checked_numel(self.shape()).unwrap_or(usize::MAX)
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
    pub(crate) fn checksum(self) -> Option<&'a str> {
        let (at, len) = self.extra()?.checksum?;
        self.ops.text.get(at as usize..(at + len) as usize)
    }

    /// Dataflow id of an output.
    pub(crate) fn id(self) -> Option<u64> {
        let s = self.slot();
        (s.bits & HAS_ID != 0).then_some(s.flow)
    }

    /// Dataflow id of the captured output an input came from.
    pub(crate) fn src(self) -> Option<u64> {
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
    pub(crate) fn unwritten(self) -> bool {
        self.slot().bits & UNWRITTEN != 0
    }

    /// How it lay in memory, where the dump says (docs/format.md, "Layout").
    pub(crate) fn layout(self) -> Option<LayoutRef<'a>> {
        let s = self.slot();
        if s.bits & HAS_LAYOUT == 0 {
            return None;
        }
        let mut l = LayoutRef {
            storage: (s.storage != NONE).then_some(u64::from(s.storage)),
            ..LayoutRef::default()
        };
        if let Some(x) = side(&self.ops.layouts, self.i) {
            let at = x.stride as usize;
            l.stride = (x.stride != NONE)
                .then(|| self.ops.dims.get(at..at + s.ndim as usize))
                .flatten();
            l.offset = x.offset;
            l.format = x
                .format
                .and_then(|(at, len)| self.ops.text.get(at as usize..(at + len) as usize));
        }
        Some(l)
    }

    /// Whether it is the value before the call of a target the op only writes
    /// ([`crate::op_key::WRITE_ONLY_APIS`]): not something the op computes from.
    pub(crate) fn overwritten(self) -> bool {
        self.slot_name()
            .is_some_and(|s| self.op().key().only_writes(s))
    }

    /// Its parts, for a builder; the name as stored (the caller gives the full name).
    pub(super) fn parts(self) -> TensorIn<'a> {
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
            layout: self.layout(),
        }
    }

    /// An owned copy of the record.
    pub(crate) fn to_rec(self) -> TensorRec {
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
            layout: self.layout().map(LayoutRef::to_owned),
        }
    }
}
