"""The secret-redaction rules against the corpus shared with the Rust implementation
(testdata/secrets/corpus.json; tests/secrets_corpus.rs reads the same file)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from probe.config_pack import redaction

CORPUS = json.loads(
    (Path(__file__).resolve().parents[2] / "testdata" / "secrets" / "corpus.json").read_text()
)
PLACEHOLDER = re.compile("«([^»]*)»")


def expand(expected: Any, mode: str) -> Any:
    """«X» → the marker of X, computed here independently of the module under test."""
    if isinstance(expected, str):

        def sub(m: re.Match[str]) -> str:
            if mode == "drop":
                return "<redacted>"
            return f"<redacted:sha256:{hashlib.sha256(m.group(1).encode()).hexdigest()[:8]}>"

        return PLACEHOLDER.sub(sub, expected)
    if isinstance(expected, list):
        return [expand(x, mode) for x in expected]
    if isinstance(expected, dict):
        return {k: expand(v, mode) for k, v in expected.items()}
    return expected


@pytest.mark.parametrize("name", CORPUS["names"]["secret"])
def test_secret_names(name: str) -> None:
    assert redaction.is_secret_name(name)


@pytest.mark.parametrize("name", CORPUS["names"]["plain"])
def test_plain_names(name: str) -> None:
    assert not redaction.is_secret_name(name)


@pytest.mark.parametrize("mode", redaction.MODES)
@pytest.mark.parametrize("case", CORPUS["env"], ids=lambda c: f"{c['name']}={c['value'][:24]}")
def test_env(case: dict[str, str], mode: str) -> None:
    got = redaction.redact_named(case["name"], case["value"], mode)
    assert got == expand(case["expect"], mode)
    assert redaction.redact_named(case["name"], got, mode) == got  # idempotent


@pytest.mark.parametrize("mode", redaction.MODES)
@pytest.mark.parametrize("case", CORPUS["argv"], ids=lambda c: " ".join(c["argv"][1:])[:30])
def test_argv(case: dict[str, list[str]], mode: str) -> None:
    got = redaction.redact_argv(case["argv"], mode)
    assert got == expand(case["expect"], mode)
    assert redaction.redact_argv(got, mode) == got


@pytest.mark.parametrize("mode", redaction.MODES)
@pytest.mark.parametrize("case", CORPUS["tree"], ids=lambda c: str(c["path"]))
def test_tree(case: dict[str, Any], mode: str) -> None:
    got = redaction.redact_tree(case["value"], case["path"], mode)
    assert got == expand(case["expect"], mode)
    assert redaction.redact_tree(got, case["path"], mode) == got


def test_marker() -> None:
    m = redaction.marker("hunter2")
    assert m == "<redacted:sha256:f52fbd32>"
    assert redaction.is_marker(m) and redaction.is_marker("<redacted>")
    assert not redaction.is_marker("<redacted:sha256:f52fbd3>")
    assert redaction.marker("hunter2", "drop") == "<redacted>"
