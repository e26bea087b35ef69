//! `probe compare --shard i/N` + `probe merge`: a compare split over processes and combined
//! without re-reading tensors equals the unsharded compare (summary.json byte for byte apart
//! from the output paths; the same rows); merge refuses shards that do not make one run.

use crate::common;
use common::*;
use std::path::Path;

/// summary.json with the output folder's name replaced, so two runs written to different
/// folders compare byte for byte.
fn summary_text(cwd: &Path, out: &str) -> String {
    std::fs::read_to_string(cwd.join(out).join("summary.json"))
        .expect("summary.json")
        .replace(&format!("\"{out}/"), "\"OUT/")
}

/// Asserts two summaries are equal without printing two whole documents when they differ.
fn same_summary(cwd: &Path, a: &str, b: &str) {
    let (x, y) = (summary_text(cwd, a), summary_text(cwd, b));
    if x != y {
        let line = x.lines().zip(y.lines()).position(|(p, q)| p != q);
        panic!("{a}/summary.json differs from {b}/summary.json at line {line:?}");
    }
}

fn parquet_rows(path: &Path) -> i64 {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let f = std::fs::File::open(path).unwrap();
    SerializedFileReader::new(f)
        .unwrap()
        .metadata()
        .file_metadata()
        .num_rows()
}

/// A parquet table's rows, every cell as text (null as `-`), in file order.
fn parquet_cells(path: &Path) -> Vec<Vec<String>> {
    use arrow_array::{Array, BooleanArray, Float64Array, StringArray, UInt64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let mut rows = Vec::new();
    for batch in b.build().unwrap() {
        let batch = batch.unwrap();
        for i in 0..batch.num_rows() {
            let cell = |c: &dyn Array| -> String {
                if c.is_null(i) {
                    return "-".into();
                }
                let any = c.as_any();
                if let Some(a) = any.downcast_ref::<StringArray>() {
                    a.value(i).to_string()
                } else if let Some(a) = any.downcast_ref::<UInt64Array>() {
                    a.value(i).to_string()
                } else if let Some(a) = any.downcast_ref::<Float64Array>() {
                    format!("{:?}", a.value(i).to_bits())
                } else if let Some(a) = any.downcast_ref::<BooleanArray>() {
                    a.value(i).to_string()
                } else {
                    panic!("unexpected column type {:?}", c.data_type())
                }
            };
            rows.push(batch.columns().iter().map(|c| cell(c.as_ref())).collect());
        }
    }
    rows
}

/// The row groups of a compare's table, each as the (step, kind) of its rows, checked to
/// hold one step's rows of one kind (matched, or `unmatched`) and to start where a
/// step/rank pair starts, read from the rows themselves.
fn row_groups(path: &Path) -> Vec<(String, bool)> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let meta = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let sizes: Vec<usize> = meta
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as usize)
        .collect();
    let rows = parquet_cells(path);
    let (step, rank, verdict) = (0, 1, 14);
    let mut out = Vec::new();
    let mut at = 0;
    for n in sizes {
        let group = &rows[at..at + n];
        let kind = |r: &Vec<String>| (r[step].clone(), r[verdict] == "unmatched");
        assert!(
            group.iter().all(|r| kind(r) == kind(&group[0])),
            "{group:?}"
        );
        if at > 0 {
            let (prev, first) = (&rows[at - 1], &group[0]);
            assert!(
                (&prev[step], &prev[rank]) != (&first[step], &first[rank])
                    || kind(prev) != kind(first),
                "a row group starts inside {}/{}",
                first[step],
                first[rank]
            );
        }
        out.push(kind(&group[0]));
        at += n;
    }
    assert_eq!(at, rows.len());
    out
}

/// The unsharded compare of `cwd`'s `bench` and `cmp` into `out`.
fn compare_into(cwd: &Path, out: &str) -> Out {
    probe_in(
        cwd,
        &["compare", "-b", "bench", "-c", "cmp", "-o", out, "-q"],
    )
}

