//! Intra-job consistency: within one side, every rank against its peers (docs/config-check.md,
//! "Folders of packs"). Each pack is reduced to its *peer view* (item → value, without what
//! legitimately differs per rank), added a rank at a time; at the end, per item, the value
//! most ranks hold is the reference and the other ranks are findings.
//!
//! Two classes of category:
//! * **uniform** (env, packages, determinism, hyperparameters): every rank of a job should
//!   hold the same; an item set on some ranks only counts (absent is a value), and any
//!   disagreement is a finding, against the largest group when no value has a majority;
//! * **may vary by rank** (random, weights): seeds like `seed + rank` and tensor-parallel
//!   shards differ on purpose; only ranks that hold the item are compared, and only a strict
//!   majority (more than half) makes the others findings; otherwise the item is noted as
//!   varying by rank.
//!
//! The dataset is never compared across peers (each rank reads its own shard): it is
//! compared bench rank i against cmp rank i.

use super::super::check::{severity, status_of};
use super::super::pack::Pack;
use super::super::random::{untouched, use_of};
use super::super::rules::Rules;
use super::super::{Category, Status};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Environment variables that differ per rank by design (names, exact), besides the ignored
/// ones (`HOSTNAME`, `TORCHELASTIC_ERROR_FILE`, ...).
pub(crate) const ENV_PER_RANK: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "NODE_RANK",
    "GLOBAL_RANK",
    "CROSS_RANK",
    "RANK_ID",
    "DEVICE_ID",
    "ASCEND_DEVICE_ID",
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_NODE_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "MV2_COMM_WORLD_RANK",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURMD_NODENAME",
    "SLURM_TOPOLOGY_ADDR",
];

/// Keys of the user's `args` (the last part of the path) that differ per rank by design.
pub(crate) const ARGS_PER_RANK: &[&str] = &[
    "local_rank",
    "local-rank",
    "rank",
    "global_rank",
    "node_rank",
    "world_rank",
    "device_id",
    "local_device",
    "gpu",
];

/// Whether ranks of one job may hold different values of a category's items.
fn may_vary(c: Category) -> bool {
    matches!(c, Category::Random | Category::Weights)
}

/// `argv` without the launcher's per-rank `--local_rank=N` / `--local-rank N`.
fn argv_of_peer(argv: &str) -> String {
    let mut out = vec![];
    let mut skip = false;
    for a in argv.split(' ') {
        if skip {
            skip = false;
            continue;
        }
        if a == "--local_rank" || a == "--local-rank" {
            skip = true;
            continue;
        }
        if a.starts_with("--local_rank=") || a.starts_with("--local-rank=") {
            continue;
        }
        out.push(a);
    }
    out.join(" ")
}

/// One pack's items as its peers see them.
pub(crate) struct PeerView {
    /// Categories the pack has.
    pub has: Vec<Category>,
    /// (category, item) → value.
    pub items: Vec<(Category, String, String)>,
}

/// The pack's peer view: every item but the per-rank ones, the ignored ones (by the rules)
/// and the dataset.
pub(crate) fn view(p: &Pack, rules: &Rules) -> PeerView {
    let mut has = vec![];
    let mut items = vec![];
    let mut put = |c: Category, k: String, v: String| items.push((c, k, v));
    if let Some(env) = &p.env {
        has.push(Category::Env);
        for (k, v) in env {
            if !ENV_PER_RANK.contains(&k.as_str()) && !rules.ignored(Category::Env, k) {
                put(Category::Env, k.clone(), v.clone());
            }
        }
    }
    if p.distributions.is_some() || p.platform.is_some() {
        has.push(Category::Packages);
    }
    for (k, (_, v)) in p.distributions.iter().flatten() {
        put(Category::Packages, k.clone(), v.clone());
    }
    for (k, v) in p.platform.iter().flatten() {
        put(Category::Packages, k.clone(), v.clone());
    }
    if let Some(d) = &p.determinism {
        has.push(Category::Determinism);
        for (k, v) in d {
            put(Category::Determinism, k.clone(), v.clone());
        }
    }
    if let Some(h) = &p.hyperparameters {
        has.push(Category::Hyperparameters);
        for (k, v) in h {
            let leaf = k.rsplit('.').next().unwrap_or(k);
            if k.starts_with("args.") && ARGS_PER_RANK.contains(&leaf) {
                continue;
            }
            let v = if k == "argv" {
                argv_of_peer(v)
            } else {
                v.clone()
            };
            put(Category::Hyperparameters, k.clone(), v);
        }
    }
    if let Some(r) = &p.random {
        has.push(Category::Random);
        let mut nth: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &r.seeds {
            let k = nth.entry(&s.function).or_default();
            *k += 1;
            let v = s
                .value
                .clone()
                .unwrap_or_else(|| "(value not recorded)".into());
            put(Category::Random, format!("seed {} #{k}", s.function), v);
        }
        for ((_, f), sites) in &r.draws {
            let n: u64 = sites.iter().map(|(_, n)| n).sum();
            put(Category::Random, format!("draws {f}"), n.to_string());
        }
        for (g, h) in r.states.iter().flatten() {
            if !untouched(use_of(r, g)) {
                let short: String = h.chars().take(16).collect();
                put(Category::Random, format!("state {g}"), short);
            }
        }
    }
    if let Some(w) = &p.weights {
        has.push(Category::Weights);
        for ((step, _, name), fp) in w {
            let v = match &fp.sha256 {
                Some(h) => format!("sha256:{}…", h.chars().take(12).collect::<String>()),
                None => format!(
                    "{:?}",
                    [fp.max, fp.min, fp.mean, fp.norm].map(|s| s.map(|x| x.0))
                ),
            };
            put(Category::Weights, format!("{name} (step {step})"), v);
        }
    }
    PeerView { has, items }
}

