//! `probe compare --reference REF` (docs/compare.md, "Drift or defect"): each tensor judged
//! against k times the reference run's error on it, on small synthetic runs whose errors are
//! set by hand: a chain `x -> A -> a -> B -> b`.

mod common;
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
    let r = &s["reference"];
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
    assert_eq!(summary(d.path())["reference"]["k"], 12.0);
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
    let r = &s["reference"];
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
    assert_eq!(s["reference"]["calibrated"], 0, "{s}");
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
