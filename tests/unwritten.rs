//! Tensors read from memory nothing had written (`"unwritten": true`, the agent's record of
//! leftover bytes: `torch.empty`, FSDP's gather buffers): never compared or scanned as
//! values, never "within tolerance", and named as the likely cause when an op that read
//! them is where the runs part.

use crate::common;
use common::*;
use probe::schema::dump::{OpRecord, Stat};
use std::path::Path;

/// `op_record`, with the tensors at `leftover` (indexes) read from unwritten memory: no
/// statistics, as the agent writes them.
fn op(key: &str, tensors: &[Tensor], leftover: &[usize]) -> OpRecord {
    let mut r = op_record(key, tensors);
    for &i in leftover {
        r.tensors[i].unwritten = true;
        r.tensors[i].stats = None;
    }
    r
}

/// A one-rank run: a buffer viewed before anything wrote it (leftover bytes on the sides
/// listed in `view_leftover`), then `add` reading `buf` (leftover where `add_leftover`)
/// with `y` as its output, then `mul` of that output.
fn run(dir: &Path, view_leftover: bool, add_leftover: bool, y: f32) {
    let buf = vec![0.0f32; 4];
    let x = vec![1.0f32, 2.0, 3.0, 4.0];
    let out = vec![y; 4];
    let twice: Vec<f32> = out.iter().map(|v| v * 2.0).collect();
    let view: &[usize] = if view_leftover { &[0, 1] } else { &[] };
    let add: &[usize] = if add_leftover { &[0] } else { &[] };
    let records = vec![
        op(
            "Tensor.view.0.forward",
            &[
                ("input.0", "input", buf.clone()),
                ("output.0", "output", buf.clone()),
            ],
            view,
        ),
        op(
            "Tensor.add.0.forward",
            &[
                ("input.0", "input", buf),
                ("input.1", "input", x),
                ("output.0", "output", out.clone()),
            ],
            add,
        ),
        op(
            "Tensor.mul.0.forward",
            &[("input.0", "input", out), ("output.0", "output", twice)],
            &[],
        ),
    ];
    write_op_log(dir, records);
}

#[test]
fn leftover_bytes_on_both_sides_pass_uncompared_and_on_one_side_warn() {
    let d = tempfile::tempdir().unwrap();
    // Both runs view the same kind of fresh buffer; only the cmp run reads one in `add`,
    // and it happens to hold what the bench's zeros give (no output differs).
    run(&d.path().join("bench"), true, false, 1.0);
    run(&d.path().join("cmp"), true, true, 1.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let c = &s["counts"];
    assert_eq!(c["compared_by"]["unwritten"], 3, "{c}");
    assert_eq!(c["compared_by"]["statistics"], 4, "{c}");
    assert_eq!(
        (c["pass"].as_u64(), c["warning"].as_u64()),
        (Some(6), Some(1))
    );
    assert_eq!(s["worst_ops"][0]["op"], "Tensor.add.0.forward", "{s}");
    // Every row, read back from the parquet table: how each pair was compared and why.
    let rows = parquet_rows(&d.path().join("out").join("compare.parquet"));
    let row = |t: &str| rows.iter().find(|r| r[0] == t).cloned().unwrap_or_default();
    let both = "unwritten memory on both sides (leftover bytes): not compared";
    for t in ["input.0", "output.0"] {
        let r = row(&format!("Tensor.view.0.forward.{t}"));
        assert_eq!(r[1..], ["unwritten", "pass", both], "{rows:?}");
    }
    let one = "unwritten memory on the cmp side (leftover bytes), values on the bench side: \
               not compared";
    let r = row("Tensor.add.0.forward.input.0");
    assert_eq!(r[1..], ["unwritten", "warning", one], "{rows:?}");
    let r = row("Tensor.add.0.forward.output.0");
    assert_eq!(r[1..], ["statistics", "pass", ""], "{rows:?}");
}

/// (tensor, compared_by, verdict, reason) of every row of a compare's parquet table.
fn parquet_rows(path: &Path) -> Vec<Vec<String>> {
    use arrow_array::{Array, StringArray};
    let f = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let cols: Vec<_> = ["tensor", "compared_by", "verdict", "reason"]
            .iter()
            .map(|n| batch.column(batch.schema().index_of(n).unwrap()).clone())
            .collect();
        for i in 0..batch.num_rows() {
            rows.push(
                cols.iter()
                    .map(|c| {
                        let c = c.as_any().downcast_ref::<StringArray>().unwrap();
                        if c.is_null(i) {
                            String::new()
                        } else {
                            c.value(i).to_string()
                        }
                    })
                    .collect(),
            );
        }
    }
    rows
}

