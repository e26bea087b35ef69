//! The random category: seed calls, draw counts and generator states (docs/config-check.md,
//! "Random").
//!
//! A generator counts as a difference only when the job depends on it: seeded differently or
//! on one side only (seed items), drawn from a different number of times (draw items), or its
//! state differs at save time after it was seeded or drawn from on either side (state items).
//! A generator neither side seeded nor drew from is `never seeded or used`: Python's `random`
//! and NumPy's global generator start from OS entropy in every process, so their states
//! differ between any two runs without meaning anything.

use super::check::{item, loose_equal, Ctx};
use super::pack::{normalize_site, GeneratorDoc, RandomInfo};
use super::rules::Level;
use super::{Category, Item, Status};
use std::collections::{BTreeMap, BTreeSet};

fn platform_fn(f: &str) -> bool {
    f.starts_with("torch.cuda.") || f.starts_with("torch.npu.")
}

/// The random-number items: seed calls, draw counts, generator states.
pub(crate) fn random_items(
    ctx: &Ctx,
    b: &RandomInfo,
    c: &RandomInfo,
    notes: &mut Vec<String>,
) -> Vec<Item> {
    let mut out = seed_items(ctx, b, c);
    out.extend(draw_items(ctx, b, c));
    out.extend(state_items(ctx, b, c, notes));
    out
}

/// Seed calls: the k-th call of each function, per rank.
fn seed_items(ctx: &Ctx, b: &RandomInfo, c: &RandomInfo) -> Vec<Item> {
    let cat = Category::Random;
    let mut out = vec![];
    let group = |r: &'_ RandomInfo| -> BTreeMap<(u64, String), Vec<super::pack::SeedCall>> {
        let mut m: BTreeMap<(u64, String), Vec<super::pack::SeedCall>> = BTreeMap::new();
        for s in &r.seeds {
            m.entry((s.rank, s.function.clone()))
                .or_default()
                .push(s.clone());
        }
        m
    };
    let bg = group(b);
    let mut cg = group(c);
    let show = |s: &super::pack::SeedCall| {
        format!(
            "{} @ {}",
            s.value.as_deref().unwrap_or("(value not recorded)"),
            normalize_site(&s.site)
        )
    };
    for ((rank, f), bcalls) in &bg {
        let mut name = f.clone();
        let ccalls = match cg.remove(&(*rank, f.clone())) {
            Some(v) => Some(v),
            None => {
                let p = ctx
                    .rules
                    .counterparts(cat, f)
                    .into_iter()
                    .find(|p| cg.contains_key(&(*rank, p.clone())));
                p.and_then(|p| {
                    name = format!("{f} ↔ {p}");
                    cg.remove(&(*rank, p))
                })
            }
        };
        let ccalls = ccalls.unwrap_or_default();
        for k in 0..bcalls.len().max(ccalls.len()) {
            let (bs, cs) = (bcalls.get(k), ccalls.get(k));
            let label = format!("seed {name} #{}", k + 1);
            let mut it = item(cat, &label, bs.map(show), cs.map(show));
            it.rank = Some(*rank);
            match (bs, cs) {
                (Some(x), Some(y)) => {
                    if let (Some(xv), Some(yv)) = (&x.value, &y.value) {
                        if !loose_equal(xv, yv) {
                            it.status = ctx.judge(cat, &label, Level::Error, false);
                            it.detail = "seed value differs".into();
                        }
                    } else {
                        it.detail = "seed value not recorded on one side".into();
                    }
                    if it.status == Status::Pass
                        && normalize_site(&x.site) != normalize_site(&y.site)
                    {
                        it.status = ctx.judge(cat, &label, Level::Warning, false);
                        it.detail = "same seed from another call site".into();
                    }
                }
                (Some(x), None) | (None, Some(x)) => {
                    it.status = ctx.judge(cat, &label, Level::Error, platform_fn(&x.function));
                    it.detail = ctx
                        .side_note(bs.is_some())
                        .replace("only", "seed call only");
                }
                (None, None) => {}
            }
            out.push(it);
        }
    }
    for ((rank, f), ccalls) in cg {
        for (k, s) in ccalls.iter().enumerate() {
            let label = format!("seed {f} #{}", k + 1);
            let mut it = item(cat, &label, None, Some(show(s)));
            it.rank = Some(rank);
            it.status = ctx.judge(cat, &label, Level::Error, platform_fn(&f));
            it.detail = ctx.side_note(false).replace("only", "seed call only");
            out.push(it);
        }
    }
    out
}

