//! The localiser on hand-written statistics dumps, one per failure mode of naive
//! "first failing row" verdicts (see docs/compare.md).

use crate::common;
use common::*;
use probe::dump::OpKey;
use probe::schema::dump::{OpRecord, Stat, StatsRecord, TensorRecord};
use std::path::Path;

/// An op: key, inputs and outputs as (name suffix, mean value, src id, id).
struct Op<'a> {
    key: &'a str,
    inputs: Vec<(f64, Option<u64>)>,
    outputs: Vec<(f64, u64)>,
}

fn stats(v: f64) -> StatsRecord {
    // A tensor of 100 equal values v: max = min = mean = v, norm = 10|v|.
    StatsRecord {
        max: Stat(Some(v)),
        min: Stat(Some(v)),
        mean: Stat(Some(v)),
        norm: Stat(Some(10.0 * v.abs())),
        nan: Some(0),
        inf: Some(0),
    }
}

fn tensor(
    name: String,
    role: &str,
    dtype: &str,
    v: f64,
    src: Option<u64>,
    id: Option<u64>,
) -> TensorRecord {
    TensorRecord {
        checksum: None,
        dtype: dtype.into(),
        file: None,
        data_offsets: None,
        id,
        name,
        role: role.into(),
        shape: vec![100],
        src,
        stats: Some(stats(v)),
        unwritten: false,
        stride: None,
        offset: None,
        storage: None,
        format: None,
    }
}

fn record(key: &str, tensors: Vec<TensorRecord>) -> OpRecord {
    OpRecord {
        args: None,
        direction: OpKey::parse(key).direction().name().into(),
        kind: "api".into(),
        module: None,
        op: key.into(),
        recompute: false,
        group: None,
        coll_seq: None,
        seq: 0,
        stack: None,
        tensors,
    }
}

fn write_side(dir: &Path, ops: &[Op]) {
    let records = ops
        .iter()
        .map(|op| {
            let mut tensors: Vec<TensorRecord> = op
                .inputs
                .iter()
                .enumerate()
                .map(|(i, (v, src))| {
                    tensor(
                        format!("{}.input.{i}", op.key),
                        "input",
                        "float32",
                        *v,
                        *src,
                        None,
                    )
                })
                .collect();
            tensors.extend(op.outputs.iter().enumerate().map(|(i, (v, id))| {
                tensor(
                    format!("{}.output.{i}", op.key),
                    "output",
                    "float32",
                    *v,
                    None,
                    Some(*id),
                )
            }));
            record(op.key, tensors)
        })
        .collect();
    write_op_log(dir, records);
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
        let realistic = StatsRecord {
            max: Stat(Some(2.0)),
            min: Stat(Some(-2.0)),
            mean: Stat(Some(mean)),
            norm: Stat(Some(10.0)),
            nan: Some(0),
            inf: Some(0),
        };
        v["tensors"][1]["stats"] = serde_json::to_value(realistic).unwrap();
        std::fs::write(&p, v.to_string() + "\n").unwrap();
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
}

/// A tensor for the free-form cases: (role, dtype, value, src, id).
type Tn<'a> = (&'a str, &'a str, f64, Option<u64>, Option<u64>);

/// Writes one side from (op key, tensors) in execution order; tensors are 100 equal values.
fn write_ops(dir: &Path, ops: &[(&str, Vec<Tn>)]) {
    let records = ops
        .iter()
        .map(|(key, ts)| {
            let mut counters = std::collections::HashMap::new();
            let tensors = ts
                .iter()
                .map(|(role, dtype, v, src, id)| {
                    let slot = if *role == "output" { "output" } else { "input" };
                    let k = counters.entry(slot).or_insert(0);
                    *k += 1;
                    tensor(
                        format!("{key}.{slot}.{}", *k - 1),
                        role,
                        dtype,
                        *v,
                        *src,
                        *id,
                    )
                })
                .collect();
            record(key, tensors)
        })
        .collect();
    write_op_log(dir, records);
}

