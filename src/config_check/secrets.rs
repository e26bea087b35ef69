//! Secrets never leave the machine: redaction of environment values, `sys.argv` and user
//! arguments, by name and by value.
//!
//! The rules are written once in docs/config-check.md ("Secrets") and implemented twice,
//! here and in `python/probe/config_pack/redaction.py`; both are tested against
//! `testdata/secrets/corpus.json`. Change the two together.
//!
//! A redacted value becomes `<redacted:sha256:XXXXXXXX>` (the first 8 hex digits of the
//! sha256 of the secret's UTF-8 bytes), so the same secret on both sides still compares
//! equal, or `<redacted>` in `RedactMode::Drop`, which keeps nothing of the value.
//! Every function is idempotent: markers are left as they are.

use serde_json::Value;
use std::collections::BTreeMap;
use std::str::FromStr;

/// What replaces a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedactMode {
    /// `<redacted:sha256:XXXXXXXX>`: equal secrets stay equal across packs.
    #[default]
    Hash,
    /// `<redacted>`: nothing of the value is kept.
    Drop,
}

impl FromStr for RedactMode {
    type Err = String;
    fn from_str(s: &str) -> Result<RedactMode, String> {
        match s {
            "hash" => Ok(RedactMode::Hash),
            "drop" => Ok(RedactMode::Drop),
            _ => Err(format!("{s:?}: expected hash or drop")),
        }
    }
}

/// Name parts that mark a value as secret, matched whole (`GITHUB_PAT`, not `PATH`).
pub(crate) const NAME_PARTS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "PASSPHRASE",
    "PAT",
    "KEY",
    "APIKEY",
    "WEBHOOK",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "AUTHORIZATION",
    "BEARER",
    "COOKIE",
    "COOKIES",
    "SESSION",
    "SIG",
    "SIGNATURE",
    "DSN",
];

/// Endings of a name part that mark it as secret (`HFTOKEN`, `DBPASSWORD`).
pub(crate) const NAME_SUFFIXES: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "APIKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "PRIVATEKEY",
    "WEBHOOK",
    "CREDENTIAL",
    "CREDENTIALS",
    "COOKIE",
];

/// A marking part followed by one of these names something about a secret, not the
/// secret (`PAD_TOKEN_ID`, `XDG_SESSION_TYPE`, `HF_TOKEN_PATH`, `SSH_AUTH_SOCK`).
pub(crate) const NEXT_EXCEPTIONS: &[&str] = &[
    "ID", "IDS", "TYPE", "TYPES", "LEN", "LENGTH", "SIZE", "COUNT", "PATH", "FILE", "DIR", "NAME",
    "SOCK",
];

/// A marking part preceded by one of these is a tokenizer's special token or a count
/// (`EOS_TOKEN`, `MAX_TOKEN`).
pub(crate) const PREV_EXCEPTIONS: &[&str] = &[
    "PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "MAX", "NUM",
];

/// Values that are never secrets, whatever the name (compared case-insensitively).
pub(crate) const PLAIN_VALUES: &[&str] = &[
    "", "true", "false", "none", "null", "yes", "no", "on", "off",
];

/// Well-known token prefixes; a word starting with one is a secret when at least
/// [`PREFIX_MIN_TAIL`] characters of `[A-Za-z0-9_-]` follow the prefix and they hold a
/// digit or both an upper and a lower case letter.
pub(crate) const TOKEN_PREFIXES: &[&str] = &[
    "github_pat_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxr-",
    "xoxs-",
    "xapp-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "sk-",
    "hf_",
    "api_org_",
    "AKIA",
    "AIza",
    "ya29.",
    "eyJ",
    "npm_",
    "pypi-",
];
/// See [`TOKEN_PREFIXES`].
pub(crate) const PREFIX_MIN_TAIL: usize = 16;

/// The high-entropy rule: a run of `[A-Za-z0-9+_-]` at least this long, holding an upper
/// case letter, a lower case letter and a digit, whose Shannon entropy per character is at
/// least [`ENTROPY_MIN_BITS`]. Lower-case hex digests never match.
pub(crate) const ENTROPY_MIN_LEN: usize = 32;
/// See [`ENTROPY_MIN_LEN`].
pub(crate) const ENTROPY_MIN_BITS: f64 = 4.0;

/// Userinfo without a password (`https://TOKEN@host`) is redacted from this length on.
pub(crate) const USERINFO_MIN_LEN: usize = 16;

/// Hosts whose URLs are secrets themselves (everything after `host/` is redacted).
pub(crate) const WEBHOOK_HOSTS: &[&str] = &["hooks.slack.com"];
/// Hosts whose `/api/webhooks/...` URLs are secrets.
pub(crate) const DISCORD_HOSTS: &[&str] = &["discord.com", "discordapp.com"];

