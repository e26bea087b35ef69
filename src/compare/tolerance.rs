//! The tolerance table: thresholds per dtype (defaults) and per op pattern (TOML overrides).
//! The rules that apply them are in [`super::judge`].
//!
//! A tensor is judged by its relative L2 error (‖c − b‖ − atol·√n) / ‖b‖ (robust to the
//! reordering of float sums that any two devices do; forgiving `atol` per element, as
//! allclose does, keeps tensors that are zero up to rounding, like the gradient of a bias
//! followed by a normalisation, from exploding) and warned on by its largest elementwise error scaled by the tensor's largest
//! magnitude (so a handful of wild elements cannot hide). The thresholds
//! come from the *less precise* of the two dtypes, so a bf16 run against an fp32 benchmark
//! is judged by what bf16 can do. Defaults can be overridden per dtype and per op pattern
//! in a TOML file (`probe compare --config`), documented in docs/compare.md.

use super::envelope::{Bound, Source};
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
pub use crate::vocab::Verdict;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Thresholds for one dtype or op pattern.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tol {
    /// Relative L2 error above which a tensor is a warning.
    pub warning: f64,
    /// Relative L2 error above which a tensor is an error.
    pub error: f64,
    /// max|c − b| / max|b| above which a tensor is a warning (elementwise outliers; an error
    /// would fire on every sign flip near zero in a low-precision run).
    pub max_abs: f64,
    /// Absolute difference forgiven per element (RMS): ‖c − b‖ up to atol·√n counts as
    /// equal. torch.testing's default absolute tolerance.
    pub atol: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartialTol {
    warning: Option<f64>,
    error: Option<f64>,
    max_abs: Option<f64>,
    atol: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpRule {
    pattern: String,
    /// A calibration's reference error for the tensors it matches (`probe calibrate`):
    /// they are judged against `k` times it, as against a reference run.
    reference: Option<f64>,
    /// The calibration found the op's outputs differ from run to run (`--reruns`).
    #[serde(default)]
    nondeterministic: bool,
    #[serde(flatten)]
    tol: PartialTol,
}

/// Where a calibration file came from (`probe calibrate` writes it; compare reads `k`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCalibration {
    k: f64,
    #[allow(dead_code)] // a person's record of the runs, not read
    #[serde(default)]
    source: Vec<String>,
    #[allow(dead_code)]
    quantile: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    dtype: BTreeMap<String, PartialTol>,
    #[serde(default)]
    op: Vec<OpRule>,
    local_gain: Option<f64>,
    blame_without_inputs: Option<bool>,
    calibration: Option<RawCalibration>,
}

/// What a calibration file says of the tensors one of its rules matches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Calibrated {
    /// Their reference error and `k`.
    pub bound: Bound,
    /// Their op's outputs differ from run to run.
    pub nondeterministic: bool,
}

/// The tolerance table in force for a compare.
#[derive(Debug, Clone)]
pub struct Tolerances {
    by_dtype: BTreeMap<DType, Tol>,
    /// The `[[op]]` rules in order, with what a calibration file's rule (`probe calibrate`)
    /// says of the tensors it matches.
    rules: Vec<(glob::Pattern, PartialTol, Option<Calibrated>)>,
    /// The calibration file, when the table came from one.
    calibration: Option<Source>,
    /// An op whose inputs differ is blamed only if its output error exceeds this many times
    /// its largest input error: otherwise it is carrying (or mildly amplifying) inherited error.
    pub local_gain: f64,
    /// Whether an op with no recorded inputs (a `parameters_grad` record, a tensor
    /// creation) can be named locally divergent. Off by default: with nothing it consumed
    /// on record, nothing shows that the difference starts there (a parameter's gradient
    /// is computed by the backward ops before it).
    pub blame_without_inputs: bool,
}

fn default_tol(d: DType) -> Tol {
    match d {
        DType::F64 => Tol {
            warning: 1e-10,
            error: 1e-7,
            max_abs: 1e-6,
            atol: 1e-7,
        },
        DType::F32 => Tol {
            warning: 1e-5,
            error: 1e-4,
            max_abs: 1e-3,
            atol: 1e-5,
        },
        DType::F16 => Tol {
            warning: 2e-3,
            error: 2e-2,
            max_abs: 5e-2,
            atol: 1e-5,
        },
        DType::BF16 => Tol {
            warning: 1.6e-2,
            error: 1e-1,
            max_abs: 2e-1,
            atol: 1e-5,
        },
        // Integers and booleans are exact.
        _ => Tol {
            warning: 0.0,
            error: 0.0,
            max_abs: 0.0,
            atol: 0.0,
        },
    }
}

const ALL_DTYPES: [DType; 10] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U8,
    DType::Bool,
];

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            by_dtype: ALL_DTYPES.iter().map(|&d| (d, default_tol(d))).collect(),
            rules: Vec::new(),
            calibration: None,
            local_gain: 10.0,
            blame_without_inputs: false,
        }
    }
}

