//! What a tensor no captured op produced *is*, so that "the divergence enters from outside"
//! can say which outside and what to check: a model parameter (which one), a parameter's
//! gradient (which one, and whether the parameter is shared by two modules on one side
//! only: tied weights), data (integer inputs: token ids, labels, masks), or a tensor held
//! outside the parameters (a buffer computed from a config value, a random draw).
//!
//! The dump tells: at module and mix level every module record holds its own parameters
//! (`Module.{path}.{Class}.forward.N.parameters.{name}`) and every parameter's gradient is
//! recorded once a step (`Module.{path}.{Class}.parameters_grad.{name}`); an API op's input
//! that is one of them carries the same statistics, bit for bit. At API level there are no
//! such records, and the tensor is named by its kind alone.

use super::context::Context;
use super::rows::discrete;
use crate::compare::judge::Row;
use crate::dump::Role;
use crate::op_key::{module_path, OpKind};
use crate::schema::summary::{Outside, OutsideKind};
use crate::vocab::Side;
use std::collections::BTreeMap;

/// What an outside tensor is.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Identity {
    /// A model parameter, by its dotted name (`transformer.wte.weight`).
    Parameter(String),
    /// The gradient of a parameter, by the parameter's dotted name, and the parameter it
    /// is tied with on one side only (the side, the other parameter's name).
    Gradient(String, Option<Tied>),
    /// What one run's optimizer reads in place of a parameter's gradient, which autograd
    /// left the same in both runs: that run changed it after backward (clipping, scaling, a
    /// hook). The parameter's dotted name, and that run.
    Changed(String, Side),
    /// Integer or boolean data: token ids, labels, positions, masks.
    Data,
    /// A floating-point tensor that is neither a recorded parameter nor a gradient, read
    /// inside this module, where the dump says.
    Unknown(Option<String>),
    /// A floating-point tensor of a dump that records no parameters (API level).
    Unrecorded,
}

/// A parameter shared by two modules in one run and held twice in the other.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tied {
    /// The run that ties them.
    pub side: Side,
    /// The other module's name for it.
    pub with: String,
}

/// A recorded parameter or gradient: its dotted name and both sides' statistics, bit for
/// bit (None where not all four statistics are recorded and finite).
struct Known {
    name: String,
    /// The two runs' values are within tolerance.
    agree: bool,
    bench: Option<[u64; 4]>,
    cmp: Option<[u64; 4]>,
}

/// The unit's recorded parameters and gradients (empty at API level).
pub(super) struct Catalogue {
    parameters: Vec<Known>,
    gradients: Vec<Known>,
}

impl Catalogue {
    /// Reads the module and parameter-gradient records of the unit.
    pub(super) fn of(cx: &Context) -> Catalogue {
        let mut parameters = BTreeMap::new();
        let mut gradients = BTreeMap::new();
        for k in 0..cx.unit.ops() {
            let key = cx.unit.key(k);
            let (into, kind) = match key.kind() {
                OpKind::Module => (&mut parameters, "parameters."),
                OpKind::ParametersGrad => (&mut gradients, "parameters_grad."),
                OpKind::Api => continue,
            };
            let Some(path) = module_path(key.text()) else {
                continue;
            };
            for r in cx.unit.rows(k).iter() {
                if r.tensor.role != Role::Parameter {
                    continue;
                }
                let Some((_, pname)) = r.tensor.name.rsplit_once(kind) else {
                    continue;
                };
                let name = format!("{path}.{pname}");
                let known = Known {
                    name: name.clone(),
                    agree: r.judgement.verdict != crate::vocab::Verdict::Error,
                    bench: fingerprint(r, true),
                    cmp: fingerprint(r, false),
                };
                into.entry(name).or_insert(known);
            }
        }
        Catalogue {
            parameters: parameters.into_values().collect(),
            gradients: gradients.into_values().collect(),
        }
    }

    /// What input `r` of an op is, by its statistics.
    pub(super) fn identify(&self, r: &Row) -> Identity {
        if discrete(r) {
            return Identity::Data;
        }
        let (bench, cmp) = (fingerprint(r, true), fingerprint(r, false));
        if let Some(g) = find(&self.gradients, bench, cmp) {
            // The recorded gradient is what one run's optimizer reads but not the other's,
            // though autograd left it the same in both: the other changed it.
            let (on_bench, on_cmp) = (g.bench == bench, g.cmp == cmp);
            if g.agree && on_bench != on_cmp {
                let changer = if on_cmp { Side::Bench } else { Side::Cmp };
                return Identity::Changed(g.name.clone(), changer);
            }
            return Identity::Gradient(g.name.clone(), self.tied(g));
        }
        match find(&self.parameters, bench, cmp) {
            Some(p) => Identity::Parameter(p.name.clone()),
            None if self.parameters.is_empty() => Identity::Unrecorded,
            None => Identity::Unknown(r.tensor.op.module_path()),
        }
    }

    /// A parameter tied with another in one run only, as the identity of the gradient it
    /// has (the first by name, if there are several).
    pub(super) fn tie(&self) -> Option<Identity> {
        self.gradients.iter().find_map(|g| {
            self.tied(g)
                .map(|t| Identity::Gradient(g.name.clone(), Some(t)))
        })
    }

