//! The words every stage shares: a tensor's verdict, the two sides of a compare, how a
//! pair was found. A leaf: it imports nothing from the crate, so that the gate, the
//! on-disk schemas, the one-sided scan and the error type can name these without depending
//! on the compare pipeline that produces them (docs/architecture.md, "Layers").

use serde::{Deserialize, Serialize};

/// A tensor's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Within tolerance.
    Pass,
    /// Past the warning threshold only.
    Warning,
    /// Out of tolerance.
    Error,
}

impl Verdict {
    /// The name used in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warning => "warning",
            Verdict::Error => "error",
        }
    }
}

/// Which side a tensor was found on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The benchmark.
    Bench,
    /// The comparison run.
    Cmp,
}

impl Side {
    /// `bench` or `cmp`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Bench => "bench",
            Side::Cmp => "cmp",
        }
    }

    /// The run, as explanations name it: `the benchmark`, `the comparison run`.
    pub(crate) fn run(self) -> &'static str {
        match self {
            Side::Bench => "the benchmark",
            Side::Cmp => "the comparison run",
        }
    }

    /// The other side.
    pub(crate) fn other(self) -> Side {
        match self {
            Side::Bench => Side::Cmp,
            Side::Cmp => Side::Bench,
        }
    }
}

/// A value for each side of a compare: the benchmark (trusted) and the comparison run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sides<T> {
    /// The benchmark (`-b`).
    pub bench: T,
    /// The comparison run (`-c`).
    pub cmp: T,
}

impl<T> Sides<T> {
    /// Both values.
    pub fn new(bench: T, cmp: T) -> Self {
        Sides { bench, cmp }
    }

    /// The same function applied to both sides.
    pub(crate) fn map<U>(self, mut f: impl FnMut(T) -> U) -> Sides<U> {
        Sides {
            bench: f(self.bench),
            cmp: f(self.cmp),
        }
    }

    /// Borrows both sides.
    pub(crate) fn as_ref(&self) -> Sides<&T> {
        Sides {
            bench: &self.bench,
            cmp: &self.cmp,
        }
    }

    /// Bench then cmp.
    pub(crate) fn pair(&self) -> (&T, &T) {
        (&self.bench, &self.cmp)
    }
}

/// How a pair of tensors was found (the `matched_by` column of every report).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum MatchedBy {
    /// Same op key (backward calls renumbered by occurrence) in the same module call.
    #[default]
    Exact,
    /// Paired by sequence alignment of op signatures: same API and shapes in the same
    /// module call, but another call counter (a call inserted or removed earlier).
    Aligned,
    /// The boundary of a region a mapping rule declares equivalent (a fused kernel and the
    /// composition it replaces).
    Mapped,
    /// The boundary of a region whose API calls could not be aligned: compared at the
    /// module call's boundary tensors (module fallback).
    Module,
}

impl MatchedBy {
    /// The name used in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            MatchedBy::Exact => "exact",
            MatchedBy::Aligned => "aligned",
            MatchedBy::Mapped => "mapped",
            MatchedBy::Module => "module",
        }
    }
}

/// What a localiser finding says of the op it names. The list the reports, the headline and
/// the cross-rank analysis read a unit's findings by: one variant per diagnosis, declared in
/// the order reports list findings at the same op (the causal order decides first:
/// `schema::summary::Finding::causal_key`). A new diagnosis is one variant here, its words
/// below, and the rule that finds it (`compare/analyze/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    /// A failing input no captured op produced: the divergence enters from outside (or with
    /// the previous step's value), per phase.
    ExternalSource,
    /// The first locally divergent op, per phase.
    FirstDivergent,
    /// The first op with finite inputs and new non-finite outputs.
    FirstNonfinite,
    /// The first op called with different non-tensor arguments, whatever its outputs.
    OtherArgs,
    /// A decision (indices, a mask) from inputs within tolerance that went the other way,
    /// per phase.
    NearTie,
    /// A random op whose inputs agree and whose outputs differ: another draw, per phase.
    RandomDraw,
    /// Where nothing fails: the first op whose output warns while its inputs pass.
    FirstWarning,
    /// The first op with a tensor out of tolerance, per phase.
    EarliestFailing,
}