const HASH_PREFIX: &str = "<redacted:sha256:";
const DROPPED: &str = "<redacted>";

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'-')
}
fn is_entropy_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'_' | b'-')
}
fn is_tail_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-')
}
fn is_scheme_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'.' | b'-')
}
fn is_url_end(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n' | b'"' | b'\'' | b',' | b';')
}
fn is_authority_end(c: u8) -> bool {
    matches!(c, b'/' | b'?' | b'#') || is_url_end(c)
}

/// What replaces `secret`: `<redacted:sha256:XXXXXXXX>`, or `<redacted>` in drop mode.
pub(crate) fn marker(secret: &str, mode: RedactMode) -> String {
    match mode {
        RedactMode::Drop => DROPPED.to_string(),
        RedactMode::Hash => {
            let hex = super::pack::sha256_hex(secret.as_bytes());
            format!("{HASH_PREFIX}{}>", &hex[..8])
        }
    }
}

/// Whether `value` is already a redaction marker.
pub(crate) fn is_marker(value: &str) -> bool {
    if value == DROPPED {
        return true;
    }
    match value
        .strip_prefix(HASH_PREFIX)
        .and_then(|r| r.strip_suffix('>'))
    {
        Some(h) => h.len() == 8 && h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
        None => false,
    }
}

/// `hfToken-v2.X` → `["HF", "TOKEN", "V2", "X"]`: runs of ASCII letters and digits, split
/// again at camelCase boundaries, upper-cased.
pub(crate) fn name_parts(name: &str) -> Vec<String> {
    let mut parts = vec![];
    for run in name.split(|c: char| !c.is_ascii_alphanumeric()) {
        let b = run.as_bytes();
        if b.is_empty() {
            continue;
        }
        let mut start = 0;
        for i in 1..b.len() {
            let (c, p) = (b[i], b[i - 1]);
            let next_lower = b.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if c.is_ascii_uppercase()
                && (p.is_ascii_lowercase()
                    || p.is_ascii_digit()
                    || (p.is_ascii_uppercase() && next_lower))
            {
                parts.push(run[start..i].to_ascii_uppercase());
                start = i;
            }
        }
        parts.push(run[start..].to_ascii_uppercase());
    }
    parts
}

/// Whether a value stored under `name` must not leave the machine (see the module).
pub fn is_secret_name(name: &str) -> bool {
    let parts = name_parts(name);
    parts.iter().enumerate().any(|(i, p)| {
        let marks =
            NAME_PARTS.contains(&p.as_str()) || NAME_SUFFIXES.iter().any(|s| p.ends_with(s));
        let next_ok = parts
            .get(i + 1)
            .is_some_and(|n| NEXT_EXCEPTIONS.contains(&n.as_str()));
        let prev_ok = i > 0 && PREV_EXCEPTIONS.contains(&parts[i - 1].as_str());
        marks && !next_ok && !prev_ok
    })
}

fn plain(value: &str) -> bool {
    value.chars().count() <= 1 || PLAIN_VALUES.contains(&value.to_lowercase().as_str())
}

fn entropy(s: &str) -> f64 {
    let mut counts: BTreeMap<char, usize> = BTreeMap::new();
    for c in s.chars() {
        *counts.entry(c).or_default() += 1;
    }
    let n = s.chars().count() as f64;
    let mut h = 0.0;
    for &k in counts.values() {
        let p = k as f64 / n;
        h -= p * p.log2();
    }
    h
}

fn digit_or_mixed_case(s: &str) -> bool {
    s.bytes().any(|c| c.is_ascii_digit())
        || (s.bytes().any(|c| c.is_ascii_uppercase()) && s.bytes().any(|c| c.is_ascii_lowercase()))
}

fn prefixed(word: &str) -> bool {
    TOKEN_PREFIXES.iter().any(|p| {
        word.strip_prefix(p).is_some_and(|tail| {
            let n = tail.bytes().take_while(|&c| is_tail_char(c)).count();
            n >= PREFIX_MIN_TAIL && digit_or_mixed_case(&tail[..n])
        })
    })
}

fn high_entropy(run: &str) -> bool {
    run.len() >= ENTROPY_MIN_LEN
        && run.bytes().any(|c| c.is_ascii_uppercase())
        && run.bytes().any(|c| c.is_ascii_lowercase())
        && run.bytes().any(|c| c.is_ascii_digit())
        && entropy(run) >= ENTROPY_MIN_BITS
}

