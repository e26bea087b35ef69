//! The chart on the compare workbook's summary sheet: the chart part read from the xlsx zip
//! (calamine does not read charts), its points on the `plot` sheet checked against an
//! expectation computed independently from the parquet table, the culprit from
//! summary.json.

use crate::common;
use arrow_array::{Array, Float64Array, StringArray};
use calamine::{open_workbook, Data, Reader, Xlsx};
use common::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::io::Read;
use std::path::Path;

/// Compares the bundled demo pair (one injected fault) into `out`.
fn compare_demo(out: &Path) {
    let demo = root().join("testdata/demo");
    let o = compare_paths(&demo.join("bench"), &demo.join("cmp"), out, &["-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
}

/// Every part of an xlsx, by name.
fn parts(path: &Path) -> Vec<(String, Vec<u8>)> {
    let f = std::fs::File::open(path).unwrap();
    let mut z = zip::ZipArchive::new(f).unwrap();
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).unwrap();
            let mut v = Vec::new();
            e.read_to_end(&mut v).unwrap();
            (e.name().unwrap().to_string(), v)
        })
        .collect()
}

/// One op as the chart should draw it: its worst tensor by error over tolerance.
#[derive(Debug)]
struct Expected {
    place: String,
    op: String,
    direction: String,
    err: f64,
    tolerance: f64,
}

/// The ops of the parquet table in execution order (unmatched lines left out), each with
/// the error and tolerance of its tensor furthest past its tolerance.
fn expected_ops(parquet: &Path) -> Vec<Expected> {
    let f = std::fs::File::open(parquet).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut out: Vec<Expected> = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = |n: &str| batch.column(batch.schema().index_of(n).unwrap()).clone();
        let text = |n: &str| {
            let c = col(n);
            let a = c.as_any().downcast_ref::<StringArray>().unwrap();
            (0..a.len())
                .map(|i| a.value(i).to_string())
                .collect::<Vec<_>>()
        };
        let number = |n: &str| {
            let c = col(n);
            let a = c.as_any().downcast_ref::<Float64Array>().unwrap();
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect::<Vec<_>>()
        };
        let (step, rank, op, dir, verdict) = (
            text("step"),
            text("rank"),
            text("op"),
            text("direction"),
            text("verdict"),
        );
        let (err, tol) = (number("err"), number("tolerance"));
        for i in 0..batch.num_rows() {
            if verdict[i] == "unmatched" {
                continue;
            }
            let place = format!("{}/{}", step[i], rank[i]);
            let (e, t) = (err[i].unwrap(), tol[i].unwrap());
            match out.last_mut() {
                Some(x) if x.place == place && x.op == op[i] => {
                    if e / t > x.err / x.tolerance {
                        x.err = e;
                        x.tolerance = t;
                    }
                }
                _ => out.push(Expected {
                    place,
                    op: op[i].clone(),
                    direction: dir[i].clone(),
                    err: e,
                    tolerance: t,
                }),
            }
        }
    }
    out
}

fn float(d: &Data) -> Option<f64> {
    match d {
        Data::Float(f) => Some(*f),
        Data::Int(i) => Some(*i as f64),
        Data::Empty => None,
        other => panic!("not a number: {other:?}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
}

#[test]
fn summary_sheet_has_a_log_scale_chart_of_every_op_with_the_culprit_labelled() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    compare_demo(&out);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let culprit = s["first_divergent"]["forward"]["op"].as_str().unwrap();
    assert_eq!(
        culprit, "Functional.gelu.1.forward",
        "the demo's injected fault"
    );

    // The chart part: on the summary sheet (the first), log scale, four series, the label.
    let xlsx = out.join("compare.xlsx");
    let parts = parts(&xlsx);
    let part = |name: &str| {
        let (_, v) = parts
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in the workbook"));
        String::from_utf8(v.clone()).unwrap()
    };
    let chart = part("xl/charts/chart1.xml");
    assert!(!parts.iter().any(|(n, _)| n == "xl/charts/chart2.xml"));
    assert!(chart.contains("<c:logBase val=\"10\"/>"), "{chart}");
    let series: Vec<&str> = chart.split("<c:ser>").skip(1).collect();
    assert_eq!(series.len(), 4, "forward, backward, tolerance, culprit");
    for (s, name) in series
        .iter()
        .zip(["forward", "backward", "tolerance", "culprit"])
    {
        assert!(s.contains(&format!("<c:v>{name}</c:v>")), "{name}: {s}");
    }
    assert!(
        series[3].contains(&format!("<a:t>{culprit}</a:t>")),
        "{}",
        series[3]
    );
    assert!(chart.contains("Error per op along execution order"));
    let drawing = part("xl/worksheets/_rels/sheet1.xml.rels");
    assert!(
        drawing.contains("drawing"),
        "the chart is on the summary sheet"
    );

    // Its points: one per op, as computed from the parquet table.
    let expected = expected_ops(&out.join("compare.parquet"));
    assert!(
        expected.iter().any(|e| e.direction == "backward"),
        "the demo has a backward pass"
    );
    let mut wb: Xlsx<_> = open_workbook(&xlsx).unwrap();
    assert_eq!(
        wb.sheet_names(),
        vec!["summary", "tensors", "unmatched", "plot"]
    );
    let plot = wb.worksheet_range("plot").unwrap();
    let rows: Vec<&[Data]> = plot.rows().skip(1).collect();
    assert_eq!(rows.len(), expected.len(), "every op (no downsampling)");
    let mut culprits = 0;
    for (i, (r, e)) in rows.iter().zip(&expected).enumerate() {
        assert_eq!(float(&r[0]), Some(i as f64 + 1.0), "x");
        assert_eq!(r[1].to_string(), e.place);
        assert_eq!(r[2].to_string(), e.op);
        assert_eq!(r[3].to_string(), e.direction);
        let err = float(&r[5]).unwrap();
        assert!(close(err, e.err), "{}: {err} vs {}", e.op, e.err);
        assert!(close(float(&r[6]).unwrap(), e.tolerance), "{}", e.op);
        let (fwd, bwd) = (float(&r[7]), float(&r[8]));
        let drawn = e.err.max(1e-10);
        if e.direction == "forward" {
            assert!(bwd.is_none() && close(fwd.unwrap(), drawn), "{}", e.op);
        } else {
            assert!(fwd.is_none() && close(bwd.unwrap(), drawn), "{}", e.op);
        }
        assert!(close(float(&r[9]).unwrap(), e.tolerance.max(1e-10)));
        if let Some(c) = r.get(10).and_then(float) {
            culprits += 1;
            assert_eq!(e.op, culprit);
            assert!(close(c, drawn));
        }
        let failing = e.err > e.tolerance;
        assert_eq!(r[4] == "error", failing, "{}: verdict {}", e.op, r[4]);
    }
    assert_eq!(culprits, 1);
}

/// The same compare gives the same workbook byte for byte, the chart's part and the
/// document properties (a fixed creation time) included.
#[test]
fn the_chart_is_deterministic() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    compare_demo(&a);
    compare_demo(&b);
    let (pa, pb) = (
        parts(&a.join("compare.xlsx")),
        parts(&b.join("compare.xlsx")),
    );
    assert_eq!(pa.len(), pb.len());
    for ((na, va), (nb, vb)) in pa.iter().zip(&pb) {
        assert_eq!(na, nb);
        assert!(va == vb, "{na} differs");
    }
    let bytes = |d: &Path| std::fs::read(d.join("compare.xlsx")).unwrap();
    assert!(bytes(&a) == bytes(&b), "compare.xlsx differs");
}
