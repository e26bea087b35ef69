"""From an op's records to a replayable call (a *spec*, kernel.py) or the reason there is none.

Why apart from the execution: what a dump lets us rebuild is a question of the records
alone (which API, which arguments were recorded, whether the call draws random numbers),
answered without running anything; the answer is data that the repro script carries as
literals. The rules (docs/replay.md, "What can be replayed"):

- API calls of ``torch``, ``torch.nn.functional``, ``Tensor`` methods, ``torch._VF``,
  ``torch.ops.aten`` and ``torch_npu`` (where importable) are called by their dotted path,
  only when it names an operator a capture could have recorded (allowed.py: the name is
  data from a dump, never a path to walk); collectives (``Distributed``) are not: their
  result is other ranks' data.
- Arguments come from the input tensors' names (``input.0``, ``input.weight``, ``.i`` list
  items, ``.key`` dict items) and the record's ``args``; a positional slot neither holds
  was an argument the agent does not record (None, or a value that is not JSON-safe) and
  is passed as None, said in ``assumed_none``.
- Random ops are not replayed unless their draw was recorded off.
- Module calls only for ``torch.nn`` classes whose construction the recorded parameters
  determine (``MODULES``); other modules name the API calls recorded inside them.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from typing import Any, Optional

from .._op_key import ParsedKey
from .allowed import API_ROOTS, MODULES, check

#: Random APIs: the list compare reads too (``probe/random_ops.json``, docs/compare.md
#: "Random ops").
with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "random_ops.json")) as _fh:
    RANDOM: tuple[str, ...] = tuple(json.load(_fh)["apis"])
#: Per pattern, the arguments that switch the draw off: name -> (position, value that means
#: off).
_SWITCHES: dict[str, dict[str, tuple[Optional[int], Any]]] = {
    "Functional.dropout*": {"p": (1, 0), "training": (2, False)},
    "Functional.scaled_dot_product_attention": {"dropout_p": (4, 0)},
    "NPU.npu_fusion_attention*": {"keep_prob": (None, 1)},
}
#: Random only with their dropout on (default off where not recorded).
_DROPOUT_WHEN_ON = {"Functional.scaled_dot_product_attention": "dropout_p"}

_DEVICE = re.compile(r"^(cpu|cuda|npu|xpu|mps|meta)(:\d+)?$")
_NONFINITE = {"nan": "nan", "inf": "inf", "+inf": "inf", "-inf": "-inf", "infinity": "inf"}
_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
}


class CannotReplay(Exception):
    """This call cannot be re-executed from the dump; the message says why."""


def target(p: ParsedKey, params: dict[str, list[int]]) -> dict[str, Any]:
    """The callable of a parsed key: ``{"kind", "path"}`` (+ constructor arguments of a
    module), or CannotReplay with the reason; ``allowed.NotAnOperator`` when the key names
    no operator a replay may run (a hostile dump: refused outright, not a reason)."""
    if p.kind == "module":
        return _module_target(p, params)
    if p.kind != "api":
        raise CannotReplay("a parameter-gradient record is an accumulation, not a call")
    if p.prefix == "Distributed":
        raise CannotReplay(
            "a collective: its result is other ranks' data, which one process cannot rerun"
        )
    root = API_ROOTS.get(p.prefix)
    if root is None:
        raise CannotReplay(f"unknown API type {p.prefix}")
    kind = "method" if p.prefix == "Tensor" else "function"
    path = f"{root}.{p.name}"
    check(kind, path)  # the name is data: NotAnOperator unless an operator of its namespace
    return {"kind": kind, "path": path}


def _module_target(p: ParsedKey, params: dict[str, list[int]]) -> dict[str, Any]:
    if p.name not in MODULES:
        raise CannotReplay(
            f"module class {p.name}: its constructor arguments (such as a convolution's stride or"
            " a norm's eps) are not in the dump, so it cannot be rebuilt; replay the API calls"
            " recorded inside it"
        )
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if p.name in ("Linear", "Bilinear"):
        w = params.get("parameters.weight")
        if w is None:
            raise CannotReplay(
                f"module {p.name}: its parameters are not in the dump (capture at level module or mix)"
            )
        args = [w[1], w[0]] if p.name == "Linear" else [w[1], w[2], w[0]]
        kwargs = {"bias": "parameters.bias" in params}
    return {"kind": "module", "path": f"torch.nn.{p.name}", "args": args, "kwargs": kwargs}


def random_reason(api: str, args: list[Any], kwargs: dict[str, Any]) -> Optional[str]:
    """Why an API call draws random numbers (None when it does not, or its draw was
    recorded off): its draw cannot be replayed."""
    for pattern, switches in _SWITCHES.items():
        if fnmatch.fnmatchcase(api, pattern):
            for name, (pos, off) in switches.items():
                value = kwargs.get(name, args[pos] if pos is not None and pos < len(args) else None)
                if value is None and api in _DROPOUT_WHEN_ON:
                    return None  # its dropout defaults to off
                if value is not None and value == off:
                    return None
    if api in _DROPOUT_WHEN_ON or any(fnmatch.fnmatchcase(api, p) for p in RANDOM):
        return f"{api} draws random numbers: a replay would draw others (record it with its draw off, e.g. dropout 0)"
    return None


def encode(value: Any) -> Any:
    """A recorded argument (docs/format.md, ``args``) as a spec value (kernel.decode)."""
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, str):
        if value.startswith("torch.") and value[6:] in _DTYPES:
            return {"dtype": value[6:]}
        if _DEVICE.match(value):
            return {"device": value}
        if value.lower() in _NONFINITE:
            return {"float": _NONFINITE[value.lower()]}
    return value


def arguments(
    input_slots: list[str], recorded: dict[str, Any]
) -> tuple[list[Any], dict[str, Any], list[str]]:
    """Positional and keyword arguments from the input tensors' slots and the record's
    ``args``; and the positional slots neither holds (passed as None)."""
    tree: dict[str, Any] = {}
    for slot in input_slots:
        _insert(tree, slot.split(".")[1:], {"tensor": slot})
    for slot, value in recorded.items():
        if slot.startswith("input."):
            _insert(tree, slot.split(".")[1:], encode(value))
    positional = {int(k): v for k, v in tree.items() if k.isdigit()}
    kwargs = {k: _build(v) for k, v in tree.items() if not k.isdigit()}
    n = max(positional) + 1 if positional else 0
    gaps = [f"input.{i}" for i in range(n) if i not in positional]
    args = [_build(positional[i]) if i in positional else None for i in range(n)]
    return args, kwargs, gaps


def _insert(tree: dict[str, Any], parts: list[str], leaf: Any) -> None:
    for part in parts[:-1]:
        node = tree.setdefault(part, {})
        if not isinstance(node, dict):
            raise CannotReplay("the recorded argument names overlap")
        tree = node
    if parts:
        tree[parts[-1]] = _Leaf(leaf)


class _Leaf:
    """A value in the argument tree (a plain dict there is a nested container)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _build(node: Any) -> Any:
    """A tree node as a spec value: digit keys a list (gaps None), other keys a dict."""
    if isinstance(node, _Leaf):
        return node.value
    if all(k.isdigit() for k in node):
        n = max((int(k) for k in node), default=-1) + 1
        return [_build(node[str(i)]) if str(i) in node else None for i in range(n)]
    return {"dict": {k: _build(v) for k, v in node.items()}}
