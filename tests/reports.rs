//! The report files read back: the workbook with calamine, the table with the parquet
//! reader, the JSON against its schema's required fields.

use crate::common;
use arrow_array::{Array, Float64Array, StringArray};
use calamine::{open_workbook, Data, Reader, Xlsx};
use common::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::Path;

fn run_demo() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--inject", "Functional.gelu.1"]);
    // One unmatched tensor on each side, so every sheet has content.
    let p = t.path().join("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replacen(
            "Torch.add.2.forward.output.0",
            "Torch.add.2.forward.output.9",
            1,
        ),
    )
    .unwrap();
    let p = t.path().join("cmp/step0/rank0/tensors-00000.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let needle = b"Torch.add.2.forward.output.0";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let mut bytes = bytes;
    bytes[at + needle.len() - 1] = b'9';
    std::fs::write(&p, bytes).unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    t
}

#[test]
fn workbook_has_summary_tensors_unmatched_in_order() {
    let t = run_demo();
    let s = summary(t.path());
    let mut wb: Xlsx<_> = open_workbook(t.path().join("out/compare.xlsx")).unwrap();
    assert_eq!(
        wb.sheet_names(),
        vec!["summary", "tensors", "unmatched", "plot"]
    );
    let sum = wb.worksheet_range("summary").unwrap();
    let cells: Vec<String> = sum
        .rows()
        .flat_map(|r| r.iter().map(|c| c.to_string()))
        .collect();
    assert!(
        cells.iter().any(|c| c == "Functional.gelu.1.forward"),
        "culprit on the summary sheet"
    );
    assert!(cells.iter().any(|c| c.starts_with("DIVERGENCE")));
    let tens = wb.worksheet_range("tensors").unwrap();
    let rows: Vec<&[Data]> = tens.rows().collect();
    let header: Vec<String> = rows[0].iter().map(|c| c.to_string()).collect();
    for col in [
        "Tensor",
        "Cosine",
        "MaxAbsErr",
        "MaxRelativeErr",
        "One Thousandth Err Ratio",
        "Verdict",
        "Reason",
        "Tolerance",
    ] {
        assert!(header.iter().any(|h| h == col), "missing column {col}");
    }
    assert_eq!(
        rows.len() - 1,
        s["counts"]["tensors"].as_u64().unwrap() as usize
    );
    let seq_col = header.iter().position(|h| h == "Seq").unwrap();
    let seqs: Vec<f64> = rows[1..]
        .iter()
        .map(|r| match r[seq_col] {
            Data::Float(f) => f,
            ref other => panic!("seq {other:?}"),
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "execution order");
    let verdict_col = header.iter().position(|h| h == "Verdict").unwrap();
    let errors = rows[1..]
        .iter()
        .filter(|r| r[verdict_col] == "error")
        .count();
    assert_eq!(errors, s["counts"]["error"].as_u64().unwrap() as usize);
    let un = wb.worksheet_range("unmatched").unwrap();
    let names: Vec<String> = un.rows().skip(1).map(|r| r[5].to_string()).collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"Torch.add.2.forward.output.0".to_string()));
    assert!(names.contains(&"Torch.add.2.forward.output.9".to_string()));
}

#[test]
fn parquet_holds_every_row_and_metric() {
    let t = run_demo();
    let s = summary(t.path());
    let f = std::fs::File::open(t.path().join("out/compare.parquet")).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = 0;
    let mut unmatched = 0;
    let mut culprit_cos = None;
    for batch in reader {
        let batch = batch.unwrap();
        rows += batch.num_rows();
        let col = |n: &str| batch.column(batch.schema().index_of(n).unwrap()).clone();
        let verdict = col("verdict");
        let verdict = verdict.as_any().downcast_ref::<StringArray>().unwrap();
        let tensor = col("tensor");
        let tensor = tensor.as_any().downcast_ref::<StringArray>().unwrap();
        let cos = col("cosine");
        let cos = cos.as_any().downcast_ref::<Float64Array>().unwrap();
        for i in 0..batch.num_rows() {
            if verdict.value(i) == "unmatched" {
                unmatched += 1;
                assert!(cos.is_null(i));
            }
            if tensor.value(i) == "Functional.gelu.1.forward.output.0" {
                culprit_cos = Some(cos.value(i));
            }
        }
    }
    let c = &s["counts"];
    assert_eq!(rows as u64, c["tensors"].as_u64().unwrap() + 2);
    assert_eq!(unmatched, 2);
    let cos = culprit_cos.unwrap();
    assert!(cos < 0.9999 && cos > 0.99, "{cos}");
}

#[test]
fn summary_json_has_the_schema_fields() {
    let t = run_demo();
    let s = summary(t.path());
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schemas/probe-compare-summary.v2.schema.json"))
            .unwrap(),
    )
    .unwrap();
    for k in schema["required"].as_array().unwrap() {
        assert!(
            s.get(k.as_str().unwrap()).is_some(),
            "summary.json lacks {k}"
        );
    }
    assert_eq!(s["format"], "probe-compare-summary");
    assert_eq!(s["version"], 2);
    for k in schema["properties"]["counts"]["required"]
        .as_array()
        .unwrap()
    {
        assert!(
            s["counts"].get(k.as_str().unwrap()).is_some(),
            "counts lacks {k}"
        );
    }
    for k in schema["$defs"]["finding"]["required"].as_array().unwrap() {
        assert!(
            s["first_divergent"]["forward"]
                .get(k.as_str().unwrap())
                .is_some(),
            "finding lacks {k}"
        );
    }
    // No temporary files left behind.
    let left = leftovers(&t.path().join("out"));
    assert!(left.is_empty(), "{left:?}");
}

/// The text of `entry` in the zip at `path`.
fn zip_entry(path: &Path, entry: &str) -> String {
    let f = std::fs::File::open(path).unwrap();
    let mut z = zip::ZipArchive::new(f).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut z.by_name(entry).unwrap(), &mut text).unwrap();
    text
}

#[test]
fn workbooks_carry_no_wall_clock_time() {
    // rust_xlsxwriter writes the time of writing into docProps/core.xml unless told a
    // date: two runs on the same inputs then differed in their workbooks' bytes. Every
    // workbook probe writes (compare, scan, merge, config-check) says 1980-01-01, the
    // date of its zip entries.
    let fixed = "1980-01-01T00:00:00Z";
    let t = run_demo();
    let scan_out = t.path().join("scan");
    assert_eq!(scan(&t.path().join("cmp"), &scan_out, &[]).code, 0);
    let packs = root().join("testdata/config_check");
    let check_out = t.path().join("check");
    let o = probe(&[
        "config-check",
        packs.join("base.zip").to_str().unwrap(),
        packs.join("seed.zip").to_str().unwrap(),
        "-o",
        check_out.to_str().unwrap(),
        "-q",
    ]);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    for book in [
        t.path().join("out/compare.xlsx"),
        scan_out.join("scan.xlsx"),
        check_out.join("config_check.xlsx"),
    ] {
        let core = zip_entry(&book, "docProps/core.xml");
        for tag in ["dcterms:created", "dcterms:modified"] {
            let want = format!(r#"<{tag} xsi:type="dcterms:W3CDTF">{fixed}</{tag}>"#);
            assert!(core.contains(&want), "{}: {core}", book.display());
        }
    }
}
