//! `probe replay` (docs/replay.md): every argument and path checked before any work, the
//! Python found or refused with one line, the delegation to `python -m probe.replay` by its
//! contract (a shim Python that records its arguments stands in for the replay engine), the
//! compare's first divergent op as the default, and `recapture.json` where the dumps lack
//! the op's tensors (from compare and from replay).

use crate::common;

use common::{assert_input_error, synth, Out};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs probe in `cwd` with extra environment variables (and PROBE_PYTHON removed unless
/// given).
fn probe_env(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_probe"));
    c.current_dir(cwd).args(args).env_remove("PROBE_PYTHON");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run probe");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn run(cwd: &Path, args: &[&str]) -> Out {
    probe_env(cwd, args, &[])
}

/// An executable script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A stand-in for a Python with torch and probe: passes the import check (the `-c` code
/// that looks for the modules), then writes its arguments one per line into `argv.txt`
/// (beside it), says a verdict line and exits with `$SHIM_CODE` (default 1: reproduces).
fn shim(dir: &Path) -> PathBuf {
    let log = dir.join("argv.txt");
    script(
        dir,
        "shim-python",
        &format!(
            "#!/bin/sh\ncase \"$2\" in *find_spec*) echo probe-replay-ok; exit 0;; esac\n\
             printf '%s\\n' \"$@\" > '{}'\necho 'REPRODUCES: shim'\nexit ${{SHIM_CODE:-1}}\n",
            log.display()
        ),
    )
}

fn argv(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("argv.txt"))
        .expect("the shim ran")
        .lines()
        .map(String::from)
        .collect()
}

/// A tensor-mode pair whose comparison perturbs gelu.1 (the first divergent op).
fn tensor_pair(dir: &Path) {
    synth(&dir.join("t"), &["--inject", "Functional.gelu.1"]);
}

/// The same in statistics mode.
fn stats_pair(dir: &Path) {
    synth(
        &dir.join("s"),
        &["--mode", "statistics", "--inject", "Functional.gelu.1"],
    );
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn arguments_and_paths_are_checked_before_any_work() {
    let d = tmp();
    let p = d.path();
    tensor_pair(p);
    let py = shim(p);
    let py = py.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["-o", "r"], "give the dumps"),
        (&["-b", "t/bench", "-o", "r"], "both -b and -c"),
        (
            &["-b", "t/bench", "-c", "t/cmp", "-o", "nowhere/r"],
            "does not exist",
        ),
        (
            &["-b", "t/bench", "-c", "missing", "-o", "r"],
            "no such file",
        ),
        (&["--from", "t", "-o", "r"], "not a compare's output folder"),
        (&["--from", "absent", "-o", "r"], "no such file"),
        (
            &["-b", "t/bench", "-c", "t/cmp", "--op=-x", "-o", "r"],
            "not an op key",
        ),
        (
            &["-b", "t/bench", "-c", "t/cmp", "--rtol=-1", "-o", "r"],
            "--rtol",
        ),
        (
            &[
                "-b",
                "t/bench",
                "-c",
                "t/cmp",
                "--prelude",
                "nope.py",
                "-o",
                "r",
            ],
            "nope.py",
        ),
        (
            &["-b", "t/bench", "-c", "t/cmp", "-o", "t/bench/r"],
            "inside the input dump",
        ),
    ];
    for (args, needle) in cases {
        let mut a = vec!["replay", "--python", py];
        a.extend_from_slice(args);
        let o = run(p, &a);
        assert_input_error(&o, 2, needle);
        assert!(!p.join("argv.txt").exists(), "{args:?} ran the Python");
        assert!(!p.join("r").exists(), "{args:?} wrote its output");
    }
    // -o naming a file.
    std::fs::write(p.join("file"), "").unwrap();
    let o = run(
        p,
        &[
            "replay", "-b", "t/bench", "-c", "t/cmp", "-o", "file", "--python", py,
        ],
    );
    assert_input_error(&o, 2, "not a directory");
    // --from a scan's output folder: a summary.json of another kind.
    let s = run(p, &["scan", "t/cmp", "-o", "scanned", "--format", "json"]);
    assert!(s.code == 0 || s.code == 1, "{}", s.stderr);
    let o = run(
        p,
        &["replay", "--from", "scanned", "-o", "r", "--python", py],
    );
    assert_input_error(&o, 2, "not a probe-compare-summary");
}