    /// The parameter whose gradient is `g`'s in one run only: the same statistics bit for
    /// bit (one tensor, shared by two modules) on that side, others on the other.
    fn tied(&self, g: &Known) -> Option<Tied> {
        self.gradients
            .iter()
            .filter(|o| o.name != g.name)
            .find_map(|o| {
                let bench = g.bench.is_some() && o.bench == g.bench;
                let cmp = g.cmp.is_some() && o.cmp == g.cmp;
                (bench != cmp).then(|| Tied {
                    side: if bench { Side::Bench } else { Side::Cmp },
                    with: o.name.clone(),
                })
            })
    }
}

/// The known tensor with these statistics, the comparison side's first: of two parameters
/// tied in the benchmark (one tensor, the same statistics there), the one the tensor is in
/// the comparison run is meant.
fn find(known: &[Known], bench: Option<[u64; 4]>, cmp: Option<[u64; 4]>) -> Option<&Known> {
    let on_cmp = cmp.and_then(|w| known.iter().find(|k| k.cmp == Some(w)));
    on_cmp.or_else(|| bench.and_then(|w| known.iter().find(|k| k.bench == Some(w))))
}

/// One side's statistics of a row, bit for bit.
fn fingerprint(r: &Row, bench: bool) -> Option<[u64; 4]> {
    let s = &r.tensor.sides;
    let side = if bench { &s.bench } else { &s.cmp };
    side.stats.as_ref()?.fingerprint()
}

impl Identity {
    /// Whether the dump tells what the tensor is (a parameter, a gradient, data).
    pub(super) fn known(&self) -> bool {
        !matches!(self, Identity::Unknown(_) | Identity::Unrecorded)
    }

    /// What the tensor is, as data.
    pub(super) fn outside(&self) -> Outside {
        let (kind, parameter, tied) = match self {
            Identity::Parameter(p) => (OutsideKind::Parameter, Some(p), None),
            Identity::Gradient(p, t) => (OutsideKind::Gradient, Some(p), t.as_ref()),
            Identity::Changed(p, _) => (OutsideKind::Gradient, Some(p), None),
            Identity::Data => (OutsideKind::Data, None, None),
            Identity::Unknown(_) | Identity::Unrecorded => (OutsideKind::Other, None, None),
        };
        Outside {
            kind,
            parameter: parameter.cloned(),
            tied_with: tied.map(|t| t.with.clone()),
            tied_in: tied.map(|t| t.side),
            changed_in: match self {
                Identity::Changed(_, side) => Some(*side),
                _ => None,
            },
        }
    }

    /// What the tensor is, for a person: "the parameter `a.weight`".
    pub(super) fn said(&self) -> String {
        match self {
            Identity::Parameter(p) => format!("the parameter `{p}`"),
            Identity::Gradient(p, _) => format!("the gradient of `{p}`"),
            Identity::Changed(p, side) => format!(
                "the gradient of `{p}` as {} changed it after backward",
                side.run()
            ),
            Identity::Data => "data (integer: token ids, labels, positions or a mask)".into(),
            Identity::Unknown(None) => "a tensor no captured op produced".into(),
            Identity::Unknown(Some(m)) => format!(
                "a tensor no captured op produced, read in `{m}`, and none of the model's \
                 recorded parameters"
            ),
            Identity::Unrecorded => {
                "a tensor no captured op produced (weight, data batch or random draw)".into()
            }
        }
    }

    /// What to check first, given what the tensor is.
    pub(super) fn advice(&self) -> String {
        match self {
            Identity::Parameter(p) => format!(
                "Check how `{p}` is initialised or loaded on each side (config-check's \
                 weights: a checkpoint converted for the port, another seed or init) before \
                 suspecting this op"
            ),
            Identity::Gradient(p, Some(t)) => {
                let (tying, other) = (t.side.run(), t.side.other().run());
                format!(
                    "`{p}` and `{}` are one parameter in {tying} (their gradients are one \
                     tensor) and two in {other}: the weights are tied on one side and \
                     untied on the other (a converter that copies the tied weight, or \
                     `tie_word_embeddings` set differently), so autograd sums the uses of \
                     `{p}` differently. Tie them the same way on both sides",
                    t.with
                )
            }
            Identity::Changed(p, side) => {
                let (changes, other) = (side.run(), side.other().run());
                format!(
                    "Autograd left the gradient of `{p}` the same in both runs (its \
                     parameters_grad record agrees), but {changes} changes it before its \
                     optimizer reads it and {other} does not: gradient clipping \
                     (`clip_grad_norm_`), unscaling or a gradient hook on one side only. \
                     Clip and scale the same way on both sides"
                )
            }
            Identity::Gradient(p, None) => format!(
                "autograd forms the gradient of `{p}` outside the captured ops, summing the \
                 gradients of its uses: check that `{p}` is used in the same places on both \
                 sides (a weight shared or tied on one side only, a use outside the captured \
                 modules) and that no gradient hook or clipping changes it on one side only"
            ),
            Identity::Data => "Check config-check's dataset and random seeds (the batch, its \
                               padding and masks) before suspecting this op"
                .into(),
            Identity::Unknown(module) => {
                let held = match module {
                    Some(m) => format!("a buffer of `{m}` or its modules"),
                    None => "a buffer".to_string(),
                };
                format!(
                    "At module or mix level the dump holds every module's parameters, so it \
                     is {held} computed from a config value (rotary frequencies from \
                     `rope_theta`, say), a data batch or a random draw. Check config-check's \
                     hyperparameters (the model configs), dataset and random seeds before \
                     suspecting this op"
                )
            }
            Identity::Unrecorded => "Check the config-check categories (weights, dataset, \
                                     random seeds) before suspecting this op"
                .into(),
        }
    }
}
