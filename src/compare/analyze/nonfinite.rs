//! The first NaN/Inf producer: in execution order over both phases, the first op whose
//! inputs are all finite and whose output holds NaN/Inf the benchmark does not (from
//! leftover bytes it read, where it read some). What follows only carries it.

use super::context::Context;
use super::rows::{finding, is_input, is_output, leftover, unwritten_sides};
use crate::compare::judge::Row;
use crate::vocab::FindingKind;

/// The first op with finite inputs and new non-finite outputs.
pub(super) fn rule(cx: &mut Context) {
    for (k, h) in cx.briefs.iter().enumerate() {
        // No NaN/Inf on the comparison side: no new NaN/Inf output.
        if !h.nonfinite {
            continue;
        }
        let rows = cx.unit.rows(k);
        let g: Vec<&Row> = rows.iter().collect();
        let inputs_finite = g
            .iter()
            .filter(|r| is_input(r))
            .all(|r| !r.tensor.cmp_nonfinite());
        if !inputs_finite {
            continue;
        }
        if let Some(out) = g.iter().find(|r| is_output(r) && r.tensor.new_nonfinite()) {
            let expl = match leftover(&g) {
                Some(u) => format!(
                    "first op whose output {} holds NaN/Inf that the benchmark does not; its \
                     input {} read memory nothing had written {} (leftover bytes, not \
                     compared) and its other inputs are finite: leftover bytes read as values \
                     (an uninitialised buffer) are the likely cause",
                    out.tensor.name,
                    u.tensor.name,
                    unwritten_sides(u)
                ),
                None => format!(
                    "first op whose inputs are all finite but whose output {} holds NaN/Inf \
                     that the benchmark does not",
                    out.tensor.name
                ),
            };
            let f = finding(&cx.at, &g, out, expl);
            cx.put(FindingKind::FirstNonfinite, None, f);
            return;
        }
    }
}
