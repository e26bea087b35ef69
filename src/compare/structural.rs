//! Structural alignment: pair the op calls of two runs whose code paths differ.
//!
//! Global call counters (`Functional.linear.7`) shift as soon as one side calls an API
//! once more or once less anywhere before: pairing by name then compares the wrong calls.
//! Here calls are paired within their module call instead, in four passes:
//!
//! 1. **Groups.** Each side's calls are grouped by (phase, module path): forward,
//!    recomputed forward and backward apart, and within them the module the call was made
//!    in (when both sides know it). A call inserted in one module cannot shift another's.
//! 2. **Anchors.** In a group, the n-th call of an API on both sides with the same
//!    signature (API, input and output shapes) is a candidate, and so is the n-th call of
//!    a signature on both sides (one call more of an API on one side shifts the first
//!    count of its later calls, a call of other shapes the second); the longest chain of
//!    candidates in the same order on both sides is kept (a longest increasing subsequence,
//!    `O(n log n)`). On identical code paths every call is an anchor and nothing else runs.
//! 3. **Gaps.** Between two anchors, the calls left are aligned by a longest common
//!    subsequence over signatures (quadratic, but only inside one gap of one module call;
//!    a gap too large for it is paired greedily in order). Same API with other shapes is
//!    never a pair.
//! 4. **Regions.** What is still left on both sides between two pairs is a region: the two
//!    code paths differ there. It is compared at its boundary tensors: the inputs it reads
//!    from outside and the outputs read after it, paired through the dataflow links of
//!    what was already paired (by shape and order without links). A mapping rule that
//!    declares the two runs equivalent (a fused kernel and its composition) marks the rows
//!    `mapped`, else `module`. The backward calls of a forward region are compared at the
//!    gradients of its boundary tensors.
//!
//! What is left after that is unmatched, with the reason: other shapes for the same API,
//! a recomputation only one side does, or nothing on the other side.

use super::align::{
    match_keys, unmatched, Aligner, Alignment, MatchedBy, OpInfo, Region, Side, TensorMatch,
    TensorRef, Unmatched, Why,
};
use super::mapping::Mapping;
use super::Sides;
use crate::dump::{Direction, Op, OpKind, Ops, RankDump, Role, Tensor};
use foldhash::{HashMap, HashMapExt, HashSet};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// Largest gap (calls × calls) aligned by the quadratic longest common subsequence.
const MAX_DP_CELLS: usize = 1 << 20;

/// The structural aligner (the default), with the mapping table it consults.
#[derive(Debug, Clone)]
pub struct StructuralAligner {
    /// Equivalences and renames between the sides.
    pub mapping: Mapping,
}

impl Default for StructuralAligner {
    /// With the built-in mapping table.
    fn default() -> Self {
        StructuralAligner::new(Mapping::builtin())
    }
}

impl StructuralAligner {
    /// An aligner consulting `mapping`.
    pub fn new(mapping: Mapping) -> Self {
        StructuralAligner { mapping }
    }
}

/// Forward, recomputed forward, backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Phase {
    Forward,
    Recompute,
    Backward,
}

type GroupKey = (Phase, String);

/// What the aligner knows of one side.
struct SideView<'a> {
    dump: &'a RankDump,
    /// API per op (the bench name for the comparison side), as an id into the aligner's
    /// API names (shared by both sides).
    api: Vec<u32>,
    /// Signature per op.
    sig: Vec<u64>,
    /// Match key per op (backward counters renumbered), for the `exact` label.
    key: Vec<Option<Box<str>>>,
    /// Ops by group, in execution order (taken by the aligner's passes).
    groups: BTreeMap<GroupKey, Vec<u32>>,
    /// Producer and readers of each dataflow id.
    flow: Dataflow,
    /// Op index by op key, for backward → forward twins (empty on a side without backward
    /// calls).
    by_key: HashMap<&'a str, usize>,
}

/// Who produced and who read each dataflow id of one side: sorted lists, searched by id.
/// (Maps of an id to a vector of readers took ~100 MB a side for a million tensors.)
#[derive(Default)]
struct Dataflow {
    /// (id, producer), by id; of an id produced twice, the later producer counts.
    producers: Vec<(u64, TensorRef)>,
    /// (id, reader), by id, each id's readers in execution order.
    readers: Vec<(u64, TensorRef)>,
}

impl Dataflow {
    fn of(ops: &Ops) -> Dataflow {
        let (mut producers, mut readers) = (Vec::new(), Vec::new());
        for op in ops.iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if let Some(id) = t.id().filter(|_| t.role() == Role::Output) {
                    producers.push((id, r));
                }
                if let Some(src) = t.src() {
                    readers.push((src, r));
                }
            }
        }
        // Stable sorts: equal ids keep execution order.
        producers.sort_by_key(|e| e.0);
        readers.sort_by_key(|e| e.0);
        Dataflow { producers, readers }
    }

    /// The op output that produced `id`.
    fn producer(&self, id: u64) -> Option<TensorRef> {
        let end = self.producers.partition_point(|e| e.0 <= id);
        end.checked_sub(1)
            .map(|i| self.producers[i])
            .filter(|e| e.0 == id)
            .map(|e| e.1)
    }

    /// The tensors that read `id`, in execution order (None: none).
    fn readers(&self, id: u64) -> Option<impl Iterator<Item = TensorRef> + Clone + '_> {
        let start = self.readers.partition_point(|e| e.0 < id);
        let end = self.readers.partition_point(|e| e.0 <= id);
        (start < end).then(|| self.readers[start..end].iter().map(|e| e.1))
    }
}

fn module_path(op: Op) -> Option<String> {
    let m: &str = op.module()?;
    // msprobe's construct.json names the parent module call (`Module.a.b.Class.forward.0`).
    if let Some(rest) = m
        .strip_prefix("Module.")
        .or_else(|| m.strip_prefix("Cell."))
    {
        let parts: Vec<&str> = rest.split('.').collect();
        if parts.len() >= 4 {
            return Some(parts[..parts.len() - 3].join("."));
        }
    }
    Some(m.to_string())
}

fn phase(op: Op) -> Phase {
    match (op.direction(), op.recompute()) {
        (Direction::Backward, _) => Phase::Backward,
        (Direction::Forward, true) => Phase::Recompute,
        (Direction::Forward, false) => Phase::Forward,
    }
}

/// API name (module records: the module key base) and its input/output shapes. dtypes
/// are left out on purpose: autocast changes them, not what the call computes. Signatures
/// are only ever compared for equality within one process, so any well-mixed 64-bit hash
/// does (foldhash with a fixed seed: SipHash took 7 % of a million-op compare).
fn signature(api: &str, op: Op) -> u64 {
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

/// API names, each once, and their ids.
#[derive(Default)]
struct Interner<'a> {
    names: Vec<&'a str>,
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
    fn new(
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
            .filter_map(|op| {
                let base = op.key().base_text();
                let (path, class) = base.strip_prefix("Module.")?.rsplit_once('.')?;
                Some((path, class))
            })
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
    fn renumber(&mut self, own: Interner<'a>, shared: &mut Interner<'a>) {
        let to: Vec<u32> = own.names.iter().map(|n| shared.id(n)).collect();
        for a in &mut self.api {
            *a = to[*a as usize];
        }
    }

    fn ops(&self) -> &'a Ops {
        &self.dump.ops
    }

    fn match_key(&self, op: usize) -> &str {
        self.key[op]
            .as_deref()
            .unwrap_or(self.dump.ops.get(op).key().text())
    }

    /// The forward op a backward op belongs to.
    fn twin(&self, op: usize) -> Option<usize> {
        let k = self.dump.ops.get(op).key().forward_twin()?;
        self.by_key.get(k.as_str()).copied()
    }
}

/// Whether two tensor records hold the same value by what they say: dtype, shape, and
/// equal statistics or checksum (NaN statistics never equal). Without either, no.
fn same_value(a: Tensor, b: Tensor) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    match (a.checksum(), b.checksum()) {
        (Some(x), Some(y)) => x == y,
        _ => a.stats().is_some_and(|x| b.stats() == Some(x)),
    }
}

