//! The run-wide verdict: counts, the headline that tells the story, the worst ops and the
//! exit code, built from every unit's result into a [`Summary`] (`summary.json`).
//!
//! Reads [`UnitSummary`]s only, never rows or tensors, so the same verdict can be built from units
//! compared apart.

use crate::compare::coverage::SideCoverage;
use crate::compare::{
    cross_rank, CompareRun, MatchedBy, Region, Side, Sides, UnitSummary, Verdict, WorstCandidate,
    WORST_OPS,
};
use crate::dump::Direction;
use crate::gate::{FailOn, EXIT_FAIL, EXIT_INCOMPLETE, EXIT_NOTHING_COMPARABLE, EXIT_PASS};
use crate::op_key::{module_path, OpKey, OpKind, Randomness};
use crate::schema::summary::{
    label_key, Counts, Finding, Findings, IncompleteUnit, Outside, PairSummary, RunFindings,
    RunVerdict, Summary, WorstOp,
};
use crate::vocab::FindingKind;
use std::collections::BTreeMap;

/// The earliest of some findings in causal order.
fn earliest<'a>(fs: impl Iterator<Item = &'a Finding>) -> Option<&'a Finding> {
    fs.min_by(|a, b| a.causal_key().cmp(&b.causal_key()))
}

fn counts(run: &CompareRun) -> Counts {
    // Every way of pairing is listed, zeros included.
    let mut c = Counts {
        matched_by: [
            MatchedBy::Exact,
            MatchedBy::Aligned,
            MatchedBy::Mapped,
            MatchedBy::Module,
        ]
        .iter()
        .map(|m| (m.name().to_string(), 0))
        .collect(),
        ..Counts::default()
    };
    for u in &run.units {
        c.add(&u.counts);
    }
    c
}

fn pair_summary(u: &UnitSummary) -> PairSummary {
    let c = &u.counts;
    PairSummary {
        step: u.step.clone(),
        rank: u.rank.clone(),
        bench: u.dirs.bench.display().to_string(),
        cmp: u.dirs.cmp.display().to_string(),
        tensors: c.tensors,
        errors: c.error,
        warnings: c.warning,
        unmatched: c.one_sided(),
        unmatched_fraction: u.coverage.as_ref().map(|c| c.unmatched_fraction()),
        findings: u.findings.clone(),
        regions: u.regions.clone(),
        loss_scale: u.loss_scale.clone(),
        scaler_skipped: u.scaler_skipped.clone(),
        micro_batches: u.micro_batches.clone(),
        input_sizes: u.input_sizes.clone(),
    }
}

/// Per side, the share of the compared pairs' tensors without a counterpart.
fn unmatched_fraction(run: &CompareRun) -> Sides<f64> {
    let mut total = Sides::new(SideCoverage::default(), SideCoverage::default());
    for u in &run.units {
        for (t, c) in [
            (&mut total.bench, &u.coverage.bench),
            (&mut total.cmp, &u.coverage.cmp),
        ] {
            t.tensors += c.tensors;
            t.unmatched += c.unmatched;
        }
    }
    total.map(|c| c.unmatched_fraction())
}

/// What a command adds to the summary of its run: a note on how it ran (after the run's own
/// warnings), and the report files it writes, by format (empty where it writes none).
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// A warning of the command's (a thread count it could not set, say).
    pub note: Option<String>,
    /// Report files, by format.
    pub outputs: BTreeMap<String, String>,
}