#[test]
fn a_python_that_cannot_replay_is_refused_in_one_line_naming_it() {
    let d = tmp();
    let p = d.path();
    tensor_pair(p);
    let not_python = script(p, "not-python", "#!/bin/sh\nexit 0\n");
    let no_torch = script(
        p,
        "no-torch",
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n",
    );
    for (py, needle) in [
        (&not_python, "not a Python that imports torch"),
        (&no_torch, "No module named 'torch'"),
    ] {
        let py = py.to_str().unwrap();
        let o = run(
            p,
            &[
                "replay", "-b", "t/bench", "-c", "t/cmp", "-o", "r", "--python", py,
            ],
        );
        assert_input_error(&o, 2, needle);
        assert!(
            o.stderr.contains(py) && o.stderr.contains("--python"),
            "{}",
            o.stderr
        );
        // Refused before the compare: nothing was compared.
        assert!(!o.stderr.contains("comparing"), "{}", o.stderr);
    }
    // $PROBE_PYTHON is the one tried when there is no --python.
    let o = probe_env(
        p,
        &["replay", "-b", "t/bench", "-c", "t/cmp", "-o", "r"],
        &[("PROBE_PYTHON", no_torch.to_str().unwrap())],
    );
    assert_input_error(&o, 2, "(PROBE_PYTHON)");
    // A path that does not exist.
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "-o",
            "r",
            "--python",
            "no/such/python",
        ],
    );
    assert_input_error(&o, 2, "cannot run it");
}

#[test]
fn the_first_divergent_op_is_handed_to_the_python_by_its_contract() {
    let d = tmp();
    let p = d.path();
    tensor_pair(p);
    let py = shim(p);
    let py = py.to_str().unwrap();
    let prelude = p.join("prelude.py");
    std::fs::write(&prelude, "").unwrap();
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "-o",
            "r",
            "--python",
            py,
            "--device",
            "cpu",
            "--prelude",
            "prelude.py",
            "--atol",
            "0.001",
        ],
    );
    assert_eq!(o.code, 1, "the Python's exit code: {}", o.stderr);
    assert!(
        o.stdout.contains("REPRODUCES: shim"),
        "stdout passed through: {}",
        o.stdout
    );
    let got = argv(p);
    // `python -c CODE`: the current folder off sys.path, then the engine (issue 70).
    assert_eq!(got[0], "-c");
    assert_eq!(
        got[1],
        "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; \
         from probe.replay.cli import main; sys.exit(main())"
    );
    assert_eq!(
        got[2..],
        [
            "--bench",
            "t/bench",
            "--cmp",
            "t/cmp",
            "--op",
            "Functional.gelu.1.forward",
            "-o",
            "r",
            "--device",
            "cpu",
            "--prelude",
            "prelude.py",
            "--step",
            "0",
            "--rank",
            "0",
            "--atol",
            "0.001",
        ]
    );
    // Every exit code of the replay's is probe's.
    for code in ["0", "2", "3"] {
        let o = probe_env(
            p,
            &[
                "replay", "-b", "t/bench", "-c", "t/cmp", "-o", "r", "--python", py,
            ],
            &[("SHIM_CODE", code)],
        );
        assert_eq!(o.code.to_string(), code, "{}", o.stderr);
    }
    // Another is an error of probe's, exit 2.
    let o = probe_env(
        p,
        &[
            "replay", "-b", "t/bench", "-c", "t/cmp", "-o", "r", "--python", py,
        ],
        &[("SHIM_CODE", "9")],
    );
    assert_input_error(&o, 2, "exited with status 9");
    // So is a Python killed by a signal.
    let killed = script(
        p,
        "killed-python",
        "#!/bin/sh\ncase \"$2\" in *find_spec*) echo probe-replay-ok; exit 0;; esac\nkill -9 $$\n",
    );
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "-o",
            "r",
            "--python",
            killed.to_str().unwrap(),
        ],
    );
    assert_input_error(&o, 2, "killed by signal 9");
}

