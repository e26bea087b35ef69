//! Issue 53: a hostile re-test's failures, each reproduced from outside (the binary, real
//! files) and held fixed: numeric arguments out of range, terminal control characters from
//! a dump, outputs across a kill, stale staging folders. (Merge's cases are in
//! `tests/shard.rs`, secrets' in `tests/secrets_corpus.rs`.)

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Runs probe under an address-space limit (`ulimit -v`, KiB) and a time limit, so an
/// argument that makes it allocate without bound fails the test instead of the machine.
fn probe_bounded(cwd: &Path, args: &[&str], kib: u64) -> Out {
    let mut script = format!(
        "ulimit -v {kib}; exec timeout 60 {}",
        env!("CARGO_BIN_EXE_probe")
    );
    for a in args {
        script += &format!(" '{}'", a.replace('\'', r"'\''"));
    }
    let o = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(cwd)
        .output()
        .expect("run sh");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn synth_refuses_sizes_out_of_range_without_a_panic() {
    let t = tempfile::tempdir().unwrap();
    let huge = u64::MAX.to_string();
    let cases: &[&[&str]] = &[
        &["--bulk", "1", "--bulk-elems", &huge],
        &["--bulk", "1", "--bulk-elems", "0"],
        &["--bulk", &huge],
        &["--width", "4294967296"],
        &["--width", &huge],
        &["--batch", &huge],
        &["--blocks", &huge],
        &["--steps", &huge],
        &["--ranks", &huge],
        &["--blocks", "1048576", "--steps", "1048576"],
        &["--width", "4096", "--batch", "65536"],
        &["--noise", "nan"],
        &["--noise", "inf"],
        &["--inject-scale=-1"],
        &["--width", "0"],
    ];
    for (i, case) in cases.iter().enumerate() {
        let out = format!("s{i}");
        let mut a = vec!["synth", "-o", &out];
        a.extend_from_slice(case);
        let o = probe_bounded(t.path(), &a, 2 << 20);
        assert_input_error(&o, 2, "--");
        assert!(!t.path().join(&out).join("bench").exists(), "{case:?}");
    }
}

#[test]
fn numeric_arguments_out_of_range_are_usage_errors_never_panics() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(cwd, &["--ranks", "2"]);
    let huge = u64::MAX.to_string();
    let c = ["compare", "-b", "bench", "-c", "cmp", "-o", "o", "-q"];
    let with =
        |extra: &[&str]| -> Vec<String> { c.iter().chain(extra).map(|s| s.to_string()).collect() };
    let refused: Vec<Vec<String>> = vec![
        with(&["--threads", "0"]),
        with(&["--reference", "cmp", "--reference-k", "nan"]),
        with(&["--reference", "cmp", "--reference-k", "1e309"]),
        with(&["--max-unmatched", "nan"]),
        with(&["--max-unmatched", "2"]),
        with(&["--steps", &huge]),
        with(&["--shard", &format!("0/{huge}")]),
        ["scan", "cmp", "-o", "s", "-q", "--overflow-margin", "inf"]
            .map(String::from)
            .to_vec(),
        ["scan", "cmp", "-o", "s", "-q", "--overflow-margin", "nan"]
            .map(String::from)
            .to_vec(),
        [
            "calibrate",
            "-b",
            "bench",
            "-r",
            "cmp",
            "-o",
            "t.toml",
            "-q",
            "--k",
            "nan",
        ]
        .map(String::from)
        .to_vec(),
        [
            "calibrate",
            "-b",
            "bench",
            "-r",
            "cmp",
            "-o",
            "t.toml",
            "-q",
            "--quantile",
            "5",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for a in &refused {
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = probe_bounded(cwd, &args, 4 << 20);
        assert_eq!(o.code, 2, "{a:?}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{a:?}: {}", o.stderr);
    }
    // Huge but meaningful values are taken (capped where a resource is named).
    for extra in [
        &["--threads", &huge][..],
        &["--row-memory", &huge],
        &["--xlsx-rows", &huge],
        &["--ranks", &format!("0-{huge}")],
    ] {
        let a = with(extra);
        let args: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = probe_bounded(cwd, &args, 4 << 20);
        assert_eq!(o.code, 0, "{extra:?}: {}", o.stderr);
    }
}
