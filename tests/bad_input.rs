//! One test per class of bad input: a one-line error naming the culprit file or tensor,
//! exit 2 (3 when nothing is comparable), never a panic, never silent wrong output.

use crate::common;
use common::*;
use std::path::Path;

fn demo(t: &Path) {
    synth(t, &["--inject", "Functional.gelu.1"]);
}

fn rank(t: &Path, side: &str) -> std::path::PathBuf {
    t.join(side).join("step0/rank0")
}

/// Applies the same text edit to the first matching line of both sides' op logs.
fn edit_first_op(t: &Path, from: &str, to: &str) {
    for side in ["bench", "cmp"] {
        let p = rank(t, side).join("ops.jsonl");
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(from), "{from} not in {}", p.display());
        std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    }
}

/// Rewrites the comparison side's op log line by line.
fn edit_cmp_lines(t: &Path, edit: impl FnOnce(&mut Vec<String>)) {
    let p = rank(t, "cmp").join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    edit(&mut lines);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
}

#[test]
fn missing_directory() {
    let t = tempfile::tempdir().unwrap();
    let o = probe(&[
        "compare",
        "-b",
        "/nonexistent/bench",
        "-c",
        "/nonexistent/cmp",
        "-o",
        t.path().to_str().unwrap(),
    ]);
    assert_input_error(&o, 2, "/nonexistent/bench: no such file or directory");
}

#[test]
fn folder_that_is_not_a_dump() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("bench/random")).unwrap();
    std::fs::create_dir_all(t.path().join("cmp")).unwrap();
    assert_input_error(&compare(t.path(), &[]), 2, "not a dump");
}

#[test]
fn empty_dump() {
    // An empty op log is what a run killed before its first flush leaves: the pair is
    // listed as incomplete, not an input error; with no other pair nothing is comparable.
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    std::fs::write(rank(t.path(), "cmp").join("ops.jsonl"), "").unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 3, "{}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("no op records"), "{}", o.stderr);
    let s = summary(t.path());
    assert_eq!(s["partial"], true);
    assert_eq!(s["incomplete_units"][0]["step"], "step0");
}

#[test]
fn truncated_safetensors_shard() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = rank(t.path(), "cmp").join("tensors-00000.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, "corrupt safetensors shard");
    assert!(o.stderr.contains("tensors-00000.safetensors"));
}

#[test]
fn safetensors_header_too_large() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = rank(t.path(), "bench").join("tensors-00000.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, "corrupt safetensors shard");
    assert!(o.stderr.to_lowercase().contains("header"), "{}", o.stderr);
}

#[test]
fn op_log_shape_disagrees_with_shard() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_first_op(t.path(), "\"shape\":[4,16]", "\"shape\":[2,32]");
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, "op log says shape [2, 32], shard holds [4, 16]");
    assert!(o.stderr.contains("Functional.linear.0.forward.input.0"));
}

#[test]
fn unknown_dtype_with_data() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_first_op(
        t.path(),
        "\"dtype\":\"float32\"",
        "\"dtype\":\"float8_e4m3fn\"",
    );
    assert_input_error(
        &compare(t.path(), &[]),
        2,
        "unsupported dtype float8_e4m3fn",
    );
}

#[test]
fn corrupt_line_in_the_middle_of_the_op_log() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_cmp_lines(t.path(), |lines| lines[2] = lines[2][..40].to_string());
    assert_input_error(&compare(t.path(), &[]), 2, "ops.jsonl:3: bad op record");
}

#[test]
fn a_tensor_name_recorded_twice() {
    // A later op's tensor carries the name of an earlier op's: names must be unique in an
    // op log (they are the tensors' keys), so the log is refused naming the line and name.
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let mut first = serde_json::Value::Null;
    edit_cmp_lines(t.path(), |lines| {
        let op = |l: &str| serde_json::from_str::<serde_json::Value>(l).unwrap();
        first = op(&lines[0])["tensors"][0]["name"].clone();
        let mut fourth = op(&lines[3]);
        fourth["tensors"][0]["name"] = first.clone();
        lines[3] = fourth.to_string();
    });
    let needle = format!(
        "ops.jsonl:4: bad op record: duplicate tensor name {}",
        first.as_str().unwrap()
    );
    assert_input_error(&compare(t.path(), &[]), 2, &needle);
}