#[test]
fn ops_given_and_from_a_compare() {
    let d = tmp();
    let p = d.path();
    tensor_pair(p);
    let py = shim(p);
    let py = py.to_str().unwrap();
    // --op: no compare; the dump's one step and rank.
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "--op",
            "Functional.gelu.0.forward",
            "--op",
            "Functional.linear.1.forward",
            "-o",
            "r",
            "--python",
            py,
        ],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(!o.stderr.contains("comparing"), "{}", o.stderr);
    let a = argv(p);
    let ops: Vec<&str> = a
        .windows(2)
        .filter(|w| w[0] == "--op")
        .map(|w| w[1].as_str())
        .collect();
    assert_eq!(
        ops,
        ["Functional.gelu.0.forward", "Functional.linear.1.forward"]
    );
    // --from: the compare's dumps and its first divergent op.
    let c = run(p, &["compare", "-b", "t/bench", "-c", "t/cmp", "-o", "out"]);
    assert_eq!(c.code, 1, "{}", c.stderr);
    assert!(
        !p.join("out/recapture.json").exists(),
        "tensors were dumped"
    );
    std::fs::remove_file(p.join("argv.txt")).unwrap();
    let o = run(p, &["replay", "--from", "out", "-o", "r", "--python", py]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(!o.stderr.contains("comparing"), "{}", o.stderr);
    let a = argv(p);
    assert_eq!(
        a[2..9],
        [
            "--bench",
            "t/bench",
            "--cmp",
            "t/cmp",
            "--op",
            "Functional.gelu.1.forward",
            "-o"
        ]
    );
    // --from with the dumps moved: -b/-c say where they are now.
    std::fs::rename(p.join("t"), p.join("moved")).unwrap();
    let o = run(p, &["replay", "--from", "out", "-o", "r", "--python", py]);
    assert_input_error(&o, 2, "give -b and -c");
    let o = run(
        p,
        &[
            "replay",
            "--from",
            "out",
            "-b",
            "moved/bench",
            "-c",
            "moved/cmp",
            "-o",
            "r",
            "--python",
            py,
        ],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(argv(p).contains(&"moved/cmp".to_string()));
}

#[test]
fn nothing_to_replay_without_a_divergent_op() {
    let d = tmp();
    let p = d.path();
    synth(&p.join("t"), &[]);
    let py = shim(p);
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "-o",
            "r",
            "--python",
            py.to_str().unwrap(),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with("nothing to replay: no divergent op"),
        "{}",
        o.stdout
    );
    assert!(!p.join("argv.txt").exists());
}

