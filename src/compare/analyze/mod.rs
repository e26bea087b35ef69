//! Analyze: name the first divergent operator of a unit (see docs/compare.md, "How the
//! culprit is found").
//!
//! The first row that fails is usually downstream of the real cause. An op is *locally
//! divergent* when its outputs break tolerance while everything it consumed agrees:
//! - all of its inputs (tensors it consumed, weights included) are within tolerance, and
//! - an output is an error, or its inputs are equal (bitwise, or every statistic in
//!   statistics mode: [`crate::compare::judge::Equality`]) and an output is past the warning
//!   threshold (with equal inputs even a small difference is far beyond rounding), and
//! - its output error is more than `local_gain` times its largest input error (otherwise it
//!   only carries or mildly amplifies inherited error).
//!
//! A backward op also consumes what its forward call saved: the inputs and outputs of the
//! matching forward op count as its inputs.
//!
//! The first divergent op is the earliest locally divergent op, per phase, that is
//! followed by an error. Phases: forward; backward, which also holds the forward-direction
//! ops that run after the first backward op (the optimizer update consumes gradients).
//! Failing inputs of the earliest failing op mean the divergence enters from outside the
//! captured ops (weights, data, random draws): reported as such. The first NaN/Inf producer
//! is the earliest op with finite inputs and new non-finite outputs.

//!
//! The localiser is an ordered list of rules ([`RULES`]) over one shared [`context::Context`]
//! (the unit's ops, their phases, the findings so far); each rule family is a file:
//! - [`entry`]: the earliest failing op of a phase, and the divergence entering through its
//!   inputs (from outside, from an op only one run calls, with the previous step's value);
//! - [`local`]: the first locally divergent op of a phase, and accumulated drift where
//!   there is none; what it passes over on the way is said by [`decisions`] (a near tie, a
//!   random draw) and [`arguments`] (an op called differently);
//! - [`nonfinite`]: the first NaN/Inf producer;
//! - [`warnings`]: where no tensor fails, where the warnings begin;
//! - [`layout`]: last, the layout differences at each named op, added to its finding.
//!
//! A new diagnosis is a `FindingKind` variant (`crate::vocab`), a rule in a file here,
//! its place in [`RULES`], and its tests.

mod arguments;
mod context;
mod decisions;
mod entry;
mod identity;
mod layout;
mod local;
mod nonfinite;
pub(crate) mod rows;
mod warnings;

use super::op_rows::OpRows;
use super::{Carry, Tolerances};
use crate::schema::summary::Findings;
use context::{Context, Place};
use std::collections::BTreeMap;

/// One rule of the localiser: reads the unit through the context, adds what it finds.
type Rule = fn(&mut Context);

/// The rules, in the order they run: a later rule may read what an earlier one found (drift
/// is said where neither an entry nor a local divergence, a near tie or a random draw was).
const RULES: [Rule; 7] = [
    entry::rule,
    local::rule,
    local::drift,
    nonfinite::rule,
    arguments::rule,
    warnings::rule,
    layout::rule,
];

/// Localises one unit. Its ops must be in execution order (as the judge hands them on).
pub(crate) fn localize(
    unit: &dyn OpRows,
    stacks: &BTreeMap<u64, Vec<String>>,
    step: &str,
    rank: &str,
    tols: &Tolerances,
    carried: &Carry,
) -> Findings {
    let mut cx = Context::new(unit, Place { step, rank, stacks }, tols, carried);
    for rule in RULES {
        rule(&mut cx);
    }
    cx.findings()
}