#[test]
fn an_op_key_too_long_to_be_one() {
    // Op keys are held in 16-bit lengths: a key past 65,535 bytes (a corrupt record: real
    // keys are tens of bytes) is refused, naming the line and the key's length.
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let long = format!("Functional.{}.0.forward", "x".repeat(70_000));
    let len = long.len();
    edit_cmp_lines(t.path(), |lines| {
        let mut op: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        let key = op["op"].as_str().unwrap().to_string();
        op["op"] = long.clone().into();
        for t in op["tensors"].as_array_mut().unwrap() {
            let name = t["name"].as_str().unwrap().replace(&key, &long);
            t["name"] = name.into();
        }
        lines[2] = op.to_string();
    });
    let needle = format!("ops.jsonl:3: bad op record: op key of {len} bytes");
    assert_input_error(&compare(t.path(), &[]), 2, &needle);
}

#[test]
fn more_undecodable_dtypes_than_an_op_log_holds() {
    // A rank's op log names its dtypes with one byte: past 246 distinct dtypes probe does
    // not decode (a corrupt log: real ones use a handful), the log is refused.
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_cmp_lines(t.path(), |lines| {
        let op: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        let mut extra = Vec::new();
        for i in 0..300 {
            let mut o = op.clone();
            let key = format!("Functional.odd{i}.0.forward");
            o["op"] = key.clone().into();
            o["seq"] = (1_000_000 + i).into();
            for (j, t) in o["tensors"].as_array_mut().unwrap().iter_mut().enumerate() {
                t["name"] = format!("{key}.input.{j}").into();
                t["dtype"] = format!("float{i}_odd").into();
                t.as_object_mut().unwrap().remove("file");
            }
            extra.push(o.to_string());
        }
        lines.extend(extra);
    });
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, "distinct dtypes probe does not decode in one op log");
}

#[test]
fn op_log_with_a_huge_hole() {
    // A corrupt op log whose size says gigabytes (a sparse file: valid records, then a
    // hole of zero bytes). The reader sizes its record list from the file (tens of
    // millions of records here) and reads on line by line: the hole is a bad record, found
    // without reading the gigabytes or holding them.
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = rank(t.path(), "cmp").join("ops.jsonl");
    let lines = std::fs::read_to_string(&p).unwrap().lines().count();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(8 << 30).unwrap();
    drop(f);
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, &format!("ops.jsonl:{}: bad op record", lines + 1));
}

#[test]
fn truncated_last_line_of_a_crashed_run_is_skipped_with_a_warning() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = rank(t.path(), "cmp").join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let cut = &text[..text.len() - 30]; // no trailing newline: a record cut short
    std::fs::write(&p, cut).unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_eq!(o.stderr.matches("incomplete").count(), 1, "{}", o.stderr);
    let s = summary(t.path());
    assert_eq!(
        s["first_divergent"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
    // Compared up to the last complete record: the comparison is partial, and the
    // benchmark's ops past the cut are not counted as unmatched.
    assert_eq!(s["partial"], true);
    assert_eq!(s["counts"]["unmatched_bench"], 0);
}

#[test]
fn manifest_of_another_version() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = t.path().join("cmp/manifest.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replace("\"version\": 1", "\"version\": 7")).unwrap();
    assert_input_error(
        &compare(t.path(), &[]),
        2,
        "format version 7 is not supported",
    );
}

#[test]
fn manifest_with_a_world_size_that_is_no_number_of_ranks() {
    for (value, said) in [
        ("0", "world_size 0 is not a number of ranks"),
        ("-2", "bad manifest"),
        ("\"four\"", "bad manifest"),
    ] {
        let t = tempfile::tempdir().unwrap();
        demo(t.path());
        let p = t.path().join("cmp/manifest.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let text = text.replace("\"world_size\": 1", &format!("\"world_size\": {value}"));
        std::fs::write(&p, text).unwrap();
        assert_input_error(&compare(t.path(), &[]), 2, said);
    }
}

#[test]
fn output_path_is_a_file() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    std::fs::write(t.path().join("out"), "x").unwrap();
    assert_input_error(&compare(t.path(), &[]), 2, "exists and is not a directory");
}

#[test]
fn bad_tolerance_config() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let cfg = t.path().join("tol.toml");
    std::fs::write(&cfg, "[dtype.float33]\nerror = 1e-3\n").unwrap();
    assert_input_error(
        &compare(t.path(), &["--config", cfg.to_str().unwrap()]),
        2,
        "unknown dtype \"float33\"",
    );
    std::fs::write(&cfg, "[[op]]\npattern = \"Functional.*\"\nerror = -1\n").unwrap();
    assert_input_error(
        &compare(t.path(), &["--config", cfg.to_str().unwrap()]),
        2,
        "non-negative",
    );
    std::fs::write(&cfg, "this is not toml").unwrap();
    assert_input_error(
        &compare(t.path(), &["--config", cfg.to_str().unwrap()]),
        2,
        "bad config",
    );
}

