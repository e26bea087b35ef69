//! A crashed (or full-disk) run stays comparable: what both sides hold is compared, what
//! is missing is listed in `incomplete_units`, and the exit status says the comparison is
//! partial (4) unless something diverged (1). Never an input error for a crash's leftovers.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};

const EXIT_INCOMPLETE: i32 = 4;

fn rank(t: &Path, side: &str, step: usize) -> PathBuf {
    t.join(side).join(format!("step{step}/rank0"))
}

fn units(s: &serde_json::Value) -> Vec<String> {
    s["incomplete_units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            format!(
                "{}/{}",
                u["step"].as_str().unwrap(),
                u["rank"].as_str().unwrap()
            )
        })
        .collect()
}

/// Turns the finished shard of `dir` into what a crash leaves: `<shard>.stream.tmp`, its
/// data located by the records' `data_offsets` (as the agent writes them), cut to `keep`
/// of its data bytes.
fn crash_shard(dir: &Path, keep: f64) {
    let shard = dir.join("tensors-00000.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let ops = dir.join("ops.jsonl");
    let text = std::fs::read_to_string(&ops).unwrap();
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut rec: serde_json::Value = serde_json::from_str(line).unwrap();
        for t in rec["tensors"].as_array_mut().unwrap() {
            if let Some(e) = header.get(t["name"].as_str().unwrap()) {
                t["data_offsets"] = e["data_offsets"].clone();
            }
        }
        lines.push(serde_json::to_string(&rec).unwrap());
    }
    std::fs::write(&ops, lines.join("\n") + "\n").unwrap();
    let data = bytes.len() - 8 - n;
    let cut = 8 + n + (data as f64 * keep) as usize;
    std::fs::write(
        dir.join("tensors-00000.safetensors.stream.tmp"),
        &bytes[..cut],
    )
    .unwrap();
    std::fs::remove_file(&shard).unwrap();
}

fn run(t: &Path) -> (Out, serde_json::Value) {
    let o = compare(t, &[]);
    let s = summary(t);
    (o, s)
}

#[test]
fn stream_tmp_only_is_read_in_full() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    crash_shard(&rank(t.path(), "cmp", 0), 1.0);
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("error"), "{}", o.stderr);
    assert_eq!(s["partial"], true);
    assert_eq!(units(&s), ["step0/rank0"]);
    // Every tensor was read from the unfinished shard: all compared as tensors.
    assert_eq!(
        s["counts"]["compared_by"]["tensor"], s["counts"]["tensors"],
        "{s}"
    );
    assert!(o.stderr.contains("stream.tmp"), "{}", o.stderr);
    assert!(
        s["headline"].as_str().unwrap().starts_with("INCOMPLETE"),
        "{s}"
    );
}

#[test]
fn truncated_stream_tmp_compares_the_rest_by_statistics() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    crash_shard(&rank(t.path(), "cmp", 0), 0.5);
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("error"), "{}", o.stderr);
    let by = &s["counts"]["compared_by"];
    assert!(by["tensor"].as_u64().unwrap() > 0, "{s}");
    assert!(by["statistics"].as_u64().unwrap() > 0, "{s}");
    // One warning for the shard, naming tensors without data.
    let w: Vec<&str> = s["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .filter(|w| w.contains("compared by statistics"))
        .collect();
    assert_eq!(w.len(), 1, "{s}");
    assert!(w[0].contains(".forward."), "{}", w[0]);
}

#[test]
fn record_pointing_at_a_missing_shard_is_compared_by_statistics() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    std::fs::remove_file(rank(t.path(), "cmp", 0).join("tensors-00000.safetensors")).unwrap();
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("error"), "{}", o.stderr);
    assert!(o.stderr.contains("shard missing"), "{}", o.stderr);
    assert!(o.stderr.contains(".forward.input.0"), "{}", o.stderr);
    assert_eq!(
        s["counts"]["compared_by"]["statistics"],
        s["counts"]["tensors"]
    );
    assert_eq!(s["incomplete_units"][0]["side"], "cmp");
    assert_eq!(s["incomplete_units"][0]["compared"], true);
}

#[test]
fn empty_rank_folder_on_one_side_is_listed_and_the_rest_compared() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "2"]);
    std::fs::write(rank(t.path(), "cmp", 1).join("ops.jsonl"), "").unwrap();
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("error"), "{}", o.stderr);
    assert_eq!(units(&s), ["step1/rank0"]);
    assert_eq!(s["incomplete_units"][0]["compared"], false);
    assert_eq!(s["counts"]["pairs"], 1);
    assert!(s["counts"]["tensors"].as_u64().unwrap() > 0);
}

#[test]
fn step_present_on_one_side_only_is_listed() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "3"]);
    std::fs::remove_dir_all(t.path().join("cmp/step2")).unwrap();
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(units(&s), ["step2/rank0"]);
    assert_eq!(s["incomplete_units"][0]["side"], "cmp");
    assert_eq!(s["counts"]["pairs"], 2);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with("INCOMPLETE") && h.contains("step2/rank0"),
        "{h}"
    );
}

#[test]
fn a_divergence_in_a_partial_comparison_still_exits_1() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "2", "--inject", "Functional.gelu.1"]);
    std::fs::remove_dir_all(t.path().join("cmp/step1")).unwrap();
    let (o, s) = run(t.path());
    assert_eq!(o.code, 1, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(s["partial"], true);
    assert!(s["headline"].as_str().unwrap().starts_with("DIVERGENCE"));
}

#[test]
fn a_complete_comparison_is_not_partial() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--steps", "2"]);
    let (o, s) = run(t.path());
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(s["partial"], false);
    assert_eq!(s["incomplete_units"].as_array().unwrap().len(), 0);
}

#[test]
fn a_cut_op_log_is_compared_up_to_its_last_record() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    let p = rank(t.path(), "cmp", 0).join("ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    let (o, s) = run(t.path());
    assert_eq!(o.code, EXIT_INCOMPLETE, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(
        o.stderr.matches("incomplete (crashed run?)").count(),
        1,
        "{}",
        o.stderr
    );
    // The benchmark's ops after the cut were never reached: not unmatched, not compared.
    assert_eq!(s["counts"]["unmatched_bench"], 0, "{s}");
    let reason = s["incomplete_units"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("op log cut short") && reason.contains("not compared"),
        "{reason}"
    );
}