/// Draw counts per function and call site, per rank.
fn draw_items(ctx: &Ctx, b: &RandomInfo, c: &RandomInfo) -> Vec<Item> {
    let cat = Category::Random;
    let mut out = vec![];
    let summarize = |sites: &[(String, u64)]| -> (u64, BTreeMap<String, u64>) {
        let mut m = BTreeMap::new();
        for (s, n) in sites {
            *m.entry(normalize_site(s)).or_insert(0) += n;
        }
        (m.values().sum(), m)
    };
    let show_draws = |total: u64, m: &BTreeMap<String, u64>| {
        let sites: Vec<String> = m.iter().map(|(s, n)| format!("{n}× {s}")).collect();
        format!("{total} ({})", sites.join("; "))
    };
    let keys: BTreeSet<&(u64, String)> = b.draws.keys().chain(c.draws.keys()).collect();
    for key in keys {
        let (rank, f) = key;
        let label = format!("draws {f}");
        let bd = b.draws.get(key).map(|v| summarize(v));
        let cd = c.draws.get(key).map(|v| summarize(v));
        let mut it = item(
            cat,
            &label,
            bd.as_ref().map(|(t, m)| show_draws(*t, m)),
            cd.as_ref().map(|(t, m)| show_draws(*t, m)),
        );
        it.rank = Some(*rank);
        match (&bd, &cd) {
            (Some((bt, bm)), Some((ct, cm))) => {
                if bt != ct {
                    it.status = ctx.judge(cat, &label, Level::Error, false);
                    it.detail = format!("{bt} vs {ct} draws during the captured steps");
                } else if bm != cm {
                    it.status = ctx.judge(cat, &label, Level::Warning, false);
                    it.detail = "same count from other call sites".into();
                }
            }
            _ => {
                it.status = ctx.judge(cat, &label, Level::Error, platform_fn(f));
                it.detail = ctx.side_note(bd.is_some()).replace("only", "draws only");
            }
        }
        out.push(it);
    }
    out
}

/// The generators a seed or draw function touches, for packs that do not say
/// (`random.generators` is new in version 2): `torch.manual_seed` seeds the CPU and every
/// device generator.
fn generators_of(function: &str) -> &'static [&'static str] {
    if function.starts_with("random.") {
        &["python"]
    } else if function.starts_with("numpy.random.") {
        &["numpy"]
    } else if function.starts_with("torch.cuda.") {
        &["cuda"]
    } else if function.starts_with("torch.npu.") {
        &["npu"]
    } else if function.starts_with("torch.") {
        &["torch", "cuda", "npu"]
    } else {
        &[]
    }
}

/// Whether generator `g` was seeded and drawn from: as the pack says (version 2), else
/// inferred from its recorded seed calls and counted draws (draws are counted during the
/// captured steps only, so an older pack's "drawn" misses draws before them).
pub(crate) fn use_of(r: &RandomInfo, g: &str) -> GeneratorDoc {
    if let Some(u) = r.generators.get(g) {
        return *u;
    }
    let touches = |f: &str| generators_of(f).contains(&g);
    GeneratorDoc {
        seeded: r.seeds.iter().any(|s| touches(&s.function)),
        drawn: Some(
            r.draws
                .iter()
                .any(|((_, f), sites)| touches(f) && sites.iter().any(|(_, n)| *n > 0)),
        ),
    }
}

/// Never seeded and never drawn from (an unknown `drawn` counts as drawn).
pub(crate) fn untouched(u: GeneratorDoc) -> bool {
    !u.seeded && u.drawn == Some(false)
}

/// Why two states of a generator the job used differ.
fn state_detail(bu: GeneratorDoc, cu: GeneratorDoc) -> String {
    let drawn = |u: GeneratorDoc| u.drawn != Some(false);
    match (bu.seeded, cu.seeded) {
        (true, true) => {
            "generator state differs after the captured steps (seeded on both sides)".into()
        }
        (false, false) => {
            let on = match (drawn(bu), drawn(cu)) {
                (true, true) => "both sides",
                (true, false) => "the bench side",
                _ => "the cmp side",
            };
            format!(
                "drawn from on {on} but seeded on neither: an unseeded generator starts from OS \
                 entropy, so its draws differ between any two processes"
            )
        }
        _ => "generator state differs after the captured steps (seeded on one side only)".into(),
    }
}

