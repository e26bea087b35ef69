//! The first locally divergent op of each phase: the earliest op, up to the phase's last
//! error, whose outputs break tolerance while everything it consumed agrees (its inputs,
//! and for a backward op what its forward call saved), by more than the local gain over
//! its inputs' error once a sum's cancellation is allowed for. On the way it passes over
//! ops that are no culprit although they look local: a decision that went the other way
//! at a near tie, a different random draw ([`super::decisions`]); and it names an op called
//! with different arguments as such ([`super::arguments`]). A phase with errors and none of
//! these drifts: no single op is locally divergent.

use super::context::Context;
use super::rows::{
    cancellation, discrete, fails, finding, floating, is_input, is_output, leftover,
    rounding_noise, unwritten_sides, worst, Consumed,
};
use super::{arguments, decisions};
use crate::compare::judge::{Equality, Row, Verdict};
use crate::compare::op_rows::Draw;
use crate::dump::Direction;
use crate::op_key::{OpKind, Randomness};
use crate::vocab::FindingKind;

/// Per phase with an error: its first locally divergent op, if any.
pub(super) fn rule(cx: &mut Context) {
    for dir in [Direction::Forward, Direction::Backward] {
        let ops = cx.phase_ops(dir);
        let Some(last_error) = ops.iter().rposition(|&k| cx.briefs[k as usize].fails) else {
            continue;
        };
        for &k in &ops[..=last_error] {
            // Every tensor within tolerance: its worst output is no divergence.
            let k = k as usize;
            if cx.briefs[k].flagged && !calls_captured(cx, k) && examine(cx, dir, k) {
                break;
            }
        }
    }
}

/// Whether op `k` is a module's record whose calls inside are captured too (the unit holds
/// API calls: `level="mix"`). Such a record is never a culprit: it holds what the module was
/// called with, not its submodules' parameters nor the values inside it, so inputs that
/// agree do not show that the module's own computation is at fault (a submodule's weight
/// may differ); one of the calls inside is where the divergence starts, or enters.
fn calls_captured(cx: &Context, k: usize) -> bool {
    cx.apis && cx.unit.key(k).kind() == OpKind::Module
}

/// Per phase with an error: drift, where no rule named an op that explains it (a local
/// divergence, an entry, a random draw, a near tie) and the phase does not inherit a
/// diverged forward.
pub(super) fn drift(cx: &mut Context) {
    for dir in [Direction::Forward, Direction::Backward] {
        let fails = cx.briefs.iter().any(|h| h.fails && cx.phase(h) == dir);
        let explained = [
            FindingKind::FirstDivergent,
            FindingKind::ExternalSource,
            FindingKind::RandomDraw,
            FindingKind::NearTie,
        ]
        .iter()
        .any(|&k| cx.has(k, Some(dir)));
        if fails && !explained && !cx.inherited(dir) {
            cx.drifts(dir);
        }
    }
}

