//! Where a divergence enters, as a finding of `summary.json` says it (`super::summary`):
//! what a tensor from outside the captured ops is ([`Outside`]), the previous step's op
//! whose output it is ([`Carried`]), an op only one run calls ([`OneSided`]).

use crate::vocab::Side;
use serde::{Deserialize, Serialize};

/// What a tensor from outside the captured ops is, as far as the dump tells (its module
/// and gradient records, by their statistics bit for bit).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Outside {
    /// What kind of tensor it is.
    pub kind: OutsideKind,
    /// The parameter's dotted name (`transformer.wte.weight`), for a parameter or gradient.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    /// A parameter held as one with this one in one run and as two in the other (tied
    /// weights on one side only): its dotted name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_with: Option<String>,
    /// The run that ties them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_in: Option<Side>,
    /// For a gradient that autograd left the same in both runs: the run that changed it
    /// before its optimizer read it (clipping, unscaling, a hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_in: Option<Side>,
}

/// The kind of a tensor from outside the captured ops.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OutsideKind {
    /// A model parameter.
    Parameter,
    /// A parameter's gradient.
    Gradient,
    /// Integer or boolean data: ids, labels, masks.
    Data,
    /// Something else: a buffer, a data batch, a random draw.
    Other,
}

/// The captured op of the previous step whose output a differing input is (the same
/// statistics in both runs, bit for bit), where that output differed only by rounding noise
/// the op amplified: a warning there (a normalised update of a near-zero gradient).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Carried {
    /// Its step.
    pub step: String,
    /// Its op key.
    pub op: String,
    /// The output.
    pub tensor: String,
}

impl Outside {
    /// The tie on one side only, for a person: "`a` and `b` are one parameter in the
    /// benchmark and two in the comparison run"; empty for none.
    pub fn tie(&self) -> String {
        let (Some(p), Some(w), Some(side)) = (&self.parameter, &self.tied_with, self.tied_in)
        else {
            return String::new();
        };
        format!(
            "`{p}` and `{w}` are one parameter in {} and two in {}",
            side.run(),
            side.other().run()
        )
    }

    /// What the headline says of it before the tensor's name: "the gradient of
    /// `wte.weight` (tied with `lm_head.weight` in the benchmark only), "; empty where the
    /// dump does not tell.
    pub fn headline(&self) -> String {
        let of = |what: &str| match &self.parameter {
            Some(p) => format!("{what} `{p}`"),
            None => what.to_string(),
        };
        let said = match self.kind {
            OutsideKind::Parameter => of("the parameter"),
            OutsideKind::Gradient => of("the gradient of"),
            OutsideKind::Data => "data".to_string(),
            OutsideKind::Other => return String::new(),
        };
        if let Some(side) = self.changed_in {
            return format!("{said} after {} changed it, ", side.run());
        }
        match (&self.tied_with, self.tied_in) {
            (Some(w), Some(side)) => format!("{said} (tied with `{w}` in {} only), ", side.run()),
            _ => format!("{said}, "),
        }
    }
}

/// An op only one run calls, named as the source of an input that differs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OneSided {
    /// The run that calls it: `bench` or `cmp`.
    pub side: String,
    /// Its op key.
    pub op: String,
    /// The innermost frame of its call stack, when that run recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// What the stretch of ops only that run calls computes, where its ops tell
    /// (`gradient clipping`: a scaling of the gradients by a coefficient from their norm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computes: Option<String>,
}

impl OneSided {
    /// `Tensor.__mul__.0.forward, which only the comparison run calls (File ...)`, as a
    /// headline names it.
    pub(crate) fn said(&self) -> String {
        let run = if self.side == "cmp" {
            "comparison run"
        } else {
            "benchmark"
        };
        let at = self
            .at
            .as_ref()
            .map_or(String::new(), |f| format!(" ({f})"));
        match &self.computes {
            Some(what) => format!("{what} only the {run} runs ({}{at})", self.op),
            None => format!("{}, which only the {run} calls{at}", self.op),
        }
    }
}
