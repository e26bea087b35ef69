//! What counts as a difference, how bad it is, and which names are the same thing on the
//! other platform: built-in defaults plus the user's TOML (docs/config-check.md).

use super::Category;
use crate::error::{ProbeError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What a difference in an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Fails the check by default.
    Error,
    /// Reported; fails only with `--fail-on warning`.
    Warning,
    /// A normal difference between the two platforms; counts as pass.
    Expected,
    /// Ignored; counts as pass.
    Ignore,
}

/// The user's config-check TOML.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    /// Use the built-in ignore lists, equivalences and severities (default true).
    #[serde(default)]
    pub use_defaults: Option<bool>,
    /// Relative tolerance for statistics when a side has no hash (default 1e-6).
    #[serde(default)]
    pub stats_rtol: Option<f64>,
    /// Category name → glob patterns of items whose differences are ignored.
    #[serde(default)]
    pub ignore: BTreeMap<String, Vec<String>>,
    /// `[[equivalence]]` tables: names that mean the same thing on the two sides.
    #[serde(default)]
    pub equivalence: Vec<EquivalenceDoc>,
    /// `[[severity]]` tables: levels for matching items; the last match wins.
    #[serde(default)]
    pub severity: Vec<SeverityDoc>,
}

/// One `[[equivalence]]` table of the rules file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EquivalenceDoc {
    /// Category name (`env`, `packages`, ...).
    pub category: String,
    /// Item name (a trailing `*` captures a suffix) on one side ...
    pub bench: String,
    /// ... and its counterpart on the other side (either way round).
    pub cmp: String,
}

/// One `[[severity]]` table of the rules file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SeverityDoc {
    /// Category name (`env`, `packages`, ...).
    pub category: String,
    /// Glob over item names; default `*`.
    #[serde(default)]
    pub item: Option<String>,
    /// The level a difference in a matching item gets.
    pub level: Level,
}

/// Two item names that mean the same thing on the two sides, either way round.
#[derive(Debug, Clone)]
pub struct Equivalence {
    /// The category the names belong to.
    pub category: Category,
    /// One name (a trailing `*` captures a suffix).
    pub a: String,
    /// Its counterpart (a trailing `*` receives the captured suffix).
    pub b: String,
}

#[derive(Debug, Clone)]
struct SeverityRule {
    category: Category,
    item: glob::Pattern,
    level: Level,
}

/// The rules a check runs with.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Relative tolerance for statistics when a side has no hash.
    pub stats_rtol: f64,
    ignore: Vec<(Category, glob::Pattern)>,
    /// Built-in equivalences (unless disabled), then the user's.
    pub equivalences: Vec<Equivalence>,
    severity: Vec<SeverityRule>,
}

/// Environment variables that change numerics: a difference is an error.
pub(crate) const ENV_PRECISION: &[&str] = &[
    "CUDA_LAUNCH_BLOCKING",
    "ASCEND_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "*DETERMINISTIC*",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32*",
    "*_NUM_THREADS",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "HCCL_ALGO",
    "*PRECISION*",
    "INF_NAN_MODE_ENABLE",
    "ATB_*",
];

/// Environment variables that differ between any two runs and mean nothing for numerics.
pub(crate) const ENV_VOLATILE: &[&str] = &[
    "PWD",
    "OLDPWD",
    "_",
    "SHLVL",
    "HOSTNAME",
    "HOST",
    "HOME",
    "USER",
    "LOGNAME",
    "MAIL",
    "TERM",
    "TERM_*",
    "COLORTERM",
    "LS_COLORS",
    "SSH_*",
    "DISPLAY",
    "XDG_*",
    "TMUX*",
    "STY",
    "WINDOW",
    "PS1",
    "SUDO_*",
    "GPG_*",
    "DBUS_*",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_RUN_ID",
    "TORCHINDUCTOR_CACHE_DIR",
    "*_PID",
];

/// Env families that exist on one platform only (expected when the sides differ).
pub(crate) const ENV_PLATFORM: &[&str] = &[
    "CUDA_*",
    "NCCL_*",
    "NVIDIA_*",
    "CUBLAS_*",
    "CUDNN_*",
    "TORCH_NCCL_*",
    "ASCEND_*",
    "HCCL_*",
    "ACL_*",
    "TORCH_HCCL_*",
    "TASK_QUEUE_ENABLE",
    "PYTORCH_NPU_*",
    "LD_LIBRARY_PATH",
    "TOOLCHAIN_HOME",
];

/// Packages whose version difference is an error (others: warning).
pub(crate) const KEY_PACKAGES: &[&str] = &[
    "torch",
    "torch-npu",
    "numpy",
    "transformers",
    "accelerate",
    "deepspeed",
    "megatron-core",
    "mindspeed",
    "apex",
    "triton",
    "flash-attn",
    "xformers",
    "peft",
    "timm",
    "torchvision",
    "torchaudio",
    "tokenizers",
    "safetensors",
    "scipy",
];

