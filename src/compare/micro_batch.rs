//! Micro-batching: one run takes its step's batch in more forward passes than the other.
//!
//! Why: a port short of device memory splits each step's batch into micro-batches and
//! accumulates their gradients (gradient accumulation, a pipeline schedule's micro-batch
//! count), while the GPU run takes it whole. Both make the same update, but op by op they
//! are different programs: the one-pass run's calls pair with the first micro-batch's, on
//! other shapes, and the rest is one-sided. The localiser then named "a tensor that differs
//! before any captured op fails" (the accumulated loss) and half the calls as unmatched,
//! which reads like a bug in the port. The pair is recognised by the first API whose first
//! call reads inputs of another size on the two sides: when one run calls it k times
//! (k >= 2) as often as the other, each time on an input k times smaller, the runs differ
//! in micro-batching, which is said per pair and in the headline; the comparison holds
//! only for what pairs.

use super::Sides;
use crate::dump::{Direction, OpKind, Ops, RankDump};
pub use crate::schema::compare::{InputSizes, MicroBatches};
use std::collections::HashMap;

/// A step's forward API calls (not recomputed) among its first `end` ops, in order: their
/// API and their first input's element count.
fn forward_calls(ops: &Ops, end: usize) -> impl Iterator<Item = (&str, usize)> {
    ops.iter()
        .take(end)
        .filter(|op| {
            op.kind() == OpKind::Api && op.direction() == Direction::Forward && !op.recompute()
        })
        .filter_map(|op| Some((op.key().base_text(), op.tensors().next()?.numel())))
}

/// The input sizes of each API's calls among the first `end` ops, in call order (the
/// first call's first).
fn sizes(ops: &Ops, end: usize) -> HashMap<&str, Vec<usize>> {
    let mut m: HashMap<&str, Vec<usize>> = HashMap::new();
    for (api, n) in forward_calls(ops, end) {
        m.entry(api).or_default().push(n);
    }
    m
}

/// Whether an API reads data of another size on the two sides: neither side's sizes, call
/// by call, are the other's with calls left out. (A call one side adds on a mask before the
/// calls both make is not another size of data; sizes matched across other positions are
/// no evidence of the same data either: a micro-batch's hidden layer may read as many
/// elements as the whole batch's input layer.)
fn other_size(bench: &[usize], cmp: &[usize]) -> bool {
    !(within(bench, cmp) || within(cmp, bench))
}

/// Whether `part` is `whole` with some elements left out (in order).
fn within(part: &[usize], whole: &[usize]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|p| rest.any(|w| w == p))
}

/// How the two runs take their step's data, where it differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batching {
    /// One run takes it in more forward passes (module docs).
    Micro(MicroBatches),
    /// The runs read data of other sizes.
    Sizes(InputSizes),
}

/// How the pair's runs differ in the data they take, if they do. The API it is told by is
/// the first, in the benchmark's order, whose first call reads inputs of another size on
/// the two sides (calls before it, such as splitting the batch, read the same): the runs
/// differ in micro-batching when one calls it k times as often on inputs k times smaller
/// (module docs), else in their data's size.
pub(crate) fn detect(dumps: &Sides<RankDump>) -> Option<Batching> {
    if !whole_pass_differs(dumps) {
        return None;
    }
    let (bench, cmp) = (&dumps.bench.ops, &dumps.cmp.ops);
    let (of_bench, of_cmp) = (sizes(bench, bench.len()), sizes(cmp, cmp.len()));
    // The first API, in the benchmark's order, whose first calls read other sizes.
    let mut seen = std::collections::HashSet::new();
    let (api, nb, nc) = forward_calls(bench, bench.len()).find_map(|(api, _)| {
        if !seen.insert(api) {
            return None;
        }
        let (b, c) = (of_bench.get(api)?, of_cmp.get(api)?);
        other_size(b, c).then(|| (api, b[0], c[0]))
    })?;
    Some(match micro_batches(dumps, api, nb, nc) {
        Some(m) => Batching::Micro(m),
        None => Batching::Sizes(InputSizes {
            bench: nb,
            cmp: nc,
            at: api.to_string(),
        }),
    })
}

/// The pair's micro-batching, told by `api`, whose first call reads `nb` elements in the
/// benchmark and `nc` in the comparison run.
fn micro_batches(dumps: &Sides<RankDump>, api: &str, nb: usize, nc: usize) -> Option<MicroBatches> {
    let count = |ops: &Ops, n: usize| {
        forward_calls(ops, ops.len())
            .filter(|&c| c == (api, n))
            .count()
    };
    let (b, c) = (count(&dumps.bench.ops, nb), count(&dumps.cmp.ops, nc));
    if b == 0 || c == 0 || b == c {
        return None;
    }
    // k times the calls on inputs k times smaller, exactly.
    let cmp_more = c > b;
    let ((more, fewer), (small, large)) = if cmp_more {
        ((c, b), (nc, nb))
    } else {
        ((b, c), (nb, nc))
    };
    let k = more / fewer;
    if more % fewer != 0 || k < 2 || small.checked_mul(k) != Some(large) {
        return None;
    }
    let (bench, cmp) = if cmp_more { (1, k) } else { (k, 1) };
    Some(MicroBatches {
        bench,
        cmp,
        at: api.to_string(),
    })
}

/// Whether, in the first forward pass (the ops before the first backward record), at least
/// half the APIs both sides call read inputs of other sizes on the two sides at their first
/// call. A micro-batch is the whole forward again; where most APIs read the same sizes, one
/// module loops where the other runs once (an MoE's experts, each on its share of the
/// tokens: four experts on 16 tokens each against one grouped call on 64 looked like four
/// micro-batches).
fn whole_pass_differs(dumps: &Sides<RankDump>) -> bool {
    fn first_pass(ops: &Ops) -> HashMap<&str, Vec<usize>> {
        let end = ops
            .iter()
            .position(|op| op.direction() == Direction::Backward)
            .unwrap_or(ops.len());
        sizes(ops, end)
    }
    let c = first_pass(&dumps.cmp.ops);
    let (mut both, mut differ) = (0, 0);
    for (api, nb) in first_pass(&dumps.bench.ops) {
        if let Some(nc) = c.get(api) {
            both += 1;
            differ += usize::from(other_size(&nb, nc));
        }
    }
    both > 0 && 2 * differ >= both
}
