//! Non-finite values end to end: msprobe's bare `NaN`/`Infinity` tokens and `"nan"`
//! strings read as numbers, agreeing non-finite statistics compare equal, the first
//! producer is named, and every bundled dump compares clean with itself.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

fn td(p: &str) -> PathBuf {
    root().join("testdata").join(p)
}

fn compare_dirs(b: &Path, c: &Path, out: &Path) -> Out {
    probe(&[
        "compare",
        "-b",
        b.to_str().unwrap(),
        "-c",
        c.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ])
}

fn summary_at(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

/// Every dump root under testdata/: folders holding `step<S>` folders.
fn bundled_dumps() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut subdirs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        if subdirs.iter().any(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step"))
        }) {
            out.push(dir.to_path_buf());
            return;
        }
        for p in subdirs {
            walk(&p, out);
        }
    }
    let mut out = Vec::new();
    walk(&td(""), &mut out);
    out
}

#[test]
fn every_bundled_dump_compared_with_itself_passes() {
    let dumps = bundled_dumps();
    assert!(dumps.len() >= 9, "found only {dumps:?}");
    assert!(dumps.iter().any(|d| d.ends_with("nonfinite_cmp")));
    let t = tempfile::tempdir().unwrap();
    for (i, d) in dumps.iter().enumerate() {
        let out = t.path().join(format!("o{i}"));
        let o = compare_dirs(d, d, &out);
        assert_eq!(o.code, 0, "{}: {}{}", d.display(), o.stdout, o.stderr);
        let s = summary_at(&out);
        assert_eq!(s["verdict"], "pass", "{}", d.display());
        assert_eq!(s["counts"]["error"], 0);
    }
}

#[test]
fn msprobe_bare_nan_and_infinity_tokens_are_read_as_numbers() {
    // The fixture holds both spellings msprobe uses: bare tokens and strings.
    let text = std::fs::read_to_string(td("msprobe/nonfinite_cmp/step0/proc2/dump.json")).unwrap();
    assert!(text.contains(": NaN") && text.contains("\"nan\""));
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_err(),
        "not strict JSON"
    );
    let bench =
        std::fs::read_to_string(td("msprobe/nonfinite_bench/step0/proc1/dump.json")).unwrap();
    assert!(bench.contains("-Infinity"));
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let o = compare_dirs(
        &td("msprobe/nonfinite_bench"),
        &td("msprobe/nonfinite_bench"),
        &out,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // The masked scores keep their -inf minimum as a number in the parquet table.
    let p = std::fs::File::open(out.join("compare.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(p)
        .unwrap()
        .build()
        .unwrap();
    let mut found = false;
    for batch in reader {
        let batch = batch.unwrap();
        let col = |n: &str| batch.column(batch.schema().index_of(n).unwrap()).clone();
        let tensor = col("tensor");
        let tensor = tensor
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        let min = col("bench_min");
        let min = min
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .unwrap();
        for i in 0..batch.num_rows() {
            if tensor.value(i) == "Functional.softmax.0.forward.input.0" {
                assert_eq!(min.value(i), f64::NEG_INFINITY);
                found = true;
            }
        }
    }
    assert!(found);
}

#[test]
fn the_first_nan_producer_is_named_in_the_headline() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let o = compare_dirs(
        &td("msprobe/nonfinite_bench"),
        &td("msprobe/nonfinite_cmp"),
        &out,
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary_at(&out);
    assert_eq!(s["first_nonfinite"]["op"], "Functional.gelu.0.forward");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("NaN/Inf") && h.contains("Functional.gelu.0.forward"),
        "{h}"
    );
    // The mask's -inf agrees on both sides: softmax's input is no error.
    let reason = |name: &str| {
        s["first_nonfinite"]["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains(name))
    };
    assert!(reason("Functional.gelu.0.forward.output.0"));
}

#[test]
fn probe_dumps_with_bare_tokens_are_read_too() {
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &["--mode", "statistics", "--nan", "Functional.gelu.0"],
    );
    // Rewrite the comparison's string statistics as Python's bare tokens.
    let p = t.path().join("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains("\"nan\""));
    std::fs::write(&p, text.replace("\"nan\"", "NaN")).unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    assert_eq!(s["first_nonfinite"]["op"], "Functional.gelu.0.forward");
    // And compared with itself, the NaN statistics are equal.
    let out = t.path().join("self");
    let cmp = t.path().join("cmp");
    let o = compare_dirs(&cmp, &cmp, &out);
    assert_eq!(o.code, 0, "{}", o.stdout);
}
