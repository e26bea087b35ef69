//! Honest verdicts (issue 16): the real binary on hand-written dumps, each case one way a
//! verdict could claim more than the data shows.

use crate::common;
use common::dumps::with_extra_op;
use common::*;
use probe::schema::dump::OpRecord;
use std::path::Path;

/// One op: inputs 0 and 1, output 0, as (slot, role, values).
fn mul_op(in0: &[f32], in1: &[f32], out: &[f32]) -> Vec<Tensor<'static>> {
    vec![
        ("input.0", "input", in0.to_vec()),
        ("input.1", "input", in1.to_vec()),
        ("output.0", "output", out.to_vec()),
    ]
}

const IN0: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
/// Small values: a difference of 2e-7 per element is far inside atol (1e-5) yet a
/// relative L2 error of ~1e-3.
const IN1: [f32; 4] = [1e-4, 2e-4, -1e-4, 3e-4];

fn line<'a>(lines: &'a [String], tensor: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.contains(&format!("{tensor} ")))
        .unwrap_or_else(|| panic!("no evidence line for {tensor}: {lines:#?}"))
}

/// Tensor mode: "(identical)" only next to data seen equal, never next to a pass that
/// atol forgave (the issue: `rel_l2=2.1e-3 (identical)`).
#[test]
fn identical_means_bitwise_equal_data() {
    let t = tempfile::tempdir().unwrap();
    let cmp_in1: Vec<f32> = IN1.iter().map(|x| x + 2e-7).collect();
    let out_b = [1.0f32, 2.0, 3.0, 4.0];
    let out_c: Vec<f32> = out_b.iter().map(|x| x * 1.1).collect();
    write_tensor_log(
        &t.path().join("bench"),
        &[("Torch.mul.0.forward", mul_op(&IN0, &IN1, &out_b))],
    );
    write_tensor_log(
        &t.path().join("cmp"),
        &[("Torch.mul.0.forward", mul_op(&IN0, &cmp_in1, &out_c))],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Torch.mul.0.forward", "{s:#}");
    let lines: Vec<String> = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    let equal = line(&lines, "Torch.mul.0.forward.input.0");
    assert!(equal.ends_with("(identical)"), "{equal}");
    let forgiven = line(&lines, "Torch.mul.0.forward.input.1");
    assert!(forgiven.contains("[pass]"), "{forgiven}");
    assert!(!forgiven.contains("rel_l2=0.000e0"), "{forgiven}");
    assert!(!forgiven.contains("identical"), "{forgiven}");
    for l in evidence_lines(&s) {
        if l.contains("(identical)") {
            assert!(l.contains("rel_l2=0.000e0 max_abs=0.000e0"), "{l}");
        }
    }
    // The terminal prints the same lines.
    assert!(o.stdout.contains(forgiven), "{}", o.stdout);
    assert!(!o.stdout.contains("e-3 max_abs=2.000e-7 (identical)"));
}

fn stats_pair(
    dir: &Path,
    bench: Vec<probe::schema::dump::OpRecord>,
    cmp: Vec<probe::schema::dump::OpRecord>,
) {
    write_op_log(&dir.join("bench"), bench);
    write_op_log(&dir.join("cmp"), cmp);
}

/// Statistics mode: equal statistics are "statistics equal", never "identical" (the
/// elements were not compared), in the evidence and in the explanation.
#[test]
fn equal_statistics_are_not_called_identical() {
    let t = tempfile::tempdir().unwrap();
    let out_c: Vec<f32> = IN0.iter().map(|x| x * 1.1).collect();
    let op = |out: &[f32]| {
        op_record(
            "Torch.mul.0.forward",
            &[
                ("input.0", "input", IN0.to_vec()),
                ("output.0", "output", out.to_vec()),
            ],
        )
    };
    stats_pair(t.path(), vec![op(&IN0)], vec![op(&out_c)]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Torch.mul.0.forward", "{s:#}");
    let expl = f["explanation"].as_str().unwrap();
    assert!(
        expl.contains("have equal statistics on both sides"),
        "{expl}"
    );
    assert!(!expl.contains("identical"), "{expl}");
    let lines = evidence_lines(&s);
    assert!(lines.iter().all(|l| !l.contains("identical")), "{lines:#?}");
    assert!(
        line(&lines, "Torch.mul.0.forward.input.0").ends_with("(statistics equal)"),
        "{lines:#?}"
    );
    assert!(!o.stdout.contains("identical"), "{}", o.stdout);
}

const FORWARD: [&str; 3] = [
    "Torch.matmul.0.forward",
    "Functional.gelu.0.forward",
    "Torch.sum.0.forward",
];
const TRAIN: [&str; 6] = [
    "Torch.matmul.0.forward",
    "Functional.gelu.0.forward",
    "Torch.sum.0.forward",
    "Torch.sum.0.backward",
    "Functional.gelu.0.backward",
    "Torch.matmul.0.backward",
];

/// Writes one step/rank of both sides (statistics): a chain of `keys`, one input and one
/// output each; in the comparison run the op at `culprit` returns 10 % more, and
/// everything after it carries that.
fn write_unit(dir: &Path, step: &str, rank: &str, keys: &[&str], culprit: Option<usize>) {
    for side in ["bench", "cmp"] {
        let records = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let base: Vec<f32> = IN0.iter().map(|x| x + i as f32).collect();
                let off = |after: bool| {
                    if side == "cmp" && culprit.is_some_and(|c| i > c || (after && i == c)) {
                        1.1
                    } else {
                        1.0
                    }
                };
                let input: Vec<f32> = base.iter().map(|x| x * off(false)).collect();
                let output: Vec<f32> = base.iter().map(|x| (x + 1.0) * off(true)).collect();
                op_record(
                    key,
                    &[("input.0", "input", input), ("output.0", "output", output)],
                )
            })
            .collect();
        write_op_log_at(&dir.join(side), step, rank, "statistics", records);
    }
}

/// Step 2's backward culprit comes before step 10's forward one: in the headline, in the
/// terminal, and numeric step order (step2 < step10, which sorts after it as text).
#[test]
fn findings_are_told_in_causal_order() {
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step2", "rank0", &TRAIN, Some(4));
    write_unit(t.path(), "step10", "rank0", &TRAIN, Some(0));
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(s["first_divergent"]["backward"]["step"], "step2", "{s:#}");
    assert_eq!(s["first_divergent"]["backward"]["op"], TRAIN[4]);
    assert_eq!(s["first_divergent"]["forward"]["step"], "step10");
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains(TRAIN[4]) && h.contains("step2/rank0"), "{h}");
    let at = |needle: &str| {
        o.stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in {}", o.stdout))
    };
    // Step 10 starts from what step 2's diverged update left: its findings are told as
    // consequences, never as a first divergent op.
    let later = "consequence of step2's divergence, first op whose error grows (forward): \
                 Torch.matmul.0.forward (step10/rank0";
    assert!(
        at("first divergent op (backward): Functional.gelu.0.backward (step2/rank0") < at(later),
        "{}",
        o.stdout
    );
    assert!(
        !o.stdout.contains("first divergent op (forward)"),
        "{}",
        o.stdout
    );
    assert_eq!(s["first_divergent"]["forward"]["consequence_of"], "step2");
    assert!(s["first_divergent"]["backward"]
        .get("consequence_of")
        .is_none());
    // The workbook's summary sheet tells them in the same order.
    use calamine::{open_workbook, Reader, Xlsx};
    let mut wb: Xlsx<_> = open_workbook(t.path().join("out/compare.xlsx")).unwrap();
    let sheet = wb.worksheet_range("summary").unwrap();
    let row_of = |needle: &str| {
        sheet
            .rows()
            .position(|r| r.iter().any(|c| c.to_string().starts_with(needle)))
            .unwrap_or_else(|| panic!("{needle:?} not in the summary sheet"))
    };
    assert!(
        row_of("first divergent op (backward)")
            < row_of("consequence of step2's divergence, first op whose error grows (forward)")
    );
}

/// Within a step, findings of all ranks in execution order, then by numeric rank.
#[test]
fn ranks_within_a_step_follow_execution_order_then_rank_number() {
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank2", &FORWARD, Some(2));
    write_unit(t.path(), "step0", "rank10", &FORWARD, Some(1));
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(
        (&f["rank"], &f["op"]),
        (&"rank10".into(), &FORWARD[1].into())
    );
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains(FORWARD[1]) && h.contains("step0/rank10"), "{h}");
    // Same op on both: the lower rank number (rank2, though "rank10" sorts first as text).
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank2", &FORWARD, Some(1));
    write_unit(t.path(), "step0", "rank10", &FORWARD, Some(1));
    compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["first_divergent"]["forward"]["rank"], "rank2");
    assert!(s["headline"].as_str().unwrap().contains("step0/rank2"));
}