/// Byte spans of the maximal runs of ASCII characters accepted by `f`.
fn runs(s: &str, f: fn(u8) -> bool) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        if f(b[i]) {
            let j = i + b[i..].iter().take_while(|&&c| f(c)).count();
            out.push((i, j));
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Secret-shaped words: token prefixes (over word runs) and high entropy (over runs without
/// dots). Runs never cross a marker's `<`, `:` or `>`.
fn redact_words(s: &str, mode: RedactMode) -> String {
    let mut spans: Vec<(usize, usize)> = runs(s, is_word)
        .into_iter()
        .filter(|&(a, b)| prefixed(&s[a..b]))
        .collect();
    for (a, b) in runs(s, is_entropy_char) {
        if high_entropy(&s[a..b]) && !spans.iter().any(|&(x, y)| x < b && a < y) {
            spans.push((a, b));
        }
    }
    if spans.is_empty() {
        return s.to_string();
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (a, b) in spans {
        out.push_str(&s[last..a]);
        out.push_str(&marker(&s[a..b], mode));
        last = b;
    }
    out.push_str(&s[last..]);
    out
}

/// `?a=1&token=X#f` → the values of secret-named parameters redacted.
fn redact_query(rest: &str, mode: RedactMode) -> String {
    let Some(q) = rest.find('?') else {
        return rest.to_string();
    };
    let end = rest[q..].find('#').map_or(rest.len(), |h| q + h);
    let params: Vec<String> = rest[q + 1..end]
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !v.is_empty() && !is_marker(v) && is_secret_name(k) => {
                format!("{k}={}", marker(v, mode))
            }
            _ => kv.to_string(),
        })
        .collect();
    format!("{}{}{}", &rest[..=q], params.join("&"), &rest[end..])
}

/// One URL (`scheme://` up to white space, a quote, `,` or `;`): credentials in the
/// userinfo, webhook paths, secret-named query parameters.
fn redact_url(url: &str, mode: RedactMode) -> String {
    let start = url.find("://").map_or(0, |k| k + 3);
    let a_end = start
        + url.as_bytes()[start..]
            .iter()
            .take_while(|&&c| !is_authority_end(c))
            .count();
    let (mut authority, mut rest) = (url[start..a_end].to_string(), url[a_end..].to_string());
    let (userinfo, host) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), authority[at + 1..].to_string()),
        None => (None, authority.clone()),
    };
    if let Some(userinfo) = userinfo {
        let new_info = if is_marker(userinfo) {
            userinfo.to_string()
        } else if let Some((user, pw)) = userinfo.split_once(':') {
            if !pw.is_empty() && !is_marker(pw) {
                format!("{user}:{}", marker(pw, mode))
            } else {
                userinfo.to_string()
            }
        } else if userinfo.chars().count() >= USERINFO_MIN_LEN || prefixed(userinfo) {
            marker(userinfo, mode)
        } else {
            userinfo.to_string()
        };
        authority = format!("{new_info}@{host}");
    }
    let hostname = host.split(':').next().unwrap_or("").to_ascii_lowercase();
    let path = rest.strip_prefix('/').unwrap_or("").to_string();
    if WEBHOOK_HOSTS.contains(&hostname.as_str()) && !path.is_empty() && !is_marker(&path) {
        rest = format!("/{}", marker(&path, mode));
    } else if DISCORD_HOSTS.contains(&hostname.as_str()) && path.starts_with("api/webhooks/") {
        let hook = &path["api/webhooks/".len()..];
        if !hook.is_empty() && !is_marker(hook) {
            rest = format!("/api/webhooks/{}", marker(hook, mode));
        }
    } else {
        rest = redact_query(&rest, mode);
    }
    format!("{}{authority}{rest}", &url[..start])
}

fn redact_urls(s: &str, mode: RedactMode) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while let Some(k) = s[i..].find("://").map(|x| i + x) {
        let mut a = k;
        while a > i && is_scheme_char(b[a - 1]) {
            a -= 1;
        }
        while a < k && !b[a].is_ascii_alphabetic() {
            a += 1; // a scheme starts with a letter
        }
        let e = k + 3 + b[k + 3..].iter().take_while(|&&c| !is_url_end(c)).count();
        if a == k {
            out.push_str(&s[i..e]);
        } else {
            out.push_str(&s[i..a]);
            out.push_str(&redact_url(&s[a..e], mode));
        }
        i = e;
    }
    out.push_str(&s[i..]);
    out
}

