//! The localiser on in-memory units: op logs built as values and run through the compare
//! stages (align → measure → judge → analyze) without files or a process. Each case is
//! one way a naive "first failing row" verdict goes wrong (docs/compare.md).

use probe::compare::judge::Equality;
use probe::compare::{self, Options, Sides, Unit, Verdict};
use probe::dtype::{AnyDType, DType};
use probe::dump::{
    Direction, Format, OpRec, RankDump, RankLoc, Role, Stats, StatsFields, TensorRec,
};
use probe::schema::summary::{Finding, Findings};
use probe::tensor::ShardCache;
use probe::vocab::FindingKind;
use std::path::PathBuf;

/// Statistics of 100 equal values `v`: max = min = mean = v, norm = 10|v|, `nan` NaNs.
fn stats(v: f64, nan: u64) -> Stats {
    StatsFields {
        max: Some(v),
        min: Some(v),
        mean: Some(v),
        norm: Some(10.0 * v.abs()),
        nan: Some(nan),
        inf: Some(0),
    }
    .into()
}

/// Builds one side's op log, op by op.
#[derive(Default)]
struct Log {
    ops: Vec<OpRec>,
}

impl Log {
    /// An op with inputs (value, producing id) and outputs (value, id), float32.
    fn op(self, key: &str, inputs: &[(f64, Option<u64>)], outputs: &[(f64, u64)]) -> Log {
        self.op_with(key, DType::F32, inputs, outputs, 0)
    }

    fn op_with(
        mut self,
        key: &str,
        dtype: DType,
        inputs: &[(f64, Option<u64>)],
        outputs: &[(f64, u64)],
        nan_out: u64,
    ) -> Log {
        let t = |slot: &str, i: usize, role, v, nan, id, src| TensorRec {
            name: format!("{key}.{slot}.{i}").into(),
            role,
            dtype: AnyDType::Known(dtype),
            shape: vec![100],
            stats: Some(stats(v, nan)),
            checksum: None,
            id,
            src,
            data: None,
            unwritten: false,
            layout: None,
        };
        let mut tensors: Vec<TensorRec> = inputs
            .iter()
            .enumerate()
            .map(|(i, (v, src))| t("input", i, Role::Input, *v, 0, None, *src))
            .collect();
        tensors.extend(
            outputs
                .iter()
                .enumerate()
                .map(|(i, (v, id))| t("output", i, Role::Output, *v, nan_out, Some(*id), None)),
        );
        self.ops
            .push(OpRec::new(self.ops.len() as u64, key, tensors));
        self
    }

    fn dump(self) -> RankDump {
        RankDump {
            loc: loc(),
            ops: probe::dump::Ops::from_records(&self.ops).expect("test ops fit"),
            stacks: Default::default(),
            has_dataflow: true,
            warnings: vec![],
            incomplete: vec![],
        }
    }
}

fn loc() -> RankLoc {
    RankLoc {
        step: "step0".into(),
        rank: "rank0".into(),
        dir: PathBuf::from("/in-memory"),
        format: Format::Probe,
    }
}

/// What the tests read of a compared unit: its rows, its unmatched tensors, its findings.
struct Compared {
    rows: Vec<compare::Row>,
    unmatched: Vec<compare::Unmatched>,
    findings: Findings,
}

fn run(bench: Log, cmp: Log) -> Compared {
    let unit = Unit {
        step: "step0".into(),
        rank: "rank0".into(),
        locs: Sides::new(loc(), loc()),
        compiled: Sides::default(),
    };
    let caches = Sides::<ShardCache>::default();
    let (summary, table) = compare::compare_unit(
        &unit,
        Sides::new(bench.dump(), cmp.dump()),
        &Options::default(),
        &caches,
        &probe::progress::Progress::hidden(),
        &compare::Carry::default(),
        None,
    )
    .expect("in-memory unit compares");
    Compared {
        rows: table.rows.all(),
        unmatched: table.unmatched,
        findings: summary.findings,
    }
}

const CHAIN: [&str; 4] = [
    "Torch.matmul.0.forward",
    "Functional.softmax.0.forward",
    "Torch.sub.0.forward",
    "Functional.gelu.0.forward",
];

