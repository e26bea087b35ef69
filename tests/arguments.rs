//! An op called with different non-tensor arguments (`args` in probe's op log, typed
//! non-tensor leaves in msprobe's `dump.json`): where its tensors agree and its output
//! differs, the arguments are named as the cause; devices, and the same value under another
//! slot, are not a difference; an argument one run passed and the other did not is said
//! where the op is named, and nowhere else.

use crate::common;
use common::*;
use probe::schema::dump::OpRecord;
use serde_json::{json, Value};
use std::path::Path;

/// `op_record` with `args`.
fn op(key: &str, tensors: &[Tensor], args: Value) -> OpRecord {
    let mut r = op_record(key, tensors);
    r.args = match args {
        Value::Object(m) => Some(m),
        _ => None,
    };
    r
}

/// A one-rank run: `x * scale` (the scale recorded as `mul`'s argument `input.1`, plus
/// `extra` arguments), then that plus one.
fn run(dir: &Path, scale: f32, mut args: Value, extra: Value) {
    let x = vec![1.0f32, -2.0, 3.0, 0.5];
    let y: Vec<f32> = x.iter().map(|v| v * scale).collect();
    let z: Vec<f32> = y.iter().map(|v| v + 1.0).collect();
    if let (Some(a), Value::Object(e)) = (args.as_object_mut(), extra) {
        a.extend(e);
    }
    write_op_log(
        dir,
        vec![
            op(
                "Tensor.mul.0.forward",
                &[("input.0", "input", x), ("output.0", "output", y.clone())],
                args,
            ),
            op(
                "Tensor.add.0.forward",
                &[("input.0", "input", y), ("output.0", "output", z)],
                json!({"input.1": 1}),
            ),
        ],
    );
}

#[test]
fn an_argument_that_differs_is_named_as_the_cause() {
    let d = tempfile::tempdir().unwrap();
    run(
        &d.path().join("bench"),
        2.0,
        json!({"input.1": 2.0}),
        json!({}),
    );
    run(
        &d.path().join("cmp"),
        3.0,
        json!({"input.1": 3.0}),
        json!({}),
    );
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("first divergent op Tensor.mul.0.forward")
            && h.ends_with("it was called with different arguments (input.1 = 2.0 vs 3.0)"),
        "{h}"
    );
    let f = &s["first_divergent"]["forward"];
    assert_eq!(
        f["args"],
        json!([{"name": "input.1", "bench": "2.0", "cmp": "3.0"}])
    );
    let e = f["explanation"].as_str().unwrap();
    assert!(
        e.contains("different non-tensor arguments (input.1 = 2.0 vs 3.0"),
        "{e}"
    );
    // The downstream op's own argument agrees: it is not named.
    assert!(!h.contains("Tensor.add"), "{h}");
}

#[test]
fn one_argument_by_keyword_and_by_position_and_devices_are_no_difference() {
    let d = tempfile::tempdir().unwrap();
    // The same scale, the same `1` by keyword in one run and by position in the other; the
    // output differs for another reason (a faulty kernel).
    run(
        &d.path().join("bench"),
        2.0,
        json!({"input.1": 2.0}),
        json!({"input.device": "cuda:0", "input.dim": 1}),
    );
    run(
        &d.path().join("cmp"),
        2.5,
        json!({"input.1": 2}),
        json!({"input.device": "npu:0", "input.2": 1}),
    );
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("first divergent op Tensor.mul.0.forward"), "{h}");
    assert!(!h.contains("arguments"), "{h}");
    let f = &s["first_divergent"]["forward"];
    assert!(f.get("args").is_none(), "{f}");
    assert!(
        f["explanation"]
            .as_str()
            .unwrap()
            .contains("the error is local to this op"),
        "{f}"
    );
}

#[test]
fn an_argument_that_differs_where_outputs_agree_changes_no_verdict() {
    let d = tempfile::tempdir().unwrap();
    run(
        &d.path().join("bench"),
        2.0,
        json!({"input.1": 2.0}),
        json!({"input.rounding_mode": "floor"}),
    );
    run(
        &d.path().join("cmp"),
        2.0,
        json!({"input.1": 2.0}),
        json!({"input.rounding_mode": "trunc"}),
    );
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(s["verdict"], "pass");
    // Said, as a hint: the call differs though its outputs agree.
    assert!(
        s["headline"].as_str().unwrap().ends_with(
            "; Tensor.mul.0.forward (step0/rank0) was called with different arguments \
             (input.rounding_mode = \"floor\" vs \"trunc\")"
        ),
        "{}",
        s["headline"]
    );
    let f = &s["other_args"];
    assert_eq!(f["op"], "Tensor.mul.0.forward", "{f}");
    assert!(
        f["explanation"]
            .as_str()
            .unwrap()
            .starts_with("the only op of step0/rank0"),
        "{f}"
    );
    assert!(
        o.stdout
            .contains("first op called with different arguments: Tensor.mul.0.forward"),
        "{}",
        o.stdout
    );
}

/// A one-rank msprobe statistics dump: `layer_norm` called with `eps` as a keyword, its
/// output's statistics `out`.
fn msprobe_run(dir: &Path, eps: f64, out: [f64; 4]) {
    let rank = dir.join("step0").join("rank0");
    std::fs::create_dir_all(&rank).unwrap();
    let leaf = |s: [f64; 4]| {
        json!({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 8],
               "Max": s[0], "Min": s[1], "Mean": s[2], "Norm": s[3], "requires_grad": false})
    };
    let dump = json!({
        "task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null,
        "data": {
            "Functional.layer_norm.0.forward": {
                "input_args": [leaf([3.0, -3.0, 0.1, 9.0]), [{"type": "int", "value": 8}]],
                "input_kwargs": {
                    "eps": {"type": "float", "value": eps},
                    "device": {"type": "torch.device", "value": "cuda:0"}
                },
                "output": [leaf(out)]
            }
        }
    });
    std::fs::write(rank.join("dump.json"), dump.to_string()).unwrap();
}

