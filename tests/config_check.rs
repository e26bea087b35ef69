//! `probe config-check` and `probe config-pack`, run as the real binary.
//!
//! Packs under testdata/config_check/ come from real runs of a tiny model
//! (testdata/config_check/make_packs.py) and from msprobe itself (msprobe/*.zip).

use calamine::{Data, Reader, Xlsx};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn td(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/config_check")
        .join(name)
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    out: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Run {
    fn json(&self) -> Value {
        let text = std::fs::read_to_string(self.out.join("config_check.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

fn check(bench: &Path, cmp: &Path, extra: &[&str]) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .arg("config-check")
        .arg(bench)
        .arg(cmp)
        .arg("-o")
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        out,
        _tmp: tmp,
    }
}

/// Categories whose verdict is error or warning.
fn failing(j: &Value) -> BTreeSet<String> {
    j["categories"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verdict"] == "error" || c["verdict"] == "warning")
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn real_runs_fail_exactly_the_changed_categories() {
    let base = td("base.zip");
    for (pack, want, code) in [
        ("rerun.zip", set(&[]), 0),
        ("seed.zip", set(&["random", "weights"]), 1),
        ("env.zip", set(&["env"]), 1),
        ("package.zip", set(&["packages"]), 1),
        ("data_order.zip", set(&["dataset"]), 1),
    ] {
        let r = check(&base, &td(pack), &[]);
        assert_eq!(r.code, code, "{pack}: {}{}", r.stdout, r.stderr);
        let j = r.json();
        assert_eq!(failing(&j), want, "{pack}:\n{}", r.stdout);
        // Every category is compared between two probe packs of the same platform.
        for c in j["categories"].as_array().unwrap() {
            assert_ne!(c["verdict"], "skipped", "{pack}: {c}");
        }
        assert_eq!(j["cross_platform"], false);
    }
}

#[test]
fn changed_items_are_named() {
    let base = td("base.zip");
    let j = check(&base, &td("seed.zip"), &[]).json();
    let seed = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["item"] == "seed torch.manual_seed #1")
        .unwrap();
    assert_eq!(seed["status"], "error");
    assert!(seed["bench"]
        .as_str()
        .unwrap()
        .starts_with("1234 @ make_packs.py:"));
    assert!(seed["cmp"]
        .as_str()
        .unwrap()
        .starts_with("1235 @ make_packs.py:"));

    let j = check(&base, &td("package.zip"), &[]).json();
    let errs: Vec<&Value> = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "error")
        .collect();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0]["item"], "numpy");
    assert_eq!(errs[0]["cmp"], "1.26.4");

    let j = check(&base, &td("data_order.zip"), &[]).json();
    let errs: Vec<&Value> = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "error")
        .collect();
    assert_eq!(errs.len(), 3, "one input per step");
    assert!(errs.iter().all(|i| i["category"] == "dataset"));
}

