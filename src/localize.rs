//! Naming the first divergent operator (see docs/compare.md, "How the culprit is found").
//!
//! The first row that fails is usually downstream of the real cause. An op is *locally
//! divergent* when its outputs break tolerance while everything it consumed agrees:
//! - all of its inputs (tensors it consumed, weights included) are within tolerance, and
//! - an output is an error, or its inputs are identical and an output is past the warning
//!   threshold (with equal inputs even a small difference is far beyond rounding), and
//! - its output error is more than `local_gain` times its largest input error (otherwise it
//!   only carries or mildly amplifies inherited error).
//!
//! A backward op also consumes what its forward call saved: the inputs and outputs of the
//! matching forward op count as its inputs.
//!
//! The first divergent op is the earliest locally divergent op, per phase, that is
//! followed by an error. Phases: forward; backward, which also holds the forward-direction
//! ops that run after the first backward op (the optimizer update consumes gradients). Failing inputs of the earliest failing op mean the divergence
//! enters from outside the captured ops (weights, data, random draws): reported as such.
//! The first NaN/Inf producer is the earliest op with finite inputs and new non-finite
//! outputs.

use crate::compare::{CompareResult, Pair, Row};
use crate::dump::{Direction, Role};
use crate::tolerance::{Tolerances, Verdict};
use serde::Serialize;
use std::collections::HashMap;

/// A named op with the evidence for naming it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    pub op: String,
    pub step: String,
    pub rank: String,
    pub seq: u64,
    pub direction: Direction,
    /// The tensor the finding is about (the worst output, or the failing input).
    pub tensor: String,
    pub reason: String,
    pub explanation: String,
    /// One line per input and output tensor of the op, with its metrics.
    pub evidence: Vec<String>,
    pub stack: Vec<String>,
}

/// Per-direction findings.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ByDirection {
    pub forward: Option<Finding>,
    pub backward: Option<Finding>,
}

impl ByDirection {
    fn slot(&mut self, d: Direction) -> &mut Option<Finding> {
        match d {
            Direction::Forward => &mut self.forward,
            Direction::Backward => &mut self.backward,
        }
    }
}

/// What the localiser found in one (step, rank) pair.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Findings {
    pub first_divergent: ByDirection,
    pub earliest_failing: ByDirection,
    /// The divergence enters from outside the captured ops (per direction).
    pub external_source: ByDirection,
    pub first_nonfinite: Option<Finding>,
    /// Errors exist in this direction but no op is locally divergent: accumulated drift.
    pub drift: Vec<Direction>,
}

/// The forward call a backward op belongs to (same API counter, as msprobe numbers them):
/// `Functional.gelu.3.backward` → `Functional.gelu.3.forward`,
/// `Module.fc.Linear.backward.2` → `Module.fc.Linear.forward.2`.
fn forward_key(backward: &str) -> Option<String> {
    if let Some(base) = backward.strip_suffix(".backward") {
        return Some(format!("{base}.forward"));
    }
    let (head, call) = backward.rsplit_once('.')?;
    let base = head.strip_suffix(".backward")?;
    Some(format!("{base}.forward.{call}"))
}

fn is_input(r: &Row) -> bool {
    r.role == Role::Input || (r.role == Role::Parameter && r.direction == Direction::Forward)
}

fn is_output(r: &Row) -> bool {
    !is_input(r)
}

/// One line of evidence for a row.
pub fn evidence_line(r: &Row) -> String {
    let side = if is_input(r) { "in " } else { "out" };
    let mut s = format!("{side} {} [{}]", r.name, r.verdict.name());
    if let Some(m) = &r.metrics {
        let cos = m
            .cosine
            .map(|c| format!("{c:.7}"))
            .unwrap_or_else(|| "n/a".into());
        s += &format!(
            " cos={cos} rel_l2={:.3e} max_abs={:.3e}",
            m.rel_l2, m.max_abs
        );
    } else if r.stats_b.is_some() && r.stats_c.is_some() {
        s += &format!(" stat_err={:.3e}", r.err);
    }
    if r.err == 0.0 && r.verdict == Verdict::Pass {
        s += " (identical)";
    }
    if !r.reason.is_empty() {
        s += &format!(": {}", r.reason);
    }
    s
}

