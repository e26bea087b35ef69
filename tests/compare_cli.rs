//! End-to-end tests of `probe compare` on real dump files: verdicts, the first divergent
//! operator, exit codes and the three report files read back.

use crate::common;
use common::*;
use std::path::Path;

fn op_of(s: &serde_json::Value, path: &[&str]) -> Option<String> {
    let mut v = s;
    for p in path {
        v = v.get(p)?;
    }
    v.get("op").and_then(|o| o.as_str()).map(String::from)
}

#[test]
fn bundled_demo_names_the_injected_op_and_exits_1() {
    let t = tempfile::tempdir().unwrap();
    let demo = root().join("testdata/demo");
    let out = t.path().join("out");
    let o = probe(&[
        "compare",
        "-b",
        demo.join("bench").to_str().unwrap(),
        "-c",
        demo.join("cmp").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stdout.contains("Functional.gelu.1.forward"),
        "{}",
        o.stdout
    );
    let s = summary(t.path());
    assert_eq!(s["verdict"], "error");
    assert_eq!(s["exit_code"], 1);
    assert_eq!(
        op_of(&s, &["first_divergent", "forward"]).as_deref(),
        Some("Functional.gelu.1.forward")
    );
    assert!(s["external_source"]["forward"].is_null());
    // Everything before the injected op agrees; the earliest failing op is the culprit itself.
    assert_eq!(
        op_of(&s, &["earliest_failing", "forward"]).as_deref(),
        Some("Functional.gelu.1.forward")
    );
    let fd = &s["first_divergent"]["forward"];
    assert!(fd["explanation"].as_str().unwrap().contains("identical"));
    assert!(!fd["stack"].as_array().unwrap().is_empty());
    assert_eq!(s["counts"]["unmatched_bench"], 0);
    assert_eq!(s["counts"]["unmatched_cmp"], 0);
}

#[test]
fn bundled_demo_is_what_the_generator_writes() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), DEMO_SYNTH_ARGS);
    for side in ["bench", "cmp"] {
        for f in [
            "manifest.json",
            "step0/rank0/ops.jsonl",
            "step0/rank0/stacks.jsonl",
            "step0/rank0/tensors-00000.safetensors",
        ] {
            let a = std::fs::read(root().join("testdata/demo").join(side).join(f)).unwrap();
            let b = std::fs::read(t.path().join(side).join(f)).unwrap();
            assert!(
                a == b,
                "testdata/demo/{side}/{f} differs from testdata/generate.sh's output"
            );
        }
    }
}

#[test]
fn identical_runs_pass_with_exit_0() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "2"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    let s = summary(t.path());
    assert_eq!(s["verdict"], "pass");
    assert_eq!(s["counts"]["error"], 0);
    assert_eq!(s["counts"]["warning"], 0);
    assert_eq!(s["counts"]["pairs"], 2);
    assert!(s["first_divergent"]["forward"].is_null());
    assert!(s["first_divergent"]["backward"].is_null());
    assert!(o.stdout.starts_with("PASS"));
}

#[test]
fn cross_device_jitter_is_not_a_divergence() {
    // 1e-7 relative noise on every op output: float32 rounding-level differences.
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--noise", "1e-7", "--blocks", "4"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert_eq!(summary(t.path())["counts"]["error"], 0);
}

#[test]
fn bf16_run_against_fp32_blames_the_injected_op_only() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--bf16"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "bf16 rounding alone must pass: {}", o.stdout);

    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--bf16",
            "--inject",
            "Functional.linear.3",
            "--inject-scale",
            "0.3",
        ],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert_eq!(
        op_of(&s, &["first_divergent", "forward"]).as_deref(),
        Some("Functional.linear.3.forward")
    );
}

#[test]
fn perturbed_weight_is_reported_as_entering_from_outside() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--perturb-weight", "1"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    let ext = &s["external_source"]["forward"];
    assert_eq!(ext["tensor"], "Functional.linear.2.forward.input.1");
    assert_eq!(ext["op"], "Functional.linear.2.forward");
    // linear.2 consumed a bad weight: it is not a local culprit.
    assert_ne!(
        op_of(&s, &["first_divergent", "forward"]).as_deref(),
        Some("Functional.linear.2.forward")
    );
    assert!(s["headline"].as_str().unwrap().contains("outside"));
}

#[test]
fn first_nan_producer_is_named() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--nan", "Torch.add.1"]);
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert_eq!(s["first_nonfinite"]["op"], "Torch.add.1.forward");
    assert_eq!(
        s["first_nonfinite"]["tensor"],
        "Torch.add.1.forward.output.0"
    );
}

