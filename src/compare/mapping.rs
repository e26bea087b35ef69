//! The mapping table: which runs of ops of the two sides compute the same thing although
//! they call different APIs, and which names of the comparison run stand for which names
//! of the benchmark.
//!
//! Why it exists: the two runs probe compares rarely call the same ops. An NPU port calls
//! fused kernels (`NPU.npu_fusion_attention`, `NPU.npu_rms_norm`, fused optimizers) where
//! the GPU run calls a torch composition (matmul, softmax, matmul); among torch
//! implementations SDPA stands for matmul/softmax/matmul, `F.layer_norm` for
//! mean/var/rsqrt, a fused Adam for per-tensor updates. Pairing by name leaves both sides
//! of such a place unmatched. The structural aligner, meeting a run of ops on one side with
//! no counterpart on the other inside one module call, asks [`Mapping::rule_for`] whether
//! the two runs are a known equivalence; if so it compares the region at its boundary
//! tensors. The renames ([`Mapping::bench_api`], [`Mapping::tensor_index`],
//! [`Mapping::bench_module`]) carry msprobe's API, data, cell and layer mappings.
//!
//! The table in force is the built-in one ([`Mapping::builtin`]; every entry is listed in
//! docs/compare.md, "Mapping files") under the files given with `probe compare --mapping`:
//! probe's own TOML or one of msprobe's YAML mapping files, read by [`Mapping::load`].
//! Files are input from users and may be hostile: they are read with a size cap, YAML
//! nesting is bounded and aliases refused, and every problem is one [`MappingError`] naming
//! the file and, where there is one, the line.

mod builtin;
mod files;
mod msprobe_yaml;
mod probe_toml;

pub use crate::error::MappingError;
use crate::op_key::api_name;

use std::borrow::Cow;

/// The largest mapping file read. msprobe's data mappings list one line per tensor (a few
/// MB for a large model), far more than a tolerance file, hence a cap above
/// [`crate::config_file::MAX_CONFIG_BYTES`]; still small enough that a mistyped path to a
/// dump or `/dev/zero` is refused at once.
pub(crate) const MAX_MAPPING_BYTES: u64 = 16 << 20;

/// One equivalence between runs of ops: a fused computation and the ops a composition of
/// it may be made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRule {
    /// Short name shown in reports (`rms_norm`).
    pub name: String,
    /// API names (no call counter, no direction) that each compute the whole thing:
    /// `NPU.npu_rms_norm`, `Functional.rms_norm`. A trailing `*` matches every API name
    /// with that beginning.
    pub fused: Vec<String>,
    /// API names the other side's run may be made of: `Tensor.pow`, `Torch.mean`,
    /// `Torch.rsqrt`, `Tensor.__mul__`, ...
    pub composition: Vec<String>,
    /// `built-in`, or the file the rule came from.
    pub source: String,
}

impl MapRule {
    /// Whether `api` is one of the fused APIs.
    pub(crate) fn is_fused(&self, api: &str) -> bool {
        self.fused.iter().any(|p| name_matches(p, api))
    }

    /// Whether `api` may appear in this rule's region: fused or composition.
    pub(crate) fn covers(&self, api: &str) -> bool {
        self.is_fused(api) || self.composition.iter().any(|p| name_matches(p, api))
    }

    /// One side holds fused ops only, the other ops of this rule only.
    fn explains(&self, one: &[&str], other: &[&str]) -> bool {
        one.iter().all(|a| self.is_fused(a)) && other.iter().all(|a| self.covers(a))
    }
}

/// A child rename scoped to one layer class (msprobe's layer mapping): inside a module of
/// class `layer`, the comparison run's child `cmp` is the benchmark's child `bench`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRename {
    /// The class of the enclosing module (`ParallelAttention`).
    pub layer: String,
    /// The child's name in the comparison run; may be dotted (`core.qkv`).
    pub cmp: String,
    /// The child's name in the benchmark.
    pub bench: String,
}

