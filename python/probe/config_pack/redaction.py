"""Secrets never leave the machine: redaction of environment values, ``sys.argv`` and
user arguments, by name and by value.

The rules are written once in docs/config-check.md ("Secrets") and implemented twice, here
and in ``src/config_check/secrets.rs`` (config-check applies them to every pack it reads);
both are tested against ``testdata/secrets/corpus.json``. Change the two together.

A redacted value becomes ``<redacted:sha256:XXXXXXXX>`` (the first 8 hex digits of the
sha256 of the secret's UTF-8 bytes), so the same secret on both sides still compares equal,
or ``<redacted>`` in ``drop`` mode, which keeps nothing of the value.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

#: Redaction modes: ``hash`` keeps a short digest (equality stays checkable), ``drop`` none.
MODES: tuple[str, ...] = ("hash", "drop")

#: Name parts that mark a value as secret, matched whole (``GITHUB_PAT``, not ``PATH``).
NAME_PARTS: frozenset[str] = frozenset(
    {
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
    }
)

#: Endings of a name part that mark it as secret (``HFTOKEN``, ``DBPASSWORD``).
NAME_SUFFIXES: tuple[str, ...] = (
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
)

#: A marking part followed by one of these names something about a secret, not the secret
#: (``PAD_TOKEN_ID``, ``XDG_SESSION_TYPE``, ``HF_TOKEN_PATH``, ``SSH_AUTH_SOCK``).
NEXT_EXCEPTIONS: frozenset[str] = frozenset(
    {
        "ID",
        "IDS",
        "TYPE",
        "TYPES",
        "LEN",
        "LENGTH",
        "SIZE",
        "COUNT",
        "PATH",
        "FILE",
        "DIR",
        "NAME",
        "SOCK",
    }
)

#: A marking part preceded by one of these is a tokenizer's special token or a count
#: (``EOS_TOKEN``, ``MAX_TOKEN``).
PREV_EXCEPTIONS: frozenset[str] = frozenset(
    {"PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "MAX", "NUM"}
)

#: Values that are never secrets, whatever the name (compared case-insensitively).
PLAIN_VALUES: frozenset[str] = frozenset(
    {"", "true", "false", "none", "null", "yes", "no", "on", "off"}
)

#: Well-known token prefixes; a word starting with one is a secret when at least
#: :data:`PREFIX_MIN_TAIL` characters of ``[A-Za-z0-9_-]`` follow the prefix and they hold a
#: digit or both an upper and a lower case letter.
TOKEN_PREFIXES: tuple[str, ...] = (
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
)
PREFIX_MIN_TAIL = 16

#: The high-entropy rule: a run of ``[A-Za-z0-9+_-]`` at least this long, holding an upper
#: case letter, a lower case letter and a digit, whose Shannon entropy per character is at
#: least :data:`ENTROPY_MIN_BITS`. Lower-case hex digests never match (no upper case letter,
#: and at most 4 bits per character).
ENTROPY_MIN_LEN = 32
ENTROPY_MIN_BITS = 4.0

#: Userinfo without a password (``https://TOKEN@host``) is redacted from this length on.
USERINFO_MIN_LEN = 16

#: Hosts whose URLs are secrets themselves (everything after ``host/`` is redacted);
#: discord only under ``/api/webhooks/``.
WEBHOOK_HOSTS: tuple[str, ...] = ("hooks.slack.com",)
DISCORD_HOSTS: tuple[str, ...] = ("discord.com", "discordapp.com")

_HASH_PREFIX = "<redacted:sha256:"
_DROPPED = "<redacted>"
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")
_ENTROPY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+_-")
_TAIL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCHEME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")
_URL_END = frozenset(" \t\r\n\"',;")
_AUTHORITY_END = frozenset("/?#") | _URL_END
_HEX = frozenset("0123456789abcdef")


def _is_upper(c: str) -> bool:
    return "A" <= c <= "Z"


def _is_lower(c: str) -> bool:
    return "a" <= c <= "z"


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def marker(secret: str, mode: str = "hash") -> str:
    """What replaces ``secret``: ``<redacted:sha256:XXXXXXXX>``, or ``<redacted>`` in drop mode."""
    if mode == "drop":
        return _DROPPED
    digest = hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{_HASH_PREFIX}{digest[:8]}>"


def is_marker(value: str) -> bool:
    """True when ``value`` is already a redaction marker (redacting it again keeps it)."""
    if value == _DROPPED:
        return True
    if not (value.startswith(_HASH_PREFIX) and value.endswith(">")):
        return False
    h = value[len(_HASH_PREFIX) : -1]
    return len(h) == 8 and all(c in _HEX for c in h)


def name_parts(name: str) -> list[str]:
    """``hfToken-v2.X`` → ``["HF", "TOKEN", "V2", "X"]``: runs of ASCII letters and digits,
    split again at camelCase boundaries, upper-cased."""
    parts: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if not run:
            return
        start = 0
        for i in range(1, len(run)):
            c, p = run[i], run[i - 1]
            nxt = run[i + 1] if i + 1 < len(run) else ""
            if _is_upper(c) and (
                _is_lower(p) or _is_digit(p) or (_is_upper(p) and nxt != "" and _is_lower(nxt))
            ):
                parts.append("".join(run[start:i]).upper())
                start = i
        parts.append("".join(run[start:]).upper())
        run.clear()

    for c in name:
        if _is_upper(c) or _is_lower(c) or _is_digit(c):
            run.append(c)
        else:
            flush()
    flush()
    return parts


def is_secret_name(name: str) -> bool:
    """True when a value stored under ``name`` must not leave the machine (see the module)."""
    parts = name_parts(name)
    for i, p in enumerate(parts):
        if not (p in NAME_PARTS or p.endswith(NAME_SUFFIXES)):
            continue
        if i + 1 < len(parts) and parts[i + 1] in NEXT_EXCEPTIONS:
            continue
        if i > 0 and parts[i - 1] in PREV_EXCEPTIONS:
            continue
        return True
    return False


def _plain(value: str) -> bool:
    return len(value) <= 1 or value.lower() in PLAIN_VALUES


def _entropy(s: str) -> float:
    counts: dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    n = len(s)
    h = 0.0
    for c in sorted(counts):
        p = counts[c] / n
        h -= p * math.log2(p)
    return h


def _has_digit_or_mixed_case(s: str) -> bool:
    return any(_is_digit(c) for c in s) or (
        any(_is_upper(c) for c in s) and any(_is_lower(c) for c in s)
    )


def _prefixed(word: str) -> bool:
    for p in TOKEN_PREFIXES:
        if word.startswith(p):
            tail = word[len(p) :]
            n = 0
            while n < len(tail) and tail[n] in _TAIL_CHARS:
                n += 1
            if n >= PREFIX_MIN_TAIL and _has_digit_or_mixed_case(tail[:n]):
                return True
    return False


def _high_entropy(run: str) -> bool:
    return (
        len(run) >= ENTROPY_MIN_LEN
        and any(_is_upper(c) for c in run)
        and any(_is_lower(c) for c in run)
        and any(_is_digit(c) for c in run)
        and _entropy(run) >= ENTROPY_MIN_BITS
    )


def _runs(s: str, chars: frozenset[str]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(s):
        if s[i] in chars:
            j = i
            while j < len(s) and s[j] in chars:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _redact_words(s: str, mode: str) -> str:
    """Secret-shaped words: token prefixes (over word runs) and high entropy (over runs
    without dots). Runs never cross a marker's ``<``, ``:`` or ``>``."""
    spans: list[tuple[int, int]] = [(a, b) for a, b in _runs(s, _WORD) if _prefixed(s[a:b])]
    for a, b in _runs(s, _ENTROPY_CHARS):
        if _high_entropy(s[a:b]) and not any(x < b and a < y for x, y in spans):
            spans.append((a, b))
    if not spans:
        return s
    spans.sort()
    out: list[str] = []
    last = 0
    for a, b in spans:
        out.append(s[last:a])
        out.append(marker(s[a:b], mode))
        last = b
    out.append(s[last:])
    return "".join(out)


