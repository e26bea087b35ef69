//! Issue 47, items 7 and 8: what a step finds after an earlier step of its rank diverged is
//! told as a consequence of that divergence, never as a first divergent op; a module's
//! record is no culprit on the grounds of inputs that agree (it holds no submodule
//! weights); every finding names the module its op ran in. The real binary on hand-written
//! statistics dumps whose divergences are known by construction.

use crate::common;
use common::*;
use probe::schema::dump::{OpRecord, TensorRecord};
use serde_json::Value;
use std::path::Path;

/// A float32 tensor: slot, role, values, the dataflow id of its producer (`src`) and its own.
type T<'a> = (&'a str, &'a str, Vec<f32>, Option<u64>, Option<u64>);

/// A record of `key` (`api` or `module`) made in `module`.
fn rec(key: &str, kind: &str, module: &str, tensors: &[T]) -> OpRecord {
    let mut r = op_record(key, &[]);
    r.kind = kind.into();
    r.module = Some(module.into());
    r.tensors = tensors
        .iter()
        .map(|(slot, role, values, src, id)| TensorRecord {
            src: *src,
            id: *id,
            ..op_record(key, &[(slot, role, values.clone())]).tensors[0].clone()
        })
        .collect();
    r
}

const X: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
const W: [f32; 4] = [0.5, -0.25, 0.75, 1.0];

fn scaled(v: &[f32], by: f32) -> Vec<f32> {
    v.iter().map(|x| x * by).collect()
}

/// What the comparison run does differently in one step/rank.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Its linear layer's weight (no captured op produced it) is 5 % larger.
    weight: bool,
    /// Its gelu returns 10 % more than the benchmark's from the same input.
    gelu: bool,
    /// Its mul (on fresh, equal inputs) returns 10 % more.
    mul: bool,
}

/// One side of a step: `Functional.linear` in `fc_module`, the `Linear` module's record
/// around it (its input, its output, no weight: a module record holds none), a gelu
/// reading the linear's output in `blocks.1.act`, then a mul on fresh inputs in
/// `blocks.2`. `cmp` applies the faults.
fn step_records(fc_module: &str, faults: Faults, cmp: bool) -> Vec<OpRecord> {
    let off = |on: bool, by: f32| if cmp && on { by } else { 1.0 };
    let w = scaled(&W, off(faults.weight, 1.05));
    let y: Vec<f32> = X.iter().zip(&w).map(|(x, w)| x * w).collect();
    let z: Vec<f32> = scaled(
        &y.iter().map(|v| v + 1.0).collect::<Vec<_>>(),
        off(faults.gelu, 1.1),
    );
    let m = scaled(
        &X.iter().map(|v| v * 3.0).collect::<Vec<_>>(),
        off(faults.mul, 1.1),
    );
    let fc_key = format!("Module.{fc_module}.Linear.forward.0");
    vec![
        rec(
            "Functional.linear.0.forward",
            "api",
            fc_module,
            &[
                ("input.0", "input", X.to_vec(), None, None),
                ("input.1", "input", w, None, None),
                ("output.0", "output", y.clone(), None, Some(1)),
            ],
        ),
        rec(
            &fc_key,
            "module",
            fc_module,
            &[
                ("input.0", "input", X.to_vec(), None, None),
                ("output.0", "output", y.clone(), None, None),
            ],
        ),
        rec(
            "Functional.gelu.0.forward",
            "api",
            "blocks.1.act",
            &[
                ("input.0", "input", y, Some(1), None),
                ("output.0", "output", z, None, Some(2)),
            ],
        ),
        rec(
            "Torch.mul.0.forward",
            "api",
            "blocks.2",
            &[
                ("input.0", "input", X.to_vec(), None, None),
                ("input.1", "input", vec![3.0; 4], None, None),
                ("output.0", "output", m, None, Some(3)),
            ],
        ),
    ]
}

fn write_step(dir: &Path, step: &str, rank: &str, fc_module: &str, faults: Faults) {
    for (side, cmp) in [("bench", false), ("cmp", true)] {
        let records = step_records(fc_module, faults, cmp);
        write_op_log_at(&dir.join(side), step, rank, "statistics", records);
    }
}

