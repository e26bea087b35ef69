//! Cross-rank analysis of a distributed run (docs/compare.md, "Distributed runs").
//!
//! Each rank's localiser names its own first divergent op; in a distributed run that op may
//! be a collective whose local inputs agree and whose output differs: the rank *inherited*
//! a divergence from another rank of the group. This module puts every rank's first
//! divergence of a step on a common timeline, the *collective epoch* (how many collectives
//! the rank ran before the op: ops between the same two collectives run concurrently across
//! ranks), names the rank where it began, and how the others inherited it.
//!
//! It reads [`UnitSummary`]s only: the collectives each unit recorded
//! ([`UnitSummary::collectives`]) and its findings.

pub use super::collectives::{calls_of, epoch, judge_calls, CollectiveCall};
use super::UnitSummary;
use crate::schema::summary::{label_key, Finding, Origin, Propagation, Via};
use crate::vocab::FindingKind;
use foldhash::{HashMap, HashMapExt, HashSet};
use std::collections::BTreeMap;

/// The rank number of a `rank3` label (a `proc<PID>` label has none).
pub(crate) fn rank_number(label: &str) -> Option<u32> {
    label.strip_prefix("rank")?.parse().ok()
}

/// A collective call across ranks: its group and sequence within it.
type CallId<'a> = (&'a [u32], u64);

/// What the cross-rank analysis found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CrossRank {
    /// Where the divergence began.
    pub origin: Origin,
    /// The ranks that inherited it.
    pub propagation: Vec<Propagation>,
    /// The origin's finding (the headline quotes its direction and tensor).
    pub finding: Finding,
    /// The origin rank's first NaN/Inf producer, where it is the origin's op: the headline
    /// then says NaN/Inf, as a single rank's does.
    pub nonfinite: Option<Finding>,
}

/// A rank's first divergence, as the timeline sees it.
enum First<'a> {
    /// Its own op.
    Local(&'a Finding),
    /// A tensor that differs before any of its captured ops fails (an op only one run
    /// calls, or code the agent does not capture, produced it), or a decision from inputs
    /// within tolerance that went the other way (`near_tie`): the origin's `kind`.
    Outside(&'a Finding, &'static str),
    /// A collective whose local inputs agree.
    Inherited(&'a Finding, &'a CollectiveCall),
}

/// The earliest divergence of a unit, either phase, with the origin kind it makes: a first
/// divergent op (`op`), where a divergence enters from outside its captured ops
/// (`outside`), or a near tie decided the other way (`near_tie`). A rank whose difference
/// begins so is where it began as much as one with a divergent op: the ranks it sends to
/// inherit it.
fn first_divergent(u: &UnitSummary) -> Option<(&Finding, &'static str)> {
    u.findings
        .iter()
        .filter_map(|f| Some((&f.finding, origin_kind(f.kind)?)))
        .min_by_key(|(x, _)| x.seq)
}

/// The origin kind a rank's finding makes where its divergence began, if it can begin
/// one: its own op, a difference entering from outside, a near tie decided otherwise.
fn origin_kind(kind: FindingKind) -> Option<&'static str> {
    match kind {
        FindingKind::FirstDivergent => Some("op"),
        FindingKind::ExternalSource => Some("outside"),
        FindingKind::NearTie => Some("near_tie"),
        _ => None,
    }
}

fn via(u: &UnitSummary, c: &CollectiveCall) -> Via {
    Via {
        op: c.op.clone(),
        group: u.collectives.group(c).to_vec(),
        coll_seq: c.coll_seq,
    }
}

