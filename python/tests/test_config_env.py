"""``PROBE_CONFIG``: a recapture.json applied with no change to the training script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probe.config import ConfigError, load_config


def test_probe_config_replaces_the_scripts_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "recapture.json"
    path.write_text(
        json.dumps(
            {
                "$reason": "r",
                "$replay": {"step": 0, "rank": 0, "ops": ["Functional.gelu.1.forward"]},
                "$msprobe": {"task": "tensor"},
                "dump_path": "./probe_recapture",
                "steps": [0],
                "ranks": [0],
                "level": "api",
                "mode": "tensor",
                "include": ["Functional.gelu.1"],
            }
        )
    )
    monkeypatch.setenv("PROBE_CONFIG", str(path))
    c = load_config({"mode": "statistics", "steps": [3]}, {"dump_path": "/elsewhere"})
    assert (c.mode, c.dump_path, c.include) == ("tensor", "./probe_recapture", ["Functional.gelu.1"])
    assert c.steps == frozenset({0}) and c.ranks == frozenset({0})
    monkeypatch.setenv("PROBE_CONFIG", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="PROBE_CONFIG"):
        load_config(None, {})


def test_without_probe_config_the_scripts_config_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROBE_CONFIG", raising=False)
    assert load_config({"mode": "tensor"}, {"steps": [2]}).steps == frozenset({2})
