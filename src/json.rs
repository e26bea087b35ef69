//! JSON as Python writes it.
//!
//! Python's `json` module writes a non-finite float as a bare `NaN`, `Infinity` or
//! `-Infinity` token, which strict JSON parsers refuse. msprobe writes `dump.json` that way
//! (every HF transformer dump has `-Infinity` statistics: the causal attention mask), and
//! so can any tool writing config packs or op logs from Python. Every JSON document probe
//! reads goes through [`accept_nonfinite`] first, which turns those tokens into the strings
//! `"nan"`, `"inf"` and `"-inf"` (the encoding probe's own format uses): statistics readers
//! take them back as numbers, so non-finite values stay numbers end to end.

use std::borrow::Cow;

/// The bare tokens and their string spelling.
const TOKENS: [(&[u8], &[u8]); 3] = [
    (b"-Infinity", b"\"-inf\""),
    (b"Infinity", b"\"inf\""),
    (b"NaN", b"\"nan\""),
];

/// Finds the next bare token outside strings at or after `from`: (position, token index).
fn next_token(text: &[u8], from: usize, in_string: &mut bool) -> Option<(usize, usize)> {
    let mut i = from;
    while i < text.len() {
        let b = text[i];
        if *in_string {
            match b {
                b'\\' => i += 1,
                b'"' => *in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            *in_string = true;
        } else if matches!(b, b'N' | b'I' | b'-') {
            let rest = &text[i..];
            if let Some(k) = TOKENS.iter().position(|(t, _)| rest.starts_with(t)) {
                return Some((i, k));
            }
        }
        i += 1;
    }
    None
}

/// `text` with bare `NaN`, `Infinity` and `-Infinity` tokens (outside strings) written as
/// the strings `"nan"`, `"inf"`, `"-inf"`. Borrowed, without a copy, when there are none.
pub fn accept_nonfinite(text: &[u8]) -> Cow<'_, [u8]> {
    // Most documents hold neither token: a substring search (fast) settles those.
    let maybe = match std::str::from_utf8(text) {
        Ok(s) => s.contains("NaN") || s.contains("Infinity"),
        Err(_) => true,
    };
    if !maybe {
        return Cow::Borrowed(text);
    }
    let mut in_string = false;
    let Some(mut at) = next_token(text, 0, &mut in_string) else {
        return Cow::Borrowed(text);
    };
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut copied = 0;
    loop {
        let (i, k) = at;
        let (token, replacement) = TOKENS[k];
        out.extend_from_slice(&text[copied..i]);
        out.extend_from_slice(replacement);
        copied = i + token.len();
        match next_token(text, copied, &mut in_string) {
            Some(next) => at = next,
            None => break,
        }
    }
    out.extend_from_slice(&text[copied..]);
    Cow::Owned(out)
}

/// [`accept_nonfinite`] for text.
pub(crate) fn accept_nonfinite_str(text: &str) -> Cow<'_, str> {
    match accept_nonfinite(text.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        // Only ASCII was replaced by ASCII at token boundaries: still UTF-8.
        Cow::Owned(v) => Cow::Owned(
            String::from_utf8(v)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(s: &str) -> String {
        accept_nonfinite_str(s).into_owned()
    }

    #[test]
    fn bare_tokens_become_strings() {
        assert_eq!(
            fix(r#"{"Max": NaN, "Min": -Infinity, "Norm": Infinity, "x": [NaN,-Infinity]}"#),
            r#"{"Max": "nan", "Min": "-inf", "Norm": "inf", "x": ["nan","-inf"]}"#
        );
    }

    #[test]
    fn strings_and_numbers_are_untouched() {
        for s in [
            r#"{"NaN": "Infinity", "k": "say \"NaN\" -Infinity", "n": -1.5e-3}"#,
            r#"["\\", NaN]"#,
        ] {
            let out = fix(s);
            let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
            if s.starts_with('{') {
                assert_eq!(out, s, "nothing to replace");
                assert_eq!(v["NaN"], "Infinity");
            } else {
                assert_eq!(v[1], "nan");
            }
        }
        assert!(matches!(accept_nonfinite(b"{\"a\": 1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_result_parses_where_the_input_did_not() {
        let s = r#"{"data": {"op": {"output": [{"Max": NaN, "Min": -Infinity}]}}}"#;
        assert!(serde_json::from_str::<serde_json::Value>(s).is_err());
        let v: serde_json::Value = serde_json::from_str(&fix(s)).unwrap();
        assert_eq!(v["data"]["op"]["output"][0]["Min"], "-inf");
    }
}