/// A `parameters_grad` record consumes nothing on record: its differing gradient is not
/// named locally divergent (the backward ops before it computed it), unless asked for.
#[test]
fn a_record_without_inputs_is_not_a_local_culprit_by_default() {
    let t = tempfile::tempdir().unwrap();
    for side in ["bench", "cmp"] {
        let grad: Vec<f32> = IN0
            .iter()
            .map(|x| if side == "cmp" { x * 1.1 } else { *x })
            .collect();
        let clean = |key| {
            op_record(
                key,
                &[
                    ("input.0", "input", IN0.to_vec()),
                    ("output.0", "output", IN0.to_vec()),
                ],
            )
        };
        let mut pg = op_record(
            "Module.fc.Linear.parameters_grad",
            &[("weight", "parameter", grad)],
        );
        pg.kind = "parameters_grad".into();
        write_op_log(
            &t.path().join(side),
            vec![
                clean("Torch.matmul.0.forward"),
                clean("Torch.matmul.0.backward"),
                pg,
            ],
        );
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert!(s["first_divergent"]["backward"].is_null(), "{s:#}");
    assert_eq!(
        s["earliest_failing"]["backward"]["op"],
        "Module.fc.Linear.parameters_grad"
    );
    assert_eq!(s["pairs"][0]["findings"]["drift"][0], "backward");
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("no single op is locally divergent"), "{h}");

    // Asked for: named, saying why.
    let cfg = t.path().join("tol.toml");
    std::fs::write(&cfg, "blame_without_inputs = true\n").unwrap();
    let o = compare(t.path(), &["--config", cfg.to_str().unwrap()]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    let f = &s["first_divergent"]["backward"];
    assert_eq!(f["op"], "Module.fc.Linear.parameters_grad", "{s:#}");
    assert!(f["explanation"]
        .as_str()
        .unwrap()
        .contains("no recorded inputs"));
}

/// Keeps the first `n` lines of a rank's op log: a valid, shorter dump (a capture that
/// stopped, not a crash: every line is complete).
fn keep_ops(rank_dir: &Path, n: usize) -> Vec<String> {
    let p = rank_dir.join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let kept: Vec<String> = text.lines().take(n).map(String::from).collect();
    assert!(text.lines().count() > 10 * n);
    std::fs::write(&p, kept.join("\n") + "\n").unwrap();
    kept
}

fn op_key_of(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["op"].as_str().unwrap().to_string()
}

/// The case: the comparison run's capture stopped after two ops; the two ops it
/// has agree with the benchmark. That used to exit 0.
#[test]
fn a_capture_that_stopped_early_is_incomplete_not_a_pass() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics", "--blocks", "8"]);
    let kept = keep_ops(&t.path().join("cmp/step0/rank0"), 2);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(s["verdict"], "incomplete");
    assert_eq!(s["exit_code"], 4);
    assert_eq!(s["partial"], true);
    let missing = s["counts"]["unmatched_bench"].as_u64().unwrap();
    let compared = s["counts"]["tensors"].as_u64().unwrap();
    assert!(compared > 0 && missing > 10 * compared, "{s:#}");
    let h = s["headline"].as_str().unwrap();
    let expect = format!(
        "INCOMPLETE: step0/rank0: the comparison run's capture stopped after op 2 ({}); {missing} bench tensors have no counterpart",
        op_key_of(&kept[1])
    );
    assert!(h.starts_with(&expect), "{h}\n{expect}");
    assert!(o.stdout.starts_with(&expect), "{}", o.stdout);
    let frac = missing as f64 / (missing + compared) as f64;
    assert!((s["unmatched_fraction"]["bench"].as_f64().unwrap() - frac).abs() < 1e-12);
    assert_eq!(s["unmatched_fraction"]["cmp"], 0.0);
    assert_eq!(s["pairs"][0]["unmatched_fraction"], s["unmatched_fraction"]);
    assert_eq!(s["max_unmatched"], 0.05);
    let u = &s["incomplete_units"][0];
    assert_eq!((&u["side"], &u["compared"]), (&"cmp".into(), &true.into()));

    // Allowed to miss everything: a warning (unmatched tensors), exit 0; with --fail-on
    // warning the gate fails on them first (exit 1 before 4).
    let o = compare(t.path(), &["--max-unmatched", "100%"]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert_eq!(summary(t.path())["verdict"], "warning");
    assert_eq!(compare(t.path(), &["--fail-on", "warning"]).code, 1);
    assert_eq!(compare(t.path(), &["--fail-on", "never"]).code, 4);
}

/// The benchmark's capture stopped instead: named the same way, from the other side.
#[test]
fn a_benchmark_that_stopped_early_is_named_as_such() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics", "--blocks", "8"]);
    let kept = keep_ops(&t.path().join("bench/step0/rank0"), 3);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains(&format!(
            "the benchmark run's capture stopped after op 3 ({})",
            op_key_of(&kept[2])
        )) && h.contains("cmp tensors have no counterpart"),
        "{h}"
    );
    assert_eq!(s["incomplete_units"][0]["side"], "bench");
}

