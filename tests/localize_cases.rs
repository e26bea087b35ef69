//! The localiser on hand-written statistics dumps, one per failure mode of naive
//! "first failing row" verdicts (see docs/compare.md).

mod common;
use common::*;
use serde_json::json;
use std::path::Path;

/// An op: key, inputs and outputs as (name suffix, mean value, src id, id).
struct Op<'a> {
    key: &'a str,
    inputs: Vec<(f64, Option<u64>)>,
    outputs: Vec<(f64, u64)>,
}

fn stats(v: f64) -> serde_json::Value {
    // A tensor of 100 equal values v: max = min = mean = v, norm = 10|v|.
    json!({"max": v, "min": v, "mean": v, "norm": 10.0 * v.abs(), "nan": 0, "inf": 0})
}

fn write_side(dir: &Path, ops: &[Op]) {
    let rank = dir.join("step0/rank0");
    std::fs::create_dir_all(&rank).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        json!({"format": "probe-dump", "version": 1, "framework": "pytorch", "device": "cpu",
               "mode": "statistics", "level": "api", "created": "2026-01-01T00:00:00Z"})
        .to_string(),
    )
    .unwrap();
    let mut text = String::new();
    for (seq, op) in ops.iter().enumerate() {
        let mut tensors = Vec::new();
        for (i, (v, src)) in op.inputs.iter().enumerate() {
            tensors.push(
                json!({"name": format!("{}.input.{i}", op.key), "role": "input",
                "dtype": "float32", "shape": [100], "stats": stats(*v), "src": src}),
            );
        }
        for (i, (v, id)) in op.outputs.iter().enumerate() {
            tensors.push(
                json!({"name": format!("{}.output.{i}", op.key), "role": "output",
                "dtype": "float32", "shape": [100], "stats": stats(*v), "id": id}),
            );
        }
        let dir = if op.key.ends_with("backward") {
            "backward"
        } else {
            "forward"
        };
        text +=
            &json!({"seq": seq, "op": op.key, "kind": "api", "direction": dir, "tensors": tensors})
                .to_string();
        text.push('\n');
    }
    std::fs::write(rank.join("ops.jsonl"), text).unwrap();
}

/// A chain a → b → c → d of ops; `vals_b` / `vals_c` give each op's (input, output) value.
fn chain(dir: &Path, vals_b: &[(f64, f64)], vals_c: &[(f64, f64)]) {
    let keys = [
        "Torch.matmul.0.forward",
        "Functional.softmax.0.forward",
        "Torch.sub.0.forward",
        "Functional.gelu.0.forward",
    ];
    for (side, vals) in [("bench", vals_b), ("cmp", vals_c)] {
        let ops: Vec<Op> = vals
            .iter()
            .enumerate()
            .map(|(i, (vin, vout))| Op {
                key: keys[i],
                inputs: vec![(*vin, if i == 0 { None } else { Some(i as u64 - 1) })],
                outputs: vec![(*vout, i as u64)],
            })
            .collect();
        write_side(&dir.join(side), &ops);
    }
}

#[test]
fn small_local_error_with_identical_inputs_is_blamed_not_the_amplifier() {
    // matmul: identical input, output off by 5e-5 (under float32's error tolerance, far
    // beyond rounding); sub amplifies it to 5e-2. The culprit is matmul.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[
            (1.0, 2.0001),
            (2.0001, 3.00015),
            (3.00015, 4.2),
            (4.2, 5.25),
        ],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let s = summary(t.path());
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Torch.matmul.0.forward"
    );
    assert_eq!(
        s["earliest_failing"]["forward"]["op"],
        "Torch.sub.0.forward"
    );
}

#[test]
fn accumulated_error_blames_the_op_whose_output_error_jumps() {
    // Inputs of softmax differ a little (inherited), its output error is 1000x larger.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[
            (1.0000001, 2.0000004),
            (2.0000004, 3.3),
            (3.3, 4.4),
            (4.4, 5.5),
        ],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Functional.softmax.0.forward"
    );
    assert!(s["first_divergent"]["forward"]["explanation"]
        .as_str()
        .unwrap()
        .contains("within tolerance"));
}

#[test]
fn slow_drift_without_a_local_jump_blames_nobody() {
    // Every op adds a little error, none more than 10x its input error, and no op has
    // identical inputs: accumulated drift, no single culprit.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0)],
        &[
            (1.0000001, 1.0000008),
            (1.0000008, 1.000005),
            (1.000005, 1.00003),
            (1.00003, 1.0002),
        ],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert!(
        s["first_divergent"]["forward"].is_null(),
        "{}",
        s["first_divergent"]
    );
    assert!(
        s["headline"].as_str().unwrap().contains("drift"),
        "{}",
        s["headline"]
    );
    assert_eq!(
        s["earliest_failing"]["forward"]["op"],
        "Functional.gelu.0.forward"
    );
}

#[test]
fn failing_input_no_op_produced_enters_from_outside() {
    // The data batch differs: the first op's input has no producer.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[(1.5, 2.5), (2.5, 3.5), (3.5, 4.5), (4.5, 5.5)],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert_eq!(
        s["external_source"]["forward"]["tensor"],
        "Torch.matmul.0.forward.input.0"
    );
    assert!(s["first_divergent"]["forward"].is_null());
    assert!(o.stdout.contains("outside"), "{}", o.stdout);
}

#[test]
fn statistics_near_zero_do_not_explode() {
    // A mean of 1e-9 vs 3e-9 is a 200 % relative difference, but nothing against the scale.
    let t = tempfile::tempdir().unwrap();
    let key = "Functional.layer_norm.0.forward";
    for (side, mean) in [("bench", 1e-9), ("cmp", 3e-9)] {
        let ops = [Op {
            key,
            inputs: vec![(1.0, None)],
            outputs: vec![(0.0, 0)],
        }];
        write_side(&t.path().join(side), &ops);
        // Give the output realistic statistics: max 2, min -2, mean ~0, norm 10.
        let p = t.path().join(side).join("step0/rank0/ops.jsonl");
        let text = std::fs::read_to_string(&p).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        v["tensors"][1]["stats"] =
            json!({"max": 2.0, "min": -2.0, "mean": mean, "norm": 10.0, "nan": 0, "inf": 0});
        std::fs::write(&p, v.to_string() + "\n").unwrap();
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
}
