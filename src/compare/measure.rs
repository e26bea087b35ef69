//! Measure: the numbers of every paired tensor, in parallel.
//!
//! Full tensors get every metric ([`crate::metrics`], read window by window from disk);
//! checksums get compared. Statistics differences are not stored: they follow from the two
//! sides' statistics a row holds ([`Measured::stat_diff`]), and a stored copy made every row
//! 128 bytes larger. Nothing here depends on tolerances: that is the judge's job.

use super::align::{records, MatchedBy, OpInfo, TensorMatch};
use super::Sides;
use crate::dtype::AnyDType;
use crate::dump::{RankDump, Role, Stats, Tensor};
use crate::error::{ProbeError, Result};
use crate::metrics::{self, Metrics, StatDiff};
use crate::tensor::ShardCache;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How a tensor pair was compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompareKind {
    /// Full tensors: every metric.
    Tensor,
    /// Checksums, with statistics where present.
    Checksum,
    /// Recorded statistics only.
    Statistics,
    /// Not compared: a side read memory nothing had written (`Tensor::unwritten`), whose
    /// leftover bytes no two runs share.
    Unwritten,
    /// Nothing usable on one side (no data, no statistics).
    None,
}

impl CompareKind {
    /// The name used in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            CompareKind::Tensor => "tensor",
            CompareKind::Checksum => "checksum",
            CompareKind::Statistics => "statistics",
            CompareKind::Unwritten => "unwritten",
            CompareKind::None => "none",
        }
    }
}

/// What one side recorded about a tensor, as reports show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorSide {
    /// Element type.
    pub dtype: AnyDType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Statistics recorded at capture time.
    pub stats: Option<Stats>,
    /// Read from memory nothing had written (`Tensor::unwritten`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unwritten: bool,
}

impl TensorSide {
    /// Number of elements.
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A measured tensor pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The comparison side's op.
    pub op: OpInfo,
    /// The comparison side's tensor name.
    pub name: String,
    /// The benchmark's tensor name, when it differs.
    #[serde(default)]
    pub bench_name: Option<String>,
    /// How the pair was found.
    #[serde(default)]
    pub matched_by: MatchedBy,
    /// Input, output or parameter.
    pub role: Role,
    /// An input that no captured op produced (weight, data, random tensor).
    pub external: bool,
    /// What each side recorded.
    pub sides: Sides<TensorSide>,
    /// How the pair was compared.
    pub kind: CompareKind,
    /// Metrics of full tensors (boxed: most rows of a large compare are statistics rows,
    /// which would otherwise each carry the room for them).
    pub metrics: Option<Box<Metrics>>,
    /// Whether the checksums agree, when both sides have one.
    pub checksum_equal: Option<bool>,
}

impl Measured {
    /// Differences of the recorded statistics, when both sides have them: derived from
    /// the two sides' statistics when asked for rather than stored in every row.
    pub fn stat_diff(&self) -> Option<StatDiff> {
        let s = &self.sides;
        Some(metrics::stat_diff(
            s.bench.stats.as_ref()?,
            s.cmp.stats.as_ref()?,
        ))
    }

    /// Whether the comparison side holds NaN/Inf that the benchmark does not.
    pub(crate) fn new_nonfinite(&self) -> bool {
        if let Some(m) = &self.metrics {
            return m.nonfinite_c > 0 && m.nonfinite_mismatch > 0;
        }
        nonfinite(&self.sides.cmp.stats) > 0 && nonfinite(&self.sides.bench.stats) == 0
    }

    /// Whether the comparison side holds any NaN/Inf.
    pub(crate) fn cmp_nonfinite(&self) -> bool {
        match &self.metrics {
            Some(m) => m.nonfinite_c > 0,
            None => nonfinite(&self.sides.cmp.stats) > 0,
        }
    }
}

