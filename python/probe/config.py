"""Capture configuration: probe's own JSON keys, msprobe's config.json keys, the migration
tutorial's ``{"dump": {...}}`` file, overrides.

Users come from msprobe with a config.json they trust, or paste the tutorial's dump config,
so those shapes are accepted and translated; probe's own keys
(schemas/probe-capture-config.v1.schema.json) say the same things more directly. Everything
is validated up front so a typo fails at construction, before hours of training, rather
than silently capturing nothing.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ._op_key import FORWARD, api_key, module_base, module_key

LEVELS = ("api", "module", "mix")
MODES = ("statistics", "tensor", "checksum", "overflow")
DIRECTIONS = ("forward", "backward")
DATA = ("inputs", "outputs")
#: Who writes tensor data (``tensor_writer``): writer.py, ``TensorWriter``.
TENSOR_WRITERS = ("auto", "thread", "inline")
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
    "tensor_writer",
    "device",
    "overflow_nums",
    "api_list",
    "flight_recorder",
    "dry_run",
    "max_bytes",
    "max_overhead",
    "on_budget",
}

#: The tutorial's ``common_dump_settings`` keys, and the probe keys they stand for (giving
#: both is refused: which one would win is not obvious).
_TUTORIAL_SETTINGS = {"dump_mode": "level", "dump_path": "dump_path", "dump_iter": "steps"}

#: Full PyTorch names (``torch.nn.functional.conv2d``) -> the agent's API types
#: (``Functional.conv2d``); longest prefix first, ``torch.`` last.
_API_PREFIXES = (
    ("torch.nn.functional.", "Functional"),
    ("torch.Tensor.", "Tensor"),
    ("torch.distributed.", "Distributed"),
    ("torch_npu.", "NPU"),
    ("torch._VF.", "VF"),
    ("torch.", "Torch"),
)
_API_TYPES = ("Functional", "Tensor", "Distributed", "NPU", "VF", "Torch")


class ConfigError(ValueError):
    """The configuration is invalid; raised at construction, never during training."""


def parse_selection(value: Any, what: str) -> Optional[frozenset[int]]:
    """Parse ``[0, 3, "5-7"]`` (ints and inclusive ``a-b`` ranges) into a set; None = all."""
    if value is None:
        return None
    if isinstance(value, (int, str)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f'{what}: cannot parse {value!r} (use 3, "2-5" or a list of them)')
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
        elif (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in item)
        ):
            out.update(range(item[0], item[1] + 1))
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
    return (short, api, f"{api}.{call}", api_key(api, call, direction))


@dataclass(frozen=True)
class ListEntry:
    """One ``api_list`` entry: an API (``api``, the agent's name, ``Functional.conv2d``) or a
    module path (``module``, as given: a leading model variable name is resolved once the
    model is known), and the directions it selects."""

    name: str
    api: Optional[str]
    module: Optional[str]
    forward: bool
    backward: bool


def api_name(name: str) -> Optional[str]:
    """The agent's name of an API (``torch.nn.functional.conv2d`` -> ``Functional.conv2d``,
    ``torch.matmul`` -> ``Torch.matmul``, ``torch.Tensor.add`` -> ``Tensor.add``; the
    agent's own names pass through), or None when ``name`` is not an API name (then it is
    a module path)."""
    for prefix, api_type in _API_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"{api_type}.{name[len(prefix) :]}"
    head, _, rest = name.partition(".")
    if head in _API_TYPES and rest and "." not in rest:
        return name
    return None


def parse_api_list(value: Any) -> tuple[ListEntry, ...]:
    """Parse ``[{"name": "torch.nn.functional.conv2d", "api_type": "forward"}, ...]``.

    ``api_type`` is ``forward`` or ``backward``; without it an entry selects both. A name
    that is not an API name (:func:`api_name`) is a module path as ``print(model)`` shows
    it."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"api_list: expected a list of {{name, api_type}} objects, got {value!r}")
    out: list[ListEntry] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ConfigError(f"api_list[{i}]: expected {{name, api_type}}, got {item!r}")
        unknown = sorted(set(item) - {"name", "api_type"})
        if unknown:
            raise ConfigError(f"api_list[{i}]: unknown key {unknown[0]!r} (name, api_type)")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"api_list[{i}]: name must be a non-empty string, got {name!r}")
        name = name.strip()
        kind = item.get("api_type")
        if kind is not None and kind not in DIRECTIONS:
            raise ConfigError(
                f"api_list[{i}] ({name}): api_type {kind!r} is not forward or backward"
            )
        api = api_name(name)
        out.append(
            ListEntry(
                name=name,
                api=api,
                module=None if api is not None else name,
                forward=kind in (None, "forward"),
                backward=kind in (None, "backward"),
            )
        )
    return tuple(out)


