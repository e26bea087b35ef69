//! A unit's findings as data (`schema::summary::Findings`): typed by kind and phase, and
//! written in `summary.json` one key per kind, as schema v2 has always had them.

use probe::op_key::Direction;
use probe::schema::summary::{Carried, Finding, Findings, Found, RunFindings};
use probe::vocab::FindingKind;
use serde_json::Value;

fn finding(op: &str, step: &str, seq: u64) -> Finding {
    Finding {
        op: op.into(),
        step: step.into(),
        rank: "rank0".into(),
        seq,
        direction: Direction::Forward,
        tensor: format!("{op}.output.0"),
        reason: String::new(),
        explanation: String::new(),
        evidence: Vec::new(),
        stack: Vec::new(),
        leftover: None,
        args: Vec::new(),
        one_sided_source: None,
        carried: None,
        outside: None,
        draw: None,
        module: None,
        consequence_of: None,
        layout: Vec::new(),
    }
}

const FWD: Option<Direction> = Some(Direction::Forward);
const BWD: Option<Direction> = Some(Direction::Backward);

fn keys(v: &Value) -> Vec<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

#[test]
fn a_units_findings_are_written_one_key_per_kind_and_read_back() {
    let found = vec![
        Found::new(
            FindingKind::NearTie,
            BWD,
            finding("Torch.topk.0.backward", "step0", 9),
        ),
        Found::new(
            FindingKind::FirstDivergent,
            FWD,
            finding("Functional.gelu.1.forward", "step0", 4),
        ),
        Found::new(
            FindingKind::FirstNonfinite,
            None,
            finding("Torch.log.0.forward", "step0", 2),
        ),
    ];
    let f = Findings::new(found, vec![Direction::Backward]);
    let v = serde_json::to_value(&f).unwrap();
    // The schema's keys (their order and bytes: tests/golden.rs).
    let mut k = keys(&v);
    k.sort();
    let mut want = vec![
        "first_divergent",
        "earliest_failing",
        "external_source",
        "first_nonfinite",
        "drift",
        "random_draw",
        "near_tie",
    ];
    want.sort();
    assert_eq!(
        k, want,
        "other_args and first_warning are left out when absent"
    );
    assert_eq!(
        v["first_divergent"]["forward"]["op"],
        "Functional.gelu.1.forward"
    );
    assert_eq!(v["first_divergent"]["backward"], Value::Null);
    assert_eq!(v["near_tie"]["backward"]["op"], "Torch.topk.0.backward");
    assert_eq!(v["first_nonfinite"]["op"], "Torch.log.0.forward");
    assert_eq!(v["drift"], serde_json::json!(["backward"]));
    let back: Findings = serde_json::from_value(v).unwrap();
    assert_eq!(back, f);
    // In listing order: by kind, then phase.
    let kinds: Vec<FindingKind> = back.iter().map(|x| x.kind).collect();
    assert_eq!(
        kinds,
        [
            FindingKind::FirstDivergent,
            FindingKind::FirstNonfinite,
            FindingKind::NearTie
        ]
    );
}

#[test]
fn the_run_wide_findings_have_no_drift_key() {
    let f = Findings::new(
        vec![Found::new(
            FindingKind::OtherArgs,
            None,
            finding("Functional.layer_norm.0.forward", "step0", 3),
        )],
        Vec::new(),
    );
    let v = serde_json::to_value(RunFindings(f.clone())).unwrap();
    assert!(v.get("drift").is_none());
    assert_eq!(v["other_args"]["op"], "Functional.layer_norm.0.forward");
    assert!(v.get("first_warning").is_none());
    let back: RunFindings = serde_json::from_value(v).unwrap();
    assert_eq!(back.0, f);
}

#[test]
fn one_finding_of_a_kind_and_phase_is_kept_and_unphased_kinds_have_no_phase() {
    let f = Findings::new(
        vec![
            Found::new(
                FindingKind::FirstDivergent,
                FWD,
                finding("A.a.0.forward", "step0", 1),
            ),
            Found::new(
                FindingKind::FirstDivergent,
                FWD,
                finding("B.b.0.forward", "step0", 0),
            ),
            Found::new(
                FindingKind::FirstWarning,
                BWD,
                finding("C.c.0.forward", "step0", 2),
            ),
        ],
        Vec::new(),
    );
    assert_eq!(
        f.get(FindingKind::FirstDivergent, FWD)
            .map(|x| x.op.as_str()),
        Some("A.a.0.forward")
    );
    assert_eq!(f.of(FindingKind::FirstDivergent).count(), 1);
    // A kind with one in all takes no phase, whatever it was given.
    let w = f.of(FindingKind::FirstWarning).next().unwrap();
    assert_eq!(w.phase, None);
    assert!(f.get(FindingKind::FirstWarning, BWD).is_some());
}

#[test]
fn over_units_the_earliest_of_each_kind_and_phase_is_kept() {
    let unit = |step: &str, seq: u64| {
        Findings::new(
            vec![
                Found::new(
                    FindingKind::FirstDivergent,
                    FWD,
                    finding(&format!("Op.x.{seq}.forward"), step, seq),
                ),
                Found::new(
                    FindingKind::ExternalSource,
                    BWD,
                    finding(&format!("Op.y.{seq}.backward"), step, seq + 100),
                ),
            ],
            Vec::new(),
        )
    };
    // step2 before step10 (labels by number), then execution order within a step.
    let units = [unit("step10", 1), unit("step2", 7), unit("step2", 5)];
    let run = Findings::earliest(units.iter());
    let first = run.get(FindingKind::FirstDivergent, FWD).unwrap();
    assert_eq!((first.step.as_str(), first.seq), ("step2", 5));
    let entry = run.get(FindingKind::ExternalSource, BWD).unwrap();
    assert_eq!((entry.step.as_str(), entry.seq), ("step2", 105));
    assert!(run.drift().is_empty());
}

#[test]
fn an_entry_with_the_previous_steps_value_is_titled_so() {
    let mut f = finding("Tensor.addcdiv_.0.forward", "step1", 3);
    let plain = Found::new(FindingKind::ExternalSource, FWD, f.clone());
    assert_eq!(plain.title(), "divergence enters from outside (forward)");
    f.carried = Some(Carried {
        step: "step0".into(),
        op: "Tensor.addcdiv_.0.forward".into(),
        tensor: "Tensor.addcdiv_.0.forward.output.0".into(),
    });
    let carried = Found::new(FindingKind::ExternalSource, BWD, f);
    assert_eq!(
        carried.title(),
        "divergence enters with the previous step's value (backward)"
    );
    let nan = Found::new(
        FindingKind::FirstNonfinite,
        FWD,
        finding("Torch.log.0.forward", "step0", 2),
    );
    assert_eq!(nan.title(), "first NaN/Inf producer");
    assert!(nan.kind.names_culprit());
    assert!(!FindingKind::NearTie.names_culprit());
}
