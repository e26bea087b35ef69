//! Filling an [`Ops`] op by op: what a reader hands over ([`OpIn`],
//! [`TensorIn`], borrowed from the line it parsed) copied once into the store's slots and
//! arenas, with interning of module paths, tensor slots and dtypes; a push that does not
//! fit (a table past `u32`) leaves nothing behind.

use super::{
    dtype_text, kind_bits, known_index, role_bits, Extra, LayoutExtra, OpSlot, Ops, TensorSlot,
    BACKWARD, BIG, HAS_ARGS, HAS_COLLECTIVE, HAS_EXTRA, HAS_ID, HAS_LAYOUT, HAS_SRC, HAS_STACK,
    KIND_SHIFT, KNOWN, NONE, RECOMPUTE, SLOT_NAME, UNWRITTEN,
};
use crate::dtype::{AnyDType, DType};
use crate::dump::{Collective, Direction, Layout, LayoutRef, OpKind, OpRec, Role, Stats};
use crate::op_key::KeyParts;
use crate::tensor::Data;
use std::sync::Arc;

/// An op as a reader hands it to `OpsBuilder::push`, borrowed from what it parsed.
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
    /// Its non-tensor arguments, canonical (`crate::dump::args::canonical`).
    pub args: Option<&'x str>,
}

/// A tensor of an op as a reader hands it to `OpsBuilder::push`.
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
    /// How it lay in memory, where the dump says.
    pub layout: Option<LayoutRef<'x>>,
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
    /// Whether none was pushed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// A builder with room reserved for an op log of about `bytes` bytes (reserved memory
    /// that is never written costs nothing; growing by doubling copies and touches it all).
    pub(crate) fn for_log_bytes(bytes: u64) -> OpsBuilder {
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
    pub(crate) fn ops(&self) -> &Ops {
        &self.ops
    }

    /// Ops pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
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
    pub(crate) fn push<'x>(
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

    fn mark(&self) -> [usize; 11] {
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
            o.layouts.len(),
        ]
    }

    fn undo(&mut self, m: [usize; 11]) {
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
        o.layouts.truncate(m[10]);
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
        let storage = match t.layout {
            Some(l) => {
                bits |= HAS_LAYOUT;
                self.layout(at, t.name, t.shape.len(), l)?
            }
            None => NONE,
        };
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
            storage,
        });
        Ok(())
    }

    /// Keeps tensor `at`'s layout: what is not plain (strides, an offset, a format) in the
    /// side table; returns its storage id for the slot ([`NONE`]: none).
    fn layout(&mut self, at: u32, name: &str, ndim: usize, l: LayoutRef) -> Result<u32, String> {
        let storage = match l.storage {
            Some(s) => u32::try_from(s)
                .ok()
                .filter(|&s| s != NONE)
                .ok_or_else(|| format!("tensor {name}: storage id {s} past {}", NONE - 1))?,
            None => NONE,
        };
        if l.stride.is_none() && l.offset == 0 && l.format.is_none() {
            return Ok(storage);
        }
        let stride = match l.stride {
            Some(s) if s.len() != ndim => {
                return Err(format!(
                    "tensor {name}: stride of {} dimensions for a shape of {ndim}",
                    s.len()
                ))
            }
            Some(s) => {
                let i = index(self.ops.dims.len(), "dimensions")?;
                index(self.ops.dims.len() + s.len(), "dimensions")?;
                self.ops.dims.extend_from_slice(s);
                i
            }
            None => NONE,
        };
        let format = match l.format {
            Some(f) => Some(self.text(f)?),
            None => None,
        };
        self.ops.layouts.push((
            at,
            LayoutExtra {
                stride,
                offset: l.offset,
                format,
            },
        ));
        Ok(storage)
    }

    /// Appends an owned record.
    pub(crate) fn push_rec(&mut self, op: &OpRec) -> Result<(), String> {
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
            layout: t.layout.as_ref().map(Layout::as_ref),
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
    pub(crate) fn finish(self) -> Ops {
        self.ops
    }
}