#[test]
fn float32_tensors_after_bf16_ops_get_bf16_tolerance() {
    // The cmp run computes matmul in bf16 and casts back: the float32 copy carries bf16
    // rounding (1 %), which is no divergence.
    let t = tempfile::tempdir().unwrap();
    for (side, dt, v) in [("bench", "float32", 2.0), ("cmp", "bfloat16", 2.02)] {
        write_ops(
            &t.path().join(side),
            &[
                (
                    "Torch.matmul.0.forward",
                    vec![
                        ("input", "float32", 1.0, None, None),
                        ("output", dt, v, None, Some(0)),
                    ],
                ),
                (
                    "Tensor.float.0.forward",
                    vec![
                        ("input", dt, v, Some(0), None),
                        ("output", "float32", v, None, Some(1)),
                    ],
                ),
            ],
        );
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    // Without the bf16 op before it, the same 1 % on a float32 tensor is an error.
    let t = tempfile::tempdir().unwrap();
    for (side, v) in [("bench", 2.0), ("cmp", 2.02)] {
        write_ops(
            &t.path().join(side),
            &[(
                "Tensor.float.0.forward",
                vec![
                    ("input", "float32", 1.0, None, None),
                    ("output", "float32", v, None, Some(1)),
                ],
            )],
        );
    }
    assert_eq!(compare(t.path(), &[]).code, 1);
}

#[test]
fn tensors_that_are_zero_up_to_rounding_compare_equal() {
    // A bias gradient in front of a normalisation: 1e-9 against 3e-9 is 200 % relative, but
    // far below the absolute floor (atol 1e-5 per element).
    let t = tempfile::tempdir().unwrap();
    for (side, v) in [("bench", 1e-9), ("cmp", 3e-9)] {
        write_ops(
            &t.path().join(side),
            &[(
                "Torch.sum.0.forward",
                vec![
                    ("input", "float32", 1.0, None, None),
                    ("output", "float32", v, None, Some(0)),
                ],
            )],
        );
    }
    assert_eq!(compare(t.path(), &[]).code, 0);
}

#[test]
fn optimizer_ops_after_backward_are_not_an_outside_source() {
    // The gradient differs from backward on; the optimizer's add_ consumes it after backward.
    let t = tempfile::tempdir().unwrap();
    for (side, g) in [("bench", 1.0), ("cmp", 1.5)] {
        write_ops(
            &t.path().join(side),
            &[
                (
                    "Torch.mul.0.forward",
                    vec![
                        ("input", "float32", 1.0, None, None),
                        ("output", "float32", 2.0, None, Some(0)),
                    ],
                ),
                (
                    "Torch.mul.0.backward",
                    vec![
                        ("input", "float32", 1.0, None, None),
                        ("output", "float32", g, None, None),
                    ],
                ),
                (
                    "Tensor.add_.0.forward",
                    vec![
                        ("input", "float32", 3.0, None, None),
                        ("input", "float32", g, None, None),
                        ("output", "float32", 3.0 + g, None, Some(1)),
                    ],
                ),
            ],
        );
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    assert!(
        s["external_source"]["forward"].is_null(),
        "{}",
        s["external_source"]
    );
    assert!(s["earliest_failing"]["forward"].is_null());
    assert_eq!(
        s["first_divergent"]["backward"]["op"],
        "Torch.mul.0.backward"
    );
}

#[test]
fn backward_op_with_differing_saved_activations_is_not_blamed() {
    // gelu's forward output differs (the culprit); gelu.backward gets an identical incoming
    // gradient but its saved input/output differ, so it is not local.
    let t = tempfile::tempdir().unwrap();
    for (side, y, g) in [("bench", 2.0, 0.5), ("cmp", 2.5, 0.7)] {
        write_ops(
            &t.path().join(side),
            &[
                (
                    "Functional.gelu.0.forward",
                    vec![
                        ("input", "float32", 1.0, None, None),
                        ("output", "float32", y, None, Some(0)),
                    ],
                ),
                (
                    "Functional.gelu.0.backward",
                    vec![
                        ("input", "float32", 1.0, None, None),
                        ("output", "float32", g, None, None),
                    ],
                ),
            ],
        );
    }
    compare(t.path(), &[]);
    let s = summary(t.path());
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Functional.gelu.0.forward"
    );
    assert!(
        s["first_divergent"]["backward"].is_null(),
        "{}",
        s["first_divergent"]["backward"]
    );
}

#[test]
fn headline_follows_the_earliest_step_with_an_error() {
    // Step 0 drifts (no culprit); step 1 then sees different inputs from outside. The
    // headline is about step 0: step 1 only inherits it.
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
    let s1 = tempfile::tempdir().unwrap();
    chain(
        s1.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[(1.5, 2.5), (2.5, 3.5), (3.5, 4.5), (4.5, 5.5)],
    );
    for side in ["bench", "cmp"] {
        std::fs::rename(
            s1.path().join(side).join("step0"),
            t.path().join(side).join("step1"),
        )
        .unwrap();
    }
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1);
    let s = summary(t.path());
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("step0/rank0") && h.contains("drift"), "{h}");
    assert_eq!(
        s["pairs"][1]["findings"]["external_source"]["forward"]["tensor"],
        "Torch.matmul.0.forward.input.0"
    );
}