def module_candidates(path: str, cls: str, call: int) -> tuple[str, ...]:
    """Names a pattern may match for a module call (msprobe keys included)."""
    base = module_base(path, cls)
    return (path, cls, base, module_key(base, FORWARD, call), f"{base}.{FORWARD}")


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


#: The flight recorder's triggers (``flight_recorder.triggers``; docs/monitor.md).
TRIGGERS = ("nonfinite", "loss_spike", "exception", "signal")
#: What the flight recorder does after writing (``flight_recorder.then``).
THEN = ("continue", "stop")
#: What a capture that exceeds ``max_bytes``/``max_overhead`` does to the following steps.
ON_BUDGET = ("statistics", "stop", "warn")
_FLIGHT_KEYS = (
    "steps",
    "triggers",
    "then",
    "signal",
    "loss_window",
    "spike_threshold",
    "spike_margin",
)


@dataclass(frozen=True)
class FlightConfig:
    """The flight recorder's settings (``flight_recorder``; docs/monitor.md, "Dump on
    trigger"). Defaults are chosen so that ordinary loss noise never fires and a real
    spike (ten times the recent spread, and 25 % above the recent median) does."""

    #: Steps held: the trigger's step and the ``steps - 1`` before it.
    steps: int
    triggers: tuple[str, ...] = TRIGGERS
    then: str = "continue"
    #: The signal that asks for a dump (a name of the ``signal`` module).
    signal: str = "SIGUSR1"
    #: Losses the spike score is taken over (median and MAD of the last ``loss_window``).
    loss_window: int = 50
    #: A spike: ``(loss - median) / (1.4826 * MAD)`` above this...
    spike_threshold: float = 10.0
    #: ...and ``loss - median`` above this fraction of ``|median|``.
    spike_margin: float = 0.25