fn finding(pair: &Pair, rows: &[&Row], focus: &Row, explanation: String) -> Finding {
    let stack = focus
        .stack
        .and_then(|id| pair.stacks.get(&id).cloned())
        .unwrap_or_default();
    Finding {
        op: focus.op.clone(),
        step: pair.step.clone(),
        rank: pair.rank.clone(),
        seq: focus.seq,
        direction: focus.direction,
        tensor: focus.name.clone(),
        reason: focus.reason.clone(),
        explanation,
        evidence: rows.iter().map(|r| evidence_line(r)).collect(),
        stack,
    }
}

fn worst<'a>(rows: impl Iterator<Item = &'a &'a Row>) -> Option<&'a Row> {
    rows.copied().max_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then(a.err.total_cmp(&b.err))
            .then(b.seq.cmp(&a.seq))
    })
}

/// Localises every pair. `rows` of a pair must be in execution order (as compare makes them).
pub fn localize(res: &CompareResult, tols: &Tolerances) -> Vec<Findings> {
    res.pairs
        .iter()
        .enumerate()
        .map(|(pi, pair)| {
            let rows: Vec<&Row> = res.rows.iter().filter(|r| r.pair == pi).collect();
            localize_pair(pair, &rows, tols)
        })
        .collect()
}

fn localize_pair(pair: &Pair, rows: &[&Row], tols: &Tolerances) -> Findings {
    // Group rows by op, keeping execution order.
    let mut ops: Vec<Vec<&Row>> = Vec::new();
    for r in rows {
        match ops.last_mut() {
            Some(g) if g[0].op_index == r.op_index => g.push(r),
            _ => ops.push(vec![r]),
        }
    }
    let by_key: HashMap<&str, &Vec<&Row>> = ops
        .iter()
        .filter(|g| g[0].direction == Direction::Forward)
        .map(|g| (g[0].op.as_str(), g))
        .collect();
    let mut f = Findings::default();
    let first_backward = rows
        .iter()
        .filter(|r| r.direction == Direction::Backward)
        .map(|r| r.seq)
        .min();
    let phase = |g: &Vec<&Row>| match first_backward {
        Some(s) if g[0].seq > s => Direction::Backward,
        _ => g[0].direction,
    };
    let forward_fails = ops
        .iter()
        .any(|g| phase(g) == Direction::Forward && g.iter().any(|r| r.verdict == Verdict::Error));
    for dir in [Direction::Forward, Direction::Backward] {
        // Gradients of a diverged forward differ from the loss on: not an outside source.
        let inherited = dir == Direction::Backward && forward_fails;
        let dir_ops: Vec<&Vec<&Row>> = ops.iter().filter(|g| phase(g) == dir).collect();
        let last_error = dir_ops
            .iter()
            .rposition(|g| g.iter().any(|r| r.verdict == Verdict::Error));
        let Some(last_error) = last_error else {
            continue;
        };
        // Earliest failing op, and whether the failure enters through its inputs.
        if let Some(g) = dir_ops
            .iter()
            .find(|g| g.iter().any(|r| r.verdict == Verdict::Error))
        {
            let focus = worst(g.iter().filter(|r| r.verdict == Verdict::Error));
            if let Some(focus) = focus {
                *f.earliest_failing.slot(dir) = Some(finding(
                    pair,
                    g,
                    focus,
                    "the first op with a tensor out of tolerance".into(),
                ));
            }
            let bad_in: Vec<&&Row> = g
                .iter()
                .filter(|r| is_input(r) && r.verdict == Verdict::Error)
                .collect();
            if let Some(inp) = worst(bad_in.into_iter()).filter(|_| !inherited) {
                let what = match (inp.role, inp.external) {
                    (Role::Parameter, _) => "a parameter",
                    (_, true) => "a tensor no captured op produced (weight, data batch or random draw)",
                    _ => "a tensor that differs before any captured op fails (produced or changed outside the captured ops)",
                };
                let expl = format!(
                    "the divergence enters from outside the captured ops: {} is {what}; \
                     no earlier captured op fails. Check the config-check categories \
                     (weights, dataset, random seeds) before suspecting this op",
                    inp.name
                );
                *f.external_source.slot(dir) = Some(finding(pair, g, inp, expl));
            }
        }
        // First locally divergent op followed by an error.
        let mut found = false;
        for (k, g) in dir_ops.iter().enumerate() {
            if k > last_error {
                break;
            }
            let inputs: Vec<&&Row> = g.iter().filter(|r| is_input(r)).collect();
            let outputs: Vec<&&Row> = g.iter().filter(|r| is_output(r)).collect();
            if outputs.is_empty() || inputs.iter().any(|r| r.verdict == Verdict::Error) {
                continue;
            }
            let saved: &[&Row] = if g[0].direction == Direction::Backward {
                forward_key(&g[0].op)
                    .and_then(|k| by_key.get(k.as_str()))
                    .map_or(&[], |fg| fg.as_slice())
            } else {
                &[]
            };
            let identical =
                inputs.iter().all(|r| r.identical()) && saved.iter().all(|r| r.identical());
            let Some(out) = worst(outputs.iter().copied()) else {
                continue;
            };
            let threshold = if identical {
                Verdict::Warning
            } else {
                Verdict::Error
            };
            if out.verdict < threshold || saved.iter().any(|r| r.verdict == Verdict::Error) {
                continue;
            }
            let max_in = inputs
                .iter()
                .copied()
                .chain(saved.iter())
                .map(|r| r.raw_err)
                .fold(0.0f64, f64::max);
            if !identical && out.raw_err <= tols.local_gain * max_in {
                continue;
            }
            let consumed = if saved.is_empty() {
                format!("{} inputs", inputs.len())
            } else {
                format!(
                    "{} inputs and the {} tensors of its forward call",
                    inputs.len(),
                    saved.len()
                )
            };
            let expl = if inputs.is_empty() && saved.is_empty() {
                format!(
                    "its output {} is out of tolerance and it has no recorded inputs",
                    out.name
                )
            } else if identical {
                format!(
                    "all {consumed} are identical on both sides, yet output {} differs \
                     (error {:.3e}): the error is local to this op",
                    out.name, out.err
                )
            } else {
                format!(
                    "all {consumed} are within tolerance (largest relative error {:.3e}), yet \
                     output {} has relative error {:.3e}, {:.0}x larger: the error is local to this op",
                    max_in,
                    out.name,
                    out.raw_err,
                    out.raw_err / max_in
                )
            };
            let expl = if inherited {
                format!("{expl} (note: the forward diverged first)")
            } else {
                expl
            };
            *f.first_divergent.slot(dir) = Some(finding(pair, g, out, expl));
            found = true;
            break;
        }
        if !found && !inherited && f.external_source.slot(dir).is_none() {
            f.drift.push(dir);
        }
    }
    // First NaN/Inf producer, in execution order over both directions.
    for g in &ops {
        let inputs_finite = g.iter().filter(|r| is_input(r)).all(|r| !r.cmp_nonfinite());
        if !inputs_finite {
            continue;
        }
        if let Some(out) = g.iter().find(|r| is_output(r) && r.new_nonfinite()) {
            let expl = format!(
                "first op whose inputs are all finite but whose output {} holds NaN/Inf \
                 that the benchmark does not",
                out.name
            );
            f.first_nonfinite = Some(finding(pair, g, out, expl));
            break;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::forward_key;

    #[test]
    fn backward_ops_find_their_forward_call() {
        assert_eq!(
            forward_key("Functional.gelu.3.backward").as_deref(),
            Some("Functional.gelu.3.forward")
        );
        assert_eq!(
            forward_key("Module.fc.Linear.backward.2").as_deref(),
            Some("Module.fc.Linear.forward.2")
        );
        assert_eq!(forward_key("Module.fc.Linear.parameters_grad"), None);
    }
}
