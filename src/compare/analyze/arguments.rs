//! Ops called with different non-tensor arguments on the two sides (a layer norm's `eps`,
//! a softmax scale, a cast's dtype): set by code the dump does not capture, the call is the
//! likely cause rather than the kernel. Said where such an op is the first divergent one
//! ([`divergent_call`]), and, whatever its outputs, for the first such op of a unit as a
//! hint ([`rule`]).

use super::context::{Context, Place};
use super::rows::{finding, is_output, worst, Consumed};
use crate::compare::judge::Row;
use crate::compare::op_rows::OpRows;
use crate::dump::args::ArgDiff;
use crate::schema::summary::Finding;
use crate::vocab::FindingKind;

/// The first op of the unit called with different arguments, as a hint.
pub(super) fn rule(cx: &mut Context) {
    if let Some(f) = first_call(cx.unit, &cx.at) {
        cx.put(FindingKind::OtherArgs, None, f);
    }
}

/// Why a first divergent op (output `out`, what it consumed `c`) called with the arguments
/// `diffs` differs: the call, not the kernel.
pub(super) fn divergent_call(c: &Consumed, out: &Row, diffs: &[ArgDiff]) -> String {
    let consumed = c.said();
    let agree = if c.equal.is_some() {
        format!("all {consumed} agree")
    } else {
        format!(
            "all {consumed} are within tolerance (largest relative error {:.3e})",
            c.max_in
        )
    };
    let list: Vec<String> = diffs.iter().map(ArgDiff::brief).collect();
    let one_sided = diffs.iter().all(|d| {
        d.bench == crate::dump::args::NOT_PASSED || d.cmp == crate::dump::args::NOT_PASSED
    });
    if one_sided {
        format!(
            "{agree}, yet output {} has error {:.3e}, and one run passed an \
             argument the other did not ({}; benchmark vs comparison): unless it \
             is the value the other run's default gives, the call differs; check \
             it before suspecting the kernel",
            out.tensor.name,
            out.judgement.err,
            list.join(", ")
        )
    } else {
        format!(
            "{agree}, yet output {} has error {:.3e} and the op was called with \
             different non-tensor arguments ({}; benchmark vs comparison): the \
             call differs, set by code the dump does not capture (a \
             hyperparameter, a config value, a number read from a tensor); check \
             where those come from before suspecting the kernel",
            out.tensor.name,
            out.judgement.err,
            list.join(", ")
        )
    }
}

/// The first op called with different non-tensor arguments, whatever its outputs, with how
/// many ops of the unit were. An argument only one run passed counts where a tensor of the
/// op is not within tolerance (elsewhere an explicit default would only be noise).
fn first_call(unit: &dyn OpRows, at: &Place) -> Option<Finding> {
    let mut differing = (0..unit.ops()).filter_map(|k| {
        let d = unit.arg_diffs(k, unit.head(k).flagged);
        (!d.is_empty()).then_some((k, d))
    });
    let (k, diffs) = differing.next()?;
    let n = 1 + differing.count();
    let rows = unit.rows(k);
    let g: Vec<&Row> = rows.iter().collect();
    let outputs = g.iter().filter(|r| is_output(r));
    let focus = worst(outputs).or_else(|| worst(g.iter()))?;
    let list: Vec<String> = diffs.iter().map(ArgDiff::brief).collect();
    let ops = if n == 1 {
        "the only op".to_string()
    } else {
        format!("the first of {n} ops")
    };
    let expl = format!(
        "{ops} of {}/{} called with different non-tensor arguments ({}; benchmark vs \
         comparison), set by code the dump does not capture; its output {} is {}",
        at.step,
        at.rank,
        list.join(", "),
        focus.tensor.name,
        focus.judgement.verdict.name()
    );
    let mut found = finding(at, &g, focus, expl);
    found.args = diffs;
    Some(found)
}
