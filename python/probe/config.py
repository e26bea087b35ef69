"""Capture configuration: probe's own JSON keys, msprobe's config.json keys, overrides.

Users come from msprobe with a config.json they trust, so those keys are accepted and
translated; probe's own keys (schemas/probe-capture-config.v1.schema.json) say the same
things more directly. Everything is validated up front so a typo fails at construction,
before hours of training, rather than silently capturing nothing.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

LEVELS = ("api", "module", "mix")
MODES = ("statistics", "tensor", "checksum", "overflow")
DIRECTIONS = ("forward", "backward")
DATA = ("inputs", "outputs")
_MSPROBE_LEVELS = {"L0": "module", "L1": "api", "mix": "mix"}

NATIVE_KEYS = {
    "dump_path",
    "steps",
    "ranks",
    "level",
    "mode",
    "directions",
    "data",
    "include",
    "exclude",
    "include_modules",
    "exclude_modules",
    "scope",
    "stack",
    "shard_size_mb",
    "queue_size",
    "device",
    "overflow_nums",
}


class ConfigError(ValueError):
    """The configuration is invalid; raised at construction, never during training."""


def parse_selection(value: Any, what: str) -> Optional[frozenset[int]]:
    """Parse ``[0, 3, "5-7"]`` (ints and inclusive ``a-b`` ranges) into a set; None = all."""
    if value is None:
        return None
    if isinstance(value, (int, str)):
        value = [value]
    out: set[int] = set()
    for item in value:
        if isinstance(item, bool):
            raise ConfigError(f"{what}: {item!r} is not a step/rank number")
        if isinstance(item, int):
            if item < 0:
                raise ConfigError(f"{what}: negative value {item}")
            out.add(item)
        elif isinstance(item, str):
            text = item.strip()
            try:
                if "-" in text:
                    lo_s, hi_s = text.split("-", 1)
                    lo, hi = int(lo_s), int(hi_s)
                    if lo > hi or lo < 0:
                        raise ValueError
                    out.update(range(lo, hi + 1))
                else:
                    out.add(int(text))
            except ValueError:
                raise ConfigError(f'{what}: cannot parse {item!r} (use 3 or "2-5")') from None
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            out.update(range(int(item[0]), int(item[1]) + 1))
        else:
            raise ConfigError(f"{what}: cannot parse {item!r}")
    return frozenset(out) if out else None


def _list_of_str(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what}: expected a list of strings, got {value!r}")
    return list(value)


def op_candidates(api: str, call: int, direction: str = "forward") -> tuple[str, ...]:
    """Names an op pattern may match: ``gelu``, ``Functional.gelu``, ``Functional.gelu.0``,
    ``Functional.gelu.0.forward``."""
    short = api.split(".", 1)[1] if "." in api else api
    return (short, api, f"{api}.{call}", f"{api}.{call}.{direction}")


def module_candidates(path: str, cls: str, call: int) -> tuple[str, ...]:
    """Names a pattern may match for a module call (msprobe keys included)."""
    base = f"Module.{path}.{cls}"
    return (path, cls, base, f"{base}.forward.{call}", f"{base}.forward")


def pattern_match(patterns: Iterable[str], names: tuple[str, ...]) -> bool:
    """True if any glob pattern equals or matches any of ``names``."""
    for p in patterns:
        wild = any(c in p for c in "*?[")
        for n in names:
            if (wild and fnmatch.fnmatchcase(n, p)) or n == p:
                return True
    return False


def module_path_match(patterns: Iterable[str], path: Optional[str]) -> bool:
    """A module pattern matches the module and everything below it (``block`` ~ ``block.mlp``)."""
    if path is None:
        return False
    for p in patterns:
        if path == p or path.startswith(p + ".") or fnmatch.fnmatchcase(path, p):
            return True
        if fnmatch.fnmatchcase(path, p + ".*"):
            return True
    return False


@dataclass
class CaptureConfig:
    """The validated capture configuration. ``raw`` is what the user gave (for the manifest)."""

    dump_path: str = "./probe_dump"
    steps: Optional[frozenset[int]] = None
    ranks: Optional[frozenset[int]] = None
    level: str = "api"
    mode: str = "statistics"
    directions: tuple[str, ...] = DIRECTIONS
    data: tuple[str, ...] = DATA
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    include_modules: list[str] = field(default_factory=list)
    exclude_modules: list[str] = field(default_factory=list)
    scope: Optional[tuple[str, Optional[str]]] = None
    stack: bool = True
    shard_size_mb: float = 256.0
    queue_size: int = 64
    device: Optional[str] = None
    #: Overflow mode: how many ops producing NaN/Inf to record before capture stops for
    #: the rest of the run; -1 = no limit (msprobe's ``overflow_nums``, default 1 there too).
    overflow_nums: int = 1
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def forward(self) -> bool:
        return "forward" in self.directions

    @property
    def backward(self) -> bool:
        return "backward" in self.directions

    @property
    def inputs(self) -> bool:
        return "inputs" in self.data

    @property
    def outputs(self) -> bool:
        return "outputs" in self.data

    @property
    def api(self) -> bool:
        return self.level in ("api", "mix")

    @property
    def module(self) -> bool:
        return self.level in ("module", "mix")

    @property
    def shard_bytes(self) -> int:
        return max(1, int(self.shard_size_mb * 1024 * 1024))


def _from_msprobe(cfg: dict[str, Any]) -> dict[str, Any]:
    """Translate msprobe config.json keys into probe's keys."""
    task = cfg.get("task", "statistics")
    out: dict[str, Any] = {}
    if "dump_path" in cfg:
        out["dump_path"] = cfg["dump_path"]
    if cfg.get("step"):
        out["steps"] = cfg["step"]
    if cfg.get("rank"):
        out["ranks"] = cfg["rank"]
    level = cfg.get("level", "L1")
    if level not in _MSPROBE_LEVELS:
        raise ConfigError(
            f"level: {level!r} is not supported (msprobe's L0, L1 or mix; probe has no "
            "kernel-level L2 dump)"
            if level == "L2"
            else f"level: unknown msprobe level {level!r} (L0, L1, mix)"
        )
    out["level"] = _MSPROBE_LEVELS[level]
    section: dict[str, Any] = cfg[task] if isinstance(cfg.get(task), dict) else {}
    mode = {"tensor": "tensor", "statistics": "statistics", "overflow_check": "overflow"}.get(task)
    if mode is None:
        raise ConfigError(f"task: {task!r} is not supported (statistics, tensor, overflow_check)")
    summary = section.get("summary_mode", "statistics")
    if mode == "statistics" and summary == "md5":
        mode = "checksum"
    out["mode"] = mode
    if mode == "overflow" and "overflow_nums" in section:
        out["overflow_nums"] = section["overflow_nums"]
    scope = section.get("scope") or []
    if scope:
        out["scope"] = scope
    names = section.get("list") or []
    if names:
        # msprobe's list entries match by substring of the API/module name.
        out["include"] = [n if any(c in n for c in "*?[") else f"*{n}*" for n in names]
    data_mode = section.get("data_mode") or ["all"]
    if "all" not in data_mode:
        dirs = [d for d in ("forward", "backward") if d in data_mode]
        data = [d + "s" for d in ("input", "output") if d in data_mode]
        if dirs:
            out["directions"] = dirs
        if data:
            out["data"] = data
    return out


