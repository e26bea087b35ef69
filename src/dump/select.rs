//! Which steps and ranks a command reads (`--steps 0,2-4 --ranks 0-7`).
//!
//! Why: a 1,000-rank job's dump is compared a few ranks at a time (the ranks a node holds,
//! the ranks a first look flagged), and one step is often enough. A selection is applied to
//! what discovery found, before anything is paired or read: folders outside it are neither
//! compared nor reported as missing.

use super::{DumpSet, RankLoc};
use crate::error::{ProbeError, Result};
use std::fmt;
use std::str::FromStr;

/// A set of step or rank numbers: `3`, `0-7`, `0,2,5-9` (ranges inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbers(Vec<(u64, u64)>);

impl Numbers {
    /// Whether `n` is in the set.
    pub(crate) fn contains(&self, n: u64) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= n && n <= hi)
    }
}

impl FromStr for Numbers {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let number = |t: &str| {
            t.trim()
                .parse::<u64>()
                .map_err(|_| format!("{t:?} is not a number (write numbers and ranges: 0,2,5-9)"))
        };
        let mut ranges = Vec::new();
        for item in s.split(',') {
            let range = match item.split_once('-') {
                Some((lo, hi)) => (number(lo)?, number(hi)?),
                None => {
                    let n = number(item)?;
                    (n, n)
                }
            };
            if range.0 > range.1 {
                return Err(format!("range {item:?} runs backwards"));
            }
            ranges.push(range);
        }
        Ok(Numbers(ranges))
    }
}

impl fmt::Display for Numbers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self
            .0
            .iter()
            .map(|&(lo, hi)| match lo == hi {
                true => lo.to_string(),
                false => format!("{lo}-{hi}"),
            })
            .collect();
        f.write_str(&items.join(","))
    }
}

/// The steps and ranks to read; `None` keeps all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// `--steps`: matched against the number of a `step<N>` folder.
    pub steps: Option<Numbers>,
    /// `--ranks`: matched against the number of a `rank<N>` folder.
    pub ranks: Option<Numbers>,
}

/// The number of a `step12` / `rank3` label; `proc<PID>` (msprobe without a known rank)
/// has none, so a rank selection never picks it.
fn label_number(label: &str, prefix: &str) -> Option<u64> {
    label.strip_prefix(prefix)?.parse().ok()
}

impl Selection {
    /// Whether nothing is selected away.
    pub(crate) fn is_all(&self) -> bool {
        self.steps.is_none() && self.ranks.is_none()
    }

    /// Whether the folder at `loc` is selected.
    pub(crate) fn keeps(&self, loc: &RankLoc) -> bool {
        let within = |set: &Option<Numbers>, label: &str, prefix: &str| match set {
            None => true,
            Some(s) => label_number(label, prefix).is_some_and(|n| s.contains(n)),
        };
        within(&self.steps, &loc.step, "step") && within(&self.ranks, &loc.rank, "rank")
    }

    /// `set` with only the selected step/rank folders. A selection that keeps none of a
    /// dump's folders is a usage error naming what the dump holds.
    pub(crate) fn apply(&self, set: DumpSet) -> Result<DumpSet> {
        if self.is_all() || set.ranks.is_empty() {
            return Ok(set);
        }
        let (kept, dropped): (Vec<RankLoc>, Vec<RankLoc>) =
            set.ranks.into_iter().partition(|l| self.keeps(l));
        if kept.is_empty() {
            let held: Vec<String> = dropped
                .iter()
                .map(|l| format!("{}/{}", l.step, l.rank))
                .take(8)
                .collect();
            let more = if dropped.len() > held.len() {
                ", …"
            } else {
                ""
            };
            return Err(ProbeError::Usage(format!(
                "{}: {} selects none of its step/rank folders ({}{more})",
                set.path.display(),
                self,
                held.join(", ")
            )));
        }
        Ok(DumpSet { ranks: kept, ..set })
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(s) = &self.steps {
            parts.push(format!("--steps {s}"));
        }
        if let Some(r) = &self.ranks {
            parts.push(format!("--ranks {r}"));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::Format;
    use std::path::PathBuf;

    fn loc(step: &str, rank: &str) -> RankLoc {
        RankLoc {
            step: step.into(),
            rank: rank.into(),
            dir: PathBuf::from(format!("d/{step}/{rank}")),
            format: Format::Probe,
        }
    }

    #[test]
    fn parses_lists_and_ranges() {
        let n: Numbers = "0, 2,5-7".parse().unwrap();
        let inside: Vec<u64> = (0..10).filter(|&i| n.contains(i)).collect();
        assert_eq!(inside, vec![0, 2, 5, 6, 7]);
        assert_eq!(n.to_string(), "0,2,5-7");
        for bad in ["", "a", "1-", "-3", "5-2", "1,,2", "step0"] {
            assert!(bad.parse::<Numbers>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn selects_by_the_folder_number() {
        let sel = Selection {
            steps: Some("1".parse().unwrap()),
            ranks: Some("0-1".parse().unwrap()),
        };
        assert!(sel.keeps(&loc("step1", "rank1")));
        assert!(!sel.keeps(&loc("step1", "rank2")));
        assert!(!sel.keeps(&loc("step0", "rank0")));
        assert!(!sel.keeps(&loc("step1", "proc0")), "a PID is not a rank");
        let steps_only = Selection {
            steps: Some("1".parse().unwrap()),
            ranks: None,
        };
        assert!(steps_only.keeps(&loc("step1", "proc4242")));
    }

    #[test]
    fn a_selection_of_nothing_names_what_is_there() {
        let set = DumpSet {
            path: PathBuf::from("run"),
            mode: None,
            ranks: vec![loc("step0", "rank0"), loc("step0", "rank1")],
            overflow: false,
            compiled: false,
            world_size: None,
        };
        let sel = Selection {
            steps: None,
            ranks: Some("4-7".parse().unwrap()),
        };
        let err = sel.apply(set.clone()).unwrap_err().to_string();
        assert!(
            err.contains("--ranks 4-7") && err.contains("step0/rank1"),
            "{err}"
        );
        let one = Selection {
            steps: None,
            ranks: Some("1".parse().unwrap()),
        };
        let kept = one.apply(set).unwrap();
        assert_eq!(kept.ranks, vec![loc("step0", "rank1")]);
    }
}