/// Ops missing in the middle, not at the end: no capture stopped; the share is named.
/// And a divergence in what was compared still exits 1 (precedence).
#[test]
fn too_many_unmatched_tensors_make_the_comparison_incomplete() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics", "--blocks", "8"]);
    let p = t.path().join("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (n, cut) = (lines.len(), lines.len() / 4);
    let kept: Vec<&str> = lines[..cut]
        .iter()
        .chain(&lines[2 * cut..])
        .copied()
        .collect();
    std::fs::write(&p, kept.join("\n") + "\n").unwrap();
    assert!(n > 8);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let h = s["headline"].as_str().unwrap();
    assert!(!h.contains("stopped"), "{h}");
    let (missing, compared) = (
        s["counts"]["unmatched_bench"].as_u64().unwrap(),
        s["counts"]["tensors"].as_u64().unwrap(),
    );
    let pct = 100.0 * missing as f64 / (missing + compared) as f64;
    let expect = format!(
        "{missing} of {} bench tensors ({pct:.1}%) have no counterpart in cmp",
        missing + compared
    );
    assert!(h.contains(&expect), "{h}\n{expect}");
    // A threshold above the share: complete (a warning for the unmatched tensors).
    let above = format!("{}", pct / 100.0 + 0.01);
    assert_eq!(compare(t.path(), &["--max-unmatched", &above]).code, 0);

    // A divergence among the compared tensors: exit 1, the headline says both.
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--mode",
            "statistics",
            "--blocks",
            "8",
            "--inject",
            "Functional.linear.0",
        ],
    );
    keep_ops(&t.path().join("cmp/step0/rank0"), 3);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(s["verdict"], "error");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with("DIVERGENCE") && h.contains("comparison incomplete"),
        "{h}"
    );
}

/// `--max-unmatched` is read and checked before any dump is.
#[test]
fn max_unmatched_must_be_a_fraction() {
    for bad in ["1.5", "-1", "120%", "lots"] {
        let arg = format!("--max-unmatched={bad}");
        let o = probe(&[
            "compare",
            "-b",
            "/nonexistent/b",
            "-c",
            "/nonexistent/c",
            &arg,
        ]);
        assert_eq!(o.code, 2, "{bad}: {}", o.stderr);
        assert!(o.stderr.contains("--max-unmatched"), "{}", o.stderr);
        assert!(!o.stderr.contains("nonexistent"), "{}", o.stderr);
    }
}

/// A dropout whose input agrees and whose output differs is a different random draw, told
/// as such; the ops after it (inputs off) are nobody's fault; `first_divergent` stays
/// empty.
#[test]
fn a_different_dropout_mask_is_a_random_draw_not_a_culprit() {
    let keys = [
        "Torch.matmul.0.forward",
        "Functional.dropout.0.forward",
        "Torch.sum.0.forward",
    ];
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank0", &keys, Some(1));
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert!(s["first_divergent"]["forward"].is_null(), "{s:#}");
    let r = &s["random_draw"]["forward"];
    assert_eq!(r["op"], keys[1]);
    let expl = r["explanation"].as_str().unwrap();
    assert!(
        expl.contains("different random draw") && expl.contains("config-check's random category"),
        "{expl}"
    );
    assert_eq!(s["pairs"][0]["findings"]["random_draw"], s["random_draw"]);
    assert!(s["pairs"][0]["findings"]["drift"]
        .as_array()
        .unwrap()
        .is_empty());
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(&format!("DIVERGENCE from random numbers: {}", keys[1]))
            && h.contains("not a faulty kernel"),
        "{h}"
    );
    assert!(o
        .stdout
        .contains("different random draw (forward): Functional.dropout.0.forward"));

    // The same difference in a deterministic op is that op's fault.
    let keys = [
        "Torch.matmul.0.forward",
        "Functional.gelu.0.forward",
        "Torch.sum.0.forward",
    ];
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank0", &keys, Some(1));
    compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["first_divergent"]["forward"]["op"], keys[1]);
    assert!(s["random_draw"]["forward"].is_null());
}