/// One group of ranks holding one value of an item.
struct Group {
    value: Option<String>,
    ranks: Vec<u32>,
}

#[derive(Default)]
struct Values {
    groups: Vec<Group>,
    index: HashMap<String, usize>,
}

/// A rank that differs from its peers in one item.
#[derive(Debug, Clone, Serialize)]
pub struct PeerFinding {
    /// `bench` or `cmp`: the side whose ranks disagree.
    pub side: &'static str,
    /// The item's category.
    pub category: Category,
    /// The item (as in the rank-by-rank items: an env name, `numpy`, `seed torch.manual_seed #1`).
    pub item: String,
    /// The ranks that differ, in order.
    pub ranks: Vec<u64>,
    /// What they hold (None: the item is absent there).
    pub value: Option<String>,
    /// What the reference ranks hold (None: absent).
    pub majority: Option<String>,
    /// How many ranks hold the reference value.
    pub majority_count: usize,
    /// The ranks of the side that have the item's category.
    pub of: usize,
    /// Whether the reference is held by more than half of them.
    pub strict: bool,
    /// How bad the difference is (the category's rule, as between two packs).
    pub status: Status,
    /// Why.
    pub detail: String,
}

/// One side's ranks, as they are added; [`Peers::findings`] at the end.
pub(crate) struct Peers {
    side: &'static str,
    ranks: Vec<u64>,
    has: BTreeMap<Category, Vec<u32>>,
    items: HashMap<(Category, String), Values>,
}

impl Peers {
    pub(crate) fn new(side: &'static str) -> Peers {
        Peers {
            side,
            ranks: vec![],
            has: BTreeMap::new(),
            items: HashMap::new(),
        }
    }

    /// Adds rank `rank`'s view (ranks are added in increasing order).
    pub(crate) fn add(&mut self, rank: u64, v: PeerView) {
        let idx = self.ranks.len() as u32;
        self.ranks.push(rank);
        for c in v.has {
            self.has.entry(c).or_default().push(idx);
        }
        for (c, k, val) in v.items {
            let vals = self.items.entry((c, k)).or_default();
            match vals.index.get(&val) {
                Some(&g) => vals.groups[g].ranks.push(idx),
                None => {
                    vals.index.insert(val.clone(), vals.groups.len());
                    vals.groups.push(Group {
                        value: Some(val),
                        ranks: vec![idx],
                    });
                }
            }
        }
    }

