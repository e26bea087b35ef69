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


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"task": ["tensor"]}, "task"),
        ({"task": {"t": 1}}, "task"),
        ({"task": "statistics", "level": ["L1"]}, "level"),
        ({"task": "statistics", "step": 1.5}, "steps"),
        ({"task": "statistics", "rank": {"0": 1}}, "ranks"),
        ({"task": "statistics", "step": [[0, "3"]]}, "steps"),
        ({"task": "tensor", "tensor": {"list": 5}}, "tensor.list"),
        ({"task": "tensor", "tensor": {"list": [1]}}, "tensor.list"),
        ({"task": "statistics", "statistics": {"data_mode": 1.5}}, "statistics.data_mode"),
        ({"dump": {"common_dump_settings": {"dump_iter": 1.5}}}, "steps"),
    ],
)
def test_wrongly_typed_msprobe_configs_are_config_errors(
    cfg: dict[str, object], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 70: msprobe keys of the wrong JSON type raised TypeError from inside the
    translation; each is the configuration's own error, naming the key."""
    monkeypatch.delenv("PROBE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=f"^{key}: "):
        load_config(cfg, {})