/// RNG state hashes at pack time (msprobe records none: a note then), judged by the rule
/// above: a generator neither side seeded or drew from passes whatever its state.
fn state_items(ctx: &Ctx, b: &RandomInfo, c: &RandomInfo, notes: &mut Vec<String>) -> Vec<Item> {
    let cat = Category::Random;
    let mut out = vec![];
    let (Some(bs), Some(cs)) = (&b.states, &c.states) else {
        notes.push("RNG state hashes recorded on one side only (msprobe has none)".into());
        return out;
    };
    let keys: BTreeSet<&String> = bs.keys().chain(cs.keys()).collect();
    for g in keys {
        let label = format!("state {g}");
        let short = |h: &String| h.chars().take(16).collect::<String>();
        let mut it = item(cat, &label, bs.get(g).map(short), cs.get(g).map(short));
        let (bu, cu) = (use_of(b, g), use_of(c, g));
        match (bs.get(g), cs.get(g)) {
            (Some(_), Some(_)) if untouched(bu) && untouched(cu) => {
                it.detail = "note: never seeded or used".into();
            }
            (Some(x), Some(y)) if x == y => {}
            (Some(_), Some(_)) => {
                it.status = ctx.judge(cat, &label, Level::Error, false);
                it.detail = state_detail(bu, cu);
            }
            _ => {
                let plat = g == "cuda" || g == "npu";
                it.status = ctx.judge(cat, &label, Level::Warning, plat);
                it.detail = ctx.side_note(bs.contains_key(g));
            }
        }
        out.push(it);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_check::pack::SeedCall;

    fn info(seeded: bool, drawn: Option<bool>, state: &str) -> RandomInfo {
        let mut r = RandomInfo {
            states: Some(BTreeMap::from([("numpy".to_string(), state.to_string())])),
            ..RandomInfo::default()
        };
        r.generators
            .insert("numpy".into(), GeneratorDoc { seeded, drawn });
        r
    }

    fn judge(b: &RandomInfo, c: &RandomInfo) -> (Status, String) {
        let rules = super::super::rules::Rules::default();
        let ctx = Ctx::new(&rules, "gpu", "gpu");
        let mut notes = vec![];
        let it = state_items(&ctx, b, c, &mut notes).remove(0);
        (it.status, it.detail)
    }

    #[test]
    fn an_untouched_generator_passes_whatever_its_state() {
        let (s, d) = judge(
            &info(false, Some(false), "a"),
            &info(false, Some(false), "b"),
        );
        assert_eq!(
            (s, d.as_str()),
            (Status::Pass, "note: never seeded or used")
        );
    }

    #[test]
    fn a_drawn_unseeded_generator_is_an_error() {
        let (s, d) = judge(&info(false, Some(true), "a"), &info(false, Some(true), "b"));
        assert_eq!(s, Status::Error);
        assert!(d.contains("seeded on neither"), "{d}");
        // Drawn on one side only is enough.
        let (s, _) = judge(
            &info(false, Some(false), "a"),
            &info(false, Some(true), "b"),
        );
        assert_eq!(s, Status::Error);
        // Unknown use counts as used.
        let (s, _) = judge(&info(false, None, "a"), &info(false, Some(false), "b"));
        assert_eq!(s, Status::Error);
    }

    #[test]
    fn a_seeded_generator_must_end_in_the_same_state() {
        let (s, _) = judge(&info(true, Some(false), "a"), &info(true, Some(false), "b"));
        assert_eq!(s, Status::Error);
        let (s, _) = judge(&info(true, Some(true), "a"), &info(true, Some(true), "a"));
        assert_eq!(s, Status::Pass);
    }

    #[test]
    fn older_packs_infer_use_from_seed_calls_and_draws() {
        let mut r = RandomInfo::default();
        assert!(untouched(use_of(&r, "python")));
        r.draws.insert(
            (0, "random.shuffle".into()),
            vec![("a.py:1 in f".into(), 2)],
        );
        assert_eq!(use_of(&r, "python").drawn, Some(true));
        assert!(untouched(use_of(&r, "numpy")));
        r.seeds.push(SeedCall {
            rank: 0,
            function: "torch.manual_seed".into(),
            value: Some("1".into()),
            site: String::new(),
        });
        assert!(use_of(&r, "cuda").seeded && use_of(&r, "torch").seeded);
        assert!(!use_of(&r, "numpy").seeded);
    }
}