/// A real culprit before a dropout is still the story (the dropout's input then differs:
/// no random draw is claimed); after a random draw, a deterministic op with agreeing
/// inputs is still found.
#[test]
fn random_draws_and_culprits_keep_their_order() {
    let keys = [
        "Torch.matmul.0.forward",
        "Functional.dropout.0.forward",
        "Torch.sum.0.forward",
    ];
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank0", &keys, Some(0));
    compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["first_divergent"]["forward"]["op"], keys[0], "{s:#}");
    assert!(s["random_draw"]["forward"].is_null());
    assert!(s["headline"]
        .as_str()
        .unwrap()
        .starts_with("DIVERGENCE: first divergent op Torch.matmul.0.forward"));

    // Fused attention draws only when its dropout is on: the dump cannot tell, and the
    // words say both.
    let keys = [
        "Torch.matmul.0.forward",
        "Functional.scaled_dot_product_attention.0.forward",
        "Torch.sum.0.forward",
    ];
    let t = tempfile::tempdir().unwrap();
    write_unit(t.path(), "step0", "rank0", &keys, Some(1));
    compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["random_draw"]["forward"]["op"], keys[1], "{s:#}");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("if its dropout is active (else a faulty kernel)"),
        "{h}"
    );
}

/// One op record whose tensors are all of `dtype` on this side.
fn with_dtype(mut r: probe::schema::dump::OpRecord, dtype: &str) -> probe::schema::dump::OpRecord {
    for t in &mut r.tensors {
        t.dtype = dtype.into();
    }
    r
}

/// Writes one step/rank of both sides: a forward matmul whose weight (input.1) is 1 %
/// larger in the comparison run (as after an update), then, when `backward`, its backward
/// call, computed in bfloat16 in the comparison run when `bf16`.
fn write_step(dir: &Path, step: &str, rank: &str, weight_off: bool, backward: bool, bf16: bool) {
    for side in ["bench", "cmp"] {
        let cmp = side == "cmp";
        let w: Vec<f32> = IN0
            .iter()
            .map(|x| if cmp && weight_off { x * 1.01 } else { *x })
            .collect();
        let fwd = op_record(
            "Torch.matmul.0.forward",
            &[
                ("input.0", "input", IN0.to_vec()),
                ("input.1", "input", w.clone()),
                ("output.0", "output", w),
            ],
        );
        let mut ops = vec![if cmp && bf16 && !backward {
            with_dtype(fwd, "bfloat16")
        } else {
            fwd
        }];
        if backward {
            let bwd = op_record(
                "Torch.matmul.0.backward",
                &[
                    ("input.0", "input", IN0.to_vec()),
                    ("output.0", "output", IN0.to_vec()),
                ],
            );
            ops.push(if cmp && bf16 {
                with_dtype(bwd, "bfloat16")
            } else {
                bwd
            });
        }
        write_op_log_at(&dir.join(side), step, rank, "statistics", ops);
    }
}

