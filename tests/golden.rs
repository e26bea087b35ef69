//! The golden corpus (issue 46): every output of the real `probe` on a fixed set of runs,
//! byte for byte, so that a change of the compare code that should change nothing is seen
//! to change nothing.
//!
//! Each case makes its inputs in a temporary folder (`probe synth`, the bundled msprobe
//! dumps, op logs written here), runs `probe` there with relative paths (the paths written
//! into the outputs are then the same on every machine), and checks what it got against
//! `testdata/golden/<case>/`:
//!
//! - `transcript.txt`: each command, its exit code, stdout and stderr (no terminal, so no
//!   progress bars);
//! - every JSON file written (`summary.json`, a shard's `shard.json`) in full, at its path
//!   in the case's folder, so a reviewer reads the change as a diff;
//! - `files.txt`: `sha256  path` of every file the commands wrote (parquet, xlsx, html,
//!   shard results, and the JSON again), and so also which files were written.
//!
//! A mismatch names the case and the file, and for text the first line that differs. When
//! a change of output is intended, rewrite the goldens and review their diff:
//!
//! ```text
//! PROBE_BLESS=1 cargo test --test golden
//! ```
//!
//! Run it also with `RAYON_NUM_THREADS=1`: the outputs do not depend on the thread count.

use crate::common;
use common::dumps::*;
use common::*;
use probe::schema::dump::OpRecord;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One case: a name (its folder under `testdata/golden/`; none starts with `step`, or
/// `testdata/golden/` would look like a dump root to `tests/nonfinite.rs`) and what it runs.
type CaseFn = fn(&mut Case);

const CASES: &[(&str, CaseFn)] = &[
    // probe dumps, one rank (`probe synth`)
    ("demo", demo),
    ("tensor_clean", tensor_clean),
    ("tensor_inject_xlsx_rows", tensor_inject_xlsx_rows),
    ("statistics_inject", statistics_inject),
    ("checksum_inject", checksum_inject),
    ("nan_tensor", nan_tensor),
    ("nan_statistics", nan_statistics),
    ("bf16", bf16),
    ("noise_fail_on", noise_fail_on),
    ("perturb_weight_steps", perturb_weight_steps),
    ("selected_steps", selected_steps),
    ("tolerance_config", tolerance_config),
    ("truncated_capture", truncated_capture),
    // distributed
    ("ranks2_op", ranks2_op),
    ("ranks4_collective", ranks4_collective),
    ("ranks8_backward", ranks8_backward),
    ("row_memory_0", row_memory_0),
    ("shard_merge", shard_merge),
    ("shard_node_local", shard_node_local),
    // differing code paths and how runs differ
    ("extra_op_cmp", extra_op_cmp),
    ("extra_op_bench", extra_op_bench),
    ("align_name_shifted_counters", align_name_shifted_counters),
    ("fused_mapping", fused_mapping),
    ("fused_faulty", fused_faulty),
    ("random_draw", random_draw),
    ("levels", levels),
    ("loss_scale", loss_scale),
    ("loss_scaler_ops", loss_scaler_ops),
    ("micro_batch", micro_batch),
    // msprobe dumps
    ("msprobe_tensor", msprobe_tensor),
    ("msprobe_stats", msprobe_stats),
    ("msprobe_dist", msprobe_dist),
    ("msprobe_nonfinite", msprobe_nonfinite),
    ("msprobe_api_mapping", msprobe_api_mapping),
    ("probe_vs_msprobe", probe_vs_msprobe),
    // scans and refusals
    ("scan_synth", scan_synth),
    ("scan_msprobe", scan_msprobe),
    ("input_errors", input_errors),
];

// ---- probe dumps, one rank

fn demo(c: &mut Case) {
    c.copy("testdata/demo", "demo");
    c.probe(&["compare", "-b", "demo/bench", "-c", "demo/cmp", "-o", "out"]);
}

fn tensor_clean(c: &mut Case) {
    c.synth(&["--blocks", "2"]);
    c.compare("out", &["--threads", "1"]);
}

fn tensor_inject_xlsx_rows(c: &mut Case) {
    c.synth(&["--inject", "Functional.linear.3", "--blocks", "3"]);
    c.compare("out", &["--xlsx-rows", "10", "--format", "xlsx,json"]);
}

fn statistics_inject(c: &mut Case) {
    c.synth(&["--mode", "statistics", "--inject", "Functional.linear.2"]);
    c.compare("out", &[]);
}

fn checksum_inject(c: &mut Case) {
    c.synth(&["--mode", "checksum", "--inject", "Functional.gelu.1"]);
    c.compare("out", &[]);
}

fn nan_tensor(c: &mut Case) {
    c.synth(&["--nan", "Functional.gelu.1"]);
    c.compare("out", &[]);
}

fn nan_statistics(c: &mut Case) {
    c.synth(&["--mode", "statistics", "--nan", "Functional.linear.3"]);
    c.compare("out", &[]);
}

fn bf16(c: &mut Case) {
    c.synth(&["--bf16", "--blocks", "2"]);
    c.compare("out", &[]);
}

/// Cross-device noise: warnings, whose exit code `--fail-on` sets.
fn noise_fail_on(c: &mut Case) {
    c.synth(&["--mode", "statistics", "--noise", "3e-5"]);
    c.compare("out", &[]);
    c.compare("out_warning", &["--fail-on", "warning", "--format", "json"]);
    c.compare("out_never", &["--fail-on", "never", "--format", "json"]);
}

/// A weight perturbed in the comparison run: the divergence enters from outside the ops.
fn perturb_weight_steps(c: &mut Case) {
    c.synth(&["--perturb-weight", "1", "--steps", "2", "--blocks", "2"]);
    c.compare("out", &[]);
}

fn selected_steps(c: &mut Case) {
    c.synth(&[
        "--mode",
        "statistics",
        "--steps",
        "3",
        "--inject",
        "Functional.gelu.0",
    ]);
    c.compare("out", &[]);
    c.compare("out_steps", &["--steps", "1-2", "--format", "json"]);
}

fn tolerance_config(c: &mut Case) {
    c.synth(&["--mode", "statistics", "--noise", "1e-3", "--blocks", "2"]);
    c.write(
        "tol.toml",
        "local_gain = 20.0\n\n[dtype.float32]\nwarning = 1e-3\nerror = 1e-2\n\n\
         [[op]]\npattern = \"*.backward.*\"\nerror = 5e-2\n",
    );
    c.compare("strict", &[]);
    c.compare("loose", &["--config", "tol.toml"]);
}

/// The comparison run's capture stopped after two ops: incomplete, and the gates around it.
fn truncated_capture(c: &mut Case) {
    c.synth(&["--mode", "statistics", "--blocks", "4"]);
    let log = c.path("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let kept: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&log, kept.join("\n") + "\n").unwrap();
    c.compare("out", &[]);
    c.compare("out_all", &["--max-unmatched", "100%", "--format", "json"]);
    c.compare("out_never", &["--fail-on", "never", "--format", "json"]);
}

// ---- distributed

fn ranks2_op(c: &mut Case) {
    c.synth(&[
        "--ranks",
        "2",
        "--perturb-rank",
        "1",
        "--perturb-op",
        "Functional.gelu.1",
    ]);
    c.compare("out", &[]);
}

fn ranks4_collective(c: &mut Case) {
    c.synth(&[
        "--ranks",
        "4",
        "--mode",
        "statistics",
        "--perturb-collective",
        "--perturb-rank",
        "2",
    ]);
    c.compare("out", &[]);
}

fn ranks8_backward(c: &mut Case) {
    c.synth(&[
        "--ranks",
        "8",
        "--steps",
        "2",
        "--mode",
        "statistics",
        "--blocks",
        "2",
        "--perturb-rank",
        "5",
        "--perturb-op",
        "Functional.linear.1.backward",
    ]);
    c.compare("out", &[]);
    c.compare(
        "out_selected",
        &["--ranks", "4-7", "--steps", "1", "--format", "json"],
    );
}

fn row_memory_0(c: &mut Case) {
    c.synth(&[
        "--ranks",
        "4",
        "--steps",
        "2",
        "--blocks",
        "2",
        "--perturb-rank",
        "3",
        "--perturb-op",
        "Functional.layer_norm.0",
    ]);
    c.compare("out", &["--row-memory", "0"]);
}

/// `--shard i/2` twice, then `probe merge`, next to the unsharded compare.
fn shard_merge(c: &mut Case) {
    c.synth(&[
        "--ranks",
        "4",
        "--mode",
        "statistics",
        "--perturb-rank",
        "1",
        "--perturb-op",
        "Functional.gelu.0",
    ]);
    c.compare("full", &[]);
    c.compare("s0", &["--shard", "0/2"]);
    c.compare("s1", &["--shard", "1/2"]);
    c.probe(&["merge", "s0", "s1", "-o", "merged"]);
    let rm0 = ["--row-memory", "0", "--format", "json,parquet"];
    c.probe(&[&["merge", "s1", "s0", "-o", "merged_rm0"], &rm0[..]].concat());
}

/// Two nodes, each holding two of the four ranks (interleaved) at the same relative path,
/// compare all they hold (`--shard all`); the shards merge into the whole run's reports.
fn shard_node_local(c: &mut Case) {
    c.synth_into(
        "whole",
        &["--ranks", "4", "--noise", "1e-3", "--blocks", "2"],
    );
    for (node, ranks) in [("node0", ["rank0", "rank2"]), ("node1", ["rank1", "rank3"])] {
        for side in ["bench", "cmp"] {
            let (from, to) = (
                c.path(&format!("whole/{side}")),
                c.path(&format!("{node}/{side}")),
            );
            std::fs::create_dir_all(to.join("step0")).unwrap();
            std::fs::copy(from.join("manifest.json"), to.join("manifest.json")).unwrap();
            for r in ranks {
                copy_dir(&from.join("step0").join(r), &to.join("step0").join(r));
            }
        }
        let shard = ["compare", "-b", "bench", "-c", "cmp", "-o", "shard"];
        c.probe_in(node, &[&shard[..], &["--shard", "all"]].concat());
    }
    c.probe_in(
        "whole",
        &["merge", "../node1/shard", "../node0/shard", "-o", "merged"],
    );
}

// ---- differing code paths and how runs differ

/// The port calls an op the benchmark does not (with its stack).
fn extra_op_cmp(c: &mut Case) {
    with_extra_op(&c.path("bench"), false);
    with_extra_op(&c.path("cmp"), true);
    c.compare("out", &["--max-unmatched", "0.5"]);
}

/// The benchmark calls an op the port does not.
fn extra_op_bench(c: &mut Case) {
    with_extra_op(&c.path("bench"), true);
    with_extra_op(&c.path("cmp"), false);
    c.compare("out", &["--max-unmatched", "0.5"]);
}

/// The port calls GELU once more, on a mask, before the model's: every later GELU's call
/// counter is one higher. Paired by structure (signatures), then by msprobe's names.
fn align_name_shifted_counters(c: &mut Case) {
    let x = vec![0.5f32, -1.0, 2.0, 0.25];
    let h: Vec<f32> = x.iter().map(|v| v * 3.0).collect();
    let g: Vec<f32> = h.iter().map(|&v| gelu(v)).collect();
    let z: Vec<f32> = g.iter().map(|v| v * 0.5 - 0.25).collect();
    let op = |key: &str, i: &[f32], o: &[f32]| {
        op_record(
            key,
            &[
                ("input.0", "input", i.to_vec()),
                ("output.0", "output", o.to_vec()),
            ],
        )
    };
    let mask = [1.0f32, 0.0];
    let run = |extra: bool, gelu_key: &str| {
        let mut ops = vec![op("Functional.linear.0.forward", &x, &h)];
        if extra {
            ops.push(op("Functional.gelu.0.forward", &mask, &mask.map(gelu)));
        }
        ops.push(op(gelu_key, &h, &g));
        ops.push(op("Functional.linear.1.forward", &g, &z));
        ops
    };
    write_op_log(&c.path("bench"), run(false, "Functional.gelu.0.forward"));
    write_op_log(&c.path("cmp"), run(true, "Functional.gelu.1.forward"));
    c.compare("out", &["--max-unmatched", "0.5"]);
    c.compare("out_name", &["--max-unmatched", "0.5", "--align", "name"]);
}

/// A fused kernel (`NPU.npu_gelu_mul`) against its composition: a region, compared at its
/// boundary, by the mapping file's rule or by its module without it.
fn fused_mapping(c: &mut Case) {
    fused_pair(c, 1.0);
    c.copy("testdata/mapping/npu_fused.toml", "npu_fused.toml");
    c.compare("plain", &[]);
    c.compare("mapped", &["--mapping", "npu_fused.toml"]);
}

/// The fused kernel returns 2 % more: the region's output fails.
fn fused_faulty(c: &mut Case) {
    fused_pair(c, 1.02);
    c.copy("testdata/mapping/npu_fused.toml", "npu_fused.toml");
    c.compare("out", &["--mapping", "npu_fused.toml"]);
}

/// A dropout whose input agrees and whose output differs: a different random draw.
fn random_draw(c: &mut Case) {
    for (side, mask) in [
        ("bench", [1.0, 0.0, 1.0, 1.0]),
        ("cmp", [0.0, 1.0, 1.0, 1.0]),
    ] {
        let x = vec![0.5f32, -1.0, 2.0, 0.25];
        let h: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        let d: Vec<f32> = h.iter().zip(mask).map(|(v, m)| v * m / 0.75).collect();
        let s = vec![d.iter().sum::<f32>()];
        let ops = vec![
            op_record(
                "Torch.matmul.0.forward",
                &[("input.0", "input", x), ("output.0", "output", h.clone())],
            ),
            op_record(
                "Functional.dropout.0.forward",
                &[("input.0", "input", h), ("output.0", "output", d.clone())],
            ),
            op_record(
                "Torch.sum.0.forward",
                &[("input.0", "input", d), ("output.0", "output", s)],
            ),
        ];
        write_op_log(&c.path(side), ops);
    }
    c.compare("out", &[]);
}

/// Module and API records on one side, API records only on the other.
fn levels(c: &mut Case) {
    write_op_log(&c.path("bench"), linear_at_levels(true, true, 1.0));
    write_op_log(&c.path("cmp"), linear_at_levels(true, false, 1.5));
    write_op_log(&c.path("modules/bench"), linear_at_levels(false, true, 1.0));
    write_op_log(&c.path("modules/cmp"), linear_at_levels(true, false, 1.0));
    c.compare("out", &[]);
    c.compare("out_api", &["-l", "api", "--format", "json"]);
    c.probe(&[
        "compare",
        "-b",
        "modules/bench",
        "-c",
        "modules/cmp",
        "-o",
        "out_nothing",
    ]);
}

/// Gradients 1024x the benchmark's (compared divided by it); then also 10 % off.
fn loss_scale(c: &mut Case) {
    write_op_log(&c.path("bench"), loss_scale_records(1.0, 1.0));
    write_op_log(&c.path("cmp"), loss_scale_records(1024.0, 1.0));
    write_op_log(&c.path("off/bench"), loss_scale_records(1.0, 1.0));
    write_op_log(&c.path("off/cmp"), loss_scale_records(1024.0, 1.1));
    c.compare("out", &[]);
    c.probe(&[
        "compare",
        "-b",
        "off/bench",
        "-c",
        "off/cmp",
        "-o",
        "out_off",
    ]);
}

/// The port's scaler arithmetic (one-sided), and the update its scaler skipped.
fn loss_scaler_ops(c: &mut Case) {
    let scalar = |v: f32| vec![v];
    let mut cmp = loss_scale_records(1024.0, 1.0);
    cmp.splice(
        1..1,
        [
            op_record(
                "Tensor.__mul__.0.forward",
                &[
                    ("input.0", "input", scalar(1.5)),
                    ("input.1", "input", scalar(1024.0)),
                    ("output.0", "output", scalar(1536.0)),
                ],
            ),
            op_record(
                "Tensor.reciprocal.0.forward",
                &[
                    ("input.0", "input", scalar(1024.0)),
                    ("output.0", "output", scalar(1.0 / 1024.0)),
                ],
            ),
        ],
    );
    cmp.pop(); // the update the scaler skipped
    cmp.push(op_record(
        "Torch._amp_update_scale_.0.forward",
        &[
            ("input.0", "input", scalar(1024.0)),
            ("input.1", "input", scalar(0.0)),
            ("input.2", "input", scalar(1.0)),
        ],
    ));
    write_op_log(&c.path("bench"), loss_scale_records(1.0, 1.0));
    write_op_log(&c.path("cmp"), cmp);
    c.compare("out", &["--max-unmatched", "0.9"]);
}

/// Two micro-batches against one; and the same passes on inputs of another size.
fn micro_batch(c: &mut Case) {
    write_op_log(&c.path("bench"), micro_batch_step(1, 8));
    write_op_log(&c.path("cmp"), micro_batch_step(2, 4));
    write_op_log(&c.path("sizes/bench"), micro_batch_step(1, 8));
    write_op_log(&c.path("sizes/cmp"), micro_batch_step(1, 4));
    c.compare("out", &["--max-unmatched", "1"]);
    c.probe(&[
        "compare",
        "-b",
        "sizes/bench",
        "-c",
        "sizes/cmp",
        "-o",
        "out_sizes",
        "--max-unmatched",
        "1",
    ]);
}

// ---- msprobe dumps

fn msprobe_tensor(c: &mut Case) {
    c.copy("testdata/msprobe/tensor_bench", "bench");
    c.copy("testdata/msprobe/tensor_bf16", "cmp");
    c.compare("out", &[]);
}

fn msprobe_stats(c: &mut Case) {
    c.copy("testdata/msprobe/stats_bench", "bench");
    c.copy("testdata/msprobe/stats_bf16", "cmp");
    c.compare("out", &[]);
    c.compare("out_step1", &["--steps", "1", "--format", "json"]);
}

/// A gloo group's rank folder against a proc folder; the collective is on one side only.
fn msprobe_dist(c: &mut Case) {
    c.copy("testdata/msprobe/dist_bench", "bench");
    c.copy("testdata/msprobe/stats_bench/step0", "cmp/step0");
    c.compare("out", &[]);
}

fn msprobe_nonfinite(c: &mut Case) {
    c.copy("testdata/msprobe/nonfinite_bench", "bench");
    c.copy("testdata/msprobe/nonfinite_cmp", "cmp");
    c.compare("out", &[]);
}

/// The comparison run calls its GELU `Functional.fast_gelu`: paired by an msprobe API
/// mapping file, or not.
fn msprobe_api_mapping(c: &mut Case) {
    c.copy("testdata/msprobe/stats_bench/step0", "bench/step0");
    c.copy("testdata/msprobe/stats_bf16/step0", "cmp/step0");
    for name in ["dump.json", "stack.json", "construct.json"] {
        let p = c.path("cmp/step0/proc24524").join(name);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(
            &p,
            text.replace("Functional.gelu.", "Functional.fast_gelu."),
        )
        .unwrap();
    }
    c.write(
        "api_mapping.yaml",
        "- ms_api: Functional.fast_gelu\n  pt_api: Functional.gelu\n",
    );
    c.compare("plain", &["--max-unmatched", "1"]);
    c.compare("mapped", &["--mapping", "api_mapping.yaml"]);
}

/// The demo pair with one side rewritten as an msprobe dump of `.npy` files.
fn probe_vs_msprobe(c: &mut Case) {
    c.synth(DEMO_SYNTH_ARGS);
    probe_to_msprobe(&c.path("cmp"), &c.path("cmp_msprobe"));
    probe_to_msprobe(&c.path("bench"), &c.path("bench_msprobe"));
    c.probe(&["compare", "-b", "bench", "-c", "cmp_msprobe", "-o", "out"]);
    c.probe(&[
        "compare",
        "-b",
        "bench_msprobe",
        "-c",
        "cmp",
        "-o",
        "out_rev",
    ]);
}

// ---- scans and refusals

fn scan_synth(c: &mut Case) {
    c.synth(&["--nan", "Functional.gelu.1", "--steps", "2"]);
    c.probe(&["scan", "cmp", "-o", "scan_cmp"]);
    c.probe(&["scan", "bench", "-o", "scan_bench"]);
    c.probe(&[
        "scan",
        "cmp",
        "-o",
        "scan_step1",
        "--steps",
        "1",
        "--format",
        "json",
    ]);
}

fn scan_msprobe(c: &mut Case) {
    c.copy("testdata/msprobe/nonfinite_cmp", "nonfinite_cmp");
    c.copy("testdata/msprobe/nonfinite_bench", "nonfinite_bench");
    c.copy("testdata/msprobe/stats_bf16", "stats_bf16");
    c.probe(&["scan", "nonfinite_cmp", "-o", "scan_cmp"]);
    c.probe(&["scan", "nonfinite_bench", "-o", "scan_bench"]);
    let warn = ["--fail-on", "warning", "--overflow-margin", "1e6"];
    c.probe(&[&["scan", "stats_bf16", "-o", "scan_bf16"], &warn[..]].concat());
}

/// Refused before any work: exit 2, one line on stderr.
fn input_errors(c: &mut Case) {
    c.synth(&["--blocks", "1"]);
    c.write("bad.toml", "[dtype.float32]\nerror = -1\n");
    c.compare("o1", &["--max-unmatched", "1.5"]);
    c.compare("o2", &["--format", "json,pdf"]);
    c.compare("o3", &["--config", "bad.toml"]);
    c.compare("o4", &["--threads", "0"]);
    c.probe(&["compare", "-b", "missing", "-c", "cmp", "-o", "o5"]);
    c.probe(&["merge", "missing", "-o", "o6"]);
}

// ---- inputs built here

/// GELU (tanh form).
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// An op record in module `mlp` whose tensors carry dataflow ids: `links[i]` is tensor
/// i's (id, src).
fn linked(key: &str, tensors: &[Tensor], links: &[(Option<u64>, Option<u64>)]) -> OpRecord {
    let mut r = op_record(key, tensors);
    r.module = Some("mlp".into());
    for (t, &(id, src)) in r.tensors.iter_mut().zip(links) {
        t.id = id;
        t.src = src;
    }
    r
}

/// `chunk` → `gelu` → `__mul__` → `linear` on the benchmark; `chunk` →
/// `NPU.npu_gelu_mul` (its output times `fault`) → `linear` on the comparison run.
fn fused_pair(c: &Case, fault: f32) {
    let x: Vec<f32> = (0..8).map(|i| i as f32 / 4.0 - 1.0).collect();
    let (a, b) = (x[..4].to_vec(), x[4..].to_vec());
    let g: Vec<f32> = a.iter().map(|&v| gelu(v)).collect();
    let y: Vec<f32> = g.iter().zip(&b).map(|(g, b)| g * b).collect();
    let yc: Vec<f32> = y.iter().map(|v| v * fault).collect();
    let lin = |y: Vec<f32>| {
        let z: Vec<f32> = y.iter().map(|v| v * 0.5 + 0.1).collect();
        linked(
            "Functional.linear.0.forward",
            &[("input.0", "input", y), ("output.0", "output", z)],
            &[(None, Some(4)), (Some(5), None)],
        )
    };
    let chunk = linked(
        "Tensor.chunk.0.forward",
        &[
            ("input.0", "input", x.clone()),
            ("output.0", "output", a.clone()),
            ("output.1", "output", b.clone()),
        ],
        &[(None, None), (Some(1), None), (Some(2), None)],
    );
    let bench = vec![
        chunk.clone(),
        linked(
            "Functional.gelu.0.forward",
            &[
                ("input.0", "input", a.clone()),
                ("output.0", "output", g.clone()),
            ],
            &[(None, Some(1)), (Some(3), None)],
        ),
        linked(
            "Tensor.__mul__.0.forward",
            &[
                ("input.0", "input", g),
                ("input.1", "input", b.clone()),
                ("output.0", "output", y.clone()),
            ],
            &[(None, Some(3)), (None, Some(2)), (Some(4), None)],
        ),
        lin(y),
    ];
    let cmp = vec![
        chunk,
        linked(
            "NPU.npu_gelu_mul.0.forward",
            &[
                ("input.0", "input", a),
                ("input.1", "input", b),
                ("output.0", "output", yc.clone()),
            ],
            &[(None, Some(1)), (None, Some(2)), (Some(4), None)],
        ),
        lin(yc),
    ];
    write_op_log(&c.path("bench"), bench);
    write_op_log(&c.path("cmp"), cmp);
}

// ---- the runner

/// A case's temporary folder, the outputs its commands wrote and its transcript.
struct Case {
    dir: tempfile::TempDir,
    outputs: BTreeSet<String>,
    transcript: String,
}

impl Case {
    fn new() -> Case {
        Case {
            dir: tempfile::tempdir().unwrap(),
            outputs: BTreeSet::new(),
            transcript: String::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// An input: `text` written at `rel`.
    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    /// An input: a file or folder of the repository copied to `to`.
    fn copy(&self, from: &str, to: &str) {
        let (from, to) = (root().join(from), self.path(to));
        if from.is_dir() {
            copy_dir(&from, &to);
        } else {
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&from, &to).unwrap();
        }
    }

    /// An input: `probe synth` into `bench/` and `cmp/`.
    fn synth(&self, args: &[&str]) {
        self.synth_into(".", args);
    }

    /// An input: `probe synth` into `dir/bench` and `dir/cmp`.
    fn synth_into(&self, dir: &str, args: &[&str]) {
        let o = run_probe(self.dir.path(), &[&["synth", "-o", dir], args].concat());
        assert_eq!(o.code, 0, "synth failed: {}", o.stderr);
    }

    /// `probe compare -b bench -c cmp -o OUT extra...`, recorded.
    fn compare(&mut self, out: &str, extra: &[&str]) {
        let base = ["compare", "-b", "bench", "-c", "cmp", "-o", out];
        self.probe(&[&base[..], extra].concat());
    }

    /// `probe args...` in the case's folder, recorded.
    fn probe(&mut self, args: &[&str]) {
        self.probe_in(".", args);
    }

    /// `probe args...` in the case's subfolder `cwd`, recorded: its transcript, and the
    /// files it wrote are outputs.
    fn probe_in(&mut self, cwd: &str, args: &[&str]) {
        let before = stamps(self.dir.path());
        let o = run_probe(&self.path(cwd), args);
        let after = stamps(self.dir.path());
        let written = after.iter().filter(|(p, s)| before.get(*p) != Some(s));
        self.outputs.extend(written.map(|(p, _)| p.clone()));
        let t = &mut self.transcript;
        let at = if cwd == "." {
            String::new()
        } else {
            format!("[{cwd}] ")
        };
        writeln!(t, "{at}$ probe {}\nexit {}", args.join(" "), o.code).unwrap();
        for (name, text) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            if text.is_empty() {
                writeln!(t, "--- {name}: empty").unwrap();
            } else {
                writeln!(t, "--- {name}").unwrap();
                t.push_str(text);
                if !text.ends_with('\n') {
                    t.push_str("\n--- (no final newline)\n");
                }
            }
        }
        t.push('\n');
    }

    /// What the case's golden folder holds: its transcript, every JSON output in full, and
    /// the manifest of every output's SHA-256.
    fn goldens(&self) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        let mut manifest = String::new();
        for rel in &self.outputs {
            let Ok(bytes) = std::fs::read(self.dir.path().join(rel)) else {
                continue; // written and removed again (a temporary file)
            };
            writeln!(manifest, "{}  {rel}", sha256(&bytes)).unwrap();
            if rel.ends_with(".json") {
                files.insert(rel.clone(), bytes);
            }
        }
        files.insert(TRANSCRIPT.into(), self.transcript.clone().into_bytes());
        files.insert(MANIFEST.into(), manifest.into_bytes());
        files
    }
}

const TRANSCRIPT: &str = "transcript.txt";
const MANIFEST: &str = "files.txt";

/// Runs the real binary in `cwd`: no terminal, nothing on stdin, no memory tracing.
fn run_probe(cwd: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .current_dir(cwd)
        .args(args)
        .env_remove("PROBE_TRACE_MEMORY")
        .stdin(Stdio::null())
        .output()
        .expect("run probe");
    Out::from(o)
}

/// Every file under `dir`, as `/`-separated paths relative to it.
fn files_under(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            // An output folder's current set (`.probe-current`) is read through its links.
            if p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".probe-"))
            {
                continue;
            }
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap();
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.insert(parts.join("/"));
            }
        }
    }
    out
}

