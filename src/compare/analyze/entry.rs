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

/// A run, as the explanations name it.
fn run_of(side: Side) -> &'static str {
    match side {
        Side::Bench => "the benchmark",
        Side::Cmp => "the comparison run",
    }
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
    let catalogue = (backward || inp.tensor.external || inp.tensor.role == Role::Parameter)
        .then(|| Catalogue::of(cx));
    let tie = catalogue
        .as_ref()
        .filter(|_| backward)
        .and_then(Catalogue::tie);
    let tied = tie.is_some();
    let identity = match (inp.tensor.role, inp.tensor.external, &catalogue) {
        _ if tie.is_some() => tie,
        (Role::Parameter, _, Some(c)) | (_, true, Some(c)) => Some(c.identify(inp)),
        _ => None,
    };
    let source = cx.unit.one_sided_source(k, &inp.tensor.name);
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
                Some((side, op, _)) => format!(
                    " (it reaches this op through {op}, which only {} calls: it runs over \
                     every gradient, and the parameter lists differ)",
                    run_of(*side)
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
        (Some((side, op, _)), _) => {
            let (calls, other, why) = match side {
                Side::Cmp => (
                    "the comparison run",
                    "the benchmark",
                    "code the port adds, or a call it makes another way",
                ),
                Side::Bench => (
                    "the benchmark",
                    "the comparison run",
                    "a step the port leaves out, or makes another way",
                ),
            };
            format!(
                "the divergence enters through an op only {calls} calls: {} is the output of \
                 {op} there, which {other} does not call ({why}); {earlier}. Check that call \
                 before suspecting this op",
                inp.tensor.name
            )
        }
        (None, Some(w)) => format!(
            "the divergence enters with {}, the value {} wrote in {} (the same statistics in \
             both runs), where it differed only by rounding noise that op amplified (a \
             normalised update of a near-zero gradient, as Adam's): a warning there, not an \
             op's error. No captured op is at fault; {earlier}",
            inp.tensor.name, w.op, cx.carried.step
        ),
        (None, None) => match &identity {
            Some(id) => format!(
                "the divergence enters from outside the captured ops: {} is {}; {earlier}. {}",
                inp.tensor.name,
                id.said(),
                id.advice()
            ),
            None => format!(
                "the divergence enters from outside the captured ops: {} is a tensor that \
                 differs before any captured op fails (produced or changed outside the \
                 captured ops); {earlier}. Check the config-check categories (weights, \
                 dataset, random seeds) before suspecting this op",
                inp.tensor.name
            ),
        },
    };
    let mut found = finding(&cx.at, g, inp, expl);
    found.outside = match (&source, noise) {
        _ if tied => identity.map(|id| id.outside()),
        (None, None) => identity.map(|id| id.outside()),
        _ => None,
    };
    found.one_sided_source = source.map(|(side, op, stack)| OneSided {
        side: side.name().into(),
        op,
        at: stack
            .and_then(|id| cx.at.stacks.get(&id))
            .and_then(|frames| frames.last().cloned()),
    });
    found.carried = noise.map(|w| Carried {
        step: cx.carried.step.clone(),
        op: w.op.clone(),
        tensor: w.tensor.clone(),
    });
    found
}
