"""Rewrite a probe statistics dump into msprobe's on-disk format (issue 16, test helper).

msprobe is not installable here, so tests that pair "a probe dump with an msprobe dump of the
same run" convert a real probe dump into what msprobe (mindstudio-probe 26.2.0, level L1,
task statistics) would have written for that run. The shape follows the real msprobe dumps in
the shared fixtures (``/work/shared/fixtures/msprobe/dumps/L1_statistics_bench``)::

    <out>/dump/step<S>/proc<PID>/dump.json       {"task", "level", "framework", "dump_data_dir",
                                                   "data": {op_key: {...}}}
    <out>/dump/step<S>/proc<PID>/stack.json      {"0": [[op keys], [frames]], ...}
    <out>/dump/step<S>/proc<PID>/construct.json  {} (empty at L1)

Forward entries hold ``input_args`` (positional, nested lists kept), ``input_kwargs`` and
``output``; backward entries ``input`` (gradients of the outputs) and ``output`` (gradients
of the inputs). Tensor leaves are ``{"type": "torch.Tensor", "dtype": "torch.float32",
"shape", "Max", "Min", "Mean", "Norm", "requires_grad"}``.

What really differs between the two dumpers, and is modelled here:

- msprobe L1 records no module paths and no dataflow ids (probe's ``module`` and
  ``id``/``src``): the converted dump has neither (``construct.json`` is empty, as at L1).
- msprobe hooks a different API set: the APIs in ``MSPROBE_UNHOOKED`` are recorded by probe
  and not by msprobe; their records are dropped, forward and backward.
- Call counters are per API per process, so they are renumbered after dropping: an API whose
  calls are all dropped has no counter at all, the others keep their sequence.

Non-tensor arguments are written as msprobe's ``{"type": ..., "value": ...}`` leaves where
probe kept them (``args``), else as ``null``, so positional indices stay put.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# APIs that probe records and msprobe 26.2.0 does not, checked against the fixture run
# L1_statistics_bench (same kind of model: conv stem + one pre-LN transformer block + head).
# Its stack.json names the model's source lines, and its dump.json has no key of:
# - Tensor.reshape: train_probe.py line 139 `self.stem(img).reshape(...)` and line 110
#   `torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)` call it; no record.
# - Tensor.transpose: line 108 `torch.matmul(q, k.transpose(-2, -1))` and line 110; no record
#   (the matmul and the __truediv__ on the same lines are recorded).
# - Tensor.float: line 226 `F.cross_entropy(logits.float(), label)`; only cross_entropy is
#   recorded.
# - Tensor.flatten, Tensor.permute, Tensor.unbind: absent from every dump.json key list in the
#   fixtures too. Weaker evidence: the fixture model's source lines that split the heads
#   (lines 105-107, between the `qkv(x).chunk(3, dim=-1)` of line 104 and the matmul of 108)
#   and line 90 (between the pooling and the projection) produced no record at all, so the
#   view/layout ops there are not hooked, but their text is not in the dump (no record, no
#   frame). `Tensor.chunk` (line 104) is not recorded either; probe's example model uses
#   `unbind` where the fixture model uses `chunk`.
# Every other API that probe's example model records (Functional.*, Torch.matmul,
# Tensor.__add__/__truediv__/mean/add_, the optimizer's Tensor.* in-place ops) has keys in the
# fixture's dump.json.
MSPROBE_UNHOOKED: frozenset[str] = frozenset(
    {
        "Tensor.reshape",
        "Tensor.transpose",
        "Tensor.float",
        "Tensor.flatten",
        "Tensor.permute",
        "Tensor.unbind",
    }
)

_KEY = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_FRAME = re.compile(r'^File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>[^:]*): ?(?P<code>.*)$')


def split_key(op: str) -> tuple[str, int, str]:
    """``Functional.gelu.0.forward`` -> ``("Functional.gelu", 0, "forward")``."""
    m = _KEY.match(op)
    if m is None:
        raise ValueError(f"not an msprobe-style op key: {op!r}")
    return m["api"], int(m["n"]), m["dir"]


def read_records(rank_dir: Path) -> list[dict[str, Any]]:
    """The records of one probe ``ops.jsonl``, in file (execution) order."""
    with open(rank_dir / "ops.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def dropped_records(
    records: Iterable[dict[str, Any]], drop_apis: frozenset[str] = MSPROBE_UNHOOKED
) -> list[dict[str, Any]]:
    """The API records of ``records`` that the converter leaves out."""
    return [r for r in records if r.get("kind") == "api" and split_key(r["op"])[0] in drop_apis]


def _stat(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _tensor_leaf(t: dict[str, Any]) -> dict[str, Any]:
    stats = t.get("stats") or {}
    leaf: dict[str, Any] = {
        "type": "torch.Tensor",
        "dtype": f"torch.{t['dtype']}",
        "shape": list(t["shape"]),
        "Max": _stat(stats.get("max")),
        "Min": _stat(stats.get("min")),
        "Mean": _stat(stats.get("mean")),
        "Norm": _stat(stats.get("norm")),
        # probe does not record requires_grad; msprobe writes it and probe's reader ignores
        # it, so False stands in for the unknown value.
        "requires_grad": False,
    }
    if isinstance(t.get("checksum"), str) and t["checksum"].startswith("crc32:"):
        leaf["md5"] = t["checksum"].removeprefix("crc32:").upper()
    return leaf


def _value_leaf(v: Any) -> Any:
    """A non-tensor argument as msprobe writes it."""
    if v is None:
        return None
    if isinstance(v, list):
        return [_value_leaf(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _value_leaf(x) for k, x in v.items()}
    kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(v), "str")
    return {"type": kind, "value": _stat(v) if kind == "float" else v}


def _put(root: dict[str, Any], path: list[str], leaf: Any, *, overwrite: bool) -> None:
    """Store ``leaf`` at ``path`` below ``root``: digit parts index lists, others dict keys."""
    node: Any = root
    for i, part in enumerate(path):
        last = i == len(path) - 1
        nxt_is_index = not last and path[i + 1].isdigit()
        empty: Any = [] if nxt_is_index else {}
        if isinstance(node, list):
            if not part.isdigit():
                return  # shape clash with an argument leaf: keep what is there
            idx = int(part)
            while len(node) <= idx:
                node.append(None)
            if last:
                if overwrite or node[idx] is None:
                    node[idx] = leaf
                return
            if not isinstance(node[idx], (list, dict)) or (
                isinstance(node[idx], dict) and "type" in node[idx]
            ):
                if node[idx] is not None and not overwrite:
                    return
                node[idx] = empty
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                if overwrite or node.get(part) is None:
                    node[part] = leaf
                return
            cur = node.get(part)
            if not isinstance(cur, (list, dict)) or (isinstance(cur, dict) and "type" in cur):
                if cur is not None and not overwrite:
                    return
                node[part] = empty
            node = node[part]
        else:
            return


def _entry(rec: dict[str, Any], old_key: str) -> dict[str, Any]:
    """One dump.json ``data`` entry from a probe record (tensor names start with ``old_key``)."""
    backward = rec["direction"] == "backward"
    # Slots: "input" (positional list + kwargs dict) and "output", like msprobe.
    tree: dict[str, Any] = {"input": {}, "output": {}}
    prefix = old_key + "."
    for t in rec.get("tensors", []):
        name: str = t["name"]
        if not name.startswith(prefix):
            raise ValueError(f"tensor {name!r} does not belong to {old_key!r}")
        parts = name[len(prefix) :].split(".")
        if parts[0] not in tree or len(parts) < 2:
            continue  # parameters and other roles do not occur at level api
        _put(tree[parts[0]], parts[1:], _tensor_leaf(t), overwrite=True)
    for arg, value in (rec.get("args") or {}).items():
        parts = arg.split(".")
        if parts[0] in tree and len(parts) >= 2:
            _put(tree[parts[0]], parts[1:], _value_leaf(value), overwrite=False)

    def positional(d: dict[str, Any]) -> list[Any]:
        idx = [int(k) for k in d if k.isdigit()]
        out: list[Any] = [None] * (max(idx) + 1 if idx else 0)
        for i in idx:
            out[i] = d[str(i)]
        return out

    inputs, outputs = tree["input"], tree["output"]
    if backward:
        return {"input": positional(inputs), "output": positional(outputs)}
    return {
        "input_args": positional(inputs),
        "input_kwargs": {k: v for k, v in inputs.items() if not k.isdigit()},
        "output": positional(outputs),
    }


def _msprobe_frame(frame: str) -> str:
    """probe's ``File "f", line N, in fn: code`` -> msprobe's ``File f, line N, in fn, \\n code``."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    return f"File {m['file']}, line {m['line']}, in {m['func']}, \n {m['code']}"