/// Examines flagged op `k` of phase `dir`; true when it is named the first divergent op
/// (the phase's search ends there).
fn examine(cx: &mut Context, dir: Direction, k: usize) -> bool {
    let unit = cx.unit;
    let rows = unit.rows(k);
    let g: Vec<&Row> = rows.iter().collect();
    let inputs: Vec<&&Row> = g.iter().filter(|r| is_input(r)).collect();
    // Outputs that are rounding noise of the inputs cannot show a local error (judged
    // against a reference's envelope, the reference says what the noise is: a softmax's
    // masked inputs at the float's lowest value make any output difference "rounding" of
    // them).
    let outputs: Vec<&&Row> = g
        .iter()
        .filter(|r| {
            is_output(r) && (r.judgement.reference.is_some() || !rounding_noise(r, &inputs))
        })
        .collect();
    if outputs.is_empty() || inputs.iter().any(|r| fails(r)) {
        return false;
    }
    // A backward op also consumes what its forward call saved.
    let twin = g[0]
        .tensor
        .op
        .key
        .forward_twin()
        .and_then(|k| cx.by_key.get(k.as_str()))
        .map(|&t| unit.rows(t));
    let saved: Vec<&Row> = twin.iter().flat_map(|t| t.iter()).collect();
    if saved.iter().any(|r| fails(r)) {
        return false;
    }
    let equal = inputs
        .iter()
        .copied()
        .chain(saved.iter())
        .map(|r| r.equality())
        .try_fold(Equality::Bitwise, |acc, e| e.map(|e| acc.min(e)));
    let max_in = inputs
        .iter()
        .copied()
        .chain(saved.iter())
        .map(|r| r.judgement.raw_err)
        .fold(0.0f64, f64::max);
    let c = Consumed {
        inputs,
        outputs,
        saved,
        equal,
        max_in,
    };
    let identical = c.equal.is_some();
    let threshold = threshold(&c);
    // An output grown past its inputs' error by more than the local gain, once a sum's
    // cancellation is allowed for. (The cancellation is at least 1: it is worked out only
    // past the plain test.)
    let bound = cx.tols.local_gain * c.max_in;
    // (Judged against a reference run's envelope, the bound is the envelope's: the
    // reference shows what the op does to its inputs' drift.)
    let local = |r: &&&Row| {
        let err = r.judgement.raw_err;
        r.judgement.verdict >= threshold
            && (identical
                || r.judgement.reference.is_some()
                || err > bound && err / cancellation(r, &c.inputs) > bound)
    };
    // A decision (indices, a mask) taken from floating-point values that agree within
    // tolerance, not exactly, and called the same way: a near tie went the other way. Not
    // the culprit, unless a floating-point output is one by itself; look on (what follows
    // took other paths).
    let near_tie = !identical
        && c.inputs.iter().any(|r| floating(r))
        && !c.outputs.iter().any(|r| floating(r) && local(r));
    if near_tie && unit.arg_diffs(k, true).is_empty() {
        let decided: Vec<&Row> = c
            .outputs
            .iter()
            .map(|r| **r)
            .filter(|r| fails(r) && discrete(r))
            .collect();
        if let Some(out) = worst(decided.iter()) {
            if !cx.has(FindingKind::NearTie, Some(dir)) {
                let f = finding(&cx.at, &g, out, decisions::near_tie_explanation(out));
                cx.put(FindingKind::NearTie, Some(dir), f);
            }
            return false;
        }
    }
    // Leftover bytes read on one side are no rounding: an output they move at all, ahead
    // of an error of the phase, is where the runs part, however small the move (the
    // tolerance allows for arithmetic, not for an uninitialised buffer; a read of a few
    // leftover bytes near zero stays within it, and the error surfaces ops later).
    let moved = |r: &&&Row| r.judgement.raw_err > 0.0 || r.judgement.verdict >= threshold;
    let one_sided = leftover(&g).is_some_and(|u| {
        let s = &u.tensor.sides;
        s.bench.unwritten != s.cmp.unwritten
    });
    let out = if one_sided {
        worst(c.outputs.iter().copied().filter(moved))
    } else {
        worst(c.outputs.iter().copied().filter(local))
    };
    let Some(out) = out else {
        return false;
    };
    // After a near tie, a decision's consequences: what it consumed agrees by its
    // statistics only, which a permutation leaves unchanged (tokens routed to other
    // experts: the same count of ones in the routing mask, other rows), and only discrete
    // outputs differ (per-expert counts). Not a culprit; look on.
    if cx.has(FindingKind::NearTie, Some(dir))
        && c.equal == Some(Equality::Statistics)
        && c.outputs.iter().all(|r| !fails(r) || discrete(r))
    {
        return false;
    }
    // Called differently on the two sides: the call is the cause, not its kernel.
    let diffs = unit.arg_diffs(k, true);
    if !diffs.is_empty() {
        let expl = noted(cx, dir, arguments::divergent_call(&c, out, &diffs));
        let mut at_op = finding(&cx.at, &g, out, expl);
        at_op.args = diffs;
        cx.put(FindingKind::FirstDivergent, Some(dir), at_op);
        return true;
    }
    // A different random draw explains it (not the culprit; look on), or both runs called
    // it with its draw off.
    let Some(off) = draw_off(cx, dir, k, &g, &c, out) else {
        return false;
    };
    // Nothing it consumed is on record (a parameters_grad record): nothing shows that the
    // difference starts here rather than in what computed it.
    if c.inputs.is_empty() && c.saved.is_empty() && !cx.tols.blame_without_inputs {
        return false;
    }
    let mut expl = explanation(&g, &c, out);
    // A random op both runs called with its draw off computes deterministically: its own
    // fault, as any op's.
    if let Some(said) = &off {
        expl = format!(
            "{expl}: a faulty kernel, not a different random draw, since both runs called it \
             with its random draw off ({said})"
        );
    }
    let expl = noted(cx, dir, expl);
    let f = finding(&cx.at, &g, out, expl);
    cx.put(FindingKind::FirstDivergent, Some(dir), f);
    true
}

/// The verdict an output of an op that consumed `c` must reach to be locally divergent: an
/// error, or a warning where what it consumed is identical (nothing else explains any
/// difference). Judged against a reference's envelope, a warning too (past half way to the
/// envelope) where everything it consumed is within its own reference's error: the excess
/// over the drift begins there, when an error follows in the phase (a fault of a few times
/// the drift leaves its own output just short of the envelope, and the op after it, which
/// adds its own drift, past it).
fn threshold(c: &Consumed) -> Verdict {
    let mut consumed = c.inputs.iter().copied().chain(c.saved.iter()).peekable();
    let calibrated_start = consumed.peek().is_some()
        && consumed
            .all(|r| r.judgement.reference.is_some() && r.judgement.verdict == Verdict::Pass);
    if c.equal.is_some() || calibrated_start {
        Verdict::Warning
    } else {
        Verdict::Error
    }
}