#[test]
fn an_op_that_read_leftover_bytes_and_diverges_is_named_with_them() {
    let d = tempfile::tempdir().unwrap();
    run(&d.path().join("bench"), false, false, 1.0);
    // The cmp run's buffer held leftovers, and `add` turned them into a different output.
    run(&d.path().join("cmp"), false, true, 7.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Tensor.add.0.forward", "{s}");
    assert_eq!(f["leftover"], "Tensor.add.0.forward.input.0", "{f}");
    let e = f["explanation"].as_str().unwrap();
    assert!(
        e.contains("read memory nothing had written on the cmp side") && !e.starts_with("all "),
        "{e}"
    );
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("it read leftover bytes in Tensor.add.0.forward.input.0"),
        "{h}"
    );
}

/// `add` reading a buffer (leftover bytes where `leftover`, else `buf`) and ones into
/// `buf + 1`, then `exp` of that, grown `gain`-fold into the error: a run whose leftover
/// bytes were near zero.
fn amplified(dir: &Path, leftover: bool, buf: f32, gain: f32) {
    let out = vec![1.0 + buf; 4];
    let grown: Vec<f32> = out.iter().map(|v| 1.0 + (v - 1.0) * gain).collect();
    let mut a = op(
        "Tensor.add.0.forward",
        &[
            ("input.0", "input", vec![buf; 4]),
            ("input.1", "input", vec![1.0; 4]),
            ("output.0", "output", out.clone()),
        ],
        if leftover { &[0] } else { &[] },
    );
    a.tensors[2].id = Some(1);
    let mut e = op(
        "Tensor.exp.0.forward",
        &[("input.0", "input", out), ("output.0", "output", grown)],
        &[],
    );
    e.tensors[0].src = Some(1);
    write_op_log(dir, vec![a, e]);
}

#[test]
fn leftover_bytes_that_move_an_output_within_tolerance_start_a_later_error() {
    // The cmp run's buffer held leftovers near zero: `add`'s output moves 5e-5 (a float32
    // warning, no error), and `exp` grows that 6-fold into an error, less than the local
    // gain: without the leftover read, accumulated drift. With it, `add` is where the runs
    // part, however small its move.
    let d = tempfile::tempdir().unwrap();
    amplified(&d.path().join("bench"), false, 0.0, 6.0);
    amplified(&d.path().join("cmp"), true, 5e-5, 6.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Tensor.add.0.forward", "{s}");
    assert_eq!(f["leftover"], "Tensor.add.0.forward.input.0", "{f}");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("leftover bytes in Tensor.add.0.forward.input.0"),
        "{h}"
    );
    // The same values with every byte written on both sides: `add`'s input differs as its
    // output does (from outside the captured ops), and `exp` grows the error less than the
    // local gain: no op is named.
    let d = tempfile::tempdir().unwrap();
    amplified(&d.path().join("bench"), false, 0.0, 6.0);
    amplified(&d.path().join("cmp"), false, 5e-5, 6.0);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert!(s["first_divergent"]["forward"].is_null(), "{s}");
    let h = s["headline"].as_str().unwrap();
    assert!(!h.contains("leftover"), "{h}");
}

