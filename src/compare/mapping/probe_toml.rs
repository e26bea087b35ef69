//! probe's own mapping file (TOML): rules, renames and passthrough additions, in the format
//! docs/compare.md ("Mapping files") describes. Every entry is checked here, so that a typo
//! (an op key where an API name belongs, a rule with nothing on one side) is an error with
//! its line rather than a rule that silently never fires.

use super::{check_api_name, check_dotted, LayerRename, MapRule, Mapping, MappingError};
use crate::error::one_line;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<RawRule>,
    #[serde(default)]
    api: Vec<RawPair>,
    #[serde(default)]
    tensor: Vec<RawPair>,
    #[serde(default)]
    module: Vec<RawPair>,
    #[serde(default)]
    layer: Vec<RawLayer>,
    #[serde(default)]
    passthrough: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Spanned<String>,
    fused: Vec<Spanned<String>>,
    composition: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPair {
    cmp: Spanned<String>,
    bench: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    layer: Spanned<String>,
    cmp: Spanned<String>,
    bench: Spanned<String>,
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Reads probe's TOML mapping format.
pub(super) fn parse(text: &str, path: &Path) -> Result<Mapping, MappingError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| MappingError::Toml {
        path: path.to_path_buf(),
        line: e.span().map_or(0, |s| line_of(text, s.start)),
        msg: one_line(e.message().to_string()),
    })?;
    if raw.rule.is_empty()
        && raw.api.is_empty()
        && raw.tensor.is_empty()
        && raw.module.is_empty()
        && raw.layer.is_empty()
        && raw.passthrough.is_empty()
    {
        return Err(MappingError::invalid(
            path,
            0,
            "no entries: expected [[rule]], [[api]], [[tensor]], [[module]], [[layer]] or passthrough",
        ));
    }
    let at = |s: &Spanned<String>| line_of(text, s.span().start);
    let bad = |s: &Spanned<String>, msg: String| MappingError::invalid(path, at(s), msg);
    let source = path.display().to_string();
    let mut m = Mapping::default();

    let mut names: HashMap<&str, usize> = HashMap::new();
    for r in &raw.rule {
        let name = r.name.get_ref();
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err(bad(&r.name, format!("[[rule]]: bad name {name:?}")));
        }
        if let Some(first) = names.insert(name, at(&r.name)) {
            return Err(bad(
                &r.name,
                format!("[[rule]] {name:?} is defined twice (first at line {first})"),
            ));
        }
        for (what, list) in [("fused", &r.fused), ("composition", &r.composition)] {
            if list.is_empty() {
                return Err(bad(
                    &r.name,
                    format!("[[rule]] {name:?}: `{what}` is empty: name at least one API"),
                ));
            }
            for e in list {
                check_api_name(e.get_ref(), true)
                    .map_err(|msg| bad(e, format!("[[rule]] {name:?}, {what}: {msg}")))?;
            }
        }
        let own = |v: &[Spanned<String>]| v.iter().map(|s| s.get_ref().clone()).collect();
        m.rules.push(MapRule {
            name: name.clone(),
            fused: own(&r.fused),
            composition: own(&r.composition),
            source: source.clone(),
        });
    }

    let api = |s: &str| check_api_name(s, false);
    let tensor = |s: &str| check_dotted(s, "tensor name");
    let module = |s: &str| check_dotted(s, "module path");
    m.api_renames = pairs(&raw.api, "api", &api, &bad, &at)?;
    m.tensor_pairs = pairs(&raw.tensor, "tensor", &tensor, &bad, &at)?;
    m.module_renames = pairs(&raw.module, "module", &module, &bad, &at)?;

    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    for l in &raw.layer {
        check_dotted(l.layer.get_ref(), "layer class")
            .map_err(|msg| bad(&l.layer, format!("[[layer]]: {msg}")))?;
        for s in [&l.cmp, &l.bench] {
            check_dotted(s.get_ref(), "child name")
                .map_err(|msg| bad(s, format!("[[layer]]: {msg}")))?;
        }
        if let Some(first) = seen.insert((l.layer.get_ref(), l.cmp.get_ref()), at(&l.cmp)) {
            return Err(bad(
                &l.cmp,
                format!(
                    "[[layer]] {:?} renames {:?} twice (first at line {first})",
                    l.layer.get_ref(),
                    l.cmp.get_ref()
                ),
            ));
        }
        m.layer_renames.push(LayerRename {
            layer: l.layer.get_ref().clone(),
            cmp: l.cmp.get_ref().clone(),
            bench: l.bench.get_ref().clone(),
        });
    }

    for p in &raw.passthrough {
        check_api_name(p.get_ref(), true).map_err(|msg| bad(p, format!("passthrough: {msg}")))?;
        if !m.passthrough.contains(p.get_ref()) {
            m.passthrough.push(p.get_ref().clone());
        }
    }
    Ok(m)
}

/// The `[[table]]` entries as (cmp, bench) pairs, each name checked, a comparison name
/// given twice refused (which one would apply is a guess).
fn pairs(
    list: &[RawPair],
    table: &str,
    check: &dyn Fn(&str) -> Result<(), String>,
    bad: &dyn Fn(&Spanned<String>, String) -> MappingError,
    at: &dyn Fn(&Spanned<String>) -> usize,
) -> Result<Vec<(String, String)>, MappingError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(list.len());
    for p in list {
        for s in [&p.cmp, &p.bench] {
            check(s.get_ref()).map_err(|msg| bad(s, format!("[[{table}]]: {msg}")))?;
        }
        if let Some(first) = seen.insert(p.cmp.get_ref(), at(&p.cmp)) {
            return Err(bad(
                &p.cmp,
                format!(
                    "[[{table}]] cmp {:?} is given twice (first at line {first})",
                    p.cmp.get_ref()
                ),
            ));
        }
        out.push((p.cmp.get_ref().clone(), p.bench.get_ref().clone()));
    }
    Ok(out)
}
