//! `probe scan`: where NaN/Inf comes from in one run, on real fixtures and hand-written
//! op logs (written with the dump format's own record types).

use crate::common;
use common::*;
use probe::schema::dump::{OpRecord, Stat, StatsRecord, TensorRecord};
use std::path::{Path, PathBuf};

fn json(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("JSON")
}

/// (max, min, nan, inf) of 100 values.
fn stats(max: f64, min: f64, nan: u64, inf: u64) -> StatsRecord {
    let mean = if nan > 0 { f64::NAN } else { (max + min) / 2.0 };
    StatsRecord {
        max: Stat(Some(if nan > 0 { f64::NAN } else { max })),
        min: Stat(Some(if nan > 0 { f64::NAN } else { min })),
        mean: Stat(Some(mean)),
        norm: Stat(Some(10.0 * max.abs().max(min.abs()))),
        nan: Some(nan),
        inf: Some(inf),
    }
}

type T<'a> = (&'a str, &'a str, StatsRecord); // (role, dtype, stats)

/// Writes a one-rank statistics dump of `ops` (key, tensors) under `dir`.
fn write_dump(dir: &Path, ops: &[(&str, Vec<T>)]) -> PathBuf {
    let records = ops
        .iter()
        .map(|(key, ts)| {
            let mut n = std::collections::HashMap::new();
            let tensors = ts
                .iter()
                .map(|(role, dtype, st)| {
                    let slot = if *role == "output" { "output" } else { "input" };
                    let k = n.entry(slot).or_insert(0);
                    *k += 1;
                    TensorRecord {
                        checksum: None,
                        dtype: dtype.to_string(),
                        file: None,
                        data_offsets: None,
                        id: None,
                        name: format!("{key}.{slot}.{}", *k - 1),
                        role: role.to_string(),
                        shape: vec![100],
                        src: None,
                        stats: Some(*st),
                        unwritten: false,
                        stride: None,
                        offset: None,
                        storage: None,
                        format: None,
                    }
                })
                .collect();
            OpRecord {
                args: None,
                direction: if key.contains(".backward") {
                    "backward"
                } else {
                    "forward"
                }
                .into(),
                kind: "api".into(),
                module: None,
                op: key.to_string(),
                recompute: false,
                group: None,
                coll_seq: None,
                seq: 0,
                stack: None,
                tensors,
            }
        })
        .collect();
    write_op_log(dir, records);
    dir.to_path_buf()
}

fn ok() -> StatsRecord {
    stats(1.0, -1.0, 0, 0)
}