/// Builds the summary of a compare, whole. `max_unmatched` is the largest share of a
/// side's tensors in a step/rank pair that may lack a counterpart before the comparison
/// counts as incomplete.
pub fn summarize(run: &CompareRun, fail_on: FailOn, max_unmatched: f64, extras: Extras) -> Summary {
    let c = counts(run);
    // The worst verdict of what was compared (unmatched tensors are a warning).
    let compared = if c.error > 0 {
        Verdict::Error
    } else if c.warning > 0 || c.unmatched_bench + c.unmatched_cmp > 0 {
        Verdict::Warning
    } else {
        Verdict::Pass
    };
    let incomplete = incomplete_units(run, max_unmatched);
    // Precedence (docs/compare.md, "Exit codes"): nothing comparable, then the gate on
    // what was compared (a divergence is reported however little was compared), then an
    // incomplete comparison, then a pass.
    let exit_code = if c.tensors == 0 {
        EXIT_NOTHING_COMPARABLE
    } else if fail_on.fails(compared) {
        EXIT_FAIL
    } else if !incomplete.is_empty() {
        EXIT_INCOMPLETE
    } else {
        EXIT_PASS
    };
    let verdict = match compared {
        Verdict::Error => RunVerdict::Error,
        _ if !incomplete.is_empty() => RunVerdict::Incomplete,
        Verdict::Warning => RunVerdict::Warning,
        Verdict::Pass => RunVerdict::Pass,
    };
    let pairs: Vec<PairSummary> = run.units.iter().map(pair_summary).collect();
    let findings = run_findings(run, &pairs);
    let cross = if compared == Verdict::Error {
        cross_rank::analyze(&run.units)
    } else {
        None
    };
    let warnings_begin = findings.get(FindingKind::FirstWarning, None);
    let mut headline = match &cross {
        // (With what the headline of one rank adds about how the runs were compared.)
        Some(x) => {
            cross_rank::headline(x)
                + &micro_note(&pairs)
                + &scale_note(&pairs)
                + &skipped_note(&pairs)
        }
        None => headline(compared, &c, &pairs, warnings_begin),
    };
    if !incomplete.is_empty() {
        headline = incomplete_headline(headline, compared, &c, &incomplete);
    }
    let calibration = run
        .calibration
        .as_ref()
        .map(|r| crate::schema::summary::CalibrationUse::of(r.by(), r.path(), r.k(), &c));
    Summary {
        format: "probe-compare-summary".into(),
        version: 2,
        verdict,
        fail_on,
        max_unmatched,
        unmatched_fraction: unmatched_fraction(run),
        exit_code,
        headline,
        bench: run.bench.display().to_string(),
        cmp: run.cmp.display().to_string(),
        counts: c,
        findings,
        pairs,
        worst_ops: worst_ops(run, WORST_OPS),
        warnings: run
            .warnings
            .iter()
            .cloned()
            .chain(extras.note)
            .chain(calibration.as_ref().and_then(|c| c.warning()))
            .collect(),
        partial: !incomplete.is_empty(),
        incomplete_units: incomplete,
        outputs: extras.outputs,
        origin: cross.as_ref().map(|x| x.origin.clone()),
        propagation: cross.map(|x| x.propagation).unwrap_or_default(),
        calibration,
        recapture: None,
    }
}

/// `n` with thousands separators (2,501).
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The run a side names, for a headline.
fn run_name(side: Side) -> &'static str {
    match side {
        Side::Bench => "the benchmark run",
        Side::Cmp => "the comparison run",
    }
}

