//! An op call's non-tensor arguments: probe's `args` (`{"input.1": 1.0, "input.eps":
//! 1e-05}`) and the typed non-tensor leaves of msprobe's `input_args` / `input_kwargs`
//! (`{"type": "float", "value": 1e-05}`), read into one form: canonical JSON text of an
//! object whose keys are the argument slots, sorted.
//!
//! Why compare them: an op whose tensors agree and whose output differs is named as the
//! first divergent op, but when it was *called* differently (a layer norm's `eps`, a
//! clipping threshold, a softmax scale, a cast's dtype) the cause is the call, set by code
//! the dump does not capture, not the kernel. Only slots recorded on both sides are
//! compared: a slot given by keyword in one run and by position in the other, or left to
//! its default, says nothing. Where an op is named as the first divergent op, a slot one
//! run passed and the other left out ([`diff_at_divergence`]) is said too: a port that adds
//! `approximate="tanh"` to a GELU shows only so. Devices are not compared (`cuda:0` against
//! `npu:0` is the migration itself).

pub use crate::schema::compare::ArgDiff;
use serde_json::{Map, Value};

/// The canonical text of recorded arguments, or None when there are none.
pub(crate) fn canonical(args: &Map<String, Value>) -> Option<String> {
    if args.is_empty() {
        return None;
    }
    // serde_json's map is ordered by key: the text is canonical.
    serde_json::to_string(args).ok()
}

/// Relative difference under which two numbers are the same argument: a Python number
/// computed from a tensor read (`.item()`) carries its rounding, as tensors do.
const SAME_NUMBER: f64 = 1e-6;

/// Whether a string names a device (`cpu`, `cuda:0`, `npu:3`).
fn is_device(s: &str) -> bool {
    let (kind, index) = s.split_once(':').unwrap_or((s, "0"));
    matches!(
        kind,
        "cpu" | "cuda" | "npu" | "xpu" | "mps" | "meta" | "hpu" | "xla" | "mtia" | "privateuseone"
    ) && !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
}

/// Whether two recorded values are the same argument.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= SAME_NUMBER * x.abs().max(y.abs()),
            _ => x == y,
        },
        (Value::String(x), Value::String(y)) => x == y || (is_device(x) && is_device(y)),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        _ => a == b,
    }
}