    /// The findings, in (category, item) order, and per category the items noted as
    /// varying by rank.
    pub(crate) fn findings(
        mut self,
        rules: &Rules,
    ) -> (Vec<PeerFinding>, BTreeMap<Category, Vec<String>>) {
        let mut out = vec![];
        let mut varies: BTreeMap<Category, Vec<String>> = BTreeMap::new();
        let all = self.ranks.len();
        for (c, holders) in &self.has {
            if holders.len() < all {
                let mut has = vec![false; all];
                for &i in holders {
                    has[i as usize] = true;
                }
                let lack: Vec<u64> = (0..all)
                    .filter(|&i| !has[i])
                    .map(|i| self.ranks[i])
                    .collect();
                out.push(PeerFinding {
                    side: self.side,
                    category: *c,
                    item: format!("({} section)", c.name()),
                    ranks: lack,
                    value: None,
                    majority: Some("recorded".into()),
                    majority_count: holders.len(),
                    of: all,
                    strict: holders.len() * 2 > all,
                    status: Status::Warning,
                    detail: format!("these ranks' packs have no {} section", c.name()),
                });
            }
        }
        let mut keys: Vec<(Category, String)> = self.items.keys().cloned().collect();
        keys.sort();
        for key in keys {
            let Some(mut vals) = self.items.remove(&key) else {
                continue;
            };
            let (c, item) = key;
            let with = self.has.get(&c).map_or(0, Vec::len);
            let held: usize = vals.groups.iter().map(|g| g.ranks.len()).sum();
            if !may_vary(c) && held < with {
                let mut holders = vec![false; all];
                for g in &vals.groups {
                    for &r in &g.ranks {
                        holders[r as usize] = true;
                    }
                }
                let absent = self.has[&c]
                    .iter()
                    .copied()
                    .filter(|&i| !holders[i as usize])
                    .collect();
                vals.groups.push(Group {
                    value: None,
                    ranks: absent,
                });
            }
            if vals.groups.len() < 2 {
                continue;
            }
            let of = if may_vary(c) { held } else { with };
            // The reference: the largest group, the lowest rank's among equals.
            let refg = (0..vals.groups.len())
                .max_by(|&a, &b| {
                    let (ga, gb) = (&vals.groups[a], &vals.groups[b]);
                    ga.ranks
                        .len()
                        .cmp(&gb.ranks.len())
                        .then(gb.ranks[0].cmp(&ga.ranks[0]))
                })
                .unwrap_or(0);
            let reference = &vals.groups[refg];
            let strict = reference.ranks.len() * 2 > of;
            if may_vary(c) && !strict {
                varies.entry(c).or_default().push(item);
                continue;
            }
            for (gi, g) in vals.groups.iter().enumerate() {
                if gi == refg {
                    continue;
                }
                let ranks: Vec<u64> = g.ranks.iter().map(|&i| self.ranks[i as usize]).collect();
                let lvl = severity(c, &item, reference.value.as_deref(), g.value.as_deref());
                let status = rules.rule_level(c, &item).map_or(status_of(lvl), status_of);
                let others = of - g.ranks.len();
                let detail = if strict {
                    format!(
                        "differs from the other {others} rank{} of {}, {} of which hold the reference",
                        if others == 1 { "" } else { "s" },
                        self.side,
                        reference.ranks.len()
                    )
                } else {
                    format!(
                        "the ranks of {} disagree: no value is held by more than half of {of}; \
                         compared with the largest group ({} ranks)",
                        self.side,
                        reference.ranks.len()
                    )
                };
                out.push(PeerFinding {
                    side: self.side,
                    category: c,
                    item: item.clone(),
                    ranks,
                    value: g.value.clone(),
                    majority: reference.value.clone(),
                    majority_count: reference.ranks.len(),
                    of,
                    strict,
                    status,
                    detail,
                });
            }
        }
        out.sort_by(|a, b| (a.category, &a.item, &a.ranks).cmp(&(b.category, &b.item, &b.ranks)));
        (out, varies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_view(vars: &[(&str, &str)]) -> PeerView {
        PeerView {
            has: vec![Category::Env],
            items: vars
                .iter()
                .map(|(k, v)| (Category::Env, k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_odd_rank_is_named_against_the_majority() {
        let mut p = Peers::new("cmp");
        for r in 0..8 {
            let algo = if r == 5 { "Ring" } else { "Tree" };
            p.add(r, env_view(&[("NCCL_ALGO", algo), ("X", "1")]));
        }
        let (f, varies) = p.findings(&Rules::default());
        assert!(varies.is_empty());
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].ranks, vec![5]);
        assert_eq!(f[0].value.as_deref(), Some("Ring"));
        assert_eq!(f[0].majority.as_deref(), Some("Tree"));
        assert_eq!((f[0].majority_count, f[0].of, f[0].strict), (7, 8, true));
        assert_eq!(f[0].status, Status::Error);
    }

    #[test]
    fn a_variable_on_one_rank_only_is_a_finding() {
        let mut p = Peers::new("bench");
        p.add(0, env_view(&[]));
        p.add(1, env_view(&[("FOO", "1")]));
        p.add(2, env_view(&[]));
        let (f, _) = p.findings(&Rules::default());
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].ranks.clone(), f[0].value.as_deref()),
            (vec![1], Some("1"))
        );
        assert_eq!(f[0].majority, None);
        assert_eq!(f[0].status, Status::Warning);
    }

    #[test]
    fn seeds_that_differ_on_every_rank_vary_by_rank() {
        let mut p = Peers::new("cmp");
        for r in 0..4u64 {
            p.add(
                r,
                PeerView {
                    has: vec![Category::Random],
                    items: vec![(
                        Category::Random,
                        "seed torch.manual_seed #1".into(),
                        (100 + r).to_string(),
                    )],
                },
            );
        }
        let (f, varies) = p.findings(&Rules::default());
        assert!(f.is_empty(), "{f:?}");
        assert_eq!(varies[&Category::Random], vec!["seed torch.manual_seed #1"]);
    }

    #[test]
    fn a_split_without_majority_is_still_a_finding_where_ranks_must_agree() {
        let mut p = Peers::new("cmp");
        for r in 0..4u64 {
            let v = if r < 2 { "2.5.1" } else { "2.6.0" };
            p.add(
                r,
                PeerView {
                    has: vec![Category::Packages],
                    items: vec![(Category::Packages, "torch".into(), v.into())],
                },
            );
        }
        let (f, _) = p.findings(&Rules::default());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].ranks, vec![2, 3]);
        assert!(!f[0].strict);
        assert_eq!(f[0].status, Status::Error);
    }

    #[test]
    fn launcher_local_rank_is_not_argv() {
        assert_eq!(
            argv_of_peer("train.py --local_rank=3 --lr 1"),
            "train.py --lr 1"
        );
        assert_eq!(
            argv_of_peer("train.py --local-rank 3 --lr 1"),
            "train.py --lr 1"
        );
    }
}
