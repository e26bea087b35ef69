//! `<stem>.junit.xml`: the run as JUnit XML, the test-result format CI systems show
//! (GitHub Actions through a reporter action, GitLab's `artifacts:reports:junit`, Jenkins'
//! `junit` step, Buildkite's test analytics). One test case per step/rank pair of a compare
//! or scan (per category of a config-check), failing where the gate fails; a failure holds
//! the headline, the culprit and its evidence lines (docs/ci.md).
//!
//! The XML is written by hand: a handful of elements, every input-derived string escaped
//! ([`xml_escape`]: markup characters as entities, the characters XML 1.0 forbids as
//! `\u{..}`). No timestamps, hosts or durations: the same run gives the same bytes.

use super::{Document, ReportWriter};
use crate::atomic;
use crate::error::{ProbeError, Result};
use crate::scan::ScanSummary;
use crate::schema::summary::{Finding, Found, PairSummary, Summary};
use crate::vocab::{FindingKind, Verdict};
use std::fmt::Write as _;
use std::path::Path;

/// How a test case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Within the gate.
    Pass,
    /// The gate fails on it (`<failure>`): a divergence at or above `--fail-on`.
    Failure(Failed),
    /// It could not be judged in full (`<error>`): an incomplete comparison, nothing
    /// comparable.
    Error(Failed),
    /// Not run (`<skipped>`): a config-check category one side lacks.
    Skipped(String),
}

/// What a failed or errored case says.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    /// The `type` attribute (`error`, `warning`, `incomplete`, ...).
    pub kind: String,
    /// The `message` attribute: one line.
    pub message: String,
    /// The element's text: the culprit and its evidence.
    pub text: String,
}

/// One test case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Its name (`step0/rank1`, `packages`).
    pub name: String,
    /// Its class name (`probe.compare`).
    pub classname: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Its `<system-out>` (empty: none): the counts of a passing case.
    pub out: String,
}

/// One test suite: the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    /// Its name (`probe compare`).
    pub name: String,
    /// `<properties>`: verdict, exit code, headline, inputs.
    pub properties: Vec<(String, String)>,
    /// The cases.
    pub cases: Vec<Case>,
    /// The suite's `<system-out>`: the headline.
    pub out: String,
}

/// `s` for XML 1.0 text or a quoted attribute: `&`, `<`, `>`, `"`, `'` as entities; tab,
/// newline and carriage return as character references in attributes (kept in text); every
/// other control character (forbidden in XML 1.0, or discouraged: C1) and U+FFFE/U+FFFF as
/// `\u{..}`, so a hostile op key (ESC, NUL) can neither break the document nor reach a
/// terminal that shows it.
pub fn xml_escape(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' if attribute => {
                let _ = write!(out, "&#{};", c as u32);
            }
            '\t' | '\n' => out.push(c),
            c if c.is_control() || c == '\u{fffe}' || c == '\u{ffff}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

impl Suite {
    /// The suite's counts: tests, failures, errors, skipped.
    fn counts(&self) -> [usize; 4] {
        let mut n = [self.cases.len(), 0, 0, 0];
        for c in &self.cases {
            match c.outcome {
                Outcome::Pass => {}
                Outcome::Failure(_) => n[1] += 1,
                Outcome::Error(_) => n[2] += 1,
                Outcome::Skipped(_) => n[3] += 1,
            }
        }
        n
    }