/// Why a compared unit covers too little, if it does: per side whose unmatched share
/// passes `max`, what the other side lacks. The other side *stopped early* when its records
/// end while this side's unmatched tensors form a long tail after its last matched op
/// (the tail alone passes `max`, and is ten times the other side's own tail): a capture
/// that stopped, not ops that differ. Returns the side lacking something and the reason.
fn coverage_gap(u: &UnitSummary, max: f64) -> Option<(&'static str, String)> {
    let cov = &u.coverage;
    let mut reasons = Vec::new();
    let mut lacking = Vec::new();
    for (have, other) in [(Side::Bench, Side::Cmp), (Side::Cmp, Side::Bench)] {
        let (h, o) = match have {
            Side::Bench => (&cov.bench, &cov.cmp),
            Side::Cmp => (&cov.cmp, &cov.bench),
        };
        if h.unmatched_fraction() <= max {
            continue;
        }
        lacking.push(other);
        let stopped = o.ops > 0
            && h.tail_unmatched as f64 > max * h.tensors as f64
            && o.tail_unmatched.saturating_mul(10) <= h.tail_unmatched;
        // What this side lacks a counterpart for is mostly its forward calls after its
        // gradients (its optimizer's update), and the other side's such calls nearly all
        // have one (logging the loss, say; a fused optimizer's one hooked call, the
        // `_foreach_add_` of its step counters, may have none): the other run's update is
        // not in its dump. Where the other side's calls after its gradients outnumber what
        // this side lacks there, they are an update: this side's unmatched calls are steps
        // the other run leaves out (gradient clipping's `_foreach_norm` and
        // `_foreach_mul_`), not its whole update.
        let update = h.update_unmatched.unwrap_or(0);
        let lacks = o
            .update_unmatched
            .is_some_and(|u| u.saturating_mul(10) <= update)
            && update > 0
            && 2 * update >= h.unmatched;
        let no_update = lacks && o.update_tensors.unwrap_or(0) < update;
        // The other side's update is there: this side runs more after its gradients than
        // an update (gradient clipping, a norm it logs).
        let more = lacks && !no_update;
        reasons.push(match (&o.last_op, stopped) {
            _ if more => format!(
                "{} runs ops after its gradients that {} does not: {} {} tensors have no \
                 counterpart there, while both runs' optimizer updates pair (gradient \
                 clipping, unscaling or a norm logged on one side only)",
                run_name(have),
                run_name(other),
                thousands(update),
                have.name()
            ),
            _ if no_update => format!(
                "{}'s dump has no optimizer update after its gradients: {} {} tensors of the \
                 update have no counterpart (a fused optimizer's kernel is not hooked; or the \
                 update ran outside the captured step)",
                run_name(other),
                thousands(update),
                have.name()
            ),
            (Some(last), true) => format!(
                "{}'s capture stopped after op {} ({last}); {} {} tensors have no counterpart",
                run_name(other),
                thousands(o.ops),
                thousands(h.unmatched),
                have.name()
            ),
            _ => format!(
                "{} of {} {} tensors ({:.1}%) have no counterpart in {}",
                thousands(h.unmatched),
                thousands(h.tensors),
                have.name(),
                100.0 * h.unmatched_fraction(),
                other.name()
            ),
        });
    }
    // A run that ran compiled code lacks the operators inside its graphs.
    for (run, compiled) in [(Side::Bench, u.compiled.bench), (Side::Cmp, u.compiled.cmp)] {
        if compiled && lacking.contains(&run) {
            reasons.push(format!(
                "{} ran compiled code (torch.compile, TorchScript): operators inside its \
                 graphs are not in its dump",
                run_name(run)
            ));
        }
    }
    let side = match lacking.as_slice() {
        [] => return None,
        [one] => one.name(),
        _ => "both",
    };
    Some((side, reasons.join("; ")))
}

/// Every pair not compared in full, in step/rank order: the run's (not compared at all)
/// and the compared units' (cut short by a crash, or covering too little: more than
/// `max_unmatched` of a side's tensors without a counterpart).
fn incomplete_units(run: &CompareRun, max_unmatched: f64) -> Vec<IncompleteUnit> {
    let mut v: Vec<IncompleteUnit> = run.incomplete.clone();
    for u in &run.units {
        let gap = coverage_gap(u, max_unmatched);
        v.extend(match (&u.incomplete, gap) {
            (None, None) => None,
            (Some(i), None) => Some(i.clone()),
            (None, Some((side, reason))) => Some(IncompleteUnit {
                step: u.step.clone(),
                rank: u.rank.clone(),
                side: side.to_string(),
                compared: true,
                reason,
            }),
            (Some(i), Some((side, reason))) => Some(IncompleteUnit {
                side: if i.side == side { side } else { "both" }.to_string(),
                reason: format!("{}; {reason}", i.reason),
                ..i.clone()
            }),
        });
    }
    v.sort_by(|a, b| {
        (label_key(&a.step), label_key(&a.rank)).cmp(&(label_key(&b.step), label_key(&b.rank)))
    });
    v
}

