//! Where a divergence enters: the earliest failing op of each phase, and, when an input of
//! it already fails, the divergence entering through that input rather than at an op: from
//! outside the captured ops (weights, data, random draws), through an op only one run calls
//! (code the port adds or leaves out), or with the value the rank's previous step wrote
//! where it differed only by amplified rounding noise.

use super::context::Context;
use super::identity::Catalogue;
use super::rows::{fails, finding, is_input, worst};
use crate::compare::align::Side;
use crate::compare::judge::Row;
use crate::compare::op_rows::OneSidedOp;
use crate::dump::{Direction, Role};
use crate::schema::summary::{Carried, OneSided};
use crate::vocab::FindingKind;

/// Per phase with an error: its earliest failing op, and where the divergence enters.
pub(super) fn rule(cx: &mut Context) {
    for dir in [Direction::Forward, Direction::Backward] {
        let ops = cx.phase_ops(dir);
        let Some(&k) = ops.iter().find(|&&k| cx.briefs[k as usize].fails) else {
            continue;
        };
        let rows = cx.unit.rows(k as usize);
        let g: Vec<&Row> = rows.iter().collect();
        if let Some(focus) = worst(g.iter().filter(|r| fails(r))) {
            let f = finding(
                &cx.at,
                &g,
                focus,
                "the first op with a tensor out of tolerance".into(),
            );
            cx.put(FindingKind::EarliestFailing, Some(dir), f);
        }
        let bad_in: Vec<&&Row> = g.iter().filter(|r| is_input(r) && fails(r)).collect();
        if let Some(inp) = worst(bad_in.into_iter()).filter(|_| !cx.inherited(dir)) {
            let earlier = earlier_warnings(cx, &ops, k, inp);
            let f = entering(cx, k as usize, &g, inp, &earlier);
            cx.put(FindingKind::ExternalSource, Some(dir), f);
        }
    }
}

/// What the ops of the phase before `k` say: none fails, though some may warn (the
/// difference may have grown there, below the error tolerance: a small one that atol
/// forgave, say).
fn earlier_warnings(cx: &Context, ops: &[u32], k: u32, inp: &Row) -> String {
    let warned: Vec<u32> = ops
        .iter()
        .take_while(|&&j| j != k)
        .filter(|&&j| cx.briefs[j as usize].flagged)
        .copied()
        .collect();
    match warned.first() {
        Some(&j) if !inp.tensor.external => {
            let (n, verb) = match warned.len() {
                1 => ("one".to_string(), "warns"),
                n => (n.to_string(), "warn"),
            };
            format!(
                "no earlier captured op fails, though {n} {verb} from {} on: the difference \
                 may have grown there, below the error tolerance",
                cx.unit.key(j as usize).text()
            )
        }
        _ => "no earlier captured op fails".to_string(),
    }
}

/// What a one-sided stretch of the backward phase computes, where its ops tell: gradient
/// clipping scales the gradients (`mul_`, `_foreach_mul_`) by a coefficient computed from
/// their norm (`vector_norm`, `_foreach_norm`, upstream of the scaling on the same side).
fn stretch_computes(one: &OneSidedOp) -> Option<&'static str> {
    const SCALES: [&str; 6] = [
        "mul",
        "mul_",
        "__mul__",
        "__imul__",
        "_foreach_mul",
        "_foreach_mul_",
    ];
    const NORMS: [&str; 4] = ["norm", "vector_norm", "_foreach_norm", "clip_grad_norm_"];
    let key = crate::op_key::OpKey::parse(&one.op);
    let norm = one.upstream.iter().any(|l| NORMS.contains(&l.as_str()));
    (SCALES.contains(&key.leaf()) && norm).then_some("gradient clipping")
}

/// The explanation of a divergence entering through an op only one run calls (`computes`:
/// what its stretch computes, where its ops tell).
fn through_one_sided(
    one: &OneSidedOp,
    computes: Option<&str>,
    input: &str,
    earlier: &str,
) -> String {
    let (calls, other) = (one.side.run(), one.side.other().run());
    let op = &one.op;
    if let Some(what) = computes {
        let from = one
            .upstream
            .iter()
            .take(6)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        return format!(
            "the divergence enters through {what} only {calls} runs: {input} is the output \
             of {op} there, which scales the gradients by a coefficient computed from their \
             norm (from {from}), and {other} does not clip; {earlier}. Clip the same way on \
             both sides (`clip_grad_norm_` with the same max_norm) before suspecting this op"
        );
    }
    let why = match one.side {
        Side::Cmp => "code the port adds, or a call it makes another way",
        Side::Bench => "a step the port leaves out, or makes another way",
    };
    format!(
        "the divergence enters through an op only {calls} calls: {input} is the output of \
         {op} there, which {other} does not call ({why}); {earlier}. Check that call before \
         suspecting this op"
    )
}

