//! The secret-redaction rules against the corpus shared with the Python implementation
//! (testdata/secrets/corpus.json; python/tests/test_secrets_corpus.py reads the same file).

use probe::config_check::pack::sha256_hex;
use probe::config_check::secrets::{
    is_secret_name, redact_argv, redact_named, redact_tree, RedactMode,
};
use serde_json::Value;

fn corpus() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/secrets/corpus.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// «X» → the marker of X, computed here independently of the module under test.
fn expand_str(s: &str, mode: RedactMode) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(a) = rest.find('«') {
        let b = rest[a..].find('»').map(|b| a + b).expect("unclosed «");
        out.push_str(&rest[..a]);
        let secret = &rest[a + '«'.len_utf8()..b];
        match mode {
            RedactMode::Drop => out.push_str("<redacted>"),
            RedactMode::Hash => out.push_str(&format!(
                "<redacted:sha256:{}>",
                &sha256_hex(secret.as_bytes())[..8]
            )),
        }
        rest = &rest[b + '»'.len_utf8()..];
    }
    out.push_str(rest);
    out
}

fn expand(v: &Value, mode: RedactMode) -> Value {
    match v {
        Value::String(s) => Value::String(expand_str(s, mode)),
        Value::Array(a) => Value::Array(a.iter().map(|x| expand(x, mode)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), expand(x, mode)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

const MODES: [RedactMode; 2] = [RedactMode::Hash, RedactMode::Drop];

#[test]
fn names() {
    let c = corpus();
    for n in strs(&c["names"]["secret"]) {
        assert!(is_secret_name(&n), "{n} should be secret");
    }
    for n in strs(&c["names"]["plain"]) {
        assert!(!is_secret_name(&n), "{n} should be plain");
    }
}

#[test]
fn env_values() {
    let c = corpus();
    let cases = c["env"].as_array().unwrap();
    assert!(cases.len() > 40);
    for mode in MODES {
        for case in cases {
            let (name, value) = (
                case["name"].as_str().unwrap(),
                case["value"].as_str().unwrap(),
            );
            let want = expand_str(case["expect"].as_str().unwrap(), mode);
            let got = redact_named(name, value, mode);
            assert_eq!(got, want, "{name}={value} ({mode:?})");
            assert_eq!(redact_named(name, &got, mode), got, "idempotent: {name}");
        }
    }
}

#[test]
fn argv() {
    let c = corpus();
    for mode in MODES {
        for case in c["argv"].as_array().unwrap() {
            let argv = strs(&case["argv"]);
            let want = strs(&expand(&case["expect"], mode));
            let got = redact_argv(&argv, mode);
            assert_eq!(got, want, "{argv:?} ({mode:?})");
            assert_eq!(redact_argv(&got, mode), got);
        }
    }
}

#[test]
fn trees() {
    let c = corpus();
    for mode in MODES {
        for case in c["tree"].as_array().unwrap() {
            let path = case["path"].as_str().unwrap();
            let mut got = case["value"].clone();
            redact_tree(&mut got, path, mode);
            assert_eq!(got, expand(&case["expect"], mode), "{path} ({mode:?})");
            let again = got.clone();
            redact_tree(&mut got, path, mode);
            assert_eq!(got, again);
        }
    }
}
