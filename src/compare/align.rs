//! Align: pair the tensors of the two sides of a unit.
//!
//! Behind the [`Aligner`] trait so that pairing rules plug in without touching the stages
//! around it. The types here say what an alignment is (which tensors pair up, how each
//! pair was found, what was left over and why); [`super::structural`] is the rule.

use super::Sides;
use crate::dtype::AnyDType;
use crate::dump::{Direction, Op, OpKind, Ops, RankDump, Role, Tensor};
pub use crate::schema::compare::{OpInfo, Region};
pub use crate::vocab::{MatchedBy, Side};
use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

impl OpInfo {
    /// The op, at its index in its side's op log.
    pub fn of(op: Op) -> OpInfo {
        OpInfo {
            index: op.index(),
            seq: op.seq(),
            key: op.key().to_owned(),
            direction: op.direction(),
            stack: op.stack(),
            module: op.module().cloned(),
        }
    }
}

/// Where a tensor is in its side's op log: the `tensor`-th tensor of op `op`. Two `u32`s
/// (an op store indexes its ops and tensors so): the aligner holds several per tensor of a
/// unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorRef {
    op: u32,
    tensor: u32,
}

impl TensorRef {
    /// The `tensor`-th tensor of op `op` (positions in an op store, which fit `u32`).
    pub fn new(op: usize, tensor: usize) -> TensorRef {
        TensorRef {
            op: op as u32,
            tensor: tensor as u32,
        }
    }

    /// Index of the op.
    pub(crate) fn op(self) -> usize {
        self.op as usize
    }

    /// Index of the tensor in the op.
    pub(crate) fn tensor(self) -> usize {
        self.tensor as usize
    }
}

/// A tensor present on both sides: where it is on each. Small on purpose: a unit can hold
/// millions of pairs, and the records themselves stay in the dumps until the judge moves
/// them into rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMatch {
    /// The two tensors.
    pub refs: Sides<TensorRef>,
    /// An input that no captured op produced (weight, data, random tensor).
    pub external: bool,
    /// How the pair was found.
    pub by: MatchedBy,
    /// The comparison-side op the row is reported under: the tensor's own op, or for a
    /// region compared at its boundary the region's last op (so that the localiser sees
    /// the region's inputs and outputs as one op's).
    pub at: u32,
}

/// Why a tensor has no counterpart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Nothing on the other side corresponds to it.
    #[default]
    Unmatched,
    /// The other side calls the same API here with other shapes: the code paths differ
    /// (a matching finding, never a numerical one).
    ShapeMismatch,
    /// A forward re-run by activation checkpointing that the other side does not re-run.
    Recompute,
    /// Inside a region compared at its boundary (mapped or module fallback).
    Inside,
    /// A view, layout change or cast (a passthrough op) of an API the other run records no
    /// call of at all: its dumper does not hook it (msprobe and probe hook different API
    /// sets). It computes nothing new.
    Unhooked,
    /// The loss scaler's own arithmetic in a run that scales its loss while the other does
    /// not (the loss times the scale, the scale's reciprocal: `loss_scale`).
    LossScaler,
    /// The optimizer's update in a step the other run's loss scaler skipped (its gradients
    /// overflowed): the other run never made it.
    SkippedUpdate,
}

impl Why {
    /// Whether the tensor counts as missing from the comparison (the `--max-unmatched`
    /// gate): recomputation, region interiors, views the other dumper does not hook, a
    /// one-sided loss scaler's arithmetic and the update it skipped are accounted for
    /// elsewhere.
    pub(crate) fn missing(self) -> bool {
        matches!(self, Why::Unmatched | Why::ShapeMismatch)
    }
}

/// A tensor found on one side only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unmatched {
    /// The side that has it.
    pub side: Side,
    /// Its op, on that side.
    pub op: OpInfo,
    /// Its name.
    pub name: String,
    /// Input, output or parameter.
    pub role: Role,
    /// Its dtype.
    pub dtype: AnyDType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Why it has no counterpart.
    #[serde(default)]
    pub why: Why,
}

/// The result of aligning one unit: both op logs and how their tensors pair up.
#[derive(Debug, Clone)]
pub struct Alignment {
    /// The two op logs, as read.
    pub dumps: Sides<RankDump>,
    /// Paired tensors, in the comparison run's execution order.
    pub matches: Vec<TensorMatch>,
    /// Tensors of either side left unpaired: comparison-only in execution order, then
    /// benchmark-only in execution order.
    pub unmatched: Vec<Unmatched>,
    /// Regions compared at their boundary, in the comparison run's execution order.
    pub regions: Vec<Region>,
}

impl Alignment {}

/// The records of a pair in the two op logs it was found in.
pub fn records<'a>(dumps: &'a Sides<RankDump>, m: &TensorMatch) -> Sides<Tensor<'a>> {
    let (b, c) = (m.refs.bench, m.refs.cmp);
    Sides::new(
        dumps.bench.ops.get(b.op()).tensor(b.tensor()),
        dumps.cmp.ops.get(c.op()).tensor(c.tensor()),
    )
}

