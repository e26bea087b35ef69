//! What the passes of a unit note for the person reading the run, as typed values, and the
//! one place that words them. A pass says *what* it found ([`Note`]); the warnings of the
//! unit's summary, the terminal and every report carry the words made here.

use super::super::micro_batch::{Batching, InputSizes, MicroBatches};
use crate::schema::compare::LossScale;

/// Something a pass found that changes how the unit's comparison reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Note {
    /// A reader's own warning (a truncated log, a missing tensor file), in its words.
    Read(String),
    /// The runs were captured at other levels: compared at the level they share, or
    /// nothing can pair (the level's own sentence: `prepare::common_level`).
    Level(String),
    /// A run's loss scaler skipped the step: `bench`, `cmp` or `both`.
    ScalerSkipped(&'static str),
    /// The runs take the step's batch in other numbers of forward passes.
    MicroBatches(MicroBatches),
    /// The runs read data of other sizes.
    InputSizes(InputSizes),
    /// The comparison run's gradients are a power of two times the benchmark's.
    LossScale(LossScale),
    /// The reference run (`--reference`) lacks counterparts for a share of the benchmark's
    /// tensors: (unmatched, benchmark tensors).
    ReferenceLacks(usize, usize),
    /// The reference run's reader found it incomplete or damaged (its words).
    ReferenceRead(String),
    /// The reference run equals the benchmark on every tensor they share: it shows no drift.
    ReferenceEqual,
}

impl Note {
    /// The notes a batching difference makes.
    pub(crate) fn of_batching(b: &Batching) -> Note {
        match b {
            Batching::Micro(m) => Note::MicroBatches(m.clone()),
            Batching::Sizes(i) => Note::InputSizes(i.clone()),
        }
    }

    /// The warning it makes in unit `step`/`rank`.
    pub(crate) fn said(&self, step: &str, rank: &str) -> String {
        match self {
            Note::Read(w) | Note::Level(w) => w.clone(),
            Note::ReferenceRead(w) => format!(
                "{step}/{rank}: the reference run: {w}; what it lacks is judged by the \
                 tolerances"
            ),
            Note::ReferenceEqual => format!(
                "{step}/{rank}: the reference run equals the benchmark on every tensor they \
                 share (the same run, or the same precision?): it shows no drift, so every \
                 tensor is judged against its dtype's floor; give the benchmark's device \
                 under the port's precision"
            ),
            Note::ReferenceLacks(n, of) => format!(
                "{step}/{rank}: the reference run has no counterpart for {n} of the \
                 benchmark's {of} tensors (another model, configuration or capture?): they \
                 are judged by the tolerances, not against the reference"
            ),
            Note::ScalerSkipped(side) => {
                let who = if *side == "both" {
                    "both runs' loss scalers".to_string()
                } else {
                    format!("the {side} run's loss scaler")
                };
                format!(
                    "{step}/{rank}: {who} skipped this step (found_inf set: gradients \
                     overflowed under the loss scale); NaN/Inf in its backward is the \
                     scaler's, and it updated no weights"
                )
            }
            Note::MicroBatches(m) => format!(
                "{step}/{rank}: {}: gradient accumulation differs, so the runs' calls pair \
                 only in part; compare runs with the same micro-batch size",
                m.brief()
            ),
            Note::InputSizes(i) => format!(
                "{step}/{rank}: {}: their batch size, sequence length or data differ, so \
                 every call reads other data; compare runs of the same configuration \
                 (config-check: hyperparameters, data)",
                i.brief()
            ),
            Note::LossScale(s) => format!(
                "{step}/{rank}: the cmp run's gradients are {} the bench's from {} on: a \
                 loss scale (AMP's GradScaler, a static loss_scale); their statistics are \
                 compared divided by it, their data and checksums not compared",
                s.brief(),
                s.at
            ),
        }
    }
}
