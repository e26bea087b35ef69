//! `probe calibrate`: per-op tolerances learnt from clean pairs, so a CI gate needs no
//! reference run each time (calibrate once on the benchmark's device, gate every port).
//!
//! Each pair is the benchmark compared with a reference run (the same script under the
//! port's precision, or a rerun): every tensor's error, measured as a reference run's is
//! (`envelope::measure`), joins the group of tensors of its API (or module), direction and
//! slot with the call counters left out (`Functional.silu.*.forward.output.*`). A group's
//! reference error is a high quantile of its errors over every step, rank and pair; the
//! calibration file holds one `[[op]]` rule per group with it, and `probe compare --config`
//! judges each tensor a rule matches against `k` times it (at least the dtype's floor), as
//! against a reference run.
//!
//! With reruns (`--reruns`: each pair is two runs of one configuration on one device), the
//! same pass is a determinism map: an op whose inputs agree exactly (their data, or their
//! statistics in a statistics dump) while an output differs
//! is nondeterministic (atomics in `index_add_`/`scatter_add_`, split-K matmuls), and its
//! rule says so; its outputs' run-to-run noise is its reference error, so a later compare
//! never blames it for that noise, only for more than `k` times it.

use super::envelope::measure;
use super::judge::Row;
use super::measure::CompareKind;
use super::tolerance::loosest;
use super::CompareRun;
use crate::dtype::DType;
use crate::error::Result;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The errors of one group of tensors (see the module docs).
#[derive(Debug, Clone, Default)]
struct Group {
    errors: Vec<f64>,
    /// The least precise float dtype among them.
    dtype: Option<DType>,
    /// Its op's outputs differed while everything it consumed agreed exactly, in a rerun.
    nondeterministic: bool,
}

/// What the pairs showed, by group pattern.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    groups: BTreeMap<String, Group>,
    /// How many tensors were observed.
    pub tensors: usize,
}

/// The glob pattern of a tensor's group: its name with the op key's call counter and the
/// slot's index as `*`, every other character literal.
fn pattern(r: &Row) -> String {
    let key = &r.tensor.op.key;
    let (text, base) = (key.as_str(), key.base());
    let suffix = r.tensor.name.strip_prefix(text).unwrap_or("");
    let mut out = glob::Pattern::escape(base);
    for part in text[base.len()..]
        .split('.')
        .skip(1)
        .chain(suffix.split('.').skip(1))
    {
        out.push('.');
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            out.push('*');
        } else {
            out += &glob::Pattern::escape(part);
        }
    }
    out
}

impl Observations {
    /// Adds what one compared pair (`run`: the benchmark against a reference or a rerun)
    /// shows; `reruns` when its two runs share one configuration and device.
    pub fn observe(&mut self, run: &CompareRun, reruns: bool) -> Result<()> {
        run.tables.visit_rows(|_, rows| {
            for op in rows.chunk_by(|a, b| a.tensor.op.index == b.tensor.op.index) {
                // Equal data, or equal statistics in a statistics dump.
                let agrees = op
                    .iter()
                    .filter(|r| r.consumed())
                    .all(|r| r.equality().is_some());
                for r in op {
                    let kind = r.tensor.kind;
                    if !matches!(kind, CompareKind::Tensor | CompareKind::Statistics) {
                        continue;
                    }
                    let err = measure(kind, r.judgement.err, r.judgement.raw_err);
                    if !err.is_finite() {
                        continue;
                    }
                    self.tensors += 1;
                    let g = self.groups.entry(pattern(r)).or_default();
                    g.errors.push(err);
                    let s = &r.tensor.sides;
                    for d in [s.bench.dtype.known(), s.cmp.dtype.known()]
                        .into_iter()
                        .flatten()
                        .filter(|d| d.is_float())
                    {
                        g.dtype = Some(g.dtype.map_or(d, |x| loosest(x, d)));
                    }
                    if reruns && !r.consumed() && err > 0.0 && agrees {
                        g.nondeterministic = true;
                    }
                }
            }
            Ok(())
        })
    }

    /// The calibration file: a header, `[calibration]` with `k`, and one rule per group
    /// with the `quantile` of its errors as its reference error. `source` lines say where
    /// it came from.
    pub fn toml(&self, k: f64, quantile: f64, source: &[String]) -> String {
        let mut out = String::from(
            "# probe calibrate: per-op reference errors learnt from clean pairs\n\
             # (docs/compare.md, \"Drift or defect\"). Judge a port with it:\n\
             #   probe compare -b BENCH -c CMP --config THIS_FILE\n\
             # A tensor a rule matches passes within k times the rule's reference error (at\n\
             # least its dtype's floor); one no rule matches is judged by the tolerances.\n\n",
        );
        let quoted: Vec<String> = source.iter().map(|s| toml_string(s)).collect();
        let _ = write!(
            out,
            "[calibration]\nk = {}\nquantile = {}\nsource = [{}]\n",
            float(k),
            float(quantile),
            quoted.join(", ")
        );
        for (p, g) in &self.groups {
            let mut errs = g.errors.clone();
            errs.sort_by(f64::total_cmp);
            let at = ((quantile * errs.len() as f64).ceil() as usize).clamp(1, errs.len()) - 1;
            let dtype = g.dtype.map_or("no float", |d| d.name());
            let _ = write!(
                out,
                "\n[[op]]  # {} tensors, {dtype}, largest error {:.3e}\npattern = {}\nreference = {:e}\n",
                errs.len(),
                errs[errs.len() - 1],
                toml_string(p),
                errs[at]
            );
            if g.nondeterministic {
                out += "nondeterministic = true\n";
            }
        }
        out
    }

    /// The nondeterministic groups with their largest run-to-run error, for a person.
    pub fn nondeterministic(&self) -> Vec<(String, f64)> {
        self.groups
            .iter()
            .filter(|(_, g)| g.nondeterministic)
            .map(|(p, g)| (p.clone(), g.errors.iter().copied().fold(0.0, f64::max)))
            .collect()
    }

    /// How many groups (rules).
    pub fn groups(&self) -> usize {
        self.groups.len()
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as TOML reads it back (always with a point or an exponent).
fn float(v: f64) -> String {
    let s = format!("{v}");
    if s.contains(['.', 'e', 'E']) || !v.is_finite() {
        s
    } else {
        s + ".0"
    }
}