fn shard_and_merge(cwd: &Path, n: u32, extra: &[&str]) -> Out {
    let mut outs = Vec::new();
    for i in 0..n {
        let out = format!("s{i}");
        let part = format!("{i}/{n}");
        let mut a = vec!["compare", "-b", "bench", "-c", "cmp", "-o", &out, "-q"];
        a.extend(["--shard", &part]);
        a.extend_from_slice(extra);
        let o = probe_in(cwd, &a);
        assert_eq!(o.code, 0, "shard {part}: {}", o.stderr);
        outs.push(out);
    }
    let mut a = vec!["merge", "-o", "merged", "-q"];
    a.extend(outs.iter().map(String::as_str));
    probe_in(cwd, &a)
}

#[test]
fn four_shards_merged_equal_the_unsharded_compare() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    // 4 ranks x 2 steps, a fault on rank 2: the cross-rank story needs every rank.
    synth(
        cwd,
        &["--ranks", "4", "--steps", "2", "--blocks", "2"]
            .into_iter()
            .chain(["--perturb-rank", "2", "--perturb-op", "Functional.gelu.1"])
            .collect::<Vec<_>>(),
    );
    let full = compare_into(cwd, "full");
    assert_eq!(full.code, 1, "{}", full.stderr);
    let merged = shard_and_merge(cwd, 4, &[]);
    assert_eq!(merged.code, full.code, "{}", merged.stderr);
    same_summary(cwd, "merged", "full");
    let s: serde_json::Value = serde_json::from_str(&summary_text(cwd, "merged")).unwrap();
    assert!(s["headline"]
        .as_str()
        .unwrap()
        .contains("rank 2 diverged first"));
    // The shards' parquet tables hold the whole run's rows between them.
    let shard_rows: i64 = (0..4)
        .map(|i| parquet_rows(&cwd.join(format!("s{i}/compare.parquet"))))
        .sum();
    assert_eq!(shard_rows, parquet_rows(&cwd.join("full/compare.parquet")));
    assert_eq!(
        parquet_rows(&cwd.join("merged/compare.parquet")),
        parquet_rows(&cwd.join("full/compare.parquet"))
    );
    // The merged table is the shards' row groups copied in order (one step of one rank
    // each: the shards hold one rank), the unsharded table's rows; the unsharded table has
    // one row group per step (every tensor matched; 4 small pairs share one).
    let (full_table, merged_table) = (
        cwd.join("full/compare.parquet"),
        cwd.join("merged/compare.parquet"),
    );
    assert!(
        parquet_cells(&merged_table) == parquet_cells(&full_table),
        "the merged rows differ"
    );
    let step = |s: &str| (s.to_string(), false);
    assert_eq!(row_groups(&full_table), vec![step("step0"), step("step1")]);
    assert_eq!(row_groups(&merged_table).len(), 8);
    // More shards than ranks: the extra shards are empty, the merge is the same.
    let more = shard_and_merge(cwd, 6, &[]);
    assert_eq!(more.code, full.code, "{}", more.stderr);
    same_summary(cwd, "merged", "full");
}

/// The cells of a workbook's sheet, as text.
fn sheet_cells(path: &Path, sheet: &str) -> Vec<Vec<String>> {
    use calamine::{open_workbook, Reader, Xlsx};
    let mut wb: Xlsx<_> = open_workbook(path).unwrap();
    let range = wb.worksheet_range(sheet).unwrap();
    range
        .rows()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect()
}

/// No temporary rows file is left in an output folder.
fn no_parked_rows_left(dir: &Path) {
    let left = leftovers(dir);
    assert!(left.is_empty(), "{left:?} left in {}", dir.display());
}

