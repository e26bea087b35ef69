//! Helpers shared by the integration tests: run the real `probe` binary on real files.
#![allow(dead_code)]

pub mod dumps;

use probe::dump::OpKey;
use probe::schema::dump::{ManifestRecord, OpRecord, Stat, StatsRecord, TensorRecord};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Out {
    fn from(o: std::process::Output) -> Self {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

pub fn probe(args: &[&str]) -> Out {
    probe_in(Path::new("."), args)
}

/// Runs probe in `cwd` (relative dump paths, as a job on each node would give them).
pub fn probe_in(cwd: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run probe");
    Out::from(o)
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
    compare_to(dir, "out", extra)
}

/// `probe compare -b dir/bench -c dir/cmp -o dir/OUT extra...`
pub fn compare_to(dir: &Path, out: &str, extra: &[&str]) -> Out {
    compare_paths(&dir.join("bench"), &dir.join("cmp"), &dir.join(out), extra)
}

/// `probe scan DUMP -o OUT extra...`
pub fn scan(dump: &Path, out: &Path, extra: &[&str]) -> Out {
    let mut a = vec!["scan", dump.to_str().unwrap(), "-o", out.to_str().unwrap()];
    a.extend_from_slice(extra);
    probe(&a)
}

/// `probe compare -b B -c C -o OUT extra...`
pub fn compare_paths(b: &Path, c: &Path, out: &Path, extra: &[&str]) -> Out {
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
    write_op_log_at(dir, "step0", "rank0", "statistics", records);
}

/// Writes `dir/manifest.json` (mode `mode`) and `dir/<step>/<rank>/ops.jsonl` from op
/// records, numbering them in order.
pub fn write_op_log_at(dir: &Path, step: &str, rank: &str, mode: &str, records: Vec<OpRecord>) {
    let rank = dir.join(step).join(rank);
    std::fs::create_dir_all(&rank).unwrap();
    let manifest = ManifestRecord {
        compiled: None,
        compiled_capture: None,
        created: "2026-01-01T00:00:00Z".into(),
        device: "cpu".into(),
        format: "probe-dump".into(),
        framework: "pytorch".into(),
        framework_version: None,
        level: "api".into(),
        mode: mode.into(),
        overflow: None,
        producer: None,
        version: 1,
        world_size: None,
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

/// Statistics of float values as the agent records them (max, min, mean, L2 norm).
pub fn stats_of(values: &[f32]) -> StatsRecord {
    let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    let n = v.len().max(1) as f64;
    StatsRecord {
        max: Stat(v.iter().copied().reduce(f64::max)),
        min: Stat(v.iter().copied().reduce(f64::min)),
        mean: Stat(Some(v.iter().sum::<f64>() / n)),
        norm: Stat(Some(v.iter().map(|x| x * x).sum::<f64>().sqrt())),
        nan: Some(0),
        inf: Some(0),
    }
}

/// A float32 tensor of an op: (slot, role, values), e.g. `("input.0", "input", vec![1.0])`.
pub type Tensor<'a> = (&'a str, &'a str, Vec<f32>);

/// An API op record of `key` (direction from the key) with float32 [`Tensor`]s: statistics
/// computed from the values, no data (see [`write_tensor_log`] for data).
pub fn op_record(key: &str, tensors: &[Tensor]) -> OpRecord {
    OpRecord {
        args: None,
        direction: OpKey::parse(key).direction().name().into(),
        kind: "api".into(),
        module: None,
        op: key.into(),
        recompute: false,
        group: None,
        coll_seq: None,
        seq: 0,
        stack: None,
        tensors: tensors
            .iter()
            .map(|(slot, role, values)| TensorRecord {
                checksum: None,
                dtype: "float32".into(),
                file: None,
                data_offsets: None,
                id: None,
                name: format!("{key}.{slot}"),
                role: (*role).into(),
                shape: vec![values.len()],
                src: None,
                stats: Some(stats_of(values)),
                unwritten: false,
                stride: None,
                offset: None,
                storage: None,
                format: None,
            })
            .collect(),
    }
}

/// A tensor-mode dump of one rank: every float32 tensor of `ops` (built by [`op_record`]
/// from the same values) gets its data in `tensors-00000.safetensors`.
pub fn write_tensor_log(dir: &Path, ops: &[(&str, Vec<Tensor>)]) {
    let shard = "tensors-00000.safetensors";
    let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
    let records = ops
        .iter()
        .map(|(key, ts)| {
            let mut r = op_record(key, ts);
            for (t, (_, _, values)) in r.tensors.iter_mut().zip(ts) {
                t.file = Some(shard.into());
                let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
                data.push((t.name.clone(), bytes, t.shape.clone()));
            }
            r
        })
        .collect();
    write_op_log_at(dir, "step0", "rank0", "tensor", records);
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, b, s)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .unwrap();
            (n.clone(), v)
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("step0/rank0").join(shard), bytes).unwrap();
}

/// Every evidence line of every finding in a summary (top level and per pair).
pub fn evidence_lines(s: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut walk = vec![s];
    while let Some(v) = walk.pop() {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(ev)) = m.get("evidence") {
                    out.extend(ev.iter().filter_map(|e| e.as_str().map(String::from)));
                }
                walk.extend(m.values());
            }
            serde_json::Value::Array(a) => walk.extend(a.iter()),
            _ => {}
        }
    }
    out
}

/// `linear` of ones into `h` (dataflow id 1), then where `extra` a `__mul__` scaling it by
/// 1.5 (id 2), an op the other run does not call: the records, and the value the next op
/// reads with its dataflow id.
pub fn linear_and_extra_mul(extra: bool) -> (Vec<OpRecord>, Vec<f32>, u64) {
    let h = vec![2.0f32; 4];
    let mut lin = op_record(
        "Functional.linear.0.forward",
        &[
            ("input.0", "input", vec![1.0; 4]),
            ("output.0", "output", h.clone()),
        ],
    );
    lin.tensors[1].id = Some(1);
    if !extra {
        return (vec![lin], h, 1);
    }
    let scaled: Vec<f32> = h.iter().map(|v| v * 1.5).collect();
    let mut mul = op_record(
        "Tensor.__mul__.0.forward",
        &[
            ("input.0", "input", h),
            ("output.0", "output", scaled.clone()),
        ],
    );
    mul.tensors[0].src = Some(1);
    mul.tensors[1].id = Some(2);
    (vec![lin, mul], scaled, 2)
}

/// The hidden entries of an output folder besides its current set (`.probe-current` and
/// the folder it names): what a run left behind.
pub fn leftovers(dir: &Path) -> Vec<String> {
    let current = std::fs::read_link(dir.join(".probe-current")).ok();
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n != ".probe-current")
        .filter(|n| current.as_deref() != Some(Path::new(n)))
        .collect()
}

/// This machine's name as probe puts it in its scratch names (`.probe-KIND-HOST-PID`).
pub fn scratch_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .replace(
            |c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'),
            "_",
        )
}

/// The id of a process that has exited: it names no running process.
pub fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    dead
}