#[test]
fn msprobe_packs_env_differs_the_right_way_round() {
    let r = check(&td("msprobe/A_bench.zip"), &td("msprobe/C_env.zip"), &[]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let j = r.json();
    assert_eq!(failing(&j), set(&["env"]));
    assert_eq!(j["bench"]["format"], "msprobe");
    let errs: Vec<&Value> = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["status"] == "error" || i["status"] == "warning")
        .collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = errs[0];
    assert_eq!(e["item"], "CUDA_LAUNCH_BLOCKING");
    // A (bench) does not set it; C (cmp) sets it to 1. msprobe's own sheet has these swapped.
    assert_eq!(e["bench"], Value::Null);
    assert_eq!(e["cmp"], "1");
    // Datasets, weights (3 steps) and random draws of msprobe packs are compared.
    for c in j["categories"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if [
            "dataset",
            "weights",
            "random",
            "packages",
            "hyperparameters",
        ]
        .contains(&name)
        {
            assert_eq!(c["verdict"], "pass", "{c}");
            assert!(c["counts"]["pass"].as_u64().unwrap() > 0, "{c}");
        }
    }
    // Terminal summary.
    assert!(
        r.stdout.starts_with("probe config-check: ERROR"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("CUDA_LAUNCH_BLOCKING: bench=<unset> cmp=1"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("msprobe pack"));

    // The workbook: summary first, one sheet per category, columns bench then cmp.
    let mut wb: Xlsx<_> = calamine::open_workbook(r.out.join("config_check.xlsx")).unwrap();
    assert_eq!(
        wb.sheet_names(),
        vec![
            "summary",
            "env",
            "packages",
            "determinism",
            "random",
            "dataset",
            "weights",
            "hyperparameters"
        ]
    );
    let summary = wb.worksheet_range("summary").unwrap();
    let rows: Vec<Vec<String>> = summary
        .rows()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect();
    assert_eq!(rows[0][0], "category");
    assert_eq!(rows[1][0], "env");
    assert_eq!(rows[1][1], "error");
    assert_eq!(rows[3][0], "determinism");
    assert_eq!(rows[3][1], "skipped");
    let env = wb.worksheet_range("env").unwrap();
    let header: Vec<String> = env
        .rows()
        .next()
        .unwrap()
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(header[..5], ["item", "rank", "bench", "cmp", "status"]);
    let row = env
        .rows()
        .find(|r| r[0] == Data::String("CUDA_LAUNCH_BLOCKING".into()))
        .unwrap();
    assert_eq!(row[2], Data::Empty);
    assert_eq!(row[3], Data::String("1".into()));
    assert_eq!(row[4], Data::String("error".into()));
    let weights = wb.worksheet_range("weights").unwrap();
    assert_eq!(weights.rows().count(), 1 + 72);
}

#[test]
fn mixed_msprobe_and_probe_packs_compare() {
    for (b, c) in [
        (td("msprobe/A_bench.zip"), td("base.zip")),
        (td("base.zip"), td("msprobe/A_bench.zip")),
    ] {
        let r = check(&b, &c, &["--fail-on", "never"]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let j = r.json();
        let det = &j["categories"].as_array().unwrap()[2];
        assert_eq!(det["name"], "determinism");
        assert_eq!(det["verdict"], "skipped");
    }
}

#[test]
fn fail_on_and_config_overrides() {
    let (base, env) = (td("base.zip"), td("env.zip"));
    assert_eq!(check(&base, &env, &["--fail-on", "never"]).code, 0);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("rules.toml");
    std::fs::write(
        &cfg,
        "[[severity]]\ncategory = \"env\"\nitem = \"CUDA_LAUNCH_BLOCKING\"\nlevel = \"warning\"\n",
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let r = check(&base, &env, &["--config", c]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.json()["verdict"], "warning");
    assert_eq!(
        check(&base, &env, &["--config", c, "--fail-on", "warning"]).code,
        1
    );
    std::fs::write(&cfg, "[ignore]\nenv = [\"CUDA_*\"]\n").unwrap();
    let r = check(&base, &env, &["--config", c]);
    assert_eq!(r.code, 0);
    assert_eq!(r.json()["counts"]["ignored"], 1);
    std::fs::write(&cfg, "[ignore]\nnot_a_category = [\"X\"]\n").unwrap();
    let r = check(&base, &env, &["--config", c]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("rules.toml") && r.stderr.contains("not_a_category"));
}

// ---- helpers to write packs in tests

fn read_zip(path: &Path) -> Vec<(String, Vec<u8>)> {
    let f = std::fs::File::open(path).unwrap();
    let mut z = zip::ZipArchive::new(f).unwrap();
    let mut out = vec![];
    for i in 0..z.len() {
        let mut e = z.by_index(i).unwrap();
        let mut buf = vec![];
        std::io::Read::read_to_end(&mut e, &mut buf).unwrap();
        out.push((e.name().unwrap().to_string(), buf));
    }
    out
}

fn write_zip(path: &Path, entries: &[(String, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (n, b) in entries {
        z.start_file(n.as_str(), o).unwrap();
        z.write_all(b).unwrap();
    }
    z.finish().unwrap();
}

fn edit_json(entries: &mut [(String, Vec<u8>)], name: &str, f: impl FnOnce(&mut Value)) {
    let e = entries.iter_mut().find(|(n, _)| n == name).unwrap();
    let mut v: Value = serde_json::from_slice(&e.1).unwrap();
    f(&mut v);
    e.1 = serde_json::to_vec(&v).unwrap();
}

#[test]
fn npu_vs_gpu_differences_are_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let npu = tmp.path().join("npu.zip");
    let mut entries = read_zip(&td("base.zip"));
    edit_json(&mut entries, "manifest.json", |m| {
        m["device"] = "npu".into()
    });
    edit_json(&mut entries, "env.json", |e| {
        let vars = e["vars"].as_object_mut().unwrap();
        let dev = vars.remove("CUDA_VISIBLE_DEVICES").unwrap();
        vars.insert("ASCEND_RT_VISIBLE_DEVICES".into(), dev);
        let nccl = vars.remove("NCCL_DEBUG").unwrap();
        vars.insert("HCCL_DEBUG".into(), nccl);
        vars.insert("ASCEND_HOME_PATH".into(), "/usr/local/Ascend".into());
    });
    edit_json(&mut entries, "packages.json", |p| {
        let d = p["distributions"].as_object_mut().unwrap();
        d.retain(|k, _| !k.starts_with("nvidia-"));
        d.insert("torch_npu".into(), "2.15.0".into());
        let torch = d["torch"]
            .as_str()
            .unwrap()
            .split('+')
            .next()
            .unwrap()
            .to_string();
        d.insert("torch".into(), torch.clone().into());
        p["accelerator"]["torch"] = torch.into();
        p["accelerator"]["torch_npu"] = "2.15.0".into();
        p["accelerator"]["cann"] = "8.5.0".into();
        p["accelerator"]["cuda"] = Value::Null;
    });
    write_zip(&npu, &entries);
    let r = check(&td("base.zip"), &npu, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let j = r.json();
    assert_eq!(j["cross_platform"], true);
    assert_eq!(failing(&j), set(&[]), "{}", r.stdout);
    let items = j["items"].as_array().unwrap();
    let find = |name: &str| items.iter().find(|i| i["item"] == name).unwrap();
    let vis = find("CUDA_VISIBLE_DEVICES ↔ ASCEND_RT_VISIBLE_DEVICES");
    assert_eq!(vis["status"], "expected");
    assert_eq!(find("NCCL_DEBUG ↔ HCCL_DEBUG")["status"], "expected");
    assert_eq!(find("ASCEND_HOME_PATH")["status"], "expected");
    assert_eq!(find("torch-npu")["status"], "expected");
    assert_eq!(find("accelerator.cann")["status"], "expected");
    assert!(r.stdout.contains("GPU vs NPU"), "{}", r.stdout);

    // A real NPU-only difference still fails: a different numpy.
    edit_json(&mut entries, "packages.json", |p| {
        p["distributions"]["numpy"] = "1.0.0".into()
    });
    write_zip(&npu, &entries);
    let r = check(&td("base.zip"), &npu, &[]);
    assert_eq!(r.code, 1);
    assert_eq!(failing(&r.json()), set(&["packages"]));
}

// ---- hostile zips: each rejected with one line naming pack and entry, exit 2

fn expect_rejected(path: &Path, needles: &[&str]) {
    let r = check(path, &td("base.zip"), &[]);
    assert_eq!(r.code, 2, "{}: {}{}", path.display(), r.stdout, r.stderr);
    let line = r.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    for n in needles {
        assert!(line.contains(n), "{line} lacks {n}");
    }
    assert!(!r.out.join("config_check.json").exists());
}

/// Replaces `from` by `to` (same length) everywhere in the file's bytes.
fn patch(path: &Path, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut b = std::fs::read(path).unwrap();
    let mut i = 0;
    let mut n = 0;
    while i + from.len() <= b.len() {
        if &b[i..i + from.len()] == from {
            b[i..i + from.len()].copy_from_slice(to);
            n += 1;
        }
        i += 1;
    }
    assert!(n >= 2, "name in local and central headers");
    std::fs::write(path, b).unwrap();
}

/// Sets the uncompressed size of the (only) entry in the local and central headers.
fn patch_size(path: &Path, size: u32) {
    let mut b = std::fs::read(path).unwrap();
    let find = |b: &[u8], sig: &[u8]| b.windows(4).position(|w| w == sig).unwrap();
    let l = find(&b, b"PK\x03\x04");
    b[l + 22..l + 26].copy_from_slice(&size.to_le_bytes());
    let c = find(&b, b"PK\x01\x02");
    b[c + 24..c + 28].copy_from_slice(&size.to_le_bytes());
    std::fs::write(path, b).unwrap();
}

#[test]
fn hostile_path_traversal() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("trav.zip");
    write_zip(&p, &[("xx/evil.json".into(), b"{}".to_vec())]);
    patch(&p, b"xx/evil.json", b"../evil.json");
    expect_rejected(&p, &["../evil.json", "path traversal"]);
}

#[test]
fn hostile_absolute_path() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("abs.zip");
    write_zip(&p, &[("Xetc/passwd".into(), b"root".to_vec())]);
    patch(&p, b"Xetc/passwd", b"/etc/passwd");
    expect_rejected(&p, &["/etc/passwd", "absolute path"]);
}

#[test]
fn hostile_symlink() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("link.zip");
    let f = std::fs::File::create(&p).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o = zip::write::SimpleFileOptions::default();
    z.add_symlink("env.json", "/etc/shadow", o).unwrap();
    z.finish().unwrap();
    expect_rejected(&p, &["env.json", "symbolic link"]);
}

#[test]
fn hostile_too_many_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("many.zip");
    let entries: Vec<(String, Vec<u8>)> = (0..10_001).map(|i| (format!("f{i}"), vec![])).collect();
    let f = std::fs::File::create(&p).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (n, _) in &entries {
        z.start_file(n.as_str(), o).unwrap();
    }
    z.finish().unwrap();
    expect_rejected(&p, &["10001 entries", "10000"]);
}

#[test]
fn hostile_compression_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("ratio.zip");
    write_zip(&p, &[("env.json".into(), vec![b' '; 4 << 20])]);
    expect_rejected(&p, &["env.json", "compression ratio"]);
}

#[test]
fn hostile_declared_size() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("huge.zip");
    write_zip(&p, &[("env.json".into(), b"{}".to_vec())]);
    patch_size(&p, 0x4000_0000);
    expect_rejected(&p, &["env.json", "declares 1073741824 bytes"]);
}