#[test]
fn warnings_without_an_error_say_where_they_begin() {
    // softmax's output is 2e-5 off (float32: past the warning tolerance, under the error
    // one) while its input is identical; what follows inherits it. No culprit, but the
    // warnings begin at softmax, and the headline says so.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[
            (1.0, 2.0),
            (2.0, 3.00006),
            (3.00006, 4.00008),
            (4.00008, 5.0001),
        ],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    let s = summary(t.path());
    assert_eq!(s["verdict"], "warning");
    assert_eq!(s["first_warning"]["op"], "Functional.softmax.0.forward");
    assert_eq!(
        s["pairs"][0]["findings"]["first_warning"]["op"],
        "Functional.softmax.0.forward"
    );
    let headline = s["headline"].as_str().unwrap();
    assert!(
        headline.contains("the warnings begin at Functional.softmax.0.forward (step0/rank0)"),
        "{headline}"
    );
    assert!(s["first_divergent"]["forward"].is_null());

    // Where a tensor is out of tolerance, the localiser's findings speak instead.
    let t = tempfile::tempdir().unwrap();
    chain(
        t.path(),
        &[(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)],
        &[(1.0, 2.0), (2.0, 3.00006), (3.00006, 4.4), (4.4, 5.5)],
    );
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let s = summary(t.path());
    assert!(s.get("first_warning").is_none(), "{s}");
    assert!(s["pairs"][0]["findings"].get("first_warning").is_none());
}

/// Statistics of `n` values from `min` to `max` with the given mean and norm.
fn spread(min: f64, max: f64, mean: f64, norm: f64) -> StatsRecord {
    StatsRecord {
        max: Stat(Some(max)),
        min: Stat(Some(min)),
        mean: Stat(Some(mean)),
        norm: Stat(Some(norm)),
        nan: Some(0),
        inf: Some(0),
    }
}

#[test]
fn a_loss_whose_integer_target_is_large_is_still_blamed_not_drift() {
    // A cross-entropy: float32 logits [n, c] (equal on both sides), an int64 class-index
    // target [n] with values 0..c-1 (equal), a scalar loss that differs (one side smooths
    // its labels). Integer inputs are not rounded: the bound on the rounding noise of the
    // loss is k·ε·s over the logits only (k = n·c logits per loss element), far below the
    // loss. Counting the target's scale (c - 1) in it made the bound exceed the loss: the
    // loss was "rounding noise" and the phase drift. Sizes and values vary: the rule, not
    // one case.
    let eps = f32::EPSILON as f64;
    let key = "Functional.cross_entropy.0.forward";
    let mut cases = 0;
    for (n, c) in [(512usize, 512usize), (1024, 1000), (512, 2048), (4096, 300)] {
        for (logit_scale, shift) in [(2.0, 0.02), (6.0, 0.1), (0.5, 0.3)] {
            let loss_b = (c as f64).ln() + 0.1 * logit_scale;
            let loss_c = loss_b * (1.0 + shift);
            // The case is one the flaw hit: with the target, k·ε·(c - 1) covers the loss and
            // its difference; without it, k·ε·logit_scale is far below the loss.
            let k = (n * c) as f64;
            let with_target = k * eps * (c as f64 - 1.0).max(logit_scale);
            assert!(with_target >= loss_c && with_target >= loss_c - loss_b);
            assert!(k * eps * logit_scale < loss_b / 4.0);

            let t = tempfile::tempdir().unwrap();
            for (side, loss) in [("bench", loss_b), ("cmp", loss_c)] {
                let mut logits = tensor(
                    format!("{key}.input.0"),
                    "input",
                    "float32",
                    0.0,
                    None,
                    None,
                );
                logits.shape = vec![n, c];
                let nl = (n * c) as f64;
                logits.stats = Some(spread(
                    -logit_scale,
                    logit_scale,
                    0.0,
                    logit_scale * nl.sqrt() / 2.0,
                ));
                let mut target =
                    tensor(format!("{key}.input.1"), "input", "int64", 0.0, None, None);
                target.shape = vec![n];
                let top = c as f64 - 1.0;
                target.stats = Some(spread(
                    0.0,
                    top,
                    top / 2.0,
                    (n as f64 * top * top / 3.0).sqrt(),
                ));
                let mut out = tensor(
                    format!("{key}.output.0"),
                    "output",
                    "float32",
                    loss,
                    None,
                    Some(0),
                );
                out.shape = vec![];
                out.stats = Some(spread(loss, loss, loss, loss));
                write_op_log(
                    &t.path().join(side),
                    vec![record(key, vec![logits, target, out])],
                );
            }
            let o = compare(t.path(), &[]);
            assert_eq!(o.code, 1, "n={n} c={c}: {}", o.stdout);
            let s = summary(t.path());
            let f = &s["first_divergent"]["forward"];
            assert_eq!(f["op"], key, "n={n} c={c} scale={logit_scale}: {s}");
            assert_eq!(f["tensor"], format!("{key}.output.0"));
            let expl = f["explanation"].as_str().unwrap();
            assert!(expl.contains("equal statistics"), "{expl}");
            assert!(!s["headline"].as_str().unwrap().contains("drift"), "{s}");
            cases += 1;
        }
    }
    assert_eq!(cases, 12);
}