/// A rule that pairs the tensors of two op logs of one unit.
pub trait Aligner: Sync {
    /// Pairs the tensors of both dumps.
    fn align(&self, dumps: Sides<RankDump>) -> Alignment;
}

/// msprobe's rule (`--align name`): tensors pair by flattened name, backward calls
/// renumbered by occurrence per op. Right when both runs execute the same code; kept for
/// msprobe-identical results and as the baseline of the alignment benchmark.
#[derive(Debug, Clone, Copy, Default)]
pub struct NameAligner;

/// Per op, the key its tensors are matched under when it differs from the op's own key:
/// backward calls renumbered by their occurrence among backward calls of the same API or
/// module (None: the key as written, e.g. every forward call).
pub(crate) fn match_keys(ops: &Ops) -> Vec<Option<Box<str>>> {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    ops.iter()
        .map(|op| {
            let key = op.key();
            if op.direction() != Direction::Backward
                || op.kind() == OpKind::ParametersGrad
                || !key.has_call()
            {
                return None;
            }
            let k = seen.entry(key.base_text()).or_insert(0);
            let renumbered = key.with_call(*k);
            *k += 1;
            renumbered
                .filter(|r| r != key.as_str())
                .map(String::into_boxed_str)
        })
        .collect()
}

/// A tensor left over on `side`.
pub(crate) fn unmatched(side: Side, t: Tensor, why: Why) -> Unmatched {
    Unmatched {
        side,
        op: OpInfo::of(t.op()),
        name: t.name().into_owned(),
        role: t.role(),
        dtype: t.dtype().clone(),
        shape: t.shape().to_vec(),
        why,
    }
}

/// A tensor's name under its op's match key.
fn match_name<'a>(match_key: &Option<Box<str>>, t: Tensor<'a>) -> Cow<'a, str> {
    match (match_key, t.slot_name()) {
        (Some(k), Some(slot)) => Cow::Owned(format!("{k}.{slot}")),
        _ => t.name(),
    }
}

impl Aligner for NameAligner {
    fn align(&self, dumps: Sides<RankDump>) -> Alignment {
        let (bd, cd) = dumps.pair();
        let bkeys = match_keys(&bd.ops);
        let ckeys = match_keys(&cd.ops);
        // Bench tensors by match name (a later duplicate wins; the earlier one stays
        // unmatched); a match marks its tensor taken.
        let n = bd.ops.tensor_count();
        let mut taken = vec![false; n];
        let mut index: HashMap<Cow<str>, TensorRef> = HashMap::with_capacity(n);
        for op in bd.ops.iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                index.insert(match_name(&bkeys[op.index()], t), r);
            }
        }
        let first = |r: TensorRef| bd.ops.get(r.op()).first_tensor() + r.tensor();
        let mut matches = Vec::with_capacity(cd.ops.tensor_count());
        let mut only = Vec::new();
        for op in cd.ops.iter() {
            let oi = op.index();
            for (ti, t) in op.tensors().enumerate() {
                let found = index
                    .get(match_name(&ckeys[oi], t).as_ref())
                    .copied()
                    .filter(|&b| !taken[first(b)]);
                let Some(b) = found else {
                    only.push(unmatched(Side::Cmp, t, Why::Unmatched));
                    continue;
                };
                taken[first(b)] = true;
                let external = match t.role() {
                    Role::Parameter => op.direction() == Direction::Forward,
                    Role::Input => {
                        cd.has_dataflow && t.src().is_none() && op.direction() == Direction::Forward
                    }
                    Role::Output => false,
                };
                matches.push(TensorMatch {
                    refs: Sides::new(b, TensorRef::new(oi, ti)),
                    external,
                    by: MatchedBy::Exact,
                    at: oi as u32,
                });
            }
        }
        for t in bd.ops.iter().flat_map(|op| op.tensors()) {
            if !taken[t.flat()] {
                only.push(unmatched(Side::Bench, t, Why::Unmatched));
            }
        }
        drop(index);
        Alignment {
            dumps,
            matches,
            unmatched: only,
            regions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_keys_renumbered_by_occurrence() {
        let ops: Vec<crate::dump::OpRec> = [
            "Functional.gelu.3.forward",
            "Functional.gelu.3.backward",
            "Functional.gelu.1.backward",
            "Module.fc.Linear.backward.4",
            "Module.fc.Linear.backward.7",
            "Module.fc.Linear.parameters_grad",
        ]
        .into_iter()
        .map(|k| crate::dump::OpRec::new(0, k, vec![]))
        .collect();
        let renumbered = match_keys(&Ops::from_records(&ops).unwrap());
        let keys: Vec<&str> = renumbered
            .iter()
            .zip(&ops)
            .map(|(k, op)| k.as_deref().unwrap_or(op.key.as_str()))
            .collect();
        assert_eq!(
            keys,
            vec![
                "Functional.gelu.3.forward",
                "Functional.gelu.0.backward",
                "Functional.gelu.1.backward",
                "Module.fc.Linear.backward.0",
                "Module.fc.Linear.backward.1",
                "Module.fc.Linear.parameters_grad",
            ]
        );
    }
}
