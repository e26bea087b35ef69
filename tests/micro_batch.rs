//! Micro-batching: a run that takes its step in k forward passes on inputs k times smaller
//! than the other's is said to differ in gradient accumulation, per pair and in the
//! headline; the same call count, or a ratio that is not exact, is not.

use crate::common;
use common::dumps::micro_batch_step as step;
use common::*;
use probe::schema::dump::OpRecord;
use std::path::Path;

fn pair(dir: &Path, bench: Vec<OpRecord>, cmp: Vec<OpRecord>) -> serde_json::Value {
    write_op_log(&dir.join("bench"), bench);
    write_op_log(&dir.join("cmp"), cmp);
    let o = compare(dir, &["--max-unmatched", "1"]);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    summary(dir)
}

#[test]
fn two_micro_batches_against_one_are_said() {
    let d = tempfile::tempdir().unwrap();
    let s = pair(d.path(), step(1, 8), step(2, 4));
    let m = &s["pairs"][0]["micro_batches"];
    assert_eq!(m["bench"], 1, "{s}");
    assert_eq!(m["cmp"], 2, "{s}");
    assert_eq!(m["at"], "Functional.linear");
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.contains("the cmp run takes its step in 2 micro-batches, the bench run in one (2x the Functional.linear calls, on inputs 2x smaller) in step0/rank0: gradient accumulation differs"),
        "{h}"
    );
    assert!(
        s["warnings"][0].as_str().unwrap().contains("micro-batches"),
        "{s}"
    );
    // The other way round: the bench takes 4 passes of 2 rows.
    let e = tempfile::tempdir().unwrap();
    let s = pair(e.path(), step(4, 2), step(1, 8));
    let m = &s["pairs"][0]["micro_batches"];
    assert_eq!(
        (m["bench"].as_u64(), m["cmp"].as_u64()),
        (Some(4), Some(1)),
        "{s}"
    );
}

#[test]
fn the_same_passes_or_an_inexact_ratio_are_not_micro_batching() {
    // The same passes on other sizes (another batch size): no. The runs read data of
    // other sizes, and that is said instead (the linear layer's first input: 8 rows of 2
    // against 4).
    let d = tempfile::tempdir().unwrap();
    let s = pair(d.path(), step(1, 8), step(1, 4));
    assert!(s["pairs"][0].get("micro_batches").is_none(), "{s}");
    let sizes = serde_json::json!({"bench": 16, "cmp": 8, "at": "Functional.linear"});
    assert_eq!(s["pairs"][0]["input_sizes"], sizes, "{s}");
    let said = "the runs' inputs differ in size from their first forward pass on \
                (Functional.linear reads 16 elements in the bench run, 8 in the cmp run) in \
                step0/rank0: their batch size, sequence length or data differ";
    assert!(s["headline"].as_str().unwrap().contains(said), "{s}");
    // Twice the calls on inputs of the same size (the model called twice): no, and the
    // data's size is the same.
    let e = tempfile::tempdir().unwrap();
    let s = pair(e.path(), step(1, 8), step(2, 8));
    assert!(s["pairs"][0].get("micro_batches").is_none(), "{s}");
    assert!(s["pairs"][0].get("input_sizes").is_none(), "{s}");
    // Three passes of a third is not 8 rows: no; the data's size differs.
    let f = tempfile::tempdir().unwrap();
    let s = pair(f.path(), step(1, 8), step(3, 3));
    assert!(s["pairs"][0].get("micro_batches").is_none(), "{s}");
    assert!(!s["headline"].as_str().unwrap().contains("micro-batches"));
    assert_eq!(s["pairs"][0]["input_sizes"]["cmp"], 6, "{s}");
}

#[test]
fn an_expert_loop_against_one_grouped_call_is_not_micro_batching() {
    // The same model around an MoE layer on both sides: an embedding, a norm and an
    // output projection on 8 rows. Inside, the bench runs its 4 experts one by one on 2
    // rows each (a balanced router), the comparison one grouped call on all 8: the experts'
    // GELU is called 4x as often on inputs 4x smaller, as micro-batches would be, but
    // everything else reads the same sizes.
    let around = |experts: Vec<OpRecord>| -> Vec<OpRecord> {
        let x: Vec<f32> = (0..16).map(|v| v as f32 / 10.0).collect();
        let mut ops = vec![
            op_record(
                "Functional.embedding.0.forward",
                &[("input.0", "input", x.clone())],
            ),
            op_record(
                "Functional.layer_norm.0.forward",
                &[("input.0", "input", x.clone())],
            ),
        ];
        ops.extend(experts);
        ops.push(op_record(
            "Functional.linear.0.forward",
            &[("input.0", "input", x.clone())],
        ));
        ops.push(op_record(
            "Functional.cross_entropy.0.forward",
            &[("input.0", "input", x)],
        ));
        ops
    };
    let gelu = |i: usize, rows: usize| {
        let x: Vec<f32> = (0..rows * 2).map(|v| v as f32 / 10.0).collect();
        op_record(
            &format!("Functional.gelu.{i}.forward"),
            &[("input.0", "input", x.clone()), ("output.0", "output", x)],
        )
    };
    let d = tempfile::tempdir().unwrap();
    let s = pair(
        d.path(),
        around((0..4).map(|i| gelu(i, 2)).collect()),
        around(vec![gelu(0, 8)]),
    );
    assert!(s["pairs"][0].get("micro_batches").is_none(), "{s}");
    assert!(s["pairs"][0].get("input_sizes").is_none(), "{s}");
    assert!(
        !s["headline"].as_str().unwrap().contains("micro-batches"),
        "{s}"
    );
}

#[test]
fn a_call_one_side_adds_on_other_data_is_no_other_input_size() {
    // The same step, but the comparison run first calls the same API once more on a
    // small mask: its first call reads 2 elements where the bench's reads 16, yet its
    // other call reads the bench's 16. No size of data differs: nothing is said.
    let d = tempfile::tempdir().unwrap();
    // (The linear and the gelu of one pass: the extra gelu call makes half the APIs'
    // first calls read other sizes.)
    let bench = step(1, 8)[1..].to_vec();
    let mask = vec![1.0f32, 0.0];
    let mut cmp = vec![op_record(
        "Functional.gelu.0.forward",
        &[
            ("input.0", "input", mask.clone()),
            ("output.0", "output", mask),
        ],
    )];
    for op in &bench {
        cmp.push(match op.op.as_str() {
            "Functional.gelu.0.forward" => renamed(op.clone(), "Functional.gelu.1.forward"),
            _ => op.clone(),
        });
    }
    let s = pair(d.path(), bench, cmp);
    assert!(s["pairs"][0].get("input_sizes").is_none(), "{s}");
    assert!(s["pairs"][0].get("micro_batches").is_none(), "{s}");
    assert!(
        !s["headline"].as_str().unwrap().contains("differ in size"),
        "{s}"
    );
}

/// An op record under another key, its tensors' names with it.
fn renamed(mut op: OpRecord, key: &str) -> OpRecord {
    for t in &mut op.tensors {
        t.name = t.name.replacen(&op.op, key, 1);
    }
    op.op = key.into();
    op
}
