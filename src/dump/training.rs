//! What a run's op records say about its training step, read the same way by compare and by
//! the one-sided scan: which records hold gradients, and whether the run's loss scaler
//! skipped the step.

use super::{Direction, Op, OpKind, Ops};

/// Whether an op's tensors are gradients: backward records, parameter gradients and DDP's
/// gradient all-reduce.
pub fn holds_gradients(op: Op) -> bool {
    op.direction() == Direction::Backward
        || op.kind() == OpKind::ParametersGrad
        || op.key().base_text() == "Distributed.ddp_bucket_allreduce"
}

/// Whether the loss scaler skipped this step: its `found_inf` is set where it is read after
/// the gradients were checked (`_amp_update_scale_`'s third argument), or where msprobe
/// records it after the check (`_amp_foreach_non_finite_check_and_unscale_`'s second).
/// probe's agent records inputs before the call, so only the former tells there.
pub fn scaler_skipped(ops: &Ops) -> bool {
    ops.iter().any(|op| {
        let key = op.key();
        let base = key.base_text();
        let slot = if base.ends_with("._amp_update_scale_") {
            "input.2"
        } else if base.ends_with("._amp_foreach_non_finite_check_and_unscale_") {
            "input.1"
        } else {
            return false;
        };
        op.tensors().any(|t| {
            let name = t.name();
            (name.ends_with(slot) || name.ends_with("found_inf"))
                && t.dtype().known().is_some_and(crate::dtype::DType::is_float)
                && t.stats().and_then(|s| s.max()).is_some_and(|m| m > 0.0)
        })
    })
}