def _redact_query(rest: str, mode: str) -> str:
    """``?a=1&token=X#f`` → the values of secret-named parameters redacted."""
    q = rest.find("?")
    if q < 0:
        return rest
    h = rest.find("#", q)
    end = len(rest) if h < 0 else h
    params = rest[q + 1 : end].split("&")
    for i, kv in enumerate(params):
        k, eq, v = kv.partition("=")
        if eq and v and not is_marker(v) and is_secret_name(k):
            params[i] = f"{k}={marker(v, mode)}"
    return rest[: q + 1] + "&".join(params) + rest[end:]


def _redact_url(url: str, mode: str) -> str:
    """One URL (``scheme://`` up to white space or a quote): credentials in the userinfo,
    webhook paths, secret-named query parameters."""
    start = url.index("://") + 3
    a_end = start
    while a_end < len(url) and url[a_end] not in _AUTHORITY_END:
        a_end += 1
    authority, rest = url[start:a_end], url[a_end:]
    at = authority.rfind("@")
    host = authority[at + 1 :]
    if at >= 0:
        userinfo = authority[:at]
        user, colon, pw = userinfo.partition(":")
        if is_marker(userinfo):
            pass
        elif colon:
            if pw and not is_marker(pw):
                userinfo = f"{user}:{marker(pw, mode)}"
        elif len(userinfo) >= USERINFO_MIN_LEN or _prefixed(userinfo):
            userinfo = marker(userinfo, mode)
        authority = f"{userinfo}@{host}"
    hostname = host.partition(":")[0].lower()
    path = rest[1:] if rest.startswith("/") else ""
    if hostname in WEBHOOK_HOSTS and path and not is_marker(path):
        rest = "/" + marker(path, mode)
    elif hostname in DISCORD_HOSTS and path.startswith("api/webhooks/"):
        hook = path[len("api/webhooks/") :]
        if hook and not is_marker(hook):
            rest = "/api/webhooks/" + marker(hook, mode)
    else:
        rest = _redact_query(rest, mode)
    return url[:start] + authority + rest


