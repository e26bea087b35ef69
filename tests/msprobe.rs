//! msprobe interoperability: probe reads msprobe's dumps as they are and gives msprobe's
//! numbers.
//!
//! The fixtures under testdata/msprobe/ are real msprobe outputs (see its README.md): the
//! metrics are checked against msprobe's own compare workbooks, cell by cell.

use crate::common;

use calamine::{open_workbook, Data as Cell, Reader, Xlsx};
use common::dumps::probe_to_msprobe;
use probe::compare::{self, CompareKind, Options, Row};
use probe::dtype::{AnyDType, DType};
use probe::tensor::{npy, pt, Data, TensorData};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn td(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/msprobe")
        .join(p)
}

fn run(b: &str, c: &str) -> compare::CompareRun {
    compare::run(
        &td(b),
        &td(c),
        &Options::default(),
        &probe::progress::Progress::hidden(),
    )
    .expect("compare runs")
}

/// One sheet of an msprobe workbook: rows as header → cell text.
fn workbook(name: &str) -> Vec<HashMap<String, String>> {
    let mut wb: Xlsx<_> = open_workbook(td("compare").join(name)).expect("workbook");
    let sheet = wb.sheet_names()[0].clone();
    let range = wb.worksheet_range(&sheet).expect("sheet");
    let mut rows = range.rows();
    let header: Vec<String> = rows.next().unwrap().iter().map(|c| c.to_string()).collect();
    rows.map(|r| {
        header
            .iter()
            .cloned()
            .zip(r.iter().map(|c| match c {
                Cell::Float(f) => format!("{f:?}"),
                Cell::Int(i) => i.to_string(),
                Cell::Bool(b) => b.to_string(),
                Cell::Empty => String::new(),
                other => other.to_string(),
            }))
            .collect()
    })
    .collect()
}

/// A numeric cell (`"0.5"`, `"12.5%"`); `None` for "unsupported", "N/A", "None", ...
fn num(s: &str) -> Option<f64> {
    let t = s.trim().trim_end_matches('%');
    match t.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => t.parse().ok(),
    }
}

/// Equal to 1e-6 relative, allowing for msprobe's rounding of the cell to `decimals`.
fn close(probe: f64, ms: f64, decimals: i32) -> bool {
    if ms.is_nan() || probe.is_nan() {
        return ms.is_nan() && probe.is_nan();
    }
    if ms.is_infinite() || probe.is_infinite() {
        return ms == probe;
    }
    let rounding = 0.5 * 10f64.powi(-decimals);
    (probe - ms).abs() <= 1e-6 * ms.abs() + rounding
}