def _positive_int(value: Any, what: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{what}: {value!r} must be an integer >= {least}")
    return value


def _positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{what}: {value!r} must be a positive number")
    return float(value)


def parse_flight_recorder(value: Any) -> Optional[FlightConfig]:
    """Parse ``flight_recorder``: ``K`` (steps held, every trigger) or ``{"steps": K,
    "triggers": [...], "then": "continue", ...}``; None/absent = off."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return FlightConfig(steps=_positive_int(value, "flight_recorder"))
    unknown = sorted(set(value) - set(_FLIGHT_KEYS))
    if unknown:
        raise ConfigError(
            f"flight_recorder: unknown key {unknown[0]!r} ({', '.join(_FLIGHT_KEYS)})"
        )
    if "steps" not in value:
        raise ConfigError("flight_recorder: 'steps' (how many steps to hold) is required")
    triggers = tuple(
        _list_of_str(value.get("triggers", list(TRIGGERS)), "flight_recorder.triggers")
    )
    if not triggers:
        raise ConfigError(f"flight_recorder.triggers: empty (one or more of {', '.join(TRIGGERS)})")
    bad = [t for t in triggers if t not in TRIGGERS]
    if bad:
        raise ConfigError(
            f"flight_recorder.triggers: {bad[0]!r} is not a trigger ({', '.join(TRIGGERS)})"
        )
    then = value.get("then", "continue")
    if then not in THEN:
        raise ConfigError(f"flight_recorder.then: {then!r} is not one of {', '.join(THEN)}")
    sig = value.get("signal", "SIGUSR1")
    if "signal" in value and not (
        isinstance(sig, str) and sig.startswith("SIG") and hasattr(signal, sig)
    ):
        raise ConfigError(
            f"flight_recorder.signal: {sig!r} is not a signal of this platform (SIGUSR1)"
        )
    return FlightConfig(
        steps=_positive_int(value["steps"], "flight_recorder.steps"),
        triggers=triggers,
        then=then,
        signal=sig,
        loss_window=_positive_int(value.get("loss_window", 50), "flight_recorder.loss_window", 3),
        spike_threshold=_positive_number(
            value.get("spike_threshold", 10.0), "flight_recorder.spike_threshold"
        ),
        spike_margin=_positive_number(
            value.get("spike_margin", 0.25), "flight_recorder.spike_margin"
        ),
    )


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
    #: Who writes tensor data: ``thread`` (a background thread, from host copies),
    #: ``inline`` (the training thread, as each tensor is captured) or ``auto``
    #: (writer.py: ``inline`` on a CPU run with no core to spare for the thread).
    tensor_writer: str = "auto"
    device: Optional[str] = None
    #: Overflow mode: how many ops producing NaN/Inf to record before capture stops for
    #: the rest of the run; -1 = no limit (msprobe's ``overflow_nums``, default 1 there too).
    overflow_nums: int = 1
    #: APIs and module paths to capture, each in its own directions (the tutorial's
    #: ``api_list``); empty = no such filter.
    api_list: tuple[ListEntry, ...] = ()
    #: Dump on trigger (capture/flight.py): the last steps held in memory, written only when
    #: a trigger fires; None = every captured step is written.
    flight_recorder: Optional[FlightConfig] = None
    #: Capture the first selected step in a temporary folder, forecast the cost, write
    #: nothing into ``dump_path`` and capture no more (capture/forecast.py).
    dry_run: bool = False
    #: Budgets checked against the forecast after the first captured step: bytes for the
    #: selected steps and ranks, and captured step time over bare step time...
    max_bytes: Optional[int] = None
    max_overhead: Optional[float] = None
    #: ...and what exceeding one does to the following steps (forecast.ON_BUDGET).
    on_budget: str = "statistics"
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
    if not isinstance(task, str):
        raise ConfigError(f"task: {task!r} is not supported (statistics, tensor, overflow_check)")
    out: dict[str, Any] = {}
    if "dump_path" in cfg:
        out["dump_path"] = cfg["dump_path"]
    if cfg.get("step"):
        out["steps"] = cfg["step"]
    if cfg.get("rank"):
        out["ranks"] = cfg["rank"]
    level = cfg.get("level", "L1")
    if not isinstance(level, str) or level not in _MSPROBE_LEVELS:
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
    names = _list_of_str(section.get("list") or [], f"{task}.list")
    if names:
        # msprobe's list entries match by substring of the API/module name.
        out["include"] = [n if any(c in n for c in "*?[") else f"*{n}*" for n in names]
    data_mode = _list_of_str(section.get("data_mode") or [], f"{task}.data_mode") or ["all"]
    if "all" not in data_mode:
        dirs = [d for d in ("forward", "backward") if d in data_mode]
        data = [d + "s" for d in ("input", "output") if d in data_mode]
        if dirs:
            out["directions"] = dirs
        if data:
            out["data"] = data
    return out


def _from_tutorial(cfg: dict[str, Any]) -> dict[str, Any]:
    """Translate the migration tutorial's ``{"dump": {"common_dump_settings": {...},
    "api_list": [...]}}`` into probe's keys.

    ``dump_mode`` is the level, ``dump_iter`` (``"10|20"``, 0-based like msprobe's
    ``step``) the steps; probe's own keys (``mode``, ``ranks``, ...) are accepted in
    ``common_dump_settings`` too, which is how the tutorial shape asks for tensor mode."""
    extra = sorted(set(cfg) - {"dump", "$schema", "version"})
    if extra:
        raise ConfigError(f"unknown configuration key {extra[0]!r} beside 'dump'")
    dump = cfg["dump"]
    if not isinstance(dump, dict):
        raise ConfigError(f"dump: expected an object, got {dump!r}")
    unknown = sorted(set(dump) - {"common_dump_settings", "api_list"})
    if unknown:
        raise ConfigError(f"dump: unknown key {unknown[0]!r} (common_dump_settings, api_list)")
    settings = dump.get("common_dump_settings") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"dump.common_dump_settings: expected an object, got {settings!r}")
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _TUTORIAL_SETTINGS:
            out[_TUTORIAL_SETTINGS[key]] = value
        elif key in NATIVE_KEYS - {"api_list"} - set(_TUTORIAL_SETTINGS.values()):
            out[key] = value
        else:
            raise ConfigError(
                f"dump.common_dump_settings: unknown key {key!r} (dump_mode, dump_path, "
                "dump_iter, or a probe key such as mode; docs/capture.md)"
            )
    if "level" in out and out["level"] not in ("api", "module", "mix"):
        raise ConfigError(f"dump_mode: {out['level']!r} is not api, module or mix")
    it = out.get("steps")
    if isinstance(it, str):
        out["steps"] = [p for p in (s.strip() for s in it.split("|")) if p]
    if "api_list" in dump:
        out["api_list"] = dump["api_list"]
    return out


def strip_line_comments(text: str) -> str:
    """Blank out ``//`` comments outside JSON strings, keeping every line and column in place
    (so a JSON error still points at the right spot): the tutorial writes its config with
    such comments. Block comments are not JSON and stay an error."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def read_config_file(path: Union[str, os.PathLike[str]]) -> dict[str, Any]:
    """Read a JSON configuration file (``//`` line comments allowed) as an object."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        raw = json.loads(strip_line_comments(text))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{os.fspath(path)}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{os.fspath(path)}: the configuration must be a JSON object")
    return raw


#: The environment variable naming a configuration file that replaces the one the training
#: script gives (its file or dict and its keyword overrides): a ``recapture.json`` applied
#: with no change to the script (docs/replay.md).
CONFIG_ENV = "PROBE_CONFIG"


def load_config(
    source: Union[str, os.PathLike[str], dict[str, Any], None], overrides: dict[str, Any]
) -> CaptureConfig:
    """Build a CaptureConfig from a JSON file path, a dict or None, plus keyword overrides.

    Three shapes: probe's own keys, msprobe's config.json (a ``task`` key), the tutorial's
    ``{"dump": {...}}``. ``$PROBE_CONFIG``, when set, names the file used instead of
    ``source`` and ``overrides``."""
    forced = os.environ.get(CONFIG_ENV)
    if forced:
        if not os.path.isfile(forced):
            raise ConfigError(f"{CONFIG_ENV}={forced!r} is not a file")
        source, overrides = forced, {}
    if source is None:
        raw: dict[str, Any] = {}
    elif isinstance(source, dict):
        raw = dict(source)
    else:
        raw = read_config_file(source)
    given = dict(raw)
    given.update(overrides)
    if "task" in raw:
        cfg = _from_msprobe(raw)
    elif "dump" in raw:
        cfg = _from_tutorial(raw)
    else:
        cfg = dict(raw)
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
    c.tensor_writer = cfg.get("tensor_writer", "auto")
    if c.tensor_writer not in TENSOR_WRITERS:
        raise ConfigError(
            f"tensor_writer: {c.tensor_writer!r} is not one of {', '.join(TENSOR_WRITERS)}"
        )
    dev = cfg.get("device")
    if dev is not None and dev not in ("cpu", "cuda", "npu"):
        raise ConfigError(f"device: {dev!r} is not one of cpu, cuda, npu")
    c.device = dev
    nums = cfg.get("overflow_nums", 1)
    if isinstance(nums, bool) or not isinstance(nums, int) or not (nums >= 1 or nums == -1):
        raise ConfigError(f"overflow_nums: {nums!r} must be a positive integer or -1 (no limit)")
    c.overflow_nums = nums
    c.api_list = parse_api_list(cfg.get("api_list"))
    c.flight_recorder = parse_flight_recorder(cfg.get("flight_recorder"))
    if c.flight_recorder is not None and c.mode != "statistics":
        raise ConfigError(
            f"flight_recorder: needs mode 'statistics' (mode is {c.mode!r}): the recorder "
            "holds op records in memory, not tensor data (docs/monitor.md)"
        )
    _parse_cost(c, cfg)
    return c


def _parse_cost(c: CaptureConfig, cfg: dict[str, Any]) -> None:
    """``dry_run``, ``max_bytes``, ``max_overhead``, ``on_budget`` (docs/capture.md,
    "Forecast, dry run and budgets")."""
    dry = cfg.get("dry_run", False)
    if not isinstance(dry, bool):
        raise ConfigError(f"dry_run: {dry!r} must be true or false")
    c.dry_run = dry
    if cfg.get("max_bytes") is not None:
        c.max_bytes = _positive_int(cfg["max_bytes"], "max_bytes")
        if c.steps is None:
            raise ConfigError(
                "max_bytes: needs a finite 'steps' selection (the budget is for the "
                "selected steps and ranks)"
            )
    if cfg.get("max_overhead") is not None:
        c.max_overhead = _positive_number(cfg["max_overhead"], "max_overhead")
        if c.max_overhead < 1:
            raise ConfigError(
                f"max_overhead: {c.max_overhead:g} must be >= 1 (captured step time over bare)"
            )
    on = cfg.get("on_budget", "statistics")
    if on not in ON_BUDGET:
        raise ConfigError(f"on_budget: {on!r} is not one of {', '.join(ON_BUDGET)}")
    c.on_budget = on
    if c.flight_recorder is not None and (c.dry_run or c.max_bytes or c.max_overhead):
        raise ConfigError(
            "dry_run / max_bytes / max_overhead: not with flight_recorder (it writes "
            "only on a trigger, so a step's cost is not known up front)"
        )
