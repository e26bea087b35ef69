//! Monitor folders (docs/monitor.md): `probe compare` of two and `probe scan` of one, on
//! files written here by arrow-rs's own IPC writer (independent of the agent's), with
//! series set by hand: a chain of modules `embed -> layers.0 -> layers.1 -> head`, whose
//! outputs' norms follow a smooth curve, each module feeding the next.

use crate::common;
use arrow_array::{
    ArrayRef, DictionaryArray, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use common::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The monitored modules in `named_modules` order, and their forward return order.
const MODULES: &[(&str, Option<i32>)] = &[
    ("", Some(4)),
    ("embed", Some(0)),
    ("layers", None),
    ("layers.0", Some(1)),
    ("layers.1", Some(2)),
    ("head", Some(3)),
];
const METRICS: &[&str] = &[
    "output_norm",
    "output_nonfinite",
    "grad_norm",
    "param_norm",
    "update_norm",
];

/// A module's metric at a step: (step, module index, metric) -> value.
type Values = Box<dyn Fn(i32, usize, &str) -> Option<f64>>;

/// A run's values; loss and lr by step.
struct Run {
    value: Values,
    loss: Box<dyn Fn(i32) -> f64>,
    lr: Box<dyn Fn(i32) -> f64>,
}

/// A clean run: norms on a smooth curve, with relative noise `eps` varying by step
/// (another thread count's rounding).
fn clean(eps: f64) -> Run {
    Run {
        value: Box::new(move |s, m, metric| {
            let base = 1.0 + m as f64 + 0.3 * (f64::from(s) / 40.0).sin();
            let wobble = 1.0 + eps * ((f64::from(s) * 12.9898 + m as f64).sin());
            match metric {
                "output_nonfinite" => Some(0.0),
                "output_norm" if MODULES[m].1.is_none() => None,
                "update_norm" => Some(1e-3 * base * wobble),
                _ => Some(base * wobble * if metric == "grad_norm" { 0.1 } else { 1.0 }),
            }
        }),
        loss: Box::new(move |s| (2.5 - f64::from(s) / 400.0) * (1.0 + eps * (f64::from(s)).cos())),
        lr: Box::new(|_| 1e-3),
    }
}

/// Writes `steps` steps of `run` as rank `rank`'s monitor file in `dir`.
fn write(dir: &Path, rank: u32, steps: i32, run: &Run) {
    write_some(dir, rank, steps, run, MODULES.len(), &|m| m.to_string());
}

/// [`write`] of the first `modules` modules only, each metric column named `name(metric)`.
fn write_some(
    dir: &Path,
    rank: u32,
    steps: i32,
    run: &Run,
    modules: usize,
    name: &dyn Fn(&str) -> String,
) {
    std::fs::create_dir_all(dir).unwrap();
    let mut fields = vec![
        Field::new("step", DataType::Int32, false),
        Field::new_dictionary("module", DataType::Int32, DataType::Utf8, false),
        Field::new("order", DataType::Int32, true),
        Field::new(name("loss"), DataType::Float64, true),
        Field::new(name("lr"), DataType::Float64, true),
    ];
    fields.extend(
        METRICS
            .iter()
            .map(|m| Field::new(name(m), DataType::Float32, true)),
    );
    let meta = HashMap::from([(
        "probe.monitor".to_string(),
        format!("{{\"format\": \"probe.monitor\", \"version\": 1, \"rank\": {rank}}}"),
    )]);
    let schema = Arc::new(Schema::new(fields).with_metadata(meta));
    let file = std::fs::File::create(dir.join(format!("rank{rank}.arrows"))).unwrap();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
    let names = StringArray::from(MODULES[..modules].iter().map(|m| m.0).collect::<Vec<_>>());
    for s in 0..steps {
        let n = modules;
        let keys = Int32Array::from((0..n as i32).collect::<Vec<_>>());
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![s; n])),
            Arc::new(DictionaryArray::try_new(keys, Arc::new(names.clone())).unwrap()),
            Arc::new(Int32Array::from(
                MODULES[..n].iter().map(|m| m.1).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                (0..n)
                    .map(|m| (m == 0).then(|| (run.loss)(s)))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                (0..n)
                    .map(|m| (m == 0).then(|| (run.lr)(s)))
                    .collect::<Vec<_>>(),
            )),
        ];
        for metric in METRICS {
            cols.push(Arc::new(Float32Array::from(
                (0..n)
                    .map(|m| (run.value)(s, m, metric).map(|v| v as f32))
                    .collect::<Vec<_>>(),
            )));
        }
        w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
    }
    w.finish().unwrap();
}