#[test]
fn compare_writes_recapture_json_when_the_first_divergent_op_has_no_tensors() {
    let d = tmp();
    let p = d.path();
    stats_pair(p);
    let o = run(p, &["compare", "-b", "s/bench", "-c", "s/cmp", "-o", "out"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let text = std::fs::read_to_string(p.join("out/recapture.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["mode"], "tensor");
    assert_eq!(r["steps"], serde_json::json!([0]));
    assert_eq!(r["ranks"], serde_json::json!([0]));
    assert_eq!(r["level"], "api");
    assert_eq!(r["include"], serde_json::json!(["Functional.gelu.1"]));
    assert_eq!(
        r["$replay"]["ops"],
        serde_json::json!(["Functional.gelu.1.forward"])
    );
    assert_eq!(r["$msprobe"]["task"], "tensor");
    assert_eq!(
        r["$msprobe"]["tensor"]["list"],
        serde_json::json!(["Functional.gelu.1.forward"])
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("out/summary.json")).unwrap())
            .unwrap();
    assert_eq!(s["recapture"]["path"], "out/recapture.json");
    assert_eq!(
        s["recapture"]["ops"],
        serde_json::json!(["Functional.gelu.1.forward"])
    );
    assert!(
        o.stdout.contains("recapture: out/recapture.json")
            && o.stdout.contains("PROBE_CONFIG=out/recapture.json")
            && o.stdout.contains("--op Functional.gelu.1.forward"),
        "{}",
        o.stdout
    );
    // A tensor-mode pair: no recapture.
    tensor_pair(p);
    let o = run(
        p,
        &["compare", "-b", "t/bench", "-c", "t/cmp", "-o", "tout"],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(!p.join("tout/recapture.json").exists());
    assert!(!o.stdout.contains("recapture"), "{}", o.stdout);
}

#[test]
fn replay_of_ops_the_dumps_lack_writes_recapture_json_and_runs_no_python() {
    let d = tmp();
    let p = d.path();
    stats_pair(p);
    // No Python needed to say so: this one cannot replay anything.
    let no_torch = script(p, "no-torch", "#!/bin/sh\nexit 1\n");
    let py = no_torch.to_str().unwrap();
    let o = run(
        p,
        &[
            "replay", "-b", "s/bench", "-c", "s/cmp", "-o", "r", "--python", py,
        ],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stdout
            .contains("not replayable: Functional.gelu.1.forward (step0/rank0)"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("PROBE_CONFIG=r/recapture.json"),
        "{}",
        o.stdout
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("r/recapture.json")).unwrap())
            .unwrap();
    assert_eq!(r["include"], serde_json::json!(["Functional.gelu.1"]));
    assert_eq!(r["mode"], "tensor");
    // --from a statistics compare, too.
    let c = run(p, &["compare", "-b", "s/bench", "-c", "s/cmp", "-o", "out"]);
    assert_eq!(c.code, 1);
    let o = run(p, &["replay", "--from", "out", "-o", "r2", "--python", py]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(p.join("r2/recapture.json").is_file());
    // An op outside the dump (a tensor pair): recaptured in its step and rank.
    tensor_pair(p);
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "--op",
            "Functional.softmax.7.forward",
            "--step",
            "0",
            "--rank",
            "0",
            "-o",
            "r3",
            "--python",
            py,
        ],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stdout.contains("outside the dumped"), "{}", o.stdout);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("r3/recapture.json")).unwrap())
            .unwrap();
    assert_eq!(r["include"], serde_json::json!(["Functional.softmax.7"]));
    // A step the dump does not hold.
    let o = run(
        p,
        &[
            "replay",
            "-b",
            "t/bench",
            "-c",
            "t/cmp",
            "--op",
            "Functional.gelu.1.forward",
            "--step",
            "4",
            "-o",
            "r4",
            "--python",
            py,
        ],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stdout.contains("(step4/rank0)"), "{}", o.stdout);
}

#[test]
fn an_op_key_through_another_module_is_refused_before_any_python_runs() {
    // issue 70: a key's name is data; the Python's allow-list is the guarantee, this is
    // probe's early refusal (docs/replay.md, "Only operators").
    let d = tmp();
    let p = d.path();
    tensor_pair(p);
    let py = shim(p);
    let py = py.to_str().unwrap();
    for op in [
        "Torch.os.system.0.forward",
        "Functional.torch.os.system.0.forward",
        "Torch.nn.functional.torch.0.forward",
        "Aten.__getattr__.0.forward",
        "Aten.add.Tensor.__call__.0.forward",
        "VF.__class__.0.backward",
        "Tensor.add.__globals__.0.forward",
        "NPU.os.system.0.forward",
    ] {
        let o = run(
            p,
            &[
                "replay", "--python", py, "-b", "t/bench", "-c", "t/cmp", "--op", op, "-o", "r",
            ],
        );
        assert_input_error(&o, 2, "not an operator a replay may run");
        assert!(o.stderr.contains(op), "{op}: {}", o.stderr);
        assert!(!p.join("argv.txt").exists(), "{op} ran the Python");
        assert!(!p.join("r").exists(), "{op} wrote its output");
    }
    // Names of operators pass on to the Python (which holds the list): a listed namespace,
    // an ATen overload, a Tensor operator method.
    for op in [
        "Torch.linalg.vector_norm.0.forward",
        "Aten.add.Tensor.0.forward",
        "Tensor.__add__.0.forward",
    ] {
        let o = run(
            p,
            &[
                "replay", "--python", py, "-b", "t/bench", "-c", "t/cmp", "--op", op, "-o", "r",
            ],
        );
        assert!(!o.stderr.contains("not an operator"), "{op}: {}", o.stderr);
    }
}