#[test]
fn rows_parked_in_a_file_give_the_same_reports_as_rows_in_memory() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(
        cwd,
        &["--ranks", "3", "--steps", "2", "--blocks", "2"]
            .into_iter()
            .chain(["--perturb-rank", "1", "--perturb-op", "Functional.gelu.1"])
            .collect::<Vec<_>>(),
    );
    let run = |out: &str, extra: &[&str]| {
        let mut a = vec!["compare", "-b", "bench", "-c", "cmp", "-o", out, "-q"];
        a.extend_from_slice(extra);
        let o = probe_in(cwd, &a);
        assert_eq!(o.code, 1, "{out}: {}", o.stderr);
        no_parked_rows_left(&cwd.join(out));
    };
    run("memory", &[]);
    // 0 MB: every pair's rows go to the file and are read back unit by unit by each report.
    run("parked", &["--row-memory", "0"]);
    same_summary(cwd, "parked", "memory");
    for file in ["compare.parquet", "compare.html"] {
        let (a, b) = (
            std::fs::read(cwd.join("memory").join(file)).unwrap(),
            std::fs::read(cwd.join("parked").join(file)).unwrap(),
        );
        assert!(a == b, "{file} differs");
    }
    for sheet in ["summary", "tensors", "unmatched", "plot"] {
        assert_eq!(
            sheet_cells(&cwd.join("memory/compare.xlsx"), sheet),
            sheet_cells(&cwd.join("parked/compare.xlsx"), sheet),
            "sheet {sheet}"
        );
    }
    // Shards whose rows were parked merge into the same run.
    let merged = shard_and_merge(cwd, 2, &["--row-memory", "0"]);
    assert_eq!(merged.code, 1, "{}", merged.stderr);
    same_summary(cwd, "merged", "memory");
    assert!(
        parquet_cells(&cwd.join("memory/compare.parquet"))
            == parquet_cells(&cwd.join("merged/compare.parquet")),
        "the merged parquet table differs"
    );
    // A merge that reads the shards' rows for each report (nothing held) writes the same.
    let o = probe_in(
        cwd,
        &[
            "merge",
            "s0",
            "s1",
            "-o",
            "merged0",
            "-q",
            "--row-memory",
            "0",
        ],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    same_summary(cwd, "merged0", "memory");
    for file in ["compare.parquet", "compare.html"] {
        let (a, b) = (
            std::fs::read(cwd.join("merged").join(file)).unwrap(),
            std::fs::read(cwd.join("merged0").join(file)).unwrap(),
        );
        assert!(a == b, "merged {file} differs with --row-memory 0");
    }
    for d in ["s0", "s1", "merged", "merged0"] {
        no_parked_rows_left(&cwd.join(d));
    }
}