#[test]
fn a_sum_over_an_integer_index_is_no_cancellation() {
    // A scatter_add: float32 values [n] (within tolerance, 1e-6 apart), an int64 index [n]
    // into m buckets (equal), an output [m] 1 % apart. Every value is positive: nothing
    // cancels, the op is the culprit. The index is no term of the sum: counted as one (its
    // root mean square ~ m/√3), the "cancellation" n/√3 over the output's scale divided the
    // output's error below the local gain over its inputs', and the phase was drift.
    let key = "Torch.scatter_add.0.forward";
    let (gain, in_err, out_err) = (10.0, 1e-6, 1e-2);
    let mut cases = 0;
    for m in [5_000usize, 20_000, 100_000] {
        for per in [4usize, 10, 33] {
            let n = m * per;
            let out_scale = per as f64 * 1.5;
            // The case is one the flaw hit: the index's terms over the output's scale.
            let index_rms = (m as f64 - 1.0) / 3f64.sqrt();
            let old_cancellation = per as f64 * index_rms / out_scale;
            assert!(out_err / old_cancellation <= gain * in_err * (1.0 + in_err));
            let t = tempfile::tempdir().unwrap();
            for (side, f_in, f_out) in [("bench", 1.0, 1.0), ("cmp", 1.0 + in_err, 1.0 + out_err)] {
                let nf = n as f64;
                let mut src = tensor(
                    format!("{key}.input.0"),
                    "input",
                    "float32",
                    0.0,
                    None,
                    None,
                );
                src.shape = vec![n];
                src.stats = Some(spread(
                    0.5 * f_in,
                    1.5 * f_in,
                    f_in,
                    1.04 * f_in * nf.sqrt(),
                ));
                let mut index = tensor(format!("{key}.input.1"), "input", "int64", 0.0, None, None);
                index.shape = vec![n];
                let top = m as f64 - 1.0;
                index.stats = Some(spread(0.0, top, top / 2.0, index_rms * nf.sqrt()));
                let mut out = tensor(
                    format!("{key}.output.0"),
                    "output",
                    "float32",
                    0.0,
                    None,
                    Some(0),
                );
                out.shape = vec![m];
                let mean = per as f64 * f_out;
                out.stats = Some(spread(
                    0.5 * mean,
                    1.5 * mean,
                    mean,
                    1.04 * mean * (m as f64).sqrt(),
                ));
                write_op_log(
                    &t.path().join(side),
                    vec![record(key, vec![src, index, out])],
                );
            }
            let o = compare(t.path(), &[]);
            assert_eq!(o.code, 1, "n={n} m={m}: {}", o.stdout);
            let s = summary(t.path());
            let f = &s["first_divergent"]["forward"];
            assert_eq!(f["op"], key, "n={n} m={m}: {s}");
            let expl = f["explanation"].as_str().unwrap();
            assert!(expl.contains("within tolerance"), "{expl}");
            cases += 1;
        }
    }
    assert_eq!(cases, 9);
}