/// The finding of a divergence entering op `k` through its failing input `inp`.
fn entering(
    cx: &Context,
    k: usize,
    g: &[&Row],
    inp: &Row,
    earlier: &str,
) -> crate::schema::summary::Finding {
    // What the input is, and so what to check: only for a tensor from outside the captured
    // ops (one that a captured op produced differs for another reason).
    // A parameter tied on one side only explains any divergence of the backward phase:
    // autograd sums the tied parameter's uses into one gradient on that side (and the
    // parameter lists differ, so what is computed over all gradients differs too).
    let backward = cx.phase(&cx.briefs[k]) == Direction::Backward;
    let catalogue = Catalogue::of(cx);
    let tie = catalogue.tie().filter(|_| backward);
    let tied = tie.is_some();
    // What the input is, and so what to check. A tensor that a captured op produced and
    // that is neither a parameter, a gradient nor data differs for another reason.
    let identity = tie
        .or_else(|| Some(catalogue.identify(inp)))
        .filter(|id| inp.tensor.external || inp.tensor.role == Role::Parameter || id.known());
    let source = cx.unit.one_sided_source(k, &inp.tensor.name);
    let computes = source
        .as_ref()
        .filter(|_| backward)
        .and_then(stretch_computes);
    // The value a captured op of the previous step wrote, where it differed only by noise
    // it amplified (judge.rs, `NoiseWrite`): no op is at fault.
    let noise = match source {
        None => cx.carried.noise_write(&inp.tensor),
        Some(_) => None,
    };
    let expl = match (&source, noise) {
        _ if tied => {
            let id = identity.as_ref().expect("the tie is the identity");
            let through = match &source {
                Some(one) => format!(
                    " (it reaches this op through {}, which only {} calls: it runs over \
                     every gradient, and the parameter lists differ)",
                    one.op,
                    one.side.run()
                ),
                None => String::new(),
            };
            format!(
                "the divergence enters with {}{through}, in the backward phase of a model \
                 whose weights are tied differently; {earlier}. {}",
                inp.tensor.name,
                id.advice()
            )
        }
        (Some(one), _) => through_one_sided(one, computes, &inp.tensor.name, earlier),
        (None, Some(w)) => format!(
            "the divergence enters with {}, the value {} wrote in {} (the same statistics in \
             both runs), where it differed only by rounding noise that op amplified (a \
             normalised update of a near-zero gradient, as Adam's): a warning there, not an \
             op's error. No captured op is at fault; {earlier}",
            inp.tensor.name, w.op, cx.carried.step
        ),
        (None, None) => {
            let (what, advice) = match &identity {
                Some(id) => (id.said(), id.advice()),
                None => (
                    "a tensor that differs before any captured op fails (produced or changed \
                     outside the captured ops)"
                        .to_string(),
                    "Check the config-check categories (weights, dataset, random seeds) \
                     before suspecting this op"
                        .to_string(),
                ),
            };
            // After an earlier step of the rank diverged, the weights are what its update
            // wrote (the context's note says so): no configuration to check.
            let advice = match cx.carried.diverged {
                Some(_) => String::new(),
                None => format!(" {advice}"),
            };
            format!(
                "the divergence enters from outside the captured ops: {} is {what}; \
                 {earlier}.{advice}",
                inp.tensor.name
            )
        }
    };
    let mut found = finding(&cx.at, g, inp, expl);
    // What the input is, where the explanation says so (a tie, or no other source).
    found.outside = identity
        .filter(|_| tied || (source.is_none() && noise.is_none()))
        .map(|id| id.outside());
    found.one_sided_source = source.map(|one| OneSided {
        side: one.side.name().into(),
        op: one.op,
        at: one
            .stack
            .and_then(|id| cx.at.stacks.get(&id))
            .and_then(|frames| frames.last().cloned()),
        computes: computes.map(Into::into),
    });
    found.carried = noise.map(|w| Carried {
        step: cx.carried.step.clone(),
        op: w.op.clone(),
        tensor: w.tensor.clone(),
    });
    found
}