/// A rank whose step 0 ran its backward in bf16 carries bf16 precision into step 1: a
/// weight 1 % off there is bf16 rounding of the update, not an outside divergence. A rank
/// that stayed in float32, or whose bf16 step had no backward (no update), does not.
#[test]
fn a_bf16_update_carries_its_precision_into_the_next_step() {
    let t = tempfile::tempdir().unwrap();
    write_step(t.path(), "step0", "rank0", false, true, true);
    write_step(t.path(), "step1", "rank0", true, true, false);
    write_step(t.path(), "step0", "rank1", false, true, false);
    write_step(t.path(), "step1", "rank1", true, true, false);
    write_step(t.path(), "step0", "rank2", false, false, true);
    write_step(t.path(), "step1", "rank2", true, false, false);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(t.path());
    let pair = |step: &str, rank: &str| {
        s["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["step"] == step && p["rank"] == rank)
            .unwrap_or_else(|| panic!("no {step}/{rank}"))
            .clone()
    };
    let carried = pair("step1", "rank0");
    assert_eq!(carried["errors"], 0, "{carried:#}");
    assert!(carried["findings"]["external_source"]["forward"].is_null());
    for rank in ["rank1", "rank2"] {
        let p = pair("step1", rank);
        assert!(p["errors"].as_u64().unwrap() > 0, "{p:#}");
        assert_eq!(
            p["findings"]["external_source"]["forward"]["tensor"], "Torch.matmul.0.forward.input.1",
            "{rank}"
        );
    }
}

/// The fixture: msprobe's L1 statistics dumps, bf16 autocast against float32 over
/// three steps. Step 1's conv bias is judged at bf16 (its update came from bf16
/// gradients), and the bias gradient that is rounding noise names no culprit.
#[test]
fn bf16_against_fp32_over_steps_names_no_false_culprit() {
    let t = tempfile::tempdir().unwrap();
    let td = root().join("testdata/msprobe");
    let out = t.path().join("out");
    let o = probe(&[
        "compare",
        "-b",
        td.join("stats_bench").to_str().unwrap(),
        "-c",
        td.join("stats_bf16").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["counts"]["pairs"], 3, "{}", o.stderr);
    for p in s["pairs"].as_array().unwrap() {
        let f = &p["findings"];
        for k in ["first_divergent", "external_source"] {
            for d in ["forward", "backward"] {
                assert!(f[k][d].is_null(), "{} {k} {d}: {:#}", p["step"], f[k][d]);
            }
        }
        assert_eq!(f["drift"], serde_json::json!(["backward"]), "{}", p["step"]);
    }
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("step0/") && h.contains("accumulated drift"),
        "{h}"
    );
    assert!(!h.contains("outside"), "{h}");
    // The row itself says why it got bf16 tolerance.
    let run = probe::compare::run(
        &td.join("stats_bench"),
        &td.join("stats_bf16"),
        &Default::default(),
        &probe::progress::Progress::hidden(),
    )
    .unwrap();
    let step1 = run.tables.rows(1).unwrap();
    let bias = step1
        .iter()
        .find(|r| r.tensor.name == "Functional.conv2d.0.forward.input.2")
        .unwrap();
    assert_eq!(bias.judgement.precision, Some(probe::dtype::DType::BF16));
    assert!(
        bias.judgement.verdict < probe::compare::Verdict::Error,
        "{bias:?}"
    );
    let step2 = run.tables.rows(2).unwrap();
    let step2 = step2
        .iter()
        .find(|r| r.tensor.name == "Functional.conv2d.0.forward.input.2")
        .unwrap();
    assert!(
        step2
            .judgement
            .reason
            .contains("(float32, after bfloat16 updates in an earlier step)"),
        "{:?}",
        step2.judgement
    );
}

/// A conv bias gradient before a normalisation is mathematically zero: ~1e-8 in float32,
/// ~1e-4 in bf16 from the same incoming gradient. Its huge relative error is rounding
/// noise of the inputs, not a local error; a difference as large as the inputs is one.
#[test]
fn a_gradient_that_is_rounding_noise_names_no_culprit() {
    let grad: Vec<f32> = (0..512)
        .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.094)
        .collect();
    let bias_b = vec![2.6e-8f32, -2.98e-8, 1.0e-8, 5.0e-9];
    let run = |dir: &Path, bias_c: Vec<f32>, dtype: &str| {
        for (side, bias) in [("bench", bias_b.clone()), ("cmp", bias_c)] {
            let fwd = op_record(
                "Functional.conv2d.0.forward",
                &[
                    ("input.0", "input", grad.clone()),
                    ("output.0", "output", grad.clone()),
                ],
            );
            let mut bwd = op_record(
                "Functional.conv2d.0.backward",
                &[
                    ("input.0", "input", grad.clone()),
                    ("output.2", "output", bias),
                ],
            );
            if side == "cmp" {
                bwd.tensors[1].dtype = dtype.into();
            }
            write_op_log(&dir.join(side), vec![fwd, bwd]);
        }
        compare(dir, &[]);
        summary(dir)
    };
    let t = tempfile::tempdir().unwrap();
    let s = run(t.path(), vec![1.66e-4, -1.0e-4, 7.4e-5, 1.0e-4], "bfloat16");
    assert_eq!(s["counts"]["error"], 1, "{s:#}");
    assert!(s["first_divergent"]["backward"].is_null(), "{s:#}");
    assert_eq!(
        s["earliest_failing"]["backward"]["tensor"],
        "Functional.conv2d.0.backward.output.2"
    );
    // Garbage the size of the inputs where the benchmark has zero: that op's fault.
    let t = tempfile::tempdir().unwrap();
    let s = run(t.path(), vec![0.03, -0.04, 0.02, 0.01], "float32");
    assert_eq!(
        s["first_divergent"]["backward"]["op"], "Functional.conv2d.0.backward",
        "{s:#}"
    );
}

/// A linear layer's forward whose weight is `w`: input, weight, output.
fn linear_step(w: f32) -> Vec<probe::schema::dump::OpRecord> {
    let x = vec![1.0f32, -2.0, 0.5, 3.0];
    let y: Vec<f32> = x.iter().map(|v| v * w).collect();
    vec![op_record(
        "Functional.linear.0.forward",
        &[
            ("input.0", "input", x),
            ("input.1", "input", vec![w; 4]),
            ("output.0", "output", y),
        ],
    )]
}

