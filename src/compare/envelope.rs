//! Verdicts calibrated against a reference run (`--reference REF`): drift or defect.
//!
//! Under low precision every tensor differs, and a fixed tolerance per dtype cannot tell the
//! drift the port chose (bf16 autocast) from a kernel a few percent off: bf16's error
//! tolerance sits above both. A reference run answers it: REF differs from the benchmark
//! only by expected drift (the benchmark's own device under the port's precision, or a
//! rerun), so its error on a tensor is what that tensor's drift looks like. A tensor of the
//! comparison run passes within `k` times the reference's error on the same tensor, at
//! least a floor of the dtype judged (the noise two devices' roundings bring where the reference
//! happens to have none), and fails beyond it, with the ratio in the reason. This is the
//! rule of Ascend's accuracy standard (an NPU op judged by its error relative to the GPU's
//! on the same inputs), applied to every tensor of a training step; the localiser's causal
//! rules then run on these verdicts unchanged.
//!
//! One tensor's reference error can be small by chance (a maximum that rounded well), so the
//! envelope is taken from the larger of it and the median reference error of the tensors of
//! the same API, direction and role in the unit ([`Envelope::of`]).

use super::measure::CompareKind;
use crate::dtype::DType;
use crate::op_key::Direction;
use std::collections::HashMap;

/// The reference run and how far the comparison may stray from its error.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// The reference dump's root.
    pub root: std::path::PathBuf,
    /// A comparison error up to `k` times the reference's (at least the dtype's floor)
    /// passes.
    pub k: f64,
}

/// What a compare's verdicts were calibrated against: a reference run (`--reference`) or
/// a calibration file (`--config` written by `probe calibrate`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "by", rename_all = "lowercase")]
pub enum Source {
    /// A reference run, compared unit by unit.
    Reference {
        /// Its root.
        path: std::path::PathBuf,
        /// `k`.
        k: f64,
    },
    /// A calibration file's rules.
    File {
        /// The file.
        path: std::path::PathBuf,
        /// `k`.
        k: f64,
    },
}

impl Source {
    /// The reference run or file, as given.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Source::Reference { path, .. } | Source::File { path, .. } => path,
        }
    }

    /// `k`.
    pub fn k(&self) -> f64 {
        match self {
            Source::Reference { k, .. } | Source::File { k, .. } => *k,
        }
    }

    /// `reference` or `file`.
    pub fn by(&self) -> &'static str {
        match self {
            Source::Reference { .. } => "reference",
            Source::File { .. } => "file",
        }
    }
}

/// The default `k`: a correct port's error, from another device's roundings, stays within a
/// few times the reference's (the correct ports of `python/tests/test_reference.py` pass
/// down to 1.5); a kernel a few per cent off under bf16 is several times it.
pub const DEFAULT_K: f64 = 4.0;

/// The smallest envelope for a dtype judged: the machine epsilon of bf16 and fp16 (one
/// unit in the last place at 1: two implementations that round at other points, such as
/// eager and fused attention, differ by about that much however small the reference's
/// error on the tensor happens to be), and 2^-20 (16 ulps) for float32 and float64, where
/// two devices' orders of summation differ by more than one rounding.
pub fn floor(dtype: Option<DType>) -> f64 {
    match dtype {
        Some(DType::BF16) => 2f64.powi(-7),
        Some(DType::F16) => 2f64.powi(-10),
        _ => 2f64.powi(-20),
    }
}

/// The error measure a reference calibrates, of a pair measured as `kind` with error `err`
/// (`atol` forgiven) and `raw` (scale-free): full tensors by their relative L2 error with
/// nothing forgiven (`atol`·√n of slack on the difference's norm swallows a whole gradient
/// of 1e-5 values, and with it a faulty kernel's backward), statistics with `atol` forgiven
/// per statistic (a gradient's mean of 1e-7 differs relatively by anything, in the
/// reference too).
pub fn measure(kind: CompareKind, err: f64, raw: f64) -> f64 {
    match kind {
        CompareKind::Statistics => err,
        _ => raw,
    }
}

/// What one tensor is judged against under a reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The reference's error on this tensor, or the median of its group's when larger.
    pub reference: f64,
    /// `k`.
    pub k: f64,
}

impl Bound {
    /// The error past which the tensor fails: `k` × the reference's error, at least the
    /// floor.
    pub fn error(&self, dtype: Option<DType>) -> f64 {
        (self.k * self.reference).max(floor(dtype))
    }

    /// The error past which it warns: half way from the reference's own error to the
    /// error envelope, at least the floor.
    pub fn warning(&self, dtype: Option<DType>) -> f64 {
        ((1.0 + self.k) / 2.0 * self.reference).max(floor(dtype))
    }
}

/// A unit's reference errors by benchmark tensor name.
#[derive(Debug, Clone, Default)]
pub struct Envelope {
    by_tensor: HashMap<Box<str>, f64>,
    k: f64,
}

/// One reference measurement.
pub struct Measured<'a> {
    /// The benchmark tensor's name.
    pub name: std::borrow::Cow<'a, str>,
    /// Its op's API or module (the key without call counter and direction).
    pub api: &'a str,
    /// Its op's direction.
    pub direction: Direction,
    /// Whether it is an output of its op.
    pub output: bool,
    /// The reference run's error on it.
    pub err: f64,
}

/// The tensors whose reference errors are alike: of one API, direction and role.
type Group<'a> = (&'a str, Direction, bool);

impl Envelope {
    /// The envelope of the reference's measurements (finite errors only: a reference
    /// tensor of another shape or with NaN says nothing of drift).
    pub fn of<'a>(measured: impl Iterator<Item = Measured<'a>>, k: f64) -> Envelope {
        let mut groups: HashMap<Group, Vec<f64>> = HashMap::new();
        let mut own: Vec<(Box<str>, Group, f64)> = Vec::new();
        for m in measured.filter(|m| m.err.is_finite()) {
            let g = (m.api, m.direction, m.output);
            groups.entry(g).or_default().push(m.err);
            own.push((m.name.into_owned().into_boxed_str(), g, m.err));
        }
        let medians: HashMap<Group, f64> = groups
            .into_iter()
            .map(|(g, mut v)| {
                v.sort_by(f64::total_cmp);
                (g, v[v.len() / 2])
            })
            .collect();
        let by_tensor = own
            .into_iter()
            .map(|(name, g, err)| (name, err.max(medians.get(&g).copied().unwrap_or(0.0))))
            .collect();
        Envelope { by_tensor, k }
    }

    /// Whether the reference measured tensors and none differs: it is the benchmark again
    /// (or of its precision), and shows no drift.
    pub fn shows_no_drift(&self) -> bool {
        !self.by_tensor.is_empty() && self.by_tensor.values().all(|&e| e == 0.0)
    }

    /// The bound of the benchmark tensor `name`, if the reference has it.
    pub fn bound(&self, name: &str) -> Option<Bound> {
        self.by_tensor.get(name).map(|&reference| Bound {
            reference,
            k: self.k,
        })
    }
}
