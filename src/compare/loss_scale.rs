//! Loss scaling: one run's gradients a power of two times the other's.
//!
//! Why: mixed precision in float16 multiplies the loss by a scale before the backward
//! (AMP's `GradScaler`, a static `loss_scale` in Megatron-LM or DeepSpeed) so that small
//! gradients do not underflow, and unscales the gradients before the optimizer step. A
//! port to an NPU without bfloat16 does exactly that while the GPU run does not; every
//! gradient then differs by the scale, and the first backward op was named as where the
//! divergence "enters from outside". The scale is found from the first gradient the two runs
//! share (the loss's own, as a rule): when the comparison side's is a power of two times
//! the benchmark's (within 5 %, which the forward's rounding leaves room for), every
//! gradient of the comparison side is compared divided by it: its statistics are divided
//! (exact, a power of two), its data and checksum set aside (they hold scaled values), so
//! those pairs compare by statistics. What the optimizer reads after unscaling, and the
//! forward (recomputed forwards included), is compared as recorded.
//!
//! A run that scales while the other does not also records the scaler's own arithmetic:
//! the loss times the scale (and its backward), the scale's reciprocal in float64, its casts
//! and moves. Those calls have no counterpart by nature, and a step of a small model has
//! few tensors, so as plain unmatched tensors they made the pair "not compared in full".
//! They are recognised by what they compute on, not by name (the scaler's code is the
//! user's, and a port may write its own): an op wholly one-sided whose tensors are all
//! single elements, one of them holding the scale or its reciprocal exactly. They are listed
//! as `loss_scaler`: accounted for, not missing.

use super::align::{Alignment, Side, Why};
pub use crate::dump::training::{holds_gradients, scaler_skipped};
use crate::dump::{Direction, OpKind, Ops, Role, TensorIn};
pub use crate::schema::compare::LossScale;
use std::collections::{BTreeMap, HashSet};

/// The largest relative departure from a power of two that still reads as a loss scale.
const NEAR: f64 = 0.05;

/// The index of a side's last record of gradients (a backward call, DDP's gradient
/// all-reduce): the forward calls after it are the optimizer's update. Parameter gradients
/// are recorded when capture stops, after everything: not a mark.
pub(crate) fn last_gradients(ops: &Ops) -> Option<usize> {
    ops.iter()
        .rposition(|op| holds_gradients(op) && op.kind() != OpKind::ParametersGrad)
}

/// The forward calls of a side computed from leftover bytes: calls that read memory
/// nothing had written (`unwritten`, and not merely a target they overwrite) or a value
/// computed from such (dataflow `src` links), as PyTorch's pipeline stages infer their
/// shapes on `torch.empty` inputs. The gradients of their backward calls come from those
/// bytes, which differ from run to run: they tell no loss scale. (One such gradient pair
/// whose norms happened to be a power of two apart read as a scale of 2^15, and every
/// gradient of the step was divided by it.)
fn from_leftovers(ops: &Ops) -> HashSet<String> {
    let mut ids: HashSet<u64> = HashSet::new();
    let mut calls = HashSet::new();
    for op in ops.iter().filter(|op| op.direction() == Direction::Forward) {
        let fed = op.tensors().any(|t| {
            t.role() != Role::Output
                && ((t.unwritten() && !t.overwritten())
                    || t.src().is_some_and(|s| ids.contains(&s)))
        });
        if fed {
            ids.extend(op.tensors().filter_map(|t| t.id()));
            calls.insert(op.key().text().to_string());
        }
    }
    calls
}