def _redact_urls(s: str, mode: str) -> str:
    out: list[str] = []
    i = 0
    while True:
        k = s.find("://", i)
        if k < 0:
            break
        a = k
        while a > i and s[a - 1] in _SCHEME_CHARS:
            a -= 1
        while a < k and not (_is_upper(s[a]) or _is_lower(s[a])):
            a += 1  # a scheme starts with a letter
        e = k + 3
        while e < len(s) and s[e] not in _URL_END:
            e += 1
        if a == k:
            out.append(s[i:e])
        else:
            out.append(s[i:a])
            out.append(_redact_url(s[a:e], mode))
        i = e
    out.append(s[i:])
    return "".join(out)


def _secret_pem_label(label: str) -> bool:
    """Whether a PEM label (``RSA PRIVATE KEY``, ``OPENSSH PRIVATE KEY``, ``ENCRYPTED
    PRIVATE KEY``, ``PGP PRIVATE KEY BLOCK``) names a secret; certificates and public keys
    are not."""
    up = label.upper()
    return any(w in up for w in ("PRIVATE", "SECRET", "ENCRYPTED"))


def _redact_pem(value: str, mode: str) -> str:
    """Private-key blocks, each redacted whole: from ``-----BEGIN … PRIVATE KEY-----``
    through its ``-----END …-----`` line (to the value's end when cut short), whether the
    lines are real newlines or written ``\\n``. A certificate beside the key stays."""
    begin, dashes, end_mark = "-----BEGIN ", "-----", "-----END "
    out: list[str] = []
    rest = value
    while True:
        a = rest.find(begin)
        if a < 0:
            break
        label_end = rest.find(dashes, a + len(begin))
        if label_end < 0:
            break
        head = label_end + len(dashes)
        if not _secret_pem_label(rest[a + len(begin) : label_end]):
            out.append(rest[:head])
            rest = rest[head:]
            continue
        end = len(rest)
        e = rest.find(end_mark, head)
        if e >= 0:
            d = rest.find(dashes, e + len(end_mark))
            if d >= 0:
                end = d + len(dashes)
        out.append(rest[:a])
        out.append(marker(rest[a:end], mode))
        rest = rest[end:]
    out.append(rest)
    return "".join(out)


def redact_value(value: str, mode: str = "hash") -> str:
    """The value rules alone (whatever the name): private-key blocks whole, credentials and
    secret query parameters in URLs, webhook URLs, token-shaped words, high-entropy words."""
    if is_marker(value):
        return value
    return _redact_words(_redact_urls(_redact_pem(value, mode), mode), mode)


def redact_named(name: str, value: str, mode: str = "hash") -> str:
    """A value stored under ``name`` (an environment variable, an ``args`` path): all of it
    when the name is secret, else the value rules."""
    if is_marker(value):
        return value
    if is_secret_name(name) and not _plain(value):
        return marker(value, mode)
    return redact_value(value, mode)


def _flag_name(arg: str) -> str | None:
    """``--api-key`` / ``-password`` → the name; None for ``-p``, ``-`` and non-flags."""
    name = arg.lstrip("-")
    if arg.startswith("-") and len(name) > 1 and (_is_upper(name[0]) or _is_lower(name[0])):
        return name
    return None


