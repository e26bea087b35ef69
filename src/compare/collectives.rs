//! A unit's collectives (the comparison side's records): each call with its group and its
//! sequence within the group, and whether its inputs and outputs agree with the benchmark's.
//! Gathered by the unit's last pass, read by the cross-rank analysis (`cross_rank`) over
//! every unit of a step.

use super::tables::UnitRows;
use crate::dump::{Collective, Direction, Ops, Role};
use crate::error::Result;
use crate::vocab::Verdict;
use foldhash::HashMap;
use serde::{Deserialize, Serialize};

/// One collective call of a rank (the comparison side's record) with the compare's
/// findings at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveCall {
    /// The op's sequence number on its rank.
    pub seq: u64,
    /// The op key.
    pub op: String,
    /// Its process group: an index into [`Collectives::groups`].
    pub group: u32,
    /// Its sequence number within the group and step.
    pub coll_seq: u64,
    /// Some input of the call is out of tolerance.
    pub inputs_differ: bool,
    /// Some output of the call is out of tolerance.
    pub output_differs: bool,
}

/// A unit's collective calls, in execution order, and the distinct process groups they
/// name. Every rank of a run keeps its calls until the cross-rank analysis; a group is a
/// list of up to world-size ranks, so it is held once per unit, not once per call (which
/// grew with ranks × calls × world size: gigabytes at a thousand ranks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collectives {
    /// The distinct groups, in order of first call.
    pub groups: Vec<Vec<u32>>,
    /// The calls.
    pub calls: Vec<CollectiveCall>,
}

impl Collectives {
    /// The group of a call of this unit.
    pub(crate) fn group(&self, c: &CollectiveCall) -> &[u32] {
        self.groups
            .get(c.group as usize)
            .map_or(&[], |g| g.as_slice())
    }

    /// Whether the unit recorded no collective.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

/// The collectives of an op log, in execution order, before they are judged.
pub fn calls_of(ops: &Ops) -> Vec<(u64, String, Collective)> {
    ops.iter()
        .filter_map(|o| Some((o.seq(), o.key().text().to_string(), o.collective()?.clone())))
        .collect()
}

/// Marks each collective call with whether its inputs and outputs are out of tolerance.
pub fn judge_calls(calls: Vec<(u64, String, Collective)>, rows: &UnitRows) -> Result<Collectives> {
    if calls.is_empty() {
        return Ok(Collectives::default());
    }
    // seq -> (an input fails, an output fails)
    let mut at: HashMap<u64, (bool, bool)> = calls.iter().map(|c| (c.0, (false, false))).collect();
    rows.visit(&mut |rows| {
        for r in rows {
            let t = &r.tensor;
            let Some(e) = at.get_mut(&t.op.seq) else {
                continue;
            };
            if r.judgement.verdict != Verdict::Error {
                continue;
            }
            let input = t.role == Role::Input
                || (t.role == Role::Parameter && t.op.direction == Direction::Forward);
            if input {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
        Ok(())
    })?;
    let mut groups: Vec<Vec<u32>> = Vec::new();
    let calls = calls
        .into_iter()
        .map(|(seq, op, collective)| {
            let (inputs_differ, output_differs) = at[&seq];
            let group = match groups.iter().position(|g| *g == collective.group) {
                Some(i) => i,
                None => {
                    groups.push(collective.group);
                    groups.len() - 1
                }
            };
            CollectiveCall {
                seq,
                op,
                group: group as u32,
                coll_seq: collective.seq,
                inputs_differ,
                output_differs,
            }
        })
        .collect();
    Ok(Collectives { groups, calls })
}

/// The collective epoch of the op at `seq`: how many of the rank's collectives (sorted by
/// sequence number) ran before it.
pub fn epoch(calls: &[CollectiveCall], seq: u64) -> u64 {
    calls.partition_point(|c| c.seq < seq) as u64
}