/// Packages that exist on one platform only.
pub(crate) const PACKAGES_PLATFORM: &[&str] = &[
    "torch-npu",
    "nvidia-*",
    "cuda-*",
    "cupy*",
    "triton",
    "pytorch-triton*",
    "te",
    "hccl",
    "op-gen",
    "opc-tool",
    "schedule-search",
    "auto-tune",
    "dataflow",
    "llm-datadist",
    "torchair",
    "accelerator.*",
];

/// Built-in equivalences (NPU ↔ GPU), either way round.
const DEFAULT_EQUIVALENCES: &[(Category, &str, &str)] = &[
    (
        Category::Env,
        "CUDA_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
    ),
    (
        Category::Env,
        "CUDA_LAUNCH_BLOCKING",
        "ASCEND_LAUNCH_BLOCKING",
    ),
    (Category::Env, "NCCL_*", "HCCL_*"),
    (Category::Env, "TORCH_NCCL_*", "TORCH_HCCL_*"),
    (
        Category::Determinism,
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.npu.matmul.allow_hf32",
    ),
    (
        Category::Determinism,
        "torch.backends.cudnn.allow_tf32",
        "torch.npu.conv.allow_hf32",
    ),
    (Category::Determinism, "autocast.cuda.*", "autocast.npu.*"),
    (Category::Random, "torch.cuda.*", "torch.npu.*"),
    (Category::Random, "cuda", "npu"),
];

/// Default severity of differences per category, before the user's rules.
const DEFAULT_SEVERITY: &[(Category, &str, Level)] = &[
    (Category::Hyperparameters, "argv", Level::Warning),
    (
        Category::Determinism,
        "torch.get_num_threads",
        Level::Warning,
    ),
    (Category::Packages, "os.*", Level::Warning),
    (Category::Packages, "cpu.*", Level::Warning),
    (Category::Packages, "python.implementation", Level::Warning),
];

fn pattern(p: &str, path: Option<&Path>) -> Result<glob::Pattern> {
    glob::Pattern::new(p).map_err(|e| ProbeError::BadConfig {
        path: path.map(Path::to_path_buf).unwrap_or_default(),
        msg: format!("bad pattern {p:?}: {e}"),
    })
}

/// Does `name` match a `*`-glob (case-sensitive)?
pub(crate) fn matches(pat: &str, name: &str) -> bool {
    glob::Pattern::new(pat).is_ok_and(|p| p.matches(name))
}

/// Does `name` match any of the `*`-globs `pats`?
pub(crate) fn matches_any(pats: &[&str], name: &str) -> bool {
    pats.iter().any(|p| matches(p, name))
}

impl Default for Rules {
    fn default() -> Self {
        // The built-in patterns are valid; an invalid one would only make it not match.
        Rules::build(&ConfigFile::default(), None).unwrap_or(Rules {
            stats_rtol: 1e-6,
            ignore: vec![],
            equivalences: vec![],
            severity: vec![],
        })
    }
}

impl Rules {
    /// The level a difference gets: a rule's, else the category's own judgement.
    #[cfg(test)]
    pub(crate) fn level(&self, c: Category, item: &str, own: Level) -> Level {
        self.rule_level(c, item).unwrap_or(own)
    }

    /// Reads a rules TOML file (`--config`) and builds the rules from it.
    pub fn from_file(path: &Path) -> Result<Rules> {
        let text = crate::config_file::read(path)?;
        Rules::from_toml(&text, path)
    }

    /// Parses the text of a rules TOML file (`path` only names it in errors) and builds the
    /// rules from it. [`Rules::from_file`] reads the file and calls this.
    pub fn from_toml(text: &str, path: &Path) -> Result<Rules> {
        let cfg: ConfigFile = toml::from_str(text).map_err(|e| ProbeError::BadConfig {
            path: path.to_path_buf(),
            msg: crate::config_file::printable(&e.to_string().trim().replace('\n', " ")),
        })?;
        Rules::build(&cfg, Some(path))
    }