/// The findings of the pair `step`/`rank` in summary.json.
fn pair<'a>(s: &'a Value, step: &str, rank: &str) -> &'a Value {
    s["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["step"] == step && p["rank"] == rank)
        .map(|p| &p["findings"])
        .unwrap_or_else(|| panic!("no pair {step}/{rank} in {s:#}"))
}

/// Rank 0's gelu diverges in step 0 (a fault of its own); in step 1 its weight differs
/// and its mul returns another value: both after step 0 diverged, so both are its
/// consequences, in every report, and the headline tells step 0. Rank 1 diverges first
/// in step 1: its findings are its own.
#[test]
fn a_later_steps_findings_are_told_as_consequences_of_the_earlier_divergence() {
    let t = tempfile::tempdir().unwrap();
    let gelu = Faults {
        gelu: true,
        ..Faults::default()
    };
    let later = Faults {
        weight: true,
        mul: true,
        ..Faults::default()
    };
    write_step(t.path(), "step0", "rank0", "blocks.0.fc", gelu);
    write_step(t.path(), "step1", "rank0", "blocks.0.fc", later);
    write_step(t.path(), "step0", "rank1", "blocks.0.fc", Faults::default());
    write_step(t.path(), "step1", "rank1", "blocks.0.fc", later);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());

    // The headline tells step 0's own divergence, naming the module the gelu ran in.
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "DIVERGENCE: first divergent op Functional.gelu.0.forward in `blocks.1.act` \
             (forward step0/rank0"
        ),
        "{h}"
    );

    // Step 0 of rank 0: its own, no consequence; the finding names the module.
    let own = &pair(&s, "step0", "rank0")["first_divergent"]["forward"];
    assert_eq!(own["op"], "Functional.gelu.0.forward", "{s:#}");
    assert_eq!(own["module"], "blocks.1.act");
    assert!(own.get("consequence_of").is_none(), "{own:#}");

    // Step 1 of rank 0: the weight entering and the mul are consequences of step 0's.
    let later0 = pair(&s, "step1", "rank0");
    let entry = &later0["external_source"]["forward"];
    assert_eq!(entry["op"], "Functional.linear.0.forward", "{later0:#}");
    assert_eq!(entry["consequence_of"], "step0");
    let grows = &later0["first_divergent"]["forward"];
    assert_eq!(grows["op"], "Torch.mul.0.forward", "{later0:#}");
    assert_eq!(grows["consequence_of"], "step0");
    assert!(
        grows["explanation"]
            .as_str()
            .unwrap()
            .contains("step0 diverged first"),
        "{grows:#}"
    );
    // Every finding of the step is one, whatever its kind.
    for kind in ["earliest_failing", "external_source", "first_divergent"] {
        assert_eq!(later0[kind]["forward"]["consequence_of"], "step0", "{kind}");
    }

    // Rank 1 diverged first in step 1: nothing earlier of its own to follow.
    let first1 = pair(&s, "step1", "rank1");
    assert_eq!(
        first1["external_source"]["forward"]["op"],
        "Functional.linear.0.forward"
    );
    assert!(first1["external_source"]["forward"]
        .get("consequence_of")
        .is_none());

    // stdout lists the run's earliest finding of each kind: step 0's first divergent op,
    // then step 1's entry as a consequence (rank 0's, the lower rank at the same op); no
    // later step is called a first divergent op.
    let at = |needle: &str| {
        o.stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in {}", o.stdout))
    };
    let first = at(
        "first divergent op (forward): Functional.gelu.0.forward in `blocks.1.act` \
                    (step0/rank0",
    );
    let enters = "consequence of step0's divergence, where it enters (forward): \
                  Functional.linear.0.forward in `blocks.0.fc` (step1/rank0";
    assert!(first < at(enters), "{}", o.stdout);
    assert!(
        !o.stdout
            .lines()
            .any(|l| l.contains("first divergent op") && l.contains("step1/")),
        "{}",
        o.stdout
    );
    assert!(
        !o.stdout.contains("divergence enters from outside ("),
        "{}",
        o.stdout
    );

    // The html report: its culprit card is step 0's gelu; step 1's findings are titled as
    // consequences.
    let html = std::fs::read_to_string(t.path().join("out/compare.html")).unwrap();
    let card = html.split("id=\"culprit\"").nth(1).expect("a culprit card");
    let card = card.split("</div>\n<h2>").next().unwrap();
    assert!(card.contains("Functional.gelu.0.forward"), "{card}");
    assert!(card.contains("step0/rank0"), "{card}");
    assert!(
        html.contains("consequence of step0&#39;s divergence, where it enters")
            || html.contains("consequence of step0's divergence, where it enters"),
        "no consequence title in the html"
    );

    // The workbook's summary sheet lists them the same way.
    use calamine::{open_workbook, Reader, Xlsx};
    let mut wb: Xlsx<_> = open_workbook(t.path().join("out/compare.xlsx")).unwrap();
    let sheet = wb.worksheet_range("summary").unwrap();
    let cells: Vec<String> = sheet
        .rows()
        .flat_map(|r| r.iter().map(|c| c.to_string()).collect::<Vec<_>>())
        .collect();
    assert!(
        cells
            .iter()
            .any(|c| c == "consequence of step0's divergence, where it enters (forward)"),
        "{cells:#?}"
    );
    assert!(
        cells.iter().any(|c| c == "blocks.0.fc"),
        "no module row: {cells:#?}"
    );
}