#[test]
fn a_weight_that_changes_between_clean_steps_points_at_the_update() {
    // Step 0 agrees on every tensor; in step 1 the port's weight is 2 % off: its optimizer
    // step (unseen: a multi-tensor or fused optimizer, or another learning rate) made it.
    // The headline says the step before compared without error; a weight that differs from
    // the first step on does not get that clause.
    let d = tempfile::tempdir().unwrap();
    for (side, w1) in [("bench", 0.5f32), ("cmp", 0.51)] {
        let dir = d.path().join(side);
        write_op_log_at(&dir, "step0", "rank0", "statistics", linear_step(0.4));
        write_op_log_at(&dir, "step1", "rank0", "statistics", linear_step(w1));
    }
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let h = summary(d.path())["headline"].as_str().unwrap().to_string();
    assert!(
        h.starts_with("DIVERGENCE enters from outside the captured ops: Functional.linear.0.forward.input.1 (input of Functional.linear.0.forward, step1/rank0); step0/rank0 compared without error, so it changed between the steps"),
        "{h}"
    );
    let e = tempfile::tempdir().unwrap();
    for (side, w) in [("bench", 0.5f32), ("cmp", 0.51)] {
        write_op_log(&e.path().join(side), linear_step(w));
    }
    let o = compare(e.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let h = summary(e.path())["headline"].as_str().unwrap().to_string();
    assert!(
        h.contains("Functional.linear.0.forward.input.1") && !h.contains("between the steps"),
        "{h}"
    );
}

#[test]
fn a_divergence_from_an_op_only_one_run_calls_names_that_op() {
    // The port adds a call (cmp) or leaves one out (bench): the first failing op's input
    // differs before any paired op fails, and it is that call's output, not something
    // config-check would find.
    for (port_adds, side, who) in [
        (true, "cmp", "comparison run"),
        (false, "bench", "benchmark"),
    ] {
        let d = tempfile::tempdir().unwrap();
        with_extra_op(&d.path().join("bench"), !port_adds);
        with_extra_op(&d.path().join("cmp"), port_adds);
        let o = compare(d.path(), &["--max-unmatched", "0.5"]);
        assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
        let s = summary(d.path());
        let at = if port_adds {
            " (File \"port.py\", line 12, in forward: h = h * 1.5)"
        } else {
            "" // (the stack of a benchmark's op is not the comparison run's to tell)
        };
        assert_eq!(
            s["headline"],
            format!(
                "DIVERGENCE enters through Tensor.__mul__.0.forward, which only the {who} \
                 calls{at}: its output Functional.gelu.0.forward.input.0 (input of \
                 Functional.gelu.0.forward, step0/rank0) differs"
            ),
            "{s}"
        );
        let f = &s["external_source"]["forward"];
        assert_eq!(f["one_sided_source"]["side"], side, "{f}");
        assert!(
            f["explanation"]
                .as_str()
                .unwrap()
                .starts_with("the divergence enters through an op only the"),
            "{f}"
        );
        assert!(!f["explanation"].as_str().unwrap().contains("config-check"));
    }
}

/// A linear layer's backward whose bias gradient (`output.2`) is the sum over a batch of
/// 32 output gradients that cancel to a tenth of their size: `shift` moves every gradient
/// (within tolerance), `bias_scale` scales the bias gradient the op returns (a fault).
fn bias_gradient(dir: &Path, shift: f32, bias_scale: f32) {
    let g: Vec<f32> = (0..32)
        .map(|i| (if i % 2 == 0 { 0.1 } else { -0.1 }) + 0.01 + shift)
        .collect();
    let sum: f32 = g.iter().sum::<f32>() * bias_scale;
    let op = op_record(
        "Functional.linear.0.backward",
        &[("input.0", "input", g), ("output.2", "output", vec![sum])],
    );
    write_op_log(dir, vec![op]);
}

#[test]
fn a_sum_that_cancels_carries_its_inputs_error_not_its_own() {
    // The gradients differ by 5e-6 (4.5e-5 of their size: within tolerance), the bias
    // gradient by 32 times that, 5e-4 of its own size: 11 times the inputs' error, yet only
    // what the inputs' difference gives a sum whose terms cancel to a tenth. No culprit.
    let d = tempfile::tempdir().unwrap();
    bias_gradient(&d.path().join("bench"), 0.0, 1.0);
    bias_gradient(&d.path().join("cmp"), 5e-6, 1.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert!(s["first_divergent"]["backward"].is_null(), "{s}");
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("accumulated drift"), "{h}");
    // A bias gradient 1 % off is more than that sum can carry: named.
    let d = tempfile::tempdir().unwrap();
    bias_gradient(&d.path().join("bench"), 0.0, 1.0);
    bias_gradient(&d.path().join("cmp"), 5e-6, 1.01);
    compare(d.path(), &[]);
    let s = summary(d.path());
    let f = &s["first_divergent"]["backward"];
    assert_eq!(f["op"], "Functional.linear.0.backward", "{s}");
}

/// `softmax` of `scores` into `p`, then `max(p, -1)`: its values (`output.0`) and the
/// index of each row's maximum (`output.1`, int64), as an MoE router picks an expert.
fn router(dir: &Path, scores: &[[f32; 2]; 4], picked: &[f32; 4], values_scale: f32) {
    write_op_log(dir, router_ops(scores, picked, values_scale));
}

fn router_ops(scores: &[[f32; 2]; 4], picked: &[f32; 4], values_scale: f32) -> Vec<OpRecord> {
    let p: Vec<f32> = scores
        .iter()
        .flat_map(|r| {
            let e = [r[0].exp(), r[1].exp()];
            [e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])]
        })
        .collect();
    let best: Vec<f32> = p.chunks(2).map(|r| r[0].max(r[1]) * values_scale).collect();
    let mut soft = op_record(
        "Torch.softmax.0.forward",
        &[
            (
                "input.0",
                "input",
                scores.iter().flatten().copied().collect(),
            ),
            ("output.0", "output", p.clone()),
        ],
    );
    soft.tensors[1].id = Some(1);
    let mut max = op_record(
        "Tensor.max.0.forward",
        &[
            ("input.0", "input", p),
            ("output.0", "output", best),
            ("output.1", "output", picked.to_vec()),
        ],
    );
    max.tensors[0].src = Some(1);
    max.tensors[2].dtype = "int64".into();
    vec![soft, max]
}