#[test]
fn msprobe_dumps_name_the_argument_too() {
    let d = tempfile::tempdir().unwrap();
    msprobe_run(&d.path().join("bench"), 1e-5, [1.7, -1.7, 0.0, 5.65]);
    msprobe_run(&d.path().join("cmp"), 0.1, [1.5, -1.5, 0.0, 5.1]);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("Functional.layer_norm.0.forward") && h.ends_with("(input.eps = 1e-5 vs 0.1)"),
        "{h}"
    );
    // The normalized shape (a tuple of ints) is the same on both sides; the device is not
    // an argument that can differ.
    assert_eq!(
        s["first_divergent"]["forward"]["args"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn args_that_are_not_an_object_are_a_bad_record() {
    let d = tempfile::tempdir().unwrap();
    run(
        &d.path().join("bench"),
        2.0,
        json!({"input.1": 2.0}),
        json!({}),
    );
    run(
        &d.path().join("cmp"),
        2.0,
        json!({"input.1": 2.0}),
        json!({}),
    );
    let log = d
        .path()
        .join("cmp")
        .join("step0")
        .join("rank0")
        .join("ops.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(
        &log,
        text.replacen(r#""args":{"input.1":2.0}"#, r#""args":[2.0]"#, 1),
    )
    .unwrap();
    let o = compare(d.path(), &[]);
    assert_input_error(&o, 2, "ops.jsonl:1: bad op record");
}

#[test]
fn accumulated_drift_ends_with_the_call_that_differs() {
    // `mul` by 2 against 2.00001 (5e-6 apart: within tolerance), then two subtractions
    // that each amplify the difference 8 times (under `local_gain`): errors, and no op
    // locally divergent.
    let d = tempfile::tempdir().unwrap();
    // (The argument as the agent records a Python float: a double.)
    for (side, scale, arg) in [("bench", 2.0f32, 2.0f64), ("cmp", 2.00001, 2.00001)] {
        let x = vec![1.0f32, 2.0, 3.0, 4.0];
        let y: Vec<f32> = x.iter().map(|v| v * scale).collect();
        let c1: Vec<f32> = x.iter().map(|v| v * 2.0 * 0.875).collect();
        let z: Vec<f32> = y.iter().zip(&c1).map(|(a, b)| a - b).collect();
        let c2: Vec<f32> = x.iter().map(|v| v * 0.25 * 0.875).collect();
        let w: Vec<f32> = z.iter().zip(&c2).map(|(a, b)| a - b).collect();
        write_op_log(
            &d.path().join(side),
            vec![
                op(
                    "Tensor.mul.0.forward",
                    &[("input.0", "input", x), ("output.0", "output", y.clone())],
                    json!({"input.1": arg}),
                ),
                op(
                    "Tensor.sub.0.forward",
                    &[
                        ("input.0", "input", y),
                        ("input.1", "input", c1),
                        ("output.0", "output", z.clone()),
                    ],
                    json!({}),
                ),
                op(
                    "Tensor.sub.1.forward",
                    &[
                        ("input.0", "input", z),
                        ("input.1", "input", c2),
                        ("output.0", "output", w),
                    ],
                    json!({}),
                ),
            ],
        );
    }
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("accumulated drift"), "{h}");
    assert!(
        h.ends_with(
            "; Tensor.mul.0.forward (step0/rank0) was called with different arguments \
             (input.1 = 2.0 vs 2.00001)"
        ),
        "{h}"
    );
    assert_eq!(s["other_args"]["args"][0]["cmp"], "2.00001");
}

/// The benchmark's `x * 2.0` against the comparison run's `x * scale` that also passes
/// `out_dtype`, compared: the exit code and the summary (the folder lives as long as the
/// first).
fn out_dtype_only_in_cmp(scale: f32) -> (tempfile::TempDir, i32, Value) {
    let d = tempfile::tempdir().unwrap();
    run(
        &d.path().join("bench"),
        2.0,
        json!({"input.1": 2.0}),
        json!({}),
    );
    let extra = json!({"input.out_dtype": "torch.float32"});
    run(&d.path().join("cmp"), scale, json!({"input.1": 2.0}), extra);
    let o = compare(d.path(), &[]);
    let s = summary(d.path());
    (d, o.code, s)
}

#[test]
fn an_argument_only_one_run_passed_is_said_where_the_op_is_named() {
    let (_d, code, s) = out_dtype_only_in_cmp(2.5);
    assert_eq!(code, 1, "{s}");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.ends_with(
            r#"it was called with different arguments (input.out_dtype = (not passed) vs "torch.float32")"#
        ),
        "{h}"
    );
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["args"][0]["bench"], "(not passed)", "{f}");
    let e = f["explanation"].as_str().unwrap();
    assert!(
        e.contains("one run passed an argument the other did not"),
        "{e}"
    );
    // Where outputs agree it is no hint: an explicit default would only be noise.
    let (_d, code, s) = out_dtype_only_in_cmp(2.0);
    assert_eq!(code, 0, "{s}");
    assert!(s["other_args"].is_null());
    // Where they differ within tolerance (a warning) it is the hint.
    let (_d, code, s) = out_dtype_only_in_cmp(2.00004);
    assert_eq!((code, s["verdict"].as_str()), (0, Some("warning")), "{s}");
    assert_eq!(s["other_args"]["args"][0]["name"], "input.out_dtype", "{s}");
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("was called with different arguments"), "{h}");
}