    /// The JUnit XML document.
    pub fn render(&self) -> String {
        let a = |s: &str| xml_escape(s, true);
        let t = |s: &str| xml_escape(s, false);
        let [tests, failures, errors, skipped] = self.counts();
        let counts = format!(
            "tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"0\""
        );
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(x, "<testsuites name=\"{}\" {counts}>", a(&self.name));
        let _ = writeln!(x, "  <testsuite name=\"{}\" {counts}>", a(&self.name));
        x += "    <properties>\n";
        for (k, v) in &self.properties {
            let _ = writeln!(x, "      <property name=\"{}\" value=\"{}\"/>", a(k), a(v));
        }
        x += "    </properties>\n";
        for c in &self.cases {
            let _ = write!(
                x,
                "    <testcase name=\"{}\" classname=\"{}\" time=\"0\"",
                a(&c.name),
                a(&c.classname)
            );
            if c.outcome == Outcome::Pass && c.out.is_empty() {
                x += "/>\n";
                continue;
            }
            x += ">\n";
            match &c.outcome {
                Outcome::Pass => {}
                Outcome::Failure(f) | Outcome::Error(f) => {
                    let tag = match c.outcome {
                        Outcome::Failure(_) => "failure",
                        _ => "error",
                    };
                    let _ = writeln!(
                        x,
                        "      <{tag} message=\"{}\" type=\"{}\">{}</{tag}>",
                        a(&f.message),
                        a(&f.kind),
                        t(&f.text)
                    );
                }
                Outcome::Skipped(m) => {
                    let _ = writeln!(x, "      <skipped message=\"{}\"/>", a(m));
                }
            }
            if !c.out.is_empty() {
                let _ = writeln!(x, "      <system-out>{}</system-out>", t(&c.out));
            }
            x += "    </testcase>\n";
        }
        let _ = writeln!(x, "    <system-out>{}</system-out>", t(&self.out));
        x += "  </testsuite>\n</testsuites>\n";
        x
    }

    /// Makes the suite fail where the gate failed (`exit_code` not 0) though no case does:
    /// a run with nothing comparable, say. A case named `gate` carries the headline.
    pub fn gated(mut self, exit_code: u8, headline: &str, classname: &str) -> Suite {
        let fails = self
            .cases
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failure(_) | Outcome::Error(_)));
        if exit_code != 0 && !fails {
            let failed = Failed {
                kind: format!("exit {exit_code}"),
                message: headline.to_string(),
                text: headline.to_string(),
            };
            let outcome = match exit_code {
                1 => Outcome::Failure(failed),
                _ => Outcome::Error(failed),
            };
            self.cases.push(Case {
                name: "gate".into(),
                classname: classname.into(),
                outcome,
                out: String::new(),
            });
        }
        self
    }
}

/// At most this many findings, and evidence lines a finding, in a failure's text.
const FINDINGS_SHOWN: usize = 6;
const EVIDENCE_SHOWN: usize = 8;

/// A finding as a failure's text shows it: title, op (with its module), place, why,
/// evidence lines, the innermost frame of its stack.
pub(crate) fn finding_text(out: &mut String, title: &str, f: &Finding) {
    let _ = writeln!(
        out,
        "{title}: {} ({}/{}, seq {})\n  {}",
        f.named(),
        f.step,
        f.rank,
        f.seq,
        f.explanation
    );
    for e in f.evidence.iter().take(EVIDENCE_SHOWN) {
        let _ = writeln!(out, "    {e}");
    }
    if f.evidence.len() > EVIDENCE_SHOWN {
        let _ = writeln!(
            out,
            "    ... {} more lines",
            f.evidence.len() - EVIDENCE_SHOWN
        );
    }
    if let Some(top) = f.stack.last() {
        let _ = writeln!(out, "  at {top}");
    }
}

/// A pair's findings in causal order, the earliest failing ops left out where another
/// finding says more.
fn pair_findings(p: &PairSummary) -> Vec<&Found> {
    let mut found: Vec<&Found> = p.findings.iter().collect();
    found.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    if found.iter().any(|f| f.kind != FindingKind::EarliestFailing) {
        found.retain(|f| f.kind != FindingKind::EarliestFailing);
    }
    found
}

/// The worst verdict of a pair (unmatched tensors are a warning, as in the summary).
fn pair_verdict(p: &PairSummary) -> Verdict {
    if p.errors > 0 {
        Verdict::Error
    } else if p.warnings > 0 || p.unmatched > 0 {
        Verdict::Warning
    } else {
        Verdict::Pass
    }
}