#[test]
fn merge_encodes_the_table_again_when_a_shards_table_is_unusable() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(
        cwd,
        &["--ranks", "2", "--steps", "2", "--blocks", "2"]
            .into_iter()
            .chain(["--perturb-rank", "1", "--perturb-op", "Functional.gelu.1"])
            .collect::<Vec<_>>(),
    );
    let full = compare_into(cwd, "full");
    assert_eq!(full.code, 1, "{}", full.stderr);
    let merged = shard_and_merge(cwd, 2, &[]);
    assert_eq!(merged.code, 1, "{}", merged.stderr);
    same_summary(cwd, "merged", "full");
    let table = std::fs::read(cwd.join("full/compare.parquet")).unwrap();
    let shard_table = cwd.join("s1/compare.parquet");
    let good = std::fs::read(&shard_table).unwrap();
    // A cut table, another run's table: not the table shard.json names, refused (issue 53
    // item 2: merge never copies bytes it has not checked).
    let other = std::fs::read(cwd.join("s0/compare.parquet")).unwrap();
    for (case, bytes) in [("cut", good[..good.len() / 2].to_vec()), ("foreign", other)] {
        std::fs::remove_file(&shard_table).unwrap();
        std::fs::write(&shard_table, &bytes).unwrap();
        let out = format!("m-{case}");
        let o = probe_in(cwd, &["merge", "s0", "s1", "-o", &out, "-q"]);
        assert_input_error(&o, 2, "compare.parquet");
        assert!(o.stderr.contains("checksum"), "{case}: {}", o.stderr);
        assert!(!cwd.join(&out).join("summary.json").exists(), "{case}");
    }
    // None at all: encoded again from the checked rows.
    std::fs::remove_file(&shard_table).unwrap();
    let o = probe_in(cwd, &["merge", "s0", "s1", "-o", "m-missing", "-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    // The same table, encoded from the shards' rows (as the unsharded compare encodes it:
    // the same bytes), the same summary; stderr says why.
    let again = std::fs::read(cwd.join("m-missing/compare.parquet")).unwrap();
    assert!(again == table, "the parquet table differs");
    same_summary(cwd, "m-missing", "full");
    assert!(o.stderr.contains("encoded again"), "{}", o.stderr);
    std::fs::write(&shard_table, &good).unwrap();
}

/// Each "node" holds its own ranks at the same relative path and compares all it holds
/// (`--shard all`); merges the nodes' shards and checks the merge is the whole run's
/// compare. Returns the merge's stderr.
fn node_local_merge(layout: [[&str; 2]; 2]) -> String {
    let t = tempfile::tempdir().unwrap();
    let whole = t.path().join("whole");
    synth(&whole, &["--ranks", "4", "--noise", "1e-3"]);
    for (node, ranks) in ["node0", "node1"].into_iter().zip(layout) {
        for side in ["bench", "cmp"] {
            let from = whole.join(side);
            let to = t.path().join(node).join(side);
            std::fs::create_dir_all(to.join("step0")).unwrap();
            std::fs::copy(from.join("manifest.json"), to.join("manifest.json")).unwrap();
            for r in ranks {
                copy_dir(&from.join("step0").join(r), &to.join("step0").join(r));
            }
        }
        let o = probe_in(
            &t.path().join(node),
            &[
                "compare", "-b", "bench", "-c", "cmp", "-o", "shard", "--shard", "all", "-q",
            ],
        );
        assert_eq!(o.code, 0, "{node}: {}", o.stderr);
    }
    let full = probe_in(
        &whole,
        &["compare", "-b", "bench", "-c", "cmp", "-o", "full", "-q"],
    );
    let merged = probe_in(
        &whole,
        &[
            "merge",
            "../node1/shard",
            "../node0/shard",
            "-o",
            "merged",
            "-q",
        ],
    );
    assert_eq!(merged.code, full.code, "{}", merged.stderr);
    same_summary(&whole, "merged", "full");
    assert!(
        parquet_cells(&whole.join("merged/compare.parquet"))
            == parquet_cells(&whole.join("full/compare.parquet")),
        "the merged rows differ"
    );
    merged.stderr
}

#[test]
fn node_local_shards_merge_into_the_whole_run() {
    // Nodes of consecutive ranks: the nodes' row groups are copied.
    let stderr = node_local_merge([["rank0", "rank1"], ["rank2", "rank3"]]);
    assert!(!stderr.contains("encoded again"), "{stderr}");
    // Interleaved ranks: a node's row group holds ranks 0 and 2, which the run's table does
    // not keep together, so the rows are encoded again (and stderr says so).
    let stderr = node_local_merge([["rank0", "rank2"], ["rank1", "rank3"]]);
    assert!(
        stderr.contains("encoded again") && stderr.contains("does not keep together"),
        "{stderr}"
    );
}

#[test]
fn merge_refuses_shards_that_do_not_make_one_run() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(cwd, &["--ranks", "4"]);
    let shard = |out: &str, part: &str, extra: &[&str]| {
        let mut a = vec![
            "compare", "-b", "bench", "-c", "cmp", "-o", out, "-q", "--shard", part,
        ];
        a.extend_from_slice(extra);
        let o = probe_in(cwd, &a);
        assert_eq!(o.code, 0, "{}", o.stderr);
    };
    shard("a0", "0/2", &[]);
    shard("a1", "1/2", &[]);
    shard("api1", "1/2", &["-l", "api"]);
    shard("b0", "0/4", &[]);
    shard("all", "all", &[]);
    let merge = |args: &[&str]| {
        let mut a = vec!["merge", "-o", "m", "-q"];
        a.extend_from_slice(args);
        let o = probe_in(cwd, &a);
        assert!(
            !cwd.join("m/summary.json").exists(),
            "wrote a summary: {}",
            o.stderr
        );
        o
    };
    assert_input_error(
        &merge(&["a0", "api1"]),
        2,
        "different runs (level Mix vs Api)",
    );
    assert_input_error(
        &merge(&["a0", "a0"]),
        2,
        "are both shard 0/2 (overlapping shards)",
    );
    assert_input_error(&merge(&["a0"]), 2, "shard 1/2 is missing");
    assert_input_error(&merge(&["a0", "a1", "b0"]), 2, "4-way split");
    assert_input_error(&merge(&["a0", "a1", "all"]), 2, "overlapping shards");
    assert_input_error(&merge(&["bench"]), 2, "no shard.json");
    // A results file cut short (a full disk while copying shards around).
    let results = cwd.join("a1/units.msgpack");
    let bytes = std::fs::read(&results).unwrap();
    std::fs::write(&results, &bytes[..bytes.len() / 2]).unwrap();
    assert_input_error(&merge(&["a0", "a1"]), 2, "does not match the checksum");
    std::fs::write(&results, &bytes).unwrap();
    // The same for the rows file.
    let rows = cwd.join("a1/rows.msgpack");
    let bytes = std::fs::read(&rows).unwrap();
    std::fs::write(&rows, &bytes[..bytes.len() / 2]).unwrap();
    assert_input_error(
        &merge(&["a0", "a1"]),
        2,
        "rows.msgpack does not match the checksum",
    );
    // The good pair still merges.
    std::fs::write(&rows, &bytes).unwrap();
    let ok = probe_in(cwd, &["merge", "a0", "a1", "-o", "m", "-q"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn bad_shard_arguments_are_usage_errors() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    for bad in ["4/4", "1/0", "x", "1"] {
        let o = compare(t.path(), &["-q", "--shard", bad]);
        assert_eq!(o.code, 2, "{bad}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"));
    }
    let o = probe(&["merge", "-o", t.path().join("m").to_str().unwrap()]);
    assert_eq!(o.code, 2, "{}", o.stderr);
}

/// Runs probe in `cwd` under an address-space limit and a time limit (`ulimit -v`,
/// `timeout`): a merge that reads without bound fails the test, not the machine.
fn probe_bounded(cwd: &Path, args: &[&str]) -> Out {
    let mut script = format!(
        "ulimit -v {}; exec timeout 60 {}",
        2 << 20,
        env!("CARGO_BIN_EXE_probe")
    );
    for a in args {
        script += &format!(" '{a}'");
    }
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(cwd)
        .output()
        .unwrap();
    Out::from(o)
}

/// `probe compare --shard PART` of `cwd`'s bench and cmp into `out`.
fn shard_into(cwd: &Path, part: &str, out: &str) {
    let o = probe_in(
        cwd,
        &[
            "compare", "-b", "bench", "-c", "cmp", "-o", out, "-q", "--shard", part,
        ],
    );
    assert_eq!(o.code, 0, "{part}: {}", o.stderr);
}

#[test]
fn merge_refuses_shards_of_runs_with_other_ranks_or_rewritten_dumps() {
    // Issue 53 item 1: shard 0/2 of a 4-rank pair and shard 1/2 of an 8-rank pair, the same
    // relative paths and options, merged to PASS with ranks missing.
    let t = tempfile::tempdir().unwrap();
    let (four, eight) = (t.path().join("four"), t.path().join("eight"));
    synth(&four, &["--ranks", "4"]);
    synth(&eight, &["--ranks", "8"]);
    shard_into(&four, "0/2", "s0");
    shard_into(&eight, "1/2", "s1");
    let o = probe_in(t.path(), &["merge", "four/s0", "eight/s1", "-o", "m", "-q"]);
    assert_input_error(
        &o,
        2,
        "different runs (their plans differ: 4 and 8 step/rank pairs",
    );
    assert!(!t.path().join("m/summary.json").exists());
    // Gap: the same paths, options and ranks, but the dumps rewritten between the shards.
    shard_into(&four, "1/2", "s1");
    synth(&four, &["--ranks", "4", "--seed", "99"]);
    shard_into(&four, "0/2", "s0");
    let o = probe_in(&four, &["merge", "s0", "s1", "-o", "m", "-q"]);
    assert_input_error(&o, 2, "the dumps' files differ");
    // Shards of one run still merge.
    shard_into(&four, "1/2", "s1");
    let o = probe_in(&four, &["merge", "s0", "s1", "-o", "m", "-q"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn merge_refuses_a_shard_table_with_any_byte_changed() {
    // Issue 53 item 2: bytes flipped inside a shard's compare.parquet were copied into the
    // merged table (unreadable, or silently other values).
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(cwd, &["--ranks", "2"]);
    shard_into(cwd, "0/2", "s0");
    shard_into(cwd, "1/2", "s1");
    let table = cwd.join("s1/compare.parquet");
    let good = std::fs::read(&table).unwrap();
    std::fs::remove_file(&table).unwrap();
    // Single bits across the file: the magic, the data pages, the footer.
    let n = 24;
    for k in 0..n {
        let at = k * (good.len() - 1) / (n - 1);
        let mut bad = good.clone();
        bad[at] ^= 1 << (k % 8);
        std::fs::write(&table, &bad).unwrap();
        let o = probe_in(cwd, &["merge", "s0", "s1", "-o", "m", "-q"]);
        assert_input_error(&o, 2, "compare.parquet does not match the checksum");
        assert!(!cwd.join("m/summary.json").exists(), "byte {at}");
    }
    std::fs::write(&table, &good).unwrap();
    let o = probe_in(cwd, &["merge", "s0", "s1", "-o", "m", "-q"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn merge_reads_shard_files_with_a_size_cap() {
    // Issue 53 item 3: a shard file that is (a link to) /dev/zero hung the merge or read
    // until memory ran out.
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(cwd, &["--ranks", "2"]);
    shard_into(cwd, "0/2", "s0");
    shard_into(cwd, "1/2", "s1");
    for name in [
        "rows.msgpack",
        "units.msgpack",
        "shard.json",
        "compare.parquet",
    ] {
        let p = cwd.join("s1").join(name);
        let keep = cwd.join("kept");
        std::fs::rename(&p, &keep).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let o = probe_bounded(cwd, &["merge", "s0", "s1", "-o", "m", "-q"]);
        assert_input_error(&o, 2, "not a regular file");
        assert!(o.stderr.contains(name), "{name}: {}", o.stderr);
        // A regular file far larger than shard.json says (sparse: no disk used).
        std::fs::remove_file(&p).unwrap();
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(300 << 20).unwrap();
        let o = probe_bounded(cwd, &["merge", "s0", "s1", "-o", "m", "-q"]);
        assert_eq!(o.code, 2, "{name}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        std::fs::remove_file(&p).unwrap();
        std::fs::rename(&keep, &p).unwrap();
    }
    let o = probe_in(cwd, &["merge", "s0", "s1", "-o", "m", "-q"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn a_node_whose_shard_all_result_is_missing_makes_the_merge_incomplete() {
    // Issue 53 gap: a --shard all result missing for a node passed silently.
    let t = tempfile::tempdir().unwrap();
    let whole = t.path().join("whole");
    synth(&whole, &["--ranks", "4"]);
    for (node, ranks) in [("node0", ["rank0", "rank1"]), ("node1", ["rank2", "rank3"])] {
        for side in ["bench", "cmp"] {
            let (from, to) = (whole.join(side), t.path().join(node).join(side));
            std::fs::create_dir_all(to.join("step0")).unwrap();
            std::fs::copy(from.join("manifest.json"), to.join("manifest.json")).unwrap();
            for r in ranks {
                copy_dir(&from.join("step0").join(r), &to.join("step0").join(r));
            }
        }
        shard_into(&t.path().join(node), "all", "shard");
    }
    let o = probe_in(
        t.path(),
        &["merge", "node0/shard", "node1/shard", "-o", "m", "-q"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = probe_in(t.path(), &["merge", "node0/shard", "-o", "m1", "-q"]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("no shard result holds 2 of the job's 4 ranks (rank2, rank3)"),
        "{}",
        o.stderr
    );
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.path().join("m1/summary.json")).unwrap()).unwrap();
    let missing: Vec<&str> = s["incomplete_units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["rank"].as_str().unwrap())
        .collect();
    assert_eq!(missing, ["rank2", "rank3"], "{s}");
}
