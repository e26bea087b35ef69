//! `probe compare --reference REF` (docs/compare.md, "Drift or defect"): each tensor judged
//! against k times the reference run's error on it, on small synthetic runs whose errors are
//! set by hand: a chain `x -> A -> a -> B -> b`.

use crate::common;
use common::*;
use std::path::Path;

/// One run of the chain at `step`: `A` outputs `1 + da`, `B` outputs `2 * (1 + db)`.
fn chain_at(dir: &Path, step: &str, da: f32, db: f32) {
    let x = vec![1.0f32; 4];
    let a = vec![1.0 + da; 4];
    let b = vec![2.0 * (1.0 + db); 4];
    let mut first = op_record(
        "Torch.exp.0.forward",
        &[("input.0", "input", x), ("output.0", "output", a.clone())],
    );
    first.tensors[1].id = Some(1);
    let mut second = op_record(
        "Torch.sin.0.forward",
        &[("input.0", "input", a), ("output.0", "output", b)],
    );
    second.tensors[0].src = Some(1);
    write_op_log_at(dir, step, "rank0", "statistics", vec![first, second]);
}

fn chain(dir: &Path, da: f32, db: f32) {
    chain_at(dir, "step0", da, db);
}

/// `compare` of dir/bench and dir/cmp with dir/ref as the reference, and `extra`.
fn with_reference(dir: &Path, extra: &[&str]) -> Out {
    let r = dir.join("ref");
    let mut args = vec!["--reference", r.to_str().unwrap()];
    args.extend_from_slice(extra);
    compare(dir, &args)
}

