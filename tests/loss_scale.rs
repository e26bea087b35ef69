//! Loss scaling (AMP's GradScaler, a static loss_scale): one run's gradients a power of two
//! times the other's are compared divided by it, and said; a ratio that is no power of two,
//! or a gradient that differs beyond the scale, is still a divergence.

use crate::common;
use common::dumps::loss_scale_records as records;
use common::*;
use std::path::Path;

/// A one-rank run: `gelu` forward, then its backward and a parameter gradient, with every
/// gradient times `scale` and the parameter gradient also times `extra`.
fn run(dir: &Path, scale: f32, extra: f32) {
    write_op_log(dir, records(scale, extra));
}

#[test]
fn the_one_sided_scalers_arithmetic_is_accounted_for_not_missing() {
    // The port scales its loss (GradScaler: the loss times the scale, the scale's reciprocal
    // to unscale with); the GPU run does not. Those calls have no counterpart by nature: on
    // a small step they made the pair "not compared in full". A one-sided scalar op that
    // does not hold the scale is still missing.
    let d = tempfile::tempdir().unwrap();
    run(&d.path().join("bench"), 1.0, 1.0);
    let scalar = |v: f32| vec![v];
    let scaler = || {
        [
            op_record(
                "Tensor.__mul__.0.forward",
                &[
                    ("input.0", "input", scalar(1.5)),
                    ("input.1", "input", scalar(1024.0)),
                    ("output.0", "output", scalar(1536.0)),
                ],
            ),
            op_record(
                "Tensor.reciprocal.0.forward",
                &[
                    ("input.0", "input", scalar(1024.0)),
                    ("output.0", "output", scalar(1.0 / 1024.0)),
                ],
            ),
            op_record(
                "Tensor.__mul__.1.forward",
                &[
                    ("input.0", "input", scalar(1.5)),
                    ("input.1", "input", scalar(3.0)),
                    ("output.0", "output", scalar(4.5)),
                ],
            ),
        ]
    };
    let mut cmp = records(1024.0, 1.0);
    cmp.splice(1..1, scaler());
    write_op_log(&d.path().join("cmp"), cmp);
    let o = compare(d.path(), &["--max-unmatched", "0.5"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(s["counts"]["loss_scaler"], 5, "{}", s["counts"]);
    assert_eq!(s["counts"]["unmatched_cmp"], 3, "{}", s["counts"]);
    assert_eq!(s["pairs"][0]["loss_scale"]["ratio"], 1024.0);
    // The same calls where the gradients agree (no loss scale) are plain unmatched tensors.
    let e = tempfile::tempdir().unwrap();
    run(&e.path().join("bench"), 1.0, 1.0);
    let mut plain = records(1.0, 1.0);
    plain.splice(1..1, scaler());
    write_op_log(&e.path().join("cmp"), plain);
    compare(e.path(), &["--max-unmatched", "0.9"]);
    let s = summary(e.path());
    assert_eq!(s["counts"]["loss_scaler"], 0, "{}", s["counts"]);
    assert_eq!(s["counts"]["unmatched_cmp"], 8, "{}", s["counts"]);
}

#[test]
fn gradients_a_power_of_two_apart_are_compared_divided_by_it() {
    let d = tempfile::tempdir().unwrap();
    run(&d.path().join("bench"), 1.0, 1.0);
    run(&d.path().join("cmp"), 1024.0, 1.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(s["verdict"], "pass", "{}", s["headline"]);
    assert_eq!(s["counts"]["pass"], s["counts"]["tensors"]);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.ends_with("; the cmp run's gradients are 1024x (2^10) the bench's (a loss scale): compared divided by it"),
        "{h}"
    );
    let p = &s["pairs"][0]["loss_scale"];
    assert_eq!(p["ratio"], 1024.0);
    assert_eq!(p["at"], "Functional.gelu.0.backward");
    assert!(o.stderr.contains("a loss scale"), "{}", o.stderr);
    // The bench scaled instead: the same, the other way round.
    let e = tempfile::tempdir().unwrap();
    run(&e.path().join("bench"), 65536.0, 1.0);
    run(&e.path().join("cmp"), 1.0, 1.0);
    let o = compare(e.path(), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        summary(e.path())["pairs"][0]["loss_scale"]["ratio"],
        1.0 / 65536.0
    );
}

#[test]
fn a_ratio_that_is_no_power_of_two_is_a_divergence() {
    let d = tempfile::tempdir().unwrap();
    run(&d.path().join("bench"), 1.0, 1.0);
    run(&d.path().join("cmp"), 3.0, 1.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert!(
        s["pairs"][0].get("loss_scale").is_none(),
        "{}",
        s["pairs"][0]
    );
    assert!(!s["headline"].as_str().unwrap().contains("loss scale"));
}

#[test]
fn a_gradient_that_differs_beyond_the_scale_is_still_found() {
    let d = tempfile::tempdir().unwrap();
    run(&d.path().join("bench"), 1.0, 1.0);
    // The weight's gradient 10 % off, after the scale is taken out.
    run(&d.path().join("cmp"), 1024.0, 1.1);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(s["counts"]["error"], 1, "{}", s["headline"]);
    assert_eq!(
        s["worst_ops"][0]["tensor"],
        "Module.fc.Linear.parameters_grad.weight"
    );
    assert!(s["headline"].as_str().unwrap().contains("a loss scale"));
}

#[test]
fn the_update_a_loss_scaler_skipped_is_accounted_for_not_missing() {
    // The port's scaler found an overflow and skipped the optimizer step: the benchmark's
    // update (after its last backward) has no counterpart, by the skip. A bench-only call
    // before the backward is still missing.
    let d = tempfile::tempdir().unwrap();
    let mut bench = records(1.0, 1.0);
    bench.insert(
        1,
        op_record(
            "Functional.relu.0.forward",
            &[
                ("input.0", "input", vec![1.0]),
                ("output.0", "output", vec![1.0]),
            ],
        ),
    );
    bench.push(op_record(
        "Tensor.addcdiv_.0.forward",
        &[
            ("input.0", "input", vec![0.5, 0.25]),
            ("output.0", "output", vec![0.4, 0.2]),
        ],
    ));
    write_op_log(&d.path().join("bench"), bench);
    let mut cmp = records(1024.0, 1.0);
    cmp.pop(); // the update the scaler skipped
    cmp.push(op_record(
        "Torch._amp_update_scale_.0.forward",
        &[
            ("input.0", "input", vec![1024.0]),
            ("input.1", "input", vec![0.0]),
            ("input.2", "input", vec![1.0]),
        ],
    ));
    write_op_log(&d.path().join("cmp"), cmp);
    compare(d.path(), &["--max-unmatched", "0.9"]);
    let s = summary(d.path());
    assert_eq!(s["pairs"][0]["scaler_skipped"], "cmp", "{}", s["headline"]);
    // add_ (2 tensors) and addcdiv_ (2) are the skipped update; relu (2) is missing.
    assert_eq!(s["counts"]["loss_scaler"], 4, "{}", s["counts"]);
    assert_eq!(s["counts"]["unmatched_bench"], 2, "{}", s["counts"]);
}

/// Before the step's own calls, a forward on memory nothing had written (PyTorch's
/// pipeline stages infer their shapes on `torch.empty` inputs) and its backward: leftover
/// bytes, other in each run, whose gradients here happen to be 1024 times apart. They tell
/// no loss scale: the runs' real gradients are equal and must compare as they are. (Read as
/// a scale of 2^15 once, every gradient of a pipeline stage's step was divided by it and 76
/// tensors failed: `test_distributed.py::test_pipeline_runs_compare_equal_and_a_garbled_transfer_is_named`.)
#[test]
fn gradients_computed_from_leftover_bytes_tell_no_loss_scale() {
    let d = tempfile::tempdir().unwrap();
    for (side, garbage) in [("bench", 1.0f32), ("cmp", 1024.0)] {
        let leftovers: Vec<f32> = [3.0f32, -7.5, 1.25, 9.0]
            .iter()
            .map(|v| v * garbage)
            .collect();
        let mut infer = op_record(
            "Functional.relu.0.forward",
            &[
                ("input.0", "input", leftovers.clone()),
                (
                    "output.0",
                    "output",
                    leftovers.iter().map(|v| v.max(0.0)).collect(),
                ),
            ],
        );
        infer.tensors[0].unwritten = true;
        infer.tensors[0].stats = None;
        let back = op_record(
            "Functional.relu.0.backward",
            &[
                ("input.0", "input", leftovers.clone()),
                ("output.0", "output", leftovers),
            ],
        );
        let mut ops = vec![infer, back];
        ops.extend(records(1.0, 1.0));
        write_op_log(&d.path().join(side), ops);
    }
    let o = compare(d.path(), &[]);
    let s = summary(d.path());
    assert!(
        s["pairs"][0].get("loss_scale").is_none(),
        "{:#}",
        s["pairs"][0]
    );
    assert_eq!(s["counts"]["error"], 0, "{}", s["headline"]);
    // What the leftovers gave is not compared, so the pair is incomplete (exit 4).
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    assert!(
        s["headline"]
            .as_str()
            .unwrap()
            .contains("computed from leftover bytes both runs read"),
        "{}",
        s["headline"]
    );
}
