//! Distributed runs end to end: `probe synth --ranks N` dumps with collectives (group and
//! coll_seq), compared by the real binary; the cross-rank verdict names the rank where the
//! divergence began and how the others inherited it.

use crate::common;
use common::*;
use serde_json::Value;
use std::path::Path;

fn run(args: &[&str]) -> (tempfile::TempDir, Out, Value) {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), args);
    let o = compare(t.path(), &["-q"]);
    let s = summary(t.path());
    (t, o, s)
}

fn ranks_of(s: &Value) -> Vec<String> {
    s["propagation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rank"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_perturbed_op_on_rank_1_of_2_is_the_origin_and_rank_0_inherits_it() {
    let (_t, o, s) = run(&[
        "--ranks",
        "2",
        "--perturb-rank",
        "1",
        "--perturb-op",
        "Functional.gelu.1",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "DIVERGENCE: rank 1 diverged first: first divergent op Functional.gelu.1.forward"
        ),
        "{h}"
    );
    assert!(
        h.contains(
            "rank 0 inherited it through Distributed.all_reduce.0.forward (coll #0, group [0, 1])"
        ),
        "{h}"
    );
    let origin = &s["origin"];
    assert_eq!(origin["rank"], "rank1");
    assert_eq!(origin["kind"], "op");
    assert_eq!(origin["op"], "Functional.gelu.1.forward");
    assert_eq!(origin["epoch"], 0);
    assert_eq!(ranks_of(&s), ["rank0"]);
    let p = &s["propagation"][0];
    assert_eq!(p["via"]["op"], "Distributed.all_reduce.0.forward");
    assert_eq!(p["via"]["group"], serde_json::json!([0, 1]));
    assert_eq!(p["via"]["coll_seq"], 0);
    assert_eq!(p["from_ranks"], serde_json::json!([1]));
    // Every field the summary schema requires is there.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schemas/probe-compare-summary.v2.schema.json"))
            .unwrap(),
    )
    .unwrap();
    let props = &schema["properties"];
    for k in props["origin"]["required"].as_array().unwrap() {
        assert!(
            origin.get(k.as_str().unwrap()).is_some(),
            "origin lacks {k}"
        );
    }
    for k in props["propagation"]["items"]["required"]
        .as_array()
        .unwrap()
    {
        assert!(
            p.get(k.as_str().unwrap()).is_some(),
            "propagation lacks {k}"
        );
    }
}

#[test]
fn a_perturbed_op_on_rank_1_of_4_propagates_to_every_other_rank() {
    let (_t, o, s) = run(&[
        "--ranks",
        "4",
        "--perturb-rank",
        "1",
        "--perturb-op",
        "Functional.gelu.1",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let h = s["headline"].as_str().unwrap();
    assert!(h.contains("rank 1 diverged first"), "{h}");
    assert!(h.contains("Functional.gelu.1.forward"), "{h}");
    assert!(
        h.contains("ranks 0, 2, 3 inherited it through Distributed.all_reduce.0.forward"),
        "{h}"
    );
    assert_eq!(s["origin"]["rank"], "rank1");
    assert_eq!(ranks_of(&s), ["rank0", "rank2", "rank3"]);
    for p in s["propagation"].as_array().unwrap() {
        assert_eq!(p["via"]["op"], "Distributed.all_reduce.0.forward");
        assert_eq!(p["from_ranks"], serde_json::json!([1]));
    }
}

#[test]
fn a_perturbed_backward_op_is_inherited_through_its_ddp_bucket() {
    let (_t, o, s) = run(&[
        "--ranks",
        "4",
        "--perturb-rank",
        "2",
        "--perturb-op",
        "Functional.gelu.1.backward",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_eq!(s["origin"]["rank"], "rank2");
    assert_eq!(s["origin"]["op"], "Functional.gelu.1.backward");
    // Block 1 of 3 is the second bucket of the backward (coll #2 after the forward's #0).
    assert_eq!(s["origin"]["epoch"], 2);
    assert_eq!(ranks_of(&s), ["rank0", "rank1", "rank3"]);
    let p = &s["propagation"][0];
    assert_eq!(p["via"]["op"], "Distributed.ddp_bucket_allreduce.1.forward");
    assert_eq!(p["via"]["coll_seq"], 2);
}

#[test]
fn a_collective_whose_inputs_agree_everywhere_is_named_as_faulty() {
    let (_t, o, s) = run(&[
        "--ranks",
        "2",
        "--perturb-rank",
        "1",
        "--perturb-collective",
    ]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let h = s["headline"].as_str().unwrap();
    assert!(
        h.starts_with(
            "DIVERGENCE: collective Distributed.all_reduce.0.forward (coll #0, group [0, 1])"
        ),
        "{h}"
    );
    assert!(h.contains("faulty communication"), "{h}");
    assert!(h.contains("on rank 1"), "{h}");
    let origin = &s["origin"];
    assert_eq!(origin["kind"], "collective");
    assert_eq!(origin["rank"], "rank1");
    assert_eq!(origin["collective"]["coll_seq"], 0);
    // Rank 0 inherits it later, through the first gradient bucket rank 1 fed.
    assert_eq!(ranks_of(&s), ["rank0"]);
    assert_eq!(s["propagation"][0]["from_ranks"], serde_json::json!([1]));
}

/// A collective is faulty only when every rank of its group was compared and fed it
/// agreeing inputs: with ranks 2 and 3 left out (`--ranks 0-1`), what they sent is unknown.
#[test]
fn a_collective_whose_group_was_not_all_compared_is_not_called_faulty() {
    let t = tempfile::tempdir().unwrap();
    synth(
        t.path(),
        &[
            "--ranks",
            "4",
            "--perturb-rank",
            "1",
            "--perturb-collective",
        ],
    );
    let o = compare(t.path(), &["-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    assert_eq!(s["origin"]["kind"], "collective", "{s:#}");
    let o = compare(t.path(), &["-q", "--ranks", "0-1"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    let h = s["headline"].as_str().unwrap();
    assert!(!h.contains("faulty communication"), "{h}");
    assert!(s.get("origin").is_none(), "{s:#}");
}

/// The GPU job ran on 2 ranks, the NPU job on 4: a rank of each reads another share of the
/// data, and each all-reduce sums over other ranks. That is said, and no collective is
/// called faulty (its inputs agree on the ranks both runs have; ranks 2 and 3 are the
/// comparison run's only).
#[test]
fn runs_of_another_world_size_are_said_to_be() {
    let t = tempfile::tempdir().unwrap();
    synth(
        &t.path().join("two"),
        &["--ranks", "2", "--mode", "statistics"],
    );
    synth(
        &t.path().join("four"),
        &["--ranks", "4", "--mode", "statistics"],
    );
    let out = t.path().join("out");
    let warned = |bench: &Path, cmp: &Path, said: &str| {
        let o = compare_paths(bench, cmp, &out, &["-q"]);
        assert_ne!(o.code, 0, "{}", o.stderr);
        let s: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        let h = s["headline"].as_str().unwrap();
        assert!(!h.contains("faulty communication"), "{h}");
        assert!(s.get("origin").is_none(), "{s:#}");
        assert!(
            s["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().starts_with(said)),
            "{s:#}"
        );
        assert!(o.stderr.contains(said), "{}", o.stderr);
    };
    // The manifests say each job's world size.
    warned(
        &t.path().join("two/bench"),
        &t.path().join("four/cmp"),
        "the benchmark ran on 2 ranks and the comparison run on 4: in a data-parallel job of \
         another world size a rank reads another share of the data",
    );
    // Dumps whose manifests do not (msprobe's, older probe ones): by their rank folders.
    for side in ["two/bench", "four/cmp"] {
        let m = t.path().join(side).join("manifest.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
        assert!(
            v.as_object_mut().unwrap().remove("world_size").is_some(),
            "{v}"
        );
        std::fs::write(&m, v.to_string()).unwrap();
    }
    warned(
        &t.path().join("two/bench"),
        &t.path().join("four/cmp"),
        "step0: the benchmark has ranks 0-1 and the comparison run 0-3 (by their folders",
    );
    // The same world size says nothing of it.
    let o = compare_paths(
        &t.path().join("four/bench"),
        &t.path().join("four/cmp"),
        &out,
        &["-q"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("world size"), "{}", o.stderr);
}

/// A job of 4 ranks whose benchmark dumped ranks 0 and 1 only (its config's `rank` list),
/// against all 4 of the comparison run: the same world size, which the manifests say, so
/// no rank is said to hold another share of the data (the folders alone said 2 against 4).
/// The comparison run's other ranks are said to have no counterpart.
#[test]
fn a_dump_of_some_ranks_of_a_job_is_not_another_world_size() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--ranks", "4", "--mode", "statistics"]);
    for r in ["rank2", "rank3"] {
        std::fs::remove_dir_all(t.path().join("bench/step0").join(r)).unwrap();
    }
    let out = t.path().join("out");
    let o = compare_paths(
        &t.path().join("bench"),
        &t.path().join("cmp"),
        &out,
        &["-q"],
    );
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(!o.stderr.contains("world size"), "{}", o.stderr);
    let warnings: Vec<&str> = s["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        !warnings.iter().any(|w| w.contains("world size")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("rank2"))
            && warnings.iter().any(|w| w.contains("rank3")),
        "{warnings:?}"
    );
    // The ranks both have compare as ever: nothing differs there.
    assert_eq!(s["counts"]["error"], 0, "{s:#}");
}

#[test]
fn identical_multi_rank_runs_pass_without_a_cross_rank_story() {
    let (_t, o, s) = run(&["--ranks", "4"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(s["verdict"], "pass");
    assert!(s.get("origin").is_none());
    assert!(s.get("propagation").is_none());
    assert_eq!(s["counts"]["pairs"], 4);
}

#[test]
fn collectives_record_group_and_coll_seq_in_the_op_log() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--ranks", "2"]);
    let text = std::fs::read_to_string(t.path().join("cmp/step0/rank1/ops.jsonl")).unwrap();
    let colls: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["op"].as_str().unwrap().starts_with("Distributed."))
        .collect();
    // One forward all_reduce, one bucket per block (3).
    assert_eq!(colls.len(), 4);
    for (i, c) in colls.iter().enumerate() {
        assert_eq!(c["group"], serde_json::json!([0, 1]));
        assert_eq!(c["coll_seq"], i);
    }
    // Other records carry neither field.
    assert!(!text
        .lines()
        .filter(|l| !l.contains("Distributed."))
        .any(|l| l.contains("coll_seq") || l.contains("\"group\"")));
}

#[test]
fn a_group_without_coll_seq_is_a_bad_record() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--ranks", "2"]);
    let p = t.path().join("cmp/step0/rank0/ops.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replacen(",\"coll_seq\":0", "", 1)).unwrap();
    let o = compare(t.path(), &["-q"]);
    assert_input_error(&o, 2, "group without coll_seq");
    std::fs::write(&p, text.replacen("\"coll_seq\":0", "\"coll_seq\":\"x\"", 1)).unwrap();
    let o = compare(t.path(), &["-q"]);
    assert_input_error(&o, 2, "bad op record");
}

#[test]
fn comparing_different_ranks_warns_loudly() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--ranks", "2"]);
    let out = t.path().join("out");
    let o = probe(&[
        "compare",
        "-b",
        t.path().join("bench/step0/rank0").to_str().unwrap(),
        "-c",
        t.path().join("cmp/step0/rank1").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    let needle =
        "comparing rank0 of the benchmark with rank1 of the comparison run: different ranks";
    assert!(o.stderr.contains(needle), "{}", o.stderr);
    let s = summary(t.path());
    assert!(
        s["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains(needle)),
        "{s}"
    );
    // The same rank of each run: no such warning.
    let o = probe(&[
        "compare",
        "-b",
        t.path().join("bench/step0/rank1").to_str().unwrap(),
        "-c",
        t.path().join("cmp/step0/rank1").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("different ranks"), "{}", o.stderr);
    assert!(
        !o.stderr.contains("different training steps"),
        "{}",
        o.stderr
    );
}

/// One step captured in each run, of another number (the GPU run's `steps=[0]`, the
/// port's `steps=[3]`): their folders pair, since each run has one, and a warning says
/// they are different steps.
#[test]
fn comparing_different_steps_warns() {
    let t = tempfile::tempdir().unwrap();
    synth(t.path(), &["--mode", "statistics"]);
    let later = t.path().join("later");
    std::fs::create_dir_all(later.join("step3")).unwrap();
    std::fs::rename(t.path().join("cmp/step0/rank0"), later.join("step3/rank0")).unwrap();
    std::fs::rename(
        t.path().join("cmp/manifest.json"),
        later.join("manifest.json"),
    )
    .unwrap();
    let out = t.path().join("out");
    let o = compare_paths(&t.path().join("bench"), &later, &out, &["-q"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let needle = "comparing step0 of the benchmark with step3 of the comparison run: different \
                  training steps";
    assert!(o.stderr.contains(needle), "{}", o.stderr);
}

#[test]
fn a_single_rank_dump_keeps_its_headline() {
    let (_t, o, s) = run(DEMO_SYNTH_ARGS);
    assert_eq!(o.code, 1);
    assert!(s.get("origin").is_none());
    assert!(s["headline"]
        .as_str()
        .unwrap()
        .starts_with("DIVERGENCE: first divergent op Functional.gelu.1.forward"));
}

/// One rank of a job: `linear` of ones into `h`, on the comparison side of rank 1 (when
/// `extra`) a `__mul__` only that run calls scaling `h` by 1.5, then an `all_reduce` of
/// it over ranks [0, 1] returning `total` (the sum over the ranks of the job).
fn rank_ops(extra: bool, total: f32) -> Vec<probe::schema::dump::OpRecord> {
    let (mut ops, sent, id) = linear_and_extra_mul(extra);
    let mut ar = op_record(
        "Distributed.all_reduce.0.forward",
        &[
            ("input.0", "input", sent),
            ("output.0", "output", vec![total; 4]),
        ],
    );
    ar.tensors[0].src = Some(id);
    ar.group = Some(vec![0, 1]);
    ar.coll_seq = Some(0);
    ops.push(ar);
    ops
}

#[test]
fn a_rank_whose_difference_enters_through_a_one_sided_op_is_the_origin() {
    // The port's rank 1 scales what it sends by an op the benchmark does not call: rank 1
    // has no first divergent op (its first failing op's input already differs), rank 0's
    // all_reduce gets agreeing inputs and returns a different sum. Rank 1 is where it
    // began, through the one-sided op; rank 0 inherited it.
    let t = tempfile::tempdir().unwrap();
    for (side, extra, total) in [("bench", false, 4.0), ("cmp", true, 5.0)] {
        for rank in [0, 1] {
            let ops = rank_ops(extra && rank == 1, total);
            let dir = t.path().join(side);
            write_op_log_at(&dir, "step0", &format!("rank{rank}"), "statistics", ops);
        }
    }
    let o = compare(t.path(), &["-q"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    let s = summary(t.path());
    let h = s["headline"].as_str().unwrap();
    // (Then: a third of rank 1's tensors have no counterpart, so it is incomplete too.)
    assert!(
        h.starts_with(
            "DIVERGENCE: rank 1 diverged first: it enters through Tensor.__mul__.0.forward, \
             which only the comparison run calls, input Distributed.all_reduce.0.forward.\
             input.0 of Distributed.all_reduce.0.forward (forward step0/rank1); rank 0 \
             inherited it through Distributed.all_reduce.0.forward (coll #0, group [0, 1]);"
        ),
        "{h}"
    );
    let origin = &s["origin"];
    assert_eq!(
        (&origin["rank"], &origin["kind"]),
        (&Value::from("rank1"), &Value::from("outside")),
        "{origin}"
    );
    assert_eq!(ranks_of(&s), ["rank0"]);
    assert_eq!(s["propagation"][0]["from_ranks"], serde_json::json!([1]));
    let rank1 = s["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["rank"] == "rank1")
        .unwrap();
    let source = &rank1["findings"]["external_source"]["forward"]["one_sided_source"];
    assert_eq!(source["side"], "cmp", "{rank1}");
    assert_eq!(source["op"], "Tensor.__mul__.0.forward", "{rank1}");
}