/// Non-finite element count from recorded statistics (0 when unknown).
pub(crate) fn nonfinite(s: &Option<Stats>) -> u64 {
    s.as_ref().and_then(|s| s.nonfinite()).unwrap_or(0)
}

/// How a matched pair can be compared, from what both sides recorded.
fn kind_of(t: &Sides<Tensor>) -> CompareKind {
    let (b, c) = (t.bench, t.cmp);
    if b.unwritten() || c.unwritten() {
        CompareKind::Unwritten
    } else if b.shape() == c.shape() && b.data().is_some() && c.data().is_some() {
        CompareKind::Tensor
    } else if b.checksum().is_some() && c.checksum().is_some() {
        CompareKind::Checksum
    } else if b.stats().is_some() && c.stats().is_some() {
        CompareKind::Statistics
    } else {
        CompareKind::None
    }
}

/// The numbers of one pair, computed without taking the pair apart.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// How the pair was compared.
    pub kind: CompareKind,
    /// Metrics of full tensors.
    pub metrics: Option<Box<Metrics>>,
    /// Whether the checksums agree, when both sides have one.
    pub checksum_equal: Option<bool>,
}

/// Measures one pair (statistics differences are the judge's to derive, see
/// [`Measured::stat_diff`]).
pub(crate) fn measure(t: Sides<Tensor>, caches: &Sides<ShardCache>) -> Result<Measurement> {
    let kind = kind_of(&t);
    let (b, c) = (t.bench, t.cmp);
    let metrics = match (b.data(), c.data()) {
        (Some(bd), Some(cd)) if kind == CompareKind::Tensor => {
            let name = c.name();
            let bt = caches.bench.open(bd, &name, b.dtype(), b.shape())?;
            let ct = caches.cmp.open(cd, &name, c.dtype(), c.shape())?;
            Some(Box::new(metrics::compare_tensors(&bt, &ct)?))
        }
        _ => None,
    };
    let checksum_equal = match (b.checksum(), c.checksum()) {
        (Some(x), Some(y)) => Some(x == y),
        _ => None,
    };
    Ok(Measurement {
        kind,
        metrics,
        checksum_equal,
    })
}

impl Measured {
    /// A pair with its measurement; the records' names, shapes and statistics are copied in.
    pub fn new(
        by: MatchedBy,
        external: bool,
        op: OpInfo,
        tensors: Sides<Tensor>,
        x: Measurement,
    ) -> Measured {
        let Sides { bench: b, cmp: c } = tensors;
        let side = |t: Tensor| TensorSide {
            dtype: t.dtype().clone(),
            shape: t.shape().to_vec(),
            stats: t.stats(),
            unwritten: t.unwritten(),
        };
        let name = c.name().into_owned();
        let bench_name = (!b.name_is(&name)).then(|| b.name().into_owned());
        Measured {
            op,
            name,
            bench_name,
            matched_by: by,
            role: c.role(),
            external,
            sides: Sides::new(side(b), side(c)),
            kind: x.kind,
            metrics: x.metrics,
            checksum_equal: x.checksum_equal,
        }
    }
}

/// Measures `pairs` of the two op logs in parallel, keeping their order; `tick` is called
/// after each pair. The first error (in pair order) is returned, so the message does not
/// depend on thread timing.
pub(crate) fn measure_pairs(
    dumps: &Sides<RankDump>,
    pairs: &[TensorMatch],
    caches: &Sides<ShardCache>,
    tick: &(dyn Fn() + Sync),
) -> Result<Vec<Measurement>> {
    // Errors boxed while collected: a pair's slot is then 16 bytes instead of 80.
    let out: Vec<std::result::Result<Measurement, Box<ProbeError>>> = pairs
        .par_iter()
        .map(|m| {
            let r = measure(records(dumps, m), caches).map_err(Box::new);
            tick();
            r
        })
        .collect();
    out.into_iter()
        .collect::<std::result::Result<Vec<_>, Box<ProbeError>>>()
        .map_err(|e| *e)
}