/// The headline of a partial comparison: it says so first, unless something diverged.
fn incomplete_headline(
    headline: String,
    verdict: Verdict,
    c: &Counts,
    incomplete: &[IncompleteUnit],
) -> String {
    const SHOWN: usize = 3;
    let mut list = incomplete
        .iter()
        .take(SHOWN)
        .map(|u| format!("{}/{} ({})", u.step, u.rank, u.reason))
        .collect::<Vec<_>>()
        .join(", ");
    if incomplete.len() > SHOWN {
        list += &format!(" and {} more", incomplete.len() - SHOWN);
    }
    let n = incomplete.len();
    if c.tensors == 0 || verdict == Verdict::Error {
        return format!("{headline}; comparison incomplete, {n} step/rank pair(s): {list}");
    }
    let what = if verdict == Verdict::Pass {
        format!("all {} compared tensors within tolerance", c.tensors)
    } else {
        format!(
            "no compared tensor out of tolerance; {} warnings, {} unmatched tensors",
            c.warning,
            c.unmatched_bench + c.unmatched_cmp
        )
    };
    // One pair: what it lacks comes first (the capture that stopped, say).
    if let [u] = incomplete {
        return format!("INCOMPLETE: {}/{}: {}; {what}", u.step, u.rank, u.reason);
    }
    format!("INCOMPLETE: {n} step/rank pair(s) not compared in full: {list}; {what}")
}

/// The pairs of the earliest step with an error, which tells the story; later steps
/// inherit it (a diverged update in step 0 is "different weights" in step 1).
fn error_step(pairs: &[PairSummary]) -> Vec<&PairSummary> {
    let Some(step) = pairs
        .iter()
        .filter(|p| p.errors > 0)
        .map(|p| label_key(&p.step))
        .min()
    else {
        return vec![];
    };
    pairs
        .iter()
        .filter(|p| p.errors > 0 && label_key(&p.step) == step)
        .collect()
}

/// For a divergence entering from outside in a later step: the step before it of the same
/// rank compared without error (`error_step` tells the earliest step with one), so what
/// differs was changed between the steps by code the dump does not see. Empty otherwise.
fn between_steps(pairs: &[PairSummary], e: &Finding) -> String {
    let at = label_key(&e.step);
    let before = pairs
        .iter()
        .filter(|p| p.rank == e.rank && p.tensors > 0 && label_key(&p.step) < at)
        .max_by_key(|p| label_key(&p.step));
    match before {
        Some(p) => format!(
            "; {}/{} compared without error, so it changed between the steps outside the \
             captured ops: a weight by the optimizer's update or its hyperparameters, a \
             data batch by the loader's order or seed",
            p.step, p.rank
        ),
        None => String::new(),
    }
}

/// The finding a headline tells, among every rank's findings of `in_step` (ranks run the
/// same program): the earliest in execution order; at the same op, the kind that says most
/// ([`FindingKind::story_rank`]: NaN/Inf first).
fn story<'a>(in_step: &[&'a PairSummary]) -> Option<(FindingKind, &'a Finding)> {
    let mut cands: Vec<(u8, FindingKind, &Finding)> = in_step
        .iter()
        .flat_map(|p| p.findings.iter())
        .filter_map(|f| Some((f.kind.story_rank()?, f.kind, &f.finding)))
        .collect();
    cands.sort_by(|(k, _, x), (l, _, y)| {
        let (xs, _, xr) = x.causal_key();
        let (ys, _, yr) = y.causal_key();
        (xs, x.seq, *k, xr).cmp(&(ys, y.seq, *l, yr))
    });
    cands.first().map(|&(_, kind, f)| (kind, f))
}