#[test]
fn scan_names_leftover_bytes_as_the_source_of_nan() {
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("run");
    let nan = vec![f32::NAN; 4];
    let mut records = vec![
        op(
            "Tensor.add.0.forward",
            &[
                ("input.0", "input", vec![0.0; 4]),
                ("input.1", "input", vec![1.0; 4]),
                ("output.0", "output", nan.clone()),
            ],
            &[0],
        ),
        op(
            "Tensor.mul.0.forward",
            &[
                ("input.0", "input", nan.clone()),
                ("output.0", "output", nan),
            ],
            &[],
        ),
    ];
    // The dataflow: mul computes from what add produced.
    records[0].tensors[2].id = Some(1);
    records[1].tensors[0].src = Some(1);
    records[1].tensors[1].id = Some(2);
    // NaN statistics as the agent writes them: NaN extremes and a count.
    for t in records.iter_mut().flat_map(|r| r.tensors.iter_mut()) {
        if t.name != "Tensor.add.0.forward.input.1" && !t.unwritten {
            t.stats = Some(probe::schema::dump::StatsRecord {
                max: Stat(Some(f64::NAN)),
                min: Stat(Some(f64::NAN)),
                mean: Stat(Some(f64::NAN)),
                norm: Stat(Some(f64::NAN)),
                nan: Some(4),
                inf: Some(0),
            });
        }
    }
    write_op_log(&dump, records);
    // Still an error (memory a C++ extension's kernel wrote can look unwritten), counted
    // apart and explained.
    let out = d.path().join("scan");
    let o = scan(&dump, &out, &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = scan_summary(&out);
    assert_eq!(s["verdict"], "error", "{s}");
    let c = &s["counts"];
    assert_eq!(
        (
            c["nonfinite"].as_u64(),
            c["nonfinite_from_leftover"].as_u64()
        ),
        (Some(0), Some(3)),
        "{c}"
    );
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "NaN/Inf only computed from leftover bytes: first by Tensor.add.0.forward from \
             leftover bytes in Tensor.add.0.forward.input.0"
        ),
        "{h}"
    );
    assert!(s["first_nonfinite"]["forward"].is_null(), "{s}");
    let f = &s["leftover_nonfinite"];
    assert_eq!(f["op"], "Tensor.add.0.forward", "{s}");
    assert_eq!(f["leftover"], "Tensor.add.0.forward.input.0", "{s}");
    let ev: Vec<&str> = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        ev[0].ends_with("input.0: unwritten memory (leftover bytes), not scanned"),
        "{ev:?}"
    );
}

/// `add` reading a buffer (`input.0`, leftover bytes where `leftover`) into `y`, then `mul`
/// of `y`, then the backward of both (gradients of `y` in size); or, with `copy`, `copy_`
/// writing `y` over the buffer instead of `add`.
fn chain(dir: &Path, leftover: bool, y: f32, copy: bool) {
    let buf = vec![0.0f32; 4];
    let out = vec![y; 4];
    let twice: Vec<f32> = out.iter().map(|v| v * 2.0).collect();
    let first = if copy {
        "Tensor.copy_.0.forward"
    } else {
        "Tensor.add.0.forward"
    };
    let mut a = op(
        first,
        &[
            ("input.0", "input", buf),
            ("input.1", "input", vec![1.0; 4]),
            ("output.0", "output", out.clone()),
        ],
        if leftover { &[0] } else { &[] },
    );
    a.tensors[2].id = Some(1);
    let mut m = op(
        "Tensor.mul.0.forward",
        &[("input.0", "input", out), ("output.0", "output", twice)],
        &[],
    );
    m.tensors[0].src = Some(1);
    m.tensors[1].id = Some(2);
    let grad = |key: &str| {
        let g = vec![y; 4];
        op(
            key,
            &[("input.0", "input", g.clone()), ("output.0", "output", g)],
            &[],
        )
    };
    let back = first.replace(".forward", ".backward");
    write_op_log(dir, vec![a, m, grad("Tensor.mul.0.backward"), grad(&back)]);
}

/// [`chain`] with `y = b` on the bench side and `y = c` on the cmp side, both reading
/// leftover bytes, compared: the run, its summary and its parquet rows (the folder lives
/// as long as the first).
fn compare_chains(
    b: f32,
    c: f32,
    copy: bool,
) -> (tempfile::TempDir, Out, serde_json::Value, Vec<Vec<String>>) {
    let d = tempfile::tempdir().unwrap();
    chain(&d.path().join("bench"), true, b, copy);
    chain(&d.path().join("cmp"), true, c, copy);
    let o = compare(d.path(), &[]);
    let s = summary(d.path());
    let rows = parquet_rows(&d.path().join("out").join("compare.parquet"));
    (d, o, s, rows)
}

