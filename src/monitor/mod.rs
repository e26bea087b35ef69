//! Monitor folders: the per-step metrics `probe.Monitor` writes (`rank<R>.arrows`, one row
//! per step and module; docs/monitor.md). A dump shows the steps a user chose; a monitor
//! shows every step at a cost of almost nothing, so it is where a user finds *which* step
//! to dump:
//!
//! - `read`: the files, read dense (a run killed mid-step keeps every completed step);
//! - `trend`: two runs, step by step: the first step where they part beyond an envelope
//!   calibrated on their first steps, and the rank, module and metric that part first;
//! - `events`: one run alone: its first NaN/Inf, loss and gradient-norm spikes, a loss
//!   scale that collapses, modules that die or explode;
//! - `recapture`: the capture configuration that dumps exactly that step (and the one
//!   before), rank and module.
//!
//! Within a step, "first" follows the data flow: the forward outputs in the order their
//! modules returned, the loss, the gradients in backward order, the learning rate and loss
//! scale, then what the optimizer made of them ([`flow`]).

pub mod events;
pub mod read;
pub mod recapture;
pub mod summary;
pub mod trend;

pub use read::{files, is_monitor, parse_rank, read_rank, RankSeries};

/// A step's data flow: where a metric of a module at position `order` (its forward's return
/// position in the step; None: not called, see [`module_order`]) comes, lowest first.
pub fn flow(metric: &str, order: Option<i32>) -> (u8, i64) {
    let pos = order.map_or(i64::MAX / 2, i64::from);
    match metric {
        "output_norm" | "output_nonfinite" => (0, pos),
        "loss" => (1, 0),
        // Backward runs the forward in reverse: the last module's gradients come first.
        "grad_norm" | "grad_nonfinite" => (2, -pos),
        "lr" | "loss_scale" => (3, 0),
        "update_norm" => (4, pos),
        m if m.starts_with("state_") => (5, pos),
        "param_norm" => (6, pos),
        _ => (7, pos),
    }
}

/// A module's position in a step's data flow: its own (the order its forward returned),
/// else, for a container that is never called itself (a `ModuleList`), the last of the
/// modules inside it that were called.
pub fn module_order(rank: &RankSeries, module: usize, step: usize) -> Option<i32> {
    if let Some(o) = rank.order(module, step) {
        return Some(o);
    }
    let name = &rank.modules[module];
    let prefix = format!("{name}.");
    rank.modules
        .iter()
        .enumerate()
        .filter(|(_, m)| name.is_empty() || m.starts_with(&prefix))
        .filter_map(|(i, _)| rank.order(i, step))
        .max()
}

/// The module that returned just before `module` in step index `step` (what fed it, for a
/// forward output): the one at the position before its own.
pub fn producer(rank: &RankSeries, module: usize, step: usize) -> Option<String> {
    let o = module_order(rank, module, step).filter(|&o| o > 0)?;
    (0..rank.modules.len())
        .find(|&i| rank.order(i, step) == Some(o - 1))
        .map(|i| rank.modules[i].clone())
}

/// How deep a module sits: 0 for the model, 1 for `layers`, 2 for `layers.0`.
pub fn depth(name: &str) -> usize {
    if name.is_empty() {
        0
    } else {
        name.matches('.').count() + 1
    }
}

/// A module as people read it: the root module (`""`) is the model.
pub fn module_label(name: &str) -> &str {
    if name.is_empty() {
        "(model)"
    } else {
        name
    }
}

/// A metric of one or two runs over the steps, as the html report draws it.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// What is drawn (`rank 0 layers.1 output_norm`).
    pub title: String,
    /// The steps.
    pub steps: Vec<i64>,
    /// Each run's values at those steps (None: not measured), with its label.
    pub lines: Vec<(String, Vec<Option<f64>>)>,
    /// The step to mark (where the runs part, or the event).
    pub mark: Option<i64>,
}

/// At most this many points of a curve: longer runs keep every n-th step and the marked one.
pub const CURVE_POINTS: usize = 1200;

/// A curve of `series` (each run's values by step index) over `steps`, thinned to
/// [`CURVE_POINTS`] (the marked step always kept).
pub fn curve(
    title: String,
    steps: &[i64],
    series: Vec<(String, Vec<f64>)>,
    mark: Option<i64>,
) -> Curve {
    let stride = steps.len().div_ceil(CURVE_POINTS).max(1);
    let keep: Vec<usize> = (0..steps.len())
        .filter(|&i| i % stride == 0 || Some(steps[i]) == mark || i + 1 == steps.len())
        .collect();
    Curve {
        title,
        steps: keep.iter().map(|&i| steps[i]).collect(),
        lines: series
            .into_iter()
            .map(|(label, v)| (label, keep.iter().map(|&i| read::present(v[i])).collect()))
            .collect(),
        mark,
    }
}
