//! `--steps` and `--ranks`: only the selected step/rank folders are read, compared and
//! reported; folders outside the selection are not "missing"; the selected pairs come out
//! exactly as in a compare of everything.

use crate::common;
use common::*;
use serde_json::Value;
use std::path::Path;

fn pairs(s: &Value) -> Vec<(String, String)> {
    s["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let f = |k: &str| p[k].as_str().unwrap().to_string();
            (f("step"), f("rank"))
        })
        .collect()
}

/// A pair's findings as a compare that did not see `step` would have them: each finding
/// that is a consequence of `step`'s divergence (`consequence_of`) without that mark and
/// without the note its explanation ends with. Counts how many it unmarked.
fn unmark(v: &mut Value, step: &str, n: &mut usize) {
    match v {
        Value::Object(o) => {
            if o.get("consequence_of").and_then(Value::as_str) == Some(step) {
                o.remove("consequence_of");
                let note = format!(" (note: {step} diverged first");
                if let Some(Value::String(e)) = o.get_mut("explanation") {
                    let at = e.rfind(&note).expect("the consequence's note");
                    e.truncate(at);
                }
                *n += 1;
            }
            o.values_mut().for_each(|x| unmark(x, step, n));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| unmark(x, step, n)),
        _ => {}
    }
}

fn compare_into(dir: &Path, out: &str, extra: &[&str]) -> (Out, Value) {
    let mut a = vec!["-q", "--format", "json"];
    a.extend_from_slice(extra);
    let run = compare_to(dir, out, &a);
    let text = std::fs::read_to_string(dir.join(out).join("summary.json")).expect("summary.json");
    (run, serde_json::from_str(&text).unwrap())
}

#[test]
fn selected_pairs_equal_those_of_the_whole_compare() {
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--ranks", "4", "--steps", "3", "--blocks", "2", "--noise", "1e-3",
        ],
    );
    let (all_run, all) = compare_into(t.path(), "all", &[]);
    let (sel_run, sel) = compare_into(t.path(), "sel", &["--steps", "1-2", "--ranks", "0,3"]);
    assert_eq!(all_run.code, sel_run.code, "{}", sel_run.stderr);
    let want: Vec<(String, String)> = ["step1", "step2"]
        .iter()
        .flat_map(|s| ["rank0", "rank3"].map(|r| (s.to_string(), r.to_string())))
        .collect();
    assert_eq!(pairs(&sel), want);
    assert_eq!(pairs(&all).len(), 12);
    // Nothing outside the selection is reported missing.
    assert_eq!(sel["incomplete_units"], Value::Array(vec![]));
    assert!(
        sel["warnings"].as_array().unwrap().is_empty(),
        "{}",
        sel["warnings"]
    );
    // Each selected pair is the same as in the full compare (fp32 runs: no precision floor
    // carried from the unselected step 0), but for the step whose divergence the later
    // steps follow: the full compare saw step 0 diverge on every rank (noise everywhere) and
    // tells every later step's findings as its consequences; the selection's first step is
    // step 1, whose findings are its own, and step 2's follow it.
    for p in sel["pairs"].as_array().unwrap() {
        let mut p = p.clone();
        let mut unmarked = 0;
        unmark(&mut p["findings"], "step1", &mut unmarked);
        assert_eq!(unmarked > 0, p["step"] == "step2", "{p:#}");
        let mut same = all["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["step"] == p["step"] && q["rank"] == p["rank"])
            .unwrap()
            .clone();
        let mut unmarked = 0;
        unmark(&mut same["findings"], "step0", &mut unmarked);
        assert!(unmarked > 0, "{same:#}");
        assert_eq!(p, same);
    }
    let tensors = |s: &Value| s["counts"]["tensors"].as_u64().unwrap();
    assert_eq!(tensors(&sel) * 3, tensors(&all));
}

#[test]
fn a_fault_on_one_rank_is_found_when_only_that_rank_is_selected() {
    let t = tempfile::tempdir().unwrap();
    let fault = [
        "--ranks",
        "4",
        "--perturb-rank",
        "3",
        "--perturb-op",
        "Functional.gelu.1",
    ];
    synth(t.path(), &fault);
    let (run, s) = compare_into(t.path(), "r3", &["--ranks", "3"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(pairs(&s), vec![("step0".into(), "rank3".into())]);
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
}

#[test]
fn scan_reads_only_the_selection() {
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &["--ranks", "2", "--steps", "2", "--nan", "Functional.gelu.1"],
    );
    let cmp = t.path().join("cmp");
    let out = t.path().join("scan");
    let o = scan(
        &cmp,
        &out,
        &["-q", "--format", "json", "--steps", "1", "--ranks", "1"],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let units: Vec<(String, String)> = s["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let f = |k: &str| u[k].as_str().unwrap().to_string();
            (f("step"), f("rank"))
        })
        .collect();
    assert_eq!(units, vec![("step1".into(), "rank1".into())]);
}

#[test]
fn a_selection_of_nothing_or_no_number_is_a_usage_error() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--ranks", "2"]);
    let o = compare(t.path(), &["-q", "--ranks", "5-7"]);
    assert_input_error(&o, 2, "--ranks 5-7 selects none of its step/rank folders");
    assert!(o.stderr.contains("step0/rank1"), "{}", o.stderr);
    for bad in ["x", "3-1", ""] {
        let o = compare(t.path(), &["-q", "--steps", bad]);
        assert_eq!(o.code, 2, "{bad:?}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        assert!(!t.path().join("out").join("summary.json").exists());
    }
}