def _read_stacks(rank_dir: Path) -> dict[int, list[str]]:
    path = rank_dir / "stacks.jsonl"
    if not path.is_file():
        return {}
    stacks: dict[int, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                s = json.loads(line)
                stacks[int(s["id"])] = list(s["frames"])
    return stacks


def convert_rank(
    rank_dir: Path, dest: Path, *, drop_apis: frozenset[str] = MSPROBE_UNHOOKED
) -> dict[str, str]:
    """Convert one probe rank folder into ``dest``; returns {new op key: old op key}."""
    records = [r for r in read_records(rank_dir) if r.get("kind") == "api"]
    # Renumber per API per process, forward in execution order; a backward entry takes its
    # forward call's new counter.
    next_n: dict[str, int] = {}
    fwd_new: dict[tuple[str, int], int] = {}
    data: dict[str, Any] = {}
    renamed: dict[str, str] = {}
    stack_ops: dict[int, list[str]] = {}
    for rec in records:
        api, n, direction = split_key(rec["op"])
        if api in drop_apis:
            continue
        if direction == "forward":
            new_n = next_n.get(api, 0)
            next_n[api] = new_n + 1
            fwd_new[(api, n)] = new_n
        elif (api, n) in fwd_new:
            new_n = fwd_new[(api, n)]
        else:  # a backward without a recorded forward: give it a counter of its own
            new_n = next_n.get(api, 0)
            next_n[api] = new_n + 1
            fwd_new[(api, n)] = new_n
        key = f"{api}.{new_n}.{direction}"
        data[key] = _entry(rec, rec["op"])
        renamed[key] = rec["op"]
        if rec.get("stack") is not None:
            stack_ops.setdefault(int(rec["stack"]), []).append(key)

    dest.mkdir(parents=True, exist_ok=True)
    dump = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}
    with open(dest / "dump.json", "w", encoding="utf-8") as f:
        json.dump({**dump, "data": data}, f, indent=1)
    stacks = _read_stacks(rank_dir)
    stack_json: dict[str, Any] = {}
    for i, (sid, keys) in enumerate(sorted(stack_ops.items())):
        # msprobe lists frames innermost first; probe outermost first.
        frames = [_msprobe_frame(fr) for fr in reversed(stacks.get(sid, []))]
        stack_json[str(i)] = [keys, frames]
    with open(dest / "stack.json", "w", encoding="utf-8") as f:
        json.dump(stack_json, f, indent=1)
    with open(dest / "construct.json", "w", encoding="utf-8") as f:
        json.dump({}, f)
    return renamed


def to_msprobe(
    probe_dump: Path,
    out: Path,
    *,
    drop_apis: frozenset[str] = MSPROBE_UNHOOKED,
    pid: int = 24241,
) -> Path:
    """Convert a probe statistics dump (``step*/rank*/ops.jsonl``) into msprobe's layout.

    Returns the msprobe ``dump_path`` (``out/dump``), holding ``step<S>/proc<PID>/`` per step
    (msprobe names the folder by PID when no rank is known; with several ranks the folders
    are ``rank<R>``, as msprobe writes them in a distributed run).
    """
    manifest = json.loads((probe_dump / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("mode") != "statistics":
        raise ValueError(f"only statistics-mode dumps are converted, not {manifest.get('mode')!r}")
    root = out / "dump"
    steps = sorted(p for p in probe_dump.iterdir() if p.is_dir() and p.name.startswith("step"))
    if not steps:
        raise ValueError(f"no step folders in {probe_dump}")
    for step in steps:
        ranks = sorted(p for p in step.iterdir() if (p / "ops.jsonl").is_file())
        for rank in ranks:
            name = f"proc{pid}" if len(ranks) == 1 else rank.name
            convert_rank(rank, root / step.name / name, drop_apis=drop_apis)
    return root
