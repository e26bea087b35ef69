//! Issue 70 item 2: what an output folder's own `.probe-current` link can make probe do,
//! through the real binary on folders laid out here: never remove anything outside `-o`.
//! (A kill over an older probe's reports, item 9, is in `tests/hostile.rs`.)

use crate::common;
use common::*;
use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
use std::path::Path;

/// A one-tensor safetensors checkpoint.
fn checkpoint(path: &Path, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![values.len()], &bytes).unwrap();
    serialize_to_file(vec![("w".to_string(), view)], None, path).unwrap();
}

/// Each command that writes a report set, as arguments whose `-o` is `OUT`, with inputs
/// made in `cwd` that it accepts.
fn commands(cwd: &Path) -> Vec<(&'static str, Vec<String>)> {
    synth(&cwd.join("d"), &["--ranks", "2"]);
    for (i, shard) in ["0/2", "1/2"].iter().enumerate() {
        let b = cwd.join("d/bench");
        let c = cwd.join("d/cmp");
        let o = compare_paths(&b, &c, &cwd.join(format!("s{i}")), &["--shard", shard]);
        assert!(o.code <= 1, "shard {shard}: {}", o.stderr);
    }
    checkpoint(&cwd.join("a.safetensors"), &[1.0, 2.0]);
    checkpoint(&cwd.join("b.safetensors"), &[1.0, 2.5]);
    let pack = root().join("testdata/config_check/base.zip");
    let pack = pack.to_str().unwrap();
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        (
            "compare",
            s(&["compare", "-b", "d/bench", "-c", "d/cmp", "-o", "OUT"]),
        ),
        ("scan", s(&["scan", "d/cmp", "-o", "OUT"])),
        ("merge", s(&["merge", "s0", "s1", "-o", "OUT"])),
        (
            "config-check",
            s(&["config-check", pack, pack, "-o", "OUT"]),
        ),
        (
            "ckpt-compare",
            s(&[
                "ckpt-compare",
                "a.safetensors",
                "b.safetensors",
                "-o",
                "OUT",
            ]),
        ),
    ]
}

fn run_in(cwd: &Path, args: &[String], out: &str) -> Out {
    let args: Vec<&str> = args
        .iter()
        .map(|a| if a == "OUT" { out } else { a.as_str() })
        .collect();
    probe_in(cwd, &args)
}

#[test]
fn a_current_link_out_of_the_folder_removes_nothing_outside_it() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    for (name, args) in commands(cwd) {
        // Each command first runs on a clean folder: it writes reports there.
        let clean = format!("clean-{name}");
        let o = run_in(cwd, &args, &clean);
        assert!(o.code <= 1, "{name} on a clean folder: {}", o.stderr);
        assert!(
            cwd.join(&clean).join(".probe-current").is_symlink(),
            "{name}"
        );
        // The crafted folder: `.probe-current -> .probe-reports-x/../../victim-NAME`, which
        // resolves to a folder beside it.
        let out = cwd.join(format!("out-{name}"));
        std::fs::create_dir_all(out.join(".probe-reports-x")).unwrap();
        let target = format!(".probe-reports-x/../../victim-{name}");
        std::os::unix::fs::symlink(&target, out.join(".probe-current")).unwrap();
        let victim = cwd.join(format!("victim-{name}"));
        std::fs::create_dir_all(victim.join("sub")).unwrap();
        std::fs::write(victim.join("keep.txt"), b"precious").unwrap();
        std::fs::write(victim.join("sub/also.txt"), b"also").unwrap();
        assert!(out.join(".probe-current").is_dir(), "the link resolves");

        let o = run_in(cwd, &args, &format!("out-{name}"));
        assert_input_error(&o, 2, ".probe-current");
        assert!(o.stderr.contains("refused"), "{name}: {}", o.stderr);
        assert_eq!(std::fs::read(victim.join("keep.txt")).unwrap(), b"precious");
        assert_eq!(std::fs::read(victim.join("sub/also.txt")).unwrap(), b"also");
        assert_eq!(
            std::fs::read_link(out.join(".probe-current")).unwrap(),
            Path::new(&target),
            "{name} changed the link"
        );
    }
}

#[test]
fn a_current_link_to_a_link_or_a_bad_name_is_refused_and_removes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path();
    synth(cwd, &[]);
    let victim = cwd.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), b"precious").unwrap();
    let abs = victim.to_str().unwrap().to_string();
    let host = ".probe-reports-h-1-2";
    // (the link's target, a folder-level link to make beside it)
    let cases: [(&str, Option<(&str, &str)>); 4] = [
        (&abs, None),
        ("../victim", None),
        (host, Some((host, "../victim"))),
        (".probe-reports-h-1-2/..", None),
    ];
    for (i, (target, extra)) in cases.iter().enumerate() {
        let out = cwd.join(format!("out{i}"));
        std::fs::create_dir(&out).unwrap();
        if let Some((at, to)) = extra {
            std::os::unix::fs::symlink(to, out.join(at)).unwrap();
        }
        std::os::unix::fs::symlink(target, out.join(".probe-current")).unwrap();
        let o = compare_to(cwd, &format!("out{i}"), &["-q"]);
        assert_input_error(&o, 2, ".probe-current");
        assert_eq!(std::fs::read(victim.join("keep.txt")).unwrap(), b"precious");
        assert!(
            !out.join("summary.json").exists(),
            "{target}: a report was written"
        );
    }
}
