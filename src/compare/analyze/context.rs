//! What every rule of the localiser reads and adds to: the unit's ops (heads of all, rows
//! when asked), where the unit is, the tolerances, what the rank's previous step left, the
//! phase of each op, and the findings so far. Made once per unit by `localize`, handed to
//! each rule in order.

use crate::compare::op_rows::OpRows;
use crate::compare::{Carry, Tolerances};
use crate::dump::Direction;
use crate::op_key::OpKind;
use crate::schema::summary::{Finding, Findings, Found};
use crate::vocab::FindingKind;
use foldhash::HashMap;
use std::collections::BTreeMap;

/// Where the findings of a unit are.
pub(crate) struct Place<'a> {
    /// Its step label.
    pub step: &'a str,
    /// Its rank label.
    pub rank: &'a str,
    /// The comparison side's call stacks by id.
    pub stacks: &'a BTreeMap<u64, Vec<String>>,
}

/// What the localiser keeps of an op's head (16 bytes: a unit can have a million ops).
#[derive(Debug, Clone, Copy)]
pub(super) struct Brief {
    pub seq: u64,
    pub direction: Direction,
    /// Its key says backward: it may have a forward twin.
    pub twin: bool,
    pub fails: bool,
    pub flagged: bool,
    pub nonfinite: bool,
}

/// One unit as the rules see it.
pub(super) struct Context<'a> {
    /// The unit's ops, in execution order.
    pub unit: &'a dyn OpRows,
    /// Where it is.
    pub at: Place<'a>,
    /// The thresholds in force.
    pub tols: &'a Tolerances,
    /// What the rank's previous step left.
    pub carried: &'a Carry,
    /// Every op's head.
    pub briefs: Vec<Brief>,
    /// Forward ops by key, for backward ops to find their forward twin (empty when no op
    /// may have one: a forward-only unit of a million ops needs no map of a million keys).
    pub by_key: HashMap<&'a str, usize>,
    /// The sequence number of the first backward op: the backward phase starts there.
    first_backward: Option<u64>,
    /// Some op of the forward phase fails.
    forward_fails: bool,
    /// The unit holds API calls, not module records only (the agent's `mix` level, or
    /// `api`): the ops a module calls are captured, so one of them, not the module's
    /// record, is where a divergence inside the module starts.
    pub apis: bool,
    /// What the rules found so far.
    found: Vec<Found>,
    /// Phases whose errors no op is locally responsible for.
    drift: Vec<Direction>,
}

impl<'a> Context<'a> {
    /// A unit's context, before any rule.
    pub fn new(
        unit: &'a dyn OpRows,
        at: Place<'a>,
        tols: &'a Tolerances,
        carried: &'a Carry,
    ) -> Context<'a> {
        let briefs: Vec<Brief> = (0..unit.ops())
            .map(|k| {
                let h = unit.head(k);
                Brief {
                    seq: h.seq,
                    direction: h.direction,
                    twin: unit.key(k).direction() == Direction::Backward,
                    fails: h.fails,
                    flagged: h.flagged,
                    nonfinite: h.nonfinite,
                }
            })
            .collect();
        let by_key = if briefs.iter().any(|b| b.twin) {
            (0..briefs.len())
                .filter(|&k| briefs[k].direction == Direction::Forward)
                .map(|k| (unit.key(k).text(), k))
                .collect()
        } else {
            HashMap::default()
        };
        let first_backward = briefs
            .iter()
            .filter(|h| h.direction == Direction::Backward)
            .map(|h| h.seq)
            .min();
        let forward_fails = briefs
            .iter()
            .any(|h| phase_of(first_backward, h) == Direction::Forward && h.fails);
        let apis = (0..unit.ops()).any(|k| unit.key(k).kind() == OpKind::Api);
        Context {
            unit,
            at,
            tols,
            carried,
            briefs,
            by_key,
            first_backward,
            forward_fails,
            apis,
            found: Vec::new(),
            drift: Vec::new(),
        }
    }

    /// The phase of an op: forward; backward, which also holds the forward-direction ops
    /// that run after the first backward op (the optimizer update consumes gradients).
    pub(crate) fn phase(&self, h: &Brief) -> Direction {
        phase_of(self.first_backward, h)
    }

    /// The ops of a phase, in execution order (u32: a store's op count fits).
    pub(crate) fn phase_ops(&self, dir: Direction) -> Vec<u32> {
        (0..self.briefs.len())
            .filter(|&k| self.phase(&self.briefs[k]) == dir)
            .map(|k| k as u32)
            .collect()
    }

    /// Whether the backward phase inherits a diverged forward: gradients of a diverged
    /// forward differ from the loss on (not an outside source, no local cause).
    pub(crate) fn inherited(&self, dir: Direction) -> bool {
        dir == Direction::Backward && self.forward_fails
    }

    /// Whether some rule found a finding of this kind in this phase.
    pub(crate) fn has(&self, kind: FindingKind, phase: Option<Direction>) -> bool {
        self.found
            .iter()
            .any(|f| f.kind == kind && f.phase == phase.filter(|_| kind.phased()))
    }

    /// Adds a finding (the first of a kind and phase stands). In a step after an earlier
    /// one of the rank diverged it is a consequence of that divergence: marked so
    /// (`Finding::consequence_of`), and its explanation says so, whatever rule found it.
    pub(crate) fn put(
        &mut self,
        kind: FindingKind,
        phase: Option<Direction>,
        mut finding: Finding,
    ) {
        if self.has(kind, phase) {
            return;
        }
        if let Some(step) = &self.carried.diverged {
            finding.explanation = format!(
                "{} (note: {step} diverged first; this step starts from the weights and \
                 optimizer state its diverged update left: a consequence of that divergence, \
                 not a cause of its own)",
                finding.explanation
            );
            finding.consequence_of = Some(step.clone());
        }
        self.found.push(Found::new(kind, phase, finding));
    }

    /// What the rules found so far, to add evidence to.
    pub(crate) fn found_mut(&mut self) -> &mut [Found] {
        &mut self.found
    }

    /// Says that a phase's errors have no locally divergent op.
    pub(crate) fn drifts(&mut self, dir: Direction) {
        self.drift.push(dir);
    }

    /// What the rules found.
    pub(crate) fn findings(self) -> Findings {
        Findings::new(self.found, self.drift)
    }
}

/// The phase of an op, the backward phase starting after the op at `first_backward`.
fn phase_of(first_backward: Option<u64>, h: &Brief) -> Direction {
    match first_backward {
        Some(s) if h.seq > s => Direction::Backward,
        _ => h.direction,
    }
}