/// One case of a compare's pair.
fn pair_case(s: &Summary, p: &PairSummary, incomplete: Option<&str>) -> Case {
    let verdict = pair_verdict(p);
    let counts = format!(
        "{} tensors compared: {} error, {} warning; {} unmatched ({:.1}% / {:.1}% of each side's tensors)",
        p.tensors,
        p.errors,
        p.warnings,
        p.unmatched,
        100.0 * p.unmatched_fraction.bench,
        100.0 * p.unmatched_fraction.cmp
    );
    let mut text = String::new();
    let culprit = crate::verdict::culprit(s);
    let holds_culprit = culprit.is_some_and(|c| c.step == p.step && c.rank == p.rank);
    if holds_culprit {
        let _ = writeln!(text, "{}", s.headline);
    }
    let _ = writeln!(text, "{counts}");
    let found = pair_findings(p);
    for f in found.iter().take(FINDINGS_SHOWN) {
        finding_text(&mut text, &f.title(), &f.finding);
    }
    let outcome = if s.fail_on.fails(verdict) {
        let message = match (holds_culprit, found.first()) {
            (true, _) => s.headline.clone(),
            (false, Some(f)) => format!("{}: {}", f.title(), f.finding.named()),
            (false, None) => counts.clone(),
        };
        Outcome::Failure(Failed {
            kind: verdict.name().into(),
            message,
            text,
        })
    } else if let Some(why) = incomplete {
        Outcome::Error(Failed {
            kind: "incomplete".into(),
            message: why.to_string(),
            text,
        })
    } else {
        Outcome::Pass
    };
    Case {
        name: format!("{}/{}", p.step, p.rank),
        classname: "probe.compare".into(),
        outcome,
        out: counts,
    }
}

/// A compare's cases: one per step/rank pair (those not compared at all included), failing
/// where the gate fails.
pub(crate) fn compare_cases(s: &Summary) -> Vec<Case> {
    let mut cases = Vec::new();
    for p in &s.pairs {
        let fraction = p.unmatched_fraction.bench.max(p.unmatched_fraction.cmp);
        let cut = s
            .incomplete_units
            .iter()
            .find(|u| u.step == p.step && u.rank == p.rank)
            .map(|u| format!("{} lacks something: {}", u.side, u.reason));
        let over = (fraction > s.max_unmatched).then(|| {
            format!(
                "{:.1}% of a side's tensors have no counterpart (at most {:.1}% allowed, --max-unmatched)",
                100.0 * fraction,
                100.0 * s.max_unmatched
            )
        });
        cases.push(pair_case(s, p, cut.or(over).as_deref()));
    }
    for u in s.incomplete_units.iter().filter(|u| !u.compared) {
        cases.push(Case {
            name: format!("{}/{}", u.step, u.rank),
            classname: "probe.compare".into(),
            outcome: Outcome::Error(Failed {
                kind: "incomplete".into(),
                message: format!("not compared: {} lacks it ({})", u.side, u.reason),
                text: u.reason.clone(),
            }),
            out: String::new(),
        });
    }
    cases
}

/// A scan's cases: one per step/rank folder, failing where the gate fails.
pub(crate) fn scan_cases(s: &ScanSummary) -> Vec<Case> {
    s.units
        .iter()
        .map(|u| {
            let f = &u.findings;
            let mut listed: Vec<(&str, &Finding)> = [
                (
                    "NaN/Inf enters from outside (forward)",
                    &f.external_nonfinite.forward,
                ),
                (
                    "first NaN/Inf producer (forward)",
                    &f.first_nonfinite.forward,
                ),
                (
                    "first NaN/Inf producer (backward)",
                    &f.first_nonfinite.backward,
                ),
                (
                    "NaN/Inf enters from outside (backward)",
                    &f.external_nonfinite.backward,
                ),
                (
                    "first NaN/Inf computed from leftover bytes",
                    &f.leftover_nonfinite,
                ),
            ]
            .into_iter()
            .filter_map(|(t, x)| x.as_ref().map(|x| (t, x)))
            .collect();
            let errors = u.nonfinite > 0 || !listed.is_empty();
            listed.extend(f.overflow_risk.iter().take(3).map(|x| ("overflow risk", x)));
            listed.extend(f.underflow.iter().take(3).map(|x| ("underflow", x)));
            let verdict = if errors {
                Verdict::Error
            } else if listed.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Warning
            };
            let counts = format!(
                "{} tensors scanned: {} with NaN/Inf",
                u.tensors, u.nonfinite
            );
            let mut text = format!("{counts}\n");
            for (title, x) in listed.iter().take(FINDINGS_SHOWN) {
                finding_text(&mut text, title, x);
            }
            let outcome = if s.fail_on.fails(verdict) {
                let message = match listed.first() {
                    Some((title, x)) => format!("{title}: {} ({})", x.named(), x.reason),
                    None => counts.clone(),
                };
                Outcome::Failure(Failed {
                    kind: verdict.name().into(),
                    message,
                    text,
                })
            } else {
                Outcome::Pass
            };
            Case {
                name: format!("{}/{}", u.step, u.rank),
                classname: "probe.scan".into(),
                outcome,
                out: counts,
            }
        })
        .collect()
}

