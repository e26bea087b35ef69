//! A judged tensor pair as every reader sees it: what was measured and what the judge made
//! of it ([`Row`]), and how surely its two sides are equal ([`Equality`]). Apart from the
//! judge's rules (`judge.rs`) and its compact store (`judged.rs`), which both speak of rows.

use super::measure::{CompareKind, Measured};
use crate::dtype::DType;
use crate::op_key::{Direction, Role};
use crate::vocab::Verdict;
use serde::{Deserialize, Serialize};

/// The judge's word on one tensor pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Pass, warning or error.
    pub verdict: Verdict,
    /// Why, for a person (empty for a pass).
    pub reason: String,
    /// The judged error measure (relative L2, or scaled statistics error): the smallest
    /// error tolerance that would pass this tensor.
    pub err: f64,
    /// The same measure without the absolute floor (scale-free): what the localiser compares
    /// between an op's inputs and outputs, since an op may rescale its data.
    pub raw_err: f64,
    /// The error tolerance applied.
    pub tolerance: f64,
    /// The precision floor in force (see the module docs).
    pub precision: Option<DType>,
    /// The reference run's error on the same tensor (its envelope's base, see
    /// `compare::envelope`), when the verdict was calibrated against one.
    #[serde(default)]
    pub reference: Option<f64>,
}

/// A judged tensor pair: one row of every report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// What was measured.
    pub tensor: Measured,
    /// What the judge made of it.
    pub judgement: Judgement,
}

/// How far the two sides of a pair are known to agree, when no difference was measured at
/// all. The words differ because the evidence does: equal statistics say nothing about the
/// elements (a permutation, or a sign flip that cancels in the mean, keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Equality {
    /// Every recorded statistic is equal; the elements themselves were not compared.
    Statistics,
    /// The data is equal: every element (tensor mode) or the checksums.
    Bitwise,
}

impl Row {
    /// Whether, and how surely, the two sides are equal. None when any difference was
    /// measured, even one within tolerance (`atol` forgives a difference, it does not make
    /// the data equal: a pass with `rel_l2 = 2e-3` is not "identical").
    pub fn equality(&self) -> Option<Equality> {
        let (t, j) = (&self.tensor, &self.judgement);
        if j.verdict != Verdict::Pass {
            return None;
        }
        match t.kind {
            CompareKind::Tensor => t
                .metrics
                .as_ref()
                .filter(|m| m.euclid == 0.0 && m.nonfinite_mismatch == 0)
                .map(|_| Equality::Bitwise),
            CompareKind::Checksum if t.checksum_equal == Some(true) => Some(Equality::Bitwise),
            CompareKind::Checksum | CompareKind::Statistics => {
                (j.raw_err == 0.0).then_some(Equality::Statistics)
            }
            CompareKind::Unwritten | CompareKind::None => None,
        }
    }

    /// Whether it is something its op consumed: an input, or a parameter of a forward call
    /// (a backward call's parameter records are the gradients it produced).
    pub fn consumed(&self) -> bool {
        let t = &self.tensor;
        t.role == Role::Input || (t.role == Role::Parameter && t.op.direction == Direction::Forward)
    }

    /// Bitwise equal on both sides: every element, or the checksums.
    pub fn identical(&self) -> bool {
        self.equality() == Some(Equality::Bitwise)
    }
}
