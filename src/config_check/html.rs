//! `config_check.html`: the config check as one self-contained page, in the style of
//! `compare.html` (same inline style, same escaping: pack values are untrusted input). One
//! section per category with what differs; passing items are only counted (the JSON and
//! the workbook list them all).

use super::{CheckReport, Item, Status};
use crate::atomic;
use crate::error::Result;
use crate::report::html::{close_page, esc, num, open_page};
use std::fmt::Write as _;
use std::path::Path;

/// Items listed per category at most (the rest are counted; `config_check.json` has all).
const MAX_ITEMS: usize = 2000;
/// Characters of a value shown at most.
const MAX_VALUE: usize = 200;

/// Writes the page atomically.
pub(crate) fn write(report: &CheckReport, path: &Path) -> Result<()> {
    atomic::write_bytes(path, render(report).as_bytes())
}

fn badge(verdict: &str) -> String {
    let v = esc(verdict);
    format!("<span class=\"badge b-{v}\">{v}</span>")
}

/// A value for the table: `<unset>` when absent, long ones cut.
fn value(v: &Option<String>) -> String {
    match v {
        None => "<span class=\"muted\">&lt;unset&gt;</span>".into(),
        Some(s) if s.chars().count() > MAX_VALUE => {
            let cut: String = s.chars().take(MAX_VALUE - 1).collect();
            format!("<code>{}…</code>", esc(&cut))
        }
        Some(s) => format!("<code>{}</code>", esc(s)),
    }
}

fn item_row(out: &mut String, i: &Item) {
    let at = match (i.step, i.rank) {
        (Some(s), Some(_)) if i.ranks.is_some() => format!(
            "step {s}, {}",
            super::ranks::render::of_ranks(i.ranks.as_deref().unwrap_or_default())
        ),
        (None, Some(_)) if i.ranks.is_some() => {
            super::ranks::render::of_ranks(i.ranks.as_deref().unwrap_or_default())
        }
        (Some(s), Some(r)) => format!("step {s}, rank {r}"),
        (Some(s), None) => format!("step {s}"),
        (None, Some(r)) => format!("rank {r}"),
        (None, None) => String::new(),
    };
    let stats = i
        .stats
        .as_ref()
        .and_then(|s| s.max_rel_diff)
        .map(|d| format!(" (statistics differ by up to {})", num(d)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>",
        badge(i.status.name()),
        esc(&i.item),
        esc(&at),
        value(&i.bench),
        value(&i.cmp),
        esc(&i.detail),
        esc(&stats)
    );
}

/// The whole page.
pub(crate) fn render(r: &CheckReport) -> String {
    let mut out = String::new();
    open_page(&mut out, &format!("probe config-check: {}", r.verdict));
    let _ = writeln!(
        out,
        "<h1>probe config-check {}</h1>\n<div class=\"headline {}\" id=\"headline\">{} error, {} warning, {} expected, {} ignored, {} pass{}</div>",
        badge(&r.verdict),
        esc(&r.verdict),
        r.counts.error,
        r.counts.warning,
        r.counts.expected,
        r.counts.ignored,
        r.counts.pass,
        if r.cross_platform {
            format!(
                " ({} vs {}: platform differences reported as expected)",
                esc(&r.bench.family.to_uppercase()),
                esc(&r.cmp.family.to_uppercase())
            )
        } else {
            String::new()
        }
    );
    out.push_str("<table id=\"packs\"><tr><th></th><th>pack</th><th>format</th><th>device</th><th>producer</th></tr>\n");
    for (side, p) in [("bench", &r.bench), ("cmp", &r.cmp)] {
        let fmt = match (p.format, p.version) {
            (super::pack::PackKind::Probe, Some(v)) => format!("probe pack v{v}"),
            (super::pack::PackKind::Probe, None) => "probe pack".into(),
            (super::pack::PackKind::Msprobe, _) => "msprobe pack".into(),
        };
        let _ = writeln!(
            out,
            "<tr><th>{side}</th><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.path),
            esc(&fmt),
            esc(&p.device),
            esc(p.producer.as_deref().unwrap_or(""))
        );
    }
    out.push_str("</table>\n<h2>Categories</h2>\n<table id=\"categories\"><tr><th>category</th><th>verdict</th><th>pass</th><th>expected</th><th>ignored</th><th>warning</th><th>error</th></tr>\n");
    for c in &r.categories {
        let n = &c.counts;
        let _ = writeln!(
            out,
            "<tr><td><a href=\"#cat-{0}\">{0}</a></td><td>{1}</td><td class=\"n\">{2}</td><td class=\"n\">{3}</td><td class=\"n\">{4}</td><td class=\"n\">{5}</td><td class=\"n\">{6}</td></tr>",
            c.name.name(),
            badge(&c.verdict),
            n.pass,
            n.expected,
            n.ignored,
            n.warning,
            n.error
        );
    }
    out.push_str("</table>\n");
    if let Some(rk) = &r.ranks {
        super::ranks::render::html(&mut out, rk);
    }
    out.push_str("<h2>What differs</h2>\n");
    for c in &r.categories {
        let mut items: Vec<&Item> = r
            .items
            .iter()
            .filter(|i| i.category == c.name && i.status != Status::Pass)
            .collect();
        // Worst first; the report's order within a status.
        items.sort_by_key(|i| std::cmp::Reverse(i.status));
        let open = if c.counts.error + c.counts.warning > 0 {
            " open"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<details class=\"card\" id=\"cat-{0}\"{open}><summary><b>{0}</b> {1} <span class=\"muted\">{2} differ, {3} pass</span></summary>",
            c.name.name(),
            badge(&c.verdict),
            items.len(),
            c.counts.pass
        );
        for note in &c.notes {
            let _ = writeln!(out, "<p class=\"muted\">{}</p>", esc(note));
        }
        if !items.is_empty() {
            out.push_str("<table><tr><th>status</th><th>item</th><th>where</th><th>bench</th><th>cmp</th><th>why</th></tr>\n");
            for i in items.iter().take(MAX_ITEMS) {
                item_row(&mut out, i);
            }
            out.push_str("</table>\n");
            if items.len() > MAX_ITEMS {
                let _ = writeln!(
                    out,
                    "<p class=\"muted\">… and {} more (see config_check.json / config_check.xlsx)</p>",
                    items.len() - MAX_ITEMS
                );
            }
        }
        out.push_str("</details>\n");
    }
    close_page(&mut out);
    out
}
