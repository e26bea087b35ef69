//! What a rank's step leaves to the comparison of its next step ([`Carry`]): the precision
//! floor and the outputs that differed only by amplified rounding noise ([`NoiseWrite`]).
//! Written by the judge, read by the localiser of the rank's next step; apart from both.

use super::measure::Measured;
use crate::dtype::DType;
use crate::vocab::Sides;
use serde::{Deserialize, Serialize};

/// What a rank's step leaves to the comparison of its next step (units of a rank are
/// compared in step order, in one process: `compare_part`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Carry {
    /// The step it comes from (empty: none, a rank's first step).
    pub step: String,
    /// The precision floor its steps so far left (judge.rs).
    pub floor: Option<DType>,
    /// The outputs of that step that differed only by rounding noise they amplified
    /// (judge.rs, `NoiseWrite`): an input of the next step with their statistics is their
    /// value, carried over.
    pub noise: Vec<NoiseWrite>,
    /// The rank's first step compared with a tensor out of tolerance, when one was (this
    /// step's, or an earlier one's): every later step starts from what its diverged update
    /// left, so what the localiser finds there is a consequence of that divergence
    /// (`Finding::consequence_of`), not a first divergent op of its own.
    #[serde(default)]
    pub diverged: Option<String>,
}

impl Carry {
    /// The noise write whose value `t` is: both runs' statistics equal to its, bit for bit.
    pub(crate) fn noise_write(&self, t: &Measured) -> Option<&NoiseWrite> {
        let s = &t.sides;
        let bits = Sides::new(
            s.bench.stats.as_ref()?.fingerprint()?,
            s.cmp.stats.as_ref()?.fingerprint()?,
        );
        self.noise.iter().find(|w| w.stats == bits)
    }
}

/// An output that differed between the runs only by rounding noise it amplified (turned
/// into a warning by the judge's `amplified_noise`), with both runs' statistics bit for bit. The
/// rank's next step reads that very value where an input has the same statistics in both
/// runs: a parameter the optimizer updated in place, whose normalised update turned a
/// near-zero gradient's noise into ±lr. That input then differs with no captured op at
/// fault (`analyze/entry.rs`), where it looked as if it changed outside the captured ops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseWrite {
    /// The op that wrote it.
    pub op: String,
    /// Its output.
    pub tensor: String,
    /// Both runs' `Stats::fingerprint`.
    pub stats: Sides<[u64; 4]>,
}