/// The loss scale between the two sides of an aligned unit, if its first shared gradient
/// says there is one (see the module docs). Gradients computed from leftover bytes are
/// passed over ([`from_leftovers`]).
pub(crate) fn detect(al: &Alignment) -> Option<LossScale> {
    let (bench, cmp) = (&al.dumps.bench.ops, &al.dumps.cmp.ops);
    let leftovers = from_leftovers(cmp);
    let seed = al.matches.iter().find(|m| {
        let op = cmp.get(m.refs.cmp.op());
        op.direction() == Direction::Backward
            && op.tensor(m.refs.cmp.tensor()).role() == Role::Input
            && !op
                .key()
                .forward_twin()
                .is_some_and(|k| leftovers.contains(&k))
    })?;
    let b = bench
        .get(seed.refs.bench.op())
        .tensor(seed.refs.bench.tensor())
        .stats()?;
    let c_op = cmp.get(seed.refs.cmp.op());
    let c = c_op.tensor(seed.refs.cmp.tensor()).stats()?;
    let ratio = c.norm()? / b.norm()?;
    if !ratio.is_finite() || ratio <= 0.0 {
        return None;
    }
    let k = ratio.log2().round();
    if k == 0.0 || k.abs() > 120.0 {
        return None;
    }
    let scale = k.exp2();
    // The largest magnitude says the same (a norm alone could be a coincidence).
    let amax = |s: &crate::dump::Stats| Some(s.max()?.abs().max(s.min()?.abs()));
    let near = |r: f64| (r / scale - 1.0).abs() <= NEAR;
    let agree = match (amax(&b), amax(&c)) {
        (Some(x), Some(y)) if x > 0.0 => near(y / x),
        _ => true,
    };
    (near(ratio) && agree).then(|| LossScale {
        ratio: scale,
        at: c_op.key().text().to_string(),
    })
}

/// The unit with the one-sided loss scaler's arithmetic marked `loss_scaler` (module docs):
/// run on the alignment as read, before [`unscaled`] divides the gradients' statistics.
pub(crate) fn scaler_arithmetic(al: Alignment, s: &LossScale) -> Alignment {
    let mut al = al;
    // (on the comparison side, op index) -> its one-sided tensors
    let mut one_sided: BTreeMap<(bool, usize), Vec<usize>> = BTreeMap::new();
    for (i, u) in al.unmatched.iter().enumerate() {
        if u.why.missing() {
            one_sided
                .entry((u.side == Side::Cmp, u.op.index))
                .or_default()
                .push(i);
        }
    }
    let exact = [s.ratio, 1.0 / s.ratio];
    for ((cmp, index), tensors) in one_sided {
        let ops = if cmp {
            &al.dumps.cmp.ops
        } else {
            &al.dumps.bench.ops
        };
        let op = ops.get(index);
        let scalars = op.tensors().all(|t| t.numel() <= 1);
        let holds_scale = op.tensors().any(|t| {
            t.stats().is_some_and(|x| match (x.max(), x.min()) {
                (Some(hi), Some(lo)) => hi == lo && exact.contains(&hi),
                _ => false,
            })
        });
        if tensors.len() == op.tensor_count() && scalars && holds_scale {
            for i in tensors {
                al.unmatched[i].why = Why::LossScaler;
            }
        }
    }
    al
}

/// The unit with the update a loss scaler skipped marked (`Why::SkippedUpdate`): when only
/// `skipped`'s scaler skipped this step, the other run's forward calls after its last
/// backward or gradient all-reduce (the optimizer's update, which the skipping run never
/// made) that found no counterpart are the skip's, not missing.
pub(crate) fn skipped_update(al: Alignment, skipped: Side) -> Alignment {
    let mut al = al;
    let ops = match skipped {
        Side::Bench => &al.dumps.cmp.ops,
        Side::Cmp => &al.dumps.bench.ops,
    };
    let Some(last_grad) = last_gradients(ops) else {
        return al;
    };
    for u in &mut al.unmatched {
        if u.side != skipped
            && u.why.missing()
            && u.op.index > last_grad
            && u.op.direction == Direction::Forward
        {
            u.why = Why::SkippedUpdate;
        }
    }
    al
}

/// The unit with the comparison side's gradients divided by the scale (module docs).
pub(crate) fn unscaled(al: Alignment, s: &LossScale) -> Alignment {
    let mut al = al;
    let ops = std::mem::take(&mut al.dumps.cmp.ops);
    al.dumps.cmp.ops = ops.with_tensors(|op, t| {
        if !holds_gradients(op) {
            return t;
        }
        TensorIn {
            stats: t.stats.map(|x| x.divided(s.ratio)),
            checksum: None,
            data: None,
            ..t
        }
    });
    al
}
