//! Whether a dump holds an op's tensors: what `probe replay` needs of it (the values of
//! the op's inputs and outputs), and what `recapture.json` asks for when it lacks them.

use super::{load_rank, DumpSet, RankLoc};
use crate::error::Result;

/// What a side's dump holds of one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// The op is there and every tensor of it has its values.
    Tensors,
    /// The op is there, but some of its tensors have statistics or a checksum only.
    NoData,
    /// No record of the op: its step or rank was not dumped, or the op was outside the
    /// capture's selection.
    Absent,
}

impl Holding {
    /// A few words for a person: what the dump lacks.
    pub(crate) fn lacks(self) -> &'static str {
        match self {
            Holding::Tensors => "nothing",
            Holding::NoData => "its tensors (statistics or checksums only)",
            Holding::Absent => "it (outside the dumped steps, ranks or ops)",
        }
    }
}

/// The rank folder of a step and rank label (`step0`, `rank0`), if the dump has it.
pub(crate) fn find_rank<'a>(set: &'a DumpSet, step: &str, rank: &str) -> Option<&'a RankLoc> {
    set.ranks.iter().find(|l| l.step == step && l.rank == rank)
}

/// What the rank folder `loc` (None: not dumped) holds of each op of `keys`, in order.
pub(crate) fn holdings(loc: Option<&RankLoc>, keys: &[String]) -> Result<Vec<Holding>> {
    let Some(loc) = loc else {
        return Ok(vec![Holding::Absent; keys.len()]);
    };
    let dump = load_rank(loc)?;
    let mut out = vec![Holding::Absent; keys.len()];
    for op in dump.ops.iter() {
        let key = op.key().text();
        let Some(i) = keys.iter().position(|k| k == key) else {
            continue;
        };
        let full = op.tensor_count() > 0 && op.tensors().all(|t| t.data().is_some());
        out[i] = if full {
            Holding::Tensors
        } else {
            Holding::NoData
        };
    }
    Ok(out)
}
