//! The comparison, category by category.
//!
//! Every category reduces to items with a bench and a cmp value. An item only on one side is
//! first paired with its counterpart under an equivalence (`NCCL_ALGO` ↔ `HCCL_ALGO`), then,
//! when the packs come from different platforms (NPU vs GPU) and the item belongs to one
//! platform, reported as expected. Whole sections a producer does not record (msprobe has no
//! determinism flags, RNG state hashes or seed values) are noted, never failed.

use super::pack::{Fingerprint, Pack, RecordKey};
use super::rules::{self, matches_any, Level, Rules};
use super::{
    Category, CategorySummary, CheckOptions, CheckReport, Counts, Item, PackInfo, StatsPair, Status,
};
use crate::vocab::Verdict;
use std::collections::{BTreeMap, BTreeSet};

/// What every category's comparison judges with: the rules and the two sides' platforms.
pub(crate) struct Ctx<'a> {
    pub(crate) rules: &'a Rules,
    pub(crate) cross: bool,
    bench_family: &'static str,
    cmp_family: &'static str,
}

pub(crate) fn status_of(l: Level) -> Status {
    match l {
        Level::Error => Status::Error,
        Level::Warning => Status::Warning,
        Level::Expected => Status::Expected,
        Level::Ignore => Status::Ignored,
    }
}

impl<'a> Ctx<'a> {
    /// The context of a comparison between packs of these platforms (`gpu`, `npu`).
    pub(crate) fn new(
        rules: &'a Rules,
        bench_family: &'static str,
        cmp_family: &'static str,
    ) -> Self {
        Ctx {
            rules,
            cross: bench_family != cmp_family,
            bench_family,
            cmp_family,
        }
    }

    /// A difference in `item`: a rule's level, else expected when `platform` says the
    /// difference is normal between these platforms, else `own`.
    pub(crate) fn judge(&self, cat: Category, item: &str, own: Level, platform: bool) -> Status {
        match self.rules.rule_level(cat, item) {
            Some(l) => status_of(l),
            None if self.cross && platform => Status::Expected,
            None => status_of(own),
        }
    }

    pub(crate) fn side_note(&self, bench: bool) -> String {
        let (side, fam) = if bench {
            ("bench", self.bench_family)
        } else {
            ("cmp", self.cmp_family)
        };
        if self.cross {
            format!("only in {side} ({} side)", fam.to_uppercase())
        } else {
            format!("only in {side}")
        }
    }
}

pub(crate) fn item(cat: Category, name: &str, b: Option<String>, c: Option<String>) -> Item {
    Item {
        category: cat,
        item: name.to_string(),
        step: None,
        rank: None,
        bench: b,
        cmp: c,
        status: Status::Pass,
        detail: String::new(),
        stats: None,
        ranks: None,
    }
}

/// How one key-value category judges its items.
struct MapSpec<'a> {
    cat: Category,
    /// Level of a value difference (key, bench value, cmp value).
    diff: &'a dyn Fn(&str, &str, &str) -> Level,
    /// Level of a key present on one side only.
    missing: &'a dyn Fn(&str) -> Level,
    /// Keys that exist on one platform only.
    platform_key: &'a dyn Fn(&str) -> bool,
    /// Differences that are normal between platforms (key, bench, cmp).
    platform_diff: &'a dyn Fn(&str, &str, &str) -> bool,
    /// Value equality (key, bench, cmp).
    equal: &'a dyn Fn(&str, &str, &str) -> bool,
}