/// The op a divergence's headline names (the reports label it as the culprit): the
/// headline's finding, or with no single divergent op (accumulated drift) the earliest
/// failing op. None when no tensor is out of tolerance.
pub(crate) fn culprit(s: &Summary) -> Option<&Finding> {
    // A distributed run's headline names the rank where the divergence began, which may
    // act later than the ranks that inherited it (cross_rank.rs).
    if let Some(o) = &s.origin {
        let at = |f: &&Finding| f.op == o.op && f.seq == o.seq;
        let origins = [
            FindingKind::FirstDivergent,
            FindingKind::ExternalSource,
            FindingKind::NearTie,
        ];
        let found = s
            .pairs
            .iter()
            .filter(|p| p.step == o.step && p.rank == o.rank)
            .flat_map(|p| p.findings.iter())
            .filter(|f| origins.contains(&f.kind))
            .map(|f| &f.finding)
            .find(at);
        if found.is_some() {
            return found;
        }
    }
    let in_step = error_step(&s.pairs);
    if let Some((_, f)) = story(&in_step) {
        return Some(f);
    }
    in_step
        .first()?
        .findings
        .first(FindingKind::EarliestFailing)
}

/// The headline of a divergence entering from outside an op (`FindingKind::ExternalSource`):
/// through weights tied on one side only, with a value an amplifying op of the previous step
/// wrote, through an op only one run calls, or from outside the captured ops.
fn entry_headline(e: &Finding, pairs: &[PairSummary]) -> String {
    match (&e.one_sided_source, &e.carried) {
        _ if e.outside.as_ref().is_some_and(|o| o.tied_with.is_some()) => format!(
            "DIVERGENCE from weights tied on one side only: {}; the gradients \
             differ from {} (input of {}, {}/{}) on",
            e.outside.as_ref().map_or_else(String::new, Outside::tie),
            e.tensor,
            e.named(),
            e.step,
            e.rank
        ),
        (None, Some(w)) => format!(
            "DIVERGENCE from amplified rounding noise: {} (input of {}, {}/{}) is \
             the value {} wrote in {}/{} (the same statistics in both runs), where \
             it differed only by rounding noise that op amplified (a normalised \
             update of a near-zero gradient, as Adam's): no captured op is at \
             fault",
            e.tensor,
            e.named(),
            e.step,
            e.rank,
            w.op,
            w.step,
            e.rank
        ),
        (Some(o), _) => format!(
            "DIVERGENCE enters through {}: its output {} (input of {}, {}/{}) \
             differs",
            o.said(),
            e.tensor,
            e.named(),
            e.step,
            e.rank
        ),
        (None, None) => format!(
            "DIVERGENCE enters from outside the captured ops: {}{} (input of {}, \
             {}/{}){}",
            e.outside
                .as_ref()
                .map_or_else(String::new, Outside::headline),
            e.tensor,
            e.named(),
            e.step,
            e.rank,
            between_steps(pairs, e)
        ),
    }
}