/// Whether two tensors hold the same kind of value: floating point (of any width: autocast
/// changes it), integers (of any width: an index is int32 on one device, int64 on another)
/// or booleans. Unknown dtypes are taken to agree.
fn same_kind(a: Tensor, b: Tensor) -> bool {
    let kind = |t: Tensor| {
        t.dtype()
            .known()
            .map(|d| (d.is_float(), d == crate::dtype::DType::Bool))
    };
    match (kind(a), kind(b)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// The module path a module record is of (`Module.a.b.Class.forward.0`: `a.b`).
fn record_path(op: Op<'_>) -> Option<&str> {
    crate::op_key::module_path(op.key().text())
}

/// Whether both sides say which module each call was made in.
fn has_modules(d: &RankDump) -> bool {
    d.ops.iter().any(|op| op.module().is_some())
}

/// No index (u32 index lists).
const NO: u32 = u32::MAX;

/// Indices (into `seq`) of a longest strictly increasing subsequence.
fn lis(seq: &[u32]) -> Vec<u32> {
    let mut tails: Vec<u32> = Vec::new(); // index into seq of the tail of each length
    let mut prev: Vec<u32> = vec![NO; seq.len()];
    for (i, &v) in seq.iter().enumerate() {
        let pos = tails.partition_point(|&t| seq[t as usize] < v);
        prev[i] = pos.checked_sub(1).map_or(NO, |p| tails[p]);
        if pos == tails.len() {
            tails.push(i as u32);
        } else {
            tails[pos] = i as u32;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut cur = tails.last().copied().unwrap_or(NO);
    while cur != NO {
        out.push(cur);
        cur = prev[cur as usize];
    }
    out.reverse();
    out
}

/// Pairs of positions (into `b`, `c`) of a maximum-weight common subsequence of equal
/// signatures; a pair with the same match key weighs more, so ties go to the same call.
fn lcs(b: &[u32], c: &[u32], bv: &SideView, cv: &SideView) -> Vec<(usize, usize)> {
    let (n, m) = (b.len(), c.len());
    if n == 0 || m == 0 {
        return vec![];
    }
    let w = |i: usize, j: usize| -> u32 {
        let (x, y) = (b[i] as usize, c[j] as usize);
        if bv.sig[x] != cv.sig[y] {
            0
        } else if bv.match_key(x) == cv.match_key(y) {
            3
        } else {
            2
        }
    };
    if n.saturating_mul(m) > MAX_DP_CELLS {
        // Greedy in order: each comparison call takes the next bench call with its
        // signature. Linear; exact when the gap holds only insertions on one side.
        let mut next: HashMap<u64, std::collections::VecDeque<usize>> = HashMap::new();
        for (i, &op) in b.iter().enumerate() {
            next.entry(bv.sig[op as usize]).or_default().push_back(i);
        }
        let mut last = 0usize;
        let mut out = Vec::new();
        for (j, &op) in c.iter().enumerate() {
            if let Some(q) = next.get_mut(&cv.sig[op as usize]) {
                while q.front().is_some_and(|&i| i < last) {
                    q.pop_front();
                }
                if let Some(i) = q.pop_front() {
                    out.push((i, j));
                    last = i + 1;
                }
            }
        }
        return out;
    }
    let width = m + 1;
    let mut t = vec![0u32; (n + 1) * width];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            let diag = match w(i, j) {
                0 => 0,
                x => x + t[(i + 1) * width + j + 1],
            };
            t[i * width + j] = diag.max(t[(i + 1) * width + j]).max(t[i * width + j + 1]);
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < n && j < m {
        let here = t[i * width + j];
        let x = w(i, j);
        if x > 0 && here == x + t[(i + 1) * width + j + 1] {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if here == t[(i + 1) * width + j] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Op pairs of one group, and the stretches between them where both sides have calls
/// left (the regions) or one side has (insertions).
struct GroupAlignment {
    pairs: Vec<(u32, u32)>,
    gaps: Vec<(Vec<u32>, Vec<u32>)>,
}

/// `scratch` holds 0 for every API id (as many as there are API names) and is left so.
fn align_group(
    b: &[u32],
    c: &[u32],
    bv: &SideView,
    cv: &SideView,
    scratch: &mut [u32],
) -> GroupAlignment {
    // Anchors: the n-th call of an API in this group on both sides, same signature, and the
    // n-th call of a signature (below). The group's APIs are numbered densely
    // (`scratch[api]` is the number + 1 while the group is aligned), the benchmark's calls
    // are then listed per API in call order (one flat table), so the n-th call of an API is
    // an index, not a lookup of (name, n) in a map of every call.
    let mut seen_apis: Vec<u32> = Vec::new();
    let mut id_of = |api: u32| -> u32 {
        let e = &mut scratch[api as usize];
        if *e == 0 {
            seen_apis.push(api);
            *e = seen_apis.len() as u32;
        }
        *e - 1
    };
    let bid: Vec<u32> = b.iter().map(|&op| id_of(bv.api[op as usize])).collect();
    let cid: Vec<u32> = c.iter().map(|&op| id_of(cv.api[op as usize])).collect();
    let n_apis = seen_apis.len();
    for &api in &seen_apis {
        scratch[api as usize] = 0;
    }
    drop(seen_apis);
    // start[a]..start[a + 1]: where the positions in `b` of API a's calls are in `calls`.
    let mut start = vec![0u32; n_apis + 1];
    for &a in &bid {
        start[a as usize + 1] += 1;
    }
    for a in 0..n_apis {
        start[a + 1] += start[a];
    }
    let mut calls = vec![0u32; b.len()];
    let mut fill = start.clone();
    for (i, &a) in bid.iter().enumerate() {
        calls[fill[a as usize] as usize] = i as u32;
        fill[a as usize] += 1;
    }
    drop(bid);
    // Reused: how many calls of each API the comparison side has made so far.
    let seen = &mut fill;
    seen.fill(0);
    let mut cand: Vec<(u32, u32)> = Vec::new(); // (b pos, c pos), c ascending
    for (j, (&op, &a)) in c.iter().zip(&cid).enumerate() {
        let a = a as usize;
        let at = start[a] + seen[a];
        seen[a] += 1;
        if at < start[a + 1] {
            let i = calls[at as usize];
            if bv.sig[b[i as usize] as usize] == cv.sig[op as usize] {
                cand.push((i, j as u32));
            }
        }
    }
    drop((calls, start, fill, cid));
    // Also the n-th call of a signature on both sides: one call more of an API on one side
    // (a cast, the compiled model whose calls a dump lacks) shifts the count of that API's
    // later calls, and a shifted pair of two calls with the same shapes (the updates of two
    // parameters of one size) would be a candidate. Counted by signature those calls keep
    // their pairs; the longest chain then takes the candidates that agree with the
    // surrounding calls. (Counted by API, a call whose shapes differ on one side keeps the
    // later calls of its signature paired: both counts are needed.)
    let mut by_sig: HashMap<u64, (Vec<u32>, usize)> = HashMap::new();
    for (i, &op) in b.iter().enumerate() {
        by_sig
            .entry(bv.sig[op as usize])
            .or_default()
            .0
            .push(i as u32);
    }
    let mut both: Vec<(u32, u32)> = Vec::with_capacity(cand.len() + c.len());
    let mut api_cand = cand.into_iter().peekable();
    for (j, &op) in c.iter().enumerate() {
        let j = j as u32;
        // (For one comparison call, its candidates by decreasing bench position: the
        // longest strictly increasing chain then takes at most one of them.)
        let by_api = api_cand.next_if(|&(_, cj)| cj == j);
        let by_count = by_sig.get_mut(&cv.sig[op as usize]).and_then(|(pos, n)| {
            let i = pos.get(*n).copied();
            *n += 1;
            i
        });
        match (by_api, by_count) {
            (Some(a), Some(i)) if a.0 != i => {
                both.push((a.0.max(i), j));
                both.push((a.0.min(i), j));
            }
            (Some(a), _) => both.push(a),
            (None, Some(i)) => both.push((i, j)),
            (None, None) => {}
        }
    }
    drop(by_sig);
    let cand = both;
    let bpos: Vec<u32> = cand.iter().map(|&(i, _)| i).collect();
    let anchors: Vec<(u32, u32)> = lis(&bpos).into_iter().map(|k| cand[k as usize]).collect();
    drop((bpos, cand));
    let mut pairs = Vec::with_capacity(c.len().min(b.len()));
    let mut gaps = Vec::new();
    let (mut pi, mut pj) = (0usize, 0usize);
    let mut close = |ei: usize, ej: usize, pairs: &mut Vec<(u32, u32)>, pi: usize, pj: usize| {
        let (gb, gc) = (&b[pi..ei], &c[pj..ej]);
        if gb.is_empty() && gc.is_empty() {
            return;
        }
        let (mut si, mut sj) = (0usize, 0usize);
        let inner = lcs(gb, gc, bv, cv);
        for &(i, j) in inner.iter().chain(std::iter::once(&(gb.len(), gc.len()))) {
            if si < i || sj < j {
                gaps.push((gb[si..i].to_vec(), gc[sj..j].to_vec()));
            }
            if i < gb.len() {
                pairs.push((gb[i], gc[j]));
            }
            si = i + 1;
            sj = j + 1;
        }
    };
    for &(i, j) in &anchors {
        let (i, j) = (i as usize, j as usize);
        close(i, j, &mut pairs, pi, pj);
        pairs.push((b[i], c[j]));
        pi = i + 1;
        pj = j + 1;
    }
    close(b.len(), c.len(), &mut pairs, pi, pj);
    GroupAlignment { pairs, gaps }
}

/// An op list as `usize` indices.
fn widen(ops: &[u32]) -> Vec<usize> {
    ops.iter().map(|&o| o as usize).collect()
}

/// Builds the alignment of one unit, pass by pass (see the module doc).
struct Builder<'a> {
    bv: SideView<'a>,
    cv: SideView<'a>,
    mapping: &'a Mapping,
    /// API names, both sides' ids index them.
    apis: Vec<&'a str>,
    /// Taken tensors per side, by position among the side's tensors.
    taken: Sides<Vec<bool>>,
    /// The bench partner of each comparison tensor (flat), once paired.
    partner: Vec<Option<TensorRef>>,
    /// Why a left-over tensor's op is left over, when not simply unmatched.
    why: Sides<Vec<Why>>,
    matches: Vec<(TensorMatch, u8)>,
    /// Paired ops, comparison index → bench index.
    op_pair: Vec<Option<u32>>,
    regions: Vec<Region>,
    /// Forward ops inside a region, per side: op → region index.
    in_region: Sides<HashMap<usize, usize>>,
    /// Boundary pairs of each forward region whose gradients a backward record holds.
    boundaries: Vec<Vec<Sides<TensorRef>>>,
}

impl<'a> Builder<'a> {
    fn side(&self, s: Side) -> &SideView<'a> {
        match s {
            Side::Bench => &self.bv,
            Side::Cmp => &self.cv,
        }
    }

    /// The position of `r` among its side's tensors.
    fn flat(&self, s: Side, r: TensorRef) -> usize {
        self.side(s).ops().get(r.op()).first_tensor() + r.tensor()
    }

    fn is_taken(&self, s: Side, r: TensorRef) -> bool {
        match s {
            Side::Bench => self.taken.bench[self.flat(s, r)],
            Side::Cmp => self.taken.cmp[self.flat(s, r)],
        }
    }

    fn push(&mut self, b: TensorRef, c: TensorRef, by: MatchedBy, at: usize, late: u8) {
        let bi = self.flat(Side::Bench, b);
        let ci = self.flat(Side::Cmp, c);
        if self.taken.bench[bi] || self.taken.cmp[ci] {
            return;
        }
        self.taken.bench[bi] = true;
        self.taken.cmp[ci] = true;
        self.partner[ci] = Some(b);
        let op = self.cv.dump.ops.get(c.op());
        let t = op.tensor(c.tensor());
        let external = match t.role() {
            Role::Parameter => op.direction() == Direction::Forward,
            Role::Input => {
                self.cv.dump.has_dataflow
                    && t.src().is_none()
                    && op.direction() == Direction::Forward
            }
            Role::Output => false,
        };
        self.matches.push((
            TensorMatch {
                refs: Sides::new(b, c),
                external,
                by,
                at: at as u32,
            },
            late,
        ));
    }

    /// Pairs the tensors of two paired ops by slot (`input.0`, `output.1`, `input.weight`:
    /// probe and msprobe name them alike); a slot on one side only stays unmatched.
    fn pair_ops(&mut self, b: usize, c: usize) {
        self.op_pair[c] = Some(b as u32);
        let by = if self.bv.match_key(b) == self.cv.match_key(c) {
            MatchedBy::Exact
        } else {
            MatchedBy::Aligned
        };
        let (bop, cop) = (self.bv.dump.ops.get(b), self.cv.dump.ops.get(c));
        // A name outside the op's key (not the grammar) pairs by the whole name.
        let bslot = |i: usize| bop.tensor(i).slot_or_name();
        // Most ops have a few tensors: a scan beats building a map per op pair (a
        // million-op unit built a million maps).
        const SCAN: usize = 16;
        let n = bop.tensor_count();
        let slots: Option<HashMap<&str, usize>> =
            (n > SCAN).then(|| (0..n).map(|i| (bslot(i), i)).collect());
        for (j, t) in cop.tensors().enumerate() {
            let slot = t.slot_or_name();
            let found = match &slots {
                Some(map) => map.get(slot).copied(),
                // The last with that slot, as the map keeps.
                None => (0..n).rev().find(|&i| bslot(i) == slot),
            };
            if let Some(i) = found {
                let u = bop.tensor(i);
                if u.shape() == t.shape() && u.role() == t.role() {
                    let (bt, ct) = (TensorRef::new(b, i), TensorRef::new(c, j));
                    self.push(bt, ct, by, c, 0);
                }
            }
        }
    }

    fn mark(&mut self, side: Side, ops: &[usize], why: Why) {
        let w = match side {
            Side::Bench => &mut self.why.bench,
            Side::Cmp => &mut self.why.cmp,
        };
        for &op in ops {
            w[op] = why;
        }
    }

    /// Boundary tensors of a region on one side: inputs read from outside it, outputs
    /// read after it (with dataflow); else the first call's inputs and the last's outputs.
    fn boundary(&self, s: Side, ops: &[usize]) -> (Vec<TensorRef>, Vec<TensorRef>) {
        let v = self.side(s);
        let all = v.ops();
        let inside: HashSet<usize> = ops.iter().copied().collect();
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        let forward = ops
            .first()
            .is_some_and(|&o| all.get(o).direction() == Direction::Forward);
        if v.dump.has_dataflow && forward {
            for &o in ops {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    let r = TensorRef::new(o, ti);
                    match t.role() {
                        Role::Input | Role::Parameter => {
                            let from_inside = t
                                .src()
                                .and_then(|s| v.flow.producer(s))
                                .is_some_and(|p| inside.contains(&p.op()));
                            if !from_inside {
                                ins.push(r);
                            }
                        }
                        Role::Output => {
                            let read = t.id().and_then(|id| v.flow.readers(id));
                            let read_outside = read
                                .clone()
                                .is_some_and(|mut rs| rs.any(|x| !inside.contains(&x.op())));
                            let last = Some(&o) == ops.last();
                            if read_outside || (read.is_none() && last) {
                                outs.push(r);
                            }
                        }
                    }
                }
            }
        } else {
            if let Some(&o) = ops.first() {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    if t.role() != Role::Output {
                        ins.push(TensorRef::new(o, ti));
                    }
                }
            }
            if let Some(&o) = ops.last() {
                for (ti, t) in all.get(o).tensors().enumerate() {
                    if t.role() == Role::Output {
                        outs.push(TensorRef::new(o, ti));
                    }
                }
            }
        }
        (ins, outs)
    }

    /// The op keys of a region's calls on each side.
    fn calls(&self, b: &[usize], c: &[usize]) -> Sides<Vec<String>> {
        let keys = |v: &SideView, ops: &[usize]| -> Vec<String> {
            ops.iter()
                .map(|&o| v.ops().get(o).key().text().to_string())
                .collect()
        };
        Sides::new(keys(&self.bv, b), keys(&self.cv, c))
    }

    fn tensor(&self, s: Side, r: TensorRef) -> Tensor<'a> {
        self.side(s).ops().get(r.op()).tensor(r.tensor())
    }

    /// Pairs two boundary lists: first where the dataflow links say both hold the same
    /// value (`target` gives the bench dataflow id a comparison tensor corresponds to,
    /// `own` a bench tensor's id; with `placed_only`, a tensor with a target is paired
    /// there or not at all), then where the records do ([`same_value`]), then by role,
    /// shape, kind of dtype and order.
    fn pair_lists(
        &self,
        b: &[TensorRef],
        c: &[TensorRef],
        target: impl Fn(TensorRef) -> Option<u64>,
        own: impl Fn(TensorRef) -> Option<u64>,
        placed_only: bool,
    ) -> Vec<Sides<TensorRef>> {
        let mut used = vec![false; b.len()];
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for &cr in c {
            let Some(w) = target(cr) else {
                rest.push(cr);
                continue;
            };
            match (0..b.len()).find(|&i| !used[i] && own(b[i]) == Some(w)) {
                Some(i) => {
                    used[i] = true;
                    out.push(Sides::new(b[i], cr));
                }
                // An input the dataflow places comes from a paired op, compared there: the
                // router's choices, which the other side reads in a call not captured, are
                // no index tensor of the same shape.
                None if placed_only => {}
                None => rest.push(cr),
            }
        }
        // Then what holds the same value by its record (a weight read on both sides, which
        // no captured op produced: each expert's, in another order on each side), then by
        // role, shape and order.
        let mut left = Vec::new();
        for cr in rest {
            let ct = self.tensor(Side::Cmp, cr);
            let hit = (0..b.len()).find(|&i| {
                let bt = self.tensor(Side::Bench, b[i]);
                !used[i] && bt.role() == ct.role() && same_value(bt, ct)
            });
            match hit {
                Some(i) => {
                    used[i] = true;
                    out.push(Sides::new(b[i], cr));
                }
                None => left.push(cr),
            }
        }
        for cr in left {
            let ct = self.tensor(Side::Cmp, cr);
            let hit = (0..b.len()).find(|&i| {
                let bt = self.tensor(Side::Bench, b[i]);
                !used[i] && bt.role() == ct.role() && bt.shape() == ct.shape() && same_kind(bt, ct)
            });
            if let Some(i) = hit {
                used[i] = true;
                out.push(Sides::new(b[i], cr));
            }
        }
        out
    }

    /// The bench dataflow id of the value a comparison input reads: the id of the bench
    /// partner of the comparison output it was produced as.
    fn input_target(&self, cr: TensorRef) -> Option<u64> {
        let src = self.tensor(Side::Cmp, cr).src()?;
        let cp = self.cv.flow.producer(src)?;
        let partner = self.partner[self.flat(Side::Cmp, cp)]?;
        self.tensor(Side::Bench, partner).id()
    }

    /// The bench dataflow id a comparison output corresponds to: the value the bench
    /// partner of the op reading it reads in the same slot.
    fn output_target(&self, cr: TensorRef) -> Option<u64> {
        let id = self.tensor(Side::Cmp, cr).id()?;
        let reader = self.cv.flow.readers(id)?.next()?;
        let bop = self.op_pair[reader.op()]? as usize;
        let slot = self.tensor(Side::Cmp, reader).slot_name()?;
        self.bv
            .ops()
            .get(bop)
            .tensors()
            .find(|t| t.slot_name() == Some(slot))?
            .src()
    }

    /// Compares a stretch where both sides have calls left: a region. Returns whether
    /// any boundary pair was found.
    fn region(&mut self, module: &str, b: &[usize], c: &[usize], bounded: bool) -> bool {
        let bids: Vec<u32> = b.iter().map(|&o| self.bv.api[o]).collect();
        let cids: Vec<u32> = c.iter().map(|&o| self.cv.api[o]).collect();
        if bids == cids {
            // The same calls with other shapes: a shape mismatch, not another code path.
            return false;
        }
        let names =
            |ids: &[u32]| -> Vec<&str> { ids.iter().map(|&a| self.apis[a as usize]).collect() };
        let (bapis, capis) = (names(&bids), names(&cids));
        let rule = self
            .mapping
            .rule_for(&bapis, &capis)
            .map(|r| r.name.clone());
        if rule.is_none() && !bounded {
            // Module fallback only between two points both sides agree on: calls that
            // share nothing with anything paired are not guessed at.
            return false;
        }
        let by = if rule.is_some() {
            MatchedBy::Mapped
        } else {
            MatchedBy::Module
        };
        let (bin, bout) = self.boundary(Side::Bench, b);
        let (cin, cout) = self.boundary(Side::Cmp, c);
        let inputs = self.pair_lists(
            &bin,
            &cin,
            |cr| self.input_target(cr),
            |br| self.tensor(Side::Bench, br).src(),
            true,
        );
        let outputs = self.pair_lists(
            &bout,
            &cout,
            |cr| self.output_target(cr),
            |br| self.tensor(Side::Bench, br).id(),
            false,
        );
        if outputs.is_empty() {
            return false;
        }
        let at = *c.last().unwrap_or(&0);
        let direction = self.cv.ops().get(at).direction();
        for p in inputs.iter() {
            self.push(p.bench, p.cmp, by, at, 0);
        }
        for p in outputs.iter() {
            self.push(p.bench, p.cmp, by, at, 1);
        }
        let boundary: Vec<Sides<TensorRef>> = inputs.iter().chain(&outputs).copied().collect();
        let id = self.regions.len();
        self.regions.push(Region {
            module: module.to_string(),
            direction,
            by,
            rule,
            calls: self.calls(b, c),
            at: OpInfo::of(self.cv.ops().get(at)),
            boundary: boundary.len(),
        });
        if direction == Direction::Forward {
            for &o in b {
                self.in_region.bench.insert(o, id);
            }
            for &o in c {
                self.in_region.cmp.insert(o, id);
            }
            // A boundary input read by several calls of the region has its gradient summed
            // over them: no single backward record holds it, so it is not mirrored.
            let once = |s: Side, ops: &[usize], r: TensorRef| -> bool {
                let v = self.side(s);
                let t = v.ops().get(r.op()).tensor(r.tensor());
                let Some(src) = t.src() else {
                    // No link (a parameter, data from outside): its other reads are the
                    // region's src-less inputs recorded as the same value (the 3-D weights
                    // of an MoE's experts, indexed once per expert).
                    return !ops.iter().any(|&o| {
                        o != r.op()
                            && v.ops().get(o).tensors().any(|x| {
                                x.role() != Role::Output && x.src().is_none() && same_value(t, x)
                            })
                    });
                };
                let inside = v
                    .flow
                    .readers(src)
                    .map_or(0, |rs| rs.filter(|x| ops.contains(&x.op())).count());
                inside <= 1
            };
            let mirrored: Vec<Sides<TensorRef>> = inputs
                .iter()
                .filter(|p| once(Side::Bench, b, p.bench) && once(Side::Cmp, c, p.cmp))
                .chain(&outputs)
                .copied()
                .collect();
            self.boundaries.push(mirrored);
        } else {
            self.boundaries.push(Vec::new());
        }
        self.mark(Side::Bench, b, Why::Inside);
        self.mark(Side::Cmp, c, Why::Inside);
        true
    }

    /// The backward calls of forward regions: compared at the gradients of the region's
    /// boundary tensors (a forward input's gradient is its backward call's output in the
    /// same slot, a forward output's gradient its backward call's input). `groups`: the
    /// backward calls by group; a region's calls may lie in several (a module called inside
    /// it). The calls taken are marked `Inside`; the rest are aligned like forward calls.
    fn mirror(&mut self, groups: &[Sides<Vec<u32>>]) {
        if self.in_region.bench.is_empty() && self.in_region.cmp.is_empty() {
            // No forward region (identical code paths): no twin lookup per backward call.
            return;
        }
        // Backward ops whose forward twin lies in a region: by region, in execution order.
        let mut members: BTreeMap<usize, Sides<Vec<usize>>> = BTreeMap::new();
        for g in groups {
            for (s, ops) in [(Side::Bench, &g.bench), (Side::Cmp, &g.cmp)] {
                for &o in ops {
                    let o = o as usize;
                    let v = self.side(s);
                    let reg = v.twin(o).and_then(|f| match s {
                        Side::Bench => self.in_region.bench.get(&f),
                        Side::Cmp => self.in_region.cmp.get(&f),
                    });
                    match (reg, s) {
                        (Some(&r), Side::Bench) => members.entry(r).or_default().bench.push(o),
                        (Some(&r), Side::Cmp) => members.entry(r).or_default().cmp.push(o),
                        (None, _) => {}
                    }
                }
            }
        }
        for (r, mut ops) in members {
            ops.bench.sort_unstable();
            ops.cmp.sort_unstable();
            let twin_of = |v: &SideView, list: &[usize]| -> HashMap<usize, usize> {
                list.iter()
                    .filter_map(|&o| v.twin(o).map(|f| (f, o)))
                    .collect()
            };
            let (bt, ct) = (twin_of(&self.bv, &ops.bench), twin_of(&self.cv, &ops.cmp));
            let at = ops.cmp.iter().copied().max();
            let mut pairs = Vec::new();
            for p in &self.boundaries[r] {
                let (Some(&bb), Some(&cb)) = (bt.get(&p.bench.op()), ct.get(&p.cmp.op())) else {
                    continue;
                };
                let grad = |v: &SideView, fwd: TensorRef, bop: usize| -> Option<usize> {
                    let slot = v.ops().get(fwd.op()).tensor(fwd.tensor()).slot_name()?;
                    let want = if let Some(i) = slot.strip_prefix("input.") {
                        format!("output.{i}")
                    } else if let Some(i) = slot.strip_prefix("output.") {
                        format!("input.{i}")
                    } else {
                        return None;
                    };
                    v.ops()
                        .get(bop)
                        .tensors()
                        .position(|t| t.slot_name() == Some(want.as_str()))
                };
                if let (Some(x), Some(y)) = (grad(&self.bv, p.bench, bb), grad(&self.cv, p.cmp, cb))
                {
                    let bo = self.bv.ops().get(bb).tensor(x);
                    let co = self.cv.ops().get(cb).tensor(y);
                    if bo.shape() == co.shape() {
                        let late = u8::from(co.role() == Role::Output);
                        pairs.push((TensorRef::new(bb, x), TensorRef::new(cb, y), late));
                    }
                }
            }
            let Some(at) = at else {
                continue;
            };
            if pairs.is_empty() || ops.bench.is_empty() {
                continue;
            }
            let by = self.regions[r].by;
            for (b, c, late) in &pairs {
                self.push(*b, *c, by, at, *late);
            }
            let fwd = &self.regions[r];
            let region = Region {
                module: fwd.module.clone(),
                direction: Direction::Backward,
                by,
                rule: fwd.rule.clone(),
                calls: self.calls(&ops.bench, &ops.cmp),
                at: OpInfo::of(self.cv.ops().get(at)),
                boundary: pairs.len(),
            };
            self.regions.push(region);
            self.boundaries.push(Vec::new());
            self.mark(Side::Bench, &ops.bench, Why::Inside);
            self.mark(Side::Cmp, &ops.cmp, Why::Inside);
        }
    }

    /// A stretch of module records only (a dump without API calls: `level="module"`,
    /// msprobe's L0) that no region could be made of, inside a call of an ancestor module
    /// whose own records pair: the module's calls differ in number or shape inside it (an
    /// MoE's experts call their activation module once per expert, or once), and the
    /// ancestor's records compare what goes in and out. A region of that module, reported
    /// under its record; returns whether it was made.
    fn inside_record(&mut self, module: &str, b: &[usize], c: &[usize]) -> bool {
        let modules_only = |v: &SideView, ops: &[usize]| {
            ops.iter().all(|&o| v.ops().get(o).kind() == OpKind::Module)
        };
        if !modules_only(&self.bv, b) || !modules_only(&self.cv, c) {
            return false;
        }
        let (Some(&bl), Some(&cl)) = (b.last(), c.last()) else {
            return false;
        };
        let direction = self.cv.ops().get(cl).direction();
        // The record of `path` that ends the call the stretch lies in: the next one after
        // it, before any record of a module outside `path` (the call has ended then).
        let next = |v: &SideView, after: usize, path: &str| -> Option<usize> {
            for op in v.ops().iter().skip(after + 1) {
                if op.kind() != OpKind::Module || op.direction() != direction {
                    continue;
                }
                let p = record_path(op)?;
                if p == path {
                    return Some(op.index());
                }
                let inside =
                    p.len() > path.len() && p.starts_with(path) && p.as_bytes()[path.len()] == b'.';
                if !inside {
                    return None;
                }
            }
            None
        };
        let mut q = module;
        while let Some((up, _)) = q.rsplit_once('.') {
            q = up;
            let (Some(bq), Some(cq)) = (next(&self.bv, bl, q), next(&self.cv, cl, q)) else {
                continue;
            };
            if self.op_pair[cq] != Some(bq as u32) {
                return false;
            }
            let at = self.cv.ops().get(cq);
            self.regions.push(Region {
                module: q.to_string(),
                direction,
                by: MatchedBy::Module,
                rule: None,
                calls: self.calls(b, c),
                at: OpInfo::of(at),
                boundary: at.tensor_count(),
            });
            self.boundaries.push(Vec::new());
            self.mark(Side::Bench, b, Why::Inside);
            self.mark(Side::Cmp, c, Why::Inside);
            return true;
        }
        false
    }

    /// A stretch left on both sides that no region could be made of: other shapes for the
    /// same API are a shape mismatch, the rest unmatched.
    fn leftover(&mut self, b: &[usize], c: &[usize]) {
        let bapis: HashSet<u32> = b.iter().map(|&o| self.bv.api[o]).collect();
        let capis: HashSet<u32> = c.iter().map(|&o| self.cv.api[o]).collect();
        let shared: HashSet<u32> = bapis.intersection(&capis).copied().collect();
        let bw: Vec<usize> = b
            .iter()
            .copied()
            .filter(|&o| shared.contains(&self.bv.api[o]))
            .collect();
        let cw: Vec<usize> = c
            .iter()
            .copied()
            .filter(|&o| shared.contains(&self.cv.api[o]))
            .collect();
        self.mark(Side::Bench, &bw, Why::ShapeMismatch);
        self.mark(Side::Cmp, &cw, Why::ShapeMismatch);
    }
}

impl Aligner for StructuralAligner {
    fn align(&self, dumps: Sides<RankDump>) -> Alignment {
        let modules = has_modules(&dumps.bench) && has_modules(&dumps.cmp);
        let (regions, matches, unmatched) = {
            let ((bv, bapis), (mut cv, capis)) = rayon::join(
                || SideView::new(&dumps.bench, None, modules),
                || SideView::new(&dumps.cmp, Some(&self.mapping), modules),
            );
            // One id per API over both sides.
            let mut apis = bapis;
            cv.renumber(capis, &mut apis);
            let apis = apis.names;
            let (bn, cn) = (dumps.bench.ops.tensor_count(), dumps.cmp.ops.tensor_count());
            let mut scratch = vec![0u32; apis.len()];
            let mut bld = Builder {
                why: Sides::new(
                    vec![Why::Unmatched; dumps.bench.ops.len()],
                    vec![Why::Unmatched; dumps.cmp.ops.len()],
                ),
                bv,
                cv,
                mapping: &self.mapping,
                apis,
                taken: Sides::new(vec![false; bn], vec![false; cn]),
                partner: vec![None; cn],
                // At most one match per comparison tensor: reserved once rather than grown
                // by doubling (memory never written stays untouched).
                matches: Vec::with_capacity(cn),
                op_pair: vec![None; dumps.cmp.ops.len()],
                regions: Vec::new(),
                in_region: Sides::default(),
                boundaries: Vec::new(),
            };
            let keys: Vec<GroupKey> = {
                let mut k: Vec<GroupKey> = bld.bv.groups.keys().cloned().collect();
                k.extend(bld.cv.groups.keys().cloned());
                k.sort();
                k.dedup();
                k
            };
            // Each group's op lists are taken once, not copied.
            let mut groups = Sides::new(
                std::mem::take(&mut bld.bv.groups),
                std::mem::take(&mut bld.cv.groups),
            );
            let mut take = |key: &GroupKey| {
                Sides::new(
                    groups.bench.remove(key).unwrap_or_default(),
                    groups.cmp.remove(key).unwrap_or_default(),
                )
            };
            // Forward and recompute groups first: backward regions mirror forward ones.
            let mut gaps: Vec<(GroupKey, Vec<u32>, Vec<u32>)> = Vec::new();
            for key in keys.iter().filter(|k| k.0 != Phase::Backward) {
                let Sides { bench: b, cmp: c } = take(key);
                if key.0 == Phase::Recompute && (b.is_empty() || c.is_empty()) {
                    bld.mark(Side::Bench, &widen(&b), Why::Recompute);
                    bld.mark(Side::Cmp, &widen(&c), Why::Recompute);
                    continue;
                }
                let g = align_group(&b, &c, &bld.bv, &bld.cv, &mut scratch);
                drop((b, c));
                for (x, y) in g.pairs {
                    bld.pair_ops(x as usize, y as usize);
                }
                gaps.extend(g.gaps.into_iter().map(|(x, y)| (key.clone(), x, y)));
            }
            bld.regions_of(&gaps);
            let mut bwd_gaps = Vec::new();
            let bkeys: Vec<&GroupKey> = keys.iter().filter(|k| k.0 == Phase::Backward).collect();
            let bwd: Vec<Sides<Vec<u32>>> = bkeys.iter().map(|k| take(k)).collect();
            // Calls whose forward twin is inside a region go to that region's backward;
            // the rest is aligned like forward calls.
            bld.mirror(&bwd);
            for (key, ops) in bkeys.into_iter().zip(bwd) {
                let left = |ops: Vec<u32>, why: &[Why]| -> Vec<u32> {
                    let keep = |o: &u32| why[*o as usize] != Why::Inside;
                    ops.into_iter().filter(keep).collect()
                };
                let rest = Sides::new(left(ops.bench, &bld.why.bench), left(ops.cmp, &bld.why.cmp));
                let g = align_group(&rest.bench, &rest.cmp, &bld.bv, &bld.cv, &mut scratch);
                for (x, y) in g.pairs {
                    bld.pair_ops(x as usize, y as usize);
                }
                bwd_gaps.extend(g.gaps.into_iter().map(|(x, y)| (key.clone(), x, y)));
            }
            bld.regions_of(&bwd_gaps);
            bld.pair_named(&self.mapping);
            bld.finish()
        };
        Alignment {
            dumps,
            matches,
            unmatched,
            regions,
        }
    }
}

/// The stretches to make regions of: each gap with calls left on both sides takes in the
/// gaps of the modules called inside its module, on each side between the paired calls
/// around it (`paired`: the paired ops of each side, sorted). The activation module an
/// MoE's experts call once per expert on one side and once on the other: its calls belong
/// to the experts' region, and alone they pair nothing. Outermost first; what a gap takes
/// in is not a stretch of its own. In the gaps' order, op lists widened and in execution
/// order.
fn nest<'g>(
    gaps: &'g [(GroupKey, Vec<u32>, Vec<u32>)],
    paired: &Sides<Vec<u32>>,
) -> Vec<(&'g GroupKey, Vec<usize>, Vec<usize>)> {
    // The open interval between the paired ops before and after a stretch.
    let span = |ops: &[u32], paired: &[u32]| {
        let (lo, hi) = (*ops.iter().min()?, *ops.iter().max()?);
        let before = paired.partition_point(|&p| p < lo).checked_sub(1);
        let after = paired.get(paired.partition_point(|&p| p <= hi)).copied();
        Some((before.map(|i| paired[i]), after))
    };
    let within = |ops: &[u32], s: Option<(Option<u32>, Option<u32>)>| match s {
        Some((lo, hi)) => ops
            .iter()
            .all(|&o| lo.is_none_or(|lo| lo < o) && hi.is_none_or(|hi| o < hi)),
        None => ops.is_empty(),
    };
    // By key: the modules called inside `m` are the keys from "m." up to "m/".
    let mut by_key: Vec<usize> = (0..gaps.len()).collect();
    by_key.sort_by(|&x, &y| gaps[x].0.cmp(&gaps[y].0));
    let mut outermost = by_key.clone();
    outermost.sort_by_key(|&i| gaps[i].0 .1.matches('.').count());
    let mut into: Vec<Option<usize>> = vec![None; gaps.len()];
    for &i in &outermost {
        let ((phase, module), b, c) = &gaps[i];
        if into[i].is_some() || b.is_empty() || c.is_empty() || module.is_empty() {
            continue;
        }
        let (sb, sc) = (span(b, &paired.bench), span(c, &paired.cmp));
        let (from, to) = (
            (*phase, format!("{module}.")),
            (*phase, format!("{module}/")),
        );
        let lo = by_key.partition_point(|&x| gaps[x].0 < from);
        let hi = by_key.partition_point(|&x| gaps[x].0 < to);
        for &j in &by_key[lo..hi] {
            if into[j].is_none() && within(&gaps[j].1, sb) && within(&gaps[j].2, sc) {
                into[j] = Some(i);
            }
        }
    }
    let mut out: Vec<(&GroupKey, Vec<usize>, Vec<usize>)> = Vec::new();
    let mut at: Vec<usize> = vec![usize::MAX; gaps.len()];
    for (i, (key, b, c)) in gaps.iter().enumerate() {
        if into[i].is_none() {
            at[i] = out.len();
            out.push((key, widen(b), widen(c)));
        }
    }
    let mut grown = vec![false; out.len()];
    for (j, parent) in into.iter().enumerate() {
        if let Some(p) = *parent {
            let k = at[p];
            out[k].1.extend(gaps[j].1.iter().map(|&o| o as usize));
            out[k].2.extend(gaps[j].2.iter().map(|&o| o as usize));
            grown[k] = true;
        }
    }
    for (k, (_, b, c)) in out.iter_mut().enumerate() {
        if grown[k] {
            b.sort_unstable();
            c.sort_unstable();
        }
    }
    out
}

/// Whether a stretch lies between two paired ops (one before it, one after it, on both
/// sides), from the op pairs sorted by comparison index.
struct Bounds {
    /// (cmp, bench) pairs sorted by cmp.
    pairs: Vec<(usize, usize)>,
    /// Smallest bench index among pairs[..=i].
    prefix_min: Vec<usize>,
    /// Largest bench index among pairs[i..].
    suffix_max: Vec<usize>,
}

impl Bounds {
    fn new(op_pair: &[Option<u32>]) -> Bounds {
        let pairs: Vec<(usize, usize)> = op_pair
            .iter()
            .enumerate()
            .filter_map(|(c, b)| Some((c, (*b)? as usize)))
            .collect();
        let mut prefix_min = Vec::with_capacity(pairs.len());
        let mut m = usize::MAX;
        for &(_, b) in &pairs {
            m = m.min(b);
            prefix_min.push(m);
        }
        let mut suffix_max = vec![0; pairs.len()];
        let mut x = 0;
        for (i, &(_, b)) in pairs.iter().enumerate().rev() {
            x = x.max(b);
            suffix_max[i] = x;
        }
        Bounds {
            pairs,
            prefix_min,
            suffix_max,
        }
    }

    fn encloses(&self, b: &[usize], c: &[usize]) -> bool {
        let (Some(bmin), Some(bmax)) = (b.iter().min(), b.iter().max()) else {
            return false;
        };
        let (Some(cmin), Some(cmax)) = (c.iter().min(), c.iter().max()) else {
            return false;
        };
        let lo = self.pairs.partition_point(|&(x, _)| x < *cmin);
        let hi = self.pairs.partition_point(|&(x, _)| x <= *cmax);
        let before = lo > 0 && self.prefix_min[lo - 1] < *bmin;
        let after = hi < self.pairs.len() && self.suffix_max[hi] > *bmax;
        before && after
    }
}

impl Builder<'_> {
    /// Makes regions of the stretches left on both sides, or marks them left over.
    fn regions_of(&mut self, gaps: &[(GroupKey, Vec<u32>, Vec<u32>)]) {
        let bounds = Bounds::new(&self.op_pair);
        let mut paired = Sides::new(Vec::new(), Vec::new());
        for (c, b) in self.op_pair.iter().enumerate() {
            if let Some(b) = *b {
                paired.bench.push(b);
                paired.cmp.push(c as u32);
            }
        }
        paired.bench.sort_unstable();
        for (key, b, c) in nest(gaps, &paired) {
            if b.is_empty() || c.is_empty() {
                continue;
            }
            let bounded = bounds.encloses(&b, &c);
            if !self.region(&key.1, &b, &c, bounded) && !self.inside_record(&key.1, &b, &c) {
                self.leftover(&b, &c);
            }
        }
    }

    /// Explicit tensor pairs of the mapping (msprobe's data mapping), among what is left.
    fn pair_named(&mut self, mapping: &Mapping) {
        if mapping.tensor_pairs.is_empty() {
            return;
        }
        let mut bench: HashMap<std::borrow::Cow<str>, TensorRef> = HashMap::new();
        for op in self.bv.ops().iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if !self.is_taken(Side::Bench, r) {
                    bench.insert(t.name(), r);
                }
            }
        }
        let wanted: HashMap<&str, &str> = mapping
            .tensor_pairs
            .iter()
            .map(|(c, b)| (c.as_str(), b.as_str()))
            .collect();
        let mut found = Vec::new();
        for op in self.cv.ops().iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if self.is_taken(Side::Cmp, r) {
                    continue;
                }
                if let Some(b) = wanted.get(t.name().as_ref()).and_then(|&n| bench.get(n)) {
                    found.push((*b, r));
                }
            }
        }
        for (b, c) in found {
            self.push(b, c, MatchedBy::Mapped, c.op(), 0);
        }
    }

    /// Left-over views and casts of APIs the other side never calls: not hooked there.
    fn unhooked(&mut self) {
        let n = self.apis.len();
        let called = |v: &SideView| -> Vec<bool> {
            let mut c = vec![false; n];
            for &a in &v.api {
                c[a as usize] = true;
            }
            c
        };
        let (ba, ca) = (called(&self.bv), called(&self.cv));
        for (side, own, other) in [(Side::Bench, &self.bv, &ca), (Side::Cmp, &self.cv, &ba)] {
            let why = match side {
                Side::Bench => &mut self.why.bench,
                Side::Cmp => &mut self.why.cmp,
            };
            for (op, w) in why.iter_mut().enumerate() {
                let api = own.api[op] as usize;
                if *w == Why::Unmatched
                    && !other[api]
                    && self.mapping.is_passthrough(self.apis[api])
                {
                    *w = Why::Unhooked;
                }
            }
        }
    }

    fn finish(mut self) -> (Vec<Region>, Vec<TensorMatch>, Vec<Unmatched>) {
        self.unhooked();
        let mut matches = self.matches;
        // Comparison execution order; a region's rows under its last call, inputs first.
        // The key is unique (a comparison tensor has one match): an unstable sort gives the
        // same order without a scratch copy.
        matches.sort_unstable_by_key(|(m, late)| (m.at, *late, m.refs.cmp));
        let matches: Vec<TensorMatch> = matches.into_iter().map(|(m, _)| m).collect();
        let mut only = Vec::new();
        for (side, v, taken, why) in [
            (Side::Cmp, &self.cv, &self.taken.cmp, &self.why.cmp),
            (Side::Bench, &self.bv, &self.taken.bench, &self.why.bench),
        ] {
            for op in v.ops().iter() {
                for t in op.tensors() {
                    if !taken[t.flat()] {
                        only.push(unmatched(side, t, why[op.index()]));
                    }
                }
            }
        }
        let mut regions = self.regions;
        regions.sort_by_key(|r| r.at.index);
        (regions, matches, only)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::AnyDType;
    use crate::dump::{Format, OpKey, OpRec, RankLoc, Stats, StatsFields, TensorRec};

    /// An op: key, module, (role, shape, id, src) per tensor.
    type T = (Role, &'static [usize], Option<u64>, Option<u64>);

    fn op(key: &str, module: &str, tensors: &[T]) -> OpRec {
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
                }
            })
            .collect();
        OpRec {
            module: (!module.is_empty()).then(|| module.into()),
            ..OpRec::new(0, key, tensors)
        }
    }

    /// A unary API call in `module`: input [n], output [n].
    fn unary(key: &str, module: &str, n: &'static [usize]) -> OpRec {
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

    fn align(b: Vec<OpRec>, c: Vec<OpRec>, dataflow: bool) -> Alignment {
        StructuralAligner::default().align(Sides::new(dump(b, dataflow), dump(c, dataflow)))
    }

    /// (bench tensor name, cmp tensor name, matched_by) of every pair.
    fn pairs(a: &Alignment) -> Vec<(String, String, &'static str)> {
        a.matches
            .iter()
            .map(|m| {
                let r = a.records(m);
                (
                    r.bench.name().to_string(),
                    r.cmp.name().to_string(),
                    m.by.name(),
                )
            })
            .collect()
    }

    const N: &[usize] = &[4];
    const M: &[usize] = &[8];

    #[test]
    fn tensors_of_a_paired_op_pair_by_slot_whatever_their_order_and_number() {
        // Small ops are searched by a scan, large ones (more than 16 tensors) through a map:
        // both pair input.i with input.i when the comparison side lists them in another order.
        for inputs in [3usize, 40] {
            let tensors: Vec<T> = (0..inputs)
                .map(|_| (Role::Input, N, None, None))
                .chain([(Role::Output, M, None, None)])
                .collect();
            let b = op("Torch.cat.0.forward", "m", &tensors);
            let mut c = op("Torch.cat.0.forward", "m", &tensors);
            c.tensors.reverse();
            let a = align(vec![b], vec![c], false);
            let p = pairs(&a);
            assert_eq!(p.len(), inputs + 1, "{inputs} inputs");
            assert!(p.iter().all(|(b, c, by)| b == c && *by == "exact"), "{p:?}");
            assert!(a.unmatched.is_empty());
        }
    }

    #[test]
    fn identical_runs_pair_everything_exactly() {
        let ops = || {
            vec![
                unary("Functional.relu.0.forward", "a", N),
                unary("Tensor.to.0.forward", "a", N),
                unary("Functional.relu.1.forward", "b", N),
            ]
        };
        let a = align(ops(), ops(), false);
        assert_eq!(a.matches.len(), 6);
        assert!(a.matches.iter().all(|m| m.by == MatchedBy::Exact));
        assert!(a.unmatched.is_empty());
    }

    #[test]
    fn an_inserted_call_shifts_nothing_else() {
        // The comparison run casts once more in module `a`: the later casts keep their
        // partners (other counters), the extra one is left over, module `b` is untouched.
        let b = vec![
            unary("Tensor.to.0.forward", "a", N),
            unary("Functional.relu.0.forward", "a", N),
            unary("Tensor.to.1.forward", "a", M),
            unary("Tensor.to.2.forward", "b", N),
        ];
        let c = vec![
            unary("Tensor.to.0.forward", "a", N),
            unary("Tensor.to.1.forward", "a", N),
            unary("Functional.relu.0.forward", "a", N),
            unary("Tensor.to.2.forward", "a", M),
            unary("Tensor.to.3.forward", "b", N),
        ];
        let a = align(b, c, false);
        let p = pairs(&a);
        assert!(p.contains(&(
            "Tensor.to.1.forward.output.0".into(),
            "Tensor.to.2.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Tensor.to.2.forward.output.0".into(),
            "Tensor.to.3.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Functional.relu.0.forward.input.0".into(),
            "Functional.relu.0.forward.input.0".into(),
            "exact"
        )));
        let left: Vec<&str> = a.unmatched.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.side == Side::Cmp && u.why == Why::Unmatched));
        // Which of the two identical leading casts is "extra" is a tie; one of them is.
        assert!(left
            .iter()
            .all(|n| n.starts_with("Tensor.to.0.") || n.starts_with("Tensor.to.1.")));
    }

    #[test]
    fn a_deleted_call_is_left_over_on_the_bench() {
        let b = vec![
            unary("Functional.gelu.0.forward", "m", N),
            unary("Tensor.float.0.forward", "m", N),
            unary("Functional.gelu.1.forward", "m", N),
        ];
        let c = vec![
            unary("Functional.gelu.0.forward", "m", N),
            unary("Functional.gelu.1.forward", "m", N),
        ];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 4);
        assert!(a.matches.iter().all(|m| m.by == MatchedBy::Exact));
        assert_eq!(a.unmatched.len(), 2);
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.side == Side::Bench && u.name.starts_with("Tensor.float.0.")));
    }

    #[test]
    fn an_extra_call_of_other_shapes_does_not_shift_the_later_calls_of_its_api() {
        // The optimizer's per-parameter updates (`add_` of each parameter's shape, two
        // parameters of shape [8] in a row), after one more `add_` of another shape on the
        // bench (a counter the model bumps, which a compiled comparison run does not show):
        // counted by API, `add_.2` of both sides would be a candidate (both [8], but the
        // second and the first [8] parameter). Each update pairs with its own.
        const S: &[usize] = &[];
        let updates = |first: usize| -> Vec<OpRec> {
            [N, M, M, N, M]
                .iter()
                .enumerate()
                .map(|(k, &shape)| unary(&format!("Tensor.add_.{}.forward", first + k), "", shape))
                .collect()
        };
        let mut b = vec![unary("Tensor.add_.0.forward", "", S)];
        b.extend(updates(1));
        let c = updates(0);
        let a = align(b, c, false);
        let p = pairs(&a);
        for k in 0..5 {
            assert!(
                p.contains(&(
                    format!("Tensor.add_.{}.forward.output.0", k + 1),
                    format!("Tensor.add_.{k}.forward.output.0"),
                    "aligned"
                )),
                "update {k}: {p:?}"
            );
        }
        assert_eq!(a.matches.len(), 10, "{p:?}");
        let left: Vec<&str> = a.unmatched.iter().map(|u| u.name.as_str()).collect();
        assert!(
            left.len() == 2 && left.iter().all(|n| n.starts_with("Tensor.add_.0.")),
            "{left:?}"
        );
    }

    #[test]
    fn renumbered_calls_in_repeated_layers_pair_by_layer() {
        // Four identical layers; the comparison run calls linear twice in layers.1 (an
        // extra projection), so every later layer's counters are one higher.
        let layer = |i: usize, extra: bool, base: usize| -> Vec<OpRec> {
            let m = format!("layers.{i}");
            let mut v = vec![unary(&format!("Functional.linear.{base}.forward"), &m, N)];
            if extra {
                v.push(unary(
                    &format!("Functional.linear.{}.forward", base + 1),
                    &m,
                    M,
                ));
            }
            v.push(unary(&format!("Functional.gelu.{i}.forward"), &m, N));
            v
        };
        let b: Vec<OpRec> = (0..4).flat_map(|i| layer(i, false, i)).collect();
        let c: Vec<OpRec> = (0..4)
            .flat_map(|i| layer(i, i == 1, if i <= 1 { i } else { i + 1 }))
            .collect();
        let a = align(b, c, false);
        let p = pairs(&a);
        assert!(p.contains(&(
            "Functional.linear.3.forward.output.0".into(),
            "Functional.linear.4.forward.output.0".into(),
            "aligned"
        )));
        assert!(p.contains(&(
            "Functional.linear.1.forward.output.0".into(),
            "Functional.linear.1.forward.output.0".into(),
            "exact"
        )));
        assert_eq!(a.unmatched.len(), 2, "{:?}", a.unmatched);
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.name.starts_with("Functional.linear.2.")));
        assert_eq!(a.matches.len(), 16);
    }

    #[test]
    fn same_api_with_other_shapes_is_a_shape_mismatch_not_a_pair() {
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.sum.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
        ];
        let c = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.sum.0.forward", "", M),
            unary("Functional.relu.1.forward", "", N),
        ];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 4);
        assert_eq!(a.unmatched.len(), 4);
        assert!(a.unmatched.iter().all(|u| u.why == Why::ShapeMismatch));
        assert!(a.regions.is_empty());
    }

    /// q, k, v from a split, then attention, then a projection; `fused` uses SDPA.
    fn attention(fused: bool) -> Vec<OpRec> {
        use Role::{Input as I, Output as O};
        const S: &[usize] = &[2, 4, 4];
        const T: &[usize] = &[2, 4, 4];
        let mut v = vec![op(
            "Tensor.unbind.0.forward",
            "attn",
            &[
                (I, &[3, 2, 4, 4], None, None),
                (O, S, Some(1), None),
                (O, S, Some(2), None),
                (O, S, Some(3), None),
            ],
        )];
        if fused {
            v.push(op(
                "Functional.scaled_dot_product_attention.0.forward",
                "attn",
                &[
                    (I, S, None, Some(1)),
                    (I, S, None, Some(2)),
                    (I, S, None, Some(3)),
                    (O, S, Some(9), None),
                ],
            ));
        } else {
            // k is transposed first: the composition reads q, k, v in another order.
            v.push(op(
                "Tensor.transpose.0.forward",
                "attn",
                &[(I, S, None, Some(2)), (O, T, Some(4), None)],
            ));
            v.push(op(
                "Torch.matmul.0.forward",
                "attn",
                &[
                    (I, S, None, Some(1)),
                    (I, T, None, Some(4)),
                    (O, &[2, 4, 4], Some(5), None),
                ],
            ));
            v.push(op(
                "Functional.softmax.0.forward",
                "attn",
                &[
                    (I, &[2, 4, 4], None, Some(5)),
                    (O, &[2, 4, 4], Some(6), None),
                ],
            ));
            v.push(op(
                "Torch.matmul.1.forward",
                "attn",
                &[
                    (I, &[2, 4, 4], None, Some(6)),
                    (I, S, None, Some(3)),
                    (O, S, Some(9), None),
                ],
            ));
        }
        v.push(op(
            "Functional.linear.0.forward",
            "attn",
            &[(I, S, None, Some(9)), (O, S, Some(10), None)],
        ));
        v
    }

    #[test]
    fn a_fused_kernel_is_compared_at_its_boundary_through_dataflow() {
        let a = align(attention(false), attention(true), true);
        assert_eq!(a.regions.len(), 1);
        let r = &a.regions[0];
        assert_eq!(
            (r.by, r.rule.as_deref()),
            (MatchedBy::Mapped, Some("attention"))
        );
        let p = pairs(&a);
        // q, k and v pair by the value they hold, not by position (k comes first on the
        // bench, through the transpose).
        for (b, c) in [
            (
                "Torch.matmul.0.forward.input.0",
                "Functional.scaled_dot_product_attention.0.forward.input.0",
            ),
            (
                "Tensor.transpose.0.forward.input.0",
                "Functional.scaled_dot_product_attention.0.forward.input.1",
            ),
            (
                "Torch.matmul.1.forward.input.1",
                "Functional.scaled_dot_product_attention.0.forward.input.2",
            ),
            (
                "Torch.matmul.1.forward.output.0",
                "Functional.scaled_dot_product_attention.0.forward.output.0",
            ),
        ] {
            assert!(
                p.contains(&(b.into(), c.into(), "mapped")),
                "{b} <-> {c} in {p:?}"
            );
        }
        // Rows of the region are reported under the fused call, inputs first.
        let sdpa = 1;
        let region_rows: Vec<&TensorMatch> = a
            .matches
            .iter()
            .filter(|m| m.by == MatchedBy::Mapped)
            .collect();
        assert!(region_rows.iter().all(|m| m.at == sdpa));
        assert!(a
            .unmatched
            .iter()
            .all(|u| u.why == Why::Inside && u.side == Side::Bench));
    }

    #[test]
    fn unknown_code_paths_between_agreed_points_fall_back_to_the_module() {
        let b = attention(false);
        let mut c = attention(true);
        // No rule knows this kernel.
        c[1].key = OpKey::parse("NPU.npu_my_attention.0.forward");
        for t in &mut c[1].tensors {
            t.name = t
                .name
                .replace(
                    "Functional.scaled_dot_product_attention",
                    "NPU.npu_my_attention",
                )
                .into();
        }
        let a = align(b, c, true);
        assert_eq!(a.regions.len(), 1);
        assert_eq!(a.regions[0].by, MatchedBy::Module);
        assert_eq!(a.regions[0].module, "attn");
        assert_eq!(
            a.matches
                .iter()
                .filter(|m| m.by == MatchedBy::Module)
                .count(),
            4
        );
    }

    #[test]
    fn nothing_in_common_is_not_guessed_at() {
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Functional.gelu.0.forward", "", N),
        ];
        let c = vec![
            unary("Other.relu.0.forward", "", N),
            unary("Other.gelu.0.forward", "", N),
        ];
        let a = align(b, c, false);
        assert!(a.matches.is_empty());
        assert_eq!(a.unmatched.len(), 8);
    }

    #[test]
    fn recomputation_on_one_side_is_reported_as_such() {
        let b = vec![unary("Functional.relu.0.forward", "blk", N)];
        let mut again = unary("Functional.relu.1.forward", "blk", N);
        again.recompute = true;
        let c = vec![unary("Functional.relu.0.forward", "blk", N), again];
        let a = align(b, c, false);
        assert_eq!(a.matches.len(), 2);
        assert_eq!(a.unmatched.len(), 2);
        assert!(a.unmatched.iter().all(|u| u.why == Why::Recompute));
    }

    #[test]
    fn views_the_other_dumper_never_records_are_unhooked_not_missing() {
        // msprobe does not hook Tensor.reshape; a reshape the other side does call but
        // not here is a plain left-over.
        let b = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Tensor.reshape.0.forward", "", N),
            unary("Tensor.transpose.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
        ];
        let c = vec![
            unary("Functional.relu.0.forward", "", N),
            unary("Functional.relu.1.forward", "", N),
            unary("Tensor.transpose.0.forward", "", M),
        ];
        let a = align(b, c, false);
        let why = |name: &str| a.unmatched.iter().find(|u| u.name == name).map(|u| u.why);
        assert_eq!(
            why("Tensor.reshape.0.forward.output.0"),
            Some(Why::Unhooked)
        );
        assert_eq!(
            why("Tensor.transpose.0.forward.output.0"),
            Some(Why::Unmatched)
        );
        assert!(!Why::Unhooked.missing());
    }

    #[test]
    fn a_module_called_inside_a_region_is_part_of_it_forward_and_backward() {
        // An MoE's experts: the bench indexes the 3-D weight once per expert and runs its
        // activation module once per expert; the comparison run runs one grouped matmul
        // and the activation once. The activation's calls belong to the experts' region
        // (nothing is left over), its backward is the region's too, and the weight, read
        // twice by the bench, has no single gradient there to compare.
        const X: &[usize] = &[3, 4];
        const Y: &[usize] = &[6, 4];
        const W: &[usize] = &[2, 4, 4];
        const E: &[usize] = &[4, 4];
        let (i, o, ex, act) = (Role::Input, Role::Output, "moe.experts", "moe.experts.act");
        let weight = |mut r: OpRec| {
            let fields = StatsFields {
                max: Some(1.0),
                min: Some(-1.0),
                mean: Some(0.5),
                norm: Some(3.0),
                nan: Some(0),
                inf: Some(0),
            };
            r.tensors[0].stats = Some(fields.into());
            r
        };
        let b = vec![
            op(
                "Functional.relu.0.forward",
                "moe",
                &[(i, X, None, None), (o, X, Some(1), None)],
            ),
            weight(op(
                "Tensor.__getitem__.0.forward",
                ex,
                &[(i, W, None, None), (o, E, Some(10), None)],
            )),
            op(
                "Functional.linear.0.forward",
                ex,
                &[
                    (i, X, None, Some(1)),
                    (i, E, None, Some(10)),
                    (o, X, Some(11), None),
                ],
            ),
            op(
                "Functional.silu.0.forward",
                act,
                &[(i, X, None, Some(11)), (o, X, Some(12), None)],
            ),
            weight(op(
                "Tensor.__getitem__.1.forward",
                ex,
                &[(i, W, None, None), (o, E, Some(13), None)],
            )),
            op(
                "Functional.linear.1.forward",
                ex,
                &[
                    (i, X, None, Some(1)),
                    (i, E, None, Some(13)),
                    (o, X, Some(14), None),
                ],
            ),
            op(
                "Functional.silu.1.forward",
                act,
                &[(i, X, None, Some(14)), (o, X, Some(15), None)],
            ),
            op(
                "Torch.cat.0.forward",
                ex,
                &[
                    (i, X, None, Some(12)),
                    (i, X, None, Some(15)),
                    (o, Y, Some(16), None),
                ],
            ),
            op(
                "Functional.relu.1.forward",
                "moe",
                &[(i, Y, None, Some(16)), (o, Y, Some(17), None)],
            ),
            unary("Functional.relu.1.backward", "moe", Y),
            op(
                "Torch.cat.0.backward",
                ex,
                &[(i, Y, None, None), (o, X, None, None), (o, X, None, None)],
            ),
            unary("Functional.silu.1.backward", act, X),
            op(
                "Functional.linear.1.backward",
                ex,
                &[(i, X, None, None), (o, X, None, None), (o, E, None, None)],
            ),
            op(
                "Tensor.__getitem__.1.backward",
                ex,
                &[(i, E, None, None), (o, W, None, None)],
            ),
            unary("Functional.silu.0.backward", act, X),
            op(
                "Functional.linear.0.backward",
                ex,
                &[(i, X, None, None), (o, X, None, None), (o, E, None, None)],
            ),
            op(
                "Tensor.__getitem__.0.backward",
                ex,
                &[(i, E, None, None), (o, W, None, None)],
            ),
            unary("Functional.relu.0.backward", "moe", X),
        ];
        let c = vec![
            op(
                "Functional.relu.0.forward",
                "moe",
                &[(i, X, None, None), (o, X, Some(1), None)],
            ),
            weight(op(
                "Tensor.transpose.0.forward",
                ex,
                &[(i, W, None, None), (o, W, Some(10), None)],
            )),
            op(
                "Tensor.repeat.0.forward",
                ex,
                &[(i, X, None, Some(1)), (o, Y, Some(11), None)],
            ),
            op(
                "Functional.grouped_mm.0.forward",
                ex,
                &[
                    (i, Y, None, Some(11)),
                    (i, W, None, Some(10)),
                    (o, Y, Some(12), None),
                ],
            ),
            op(
                "Functional.silu.0.forward",
                act,
                &[(i, Y, None, Some(12)), (o, Y, Some(13), None)],
            ),
            op(
                "Functional.relu.1.forward",
                "moe",
                &[(i, Y, None, Some(13)), (o, Y, Some(14), None)],
            ),
            unary("Functional.relu.1.backward", "moe", Y),
            unary("Functional.silu.0.backward", act, Y),
            op(
                "Functional.grouped_mm.0.backward",
                ex,
                &[(i, Y, None, None), (o, Y, None, None), (o, W, None, None)],
            ),
            op(
                "Tensor.repeat.0.backward",
                ex,
                &[(i, Y, None, None), (o, X, None, None)],
            ),
            op(
                "Tensor.transpose.0.backward",
                ex,
                &[(i, W, None, None), (o, W, None, None)],
            ),
            unary("Functional.relu.0.backward", "moe", X),
        ];
        let a = align(b, c, true);
        let left: Vec<&str> = a
            .unmatched
            .iter()
            .filter(|u| u.why != Why::Inside)
            .map(|u| u.name.as_str())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let p = pairs(&a);
        let has = |b: &str, c: &str| p.iter().any(|(x, y, _)| x == b && y == c);
        // Forward: what enters and what leaves the experts.
        assert!(
            has(
                "Functional.linear.0.forward.input.0",
                "Tensor.repeat.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Tensor.__getitem__.0.forward.input.0",
                "Tensor.transpose.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Torch.cat.0.forward.output.0",
                "Functional.silu.0.forward.output.0"
            ),
            "{p:?}"
        );
        // Backward: the gradient flowing in, across the activation module's backward.
        assert!(
            has(
                "Torch.cat.0.backward.input.0",
                "Functional.silu.0.backward.input.0"
            ),
            "{p:?}"
        );
        // Nothing stands for the weight's or the input's whole gradient on the bench.
        assert!(
            p.iter()
                .all(|(x, y, _)| !x.contains("__getitem__") || !y.contains("backward")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .all(|(_, y, _)| !y.starts_with("Tensor.repeat.0.backward")),
            "{p:?}"
        );
        assert_eq!(
            a.regions.len(),
            2,
            "{:?}",
            a.regions.iter().map(|r| &r.calls).collect::<Vec<_>>()
        );
        assert!(a.regions.iter().all(|r| r.module == ex));
    }

    #[test]
    fn a_region_pairs_weights_by_value_and_leaves_a_placed_index_to_its_producer() {
        // Two experts' weights of one shape: the bench reads expert a's first, the
        // comparison (stacking them) expert b's: they pair by their records, not by order.
        // The router's choices come from a paired op; the bench reads them in a call not
        // captured (its `idx == e` mask is a boolean input without a link), so the
        // comparison's read of them pairs with nothing, nor does its `arange` (integers)
        // with the bench's mask (booleans).
        const X: &[usize] = &[4, 2];
        const V: &[usize] = &[4];
        const W: &[usize] = &[2, 2];
        let (i, o, m) = (Role::Input, Role::Output, "moe");
        let stats = |v: f64| -> Stats {
            StatsFields {
                max: Some(v),
                min: Some(-v),
                mean: Some(v / 4.0),
                norm: Some(2.0 * v),
                nan: Some(0),
                inf: Some(0),
            }
            .into()
        };
        let with = |mut r: OpRec, slot: usize, st: Stats, dtype: &str| {
            r.tensors[slot].stats = Some(st);
            r.tensors[slot].dtype = AnyDType::parse(dtype);
            r
        };
        let int = |mut r: OpRec, slots: &[usize], dtype: &str| {
            for &s in slots {
                r.tensors[s].dtype = AnyDType::parse(dtype);
            }
            r
        };
        let head = || {
            vec![
                op(
                    "Functional.relu.0.forward",
                    m,
                    &[(i, X, None, None), (o, X, Some(1), None)],
                ),
                int(
                    op(
                        "Tensor.max.0.forward",
                        m,
                        &[
                            (i, X, None, Some(1)),
                            (o, V, Some(2), None),
                            (o, V, Some(3), None),
                        ],
                    ),
                    &[2],
                    "int64",
                ),
            ]
        };
        let mut b = head();
        b.extend([
            int(
                op(
                    "Tensor.nonzero.0.forward",
                    m,
                    &[(i, V, None, None), (o, V, Some(4), None)],
                ),
                &[0],
                "bool",
            ),
            with(
                op(
                    "Functional.linear.0.forward",
                    m,
                    &[
                        (i, X, None, Some(1)),
                        (i, W, None, None),
                        (o, X, Some(5), None),
                    ],
                ),
                1,
                stats(1.0),
                "float32",
            ),
            with(
                op(
                    "Functional.linear.1.forward",
                    m,
                    &[
                        (i, X, None, Some(1)),
                        (i, W, None, None),
                        (o, X, Some(6), None),
                    ],
                ),
                1,
                stats(2.0),
                "float32",
            ),
            // (its own integers of that shape, from outside: a position table)
            int(
                op(
                    "Tensor.__getitem__.0.forward",
                    m,
                    &[
                        (i, X, None, Some(5)),
                        (i, V, None, None),
                        (o, X, Some(9), None),
                    ],
                ),
                &[1],
                "int64",
            ),
            op(
                "Torch.where.0.forward",
                m,
                &[
                    (i, X, None, Some(9)),
                    (i, X, None, Some(6)),
                    (o, X, Some(7), None),
                ],
            ),
            op(
                "Functional.relu.1.forward",
                m,
                &[(i, X, None, Some(7)), (o, X, Some(8), None)],
            ),
        ]);
        let mut c = head();
        c.extend([
            with(
                op(
                    "Tensor.t.0.forward",
                    m,
                    &[(i, W, None, None), (o, W, Some(10), None)],
                ),
                0,
                stats(2.0),
                "float32",
            ),
            with(
                op(
                    "Tensor.t.1.forward",
                    m,
                    &[(i, W, None, None), (o, W, Some(11), None)],
                ),
                0,
                stats(1.0),
                "float32",
            ),
            op(
                "Torch.bmm.0.forward",
                m,
                &[
                    (i, X, None, Some(1)),
                    (i, W, None, Some(10)),
                    (i, W, None, Some(11)),
                    (o, X, Some(12), None),
                ],
            ),
            int(
                op(
                    "Tensor.__getitem__.0.forward",
                    m,
                    &[
                        (i, X, None, Some(12)),
                        (i, V, None, Some(3)),
                        (i, V, None, None),
                        (o, X, Some(13), None),
                    ],
                ),
                &[1, 2],
                "int64",
            ),
            op(
                "Functional.relu.1.forward",
                m,
                &[(i, X, None, Some(13)), (o, X, Some(14), None)],
            ),
        ]);
        let a = align(b, c, true);
        let p = pairs(&a);
        let has = |b: &str, c: &str| p.iter().any(|(x, y, _)| x == b && y == c);
        assert!(
            has(
                "Functional.linear.0.forward.input.1",
                "Tensor.t.1.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Functional.linear.1.forward.input.1",
                "Tensor.t.0.forward.input.0"
            ),
            "{p:?}"
        );
        assert!(
            has(
                "Torch.where.0.forward.output.0",
                "Tensor.__getitem__.0.forward.output.0"
            ),
            "{p:?}"
        );
        assert!(
            p.iter()
                .all(|(x, y, _)| y != "Tensor.__getitem__.0.forward.input.1"
                    && !x.starts_with("Tensor.nonzero.0.forward.input")),
            "{p:?}"
        );
    }

    #[test]
    fn module_records_called_another_number_of_times_inside_a_paired_record_are_inside_it() {
        // Module records only (level "module"): the bench's experts call their activation
        // module twice (once per expert, on its share of the rows), the comparison's once
        // on all of them. The experts' own records pair: the activation's calls are inside
        // them. If the experts' records do not pair, nothing vouches for them.
        const X: &[usize] = &[6, 4];
        let (i, o) = (Role::Input, Role::Output);
        let rec = |key: &str, m: &str, x: &'static [usize], y: &'static [usize]| {
            op(key, m, &[(i, x, None, None), (o, y, None, None)])
        };
        let side = |acts: &[&'static [usize]], out: &'static [usize]| -> Vec<OpRec> {
            let mut ops = vec![rec("Module.moe.gate.Linear.forward.0", "moe.gate", X, X)];
            for (n, &a) in acts.iter().enumerate() {
                let key = format!("Module.moe.experts.act.SiLU.forward.{n}");
                ops.push(rec(&key, "moe.experts.act", a, a));
            }
            ops.push(rec(
                "Module.moe.experts.Experts.forward.0",
                "moe.experts",
                X,
                out,
            ));
            ops.push(rec("Module.moe.MoE.forward.0", "moe", X, X));
            ops
        };
        let a = align(side(&[&[2, 4], &[4, 4]], X), side(&[X], X), true);
        let left: Vec<&str> = a
            .unmatched
            .iter()
            .filter(|u| u.why != Why::Inside)
            .map(|u| u.name.as_str())
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(a.regions.len(), 1);
        assert_eq!(a.regions[0].module, "moe.experts");
        assert_eq!(
            a.regions[0].at.key.as_str(),
            "Module.moe.experts.Experts.forward.0"
        );
        // Without the experts' records (none captured), nothing vouches for them.
        let bare = |ops: Vec<OpRec>| -> Vec<OpRec> {
            ops.into_iter()
                .filter(|o| {
                    !o.key.as_str().starts_with("Module.moe.experts.Experts")
                        && !o.key.as_str().starts_with("Module.moe.MoE")
                })
                .collect()
        };
        let a = align(
            bare(side(&[&[2, 4], &[4, 4]], X)),
            bare(side(&[X], X)),
            true,
        );
        assert!(a.regions.is_empty());
        assert!(
            a.unmatched
                .iter()
                .any(|u| u.name.contains(".act.SiLU.") && u.why != Why::Inside),
            "{:?}",
            a.unmatched
        );
    }

    #[test]
    fn lis_is_longest_and_increasing() {
        let seq = [3, 1, 4, 1, 5, 9, 2, 6];
        let idx = lis(&seq);
        let vals: Vec<u32> = idx.iter().map(|&i| seq[i as usize]).collect();
        assert_eq!(vals.len(), 4);
        assert!(vals.windows(2).all(|w| w[0] < w[1]));
    }
}