/// A chain a → b → c → d; each op's (input, output) value, the input produced by the
/// previous op (the first input by nobody: a data batch).
fn chain(vals: &[(f64, f64)]) -> Log {
    vals.iter()
        .enumerate()
        .fold(Log::default(), |log, (i, (vin, vout))| {
            let src = (i > 0).then(|| i as u64 - 1);
            log.op(CHAIN[i], &[(*vin, src)], &[(*vout, i as u64)])
        })
}

const CLEAN: [(f64, f64); 4] = [(1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0)];

fn op_of(f: Option<&Finding>) -> Option<&str> {
    f.map(|f| f.op.as_str())
}

/// A unit's finding of a kind in the forward phase.
fn fwd(f: &Findings, kind: FindingKind) -> Option<&Finding> {
    f.get(kind, Some(Direction::Forward))
}

#[test]
fn identical_runs_have_no_finding() {
    let u = run(chain(&CLEAN), chain(&CLEAN));
    assert!(u.rows.iter().all(|r| r.judgement.verdict == Verdict::Pass));
    // Statistics only: equal statistics, which is not bitwise equality.
    assert!(u
        .rows
        .iter()
        .all(|r| r.equality() == Some(Equality::Statistics) && !r.identical()));
    assert_eq!(u.findings, Default::default());
}

#[test]
fn the_op_with_identical_inputs_is_blamed_not_the_amplifier() {
    let cmp = [
        (1.0, 2.0001),
        (2.0001, 3.00015),
        (3.00015, 4.2),
        (4.2, 5.25),
    ];
    let u = run(chain(&CLEAN), chain(&cmp));
    let f = &u.findings;
    assert_eq!(op_of(fwd(f, FindingKind::FirstDivergent)), Some(CHAIN[0]));
    assert_eq!(op_of(fwd(f, FindingKind::EarliestFailing)), Some(CHAIN[2]));
    let expl = &fwd(f, FindingKind::FirstDivergent).unwrap().explanation;
    assert!(
        expl.contains("have equal statistics on both sides"),
        "{expl}"
    );
    // The matmul output alone is only a warning: 1e-4 / 2 of the scale.
    let out = &u.rows[1];
    assert_eq!(out.tensor.name, "Torch.matmul.0.forward.output.0");
    assert_eq!(out.judgement.verdict, Verdict::Warning);
}

#[test]
fn a_jump_in_error_blames_the_op_where_it_jumps() {
    let cmp = [
        (1.0000001, 2.0000004),
        (2.0000004, 3.3),
        (3.3, 4.4),
        (4.4, 5.5),
    ];
    let u = run(chain(&CLEAN), chain(&cmp));
    let f = fwd(&u.findings, FindingKind::FirstDivergent);
    assert_eq!(op_of(f), Some(CHAIN[1]));
    assert!(f.as_ref().unwrap().explanation.contains("within tolerance"));
    assert!(u.findings.drift().is_empty());
}

#[test]
fn slow_drift_blames_nobody() {
    let bench = [(1.0, 1.0); 4];
    let cmp = [
        (1.0000001, 1.0000008),
        (1.0000008, 1.000005),
        (1.000005, 1.00003),
        (1.00003, 1.0002),
    ];
    let u = run(chain(&bench), chain(&cmp));
    let f = &u.findings;
    assert_eq!(fwd(f, FindingKind::FirstDivergent), None);
    assert_eq!(f.drift(), [Direction::Forward]);
    assert_eq!(op_of(fwd(f, FindingKind::EarliestFailing)), Some(CHAIN[3]));
}

#[test]
fn a_failing_input_nobody_produced_enters_from_outside() {
    let cmp = [(1.5, 2.5), (2.5, 3.5), (3.5, 4.5), (4.5, 5.5)];
    let u = run(chain(&CLEAN), chain(&cmp));
    let e = u
        .findings
        .get(FindingKind::ExternalSource, Some(Direction::Forward))
        .expect("outside source");
    assert_eq!(e.tensor, "Torch.matmul.0.forward.input.0");
    assert!(
        e.explanation.contains("no captured op produced"),
        "{}",
        e.explanation
    );
    assert_eq!(fwd(&u.findings, FindingKind::FirstDivergent), None);
    assert!(u.rows[0].tensor.external);
}