#[test]
fn tolerance_config_changes_the_verdict() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let cfg = t.path().join("tol.toml");
    std::fs::write(
        &cfg,
        "[dtype.float32]\nerror = 10.0\nwarning = 10.0\nmax_abs = 10.0\n",
    )
    .unwrap();
    let o = compare(t.path(), &["--config", cfg.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    std::fs::write(
        &cfg,
        "[[op]]\npattern = \"Functional.gelu.1.*\"\nerror = 1.0\nwarning = 1.0\nmax_abs = 1.0\n",
    )
    .unwrap();
    compare(t.path(), &["--config", cfg.to_str().unwrap()]);
    let s = summary(t.path());
    // gelu.1 is now tolerated; its consumer linear.3 has a failing input, so no local culprit
    // can be named after it and the earliest failing op moves downstream.
    assert_ne!(
        s["earliest_failing"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
}

#[test]
fn nothing_comparable_exits_3() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let p = rank(t.path(), "cmp").join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replace("Functional.", "Other.")
            .replace("Torch.", "Other2."),
    )
    .unwrap();
    // The shard keys no longer match, but nothing is read: no tensor is on both sides.
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 3, "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("NOTHING COMPARABLE"));
}

#[test]
fn shard_name_escaping_the_folder() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_first_op(
        t.path(),
        "\"file\":\"tensors-00000.safetensors\"",
        "\"file\":\"../../x.safetensors\"",
    );
    assert_input_error(&compare(t.path(), &[]), 2, "bad shard file name");
}

#[test]
fn missing_shard_file() {
    // What a crash or a full disk leaves: the tensors are compared by their statistics,
    // with a warning naming them (tests/crash.rs has the rest).
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    std::fs::remove_file(rank(t.path(), "cmp").join("tensors-00000.safetensors")).unwrap();
    let o = compare(t.path(), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("tensors-00000.safetensors: shard missing"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("compared by statistics"), "{}", o.stderr);
    assert_eq!(summary(t.path())["partial"], true);
}

#[test]
fn missing_key_in_a_finished_shard_is_still_an_error() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    edit_first_op(
        t.path(),
        "\"name\":\"Functional.",
        "\"name\":\"Renamed.Functional.",
    );
    let o = compare(t.path(), &[]);
    assert_input_error(&o, 2, "not in this shard");
}

#[test]
fn shape_mismatch_between_sides_is_a_matching_finding() {
    // The same call with other shapes on the comparison side: the code paths differ there.
    // Its tensors are left unmatched with that reason (a matching finding), never compared
    // against each other nor named as a numerical culprit.
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics"]);
    let p = rank(t.path(), "cmp").join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replacen("\"shape\":[4,16]", "\"shape\":[64]", 1)).unwrap();
    let o = compare(t.path(), &[]);
    assert_ne!(o.code, 1, "{}", o.stdout);
    let s = summary(t.path());
    assert_eq!(s["counts"]["error"], 0);
    assert_eq!(s["counts"]["unmatched_bench"], 3);
    assert_eq!(s["counts"]["unmatched_cmp"], 3);
    assert!(s["first_divergent"]["forward"].is_null());
    let wb_path = t.path().join("out/compare.xlsx");
    let mut wb: calamine::Xlsx<_> = calamine::open_workbook(&wb_path).unwrap();
    let un = calamine::Reader::worksheet_range(&mut wb, "unmatched").unwrap();
    let why: Vec<String> = un
        .rows()
        .skip(1)
        .map(|r| r[r.len() - 1].to_string())
        .collect();
    assert_eq!(why.len(), 6);
    assert!(why.iter().all(|w| w.contains("other shapes")), "{why:?}");
}

#[test]
fn usage_errors() {
    let o = probe(&["compare", "-b", "x"]);
    assert_eq!(o.code, 2);
    assert!(!o.stderr.contains("panicked"));
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    assert_input_error(
        &compare(t.path(), &["--format", "csv"]),
        2,
        "unknown report format",
    );
    assert_input_error(&compare(t.path(), &["--threads", "0"]), 2, "--threads");
}

