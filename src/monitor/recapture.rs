//! The capture configuration that dumps exactly where a monitor says runs part (or a run
//! goes bad): that step and the one before (the last step where all was well, whose
//! update the step starts from), that rank, and the module with the one that fed it.
//!
//! `recapture.json` is a probe capture configuration as it is (`probe.Debugger(
//! "recapture.json")`): level `mix` (modules and the API calls inside them), statistics
//! mode, `steps`, `ranks`, and `include_modules` when the module is not the whole model;
//! its `$`-keys (which the agent ignores) say why, and `$msprobe` holds the same selection
//! as an msprobe `config.json` (its `list` names the modules; msprobe matches list entries
//! as substrings).

use serde_json::{json, Value};

/// What to capture again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The step.
    pub step: i64,
    /// The step before it, when there is one.
    pub previous_step: Option<i64>,
    /// The rank.
    pub rank: u32,
    /// The module (`""`: the whole model).
    pub module: String,
    /// The module that returned just before it in the step.
    pub producer: Option<String>,
    /// Why (the headline).
    pub reason: String,
}

/// The recapture configuration of a target.
pub fn config(t: &Target) -> Value {
    let steps: Vec<i64> = t.previous_step.into_iter().chain([t.step]).collect();
    let modules: Vec<&str> = if t.module.is_empty() {
        Vec::new()
    } else {
        t.producer
            .iter()
            .map(String::as_str)
            .filter(|p| !p.is_empty())
            .chain([t.module.as_str()])
            .collect()
    };
    let mut probe = json!({
        "$reason": t.reason,
        "$monitor": {"step": t.step, "rank": t.rank, "module": t.module},
        "steps": steps,
        "ranks": [t.rank],
        "level": "mix",
        "mode": "statistics",
    });
    if !modules.is_empty() {
        probe["include_modules"] = json!(modules);
    }
    probe["$msprobe"] = json!({
        "task": "statistics",
        "dump_path": "./recapture_dump",
        "rank": [t.rank],
        "step": steps,
        "level": "mix",
        "statistics": {
            "scope": [],
            "list": modules,
            "data_mode": ["all"],
            "summary_mode": "statistics",
        },
    });
    probe
}
