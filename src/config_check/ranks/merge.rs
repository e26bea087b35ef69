//! The rank-by-rank comparisons (bench rank i against cmp rank i) merged into one list: an
//! item that is the same on several ranks (name, values, verdict, why) is listed once with
//! the ranks it was found on, so a difference on every rank of a 1,024-rank job is one line.

use super::super::{Category, CheckReport, Counts, Item, PackInfo};
use std::collections::{BTreeMap, HashMap};

type ItemKey = (
    Category,
    String,
    Option<u64>,
    Option<String>,
    Option<String>,
    &'static str,
    String,
);

/// One category over every rank pair.
#[derive(Default)]
pub(crate) struct CategoryPart {
    /// Ranks whose pair had the category on both sides.
    pub compared: Vec<u64>,
    /// Ranks whose pair lacked it on a side.
    pub skipped: Vec<u64>,
    /// Each note of the pairs → the ranks it was written for.
    pub notes: BTreeMap<String, Vec<u64>>,
}

/// The pairs' reports, merged as they are added (in rank order).
#[derive(Default)]
pub(crate) struct Merge {
    items: Vec<Item>,
    index: HashMap<ItemKey, usize>,
    /// Per category (report order).
    pub parts: BTreeMap<Category, CategoryPart>,
    /// Per compared rank, its pair's verdict per category (report order).
    pub cells: BTreeMap<u64, Vec<String>>,
    /// The first pair's pack descriptions and whether it was NPU against GPU.
    pub first: Option<(PackInfo, PackInfo, bool)>,
}

impl Merge {
    /// Adds rank `rank`'s pair report.
    pub(crate) fn add(&mut self, rank: u64, r: CheckReport) {
        if self.first.is_none() {
            self.first = Some((r.bench.clone(), r.cmp.clone(), r.cross_platform));
        }
        let mut cells = vec![];
        for c in r.categories {
            let part = self.parts.entry(c.name).or_default();
            if c.verdict == "skipped" {
                part.skipped.push(rank);
            } else {
                part.compared.push(rank);
            }
            for n in c.notes {
                part.notes.entry(n).or_default().push(rank);
            }
            cells.push(c.verdict);
        }
        self.cells.insert(rank, cells);
        for it in r.items {
            let key: ItemKey = (
                it.category,
                it.item.clone(),
                it.step,
                it.bench.clone(),
                it.cmp.clone(),
                it.status.name(),
                it.detail.clone(),
            );
            match self.index.get(&key) {
                Some(&i) => {
                    if let Some(rs) = self.items[i].ranks.as_mut() {
                        rs.push(rank);
                    }
                }
                None => {
                    self.index.insert(key, self.items.len());
                    let mut it = it;
                    it.rank = Some(rank);
                    it.ranks = Some(vec![rank]);
                    self.items.push(it);
                }
            }
        }
    }

    /// The merged items in report order (category, item, step, first rank) and their counts
    /// per category.
    pub(crate) fn items(&mut self) -> (Vec<Item>, BTreeMap<Category, Counts>) {
        let mut items = std::mem::take(&mut self.items);
        self.index.clear();
        items.sort_by(|a, b| {
            (a.category, &a.item, a.step, a.rank).cmp(&(b.category, &b.item, b.step, b.rank))
        });
        let mut counts: BTreeMap<Category, Counts> = BTreeMap::new();
        for it in &items {
            counts.entry(it.category).or_default().add(it.status);
        }
        (items, counts)
    }
}