    /// Builds the rules from a parsed rules file (`path` names it in errors), adding the
    /// built-in defaults unless `use_defaults = false`.
    pub(crate) fn build(cfg: &ConfigFile, path: Option<&Path>) -> Result<Rules> {
        let bad = |msg: String| ProbeError::BadConfig {
            path: path.map(Path::to_path_buf).unwrap_or_default(),
            msg,
        };
        let cat = |name: &str| {
            Category::parse(name).ok_or_else(|| {
                bad(format!(
                    "unknown category {name:?} (env, packages, determinism, random, dataset, weights, hyperparameters)"
                ))
            })
        };
        let defaults = cfg.use_defaults.unwrap_or(true);
        let mut r = Rules {
            stats_rtol: cfg.stats_rtol.unwrap_or(1e-6),
            ignore: vec![],
            equivalences: vec![],
            severity: vec![],
        };
        if r.stats_rtol.is_nan() || r.stats_rtol < 0.0 {
            return Err(bad("stats_rtol must be a number >= 0".into()));
        }
        if defaults {
            for p in ENV_VOLATILE {
                r.ignore.push((Category::Env, pattern(p, path)?));
            }
            for (c, a, b) in DEFAULT_EQUIVALENCES {
                r.equivalences.push(Equivalence {
                    category: *c,
                    a: a.to_string(),
                    b: b.to_string(),
                });
            }
            for (c, p, l) in DEFAULT_SEVERITY {
                r.severity.push(SeverityRule {
                    category: *c,
                    item: pattern(p, path)?,
                    level: *l,
                });
            }
        }
        for (c, pats) in &cfg.ignore {
            let c = cat(c)?;
            for p in pats {
                r.ignore.push((c, pattern(p, path)?));
            }
        }
        for e in &cfg.equivalence {
            r.equivalences.push(Equivalence {
                category: cat(&e.category)?,
                a: e.bench.clone(),
                b: e.cmp.clone(),
            });
        }
        for s in &cfg.severity {
            r.severity.push(SeverityRule {
                category: cat(&s.category)?,
                item: pattern(s.item.as_deref().unwrap_or("*"), path)?,
                level: s.level,
            });
        }
        Ok(r)
    }

    /// Whether an ignore pattern of category `c` matches `item`.
    pub(crate) fn ignored(&self, c: Category, item: &str) -> bool {
        self.ignore.iter().any(|(k, p)| *k == c && p.matches(item))
    }

    /// The level a rule gives a difference in `item`: ignore lists first, then severity
    /// rules (built-in, then the user's; the last that matches wins). None: no rule.
    pub fn rule_level(&self, c: Category, item: &str) -> Option<Level> {
        if self.ignored(c, item) {
            return Some(Level::Ignore);
        }
        self.severity
            .iter()
            .rev()
            .find(|s| s.category == c && s.item.matches(item))
            .map(|s| s.level)
    }

    /// The counterpart of `name` on the other side under an equivalence, if any.
    pub(crate) fn counterparts(&self, c: Category, name: &str) -> Vec<String> {
        let mut out = vec![];
        for e in self.equivalences.iter().filter(|e| e.category == c) {
            for (from, to) in [(&e.a, &e.b), (&e.b, &e.a)] {
                if let Some(m) = map_name(from, to, name) {
                    out.push(m);
                }
            }
        }
        out
    }
}

/// `NCCL_*` → `HCCL_*` maps `NCCL_ALGO` to `HCCL_ALGO`; names without `*` map exactly.
fn map_name(from: &str, to: &str, name: &str) -> Option<String> {
    match (from.strip_suffix('*'), to.strip_suffix('*')) {
        (Some(fp), Some(tp)) => name.strip_prefix(fp).map(|rest| format!("{tp}{rest}")),
        _ => (from == name).then(|| to.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equivalences_map_both_ways() {
        let r = Rules::default();
        assert_eq!(
            r.counterparts(Category::Env, "NCCL_ALGO"),
            vec!["HCCL_ALGO".to_string()]
        );
        assert!(r
            .counterparts(Category::Env, "ASCEND_RT_VISIBLE_DEVICES")
            .contains(&"CUDA_VISIBLE_DEVICES".to_string()));
    }

    #[test]
    fn user_rules_win() {
        let cfg: ConfigFile = toml::from_str(
            "[ignore]\nenv = [\"SLURM_*\"]\n[[severity]]\ncategory = \"env\"\nitem = \"CUDA_LAUNCH_BLOCKING\"\nlevel = \"warning\"\n",
        )
        .unwrap();
        let r = Rules::build(&cfg, None).unwrap();
        assert_eq!(
            r.level(Category::Env, "SLURM_JOB_ID", Level::Warning),
            Level::Ignore
        );
        assert_eq!(
            r.level(Category::Env, "CUDA_LAUNCH_BLOCKING", Level::Error),
            Level::Warning
        );
        assert_eq!(r.level(Category::Env, "PWD", Level::Warning), Level::Ignore);
    }

    #[test]
    fn bad_category_is_an_error() {
        let cfg: ConfigFile = toml::from_str("[ignore]\nenvv = [\"X\"]\n").unwrap();
        assert!(Rules::build(&cfg, None).is_err());
    }
}