/// `layers` attention layers, each a projection (`Torch.matmul`) then a fused attention
/// (`Functional.scaled_dot_product_attention`) of the projection's output as query, key and
/// value; layer `fault`'s attention returns `1 + rel` times as much on the comparison side
/// (what follows inherits it). `args(side)` is what each side's attention calls record.
fn attention_run(
    dir: &Path,
    layers: usize,
    fault: usize,
    rel: f64,
    args: impl Fn(&str) -> Option<serde_json::Value>,
) {
    for side in ["bench", "cmp"] {
        let mut records = Vec::new();
        let (mut v, mut src) = (0.75, None);
        for i in 0..layers {
            let proj = format!("Torch.matmul.{i}.forward");
            let (h, hid) = (v * 1.5, 2 * i as u64);
            records.push(record(
                &proj,
                vec![
                    tensor(format!("{proj}.input.0"), "input", "float32", v, src, None),
                    tensor(
                        format!("{proj}.output.0"),
                        "output",
                        "float32",
                        h,
                        None,
                        Some(hid),
                    ),
                ],
            ));
            let sdpa = format!("Functional.scaled_dot_product_attention.{i}.forward");
            let mut out = h * 0.8;
            if side == "cmp" && i == fault {
                out *= 1.0 + rel;
            }
            let mut tensors: Vec<TensorRecord> = (0..3)
                .map(|j| {
                    let name = format!("{sdpa}.input.{j}");
                    tensor(name, "input", "float32", h, Some(hid), None)
                })
                .collect();
            let oid = hid + 1;
            let name = format!("{sdpa}.output.0");
            tensors.push(tensor(name, "output", "float32", out, None, Some(oid)));
            let mut r = record(&sdpa, tensors);
            r.args = match args(side) {
                Some(serde_json::Value::Object(m)) => Some(m),
                _ => None,
            };
            records.push(r);
            (v, src) = (out, Some(oid));
        }
        write_op_log(&dir.join(side), records);
    }
}

/// A fused attention draws random numbers only with its dropout on: where both runs
/// recorded it off, agreeing inputs and a differing output are its kernel's fault, named as
/// the first divergent op with the argument cited; recorded on, or not recorded, a
/// different random draw (the latter said as both readings). Sizes and the faulty layer vary.
#[test]
fn a_fused_attention_with_its_dropout_recorded_off_is_a_faulty_kernel() {
    use serde_json::json;
    for (layers, fault, rel) in [(1, 0, 0.005), (3, 1, 0.005), (5, 4, 0.02)] {
        let at = format!("Functional.scaled_dot_product_attention.{fault}.forward");

        // Off on both sides, by keyword (and, in one case, by position on one side).
        let t = tempfile::tempdir().unwrap();
        attention_run(t.path(), layers, fault, rel, |side| {
            Some(if side == "cmp" && layers == 3 {
                json!({"input.4": 0, "input.is_causal": true})
            } else {
                json!({"input.dropout_p": 0.0, "input.is_causal": true})
            })
        });
        let o = compare(t.path(), &[]);
        assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
        let s = summary(t.path());
        let f = &s["first_divergent"]["forward"];
        assert_eq!(f["op"], at.as_str(), "{s:#}");
        assert!(s["random_draw"]["forward"].is_null(), "{s:#}");
        let e = f["explanation"].as_str().unwrap();
        let cited = if layers == 3 {
            "(input.dropout_p = 0.0 in the benchmark, input.4 = 0 in the comparison run)"
        } else {
            "(input.dropout_p = 0.0 on both sides)"
        };
        assert!(
            e.contains("a faulty kernel, not a different random draw") && e.ends_with(cited),
            "{e}"
        );
        let h = s["headline"].as_str().unwrap();
        assert!(
            h.contains(&format!("first divergent op {at}"))
                && !h.contains("random numbers")
                && !h.contains("if its dropout is active"),
            "{h}"
        );

        // On on both sides: a different draw, said without the hedge.
        let t = tempfile::tempdir().unwrap();
        attention_run(t.path(), layers, fault, rel, |_| {
            Some(json!({"input.dropout_p": 0.1}))
        });
        compare(t.path(), &[]);
        let s = summary(t.path());
        assert!(s["first_divergent"]["forward"].is_null(), "{s:#}");
        let r = &s["random_draw"]["forward"];
        assert_eq!(r["op"], at.as_str());
        let e = r["explanation"].as_str().unwrap();
        assert!(
            e.contains("it draws random numbers (input.dropout_p = 0.1 on both sides)")
                && !e.contains("does not record"),
            "{e}"
        );
        let h = s["headline"].as_str().unwrap();
        assert!(
            h.starts_with(&format!("DIVERGENCE from random numbers: {at}"))
                && h.contains(
                    "a different random draw (input.dropout_p = 0.1 on both sides), not a \
                     faulty kernel"
                )
                && !h.contains("if its dropout is active"),
            "{h}"
        );
        assert_eq!(r["draw"], "input.dropout_p = 0.1 on both sides", "{r:#}");

        // Not recorded: today's words, both readings.
        let t = tempfile::tempdir().unwrap();
        attention_run(t.path(), layers, fault, rel, |_| None);
        compare(t.path(), &[]);
        let s = summary(t.path());
        assert!(s["first_divergent"]["forward"].is_null(), "{s:#}");
        let r = &s["random_draw"]["forward"];
        assert_eq!(r["op"], at.as_str());
        let e = r["explanation"].as_str().unwrap();
        assert!(e.contains("the dump does not record which"), "{e}");
        let h = s["headline"].as_str().unwrap();
        assert!(
            h.starts_with(&format!("DIVERGENCE from random numbers: {at}"))
                && h.contains("if its dropout is active (else a faulty kernel)"),
            "{h}"
        );
    }
}

