//! Align: pair the tensors of the two sides of a unit.
//!
//! Behind the [`Aligner`] trait so that other pairing rules (sequence alignment of op
//! signatures, fused-op mapping, module fallback) plug in without touching the stages
//! around it. [`KeyAligner`] is the rule of msprobe's compare: tensors are paired by
//! flattened name, with backward calls renumbered by occurrence.

use super::Sides;
use crate::dtype::AnyDType;
use crate::dump::{Direction, OpKey, OpKind, OpRec, RankDump, Role, TensorRec};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;

/// The op a tensor belongs to, as reports and the localiser need it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpInfo {
    /// Position of the op in its side's execution order (the comparison side's for matches).
    pub index: usize,
    /// The op's sequence number in its dump.
    pub seq: u64,
    /// The op key.
    pub key: OpKey,
    /// Forward or backward.
    pub direction: Direction,
    /// Id of the op's call stack.
    pub stack: Option<u64>,
}

impl OpInfo {
    /// The op at `index` of its side.
    pub fn of(index: usize, op: &OpRec) -> OpInfo {
        OpInfo {
            index,
            seq: op.seq,
            key: op.key.clone(),
            direction: op.direction,
            stack: op.stack,
        }
    }
}

/// Where a tensor is in its side's op log: `ops[op].tensors[tensor]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TensorRef {
    /// Index of the op.
    pub op: usize,
    /// Index of the tensor in the op.
    pub tensor: usize,
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
}

/// Which side a tensor was found on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The benchmark.
    Bench,
    /// The comparison run.
    Cmp,
}

impl Side {
    /// `bench` or `cmp`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Bench => "bench",
            Side::Cmp => "cmp",
        }
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
}

impl Alignment {
    /// The records of a pair.
    pub fn records(&self, m: &TensorMatch) -> Sides<&TensorRec> {
        let (b, c) = (m.refs.bench, m.refs.cmp);
        Sides::new(
            &self.dumps.bench.ops[b.op].tensors[b.tensor],
            &self.dumps.cmp.ops[c.op].tensors[c.tensor],
        )
    }
}

/// A rule that pairs the tensors of two op logs of one unit.
pub trait Aligner: Sync {
    /// Pairs the tensors of both dumps.
    fn align(&self, dumps: Sides<RankDump>) -> Alignment;
}

/// Pairs tensors by flattened name, backward calls renumbered by occurrence per op, so that
/// recomputation (activation checkpointing) or a different number of forward calls does
/// not shift them.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyAligner;

/// Per op, the key its tensors are matched under when it differs from the op's own key:
/// backward calls renumbered by their occurrence among backward calls of the same API or
/// module (None: the key as written, e.g. every forward call).
pub fn match_keys(ops: &[OpRec]) -> Vec<Option<String>> {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    ops.iter()
        .map(|op| {
            let key = &op.key;
            if op.direction != Direction::Backward
                || op.kind == OpKind::ParametersGrad
                || !key.has_call()
            {
                return None;
            }
            let k = seen.entry(key.base()).or_insert(0);
            let renumbered = key.with_call(*k);
            *k += 1;
            renumbered.filter(|r| r != key.as_str())
        })
        .collect()
}

/// A tensor's name under its op's match key.
fn match_name<'a>(op: &OpRec, match_key: &Option<String>, t: &'a TensorRec) -> Cow<'a, str> {
    match match_key {
        None => Cow::Borrowed(&t.name),
        Some(k) => Cow::Owned(op.key.rename_tensor(&t.name, k)),
    }
}

fn unmatched(side: Side, index: usize, op: &OpRec, t: &TensorRec) -> Unmatched {
    Unmatched {
        side,
        op: OpInfo::of(index, op),
        name: t.name.clone(),
        role: t.role,
        dtype: t.dtype.clone(),
        shape: t.shape.clone(),
    }
}

impl Aligner for KeyAligner {
    fn align(&self, dumps: Sides<RankDump>) -> Alignment {
        let (bd, cd) = dumps.pair();
        let bkeys = match_keys(&bd.ops);
        let ckeys = match_keys(&cd.ops);
        // Bench tensors by match name (a later duplicate wins; the earlier one stays
        // unmatched); a match marks its tensor taken.
        let mut first = Vec::with_capacity(bd.ops.len());
        let mut n = 0usize;
        for op in &bd.ops {
            first.push(n);
            n += op.tensors.len();
        }
        let mut taken = vec![false; n];
        let mut index: HashMap<Cow<str>, TensorRef> = HashMap::with_capacity(n);
        for (oi, op) in bd.ops.iter().enumerate() {
            for (ti, t) in op.tensors.iter().enumerate() {
                let r = TensorRef { op: oi, tensor: ti };
                index.insert(match_name(op, &bkeys[oi], t), r);
            }
        }
        let mut matches = Vec::with_capacity(cd.ops.iter().map(|o| o.tensors.len()).sum());
        let mut only = Vec::new();
        for (oi, op) in cd.ops.iter().enumerate() {
            for (ti, t) in op.tensors.iter().enumerate() {
                let found = index
                    .get(match_name(op, &ckeys[oi], t).as_ref())
                    .copied()
                    .filter(|b| !taken[first[b.op] + b.tensor]);
                let Some(b) = found else {
                    only.push(unmatched(Side::Cmp, oi, op, t));
                    continue;
                };
                taken[first[b.op] + b.tensor] = true;
                let external = match t.role {
                    Role::Parameter => op.direction == Direction::Forward,
                    Role::Input => {
                        cd.has_dataflow && t.src.is_none() && op.direction == Direction::Forward
                    }
                    Role::Output => false,
                };
                matches.push(TensorMatch {
                    refs: Sides::new(b, TensorRef { op: oi, tensor: ti }),
                    external,
                });
            }
        }
        for (oi, op) in bd.ops.iter().enumerate() {
            for (ti, t) in op.tensors.iter().enumerate() {
                if !taken[first[oi] + ti] {
                    only.push(unmatched(Side::Bench, oi, op, t));
                }
            }
        }
        drop(index);
        Alignment {
            dumps,
            matches,
            unmatched: only,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str) -> OpRec {
        let k = OpKey::parse(key);
        OpRec {
            seq: 0,
            kind: k.kind(),
            direction: k.direction(),
            key: k,
            module: None,
            stack: None,
            recompute: false,
            tensors: vec![],
        }
    }

    #[test]
    fn backward_keys_renumbered_by_occurrence() {
        let ops: Vec<OpRec> = [
            "Functional.gelu.3.forward",
            "Functional.gelu.3.backward",
            "Functional.gelu.1.backward",
            "Module.fc.Linear.backward.4",
            "Module.fc.Linear.backward.7",
            "Module.fc.Linear.parameters_grad",
        ]
        .into_iter()
        .map(op)
        .collect();
        let renumbered = match_keys(&ops);
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
