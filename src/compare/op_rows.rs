//! A unit's judged rows op by op, as the localiser reads them ([`OpRows`]): the judge's
//! [`super::judged::Judged`] offers this view (`by_op`), the localiser (`super::analyze`)
//! consumes it, and the tests build small ones by hand. Apart from both so that neither
//! depends on the other.

use super::align::Side;
use super::judge::Row;
use crate::dump::args::ArgDiff;
use crate::op_key::{Direction, KeyRef};
use std::borrow::Cow;

/// What the localiser knows of an op before it reads its rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Head {
    /// The op's sequence number.
    pub seq: u64,
    /// Forward or backward.
    pub direction: Direction,
    /// Some tensor of it is out of tolerance.
    pub fails: bool,
    /// Some tensor of it is not within tolerance (a warning or an error).
    pub flagged: bool,
    /// Some tensor of it holds NaN/Inf on the comparison side.
    pub nonfinite: bool,
}

/// What both runs recorded of a random op's draw ([`OpRows::draw`]): on or off, with the
/// recorded arguments that say so (`input.dropout_p = 0.0 on both sides`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Draw {
    /// Both runs called it with its draw on (`dropout_p = 0.1`).
    On(String),
    /// Both runs called it with its draw off (`dropout_p = 0.0`, `training = False`): it
    /// computes deterministically.
    Off(String),
}

/// A unit's rows op by op (an op's rows are consecutive), as the localiser reads them: the
/// heads of all, the rows of those it looks into. Rows may be made when read, so the
/// localiser reads only the ops that can matter (flagged or holding NaN/Inf, and the
/// forward calls of those it examines).
pub(crate) trait OpRows {
    /// How many ops.
    fn ops(&self) -> usize;
    /// Op `k`'s key.
    fn key(&self, k: usize) -> KeyRef<'_>;
    /// Op `k`'s head.
    fn head(&self, k: usize) -> Head;
    /// Op `k`'s rows, in slot order.
    fn rows(&self, k: usize) -> Cow<'_, [Row]>;
    /// The non-tensor arguments op `k` was called with differently on the two sides (one
    /// call of the same API on each; none otherwise); with `divergent`, also those one side
    /// left out (`args::diff_at_divergence`).
    fn arg_diffs(&self, _k: usize, _divergent: bool) -> Vec<ArgDiff> {
        Vec::new()
    }
    /// For a random op (`op_key::Randomness`), whether both sides recorded its random draw
    /// on or off (`args::draw_switch`): one call of the same API on each side, the same
    /// answer on both. None when either side recorded no switch, or they disagree.
    fn draw(&self, _k: usize) -> Option<Draw> {
        None
    }
    /// How op `k`'s paired tensors lay in memory differently on the two sides, one
    /// sentence each (`super::layout::differences`); none where the dumps do not say.
    fn layout_diffs(&self, _k: usize) -> Vec<String> {
        Vec::new()
    }
    /// The op only one side calls whose output is input `name` (the comparison side's
    /// name) of op `k` on that side; None when the producers on both sides have
    /// counterparts, or none was captured.
    fn one_sided_source(&self, _k: usize, _name: &str) -> Option<OneSidedOp> {
        None
    }
}

/// An op only one side calls, the source of an input that differs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OneSidedOp {
    /// The side that calls it.
    pub side: Side,
    /// Its key.
    pub op: String,
    /// Its stack id (comparison side only).
    pub stack: Option<u64>,
    /// What it was computed from on that side, as far as other ops of that side without a
    /// counterpart go: their API names' last parts (`vector_norm`, `clamp`), nearest first,
    /// at most [`UPSTREAM`] of them.
    pub upstream: Vec<String>,
}

/// The most upstream ops [`OneSidedOp`] names (a one-sided stretch longer than this is
/// told by its nearest ops: what a stretch computes shows near its end).
pub(crate) const UPSTREAM: usize = 64;