/// The summary fields every kind of run has (`summary.json`): verdict, exit code,
/// headline, the reports written.
#[derive(Debug, Clone, Default)]
pub(crate) struct Head {
    /// `pass`, `warning`, `error`, `incomplete`.
    pub verdict: String,
    /// The exit status.
    pub exit_code: u8,
    /// The headline.
    pub headline: String,
    /// Report files by format.
    pub outputs: std::collections::BTreeMap<String, String>,
}

impl Head {
    /// Read from a document's `summary.json`.
    pub(crate) fn of(doc: &dyn Document, path: &Path) -> Result<Head> {
        let bad = |msg: String| ProbeError::Output {
            path: path.to_path_buf(),
            msg,
        };
        let text = doc.summary_json().map_err(bad)?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let exit_code = v.get("exit_code").and_then(|x| x.as_u64()).unwrap_or(0);
        let outputs = v
            .get("outputs")
            .and_then(|o| o.as_object())
            .map(|o| {
                o.iter()
                    .filter_map(|(k, p)| Some((k.clone(), p.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Head {
            verdict: s("verdict"),
            exit_code: u8::try_from(exit_code).unwrap_or(u8::MAX),
            headline: s("headline"),
            outputs,
        })
    }
}

/// `<stem>.junit.xml`.
pub struct JunitReport;

impl ReportWriter for JunitReport {
    fn format(&self) -> &'static str {
        "junit"
    }
    fn file_name(&self, stem: &str) -> String {
        format!("{stem}.junit.xml")
    }
    fn write(&self, doc: &dyn Document, path: &Path) -> Result<()> {
        let head = Head::of(doc, path)?;
        let classname = format!("probe.{}", doc.stem());
        // A kind of run without cases of its own (a monitor's) is one case: the run.
        let cases = doc.cases().unwrap_or_else(|| {
            let failed = Failed {
                kind: head.verdict.clone(),
                message: head.headline.clone(),
                text: head.headline.clone(),
            };
            let outcome = match head.exit_code {
                0 => Outcome::Pass,
                1 => Outcome::Failure(failed),
                _ => Outcome::Error(failed),
            };
            vec![Case {
                name: doc.stem().into(),
                classname: classname.clone(),
                outcome,
                out: String::new(),
            }]
        });
        let overview = doc.overview()?;
        let mut properties = vec![
            ("verdict".to_string(), head.verdict.clone()),
            ("exit_code".to_string(), head.exit_code.to_string()),
            ("headline".to_string(), head.headline.clone()),
        ];
        properties.extend(overview.facts.into_iter().filter(|(k, _)| k != "exit code"));
        let suite = Suite {
            name: format!("probe {}", doc.stem()),
            properties,
            cases,
            out: head.headline.clone(),
        }
        .gated(head.exit_code, &head.headline, &classname);
        atomic::write_bytes(path, suite.render().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_xml_well_formed() {
        assert_eq!(
            xml_escape("a<b>&\"c'\u{1b}[31m\0\n", true),
            "a&lt;b&gt;&amp;&quot;c&apos;\\u{1b}[31m\\u{0}&#10;"
        );
        assert_eq!(
            xml_escape("x\ny\u{7}\u{ffff}", false),
            "x\ny\\u{7}\\u{ffff}"
        );
    }

    #[test]
    fn a_failing_exit_without_a_failing_case_adds_the_gate_case() {
        let suite = Suite {
            name: "probe compare".into(),
            properties: vec![],
            cases: vec![],
            out: String::new(),
        };
        let gated = suite
            .clone()
            .gated(3, "nothing comparable", "probe.compare");
        assert_eq!(gated.cases.len(), 1);
        assert!(matches!(gated.cases[0].outcome, Outcome::Error(_)));
        assert_eq!(suite.clone().gated(0, "", "x").cases.len(), 0);
        let xml = gated.render();
        assert!(xml.contains("errors=\"1\""), "{xml}");
    }
}