/// `run` with module `m`'s output (and everything downstream of it: later modules'
/// outputs, the loss, every gradient and update) off by `rel` from step `from`.
fn faulty(eps: f64, from: i32, m: usize, rel: f64) -> Run {
    let base = clean(eps);
    let order = MODULES[m].1.unwrap();
    Run {
        value: Box::new(move |s, k, metric| {
            let v = (base.value)(s, k, metric)?;
            let downstream = MODULES[k].1.is_some_and(|o| o >= order) || k == 0;
            let hit = s >= from
                && match metric {
                    "output_norm" => downstream,
                    "grad_norm" | "update_norm" => true,
                    "param_norm" => s > from,
                    _ => false,
                };
            Some(if hit { v * (1.0 + rel) } else { v })
        }),
        loss: Box::new(move |s| (base.loss)(s) * if s >= from { 1.0 + rel } else { 1.0 }),
        lr: base.lr,
    }
}

/// A run's `summary.json` in `out`, or null when none was written (a refused input).
fn summary_in(out: &Path) -> serde_json::Value {
    std::fs::read_to_string(out.join("summary.json"))
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or(serde_json::Value::Null)
}

fn compare_monitors(dir: &Path, extra: &[&str]) -> (Out, serde_json::Value) {
    (compare(dir, extra), summary_in(&dir.join("out")))
}

#[test]
fn clean_reruns_over_300_steps_part_nowhere() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 300, &clean(0.0));
    write(&d.path().join("cmp"), 0, 300, &clean(3e-7));
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(s["parting"].is_null(), "{s}");
    assert_eq!(s["steps"], 300);
    assert_eq!(s["calibration"]["steps"], 20);
    assert!(s["recapture"].is_null());
    assert!(!d.path().join("out/recapture.json").exists());
    for f in ["monitor.html", "monitor.xlsx", "monitor.parquet"] {
        assert!(d.path().join("out").join(f).is_file(), "{f}");
    }
}

#[test]
fn a_fault_from_step_n_is_named_at_step_n_in_the_faulty_module_with_its_recapture() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 300, &clean(0.0));
    // layers.1 (index 4) 1 % off from step 137; its consumers and the loss follow.
    write(&d.path().join("cmp"), 0, 300, &faulty(3e-7, 137, 4, 0.01));
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let p = &s["parting"];
    assert_eq!(p["step"], 137, "{s}");
    assert_eq!(p["previous_step"], 136);
    assert_eq!(p["series"]["module"], "layers.1");
    assert_eq!(p["series"]["metric"], "output_norm");
    assert_eq!(p["producer"], "layers.0");
    assert!(s["headline"].as_str().unwrap().contains("step 137"), "{s}");
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("out/recapture.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(r["steps"], serde_json::json!([136, 137]));
    assert_eq!(r["ranks"], serde_json::json!([0]));
    assert_eq!(
        r["include_modules"],
        serde_json::json!(["layers.0", "layers.1"])
    );
    assert_eq!(r["$msprobe"]["step"], serde_json::json!([136, 137]));
    assert_eq!(r["$msprobe"]["task"], "statistics");
    let html = std::fs::read_to_string(d.path().join("out/monitor.html")).unwrap();
    assert!(html.contains("step 137"));
    assert!(html.contains("rank 0 layers.1 output_norm"));
}

#[test]
fn a_learning_rate_ported_wrong_parts_at_its_first_step_on_the_lr() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 200, &clean(0.0));
    let mut wrong = clean(3e-7);
    wrong.lr = Box::new(|s| {
        if s >= 90 {
            1e-3 * (1.0 + f64::from(s - 89) * 1e-3)
        } else {
            1e-3
        }
    });
    write(&d.path().join("cmp"), 0, 200, &wrong);
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(s["parting"]["step"], 90, "{s}");
    assert_eq!(s["parting"]["series"]["metric"], "lr");
    assert_eq!(s["parting"]["series"]["module"], "");
    // The whole model is the scope: no module filter.
    let r = std::fs::read_to_string(d.path().join("out/recapture.json")).unwrap();
    assert!(!r.contains("include_modules"), "{r}");
}