/// A value as a person reads it: JSON, with floats in Rust's shortest form (`1e-5`, not
/// `0.00001`).
fn show(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => n
            .as_f64()
            .map_or_else(|| n.to_string(), |x| format!("{x:?}")),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// The arguments recorded on both sides whose values differ, by slot. Either text that is
/// not a JSON object compares as no arguments (what a reader stored is always one).
pub(crate) fn diff(bench: &str, cmp: &str) -> Vec<ArgDiff> {
    let parse = |s: &str| match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let (b, c) = (parse(bench), parse(cmp));
    b.iter()
        .filter_map(|(name, bv)| {
            let cv = c.get(name)?;
            (!same(bv, cv)).then(|| ArgDiff {
                name: name.clone(),
                bench: show(bv),
                cmp: show(cv),
            })
        })
        .collect()
}

/// What a side that left an argument out shows for it.
pub(crate) const NOT_PASSED: &str = "(not passed)";

/// [`diff`], and the slots only one side recorded whose value none of the other side's
/// own slots holds: an argument one run passed and the other left to its default (the
/// same argument by position in one run and by keyword in the other holds the same value,
/// and is not listed). For an op named as where the runs part: there an argument the port
/// added is a likely cause; elsewhere an explicit default would only be noise.
/// `None`: the side recorded no arguments.
pub(crate) fn diff_at_divergence(bench: Option<&str>, cmp: Option<&str>) -> Vec<ArgDiff> {
    let parse = |s: Option<&str>| match s.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    };
    let (b, c) = (parse(bench), parse(cmp));
    let mut out = match (bench, cmp) {
        (Some(x), Some(y)) => diff(x, y),
        _ => Vec::new(),
    };
    let own = |m: &Map<String, Value>, other: &Map<String, Value>| -> Vec<(String, Value)> {
        m.iter()
            .filter(|(k, _)| !other.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (only_b, only_c) = (own(&b, &c), own(&c, &b));
    // (A device given on one side only is the migration too.)
    let unmatched = |v: &Value, other: &[(String, Value)]| {
        !matches!(v, Value::String(d) if is_device(d)) && !other.iter().any(|(_, w)| same(v, w))
    };
    for (name, v) in &only_b {
        if unmatched(v, &only_c) {
            out.push(ArgDiff {
                name: name.clone(),
                bench: show(v),
                cmp: NOT_PASSED.into(),
            });
        }
    }
    for (name, v) in &only_c {
        if unmatched(v, &only_b) {
            out.push(ArgDiff {
                name: name.clone(),
                bench: NOT_PASSED.into(),
                cmp: show(v),
            });
        }
    }
    out.sort_by(|x, y| x.name.cmp(&y.name));
    out
}

/// How a recorded argument turns a random op's draw off.
#[derive(Debug, Clone, Copy)]
enum Off {
    /// A probability of zero (`dropout_p`, `p`).
    Zero,
    /// A keep probability of one (`keep_prob`).
    One,
    /// A training flag that is false (`training`, `train`).
    False,
}

/// The slots of API `api` (`Type.api`, an overload after it ignored) that turn its random
/// draw off, as recorded by keyword (`input.dropout_p`) or by position (`input.4`, from the
/// API's signature), and the value that turns it off. Empty for APIs not listed here, whose
/// draw is then never taken as off.
fn draw_switches(api: &str) -> &'static [(&'static str, Off)] {
    use Off::*;
    let mut parts = api.split('.');
    let (ty, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match (ty, name) {
        // F.dropout(input, p, training, inplace) and kin; torch.dropout(input, p, train),
        // aten::dropout / native_dropout(input, p, train).
        (
            "Functional" | "Torch" | "Aten",
            "dropout"
            | "dropout_"
            | "dropout1d"
            | "dropout2d"
            | "dropout3d"
            | "alpha_dropout"
            | "alpha_dropout_"
            | "feature_dropout"
            | "feature_dropout_"
            | "feature_alpha_dropout"
            | "feature_alpha_dropout_"
            | "native_dropout",
        ) => &[
            ("input.p", Zero),
            ("input.1", Zero),
            ("input.training", False),
            ("input.train", False),
            ("input.2", False),
        ],
        // F.rrelu(input, lower, upper, training, inplace): out of training, a fixed slope.
        ("Functional" | "Torch", "rrelu" | "rrelu_") => {
            &[("input.training", False), ("input.3", False)]
        }
        ("Functional", "scaled_dot_product_attention")
        | (
            "Torch" | "Aten",
            "_scaled_dot_product_attention_math"
            | "_scaled_dot_product_fused_attention_overrideable",
        ) => &[("input.dropout_p", Zero), ("input.4", Zero)],
        (
            "Torch" | "Aten",
            "_scaled_dot_product_flash_attention" | "_scaled_dot_product_flash_attention_for_cpu",
        ) => &[("input.dropout_p", Zero), ("input.3", Zero)],
        (
            "Torch" | "Aten",
            "_scaled_dot_product_efficient_attention" | "_scaled_dot_product_cudnn_attention",
        ) => &[("input.dropout_p", Zero), ("input.5", Zero)],
        ("Torch" | "Aten", n) if n.starts_with("_scaled_dot_product_") => {
            &[("input.dropout_p", Zero)]
        }
        // F.multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads,
        // in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
        // out_proj_weight, out_proj_bias, training, ...).
        ("Functional", "multi_head_attention_forward") => &[
            ("input.dropout_p", Zero),
            ("input.10", Zero),
            ("input.training", False),
            ("input.13", False),
        ],
        // torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, pse,
        // padding_mask, atten_mask, scale, keep_prob, ...).
        ("NPU", "npu_fusion_attention") => &[("input.keep_prob", One), ("input.9", One)],
        ("NPU", n)
            if n.starts_with("npu_fusion_attention") || n.starts_with("npu_flash_attention") =>
        {
            &[("input.keep_prob", One)]
        }
        _ => &[],
    }
}

/// Whether random op `api` (`Type.api`) was called with its random draw off, by what its
/// recorded arguments `args` (canonical text) say: `Some(slot = value)` citing the slot that
/// says so (`input.dropout_p = 0.0`, `input.training = false`, `input.keep_prob = 1.0`) when
/// off, `Some` of the recorded switches when on, None when no switch of the API is recorded
/// (or the API is not one [`draw_switches`] knows).
pub(crate) fn draw_switch(api: &str, args: &str) -> Option<(bool, String)> {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(args) else {
        return None;
    };
    let mut on = Vec::new();
    for &(slot, off) in draw_switches(api) {
        let Some(v) = m.get(slot) else { continue };
        let is_off = match (off, v) {
            (Off::Zero, Value::Number(n)) => n.as_f64() == Some(0.0),
            (Off::One, Value::Number(n)) => n.as_f64() == Some(1.0),
            (Off::False, Value::Bool(b)) => !b,
            _ => false,
        };
        let said = format!("{slot} = {}", show(v));
        if is_off {
            return Some((true, said));
        }
        on.push(said);
    }
    (!on.is_empty()).then(|| (false, on.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: Value) -> String {
        match v {
            Value::Object(m) => canonical(&m).unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn canonical_text_sorts_slots_and_is_none_when_empty() {
        assert_eq!(
            text(json!({"input.eps": 0.5, "input.1": 2})),
            r#"{"input.1":2,"input.eps":0.5}"#
        );
        assert_eq!(canonical(&Map::new()), None);
    }

    #[test]
    fn only_slots_on_both_sides_with_other_values_differ() {
        let b = text(json!({"input.1": 1.0, "input.2": true, "input.dim": -1, "input.p": 0.1}));
        let c = text(json!({"input.1": 0.05, "input.2": true, "input.eps": 1e-6, "input.p": 0.1}));
        let d = diff(&b, &c);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].brief(), "input.1 = 1.0 vs 0.05");
        let small = diff(
            &text(json!({"e": 1e-12, "s": [1e-5, 2]})),
            &text(json!({"e": 1e-6, "s": [1e-6, 2]})),
        );
        let shown: Vec<String> = small.iter().map(ArgDiff::brief).collect();
        assert_eq!(shown, ["e = 1e-12 vs 1e-6", "s = [1e-5, 2] vs [1e-6, 2]"]);
    }

    #[test]
    fn numbers_compare_by_value_within_rounding() {
        let d = |a: Value, b: Value| diff(&text(json!({"x": a})), &text(json!({"x": b}))).len();
        assert_eq!(d(json!(1), json!(1.0)), 0);
        assert_eq!(d(json!(0.1), json!(0.1 + 1e-9)), 0);
        assert_eq!(d(json!(1e-5), json!(1e-6)), 1);
        assert_eq!(d(json!(0), json!(1e-30)), 1);
        assert_eq!(d(json!([1, 2.0]), json!([1.0, 2])), 0);
        assert_eq!(d(json!([1, 2]), json!([1, 2, 3])), 1);
        assert_eq!(d(json!("torch.float32"), json!("torch.bfloat16")), 1);
        assert_eq!(d(json!(true), json!(1)), 1);
    }

    #[test]
    fn devices_are_the_migration_not_a_difference() {
        let d = |a: &str, b: &str| diff(&text(json!({"x": a})), &text(json!({"x": b}))).len();
        assert_eq!(d("cuda:0", "npu:0"), 0);
        assert_eq!(d("cuda", "npu:1"), 0);
        assert_eq!(d("cpu", "cuda:"), 1);
        assert_eq!(d("mean", "sum"), 1);
    }

    #[test]
    fn at_a_divergence_an_argument_one_run_left_out_is_said() {
        let t = |v: Value| text(v);
        let tanh = t(json!({"input.approximate": "tanh"}));
        let d = diff_at_divergence(None, Some(&tanh));
        let shown: Vec<String> = d.iter().map(ArgDiff::brief).collect();
        assert_eq!(shown, [r#"input.approximate = (not passed) vs "tanh""#]);
        // By position in one run, by keyword in the other: the same value, not listed.
        let pos = t(json!({"input.1": [16], "input.4": 1e-5}));
        let kw = t(json!({"input.1": [16], "input.eps": 1e-5}));
        assert!(diff_at_divergence(Some(&pos), Some(&kw)).is_empty());
        let other = t(json!({"input.1": [16], "input.eps": 1e-6}));
        let shown: Vec<String> = diff_at_divergence(Some(&pos), Some(&other))
            .iter()
            .map(ArgDiff::brief)
            .collect();
        assert_eq!(
            shown,
            [
                "input.4 = 1e-5 vs (not passed)",
                "input.eps = (not passed) vs 1e-6"
            ]
        );
        // Both sides' slots still compare as `diff` does; nothing recorded: nothing said.
        let b = t(json!({"input.dim": -1}));
        let c = t(json!({"input.dim": 1}));
        assert_eq!(diff_at_divergence(Some(&b), Some(&c)), diff(&b, &c));
        assert!(diff_at_divergence(None, None).is_empty());
        let npu = t(json!({"input.device": "npu:0"}));
        assert!(diff_at_divergence(None, Some(&npu)).is_empty());
    }

    #[test]
    fn text_that_is_not_an_object_has_no_arguments() {
        assert!(diff("[1]", r#"{"x":1}"#).is_empty());
        assert!(diff("not json", "").is_empty());
    }

    #[test]
    fn a_random_op_s_draw_is_off_by_the_argument_its_api_reads() {
        let sw = |api: &str, v: Value| draw_switch(api, &text(v));
        let sdpa = "Functional.scaled_dot_product_attention";
        assert_eq!(
            sw(
                sdpa,
                json!({"input.dropout_p": 0.0, "input.is_causal": true})
            ),
            Some((true, "input.dropout_p = 0.0".into()))
        );
        assert_eq!(
            sw(sdpa, json!({"input.4": 0})),
            Some((true, "input.4 = 0".into()))
        );
        assert_eq!(
            sw(sdpa, json!({"input.dropout_p": 0.1})),
            Some((false, "input.dropout_p = 0.1".into()))
        );
        // Not a switch of this API: says nothing.
        assert_eq!(
            sw(sdpa, json!({"input.p": 0.0, "input.is_causal": true})),
            None
        );
        // Dropout: p = 0 or out of training, either is enough.
        let d = "Functional.dropout";
        assert_eq!(
            sw(d, json!({"input.p": 0.5, "input.training": false})),
            Some((true, "input.training = false".into()))
        );
        assert_eq!(
            sw(d, json!({"input.1": 0.5, "input.2": true})),
            Some((false, "input.1 = 0.5, input.2 = true".into()))
        );
        assert_eq!(
            sw(
                "Aten.native_dropout.default",
                json!({"input.1": 0.0, "input.2": true})
            ),
            Some((true, "input.1 = 0.0".into()))
        );
        assert_eq!(
            sw(
                "Aten._scaled_dot_product_efficient_attention.default",
                json!({"input.4": false, "input.5": 0.0})
            ),
            Some((true, "input.5 = 0.0".into()))
        );
        assert_eq!(
            sw(
                "NPU.npu_fusion_attention",
                json!({"input.3": 8, "input.keep_prob": 1.0})
            ),
            Some((true, "input.keep_prob = 1.0".into()))
        );
        assert_eq!(
            sw("NPU.npu_fusion_attention", json!({"input.9": 0.9})),
            Some((false, "input.9 = 0.9".into()))
        );
        // An API without a switch, or not random at all.
        assert_eq!(sw("Torch.randn", json!({"input.0": 4})), None);
        assert_eq!(sw("Functional.normalize", json!({"input.p": 0.0})), None);
    }
}
