//! Ops that look locally divergent and are no culprit, said as what they are: a decision
//! (indices, a mask: an MoE router's top-1) taken from floating-point inputs that agree
//! within tolerance, not exactly, that went the other way at a near tie; and a random op
//! whose inputs agree and whose outputs differ, a different draw. The local-divergence
//! rule ([`super::local`]) finds them on its way and passes over them.

use crate::compare::judge::Row;
use crate::op_key::Randomness;

/// Why a decision whose output `out` differs is a near tie decided otherwise.
pub(super) fn near_tie_explanation(out: &Row) -> String {
    format!(
        "its floating-point inputs agree within tolerance, not exactly, \
         and its output {} ({}) differs: a decision taken from values \
         at a boundary (a maximum among nearly equal scores, a top-k, a \
         threshold) went the other way: the inputs' rounding rather \
         than a faulty kernel; what follows takes other paths (an MoE \
         router's tokens go to other experts). Compare in a precision \
         where the two runs agree more closely, or fix the decision \
         (route the comparison run by the benchmark's choices) to \
         compare what comes after it",
        out.tensor.name, out.tensor.sides.cmp.dtype
    )
}

/// Why a random op whose inputs agree and whose outputs differ is no culprit; `on`: the
/// recorded arguments that show its draw on in both runs, when recorded.
pub(super) fn random_explanation(r: Randomness, consumed: &str, on: Option<&str>) -> String {
    let check = "check config-check's random category (seeds, generator states) and \
                 deterministic algorithms (torch.use_deterministic_algorithms), or compare \
                 with the random op off";
    match (r, on) {
        (Randomness::WhenDropoutActive, None) => format!(
            "what it consumed agrees on both sides ({consumed}), yet its outputs differ. It draws random \
             numbers when its dropout is active (dropout_p > 0, keep_prob < 1; the dump does \
             not record which): then this is a different random draw, not a faulty kernel — \
             {check}; with dropout off, the error is local to this op"
        ),
        (_, Some(on)) => format!(
            "what it consumed agrees on both sides ({consumed}), yet its outputs differ: it draws random \
             numbers ({on}), so this is a different random draw (another seed or generator \
             state), not a faulty kernel — {check}"
        ),
        _ => format!(
            "what it consumed agrees on both sides ({consumed}), yet its outputs differ: it draws random \
             numbers, so this is a different random draw (another seed or generator state), \
             not a faulty kernel — {check}"
        ),
    }
}
