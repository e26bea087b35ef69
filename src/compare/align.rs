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
    fn of(index: usize, op: &OpRec) -> OpInfo {
        OpInfo {
            index,
            seq: op.seq,
            key: op.key.clone(),
            direction: op.direction,
            stack: op.stack,
        }
    }
}

/// A tensor present on both sides, with everything the measure stage reads.
#[derive(Debug, Clone)]
pub struct TensorMatch {
    /// The comparison side's op.
    pub op: OpInfo,
    /// The comparison side's tensor name.
    pub name: String,
    /// Input, output or parameter.
    pub role: Role,
    /// An input that no captured op produced (weight, data, random tensor).
    pub external: bool,
    /// The two tensor records.
    pub tensors: Sides<TensorRec>,
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

/// The result of aligning one unit.
#[derive(Debug, Clone)]
pub struct Alignment {
    /// Paired tensors, in the comparison run's execution order.
    pub matches: Vec<TensorMatch>,
    /// Tensors of either side left unpaired: comparison-only in execution order, then
    /// benchmark-only in execution order.
    pub unmatched: Vec<Unmatched>,
}

/// A rule that pairs the tensors of two op logs of one unit.
pub trait Aligner: Sync {
    /// Pairs the tensors; consumes both dumps (names, shapes and statistics move on).
    fn align(&self, dumps: Sides<RankDump>) -> Alignment;
}

/// Pairs tensors by flattened name, backward calls renumbered by occurrence per op, so that
/// recomputation (activation checkpointing) or a different number of forward calls does
/// not shift them.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyAligner;

/// Per op, the key tensors are matched under: forward keys unchanged, backward calls
/// renumbered by their occurrence among backward calls of the same API or module.
pub fn match_keys(ops: &[OpRec]) -> Vec<String> {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    ops.iter()
        .map(|op| {
            let key = &op.key;
            if op.direction != Direction::Backward
                || op.kind == OpKind::ParametersGrad
                || !key.has_call()
            {
                return key.as_str().to_string();
            }
            let k = seen.entry(key.base()).or_insert(0);
            let renumbered = key.with_call(*k);
            *k += 1;
            renumbered.unwrap_or_else(|| key.as_str().to_string())
        })
        .collect()
}

/// A tensor's name under its op's match key.
fn match_name(op: &OpRec, match_key: &str, t: &TensorRec) -> String {
    if match_key == op.key.as_str() {
        t.name.clone()
    } else {
        op.key.rename_tensor(&t.name, match_key)
    }
}

fn unmatched(side: Side, index: usize, op: &OpRec, t: TensorRec) -> Unmatched {
    Unmatched {
        side,
        op: OpInfo::of(index, op),
        name: t.name,
        role: t.role,
        dtype: t.dtype,
        shape: t.shape,
    }
}

impl Aligner for KeyAligner {
    fn align(&self, dumps: Sides<RankDump>) -> Alignment {
        let Sides {
            bench: mut bd,
            cmp: mut cd,
        } = dumps;
        let bkeys = match_keys(&bd.ops);
        let ckeys = match_keys(&cd.ops);
        // Bench tensors in slots; a match takes its tensor out, what is left is unmatched.
        let n: usize = bd.ops.iter().map(|o| o.tensors.len()).sum();
        let mut slots: Vec<Option<(usize, TensorRec)>> = Vec::with_capacity(n);
        let mut index: HashMap<String, usize> = HashMap::with_capacity(n);
        for (oi, op) in bd.ops.iter_mut().enumerate() {
            for t in std::mem::take(&mut op.tensors) {
                index.insert(match_name(op, &bkeys[oi], &t), slots.len());
                slots.push(Some((oi, t)));
            }
        }
        let mut matches = Vec::with_capacity(cd.ops.iter().map(|o| o.tensors.len()).sum());
        let mut only = Vec::new();
        let has_dataflow = cd.has_dataflow;
        for (oi, op) in cd.ops.iter_mut().enumerate() {
            for t in std::mem::take(&mut op.tensors) {
                let name = match_name(op, &ckeys[oi], &t);
                let Some(bt) = index
                    .get(&name)
                    .and_then(|&k| slots[k].take())
                    .map(|(_, t)| t)
                else {
                    only.push(unmatched(Side::Cmp, oi, op, t));
                    continue;
                };
                let external = match t.role {
                    Role::Parameter => op.direction == Direction::Forward,
                    Role::Input => {
                        has_dataflow && t.src.is_none() && op.direction == Direction::Forward
                    }
                    Role::Output => false,
                };
                matches.push(TensorMatch {
                    op: OpInfo::of(oi, op),
                    name: t.name.clone(),
                    role: t.role,
                    external,
                    tensors: Sides::new(bt, t),
                });
            }
        }
        for (oi, t) in slots.into_iter().flatten() {
            only.push(unmatched(Side::Bench, oi, &bd.ops[oi], t));
        }
        Alignment {
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
        assert_eq!(
            match_keys(&ops),
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
