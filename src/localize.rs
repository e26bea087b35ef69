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
//! The first divergent op is the earliest locally divergent op, per direction, that is
//! followed by an error. Failing inputs of the earliest failing op mean the divergence
//! enters from outside the captured ops (weights, data, random draws): reported as such.
//! The first NaN/Inf producer is the earliest op with finite inputs and new non-finite
//! outputs.

use crate::compare::{CompareResult, Pair, Row};
use crate::dump::{Direction, Role};
use crate::tolerance::{Tolerances, Verdict};
use serde::Serialize;

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
    } else if r.stat_diff.is_some() {
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
    let mut f = Findings::default();
    let forward_fails = ops.iter().any(|g| {
        g[0].direction == Direction::Forward && g.iter().any(|r| r.verdict == Verdict::Error)
    });
    for dir in [Direction::Forward, Direction::Backward] {
        // Gradients of a diverged forward differ from the loss on: not an outside source.
        let inherited = dir == Direction::Backward && forward_fails;
        let dir_ops: Vec<&Vec<&Row>> = ops.iter().filter(|g| g[0].direction == dir).collect();
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
            let identical = inputs.iter().all(|r| r.identical());
            let threshold = if identical {
                Verdict::Warning
            } else {
                Verdict::Error
            };
            let Some(out) = worst(outputs.iter().copied()) else {
                continue;
            };
            if out.verdict < threshold {
                continue;
            }
            let max_in = inputs.iter().map(|r| r.err).fold(0.0f64, f64::max);
            if max_in > 0.0 && out.err <= tols.local_gain * max_in {
                continue;
            }
            let expl = if inputs.is_empty() {
                format!(
                    "its output {} is out of tolerance and it has no recorded inputs",
                    out.name
                )
            } else if identical {
                format!(
                    "all {} inputs are identical on both sides, yet output {} differs \
                     (error {:.3e}): the error is local to this op",
                    inputs.len(),
                    out.name,
                    out.err
                )
            } else {
                format!(
                    "all {} inputs are within tolerance (largest input error {:.3e}), yet output {} \
                     has error {:.3e}, {:.0}x larger: the error is local to this op",
                    inputs.len(),
                    max_in,
                    out.name,
                    out.err,
                    out.err / max_in
                )
            };
            let expl = if inherited {
                format!("{expl} (its saved forward activations already differ: the forward diverged first)")
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
