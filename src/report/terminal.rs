//! The short human summary printed on stdout.

use super::compare_findings;
use crate::op_key::Direction;
use crate::scan::ScanSummary;
use crate::schema::summary::{Finding, Found, RunVerdict, Summary};
use crate::vocab::FindingKind;

/// A finding: title, op (and the module it ran in), explanation, up to 8 lines of
/// evidence, the innermost frame.
fn show(out: &mut String, title: &str, f: &Finding) {
    *out += &format!(
        "{title}: {} ({}/{}, seq {})\n    {}\n",
        f.named(),
        f.step,
        f.rank,
        f.seq,
        f.explanation
    );
    for e in f.evidence.iter().take(8) {
        *out += &format!("      {e}\n");
    }
    if let Some(top) = f.stack.last() {
        *out += &format!("    at {top}\n");
    }
}

/// The short human summary of a scan.
pub fn scan_terminal_summary(s: &ScanSummary) -> String {
    let mut out = format!("{}\n", s.headline);
    let c = &s.counts;
    out += &format!(
        "  {} tensors in {} ops ({} step/rank folders): {} with NaN/Inf, {} -inf only, {} at overflow risk, {} underflowed; {} step/rank folders skipped by the loss scaler\n",
        c.tensors, c.ops, c.units, c.nonfinite, c.neg_inf_only, c.overflow_risk, c.underflow, c.loss_scaler_skipped_steps
    );
    if c.nonfinite_from_leftover > 0 {
        out += &format!(
            "  {} more with NaN/Inf computed from leftover bytes\n",
            c.nonfinite_from_leftover
        );
    }
    if c.nonfinite_scaler_skipped > 0 {
        out += &format!(
            "  {} more gradients with NaN/Inf in steps the loss scaler skipped\n",
            c.nonfinite_scaler_skipped
        );
    }
    let list = [
        (
            "  NaN/Inf enters from outside (forward)",
            &s.external_nonfinite.forward,
        ),
        (
            "  first NaN/Inf producer (forward)",
            &s.first_nonfinite.forward,
        ),
        (
            "  first NaN/Inf producer (backward)",
            &s.first_nonfinite.backward,
        ),
        (
            "  NaN/Inf enters from outside (backward)",
            &s.external_nonfinite.backward,
        ),
    ];
    for (title, f) in list {
        if let Some(f) = f {
            show(&mut out, title, f);
        }
    }
    if let Some(f) = &s.leftover_nonfinite {
        show(&mut out, "  first NaN/Inf computed from leftover bytes", f);
    }
    if let Some(f) = s
        .units
        .iter()
        .find_map(|u| u.findings.overflow_risk.first())
    {
        out += &format!("  first overflow risk: {} ({})\n", f.op, f.reason);
    }
    for w in s.warnings.iter().take(5) {
        out += &format!("  note: {w}\n");
    }
    for (k, v) in &s.outputs {
        out += &format!("  {k}: {v}\n");
    }
    out
}

/// The short human summary printed on stdout.
pub fn terminal_summary(s: &Summary) -> String {
    let mut out = String::new();
    let c = &s.counts;
    out += &format!("{}\n", s.headline);
    out += &format!(
        "  {} tensors in {} ops ({} step/rank pairs): {} pass, {} warning, {} error; unmatched: {} bench-only, {} cmp-only\n",
        c.tensors, c.ops, c.pairs, c.pass, c.warning, c.error, c.unmatched_bench, c.unmatched_cmp
    );
    if let Some(c) = &s.calibration {
        let what = if c.by == "file" {
            "calibration file"
        } else {
            "reference run"
        };
        out += &format!(
            "  judged against the {what} {} (k = {}): {} tensors, {} by the dtype tolerances\n",
            super::printable(&c.path),
            c.k,
            c.calibrated,
            c.fallback
        );
    }
    // In causal order (step, execution order, rank): a later step's consequences never
    // come before an earlier step's cause. At the same place, in the order listed.
    for l in compare_findings(s, false) {
        show(&mut out, &format!("  {}", l.title), &l.finding);
    }
    let forward = Some(Direction::Forward);
    if s.verdict == RunVerdict::Error
        && s.findings
            .get(FindingKind::FirstDivergent, forward)
            .is_none()
    {
        if let Some(f) = s.findings.get(FindingKind::EarliestFailing, forward) {
            let title = Found::new(FindingKind::EarliestFailing, forward, f.clone()).title();
            out += &format!("  {title}: {} ({})\n", f.named(), f.reason);
        }
    }
    for w in s.warnings.iter().take(5) {
        out += &format!("  note: {w}\n");
    }
    if let Some(r) = &s.recapture {
        let path = super::printable(&r.path);
        let ops: String = r
            .ops
            .iter()
            .map(|op| format!(" --op {}", super::printable(op)))
            .collect();
        out += &format!(
            "  recapture: {path}: {}; capture both runs again with PROBE_CONFIG={path} (tensor mode, {}/{} only), then probe replay -b NEW_BENCH -c NEW_CMP{ops} -o DIR\n",
            super::printable(&r.reason),
            super::printable(&r.step),
            super::printable(&r.rank),
        );
    }
    for (k, v) in &s.outputs {
        out += &format!("  {k}: {v}\n");
    }
    out
}