/// The `summary.json` a scan wrote to `out`.
fn scan_summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn what_both_runs_computed_from_leftover_bytes_is_no_divergence() {
    // PyTorch's pipeline stages run a forward on torch.empty inputs to learn their shapes:
    // two runs of one job read different leftovers there, and what they compute differs.
    // Not a divergence, and not a pass either: memory a C++ extension's kernel wrote can
    // look unwritten, so what was not compared makes the comparison incomplete (exit 4).
    let (_d, o, s, rows) = compare_chains(1.0, 7.0, false);
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    assert!(s["first_divergent"]["forward"].is_null(), "{s}");
    assert_eq!(s["counts"]["error"], 0, "{s}");
    assert!(
        s["headline"].as_str().unwrap().starts_with(
            "INCOMPLETE: step0/rank0: 7 tensors computed from leftover bytes both runs read, \
             from Tensor.add.0.forward on, not compared"
        ),
        "{s}"
    );
    let row = |t: &str| rows.iter().find(|r| r[0] == t).cloned().unwrap_or_default();
    let add = row("Tensor.add.0.forward.output.0");
    assert_eq!(add[1..3], ["statistics", "warning"], "{rows:?}");
    assert!(
        add[3].ends_with(
            "computed from leftover bytes both runs read in Tensor.add.0.forward.input.0: \
             the difference is theirs, not this op's"
        ),
        "{add:?}"
    );
    let mul = row("Tensor.mul.0.forward.output.0");
    assert_eq!(mul[1..3], ["unwritten", "pass"], "{rows:?}");
    // Their gradients are computed from the leftovers too.
    for t in [
        "Tensor.mul.0.backward.input.0",
        "Tensor.add.0.backward.output.0",
    ] {
        let g = row(t);
        assert_eq!(g[1..3], ["unwritten", "pass"], "{rows:?}");
        assert!(g[3].starts_with("gradient through Tensor."), "{g:?}");
    }
    assert!(
        mul[3].starts_with(
            "computed from leftover bytes both runs read, through Tensor.mul.0.forward.input.0"
        ),
        "{mul:?}"
    );
    // The chain ends where the outputs agree: with equal results nothing is downgraded.
    let (_e, o, _, rows) = compare_chains(1.0, 1.0, false);
    assert_eq!(o.code, 0);
    assert!(
        rows.iter()
            .filter(|r| r[0].ends_with("output.0"))
            .all(|r| r[1] == "statistics" && r[2] == "pass" && r[3].is_empty()),
        "{rows:?}"
    );
}

#[test]
fn a_target_the_op_only_writes_is_not_what_it_computed_from() {
    // copy_ overwrites its leftover-holding target: a different result is its own.
    let (_d, o, s, rows) = compare_chains(1.0, 7.0, true);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let f = &s["first_divergent"]["forward"];
    assert_eq!(f["op"], "Tensor.copy_.0.forward", "{s}");
    assert!(f.get("leftover").is_none(), "{f}");
    assert!(!s["headline"].as_str().unwrap().contains("leftover"), "{s}");
    let target = rows
        .iter()
        .find(|r| r[0] == "Tensor.copy_.0.forward.input.0")
        .unwrap();
    assert_eq!(target[1..3], ["unwritten", "pass"], "{rows:?}");
    assert!(target[3].starts_with("the op only writes it"), "{target:?}");
}

/// The statistics of four +Inf values, as the agent records them.
fn all_inf() -> probe::schema::dump::StatsRecord {
    probe::schema::dump::StatsRecord {
        max: Stat(Some(f64::INFINITY)),
        min: Stat(Some(f64::INFINITY)),
        mean: Stat(Some(f64::INFINITY)),
        norm: Stat(Some(f64::INFINITY)),
        nan: Some(0),
        inf: Some(4),
    }
}

