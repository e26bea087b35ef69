//! The command lines of Ascend's migration tutorial, pasted: `config-check -c A B`,
//! `-f pytorch`, `compare -l api|module`, and the reports in the tutorial's shape
//! (`pass_check`, a per-op table linking to each op's tensors).

use crate::common;
use calamine::{open_workbook, Data, Reader, Xlsx};
use common::*;
use probe::schema::dump::{OpRecord, Stat, StatsRecord, TensorRecord};
use std::io::Read;
use std::path::Path;

fn pack(name: &str) -> String {
    root()
        .join("testdata/config_check")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn config_check_takes_the_tutorial_form_and_writes_pass_check() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (pack("base.zip"), pack("env.zip"));
    let out1 = t.path().join("positional");
    let out2 = t.path().join("dash_c");
    let o1 = probe(&["config-check", &a, &b, "-o", out1.to_str().unwrap()]);
    let o2 = probe(&[
        "config-check",
        "-c",
        &a,
        &b,
        "-o",
        out2.to_str().unwrap(),
        "-f",
        "pytorch",
    ]);
    assert_eq!((o1.code, o2.code), (1, 1), "{}{}", o2.stdout, o2.stderr);
    assert!(o2.stderr.contains("-f pytorch ignored"), "{}", o2.stderr);
    let read = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("config_check.json")).unwrap())
            .unwrap()
    };
    let (j1, j2) = (read(&out1), read(&out2));
    assert_eq!(
        j1["categories"], j2["categories"],
        "both forms give the same result"
    );
    let cat = |name: &str| {
        j2["categories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(cat("env")["pass_check"], false);
    assert_eq!(cat("packages")["pass_check"], true);
    // The workbook's summary: pass_check TRUE/FALSE, msprobe's item names (pip).
    let mut wb: Xlsx<_> = open_workbook(out2.join("config_check.xlsx")).unwrap();
    let s = wb.worksheet_range("summary").unwrap();
    let rows: Vec<Vec<Data>> = s.rows().map(|r| r.to_vec()).collect();
    let head: Vec<String> = rows[0].iter().map(|c| c.to_string()).collect();
    let col = |n: &str| head.iter().position(|h| h == n).unwrap();
    let (pc, fname) = (col("pass_check"), col("filename (msprobe)"));
    let row = |name: &str| rows.iter().find(|r| r[0] == name).unwrap();
    assert_eq!(row("env")[pc], Data::Bool(false));
    assert_eq!(row("packages")[pc], Data::Bool(true));
    assert_eq!(row("packages")[fname].to_string(), "pip");
    // Neither form: a usage error.
    let o = probe(&["config-check", &a, "-o", out1.to_str().unwrap()]);
    assert_eq!(o.code, 2);
}

fn stats(v: f64) -> StatsRecord {
    StatsRecord {
        max: Stat(Some(v)),
        min: Stat(Some(v)),
        mean: Stat(Some(v)),
        norm: Stat(Some(10.0 * v.abs())),
        nan: Some(0),
        inf: Some(0),
    }
}

/// A mix-level dump: a module call holding two API calls; `gelu` is off by `off`.
fn mix_dump(dir: &Path, off: f64) {
    let t = |name: String, role: &str, v: f64| TensorRecord {
        checksum: None,
        dtype: "float32".into(),
        file: None,
        data_offsets: None,
        id: None,
        name,
        role: role.into(),
        shape: vec![100],
        src: None,
        stats: Some(stats(v)),
        unwritten: false,
        stride: None,
        offset: None,
        storage: None,
        format: None,
    };
    let op = |key: &str, kind: &str, vin: f64, vout: f64| OpRecord {
        args: None,
        direction: "forward".into(),
        kind: kind.into(),
        module: Some("block".into()),
        op: key.into(),
        recompute: false,
        group: None,
        coll_seq: None,
        seq: 0,
        stack: None,
        tensors: vec![
            t(format!("{key}.input.0"), "input", vin),
            t(format!("{key}.output.0"), "output", vout),
        ],
    };
    write_op_log(
        dir,
        vec![
            op("Functional.linear.0.forward", "api", 1.0, 2.0),
            op("Functional.gelu.0.forward", "api", 2.0, 3.0 + off),
            op("Module.block.Block.forward.0", "module", 1.0, 3.0 + off),
        ],
    );
}

#[test]
fn compare_level_restricts_records_and_verdict() {
    let t = tempfile::tempdir().unwrap();
    mix_dump(&t.path().join("bench"), 0.0);
    mix_dump(&t.path().join("cmp"), 0.5);
    let s = |level: &str| {
        let o = compare(t.path(), &["-l", level, "-q", "-f", "pytorch"]);
        (o.code, summary(t.path()))
    };
    let (code, api) = s("api");
    assert_eq!(code, 1);
    assert_eq!(api["counts"]["tensors"], 4);
    assert_eq!(
        api["first_divergent"]["forward"]["op"],
        "Functional.gelu.0.forward"
    );
    let (code, module) = s("module");
    assert_eq!(code, 1);
    assert_eq!(module["counts"]["tensors"], 2);
    assert_eq!(
        module["earliest_failing"]["forward"]["op"],
        "Module.block.Block.forward.0"
    );
    let (_, mix) = s("mix");
    assert_eq!(mix["counts"]["tensors"], 6);
    let o = compare(t.path(), &["-l", "L9"]);
    assert_eq!(o.code, 2);
}

#[test]
fn the_summary_sheet_links_each_op_to_its_tensors() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), DEMO_SYNTH_ARGS);
    let o = compare(t.path(), &["-q"]);
    assert_eq!(o.code, 1);
    let path = t.path().join("out/compare.xlsx");
    // Where each op's first tensor is in the tensors sheet (row numbers as Excel counts).
    let mut wb: Xlsx<_> = open_workbook(&path).unwrap();
    let tensors = wb.worksheet_range("tensors").unwrap();
    let rows: Vec<Vec<Data>> = tensors.rows().map(|r| r.to_vec()).collect();
    let op_col = rows[0].iter().position(|h| *h == "Op").unwrap();
    let mut first: std::collections::HashMap<String, usize> = Default::default();
    for (i, r) in rows.iter().enumerate().skip(1) {
        first.entry(r[op_col].to_string()).or_insert(i + 1);
    }
    // The hyperlinks of the summary sheet (sheet1.xml), read from the package.
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&path).unwrap()).unwrap();
    let mut xml = String::new();
    zip.by_name("xl/worksheets/sheet1.xml")
        .unwrap()
        .read_to_string(&mut xml)
        .unwrap();
    let links: Vec<(String, String)> = xml
        .split("<hyperlink ")
        .skip(1)
        .map(|h| {
            let attr = |k: &str| {
                let s = h.split(&format!("{k}=\"")).nth(1).unwrap();
                s[..s.find('"').unwrap()].replace("&apos;", "'")
            };
            (attr("display"), attr("location"))
        })
        .collect();
    assert_eq!(links.len(), first.len(), "one link per op");
    for (op, loc) in &links {
        assert_eq!(loc, &format!("'tensors'!A{}", first[op]), "{op}");
    }
    assert!(links
        .iter()
        .any(|(op, _)| op == "Functional.gelu.1.forward"));
}
