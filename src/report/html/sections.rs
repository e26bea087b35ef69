//! The page's sections below the plot, from the overview: the culprit with its evidence
//! and stack, the module tree (each module's worst error), the findings, the worst ops
//! and the run's facts.

use super::plot::{Agg, Plot};
use super::{esc, num, MAX_MODULES};
use crate::report::{Listed, Overview};
use crate::schema::summary::Finding;
use crate::vocab::FindingKind;
use std::collections::BTreeMap;
use std::fmt::Write as _;

impl Plot {
    /// The module tree: nested `<details>`, each module with its worst error; modules with
    /// out-of-tolerance tensors open.
    pub(super) fn module_tree(&self, out: &mut String) {
        let mut root = Node::default();
        for (path, agg) in &self.modules {
            let mut node = &mut root;
            node.agg.merge(agg);
            for seg in path.split('.') {
                node = node.children.entry(seg.to_string()).or_default();
                node.agg.merge(agg);
            }
        }
        out.push_str("<h2>Modules</h2>\n<div class=\"card\" id=\"modules\">\n");
        for (name, child) in &root.children {
            child.render(out, name.clone());
        }
        if self.modules_left_out > 0 {
            let _ = writeln!(
                out,
                "<p class=\"muted\">{} tensors in modules past the first {MAX_MODULES} are not in the tree.</p>",
                self.modules_left_out
            );
        }
        out.push_str("</div>\n");
    }
}

/// A module in the tree.
#[derive(Default)]
struct Node {
    agg: Agg,
    children: BTreeMap<String, Node>,
}

impl Node {
    /// Renders the node whose full path is `path`.
    fn render(&self, out: &mut String, path: String) {
        let a = &self.agg;
        let class = if a.errors > 0 { "error" } else { "" };
        let worst = match &a.worst {
            Some((e, op)) => format!("worst error {} ({})", num(*e), esc(op)),
            None => String::new(),
        };
        let line = format!(
            "<span class=\"{class}\"><code>{}</code></span> <span class=\"muted\">{worst} · {} tensors, {} out of tolerance</span>",
            esc(&path),
            a.tensors,
            a.errors
        );
        if self.children.is_empty() {
            let _ = writeln!(out, "<div class=\"leaf\">{line}</div>");
            return;
        }
        let open = if a.errors > 0 { " open" } else { "" };
        let _ = writeln!(out, "<details{open}><summary>{line}</summary>");
        for (n, c) in &self.children {
            c.render(out, format!("{path}.{n}"));
        }
        out.push_str("</details>\n");
    }
}

/// ` in <code>model.layers.1.mlp</code>`: the module an API call ran in, escaped (a module
/// record's key names its module already); empty when the dump does not say.
fn in_module(f: &Finding) -> String {
    match &f.module {
        Some(m) if crate::op_key::module_path(&f.op).is_none() => {
            format!(" in <code>{}</code>", esc(m))
        }
        _ => String::new(),
    }
}

/// One finding: what, where, why; evidence and stack when given.
fn finding_body(out: &mut String, f: &Finding, open: bool) {
    let _ = writeln!(
        out,
        "<div><code>{}</code>{} <span class=\"muted\">({} {}/{}, seq {})</span></div>\n\
<div>tensor <code>{}</code>: {}</div>\n<div>{}</div>",
        esc(&f.op),
        in_module(f),
        f.direction.name(),
        esc(&f.step),
        esc(&f.rank),
        f.seq,
        esc(&f.tensor),
        esc(&f.reason),
        esc(&f.explanation)
    );
    let o = if open { " open" } else { "" };
    if !f.evidence.is_empty() {
        let _ = writeln!(
            out,
            "<details{o}><summary>evidence</summary><pre>{}</pre></details>",
            esc(&f.evidence.join("\n"))
        );
    }
    if !f.stack.is_empty() {
        let _ = writeln!(
            out,
            "<details{o}><summary>stack</summary><pre>{}</pre></details>",
            esc(&f.stack.join("\n"))
        );
    }
}

/// The culprit: the first finding naming a divergent op (or entry point), with its
/// evidence and stack open.
pub(super) fn culprit(out: &mut String, ov: &Overview) {
    // A consequence of an earlier step's divergence locates nothing.
    let locates =
        |l: &&Listed| l.kind.is_some_and(FindingKind::locates_divergence) && !l.consequence();
    let Some(Listed {
        title, finding: f, ..
    }) = ov
        .findings
        .iter()
        .find(locates)
        .or_else(|| ov.findings.first())
    else {
        return;
    };
    let _ = writeln!(
        out,
        "<h2>Culprit</h2>\n<div class=\"card culprit\" id=\"culprit\"><div><b>{}</b></div>",
        esc(title)
    );
    finding_body(out, f, true);
    out.push_str("</div>\n");
}

pub(super) fn findings(out: &mut String, ov: &Overview) {
    if ov.findings.is_empty() {
        return;
    }
    out.push_str("<h2>Findings</h2>\n<div id=\"findings\">\n");
    for Listed {
        title, finding: f, ..
    } in &ov.findings
    {
        let _ = writeln!(
            out,
            "<details class=\"card\"><summary><b>{}</b>: <code>{}</code>{}</summary>",
            esc(title),
            esc(&f.op),
            in_module(f)
        );
        finding_body(out, f, false);
        out.push_str("</details>\n");
    }
    out.push_str("</div>\n");
}

pub(super) fn worst_ops(out: &mut String, ov: &Overview) {
    if ov.worst_ops.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Worst ops</h2>\n<table id=\"worst\"><tr><th>step/rank</th><th>seq</th><th>op</th><th>verdict</th><th>error</th><th>tensor</th><th>reason</th></tr>\n",
    );
    for w in &ov.worst_ops {
        let _ = writeln!(
            out,
            "<tr><td>{}/{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td class=\"{}\">{}</td><td class=\"n\">{}</td><td><code>{}</code></td><td>{}</td></tr>",
            esc(&w.step),
            esc(&w.rank),
            w.seq,
            esc(&w.op),
            w.verdict.name(),
            w.verdict.name(),
            w.err.map_or("inf".into(), num),
            esc(&w.tensor),
            esc(&w.reason)
        );
    }
    out.push_str("</table>\n");
}

pub(super) fn facts(out: &mut String, ov: &Overview) {
    out.push_str("<h2>Run</h2>\n<table id=\"facts\">\n");
    for (k, v) in &ov.facts {
        let _ = writeln!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table>\n");
}