fn headline(
    verdict: Verdict,
    c: &Counts,
    pairs: &[PairSummary],
    first_warning: Option<&Finding>,
) -> String {
    if c.tensors == 0 {
        return "NOTHING COMPARABLE: no tensor is present on both sides".into();
    }
    let note = micro_note(pairs)
        + &regions_note(pairs)
        + &args_note(pairs)
        + &scale_note(pairs)
        + &skipped_note(pairs);
    match verdict {
        Verdict::Pass => format!("PASS: all {} tensors within tolerance{note}", c.tensors),
        Verdict::Warning => format!(
            "WARNING: no tensor out of tolerance; {} warnings, {} unmatched tensors{}{note}",
            c.warning,
            c.unmatched_bench + c.unmatched_cmp,
            first_warning.map_or(String::new(), |x| format!(
                "; the warnings begin at {} ({}/{})",
                x.named(),
                x.step,
                x.rank
            ))
        ),
        Verdict::Error => {
            let in_step = error_step(pairs);
            let Some(p) = in_step.first().copied() else {
                return format!("DIVERGENCE: {} tensors out of tolerance", c.error);
            };
            let told = story(&in_step);
            // The first call with other arguments, where it comes before what is told (a
            // norm's `eps` whose difference atol forgives, ahead of the op where it shows).
            let hint = args_note(in_step.iter().copied().filter(|q| {
                q.findings
                    .get(FindingKind::OtherArgs, None)
                    .is_some_and(|a| told.is_none_or(|(_, x)| a.causal_key() < x.causal_key()))
            }));
            let line = match told {
                Some((FindingKind::FirstNonfinite, x)) => format!(
                    "DIVERGENCE: NaN/Inf first produced by {}",
                    x.nonfinite_producer()
                ),
                Some((FindingKind::NearTie, x)) => format!(
                    "DIVERGENCE from a near tie: {} {} takes a decision from inputs within \
                     tolerance and decides otherwise ({}): rounding at a boundary (a \
                     maximum among nearly equal scores, a top-k, a threshold), not a faulty \
                     kernel; what follows takes other paths",
                    x.named(),
                    x.place(),
                    x.tensor
                ),
                Some((FindingKind::RandomDraw, x)) => {
                    let active = OpKey::parse(&x.op).randomness() == Randomness::WhenDropoutActive;
                    let what = match &x.draw {
                        Some(on) => format!("a different random draw ({on}), not a faulty kernel"),
                        None if active => "a different random draw if its dropout is active \
                                           (else a faulty kernel)"
                            .into(),
                        None => "a different random draw, not a faulty kernel".into(),
                    };
                    format!(
                        "DIVERGENCE from random numbers: {} {} gets agreeing inputs and returns \
                         different outputs: {what}; check config-check's random category \
                         (seeds, generator states) and deterministic algorithms",
                        x.named(),
                        x.place()
                    )
                }
                Some((FindingKind::ExternalSource, e)) => entry_headline(e, pairs),
                // The other kind a story tells: a locally divergent op.
                Some((_, x)) => match region_of(pairs, x) {
                    Some(r) => format!(
                        "DIVERGENCE: code paths differ inside {} ({}{}) and its outputs \
                         diverge: first divergent region, reported under {} {}",
                        module_name(&r.module),
                        calls(r),
                        how(r),
                        x.named(),
                        x.place()
                    ),
                    // A module record whose own call is all that was captured of it: the
                    // divergence is inside the module, not in one op (`analyze/local.rs`).
                    None => match module_path(&x.op) {
                        Some(m) => format!(
                            "DIVERGENCE inside module {}: first divergent module call {} {}{}; \
                             its inputs agree and its outputs differ (its parameters or the \
                             ops it calls, not captured at this level)",
                            module_name(m),
                            x.op,
                            x.place(),
                            x.cause()
                        ),
                        None => format!(
                            "DIVERGENCE: first divergent op {} {}{}",
                            x.named(),
                            x.place(),
                            x.cause()
                        ),
                    },
                },
                None => {
                    let first = p.findings.first(FindingKind::EarliestFailing);
                    format!(
                        "DIVERGENCE in {}/{}: no single op is locally divergent (accumulated drift); \
                         earliest failing op {}",
                        p.step,
                        p.rank,
                        first.map_or("?".to_string(), Finding::named)
                    )
                }
            };
            line + &micro_note(pairs) + &hint + &scale_note(pairs) + &skipped_note(pairs)
        }
    }
}

/// A module path as the headline names it.
fn module_name(m: &str) -> String {
    if m.is_empty() {
        "the top level".into()
    } else {
        format!("`{m}`")
    }
}

/// How many calls a region holds on each side, for a headline: API calls, or module calls
/// where the dump has module records only (a region under an enclosing module's record).
/// Where both sides made the same module calls, their records differ in the tensors they
/// hold (an attention mask one attention backend is handed and the other is not): "1 vs 1
/// module calls" would read as no difference, so the modules are named instead.
fn calls(r: &Region) -> String {
    let mut keys = r.calls.bench.iter().chain(&r.calls.cmp).peekable();
    let modules = keys.peek().is_some() && keys.all(|k| OpKey::parse(k).kind() != OpKind::Api);
    if modules && r.calls.bench == r.calls.cmp {
        let names: Vec<String> = r
            .calls
            .bench
            .iter()
            .map(|k| format!("`{}`", module_path(k).unwrap_or(k)))
            .collect();
        let (lead, verb) = if names.len() == 1 {
            ("the call of", "holds")
        } else {
            ("the calls of", "hold")
        };
        return format!(
            "{lead} {} {verb} other tensors on each side",
            names.join(", ")
        );
    }
    format!(
        "{} vs {} {} calls",
        r.calls.bench.len(),
        r.calls.cmp.len(),
        if modules { "module" } else { "API" }
    )
}