/// Whether a PEM label (`RSA PRIVATE KEY`, `OPENSSH PRIVATE KEY`, `ENCRYPTED PRIVATE KEY`,
/// `PGP PRIVATE KEY BLOCK`) names a secret; certificates and public keys are not.
fn secret_pem_label(label: &str) -> bool {
    let l = label.to_ascii_uppercase();
    ["PRIVATE", "SECRET", "ENCRYPTED"]
        .iter()
        .any(|w| l.contains(w))
}

/// Private-key blocks, each redacted whole: from `-----BEGIN … PRIVATE KEY-----` through
/// its `-----END …-----` line (to the value's end when cut short), whether the lines are
/// real newlines or written `\n`. A certificate beside the key stays.
fn redact_pem(value: &str, mode: RedactMode) -> String {
    const BEGIN: &str = "-----BEGIN ";
    const DASHES: &str = "-----";
    let mut out = String::new();
    let mut rest = value;
    while let Some(a) = rest.find(BEGIN) {
        let after = &rest[a + BEGIN.len()..];
        let Some(l) = after.find(DASHES) else {
            break;
        };
        let head = a + BEGIN.len() + l + DASHES.len();
        if !secret_pem_label(&after[..l]) {
            out.push_str(&rest[..head]);
            rest = &rest[head..];
            continue;
        }
        let end = rest[head..]
            .find("-----END ")
            .and_then(|e| {
                let tail = head + e + "-----END ".len();
                rest[tail..].find(DASHES).map(|d| tail + d + DASHES.len())
            })
            .unwrap_or(rest.len());
        out.push_str(&rest[..a]);
        out.push_str(&marker(&rest[a..end], mode));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The value rules alone (whatever the name): private-key blocks whole, credentials and
/// secret query parameters in URLs, webhook URLs, token-shaped words, high-entropy words.
pub(crate) fn redact_value(value: &str, mode: RedactMode) -> String {
    if is_marker(value) {
        return value.to_string();
    }
    redact_words(&redact_urls(&redact_pem(value, mode), mode), mode)
}

/// A value stored under `name` (an environment variable, an `args` path): all of it when
/// the name is secret, else the value rules.
pub fn redact_named(name: &str, value: &str, mode: RedactMode) -> String {
    if is_marker(value) {
        value.to_string()
    } else if is_secret_name(name) && !plain(value) {
        marker(value, mode)
    } else {
        redact_value(value, mode)
    }
}

/// `--api-key` / `-password` → the name; None for `-p`, `-` and non-flags.
fn flag_name(arg: &str) -> Option<&str> {
    let name = arg.trim_start_matches('-');
    (arg.starts_with('-') && name.len() > 1 && name.as_bytes()[0].is_ascii_alphabetic())
        .then_some(name)
}

/// Short flags that carry a password in common tools (`mysql -p`, `sshpass -p`, `-P` of
/// others): their value, next (`-p VALUE`) or attached (`-pVALUE`, mysql's form), is
/// redacted unless it is a number (`-p 8080`, `-p8080`: a port).
const SECRET_SHORT_FLAGS: [&str; 2] = ["-p", "-P"];

/// Flags whose value is `user:password` (curl's `-u`/`--user`, `-U`/`--proxy-user`): the
/// part after the user is redacted, next (`-u u:pw`), attached (`-uu:pw`) or after `=`.
const USER_FLAGS: [&str; 4] = ["-u", "-U", "--user", "--proxy-user"];

/// What the previous argument says of this one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    Nothing,
    /// After `--secret-name`: the value, unless it starts with `--`.
    Named,
    /// After `-p`/`-P`: the value, unless a flag or a number.
    Short,
    /// After `-u`/`--user`: `user:password`.
    User,
}

fn number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// A whole value replaced, unless plain (`true`, one character) or already a marker.
fn whole(value: &str, mode: RedactMode) -> String {
    if is_marker(value) || plain(value) {
        value.to_string()
    } else {
        marker(value, mode)
    }
}

/// `user:password` → the user (value rules) and the password's marker. The user may be a
/// marker already (a token redacted before): the password starts after it, so redacting
/// again changes nothing. Without a password, the value rules alone.
fn user_password(value: &str, mode: RedactMode) -> String {
    let user_end = value
        .strip_prefix('<')
        .and_then(|_| value.find('>'))
        .filter(|&gt| is_marker(&value[..=gt]))
        .map_or(0, |gt| gt + 1);
    match value[user_end..].find(':').map(|c| user_end + c) {
        Some(c) if c + 1 < value.len() => format!(
            "{}:{}",
            redact_value(&value[..c], mode),
            whole(&value[c + 1..], mode)
        ),
        _ => redact_value(value, mode),
    }
}

/// `-pVALUE` / `-uUSER:PW` (a value attached to a password or user flag) redacted; None
/// for other arguments, and for `-password`-like flags (a secret name: the next argument is
/// their value).
fn attached(arg: &str, mode: RedactMode) -> Option<String> {
    if arg.starts_with("--") || flag_name(arg).is_some_and(is_secret_name) {
        return None;
    }
    let (flag, rest) = (arg.get(..2)?, arg.get(2..)?);
    if rest.is_empty() {
        return None;
    }
    let value = rest.strip_prefix('=').unwrap_or(rest);
    let head = &arg[..arg.len() - value.len()];
    if SECRET_SHORT_FLAGS.contains(&flag) {
        Some(if number(value) {
            arg.to_string()
        } else {
            format!("{head}{}", whole(value, mode))
        })
    } else if USER_FLAGS.contains(&flag) {
        Some(format!("{head}{}", user_password(value, mode)))
    } else {
        None
    }
}

/// `sys.argv`: the value of `--secret-name VALUE` (unless it starts with `--`),
/// `--secret-name=VALUE` and `secret.name=VALUE` (Hydra-style overrides), of `-p VALUE`,
/// `-pVALUE`, `-P VALUE` unless a number, the password of `-u user:password` (and its
/// attached and `--user=` forms), then the value rules on every argument.
pub fn redact_argv(argv: &[String], mode: RedactMode) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut pending = Pending::Nothing;
    for arg in argv {
        let value = match std::mem::replace(&mut pending, Pending::Nothing) {
            Pending::Named if !arg.starts_with("--") => Some(whole(arg, mode)),
            Pending::Short if !arg.starts_with('-') && !number(arg) => Some(whole(arg, mode)),
            Pending::User if !arg.starts_with('-') => Some(user_password(arg, mode)),
            _ => None,
        };
        if let Some(v) = value.or_else(|| attached(arg, mode)) {
            out.push(v);
            continue;
        }
        if let Some((key, v)) = arg.split_once('=') {
            let bare = key.trim_start_matches(['-', '+', '~']);
            if !bare.is_empty() && is_secret_name(bare) && !plain(v) && !is_marker(v) {
                out.push(format!("{key}={}", marker(v, mode)));
                continue;
            }
            if USER_FLAGS.contains(&key) {
                out.push(format!("{key}={}", user_password(v, mode)));
                continue;
            }
        } else if flag_name(arg).is_some_and(is_secret_name) {
            pending = Pending::Named;
        } else if SECRET_SHORT_FLAGS.contains(&arg.as_str()) {
            pending = Pending::Short;
        } else if USER_FLAGS.contains(&arg.as_str()) {
            pending = Pending::User;
        }
        out.push(redact_value(arg, mode));
    }
    out
}