#[test]
fn hostile_header_understates_size() {
    // The header says 100 bytes; the data inflates to 64 KiB: reading stops at the cap.
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("liar.zip");
    write_zip(&p, &[("env.json".into(), vec![b'a'; 64 << 10])]);
    patch_size(&p, 100);
    expect_rejected(&p, &["env.json"]);
}

#[test]
fn hostile_malformed_json() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("badjson.zip");
    let mut entries = read_zip(&td("base.zip"));
    let e = entries.iter_mut().find(|(n, _)| n == "env.json").unwrap();
    e.1 = b"{\"vars\": {\"A\": ".to_vec();
    write_zip(&p, &entries);
    expect_rejected(&p, &["env.json", "malformed JSON"]);
    // msprobe layout too.
    let p = tmp.path().join("badms.zip");
    write_zip(
        &p,
        &[
            ("env".into(), b"{}".to_vec()),
            ("random/rank0.json".into(), b"[1, 2".to_vec()),
        ],
    );
    expect_rejected(&p, &["random/rank0.json", "malformed JSON"]);
}

#[test]
fn not_a_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("plain.zip");
    std::fs::write(&p, b"not a zip at all").unwrap();
    expect_rejected(&p, &["not a zip archive"]);
    let p = tmp.path().join("other.zip");
    write_zip(&p, &[("readme.txt".into(), b"hi".to_vec())]);
    expect_rejected(&p, &["not a config pack"]);
    let r = check(&tmp.path().join("missing.zip"), &td("base.zip"), &[]);
    assert_eq!(r.code, 2);
    let p = tmp.path().join("future.zip");
    let mut entries = read_zip(&td("base.zip"));
    edit_json(&mut entries, "manifest.json", |m| m["version"] = 3.into());
    write_zip(&p, &entries);
    expect_rejected(&p, &["version 3"]);
}

