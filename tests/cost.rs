//! `probe cost DUMP`: the agent's forecast from the manifest and the bytes on disk, on real
//! dumps (the bundled demo, msprobe's), run through the real binary.

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

fn demo_copy(to: &Path) {
    copy_dir(&root().join("testdata/demo/bench"), to);
}

fn folder_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        total += if p.is_dir() {
            folder_bytes(&p)
        } else {
            std::fs::metadata(&p).unwrap().len()
        };
    }
    total
}

fn set_manifest_key(dump: &Path, key: &str, value: Value) {
    let path = dump.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m[key] = value;
    std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
}

fn forecast(bytes_per_step: u64, bare_from: &str) -> Value {
    json!({
        "measured_on_step": 0, "rank": 0, "time_per_step_s": 0.25, "bare_step_s": 0.2,
        "bare_from": bare_from, "overhead": 1.25, "setup_s": 0.01,
        "bytes_per_step": bytes_per_step, "host_memory_bytes": 4096,
        "steps": 10, "ranks": 1, "bytes_total": bytes_per_step * 10, "time_total_s": 2.5,
        "note": "later steps may be slower"
    })
}

#[test]
fn prints_the_forecast_and_the_bytes_on_disk() {
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("dump");
    demo_copy(&dump);
    let on_disk = folder_bytes(&dump.join("step0/rank0"));
    set_manifest_key(&dump, "forecast", forecast(on_disk, "uncaptured_step"));
    set_manifest_key(
        &dump,
        "budget",
        json!({"exceeded": ["max_bytes: 2 MB forecast > 1 MB"], "action": "statistics",
               "from_step": 1, "on_budget": "statistics"}),
    );
    let o = probe(&["cost", dump.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("1 step/rank folders (1 steps)"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("forecast (from step 0, rank 0): 0.250 s per captured step, 1.25x bare (bare from uncaptured step)"), "{}", o.stdout);
    assert!(o.stdout.contains("for 10 steps x 1 ranks"), "{}", o.stdout);
    assert!(o.stdout.contains("1.00x the forecast"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("forecast note: later steps may be slower"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("budget exceeded (max_bytes: 2 MB forecast > 1 MB): statistics from step 1"),
        "{}",
        o.stdout
    );

    let o = probe(&["cost", dump.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["units"][0]["bytes"], json!(on_disk));
    assert_eq!(v["units"][0]["step"], "step0");
    assert_eq!(v["bytes_total"], json!(on_disk));
    assert_eq!(v["forecast"]["bytes_per_step"], json!(on_disk));
    assert_eq!(v["budget"]["action"], "statistics");

    // a rank folder given: the manifest two levels up still supplies the forecast
    let o = probe(&["cost", dump.join("step0/rank0").to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("forecast (from step 0"), "{}", o.stdout);
}

#[test]
fn a_dump_without_a_forecast_still_gets_its_bytes() {
    let o = probe(&["cost", root().join("testdata/demo/bench").to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("forecast: none in the manifest"),
        "{}",
        o.stdout
    );
    let ms = root().join("testdata/msprobe/dist_bench");
    let o = probe(&["cost", ms.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["forecast"], Value::Null);
    assert_eq!(v["bytes_total"], json!(folder_bytes(&ms)));
}

#[test]
fn input_strings_are_escaped_for_the_terminal() {
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("dump");
    demo_copy(&dump);
    set_manifest_key(
        &dump,
        "forecast",
        forecast(10, "\u{1b}]0;owned\u{7}x\u{202e}gpj.exe\u{2066}"),
    );
    let o = probe(&["cost", dump.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for c in ['\u{1b}', '\u{7}', '\u{202e}', '\u{2066}'] {
        assert!(!o.stdout.contains(c), "{c:?} in {:?}", o.stdout);
    }
    assert!(
        o.stdout.contains("\\u{202e}gpj.exe\\u{2066}"),
        "{}",
        o.stdout
    );
}

/// Absurd forecast figures (the dump's data) print in scientific notation, not as a
/// 309-digit number; negative ones as unknown.
#[test]
fn huge_forecast_figures_stay_short() {
    let d = tempfile::tempdir().unwrap();
    let dump = d.path().join("dump");
    demo_copy(&dump);
    let mut f = forecast(10, "uncaptured_step");
    f["time_per_step_s"] = json!(1e308);
    f["overhead"] = json!(-3.0);
    set_manifest_key(&dump, "forecast", f);
    let o = probe(&["cost", dump.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout
            .contains(": 1.000e308 s per captured step, ?x bare"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.lines().all(|l| l.len() < 200), "{}", o.stdout);
}

#[test]
fn a_missing_or_corrupt_dump_is_a_one_line_error() {
    let d = tempfile::tempdir().unwrap();
    let o = probe(&["cost", d.path().join("nope").to_str().unwrap()]);
    assert_input_error(&o, 2, "no such file or directory");

    let dump = d.path().join("dump");
    demo_copy(&dump);
    std::fs::write(dump.join("manifest.json"), "{\"format\": ").unwrap();
    assert_input_error(&probe(&["cost", dump.to_str().unwrap()]), 2, "bad manifest");

    demo_copy(&dump);
    set_manifest_key(&dump, "forecast", json!([1, 2]));
    assert_input_error(
        &probe(&["cost", dump.to_str().unwrap()]),
        2,
        "forecast is not an object",
    );
    set_manifest_key(&dump, "forecast", json!({"bytes_per_step": "many"}));
    assert_input_error(
        &probe(&["cost", dump.to_str().unwrap()]),
        2,
        "bytes_per_step",
    );

    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_input_error(&probe(&["cost", empty.to_str().unwrap()]), 2, "not a dump");
}