#[test]
fn what_a_near_tie_reroutes_is_not_a_culprit_where_statistics_cannot_see_it() {
    // After the router's near tie, each row's choice as a one-hot mask, then the tokens per
    // expert. The masks hold as many ones on both sides (equal statistics: statistics
    // cannot see which rows), the counts differ (2, 2 against 3, 1): the sum looked like a
    // faulty kernel fed equal inputs. It is what the tie rerouted.
    let bench = [[1.0, 0.0], [0.2, 0.9], [0.5, 0.5000005], [2.0, 1.0]];
    let cmp = bench.map(|r| [r[0] + 1e-6, r[1]]);
    let d = tempfile::tempdir().unwrap();
    for (side, picked) in [
        ("bench", [0.0, 1.0, 1.0, 0.0]),
        ("cmp", [0.0, 1.0, 0.0, 0.0]),
    ] {
        let mut ops = router_ops(if side == "bench" { &bench } else { &cmp }, &picked, 1.0);
        ops[1].tensors[2].id = Some(2);
        let mask: Vec<f32> = picked
            .iter()
            .flat_map(|&e| [f32::from(e == 0.0), f32::from(e == 1.0)])
            .collect();
        let counts: Vec<f32> = (0..2)
            .map(|e| mask.iter().skip(e).step_by(2).sum())
            .collect();
        let mut one_hot = op_record(
            "Functional.one_hot.0.forward",
            &[
                ("input.0", "input", picked.to_vec()),
                ("output.0", "output", mask.clone()),
            ],
        );
        one_hot.tensors[0].src = Some(2);
        one_hot.tensors[1].id = Some(3);
        let mut sum = op_record(
            "Tensor.sum.0.forward",
            &[("input.0", "input", mask), ("output.0", "output", counts)],
        );
        sum.tensors[0].src = Some(3);
        for t in one_hot.tensors.iter_mut().chain(sum.tensors.iter_mut()) {
            t.dtype = "int64".into();
        }
        ops.extend([one_hot, sum]);
        write_op_log(&d.path().join(side), ops);
    }
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(
        s["near_tie"]["forward"]["op"], "Tensor.max.0.forward",
        "{s}"
    );
    assert!(s["first_divergent"]["forward"].is_null(), "{s}");
    let h = s["headline"].as_str().unwrap();
    assert!(h.starts_with("DIVERGENCE from a near tie"), "{h}");
}

#[test]
fn a_choice_among_nearly_equal_scores_that_went_the_other_way_is_a_near_tie() {
    // Row 2's two scores are nearly equal: the comparison run's rounding (1e-6 on every
    // score, within tolerance) picks the other one. Not the router's fault.
    let bench = [[1.0, 0.0], [0.2, 0.9], [0.5, 0.5000005], [2.0, 1.0]];
    let cmp = bench.map(|r| [r[0] + 1e-6, r[1]]);
    let d = tempfile::tempdir().unwrap();
    router(&d.path().join("bench"), &bench, &[0.0, 1.0, 1.0, 0.0], 1.0);
    router(&d.path().join("cmp"), &cmp, &[0.0, 1.0, 0.0, 0.0], 1.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert!(s["first_divergent"]["forward"].is_null(), "{s}");
    assert_eq!(
        s["near_tie"]["forward"]["op"], "Tensor.max.0.forward",
        "{s}"
    );
    assert_eq!(
        s["near_tie"]["forward"]["tensor"],
        "Tensor.max.0.forward.output.1"
    );
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with("DIVERGENCE from a near tie: Tensor.max.0.forward"),
        "{h}"
    );
    // With the same scores on both sides, another choice is the op's own; so is one
    // whose maximum values are wrong as well.
    for (scores, scale) in [(&bench, 1.0), (&cmp, 1.5)] {
        let d = tempfile::tempdir().unwrap();
        router(&d.path().join("bench"), &bench, &[0.0, 1.0, 1.0, 0.0], 1.0);
        router(&d.path().join("cmp"), scores, &[0.0, 1.0, 0.0, 0.0], scale);
        compare(d.path(), &[]);
        let s = summary(d.path());
        assert_eq!(
            s["first_divergent"]["forward"]["op"], "Tensor.max.0.forward",
            "{s}"
        );
        assert!(s["near_tie"]["forward"].is_null(), "{s}");
    }
}

/// What step 0's update writes in each run (`carried_update`).
const WRITTEN: [[f32; 4]; 2] = [[0.101, 0.199, -0.299, 0.401], [0.099, 0.201, -0.301, 0.399]];