def load_config(
    source: Union[str, os.PathLike[str], dict[str, Any], None], overrides: dict[str, Any]
) -> CaptureConfig:
    """Build a CaptureConfig from a JSON file path, a dict or None, plus keyword overrides."""
    if source is None:
        raw: dict[str, Any] = {}
    elif isinstance(source, dict):
        raw = dict(source)
    else:
        with open(source, encoding="utf-8") as fh:
            raw = json.load(fh)
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: the configuration must be a JSON object")
    given = dict(raw)
    given.update(overrides)
    cfg = _from_msprobe(raw) if "task" in raw else dict(raw)
    for k in list(cfg):
        if k.startswith("$") or k == "version":
            cfg.pop(k)
    cfg.update(overrides)
    unknown = set(cfg) - NATIVE_KEYS
    if unknown:
        raise ConfigError(f"unknown configuration keys: {sorted(unknown)}")
    c = CaptureConfig(raw=given)
    if "dump_path" in cfg:
        c.dump_path = str(cfg["dump_path"])
    c.steps = parse_selection(cfg.get("steps"), "steps")
    c.ranks = parse_selection(cfg.get("ranks"), "ranks")
    level = cfg.get("level", "api")
    given_level = level
    level = _MSPROBE_LEVELS.get(level, level) if isinstance(level, str) else level
    if level not in LEVELS:
        raise ConfigError(
            f"level: {given_level!r} is not one of {LEVELS} (or msprobe's L0, L1, mix)"
        )
    c.level = level
    mode = cfg.get("mode", "statistics")
    if mode == "md5":
        mode = "checksum"
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {MODES}")
    c.mode = mode
    dirs = _list_of_str(cfg.get("directions", list(DIRECTIONS)), "directions")
    if not dirs or any(d not in DIRECTIONS for d in dirs):
        raise ConfigError(f"directions: {dirs!r} must be a non-empty subset of {DIRECTIONS}")
    c.directions = tuple(dirs)
    given_data = _list_of_str(cfg.get("data", list(DATA)), "data")
    data = [d if d.endswith("s") else d + "s" for d in given_data]
    if not data or any(d not in DATA for d in data):
        raise ConfigError(
            f"data: {given_data!r} must be a non-empty subset of {DATA} (or input, output)"
        )
    c.data = tuple(data)
    c.include = _list_of_str(cfg.get("include"), "include")
    c.exclude = _list_of_str(cfg.get("exclude"), "exclude")
    c.include_modules = _list_of_str(cfg.get("include_modules"), "include_modules")
    c.exclude_modules = _list_of_str(cfg.get("exclude_modules"), "exclude_modules")
    scope = _list_of_str(cfg.get("scope"), "scope")
    if len(scope) > 2:
        raise ConfigError("scope: give [first_op] or [first_op, last_op]")
    c.scope = (scope[0], scope[1] if len(scope) == 2 else None) if scope else None
    c.stack = bool(cfg.get("stack", True))
    try:
        c.shard_size_mb = float(cfg.get("shard_size_mb", 256))
        c.queue_size = int(cfg.get("queue_size", 64))
    except (TypeError, ValueError):
        raise ConfigError("shard_size_mb / queue_size must be numbers") from None
    if c.shard_size_mb <= 0 or c.queue_size <= 0:
        raise ConfigError("shard_size_mb and queue_size must be positive")
    dev = cfg.get("device")
    if dev is not None and dev not in ("cpu", "cuda", "npu"):
        raise ConfigError(f"device: {dev!r} is not one of cpu, cuda, npu")
    c.device = dev
    nums = cfg.get("overflow_nums", 1)
    if isinstance(nums, bool) or not isinstance(nums, int) or not (nums >= 1 or nums == -1):
        raise ConfigError(f"overflow_nums: {nums!r} must be a positive integer or -1 (no limit)")
    c.overflow_nums = nums
    return c
