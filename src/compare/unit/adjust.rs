//! The pass after alignment: what the runs' loss scaling does to the pairs. Where one run's
//! scaler skipped the step, the other's update has no counterpart (it is the scaler's, not
//! missing); where the comparison run's gradients are a power of two times the
//! benchmark's, a loss scale, they are compared divided by it and the scaler's own
//! arithmetic is set aside.

use crate::compare::align::{Alignment, Side};
use crate::compare::loss_scale::{self, LossScale};
use crate::vocab::Sides;

/// An alignment adjusted for loss scaling, with the loss scale found, if any.
pub(super) struct Adjusted {
    /// The pairs to judge.
    pub alignment: Alignment,
    /// The comparison run's gradients over the benchmark's, when a power of two.
    pub scale: Option<LossScale>,
}

/// Adjusts `alignment` for the step each run's scaler skipped (`skipped`) and a loss scale.
pub(super) fn adjust(alignment: Alignment, skipped: Sides<bool>) -> Adjusted {
    // One run's scaler skipped the step: the other's update has no counterpart.
    let alignment = match (skipped.bench, skipped.cmp) {
        (true, false) => loss_scale::skipped_update(alignment, Side::Bench),
        (false, true) => loss_scale::skipped_update(alignment, Side::Cmp),
        _ => alignment,
    };
    // One run's gradients a power of two times the other's: compared divided by it.
    let scale = loss_scale::detect(&alignment);
    let alignment = match &scale {
        Some(s) => loss_scale::unscaled(loss_scale::scaler_arithmetic(alignment, s), s),
        None => alignment,
    };
    Adjusted { alignment, scale }
}