/// A JSON tree (`args`, `extra`, msprobe's hyperparameters): every string or number leaf
/// by its dotted path (`args.db.password`, `args.urls.0`), booleans and nulls kept.
pub fn redact_tree(value: &mut Value, path: &str, mode: RedactMode) {
    match value {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                redact_tree(v, &format!("{path}.{k}"), mode);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                redact_tree(v, &format!("{path}.{i}"), mode);
            }
        }
        Value::Number(n) => {
            let text = n.to_string();
            if is_secret_name(path) && !plain(&text) {
                *value = Value::String(marker(&text, mode));
            }
        }
        Value::String(s) => {
            let r = redact_named(path, s, mode);
            if r != *s {
                *s = r;
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_format() {
        assert_eq!(
            marker("hunter2", RedactMode::Hash),
            "<redacted:sha256:f52fbd32>"
        );
        assert_eq!(marker("hunter2", RedactMode::Drop), "<redacted>");
        assert!(is_marker("<redacted:sha256:f52fbd32>"));
        assert!(!is_marker("<redacted:sha256:f52fbd3>"));
        assert!(!is_marker("<redacted:sha256:F52FBD32>"));
    }

    #[test]
    fn parts() {
        assert_eq!(name_parts("hfToken-v2.X"), ["HF", "TOKEN", "V2", "X"]);
        assert_eq!(name_parts("HFToken"), ["HF", "TOKEN"]);
        assert_eq!(name_parts("__a__"), ["A"]);
    }

    #[test]
    fn non_ascii_is_safe() {
        // Multi-byte characters are separators and never split inside a run.
        let v = "päss://ü:pw@h/é ghp_FAKEfake0123456789FAKEfake0123456789é";
        let r = redact_value(v, RedactMode::Hash);
        assert!(!r.contains("FAKEfake"));
        assert!(r.ends_with('é'));
        assert!(is_secret_name("Ünïcode_TOKEN"));
    }
}
