//! The short human summary printed on stdout.

use crate::compare::Verdict;
use crate::schema::summary::{Finding, Summary};

/// The short human summary printed on stdout.
pub fn terminal_summary(s: &Summary) -> String {
    let mut out = String::new();
    let c = &s.counts;
    out += &format!("{}\n", s.headline);
    out += &format!(
        "  {} tensors in {} ops ({} step/rank pairs): {} pass, {} warning, {} error; unmatched: {} bench-only, {} cmp-only\n",
        c.tensors, c.ops, c.pairs, c.pass, c.warning, c.error, c.unmatched_bench, c.unmatched_cmp
    );
    let show = |out: &mut String, title: &str, f: &Finding| {
        *out += &format!(
            "{title}: {} ({}/{}, seq {})\n    {}\n",
            f.op, f.step, f.rank, f.seq, f.explanation
        );
        for e in f.evidence.iter().take(8) {
            *out += &format!("      {e}\n");
        }
        if let Some(top) = f.stack.last() {
            *out += &format!("    at {top}\n");
        }
    };
    if let Some(f) = &s.external_source.forward {
        show(&mut out, "  divergence enters from outside (forward)", f);
    }
    if let Some(f) = &s.first_divergent.forward {
        show(&mut out, "  first divergent op (forward)", f);
    }
    if let Some(f) = &s.first_divergent.backward {
        show(&mut out, "  first divergent op (backward)", f);
    }
    if let Some(f) = &s.first_nonfinite {
        show(&mut out, "  first NaN/Inf producer", f);
    }
    if s.verdict == Verdict::Error && s.first_divergent.forward.is_none() {
        if let Some(f) = &s.earliest_failing.forward {
            out += &format!("  earliest failing op (forward): {} ({})\n", f.op, f.reason);
        }
    }
    for w in s.warnings.iter().take(5) {
        out += &format!("  note: {w}\n");
    }
    for (k, v) in &s.outputs {
        out += &format!("  {k}: {v}\n");
    }
    out
}
