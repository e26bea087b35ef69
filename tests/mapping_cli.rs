//! `probe compare --mapping`: the real binary accepts probe's and msprobe's mapping files
//! (repeatably) and stops on a bad one before reading or writing anything: exit 2, one line
//! naming the file and line.

use crate::common;
use common::*;
use std::path::Path;

fn mapping(name: &str) -> String {
    root()
        .join("testdata/mapping")
        .join(name)
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn good_mapping_files_are_accepted() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--inject", "Functional.gelu.1"]);
    let plain = compare(t.path(), &["--format", "json"]);
    assert_eq!(plain.code, 1, "{}", plain.stderr);
    let files = [
        "npu_fused.toml",
        "msprobe_api_mapping.yaml",
        "msprobe_data_mapping.yaml",
        "msprobe_cell_mapping.yaml",
        "msprobe_layer_mapping.yaml",
    ];
    let mut args = vec!["--format".to_string(), "json".to_string()];
    for f in files {
        args.push("--mapping".into());
        args.push(mapping(f));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = compare(t.path(), &args);
    // The table changes no result yet (the structural aligner is what applies it): same
    // verdict and culprit as without it.
    assert_eq!(o.code, plain.code, "{}", o.stderr);
    assert!(!o.stderr.contains("error"), "{}", o.stderr);
    assert!(
        o.stdout.contains("Functional.gelu.1.forward"),
        "{}",
        o.stdout
    );
}

fn assert_refused(t: &Path, file: &Path, needle: &str) {
    let out = t.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let o = compare(t, &["--mapping", file.to_str().unwrap()]);
    assert_input_error(&o, 2, needle);
    assert!(
        o.stderr.contains(&file.display().to_string()),
        "{}",
        o.stderr
    );
    assert!(
        !out.exists(),
        "a bad mapping file must stop before -o is written"
    );
}

#[test]
fn bad_mapping_files_stop_the_compare() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &[]);
    let d = t.path();
    let toml = d.join("bad.toml");
    std::fs::write(
        &toml,
        "[[rule]]\nname = \"x\"\nfused = [\"NPU.npu_x.0.forward\"]\ncomposition = [\"Tensor.mul\"]\n",
    )
    .unwrap();
    assert_refused(d, &toml, "bad.toml:3: [[rule]] \"x\", fused:");
    let yaml = d.join("bad.yaml");
    std::fs::write(&yaml, "a: &x [1, 2]\nb: *x\n").unwrap();
    assert_refused(d, &yaml, "bad.yaml:2: YAML: YAML aliases");
    let mixed = d.join("mixed.yml");
    std::fs::write(
        &mixed,
        "Functional.abs.0.forward.input.0: Torch.abs.0.forward.input.0\nfc2.Dense: fc2.Linear\n",
    )
    .unwrap();
    assert_refused(d, &mixed, "mixed.yml:2: ");
    let json = d.join("map.json");
    std::fs::write(&json, "{}").unwrap();
    assert_refused(d, &json, "unknown kind of mapping file");
    let missing = d.join("missing.toml");
    assert_refused(d, &missing, "missing.toml: no such file or directory");
    let binary = d.join("binary.yaml");
    std::fs::write(&binary, [0u8, 159, 146, 150, 0xff]).unwrap();
    assert_refused(d, &binary, "not UTF-8 text");
    // A good file before a bad one does not hide it.
    let o = compare(
        d,
        &[
            "--mapping",
            &mapping("npu_fused.toml"),
            "--mapping",
            yaml.to_str().unwrap(),
        ],
    );
    assert_input_error(&o, 2, "bad.yaml");
}