/// The mapping table in force for a compare. Earlier entries take precedence over later
/// ones: the files' entries come before the built-in table's (`Mapping::merge`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    /// Equivalences between op runs, tried in order.
    pub rules: Vec<MapRule>,
    /// Comparison API name → benchmark API name (msprobe's API mapping, `-am`).
    pub api_renames: Vec<(String, String)>,
    /// Comparison tensor name → benchmark tensor name (msprobe's data mapping, `-dm`).
    pub tensor_pairs: Vec<(String, String)>,
    /// Comparison module path prefix → benchmark module path prefix (probe's `[[module]]`,
    /// msprobe's cell mapping, `-cm`). Applied on dotted boundaries, longest prefix first.
    pub module_renames: Vec<(String, String)>,
    /// Child renames scoped to a layer class (msprobe's layer mapping, `-lm`).
    pub layer_renames: Vec<LayerRename>,
    /// API names (trailing `*` allowed) that region matching ignores: views, layout
    /// changes, copies, casts.
    pub passthrough: Vec<String>,
}

impl Mapping {
    /// The documented built-in table (docs/compare.md, "Mapping files"): rules and the
    /// passthrough set; no renames (a rename is specific to one pair of runs).
    pub(crate) fn builtin() -> Mapping {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Mapping {
            rules: builtin::RULES
                .iter()
                .map(|r| MapRule {
                    name: r.name.to_string(),
                    fused: own(r.fused),
                    composition: r.composition.iter().flat_map(|g| own(g)).collect(),
                    source: "built-in".to_string(),
                })
                .collect(),
            passthrough: own(builtin::PASSTHROUGH),
            ..Mapping::default()
        }
    }

    /// Both tables in one: `self`'s entries first, so they win wherever the two disagree
    /// (the first matching rule is the one returned, the first rename of a name the one
    /// applied). Merge user files over the built-in table as `user.merge(builtin)`.
    pub(crate) fn merge(mut self, other: Mapping) -> Mapping {
        self.rules.extend(other.rules);
        self.api_renames.extend(other.api_renames);
        self.tensor_pairs.extend(other.tensor_pairs);
        self.module_renames.extend(other.module_renames);
        self.layer_renames.extend(other.layer_renames);
        for p in other.passthrough {
            if !self.passthrough.contains(&p) {
                self.passthrough.push(p);
            }
        }
        self
    }

    /// Whether region matching ignores `api` (a view, layout change, copy or cast).
    pub(crate) fn is_passthrough(&self, api: &str) -> bool {
        let api = api_name(api);
        self.passthrough.iter().any(|p| name_matches(p, api))
    }

    /// The rule under which a run of benchmark ops and a run of comparison ops are the same
    /// computation, in either direction; None when no rule explains them.
    ///
    /// Each op is an API name (`Functional.layer_norm`); an op key's call counter and
    /// direction are stripped if present (`Functional.layer_norm.3.forward`). Passthrough
    /// ops ([`Mapping::is_passthrough`]) are dropped from both runs first. A rule explains
    /// the pair when, after that, both runs hold at least one op, one run holds only the
    /// rule's fused APIs, and the other only APIs the rule names (its composition, or fused
    /// APIs too: `NPU.npu_rms_norm` against `Functional.rms_norm` is the same computation).
    /// Rules are tried in table order; the first that explains the pair is returned.
    pub(crate) fn rule_for(&self, bench: &[&str], cmp: &[&str]) -> Option<&MapRule> {
        let (b, c) = (self.significant(bench), self.significant(cmp));
        if b.is_empty() || c.is_empty() {
            return None;
        }
        self.rules
            .iter()
            .find(|r| r.explains(&b, &c) || r.explains(&c, &b))
    }

