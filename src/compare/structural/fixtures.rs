//! Test fixtures shared by the unit tests of every pass: op records built from a key, a
//! module and (role, shape, id, src) per tensor, dumps of them, and the alignment of two.
//! The passes are tested through the whole aligner (what a pass does shows only in the
//! pairs it leaves), so each file's tests use these.

use super::StructuralAligner;
use crate::compare::align::{Aligner, Alignment};
use crate::compare::Sides;
use crate::dtype::AnyDType;
use crate::dump::{Format, OpRec, Ops, RankDump, RankLoc, Role, TensorRec};
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;

/// An op: key, module, (role, shape, id, src) per tensor.
pub(super) type T = (Role, &'static [usize], Option<u64>, Option<u64>);

pub(super) fn op(key: &str, module: &str, tensors: &[T]) -> OpRec {
    let mut counts = HashMap::new();
    let tensors = tensors
        .iter()
        .map(|&(role, shape, id, src)| {
            let n = counts.entry(role.name()).or_insert(0);
            let name = format!("{key}.{}.{}", role.name(), n);
            *n += 1;
            TensorRec {
                name: name.into(),
                role,
                dtype: AnyDType::parse("float32"),
                shape: shape.to_vec(),
                stats: None,
                checksum: None,
                id,
                src,
                data: None,
                unwritten: false,
                layout: None,
            }
        })
        .collect();
    OpRec {
        module: (!module.is_empty()).then(|| module.into()),
        ..OpRec::new(0, key, tensors)
    }
}

/// A unary API call in `module`: input [n], output [n].
pub(super) fn unary(key: &str, module: &str, n: &'static [usize]) -> OpRec {
    op(
        key,
        module,
        &[(Role::Input, n, None, None), (Role::Output, n, None, None)],
    )
}

fn dump(ops: Vec<OpRec>, dataflow: bool) -> RankDump {
    let ops: Vec<OpRec> = ops
        .into_iter()
        .enumerate()
        .map(|(i, mut o)| {
            o.seq = i as u64;
            o
        })
        .collect();
    let ops = Ops::from_records(&ops).unwrap();
    RankDump {
        loc: RankLoc {
            step: "step0".into(),
            rank: "rank0".into(),
            dir: "x".into(),
            format: Format::Probe,
        },
        ops,
        stacks: BTreeMap::new(),
        has_dataflow: dataflow,
        warnings: vec![],
        incomplete: vec![],
    }
}

pub(super) fn align(b: Vec<OpRec>, c: Vec<OpRec>, dataflow: bool) -> Alignment {
    StructuralAligner::default().align(Sides::new(dump(b, dataflow), dump(c, dataflow)))
}

/// (bench tensor name, cmp tensor name, matched_by) of every pair.
pub(super) fn pairs(a: &Alignment) -> Vec<(String, String, &'static str)> {
    a.matches
        .iter()
        .map(|m| {
            let r = crate::compare::align::records(&a.dumps, m);
            (
                r.bench.name().to_string(),
                r.cmp.name().to_string(),
                m.by.name(),
            )
        })
        .collect()
}

pub(super) const N: &[usize] = &[4];
pub(super) const M: &[usize] = &[8];