#[test]
fn the_first_parting_rank_is_named_among_several() {
    let d = tempfile::tempdir().unwrap();
    for rank in 0..3 {
        write(&d.path().join("bench"), rank, 120, &clean(0.0));
        let run = if rank == 2 {
            faulty(0.0, 60, 3, 0.05)
        } else if rank == 1 {
            faulty(0.0, 61, 1, 0.05)
        } else {
            clean(1e-7)
        };
        write(&d.path().join("cmp"), rank, 120, &run);
    }
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(s["parting"]["step"], 60, "{s}");
    assert_eq!(s["parting"]["series"]["rank"], 2);
    assert_eq!(s["parting"]["series"]["module"], "layers.0");
    assert_eq!(s["ranks"], serde_json::json!([0, 1, 2]));
}

#[test]
fn a_given_envelope_judges_every_step_and_a_calibration_window_can_be_set() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 100, &clean(0.0));
    write(&d.path().join("cmp"), 0, 100, &faulty(0.0, 2, 5, 0.01));
    // The default window (10 steps) swallows a fault at step 2: it is the runs' drift.
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 0, "{s}");
    let (out, s) = compare_monitors(d.path(), &["--envelope", "1e-3"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(s["parting"]["step"], 2);
    assert_eq!(s["parting"]["series"]["module"], "head");
    assert_eq!(s["calibration"]["envelope"], 1e-3);
    let (out, s) = compare_monitors(d.path(), &["--calibration-steps", "1"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(s["parting"]["step"], 2);
}

#[test]
fn a_run_killed_mid_step_keeps_its_completed_steps_and_says_so() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 50, &clean(0.0));
    write(&d.path().join("cmp"), 0, 50, &clean(1e-7));
    let f = d.path().join("cmp/rank0.arrows");
    let bytes = std::fs::read(&f).unwrap();
    // Cut inside the last step's message (the end marker is 8 bytes).
    std::fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(s["steps"], 49, "{s}");
    assert!(out.stderr.contains("ends inside a step"), "{}", out.stderr);
}

#[test]
fn bad_monitor_input_is_one_line_and_exit_2() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 30, &clean(0.0));
    write(&d.path().join("cmp"), 0, 30, &clean(0.0));
    let f = d.path().join("cmp/rank0.arrows");
    let mut bytes = std::fs::read(&f).unwrap();
    // Garbage inside the first message's metadata.
    for b in &mut bytes[8..200] {
        *b = 0xAB;
    }
    std::fs::write(&f, &bytes).unwrap();
    let (out, _) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("bad monitor file"), "{}", out.stderr);
    // A monitor against a dump, and options that apply to dumps only.
    write(&d.path().join("cmp"), 0, 30, &clean(0.0));
    let dump = d.path().join("dump");
    synth(&dump, &[]);
    let o = compare_paths(
        &d.path().join("bench"),
        &dump.join("cmp"),
        &d.path().join("o2"),
        &[],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("not a monitor folder"), "{}", o.stderr);
    // ... and the monitors' options with two dumps.
    let o = compare_paths(
        &dump.join("bench"),
        &dump.join("cmp"),
        &d.path().join("o4"),
        &["--envelope", "0.1"],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("apply to monitor folders"),
        "{}",
        o.stderr
    );
    for extra in [
        &["--steps", "1"][..],
        &["--envelope", "-1"],
        &["--trend-k", "0.5"],
    ] {
        let (out, _) = compare_monitors(d.path(), extra);
        assert_eq!(out.code, 2, "{extra:?}: {}", out.stderr);
    }
    // Too few steps to calibrate: nothing comparable.
    write(&d.path().join("short_b"), 0, 3, &clean(0.0));
    write(&d.path().join("short_c"), 0, 3, &clean(0.0));
    let o = compare_paths(
        &d.path().join("short_b"),
        &d.path().join("short_c"),
        &d.path().join("o3"),
        &[],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
}

fn scan_monitor(dir: &Path) -> (Out, serde_json::Value) {
    let o = dir.join("scan_out");
    (scan(&dir.join("run"), &o, &[]), summary_in(&o))
}