#[test]
fn errors_within_k_times_the_references_pass_and_beyond_fail_with_the_ratio() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    // Twice the reference's drift on both tensors: float32's tolerance (1e-4) fails it,
    // the reference's envelope (4x) passes it.
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let o = with_reference(d.path(), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(s["counts"]["error"], 0, "{s}");
    let r = &s["calibration"];
    assert_eq!(r["k"], 4.0, "{r}");
    assert_eq!(
        (r["calibrated"].as_u64(), r["fallback"].as_u64()),
        (Some(4), Some(0)),
        "{r}"
    );
    assert!(r["path"].as_str().unwrap().ends_with("ref"), "{r}");

    // B's output ten times the reference's error, its input as the reference's: B is named,
    // with the ratio.
    chain(&d.path().join("cmp"), 1e-3, 1e-2);
    let o = with_reference(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Torch.sin.0.forward", "{s}");
    let reason = f["reason"].as_str().unwrap();
    assert!(reason.contains("10.0x the reference's 1.0e-3"), "{reason}");
    // With a k above the ratio, the same tensors pass.
    let o = with_reference(d.path(), &["--reference-k", "12"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(summary(d.path())["calibration"]["k"], 12.0);
}

#[test]
fn a_unit_the_reference_lacks_is_judged_by_the_tolerances_and_said() {
    let d = tempfile::tempdir().unwrap();
    for step in ["step0", "step1"] {
        chain_at(&d.path().join("bench"), step, 0.0, 0.0);
        chain_at(&d.path().join("cmp"), step, 2e-3, 2e-3);
    }
    chain_at(&d.path().join("ref"), "step0", 1e-3, 1e-3);
    let o = with_reference(d.path(), &[]);
    // step1 is judged by float32's tolerance: its 2e-3 fails.
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let warned = s["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str()
            .unwrap()
            .starts_with("step1/rank0: the reference has no counterpart")
    });
    assert!(warned, "{}", s["warnings"]);
    let r = &s["calibration"];
    assert_eq!(
        (r["calibrated"].as_u64(), r["fallback"].as_u64()),
        (Some(4), Some(4)),
        "{r}"
    );
    let f = &s["first_divergent"]["forward"];
    assert_eq!(
        (f["step"].as_str(), f["op"].as_str()),
        (Some("step1"), Some("Torch.exp.0.forward")),
        "{s}"
    );
}

#[test]
fn a_reference_of_another_model_is_said_and_its_tensors_fall_back() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    let other = op_record(
        "Torch.cos.0.forward",
        &[
            ("input.0", "input", vec![3.0; 9]),
            ("output.0", "output", vec![1.0; 9]),
        ],
    );
    write_op_log(&d.path().join("ref"), vec![other]);
    let o = with_reference(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let said = s["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str()
            .unwrap()
            .contains("the reference run has no counterpart for 4 of the benchmark's 4 tensors")
    });
    assert!(said, "{}", s["warnings"]);
    assert_eq!(s["calibration"]["calibrated"], 0, "{s}");
}

#[test]
fn a_reference_without_the_benchmarks_steps_or_a_k_below_1_is_refused() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("cmp"), 0.0, 0.0);
    chain_at(&d.path().join("ref"), "step5", 0.0, 0.0);
    let o = with_reference(d.path(), &[]);
    // Nothing comparable: exit 3.
    assert_input_error(&o, 3, "has no step/rank of");
    chain(&d.path().join("ref"), 0.0, 0.0);
    let o = with_reference(d.path(), &["--reference-k", "0.5"]);
    assert_input_error(&o, 2, "--reference-k 0.5 must be a number of at least 1");
    let o = compare(
        d.path(),
        &["--reference", d.path().join("nothing").to_str().unwrap()],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

#[test]
fn the_reference_error_is_a_column_of_the_table() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    // Rows parked in a temporary file keep it too.
    let o = with_reference(d.path(), &["--row-memory", "0"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    use arrow_array::{Array, Float64Array, StringArray};
    let f = std::fs::File::open(d.path().join("out").join("compare.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = |n: &str| batch.column(batch.schema().index_of(n).unwrap()).clone();
        let (t, r) = (col("tensor"), col("reference_err"));
        let t = t.as_any().downcast_ref::<StringArray>().unwrap();
        let r = r.as_any().downcast_ref::<Float64Array>().unwrap();
        for i in 0..batch.num_rows() {
            seen.push((t.value(i).to_string(), (!r.is_null(i)).then(|| r.value(i))));
        }
    }
    let a = seen
        .iter()
        .find(|(t, _)| t == "Torch.exp.0.forward.output.0")
        .and_then(|(_, r)| *r)
        .expect("a reference error");
    // (1e-3 less the 1e-5 of atol forgiven per statistic.)
    assert!((a - 9.9e-4).abs() < 1e-6, "{seen:?}");
}

/// `probe calibrate -b dir/bench -r REF... -o dir/cal.toml extra...`
fn calibrate(dir: &Path, refs: &[&str], extra: &[&str]) -> Out {
    let (b, o) = (dir.join("bench"), dir.join("cal.toml"));
    let refs: Vec<String> = refs
        .iter()
        .map(|r| dir.join(r).display().to_string())
        .collect();
    let mut args = vec![
        "calibrate",
        "-q",
        "-b",
        b.to_str().unwrap(),
        "-o",
        o.to_str().unwrap(),
    ];
    for r in &refs {
        args.extend(["-r", r.as_str()]);
    }
    args.extend_from_slice(extra);
    probe(&args)
}

#[test]
fn a_calibration_file_judges_as_the_reference_run_did() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    chain(&d.path().join("ref2"), 5e-4, 2e-3);
    let o = calibrate(d.path(), &["ref", "ref2"], &["--quantile", "1"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let text = std::fs::read_to_string(d.path().join("cal.toml")).unwrap();
    // One rule per API, direction and slot, the call counter and the slot's index as `*`:
    // the largest of the two references' errors (quantile 1), atol forgiven per statistic.
    assert!(
        text.contains("[calibration]\nk = 4.0\nquantile = 1.0\n"),
        "{text}"
    );
    let rule = "pattern = \"Torch.sin.*.forward.output.*\"\nreference = 1.99";
    assert!(text.contains(rule), "{text}");
    assert_eq!(text.matches("[[op]]").count(), 4, "{text}");
    let cal = d.path().join("cal.toml");
    let config = ["--config", cal.to_str().unwrap()];
    // Within 4x: a pass, though float32's tolerance fails it.
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    let o = compare(d.path(), &config);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let c = &s["calibration"];
    assert_eq!(
        (c["by"].as_str(), c["k"].as_f64()),
        (Some("file"), Some(4.0)),
        "{c}"
    );
    assert_eq!(
        (c["calibrated"].as_u64(), c["fallback"].as_u64()),
        (Some(4), Some(0)),
        "{c}"
    );
    // B's output 5x the largest reference error while its input is within: B is named.
    chain(&d.path().join("cmp"), 1e-3, 1e-2);
    let o = compare(d.path(), &config);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        summary(d.path())["first_divergent"]["forward"]["op"],
        "Torch.sin.0.forward"
    );
}

#[test]
fn a_calibration_file_of_another_model_is_said() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    assert_eq!(calibrate(d.path(), &["ref"], &[]).code, 0);
    // Another model: other ops, which no rule matches.
    let other = |dir: &Path, v: f32| {
        let r = op_record(
            "Torch.cos.0.forward",
            &[
                ("input.0", "input", vec![3.0; 9]),
                ("output.0", "output", vec![v; 9]),
            ],
        );
        write_op_log(dir, vec![r]);
    };
    other(&d.path().join("bench"), 1.0);
    other(&d.path().join("cmp"), 1.0);
    let cal = d.path().join("cal.toml");
    let o = compare(d.path(), &["--config", cal.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("matches 0 of the 2 tensors measured"),
        "{}",
        o.stderr
    );
}

#[test]
fn reruns_name_the_nondeterministic_op_and_it_is_not_blamed_for_its_noise() {
    let d = tempfile::tempdir().unwrap();
    // A rerun where A's output differs although its input is the same (atomics): A is
    // nondeterministic; B only carries what A gave it.
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("rerun"), 1e-3, 1e-3);
    let o = probe(&[
        "calibrate",
        "-b",
        d.path().join("bench").to_str().unwrap(),
        "-r",
        d.path().join("rerun").to_str().unwrap(),
        "--reruns",
        "-o",
        d.path().join("cal.toml").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let said: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("nondeterministic"))
        .collect();
    assert_eq!(said.len(), 1, "{}", o.stdout);
    assert!(
        said[0].starts_with("nondeterministic: Torch.exp.*.forward.output.*"),
        "{}",
        o.stdout
    );
    let text = std::fs::read_to_string(d.path().join("cal.toml")).unwrap();
    let rule = "pattern = \"Torch.exp.*.forward.output.*\"\nreference = 9.9";
    assert!(text.contains(rule), "{text}");
    assert_eq!(text.matches("nondeterministic = true").count(), 1, "{text}");
    let cal = d.path().join("cal.toml");
    let config = ["--config", cal.to_str().unwrap()];
    // Another run of the same noise: no culprit.
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    assert_eq!(compare(d.path(), &config).code, 0);
    // Ten times its noise: the op is named, as nondeterministic beyond its noise.
    chain(&d.path().join("cmp"), 1e-2, 1e-2);
    let o = compare(d.path(), &config);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let f = &summary(d.path())["first_divergent"]["forward"];
    assert_eq!(f["op"], "Torch.exp.0.forward", "{f}");
    assert!(
        f["reason"]
            .as_str()
            .unwrap()
            .contains("a nondeterministic op"),
        "{f}"
    );
}

#[test]
fn calibrate_refuses_bad_arguments_before_the_work() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    assert_input_error(
        &calibrate(d.path(), &["ref"], &["--k", "0.5"]),
        2,
        "--k 0.5",
    );
    assert_input_error(
        &calibrate(d.path(), &["ref"], &["--quantile", "0"]),
        2,
        "--quantile 0",
    );
    let o = probe(&[
        "calibrate",
        "-b",
        d.path().join("bench").to_str().unwrap(),
        "-r",
        d.path().join("ref").to_str().unwrap(),
        "-o",
        d.path().join("no").join("cal.toml").to_str().unwrap(),
    ]);
    assert_input_error(&o, 2, "its folder does not exist");
    assert!(!d.path().join("cal.toml").exists());
    // A calibration file with a reference error but no k is refused by compare.
    let bad = d.path().join("bad.toml");
    std::fs::write(&bad, "[[op]]\npattern = \"Torch.*\"\nreference = 1e-3\n").unwrap();
    chain(&d.path().join("cmp"), 0.0, 0.0);
    let o = compare(d.path(), &["--config", bad.to_str().unwrap()]);
    assert_input_error(&o, 2, "no [calibration] k");
}

#[test]
fn a_reference_cut_short_or_equal_to_the_benchmark_is_said() {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), 0.0, 0.0);
    chain(&d.path().join("cmp"), 2e-3, 2e-3);
    // The reference's log cut in its last line (a crashed run): B's tensors fall back.
    chain(&d.path().join("ref"), 1e-3, 1e-3);
    let log = d
        .path()
        .join("ref")
        .join("step0")
        .join("rank0")
        .join("ops.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::write(&log, &text[..text.len() - 40]).unwrap();
    let o = with_reference(d.path(), &[]);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    let s = summary(d.path());
    let said = s["warnings"].as_array().unwrap().iter().any(|w| {
        let w = w.as_str().unwrap();
        w.starts_with("step0/rank0: the reference run: ") && w.contains("incomplete")
    });
    assert!(said, "{}", s["warnings"]);
    let c = &s["calibration"];
    assert_eq!(
        (c["calibrated"].as_u64(), c["fallback"].as_u64()),
        (Some(2), Some(2)),
        "{c}"
    );
    // The benchmark given as its own reference: no drift to judge by, said.
    let o = compare(
        d.path(),
        &["--reference", d.path().join("bench").to_str().unwrap()],
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    let s = summary(d.path());
    let said = s["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str()
            .unwrap()
            .contains("the reference run equals the benchmark")
    });
    assert!(said, "{}", s["warnings"]);
}