#[test]
fn scan_traces_nan_computed_from_leftover_bytes_to_them() {
    // `add` reads leftover bytes into a finite but huge value; `mul` squares it past
    // float32: the NaN/Inf producer is `mul`, computed from the leftovers `add` read.
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("run");
    let mut a = op(
        "Tensor.add.0.forward",
        &[
            ("input.0", "input", vec![0.0; 4]),
            ("input.1", "input", vec![1.0; 4]),
            ("output.0", "output", vec![3e20; 4]),
        ],
        &[0],
    );
    a.tensors[2].id = Some(1);
    let mut m = op(
        "Tensor.mul.0.forward",
        &[
            ("input.0", "input", vec![3e20; 4]),
            ("output.0", "output", vec![f32::INFINITY; 4]),
        ],
        &[],
    );
    m.tensors[0].src = Some(1);
    m.tensors[1].id = Some(2);
    m.tensors[1].stats = Some(all_inf());
    write_op_log(&dump, vec![a, m]);
    let out = d.path().join("scan");
    let o = scan(&dump, &out, &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = scan_summary(&out);
    let f = &s["leftover_nonfinite"];
    assert_eq!(f["op"], "Tensor.mul.0.forward", "{s}");
    assert_eq!(f["leftover"], "Tensor.add.0.forward.input.0", "{f}");
    assert!(
        f["explanation"].as_str().unwrap().starts_with(
            "output Tensor.mul.0.forward.output.0 holds NaN/Inf computed from leftover bytes: \
             Tensor.add.0.forward.input.0 read memory nothing had written"
        ),
        "{f}"
    );
    assert!(
        s["headline"].as_str().unwrap().contains(
            "first by Tensor.mul.0.forward from leftover bytes in Tensor.add.0.forward.input.0"
        ),
        "{s}"
    );
    // NaN that does not come from them is still an error, named as before.
    let mut text = std::fs::read_to_string(dump.join("step0/rank0/ops.jsonl")).unwrap();
    text = text.replace("\"src\":1", "\"src\":9");
    std::fs::write(dump.join("step0/rank0/ops.jsonl"), text).unwrap();
    let o = scan(&dump, &d.path().join("again"), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with("NaN/Inf: first produced by Tensor.mul.0.forward from finite inputs"),
        "{}",
        o.stdout
    );
}

/// `gelu` of `x` into `y` (`y` on this side), then `__setitem__` writing `y` by an index
/// into a buffer of leftover bytes (`buf[idx] = y`, as an MoE layer gathers its experts'
/// outputs), then `mul` of the buffer.
fn gather(dir: &Path, y: f32) -> Vec<OpRecord> {
    let x = vec![0.5f32; 4];
    let ys = vec![y; 4];
    let twice: Vec<f32> = ys.iter().map(|v| v * 2.0).collect();
    let mut g = op(
        "Functional.gelu.0.forward",
        &[("input.0", "input", x), ("output.0", "output", ys.clone())],
        &[],
    );
    g.tensors[1].id = Some(1);
    let mut s = op(
        "Tensor.__setitem__.0.forward",
        &[
            ("input.0", "input", vec![0.0; 4]),
            ("input.1", "input", vec![3.0, 2.0, 1.0, 0.0]),
            ("input.2", "input", ys.clone()),
            ("output.0", "output", ys.clone()),
        ],
        &[0],
    );
    s.tensors[2].src = Some(1);
    s.tensors[3].id = Some(2);
    let mut m = op(
        "Tensor.mul.0.forward",
        &[("input.0", "input", ys), ("output.0", "output", twice)],
        &[],
    );
    m.tensors[0].src = Some(2);
    let mut records = vec![g, s, m];
    if y.is_infinite() {
        for (op, slot) in [(0, 1), (1, 2), (1, 3), (2, 0), (2, 1)] {
            records[op].tensors[slot].stats = Some(all_inf());
        }
    }
    write_op_log(dir, records.clone());
    records
}

#[test]
fn a_divergence_written_into_leftover_bytes_stays_a_divergence() {
    // The values `__setitem__` writes differ on their own: its output differs because of
    // them, not because of the buffer's leftovers, and what follows is compared.
    let d = tempfile::tempdir().unwrap();
    gather(&d.path().join("bench"), 1.0);
    gather(&d.path().join("cmp"), 1.5);
    let o = compare(d.path(), &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = summary(d.path());
    assert_eq!(
        s["first_divergent"]["forward"]["op"], "Functional.gelu.0.forward",
        "{s}"
    );
    let headline = s["headline"].as_str().unwrap();
    assert!(!headline.contains("leftover"), "{headline}");
    assert_eq!(s["counts"]["compared_by"]["unwritten"], 1, "{s}");
    let rows = parquet_rows(&d.path().join("out").join("compare.parquet"));
    let row = |t: &str| rows.iter().find(|r| r[0] == t).cloned().unwrap_or_default();
    for t in [
        "Tensor.__setitem__.0.forward.output.0",
        "Tensor.mul.0.forward.output.0",
    ] {
        let r = row(t);
        assert_eq!(r[1..3], ["statistics", "error"], "{rows:?}");
        assert!(!r[3].contains("leftover"), "{r:?}");
    }
}

#[test]
fn scan_names_nan_written_into_leftover_bytes_where_it_was_made() {
    // gelu makes the Inf, `__setitem__` writes it into a buffer of leftover bytes: what
    // the buffer holds then is gelu's Inf, not something computed from the leftovers.
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("run");
    gather(&dump, f32::INFINITY);
    let out = d.path().join("scan");
    let o = scan(&dump, &out, &[]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let s = scan_summary(&out);
    assert!(s["leftover_nonfinite"].is_null(), "{s}");
    assert_eq!(s["counts"]["nonfinite_from_leftover"], 0, "{s}");
    let first = &s["first_nonfinite"]["forward"];
    assert_eq!(first["op"], "Functional.gelu.0.forward", "{s}");
}