/// The cross-rank story of the earliest step with an error, when a divergence crossed
/// ranks through a recorded collective (or a collective is itself the culprit); `None`
/// otherwise (single-rank dumps, dumps without collective records, ranks that diverged
/// each on their own).
pub(crate) fn analyze(units: &[UnitSummary]) -> Option<CrossRank> {
    let failing = |u: &UnitSummary| u.counts.error > 0;
    let step = units
        .iter()
        .filter(|u| failing(u))
        .map(|u| label_key(&u.step))
        .min()?;
    let in_step: Vec<&UnitSummary> = units
        .iter()
        .filter(|u| label_key(&u.step) == step && !u.collectives.is_empty())
        .collect();
    if in_step.len() < 2 {
        return None;
    }
    // Every call of the step by (group, coll_seq): (rank number, call).
    let mut table: HashMap<CallId, Vec<(u32, &CollectiveCall)>> = HashMap::new();
    for u in &in_step {
        let Some(n) = rank_number(&u.rank) else {
            continue;
        };
        for c in &u.collectives.calls {
            table
                .entry((u.collectives.group(c), c.coll_seq))
                .or_default()
                .push((n, c));
        }
    }
    let differing = |u: &UnitSummary, c: &CollectiveCall| -> Vec<u32> {
        let mut v: Vec<u32> = table
            .get(&(u.collectives.group(c), c.coll_seq))
            .into_iter()
            .flatten()
            .filter(|(_, x)| x.inputs_differ)
            .map(|(n, _)| *n)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    // Each rank's first divergence on the timeline: (epoch, 0 local / 1 collective, rank).
    type Key<'k> = (u64, u8, (u64, &'k str));
    let mut firsts: Vec<(Key, &UnitSummary, First)> = Vec::new();
    for u in &in_step {
        let Some((f, kind)) = first_divergent(u) else {
            continue;
        };
        let e = epoch(&u.collectives.calls, f.seq);
        let call = u
            .collectives
            .calls
            .iter()
            .find(|c| c.seq == f.seq && !c.inputs_differ);
        let (kind, first) = match call {
            _ if kind != "op" => (0, First::Outside(f, kind)),
            Some(c) => (1, First::Inherited(f, c)),
            None => (0, First::Local(f)),
        };
        firsts.push(((e, kind, label_key(&u.rank)), u, first));
    }
    // The ranks of the step that were compared: a collective is only known to have got
    // agreeing inputs when every rank of its group was (a rank in one run only, as in a
    // job of another world size, reduces values nobody compared).
    let compared: HashSet<u32> = units
        .iter()
        .filter(|u| label_key(&u.step) == step)
        .filter_map(|u| rank_number(&u.rank))
        .collect();
    let seen_whole = |u: &UnitSummary, c: &CollectiveCall| {
        u.collectives.group(c).iter().all(|r| compared.contains(r))
    };
    // The origin: the earliest local divergence or faulty collective (inputs agree on every
    // rank of the group) on the timeline.
    firsts.sort_by(|a, b| a.0.cmp(&b.0));
    let (_, ou, of) = firsts.iter().find(|(_, u, f)| match f {
        First::Local(_) | First::Outside(..) => true,
        First::Inherited(_, c) => differing(u, c).is_empty() && seen_whole(u, c),
    })?;
    let (finding, collective, kind) = match of {
        First::Local(f) => (*f, None, "op"),
        First::Outside(f, kind) => (*f, None, *kind),
        First::Inherited(f, c) => (*f, Some(via(ou, c)), "collective"),
    };
    let origin = Origin {
        step: ou.step.clone(),
        rank: ou.rank.clone(),
        kind: kind.into(),
        op: finding.op.clone(),
        seq: finding.seq,
        epoch: epoch(&ou.collectives.calls, finding.seq),
        direction: finding.direction,
        tensor: finding.tensor.clone(),
        collective,
    };
    let mut propagation = Vec::new();
    for (_, u, f) in &firsts {
        if u.rank == ou.rank {
            continue;
        }
        if let First::Inherited(_, c) = f {
            propagation.push(Propagation {
                step: u.step.clone(),
                rank: u.rank.clone(),
                via: via(u, c),
                from_ranks: differing(u, c),
            });
        }
    }
    propagation.sort_by(|a, b| label_key(&a.rank).cmp(&label_key(&b.rank)));
    if propagation.is_empty() && origin.kind != "collective" {
        return None;
    }
    let nonfinite = ou
        .findings
        .get(FindingKind::FirstNonfinite, None)
        .filter(|n| n.seq == finding.seq)
        .cloned();
    Some(CrossRank {
        origin,
        propagation,
        finding: finding.clone(),
        nonfinite,
    })
}