/// Two steps of one rank, compared: in step 0 an optimizer's in-place update
/// (`Tensor.addcdiv_`) reads a moment at rounding-noise level (a gradient that is zero but
/// for rounding: the bias of a convolution that a BatchNorm follows) and writes a weight
/// the runs disagree on by ±lr ([`WRITTEN`]); step 1's linear reads the weight `read_c` in
/// the comparison run, what the update wrote in the benchmark. The summary.
fn carried_update(read_c: &[f32]) -> serde_json::Value {
    let t = tempfile::tempdir().unwrap();
    let before = [0.1f32, 0.2, -0.3, 0.4];
    let x = [1.0f32, -1.0, 0.5, 2.0];
    let dot = |w: &[f32]| vec![w.iter().zip(&x).map(|(a, b)| a * b).sum::<f32>()];
    for (side, moment, written, weight) in [
        (
            "bench",
            [1e-9f32, -2e-9, 1e-9, 3e-9],
            WRITTEN[0],
            &WRITTEN[0][..],
        ),
        ("cmp", [4e-9f32, 1e-9, -1e-9, 2e-9], WRITTEN[1], read_c),
    ] {
        let denom = moment.map(|m| m.abs() + 1e-8);
        let update = op_record(
            "Tensor.addcdiv_.0.forward",
            &[
                ("input.0", "input", before.to_vec()),
                ("input.1", "input", moment.to_vec()),
                ("input.2", "input", denom.to_vec()),
                ("output.0", "output", written.to_vec()),
            ],
        );
        let dir = t.path().join(side);
        write_op_log_at(&dir, "step0", "rank0", "statistics", vec![update]);
        let linear = op_record(
            "Functional.linear.0.forward",
            &[
                ("input.0", "input", x.to_vec()),
                ("input.1", "input", weight.to_vec()),
                ("output.0", "output", dot(weight)),
            ],
        );
        write_op_log_at(&dir, "step1", "rank0", "statistics", vec![linear]);
    }
    let (b, c) = (t.path().join("bench"), t.path().join("cmp"));
    let o = compare_paths(&b, &c, &t.path().join("out"), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    // The finding's title on stdout says which it is.
    let carried = s["external_source"]["forward"].get("carried").is_some();
    let title = if carried {
        "divergence enters with the previous step's value (forward): Functional.linear.0.forward"
    } else {
        "divergence enters from outside (forward): Functional.linear.0.forward"
    };
    assert!(o.stdout.contains(title), "{}", o.stdout);
    s
}

/// The weight step 1 reads is, in each run, what step 0's update wrote there (the same
/// statistics, bit for bit), and that update's difference was rounding noise it amplified
/// (a warning). It had read "enters from outside the captured ops ... a weight by the
/// optimizer's update or its hyperparameters, a data batch by the loader's order or seed",
/// sending people to their configuration: on a GPU against a CPU, Adam's update of a
/// convolution bias that BatchNorm follows does this in `examples/train_ddp.py`.
#[test]
fn a_weight_an_update_wrote_from_amplified_noise_is_not_from_outside() {
    let s = carried_update(&WRITTEN[1]);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "DIVERGENCE from amplified rounding noise: Functional.linear.0.forward.input.1 \
             (input of Functional.linear.0.forward, step1/rank0) is the value \
             Tensor.addcdiv_.0.forward wrote in step0/rank0 (the same statistics in both runs)"
        ),
        "{h}"
    );
    assert!(h.ends_with("no captured op is at fault"), "{h}");
    let e = &s["external_source"]["forward"]["carried"];
    assert_eq!(e["step"], "step0", "{e:#}");
    assert_eq!(e["op"], "Tensor.addcdiv_.0.forward", "{e:#}");
    assert_eq!(e["tensor"], "Tensor.addcdiv_.0.forward.output.0", "{e:#}");
    // Step 0: the update's output is a warning (amplified noise), nothing an error.
    let p = &s["pairs"][0];
    assert_eq!(p["step"], "step0");
    assert_eq!(
        (p["errors"].as_u64(), p["warnings"].as_u64()),
        (Some(0), Some(1))
    );

    // A weight that is not what the update wrote in one run (something outside the
    // captured ops changed it between the steps) reads as before.
    let s = carried_update(&[0.0995, 0.201, -0.301, 0.399]);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "DIVERGENCE enters from outside the captured ops: Functional.linear.0.forward.input.1"
        ) && h.contains("step0/rank0 compared without error, so it changed between the steps"),
        "{h}"
    );
    assert!(
        s["external_source"]["forward"].get("carried").is_none(),
        "{s:#}"
    );
}

/// One step of one rank whose only op, `op`, reads a parameter, a moment and its root
/// (`input.0..2`) and writes `written` (bench, cmp): the moment and root are `moment` in the
/// benchmark and `moment_c` in the comparison run. The summary.
fn one_update(op: &str, moment_c: [f32; 4], written: [[f32; 4]; 2]) -> (i32, serde_json::Value) {
    let t = tempfile::tempdir().unwrap();
    let before = [0.0f32; 4];
    let moment = [2e-3f32, -1e-3, 3e-3, 1e-3];
    for (side, m, w) in [("bench", moment, written[0]), ("cmp", moment_c, written[1])] {
        let root = m.map(|v| v.abs() + 1e-8);
        let rec = op_record(
            op,
            &[
                ("input.0", "input", before.to_vec()),
                ("input.1", "input", m.to_vec()),
                ("input.2", "input", root.to_vec()),
                ("output.0", "output", w.to_vec()),
            ],
        );
        write_op_log_at(
            &t.path().join(side),
            "step0",
            "rank0",
            "statistics",
            vec![rec],
        );
    }
    let (b, c) = (t.path().join("bench"), t.path().join("cmp"));
    let o = compare_paths(&b, &c, &t.path().join("out"), &[]);
    (o.code, summary(t.path()))
}

/// Adam's update normalises each gradient element to about ±lr: an element near zero whose
/// sign the runs' rounding tips moves the output by 2·lr. Moments that differ within
/// tolerance (a relative 2e-5 here) then move the update's mean by a third: amplified
/// rounding, a warning, no culprit (a correct bfloat16 port of GPT-NeoX had its first
/// `addcdiv_` of a zero bias named). With equal inputs the same difference is the op's own,
/// and an op that does not normalise (`mul_`) is named with differing inputs too.
#[test]
fn a_normalised_update_of_inputs_that_differ_within_tolerance_is_no_culprit() {
    let lr = 1e-3f32;
    let written = [[lr, -lr, lr, lr], [lr, -lr, lr, -lr]];
    let tipped = [2e-3f32, -1e-3, 3e-3, 1.00002e-3];
    let (code, s) = one_update("Tensor.addcdiv_.0.forward", tipped, written);
    assert!(s["first_divergent"]["forward"].is_null(), "{s:#}");
    let p = &s["pairs"][0];
    assert_eq!(
        (p["errors"].as_u64(), p["warnings"].as_u64()),
        (Some(0), Some(1)),
        "{p:#}"
    );
    assert_eq!(code, 0, "{}", s["headline"]);

    // The same inputs on both sides: the op's own error.
    let equal = [2e-3f32, -1e-3, 3e-3, 1e-3];
    let (code, s) = one_update("Tensor.addcdiv_.0.forward", equal, written);
    assert_eq!(code, 1, "{}", s["headline"]);
    assert_eq!(
        s["first_divergent"]["forward"]["op"], "Tensor.addcdiv_.0.forward",
        "{s:#}"
    );

    // An op that does not normalise is judged by its gain as ever.
    let (code, s) = one_update("Tensor.mul_.0.forward", tipped, written);
    assert_eq!(code, 1, "{}", s["headline"]);
    assert_eq!(
        s["first_divergent"]["forward"]["op"], "Tensor.mul_.0.forward",
        "{s:#}"
    );
}