fn compare_maps(
    ctx: &Ctx,
    s: &MapSpec,
    b: &BTreeMap<String, String>,
    c: &BTreeMap<String, String>,
) -> Vec<Item> {
    let mut out = vec![];
    let mut b_only: Vec<&String> = vec![];
    for (k, bv) in b {
        match c.get(k) {
            Some(cv) => {
                let mut it = item(s.cat, k, Some(bv.clone()), Some(cv.clone()));
                if !(s.equal)(k, bv, cv) {
                    let platform = (s.platform_diff)(k, bv, cv);
                    it.status = ctx.judge(s.cat, k, (s.diff)(k, bv, cv), platform);
                    it.detail = match it.status {
                        Status::Expected => "differs as expected between NPU and GPU".into(),
                        Status::Ignored => "differs (ignored)".into(),
                        _ => "differs".into(),
                    };
                }
                out.push(it);
            }
            None => b_only.push(k),
        }
    }
    let mut c_only: BTreeSet<&String> = c.keys().filter(|k| !b.contains_key(*k)).collect();
    for k in b_only {
        let bv = &b[k];
        let partner = ctx
            .rules
            .counterparts(s.cat, k)
            .into_iter()
            .find(|p| c_only.iter().any(|x| *x == p));
        if let Some(p) = partner {
            let cv = &c[&p];
            c_only.retain(|x| **x != p);
            let mut it = item(
                s.cat,
                &format!("{k} ↔ {p}"),
                Some(bv.clone()),
                Some(cv.clone()),
            );
            if (s.equal)(k, bv, cv) {
                it.status = Status::Expected;
                it.detail = "equivalent names, same value".into();
            } else {
                it.status = ctx.judge(s.cat, k, (s.diff)(k, bv, cv), false);
                it.detail = "equivalent names, different values".into();
            }
            out.push(it);
            continue;
        }
        let mut it = item(s.cat, k, Some(bv.clone()), None);
        it.status = ctx.judge(s.cat, k, (s.missing)(k), (s.platform_key)(k));
        it.detail = ctx.side_note(true);
        out.push(it);
    }
    for k in c_only {
        let mut it = item(s.cat, k, None, Some(c[k].clone()));
        it.status = ctx.judge(s.cat, k, (s.missing)(k), (s.platform_key)(k));
        it.detail = ctx.side_note(false);
        out.push(it);
    }
    out.sort_by(|x, y| x.item.cmp(&y.item));
    out
}

fn strip_local(v: &str) -> &str {
    v.split('+').next().unwrap_or(v)
}