/// `[0, 1, 2]`.
pub(crate) fn group_text(g: &[u32]) -> String {
    let v: Vec<String> = g.iter().map(|n| n.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// A rank label as a headline names it: `rank 1` (a `proc` label as is).
pub(crate) fn rank_text(label: &str) -> String {
    rank_number(label).map_or_else(|| label.to_string(), |n| format!("rank {n}"))
}

/// The headline of a cross-rank divergence.
pub(crate) fn headline(x: &CrossRank) -> String {
    let o = &x.origin;
    let f = &x.finding;
    let mut out = match &o.collective {
        None if o.kind == "outside" => {
            let how = match (&f.one_sided_source, &f.carried) {
                (Some(s), _) => format!("through {}", s.said()),
                (None, Some(w)) => format!(
                    "with the value {} wrote in {}, where it differed only by rounding noise \
                     that op amplified (no captured op is at fault)",
                    w.op, w.step
                ),
                (None, None) => "from outside the captured ops".into(),
            };
            format!(
                "DIVERGENCE: {} diverged first: it enters {how}, input {} of {} ({} {}/{})",
                rank_text(&o.rank),
                f.tensor,
                f.named(),
                f.direction.name(),
                o.step,
                o.rank
            )
        }
        None if x.nonfinite.is_some() && o.kind == "op" => format!(
            "DIVERGENCE: {} diverged first: NaN/Inf first produced by {}",
            rank_text(&o.rank),
            x.nonfinite
                .as_ref()
                .map_or(String::new(), Finding::nonfinite_producer)
        ),
        None => format!(
            "DIVERGENCE: {} diverged first: {} ({} {}/{}, tensor {})",
            rank_text(&o.rank),
            if o.kind == "near_tie" {
                format!(
                    "{} took a decision from inputs within tolerance and decided otherwise, \
                     a near tie",
                    f.named()
                )
            } else {
                format!("first divergent op {}", f.named())
            },
            f.direction.name(),
            o.step,
            o.rank,
            f.tensor
        ),
        Some(c) => format!(
            "DIVERGENCE: collective {} (coll #{}, group {}) got agreeing inputs on every rank \
             of its group and returned a different output on {} ({} {}/{}, tensor {}): faulty \
             communication",
            c.op,
            c.coll_seq,
            group_text(&c.group),
            rank_text(&o.rank),
            f.direction.name(),
            o.step,
            o.rank,
            f.tensor
        ),
    };
    // Ranks grouped by the collective they inherited through, in order of first rank.
    let mut by_via: BTreeMap<(u64, String), (Vec<String>, &Via)> = BTreeMap::new();
    let mut order: Vec<(u64, String)> = Vec::new();
    for p in &x.propagation {
        let k = (p.via.coll_seq, p.via.op.clone());
        if !by_via.contains_key(&k) {
            order.push(k.clone());
        }
        by_via
            .entry(k)
            .or_insert_with(|| (Vec::new(), &p.via))
            .0
            .push(rank_number(&p.rank).map_or_else(|| p.rank.clone(), |n| n.to_string()));
    }
    const SHOWN: usize = 8;
    for k in order.iter().take(3) {
        let (ranks, v) = &by_via[k];
        let who = if ranks.len() == 1 {
            format!("rank {}", ranks[0])
        } else if ranks.len() <= SHOWN {
            format!("ranks {}", ranks.join(", "))
        } else {
            format!(
                "ranks {} and {} more",
                ranks[..SHOWN].join(", "),
                ranks.len() - SHOWN
            )
        };
        out += &format!(
            "; {who} inherited it through {} (coll #{}, group {})",
            v.op,
            v.coll_seq,
            group_text(&v.group)
        );
    }
    if order.len() > 3 {
        out += &format!("; {} more collectives", order.len() - 3);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::tables::UnitRows;
    use crate::dump::Collective;

    fn call(seq: u64, coll: u64) -> CollectiveCall {
        CollectiveCall {
            seq,
            op: format!("Distributed.all_reduce.{coll}.forward"),
            group: 0,
            coll_seq: coll,
            inputs_differ: false,
            output_differs: false,
        }
    }

    #[test]
    fn a_units_calls_hold_each_group_once() {
        let coll = |group: Vec<u32>, seq| Collective { group, seq };
        let calls = vec![
            (
                3,
                "Distributed.all_reduce.0.forward".into(),
                coll(vec![0, 1, 2, 3], 0),
            ),
            (
                5,
                "Distributed.broadcast.0.forward".into(),
                coll(vec![0, 2], 0),
            ),
            (
                9,
                "Distributed.all_reduce.1.forward".into(),
                coll(vec![0, 1, 2, 3], 1),
            ),
        ];
        let c = judge_calls(calls, &UnitRows::default()).unwrap();
        assert_eq!(c.groups, vec![vec![0, 1, 2, 3], vec![0, 2]]);
        let groups: Vec<&[u32]> = c.calls.iter().map(|x| c.group(x)).collect();
        assert_eq!(groups, [&[0, 1, 2, 3][..], &[0, 2], &[0, 1, 2, 3]]);
        let seqs: Vec<(u64, u64)> = c.calls.iter().map(|x| (x.seq, x.coll_seq)).collect();
        assert_eq!(seqs, [(3, 0), (5, 0), (9, 1)]);
    }

    #[test]
    fn an_op_before_the_first_collective_is_in_epoch_zero() {
        let calls = [call(5, 0), call(9, 1)];
        assert_eq!(epoch(&calls, 0), 0);
        assert_eq!(epoch(&calls, 4), 0);
    }

    #[test]
    fn a_collective_is_in_the_epoch_of_the_ops_before_it() {
        let calls = [call(5, 0), call(9, 1)];
        assert_eq!(epoch(&calls, 5), 0);
        assert_eq!(epoch(&calls, 6), 1);
        assert_eq!(epoch(&calls, 9), 1);
        assert_eq!(epoch(&calls, 10), 2);
    }

    #[test]
    fn ranks_with_different_op_counts_meet_at_the_same_epoch() {
        // Rank 0 runs 3 ops before its all_reduce, rank 1 runs 7: seq 8 on rank 1 and
        // seq 4 on rank 0 are both just after the same collective.
        let r0 = [call(3, 0)];
        let r1 = [call(7, 0)];
        assert_eq!(epoch(&r0, 4), epoch(&r1, 8));
        assert!(epoch(&r1, 6) < epoch(&r0, 4));
    }

    #[test]
    fn without_collectives_every_op_is_in_epoch_zero() {
        assert_eq!(epoch(&[], 1_000), 0);
    }

    #[test]
    fn rank_labels_and_groups_print_as_the_headline_names_them() {
        assert_eq!(rank_number("rank12"), Some(12));
        assert_eq!(rank_number("proc123"), None);
        assert_eq!(rank_text("rank1"), "rank 1");
        assert_eq!(rank_text("proc7"), "proc7");
        assert_eq!(group_text(&[0, 1, 2]), "[0, 1, 2]");
    }
}
