//! Where no tensor of a unit is out of tolerance: the first op whose output warns while its
//! inputs pass, where the warnings begin. A fault smaller than the error tolerance (a
//! bfloat16 kernel a few per cent off) shows only as warnings; no culprit is named, but
//! this is where to look.

use super::context::Context;
use super::rows::{finding, is_input, is_output, worst};
use crate::compare::judge::{Row, Verdict};
use crate::schema::summary::Finding;
use crate::vocab::FindingKind;

/// Where the warnings begin, when nothing fails.
pub(super) fn rule(cx: &mut Context) {
    if cx.briefs.iter().any(|b| b.fails) {
        return;
    }
    if let Some(f) = first_warning(cx) {
        cx.put(FindingKind::FirstWarning, None, f);
    }
}

/// Where nothing fails: the first op, in execution order, whose output warns while every
/// input of it passes. Below the error tolerance the localiser names no culprit, but where
/// the warnings begin is where to look.
fn first_warning(cx: &Context) -> Option<Finding> {
    (0..cx.briefs.len())
        .filter(|&k| cx.briefs[k].flagged)
        .find_map(|k| {
            let rows = cx.unit.rows(k);
            let g: Vec<&Row> = rows.iter().collect();
            if g.iter()
                .any(|r| is_input(r) && r.judgement.verdict != Verdict::Pass)
            {
                return None;
            }
            let warned = g
                .iter()
                .filter(|r| is_output(r) && r.judgement.verdict == Verdict::Warning);
            let out = worst(warned)?;
            let expl = format!(
                "the first op whose output {} warns while its inputs pass: where the warnings \
                 begin (a difference below the error tolerance names no culprit; \
                 docs/compare.md, \"Known limits\")",
                out.tensor.name
            );
            Some(finding(&cx.at, &g, out, expl))
        })
}