#: Short flags that carry a password in common tools (``mysql -p``, ``sshpass -p``, ``-P``
#: of others): their value, next (``-p VALUE``) or attached (``-pVALUE``, mysql's form), is
#: redacted unless it is a number (``-p 8080``, ``-p8080``: a port).
_SECRET_SHORT_FLAGS = ("-p", "-P")

#: Flags whose value is ``user:password`` (curl's ``-u``/``--user``, ``-U``/``--proxy-user``):
#: the part after the user is redacted, next (``-u u:pw``), attached (``-uu:pw``) or after ``=``.
_USER_FLAGS = ("-u", "-U", "--user", "--proxy-user")


def _number(s: str) -> bool:
    return s != "" and all(_is_digit(c) for c in s)


def _whole(value: str, mode: str) -> str:
    """A whole value replaced, unless plain (``true``, one character) or already a marker."""
    return value if is_marker(value) or _plain(value) else marker(value, mode)


def _user_password(value: str, mode: str) -> str:
    """``user:password`` → the user (value rules) and the password's marker. The user may be
    a marker already (a token redacted before): the password starts after it, so redacting
    again changes nothing. Without a password, the value rules alone."""
    user_end = 0
    gt = value.find(">")
    if value.startswith("<") and gt >= 0 and is_marker(value[: gt + 1]):
        user_end = gt + 1
    c = value.find(":", user_end)
    if c < 0 or c + 1 >= len(value):
        return redact_value(value, mode)
    return f"{redact_value(value[:c], mode)}:{_whole(value[c + 1 :], mode)}"


def _attached(arg: str, mode: str) -> str | None:
    """``-pVALUE`` / ``-uUSER:PW`` (a value attached to a password or user flag) redacted;
    None for other arguments, and for ``-password``-like flags (a secret name: the next
    argument is their value)."""
    flag_name = _flag_name(arg)
    if arg.startswith("--") or (flag_name is not None and is_secret_name(flag_name)):
        return None
    flag, rest = arg[:2], arg[2:]
    if rest == "":
        return None
    value = rest[1:] if rest.startswith("=") else rest
    head = arg[: len(arg) - len(value)]
    if flag in _SECRET_SHORT_FLAGS:
        return arg if _number(value) else head + _whole(value, mode)
    if flag in _USER_FLAGS:
        return head + _user_password(value, mode)
    return None


def redact_argv(argv: list[str], mode: str = "hash") -> list[str]:
    """``sys.argv``: the value of ``--secret-name VALUE`` (unless it starts with ``--``),
    ``--secret-name=VALUE`` and ``secret.name=VALUE`` (Hydra-style overrides), of ``-p
    VALUE``, ``-pVALUE``, ``-P VALUE`` unless a number, the password of ``-u user:password``
    (and its attached and ``--user=`` forms), then the value rules on every argument."""
    out: list[str] = []
    pending = ""  # what the previous argument says of this one: named, short, user
    for arg in argv:
        was, pending = pending, ""
        value: str | None = None
        if was == "named" and not arg.startswith("--"):
            value = _whole(arg, mode)
        elif was == "short" and not arg.startswith("-") and not _number(arg):
            value = _whole(arg, mode)
        elif was == "user" and not arg.startswith("-"):
            value = _user_password(arg, mode)
        if value is None:
            value = _attached(arg, mode)
        if value is not None:
            out.append(value)
            continue
        key, eq, v = arg.partition("=")
        if eq:
            bare = key.lstrip("-+~")
            if bare and is_secret_name(bare) and not _plain(v) and not is_marker(v):
                out.append(f"{key}={marker(v, mode)}")
                continue
            if key in _USER_FLAGS:
                out.append(f"{key}={_user_password(v, mode)}")
                continue
        else:
            flag = _flag_name(arg)
            if flag is not None and is_secret_name(flag):
                pending = "named"
            elif arg in _SECRET_SHORT_FLAGS:
                pending = "short"
            elif arg in _USER_FLAGS:
                pending = "user"
        out.append(redact_value(arg, mode))
    return out


def redact_tree(value: Any, path: str, mode: str = "hash") -> Any:
    """A JSON-safe tree (``args``, ``extra``): every string or number leaf by its dotted path
    (``args.db.password``, ``args.urls.0``: the path config-check shows), booleans and nulls
    kept."""
    if isinstance(value, dict):
        return {k: redact_tree(v, f"{path}.{k}", mode) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v, f"{path}.{i}", mode) for i, v in enumerate(value)]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        text = str(value)
        if is_secret_name(path) and not _plain(text):
            return marker(text, mode)
        return value
    if isinstance(value, str):
        return redact_named(path, value, mode)
    return value