fn rows_by_name(res: &compare::CompareRun) -> HashMap<String, Row> {
    let mut out = HashMap::new();
    res.tables
        .visit_rows(|i, rows| {
            for r in rows {
                out.insert(
                    format!("{}/{}", res.units[i].step, r.tensor.name),
                    r.clone(),
                );
            }
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn tensor_metrics_match_msprobe_workbook() {
    let res = run("tensor_bench", "tensor_bf16");
    assert_eq!(res.units.len(), 1);
    let unmatched = res.tables.unmatched(0).unwrap();
    assert!(unmatched.is_empty(), "{:?}", unmatched.first());
    let rows = rows_by_name(&res);
    let ws = workbook("tensor_step0.xlsx");
    let (mut checked, mut cells) = (0, 0);
    for w in &ws {
        let name = &w["NPU Name"];
        if !w["NPU Dtype"].starts_with("torch.") {
            // Non-tensor arguments (ints, floats, None): msprobe lists them, probe skips them.
            assert!(!rows.contains_key(&format!("step0/{name}")), "{name}");
            continue;
        }
        let r = rows
            .get(&format!("step0/{name}"))
            .unwrap_or_else(|| panic!("probe has no row for {name}"));
        assert_eq!(r.tensor.kind, CompareKind::Tensor, "{name}");
        let m = r
            .tensor
            .metrics
            .as_deref()
            .unwrap_or_else(|| panic!("{name}: no metrics"));
        let checks: [(&str, Option<f64>, i32); 6] = [
            ("Cosine", m.cosine, 6),
            ("EucDist", Some(m.euclid), 16),
            ("MaxAbsErr", Some(m.max_abs), 12),
            ("MaxRelativeErr", Some(m.max_rel), 12),
            ("One Thousandth Err Ratio", Some(m.one_thousandth), 12),
            ("Five Thousandths Err Ratio", Some(m.five_thousandths), 12),
        ];
        for (col, p, dec) in checks {
            let cell = &w[col];
            match num(cell) {
                None => {
                    assert_eq!(cell, "unsupported", "{name} {col}");
                    if col == "Cosine" {
                        assert!(p.is_none(), "{name}: msprobe has no cosine, probe {p:?}");
                    }
                }
                Some(ms) => {
                    let p = p.unwrap_or_else(|| panic!("{name} {col}: probe has none"));
                    assert!(close(p, ms, dec), "{name} {col}: probe {p}, msprobe {ms}");
                    cells += 1;
                }
            }
        }
        // The statistics columns are the dump's own.
        let sc = r.tensor.sides.cmp.stats.unwrap();
        if let (Some(ms), Some(p)) = (num(&w["NPU max"]), sc.max()) {
            assert!(close(p, ms, 15), "{name} NPU max");
        }
        checked += 1;
    }
    assert_eq!(checked, 654, "every tensor of the workbook is checked");
    assert!(cells > 3000, "{cells} metric cells compared");
    // Tensors msprobe leaves out of its workbook: none.
    assert_eq!(rows.len(), checked);
}

#[test]
fn statistics_diffs_match_msprobe_workbooks() {
    let res = run("stats_bench", "stats_bf16");
    assert_eq!(
        res.units.len(),
        3,
        "three steps, proc folders paired by position"
    );
    for (i, p) in res.units.iter().enumerate() {
        assert_eq!(p.step, format!("step{i}"));
        assert!(p.dirs.bench.ends_with("proc24241") && p.dirs.cmp.ends_with("proc24524"));
    }
    let rows = rows_by_name(&res);
    let mut checked = 0;
    for step in 0..3 {
        for w in workbook(&format!("stats_step{step}.xlsx")) {
            let name = &w["NPU Name"];
            if !w["NPU Dtype"].starts_with("torch.") {
                continue;
            }
            let r = rows
                .get(&format!("step{step}/{name}"))
                .unwrap_or_else(|| panic!("step{step}: probe has no row for {name}"));
            assert_eq!(r.tensor.kind, CompareKind::Statistics);
            let d = r
                .tensor
                .stat_diff()
                .unwrap_or_else(|| panic!("{name}: no statistics diff"));
            for (col, p) in [
                ("Max diff", d.max_diff),
                ("Min diff", d.min_diff),
                ("Mean diff", d.mean_diff),
                ("L2norm diff", d.norm_diff),
                ("MaxRelativeErr", d.max_rel_pct),
                ("MinRelativeErr", d.min_rel_pct),
                ("MeanRelativeErr", d.mean_rel_pct),
                ("NormRelativeErr", d.norm_rel_pct),
            ] {
                match (num(&w[col]), p) {
                    (Some(ms), Some(p)) => {
                        assert!(
                            close(p, ms, 14),
                            "step{step} {name} {col}: probe {p}, msprobe {ms}"
                        )
                    }
                    (None, _) => {}
                    // msprobe writes 0 where both statistics are missing (integer tensors'
                    // mean and norm); probe leaves the difference empty.
                    (Some(ms), None) => {
                        let pick = |st: Option<probe::dump::Stats>| {
                            st.and_then(|st| match &col[..2] {
                                "Ma" => st.max(),
                                "Mi" => st.min(),
                                "Me" => st.mean(),
                                _ => st.norm(),
                            })
                        };
                        assert!(
                            ms == 0.0
                                && (pick(r.tensor.sides.bench.stats).is_none()
                                    || pick(r.tensor.sides.cmp.stats).is_none()),
                            "step{step} {name} {col}: msprobe {ms}, probe none"
                        )
                    }
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 1900, "{checked} rows checked");
}

#[test]
fn op_records_follow_msprobe_naming_and_order() {
    let set = probe::dump::discover(&td("tensor_bench")).unwrap();
    assert_eq!(set.ranks.len(), 1);
    assert_eq!(set.ranks[0].rank, "proc23596");
    let d = probe::dump::load_rank(&set.ranks[0]).unwrap();
    assert_eq!(d.ops.len(), 243);
    assert!(!d.has_dataflow);
    let stacks = d.stacks;
    let d: Vec<probe::dump::OpRec> = d.ops.iter().map(|o| o.to_rec()).collect();
    let d = Records { ops: d };
    assert_eq!(d.ops[0].key.as_str(), "Functional.conv2d.0.forward");
    assert_eq!(d.ops[1].key.as_str(), "Tensor.add_.0.forward");
    assert!(d.ops.windows(2).all(|w| w[0].seq < w[1].seq));
    let names: Vec<&str> = d.ops[0].tensors.iter().map(|t| &*t.name).collect();
    assert_eq!(
        names,
        [
            "Functional.conv2d.0.forward.input.0",
            "Functional.conv2d.0.forward.input.1",
            "Functional.conv2d.0.forward.input.2",
            "Functional.conv2d.0.forward.output.0"
        ]
    );
    assert!(d.ops[0].stack.is_some());
    assert!(!stacks[&d.ops[0].stack.unwrap()].is_empty());
    let bwd = d
        .ops
        .iter()
        .find(|o| o.key.as_str().ends_with(".backward"))
        .unwrap();
    assert_eq!(bwd.direction, probe::dump::Direction::Backward);
    assert!(bwd
        .tensors
        .iter()
        .any(|t| t.name.contains(".backward.input.0")));
    let t = &d.ops[0].tensors[0];
    assert!(
        matches!(t.data.as_deref(), Some(Data::Pt(p)) if p.ends_with("dump_tensor_data/Functional.conv2d.0.forward.input.0.pt"))
    );
    assert_eq!(t.dtype, AnyDType::Known(DType::F32));
    assert_eq!(t.shape, vec![2, 3, 8, 8]);
    // Statistics mode: no tensor files.
    let set = probe::dump::discover(&td("stats_bench/step1")).unwrap();
    let d = probe::dump::load_rank(&set.ranks[0]).unwrap();
    assert_eq!(set.ranks[0].step, "step1");
    let first = d.ops.get(0);
    assert!(first.tensors().all(|t| t.data().is_none()));
    assert!(first.tensor(0).stats().is_some());
}

/// Op records as owned values, to read their fields.
struct Records {
    ops: Vec<probe::dump::OpRec>,
}

// ---------------------------------------------------------------- the .pt / .npy reader

fn read_values(t: &TensorData) -> Vec<f64> {
    let mut out = vec![0.0; t.numel];
    t.with_window(0, t.numel, |b| t.dtype.decode(b, &mut out))
        .unwrap();
    out
}

#[test]
fn pt_and_npy_files_read_as_torch_wrote_them() {
    let dir = td("pt");
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let exp: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exp = exp.as_object().unwrap();
    assert!(exp.len() >= 18);
    for (file, e) in exp {
        let path = dir.join(file);
        let got = if file.ends_with(".npy") {
            npy::read(&path).map(|t| (t.dtype, t.shape, t.numel, t.offset))
        } else {
            pt::read(&path, None).map(|t| (t.dtype, t.shape, t.numel, t.offset))
        };
        if let Some(needle) = e.get("error").and_then(|v| v.as_str()) {
            let err = got.expect_err(file).to_string();
            assert!(err.contains(needle), "{file}: {err}");
            assert!(
                err.contains(file.as_str()),
                "{file}: error names the file: {err}"
            );
            continue;
        }
        let (dtype, shape, numel, offset) = got.unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(dtype.name(), e["dtype"].as_str().unwrap(), "{file}");
        let want_shape: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(shape, want_shape, "{file}");
        let want: Vec<f64> = e["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let t = TensorData::in_file(&path, offset, numel, dtype).unwrap();
        let got = read_values(&t);
        assert_eq!(got.len(), want.len(), "{file}");
        for (g, w) in got.iter().zip(&want) {
            // expected.json goes through serde_json's float parser, exact to 1 ulp.
            assert!((g - w).abs() <= 1e-15 * w.abs(), "{file}: {g} vs {w}");
        }
    }
}

#[test]
fn real_msprobe_pt_files_match_their_recorded_statistics() {
    for (side, dtype) in [
        ("tensor_bench/step0/proc23596", DType::F32),
        ("tensor_bf16/step0/proc23717", DType::BF16),
    ] {
        let f = td(side).join("dump_tensor_data/Functional.conv2d.0.forward.output.0.pt");
        let t = pt::read(&f, None).unwrap();
        assert_eq!(
            (t.dtype, t.shape.clone(), t.numel),
            (dtype, vec![2, 4, 8, 8], 512)
        );
        assert_eq!(t.offset % 64, 0, "torch aligns storages to 64 bytes");
        let v = read_values(&TensorData::in_file(&f, t.offset, t.numel, t.dtype).unwrap());
        let max = v.iter().cloned().fold(f64::MIN, f64::max);
        let want = if dtype == DType::F32 {
            1.3398535251617432
        } else {
            1.3359375
        };
        assert_eq!(max, want);
    }
}

/// A tiny deterministic generator (no extra dependency).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn malformed_pt_files_are_errors_never_panics() {
    let t = tempfile::tempdir().unwrap();
    let sources = [
        td("pt/rand_float32.pt"),
        td("pt/parameter.pt"),
        td("pt/offset_view.pt"),
        td("tensor_bf16/step0/proc23717/dump_tensor_data/Functional.conv2d.0.forward.output.0.pt"),
    ];
    let mut rng = Lcg(42);
    let mut n_err = 0;
    for (si, src) in sources.iter().enumerate() {
        let orig = std::fs::read(src).unwrap();
        let mut cases: Vec<Vec<u8>> = Vec::new();
        // Every truncation at a 7-byte stride, and all the short ones.
        for n in (0..orig.len()).step_by(7).chain(0..64) {
            cases.push(orig[..n].to_vec());
        }
        // Bit flips and byte overwrites anywhere, one to three at a time.
        for _ in 0..600 {
            let mut b = orig.clone();
            for _ in 0..=(rng.next() % 3) {
                let i = (rng.next() as usize) % b.len();
                if rng.next().is_multiple_of(2) {
                    b[i] ^= 1 << (rng.next() % 8);
                } else {
                    b[i] = rng.next() as u8;
                }
            }
            cases.push(b);
        }
        for (ci, bytes) in cases.iter().enumerate() {
            let p = t.path().join(format!("case{si}_{ci}.pt"));
            std::fs::write(&p, bytes).unwrap();
            let len = bytes.len() as u64;
            // Must never panic; when it reads, what it returns must lie inside the file.
            match std::panic::catch_unwind(|| pt::read(&p, Some(DType::F32))) {
                Err(_) => panic!("pt::read panicked on case {si}/{ci}"),
                Ok(Err(e)) => {
                    n_err += 1;
                    assert!(e.to_string().contains(&format!("case{si}_{ci}.pt")), "{e}");
                }
                Ok(Ok(r)) => {
                    let end = r.offset + (r.numel * r.dtype.size()) as u64;
                    assert!(end <= len, "case {si}/{ci}: data runs past the file");
                    let td = TensorData::in_file(&p, r.offset, r.numel, r.dtype).unwrap();
                    let _ = read_values(&td);
                }
            }
            std::fs::remove_file(&p).unwrap();
        }
    }
    assert!(n_err > 500, "most mutations are caught: {n_err}");
}

#[test]
fn pickle_interpreter_survives_random_and_spliced_input() {
    let good = {
        let f = std::fs::File::open(td("pt/rand_float32.pt")).unwrap();
        let mut z = zip::ZipArchive::new(f).unwrap();
        let name = z
            .file_names()
            .filter_map(|n| n.ok())
            .find(|n| n.ends_with("data.pkl"))
            .unwrap()
            .into_owned();
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut z.by_name(&name).unwrap(), &mut buf).unwrap();
        buf
    };
    assert!(pt::parse_pickle(&good).is_ok());
    let mut rng = Lcg(7);
    for _ in 0..20_000 {
        let mut b = good.clone();
        match rng.next() % 4 {
            0 => b.truncate((rng.next() as usize) % good.len()),
            1 => {
                let i = (rng.next() as usize) % b.len();
                b[i] = rng.next() as u8;
            }
            2 => {
                // Splice a random slice of itself somewhere (repeats opcodes, memo reads).
                let a = (rng.next() as usize) % b.len();
                let l = (rng.next() as usize) % (b.len() - a);
                let at = (rng.next() as usize) % b.len();
                let piece = b[a..a + l].to_vec();
                b.splice(at..at, piece);
            }
            _ => {
                b = (0..(rng.next() % 256)).map(|_| rng.next() as u8).collect();
            }
        }
        let _ = pt::parse_pickle(&b);
    }
}

// ---------------------------------------------------------------- the CLI end to end

fn probe_cli(args: &[&str]) -> (i32, String, String) {
    let o = common::probe(args);
    (o.code, o.stdout, o.stderr)
}

fn cli_compare(b: &Path, c: &Path, out: &Path) -> (i32, serde_json::Value, String) {
    let (code, stdout, stderr) = probe_cli(&[
        "compare",
        "-b",
        b.to_str().unwrap(),
        "-c",
        c.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let text = std::fs::read_to_string(out.join("summary.json"))
        .unwrap_or_else(|_| panic!("no summary.json; exit {code}: {stderr}"));
    (code, serde_json::from_str(&text).unwrap(), stdout)
}

#[test]
fn cli_compares_msprobe_tensor_dumps() {
    let t = tempfile::tempdir().unwrap();
    let (code, s, stdout) = cli_compare(
        &td("tensor_bench"),
        &td("tensor_bf16"),
        &t.path().join("out"),
    );
    // bf16 autocast against float32: probe's tolerances fail it, and says where.
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(s["verdict"], "error");
    let c = &s["counts"];
    assert_eq!(c["pairs"], 1);
    assert_eq!(c["ops"], 243);
    assert_eq!(c["tensors"], 654);
    assert_eq!(c["compared_by"]["tensor"], 654);
    assert_eq!(c["unmatched_bench"], 0);
    assert_eq!(c["unmatched_cmp"], 0);
    let named = ["first_divergent", "earliest_failing", "external_source"]
        .iter()
        .flat_map(|k| ["forward", "backward"].map(|d| s[k][d]["op"].as_str().map(String::from)))
        .flatten()
        .count();
    assert!(named > 0, "an op is named: {s}");
    // The failing tensor is the conv bias gradient before a BatchNorm: mathematically zero,
    // ~1e-8 in float32 and ~1e-4 in bf16 from the same incoming gradient. Rounding noise of
    // its inputs names no culprit: the backward is drift, its earliest failing op named.
    assert!(s["first_divergent"]["backward"].is_null(), "{s}");
    assert_eq!(
        s["earliest_failing"]["backward"]["tensor"],
        "Functional.conv2d.0.backward.output.2"
    );
    assert_eq!(s["pairs"][0]["findings"]["drift"][0], "backward");
}

#[test]
fn cli_identical_msprobe_dumps_pass_with_exit_0() {
    let t = tempfile::tempdir().unwrap();
    let d = td("tensor_bench");
    let (code, s, stdout) = cli_compare(&d, &d, &t.path().join("out"));
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(s["verdict"], "pass");
    assert_eq!(s["counts"]["error"], 0);
    assert_eq!(s["counts"]["pass"], 654);
    let (code, s, _) = cli_compare(
        &td("stats_bench"),
        &td("stats_bench"),
        &t.path().join("out2"),
    );
    assert_eq!(code, 0);
    assert_eq!(s["counts"]["pairs"], 3);
    assert_eq!(
        s["counts"]["compared_by"]["statistics"],
        s["counts"]["tensors"]
    );
}

#[test]
fn cli_multi_step_proc_and_rank_folders_pair() {
    let t = tempfile::tempdir().unwrap();
    let (code, s, _) = cli_compare(&td("stats_bench"), &td("stats_bf16"), &t.path().join("o1"));
    assert_eq!(code, 1);
    assert_eq!(s["counts"]["pairs"], 3);
    let steps: Vec<&str> = s["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["step0", "step1", "step2"]);
    // rank0 (gloo group run) against a proc folder: paired within the step by position;
    // the collective exists on the benchmark side only.
    let (_, s, _) = cli_compare(
        &td("dist_bench"),
        &td("stats_bench/step0"),
        &t.path().join("o2"),
    );
    assert_eq!(s["counts"]["pairs"], 1);
    assert!(s["counts"]["unmatched_bench"].as_u64().unwrap() > 0);
    assert_eq!(s["counts"]["unmatched_cmp"], 0);
}

#[test]
fn cli_probe_dump_against_msprobe_dump() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    common::synth(d, common::DEMO_SYNTH_ARGS);
    probe_to_msprobe(&d.join("cmp"), &d.join("cmp_msprobe"));
    let (code_a, a, _) = cli_compare(&d.join("bench"), &d.join("cmp"), &d.join("out_a"));
    let (code_b, b, out) = cli_compare(&d.join("bench"), &d.join("cmp_msprobe"), &d.join("out_b"));
    assert_eq!(code_b, code_a, "{out}");
    assert_eq!(code_b, 1);
    assert_eq!(
        b["first_divergent"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
    assert_eq!(
        b["first_divergent"]["forward"]["op"],
        a["first_divergent"]["forward"]["op"]
    );
    assert_eq!(b["counts"]["tensors"], a["counts"]["tensors"]);
    assert_eq!(b["counts"]["error"], a["counts"]["error"]);
    assert_eq!(b["counts"]["unmatched_bench"], 0);
    assert_eq!(b["counts"]["unmatched_cmp"], 0);
    // And the other way round: msprobe benchmark, probe comparison.
    probe_to_msprobe(&d.join("bench"), &d.join("bench_msprobe"));
    let (code_c, c, _) = cli_compare(&d.join("bench_msprobe"), &d.join("cmp"), &d.join("out_c"));
    assert_eq!(code_c, 1);
    assert_eq!(
        c["first_divergent"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
}

#[test]
fn cli_bad_msprobe_inputs_are_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    // A dump.json that is not JSON.
    let bad = t.path().join("bad/step0/rank0");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("dump.json"), b"{\"task\": \"tensor\", \"data\": {").unwrap();
    let (code, _, err) = probe_cli(&[
        "compare",
        "-b",
        t.path().join("bad").to_str().unwrap(),
        "-c",
        td("tensor_bench").to_str().unwrap(),
        "-o",
        t.path().join("o").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("dump.json") && !err.contains("panicked"),
        "{err}"
    );
    // A corrupt .pt file: the error names it.
    let side = t.path().join("side");
    common::copy_dir(&td("tensor_bench"), &side);
    let f = side.join("step0/proc23596/dump_tensor_data/Functional.conv2d.0.forward.output.0.pt");
    let mut b = std::fs::read(&f).unwrap();
    b.truncate(b.len() / 2);
    std::fs::write(&f, b).unwrap();
    let (code, _, err) = probe_cli(&[
        "compare",
        "-b",
        td("tensor_bench").to_str().unwrap(),
        "-c",
        side.to_str().unwrap(),
        "-o",
        t.path().join("o2").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("Functional.conv2d.0.forward.output.0.pt"),
        "{err}"
    );
}