/// Every file under `dir` with its size and modification time: what a command wrote, new
/// or over an older file, is what differs after it.
fn stamps(dir: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    files_under(dir)
        .into_iter()
        .map(|rel| {
            let m = std::fs::metadata(dir.join(&rel)).unwrap();
            (rel, (m.len(), m.modified().unwrap()))
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn golden_root() -> PathBuf {
    root().join("testdata/golden")
}

/// How `got` differs from the case's golden folder, one line (or a few) per file.
fn differences(case: &str, got: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    let dir = golden_root().join(case);
    if !dir.is_dir() {
        return vec![format!("{case}: no goldens (testdata/golden/{case}/)")];
    }
    let want: BTreeMap<String, Vec<u8>> = files_under(&dir)
        .into_iter()
        .map(|rel| {
            let bytes = std::fs::read(dir.join(&rel)).unwrap();
            (rel, bytes)
        })
        .collect();
    let mut out = Vec::new();
    for (rel, w) in &want {
        match got.get(rel) {
            None => out.push(format!("{case}: {rel} is no longer written")),
            Some(g) if g == w => {}
            Some(g) if rel == MANIFEST => out.extend(manifest_changes(case, w, g)),
            Some(g) => out.push(format!(
                "{case}: {rel} differs, {}",
                first_difference(&String::from_utf8_lossy(w), &String::from_utf8_lossy(g))
            )),
        }
    }
    for rel in got.keys().filter(|r| !want.contains_key(*r)) {
        out.push(format!("{case}: {rel} is written now, not in the goldens"));
    }
    out
}

/// The outputs whose hash changed, or that appeared or went, by the two manifests.
fn manifest_changes(case: &str, want: &[u8], got: &[u8]) -> Vec<String> {
    let parse = |b: &[u8]| -> BTreeMap<String, String> {
        String::from_utf8_lossy(b)
            .lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(h, p)| (p.to_string(), h.to_string()))
            .collect()
    };
    let (w, g) = (parse(want), parse(got));
    let mut out = Vec::new();
    for (path, hash) in &w {
        match g.get(path) {
            None => out.push(format!("{case}: {path} is no longer written")),
            Some(h) if h != hash => out.push(format!(
                "{case}: {path} differs (sha256 {} in the goldens, {} now)",
                &hash[..12.min(hash.len())],
                &h[..12.min(h.len())]
            )),
            Some(_) => {}
        }
    }
    for path in g.keys().filter(|p| !w.contains_key(*p)) {
        out.push(format!("{case}: {path} is written now, not in the goldens"));
    }
    out
}

/// The first line that differs, both ways.
fn first_difference(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let clip = |l: Option<&&str>| match l {
        None => "<end of file>".to_string(),
        Some(l) if l.chars().count() > 300 => l.chars().take(300).collect::<String>() + "...",
        Some(l) => l.to_string(),
    };
    match (0..w.len().max(g.len())).find(|&i| w.get(i) != g.get(i)) {
        Some(i) => format!(
            "first at line {}:\n    golden: {}\n    now:    {}",
            i + 1,
            clip(w.get(i)),
            clip(g.get(i))
        ),
        None => "in line endings or the final newline".into(),
    }
}

/// Rewrites the case's golden folder.
fn bless(case: &str, got: &BTreeMap<String, Vec<u8>>) {
    let dir = golden_root().join(case);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    for (rel, bytes) in got {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

#[test]
fn every_output_is_as_in_the_goldens() {
    let blessing = std::env::var_os("PROBE_BLESS").is_some_and(|v| v != "0" && !v.is_empty());
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for &(name, make) in CASES {
        assert!(names.insert(name), "two cases named {name}");
        assert!(
            !name.starts_with("step"),
            "{name}: a case name starts with `step`"
        );
        let mut case = Case::new();
        make(&mut case);
        let got = case.goldens();
        if blessing {
            bless(name, &got);
        } else {
            problems.extend(differences(name, &got));
        }
    }
    // A golden folder of no case is left over from a renamed or removed one.
    if let Ok(entries) = std::fs::read_dir(golden_root()) {
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() && !names.contains(name.as_str()) {
                if blessing {
                    std::fs::remove_dir_all(e.path()).unwrap();
                } else {
                    problems.push(format!(
                        "{name}: goldens of no case (testdata/golden/{name}/)"
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} difference(s) from the goldens; if intended, rewrite them with \
         `PROBE_BLESS=1 cargo test --test golden` and review the diff:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