#[test]
fn scan_names_the_first_nan_step_and_module_and_recaptures_it() {
    let d = tempfile::tempdir().unwrap();
    let base = clean(0.0);
    let run = Run {
        value: Box::new(move |s, m, metric| {
            let v = (base.value)(s, m, metric)?;
            // layers.0 (order 1) goes NaN at step 200, and everything after it.
            let after = MODULES[m].1.is_some_and(|o| o >= 1) || m == 2;
            Some(match metric {
                "output_norm" | "grad_norm" if s >= 200 && after => f64::NAN,
                "output_nonfinite" if s >= 200 && after => 12.0,
                _ => v,
            })
        }),
        loss: Box::new(|s| if s >= 200 { f64::NAN } else { 2.0 }),
        lr: Box::new(|_| 1e-3),
    };
    write(&d.path().join("run"), 0, 300, &run);
    let (out, s) = scan_monitor(d.path());
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let e = &s["events"][0];
    assert_eq!(e["kind"], "nonfinite", "{s}");
    assert_eq!(e["step"], 200);
    assert_eq!(e["module"], "layers.0");
    assert_eq!(e["metric"], "output_norm");
    assert_eq!(e["producer"], "embed");
    let r = std::fs::read_to_string(d.path().join("scan_out/recapture.json")).unwrap();
    assert!(r.contains("\"steps\": [\n    199,\n    200\n  ]"), "{r}");
}

#[test]
fn scan_finds_a_loss_spike_and_a_dead_module_and_no_event_in_a_clean_run() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("run"), 0, 300, &clean(1e-3));
    let (out, s) = scan_monitor(d.path());
    assert_eq!(out.code, 0, "{s}");
    assert_eq!(s["events_total"], 0, "{s}");

    let d = tempfile::tempdir().unwrap();
    let base = clean(1e-3);
    let run = Run {
        value: Box::new(move |s, m, metric| {
            let v = (base.value)(s, m, metric)?;
            // head's output dies from step 150.
            Some(if m == 5 && metric == "output_norm" && s >= 150 {
                0.0
            } else {
                v
            })
        }),
        loss: Box::new(|s| {
            if s == 120 {
                9.0
            } else {
                2.0 + 0.01 * (f64::from(s)).sin()
            }
        }),
        lr: Box::new(|_| 1e-3),
    };
    write(&d.path().join("run"), 0, 300, &run);
    let (out, s) = scan_monitor(d.path());
    assert_eq!(out.code, 0, "warnings only: {s}");
    assert_eq!(s["verdict"], "warning");
    let kinds: Vec<(String, i64)> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["step"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds[0], ("loss_spike".to_string(), 120), "{kinds:?}");
    assert!(kinds.contains(&("dead".to_string(), 150)), "{kinds:?}");
    let out = scan(
        &d.path().join("run"),
        &d.path().join("scan_w"),
        &["--fail-on", "warning"],
    );
    assert_eq!(out.code, 1);
}

#[test]
fn module_names_are_data_in_every_report() {
    let d = tempfile::tempdir().unwrap();
    // A hostile module name: markup and a newline.
    let dir = d.path().join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    for (side, rel) in [("bench", 0.0), ("cmp", 0.5)] {
        let dir = d.path().join(side);
        std::fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("step", DataType::Int32, false),
            Field::new("module", DataType::Utf8, false),
            Field::new("output_norm", DataType::Float64, true),
        ]));
        let file = std::fs::File::create(dir.join("rank0.arrows")).unwrap();
        let mut w = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
        for s in 0..40 {
            let v = if s >= 30 { 1.0 + rel } else { 1.0 };
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int32Array::from(vec![s])),
                Arc::new(StringArray::from(vec!["<script>x</script>\nevil"])),
                Arc::new(Float64Array::from(vec![v])),
            ];
            w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
                .unwrap();
        }
        w.finish().unwrap();
    }
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(s["parting"]["step"], 30);
    let html = std::fs::read_to_string(d.path().join("out/monitor.html")).unwrap();
    assert!(!html.contains("<script>x"), "unescaped name in the html");
    assert!(html.contains("&lt;script&gt;"));
    assert!(!out.stdout.contains("\nevil"), "{}", out.stdout);
}