/// How a region was compared, for a headline.
fn how(r: &Region) -> String {
    match &r.rule {
        Some(rule) => format!(", mapped as {rule}"),
        None => ", compared at the module's boundary".into(),
    }
}

/// The region a finding is reported under, if any.
fn region_of<'a>(pairs: &'a [PairSummary], x: &Finding) -> Option<&'a Region> {
    pairs
        .iter()
        .filter(|p| p.step == x.step && p.rank == x.rank)
        .flat_map(|p| &p.regions)
        .find(|r| r.at.seq == x.seq && r.at.key.as_str() == x.op)
}

/// A loss scale found between the runs (`loss_scale`): said, since every gradient was
/// compared divided by it.
fn scale_note(pairs: &[PairSummary]) -> String {
    let scaled: Vec<&PairSummary> = pairs.iter().filter(|p| p.loss_scale.is_some()).collect();
    let Some(first) = scaled.first() else {
        return String::new();
    };
    let s = first
        .loss_scale
        .as_ref()
        .map(|s| s.brief())
        .unwrap_or_default();
    let all = scaled
        .iter()
        .all(|p| p.loss_scale.as_ref().map(|s| s.brief()) == Some(s.clone()));
    let where_ = if scaled.len() == pairs.len() && all {
        String::new()
    } else {
        format!(" in {} of {} step/rank pairs", scaled.len(), pairs.len())
    };
    format!("; the cmp run's gradients are {s} the bench's (a loss scale{where_}): compared divided by it")
}

/// The first step/rank pair whose runs differ in micro-batching (else, the first whose runs
/// read data of other sizes): said first, since their calls pair only in part, or on other
/// data, and the rest of the headline reads on that.
fn micro_note(pairs: &[PairSummary]) -> String {
    let micro = pairs.iter().find_map(|p| {
        Some(format!(
            "; {} in {}/{}: gradient accumulation differs, so the calls pair only in part \
             (compare runs with the same micro-batch size)",
            p.micro_batches.as_ref()?.brief(),
            p.step,
            p.rank
        ))
    });
    let sizes = || {
        pairs.iter().find_map(|p| {
            Some(format!(
                "; {} in {}/{}: their batch size, sequence length or data differ, so every \
                 call reads other data (compare runs of the same configuration; config-check: \
                 hyperparameters, data)",
                p.input_sizes.as_ref()?.brief(),
                p.step,
                p.rank
            ))
        })
    };
    micro.or_else(sizes).unwrap_or_default()
}

/// The first step/rank pair a run's loss scaler skipped, if any: its NaN/Inf and its missing
/// update are the scaler's.
fn skipped_note(pairs: &[PairSummary]) -> String {
    let Some(p) = pairs.iter().find(|p| p.scaler_skipped.is_some()) else {
        return String::new();
    };
    let who = match p.scaler_skipped.as_deref() {
        Some("both") => "both runs' loss scalers".to_string(),
        Some(side) => format!("the {side} run's loss scaler"),
        None => String::new(),
    };
    format!(
        "; {who} skipped {}/{} (gradients overflowed under the loss scale)",
        p.step, p.rank
    )
}

/// The findings over the run: the earliest of each kind and phase over every pair; where
/// the warnings begin only where no tensor of any pair is out of tolerance.
fn run_findings(run: &CompareRun, pairs: &[PairSummary]) -> RunFindings {
    let all = Findings::earliest(run.units.iter().map(|u| &u.findings));
    let errors = pairs.iter().any(|p| p.errors > 0);
    RunFindings(all.without(|f| errors && f.kind == FindingKind::FirstWarning))
}