#[test]
fn statistics_and_checksum_modes_find_the_same_culprit() {
    for mode in ["statistics", "checksum"] {
        let t = tempfile::tempdir().unwrap();
        synth(
            t.path(),
            &["--mode", mode, "--inject", "Functional.linear.3"],
        );
        let o = compare(t.path(), &[]);
        assert_eq!(o.code, 1, "{mode}: {}", o.stdout);
        let s = summary(t.path());
        assert_eq!(
            op_of(&s, &["first_divergent", "forward"]).as_deref(),
            Some("Functional.linear.3.forward"),
            "{mode}"
        );
        assert_eq!(
            s["counts"]["compared_by"][mode].as_u64().unwrap(),
            s["counts"]["tensors"].as_u64().unwrap()
        );
        // Identical runs pass in this mode too.
        let t = tempfile::tempdir().unwrap();
        synth(t.path(), &["--mode", mode]);
        assert_eq!(compare(t.path(), &[]).code, 0, "{mode}");
    }
}

#[test]
fn fail_on_controls_the_exit_code() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--inject", "Functional.gelu.0"]);
    assert_eq!(compare(t.path(), &["--fail-on", "never"]).code, 0);
    assert_eq!(compare(t.path(), &["--fail-on", "error"]).code, 1);
    // Warnings only: relative noise between float32's warning and error thresholds.
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--inject",
            "Torch.add.2",
            "--inject-scale",
            "4e-5",
            "--blocks",
            "3",
        ],
    );
    let s0 = compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["counts"]["error"], 0, "{}", s0.stdout);
    assert!(s["counts"]["warning"].as_u64().unwrap() > 0);
    assert_eq!(s0.code, 0);
    assert_eq!(compare(t.path(), &["--fail-on", "warning"]).code, 1);
}

#[test]
fn step_and_rank_folders_are_accepted_and_paired() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "2", "--inject", "Functional.gelu.2"]);
    let b = t.path().join("bench/step1");
    let c = t.path().join("cmp/step1/rank0");
    let out = t.path().join("o2");
    let o = probe(&[
        "compare",
        "-b",
        b.to_str().unwrap(),
        "-c",
        c.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["counts"]["pairs"], 1);
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Functional.gelu.2.forward"
    );
    // Whole roots: both steps compared, each names the culprit.
    compare(t.path(), &[]);
    let s = summary(t.path());
    let pairs = s["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    for p in pairs {
        assert_eq!(
            p["findings"]["first_divergent"]["forward"]["op"],
            "Functional.gelu.2.forward"
        );
    }
}

fn drop_op_line(rank_dir: &Path, op: &str) {
    let p = rank_dir.join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains(&format!("\"op\":\"{op}\"")))
        .collect();
    assert!(kept.len() < text.lines().count());
    std::fs::write(&p, kept.join("\n") + "\n").unwrap();
}

#[test]
fn unmatched_tensors_are_reported_on_both_sides_never_as_pass() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    drop_op_line(
        &t.path().join("cmp/step0/rank0"),
        "Functional.gelu.1.forward",
    );
    drop_op_line(&t.path().join("bench/step0/rank0"), "Torch.add.0.forward");
    let o = compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(s["counts"]["unmatched_bench"], 2, "gelu.1: input + output");
    assert_eq!(
        s["counts"]["unmatched_cmp"], 3,
        "add.0: two inputs + output"
    );
    assert_eq!(s["verdict"], "warning");
    assert_eq!(o.code, 0);
    assert_eq!(compare(t.path(), &["--fail-on", "warning"]).code, 1);
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--inject",
            "Functional.gelu.1",
            "--width",
            "64",
            "--batch",
            "1100",
            "--blocks",
            "2",
        ],
    );
    let mut files = Vec::new();
    for n in ["1", "2", "3"] {
        compare(t.path(), &["--threads", n, "--format", "json,parquet"]);
        let out = t.path().join("out");
        files.push((
            std::fs::read(out.join("summary.json")).unwrap(),
            std::fs::read(out.join("compare.parquet")).unwrap(),
        ));
    }
    assert!(files[0] == files[1] && files[1] == files[2]);
}

#[test]
fn backward_calls_are_matched_by_occurrence() {
    // Renumber the cmp side's backward call counters (as recomputation would shift them).
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics"]);
    let p = t.path().join("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let shifted = text
        .replace("Functional.gelu.2.backward", "Functional.gelu.7.backward")
        .replace("Functional.gelu.1.backward", "Functional.gelu.8.backward")
        .replace("Functional.gelu.0.backward", "Functional.gelu.9.backward");
    std::fs::write(&p, shifted).unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    let s = summary(t.path());
    assert_eq!(s["counts"]["unmatched_cmp"], 0);
}
