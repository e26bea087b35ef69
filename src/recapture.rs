//! `recapture.json`: the capture configuration of what a dump lacks, written beside the
//! reports (and by `probe replay`) so that the next capture holds it, with no change to the
//! training script (`PROBE_CONFIG=.../recapture.json`, or `probe.Debugger(path)`).
//!
//! One writer for every command ([`bytes`], [`FILE`]); two kinds of target: a monitor's
//! step/rank/module in statistics mode (`monitor::recapture`), and, here, the ops a replay
//! needs in tensor mode ([`OpTarget`], [`op_config`]): a compare whose first divergent op
//! was dumped without its tensors (statistics or checksum mode), or an op outside the
//! dumped steps, ranks or scope.

use crate::op_key::{OpKey, OpKind};
use serde_json::{json, Value};

/// The name of the recapture configuration in an output folder.
pub const FILE: &str = "recapture.json";

/// Where a recapture writes its dump unless told otherwise: apart from the dump it
/// completes, so that the first capture is not written over.
pub const DUMP_PATH: &str = "./probe_recapture";

/// The configuration as file bytes: pretty JSON and a final newline.
pub fn bytes(config: &Value) -> Vec<u8> {
    // A `Value` always serializes (its map keys are strings).
    let mut b = serde_json::to_vec_pretty(config).unwrap_or_default();
    b.push(b'\n');
    b
}

/// Ops to capture again in tensor mode: one step, one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpTarget {
    /// The step (`debugger.step()` count: the dump's `step<S>` folder).
    pub step: u64,
    /// The rank.
    pub rank: u64,
    /// The op keys (`Functional.linear.2.forward`), in the order given.
    pub ops: Vec<String>,
    /// Why (what the dump lacks).
    pub reason: String,
}

/// The name the capture agent's `include` matches a call of `key` by (its candidates:
/// `Functional.gelu.3` for an API call, `Module.fc.Linear.forward.0` for a module call,
/// `Module.fc.Linear` for a module's parameter gradients): the call itself, whose forward
/// and backward are captured alike. A key outside the grammar is matched as written.
pub fn include_name(key: &str) -> String {
    let k = OpKey::parse(key);
    match (k.kind(), k.call()) {
        (OpKind::Api, Some(call)) if k.has_call() => format!("{}.{call}", k.base()),
        (OpKind::Module, Some(call)) if k.has_call() => format!("{}.forward.{call}", k.base()),
        (OpKind::ParametersGrad, _) => k.base().to_string(),
        _ => key.to_string(),
    }
}

/// The forward key of the call (what msprobe's `list` names: a backward call is captured
/// with its forward).
fn msprobe_name(key: &str) -> String {
    let k = OpKey::parse(key);
    match k.kind() {
        OpKind::ParametersGrad => k.base().to_string(),
        _ => k.forward_twin().unwrap_or_else(|| key.to_string()),
    }
}

/// The recapture configuration of ops: a probe capture configuration (tensor mode, that
/// step and rank, `include` naming each call; level `api`, or `mix` when a module is among
/// them) whose `$`-keys (ignored by the agent) say why, and `$msprobe` the same selection
/// as an msprobe `config.json` (`task: tensor`, its `list` naming the calls).
pub fn op_config(t: &OpTarget) -> Value {
    let mut include: Vec<String> = Vec::new();
    let mut list: Vec<String> = Vec::new();
    for op in &t.ops {
        for (into, name) in [
            (&mut include, include_name(op)),
            (&mut list, msprobe_name(op)),
        ] {
            if !into.contains(&name) {
                into.push(name);
            }
        }
    }
    let modules = t
        .ops
        .iter()
        .any(|op| OpKey::parse(op).kind() != OpKind::Api);
    let (level, msprobe_level) = if modules {
        ("mix", "mix")
    } else {
        ("api", "L1")
    };
    json!({
        "$reason": t.reason,
        "$replay": {"step": t.step, "rank": t.rank, "ops": t.ops},
        "dump_path": DUMP_PATH,
        "steps": [t.step],
        "ranks": [t.rank],
        "level": level,
        "mode": "tensor",
        "include": include,
        "$msprobe": {
            "task": "tensor",
            "dump_path": DUMP_PATH,
            "rank": [t.rank],
            "step": [t.step],
            "level": msprobe_level,
            "tensor": {
                "scope": [],
                "list": list,
                "data_mode": ["all"],
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_names_match_the_agents_candidates() {
        assert_eq!(
            include_name("Functional.gelu.3.forward"),
            "Functional.gelu.3"
        );
        assert_eq!(
            include_name("Functional.gelu.3.backward"),
            "Functional.gelu.3"
        );
        assert_eq!(
            include_name("Module.blocks.1.Block.backward.2"),
            "Module.blocks.1.Block.forward.2"
        );
        assert_eq!(
            include_name("Module.fc.Linear.parameters_grad"),
            "Module.fc.Linear"
        );
        assert_eq!(include_name("odd"), "odd");
    }

    #[test]
    fn one_entry_per_call_and_the_level_follows_the_ops() {
        let t = OpTarget {
            step: 2,
            rank: 1,
            ops: vec![
                "Functional.linear.2.forward".into(),
                "Functional.linear.2.backward".into(),
            ],
            reason: "r".into(),
        };
        let c = op_config(&t);
        assert_eq!(c["include"], json!(["Functional.linear.2"]));
        assert_eq!(c["level"], "api");
        assert_eq!(c["mode"], "tensor");
        assert_eq!(c["steps"], json!([2]));
        assert_eq!(c["ranks"], json!([1]));
        assert_eq!(
            c["$msprobe"]["tensor"]["list"],
            json!(["Functional.linear.2.forward"])
        );
        let m = OpTarget {
            ops: vec!["Module.fc.Linear.forward.0".into()],
            ..t
        };
        assert_eq!(op_config(&m)["level"], "mix");
    }
}
