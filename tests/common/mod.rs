//! Helpers shared by the integration tests: run the real `probe` binary on real files.
#![allow(dead_code)]

use probe::schema::dump::{ManifestRecord, OpRecord};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn probe(args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .args(args)
        .output()
        .expect("run probe");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The `probe synth` arguments of the bundled demo pair (as testdata/generate.sh).
pub const DEMO_SYNTH_ARGS: &[&str] = &[
    "--inject",
    "Functional.gelu.1",
    "--blocks",
    "3",
    "--width",
    "16",
    "--batch",
    "4",
    "--seed",
    "1234",
];

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `probe synth -o dir args...`; panics if it fails.
pub fn synth(dir: &Path, args: &[&str]) {
    let d = dir.to_str().unwrap();
    let mut a = vec!["synth", "-o", d];
    a.extend_from_slice(args);
    let o = probe(&a);
    assert_eq!(o.code, 0, "synth failed: {}", o.stderr);
}

/// `probe compare -b dir/bench -c dir/cmp -o dir/out extra...`
pub fn compare(dir: &Path, extra: &[&str]) -> Out {
    let b = dir.join("bench");
    let c = dir.join("cmp");
    let out = dir.join("out");
    let mut a = vec![
        "compare",
        "-b",
        b.to_str().unwrap(),
        "-c",
        c.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    probe(&a)
}

pub fn summary(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("out").join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json is JSON")
}

/// A bad-input run: exit 2 (or `code`), one line on stderr starting with "probe: error:",
/// never a panic.
pub fn assert_input_error(o: &Out, code: i32, needle: &str) {
    assert_eq!(o.code, code, "stderr: {}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "panic: {}", o.stderr);
    let errs: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("probe: error:"))
        .collect();
    assert_eq!(errs.len(), 1, "expected one error line: {}", o.stderr);
    assert!(
        errs[0].contains(needle),
        "error line {:?} should mention {needle:?}",
        errs[0]
    );
}

/// Copies a folder tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// Writes a one-rank statistics dump (manifest and `step0/rank0/ops.jsonl`) from op
/// records, numbering them in order: the dump format's own types, as every writer uses.
pub fn write_op_log(dir: &Path, records: Vec<OpRecord>) {
    let rank = dir.join("step0/rank0");
    std::fs::create_dir_all(&rank).unwrap();
    let manifest = ManifestRecord {
        created: "2026-01-01T00:00:00Z".into(),
        device: "cpu".into(),
        format: "probe-dump".into(),
        framework: "pytorch".into(),
        framework_version: None,
        level: "api".into(),
        mode: "statistics".into(),
        overflow: None,
        producer: None,
        version: 1,
    };
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string(&manifest).unwrap(),
    )
    .unwrap();
    let mut text = String::new();
    for (seq, mut r) in records.into_iter().enumerate() {
        r.seq = seq as u64;
        text += &serde_json::to_string(&r).unwrap();
        text.push('\n');
    }
    std::fs::write(rank.join("ops.jsonl"), text).unwrap();
}