fn apply(t: &mut Tol, p: &PartialTol) {
    if let Some(v) = p.warning {
        t.warning = v;
    }
    if let Some(v) = p.error {
        t.error = v;
    }
    if let Some(v) = p.max_abs {
        t.max_abs = v;
    }
    if let Some(v) = p.atol {
        t.atol = v;
    }
}

fn check(t: &PartialTol) -> std::result::Result<(), String> {
    for v in [t.warning, t.error, t.max_abs, t.atol]
        .into_iter()
        .flatten()
    {
        if v.is_nan() || v < 0.0 {
            return Err(format!("tolerance {v} must be a non-negative number"));
        }
    }
    Ok(())
}

impl Tolerances {
    /// Reads a TOML tolerance file on top of the defaults.
    pub(crate) fn from_file(path: &Path) -> Result<Tolerances> {
        let text = crate::config_file::read(path)?;
        Tolerances::from_toml(&text, path)
    }

    /// Parses the text of a TOML tolerance file on top of the defaults (`path` only names
    /// it in errors). `Tolerances::from_file` reads the file and calls this.
    pub fn from_toml(text: &str, path: &Path) -> Result<Tolerances> {
        let bad = |msg: String| ProbeError::BadConfig {
            path: path.to_path_buf(),
            msg,
        };
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| bad(crate::config_file::printable(e.message())))?;
        let mut t = Tolerances::default();
        for (name, p) in &raw.dtype {
            let d = DType::parse(name).ok_or_else(|| bad(format!("unknown dtype {name:?}")))?;
            check(p).map_err(&bad)?;
            if let Some(e) = t.by_dtype.get_mut(&d) {
                apply(e, p);
            }
        }
        let k = match &raw.calibration {
            Some(c) if c.k.is_finite() && c.k >= 1.0 => Some(c.k),
            Some(c) => return Err(bad(format!("calibration k {} must be at least 1", c.k))),
            None => None,
        };
        for r in raw.op {
            let pat = glob::Pattern::new(&r.pattern)
                .map_err(|e| bad(format!("op pattern {:?}: {e}", r.pattern)))?;
            check(&r.tol).map_err(&bad)?;
            let calibrated = match r.reference {
                None => None,
                Some(reference) => {
                    let k = k.ok_or_else(|| {
                        bad(format!(
                            "op pattern {:?} has a reference error but the file no [calibration] k",
                            r.pattern
                        ))
                    })?;
                    if !(reference.is_finite() && reference >= 0.0) {
                        return Err(bad(format!(
                            "reference {reference} must be a non-negative number"
                        )));
                    }
                    Some(Calibrated {
                        bound: Bound { reference, k },
                        nondeterministic: r.nondeterministic,
                    })
                }
            };
            t.rules.push((pat, r.tol, calibrated));
        }
        if let Some(g) = raw.local_gain {
            if g.is_nan() || g < 1.0 {
                return Err(bad(format!("local_gain {g} must be at least 1")));
            }
            t.local_gain = g;
        }
        if let Some(b) = raw.blame_without_inputs {
            t.blame_without_inputs = b;
        }
        t.calibration = k.map(|k| Source::File {
            path: path.to_path_buf(),
            k,
        });
        Ok(t)
    }

    /// The calibration file in force, if the table came from one.
    pub(crate) fn calibration(&self) -> Option<Source> {
        self.calibration.clone()
    }

    /// Whether a calibration file is in force.
    pub(crate) fn has_calibration(&self) -> bool {
        self.calibration.is_some()
    }

    /// The tolerance for a tensor of `op`: from the less precise dtype, then the first op
    /// rule whose pattern matches the op key or the tensor name; with what that rule says
    /// as a calibration file's, if it is one (one match per tensor for both).
    pub(crate) fn lookup<'t>(
        &self,
        op: &str,
        tensor: impl FnOnce() -> std::borrow::Cow<'t, str>,
        b: Option<DType>,
        c: Option<DType>,
    ) -> (Tol, Option<Calibrated>) {
        let d = match (b, c) {
            (Some(x), Some(y)) => loosest(x, y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => DType::F32,
        };
        let mut t = self.by_dtype.get(&d).copied().unwrap_or(default_tol(d));
        if self.rules.is_empty() {
            return (t, None);
        }
        // The tensor's name is only built when a rule may match it.
        let tensor = tensor();
        let rule = self
            .rules
            .iter()
            .find(|(pat, _, _)| pat.matches(op) || pat.matches(&tensor));
        match rule {
            Some((_, p, calibrated)) => {
                apply(&mut t, p);
                (t, *calibrated)
            }
            None => (t, None),
        }
    }
}

/// The dtype whose tolerance applies when two dtypes meet: the less precise float.
pub(crate) fn loosest(a: DType, b: DType) -> DType {
    let rank = |d: DType| match d {
        DType::BF16 => 0,
        DType::F16 => 1,
        DType::F32 => 2,
        DType::F64 => 3,
        _ => 4,
    };
    if rank(a) <= rank(b) {
        a
    } else {
        b
    }
}
