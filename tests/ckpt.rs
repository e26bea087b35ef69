//! `probe ckpt-compare` on bad input: every case is one line on stderr naming the file,
//! shard or tensor, exit 2, never a panic; and the small pass/differ cases on
//! safetensors written here.

use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn write_st(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.to_string(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    serialize_to_file(views, None, path).unwrap();
}

fn run(a: &Path, b: &Path, out: &Path) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .args(["ckpt-compare"])
        .arg(a)
        .arg(b)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        err,
    )
}

fn bad_input(a: &Path, b: &Path, out: &Path, needle: &str) {
    let (code, stdout, err) = run(a, b, out);
    assert_eq!(code, 2, "{stdout}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
    assert!(!out.join("ckpt_compare.json").exists());
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn simple(dir: &Path, name: &str, scale: f32) -> PathBuf {
    let p = dir.join(name);
    write_st(
        &p,
        &[
            (
                "model.embed_tokens.weight",
                vec![4, 2],
                (0..8).map(|i| i as f32).collect(),
            ),
            (
                "model.layers.0.mlp.up_proj.weight",
                vec![2, 2],
                vec![1.0, 2.0, 3.0, 4.0 * scale],
            ),
            (
                "model.layers.10.mlp.up_proj.weight",
                vec![2],
                vec![1.0, 2.0],
            ),
            (
                "model.layers.2.mlp.up_proj.weight",
                vec![2],
                vec![1.0, 2.0 * scale],
            ),
        ],
    );
    p
}

#[test]
fn equal_files_pass_and_a_change_is_named_in_model_order() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let b = simple(d.path(), "b.safetensors", 1.0);
    let c = simple(d.path(), "c.safetensors", 2.0);
    let (code, out, err) = run(&a, &b, &d.path().join("o1"));
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&a, &c, &d.path().join("o2"));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("differs: first differing parameter: model.layers.0.mlp.up_proj.weight"),
        "{out}"
    );
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("o2/ckpt_compare.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = s["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names[1..],
        [
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.2.mlp.up_proj.weight",
            "model.layers.10.mlp.up_proj.weight"
        ]
    );
    assert_eq!(s["counts"]["differ"], 2);
}

#[test]
fn a_parameter_on_one_side_only_differs() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let b = d.path().join("b.safetensors");
    write_st(
        &b,
        &[(
            "model.embed_tokens.weight",
            vec![4, 2],
            (0..8).map(|i| i as f32).collect(),
        )],
    );
    let (code, out, _) = run(&a, &b, &d.path().join("o"));
    assert_eq!(code, 1);
    assert!(out.contains("only in bench"), "{out}");
}

#[test]
fn shape_mismatch_is_bad_input() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let b = d.path().join("b.safetensors");
    write_st(
        &b,
        &[(
            "model.embed_tokens.weight",
            vec![2, 4],
            (0..8).map(|i| i as f32).collect(),
        )],
    );
    bad_input(
        &a,
        &b,
        &d.path().join("o"),
        "model.embed_tokens.weight: shape [4, 2]",
    );
}

#[test]
fn a_shard_missing_from_an_index_is_bad_input() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let dir = d.path().join("sharded");
    std::fs::create_dir(&dir).unwrap();
    write_st(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("x", vec![1], vec![1.0])],
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    bad_input(
        &a,
        &dir,
        &d.path().join("o"),
        "shard model-00002-of-00002.safetensors named in weight_map is missing",
    );
}

#[test]
fn corrupt_files_are_bad_input() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let bytes = std::fs::read(&a).unwrap();
    let cut = d.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    bad_input(&a, &cut, &d.path().join("o"), "cut.safetensors");
    let junk = d.path().join("junk.pt");
    std::fs::write(&junk, b"not a zip\n\x1b[31m").unwrap();
    bad_input(&a, &junk, &d.path().join("o"), "junk.pt");
    bad_input(&a, &d.path().join("nope"), &d.path().join("o"), "nope");
}

/// A torch.save-shaped zip whose pickle calls `os.system`: refused by name, never run.
#[test]
fn hostile_pickle_is_refused() {
    let d = tmp();
    let a = simple(d.path(), "a.safetensors", 1.0);
    let evil = d.path().join("evil.pt");
    let f = std::fs::File::create(&evil).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", opts).unwrap();
    z.write_all(b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
        .unwrap();
    z.finish().unwrap();
    bad_input(&a, &evil, &d.path().join("o"), "os.system");
}