#[test]
fn msprobe_dump_names_the_first_nan_producer_and_keeps_masks_quiet() {
    let t = tempfile::tempdir().unwrap();
    let td = root().join("testdata/msprobe");
    let o = scan(&td.join("nonfinite_cmp"), &t.path().join("a"), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = json(&t.path().join("a"));
    assert_eq!(s["format"], "probe-scan-summary");
    assert_eq!(
        s["first_nonfinite"]["forward"]["op"],
        "Functional.gelu.0.forward"
    );
    assert!(s["headline"]
        .as_str()
        .unwrap()
        .contains("Functional.gelu.0.forward"));
    for f in ["scan.parquet", "scan.xlsx"] {
        assert!(t.path().join("a").join(f).is_file(), "{f}");
    }
    // The benchmark holds only the attention mask's -inf: clean, exit 0.
    let o = scan(&td.join("nonfinite_bench"), &t.path().join("b"), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    let s = json(&t.path().join("b"));
    assert_eq!(s["counts"]["nonfinite"], 0);
    assert_eq!(s["counts"]["neg_inf_only"], 2);
    // A real bf16 run: no NaN, no false overflow or underflow.
    let o = scan(
        &td.join("stats_bf16"),
        &t.path().join("c"),
        &["--fail-on", "warning"],
    );
    assert_eq!(o.code, 0, "{}", o.stdout);
}

#[test]
fn synthetic_probe_dump_with_an_injected_nan() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--nan", "Functional.gelu.1"]);
    let o = scan(&t.path().join("cmp"), &t.path().join("o"), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = json(&t.path().join("o"));
    assert_eq!(
        s["first_nonfinite"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
    // The backward of a NaN forward is NaN from its first op: inputs already non-finite,
    // so the backward has no producer of its own.
    assert!(
        s["first_nonfinite"]["backward"].is_null(),
        "{}",
        s["first_nonfinite"]
    );
    let o = scan(&t.path().join("bench"), &t.path().join("p"), &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.starts_with("CLEAN"), "{}", o.stdout);
}

#[test]
fn nan_entering_through_the_data_is_from_outside() {
    let t = tempfile::tempdir().unwrap();
    let d = write_dump(
        &t.path().join("dump"),
        &[
            (
                "Torch.matmul.0.forward",
                vec![
                    ("input", "float32", stats(0.0, 0.0, 3, 0)),
                    ("output", "float32", stats(0.0, 0.0, 9, 0)),
                ],
            ),
            (
                "Functional.relu.0.forward",
                vec![
                    ("input", "float32", stats(0.0, 0.0, 9, 0)),
                    ("output", "float32", stats(0.0, 0.0, 9, 0)),
                ],
            ),
        ],
    );
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_eq!(o.code, 1);
    let s = json(&t.path().join("o"));
    assert_eq!(
        s["external_nonfinite"]["forward"]["tensor"],
        "Torch.matmul.0.forward.input.0"
    );
    assert!(s["first_nonfinite"]["forward"].is_null());
    assert!(s["headline"].as_str().unwrap().contains("outside"));
}

#[test]
fn a_nan_born_in_the_backward_is_found_there() {
    let t = tempfile::tempdir().unwrap();
    let d = write_dump(
        &t.path().join("dump"),
        &[
            (
                "Torch.log.0.forward",
                vec![("input", "float32", ok()), ("output", "float32", ok())],
            ),
            (
                "Torch.log.0.backward",
                vec![
                    ("input", "float32", ok()),
                    ("output", "float32", stats(0.0, 0.0, 0, 4)),
                ],
            ),
            (
                "Torch.sum.0.backward",
                vec![
                    ("input", "float32", stats(0.0, 0.0, 0, 4)),
                    ("output", "float32", stats(0.0, 0.0, 0, 4)),
                ],
            ),
        ],
    );
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_eq!(o.code, 1);
    let s = json(&t.path().join("o"));
    assert!(s["first_nonfinite"]["forward"].is_null());
    assert_eq!(
        s["first_nonfinite"]["backward"]["op"],
        "Torch.log.0.backward"
    );
    assert_eq!(s["first_nonfinite"]["backward"]["reason"], "0 NaN, 4 Inf");
}

#[test]
fn fp16_overflow_risk_and_underflow_are_warnings() {
    let t = tempfile::tempdir().unwrap();
    let d = write_dump(
        &t.path().join("dump"),
        &[
            // 60000 in fp16 is within 16x of 65504; 60000 in fp32 is nothing.
            (
                "Torch.matmul.0.forward",
                vec![
                    ("input", "float16", ok()),
                    ("output", "float16", stats(60000.0, -3.0, 0, 0)),
                ],
            ),
            (
                "Torch.matmul.1.forward",
                vec![
                    ("input", "float32", ok()),
                    ("output", "float32", stats(60000.0, -3.0, 0, 0)),
                ],
            ),
            // Non-zero fp16 inputs, all-zero output: underflow.
            (
                "Torch.mm.0.forward",
                vec![
                    ("input", "float16", stats(1e-4, -1e-4, 0, 0)),
                    ("output", "float16", stats(0.0, 0.0, 0, 0)),
                ],
            ),
            // A cast to fp16 of values beyond its range.
            (
                "Tensor.half.0.forward",
                vec![
                    ("input", "float32", stats(1e5, -1.0, 0, 0)),
                    ("output", "float16", stats(100.0, -1.0, 0, 0)),
                ],
            ),
        ],
    );
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_eq!(
        o.code, 0,
        "warnings do not fail the default gate: {}",
        o.stdout
    );
    let s = json(&t.path().join("o"));
    assert_eq!(s["verdict"], "warning");
    let risk: Vec<&str> = s["units"][0]["findings"]["overflow_risk"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["op"].as_str().unwrap())
        .collect();
    assert_eq!(risk, ["Torch.matmul.0.forward", "Tensor.half.0.forward"]);
    assert_eq!(
        s["units"][0]["findings"]["underflow"][0]["op"],
        "Torch.mm.0.forward"
    );
    let o = scan(&d, &t.path().join("w"), &["--fail-on", "warning"]);
    assert_eq!(o.code, 1);
}

#[test]
fn a_skipped_loss_scaler_step_is_reported() {
    let t = tempfile::tempdir().unwrap();
    let found_inf = StatsRecord {
        max: Stat(Some(1.0)),
        min: Stat(Some(1.0)),
        mean: Stat(Some(1.0)),
        norm: Stat(Some(1.0)),
        nan: Some(0),
        inf: Some(0),
    };
    let key = "Torch._amp_foreach_non_finite_check_and_unscale_.0.forward";
    let d = write_dump(
        &t.path().join("dump"),
        &[(
            key,
            vec![("input", "float32", ok()), ("input", "float32", found_inf)],
        )],
    );
    // found_inf is a one-element tensor.
    let p = d.join("step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let mut rec: OpRecord = serde_json::from_str(text.trim()).unwrap();
    rec.tensors[1].shape = vec![1];
    std::fs::write(&p, serde_json::to_string(&rec).unwrap() + "\n").unwrap();
    let o = scan(&d, &t.path().join("o"), &[]);
    let s = json(&t.path().join("o"));
    assert_eq!(s["counts"]["loss_scaler_skipped_steps"], 1, "{}", o.stdout);
}

#[test]
fn a_loss_scale_update_skips_by_its_found_inf_only() {
    // `_amp_update_scale_(scale, growth_tracker, found_inf, ...)`: the scale is a positive
    // one-element float too, which said "skipped" of every step; only found_inf does now.
    let t = tempfile::tempdir().unwrap();
    let one = |v: f64| StatsRecord {
        max: Stat(Some(v)),
        min: Stat(Some(v)),
        mean: Stat(Some(v)),
        norm: Stat(Some(v)),
        nan: Some(0),
        inf: Some(0),
    };
    let key = "Torch._amp_update_scale_.0.forward";
    for (found, skipped) in [(0.0, 0), (1.0, 1)] {
        let dir = t.path().join(format!("dump{found}"));
        let d = write_dump(
            &dir,
            &[(
                key,
                vec![
                    ("input", "float32", one(65536.0)),
                    ("input", "int32", one(0.0)),
                    ("input", "float32", one(found)),
                ],
            )],
        );
        // One-element tensors, as the scaler's are.
        let p = d.join("step0/rank0/ops.jsonl");
        let text = std::fs::read_to_string(&p).unwrap();
        let mut rec: OpRecord = serde_json::from_str(text.trim()).unwrap();
        for t in &mut rec.tensors {
            t.shape = vec![];
        }
        std::fs::write(&p, serde_json::to_string(&rec).unwrap() + "\n").unwrap();
        let out = t.path().join(format!("o{found}"));
        let o = scan(&d, &out, &[]);
        let s = json(&out);
        assert_eq!(
            s["counts"]["loss_scaler_skipped_steps"], skipped,
            "{}",
            o.stdout
        );
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let t = tempfile::tempdir().unwrap();
    let o = scan(&t.path().join("missing"), &t.path().join("o"), &[]);
    assert_input_error(&o, 2, "no such file or directory");
    let d = write_dump(&t.path().join("empty"), &[]);
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_input_error(&o, 3, "no step/rank holds op records");
    let o = scan(&d, &t.path().join("o"), &["--overflow-margin", "0.5"]);
    assert_input_error(&o, 2, "--overflow-margin");
}

#[test]
fn an_overflow_mode_dump_without_records_is_clean() {
    // The agent in overflow mode writes no step folder when nothing overflowed.
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("ovf");
    std::fs::create_dir_all(&d).unwrap();
    let manifest = r#"{"format": "probe-dump", "version": 1, "framework": "pytorch", "device": "cpu",
        "mode": "tensor", "level": "api", "created": "2026-01-01T00:00:00Z",
        "overflow": {"overflow_nums": 1}}"#;
    std::fs::write(d.join("manifest.json"), manifest).unwrap();
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("CLEAN: nothing overflowed"),
        "{}",
        o.stdout
    );
    // Without the overflow field the same folder is no dump at all.
    std::fs::write(
        d.join("manifest.json"),
        manifest.replace(",\n        \"overflow\": {\"overflow_nums\": 1}", ""),
    )
    .unwrap();
    let o = scan(&d, &t.path().join("p"), &[]);
    assert_input_error(&o, 2, "not a dump");
}

#[test]
fn a_step_left_empty_by_a_crash_is_skipped_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let d = write_dump(
        &t.path().join("dump"),
        &[(
            "Torch.exp.0.forward",
            vec![
                ("input", "float32", ok()),
                ("output", "float32", stats(0.0, 0.0, 2, 0)),
            ],
        )],
    );
    let crashed = d.join("step1/rank0");
    std::fs::create_dir_all(&crashed).unwrap();
    std::fs::write(crashed.join("ops.jsonl"), "").unwrap();
    let o = scan(&d, &t.path().join("o"), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("no op records (crashed run?)"),
        "{}",
        o.stderr
    );
    assert_eq!(
        json(&t.path().join("o"))["first_nonfinite"]["forward"]["op"],
        "Torch.exp.0.forward"
    );
}

#[test]
fn negative_infinity_in_a_gradient_is_an_overflow_not_a_mask() {
    // A mask's -inf lives in the forward and passes; -inf in a gradient (float16 under a
    // loss scale overflowing downwards) is NaN/Inf, named at the op that made it.
    let t = tempfile::tempdir().unwrap();
    let neg = || stats(1.0, f64::NEG_INFINITY, 0, 3);
    let fine = || stats(1.0, -1.0, 0, 0);
    // (op, exit code, -inf only, NaN/Inf)
    for (key, code, neg_inf_only, nonfinite) in [
        ("Tensor.masked_fill.0.forward", 0, 1, 0),
        ("Functional.linear.0.backward", 1, 0, 1),
    ] {
        let dump = write_dump(
            &t.path().join(key),
            &[(
                key,
                vec![("input", "float16", fine()), ("output", "float16", neg())],
            )],
        );
        let out = t.path().join(format!("o-{key}"));
        let o = scan(&dump, &out, &[]);
        assert_eq!(o.code, code, "{}", o.stdout);
        let s = json(&out);
        assert_eq!(s["counts"]["neg_inf_only"], neg_inf_only, "{key}");
        assert_eq!(s["counts"]["nonfinite"], nonfinite, "{key}");
    }
    let s = json(&t.path().join("o-Functional.linear.0.backward"));
    assert_eq!(
        s["first_nonfinite"]["backward"]["op"], "Functional.linear.0.backward",
        "{s}"
    );
}

#[test]
fn negative_infinity_made_from_finite_inputs_is_named_not_its_consumer() {
    // An entropy term `p * log(p)` without a clamp: log(0) = -inf from finite inputs is
    // produced by the log; the mul's `0 * -inf` = NaN only passes it on. A mask's -inf
    // (masked_fill, full, where of a -inf input, a division by a non-zero scalar of a
    // tensor that already held it) is not named.
    let t = tempfile::tempdir().unwrap();
    let fine = || stats(1.0, -1.0, 0, 0);
    let run = |tag: &str, ops: &[(&str, Vec<T>)]| {
        let dump = write_dump(&t.path().join(tag), ops);
        let out = t.path().join(format!("o-{tag}"));
        let o = scan(&dump, &out, &[]);
        (o.code, json(&out), o.stdout)
    };
    for before in [0usize, 1, 3] {
        for (dtype, n_inf) in [("float32", 1u64), ("float16", 7), ("bfloat16", 100)] {
            // p: softmax/relu output holding exact zeros.
            let p = || stats(0.9, 0.0, 0, 0);
            let logp = || {
                stats(
                    if n_inf == 100 {
                        f64::NEG_INFINITY
                    } else {
                        -0.1
                    },
                    f64::NEG_INFINITY,
                    0,
                    n_inf,
                )
            };
            let filler: Vec<(String, Vec<T>)> = (0..before)
                .map(|i| {
                    (
                        format!("Functional.linear.{i}.forward"),
                        vec![("input", dtype, fine()), ("output", dtype, fine())],
                    )
                })
                .collect();
            let mut ops: Vec<(&str, Vec<T>)> = filler
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect();
            ops.push((
                "Functional.relu.0.forward",
                vec![("input", dtype, fine()), ("output", dtype, p())],
            ));
            ops.push((
                "Torch.log.0.forward",
                vec![("input", dtype, p()), ("output", dtype, logp())],
            ));
            ops.push((
                "Tensor.__mul__.6.forward",
                vec![
                    ("input", dtype, p()),
                    ("input", dtype, logp()),
                    ("output", dtype, stats(0.0, 0.0, n_inf, 0)),
                ],
            ));
            let tag = format!("log-{before}-{dtype}");
            let (code, s, out) = run(&tag, &ops);
            assert_eq!(code, 1, "{tag}: {out}");
            let f = &s["first_nonfinite"]["forward"];
            assert_eq!(f["op"], "Torch.log.0.forward", "{tag}: {s}");
            assert_eq!(f["tensor"], "Torch.log.0.forward.output.0", "{tag}");
            if n_inf < 100 {
                // -inf only: a mask's, were it not made here from finite inputs.
                assert!(
                    f["reason"].as_str().unwrap().contains("log of 0"),
                    "{tag}: {f}"
                );
                // The log's -inf is not counted as a mask; the mul's input reading it is.
                assert_eq!(s["counts"]["neg_inf_only"], 1, "{tag}: {s}");
            }
            assert!(
                s["headline"]
                    .as_str()
                    .unwrap()
                    .contains("Torch.log.0.forward"),
                "{tag}"
            );

            // The mask case: same positions, -inf from masked_fill / full / where /
            // a division by a non-zero scalar: never named, exit 0.
            for maker in [
                "Tensor.masked_fill.0.forward",
                "Torch.full.0.forward",
                "Torch.where.0.forward",
                "Tensor.__truediv__.0.forward",
            ] {
                let mask = || stats(0.5, f64::NEG_INFINITY, 0, n_inf);
                let mut ops: Vec<(&str, Vec<T>)> = filler
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.clone()))
                    .collect();
                let maker_ts = match maker {
                    "Torch.full.0.forward" => vec![("output", dtype, mask())],
                    "Torch.where.0.forward" => vec![
                        ("input", "bool", stats(1.0, 0.0, 0, 0)),
                        ("input", dtype, fine()),
                        ("input", dtype, stats(0.0, f64::NEG_INFINITY, 0, 1)),
                        ("output", dtype, mask()),
                    ],
                    // A scalar divisor: no tensor that could hold 0.
                    _ => vec![("input", dtype, fine()), ("output", dtype, mask())],
                };
                ops.push((maker, maker_ts));
                ops.push((
                    "Tensor.__add__.0.forward",
                    vec![
                        ("input", dtype, fine()),
                        ("input", dtype, mask()),
                        ("output", dtype, mask()),
                    ],
                ));
                let tag = format!("mask-{before}-{dtype}-{maker}");
                let (code, s, out) = run(&tag, &ops);
                assert_eq!(code, 0, "{tag}: {out}");
                assert_eq!(s["counts"]["nonfinite"], 0, "{tag}: {s}");
                assert!(s["first_nonfinite"]["forward"].is_null(), "{tag}: {s}");
            }
        }
    }
    // A division by a tensor that reaches 0 is a producer too; one that does not is not.
    for (divisor_min, code) in [(0.0, 1), (0.5, 0)] {
        let tag = format!("div-{divisor_min}");
        let (c, s, out) = run(
            &tag,
            &[(
                "Tensor.__truediv__.0.forward",
                vec![
                    ("input", "float32", stats(-0.5, -1.0, 0, 0)),
                    ("input", "float32", stats(1.0, divisor_min, 0, 0)),
                    ("output", "float32", stats(-0.5, f64::NEG_INFINITY, 0, 2)),
                ],
            )],
        );
        assert_eq!(c, code, "{tag}: {out}");
        if code == 1 {
            assert_eq!(
                s["first_nonfinite"]["forward"]["op"], "Tensor.__truediv__.0.forward",
                "{s}"
            );
        }
    }
}

#[test]
fn leftover_bytes_an_initialiser_overwrites_are_no_nan_entering() {
    // Issue 53 item 5: an nn.Linear built inside a captured step makes its weight with
    // torch.empty, then uniform_ fills it; the leftover bytes (NaN now and then) of the
    // value before uniform_ were read as NaN entering from outside (exit 1, every run).
    // The same for the other calls that only write their target.
    let t = tempfile::tempdir().unwrap();
    for (i, key) in [
        "Tensor.uniform_.0.forward",
        "Tensor.normal_.0.forward",
        "Tensor.fill_.0.forward",
        "Tensor.copy_.0.forward",
        "Tensor.zero_.0.forward",
    ]
    .into_iter()
    .enumerate()
    {
        let dir = t.path().join(format!("d{i}"));
        let mut inputs = vec![("input", "float32", stats(0.0, 0.0, 7, 2))];
        if key.contains("copy_") {
            inputs.push(("input", "float32", ok()));
        }
        inputs.push(("output", "float32", ok()));
        let d = write_dump(
            &dir,
            &[
                (key, inputs),
                (
                    "Functional.linear.0.forward",
                    vec![
                        ("input", "float32", ok()),
                        ("input", "float32", ok()),
                        ("output", "float32", ok()),
                    ],
                ),
            ],
        );
        let o = scan(&d, &t.path().join(format!("o{i}")), &[]);
        assert_eq!(o.code, 0, "{key}: {}{}", o.stdout, o.stderr);
        let s = json(&t.path().join(format!("o{i}")));
        assert!(s["external_nonfinite"]["forward"].is_null(), "{key}: {s}");
    }
    // A NaN in what such a call reads (copy_'s source) still enters from outside.
    let dir = t.path().join("src");
    let d = write_dump(
        &dir,
        &[(
            "Tensor.copy_.0.forward",
            vec![
                ("input", "float32", ok()),
                ("input", "float32", stats(0.0, 0.0, 3, 0)),
                ("output", "float32", stats(0.0, 0.0, 3, 0)),
            ],
        )],
    );
    let o = scan(&d, &t.path().join("o-src"), &[]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let s = json(&t.path().join("o-src"));
    assert_eq!(
        s["external_nonfinite"]["forward"]["tensor"],
        "Tensor.copy_.0.forward.input.1"
    );
}