/// Whether a random draw explains op `k`'s differing output `out` (what it consumed, `c`,
/// agrees): `None` when it does (the op draws random numbers, both runs recorded its draw
/// on or neither recorded it: a different draw, not a faulty kernel; said once per phase),
/// else what the runs said of the draw when both called it with the draw off.
fn draw_off(
    cx: &mut Context,
    dir: Direction,
    k: usize,
    g: &[&Row],
    c: &Consumed,
    out: &Row,
) -> Option<Option<String>> {
    let randomness = g[0].tensor.op.key.randomness();
    if randomness == Randomness::None {
        return Some(None);
    }
    let draw = cx.unit.draw(k);
    if let Some(Draw::Off(said)) = draw {
        return Some(Some(said));
    }
    if !cx.has(FindingKind::RandomDraw, Some(dir)) {
        let on = match draw {
            Some(Draw::On(ref said)) => Some(said.as_str()),
            _ => None,
        };
        let expl = decisions::random_explanation(randomness, &c.said(), on);
        let mut f = finding(&cx.at, g, out, expl);
        f.draw = on.map(Into::into);
        cx.put(FindingKind::RandomDraw, Some(dir), f);
    }
    None
}

/// A first divergent op's explanation in a phase that inherits a diverged forward says so.
fn noted(cx: &Context, dir: Direction, expl: String) -> String {
    if cx.inherited(dir) {
        format!("{expl} (note: the forward diverged first)")
    } else {
        expl
    }
}

/// Why op `g` (output `out`, what it consumed `c`) is locally divergent, for a person.
fn explanation(g: &[&Row], c: &Consumed, out: &Row) -> String {
    let (consumed, max_in) = (c.said(), c.max_in);
    let out_err = out.judgement.raw_err;
    // An input no run wrote is never "within tolerance": it was not compared.
    if let Some(u) = leftover(g) {
        return format!(
            "input {} read memory nothing had written {} (leftover bytes, not \
             compared); the rest of its {consumed} are within tolerance (largest \
             relative error {max_in:.3e}), yet output {} has relative error \
             {out_err:.3e}: leftover bytes read as values (an uninitialised buffer) \
             are the likely cause",
            u.tensor.name,
            unwritten_sides(u),
            out.tensor.name
        );
    }
    if c.inputs.is_empty() && c.saved.is_empty() {
        return format!(
            "its output {} is out of tolerance and it has no recorded inputs \
             (named because blame_without_inputs is set)",
            out.tensor.name
        );
    }
    // A collective's output is computed from every rank's input, of which this rank sees
    // its own: the cross-rank verdict says which rank it came from. A module's record (the
    // dump holds no calls inside it) holds its inputs but not its submodules' parameters:
    // the divergence is somewhere inside the module, not in one op.
    let key = &g[0].tensor.op.key;
    let local = if key.kind() == OpKind::Module {
        "the divergence is inside this module: its parameters or the ops it calls (its \
         record holds its inputs, not its submodules' parameters, and the dump holds no \
         call inside it)"
    } else if key.base().starts_with("Distributed.") {
        "the error is local to this op, or came with another rank's input to it \
         (the cross-rank verdict says which)"
    } else {
        "the error is local to this op"
    };
    // Judged against a reference run's (or a calibration file's) envelope: the ratio says it.
    if let (Some(r), None) = (out.judgement.reference, c.equal) {
        let ratio = if r > 0.0 {
            format!("{:.1}x the reference's {r:.1e}", out_err / r)
        } else {
            "where the reference's is 0".to_string()
        };
        return format!(
            "all {consumed} are within the reference's drift (largest relative error \
             {max_in:.3e}), yet output {} has relative error {out_err:.3e}, {ratio}: {local}",
            out.tensor.name
        );
    }
    if c.equal.is_some() {
        let how = if c.equal == Some(Equality::Bitwise) {
            "are identical on both sides"
        } else {
            "have equal statistics on both sides"
        };
        format!(
            "all {consumed} {how}, yet output {} differs (error {:.3e}): {local}",
            out.tensor.name, out.judgement.err
        )
    } else if max_in > 0.0 && out_err.is_finite() {
        format!(
            "all {consumed} are within tolerance (largest relative error \
             {max_in:.3e}), yet output {} has relative error {out_err:.3e}, \
             {:.0}x larger: {local}",
            out.tensor.name,
            out_err / max_in
        )
    } else {
        format!(
            "all {consumed} are within tolerance (largest relative error \
             {max_in:.3e}), yet output {} has relative error {out_err:.3e}: {local}",
            out.tensor.name
        )
    }
}