#[test]
fn the_bundled_monitor_pair_parts_at_the_step_its_fault_appears() {
    // testdata/generate_monitor.sh: train_small monitored, Functional.gelu 5 % off from
    // step 40 in the comparison.
    let d = tempfile::tempdir().unwrap();
    let data = root().join("testdata/monitor");
    let out = d.path().join("out");
    let o = compare_paths(&data.join("bench"), &data.join("cmp"), &out, &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["parting"]["step"], 40, "{s}");
    // The activation is no module: the module fed by it (fc2) parts first, fed by fc1.
    assert_eq!(s["parting"]["series"]["module"], "block.fc2", "{s}");
    assert_eq!(s["parting"]["producer"], "block.fc1", "{s}");
    // Alone, the comparison run has no event: the fault is no NaN and no spike.
    let o = scan(&data.join("cmp"), &d.path().join("scan"), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
}

#[test]
fn a_module_one_run_never_calls_is_said_not_judged() {
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 60, &clean(0.0));
    let base = clean(0.0);
    let run = Run {
        // head is never called in the comparison (its output norm is null).
        value: Box::new(move |s, m, metric| {
            if m == 5 && metric == "output_norm" {
                None
            } else {
                (base.value)(s, m, metric)
            }
        }),
        loss: Box::new(|s| clean(0.0).loss.as_ref()(s)),
        lr: Box::new(|_| 1e-3),
    };
    write(&d.path().join("cmp"), 0, 60, &run);
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(s["parting"].is_null());
    let w = s["warnings"].to_string();
    assert!(
        w.contains("1 series differ without measure") && w.contains("head output_norm"),
        "{w}"
    );
}

#[test]
fn a_reader_that_closes_stdout_early_is_no_crash() {
    // `probe compare ... | head -1`: the summary's later lines meet a closed pipe.
    let d = tempfile::tempdir().unwrap();
    let data = root().join("testdata");
    for (b, c) in [("monitor/bench", "monitor/cmp"), ("demo/bench", "demo/cmp")] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_probe"))
            .args(["compare", "-b"])
            .arg(data.join(b))
            .arg("-c")
            .arg(data.join(c))
            .arg("-o")
            .arg(d.path().join(b.replace('/', "_")))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{b}: {err}");
        assert!(!err.contains("panicked"), "{b}: {err}");
    }
}

#[test]
fn a_file_whose_grid_of_modules_and_steps_is_far_larger_than_its_rows_is_refused() {
    // 100,000 rows, each another step and another module: dense, 10^10 cells.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int32, false),
        Field::new("module", DataType::Utf8, false),
        Field::new("output_norm", DataType::Float64, true),
    ]));
    let n = 100_000;
    let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from((0..n).collect::<Vec<i32>>())),
        Arc::new(StringArray::from(names)),
        Arc::new(Float64Array::from(vec![1.0; n as usize])),
    ];
    let file = std::fs::File::create(dir.join("rank0.arrows")).unwrap();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
    w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
        .unwrap();
    w.finish().unwrap();
    let (out, _) = scan_monitor(d.path());
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("not one row per module and step"),
        "{}",
        out.stderr
    );
}

#[test]
fn runs_with_no_metric_in_common_compare_nothing_and_exit_3() {
    // Every metric column renamed in the comparison: ranks and steps in common, no series.
    // This passed ("0 series", exit 0).
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 60, &clean(0.0));
    let renamed = |m: &str| format!("v2_{m}");
    write_some(
        &d.path().join("cmp"),
        0,
        60,
        &clean(0.0),
        MODULES.len(),
        &renamed,
    );
    let (out, s) = compare_monitors(d.path(), &[]);
    // 6 modules x 7 metrics on each side, none shared.
    assert_input_error(&out, 3, "share no series");
    assert!(
        out.stderr
            .contains("42 series in the benchmark only, 42 in the comparison only"),
        "{}",
        out.stderr
    );
    assert!(s.is_null(), "no summary for nothing compared: {s}");
}

#[test]
fn series_of_modules_one_run_lacks_are_counted_and_said() {
    // The comparison monitors the first 4 modules only: layers.1 and head (2 x 7 series)
    // were dropped without a word.
    let d = tempfile::tempdir().unwrap();
    write(&d.path().join("bench"), 0, 60, &clean(0.0));
    write_some(&d.path().join("cmp"), 0, 60, &clean(0.0), 4, &|m| {
        m.to_string()
    });
    let (out, s) = compare_monitors(d.path(), &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(s["series"], 4 * 7, "{s}");
    assert_eq!(
        s["series_one_side"],
        serde_json::json!({"bench": 14, "cmp": 0})
    );
    let w = s["warnings"].to_string();
    assert!(
        w.contains("rank 0: 14 series in the benchmark only (modules \\\"layers.1\\\", \\\"head\\\"; metrics none), 0 in the comparison only"),
        "{w}"
    );
    assert!(
        out.stdout.contains("14 series in the benchmark only")
            || out.stderr.contains("14 series in the benchmark only"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}
