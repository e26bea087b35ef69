//! The op-key parser (`probe::op_key`) against the golden keys the capture agent builds
//! (`testdata/op_keys.json`; `python/tests/test_op_keys.py` checks that the agent's builder,
//! `python/probe/_op_key.py`, makes each one).
//!
//! Why: the key is what two dumps are paired by, built in Python and read back here into
//! its parts. A change of the grammar on one side only would show as ops that no longer
//! pair; one file of examples holds both sides to the same keys.

use probe::op_key::{module_path, Direction, OpKey, OpKind};
use serde_json::Value;

fn golden() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/op_keys.json");
    let text = std::fs::read_to_string(path).expect("testdata/op_keys.json");
    let doc: Value = serde_json::from_str(&text).expect("op_keys.json is JSON");
    doc["cases"].as_array().expect("a `cases` array").clone()
}

fn text(v: &Value) -> Option<&str> {
    v.as_str()
}

#[test]
fn every_golden_key_parses_into_its_parts() {
    let cases = golden();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in &cases {
        let raw = case["key"].as_str().expect("key");
        let want = &case["parsed"];
        let key = OpKey::parse(raw);
        let at = |what: &str| format!("{raw}: {what}");
        assert_eq!(key.as_str(), raw, "{}", at("text"));
        assert_eq!(key.kind().name(), want["kind"], "{}", at("kind"));
        assert_eq!(key.prefix(), want["prefix"], "{}", at("prefix"));
        assert_eq!(key.base(), want["base"], "{}", at("base"));
        assert_eq!(key.call(), want["call"].as_u64(), "{}", at("call"));
        assert_eq!(
            key.direction().name(),
            want["direction"],
            "{}",
            at("direction")
        );
        assert_eq!(
            key.forward_twin().as_deref(),
            text(&want["forward_twin"]),
            "{}",
            at("forward_twin")
        );
        if let Some(path) = want.get("module_path") {
            assert_eq!(module_path(raw), text(path), "{}", at("module_path"));
        }
        for (slot, name) in case["tensors"].as_object().expect("tensors") {
            let name = name.as_str().expect("a tensor name");
            assert_eq!(key.slot(name), Some(slot.as_str()), "{}", at(name));
        }
    }
}

#[test]
fn calls_renumber_and_pair_as_the_agent_numbers_them() {
    for case in golden() {
        let raw = case["key"].as_str().expect("key");
        let key = OpKey::parse(raw);
        match key.kind() {
            OpKind::ParametersGrad => {
                assert!(!key.has_call(), "{raw}");
                assert_eq!(key.direction(), Direction::Backward, "{raw}");
                assert_eq!(key.with_call(0), None, "{raw}");
            }
            OpKind::Api | OpKind::Module => {
                assert!(key.has_call(), "{raw}");
                // Renumbered to the same counter, the key is unchanged: the counter and the
                // direction sit where the parser found them.
                let call = key.call().expect("a call index");
                assert_eq!(key.with_call(call).as_deref(), Some(raw), "{raw}");
                if let Some(twin) = key.forward_twin() {
                    let fwd = OpKey::parse(&twin);
                    assert_eq!(fwd.direction(), Direction::Forward, "{raw}");
                    assert_eq!((fwd.base(), fwd.call()), (key.base(), key.call()), "{raw}");
                }
            }
        }
    }
}