#[test]
fn a_backward_op_counts_its_forward_calls_tensors_as_inputs() {
    // gelu's forward agrees; its backward gets an identical incoming gradient but returns
    // a wrong one: local to the backward call, judged with the forward's saved tensors.
    let side = |grad_out: f64| {
        Log::default()
            .op("Functional.gelu.0.forward", &[(1.0, None)], &[(2.0, 0)])
            .op(
                "Functional.gelu.0.backward",
                &[(0.5, None)],
                &[(grad_out, 1)],
            )
    };
    let u = run(side(0.25), side(0.3));
    let f = u
        .findings
        .get(FindingKind::FirstDivergent, Some(Direction::Backward))
        .expect("backward culprit");
    assert_eq!(f.op, "Functional.gelu.0.backward");
    assert!(
        f.explanation.contains("tensors of its forward call"),
        "{}",
        f.explanation
    );
    assert_eq!(fwd(&u.findings, FindingKind::FirstDivergent), None);
}

#[test]
fn the_first_nan_producer_has_finite_inputs() {
    let side = |nan| {
        Log::default()
            .op("Torch.exp.0.forward", &[(1.0, None)], &[(2.0, 0)])
            .op_with(
                "Torch.log.0.forward",
                DType::F32,
                &[(2.0, Some(0))],
                &[(0.7, 1)],
                nan,
            )
            .op("Torch.sum.0.forward", &[(0.7, Some(1))], &[(70.0, 2)])
    };
    let u = run(side(0), side(3));
    let f = u
        .findings
        .get(FindingKind::FirstNonfinite, None)
        .expect("NaN producer");
    assert_eq!(f.op, "Torch.log.0.forward");
    let log_out = u
        .rows
        .iter()
        .find(|r| r.tensor.name == "Torch.log.0.forward.output.0")
        .unwrap();
    assert_eq!(log_out.judgement.verdict, Verdict::Error);
    assert!(log_out
        .judgement
        .reason
        .contains("NaN/Inf count 0 in bench, 3 in cmp"));
}

#[test]
fn float32_after_a_bf16_op_is_judged_at_bf16_precision() {
    // 1 % off in float32 is an error; after a bf16 op it is bf16 rounding.
    let bench = Log::default()
        .op("Torch.matmul.0.forward", &[(1.0, None)], &[(2.0, 0)])
        .op("Tensor.float.0.forward", &[(2.0, Some(0))], &[(2.0, 1)]);
    let cmp = Log::default()
        .op_with(
            "Torch.matmul.0.forward",
            DType::BF16,
            &[(1.0, None)],
            &[(2.0, 0)],
            0,
        )
        .op("Tensor.float.0.forward", &[(2.0, Some(0))], &[(2.02, 1)]);
    let u = run(bench, cmp);
    let r = u.rows.last().unwrap();
    assert_eq!(r.judgement.precision, Some(DType::BF16));
    assert!(r.judgement.verdict < Verdict::Error, "{:?}", r.judgement);
    // Without the bf16 op the same difference is an error.
    let bench = Log::default().op("Tensor.float.0.forward", &[(2.0, None)], &[(2.0, 1)]);
    let cmp = Log::default().op("Tensor.float.0.forward", &[(2.0, None)], &[(2.02, 1)]);
    let u = run(bench, cmp);
    assert_eq!(u.rows[1].judgement.verdict, Verdict::Error);
}

#[test]
fn tensors_on_one_side_only_are_kept_with_their_op() {
    let bench = chain(&CLEAN);
    let cmp = chain(&CLEAN).op("Torch.add.0.forward", &[(5.0, Some(3))], &[(6.0, 4)]);
    let u = run(bench, cmp);
    assert_eq!(u.unmatched.len(), 2);
    assert!(u.unmatched.iter().all(|x| x.side == compare::Side::Cmp));
    assert_eq!(u.unmatched[0].op.key.as_str(), "Torch.add.0.forward");
    assert_eq!(u.unmatched[0].op.direction, Direction::Forward);
}
