//! One side of a unit as the passes see it (pass 1, the groups): each call's API id,
//! signature and match key, the calls grouped by (phase, module path), the dataflow links
//! and each backward call's forward twin. Computed once per side, both sides in parallel,
//! before anything is paired, so that the passes compare ids and hashes instead of
//! reading op records again (they take the groups out; the rest they only read).

use super::dataflow::Dataflow;
use crate::compare::align::match_keys;
use crate::compare::mapping::Mapping;
use crate::dump::{Direction, Op, OpKind, Ops, RankDump, Role};
use crate::op_key;
use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// Forward, recomputed forward, backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Phase {
    Forward,
    Recompute,
    Backward,
}

pub(super) type GroupKey = (Phase, String);

/// What the aligner knows of one side.
pub(super) struct SideView<'a> {
    pub(super) dump: &'a RankDump,
    /// API per op (the bench name for the comparison side), as an id into the aligner's
    /// API names (shared by both sides).
    pub(super) api: Vec<u32>,
    /// Signature per op.
    pub(super) sig: Vec<u64>,
    /// Match key per op (backward counters renumbered), for the `exact` label.
    key: Vec<Option<Box<str>>>,
    /// Ops by group, in execution order (taken by the aligner's passes).
    pub(super) groups: BTreeMap<GroupKey, Vec<u32>>,
    /// Producer and readers of each dataflow id.
    pub(super) flow: Dataflow,
    /// Op index by op key, for backward → forward twins (empty on a side without backward
    /// calls).
    by_key: HashMap<&'a str, usize>,
}

/// The module path an op's call happened in: as the dump says, or from the key of the
/// parent module call msprobe's construct.json names (`Module.a.b.Class.forward.0`).
fn module_path(op: Op) -> Option<String> {
    let m: &str = op.module()?;
    Some(op_key::module_path(m).unwrap_or(m).to_string())
}

fn phase(op: Op) -> Phase {
    match (op.direction(), op.recompute()) {
        (Direction::Backward, _) => Phase::Backward,
        (Direction::Forward, true) => Phase::Recompute,
        (Direction::Forward, false) => Phase::Forward,
    }
}

/// API names, each once, and their ids.
#[derive(Default)]
pub(super) struct Interner<'a> {
    pub(super) names: Vec<&'a str>,
    ids: HashMap<&'a str, u32>,
}

impl<'a> Interner<'a> {
    /// The id of `name` (a new one for a name not met before). An op store holds at most
    /// u32::MAX ops, so at most that many names.
    fn id(&mut self, name: &'a str) -> u32 {
        let next = self.names.len() as u32;
        let id = *self.ids.entry(name).or_insert(next);
        if id == next {
            self.names.push(name);
        }
        id
    }
}

impl<'a> SideView<'a> {
    /// The view of one side, with its APIs' ids in `apis` (its own, made one with the other
    /// side's by [`SideView::renumber`]).
    pub(super) fn new(
        dump: &'a RankDump,
        mapping: Option<&'a Mapping>,
        modules: bool,
    ) -> (Self, Interner<'a>) {
        let ops = &dump.ops;
        let mut apis = Interner::default();
        let mut api = Vec::with_capacity(ops.len());
        let mut sig = Vec::with_capacity(ops.len());
        for op in ops.iter() {
            let base = op.key().base_text();
            let name = match mapping {
                Some(m) => m.bench_api(base),
                None => base,
            };
            api.push(apis.id(name));
            sig.push(signature(name, op));
        }
        // Module classes by path, from module records (`Module.path.Class.forward.0`), for
        // msprobe's class-scoped layer mapping.
        let classes: HashMap<&str, &str> = ops
            .iter()
            .filter(|op| op.kind() == OpKind::Module)
            .filter_map(|op| op_key::module_class(op.key().text()))
            .collect();
        let mut groups: BTreeMap<GroupKey, Vec<u32>> = BTreeMap::new();
        for op in ops.iter() {
            let module = if modules {
                let m = module_path(op).unwrap_or_default();
                match mapping {
                    Some(map) => map
                        .bench_module_in(&m, |p| classes.get(p).copied())
                        .into_owned(),
                    None => m,
                }
            } else {
                String::new()
            };
            groups
                .entry((phase(op), module))
                .or_default()
                .push(op.index() as u32);
        }
        let flow = if dump.has_dataflow {
            Dataflow::of(ops)
        } else {
            Dataflow::default()
        };
        // Only backward calls look up their forward twin: a side without any (an inference
        // dump, a forward-only capture) needs no map of every op key.
        let by_key = if ops.iter().any(|op| phase(op) == Phase::Backward) {
            ops.iter().map(|op| (op.key().text(), op.index())).collect()
        } else {
            HashMap::new()
        };
        let view = SideView {
            dump,
            api,
            sig,
            key: match_keys(ops),
            groups,
            flow,
            by_key,
        };
        (view, apis)
    }

    /// Moves this side's API ids from its own `own` names into `shared`.
    pub(super) fn renumber(&mut self, own: Interner<'a>, shared: &mut Interner<'a>) {
        let to: Vec<u32> = own.names.iter().map(|n| shared.id(n)).collect();
        for a in &mut self.api {
            *a = to[*a as usize];
        }
    }

    pub(super) fn ops(&self) -> &'a Ops {
        &self.dump.ops
    }

    pub(super) fn match_key(&self, op: usize) -> &str {
        self.key[op]
            .as_deref()
            .unwrap_or(self.dump.ops.get(op).key().text())
    }

    /// The forward op a backward op belongs to.
    pub(super) fn twin(&self, op: usize) -> Option<usize> {
        let k = self.dump.ops.get(op).key().forward_twin()?;
        self.by_key.get(k.as_str()).copied()
    }
}

/// Whether both sides say which module each call was made in.
pub(super) fn has_modules(d: &RankDump) -> bool {
    d.ops.iter().any(|op| op.module().is_some())
}

/// API name (module records: the module key base) and its input/output shapes. dtypes
/// are left out on purpose: autocast changes them, not what the call computes. Signatures
/// are only ever compared for equality within one process, so any well-mixed 64-bit hash
/// does (foldhash with a fixed seed: SipHash took 7 % of a million-op compare).
pub(super) fn signature(api: &str, op: Op) -> u64 {
    let mut h = foldhash::quality::FixedState::with_seed(0).build_hasher();
    api.hash(&mut h);
    op.direction().name().hash(&mut h);
    let inputs = || {
        op.tensors()
            .filter(|t| t.role() != Role::Output)
            .map(|t| t.shape())
    };
    for t in op.tensors().filter(|t| t.role() == Role::Output) {
        1u8.hash(&mut h);
        t.shape().hash(&mut h);
    }
    // Inputs as a multiset: dumpers disagree on keyword vs positional slots. Most ops have
    // a handful, sorted in place on the stack.
    let mut few: [&[usize]; 8] = [&[]; 8];
    let n = inputs().count();
    if n <= few.len() {
        for (slot, s) in few.iter_mut().zip(inputs()) {
            *slot = s;
        }
        few[..n].sort_unstable();
        few[..n].hash(&mut h);
    } else {
        let mut all: Vec<&[usize]> = inputs().collect();
        all.sort_unstable();
        all.hash(&mut h);
    }
    h.finish()
}