impl FindingKind {
    /// Every kind, in listing order.
    pub(crate) const ALL: [FindingKind; 8] = [
        FindingKind::ExternalSource,
        FindingKind::FirstDivergent,
        FindingKind::FirstNonfinite,
        FindingKind::OtherArgs,
        FindingKind::NearTie,
        FindingKind::RandomDraw,
        FindingKind::FirstWarning,
        FindingKind::EarliestFailing,
    ];

    /// Whether a unit has one per phase (forward, backward) rather than one in all.
    pub(crate) fn phased(self) -> bool {
        !matches!(
            self,
            FindingKind::FirstNonfinite | FindingKind::OtherArgs | FindingKind::FirstWarning
        )
    }

    /// How reports title it (a phased kind adds its phase; where the divergence enters with
    /// the previous step's value, `schema::summary::Found::title` says so instead).
    pub fn title(self) -> &'static str {
        match self {
            FindingKind::ExternalSource => "divergence enters from outside",
            FindingKind::FirstDivergent => "first divergent op",
            FindingKind::FirstNonfinite => "first NaN/Inf producer",
            FindingKind::OtherArgs => "first op called with different arguments",
            FindingKind::NearTie => "near tie decided otherwise",
            FindingKind::RandomDraw => "different random draw",
            FindingKind::FirstWarning => "where the warnings begin",
            FindingKind::EarliestFailing => "earliest failing op",
        }
    }

    /// How reports title it in a step after an earlier one of its rank diverged (after
    /// `consequence of step0's divergence, `): what it says there, where the step's weights
    /// already differ. Not "first divergent op": an op whose error grows in such a step
    /// amplifies what it inherited (a norm, a rotary embedding), and its gain over inputs
    /// that barely differ says nothing of a fault of its own.
    pub fn consequence_title(self) -> &'static str {
        match self {
            FindingKind::ExternalSource => "where it enters",
            FindingKind::FirstDivergent => "first op whose error grows",
            FindingKind::FirstNonfinite => "first NaN/Inf producer",
            FindingKind::OtherArgs => "first op called with different arguments",
            FindingKind::NearTie => "near tie decided otherwise",
            FindingKind::RandomDraw => "different random draw",
            FindingKind::FirstWarning => "where the warnings begin",
            FindingKind::EarliestFailing => "earliest failing op",
        }
    }

    /// Whether it names the culprit of a divergence (the op a report marks): where the
    /// divergence is local, where it enters, where NaN/Inf is first made. The other kinds
    /// are hints or say why an op is no culprit.
    pub fn names_culprit(self) -> bool {
        matches!(
            self,
            FindingKind::FirstDivergent | FindingKind::ExternalSource | FindingKind::FirstNonfinite
        )
    }

    /// Whether it locates a divergence's start (the html report's culprit card): a locally
    /// divergent op, or where the divergence enters.
    pub(crate) fn locates_divergence(self) -> bool {
        matches!(
            self,
            FindingKind::FirstDivergent | FindingKind::ExternalSource
        )
    }

    /// The story a headline tells with it, where it tells one: at the same op, the lower
    /// says more (NaN/Inf before a random draw, before a near tie, before an outside
    /// source, before a local divergence). None: the headline tells no story with it.
    pub(crate) fn story_rank(self) -> Option<u8> {
        match self {
            FindingKind::FirstNonfinite => Some(0),
            FindingKind::RandomDraw => Some(1),
            FindingKind::NearTie => Some(2),
            FindingKind::ExternalSource => Some(3),
            FindingKind::FirstDivergent => Some(4),
            _ => None,
        }
    }
}
