//! `--xlsx-rows`: past N tensor rows the workbook keeps the first N, then every warning and
//! error with 2 rows either side; compare.parquet keeps every row; `all` writes them all.
//! Expectations are computed from the parquet table, not from the workbook's own code.

use crate::common;
use arrow_array::{Array, StringArray};
use calamine::{open_workbook, Data, Reader, Xlsx};
use common::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::Path;

/// (tensor, verdict) of every tensor line of compare.parquet, in order (unmatched left out:
/// they have a sheet of their own).
fn parquet_lines(out: &Path) -> Vec<(String, String)> {
    let f = std::fs::File::open(out.join("compare.parquet")).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut v = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = |n: &str| batch.column(batch.schema().index_of(n).unwrap()).clone();
        let (t, verdict) = (col("tensor"), col("verdict"));
        let t = t.as_any().downcast_ref::<StringArray>().unwrap();
        let verdict = verdict.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..batch.num_rows() {
            if verdict.value(i) != "unmatched" {
                v.push((t.value(i).to_string(), verdict.value(i).to_string()));
            }
        }
    }
    v
}

/// Tensor names in the workbook's tensors sheet, in order.
fn sheet_tensors(out: &Path) -> (Vec<String>, Vec<Vec<Data>>) {
    let mut wb: Xlsx<_> = open_workbook(out.join("compare.xlsx")).unwrap();
    let tens = wb.worksheet_range("tensors").unwrap();
    let header: Vec<String> = tens
        .rows()
        .next()
        .unwrap()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let col = header
        .iter()
        .position(|h| h == "Tensor" || h == "NPU Name")
        .unwrap_or(5);
    let names = tens.rows().skip(1).map(|r| r[col].to_string()).collect();
    let summary = wb.worksheet_range("summary").unwrap();
    (names, summary.rows().map(|r| r.to_vec()).collect())
}

/// What the summary sheet says of the tensors rows left out.
fn left_out_note(summary: &[Vec<Data>]) -> String {
    summary
        .iter()
        .find(|r| r[0] == "tensors sheet")
        .map(|r| r[1].to_string())
        .expect("the summary says rows were left out")
}

fn run(dir: &Path, out: &str, extra: &[&str]) -> std::path::PathBuf {
    let mut a = vec!["-q", "--format", "parquet,xlsx"];
    a.extend_from_slice(extra);
    let r = compare_to(dir, out, &a);
    assert!(r.code == 0 || r.code == 1, "{}", r.stderr);
    dir.join(out)
}

#[test]
fn a_bounded_workbook_keeps_the_first_rows_and_every_failing_one_with_context() {
    let t = tempfile::tempdir().unwrap();
    // Two steps of the demo model with a fault: passing rows, then a failing stretch.
    let mut args = DEMO_SYNTH_ARGS.to_vec();
    args.extend(["--steps", "2"]);
    synth(t.path(), &args);
    let all = run(t.path(), "all", &["--xlsx-rows", "all"]);
    let lines = parquet_lines(&all);
    let (names, _) = sheet_tensors(&all);
    let every: Vec<String> = lines.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, every, "--xlsx-rows all writes every tensor row");

    let n = 5;
    let few = run(t.path(), "few", &["--xlsx-rows", &n.to_string()]);
    let lines = parquet_lines(&few);
    let failing: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].1 != "pass").collect();
    assert!(
        !failing.is_empty() && lines.len() > n + 10,
        "the test needs failing and passing rows"
    );
    let want: Vec<String> = (0..lines.len())
        .filter(|&i| i < n || failing.iter().any(|&f| i + 2 >= f && i <= f + 2))
        .map(|i| lines[i].0.clone())
        .collect();
    let (names, summary) = sheet_tensors(&few);
    assert_eq!(names, want);
    assert!(names.len() < lines.len());
    let note = left_out_note(&summary);
    assert!(
        note.starts_with(&format!("{} of {} rows", want.len(), lines.len())),
        "{note}"
    );
    assert!(note.contains("compare.parquet has every row"), "{note}");
}

#[test]
fn a_run_within_the_bound_keeps_every_row_and_says_nothing() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), DEMO_SYNTH_ARGS);
    let out = run(t.path(), "out", &[]);
    let (names, summary) = sheet_tensors(&out);
    assert_eq!(names.len(), parquet_lines(&out).len());
    assert!(!summary.iter().any(|r| r[0] == "tensors sheet"));
    let bad = compare(t.path(), &["-q", "--xlsx-rows", "some"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

#[test]
fn a_run_failing_everywhere_keeps_the_first_failing_rows_and_says_how_many_more() {
    let t = tempfile::tempdir().unwrap();
    // Every tensor out of tolerance: 3,000 failing rows.
    synth(
        t.path(),
        &[
            "--mode",
            "statistics",
            "--bulk",
            "3000",
            "--bulk-elems",
            "16",
        ]
        .into_iter()
        .chain(["--noise", "1e-1"])
        .collect::<Vec<_>>(),
    );
    let n = 10;
    let out = run(t.path(), "out", &["--xlsx-rows", &n.to_string()]);
    let lines = parquet_lines(&out);
    assert_eq!(lines.len(), 3000);
    assert!(lines.iter().all(|(_, v)| v == "error"));
    let (names, summary) = sheet_tensors(&out);
    // The first n, then failing rows while fewer than n + max(n, 1000) are shown, the last
    // one's 2 rows of context after it completing: the first 1,012 rows.
    let limit = n + n.max(1000) + 2;
    let want: Vec<String> = lines[..limit]
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(names, want);
    let note = left_out_note(&summary);
    assert!(
        note.starts_with(
            "1,012 of 3,000 rows: the first 10, then the first 1,012 warnings and errors \
             (1,988 more are only in compare.parquet)"
        ),
        "{note}"
    );
}