#[test]
fn output_inside_an_input_dump_is_refused() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let inside = t.path().join("cmp/reports");
    let (bench, cmp) = (t.path().join("bench"), t.path().join("cmp"));
    let o = compare_paths(&bench, &cmp, &inside, &[]);
    assert_input_error(&o, 2, "inside the input dump");
    assert!(!inside.exists(), "nothing written");
    let o = scan(&cmp, &inside, &[]);
    assert_input_error(&o, 2, "inside the input dump");
}

#[test]
fn a_report_that_cannot_be_written_leaves_the_previous_set_alone() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let out = t.path().join("out");
    assert_eq!(compare(t.path(), &[]).code, 1);
    let before: Vec<(String, Vec<u8>)> = ["summary.json", "compare.parquet", "compare.xlsx"]
        .iter()
        .map(|n| (n.to_string(), std::fs::read(out.join(n)).unwrap()))
        .collect();
    // The next compare's xlsx cannot be moved into place (a directory stands there); the
    // summary must not be replaced either, nor any other file.
    std::fs::remove_file(out.join("compare.xlsx")).unwrap();
    std::fs::create_dir(out.join("compare.xlsx")).unwrap();
    let o = compare(t.path(), &["--fail-on", "never"]);
    assert_input_error(&o, 2, "compare.xlsx");
    for (n, bytes) in &before[..2] {
        assert_eq!(&std::fs::read(out.join(n)).unwrap(), bytes, "{n} untouched");
    }
    let names = leftovers(&out);
    assert!(names.is_empty(), "no staging left: {names:?}");
}

#[test]
fn every_output_the_summary_lists_exists() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    compare(t.path(), &["--format", "json,parquet"]);
    let s = summary(t.path());
    let outputs = s["outputs"].as_object().unwrap();
    assert_eq!(outputs.len(), 2);
    for (_, p) in outputs {
        assert!(Path::new(p.as_str().unwrap()).is_file(), "{p}");
    }
    assert!(!t.path().join("out/compare.xlsx").exists());
}

#[test]
fn an_endless_config_file_is_refused() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let o = compare(t.path(), &["--config", "/dev/zero"]);
    assert_input_error(&o, 2, "larger than 1048576 bytes");
    let rules = probe(&[
        "config-check",
        root()
            .join("testdata/config_check/base.zip")
            .to_str()
            .unwrap(),
        root()
            .join("testdata/config_check/env.zip")
            .to_str()
            .unwrap(),
        "-o",
        t.path().join("cc").to_str().unwrap(),
        "--config",
        "/dev/zero",
    ]);
    assert_input_error(&rules, 2, "larger than 1048576 bytes");
}

#[test]
fn thread_counts_are_capped_with_a_note() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let o = compare(t.path(), &["--threads", "100000", "--format", "json"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("--threads 100000 capped at"),
        "{}",
        o.stderr
    );
}

#[test]
fn control_characters_in_a_bad_config_are_not_echoed() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let cfg = t.path().join("tol.toml");
    std::fs::write(&cfg, "[dtype.float32]\nwarning = \"\x1b[31mred\x07\"\n").unwrap();
    let o = compare(t.path(), &["--config", cfg.to_str().unwrap()]);
    assert_input_error(&o, 2, "bad config");
    assert!(
        !o.stderr.contains('\x1b') && !o.stderr.contains('\x07'),
        "{:?}",
        o.stderr
    );
}

#[test]
fn an_op_log_that_is_not_a_file_is_named_not_called_not_a_dump() {
    let t = tempfile::tempdir().unwrap();
    demo(t.path());
    let log = rank(t.path(), "cmp").join("ops.jsonl");
    std::fs::remove_file(&log).unwrap();
    std::fs::create_dir(&log).unwrap();
    assert_input_error(
        &compare(t.path(), &[]),
        2,
        "ops.jsonl: unsupported: not a regular file",
    );
}

#[test]
fn a_tensor_file_that_is_not_a_file_is_an_error_not_a_quiet_fallback() {
    let t = tempfile::tempdir().unwrap();
    let src = root().join("testdata/msprobe/tensor_bench");
    copy_dir(&src, &t.path().join("bench"));
    copy_dir(&src, &t.path().join("cmp"));
    let pt = t
        .path()
        .join("cmp/step0/proc23596/dump_tensor_data/Functional.conv2d.0.forward.input.0.pt");
    std::fs::remove_file(&pt).unwrap();
    std::fs::create_dir(&pt).unwrap();
    assert_input_error(&compare(t.path(), &[]), 2, "is not a regular file");
}