    /// The API names of a run that region matching looks at: counters and directions
    /// stripped, passthrough ops dropped.
    fn significant<'o>(&self, ops: &[&'o str]) -> Vec<&'o str> {
        ops.iter()
            .map(|o| api_name(o))
            .filter(|o| !self.is_passthrough(o))
            .collect()
    }

    /// The benchmark's name for a comparison API name (the first rename of it), or the name
    /// itself.
    pub(crate) fn bench_api<'a>(&'a self, cmp_api: &'a str) -> &'a str {
        self.api_renames
            .iter()
            .find(|(c, _)| c == cmp_api)
            .map_or(cmp_api, |(_, b)| b.as_str())
    }

    /// A comparison module path (`model.layers.3.attn`, or the path-and-class part of a
    /// module key, `fc2.Dense`: no `Module.`/`Cell.` prefix) under the benchmark's names: the
    /// longest matching prefix of [`Mapping::module_renames`] replaced, prefixes matching on
    /// dotted boundaries only (`model.layer` is not a prefix of `model.layers.3`).
    pub(crate) fn bench_module<'a>(&self, cmp_module: &'a str) -> Cow<'a, str> {
        let mut best: Option<&(String, String)> = None;
        for r in &self.module_renames {
            if is_path_prefix(&r.0, cmp_module) && best.is_none_or(|b| r.0.len() > b.0.len()) {
                best = Some(r);
            }
        }
        match best {
            Some((c, b)) if c != b => Cow::Owned(format!("{b}{}", &cmp_module[c.len()..])),
            _ => Cow::Borrowed(cmp_module),
        }
    }

    /// [`Mapping::bench_module`], then the layer renames: walking the path from the root,
    /// a child whose parent's class (`class_of(parent path)`, `""` for the root, in the
    /// comparison run's names) has a [`LayerRename`] for it takes the benchmark's name.
    /// `class_of` is how the caller knows classes (from module keys, `construct.json`); a
    /// parent it cannot name is passed over.
    pub(crate) fn bench_module_in<'a, 'c>(
        &self,
        cmp_module: &'a str,
        class_of: impl Fn(&str) -> Option<&'c str>,
    ) -> Cow<'a, str> {
        let renamed = self.bench_module(cmp_module);
        if matches!(renamed, Cow::Owned(_)) || self.layer_renames.is_empty() {
            return renamed;
        }
        let segs: Vec<&str> = cmp_module.split('.').collect();
        let mut out: Vec<&str> = Vec::with_capacity(segs.len());
        let mut changed = false;
        let mut i = 0;
        while i < segs.len() {
            let parent = segs[..i].join(".");
            let hit = class_of(&parent).and_then(|class| {
                self.layer_renames.iter().find(|r| {
                    r.layer == class && {
                        let n = r.cmp.split('.').count();
                        i + n <= segs.len() && segs[i..i + n].iter().copied().eq(r.cmp.split('.'))
                    }
                })
            });
            match hit {
                Some(r) => {
                    out.extend(r.bench.split('.'));
                    i += r.cmp.split('.').count();
                    changed = true;
                }
                None => {
                    out.push(segs[i]);
                    i += 1;
                }
            }
        }
        if changed {
            Cow::Owned(out.join("."))
        } else {
            Cow::Borrowed(cmp_module)
        }
    }
}

/// Whether a table entry matches an API name: equal, or for an entry ending in `*`, the
/// name starts with what precedes the `*`.
fn name_matches(entry: &str, api: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => api.starts_with(prefix),
        None => entry == api,
    }
}

/// Whether `prefix` is `path` or a leading run of its dotted segments.
fn is_path_prefix(prefix: &str, path: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Checks what an entry naming an API may be: `{ApiType}.{api}` in identifier characters
/// and dots, no empty part; with `pattern`, a trailing `*` (`Torch._foreach_*`, `Torch.*`).
/// An op key or tensor name (with call counter and direction) is refused with the API
/// name it holds, the likeliest slip.
fn check_api_name(name: &str, pattern: bool) -> Result<(), String> {
    let (body, star) = match name.strip_suffix('*') {
        Some(b) if pattern => (b, true),
        _ => (name, false),
    };
    if let Some(c) = body
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '.'))
    {
        let why = if c == '*' && pattern {
            "`*` is allowed only at the end".to_string()
        } else {
            format!("unexpected character {c:?}")
        };
        return Err(format!("{name:?} is not an API name: {why}"));
    }
    let segs: Vec<&str> = body.split('.').collect();
    let n = segs.len();
    // A pattern's last part may be partial or empty: `Torch._foreach_*`, `Torch.*`.
    if n < 2
        || segs
            .iter()
            .enumerate()
            .any(|(i, s)| s.is_empty() && !(star && i == n - 1))
    {
        return Err(format!(
            "{name:?} is not an API name: expected {{ApiType}}.{{api}}, e.g. Functional.gelu"
        ));
    }
    if let Some(i) = segs
        .iter()
        .position(|s| matches!(*s, "forward" | "backward"))
    {
        let mut api = &segs[..i];
        if api
            .last()
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        {
            api = &api[..api.len() - 1];
        }
        return Err(format!(
            "{name:?} names one call, not an API: give the API name without call counter and direction ({})",
            api.join(".")
        ));
    }
    Ok(())
}

/// Checks a dotted module path or name: no empty part, no whitespace or control character.
fn check_dotted(name: &str, what: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("empty {what}"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{what} {name:?} holds whitespace"));
    }
    if name.split('.').any(str::is_empty) {
        return Err(format!("{what} {name:?} has an empty dotted part"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