/// One step whose optimizer (`Tensor.lerp_`, Adam's first moment) reads, in the
/// benchmark, half the gradient autograd left in `fc.weight` (both runs record the same
/// one in `parameters_grad`): the benchmark changed it after backward (clipping,
/// unscaling, a hook outside the captured ops). Said as such, with the parameter named,
/// not as "a tensor no captured op produced" with config-check's weights and seeds.
#[test]
fn a_gradient_one_run_changed_before_its_optimizer_read_it_is_named() {
    let t = tempfile::tempdir().unwrap();
    let x = vec![1.0f32, -0.5, 0.25, 2.0];
    let w = vec![0.3f32, -0.2, 0.1, 0.4];
    let g = vec![0.02f32, -0.04, 0.01, 0.03];
    for (side, read) in [("bench", 0.5f32), ("cmp", 1.0)] {
        let seen: Vec<f32> = g.iter().map(|v| v * read).collect();
        let moment: Vec<f32> = seen.iter().map(|v| 0.1 * v).collect();
        let mut grads = op_record(
            "Module.fc.Linear.parameters_grad",
            &[("weight", "parameter", g.clone())],
        );
        grads.kind = "parameters_grad".into();
        let records = vec![
            op_record(
                "Functional.linear.0.forward",
                &[
                    ("input.0", "input", x.clone()),
                    ("input.1", "input", w.clone()),
                    ("output.0", "output", vec![0.55]),
                ],
            ),
            op_record(
                "Functional.linear.0.backward",
                &[
                    ("input.0", "input", vec![1.0]),
                    ("output.1", "output", g.clone()),
                ],
            ),
            op_record(
                "Tensor.lerp_.0.forward",
                &[
                    ("input.0", "input", vec![0.0; 4]),
                    ("input.1", "input", seen),
                    ("output.0", "output", moment),
                ],
            ),
            grads,
        ];
        write_op_log_at(
            &t.path().join(side),
            "step0",
            "rank0",
            "statistics",
            records,
        );
    }
    let (b, c) = (t.path().join("bench"), t.path().join("cmp"));
    let o = compare_paths(&b, &c, &t.path().join("out"), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    let e = &s["external_source"]["backward"];
    assert_eq!(e["op"], "Tensor.lerp_.0.forward", "{s:#}");
    assert_eq!(e["outside"]["kind"], "gradient", "{e:#}");
    assert_eq!(e["outside"]["parameter"], "fc.weight", "{e:#}");
    assert_eq!(e["outside"]["changed_in"], "bench", "{e:#}");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("the gradient of `fc.weight` after the benchmark changed it"),
        "{h}"
    );
    let x = e["explanation"].as_str().unwrap();
    assert!(x.contains("gradient clipping"), "{x}");
    assert!(!x.contains("config-check"), "{x}");
}