pub(crate) fn major_minor(v: &str) -> String {
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// Numbers compare as numbers (`1e-3` == `0.001`), booleans case-insensitively.
pub(crate) fn loose_equal(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (a.trim().parse::<f64>(), b.trim().parse::<f64>()) {
        return x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
    }
    let bool_of = |s: &str| match s.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    matches!((bool_of(a), bool_of(b)), (Some(x), Some(y)) if x == y)
}

/// The level of a difference in `key` of category `c` whose two values are `bench` and
/// `cmp` (None: the key is on one side only), by the rules of docs/config-check.md,
/// "Verdicts". One function for a pair of packs and for the peers of a job's ranks
/// (`ranks/peers.rs`), so the two verdicts cannot drift apart.
pub(crate) fn severity(c: Category, key: &str, bench: Option<&str>, cmp: Option<&str>) -> Level {
    let one_sided = bench.is_none() || cmp.is_none();
    match c {
        Category::Env if matches_any(rules::ENV_PRECISION, key) => Level::Error,
        Category::Env => Level::Warning,
        Category::Packages => match key {
            "python.version" => match (bench, cmp) {
                (Some(a), Some(b)) if major_minor(a) == major_minor(b) => Level::Warning,
                (Some(_), Some(_)) => Level::Error,
                _ => Level::Warning,
            },
            "accelerator.torch" | "accelerator.torch_npu" | "accelerator.cann" if !one_sided => {
                Level::Error
            }
            "torch" => Level::Error,
            k if !one_sided && rules::KEY_PACKAGES.contains(&k) => Level::Error,
            _ => Level::Warning,
        },
        Category::Determinism | Category::Hyperparameters if one_sided => Level::Warning,
        _ => Level::Error,
    }
}

fn env_items(ctx: &Ctx, b: &BTreeMap<String, String>, c: &BTreeMap<String, String>) -> Vec<Item> {
    let spec = MapSpec {
        cat: Category::Env,
        diff: &|k, x, y| severity(Category::Env, k, Some(x), Some(y)),
        missing: &|k| severity(Category::Env, k, None, None),
        platform_key: &|k| matches_any(rules::ENV_PLATFORM, k),
        platform_diff: &|_, _, _| false,
        equal: &|_, x, y| x == y,
    };
    let mut items = compare_maps(ctx, &spec, b, c);
    for it in &mut items {
        if it.status == Status::Error && it.detail == "differs" {
            it.detail = "differs; this variable changes numerics or scheduling".into();
        }
    }
    items
}

fn packages_items(ctx: &Ctx, b: &Pack, c: &Pack, notes: &mut Vec<String>) -> Option<Vec<Item>> {
    let mut out = vec![];
    let mut any = false;
    if let (Some(bd), Some(cd)) = (&b.distributions, &c.distributions) {
        any = true;
        let flat = |d: &BTreeMap<String, (String, String)>| -> BTreeMap<String, String> {
            d.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect()
        };
        let spec = MapSpec {
            cat: Category::Packages,
            diff: &|k, x, y| severity(Category::Packages, k, Some(x), Some(y)),
            missing: &|k| severity(Category::Packages, k, None, None),
            platform_key: &|k| matches_any(rules::PACKAGES_PLATFORM, k),
            platform_diff: &|_, x, y| strip_local(x) == strip_local(y),
            equal: &|_, x, y| x == y,
        };
        out.extend(compare_maps(ctx, &spec, &flat(bd), &flat(cd)));
    } else {
        notes.push(format!(
            "package list not in the {} pack",
            if b.distributions.is_none() {
                "bench"
            } else {
                "cmp"
            }
        ));
    }
    if let (Some(bp), Some(cp)) = (&b.platform, &c.platform) {
        any = true;
        let spec = MapSpec {
            cat: Category::Packages,
            diff: &|k, x, y| severity(Category::Packages, k, Some(x), Some(y)),
            missing: &|k| severity(Category::Packages, k, None, None),
            platform_key: &|k| k.starts_with("accelerator."),
            platform_diff: &|k, x, y| {
                if k == "accelerator.torch" {
                    strip_local(x) == strip_local(y)
                } else {
                    k.starts_with("accelerator.")
                }
            },
            equal: &|_, x, y| x == y,
        };
        out.extend(compare_maps(ctx, &spec, bp, cp));
    } else if b.platform.is_some() || c.platform.is_some() {
        notes.push("python/OS/CPU/accelerator versions recorded on one side only".into());
    }
    any.then_some(out)
}

fn determinism_items(
    ctx: &Ctx,
    b: &BTreeMap<String, String>,
    c: &BTreeMap<String, String>,
) -> Vec<Item> {
    let spec = MapSpec {
        cat: Category::Determinism,
        diff: &|k, x, y| severity(Category::Determinism, k, Some(x), Some(y)),
        missing: &|k| severity(Category::Determinism, k, None, None),
        platform_key: &|k| {
            matches_any(
                &[
                    "torch.npu.*",
                    "autocast.npu.*",
                    "autocast.cuda.*",
                    "torch.backends.cud*",
                ],
                k,
            )
        },
        platform_diff: &|_, _, _| false,
        equal: &|_, x, y| loose_equal(x, y),
    };
    compare_maps(ctx, &spec, b, c)
}

fn hyper_items(
    ctx: &Ctx,
    b: &BTreeMap<String, String>,
    c: &BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> Vec<Item> {
    let section = |k: &str| k.split('.').next().unwrap_or(k).to_string();
    let bs: BTreeSet<String> = b.keys().map(|k| section(k)).collect();
    let cs: BTreeSet<String> = c.keys().map(|k| section(k)).collect();
    let only_b: Vec<_> = bs.difference(&cs).cloned().collect();
    let only_c: Vec<_> = cs.difference(&bs).cloned().collect();
    if !only_b.is_empty() {
        notes.push(format!(
            "only in bench, not compared: {}",
            only_b.join(", ")
        ));
    }
    if !only_c.is_empty() {
        notes.push(format!("only in cmp, not compared: {}", only_c.join(", ")));
    }
    let keep = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter()
            .filter(|(k, _)| bs.contains(&section(k)) && cs.contains(&section(k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let spec = MapSpec {
        cat: Category::Hyperparameters,
        diff: &|k, x, y| severity(Category::Hyperparameters, k, Some(x), Some(y)),
        missing: &|k| severity(Category::Hyperparameters, k, None, None),
        platform_key: &|_| false,
        platform_diff: &|_, _, _| false,
        equal: &|_, x, y| loose_equal(x, y),
    };
    compare_maps(ctx, &spec, &keep(b), &keep(c))
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0.0;
    }
    let d = (a - b).abs();
    let m = a.abs().max(b.abs());
    if d.is_nan() {
        f64::INFINITY
    } else if m == 0.0 {
        0.0
    } else {
        d / m
    }
}

fn stats_of(f: &Fingerprint) -> [Option<f64>; 4] {
    [f.max, f.min, f.mean, f.norm].map(|s| s.map(|x| x.0))
}

fn show_fp(f: &Fingerprint) -> String {
    let mut s = String::new();
    if let Some(h) = &f.sha256 {
        s.push_str(&format!(
            "sha256:{}…",
            h.chars().take(12).collect::<String>()
        ));
    }
    if let Some(d) = &f.dtype {
        s.push_str(&format!(" {d}"));
    }
    if let Some(sh) = &f.shape {
        let dims: Vec<String> = sh.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!("[{}]", dims.join(",")));
    }
    if f.sha256.is_none() {
        let st = stats_of(f);
        let names = ["max", "min", "mean", "norm"];
        let parts: Vec<String> = names
            .iter()
            .zip(st)
            .filter_map(|(n, v)| v.map(|v| format!("{n}={v:.6e}")))
            .collect();
        s.push_str(&parts.join(" "));
    }
    s.trim().to_string()
}

fn fp_compare(b: &Fingerprint, c: &Fingerprint, rtol: f64) -> (Level, String, StatsPair) {
    let (bs, cs) = (stats_of(b), stats_of(c));
    let diffs: Vec<f64> = bs
        .iter()
        .zip(cs.iter())
        .filter_map(|(x, y)| Some(rel((*x)?, (*y)?)))
        .collect();
    let max_rel = diffs.iter().copied().fold(None, |m: Option<f64>, d| {
        Some(m.map_or(d, |m| if d > m || d.is_nan() { d } else { m }))
    });
    let pair = StatsPair {
        bench: bs,
        cmp: cs,
        max_rel_diff: max_rel,
    };
    let how = max_rel
        .map(|m| format!("; statistics differ by up to {m:.3e} (relative)"))
        .unwrap_or_default();
    if let (Some(hb), Some(hc)) = (&b.sha256, &c.sha256) {
        if b.dtype != c.dtype {
            let d = |x: &Option<String>| x.clone().unwrap_or_else(|| "?".into());
            return (
                Level::Error,
                format!("dtype {} vs {}", d(&b.dtype), d(&c.dtype)),
                pair,
            );
        }
        if b.shape != c.shape {
            return (
                Level::Error,
                format!("shape {:?} vs {:?}", b.shape, c.shape),
                pair,
            );
        }
        if hb == hc {
            return (Level::Expected, "identical bytes".into(), pair);
        }
        return (Level::Error, format!("bytes differ{how}"), pair);
    }
    match max_rel {
        None => (
            Level::Warning,
            "not comparable: no hash and no statistics on one side".into(),
            pair,
        ),
        Some(m) if m <= rtol => (
            Level::Expected,
            format!("statistics equal within {rtol:e} (no hash on one side)"),
            pair,
        ),
        Some(_) => (Level::Error, format!("no hash{how}"), pair),
    }
}

fn record_items(
    ctx: &Ctx,
    cat: Category,
    b: &BTreeMap<RecordKey, Fingerprint>,
    c: &BTreeMap<RecordKey, Fingerprint>,
    notes: &mut Vec<String>,
) -> Option<Vec<Item>> {
    let secs = |m: &BTreeMap<RecordKey, Fingerprint>| -> BTreeSet<(u64, u64)> {
        m.keys().map(|(s, r, _)| (*s, *r)).collect()
    };
    let (bs, cs) = (secs(b), secs(c));
    let fmt = |v: Vec<&(u64, u64)>| {
        v.iter()
            .map(|(s, r)| format!("step {s} rank {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let only_b: Vec<_> = bs.difference(&cs).collect();
    let only_c: Vec<_> = cs.difference(&bs).collect();
    if !only_b.is_empty() {
        notes.push(format!("only in bench, not compared: {}", fmt(only_b)));
    }
    if !only_c.is_empty() {
        notes.push(format!("only in cmp, not compared: {}", fmt(only_c)));
    }
    let common: BTreeSet<_> = bs.intersection(&cs).copied().collect();
    if common.is_empty() {
        if !bs.is_empty() || !cs.is_empty() {
            notes.push("no step/rank in common".into());
        }
        return None;
    }
    let keys: BTreeSet<&RecordKey> = b
        .keys()
        .chain(c.keys())
        .filter(|(s, r, _)| common.contains(&(*s, *r)))
        .collect();
    let mut out = vec![];
    for key in keys {
        let (s, r, name) = key;
        let (bf, cf) = (b.get(key), c.get(key));
        let mut it = item(cat, name, bf.map(show_fp), cf.map(show_fp));
        it.step = Some(*s);
        it.rank = Some(*r);
        match (bf, cf) {
            (Some(x), Some(y)) => {
                let (lvl, detail, pair) = fp_compare(x, y, ctx.rules.stats_rtol);
                it.status = match lvl {
                    Level::Expected => Status::Pass,
                    l => ctx.judge(cat, name, l, false),
                };
                it.detail = detail;
                it.stats = Some(pair);
            }
            _ => {
                it.status = ctx.judge(cat, name, Level::Error, false);
                it.detail = ctx.side_note(bf.is_some());
            }
        }
        out.push(it);
    }
    Some(out)
}

fn side_missing(b: bool, c: bool) -> String {
    match (b, c) {
        (false, false) => "in neither pack".into(),
        (false, true) => "not in the bench pack".into(),
        _ => "not in the cmp pack".into(),
    }
}

/// Compares two loaded packs.
pub(crate) fn compare(b: &Pack, c: &Pack, opts: &CheckOptions) -> CheckReport {
    let ctx = Ctx::new(&opts.rules, b.family(), c.family());
    let mut items: Vec<Item> = vec![];
    let mut categories = vec![];
    for cat in Category::ALL {
        let mut notes = vec![];
        let got: Option<Vec<Item>> = match cat {
            Category::Env => match (&b.env, &c.env) {
                (Some(x), Some(y)) => Some(env_items(&ctx, x, y)),
                (x, y) => {
                    notes.push(side_missing(x.is_some(), y.is_some()));
                    None
                }
            },
            Category::Packages => packages_items(&ctx, b, c, &mut notes),
            Category::Determinism => match (&b.determinism, &c.determinism) {
                (Some(x), Some(y)) => Some(determinism_items(&ctx, x, y)),
                (x, y) => {
                    notes.push(side_missing(x.is_some(), y.is_some()));
                    None
                }
            },
            Category::Random => match (&b.random, &c.random) {
                (Some(x), Some(y)) => Some(super::random::random_items(&ctx, x, y, &mut notes)),
                (x, y) => {
                    notes.push(side_missing(x.is_some(), y.is_some()));
                    None
                }
            },
            Category::Dataset | Category::Weights => {
                let (x, y) = if cat == Category::Dataset {
                    (&b.dataset, &c.dataset)
                } else {
                    (&b.weights, &c.weights)
                };
                match (x, y) {
                    (Some(x), Some(y)) => record_items(&ctx, cat, x, y, &mut notes),
                    (x, y) => {
                        notes.push(side_missing(x.is_some(), y.is_some()));
                        None
                    }
                }
            }
            Category::Hyperparameters => match (&b.hyperparameters, &c.hyperparameters) {
                (Some(x), Some(y)) => Some(hyper_items(&ctx, x, y, &mut notes)),
                (x, y) => {
                    notes.push(side_missing(x.is_some(), y.is_some()));
                    None
                }
            },
        };
        let mut counts = Counts::default();
        let verdict = got.as_ref().map(|list| {
            for it in list {
                counts.add(it.status);
            }
            if counts.error > 0 {
                Verdict::Error
            } else if counts.warning > 0 {
                Verdict::Warning
            } else {
                Verdict::Pass
            }
        });
        items.extend(got.unwrap_or_default());
        categories.push(CategorySummary {
            name: cat,
            verdict: verdict.map_or("skipped", Verdict::name).to_string(),
            pass_check: verdict.map(|v| !opts.fail_on.fails(v)),
            counts,
            notes,
        });
    }
    let mut counts = Counts::default();
    for it in &items {
        counts.add(it.status);
    }
    let verdict = if counts.error > 0 {
        Verdict::Error
    } else if counts.warning > 0 {
        Verdict::Warning
    } else {
        Verdict::Pass
    };
    let exit_code = opts.fail_on.exit_code(verdict);
    CheckReport {
        schema: super::SCHEMA,
        probe_version: env!("CARGO_PKG_VERSION"),
        bench: PackInfo::of(b),
        cmp: PackInfo::of(c),
        cross_platform: ctx.cross,
        fail_on: opts.fail_on,
        verdict: verdict.name().into(),
        exit_code,
        counts,
        categories,
        items,
        outputs: BTreeMap::new(),
        ranks: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose() {
        assert!(loose_equal("1e-3", "0.001"));
        assert!(loose_equal("True", "true"));
        assert!(!loose_equal("1234", "1235"));
    }

    #[test]
    fn fingerprints() {
        let a = Fingerprint {
            sha256: Some("aa".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        assert_eq!(fp_compare(&a, &b, 1e-6).0, Level::Expected);
        b.sha256 = Some("bb".into());
        assert_eq!(fp_compare(&a, &b, 1e-6).0, Level::Error);
    }
}