// ---- config-pack

fn safetensors_file(path: &Path) -> Vec<u8> {
    let data: Vec<u8> = [1.0f32, -2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let header = serde_json::json!({
        "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    })
    .to_string();
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&data);
    std::fs::write(path, &b).unwrap();
    data
}

fn has_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn config_pack_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("model.safetensors");
    let data = safetensors_file(&st);
    let pack = tmp.path().join("sub/pack.zip");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probe"));
    cmd.arg("config-pack")
        .arg("-o")
        .arg(&pack)
        .arg("--weights")
        .arg(&st);
    let py = has_python();
    if py {
        cmd.arg("--python").arg("python3");
    }
    let o = cmd.env("MY_API_TOKEN", "s3cret").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let entries = read_zip(&pack);
    let get = |n: &str| -> Value {
        serde_json::from_slice(&entries.iter().find(|(x, _)| x == n).unwrap().1).unwrap()
    };
    // Typed round trip of every entry through the library's format types.
    use probe::config_check::pack::{EnvDoc, ManifestDoc, PackagesDoc, RecordsDoc};
    let m: ManifestDoc = serde_json::from_value(get("manifest.json")).unwrap();
    assert_eq!((m.format.as_str(), m.version), ("probe-config-pack", 2));
    assert_eq!(serde_json::to_value(&m).unwrap(), get("manifest.json"));
    let env: EnvDoc = serde_json::from_value(get("env.json")).unwrap();
    assert!(env.redacted.contains(&"MY_API_TOKEN".to_string()));
    assert_eq!(
        env.vars["MY_API_TOKEN"],
        probe::config_check::pack::redact("s3cret")
    );
    assert!(
        !String::from_utf8_lossy(&entries.iter().find(|(n, _)| n == "env.json").unwrap().1)
            .contains("s3cret")
    );
    let pk: PackagesDoc = serde_json::from_value(get("packages.json")).unwrap();
    if py {
        assert!(!pk.distributions.is_empty());
        assert!(pk.python.is_some());
    }
    let w: RecordsDoc = serde_json::from_value(get("weights.json")).unwrap();
    assert_eq!(serde_json::to_value(&w).unwrap(), get("weights.json"));
    let fp = &w.records[0].fingerprint;
    assert_eq!(w.records[0].name, "w");
    assert_eq!(
        fp.sha256.as_deref(),
        Some(probe::config_check::pack::sha256_hex(&data).as_str())
    );
    assert_eq!(fp.shape, Some(vec![2, 2]));
    assert_eq!(fp.max.map(|s| s.0), Some(4.0));

    // The pack compares equal to itself, and reads against a training pack.
    let r = check(&pack, &pack, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.json()["verdict"], "pass");
    let r = check(&pack, &td("base.zip"), &["--fail-on", "never"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn report_matches_its_schema_outline() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/probe-config-check.v1.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let r = check(&td("base.zip"), &td("env.zip"), &[]);
    let j = r.json();
    for k in schema["required"].as_array().unwrap() {
        assert!(j.get(k.as_str().unwrap()).is_some(), "missing {k}");
    }
    assert_eq!(j["schema"], "probe-config-check.v1");
    let item_req = schema["$defs"]["item"]["required"].as_array().unwrap();
    for it in j["items"].as_array().unwrap() {
        for k in item_req {
            assert!(
                it.get(k.as_str().unwrap()).is_some(),
                "item lacks {k}: {it}"
            );
        }
    }
    let pack_schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/probe-config-pack.v2.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    // Every entry of a real pack is described by the pack schema.
    let props = pack_schema["properties"].as_object().unwrap();
    for (name, _) in read_zip(&td("base.zip")) {
        let key = name.trim_end_matches(".json");
        assert!(props.contains_key(key), "schema lacks {name}");
    }
}

#[test]
fn msprobe_own_workbook_has_the_env_columns_swapped() {
    // msprobe's result for the same A vs C packs puts C's value under bench_value: the reason
    // probe's env sheet is checked above to have A's (unset) value in the bench column.
    let mut wb: Xlsx<_> =
        calamine::open_workbook(td("msprobe/msprobe_result_A_vs_C_env.xlsx")).unwrap();
    let env = wb.worksheet_range("env").unwrap();
    let rows: Vec<Vec<String>> = env
        .rows()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect();
    assert_eq!(rows[0][2..4], ["bench_value", "cmp_value"]);
    assert_eq!(rows[1][0], "CUDA_LAUNCH_BLOCKING");
    assert_eq!(rows[1][2..4], ["1", "0"]);
}

#[test]
fn hostile_duplicate_entry_names() {
    // Two `env.json` entries: the zip crate would keep one of them silently.
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("dup.zip");
    let mut entries = read_zip(&td("base.zip"));
    let env = entries
        .iter()
        .find(|(n, _)| n == "env.json")
        .unwrap()
        .1
        .clone();
    entries.push(("env.jsoX".into(), env));
    write_zip(&p, &entries);
    patch(&p, b"env.jsoX", b"env.json");
    expect_rejected(&p, &["env.json", "duplicate name"]);
}

/// Secrets planted in `probe config-pack`'s environment: (variable, value, what must not
/// appear anywhere in the pack).
const PLANTED_ENV: &[(&str, &str, &str)] = &[
    ("DATABASE_URL", "postgres://u:PlantedPw1@h/db", "PlantedPw1"),
    (
        "PIP_INDEX_URL",
        "https://user:PlantedTok2@pypi.example/simple",
        "PlantedTok2",
    ),
    (
        "REDIS_URL",
        "redis://:PlantedRedis3@redis:6379/0",
        "PlantedRedis3",
    ),
    (
        "MLFLOW_TRACKING_URI",
        "https://ml:PlantedMl4@mlflow.example",
        "PlantedMl4",
    ),
    (
        "GITHUB_PAT",
        "github_pat_11PLANTED0fakeFAKEfake0123456789",
        "PLANTED0fake",
    ),
    (
        "SLACK_WEBHOOK",
        "https://hooks.slack.com/services/T0/B0/PlantedHook5",
        "PlantedHook5",
    ),
    (
        "ALERTS",
        "https://hooks.slack.com/services/T1/B1/PlantedHook6",
        "PlantedHook6",
    ),
    (
        "SOME_NOTE",
        "ghp_PLANTEDfake0123456789FAKEfake01234567",
        "PLANTEDfake01",
    ),
    ("HF_TOKEN", "PlantedHf7", "PlantedHf7"),
];

#[test]
fn config_pack_keeps_no_planted_secret() {
    for mode in ["hash", "drop"] {
        let tmp = tempfile::tempdir().unwrap();
        let pack = tmp.path().join("pack.zip");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_probe"));
        cmd.args(["config-pack", "--redact", mode, "-o"]).arg(&pack);
        for (k, v, _) in PLANTED_ENV {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let entries = read_zip(&pack);
        assert!(entries.iter().any(|(n, _)| n == "env.json"));
        for (name, bytes) in &entries {
            let text = String::from_utf8_lossy(bytes);
            for (_, _, s) in PLANTED_ENV {
                assert!(!text.contains(s), "{s} in {name} ({mode})");
            }
            if mode == "drop" {
                assert!(!text.contains("<redacted:sha256:"), "{name}");
            }
        }
        let env: Value =
            serde_json::from_slice(&entries.iter().find(|(n, _)| n == "env.json").unwrap().1)
                .unwrap();
        let redacted: Vec<&str> = env["redacted"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        for (k, _, _) in PLANTED_ENV {
            assert!(redacted.contains(k), "{k} not listed as redacted ({mode})");
        }
        let want = match mode {
            "hash" => probe::config_check::pack::redact("PlantedPw1"),
            _ => "<redacted>".into(),
        };
        assert_eq!(
            env["vars"]["DATABASE_URL"],
            format!("postgres://u:{want}@h/db")
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .args(["config-pack", "--redact", "none", "-o", "x.zip"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected hash or drop"));
}

/// Raw secrets as an msprobe pack (or a pack from an older probe) carries them.
const RAW: &[&str] = &[
    "RawPw1",
    "RawTok2",
    "RAWfake0123456789",
    "RawHook3",
    "RawArg4",
    "RawArg5",
    "RawArgs6",
    "RawArgs7",
    "RawMs8",
    "RawMs9",
    "RawMsEnv10",
    "RawArg11",
    "RawArg12",
];

fn assert_no_raw(r: &Run, what: &str) {
    let mut texts = vec![
        ("stdout".to_string(), r.stdout.clone()),
        ("stderr".to_string(), r.stderr.clone()),
        (
            "config_check.json".to_string(),
            std::fs::read_to_string(r.out.join("config_check.json")).unwrap(),
        ),
    ];
    for (n, b) in read_zip(&r.out.join("config_check.xlsx")) {
        texts.push((
            format!("config_check.xlsx:{n}"),
            String::from_utf8_lossy(&b).into(),
        ));
    }
    for (name, text) in &texts {
        for s in RAW {
            assert!(!text.contains(s), "{s} in {name} ({what})");
        }
    }
}

#[test]
fn config_check_redacts_raw_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    // A probe pack holding raw secrets in env, argv and args (as an older probe wrote).
    let raw_probe = tmp.path().join("raw_probe.zip");
    let mut entries = read_zip(&td("base.zip"));
    edit_json(&mut entries, "env.json", |e| {
        let v = &mut e["vars"];
        v["DATABASE_URL"] = "postgres://u:RawPw1@h/db".into();
        v["PIP_INDEX_URL"] = "https://user:RawTok2@pypi.example/simple".into();
        v["SOME_NOTE"] = "ghp_RAWfake0123456789FAKEfake0123456789ab".into();
        v["SLACK_WEBHOOK"] = "https://hooks.slack.com/services/T0/B0/RawHook3".into();
        // Legacy digest of the same value base.zip holds: must still compare equal.
        v["LEGACY_TOKEN"] = format!(
            "sha256:{}",
            probe::config_check::pack::sha256_hex(b"RawLegacy")
        )
        .into();
    });
    edit_json(&mut entries, "hyperparameters.json", |h| {
        h["argv"] = serde_json::json!([
            "train.py",
            "--token",
            "RawArg4",
            "--password=RawArg5",
            // mysql's attached password, curl's user:password
            "-pRawArg11",
            "-u",
            "me:RawArg12"
        ]);
        h["args"]["hf_token"] = "RawArgs6".into();
        h["args"]["db"] = serde_json::json!({"url": "mysql://root:RawArgs7@db/x"});
    });
    write_zip(&raw_probe, &entries);
    // The same legacy variable, raw, on the other side.
    let base2 = tmp.path().join("base2.zip");
    let mut entries = read_zip(&td("base.zip"));
    edit_json(&mut entries, "env.json", |e| {
        e["vars"]["LEGACY_TOKEN"] = "RawLegacy".into();
    });
    write_zip(&base2, &entries);
    let r = check(&base2, &raw_probe, &[]);
    assert!(r.code == 0 || r.code == 1, "{}{}", r.stdout, r.stderr);
    assert_no_raw(&r, "probe pack");
    assert!(!r.stdout.contains("RawLegacy"));
    let j = r.json();
    let item = |cat: &str, name: &str| -> Value {
        j["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["category"] == cat && i["item"] == name)
            .unwrap_or_else(|| panic!("{cat} {name}"))
            .clone()
    };
    assert_eq!(item("env", "LEGACY_TOKEN")["status"], "pass");
    let m = probe::config_check::pack::redact;
    assert_eq!(
        item("env", "DATABASE_URL")["cmp"],
        format!("postgres://u:{}@h/db", m("RawPw1"))
    );
    assert_eq!(
        item("hyperparameters", "args.hf_token")["cmp"],
        m("RawArgs6")
    );
    assert!(item("hyperparameters", "argv")["cmp"]
        .as_str()
        .unwrap()
        .contains(&m("RawArg4")));

    // An msprobe pack with raw secrets in env and hyperparameters.
    let raw_ms = tmp.path().join("raw_ms.zip");
    let mut entries = read_zip(&td("msprobe/A_bench.zip"));
    edit_json(&mut entries, "env", |e| {
        e["HF_TOKEN"] = "RawMsEnv10".into();
        e["DATABASE_URL"] = "postgres://u:RawPw1@h/db".into();
    });
    edit_json(
        &mut entries,
        "hyperparameters/hyperparameters_static.json",
        |h| {
            h["api_key"] = "RawMs8".into();
            h["push_to"] = "https://x:RawMs9@github.com/o/r".into();
        },
    );
    write_zip(&raw_ms, &entries);
    for (b, c) in [(&raw_ms, &td("msprobe/A_bench.zip")), (&raw_ms, &raw_probe)] {
        let r = check(b, c, &[]);
        assert!(r.code == 0 || r.code == 1, "{}{}", r.stdout, r.stderr);
        assert_no_raw(&r, "msprobe pack");
    }
    let r = check(&raw_ms, &td("msprobe/A_bench.zip"), &[]);
    assert!(r.stdout.contains("<redacted:sha256:"), "{}", r.stdout);
}

/// A fake PEM private key of 848 base64 characters (issue 53 item 6: 267 of them stayed
/// raw, in the pack and in config-check's json, xlsx and html).
fn fake_pem() -> (String, Vec<String>) {
    let mut state = 53u64;
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let body: String = (0..848)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            alphabet[(state >> 58) as usize] as char
        })
        .collect();
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    // Every 12-character piece of the body: none may appear anywhere.
    let pieces = (0..body.len() - 12)
        .step_by(12)
        .map(|i| body[i..i + 12].to_string())
        .collect();
    (pem, pieces)
}

#[test]
fn a_private_key_in_the_environment_is_redacted_whole_in_the_pack_and_every_report() {
    let tmp = tempfile::tempdir().unwrap();
    let (pem, pieces) = fake_pem();
    let pack = tmp.path().join("pack.zip");
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .args(["config-pack", "-q", "-o"])
        .arg(&pack)
        .env("TLS_MATERIAL", &pem)
        .env("DEPLOY_NOTES", format!("key below\n{pem}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut texts: Vec<(String, String)> = read_zip(&pack)
        .into_iter()
        .map(|(n, b)| (n, String::from_utf8_lossy(&b).into_owned()))
        .collect();
    let out = tmp.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .args(["config-check", "-q", "-o"])
        .arg(&out)
        .arg(&pack)
        .arg(&pack)
        .output()
        .unwrap();
    assert!(
        o.status.code().is_some_and(|c| c < 2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for name in ["config_check.json", "config_check.html"] {
        texts.push((
            name.into(),
            std::fs::read_to_string(out.join(name)).unwrap(),
        ));
    }
    for (n, b) in read_zip(&out.join("config_check.xlsx")) {
        texts.push((
            format!("xlsx:{n}"),
            String::from_utf8_lossy(&b).into_owned(),
        ));
    }
    for (name, text) in &texts {
        for p in &pieces {
            assert!(!text.contains(p.as_str()), "{p} of the key in {name}");
        }
    }
    assert!(texts
        .iter()
        .any(|(_, t)| t.contains("BEGIN") || t.contains("<redacted")));
}

#[test]
fn a_pack_of_millions_of_variables_is_refused_in_bounded_memory() {
    // Issue 53 item 9: a 5 MB pack of 2 M environment variables peaked at 3.35 GB and
    // aborted under a 4 GiB address-space limit. It is refused, naming the cap, under 1 GiB
    // of address space; a pack of 20,000 variables is still compared.
    let tmp = tempfile::tempdir().unwrap();
    let manifest = br#"{"format":"probe-config-pack","version":1,"framework":"pytorch","entries":["env.json"]}"#;
    let env = |n: usize| {
        let mut s = String::from("{\"redacted\":[],\"vars\":{");
        for i in 0..n {
            if i > 0 {
                s.push(',');
            }
            s += &format!("\"V{i}\":\"x\"");
        }
        s + "}}"
    };
    for (n, ok) in [(2_000_000usize, false), (20_000, true)] {
        let pack = tmp.path().join(format!("p{n}.zip"));
        write_zip(
            &pack,
            &[
                ("manifest.json".into(), manifest.to_vec()),
                ("env.json".into(), env(n).into_bytes()),
            ],
        );
        let script = format!(
            "ulimit -v {}; exec timeout 120 {} config-check -q -o {} {} {}",
            1 << 20,
            env!("CARGO_BIN_EXE_probe"),
            tmp.path().join(format!("out{n}")).display(),
            pack.display(),
            pack.display()
        );
        let o = Command::new("sh").args(["-c", &script]).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        if ok {
            assert_eq!(o.status.code(), Some(0), "{n}: {stderr}");
        } else {
            assert_eq!(o.status.code(), Some(2), "{n}: {stderr}");
            assert!(stderr.contains("more than 250000 items"), "{stderr}");
            assert!(stderr.contains("env.json"), "{stderr}");
        }
    }
}

/// `probe config-pack` once per rank, as a launcher runs it: the rank and world size
/// from `RANK`/`WORLD_SIZE` (not `LOCAL_RANK`), so the packs read as one job; the flags
/// override the variables; values that are no rank are a one-line usage error.
#[test]
fn config_pack_takes_the_launchers_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("model.safetensors");
    safetensors_file(&st);
    let pack = |name: &str, env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_probe"));
        cmd.args(["config-pack", "-q", "--weights"])
            .arg(&st)
            .arg("-o")
            .arg(tmp.path().join(name))
            .args(args)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .env("TORCHELASTIC_RUN_ID", "job-1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    for r in 0..4 {
        let (rank, local) = (r.to_string(), (r % 2).to_string());
        let env = [
            ("RANK", &*rank),
            ("LOCAL_RANK", &*local),
            ("WORLD_SIZE", "4"),
        ];
        let o = pack(&format!("job/rank{r}.zip"), &env, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let manifest = |name: &str| -> Value {
        let entries = read_zip(&tmp.path().join(name));
        let m = &entries
            .iter()
            .find(|(n, _)| n == "manifest.json")
            .unwrap()
            .1;
        serde_json::from_slice(m).unwrap()
    };
    let m = manifest("job/rank3.zip");
    assert_eq!(
        (m["rank"].clone(), m["world_size"].clone()),
        (3.into(), 4.into())
    );
    let entries = read_zip(&tmp.path().join("job/rank3.zip"));
    let w: Value =
        serde_json::from_slice(&entries.iter().find(|(n, _)| n == "weights.json").unwrap().1)
            .unwrap();
    assert_eq!(w["records"][0]["rank"], 3);
    let job = tmp.path().join("job");
    let r = check(&job, &job, &[]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.json()["ranks"]["compared"], "0-3");

    // The flags win over the variables.
    let env = [("RANK", "1"), ("WORLD_SIZE", "2")];
    let o = pack("flags.zip", &env, &["--rank", "5", "--world-size", "8"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = manifest("flags.zip");
    assert_eq!(
        (m["rank"].clone(), m["world_size"].clone()),
        (5.into(), 8.into())
    );

    for (env, args, needle) in [
        (vec![("RANK", "two")], vec![], "$RANK=\"two\": not a rank"),
        (vec![("RANK", "-1")], vec![], "$RANK=\"-1\": not a rank"),
        (
            vec![("RANK", "4"), ("WORLD_SIZE", "4")],
            vec![],
            "rank 4 is not below the world size 4",
        ),
        (
            vec![("WORLD_SIZE", "0")],
            vec![],
            "$WORLD_SIZE=\"0\": not a world size",
        ),
        (
            vec![],
            vec!["--rank", "2", "--world-size", "2"],
            "rank 2 is not below the world size 2",
        ),
        (vec![], vec!["--world-size", "0"], "--world-size 0"),
    ] {
        let o = pack("bad.zip", &env, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{env:?} {args:?}: {err}");
        assert!(
            err.contains(needle) && err.trim().lines().count() == 1,
            "{err}"
        );
        assert!(!tmp.path().join("bad.zip").exists());
    }
}