/// Where no op is named (a pass, a warning, accumulated drift): the first op called with
/// different non-tensor arguments, if any, as a hint.
fn args_note<'a>(pairs: impl IntoIterator<Item = &'a PairSummary>) -> String {
    match earliest(
        pairs
            .into_iter()
            .filter_map(|p| p.findings.get(FindingKind::OtherArgs, None)),
    ) {
        Some(x) => format!(
            "; {} ({}/{}) was called with different arguments ({})",
            x.op,
            x.step,
            x.rank,
            x.args_brief()
        ),
        None => String::new(),
    }
}

/// What a passing headline adds when code paths differ: where, and how it was compared.
fn regions_note(pairs: &[PairSummary]) -> String {
    // Forward regions of the first pair that has any (ranks run the same program; the
    // backward of each is compared with it).
    let Some(p) = pairs.iter().find(|p| !p.regions.is_empty()) else {
        return String::new();
    };
    let fwd: Vec<&Region> = p
        .regions
        .iter()
        .filter(|r| r.direction == Direction::Forward)
        .collect();
    let regions = if fwd.is_empty() {
        p.regions.iter().collect()
    } else {
        fwd
    };
    let mut parts: Vec<String> = Vec::new();
    for r in regions.iter().take(3) {
        parts.push(format!(
            "inside {} ({}{})",
            module_name(&r.module),
            calls(r),
            how(r)
        ));
    }
    if regions.len() > 3 {
        parts.push(format!("{} more", regions.len() - 3));
    }
    format!(
        "; code paths differ in {}/{} {}; their outputs agree within tolerance",
        p.step,
        p.rank,
        parts.join(", ")
    )
}

/// The ops with the worst verdicts and errors, for people who start reading at the top:
/// the worst of every unit's worst ops (ties in unit, then op order).
fn worst_ops(run: &CompareRun, k: usize) -> Vec<WorstOp> {
    let mut v: Vec<(usize, &WorstCandidate)> = run
        .units
        .iter()
        .enumerate()
        .flat_map(|(ui, u)| u.worst.iter().map(move |w| (ui, w)))
        .collect();
    v.sort_by(|(ua, a), (ub, b)| {
        WorstCandidate::order(a, b).then((ua, a.op.seq).cmp(&(ub, b.op.seq)))
    });
    v.into_iter().take(k).map(|(_, w)| w.op.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::{calls, thousands};
    use crate::compare::{MatchedBy, OpInfo, Region, Sides};
    use crate::op_key::{Direction, OpKey};

    fn region(bench: &[&str], cmp: &[&str]) -> Region {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect();
        Region {
            module: "model".into(),
            direction: Direction::Forward,
            by: MatchedBy::Module,
            rule: None,
            calls: Sides::new(keys(bench), keys(cmp)),
            at: OpInfo {
                index: 0,
                seq: 0,
                key: OpKey::parse(cmp[0]),
                direction: Direction::Forward,
                stack: None,
                module: None,
            },
            boundary: 2,
        }
    }

    #[test]
    fn a_region_of_the_same_module_calls_names_them() {
        let layer = "Module.model.layers.0.LlamaDecoderLayer.forward.0";
        assert_eq!(
            calls(&region(&[layer], &[layer])),
            "the call of `model.layers.0` holds other tensors on each side"
        );
        let other = "Module.model.layers.1.LlamaDecoderLayer.forward.0";
        assert_eq!(
            calls(&region(&[layer, other], &[layer, other])),
            "the calls of `model.layers.0`, `model.layers.1` hold other tensors on each side"
        );
        // Other calls, or API calls, are counted as before.
        assert_eq!(
            calls(&region(&[layer, other], &[layer])),
            "2 vs 1 module calls"
        );
        let api = "Functional.silu.0.forward";
        assert_eq!(calls(&region(&[api], &[api])), "1 vs 1 API calls");
    }

    #[test]
    fn counts_are_written_with_thousands_separators() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (2501, "2,501"),
            (1234567, "1,234,567"),
        ];
        for (n, s) in cases {
            assert_eq!(thousands(n), s);
        }
    }
}