/// The linear layer's weight differs (a submodule's parameter, as the `Linear` module's
/// record sees it: not at all). The record's input agrees and its output differs, which
/// says nothing of the module's own computation: with the calls inside it captured, the
/// divergence enters at the linear call, and the record is named nowhere.
#[test]
fn a_module_record_is_no_culprit_where_the_calls_inside_it_are_captured() {
    let t = tempfile::tempdir().unwrap();
    let weight = Faults {
        weight: true,
        ..Faults::default()
    };
    write_step(t.path(), "step0", "rank0", "blocks.0.fc", weight);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(s["first_divergent"]["forward"], Value::Null, "{s:#}");
    let entry = &s["external_source"]["forward"];
    assert_eq!(entry["op"], "Functional.linear.0.forward", "{s:#}");
    assert_eq!(entry["module"], "blocks.0.fc");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("Functional.linear.0.forward in `blocks.0.fc`"),
        "{h}"
    );
    assert!(
        !o.stdout.contains("Module.blocks.0.fc.Linear.forward.0 ("),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("local to this op"), "{}", o.stdout);
}

/// A dump of module records only: the record is as close as the dump gets, and it says
/// the divergence is inside the module (its parameters or the calls it makes), not local
/// to one op.
#[test]
fn a_module_record_alone_says_the_divergence_is_inside_the_module() {
    let t = tempfile::tempdir().unwrap();
    for (side, by) in [("bench", 1.0), ("cmp", 1.1)] {
        let records = vec![rec(
            "Module.blocks.0.Block.forward.0",
            "module",
            "blocks.0",
            &[
                ("input.0", "input", X.to_vec(), None, None),
                ("output.0", "output", scaled(&X, by), None, None),
            ],
        )];
        write_op_log_at(
            &t.path().join(side),
            "step0",
            "rank0",
            "statistics",
            records,
        );
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Module.blocks.0.Block.forward.0", "{s:#}");
    assert_eq!(f["module"], "blocks.0");
    let why = f["explanation"].as_str().unwrap();
    assert!(why.contains("inside this module"), "{why}");
    assert!(!why.contains("local to this op"), "{why}");
    let h = s["headline"].as_str().unwrap();
    assert!(h.starts_with("DIVERGENCE inside module `blocks.0`"), "{h}");
}

/// A module path is input: the html report escapes it as it escapes op keys.
#[test]
fn a_module_path_is_escaped_in_the_html_report() {
    let t = tempfile::tempdir().unwrap();
    let weight = Faults {
        weight: true,
        ..Faults::default()
    };
    write_step(t.path(), "step0", "rank0", "fc<b>x</b>", weight);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(
        s["external_source"]["forward"]["module"], "fc<b>x</b>",
        "{s:#}"
    );
    let html = std::fs::read_to_string(t.path().join("out/compare.html")).unwrap();
    assert!(html.contains("fc&lt;b&gt;x&lt;/b&gt;"), "not escaped");
    assert!(!html.contains("fc<b>x</b>"), "raw markup in the html");
}
